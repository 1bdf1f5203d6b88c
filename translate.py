"""Translate with a trained checkpoint: ``python translate.py checkpoint=RUN_DIR input=FILE output=FILE``.

A thin Hydra entry point: composes ``configs/translate.yaml`` and calls
``nmt.inference.translate_job.translate_main``. Mistakes in the request (missing checkpoint, bad input) are
reported in one line on stderr with exit status 2; stdout carries translations only. A disk that fills (or a
stdout that is cut) ends in one line with exit status 74; output=FILE keeps its old contents or does not exist.
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
from nmt.inference.engine import USER_ERRORS
from nmt.inference.translate_job import TranslateSettings, translate_main


@hydra.main(version_base="1.3", config_path="configs", config_name="translate")
def main(cfg: DictConfig) -> None:
    """Run the translate job (see configs/translate.yaml for the options)."""
    kept = "output= keeps its previous contents, or does not exist"
    with user_errors("translate.py", USER_ERRORS), disk_full_exits("translate.py", kept, same_command("translate.py")):
        translate_main(cfg)


if __name__ == "__main__":
    configs = Path(__file__).parent / "configs"
    exit_with_help_if_asked("translate.py", configs, "translate", sys.argv[1:], __doc__)
    check_keys_or_exit("translate.py", configs, "translate", sys.argv[1:], TranslateSettings)
    check_outputs_or_exit("translate.py", sys.argv[1:], folders=("attention_dir",), files=("output", "alignments"))
    main()
