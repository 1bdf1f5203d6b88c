"""Where a training run stands: the progress record in each checkpoint, the clocks, the log line."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from nmt.common.progress import format_duration


@dataclass
class Progress:
    """Where a run stands; saved in every checkpoint."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0  # current epoch (0-based)
    batches_done: int = 0  # this rank's batches consumed in the current epoch
    best_bleu: float = -1.0
    best_step: int = 0
    bad_validations: int = 0  # validations since the last new best
    train_seconds: float = 0.0  # optimizer steps only: batch fetching and validation not included
    wall_seconds: float = 0.0  # the loop's wall-clock time, validations included, summed over resumes
    validation_seconds: float = 0.0  # the part of wall_seconds spent validating and checkpointing
    target_tokens: int = 0  # real target tokens trained on (this rank)
    # One entry per validation: step, epoch, train/wall seconds so far, greedy BLEU, chrF, loss.
    # It answers "how long until the model was this good" (the GPU time-to-BLEU figure).
    validations: list[dict[str, float]] = field(default_factory=list)


class RunClock:
    """The timings of a run, written into its ``Progress`` (``train_seconds``, ``wall_seconds``); a resumed run's
    clock goes on from its ``wall_seconds``.
    """

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self._started: float | None = None  # perf_counter when the loop started in this process

    def start(self) -> None:
        """The loop starts: wall time counts from now, on top of earlier runs'."""
        self._started = self._window_start = time.perf_counter()
        # progress.wall_seconds and step now (earlier processes of a resumed run)
        self._wall_before, self._step_before = self.progress.wall_seconds, self.progress.step

    def stop(self) -> None:
        """The loop ended: the final evaluation is timed on its own, not as training wall time."""
        self.sync_wall_clock()
        self._started = None

    def sync_wall_clock(self) -> None:
        """Bring ``progress.wall_seconds`` up to now (no-op while the loop is not running)."""
        if self._started is not None:
            self.progress.wall_seconds = self._wall_before + time.perf_counter() - self._started

    @contextmanager
    def outside_window(self) -> Iterator[None]:
        """Time spent in the block (validation) does not lower the log window's tokens/s; it is counted in
        ``progress.validation_seconds``."""
        started = time.perf_counter()
        yield
        spent = time.perf_counter() - started
        self._window_start += spent
        self.progress.validation_seconds += spent

    def close_window(self, tokens: int) -> float:
        """Tokens per second since the last window closed; a new window starts now."""
        started, self._window_start = self._window_start, time.perf_counter()
        return tokens / max(1e-9, self._window_start - started)

    def eta_seconds(self, total_steps: int) -> float | None:
        """Seconds until ``total_steps`` at this process's pace so far (validations included); None before a step."""
        steps = self.progress.step - self._step_before
        if self._started is None or steps <= 0:
            return None
        return (time.perf_counter() - self._started) / steps * max(0, total_steps - self.progress.step)


def progress_line(step: int, total_steps: int, epoch: int, loss: float, lr: float, tokens_per_s: float,
                  elapsed: float, eta: float | None) -> str:
    """The training log line: step of ``total_steps``, epoch (0-based), mean loss per target token and target
    tokens/s (all ranks) over the log window, the last learning rate, elapsed seconds and ``eta`` (None when not
    known yet).
    """
    percent = 100 * step // max(1, total_steps)
    return (f"step {step}/{total_steps} ({percent}%) | epoch {epoch} | loss {loss:.3f} | lr {lr:.1e} | "
            f"{tokens_per_s:,.0f} tok/s | elapsed {format_duration(elapsed)} | "
            f"ETA {'?' if eta is None else format_duration(eta)}")
