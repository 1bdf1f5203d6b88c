"""The best models in one resumable command: ``python reproduce.py recipe=bt_best [parallel=2] [budget=55m]
[data.mirror=DIR]``; ``--help`` lists the recipes and settings.

A thin entry point: ``nmt.chain.main`` plans the recipe's stages (configs/recipe/) and runs train.py,
backtranslate.py and scripts/tune_decoding.py from this folder. Run it again after a stop (a budget's: exit 0; a
SIGTERM or Ctrl-C: every stage saves first, exit 143 or 130; both print the command that goes on): complete stages
are skipped and stopped ones resumed. Mistakes (a workdir that cannot be made, or another study's) end in one line
on stderr with exit status 2; a disk that fills ends in one line with exit status 74: run the same command again
once space is freed.
"""

import sys
from pathlib import Path

from nmt.chain import CardError, ChainError, Interrupted, main
from nmt.common.disk import PathNotWritable
from nmt.common.entry_point import disk_full_exits, fail, same_command
from nmt.common.files import FolderInUse

if __name__ == "__main__":
    try:
        with disk_full_exits("reproduce.py", "complete stages are kept", same_command("reproduce.py")):
            main(sys.argv[1:], Path(__file__).resolve().parent)
    except (ChainError, CardError, PathNotWritable, FolderInUse) as error:
        fail("reproduce.py", error)
    except Interrupted as stopped:
        raise SystemExit(stopped.exit_status) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
