"""What the entry points share: a user's mistake (a bad key, setting, file or checkpoint, a place that cannot be
written) ends in one line, ``PROGRAM: error: MESSAGE`` on stderr, with exit status 2 and no traceback; a disk that
fills mid-job ends in one line too, with exit status 74 (``EXIT_WRITE_STOPPED``).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from nmt.common.disk import (
    EXIT_WRITE_STOPPED,
    PathNotWritable,
    WriteStopped,
    check_writable,
    disk_full_message,
    is_disk_full,
)
from nmt.common.settings import check_command_line_keys, unknown_group_option

# Where Hydra writes before the job starts: a bad one is a NotADirectoryError inside Hydra unless checked first.
HYDRA_DIRS = ("hydra.run.dir", "hydra.sweep.dir")


def fail(program: str, error: Exception | str, status: int = 2) -> NoReturn:
    """Print ``error`` on stderr as one line (``PROGRAM: error: ...``) and exit with ``status``."""
    message = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    print(f"{program}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(status)


def check_keys_or_exit(program: str, config_dir: Path, args: Sequence[str], schema: type) -> None:
    """Exit with one line when a command-line key is not in ``schema`` (naming the nearest), before Hydra starts."""
    if problem := unknown_group_option(config_dir, args) or check_command_line_keys(config_dir, args, schema):
        fail(program, problem)


def check_outputs_or_exit(program: str, args: Sequence[str], folders: Sequence[str] = (),
                          files: Sequence[str] = ()) -> None:
    """Exit with one line (status 2) when ``key=PATH`` on the command line names a place to write (Hydra's run dir,
    ``folders``, ``files``) that cannot be made, before Hydra or the job touches it. ``-`` (stdout) and values with
    ``${...}`` interpolations are left to the job.
    """
    for arg in args:
        key, _, value = arg.lstrip("+").partition("=")
        if value in ("", "-") or "${" in value or key not in (*HYDRA_DIRS, *folders, *files):
            continue
        try:
            check_writable(value, key, folder=key not in files)
        except PathNotWritable as error:
            fail(program, error)


def check_options_or_exit(program: str, folders: Mapping[str, str | Path | None] | None = None,
                          reports: Mapping[str, str | Path | None] | None = None) -> None:
    """Exit with one line (status 2), before any work, when a place an option names cannot be written: ``folders``
    maps an option (``--out``) to a folder the command writes into, ``reports`` to a report path without extension
    (``PATH.json`` beside ``PATH.md``, ``PATH.png``). A value left out (``None``) is skipped.
    """
    places = [(option, path, True) for option, path in (folders or {}).items()]
    places += [(option, path and f"{path}.json", False) for option, path in (reports or {}).items()]
    for option, path, folder in places:
        if path is None:
            continue
        try:
            check_writable(path, option, folder=folder)
        except PathNotWritable as error:
            fail(program, error)


@contextmanager
def user_errors(program: str, errors: tuple[type[Exception], ...]) -> Iterator[None]:
    """Report ``errors`` (and ``PathNotWritable``) raised inside the block in one line and exit 2; anything else
    stays a traceback (a bug)."""
    try:
        yield
    except (*errors, PathNotWritable) as error:
        fail(program, error)


def same_command(program: str, args: Sequence[str] | None = None) -> str:
    """The command line that was run (``python PROGRAM ARGS``, quoted for a shell): what goes on after a stop."""
    return shlex.join(["python", program, *(sys.argv[1:] if args is None else args)])


@contextmanager
def disk_full_exits(program: str, kept: str, go_on: str) -> Iterator[None]:
    """Report a write stopped inside the block in one line and exit ``EXIT_WRITE_STOPPED``: a ``WriteStopped`` as the
    job worded it, any other disk-full ``OSError`` with ``kept`` (what is safe) and ``go_on`` (the command to rerun).
    """
    try:
        yield
    except WriteStopped as error:
        fail(program, error, EXIT_WRITE_STOPPED)
    except OSError as error:
        if not is_disk_full(error):
            raise
        fail(program, disk_full_message(error, kept, go_on), EXIT_WRITE_STOPPED)
