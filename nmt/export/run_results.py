"""The scores a training run recorded for its best checkpoint, read from the run dir's ``results.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nmt.model.hub_folder import CONFIG_FILE, WEIGHTS_FILE


def recorded_results(checkpoint: Path) -> dict[str, Any] | None:
    """The test scores recorded for ``checkpoint`` (a run's ``best.pt``: its results.json; a Hub folder: what its
    config.json carried over), or None: ``{"test": {set: {"bleu", "chrf", signatures...}}, "beam_size",
    "length_penalty"}``.
    """
    if checkpoint.name == WEIGHTS_FILE:
        return _read_json(checkpoint.parent / CONFIG_FILE).get("results")
    if checkpoint.name != "best.pt":
        return None
    results = _read_json(checkpoint.parent.parent / "results.json")
    if not isinstance(results.get("test"), dict):
        return None
    return {key: results.get(key) for key in ("test", "beam_size", "length_penalty")}


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; {} when it is missing, unreadable or not an object."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
