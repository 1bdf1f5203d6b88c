"""What ``train.py``, ``translate.py`` and ``serve.py`` share: a user's mistake ends in one line and exit status 2.

Before Hydra composes anything, ``check_keys_or_exit`` walks the command line's keys through the entry
point's settings schema (``nmt.train.schema.check_command_line_keys``); while the job runs, ``user_errors``
turns the errors a user can fix (a bad setting, file or checkpoint) into ``PROGRAM: error: MESSAGE`` on
stderr, folded onto one line, with no traceback.

Not done here: deciding what is a user error (each job's ``USER_ERRORS``), or composing configs.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from nmt.common.settings import check_command_line_keys, unknown_group_option


def fail(program: str, error: Exception | str) -> NoReturn:
    """Print ``error`` on stderr as one line (``PROGRAM: error: ...``) and exit with status 2."""
    message = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    print(f"{program}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def check_keys_or_exit(program: str, config_dir: Path, args: Sequence[str], schema: type) -> None:
    """Exit with one line when a command-line key is not in ``schema`` (naming the nearest), before Hydra starts."""
    if problem := unknown_group_option(config_dir, args) or check_command_line_keys(config_dir, args, schema):
        fail(program, problem)


@contextmanager
def user_errors(program: str, errors: tuple[type[Exception], ...]) -> Iterator[None]:
    """Report ``errors`` raised inside the block in one line and exit 2; anything else stays a traceback (a bug)."""
    try:
        yield
    except errors as error:
        fail(program, error)
