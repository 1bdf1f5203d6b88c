"""Settings checks for every entry point, before any work starts, naming the bad key and the valid choices; and the
training config's schema (keys and types here, values with comments in ``configs/``, each default written once).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nmt.common.device import PRECISIONS
from nmt.common.settings import ConfigError, bad_value_message, first_unknown_key, unknown_key_message
from nmt.data.prepare import DataSettings, resolve_data_config
from nmt.model.attention import attention_names, attention_options


def _positive(or_null: bool = False) -> Any:  # a field whose value must be above 0 (or, with or_null, None)
    return field(default=MISSING, metadata={"positive": True, "or_null": or_null})


@dataclass
class ModelSettings:
    emb_size: int = _positive()
    enc_hidden_size: int = _positive()
    dec_hidden_size: int = _positive()
    enc_layers: int = _positive()
    dec_layers: int = _positive()
    dropout: float = MISSING
    tie_embeddings: bool = MISSING
    output_hidden_size: int | None = MISSING
    layer_norm: bool = MISSING


@dataclass
class TrainerSettings:
    seed: int = MISSING
    device: str = MISSING
    precision: str = field(default=MISSING, metadata={"choices": PRECISIONS})
    cuda_graphs: str = MISSING  # true / false arrive as "True" / "False"; checked by cuda_graphs.resolve_cuda_graphs
    cuda_graphs_check: bool = MISSING
    bucket_width: int = _positive()
    max_epochs: int = _positive()
    max_steps: int | None = MISSING
    lr: float = _positive()
    betas: list[float] = MISSING
    weight_decay: float = MISSING
    lr_schedule: str = field(default=MISSING, metadata={"choices": ("cosine", "inverse_sqrt", "constant")})
    warmup_steps: int = MISSING
    min_lr_ratio: float = MISSING
    clip_grad_norm: float | None = MISSING
    label_smoothing: float = MISSING
    validate_every: int | None = MISSING
    val_beam_size: int = _positive()
    test_beam_size: int = _positive()
    length_penalty: float = MISSING
    early_stopping_patience: int | None = MISSING
    average_last: int = MISSING
    log_every: int = _positive()
    checkpoint_every_minutes: float | None = _positive(or_null=True)
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



def _check_attention(attention: DictConfig) -> None:
    if (name := attention.get("name")) not in attention_names():
        raise ConfigError(f"attention.name={name!r} is not an attention type; choose one with attention=NAME "
                          f"({', '.join(attention_names())})")
    valid = ["name", "hidden_size", *attention_options(name)]
    if unknown := [key for key in attention if key not in valid]:
        raise ConfigError(unknown_key_message("attention.", str(unknown[0]), valid))


def validate_config(cfg: DictConfig) -> None:
    """Check a composed training config (``data``, ``model``, ``attention``, ``trainer``); raise ``ConfigError``
    naming the first bad key.
    """
    sections = {key: value for key, value in cfg.items() if key != "hydra"}
    if problem := first_unknown_key(sections, TrainSettings):
        raise ConfigError(problem)
    for group, schema in (("data", DataSettings), ("model", ModelSettings), ("trainer", TrainerSettings)):
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
        for setting in fields(schema):  # the values a type cannot say: choices, positive numbers
            key, value, rule = f"{group}.{setting.name}", typed[setting.name], setting.metadata
            if "choices" in rule and value not in rule["choices"]:
                raise ConfigError(f"{key}={value!r} is not one of {', '.join(rule['choices'])}")
            if rule.get("positive") and (value is None or value <= 0) and not (value is None and rule["or_null"]):
                raise ConfigError(f"{key}={value!r} must be positive")
    _check_attention(cfg.attention)
    if len(cfg.trainer.betas) != 2:  # a list of numbers: its type is checked above
        raise ConfigError(f"trainer.betas={cfg.trainer.betas} must be a list of two numbers, e.g. [0.9, 0.98]")
    if cfg.model.tie_embeddings and cfg.model.output_hidden_size not in (None, cfg.model.emb_size):
        raise ConfigError(f"model.output_hidden_size={cfg.model.output_hidden_size} needs model.tie_embeddings=false "
                          f"(a tied output matrix is emb_size={cfg.model.emb_size} wide), or output_hidden_size=null")


