"""The GPU path in one command: the CUDA tests, eager against graphs (training, the recipe, search), trainings side
by side on one card, the attention study; one JSON, resumable, within a time budget if asked.

    python scripts/gpu_check.py --out runs/gpu_check                            # graphs + translate: minutes
    python scripts/gpu_check.py --out runs/gpu_check --parts recipe search --recipe-paths graphs eager
    python scripts/gpu_check.py --out runs/gpu_check --parts parallel --mps     # trainings at once, MPS too
    python scripts/gpu_check.py --device-run --out /tmp/gpu_check --pack OUT   # 9 minutes, at most 8 files

One device call runs scripts/gpu_device_run.sh. Logic and options: nmt_tools/gpu_check/ (``--help``; the device
profile is its device_run.json); the guides: docs/development/benchmarking.md, docs/results/gpu.md. A SIGTERM or
Ctrl-C stops the running command (it saves first), keeps the parts done and exits 143 or 130.
"""

from pathlib import Path

from nmt.analysis.cli import one_line_errors
from nmt.chain import Interrupted
from nmt_tools.gpu_check import main

if __name__ == "__main__":
    try:
        with one_line_errors("gpu_check.py"):  # a mistake: one line, exit 2; a full disk: one line, exit 74
            main(project_dir=Path(__file__).resolve().parents[1])
    except Interrupted as stopped:
        raise SystemExit(stopped.exit_status) from None
