"""Shared test fixtures: the corpus mirror, tiny sizes, and CPU determinism."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO_ROOT / "configs"


def _mirror_dir() -> Path | None:
    mirror = os.environ.get("NMT_DATA_MIRROR")
    if mirror and (Path(mirror) / "multi30k").is_dir():
        return Path(mirror)
    return None


@pytest.fixture(scope="session")
def mirror_dir() -> Path:
    """The corpus mirror (``NMT_DATA_MIRROR``, CI sets it to ../shared/corpora); skip without it."""
    mirror = _mirror_dir()
    if mirror is None:
        pytest.skip("NMT_DATA_MIRROR is not set to a folder holding multi30k/")
    return mirror


@pytest.fixture(autouse=True)
def _deterministic_cpu() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
