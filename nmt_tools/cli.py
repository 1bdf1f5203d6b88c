"""The frame the measuring tools share on top of ``nmt.analysis.cli``: ``--project-dir``, the places a tool writes
checked before any work, the corpus mirror's test files, device names fit for file names, and CUDA-aware timing.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from nmt.analysis.cli import OutputsParser
from nmt.common.entry_point import fail
from nmt.common.provenance import device_name

TEST_SPLIT = "test_2016_flickr"


class _Parser(OutputsParser):
    """Checks ``--project-dir`` (where a command or one of its modes has it) once all arguments are parsed: resolved,
    or one line on stderr and exit status 2 if it holds no train.py and configs/; and the places the tool writes."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:
        parsed = super().parse_args(args, namespace)
        if getattr(parsed, "project_dir", None) is not None:
            parsed.project_dir = folder = Path(parsed.project_dir).resolve()
            if not ((folder / "train.py").is_file() and (folder / "configs").is_dir()):
                fail(self.prog, f"--project-dir {folder}: no train.py/configs here; run from the project checkout "
                     "or pass --project-dir")
        return parsed


def parser(doc: str, folders: Sequence[str] = (), reports: Sequence[str] = ()) -> argparse.ArgumentParser:
    """An argument parser whose help is the tool's module docstring, and which checks ``--project-dir`` and, before
    any work, the options ``folders`` (folders the tool writes into) and ``reports`` (report paths without
    extension)."""
    return _Parser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter, folders=folders,
                   reports=reports)


def add_project_dir(arguments: argparse.ArgumentParser, default: Path | None = None) -> None:
    """``--project-dir DIR``: the checkout whose train.py, serve.py, translate.py, scripts/ and configs/ a tool runs.

    ``default``: the current directory unless given (a scripts/ wrapper passes its own checkout).
    """
    arguments.add_argument("--project-dir", type=Path, default=default or Path("."), metavar="DIR",
                           help="the project checkout: train.py, serve.py, configs/ (default: %(default)s)")


def mirror_file(lang: str, split: str = TEST_SPLIT) -> Path:
    """``$NMT_DATA_MIRROR/multi30k/<split>.<lang>.gz``.

    Raises:
        SystemExit: ``NMT_DATA_MIRROR`` is not set.
    """
    mirror = os.environ.get("NMT_DATA_MIRROR")
    if not mirror:
        raise SystemExit("NMT_DATA_MIRROR is not set: point it at the corpus mirror, or pass --input")
    return Path(mirror) / "multi30k" / f"{split}.{lang}.gz"


def device_slug(device: torch.device) -> str:
    """``device_name`` fit for a file name: ``cpu``, ``cuda-nvidia-h100-80gb-hbm3``."""
    if device.type != "cuda":
        return device.type
    return "cuda-" + re.sub(r"[^a-z0-9]+", "-", device_name(device).lower()).strip("-")


def sync(device: torch.device) -> None:
    """Wait for queued CUDA work, so that a timer read afterwards covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
