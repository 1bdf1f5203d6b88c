"""Speed on this machine, one mode per question: train, translate, backtranslate, data, server, overload.

    python scripts/benchmark.py train model=default attention=additive --train-steps 30 --out runs/bench/train
    python scripts/benchmark.py translate --checkpoint outputs/RUN              # into outputs/RUN
    python scripts/benchmark.py backtranslate --checkpoint outputs/EN_DE_RUN    # beam and sampling sentences/s
    python scripts/benchmark.py data --out runs/bench/data                      # needs NMT_DATA_MIRROR
    python scripts/benchmark.py server --checkpoint outputs/RUN
    python scripts/benchmark.py overload --checkpoint outputs/RUN --clients 300 --seconds 60

Logic and options: tools/benchmark.py (`MODE --help`); the figures explained: docs/benchmarking.md.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tools sit beside the package, not in it
from tools.benchmark import main  # noqa: E402

if __name__ == "__main__":
    main()
