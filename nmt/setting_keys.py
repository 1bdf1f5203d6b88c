"""Setting keys: checking a key against the dataclass of its settings section, naming the nearest valid key.

The one concept here is *walking a key through a schema*: every section of the settings (``data``,
``model``, ``trainer``, the translate and serve settings) is a dataclass, and a key that is not one of
its fields is answered with the nearest field and the valid ones, whether it came from the command line
or from a YAML file. Nothing here knows Hydra; nothing in ``nmt`` is imported, so any layer can use it.

Deliberately not here: types and choices (OmegaConf checks types against the same dataclasses; each
layer checks its own choices), and defaults (see ``nmt.config`` for where each default lives).
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Iterable, Mapping
from typing import Any

OPEN = object()
"""What ``field_schema`` returns for a field that takes any keys below it (e.g. ``data.files``)."""


def unknown_key_message(path: str, key: str, valid: Iterable[str]) -> str:
    """``unknown config key PATH.KEY: did you mean PATH.NEAR? valid keys under PATH: ...``."""
    valid = sorted(valid)
    near = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)  # 0.5: a truncated key (emb) still finds emb_size
    hint = f"did you mean {path}{near[0]}? " if near else ""
    return f"unknown config key {path}{key}: {hint}valid keys under {path or 'the top level'}: {', '.join(valid)}"


def bad_value_message(path: str, error: Exception, key: str | None = None) -> str:
    """``bad value for PATH.KEY: WHAT`` from an OmegaConf validation error, its first line only (the rest
    repeats the key and names the dataclass)."""
    key = key or getattr(error, "full_key", None) or "?"
    message = str(getattr(error, "msg", error)).strip().splitlines()[0]
    return f"bad value for {path}{key}: {message}"


def field_schema(schema: type, name: str) -> type | object | None:
    """The dataclass of a nested section, ``OPEN`` for a free-form field, None for a plain value."""
    hint = typing.get_type_hints(schema)[name]
    if dataclasses.is_dataclass(hint):
        return hint
    return OPEN if hint is Any or typing.get_origin(hint) in (dict, Mapping) else None


def first_unknown_key(node: Mapping[str, Any], schema: type, path: str = "") -> str | None:
    """The message for the first key of ``node`` (recursively) that ``schema`` does not have, else None."""
    names = [f.name for f in dataclasses.fields(schema)]
    for key, value in node.items():
        if key not in names:
            return unknown_key_message(path, str(key), names)
        nested = field_schema(schema, key)
        if dataclasses.is_dataclass(nested) and isinstance(value, Mapping):
            if problem := first_unknown_key(value, nested, f"{path}{key}."):
                return problem
    return None


def unknown_dotted_key(key: str, schema: type) -> str | None:
    """The message for a dotted key (``trainer.lrr``) that does not exist in ``schema``, else None."""
    path = ""
    for part in key.split("."):
        names = [f.name for f in dataclasses.fields(schema)]
        if part not in names:
            return unknown_key_message(path, part, names)
        nested = field_schema(schema, part)
        if not dataclasses.is_dataclass(nested):
            return None  # a value, or a free-form section: nothing below it to check
        schema, path = nested, f"{path}{part}."
    return None
