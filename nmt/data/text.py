"""Text: corpus files streamed as stripped UTF-8 lines and aligned pairs, and the cleaning of training pairs
(validation and test are never filtered, so scores stay comparable with published ones).
"""

from __future__ import annotations

import gzip
import logging
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import IO

from nmt.common.progress import iterate_with_progress
from nmt.data.errors import DataError

log = logging.getLogger(__name__)

INVALID_UTF8_MODES = ("error", "replace")
STRICT_UTF8 = INVALID_UTF8_MODES[0]  # every reader's default: a bad byte stops it, naming the line


def iter_decoded(raw_lines: Iterable[bytes], name: str, invalid_utf8: str = STRICT_UTF8,
                 fix: str = "set data.invalid_utf8=replace") -> Iterator[str]:
    """Decode byte lines as UTF-8 and strip them, one at a time, naming the first bad line.

    Args:
        invalid_utf8: ``error`` raises on the first bad line; ``replace`` substitutes U+FFFD and, once the
            lines are done, logs one warning with the count and the first bad line.
        fix: how to switch to ``replace`` in the caller's terms, for the error message.

    Raises:
        DataError: invalid UTF-8 (``error`` mode) or an unknown mode.
    """
    if invalid_utf8 not in INVALID_UTF8_MODES:
        raise DataError(f"invalid_utf8={invalid_utf8!r} is not valid; use one of {', '.join(INVALID_UTF8_MODES)}.")
    first_bad, n_bad = 0, 0
    for lineno, raw in enumerate(raw_lines, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            if invalid_utf8 == "error":
                raise DataError(f"{name}, line {lineno:,}: invalid UTF-8 (byte {raw[exc.start]:#04x} at column "
                                f"{exc.start + 1}). Convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8), or "
                                f"{fix} to substitute U+FFFD.") from None
            text = raw.decode("utf-8", errors="replace")
            first_bad, n_bad = first_bad or lineno, n_bad + 1
        if lineno == 1:
            text = text.removeprefix("\ufeff")  # a UTF-8 byte-order mark is not part of the sentence
        yield text.strip()
    if n_bad:
        log.warning("%s: %d line(s) with invalid UTF-8 (first: line %d); bad bytes replaced by U+FFFD",
                    name, n_bad, first_bad)


def decode_lines(raw_lines: Iterable[bytes], name: str, invalid_utf8: str = STRICT_UTF8,
                 fix: str = "set data.invalid_utf8=replace") -> list[str]:
    """``iter_decoded`` as a list (shared by training and translation, whose inputs are small)."""
    return list(iter_decoded(raw_lines, name, invalid_utf8, fix))


def iter_lines(path: Path, invalid_utf8: str = STRICT_UTF8) -> Iterator[str]:
    """The stripped lines of a plain or gzip file (by name or magic bytes), streamed. Only ``\\n`` ends a line (not
    the separators ``str.splitlines`` knows), so the two sides of a corpus stay aligned.

    Raises:
        DataError: invalid UTF-8 (``error`` mode, naming the line), or a corrupt gzip file.
    """
    try:
        with _open_binary(path) as f:
            lines = iterate_with_progress(f, f"reading {path.name}", " lines")
            yield from iter_decoded(lines, str(path), invalid_utf8)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"cannot read {path}: {exc}. Is the file truncated or not really gzip?") from exc


def read_lines(path: Path, invalid_utf8: str = STRICT_UTF8) -> list[str]:
    """``iter_lines`` as a list."""
    return list(iter_lines(path, invalid_utf8))


def _open_binary(path: Path) -> IO[bytes]:
    with open(path, "rb") as f:
        gzipped = path.suffix == ".gz" or f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gzipped else open(path, "rb")


def iter_pairs(name: str, src_path: Path, tgt_path: Path, invalid_utf8: str = STRICT_UTF8) -> Iterator[tuple[str, str]]:
    """The aligned ``(source, target)`` lines of a split, streamed, checking that the files align.

    Raises:
        DataError: different line counts (naming both files, both counts and the first line without
            a partner; raised when the shorter file ends), an empty split, or any error of ``iter_lines``.
    """
    lines = zip_longest(iter_lines(src_path, invalid_utf8), iter_lines(tgt_path, invalid_utf8))
    count = 0
    for count, (src, tgt) in enumerate(lines, start=1):
        if src is None or tgt is None:
            rest = count + sum(1 for _ in lines)  # the longer file's line count
            n_src, n_tgt = (count - 1, rest) if src is None else (rest, count - 1)
            longer = tgt_path if src is None else src_path
            raise DataError(f"split {name!r}: source and target have different line counts: {src_path} has {n_src:,} "
                            f"lines, {tgt_path} has {n_tgt:,}; line {count:,} of {longer} has no partner. Parallel "
                            "files must align line by line; check for a missing or extra line (or a stray newline "
                            "inside a sentence).")
        yield src, tgt
    if count == 0:
        raise DataError(f"split {name!r} is empty: {src_path} and {tgt_path} have no lines. Point the split at "
                        "non-empty files.")


@dataclass
class CleanStats:
    """How many training pairs cleaning kept, and how many it dropped for each reason."""

    total: int
    kept: int
    dropped: dict[str, int] = field(default_factory=dict)


class PairFilter:
    """Keeps a training pair unless a side is empty, over ``max_len`` words, or the word ratio is over ``max_ratio``
    (``None`` turns a limit off); called on each pair of a stream, it counts each drop under its first reason.
    """

    def __init__(self, max_len: int | None = None, max_ratio: float | None = None) -> None:
        self.checks: list[tuple[str, Callable[[int, int], bool]]] = [("empty side", lambda s, t: s == 0 or t == 0)]
        if max_len is not None:
            self.checks.append((f"longer than {max_len} words", lambda s, t: max(s, t) > max_len))
        if max_ratio is not None:
            self.checks.append((f"length ratio over {max_ratio}", lambda s, t: max(s, t) > max_ratio * min(s, t)))
        self.stats = CleanStats(total=0, kept=0, dropped={reason: 0 for reason, _ in self.checks})

    def __call__(self, pair: tuple[str, str]) -> bool:
        ns, nt = len(pair[0].split()), len(pair[1].split())
        self.stats.total += 1
        for reason, fails in self.checks:
            if fails(ns, nt):
                self.stats.dropped[reason] += 1
                return False
        self.stats.kept += 1
        return True

    def report(self, name: str) -> CleanStats:
        """Log the counts once the stream is done.

        Raises:
            DataError: cleaning dropped every pair.
        """
        stats, dropped = self.stats, self.stats.dropped
        log.info("cleaned %s: kept %d of %d pairs; dropped %s", name, stats.kept, stats.total,
                 ", ".join(f"{n} ({reason})" for reason, n in dropped.items()) or "none")
        if not stats.kept:
            raise DataError(f"cleaning dropped every pair of split {name!r} ({dropped}). Check that the files are the "
                            "right ones, or loosen data.clean.max_len / data.clean.max_ratio (null = off).")
        return stats
