"""The speed columns of a grouped report (``compare_runs.py --group-by KEY --speed FILE...``), measured back to back.

Trainings that share a machine with other work measure their neighbours as much as themselves, so a study's own
tokens/s cannot compare its groups. This mode takes one trained run per group and direction and, one after another
in one process with nothing else running, times ``--train-steps`` real optimizer steps of the run's own config
(``nmt_tools.timing``) and beam search over the test split with the run's checkpoint at its test beam.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from nmt.analysis.cli import RunError
from nmt.common.provenance import device_name
from nmt.inference.engine import Translator
from nmt.model.checkpoint import CheckpointError, resolve_checkpoint
from nmt.train.resume import with_added_trainer_settings
from nmt.train.trainer import DistInfo, Trainer
from nmt_tools.timing import compose_config, measure_training, measure_translation


def add_arguments(arguments: argparse.ArgumentParser) -> None:
    arguments.add_argument("run_dirs", nargs="+", type=Path, help="trained run dirs with their checkpoints, one per "
                           "group and direction (e.g. each attention type's seed 42)")
    arguments.add_argument("--group-by", default="attention", metavar="KEY",
                           help="the key compare_runs.py --group-by groups by (default: %(default)s)")
    arguments.add_argument("--train-steps", type=int, default=100, help="timed optimizer steps per run")
    arguments.add_argument("--warmup-steps", type=int, default=10, help="untimed optimizer steps first")
    arguments.add_argument("--reps", type=int, default=3, help="timed beam decodings of the test split (median)")
    arguments.add_argument("--split", help="test split to decode (default: the run's first)")


def benchmark_study_speed(args: argparse.Namespace) -> tuple[dict[str, Any], torch.device]:
    """The ``study-speed`` mode: each run's training tokens/s and beam sentences/s, one run after another."""
    rows, device = [], torch.device("cpu")
    defaults = compose_config([], args.project_dir)
    for run_dir in args.run_dirs:
        # A run trained by an earlier version lacks the trainer settings added since: today's defaults fill them.
        cfg = with_added_trainer_settings(OmegaConf.load(run_dir / "config.yaml"), defaults.trainer)
        results = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
        try:
            checkpoint = resolve_checkpoint(run_dir)
        except CheckpointError:
            raise RunError(f"{run_dir} holds no checkpoint to decode with: pass trained runs whose checkpoints/ "
                           "are still there") from None
        with tempfile.TemporaryDirectory(prefix="nmt_study_speed_") as tmp:
            trainer = Trainer(cfg, Path(tmp) / "run", DistInfo())  # its checkpoints and events: scratch
            device = trainer.device
            print(f"{run_dir}: {args.warmup_steps} warm-up + {args.train_steps} timed steps", flush=True)
            training = measure_training(trainer, args.train_steps, args.warmup_steps)
            trainer.logger.close()
        split = args.split or next(iter(trainer.data.tests))
        text = trainer.data.tests[split]
        translator = Translator.from_checkpoint(checkpoint, device, trainer.precision, max_input_words=None)
        decode = argparse.Namespace(beam_sizes=[int(cfg.trainer.test_beam_size)], batch_tokens="auto", reps=args.reps)
        decoding = measure_translation(translator, list(text.src_text), list(text.tgt_text), decode,
                                       float(cfg.trainer.length_penalty))[0]
        group = results[args.group_by] if args.group_by in results else OmegaConf.select(cfg, args.group_by)
        rows.append({"run_dir": str(run_dir), "group": group,
                     "direction": f"{cfg.data.src_lang}-{cfg.data.tgt_lang}",
                     "train_tokens_per_s": training["target_tokens_per_s_median"],
                     "beam_sentences_per_s": decoding["sentences_per_s"], "beam_size": decoding["beam_size"],
                     "split": split, "training": training, "decoding": decoding})
    return {"device": {"type": device.type, "name": device_name(device)}, "group_by": args.group_by,
            "train_steps": args.train_steps, "runs": rows}, device
