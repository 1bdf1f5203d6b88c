"""Translate with a trained checkpoint: ``python translate.py checkpoint=RUN_DIR input=FILE output=FILE``.

A thin Hydra entry point: composes ``configs/translate.yaml`` and calls
``nmt.translation.translate_main``. Mistakes in the request (missing checkpoint, bad input) are
reported in one line on stderr with exit status 2; stdout carries translations only.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from nmt.config import check_command_line_keys
from nmt.translation import TranslateSettings, translate_main
from nmt.translator import USER_ERRORS


@hydra.main(version_base="1.3", config_path="configs", config_name="translate")
def main(cfg: DictConfig) -> None:
    """Run the translate job (see configs/translate.yaml for the options)."""
    try:
        translate_main(cfg)
    except USER_ERRORS as error:
        print(f"translate.py: error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    # Hydra would refuse an unknown key too, but without naming the key that was meant
    problem = check_command_line_keys(Path(__file__).parent / "configs", sys.argv[1:], TranslateSettings)
    if problem:
        print(f"translate.py: error: {problem}", file=sys.stderr)
        sys.exit(2)
    main()
