"""The end of a training run, on rank 0: the best (and averaged) weights scored with beam search on every split,
``results.json``, the test translations and the printed summary.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from nmt.common.files import write_json_durably, write_text_durably
from nmt.common.metrics import corpus_scores
from nmt.data import EncodedSplit, PreparedData
from nmt.model.checkpoint import RunCheckpoints
from nmt.model.seq2seq import Seq2Seq
from nmt.train.run_logger import RunLogger


@dataclass(frozen=True)
class FinishedRun:
    """What the final evaluation needs of a run whose loop has ended (``Trainer.finished_run`` makes it).

    Attributes:
        model: the run's model; its weights are swapped for the scored ones and restored to the best's.
        decode: ``(split, beam_size) -> detokenized hypotheses``, the run's own search (as in validation).
        teacher_forced_loss: ``split -> loss per target token``.
        cfg: the run's config (the HParams tab and the test settings: beam size, length penalty, averaging).
        summary: what the run was and what it took (``Trainer.summary``), copied into results.json.
    """

    model: Seq2Seq
    data: PreparedData
    checkpoints: RunCheckpoints
    decode: Callable[[EncodedSplit, int], list[str]]
    teacher_forced_loss: Callable[[EncodedSplit], float]
    run_dir: Path
    cfg: DictConfig
    summary: dict[str, Any]
    logger: RunLogger


def final_evaluation(run: FinishedRun) -> dict[str, Any]:
    """Score the best (and averaged) weights of ``run``, write ``results.json`` (the scores and ``run.summary``)
    and the TensorBoard HParams, print a summary; returns the contents of ``results.json``."""
    started = time.perf_counter()
    best = run.checkpoints.load("best")
    run.model.load_state_dict(best["model"])
    results = evaluate_weights(run, "best", best["progress"]["step"])
    averaged = run.checkpoints.averaged_weights()
    if averaged is not None:
        run.model.load_state_dict(averaged)
        results["averaged"] = evaluate_weights(run, f"average of last {run.cfg.trainer.average_last}", None)
        run.model.load_state_dict(best["model"])
    results.update(run.summary)
    results["final_evaluation_seconds"] = time.perf_counter() - started
    path = run.run_dir / "results.json"
    write_json_durably(path, results)
    print(format_results(results, path), flush=True)
    run.logger.hparams(*hparams_and_metrics(run.cfg, results))
    return results


def evaluate_weights(run: FinishedRun, label: str, step: int | None) -> dict[str, Any]:
    """Beam-search scores of the model's current weights (``label``: ``best``, ``average of last 3``) on the
    validation and test splits; with ``step`` (the best checkpoint's) the test translations are written too.
    """
    beam, data = run.cfg.trainer.test_beam_size, run.data
    loss = run.teacher_forced_loss(data.valid)
    valid = {**corpus_scores(run.decode(data.valid, beam), data.valid.tgt_text), "loss": loss}
    test = {}
    for name, split in data.tests.items():
        hypotheses = run.decode(split, beam)
        test[name] = corpus_scores(hypotheses, split.tgt_text)
        if step is not None:  # the best checkpoint's translations, for analysis (scripts/compare_runs.py)
            out = run.run_dir / "translations" / f"{name}.{run.cfg.data.tgt_lang}"
            write_text_durably(out, "".join(h + "\n" for h in hypotheses))
    return {"checkpoint": label, "checkpoint_step": step, "beam_size": beam,
            "length_penalty": run.cfg.trainer.length_penalty, "valid": valid, "test": test}


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
