"""How long each kind of stage takes: this workdir's own times (``runs/.reproduce/times.json``) when it has any,
else the recipe's guess; a stage stopped part way keeps the time it ran, so its total counts once it finishes."""

from __future__ import annotations

import json
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
        seen = self.times.get(kind)
        return sum(seen) / len(seen) if seen else 60.0 * float(self.guesses.get(kind, 0))

    def remaining(self, name: str, kind: str) -> float:
        """What stage ``name`` still needs: its kind's estimate less what earlier calls ran it."""
        return max(0.0, self.estimate(kind) - self.spent.get(name, 0.0))

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
