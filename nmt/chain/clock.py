"""How long each kind of stage takes: this workdir's own times (``runs/.reproduce/times.json``) when it has any,
else the recipe's guess; a stage stopped part way keeps the time it ran, so its total counts once it finishes."""

from __future__ import annotations

import json
import re
import statistics
import time
from pathlib import Path

from nmt.common.files import write_json_durably

# The chain looks at the clock every 0.05 s while stages run; a look this much later than the one before means the
# chain was paused with its stages (SIGTSTP or Ctrl-Z, which it passes on; or a batch system stopping the whole job).
STOPPED_GAP_S = 5.0


def monotonic() -> float:
    """The chain's one clock for budgets and durations (a test replaces it)."""
    return time.monotonic()


class Clock:
    """The estimates, the finished stages' times by kind, and the seconds stopped stages have run so far.

    ``times.json`` maps a kind to the seconds each finished stage of it took; ``spent.json`` beside it maps a stage
    stopped part way (by a budget or a signal) to the seconds its calls ran it, added to its time when it finishes.
    """

    def __init__(self, path: Path, guesses: dict[str, float]) -> None:
        self.path, self.guesses = path, guesses
        self.spent_path = path.with_name("spent.json")
        self.times: dict[str, list[float]] = json.loads(path.read_text()) if path.is_file() else {}
        self.spent: dict[str, float] = json.loads(self.spent_path.read_text()) if self.spent_path.is_file() else {}
        self.last_look: float | None = None
        self.stopped_seconds = 0.0
        self.done_fraction: dict[str, float] = {}  # a stopped stage's part done, by its files (``note_progress``)

    def now(self) -> float:
        """The clock stage durations are measured on: ``monotonic()`` less the gaps in which the chain was stopped
        (longer than ``STOPPED_GAP_S`` between two looks), so a paused study does not teach the ETA a stage took
        the pause too. Budgets and deadlines stay on ``monotonic()``: a pause spends them."""
        moment = monotonic()
        if self.last_look is not None and moment - self.last_look > STOPPED_GAP_S:
            self.stopped_seconds += moment - self.last_look
        self.last_look = moment
        return moment - self.stopped_seconds

    def estimate(self, kind: str) -> float:
        """The median of this workdir's times for ``kind`` (one stage slowed by other work on the machine moves it
        less than a mean), else the recipe's guess."""
        seen = self.times.get(kind)
        return statistics.median(seen) if seen else 60.0 * float(self.guesses.get(kind, 0))

    def remaining(self, name: str, kind: str) -> float:
        """What stage ``name`` still needs: its kind's estimate for the part its files say is left, or, for a stage
        that cannot tell, the estimate less what earlier calls ran it."""
        if name in self.done_fraction:
            return self.estimate(kind) * (1.0 - self.done_fraction[name])
        return max(0.0, self.estimate(kind) - self.spent.get(name, 0.0))

    def note_progress(self, fractions: dict[str, float | None]) -> None:
        """The part done of each stage stopped part way that can tell (``training_fraction``), read once a call:
        a stage slowed by another load spent more than its estimate without being nearer its end, and a call
        killed outright recorded no time for it at all."""
        self.done_fraction = {name: f for name, f in fractions.items() if f is not None}

    def record(self, kind: str, seconds: float) -> None:
        self.times.setdefault(kind, []).append(seconds)
        write_json_durably(self.path, self.times)

    def stopped(self, name: str, seconds: float) -> None:
        """Stage ``name`` ran ``seconds`` and was stopped before it finished: kept for its total."""
        self.spent[name] = self.spent.get(name, 0.0) + seconds
        write_json_durably(self.spent_path, self.spent)

    def finished(self, name: str, kind: str, seconds: float) -> float:
        """Stage ``name`` finished after ``seconds`` in this call: its total over every call recorded; returned."""
        total = seconds + self.spent.pop(name, 0.0)
        if self.spent_path.is_file():
            write_json_durably(self.spent_path, self.spent)
        self.record(kind, total)
        return total


PLANNED = re.compile(r"(\d+) steps planned")  # train.py's start line (nmt.train.trainer)


def training_fraction(run_dir: Path) -> float | None:
    """The part of a stopped training done: the last step in ``train_log.jsonl`` of the steps its ``train.log``
    planned (early stopping may end it sooner); None for a run that has not logged both."""
    log, steps = run_dir / "train.log", run_dir / "train_log.jsonl"
    if not log.is_file() or not steps.is_file():
        return None
    planned = PLANNED.findall(log.read_text(errors="replace"))
    lines = steps.read_bytes().rstrip().rsplit(b"\n", 1)
    try:
        step = int(json.loads(lines[-1])["step"])
    except (ValueError, KeyError, TypeError):  # empty, or a line cut by a kill
        return None
    return min(1.0, step / int(planned[-1])) if planned else None
