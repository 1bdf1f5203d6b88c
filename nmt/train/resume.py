"""Resuming a run exactly where it stopped: which checkpoint ``trainer.resume`` means, the config the resumed run
uses (the checkpoint's, with this invocation's trainer settings on top), and the state put back.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from nmt.common.settings import ConfigError
from nmt.model.checkpoint import CHECKPOINT_DIR, resolve_checkpoint, upgrade_saved_config
from nmt.train.distributed import DistInfo, set_rng_state
from nmt.train.progress import Progress

log = logging.getLogger(__name__)


def resume_overrides(args: Sequence[str]) -> list[str]:
    """Hydra overrides that make ``train.py trainer.resume=RUN`` write only into RUN: the log goes on in
    ``RUN/train.log``, no new ``outputs/<date>/...`` folder and no ``.hydra/`` (the resumed config goes to
    ``RUN/config.yaml``). Empty without ``trainer.resume``, in a sweep (``-m``), or when the command line sets
    ``hydra.run.dir`` itself.

    Raises:
        CheckpointError: the resume path is neither a run dir with ``checkpoints/last.pt`` nor a checkpoint file.
    """
    values = [a.split("=", 1)[1] for a in args if a.lstrip("+").startswith("trainer.resume=")]
    resume = values[-1].strip("'\"") if values else ""
    if resume in ("", "null") or any(a in ("-m", "--multirun") or a.startswith("hydra.run.dir=") for a in args):
        return []
    checkpoint, run_dir = resume_paths(resume)
    resolve_checkpoint(checkpoint)  # fail here, before Hydra creates a run dir for a run that cannot start
    return [f"hydra.run.dir={_hydra_quoted(str(run_dir))}", "hydra.output_subdir=null"]


def _hydra_quoted(value: str) -> str:
    """``value`` as a Hydra override value: as is when plain, else single-quoted (spaces, commas, brackets)."""
    return value if re.fullmatch(r"[\w./+@-]+", value) else "'" + value.replace("'", "\\'") + "'"


def resume_paths(resume: str | Path) -> tuple[Path, Path]:
    """The checkpoint a ``trainer.resume`` value continues from, and the run dir to write into: a run dir resumes
    from ``checkpoints/last.pt``; ``RUN/checkpoints/NAME.pt`` from itself, writing on into ``RUN``.
    """
    resume = Path(resume)
    return (resume / CHECKPOINT_DIR / "last.pt", resume) if resume.is_dir() else (resume, resume.parent.parent)


def with_added_trainer_settings(saved: dict[str, Any] | DictConfig, trainer: DictConfig) -> DictConfig:
    """A saved run config as this version reads it: renamed keys updated, trainer settings added since taken from
    ``trainer`` (how to train on, not what the run is)."""
    container = OmegaConf.to_container(saved) if isinstance(saved, DictConfig) else saved
    saved = OmegaConf.create(upgrade_saved_config(container))
    added = {k: v for k, v in OmegaConf.to_container(trainer).items() if k not in (saved.get("trainer") or {})}
    return OmegaConf.merge(saved, {"trainer": added})


def resume_config(cfg: DictConfig, state: dict[str, Any]) -> DictConfig:
    """The checkpoint's config with this invocation's ``trainer`` keys on top: under Hydra only the overrides typed
    on the command line, so a run started with ``experiment=smoke`` keeps its settings on a bare resume, and the
    trainer settings added since the checkpoint was written. Warns about each data, model or attention setting
    the user gave that the checkpoint's overrides (all of them outside Hydra, where the caller gave ``cfg``).
    """
    from hydra.core.hydra_config import HydraConfig

    saved = with_added_trainer_settings(state["config"], cfg.trainer)
    try:
        hydra_config = HydraConfig.get()
    except ValueError:  # not running under Hydra (tests, notebooks): take this config's trainer section
        merged = OmegaConf.merge(saved, {"trainer": cfg.trainer})
        given = None
    else:
        typed = hydra_config.overrides.task
        overrides = [o.lstrip("+~") for o in typed if "." in o.split("=")[0] and not o.startswith("hydra.")]
        merged = OmegaConf.merge(saved, OmegaConf.from_dotlist(overrides))
        refuse_changed_run(saved, merged, overrides)
        given = given_on_command_line(cfg, hydra_config.job.config_name)
    warn_kept_settings(cfg, merged, given)
    return merged


RUN_GROUPS = ("data", "model", "attention")  # what a run is: the checkpoint's values win on resume


def given_on_command_line(cfg: DictConfig, config_name: str) -> set[str]:
    """The ``group.key`` settings (data, model, attention) whose value this invocation's command line changed from
    the config file's defaults: typed as keys or brought by a group choice such as ``experiment=...``.
    """
    from hydra import compose

    defaults = compose(config_name=config_name)
    return {f"{group}.{key}" for group in RUN_GROUPS if OmegaConf.select(cfg, group) is not None
            for key, value in _plain(cfg, group).items() if _plain(defaults, group).get(key) != value}


def _plain(cfg: DictConfig, group: str) -> dict[str, Any]:
    return OmegaConf.to_container(cfg[group], resolve=True) if OmegaConf.select(cfg, group) is not None else {}


def warn_kept_settings(cfg: DictConfig, merged: DictConfig, given: set[str] | None) -> None:
    """One warning naming each setting of ``given`` (``None``: every setting) where the checkpoint's value wins."""
    differ = []
    for group in RUN_GROUPS:
        if OmegaConf.select(cfg, group) is None:
            continue
        now, then = _plain(cfg, group), _plain(merged, group)
        differ += [f"{group}.{key}={then.get(key)!r} (here {now.get(key)!r})" for key in sorted(set(now) | set(then))
                   if now.get(key) != then.get(key) and (given is None or f"{group}.{key}" in given)]
    if differ:
        log.warning("resuming with the checkpoint's %s, not this invocation's", ", ".join(differ))


# Where the data lives and how it is loaded may change on resume; what it is may not.
RESUME_MAY_CHANGE = ("data.cache_dir", "data.mirror", "data.num_workers", "data.valid_max_tokens")


def refuse_changed_run(saved: DictConfig, merged: DictConfig, overrides: list[str]) -> None:
    """Refuse a resume whose command line changes the model, attention or data (the weights would not fit).

    Raises:
        ConfigError: naming the first such key, its value in the checkpoint and the fix.
    """
    for override in overrides:
        key = override.split("=", 1)[0]
        if key.split(".")[0] not in ("model", "attention", "data") or key in RESUME_MAY_CHANGE:
            continue
        before, after = OmegaConf.select(saved, key), OmegaConf.select(merged, key)
        if before != after:
            raise ConfigError(f"cannot resume with {key}={after!r}: the checkpoint's run has {key}={before!r}, and "
                              "its weights and data are made for that. Resume without it, or start a new run.")


def restore_run(state: dict[str, Any], model: Any, optimizer: Any, scheduler: Any, scaler: Any, tcfg: DictConfig,
                info: DistInfo) -> Progress:
    """Put a checkpoint's state back into a run's objects; returns the run's progress. ``trainer.lr``, ``betas`` and
    ``weight_decay`` are then put back in force from this run's config (unchanged values: the same numbers).
    """
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    scheduler.base_lrs = [float(tcfg.lr)] * len(optimizer.param_groups)
    factor = scheduler.lr_lambdas[0](scheduler.last_epoch)
    for group in optimizer.param_groups:
        group.update(lr=float(tcfg.lr) * factor, initial_lr=float(tcfg.lr),
                     betas=tuple(float(b) for b in tcfg.betas), weight_decay=float(tcfg.weight_decay))
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
    scaler.load_state_dict(state["scaler"])
    saved_rng = state["rng"] if isinstance(state["rng"], list) else [state["rng"]]  # older checkpoints: one dict
    if len(saved_rng) != info.world_size and info.is_main:
        log.warning("the checkpoint holds RNG states for %d process(es), this run has %d: the dropout streams "
                    "(and with another world size, the data shares) differ from the uninterrupted run's",
                    len(saved_rng), info.world_size)
    set_rng_state(saved_rng[info.rank % len(saved_rng)])
    return Progress(**state["progress"])
