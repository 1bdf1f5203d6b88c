"""The tools' one training timer: real optimizer steps of a ``Trainer`` over its real batches, timed.

``compose_config`` builds the training config the way ``train.py`` does, ``endless_batches`` yields the
trainer's batches in ``train.py``'s order, and ``measure_training`` times ``Trainer.train_step`` on them.
``benchmark.py train``, ``benchmark.py profile`` and the peer comparison all time training here.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from nmt.data import Batch
from nmt.model.seq2seq import count_parameters
from nmt.train.gpu_monitor import GpuMonitor
from nmt.train.schema import validate_config
from nmt.train.trainer import Trainer
from nmt_tools.cli import sync


def compose_config(overrides: list[str], project_dir: Path) -> DictConfig:
    """``project_dir/configs/train.yaml`` with Hydra overrides, validated as ``train.py`` validates it."""
    with initialize_config_dir(config_dir=str(Path(project_dir, "configs").resolve()), version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides))
    validate_config(cfg)
    return cfg


def endless_batches(trainer: Trainer) -> Iterator[Batch]:
    """The trainer's training batches, epoch after epoch, in the order ``train.py`` would use."""
    epoch = 0
    while True:
        trainer.train_loader.batch_sampler.set_epoch(epoch, start=0)
        yield from trainer.train_loader
        epoch += 1


def measure_training(trainer: Trainer, steps: int | None, warmup_steps: int) -> dict[str, Any]:
    """Time optimizer steps of ``trainer`` over its real batches (its model is updated by them).

    Args:
        trainer: a freshly built trainer.
        steps: timed steps; None = as many as one epoch has batches.
        warmup_steps: untimed steps first.

    Returns:
        Per-step medians and totals: target tokens/s, sentences/s, seconds per step, and the setup.
    """
    steps = trainer.batches_per_epoch if steps is None else steps
    if steps < 1:
        raise SystemExit(f"--train-steps must be >= 1, got {steps}")
    device, batches = trainer.device, endless_batches(trainer)
    for _ in range(warmup_steps):
        trainer.train_step(next(batches))  # the real step of train.py: forward, backward, clip, AdamW
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds, tokens, sentences, figures = [], [], [], []
    with GpuMonitor.for_device(device) as gpu:
        last = time.perf_counter()
        for _ in range(steps):
            batch = next(batches)  # batch fetching and collation count as training time
            result = trainer.train_step(batch)
            sync(device)  # the step reads nothing back: wait for the device to finish it
            now = time.perf_counter()
            seconds.append(now - last)
            tokens.append(result.tokens)
            sentences.append(int((batch.indices >= 0).sum()))  # a shape bucket's padding rows are no sentences
            figures.append(result.figures)
            last = now
    total = sum(seconds)
    skipped = int(torch.stack(figures)[:, 2].sum())
    return {
        "steps": steps, "warmup_steps": warmup_steps, "skipped_nonfinite_steps": skipped,
        "batches_per_epoch": trainer.batches_per_epoch, "target_tokens": sum(tokens), "sentences": sum(sentences),
        "seconds": total, "target_tokens_per_s_median": statistics.median(t / s for t, s in zip(tokens, seconds)),
        "target_tokens_per_s_total": sum(tokens) / total, "sentences_per_s_total": sum(sentences) / total,
        "seconds_per_step_median": statistics.median(seconds), "target_tokens_per_batch_mean": sum(tokens) / steps,
        "sentences_per_batch_mean": sum(sentences) / steps, "parameters": count_parameters(trainer.model),
        "precision": trainer.precision, "bf16_autocast": trainer.use_bf16, "gpu_utilisation": gpu.summary(),
        "cuda_peak_memory_allocated_mib": (torch.cuda.max_memory_allocated(device) / 2**20
                                           if device.type == "cuda" else None),
    }
