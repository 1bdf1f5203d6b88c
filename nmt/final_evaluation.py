"""The end of a training run: the best weights scored on every split, ``results.json``, the printed summary.

After the loop, rank 0 loads ``checkpoints/best.pt`` and scores it with beam search
(``trainer.test_beam_size``, ``trainer.length_penalty``) on the validation split and every test split;
with ``trainer.average_last=N`` the average of the last N validation checkpoints' weights is scored too
(under ``averaged``). ``results.json`` gets those scores with sacrebleu's signatures plus the run's
summary (steps, clock, tokens/s, device, versions, every validation); the best checkpoint's test
translations go to ``translations/<split>.<tgt_lang>``; the terminal gets a short summary.

It reads the run it reports on (``FinishedRun``: what of ``nmt.training.Trainer`` it uses) and changes
only its model's weights (restored to the best checkpoint's at the end).

Deliberately not here: decoding and teacher-forced loss (``Trainer.decode``,
``Trainer.teacher_forced_loss``, shared with validation), scoring (``nmt.evaluation``), and DDP
(the caller runs this on rank 0 alone).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Protocol

import torch
from omegaconf import DictConfig

from nmt.checkpoint import RunCheckpoints
from nmt.data import EncodedSplit, PreparedData
from nmt.distributed import DistInfo
from nmt.evaluation import corpus_scores
from nmt.model import Seq2Seq, count_parameters
from nmt.progress import Progress
from nmt.provenance import device_name, host, library_versions
from nmt.tensorboard import RunLogger


class FinishedRun(Protocol):
    """What the final evaluation reads of a training run (``nmt.training.Trainer`` is one)."""

    cfg: DictConfig
    tcfg: DictConfig
    run_dir: Path
    info: DistInfo
    model: Seq2Seq
    data: PreparedData
    data_ranks: list[dict[str, Any]]  # each rank's data fingerprint and mapped training files
    device: torch.device
    precision: str
    use_bf16: bool
    progress: Progress
    checkpoints: RunCheckpoints
    logger: RunLogger
    batches_per_epoch: int
    setup_seconds: float
    gpu_utilisation: dict[str, Any]

    def decode(self, split: EncodedSplit, beam_size: int) -> list[str]: ...

    def teacher_forced_loss(self, split: EncodedSplit) -> float: ...


def final_evaluation(trainer: FinishedRun, stopped_early: bool) -> dict[str, Any]:
    """Score the best (and averaged) weights of ``trainer`` after its loop, write ``results.json`` (recording
    ``stopped_early``) and the TensorBoard HParams, print a summary; returns the contents of ``results.json``."""
    started = time.perf_counter()
    best = trainer.checkpoints.load("best")
    trainer.model.load_state_dict(best["model"])
    results = evaluate_weights(trainer, "best", best["progress"]["step"])
    averaged = trainer.checkpoints.averaged_weights()
    if averaged is not None:
        trainer.model.load_state_dict(averaged)
        results["averaged"] = evaluate_weights(trainer, f"average of last {trainer.tcfg.average_last}", None)
        trainer.model.load_state_dict(best["model"])
    results.update(run_summary(trainer, stopped_early))
    results["final_evaluation_seconds"] = time.perf_counter() - started
    path = trainer.run_dir / "results.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(format_results(results, path), flush=True)
    trainer.logger.hparams(*hparams_and_metrics(trainer.cfg, results))
    return results


def evaluate_weights(trainer: FinishedRun, label: str, step: int | None) -> dict[str, Any]:
    """Beam-search scores of the model's current weights on the validation and test splits.

    Args:
        trainer: the run whose model is scored.
        label: what the weights are (``best``, ``average of last 3``), recorded.
        step: the checkpoint's step; given for the best checkpoint, whose test translations are written.
    """
    beam, data = trainer.tcfg.test_beam_size, trainer.data
    loss = trainer.teacher_forced_loss(data.valid)
    valid = {**corpus_scores(trainer.decode(data.valid, beam), data.valid.tgt_text), "loss": loss}
    test = {}
    for name, split in data.tests.items():
        hypotheses = trainer.decode(split, beam)
        test[name] = corpus_scores(hypotheses, split.tgt_text)
        if step is not None:  # the best checkpoint's translations, for analysis (scripts/compare_runs.py)
            out = trainer.run_dir / "translations" / f"{name}.{trainer.cfg.data.tgt_lang}"
            out.parent.mkdir(exist_ok=True)
            out.write_text("".join(h + "\n" for h in hypotheses))
    return {"checkpoint": label, "checkpoint_step": step, "beam_size": beam,
            "length_penalty": trainer.tcfg.length_penalty, "valid": valid, "test": test}


def run_summary(trainer: FinishedRun, stopped_early: bool) -> dict[str, Any]:
    """What the run was and what it took: sizes, steps, the clock, throughput, device and versions."""
    p, tcfg, data_cfg = trainer.progress, trainer.tcfg, trainer.cfg.data
    return {
        "attention": trainer.cfg.attention.name,
        "parameters": count_parameters(trainer.model),
        "steps": p.step,
        "epochs": p.epoch + p.batches_done / max(1, trainer.batches_per_epoch),
        "stopped_early": stopped_early,
        "best_val_bleu_greedy" if tcfg.val_beam_size == 1 else "best_val_bleu": p.best_bleu,
        "best_step": p.best_step,
        "train_seconds": p.train_seconds,
        "train_target_tokens_per_s": p.target_tokens * trainer.info.world_size / max(1e-9, p.train_seconds),
        "setup_seconds": trainer.setup_seconds,
        "wall_seconds": p.wall_seconds,
        "gpu_utilisation": trainer.gpu_utilisation,
        "validations": p.validations,
        "device": device_name(trainer.device),
        "precision": trainer.precision,
        "bf16_autocast": trainer.use_bf16,
        "world_size": trainer.info.world_size,
        "data_fingerprint": trainer.data.fingerprint,
        "data_sources": trainer.data.stats.get("sources", []),
        "train_files_by_rank": [seen["train_files"] for seen in trainer.data_ranks],
        "versions": library_versions(),
        "host": host(),
        "src_lang": data_cfg.src_lang,
        "tgt_lang": data_cfg.tgt_lang,
        "run_dir": str(trainer.run_dir),
    }


def format_results(results: dict[str, Any], path: Path) -> str:
    """The summary printed at the end of training: scores with signatures, the clock, where results went."""
    lines = [f"results ({results['checkpoint']} checkpoint, step {results['checkpoint_step']}, "
             f"beam {results['beam_size']}):",
             f"  valid  BLEU {results['valid']['bleu']:.2f}  chrF {results['valid']['chrf']:.2f}"]
    for name, scores in results["test"].items():
        lines.append(f"  {name}  BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}")
        lines.append(f"    {scores['bleu_signature']}")
    if "averaged" in results:
        for name, scores in results["averaged"]["test"].items():
            lines.append(f"  {name} (averaged checkpoints)  BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}")
    lines.append(f"  training: {results['steps']} steps in {results['wall_seconds'] / 60:.1f} min wall clock "
                 f"({results['train_seconds'] / 60:.1f} min of them optimizer steps, the rest validation); "
                 f"final evaluation {results['final_evaluation_seconds']:.0f} s")
    if results["gpu_utilisation"]["available"]:
        lines.append(f"  GPU utilisation during training: median "
                     f"{results['gpu_utilisation']['utilisation_percent_median']:.0f}%")
    lines.append(f"  written to {path}")
    return "\n".join(lines)


def hparams_and_metrics(cfg: DictConfig, results: dict[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
    """The run's settings and final scores for TensorBoard's HParams tab."""
    params = {"attention": cfg.attention.name, **{f"model.{k}": v for k, v in cfg.model.items()},
              "lr": cfg.trainer.lr, "max_tokens": cfg.data.max_tokens, "label_smoothing": cfg.trainer.label_smoothing}
    metrics = {"hparam/val_bleu": results["valid"]["bleu"]}
    metrics.update({f"hparam/test_bleu_{name}": s["bleu"] for name, s in results["test"].items()})
    return params, metrics
