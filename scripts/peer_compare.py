"""Training and translation speed against JoeyNMT on the same machine, as ratios.

    python scripts/peer_compare.py --checkpoint outputs/RUN --peer-dir PEER_DIR --out runs/peer_comparison

Logic and options: nmt_tools/peer.py (`--help`); the figures explained: docs/development/benchmarking.md.
"""

from pathlib import Path

from nmt.analysis.cli import one_line_errors
from nmt_tools.peer import main

if __name__ == "__main__":
    with one_line_errors("peer_compare.py"):  # a mistake: one line, exit 2; a full disk: one line, exit 74
        main(project_dir=Path(__file__).resolve().parents[1])  # this checkout, from any working directory
