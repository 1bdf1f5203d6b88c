"""Settings checks every entry point shares: a key walked through its section's dataclass, naming the nearest."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    """A config key, type or value that cannot work; the message says which and how to fix it."""


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


def first_unknown_key(node: Mapping[str, Any], schema: type, path: str = "") -> str | None:
    """The message for the first key of ``node`` (recursively) that ``schema`` does not have, else None. Below a
    free-form field (``data.files``: ``Any`` or a dict) any key goes.
    """
    names = [f.name for f in dataclasses.fields(schema)]
    for key, value in node.items():
        if key not in names:
            return unknown_key_message(path, str(key), names)
        nested = typing.get_type_hints(schema)[key]
        if dataclasses.is_dataclass(nested) and isinstance(value, Mapping):
            if problem := first_unknown_key(value, nested, f"{path}{key}."):
                return problem
    return None


def nested(key: str, value: Any) -> dict[str, Any]:
    """``{"a": {"b": value}}`` for the dotted ``key`` ``a.b``."""
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def to_plain_dict(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as plain Python values, without Hydra's own section (for checkpoints/JSON)."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("hydra", None)
    return plain


def config_groups(config_dir: str | Path, config_name: str) -> list[str]:
    """The config groups that ``config_name``'s defaults list names (``GROUP=OPTION`` on the command line), in its
    order; Hydra's own (``hydra/...``) left out. An entry point takes these and no other folder of ``config_dir``.
    """
    defaults = OmegaConf.load(Path(config_dir) / f"{config_name}.yaml").get("defaults") or []
    names = [key.split()[-1].split("@")[0] for entry in defaults if isinstance(entry, Mapping) for key in entry]
    return [name for name in names if not name.startswith("hydra/")]  # "optional experiment" -> experiment


def check_command_line_keys(config_dir: str | Path, args: Sequence[str], schema: type,
                            groups: Collection[str] | None = None) -> str | None:
    """A one-line error for a command-line key the entry point does not have, naming the nearest; None if all fit.

    Each ``key=value`` of ``args`` is walked through ``schema`` (the entry point's settings dataclass;
    ``trainer.lrr`` -> ``did you mean trainer.lr?``) before Hydra composes anything, and its value checked
    against the schema's type. ``groups``: the config groups the entry point takes (``config_groups``; None: every
    folder of ``config_dir``); another folder's name is a key like any other, and refused as one. Their choices,
    ``+key``/``~key`` and syntax errors are left to Hydra; ``hydra.*`` and ``hydra/*`` to ``nmt.common.hydra_plugins``.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        overrides = OverridesParser.create().parse_overrides([a for a in args if "=" in a and not a.startswith("-")])
    except HydraException:
        return None  # a syntax error: Hydra's own message is the right one
    folders = {path.name for path in Path(config_dir).iterdir() if path.is_dir()}
    groups = folders if groups is None else set(groups)
    for override in overrides:
        key = override.key_or_group
        if key in groups or key.startswith(("hydra.", "hydra/")):  # Hydra's own: nmt.common.hydra_plugins checks them
            continue
        if (override.is_add() or override.is_delete()) and key not in folders:
            continue  # +key, ~key: Hydra's to check; a folder that is not this entry point's group is refused below
        if problem := first_unknown_key(nested(key, None), schema):
            return problem
        if override.is_sweep_override():
            continue
        try:  # the value against the schema's type
            OmegaConf.merge(OmegaConf.structured(schema), nested(key, override.value()))
        except OmegaConfBaseException as error:
            return bad_value_message("", error, key)
    return None


def config_search_dirs(config_dir: str | Path, args: Sequence[str]) -> list[Path]:
    """Hydra's search path for configs: ``config_dir`` and the folders of ``--config-dir=DIR``, ``--config-dir DIR``
    or ``-cd DIR`` on the command line."""
    extra = [arg.split("=", 1)[1] for arg in args if arg.startswith("--config-dir=")]
    extra += [value for flag, value in zip(args, args[1:]) if flag in ("--config-dir", "-cd")]
    return [Path(folder) for folder in (config_dir, *extra)]


def options_named(override: Any) -> list[str]:
    """The options a parsed ``GROUP=...`` override names: one, each of a choice sweep (``a,b``, ``choice(a,b)``), or
    none that can be listed (a glob, a range)."""
    if not override.is_sweep_override():
        value = override.value()
        return [] if value is None else [str(value)]
    kind = override.value_type.name  # CHOICE_SWEEP, SIMPLE_CHOICE_SWEEP, GLOB_CHOICE_SWEEP, RANGE_SWEEP, ...
    return [str(option) for option in override.sweep_string_iterator()] if kind.endswith("CHOICE_SWEEP") \
        and not kind.startswith("GLOB") else []


def unknown_group_option(config_dir: str | Path, args: Sequence[str], groups: Collection[str] | None = None
                         ) -> str | None:
    """A one-line error for ``GROUP=NAME`` when no ``GROUP/NAME.yaml`` exists (Hydra would print its search path and
    exit 1), naming the valid options; None if all exist. Sweeps (``a,b``, ``choice(a,b)``) are checked option by
    option; ``null`` is valid for any group; ``--config-dir`` folders count as Hydra counts them. ``groups``: the
    groups checked (None: every folder of ``config_dir``).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    roots = config_search_dirs(config_dir, args)
    parser = OverridesParser.create()
    for arg in args:
        key, sep, _ = arg.partition("=")
        key = key.lstrip("+")
        if not sep or "." in key or key.startswith(("~", "-", "hydra")) or not (Path(config_dir) / key).is_dir():
            continue
        if groups is not None and key not in groups:
            continue  # not a group of this entry point: check_command_line_keys refuses it as a key
        try:
            override = parser.parse_override(arg)
        except HydraException:
            continue  # a syntax error: Hydra's own message is the right one
        valid = sorted({p.stem for root in roots for p in (root / key).glob("*.yaml")})
        for option in options_named(override):
            if option and option != "null" and option not in valid:
                near = difflib.get_close_matches(option, valid, n=1)
                hint = f"did you mean {key}={near[0]}? " if near else ""
                return f"unknown {key} option {option!r}: {hint}valid options: {', '.join(valid)}"
    return None


def keys_on_command_line() -> list[str] | None:
    """The keys this Hydra run's command line set (``beam_size=1``: ``beam_size``); None outside a Hydra run."""
    from hydra.core.hydra_config import HydraConfig

    try:
        typed = HydraConfig.get().overrides.task
    except ValueError:  # not running under Hydra (tests, notebooks)
        return None
    return [override.split("=", 1)[0].lstrip("+~") for override in typed]
