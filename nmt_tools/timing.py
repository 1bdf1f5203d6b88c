"""The tools' timers: real optimizer steps of a ``Trainer`` over its real batches, and a ``Translator`` on a file.

``compose_config`` builds the training config the way ``train.py`` does, ``endless_batches`` yields the
trainer's batches in ``train.py``'s order, and ``measure_training`` times ``Trainer.train_step`` on them.
``benchmark.py train``, ``benchmark.py profile`` and the peer comparison all time training here;
``measure_translation`` times translation per beam size for ``benchmark.py``'s modes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from nmt.common.metrics import corpus_scores
from nmt.data import Batch
from nmt.inference.engine import Translator
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


def measure_translation(translator: Translator, lines: list[str], refs: list[str] | None, args: argparse.Namespace,
                        length_penalty: float = 1.0, keep: bool = False) -> list[dict[str, Any]]:
    """Sentences/s per beam size in ``args.beam_sizes``: the median of ``args.reps`` timed translations of
    ``lines`` (encode, batch, search, detokenize) after one untimed warm-up; BLEU/chrF when ``refs`` is given;
    ``keep``: the last run's translations too, as the row's ``translations``."""
    rows = []
    for beam in args.beam_sizes:
        options = {"beam_size": beam, "length_penalty": length_penalty, "batch_tokens": args.batch_tokens}
        translator.translate(lines[:64], **options)  # warm-up: allocator, kernels, caches
        times, hyps = [], []
        for _ in range(args.reps):
            sync(translator.device)
            start = time.perf_counter()
            hyps = [result.text for result in translator.translate(lines, **options)]
            sync(translator.device)
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        row: dict[str, Any] = {"mode": "greedy" if beam == 1 else f"beam{beam}", "beam_size": beam,
                               "sentences": len(lines), "sentences_per_s": len(lines) / median,
                               "seconds_median": median, "seconds_all": times}
        if keep:
            row["translations"] = hyps
        if refs is not None:
            scores = corpus_scores(hyps, refs)
            row.update(bleu=scores["bleu"], chrf=scores["chrf"], bleu_signature=scores["bleu_signature"])
        rows.append(row)
        quality = f", BLEU {row['bleu']:.2f}" if "bleu" in row else ""
        print(f"{row['mode']:>8}: {row['sentences_per_s']:8.1f} sentences/s "
              f"(median of {args.reps}: {median:.2f} s for {len(lines)} sentences{quality})", flush=True)
    return rows
