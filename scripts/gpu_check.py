"""The GPU path in one command: bf16 against fp32, training speed, time to val BLEU 38, translation speed, the chain.

    python scripts/gpu_check.py --out runs/gpu_check                            # a few minutes on one GPU
    python scripts/gpu_check.py --out runs/gpu_check --parts recipe translate   # + time to val BLEU 38
    python scripts/gpu_check.py --out runs/gpu_check --parts chain --parallel 3 # + the chain's wall time

Logic and options: nmt_tools/gpu_check.py (``--help``); the guide: docs/guides/best-models.md.
"""

from pathlib import Path

from nmt.analysis.cli import one_line_errors
from nmt_tools.gpu_check import main

if __name__ == "__main__":
    with one_line_errors("gpu_check.py"):  # a mistake: one line, exit 2; a full disk: one line, exit 74
        main(project_dir=Path(__file__).resolve().parents[1])
