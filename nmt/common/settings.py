"""Settings checks every entry point shares: a key walked through its section's dataclass, naming the nearest."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    """A config key, type or value that cannot work; the message says which and how to fix it."""


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


def to_plain_dict(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as plain Python values, without Hydra's own section (for checkpoints/JSON)."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(plain, dict)
    plain.pop("hydra", None)
    return plain


def check_command_line_keys(config_dir: str | Path, args: Sequence[str], schema: type) -> str | None:
    """A one-line error for a command-line key the entry point does not have, naming the nearest; None if all fit.

    Each ``key=value`` of ``args`` is walked through ``schema`` (the entry point's settings dataclass;
    ``trainer.lrr`` -> ``did you mean trainer.lr?``) before Hydra composes anything, and its value checked
    against the schema's type. Group choices, ``+key``/``~key``, ``hydra.*`` and syntax errors are left to Hydra.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        overrides = OverridesParser.create().parse_overrides([a for a in args if "=" in a and not a.startswith("-")])
    except HydraException:
        return None  # a syntax error: Hydra's own message is the right one
    groups = {path.name for path in Path(config_dir).iterdir() if path.is_dir()}
    for override in overrides:
        key = override.key_or_group
        if override.is_add() or override.is_delete() or key.startswith("hydra.") or key in groups:
            continue
        if problem := unknown_dotted_key(key, schema):
            return problem
        if not override.is_sweep_override() and (problem := _bad_value(schema, key, override.value())):
            return problem
    return None


def _bad_value(schema: type, key: str, value: Any) -> str | None:
    """A message when ``value`` does not fit the type ``schema`` gives the dotted ``key``."""
    *parents, leaf = key.split(".")
    nested: dict[str, Any] = {leaf: value}
    for part in reversed(parents):
        nested = {part: nested}
    try:
        OmegaConf.merge(OmegaConf.structured(schema), nested)
    except OmegaConfBaseException as error:
        return bad_value_message("", error, key)
    return None


def unknown_group_option(config_dir: str | Path, args: Sequence[str]) -> str | None:
    """A one-line error for ``GROUP=NAME`` when no ``GROUP/NAME.yaml`` exists (Hydra would print its search path and
    exit 1), naming the valid options; None if all exist. Sweeps are checked option by option; ``null`` is valid
    for any group; ``--config-dir`` folders count as Hydra counts them.
    """
    roots = [Path(config_dir), *extra_config_dirs(args)]
    for arg in args:
        key, sep, value = arg.partition("=")
        key = key.lstrip("+")
        if not sep or "." in key or key.startswith(("~", "-", "hydra")) or not (Path(config_dir) / key).is_dir():
            continue
        valid = sorted({p.stem for root in roots for p in (root / key).glob("*.yaml")})
        for option in (o.strip() for o in value.split(",")):
            if option and option != "null" and option not in valid:
                near = difflib.get_close_matches(option, valid, n=1)
                hint = f"did you mean {key}={near[0]}? " if near else ""
                return f"unknown {key} option {option!r}: {hint}valid options: {', '.join(valid)}"
    return None


def extra_config_dirs(args: Sequence[str]) -> list[Path]:
    """The folders that ``--config-dir=DIR``, ``--config-dir DIR`` or ``-cd DIR`` add to Hydra's search path."""
    dirs = []
    for i, arg in enumerate(args):
        if arg.startswith("--config-dir="):
            dirs.append(Path(arg.split("=", 1)[1]))
        elif arg in ("--config-dir", "-cd") and i + 1 < len(args):
            dirs.append(Path(args[i + 1]))
    return dirs
