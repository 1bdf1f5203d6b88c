"""The parts that train: the CUDA tests, bf16 against fp32, eager against the replayed CUDA graphs, and the recipe
from process start to its test score."""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from typing import Any

from nmt.chain.runner import run_logged
from nmt_tools.gpu_check.registry import attempt, part
from nmt_tools.gpu_check.runs import SECONDS, STOP_GRACE_S, run_summary, step_losses, train, train_seconds


@part("tests", 0)
def tests_part(args: argparse.Namespace) -> dict[str, Any]:
    """``pytest -q -m gpu tests/`` into tests.txt: the counts of its last line (failures do not stop the check)."""
    log = args.out / "tests.txt"
    command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/"]
    args.budget.need(SECONDS["tests"], "the CUDA tests")
    log.unlink(missing_ok=True)
    status, seconds = run_logged(command, log, args.project_dir, args.budget.timeout(), grace=STOP_GRACE_S)
    lines = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    counts = dict.fromkeys(("passed", "failed", "skipped", "errors", "deselected"), 0)
    for number, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", lines[-1] if lines else ""):
        counts["errors" if word.startswith("error") else word] = int(number)
    return {"command": "python -m pytest -q -m gpu tests/", "exit_status": status, **counts, "seconds": seconds,
            "summary": lines[-1] if lines else "", "log": log.name}


@part("precision", 5)
def precision_part(args: argparse.Namespace) -> dict[str, Any]:
    """fp32 and bf16 on the same seed for the same steps: the loss curves compared, and each run's figures."""
    every = max(1, args.steps // 3)
    extra = [f"trainer.max_steps={args.steps}", f"trainer.validate_every={every}"]
    runs = {p: train(args, args.out / f"precision_{p}", [*extra, f"trainer.precision={p}"],
                     train_seconds(args.steps, "eager")) for p in ("fp32", "bf16")}
    fp32, bf16 = (step_losses(args.out / f"precision_{p}") for p in ("fp32", "bf16"))
    steps = sorted(set(fp32) & set(bf16))
    gaps = [abs(fp32[s] - bf16[s]) for s in steps]
    last = steps[-100:]
    return {"steps_compared": len(steps), "loss_gap_mean": statistics.fmean(gaps), "loss_gap_max": max(gaps),
            "loss_last_100_mean": {"fp32": statistics.fmean(fp32[s] for s in last),
                                   "bf16": statistics.fmean(bf16[s] for s in last)},
            "runs": {p: run_summary(run) for p, run in runs.items()}}


@part("graphs", 4)
def graphs_part(args: argparse.Namespace) -> dict[str, Any]:
    """Eager against graphs in each of ``--graph-precisions``, same seed and steps: speeds as ratios on this card,
    the loss gap (graphs against eager in each precision) and the capture's figures."""
    extra = [f"trainer.max_steps={args.graph_steps}", f"trainer.validate_every={args.graph_steps}"]
    precisions = list(dict.fromkeys(args.graph_precisions))
    names = [(path, precision) for path in ("eager", "graphs") for precision in precisions]
    args.budget.need(sum(train_seconds(args.graph_steps, path) for path, _ in names
                         if not (args.out / f"graphs_{path}_{_}" / "results.json").is_file()),
                     f"{len(names)} trainings of {args.graph_steps} steps")
    runs = {f"{path}_{precision}": train(args, args.out / f"graphs_{path}_{precision}", [
        *extra, f"trainer.cuda_graphs={path == 'graphs'}".lower(), f"trainer.precision={precision}"])
        for path, precision in names}
    speed = {name: run["results"]["train_target_tokens_per_s"] for name, run in runs.items()}
    report: dict[str, Any] = {"steps": args.graph_steps, "runs": {n: run_summary(r) for n, r in runs.items()},
                              "fastest": max(speed, key=speed.__getitem__)}
    for precision in precisions:
        eager, graphs = (step_losses(args.out / f"graphs_{path}_{precision}") for path in ("eager", "graphs"))
        gaps = [abs(eager[s] - graphs[s]) for s in sorted(set(eager) & set(graphs))]
        report[f"graphs_over_eager_{precision}"] = speed[f"graphs_{precision}"] / speed[f"eager_{precision}"]
        report[f"loss_gap_{precision}"] = {"mean": statistics.fmean(gaps), "max": max(gaps), "steps": len(gaps)}
    if len(precisions) == 2:
        report["bf16_over_fp32"] = {p: speed[f"{p}_bf16"] / speed[f"{p}_fp32"] for p in ("eager", "graphs")}
    return report


@part("recipe", 1)
def recipe_part(args: argparse.Namespace) -> dict[str, Any]:
    """The recipe trained once per ``--recipe-paths``, each from process start to its test score."""
    report: dict[str, Any] = {}
    for path in args.recipe_paths:
        report[path] = attempt(args, lambda path=path: recipe_run(args, path))
    done = {path: run for path, run in report.items() if "train_target_tokens_per_s" in run}
    if {"graphs", "eager"} <= set(done):
        report["graphs_over_eager_tokens_per_s"] = (done["graphs"]["train_target_tokens_per_s"]
                                                    / done["eager"]["train_target_tokens_per_s"])
    return report


def recipe_run(args: argparse.Namespace, path: str) -> dict[str, Any]:
    """One recipe run (``path``: graphs, eager or auto): time to the test score, its parts, time to val BLEU."""
    extra = list(args.recipe_overrides)
    if path != "auto":
        extra.append(f"trainer.cuda_graphs={'true' if path == 'graphs' else 'false'}")
    cap = args.eager_max_steps if path == "eager" else None
    if cap:
        extra.append(f"trainer.max_steps={cap}")
    seconds = train_seconds(cap, path) if cap else SECONDS["recipe_graphs" if path == "graphs" else "recipe_eager"]
    run = train(args, args.out / f"recipe_{path}", extra, seconds)
    results, seconds = run["results"], run["process_seconds"]
    work = results["setup_seconds"] + results["wall_seconds"] + results.get("final_evaluation_seconds", 0.0)
    overhead = max(0.0, seconds - work) if seconds is not None else 0.0  # imports, CUDA start, exit
    reached = next((v for v in results["validations"] if v["bleu"] >= args.target_bleu), None)
    minutes = None if reached is None else (overhead + results["setup_seconds"] + reached["wall_seconds"]) / 60
    graphs = results.get("cuda_graphs") or {}
    utilisation = results.get("gpu_utilisation") or {}
    capped = {"capped_at_steps": cap, "note": f"stopped at step {cap} to fit the budget: its wall time is not the "
              "recipe's"} if cap else {}
    return {"path": path, **capped, "process_seconds_to_test_score": seconds,
            "validation_seconds": results.get("validation_seconds"),
            "final_evaluation_seconds": results.get("final_evaluation_seconds"),
            "capture_seconds": graphs.get("capture_seconds"),
            "gpu_utilisation_median": utilisation.get("utilisation_percent_median"),
            "target_val_bleu": args.target_bleu, "minutes_to_target": minutes,
            "step_at_target": reached and reached["step"], "best_val_bleu": results.get("best_val_bleu_greedy"),
            "process_minutes": seconds and seconds / 60, **run_summary(run)}
