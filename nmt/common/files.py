"""Durable files: a write that leaves the old file or the new one, never half of one, writes done in the background,
and a lock on a folder."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from nmt.common.disk import WriteFailed


class FolderInUse(RuntimeError):
    """Another process holds the folder's lock; the message names it and says what to do."""


def replace_durably(tmp: str | Path, path: str | Path) -> Path:
    """Make a finished temp file (in ``path``'s folder, so the rename is atomic) ``path``: fsync it, rename it over
    ``path``, fsync the folder. For writers that fill their temp file themselves (a download, an array in pieces).
    """
    with open(tmp, "rb+") as handle:
        os.fsync(handle.fileno())  # the data is on disk before the rename makes it the file
    os.replace(tmp, path)  # atomic on POSIX: readers see the old file or the new one
    folder = os.open(Path(path).parent, os.O_RDONLY)  # the folder's entries flushed: the rename survives a power cut
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
    return Path(path)


class _ErrorKeepingFile:
    """A binary file that remembers the OSError a write raised: ``torch.save`` reports one as its own RuntimeError
    (``unexpected pos ...``), which loses the errno that says the disk is full."""

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle, self.error = handle, None

    def write(self, data: Any) -> int:
        try:
            return self.handle.write(data)
        except OSError as error:
            self.error = error
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)


@contextlib.contextmanager
def durable_file(path: str | Path) -> Iterator[IO[bytes]]:
    """A binary file for the block to fill: a temp file beside ``path``, fsynced and renamed over ``path`` when the
    block ends; a crash, full disk or power cut leaves the previous file (or none), never half of one, and a failed
    write removes its temp.

    Raises:
        WriteFailed: any OSError of the write (a full disk, no permission, an I/O error), naming ``path``, not the
            temp file, whatever wrote it.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # per process: two writers never share a temp file
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as raw:
            handle = _ErrorKeepingFile(raw)
            try:
                yield handle  # type: ignore[misc]  # a file in all but name
            except Exception as error:
                if handle.error is None or handle.error is error:
                    raise
                raise handle.error from error  # the errno, not the writer's wrapping of it
        replace_durably(tmp, path)
    except OSError as error:
        raise WriteFailed(error.errno, error.strerror, str(path)) from error
    finally:
        tmp.unlink(missing_ok=True)  # gone after the rename; a failed write leaves no temp file


def write_durably(path: str | Path, write: Callable[[IO[bytes]], Any]) -> Path:
    """Write ``path`` through ``write(handle)`` into a ``durable_file``: the old file or the new one, never half."""
    with durable_file(path) as handle:
        write(handle)
    return Path(path)


def write_bytes_durably(path: str | Path, data: bytes) -> Path:
    return write_durably(path, lambda handle: handle.write(data))


def write_text_durably(path: str | Path, text: str) -> Path:
    return write_bytes_durably(path, text.encode("utf-8"))


def write_json_durably(path: str | Path, data: Any, indent: int = 2) -> Path:
    return write_text_durably(path, json.dumps(data, indent=indent, ensure_ascii=False) + "\n")


@contextlib.contextmanager
def folder_lock(folder: str | Path, owner: str, advice: str) -> Iterator[None]:
    """Hold ``folder/.lock`` (an flock the OS releases however the process ends, SIGKILL included); the folder is
    created if missing. ``owner`` (``train.py (pid 12)``) is quoted to a second process, and ``advice`` ends its
    one-line refusal. A lock whose holder died without letting it go (its name still in the file) is taken over
    with one line on stderr.

    Raises:
        FolderInUse: another process holds the lock.
    """
    Path(folder).mkdir(parents=True, exist_ok=True)
    with open(Path(folder) / ".lock", "a+") as handle:
        handle.seek(0)
        holder = handle.read().strip()
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FolderInUse(f"{folder} is in use by {holder or 'another process'}: {advice}") from None
        if holder:  # its flock went with it: it was killed (SIGKILL, power cut) before it let go
            print(f"{folder}: taking over the lock of {holder}, which ended without letting it go", file=sys.stderr,
                  flush=True)
        handle.truncate(0)
        handle.write(f"{owner}\n")
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)  # let go: the next holder finds no name
