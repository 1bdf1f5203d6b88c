"""Config checking: fail before any work starts, naming the bad key and the valid choices.

Hydra already refuses a command-line override of a key that does not exist and an unknown option of a
config group. This module checks what Hydra cannot: keys and types inside the YAML files themselves
(an experiment file with a typo), the attention type's own options, and values with a fixed set of
choices. The schemas below hold types only; the defaults live in ``configs/`` (one place).

``resume_overrides`` turns ``trainer.resume=RUN`` on the command line into Hydra settings that make the
resumed run write into RUN alone.

Deliberately not here: composing the config (Hydra does it in ``train.py``).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nmt.attention import attention_names, attention_options
from nmt.device import PRECISIONS


class ConfigError(ValueError):
    """A config key, type or value that cannot work; the message says which and how to fix it."""


@dataclass
class CleanSchema:
    max_len: int | None = None
    max_ratio: float | None = None


@dataclass
class TokenizerSchema:
    model_type: str = MISSING
    vocab_size: int = MISSING
    joint: bool = MISSING
    character_coverage: float = MISSING


@dataclass
class DataSchema:
    corpus: str = MISSING
    src_lang: str = MISSING
    tgt_lang: str = MISSING
    train_split: str = MISSING
    valid_split: str = MISSING
    test_splits: list[str] = MISSING
    files: Any = None
    cache_dir: str = MISSING
    mirror: str | None = None
    invalid_utf8: str = MISSING
    clean: CleanSchema = field(default_factory=CleanSchema)
    tokenizer: TokenizerSchema = field(default_factory=TokenizerSchema)
    max_tokens: int = MISSING
    valid_max_tokens: int = MISSING
    num_workers: int = MISSING


@dataclass
class ModelSchema:
    emb_size: int = MISSING
    enc_hidden_size: int = MISSING
    dec_hidden_size: int = MISSING
    enc_layers: int = MISSING
    dec_layers: int = MISSING
    dropout: float = MISSING
    tie_embeddings: bool = MISSING


@dataclass
class TrainerSchema:
    seed: int = MISSING
    device: str = MISSING
    precision: str = MISSING
    max_epochs: int = MISSING
    max_steps: int | None = None
    lr: float = MISSING
    betas: list[float] = MISSING
    weight_decay: float = MISSING
    lr_schedule: str = MISSING
    warmup_steps: int = MISSING
    min_lr_ratio: float = MISSING
    clip_grad_norm: float | None = None
    label_smoothing: float = MISSING
    validate_every: int | None = None
    val_beam_size: int = MISSING
    test_beam_size: int = MISSING
    length_penalty: float = MISSING
    max_len_ratio: float = MISSING
    max_len: int = MISSING
    early_stopping_patience: int | None = None
    average_last: int = MISSING
    log_every: int = MISSING
    num_heatmaps: int = MISSING
    num_samples: int = MISSING
    max_nonfinite_steps: int = MISSING
    resume: str | None = None


GROUP_SCHEMAS: dict[str, type] = {"data": DataSchema, "model": ModelSchema, "trainer": TrainerSchema}
CHOICES: dict[str, tuple[str, ...]] = {
    "data.tokenizer.model_type": ("unigram", "bpe", "word"),
    "data.invalid_utf8": ("error", "replace"),
    "trainer.lr_schedule": ("cosine", "inverse_sqrt", "constant"),
    "trainer.precision": PRECISIONS,
}
POSITIVE: tuple[str, ...] = (
    "data.max_tokens", "data.valid_max_tokens", "data.tokenizer.vocab_size", "model.emb_size",
    "model.enc_hidden_size", "model.dec_hidden_size", "model.enc_layers", "model.dec_layers",
    "trainer.max_epochs", "trainer.lr", "trainer.val_beam_size", "trainer.test_beam_size", "trainer.max_len",
    "trainer.log_every",
)


def _unknown_key_error(path: str, key: str, valid: list[str]) -> ConfigError:
    near = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)  # 0.5: a truncated key (emb) still finds emb_size
    hint = f"did you mean {path}{near[0]}? " if near else ""
    return ConfigError(f"unknown config key {path}{key}: {hint}valid keys under {path or 'the top level'}: "
                       f"{', '.join(sorted(valid))}")


def _check_keys(node: Any, schema: type, path: str) -> None:
    """Every key of ``node`` must be a field of ``schema`` (recursively into nested schemas)."""
    schema_fields = {f.name: f for f in dataclasses.fields(schema)}
    for key in node:
        if key not in schema_fields:
            raise _unknown_key_error(path, str(key), list(schema_fields))
        nested = schema_fields[key].type
        nested_cls = globals().get(nested) if isinstance(nested, str) else nested
        if dataclasses.is_dataclass(nested_cls) and isinstance(node[key], DictConfig):
            _check_keys(node[key], nested_cls, f"{path}{key}.")


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
            raise _unknown_key_error("attention.", str(key), valid)


def validate_config(cfg: DictConfig) -> None:
    """Check a composed training config; raise ``ConfigError`` naming the first bad key.

    Args:
        cfg: the composed config with groups ``data``, ``model``, ``attention``, ``trainer``.
    """
    top_valid = [*GROUP_SCHEMAS, "attention", "hydra"]
    for key in cfg:
        if key not in top_valid:
            raise _unknown_key_error("", str(key), top_valid)
    for group, schema in GROUP_SCHEMAS.items():
        if group not in cfg:
            raise ConfigError(f"config group {group!r} is missing; train.yaml's defaults list selects one")
        _check_keys(cfg[group], schema, f"{group}.")
        try:  # types: OmegaConf names the full key and the expected type
            OmegaConf.merge(OmegaConf.structured(schema), cfg[group])
        except OmegaConfBaseException as error:
            key = getattr(error, "full_key", None) or "?"
            message = getattr(error, "msg", str(error)).strip()
            raise ConfigError(f"bad value for {group}.{key}: {message}") from None
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


def upgrade_saved_config(config: dict[str, Any]) -> dict[str, Any]:
    """A config saved by an earlier nmt, with renamed keys brought up to date (for resuming its run).

    ``trainer.amp`` (true: bf16 autocast on CUDA) became ``trainer.precision`` (``auto`` does the same).
    """
    trainer = dict(config.get("trainer") or {})
    if "amp" in trainer:
        amp = trainer.pop("amp")
        trainer.setdefault("precision", "auto" if amp else "fp32")
        config = {**config, "trainer": trainer}
    return config


def to_plain_dict(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as plain Python values, without Hydra's own section (for checkpoints/JSON)."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(plain, dict)
    plain.pop("hydra", None)
    return plain


def check_command_line_keys(config_dir: str | Path, config_name: str, args: Sequence[str]) -> str | None:
    """A one-line error for a command-line override of a key that does not exist, with the nearest key.

    Hydra refuses such an override too, but only says the key is "not in struct". This composes the
    config once (~0.1 s); on that error it composes again without the bad override and reports the key
    as ``validate_config`` reports a bad YAML key, with the closest existing one (``beam=3`` ->
    ``beam_size``). Sweep overrides (``a=x,y``) and ``hydra.*`` keys are left to Hydra.

    Args:
        config_dir: the folder of the primary config (``configs/``).
        config_name: ``train`` or ``translate``.
        args: the command-line arguments (``sys.argv[1:]``).

    Returns:
        The message, or None when every key exists (or Hydra should report the problem itself).
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides([a for a in args if "=" in a and not a.startswith("-")])
    except HydraException:
        return None  # a syntax error: Hydra's own message is the right one
    overrides = [o for o in parsed if not o.is_sweep_override() and not o.key_or_group.startswith("hydra.")]
    with initialize_config_dir(str(Path(config_dir).resolve()), version_base="1.3"):
        try:
            compose(config_name, overrides=[o.input_line for o in overrides])
            return None
        except HydraException as exc:
            bad = _overridden_missing_key(exc, [o.key_or_group for o in overrides])
            if bad is None:
                return None
        try:
            cfg = compose(config_name, overrides=[o.input_line for o in overrides if o.key_or_group != bad])
        except HydraException:
            return None
    # walk the dotted key down to the first part that does not exist, and name its valid siblings there
    node, path = cfg, ""
    for part in bad.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            valid = list(node.keys()) if isinstance(node, DictConfig) else []
            return str(_unknown_key_error(path, part, [str(key) for key in valid]))
        node, path = node[part], f"{path}{part}."
    return None


def _overridden_missing_key(exc: Exception, keys: list[str]) -> str | None:
    """The overridden key that Hydra's error says does not exist, if that is the error."""
    text = " ".join(str(e) for e in (exc, exc.__cause__) if e is not None)
    for key in keys:
        if f"Could not override '{key}'" in text or f"Key '{key.rpartition('.')[2]}' is not in struct" in text:
            return key
    return None


def resume_overrides(args: Sequence[str]) -> list[str]:
    """Hydra overrides that make ``train.py trainer.resume=RUN`` write only into RUN.

    Without them Hydra makes a new ``outputs/<date>/<time>_<attention>/`` holding only ``.hydra/`` and a
    ``train.log``. With them its run dir is RUN, so the log goes on in ``RUN/train.log``, and it writes
    no ``.hydra/`` (RUN keeps the one from its start; the resumed config goes to ``RUN/config.yaml``).

    Args:
        args: the command-line arguments (``sys.argv[1:]``).

    Returns:
        The overrides to append; none without ``trainer.resume``, in a sweep (``-m``), or when the
        command line sets ``hydra.run.dir`` itself.

    Raises:
        CheckpointError: the resume path is neither a run dir with ``checkpoints/last.pt`` nor a checkpoint file.
    """
    from nmt.checkpoint import resolve_checkpoint, resume_paths

    values = [a.split("=", 1)[1] for a in args if a.lstrip("+").startswith("trainer.resume=")]
    resume = values[-1].strip("'\"") if values else ""
    if resume in ("", "null") or any(a in ("-m", "--multirun") or a.startswith("hydra.run.dir=") for a in args):
        return []
    checkpoint, run_dir = resume_paths(resume)
    resolve_checkpoint(checkpoint)  # fail here, before Hydra creates a run dir for a run that cannot start
    return [f"hydra.run.dir={_hydra_quoted(str(run_dir))}", "hydra.output_subdir=null"]


def _hydra_quoted(value: str) -> str:
    """``value`` as a Hydra override value: as is when plain, else single-quoted (spaces, commas, brackets)."""
    if re.fullmatch(r"[\w./+@-]+", value):
        return value
    return "'" + value.replace("'", "\\'") + "'"
