"""The one progress display of long jobs: a tqdm bar on a terminal, log lines elsewhere (files, CI, nohup)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def format_duration(seconds: float) -> str:
    """``42s``, ``3m12s``, ``2h05m``: short enough for a log line, exact enough to decide whether to wait."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class ProgressDisplay:
    """Where a long job stands: a tqdm bar on stderr on a terminal; elsewhere a log line at most every ``every_s``
    seconds (and at the end), so a log file gets a readable record instead of carriage returns.

    Args:
        total: units of work planned (steps, lines, sentences); done: units already done (a resumed job).
        unit: the unit's name (``" lines"``); desc: what the job is doing (``"translating"``).
        every_s: the least time between two log lines; 0 logs every update.
        bar: True for a bar even off a terminal, False never; None: on a terminal.
        enabled: False shows nothing (e.g. every DDP rank but 0).
    """

    def __init__(self, total: int, unit: str, desc: str = "", done: int = 0, every_s: float = 30.0,
                 logger: logging.Logger | None = None, bar: bool | None = None, enabled: bool = True) -> None:
        self.total, self.unit, self.done, self.every_s = total, unit, done, every_s
        self.logger = logger or logging.getLogger(__name__)
        self.enabled = enabled
        self.start, self.start_done = time.perf_counter(), done
        self.last_log = self.start
        use_bar = enabled and (sys.stderr.isatty() if bar is None else bar)
        self.bar = (tqdm(total=total, initial=done, unit=unit, desc=desc or None, file=sys.stderr,
                         dynamic_ncols=True, mininterval=0.5) if use_bar else None)

    def advance(self, n: int = 1) -> None:
        """``n`` more units done; off a terminal, log ``rate_line`` when it is time."""
        self.move_to(self.done + n)

    def move_to(self, done: int, line: str | None = None, postfix: dict[str, str] | None = None) -> None:
        """``done`` units done in all; off a terminal, log ``line`` (default: ``rate_line``) when it is time, on a
        terminal show ``postfix`` beside the bar."""
        previous, self.done = self.done, done
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(done - previous)
            return
        now = time.perf_counter()
        if self.enabled and (now - self.last_log >= self.every_s or done >= self.total):
            self.last_log = now
            self.logger.info(line if line is not None else self.rate_line())

    def rate_line(self) -> str:
        """``12,000/145,000 lines (8%) | 210.4 lines/s | elapsed 57s | ETA 10m32s``."""
        elapsed = time.perf_counter() - self.start
        rate = (self.done - self.start_done) / elapsed if elapsed > 0 else 0.0
        eta = format_duration((self.total - self.done) / rate) if rate > 0 else "?"
        unit = self.unit.strip()
        return (f"{self.done:,}/{self.total:,} {unit} ({100 * self.done // max(1, self.total)}%) | "
                f"{rate:,.1f} {unit}/s | elapsed {format_duration(elapsed)} | ETA {eta}")

    def message(self, text: str) -> None:
        """A log line that does not break the bar."""
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
            self.logger.debug(text)
        elif self.enabled:
            self.logger.info(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def iterate_with_progress(items: Iterable[T], desc: str, unit: str, total: int | None = None) -> Iterator[T]:
    """``items`` behind a transient bar on a terminal (a large corpus takes minutes); elsewhere as they are."""
    if not sys.stderr.isatty():
        yield from items
        return
    with tqdm(items, desc=desc, unit=unit, total=total, unit_scale=True, leave=False, mininterval=0.5,
              file=sys.stderr) as bar:
        yield from bar
