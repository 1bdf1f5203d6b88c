"""Compare trained runs on a test split: scores, BLEU by length, attention sharpness, plots.

    python scripts/compare_runs.py --sweep-dir multirun/DATE/TIME          # into the sweep dir
    python scripts/compare_runs.py outputs/A outputs/B --out docs/results/attention_comparison
    python scripts/compare_runs.py --group-by attention --baseline additive runs/*/seed*   # seeds, significance

Logic and options: nmt/analysis/compare.py (`--help`); the figures explained: docs/development/benchmarking.md.
"""

from nmt.analysis.cli import one_line_errors
from nmt.analysis.compare import main

if __name__ == "__main__":
    with one_line_errors("compare_runs.py"):  # a run it cannot use: one line naming it, exit 2; a full disk: 74
        main()
