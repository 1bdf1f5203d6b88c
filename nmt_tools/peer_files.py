"""What the peer toolkit writes: reading its sacreBLEU JSON (shared by the peer comparison and time to BLEU)."""

from __future__ import annotations

from typing import Any


def sacrebleu_score(metrics: Any, name: str) -> float | None:
    """A score from sacrebleu's ``-w 2`` JSON output (a list of ``{"name", "score", ...}`` dicts)."""
    return next((float(m["score"]) for m in metrics if m.get("name") == name), None) if isinstance(
        metrics, list) else None
