"""The frame every analysis command shares: its parser, the corpus mirror it reads, its report files (a JSON-ready
dict opening with ``provenance``, never written into ``docs/`` by default) and its errors.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from nmt.common.files import write_json_durably, write_text_durably
from nmt.common.provenance import device_name
from nmt.inference.engine import USER_ERRORS

TEST_SPLIT = "test_2016_flickr"


class _Parser(argparse.ArgumentParser):
    """Checks ``--project-dir`` (where a command or one of its modes has it) once all arguments are parsed."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:
        parsed = super().parse_args(args, namespace)
        if getattr(parsed, "project_dir", None) is not None:
            parsed.project_dir = checked_project_dir(self.prog, parsed.project_dir)
        return parsed


def parser(doc: str) -> argparse.ArgumentParser:
    """An argument parser whose help is the command's module docstring."""
    return _Parser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_project_dir(arguments: argparse.ArgumentParser, default: Path | None = None) -> None:
    """``--project-dir DIR``: the checkout whose train.py, serve.py, translate.py, scripts/ and configs/ a tool runs.

    ``default``: the current directory unless given (a scripts/ wrapper passes its own checkout).
    """
    arguments.add_argument("--project-dir", type=Path, default=default or Path("."), metavar="DIR",
                           help="the project checkout: train.py, serve.py, configs/ (default: %(default)s)")


def checked_project_dir(prog: str, folder: Path) -> Path:
    """``folder`` resolved, or one line on stderr and exit status 2 if it holds no train.py and configs/."""
    folder = Path(folder).resolve()
    if not ((folder / "train.py").is_file() and (folder / "configs").is_dir()):
        print(f"{prog}: error: --project-dir {folder}: no train.py/configs here; run from the project checkout "
              "or pass --project-dir", file=sys.stderr)
        raise SystemExit(2)
    return folder


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


def write_report(out: Path | str, report: dict[str, Any], markdown: str | None = None) -> None:
    """``<out>.json`` (and ``<out>.md``), creating the folder; prints what it wrote."""
    paths = [Path(f"{out}.json")] + ([Path(f"{out}.md")] if markdown is not None else [])
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    write_json_durably(paths[0], report)
    if markdown is not None:
        write_text_durably(paths[1], markdown)
    print("wrote " + ", ".join(map(str, paths)), flush=True)


@contextmanager
def one_line_errors(prog: str) -> Iterator[None]:
    """A user error (a wrong path, split, device or option) ends the command with one line and exit status 2."""
    try:
        yield
    except USER_ERRORS as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
