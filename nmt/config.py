"""Settings checking for every entry point (``train.py``, ``translate.py``, ``serve.py``, ``backtranslate.py``):
fail before any work starts, naming the bad key and the valid choices; the training config's schema.

Where each setting and its default live (each default is written once):

- training: the keys and types of each section are the dataclasses here (``data``'s is
  ``nmt.data.prepare.DataSchema``); the values, with a comment on every key, are the YAML files of
  ``configs/``. A group's variants inherit from its first file and state only what differs
  (``model/small.yaml`` from ``model/default.yaml``, ``data/tatoeba.yaml`` from ``data/multi30k.yaml``);
  a nested settings block that only some runs use keeps its defaults in its dataclass
  (``data.tatoeba``: ``nmt.data.tatoeba.TatoebaSettings``; ``data.mixture`` entries:
  ``nmt.data.mixture.MixtureSourceSchema``). Code below the entry points (``Seq2Seq``, the data layer)
  receives values and does not restate them.
- ``translate.py`` and ``serve.py``: their settings dataclasses (``nmt.translate_job.TranslateSettings``,
  ``nmt.server.ServeSettings``) hold types *and* defaults, because the Python API (``Translator``,
  ``SearchOptions``) shares them; Hydra's ConfigStore gives them to the YAML files, which hold comments.
- ``backtranslate.py``: like translate.py, its settings (``nmt.backtranslation.BacktranslateSettings``)
  hold types and defaults, taking the search, sampling, device and precision defaults from the engine's
  dataclasses (``SearchOptions``, ``SamplingOptions``, ``EngineSettings``); the YAML file holds comments.

Checks: a command-line key is walked through the entry point's schema before Hydra composes anything
(``check_command_line_keys``: the nearest valid key, no composing, no reading of Hydra's messages); a
composed training config is checked for keys in YAML files, types (OmegaConf against the same
dataclasses), the attention type's own options and values with a fixed set of choices.

Deliberately not here: composing the config (Hydra does it in the entry points) and a resumed run's
config (``nmt.resume``).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nmt.attention import attention_names, attention_options
from nmt.data.prepare import DataSchema, resolve_data_config
from nmt.device import PRECISIONS
from nmt.setting_keys import bad_value_message, first_unknown_key, unknown_dotted_key, unknown_key_message


class ConfigError(ValueError):
    """A config key, type or value that cannot work; the message says which and how to fix it."""


@dataclass
class ModelSchema:
    emb_size: int = MISSING
    enc_hidden_size: int = MISSING
    dec_hidden_size: int = MISSING
    enc_layers: int = MISSING
    dec_layers: int = MISSING
    dropout: float = MISSING
    tie_embeddings: bool = MISSING
    output_hidden_size: int | None = MISSING
    layer_norm: bool = MISSING


@dataclass
class TrainerSchema:
    seed: int = MISSING
    device: str = MISSING
    precision: str = MISSING
    max_epochs: int = MISSING
    max_steps: int | None = MISSING
    lr: float = MISSING
    betas: list[float] = MISSING
    weight_decay: float = MISSING
    lr_schedule: str = MISSING
    warmup_steps: int = MISSING
    min_lr_ratio: float = MISSING
    clip_grad_norm: float | None = MISSING
    label_smoothing: float = MISSING
    validate_every: int | None = MISSING
    val_beam_size: int = MISSING
    test_beam_size: int = MISSING
    length_penalty: float = MISSING
    early_stopping_patience: int | None = MISSING
    average_last: int = MISSING
    log_every: int = MISSING
    num_heatmaps: int = MISSING
    num_samples: int = MISSING
    max_nonfinite_steps: int = MISSING
    resume: str | None = MISSING


@dataclass
class TrainSchema:
    """The sections of ``train.py``'s config; ``attention``'s keys depend on its type (checked after composing)."""

    data: DataSchema = field(default_factory=DataSchema)
    model: ModelSchema = field(default_factory=ModelSchema)
    attention: Any = MISSING
    trainer: TrainerSchema = field(default_factory=TrainerSchema)


GROUP_SCHEMAS: dict[str, type] = {"data": DataSchema, "model": ModelSchema, "trainer": TrainerSchema}
CHOICES: dict[str, tuple[str, ...]] = {
    "trainer.lr_schedule": ("cosine", "inverse_sqrt", "constant"),
    "trainer.precision": PRECISIONS,
}
POSITIVE: tuple[str, ...] = (
    "model.emb_size",
    "model.enc_hidden_size", "model.dec_hidden_size", "model.enc_layers", "model.dec_layers",
    "trainer.max_epochs", "trainer.lr", "trainer.val_beam_size", "trainer.test_beam_size",
    "trainer.log_every",
)


def _check_attention(attention: DictConfig) -> None:
    if "name" not in attention:
        raise ConfigError("attention.name is missing; choose one with attention=NAME "
                          f"({', '.join(attention_names())})")
    name = attention.name
    if name not in attention_names():
        valid_types = ", ".join(attention_names())
        raise ConfigError(f"unknown attention type attention.name={name!r}; valid types: {valid_types}")
    valid = ["name", "hidden_size", *attention_options(name)]
    for key in attention:
        if key not in valid:
            raise ConfigError(unknown_key_message("attention.", str(key), valid))


def validate_config(cfg: DictConfig) -> None:
    """Check a composed training config; raise ``ConfigError`` naming the first bad key.

    Args:
        cfg: the composed config with groups ``data``, ``model``, ``attention``, ``trainer``.
    """
    sections = {key: value for key, value in cfg.items() if key != "hydra"}
    if problem := first_unknown_key(sections, TrainSchema):
        raise ConfigError(problem)
    for group, schema in GROUP_SCHEMAS.items():
        if group not in cfg:
            raise ConfigError(f"config group {group!r} is missing; train.yaml's defaults list selects one")
        if group == "data":
            resolve_data_config(cfg.data)  # the data layer's own check (mixture entries named by index)
            continue
        try:  # types: OmegaConf names the full key and the expected type
            typed = OmegaConf.merge(OmegaConf.structured(schema), cfg[group])
        except OmegaConfBaseException as error:
            raise ConfigError(bad_value_message(f"{group}.", error)) from None
        if unset := sorted(OmegaConf.missing_keys(typed)):  # the schema has no values: a group file must set each key
            raise ConfigError(f"{group}.{unset[0]} has no value: set it ({group}.{unset[0]}=...) or add it to the "
                              f"{group} YAML file (configs/{group}/default.yaml sets every key)")
    _check_attention(cfg.attention)
    for key, choices in CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value not in choices:
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(choices)}")
    for key in POSITIVE:
        value = OmegaConf.select(cfg, key)
        if value is None or value <= 0:
            raise ConfigError(f"{key}={value!r} must be positive")
    betas = cfg.trainer.betas
    if not isinstance(betas, ListConfig) or len(betas) != 2:
        raise ConfigError(f"trainer.betas={betas} must be a list of two numbers, e.g. [0.9, 0.98]")
    model = cfg.model
    if model.tie_embeddings and model.output_hidden_size not in (None, model.emb_size):
        raise ConfigError(f"model.output_hidden_size={model.output_hidden_size} needs model.tie_embeddings=false "
                          f"(a tied output matrix is emb_size={model.emb_size} wide), or output_hidden_size=null")


def to_plain_dict(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as plain Python values, without Hydra's own section (for checkpoints/JSON)."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(plain, dict)
    plain.pop("hydra", None)
    return plain


def check_command_line_keys(config_dir: str | Path, args: Sequence[str], schema: type = TrainSchema) -> str | None:
    """A one-line error for a command-line override of a key the entry point does not have, with the nearest key.

    Each ``key=value`` is walked through ``schema`` (``trainer.lrr`` -> ``did you mean trainer.lr?``)
    before Hydra composes anything, and its value is checked against the type the schema gives it.
    Left to Hydra: group choices (``attention=NAME``, ``experiment=NAME``: Hydra lists the valid
    ones), additions and deletions (``+key``, ``~key``), ``hydra.*`` and syntax errors.

    Args:
        config_dir: the entry point's config folder; its sub-folders are the config groups.
        args: the command-line arguments (``sys.argv[1:]``).
        schema: the entry point's settings dataclass (``TrainSchema``, ``TranslateSettings``, ...).

    Returns:
        The message, or None.
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
    """A one-line error for ``GROUP=NAME`` on the command line when no ``GROUP/NAME.yaml`` exists.

    Hydra would answer with its search path and exit 1; this names the valid options instead. Sweeps
    (``attention=dot,general``) are checked option by option; ``null`` is a valid choice of any group.
    Folders added with ``--config-dir`` (``-cd``) count as Hydra counts them.

    Returns:
        The message, or None.
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
