"""The best models in one resumable command: ``python reproduce.py recipe=bt_best [parallel=2] [data.mirror=DIR]``.

A thin entry point: ``nmt.analysis.reproduce.main`` plans the recipe's stages (configs/recipe/) and runs
train.py, backtranslate.py and scripts/tune_decoding.py from this folder. Run it again after a stop: complete
stages are skipped and stopped ones resumed. Mistakes end in one line on stderr with exit status 2.
"""

import sys
from pathlib import Path

from nmt.analysis.reproduce import ChainError, main
from nmt.common.entry_point import fail

if __name__ == "__main__":
    try:
        main(sys.argv[1:], Path(__file__).resolve().parent)
    except ChainError as error:
        fail("reproduce.py", error)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
