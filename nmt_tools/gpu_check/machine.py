"""The machine a check ran on: the card, PyTorch, CUDA, cuDNN and Python, the project's commit, the date."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
from pathlib import Path
from typing import Any


def git_commit(project_dir: Path) -> str:
    """``NMT_GIT_COMMIT``, else ``git describe --always --dirty`` of the checkout, else ``unknown``."""
    if os.environ.get("NMT_GIT_COMMIT"):
        return os.environ["NMT_GIT_COMMIT"].strip()
    try:
        found = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=project_dir, capture_output=True,
                               text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return found.stdout.strip() if found.returncode == 0 and found.stdout.strip() else "unknown"


def machine_info(project_dir: Path) -> dict[str, Any]:
    """The card, PyTorch, CUDA, cuDNN and Python versions, the project's commit and the date (UTC)."""
    import torch

    from nmt.common.provenance import library_versions

    versions = library_versions()
    return {"card": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "pytorch": versions["torch"], "cuda": versions["cuda"], "cudnn": versions["cudnn"],
            "python": versions["python"], "commit": git_commit(project_dir),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
