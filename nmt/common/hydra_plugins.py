"""Hydra's launcher and sweeper plugins (``hydra/launcher=joblib``, ``hydra/sweeper=optuna``) on an entry point's
command line: a plugin that is not installed names its package and extra, and a misspelt group, option or
``hydra.launcher.*``/``hydra.sweeper.*`` key names the nearest, in one line before Hydra starts (exit 2)."""

from __future__ import annotations

import difflib
import importlib.resources
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from nmt.common.settings import (
    ConfigError,
    config_search_dirs,
    first_unknown_key,
    nested,
    options_named,
    unknown_key_message,
)

# The plugins a user may ask for by name: option -> (the package that brings it, the extra of pyproject.toml that
# installs it, None where no extra does: those plugins are Hydra's, not tried with nmt).
PLUGINS: dict[str, dict[str, tuple[str, str | None]]] = {
    "hydra/launcher": {
        "joblib": ("hydra-joblib-launcher", "cluster"),
        "submitit_local": ("hydra-submitit-launcher", "cluster"),
        "submitit_slurm": ("hydra-submitit-launcher", "cluster"),
        "ray": ("hydra-ray-launcher", None),
        "ray_aws": ("hydra-ray-launcher", None),
        "rq": ("hydra-rq-launcher", None),
    },
    "hydra/sweeper": {
        "optuna": ("hydra-optuna-sweeper", "tune"),
        "ax": ("hydra-ax-sweeper", None),
        "nevergrad": ("hydra-nevergrad-sweeper", None),
    },
}
# The sections of Hydra's config that a plugin fills; their keys are checked against the chosen plugin's.
PLUGIN_SECTIONS = ("hydra.launcher", "hydra.sweeper")


def plugin_groups_help() -> str:
    """The lines ``--help`` prints about the plugins: what each extra brings, and which options are installed now."""
    installed = {group: ", ".join(hydra_group_options(group)) for group in PLUGINS}
    return "\n".join([
        "== Hydra's plugins (with -m; docs/guides/many-machines.md) ==",
        f"  hydra/launcher: installed {installed['hydra/launcher']}; joblib, submitit_local and submitit_slurm come "
        "with pip install -e '.[cluster]'",
        f"  hydra/sweeper: installed {installed['hydra/sweeper']}; optuna comes with pip install -e '.[tune]'",
        "  e.g. -m hydra/launcher=joblib hydra.launcher.n_jobs=2 KEY=A,B",
    ])


def hydra_group_options(group: str, config_dirs: Sequence[str | Path] = ()) -> list[str]:
    """The options of Hydra's own config group ``group`` (``hydra/launcher``) as Hydra finds them: its own, the
    installed plugins' and those of ``config_dirs`` (``GROUP/NAME.yaml``; the first is the entry point's)."""
    return sorted({option for folder in _search_roots(config_dirs)
                   for option in _loader(folder).get_group_options(group)})


def _hydra_groups(config_dirs: Sequence[str | Path] = ()) -> list[str]:
    """Hydra's own config groups (``hydra/launcher``, ``hydra/job_logging``, ...), the plugins' included."""
    roots = _search_roots(config_dirs)
    return sorted({f"hydra/{name}" for folder in roots for name in _loader(folder).list_groups("hydra")})


def _search_roots(config_dirs: Sequence[str | Path]) -> list[str]:
    """``config_dirs`` as absolute paths; Hydra's own configs alone when there are none."""
    hydras_own = str(importlib.resources.files("hydra") / "conf")
    return [str(Path(folder).absolute()) for folder in config_dirs] or [hydras_own]


def _loader(config_dir: str) -> Any:
    """Hydra's config loader for ``config_dir`` (its search path: Hydra's configs, the plugins', the folder's)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
        return GlobalHydra.instance().config_loader()


def missing_plugin_message(group: str, option: str) -> str | None:
    """``GROUP=OPTION needs the package P, which is not installed: pip install -e '.[EXTRA]'``, for a plugin we know
    by name; None for any other option."""
    if option not in PLUGINS.get(group, {}):
        return None
    package, extra = PLUGINS[group][option]
    install = (f"pip install -e '.[{extra}]' (the [{extra}] extra brings it)" if extra
               else f"pip install {package} (no extra of nmt brings it: not tried with nmt)")
    return f"{group}={option} needs the package {package}, which is not installed: {install}"


def hydra_plugin_problem(config_dir: str | Path, config_name: str, args: Sequence[str], schema: type,
                         groups: Collection[str]) -> str | None:
    """A one-line error for what the command line asks of Hydra's plugins: a ``hydra/GROUP=OPTION`` choice (a plugin
    that is not installed names its package and extra), a ``hydra.launcher.*``/``hydra.sweeper.*`` key the chosen
    plugin lacks, or a key the sweeper's ``params`` would tune that ``schema`` lacks (``groups``: the entry point's
    config groups, tuned as a whole); None if Hydra can take them all. Syntax errors are left to Hydra.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    asks = ("hydra/", "experiment=", *(f"{section}." for section in PLUGIN_SECTIONS))
    if not any(arg.lstrip("+~").startswith(asks) for arg in args):
        return None  # the common case: nothing of the plugins', and no Hydra start-up to pay for
    try:
        overrides = OverridesParser.create().parse_overrides([a for a in args if "=" in a and not a.startswith("-")])
    except HydraException:
        return None
    if problem := (hydra_group_problem(overrides, config_search_dirs(config_dir, args))
                   or params_on_the_command_line(overrides)):
        return problem
    hydra_cfg = _composed_hydra_config(config_dir, config_name, args)
    if hydra_cfg is None:
        return None  # Hydra refuses the choices for a reason of its own, and says so when it starts
    return plugin_key_problem(hydra_cfg, overrides) or tuned_key_problem(hydra_cfg, schema, groups)


def with_sweeper_direction(args: Sequence[str]) -> list[str]:
    """``args`` with ``hydra.sweeper.direction=maximize`` after ``hydra/sweeper=optuna`` when they set no direction:
    ``train.py`` returns validation BLEU, better when higher, and Optuna minimizes unless told. Placed beside the
    choice, not at the end: Hydra's argument parser takes overrides only in one run, not after ``--cfg job``.
    """
    args = list(args)
    if any(arg.lstrip("+").startswith("hydra.sweeper.direction=") for arg in args):
        return args
    for at, arg in enumerate(args):
        if arg.lstrip("+") == "hydra/sweeper=optuna":
            return [*args[:at + 1], "hydra.sweeper.direction=maximize", *args[at + 1:]]
    return args


def check_maximizing_sweep() -> None:
    """Inside a job: raise ``ConfigError`` when Optuna (chosen in an experiment file, where ``with_sweeper_direction``
    does not reach) minimizes what ``train.py`` returns, validation BLEU: the sweep would look for the worst model.
    """
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return  # called as a function, not as a Hydra job
    hydra_cfg = HydraConfig.get()
    if OmegaConf.select(hydra_cfg, "runtime.choices.hydra/sweeper") != "optuna":
        return
    direction = OmegaConf.select(hydra_cfg, "sweeper.direction")
    if str(getattr(direction, "name", direction)).lower() != "maximize":
        raise ConfigError(f"hydra.sweeper.direction={getattr(direction, 'name', direction)}: train.py returns "
                          "validation BLEU, better when higher; set hydra.sweeper.direction=maximize")


def hydra_group_problem(overrides: Sequence[Any], config_dirs: Sequence[str | Path]) -> str | None:
    """A one-line error for ``hydra/GROUP=OPTION`` overrides (parsed) that Hydra cannot compose: a group Hydra does not
    have, a plugin that is not installed (naming the package and the extra), or an option nobody has (naming the
    nearest); None if all are there.
    """
    groups = _hydra_groups(config_dirs)
    for override in overrides:
        group = override.key_or_group
        if not group.startswith("hydra/") or override.is_delete():
            continue
        if group not in groups:
            near = difflib.get_close_matches(group, groups, n=1)
            hint = f"did you mean {near[0]}? " if near else ""
            return f"unknown config group {group}: {hint}Hydra's groups: {', '.join(groups)}"
        valid = hydra_group_options(group, config_dirs)
        for option in options_named(override):
            if option in valid or option == "null":
                continue
            if message := missing_plugin_message(group, option):
                return message
            near = difflib.get_close_matches(option, valid, n=1)
            hint = f"did you mean {group}={near[0]}? " if near else ""
            return f"unknown {group} option {option!r}: {hint}valid options: {', '.join(valid)}"
    return None


def params_on_the_command_line(overrides: Sequence[Any]) -> str | None:
    """A one-line error for ``hydra.sweeper.params={KEY: SPACE}`` on the command line: Hydra cannot set it there
    (merged into the sweeper's empty ``params`` it fails in OmegaConf, exit 1 and a traceback; unquoted, the space
    is an object its config cannot hold). The line gives the forms that work, with the user's own key and space:
    the space as its own override (Hydra's way for Optuna), or ``params`` in an experiment file.
    """
    for override in overrides:
        params = override.value() if override.key_or_group == "hydra.sweeper.params" else None
        if isinstance(params, dict) and params and not override.is_sweep_override():
            key = str(next(iter(params)))
            text = _raw_value(override.input_line, key) or "interval(0.1,0.5)"
            return (f"hydra.sweeper.params cannot be set on the command line (Hydra cannot merge a dict into the "
                    f"sweeper's empty params): pass each search space as its own override, {key}='{text}', "
                    "or set hydra.sweeper.params in an experiment file (docs/guides/many-machines.md)")
    return None


def _raw_value(line: str, key: str) -> str | None:
    """The text of ``key``'s value in a ``{key: value, ...}`` override, as typed (up to the comma or brace that
    closes it outside brackets)."""
    start = line.find(f"{key}:")
    if start < 0:
        return None
    depth, text = 0, ""
    for char in line[start + len(key) + 1:]:
        depth += char in "([{"
        depth -= char in ")]}"
        if depth < 0 or (depth == 0 and char == ","):
            break
        text += char
    return text.strip().strip("'\"") or None


def _plugin_key_overrides(overrides: Sequence[Any]) -> Iterator[Any]:
    """The ``hydra.launcher.KEY=...`` / ``hydra.sweeper.KEY=...`` overrides that set a key (not ``+``/``~``)."""
    for override in overrides:
        key = override.key_or_group
        if key.startswith(tuple(f"{section}." for section in PLUGIN_SECTIONS)) and not (
                override.is_add() or override.is_delete() or override.is_force_add()):
            yield override


def plugin_key_problem(hydra_cfg: DictConfig, overrides: Sequence[Any]) -> str | None:
    """A one-line error for a ``hydra.launcher.*`` or ``hydra.sweeper.*`` key that the chosen launcher or sweeper
    (in ``hydra_cfg``, Hydra's composed config) does not have (``hydra.launcher.n_job``: did you mean
    ``hydra.launcher.n_jobs``?), saying which plugin was chosen; None if all fit.
    """
    for override in _plugin_key_overrides(overrides):
        if problem := _unknown_structured_key(hydra_cfg, override.key_or_group):
            section = override.key_or_group.split(".")[1]  # launcher | sweeper
            chosen = OmegaConf.select(hydra_cfg, f"runtime.choices.hydra/{section}")
            return f"{problem} (the {section} is hydra/{section}={chosen})"
    return None


def tuned_key_problem(hydra_cfg: DictConfig, schema: type, groups: Collection[str]) -> str | None:
    """The unknown-key message for the first key of the sweeper's ``params`` (an experiment's search space, tuned
    by Optuna) that is neither one of ``groups`` nor in ``schema``: Hydra would stop at the first trial."""
    params = OmegaConf.select(hydra_cfg, "sweeper.params")
    for key in params.keys() if isinstance(params, DictConfig) else ():
        if str(key) not in groups and (problem := first_unknown_key(nested(str(key), None), schema)):
            return f"{problem} (in hydra.sweeper.params)"
    return None


def _composed_hydra_config(config_dir: str | Path, config_name: str, args: Sequence[str]) -> DictConfig | None:
    """Hydra's own config as the plugin choices (``hydra/...=``) and an experiment would make it, or None;
    ``--config-dir`` folders are searched as Hydra searches them."""
    from hydra import compose, initialize_config_dir

    chosen = [arg for arg in args if arg.lstrip("+").startswith(("hydra/", "experiment="))]
    if extra := config_search_dirs(config_dir, args)[1:]:
        chosen.append("hydra.searchpath=[" + ",".join(f"'file://{Path(d).absolute()}'" for d in extra) + "]")
    try:
        with initialize_config_dir(config_dir=str(Path(config_dir).absolute()), version_base="1.3"):
            return compose(config_name, overrides=chosen, return_hydra_config=True).hydra
    except Exception:  # noqa: BLE001  # whatever Hydra refuses, it says so itself when it starts
        return None


def _unknown_structured_key(root: DictConfig, dotted: str) -> str | None:
    """The one-line error for ``dotted`` (``hydra.launcher.n_job``) when Hydra would not set it: a plugin's section
    (a dataclass) without that key, naming the nearest; or a new key in a free-form mapping
    (``additional_parameters``), which Hydra adds only with a ``+``. None when the key is there."""
    node: Any = root
    parts = dotted.split(".")[1:]  # the root is hydra's own config
    for depth, part in enumerate(parts):
        if not isinstance(node, DictConfig):
            return None
        if part not in node:
            path = "hydra." + "".join(f"{p}." for p in parts[:depth])
            if OmegaConf.get_type(node) in (dict, None):  # a mapping: any key, added with +
                return f"{path}{part} is a new key under {path.rstrip('.')}: add it with a plus, +{dotted}=VALUE"
            return unknown_key_message(path, part, node.keys())
        node = node[part]
    return None
