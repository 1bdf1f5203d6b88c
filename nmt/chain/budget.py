"""The time a call may take: ``budget=`` and ``deadline=`` read into one end on the chain's clock, and the question
every caller asks of it, whether a piece of work expected to take so long still fits."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from nmt.chain import clock
from nmt.chain.settings import BUDGET_FORMS, DEADLINE_FORMS, ChainError


class NotInBudget(Exception):
    """Work left out: its estimate does not fit the time the budget has left (the message says both)."""


@dataclass
class Budget:
    """When work must stop: ``ends`` on ``clock.monotonic()``'s clock (``math.inf``: never), and what set it."""

    ends: float
    label: str

    @classmethod
    def seconds_from_now(cls, seconds: float | None, label: str) -> Budget:
        return cls(math.inf if seconds is None else clock.monotonic() + seconds, label)

    def left(self) -> float:
        return self.ends - clock.monotonic()

    def need(self, seconds: float, what: str) -> None:
        """Raise NotInBudget unless ``seconds`` fit in what is left."""
        left = self.left()
        if seconds > left:
            raise NotInBudget(f"{what}: needs about {seconds:.0f} s, {max(0.0, left):.0f} s left of {self.label}")

    def timeout(self) -> float | None:
        """A command's time limit: what is left (at least one second); None without a budget."""
        return None if math.isinf(self.ends) else max(1.0, self.left())


def parse_budget(value: str) -> float:
    """``budget=`` in seconds (``600``, ``90s``, ``45m``, ``1h30m15s``); anything else is a ChainError."""
    text = value.strip().lower()
    parts = re.fullmatch(r"(?:(\d+(?:\.\d*)?)h)?(?:(\d+(?:\.\d*)?)m)?(?:(\d+(?:\.\d*)?)s?)?", text)
    if not text or parts is None or not any(parts.groups()):
        raise ChainError(f"budget={value!r} is not a duration; give {BUDGET_FORMS}")
    if not text[-1].isalpha() and (parts.group(1) or parts.group(2)):
        raise ChainError(f"budget={value!r} is not a duration (a number after h or m needs its unit); "
                         f"give {BUDGET_FORMS}")
    hours, minutes, seconds = (float(g or 0) for g in parts.groups())
    if hours * 3600 + minutes * 60 + seconds <= 0:
        raise ChainError(f"budget={value!r} leaves no time; give {BUDGET_FORMS}")
    return hours * 3600 + minutes * 60 + seconds


def parse_deadline(value: str, now: datetime) -> float:
    """``deadline=`` as seconds from ``now`` (aware, local): ``HH:MM[:SS]`` the next time the clock reads it, or an
    ISO date and time (local without a zone); another form or a past time is a ChainError."""
    text = value.strip()
    if re.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?", text):
        try:
            clock = datetime.strptime(text, "%H:%M:%S" if text.count(":") == 2 else "%H:%M").time()
        except ValueError:
            raise ChainError(f"deadline={value!r} is not a time of day; give {DEADLINE_FORMS}") from None
        target = now.replace(hour=clock.hour, minute=clock.minute, second=clock.second, microsecond=0)
        target += timedelta(days=1) if target <= now else timedelta()
    else:
        try:
            target = datetime.fromisoformat(text)
        except ValueError:
            raise ChainError(f"deadline={value!r} is not a time; give {DEADLINE_FORMS}") from None
        target = target.astimezone() if target.tzinfo is None else target
        if target <= now:
            raise ChainError(f"deadline={value!r} has passed (it is {now.isoformat(timespec='seconds')} now); "
                             f"give a later one: {DEADLINE_FORMS}")
    return (target - now).total_seconds()


def time_budget(settings: dict[str, Any], began: float) -> Budget | None:
    """The sooner of ``budget=`` (counted from ``began``, when the call started) and ``deadline=``; None without."""
    limits = []
    if settings["budget"] is not None:
        limits.append((began + parse_budget(str(settings["budget"])), f"budget={settings['budget']}"))
    if settings["deadline"] is not None:
        seconds = parse_deadline(str(settings["deadline"]), datetime.now().astimezone())
        limits.append((clock.monotonic() + seconds, f"deadline={settings['deadline']}"))
    return Budget(*min(limits)) if limits else None
