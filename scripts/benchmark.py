"""Speed on this machine, one mode per question: train, translate, backtranslate, data, server, overload.

    python scripts/benchmark.py train model=default attention=additive --train-steps 30 --out runs/bench/train
    python scripts/benchmark.py translate --checkpoint outputs/RUN              # into outputs/RUN
    python scripts/benchmark.py backtranslate --checkpoint outputs/EN_DE_RUN    # beam and sampling sentences/s
    python scripts/benchmark.py data --out runs/bench/data                      # needs NMT_DATA_MIRROR
    python scripts/benchmark.py server --checkpoint outputs/RUN
    python scripts/benchmark.py overload --checkpoint outputs/RUN --clients 300 --seconds 60

Logic and options: nmt_tools/benchmark.py (`MODE --help`); the figures explained: docs/development/benchmarking.md.
"""

from pathlib import Path

from nmt_tools.benchmark import main

if __name__ == "__main__":
    main(project_dir=Path(__file__).resolve().parents[1])  # this checkout, from any working directory
