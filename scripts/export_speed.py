"""An exported model on nmt_runtime against the PyTorch engine on the CPU: speed, latency, BLEU, memory, size.

    python scripts/export_speed.py --run outputs/RUN                  # test_2016_flickr from NMT_DATA_MIRROR
    python scripts/export_speed.py --run outputs/RUN --source test.de --reference test.en --out runs/export_speed

Logic and options: nmt_tools/export_speed.py (``--help``); the guide: docs/guides/export.md.
"""

from nmt.analysis.cli import one_line_errors
from nmt_tools.export_speed import main

if __name__ == "__main__":
    with one_line_errors("export_speed.py"):  # a mistake: one line, exit 2; a full disk: one line, exit 74
        main()
