"""Training and translation speed against JoeyNMT on the same machine, as ratios.

    python scripts/peer_compare.py --checkpoint outputs/RUN --peer-dir PEER_DIR --out runs/peer_comparison

Logic and options: tools/peer.py (`--help`); the figures explained: docs/benchmarking.md.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tools sit beside the package, not in it
from tools.peer import main  # noqa: E402

if __name__ == "__main__":
    main()
