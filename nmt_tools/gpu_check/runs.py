"""What the parts share: the budget's estimates of each piece of work, one training into a run folder (skipped
when it finished before), and the figures read back from a run's results.json and train log."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from nmt.chain.runner import run_logged
from nmt.common.files import write_json_durably

# What the budget expects, in seconds on one H100 at efb7581 (docs/results/gpu.md), rounded up, process start and
# exit included: a run of the recipe's model costs train_fixed (setup, capture, the closing validation and test
# decode; 500 graph steps took 29 s) plus a time per step (500 eager steps: 47 s in all).
SECONDS = {"tests": 150.0, "train_fixed": 20.0, "eager_step": 0.055, "graphs_step": 0.018, "recipe_graphs": 95.0,
           "recipe_eager": 230.0, "translate": 30.0, "backtranslate_eager": 80.0, "backtranslate_graphs": 40.0,
           "parallel_round": 30.0, "parallel_per_run": 4.0, "study": 90.0, "chain": 600.0}
PACK_SECONDS = 15.0  # kept back from the budget for packing the files
# At the budget's end or a signal, how long a command has to save and exit before SIGKILL (a training saves its
# checkpoint in seconds; the study's chain passes the SIGTERM on to its own trainings first).
STOP_GRACE_S = 30.0


def run_timed(command: list[str], log: Path, cwd: Path, timeout: float | None = None,
              env: dict[str, str] | None = None) -> float:
    """``run_logged``; its wall seconds (exit status != 0: exits, naming the log)."""
    status, seconds = run_logged(command, log, cwd, timeout, env, STOP_GRACE_S)
    if status != 0:
        raise SystemExit(f"gpu_check.py: {command[1]} failed with exit status {status}; its output: {log}")
    return seconds


def train_seconds(steps: int, path: str) -> float:
    """The budget's estimate of one training of ``steps`` steps, ``path`` eager or graphs."""
    return SECONDS["train_fixed"] + steps * SECONDS[f"{'graphs' if path == 'graphs' else 'eager'}_step"]


def train(args: argparse.Namespace, run_dir: Path, extra: list[str], seconds: float = 0.0) -> dict[str, Any]:
    """train.py into ``run_dir`` (skipped when its results.json exists; NotInBudget when ``seconds`` do not fit the
    budget): its results and the process seconds."""
    timing = run_dir.parent / f"{run_dir.name}.seconds.json"
    if not (run_dir / "results.json").is_file():
        args.budget.need(seconds, f"train.py into {run_dir.name}")
        command = [sys.executable, "train.py", f"experiment={args.experiment}", f"trainer.seed={args.seed}",
                   *args.overrides, *extra, f"hydra.run.dir={run_dir.resolve()}"]
        took = run_timed(command, run_dir.parent / f"{run_dir.name}.log", args.project_dir, args.budget.timeout())
        write_json_durably(timing, {"process_seconds": took})
    results = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
    seconds_taken = json.loads(timing.read_text(encoding="utf-8"))["process_seconds"] if timing.is_file() else None
    return {"results": results, "process_seconds": seconds_taken}


def step_losses(run_dir: Path) -> dict[int, float]:
    """``{step: loss}`` from a run's train_log.jsonl (the last record of a step wins, as after a resume)."""
    lines = (run_dir / "train_log.jsonl").read_text(encoding="utf-8").splitlines()
    return {record["step"]: record["loss"] for record in map(json.loads, lines) if "loss" in record}


def run_summary(run: dict[str, Any]) -> dict[str, Any]:
    """One run's speed and scores: tokens/s, GPU utilisation, the graphs' figures, validation's share of the wall
    time, val BLEU per validation, test BLEU."""
    results = run["results"]
    wall = results.get("wall_seconds") or 0.0
    return {"device": results.get("device"), "precision": results.get("precision"),
            "bf16_autocast": results.get("bf16_autocast"), "steps": results["steps"],
            "train_target_tokens_per_s": results["train_target_tokens_per_s"],
            "gpu_utilisation": results.get("gpu_utilisation"), "process_seconds": run["process_seconds"],
            "cuda_graphs": results.get("cuda_graphs"), "setup_seconds": results.get("setup_seconds"),
            "validation_share_of_wall": results.get("validation_seconds", 0.0) / wall if wall else None,
            "val_bleu": [{"step": v["step"], "bleu": v["bleu"]} for v in results["validations"]],
            "test_bleu": {split: scores["bleu"] for split, scores in results["test"].items()}}


def trained_run(args: argparse.Namespace) -> Path:
    """The run the translation parts use: the recipe's (graphs, default, eager), else the bf16 precision run."""
    names = ("recipe_graphs", "recipe_auto", "recipe_eager", "precision_bf16")
    run = next((args.out / name for name in names if (args.out / name / "results.json").is_file()), None)
    if run is None:
        raise SystemExit("gpu_check.py: the translate and search parts need a trained run: add --parts recipe or "
                         "precision")
    return run
