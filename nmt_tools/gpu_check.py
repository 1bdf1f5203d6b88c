"""The GPU path in one command: the eager step against the replayed CUDA graphs, bf16 against fp32, training
speed and utilisation, time to a val BLEU, translation speed and the chain's wall time, each part resumable and
written to ``<out>/gpu_check.json``.

    python scripts/gpu_check.py --out runs/gpu_check                        # graphs + translate: minutes
    python scripts/gpu_check.py --out runs/gpu_check --parts recipe translate   # time to val BLEU 38
    python scripts/gpu_check.py --out runs/gpu_check --parts chain --parallel 3  # reproduce.py recipe=bt_best

Parts (each skips a run whose ``results.json`` exists, so a stopped check continues where it stopped):

- ``graphs``: ``train.py experiment=E`` four times on the same seed for ``--graph-steps`` steps, eager and with
  ``trainer.cuda_graphs=true``, each in fp32 and bf16: target tokens/s and their ratios on this card, the loss gap
  between eager and graphs, the shapes captured and what the capture cost, the validation share of the wall time.
- ``precision``: ``train.py experiment=E`` twice on the same seed for ``--steps`` steps, ``trainer.precision=fp32``
  and ``bf16``: the per-step losses side by side (mean and largest gap, the mean of the last 100 steps), val and
  test BLEU after the same steps, target tokens/s and the GPU's utilisation (``nvidia-smi``, from results.json).
- ``recipe``: ``train.py experiment=E`` in full: minutes from the start of the process to the first validation
  (and its checkpoint) with greedy val BLEU >= ``--target-bleu``. Process start-up and exit are both counted
  before that validation, so the figure is an upper bound by a few seconds.
- ``translate``: ``scripts/benchmark.py translate`` at beam 1 and 5 on the recipe run (else the bf16 run).
- ``chain``: ``reproduce.py recipe=R`` with ``--parallel`` stages at once: this invocation's wall time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from nmt.analysis.cli import OutputsParser
from nmt.common.files import write_json_durably

PARTS = ("graphs", "precision", "recipe", "translate", "chain")


def parse_args(argv: list[str] | None, project_dir: Path) -> argparse.Namespace:
    parser = OutputsParser(prog="gpu_check.py", description=__doc__.split("\n\n")[0], folders=("out",))
    parser.add_argument("--out", type=Path, required=True, help="folder for the runs and gpu_check.json")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=["graphs", "translate"])
    parser.add_argument("--experiment", default="multi30k_best", help="train.py's experiment for precision/recipe")
    parser.add_argument("--steps", type=int, default=1500, help="optimizer steps of each precision run")
    parser.add_argument("--graph-steps", type=int, default=600, help="optimizer steps of each graphs run")
    parser.add_argument("--recipe-overrides", nargs="*", default=[],
                        help="train.py overrides for the recipe part alone, e.g. trainer.cuda_graphs=true")
    parser.add_argument("--target-bleu", type=float, default=38.0, help="greedy val BLEU the recipe part times")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--recipe", default="bt_best", help="reproduce.py's recipe for the chain part")
    parser.add_argument("--parallel", type=int, default=3, help="chain stages at once on the GPU")
    parser.add_argument("--overrides", nargs="*", default=[],
                        help="extra train.py overrides for every run (data.*, or model=small for a quick try)")
    parser.add_argument("--project-dir", type=Path, default=project_dir, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.steps, args.graph_steps) < 2:
        parser.error(f"--steps {args.steps} / --graph-steps {args.graph_steps}: give at least 2 optimizer steps")
    return args


def run_timed(command: list[str], log: Path, cwd: Path) -> float:
    """``command`` in ``cwd``, its output appended to ``log``; returns its wall seconds (exit status != 0: exits)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"gpu_check: {' '.join(command)}", flush=True)
    started = time.perf_counter()
    with log.open("a", encoding="utf-8") as sink:
        status = subprocess.run(command, cwd=cwd, stdout=sink, stderr=subprocess.STDOUT).returncode
    if status != 0:
        raise SystemExit(f"gpu_check.py: {command[1]} failed with exit status {status}; its output: {log}")
    return time.perf_counter() - started


def train(args: argparse.Namespace, run_dir: Path, extra: list[str]) -> dict[str, Any]:
    """train.py into ``run_dir`` (skipped when its results.json exists): its results and the process seconds."""
    timing = run_dir.parent / f"{run_dir.name}.seconds.json"
    if not (run_dir / "results.json").is_file():
        command = [sys.executable, "train.py", f"experiment={args.experiment}", f"trainer.seed={args.seed}",
                   *args.overrides, *extra, f"hydra.run.dir={run_dir.resolve()}"]
        write_json_durably(timing, {"process_seconds": run_timed(command, run_dir.parent / f"{run_dir.name}.log",
                                                                  args.project_dir)})
    results = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
    seconds = json.loads(timing.read_text(encoding="utf-8"))["process_seconds"] if timing.is_file() else None
    return {"results": results, "process_seconds": seconds}


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


def precision_part(args: argparse.Namespace) -> dict[str, Any]:
    """fp32 and bf16 on the same seed for the same steps: the loss curves compared, and each run's figures."""
    every = max(1, args.steps // 3)
    extra = [f"trainer.max_steps={args.steps}", f"trainer.validate_every={every}"]
    runs = {p: train(args, args.out / f"precision_{p}", [*extra, f"trainer.precision={p}"]) for p in ("fp32", "bf16")}
    fp32, bf16 = (step_losses(args.out / f"precision_{p}") for p in ("fp32", "bf16"))
    steps = sorted(set(fp32) & set(bf16))
    gaps = [abs(fp32[s] - bf16[s]) for s in steps]
    last = steps[-100:]
    return {"steps_compared": len(steps), "loss_gap_mean": statistics.fmean(gaps), "loss_gap_max": max(gaps),
            "loss_last_100_mean": {"fp32": statistics.fmean(fp32[s] for s in last),
                                   "bf16": statistics.fmean(bf16[s] for s in last)},
            "runs": {p: run_summary(run) for p, run in runs.items()}}


def graphs_part(args: argparse.Namespace) -> dict[str, Any]:
    """Eager against graphs, each in fp32 and bf16, same seed and steps: speeds as ratios on this card, the loss gap
    (graphs against eager in each precision) and the capture's figures."""
    extra = [f"trainer.max_steps={args.graph_steps}", f"trainer.validate_every={args.graph_steps}"]
    names = [(path, precision) for path in ("eager", "graphs") for precision in ("fp32", "bf16")]
    runs = {f"{path}_{precision}": train(args, args.out / f"graphs_{path}_{precision}", [
        *extra, f"trainer.cuda_graphs={path == 'graphs'}".lower(), f"trainer.precision={precision}"])
        for path, precision in names}
    speed = {name: run["results"]["train_target_tokens_per_s"] for name, run in runs.items()}
    report: dict[str, Any] = {"steps": args.graph_steps, "runs": {n: run_summary(r) for n, r in runs.items()},
                              "fastest": max(speed, key=speed.__getitem__)}
    for precision in ("fp32", "bf16"):
        eager, graphs = (step_losses(args.out / f"graphs_{path}_{precision}") for path in ("eager", "graphs"))
        gaps = [abs(eager[s] - graphs[s]) for s in sorted(set(eager) & set(graphs))]
        report[f"graphs_over_eager_{precision}"] = speed[f"graphs_{precision}"] / speed[f"eager_{precision}"]
        report[f"loss_gap_{precision}"] = {"mean": statistics.fmean(gaps), "max": max(gaps), "steps": len(gaps)}
    report["bf16_over_fp32"] = {path: speed[f"{path}_bf16"] / speed[f"{path}_fp32"] for path in ("eager", "graphs")}
    return report


def recipe_part(args: argparse.Namespace) -> dict[str, Any]:
    """The recipe trained in full: minutes to the first validation at ``--target-bleu`` greedy val BLEU."""
    run = train(args, args.out / "recipe", list(args.recipe_overrides))
    results, seconds = run["results"], run["process_seconds"]
    work = results["setup_seconds"] + results["wall_seconds"] + results.get("final_evaluation_seconds", 0.0)
    overhead = max(0.0, seconds - work) if seconds is not None else 0.0  # imports, CUDA start, exit
    reached = next((v for v in results["validations"] if v["bleu"] >= args.target_bleu), None)
    minutes = None if reached is None else (overhead + results["setup_seconds"] + reached["wall_seconds"]) / 60
    return {"target_val_bleu": args.target_bleu, "minutes_to_target": minutes,
            "step_at_target": reached and reached["step"], "best_val_bleu": results["best_val_bleu_greedy"],
            "process_minutes": seconds and seconds / 60, **run_summary(run)}


def translate_part(args: argparse.Namespace) -> dict[str, Any]:
    """Sentences/s at beam 1 and 5 (benchmark.py translate) on the recipe run, else the bf16 precision run."""
    run = next((args.out / name for name in ("recipe", "precision_bf16")
                if (args.out / name / "results.json").is_file()), None)
    if run is None:
        raise SystemExit("gpu_check.py: the translate part needs a trained run: add --parts recipe or precision")
    report = args.out / "translate"
    if not report.with_suffix(".json").is_file():
        command = [sys.executable, "scripts/benchmark.py", "translate", "--checkpoint", str(run.resolve()),
                   "--beam-sizes", "1", "5", "--reps", "3", "--out", str(report.resolve())]
        run_timed(command, args.out / "translate.log", args.project_dir)
    rows = json.loads(report.with_suffix(".json").read_text(encoding="utf-8"))["results"]
    return {"checkpoint": run.name, **{row["mode"]: {"sentences_per_s": row["sentences_per_s"],
                                                     "bleu": row.get("bleu")} for row in rows}}


def chain_part(args: argparse.Namespace) -> dict[str, Any]:
    """reproduce.py's whole chain with ``--parallel`` stages at once; this invocation's wall time."""
    data = [o for o in args.overrides if o.startswith("data.")]
    command = [sys.executable, "reproduce.py", f"recipe={args.recipe}", f"parallel={args.parallel}",
               f"workdir={(args.out / 'chain').resolve()}", *data]
    seconds = run_timed(command, args.out / "chain.log", args.project_dir)
    return {"recipe": args.recipe, "parallel": args.parallel, "wall_minutes": seconds / 60,
            "log": str(args.out / "chain.log")}


def main(argv: list[str] | None = None, project_dir: Path | None = None) -> dict[str, Any]:
    """Run the chosen parts in order, merge them into ``<out>/gpu_check.json`` (earlier parts kept); returns it."""
    args = parse_args(argv, project_dir or Path.cwd())
    path = args.out / "gpu_check.json"
    report = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    measure = {"graphs": graphs_part, "precision": precision_part, "recipe": recipe_part,
               "translate": translate_part, "chain": chain_part}
    for part in [p for p in PARTS if p in args.parts]:  # recipe before translate, whatever order was given
        report[part] = measure[part](args)
        write_json_durably(path, report)
        print(f"gpu_check: {part}: {json.dumps(report[part], default=str)[:400]}", flush=True)
    print(f"gpu_check: wrote {path}", flush=True)
    return report
