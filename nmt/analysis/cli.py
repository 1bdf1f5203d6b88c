"""The frame every analysis command shares: its parser, its report files (a JSON-ready dict opening with
``provenance``, never written into ``docs/`` by default) and its errors.
"""

from __future__ import annotations

import argparse
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from nmt.common.entry_point import user_errors
from nmt.common.files import write_json_durably, write_text_durably
from nmt.inference.engine import USER_ERRORS


class RunError(ValueError):
    """A run folder an analysis cannot use as asked (no test outputs, another test split...): one line naming it."""


def parser(doc: str) -> argparse.ArgumentParser:
    """An argument parser whose help is the command's module docstring."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def write_report(out: Path | str, report: dict[str, Any], markdown: str | None = None) -> None:
    """``<out>.json`` (and ``<out>.md``), creating the folder; prints what it wrote."""
    paths = [write_json_durably(f"{out}.json", report)]
    if markdown is not None:
        paths.append(write_text_durably(f"{out}.md", markdown))
    print("wrote " + ", ".join(map(str, paths)), flush=True)


def one_line_errors(prog: str) -> AbstractContextManager[None]:
    """A user error (a wrong path, split, device or option) ends the command with one line and exit status 2."""
    return user_errors(prog, (*USER_ERRORS, RunError))
