"""Serve a trained model over HTTP: ``python serve.py checkpoint=RUN_DIR`` (then open http://127.0.0.1:8000/).

A thin Hydra entry point: composes ``configs/serve.yaml`` and calls ``nmt.serve.server.serve_main``. Mistakes
found before the server starts (an unknown key, a bad value, a port in use, a missing checkpoint; every
setting is checked and the port taken before the model loads) are reported in one line on stderr with
exit status 2. SIGTERM or Ctrl-C lets in-flight requests finish, then exits 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from nmt.common.entry_point import (
    check_keys_or_exit,
    check_outputs_or_exit,
    exit_with_help_if_asked,
    user_errors,
)
from nmt.common.settings import ConfigError
from nmt.inference.engine import USER_ERRORS
from nmt.serve.server import serve_main
from nmt.serve.settings import ServeSettings


@hydra.main(version_base="1.3", config_path="configs", config_name="serve")
def main(cfg: DictConfig) -> None:
    """Run the server (see configs/serve.yaml for the options)."""
    with user_errors("serve.py", (*USER_ERRORS, ConfigError)):
        serve_main(cfg)


if __name__ == "__main__":
    configs = Path(__file__).parent / "configs"
    exit_with_help_if_asked("serve.py", configs, "serve", sys.argv[1:], __doc__)
    check_keys_or_exit("serve.py", configs, "serve", sys.argv[1:], ServeSettings)
    check_outputs_or_exit("serve.py", sys.argv[1:])  # Hydra's run dir, when the command line names one
    main()
