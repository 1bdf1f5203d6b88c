"""An exported model on nmt_runtime against the PyTorch engine on the CPU: speed, latency, BLEU, memory, size.

    python scripts/export_speed.py --run outputs/RUN                  # test_2016_flickr from NMT_DATA_MIRROR
    python scripts/export_speed.py --run outputs/RUN --source test.de --reference test.en --out runs/export_speed

Logic and options: nmt_tools/export_speed.py (``--help``); the guide: docs/guides/export.md.
"""

from nmt_tools.export_speed import main

if __name__ == "__main__":
    main()
