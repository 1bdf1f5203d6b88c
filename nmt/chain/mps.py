"""CUDA MPS for processes that share one card: its control daemon started with a private pipe and log folder and
stopped on the way out, so that several trainings' kernels run side by side instead of in turns.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

CONTROL = "nvidia-cuda-mps-control"
MAX_PIPE_PATH = 60  # the daemon's socket paths must stay short (a Unix socket's path has about 100 bytes)


class MpsError(RuntimeError):
    """The MPS daemon could not be started; the message says why (one line)."""


def mps_available() -> bool:
    """Whether the MPS control program is on PATH (it comes with the NVIDIA driver)."""
    return shutil.which(CONTROL) is not None


@contextmanager
def mps_daemon(folder: Path) -> Iterator[dict[str, str]]:
    """The MPS daemon, its pipe and log folders under ``folder``, stopped (``quit``) however the block ends; yields
    the variables its clients need. Raises MpsError when it cannot start."""
    pipe, logs = folder / "pipe", folder / "log"
    short = len(str(pipe.resolve())) > MAX_PIPE_PATH
    if short:
        pipe = Path(tempfile.mkdtemp(prefix="nmt_mps_"))
    pipe.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    variables = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe.resolve()), "CUDA_MPS_LOG_DIRECTORY": str(logs.resolve())}
    env = {**os.environ, **variables}
    try:
        try:
            started = subprocess.run([CONTROL, "-d"], env=env, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise MpsError(f"{CONTROL} -d could not run ({error})") from None
        if started.returncode != 0:
            detail = (started.stderr or started.stdout).strip().replace("\n", " ")[:200]
            raise MpsError(f"{CONTROL} -d failed with exit status {started.returncode}: {detail}")
        yield variables
    finally:
        try:
            subprocess.run([CONTROL], input="quit\n", env=env, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as error:
            log.warning("stopping the MPS daemon: %s", error)
        if short:
            shutil.rmtree(pipe, ignore_errors=True)
