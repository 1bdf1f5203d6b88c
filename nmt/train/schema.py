"""Settings checks for every entry point, before any work starts, naming the bad key and the valid choices; and the
training config's schema (keys and types here, values with comments in ``configs/``, each default written once).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nmt.common.device import PRECISIONS
from nmt.common.settings import ConfigError, bad_value_message, first_unknown_key, unknown_key_message
from nmt.data.prepare import DataSettings, resolve_data_config
from nmt.model.attention import attention_names, attention_options


@dataclass
class ModelSettings:
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
class TrainerSettings:
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
class TrainSettings:
    """The sections of ``train.py``'s config; ``attention``'s keys depend on its type (checked after composing)."""

    data: DataSettings = field(default_factory=DataSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    attention: Any = MISSING
    trainer: TrainerSettings = field(default_factory=TrainerSettings)


GROUP_SETTINGS: dict[str, type] = {"data": DataSettings, "model": ModelSettings, "trainer": TrainerSettings}
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
    """Check a composed training config (``data``, ``model``, ``attention``, ``trainer``); raise ``ConfigError``
    naming the first bad key.
    """
    sections = {key: value for key, value in cfg.items() if key != "hydra"}
    if problem := first_unknown_key(sections, TrainSettings):
        raise ConfigError(problem)
    for group, schema in GROUP_SETTINGS.items():
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


