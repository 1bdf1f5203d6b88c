"""The check's parts, found by name: each registers itself with its place in the order they run in, and a part
that is skipped, stopped at the budget's end or (with ``--keep-going``) fails is noted in the report, not raised."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nmt.chain.budget import NotInBudget
from nmt.chain.runner import BudgetSpent

Measure = Callable[[argparse.Namespace], dict[str, Any]]


@dataclass(frozen=True)
class Part:
    name: str
    order: int  # the recipe first (the search parts decode its run), the rest by what the issues need most
    measure: Measure


PARTS: dict[str, Part] = {}


def part(name: str, order: int) -> Callable[[Measure], Measure]:
    """Register the decorated function as part ``name``, run ``order``-th among those asked for."""

    def register(measure: Measure) -> Measure:
        PARTS[name] = Part(name, order, measure)
        return measure

    return register


def names() -> list[str]:
    """Every part, in the order they run in."""
    return [p.name for p in sorted(PARTS.values(), key=lambda p: p.order)]


def attempt(args: argparse.Namespace, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``measure()``; a skip or a stop as ``{"skipped"|"stopped": why}``, and with ``--keep-going`` a failure as
    ``{"failed": why}``. A signal (Interrupted, not an Exception) goes on up."""
    try:
        return measure()
    except NotInBudget as why:
        return {"skipped": str(why)}
    except BudgetSpent as why:
        return {"stopped": str(why)}
    except (Exception, SystemExit) as error:
        if not args.keep_going:
            raise
        return {"failed": str(error) or type(error).__name__}
