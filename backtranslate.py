"""Back-translate monolingual text: ``python backtranslate.py checkpoint=RUN input=FILE lang=en output=DIR``.

A thin Hydra entry point: composes ``configs/backtranslate.yaml`` and calls
``nmt.inference.backtranslation.backtranslate``. Mistakes (a missing file, invalid UTF-8, a model for another
language, an output folder of another job, a bad option) are reported in one line on stderr with exit
status 2, before anything is written. Run the same command again after a kill, or after a full disk (one line,
exit status 74), to resume.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from nmt.common.entry_point import (
    check_keys_or_exit,
    check_outputs_or_exit,
    disk_full_exits,
    exit_with_help_if_asked,
    same_command,
    user_errors,
)
from nmt.common.settings import ConfigError
from nmt.inference.backtranslation import BacktranslateSettings, BacktranslationError, backtranslate
from nmt.inference.engine import USER_ERRORS


@hydra.main(version_base="1.3", config_path="configs", config_name="backtranslate")
def main(cfg: DictConfig) -> None:
    """Run the back-translation job (see configs/backtranslate.yaml for the options)."""
    kept = "output= keeps the whole chunks provenance.json records (a rerun drops anything after them)"
    with (user_errors("backtranslate.py", (*USER_ERRORS, BacktranslationError, ConfigError)),
          disk_full_exits("backtranslate.py", kept, same_command("backtranslate.py"))):
        try:
            backtranslate(cfg, argv=sys.argv[1:])
        except KeyboardInterrupt:  # the job has said where it stopped and how to go on
            raise SystemExit(130) from None


if __name__ == "__main__":
    configs = Path(__file__).parent / "configs"
    exit_with_help_if_asked("backtranslate.py", configs, "backtranslate", sys.argv[1:], __doc__)
    check_keys_or_exit("backtranslate.py", configs, "backtranslate", sys.argv[1:], BacktranslateSettings)
    check_outputs_or_exit("backtranslate.py", sys.argv[1:], folders=("output",))
    main()
