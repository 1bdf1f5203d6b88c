"""The frame every analysis command shares: its parser (which checks the places the command writes before any
work), its report files (a JSON-ready dict opening with ``provenance``, never written into ``docs/`` by default,
each written whole or not at all) and its errors (one line: exit status 2 for a mistake, 74 for a full disk).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nmt.common.entry_point import check_options_or_exit, disk_full_exits, same_command, user_errors
from nmt.common.files import write_json_durably, write_text_durably
from nmt.inference.engine import USER_ERRORS


class RunError(ValueError):
    """A run folder an analysis cannot use as asked (no test outputs, another test split...): one line naming it."""


class OutputsParser(argparse.ArgumentParser):
    """Checks, once all arguments are parsed and before any work, the places the command writes: ``folders`` and
    ``reports`` (a report path without extension) name option dests (``out``); one that cannot be written is one line
    naming the option, the path and the fix, and exit status 2. Subcommands' parsers are of this class too.
    """

    def __init__(self, *args: Any, folders: Sequence[str] = (), reports: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.folders, self.reports = tuple(folders), tuple(reports)

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:
        parsed = super().parse_args(args, namespace)
        check_options_or_exit(self.prog, *({f"--{dest.replace('_', '-')}": getattr(parsed, dest, None)
                                            for dest in dests} for dests in (self.folders, self.reports)))
        return parsed


def parser(doc: str, folders: Sequence[str] = (), reports: Sequence[str] = ()) -> argparse.ArgumentParser:
    """An argument parser whose help is the command's module docstring, and which checks the options ``folders``
    (folders it writes into) and ``reports`` (report paths without extension) before any work."""
    return OutputsParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter, folders=folders,
                         reports=reports)


def write_report(out: Path | str, report: dict[str, Any], markdown: str | None = None) -> None:
    """``<out>.json`` (and ``<out>.md``), creating the folder; prints what it wrote."""
    paths = [write_json_durably(f"{out}.json", report)]
    if markdown is not None:
        paths.append(write_text_durably(f"{out}.md", markdown))
    print("wrote " + ", ".join(map(str, paths)), flush=True)


@contextmanager
def one_line_errors(prog: str) -> Iterator[None]:
    """A user error (a wrong path, split, device or option) ends the command with one line and exit status 2; a full
    disk with one line and exit status 74 (reports are written whole or not at all, so none is left half-written).
    """
    kept = "every report is written whole or not at all: those written before are complete"
    with user_errors(prog, (*USER_ERRORS, RunError)), disk_full_exits(prog, kept, same_command(sys.argv[0])):
        yield
