"""What the entry points share: a user's mistake (a bad key, setting, file or checkpoint) ends in one line,
``PROGRAM: error: MESSAGE`` on stderr, with exit status 2 and no traceback.
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
