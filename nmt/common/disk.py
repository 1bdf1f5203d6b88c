"""Where a job writes: a place that cannot be made is refused before any work, and a write that fails mid-job (a full
disk, no permission, an immutable file, an I/O error) is told in one line (what could not be written and why, the free
space when full, what is kept, how to go on) with its own exit status.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

# Errors that mean "no room to write here", not a bug: a full disk, a quota, a file-size limit, a read-only remount.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})
# sysexits.h's EX_IOERR (74): the job stopped mid-way at a write that failed (or a closed stdout); 2 stays "bad
# input, nothing done", so a scheduler can tell "fix the disk and go on" from "fix the command".
EXIT_WRITE_STOPPED = 74


class PathNotWritable(ValueError):
    """An output path that cannot be made or written; the message names the setting, the path and the fix."""


class WriteStopped(Exception):
    """A write that could not finish mid-job (no room, no permission, an I/O error, or stdout's reader gone); the
    message is the whole one-line report: what could not be written, what is kept, how to go on
    (``write_stopped_message``)."""


class WriteFailed(OSError):
    """A durable write (``nmt.common.files``) that failed, for whatever reason the OS gave; ``filename`` is the file
    it was writing, not its temp file. Told apart from a failed read, which is the input's problem, not the disk's."""


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` is a write that found no room (``DISK_FULL_ERRNOS``)."""
    return isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS


def is_write_error(error: BaseException) -> bool:
    """Whether ``error`` is a write that failed: a full disk anywhere, or any error of a durable write."""
    return is_disk_full(error) or isinstance(error, WriteFailed)


def check_writable(path: str | Path, key: str, folder: bool = False) -> None:
    """Refuse, before any work, an output ``path`` (a file, or with ``folder`` a folder; created with its parents if
    missing) that cannot be written: a folder for a file or the reverse, a path under a file or where no folder can
    be made (``/proc``), no permission. A missing path is probed by making and removing its first missing folder.

    Raises:
        PathNotWritable: one line naming ``key``, the path and what to change.
    """
    target = Path(path)
    if target.exists():
        if target.is_dir() != folder:
            kind, wanted = ("a file", "a folder") if folder else ("a directory", "a file")
            raise PathNotWritable(f"{key}={path} is {kind}; name {wanted} to write")
        if not os.access(target, os.W_OK):
            raise PathNotWritable(f"{key}={path} is not writable; {permission_fix(target)}")
        return
    parent = existing_folder(target)  # below it: what the job would create
    if not parent.is_dir():
        raise PathNotWritable(f"{key}={path} cannot be created: {parent} is a file, not a folder; choose another path")
    first_missing = target.absolute().relative_to(parent).parts[0]
    try:  # access() says yes to root where mkdir still fails (/proc, a read-only remount): ask mkdir itself
        os.mkdir(parent / first_missing)
        os.rmdir(parent / first_missing)
    except OSError as error:
        if error.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return  # another process made it meanwhile (a torchrun rank probing the same path, or its run)
        denied = error.errno in (errno.EACCES, errno.EPERM) and os.environ.get("NMT_IMAGE")
        raise PathNotWritable(f"{key}={path} cannot be created: no folder can be made in {parent} "
                              f"({error.strerror}); {permission_fix(parent) if denied else 'choose another path'}"
                              ) from None


def permission_fix(folder: Path) -> str:
    """What to change when ``folder`` cannot be written: on a host, the path or its permissions; inside this project's
    images (``NMT_IMAGE``, set by the Dockerfile) it is most often a volume the image's user does not own, so the
    fix is on the host: its owner, or the user the container runs as.
    """
    if not os.environ.get("NMT_IMAGE"):
        return "choose another path or change its permissions"
    uid = os.getuid()
    return (f"inside this container {folder.absolute()} is not writable by its user (uid {uid}): on the host, give "
            f"the folder mounted there to that user (chown -R {uid} FOLDER), or run the container as the folder's "
            "owner (docker run --user $(id -u):$(id -g) ...)")


def format_size(n_bytes: float) -> str:
    """``n_bytes`` for people: ``"512 B"``, ``"1.2 MB"``."""
    for unit in ("B", "kB", "MB", "GB"):
        if n_bytes < 1000 or unit == "GB":
            return f"{n_bytes:.0f} {unit}" if unit == "B" else f"{n_bytes:.1f} {unit}"
        n_bytes /= 1000
    raise AssertionError("unreachable")


def existing_folder(path: str | Path) -> Path:
    """``path`` or its nearest existing parent: where ``shutil.disk_usage`` can look before the path is made."""
    folder = Path(path).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def free_space(path: str | Path) -> str:
    """``"1.2 MB free of 45.0 MB"`` on the file system of ``path`` (or of its nearest existing folder)."""
    try:
        usage = shutil.disk_usage(existing_folder(path))
    except OSError:
        return "free space unknown"
    return f"{format_size(usage.free)} free of {format_size(usage.total)}"


def write_stopped_message(error: OSError, kept: str, go_on: str) -> str:
    """The one-line report of a write that failed: the file, the reason (with the free space when there was no
    room), what ``kept`` holds, what to fix and the command (``go_on``) that goes on then.
    """
    where = error.filename or "a file"
    reason = error.strerror or os.strerror(error.errno or errno.EIO)
    if is_disk_full(error):
        space = free_space(where) if error.filename else "free space unknown"
        reason, fix = f"{reason} ({space})", "free some space"
    elif error.errno in (errno.EACCES, errno.EPERM):
        fix = "make its folder writable (its permissions, or chattr -i)"
    else:
        fix = "check the disk (dmesg tells more)"
    return f"could not write {where}: {reason}; {kept}; {fix}, then go on with: {go_on}"
