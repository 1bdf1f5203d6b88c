"""Export a trained model: ``python export.py checkpoint=RUN_DIR output=FOLDER [format=onnx|hub] [int8=true]``.

A thin Hydra entry point: composes ``configs/export.yaml`` and calls ``nmt.export.export_main``. Mistakes in
the request (a missing checkpoint, an output folder in the way, a bad option) are reported in one line on
stderr with exit status 2. A disk that fills ends in one line with exit status 74, and no output folder.
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
from nmt.export.export_job import USER_ERRORS, ExportSettings, export_main


@hydra.main(version_base="1.3", config_path="configs", config_name="export")
def main(cfg: DictConfig) -> None:
    """Run the export (see configs/export.yaml for the options)."""
    kept = "the half-made folder was removed, output= was not made"
    with user_errors("export.py", USER_ERRORS), disk_full_exits("export.py", kept, same_command("export.py")):
        export_main(cfg)


if __name__ == "__main__":
    configs = Path(__file__).parent / "configs"
    exit_with_help_if_asked("export.py", configs, "export", sys.argv[1:], __doc__)
    check_keys_or_exit("export.py", configs, "export", sys.argv[1:], ExportSettings)
    check_outputs_or_exit("export.py", sys.argv[1:], folders=("output",))
    main()
