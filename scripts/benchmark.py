"""Speed of one model config on this machine: training target tokens/s and translation sentences/s.

    python scripts/benchmark.py model=default attention=additive --train-steps 30 --warmup-steps 5
    python scripts/benchmark.py model=default attention=dot --checkpoint outputs/RUN_DIR    # real BLEU too
    python scripts/benchmark.py experiment=smoke trainer.device=cpu --skip-translate

Positional arguments are Hydra overrides of ``configs/train.yaml``, exactly as ``train.py`` takes them;
the model, data and optimizer are built by the project's own ``nmt.training.Trainer``, so the step
timed here is the step ``train.py`` runs (``trainer.precision``: bf16 autocast on CUDA by default; clipping,
AdamW, schedule). The translation part decodes in the same precision.

Training: ``--warmup-steps`` untimed optimizer steps (allocator, kernels, caches), then
``--train-steps`` timed steps over real batches of the configured corpus, in the training order. A
step's time runs from the end of the previous step to the end of this one, so it includes fetching
and collating the batch; on CUDA each step ends with ``torch.cuda.synchronize``. Reported: the
median of the per-step target tokens/s, and the total (all timed target tokens / all timed seconds).
Target tokens are the real (non-padding) tokens of ``tgt_out``, EOS included, as ``train.py`` logs.

Translation: ``scripts/benchmark_translate.py`` (greedy and beam 5, median of ``--reps``) on the
config's first test split, with ``--checkpoint`` if given; otherwise on the model just trained for
the benchmark's few steps, whose BLEU is meaningless (the JSON says so) and whose output lengths,
and so its speed, differ from a trained model's.

On CUDA, ``nvidia-smi`` is sampled every 200 ms during the timed training steps and during the
translation runs (``nmt.gpu_monitor``): median / mean / min utilisation and peak memory, in the JSON.

Writes JSON (device, versions, config, date, command, host CPU count) to
``docs/results/benchmark_<device>.json`` unless ``--out`` says otherwise. A benchmark, not a test:
it asserts nothing, and timings never go into the test suite.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO_ROOT / "configs"
sys.path.insert(0, str(REPO_ROOT))  # run as a script from anywhere, without installing the package
sys.path.insert(0, str(Path(__file__).resolve().parent))  # for benchmark_translate

import benchmark_translate  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from nmt.config import to_plain_dict, validate_config  # noqa: E402
from nmt.data import Batch, EncodedSplit  # noqa: E402
from nmt.gpu_monitor import GpuMonitor  # noqa: E402
from nmt.model import count_parameters  # noqa: E402
from nmt.provenance import device_name, device_slug, provenance  # noqa: E402
from nmt.training import DistInfo, Trainer  # noqa: E402

MEANINGLESS_BLEU_NOTE = (
    "no --checkpoint: translated with the model trained for the benchmark's few steps; its BLEU is "
    "meaningless and its output lengths (hence speed) differ from a trained model's"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of configs/train.yaml, e.g. model=default")
    parser.add_argument("--train-steps", type=int, default=100, help="timed optimizer steps")
    parser.add_argument("--warmup-steps", type=int, default=10,
                        help="untimed optimizer steps first (not the learning-rate warmup, trainer.warmup_steps)")
    parser.add_argument("--checkpoint", default=None,
                        help="run dir or .pt for the translation part (default: the freshly trained model)")
    parser.add_argument("--reps", type=int, default=3, help="timed translation runs per beam size (median)")
    parser.add_argument("--beam-sizes", type=int, nargs="+", default=[1, 5], help="1 = greedy")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="translation batch budget (translate.py's)")
    parser.add_argument("--translate-limit", type=int, default=None, help="translate only the first N test lines")
    parser.add_argument("--skip-translate", action="store_true", help="measure training only")
    parser.add_argument("--out", default=None, help="JSON path (default: docs/results/benchmark_<device>.json)")
    return parser.parse_args(argv)


def compose_config(overrides: list[str]) -> DictConfig:
    """``configs/train.yaml`` with Hydra overrides, validated as ``train.py`` validates it."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides))
    validate_config(cfg)
    return cfg


def sync(device: torch.device) -> None:
    """Wait for queued CUDA work, so a timer read afterwards covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def endless_batches(trainer: Trainer) -> Iterator[Batch]:
    """The trainer's training batches, epoch after epoch, in the order ``train.py`` would use."""
    epoch = 0
    while True:
        trainer.train_loader.batch_sampler.set_epoch(epoch, start=0)
        yield from trainer.train_loader
        epoch += 1


def measure_training(trainer: Trainer, steps: int | None, warmup_steps: int) -> dict[str, Any]:
    """Time optimizer steps of ``trainer`` over its real batches.

    Args:
        trainer: a freshly built trainer (its model is updated by the steps).
        steps: timed steps; None = as many as one epoch has batches.
        warmup_steps: untimed steps first.

    Returns:
        Per-step medians and totals: target tokens/s, sentences/s, seconds per step, and the setup.
    """
    steps = trainer.batches_per_epoch if steps is None else steps
    if steps < 1:
        raise SystemExit(f"--train-steps must be >= 1, got {steps}")
    device = trainer.device
    batches = endless_batches(trainer)
    for _ in range(warmup_steps):
        trainer._train_step(next(batches))  # the real step of train.py: forward, backward, clip, AdamW
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds, tokens, sentences, skipped = [], [], [], 0
    with GpuMonitor.for_device(device) as gpu:
        last = time.perf_counter()
        for _ in range(steps):
            batch = next(batches)  # batch fetching and collation count as training time
            loss, n_tokens, _, _ = trainer._train_step(batch)
            sync(device)  # _train_step already reads the loss (.item()), but the optimizer step runs after it
            now = time.perf_counter()
            seconds.append(now - last)
            tokens.append(n_tokens)
            sentences.append(batch.size)
            skipped += loss is None
            last = now
    total_seconds = sum(seconds)
    return {
        "steps": steps,
        "warmup_steps": warmup_steps,
        "skipped_nonfinite_steps": skipped,
        "batches_per_epoch": trainer.batches_per_epoch,
        "target_tokens": sum(tokens),
        "sentences": sum(sentences),
        "seconds": total_seconds,
        "target_tokens_per_s_median": statistics.median(t / s for t, s in zip(tokens, seconds)),
        "target_tokens_per_s_total": sum(tokens) / total_seconds,
        "sentences_per_s_total": sum(sentences) / total_seconds,
        "seconds_per_step_median": statistics.median(seconds),
        "target_tokens_per_batch_mean": sum(tokens) / steps,
        "sentences_per_batch_mean": sum(sentences) / steps,
        "parameters": count_parameters(trainer.model),
        "precision": trainer.precision,
        "bf16_autocast": trainer.use_bf16,
        "gpu_utilisation": gpu.summary(),
        "cuda_peak_memory_allocated_mib": (torch.cuda.max_memory_allocated(device) / 2**20
                                           if device.type == "cuda" else None),
    }


def write_split(split: EncodedSplit, folder: Path, limit: int | None) -> tuple[Path, Path]:
    """The raw source and reference lines of ``split`` as two files (benchmark_translate reads files)."""
    src, ref = split.src_text[:limit], split.tgt_text[:limit]
    src_path, ref_path = folder / f"{split.name}.src", folder / f"{split.name}.ref"
    src_path.write_text("".join(line + "\n" for line in src), encoding="utf-8")
    ref_path.write_text("".join(line + "\n" for line in ref), encoding="utf-8")
    return src_path, ref_path


def measure_translation(checkpoint: str | Path, src: Path, ref: Path, device: torch.device, precision: str,
                        args: argparse.Namespace, work_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Sentences/s per beam size, measured by ``scripts/benchmark_translate.py`` (its rows), and the GPU's
    utilisation over all of it (every beam size and rep together; model loading included)."""
    argv = ["--checkpoint", str(checkpoint), "--input", str(src), "--reference", str(ref),
            "--reps", str(args.reps), "--beam-sizes", *map(str, args.beam_sizes),
            "--batch-tokens", str(args.batch_tokens), "--device", str(device), "--precision", precision,
            "--out", str(work_dir / "translate_benchmark.json")]
    with GpuMonitor.for_device(device) as gpu:
        rows = benchmark_translate.main(argv)["results"]
    return rows, gpu.summary()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    cfg = compose_config(args.overrides)
    with tempfile.TemporaryDirectory(prefix="nmt_benchmark_") as tmp:
        work_dir = Path(tmp)
        # The Trainer writes its TensorBoard events (none here) and checkpoints into this scratch dir.
        trainer = Trainer(cfg, work_dir / "run", DistInfo())
        device = trainer.device
        print(f"training {cfg.attention.name} ({count_parameters(trainer.model)} parameters) on {device_name(device)}: "
              f"{args.warmup_steps} warm-up + {args.train_steps} timed steps", flush=True)
        training = measure_training(trainer, args.train_steps, args.warmup_steps)
        print(f"training: {training['target_tokens_per_s_median']:.0f} target tokens/s (median of steps), "
              f"{training['target_tokens_per_s_total']:.0f} in total over {training['seconds']:.1f} s", flush=True)

        translation: dict[str, Any] | None = None
        if not args.skip_translate:
            checkpoint = args.checkpoint
            if checkpoint is None:
                trainer.save("last")  # the freshly trained model, as a checkpoint benchmark_translate can load
                checkpoint = work_dir / "run"
            split = next(iter(trainer.data.tests.values()), trainer.data.valid)
            src, ref = write_split(split, work_dir, args.translate_limit)
            rows, gpu_utilisation = measure_translation(checkpoint, src, ref, device, trainer.precision, args,
                                                         work_dir)
            translation = {
                "checkpoint": str(args.checkpoint) if args.checkpoint else None,
                "bleu_meaningful": args.checkpoint is not None,
                "note": None if args.checkpoint else MEANINGLESS_BLEU_NOTE,
                "split": split.name,
                "sentences": len(split.src_text[: args.translate_limit]),
                "batch_tokens": args.batch_tokens,
                "reps": args.reps,
                "results": rows,
                "gpu_utilisation": gpu_utilisation,
            }
        trainer.logger.close()

    report = {
        "benchmark": "train+translate",
        **provenance("scripts/benchmark.py", argv),
        "device": {"type": device.type, "name": device_name(device)},
        "measured_without_gpu": device.type != "cuda",
        "config": {"overrides": list(args.overrides), **to_plain_dict(cfg)},
        "training": training,
        "translation": translation,
    }
    out = Path(args.out) if args.out else REPO_ROOT / "docs" / "results" / f"benchmark_{device_slug(device)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
