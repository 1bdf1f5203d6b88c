"""The GPU path in one command: the CUDA tests, the eager step against the replayed CUDA graphs, bf16 against fp32,
the recipe from process start to its test score, search and back-translation from graphs, trainings side by side on
one card, the attention study; each part resumable and written to ``<out>/gpu_check.json``.

    python scripts/gpu_check.py --out runs/gpu_check                        # graphs + translate: minutes
    python scripts/gpu_check.py --out runs/gpu_check --parts recipe search --recipe-paths graphs eager
    python scripts/gpu_check.py --out runs/gpu_check --parts parallel --parallel-counts 1 2 4 8 --mps
    python scripts/gpu_check.py --device-run --out /tmp/gpu_check --pack $OUT   # everything in 9 minutes, 8 files

Parts (each skips a run whose ``results.json`` or report exists, so a stopped check continues where it stopped):

- ``tests``: ``pytest -q -m gpu tests/``: its output in ``tests.txt``, the counts passed, failed and skipped.
- ``graphs``: ``train.py experiment=E`` on the same seed for ``--graph-steps`` steps, eager and with
  ``trainer.cuda_graphs=true``, in each of ``--graph-precisions``: target tokens/s and their ratios on this card, the
  loss gap between eager and graphs, the shapes captured and what the capture cost, the validation share of the wall.
- ``precision``: ``train.py experiment=E`` twice on the same seed for ``--steps`` steps, ``trainer.precision=fp32``
  and ``bf16``: the per-step losses side by side (mean and largest gap, the mean of the last 100 steps), val and
  test BLEU after the same steps, target tokens/s and the GPU's utilisation (``nvidia-smi``, from results.json).
- ``recipe``: ``train.py experiment=E`` in full, once per ``--recipe-paths`` (``graphs``: cuda_graphs=true,
  ``eager``: false, ``auto``: the default), from process start to its test score: the validation share of the wall,
  capture and setup seconds, GPU utilisation, minutes to the first validation at ``--target-bleu`` greedy val BLEU.
  ``--eager-max-steps`` caps the eager run (the JSON says so: its wall time is then not the recipe's).
- ``translate``: ``scripts/benchmark.py translate`` at beam 1 and 5 on the recipe run (else the bf16 run).
- ``search``: the same eager (``--cuda-graphs false``) against graphs (``true``) with ``--batch-tokens`` from
  ``--search-batch-tokens``: sentences/s, BLEU and whether the two give the same translations (lines that differ,
  BLEU difference); then back-translating the task-2 English captions (``benchmark.py backtranslate``, beam) eager
  against graphs with an en→de model (``--bt-checkpoint``, else one trained here for ``--bt-model-steps``).
- ``parallel``: ``--parallel-counts`` trainings at once on the card, separate processes of ``train.py
  experiment=E trainer.cuda_graphs=true`` for ``--parallel-steps`` steps each (``--mps``: again under CUDA MPS,
  its daemon started and stopped here): tokens/s together against one alone, and the best count, also written as
  ``<out>/measured_parallel.json`` in the shape of ``nmt/analysis/measured_parallel.json``.
- ``chain``: ``reproduce.py recipe=R`` with ``--parallel`` stages at once: this invocation's wall time.
- ``study``: ``reproduce.py recipe=attention_study parallel=auto budget=...`` within ``--study-budget`` (default:
  the time the budget has left), then the report files it wrote, whatever finished.

``--budget-seconds`` bounds the whole check: a part (or a run inside it) whose estimate does not fit the time left
is skipped with a note in the JSON, and a command still running at the end is stopped. ``--device-run`` is the
profile of one 9-minute device call (tests, graphs, recipe, search, parallel, study; ``--keep-going``), and
``--pack DIR`` writes at most 8 files there: gpu_check.json, README.md, measured_parallel.json, one tarball of the
logs, results and reports, and the study's report files.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from nmt.analysis.cli import OutputsParser
from nmt.analysis.mps import mps_daemon
from nmt.common.files import write_json_durably, write_text_durably

# The order they run in: the recipe first (the search parts decode its run), the rest by what the issues need most.
PARTS = ("tests", "recipe", "translate", "search", "graphs", "precision", "parallel", "chain", "study")
# One device call (docs/development/benchmarking.md): 9 minutes, each part short, the study in what is left.
# The recipe runs with graphs only here: its eager run alone took about 215 s at efb7581, and the graphs part
# measures eager against graphs over the same steps.
DEVICE_RUN = {"parts": ["tests", "recipe", "search", "graphs", "parallel", "study"], "graph_steps": 300,
              "graph_precisions": ["bf16"], "recipe_paths": ["graphs"], "eager_max_steps": 250,
              "search_precisions": ["auto", "fp32"], "parallel_counts": [1, 2, 4], "parallel_steps": 200,
              "budget_seconds": 540.0, "keep_going": True}
# What the budget expects, in seconds on one H100 at efb7581 (docs/results/gpu.md), rounded up, process start and
# exit included: a run of the recipe's model costs TRAIN_FIXED (setup, capture, the closing validation and test
# decode; 500 graph steps took 29 s) plus a time per step (500 eager steps: 47 s in all).
SECONDS = {"tests": 150.0, "train_fixed": 20.0, "eager_step": 0.055, "graphs_step": 0.018, "recipe_graphs": 95.0,
           "recipe_eager": 230.0, "translate": 30.0, "backtranslate_eager": 80.0, "backtranslate_graphs": 40.0,
           "parallel_round": 30.0, "parallel_per_run": 4.0, "study": 90.0, "chain": 600.0}
PACK_SECONDS = 15.0  # kept back from the budget for packing the files
STUDY_STOP_SECONDS = 30.0  # the study's budget= ends this much before ours: its stages stop and save in time
MAX_FILES = 8  # what a device call brings back
TAR_MAX_BYTES = 48 << 20  # uncompressed logs and reports in the tarball (text: a few MiB compressed)
TAR_SUFFIXES = (".json", ".jsonl", ".log", ".txt", ".md", ".png", ".yaml", ".csv", ".de", ".en")
STUDY_FILES = ("attention_study_*.md", "attention_study_*.json", "attention_study_*_groups.png",
               "attention_study_*.png", "reproduce_attention_study.md", "reproduce_attention_study.json")


class Skipped(Exception):
    """A part or run left out: its estimate does not fit the time the budget has left."""


class Stopped(Exception):
    """A command stopped at the end of the budget."""


def parse_args(argv: list[str] | None, project_dir: Path) -> argparse.Namespace:
    parser = OutputsParser(prog="gpu_check.py", description=__doc__.split("\n\n")[0], folders=("out", "pack"))
    parser.add_argument("--out", type=Path, required=True, help="folder for the runs and gpu_check.json")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=["graphs", "translate"])
    parser.add_argument("--device-run", action="store_true",
                        help="the 9-minute device profile: " + ", ".join(f"{k}={v}" for k, v in DEVICE_RUN.items()))
    parser.add_argument("--budget-seconds", type=float, help="the whole check's time: parts that do not fit are "
                        "skipped, a command running at its end is stopped (default: none)")
    parser.add_argument("--keep-going", action="store_true",
                        help="a part that fails is noted in the JSON and the next one runs")
    parser.add_argument("--pack", type=Path, metavar="DIR", help=f"at the end, at most {MAX_FILES} files into DIR")
    parser.add_argument("--experiment", default="multi30k_best", help="train.py's experiment for every training")
    parser.add_argument("--steps", type=int, default=1500, help="optimizer steps of each precision run")
    parser.add_argument("--graph-steps", type=int, default=600, help="optimizer steps of each graphs run")
    parser.add_argument("--graph-precisions", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    parser.add_argument("--recipe-paths", nargs="+", choices=("graphs", "eager", "auto"), default=["auto"],
                        help="the recipe once per path: trainer.cuda_graphs=true, false, or the default")
    parser.add_argument("--eager-max-steps", type=int, help="cap the eager recipe run at this many steps")
    parser.add_argument("--recipe-overrides", nargs="*", default=[],
                        help="train.py overrides for the recipe part alone, e.g. trainer.precision=fp32")
    parser.add_argument("--target-bleu", type=float, default=38.0, help="greedy val BLEU the recipe part times")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--search-batch-tokens", default="auto", help="the search part's --batch-tokens")
    parser.add_argument("--search-reps", type=int, default=3, help="timed translations per beam size (median)")
    parser.add_argument("--search-precisions", nargs="+", default=["auto"], choices=["auto", "bf16", "fp32"],
                        help="the search part's precisions, each eager against graphs (fp32: the tokens must agree)")
    parser.add_argument("--bt-checkpoint", help="the en→de model that back-translates the captions (default: one "
                        "trained here for --bt-model-steps)")
    parser.add_argument("--bt-model-steps", type=int, default=600, help="steps of the en→de model trained here")
    parser.add_argument("--bt-limit", type=int, default=1_000_000, help="back-translate the first N captions (all)")
    parser.add_argument("--parallel-counts", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--parallel-steps", type=int, default=300, help="optimizer steps of each parallel training")
    parser.add_argument("--mps", action="store_true", help="the parallel part again under CUDA MPS")
    parser.add_argument("--recipe", default="bt_best", help="reproduce.py's recipe for the chain part")
    parser.add_argument("--parallel", type=int, default=3, help="chain stages at once on the GPU")
    parser.add_argument("--study-budget", type=float, help="seconds for the study (default: what is left)")
    parser.add_argument("--study-parallel", default="auto", help="the study's parallel= setting")
    parser.add_argument("--overrides", nargs="*", default=[],
                        help="extra train.py overrides for every run (data.*, or model=small for a quick try)")
    parser.add_argument("--project-dir", type=Path, default=project_dir, help=argparse.SUPPRESS)
    if "--device-run" in (sys.argv[1:] if argv is None else argv):
        parser.set_defaults(**DEVICE_RUN)  # options given on the command line still win
    args = parser.parse_args(argv)
    steps = [args.steps, args.graph_steps, args.parallel_steps, args.bt_model_steps, args.eager_max_steps or 2]
    if min(steps) < 2:
        parser.error(f"--steps {args.steps} / --graph-steps {args.graph_steps} / --parallel-steps "
                     f"{args.parallel_steps} / --bt-model-steps {args.bt_model_steps} / --eager-max-steps "
                     f"{args.eager_max_steps}: give at least 2 optimizer steps")
    if min(args.parallel_counts) < 1:
        parser.error(f"--parallel-counts {args.parallel_counts}: give whole numbers >= 1")
    args.budget = Budget(args.budget_seconds)
    return args


class Budget:
    """The time the check has left (``None``: no budget), ``PACK_SECONDS`` kept back for the packing."""

    def __init__(self, seconds: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds, self.clock = seconds, clock
        self.deadline = None if seconds is None else clock() + seconds - PACK_SECONDS

    def left(self) -> float | None:
        return None if self.deadline is None else self.deadline - self.clock()

    def need(self, seconds: float, what: str) -> None:
        """Raise Skipped unless ``seconds`` fit in what is left."""
        left = self.left()
        if left is not None and seconds > left:
            raise Skipped(f"{what}: needs about {seconds:.0f} s, {max(0.0, left):.0f} s left of the "
                          f"{self.seconds:.0f} s budget")

    def timeout(self) -> float | None:
        """A command's time limit: what is left (at least one second)."""
        left = self.left()
        return None if left is None else max(1.0, left)


def run_logged(command: list[str], log: Path, cwd: Path, timeout: float | None = None,
               env: dict[str, str] | None = None) -> tuple[int, float]:
    """``command`` in ``cwd``, its output appended to ``log``: its exit status and wall seconds. Past ``timeout``
    its process group gets SIGTERM, then SIGKILL after 10 s, and Stopped is raised."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"gpu_check: {' '.join(command)}", flush=True)
    started = time.perf_counter()
    with log.open("a", encoding="utf-8") as sink:
        process = subprocess.Popen(command, cwd=cwd, stdout=sink, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
        try:
            status = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_group(process)
            raise Stopped(f"{command[1]} stopped at the end of the budget after {time.perf_counter() - started:.0f} s"
                          f"; its output: {log}") from None
    return status, time.perf_counter() - started


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to the process's group, SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def run_timed(command: list[str], log: Path, cwd: Path, timeout: float | None = None,
              env: dict[str, str] | None = None) -> float:
    """``run_logged``; its wall seconds (exit status != 0: exits, naming the log)."""
    status, seconds = run_logged(command, log, cwd, timeout, env)
    if status != 0:
        raise SystemExit(f"gpu_check.py: {command[1]} failed with exit status {status}; its output: {log}")
    return seconds


def attempt(args: argparse.Namespace, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``measure()``; a skip or a stop as ``{"skipped"|"stopped": why}``, and with ``--keep-going`` a failure as
    ``{"failed": why}``."""
    try:
        return measure()
    except Skipped as why:
        return {"skipped": str(why)}
    except Stopped as why:
        return {"stopped": str(why)}
    except (Exception, SystemExit) as error:
        if not args.keep_going:
            raise
        return {"failed": str(error) or type(error).__name__}


def train_seconds(steps: int, path: str) -> float:
    """The budget's estimate of one training of ``steps`` steps, ``path`` eager or graphs."""
    return SECONDS["train_fixed"] + steps * SECONDS[f"{'graphs' if path == 'graphs' else 'eager'}_step"]


def train(args: argparse.Namespace, run_dir: Path, extra: list[str], seconds: float = 0.0) -> dict[str, Any]:
    """train.py into ``run_dir`` (skipped when its results.json exists; Skipped when ``seconds`` do not fit the
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


def tests_part(args: argparse.Namespace) -> dict[str, Any]:
    """``pytest -q -m gpu tests/`` into tests.txt: the counts of its last line (failures do not stop the check)."""
    log = args.out / "tests.txt"
    command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/"]
    args.budget.need(SECONDS["tests"], "the CUDA tests")
    log.unlink(missing_ok=True)
    status, seconds = run_logged(command, log, args.project_dir, args.budget.timeout())
    lines = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    counts = dict.fromkeys(("passed", "failed", "skipped", "errors", "deselected"), 0)
    for number, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", lines[-1] if lines else ""):
        counts["errors" if word.startswith("error") else word] = int(number)
    return {"command": "python -m pytest -q -m gpu tests/", "exit_status": status, **counts, "seconds": seconds,
            "summary": lines[-1] if lines else "", "log": log.name}


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


def trained_run(args: argparse.Namespace) -> Path:
    """The run the translation parts use: the recipe's (graphs, default, eager), else the bf16 precision run."""
    names = ("recipe_graphs", "recipe_auto", "recipe_eager", "precision_bf16")
    run = next((args.out / name for name in names if (args.out / name / "results.json").is_file()), None)
    if run is None:
        raise SystemExit("gpu_check.py: the translate and search parts need a trained run: add --parts recipe or "
                         "precision")
    return run


def translate_part(args: argparse.Namespace) -> dict[str, Any]:
    """Sentences/s at beam 1 and 5 (benchmark.py translate) on the recipe run, else the bf16 precision run."""
    run = trained_run(args)
    report = args.out / "translate"
    if not report.with_suffix(".json").is_file():
        command = [sys.executable, "scripts/benchmark.py", "translate", "--checkpoint", str(run.resolve()),
                   "--beam-sizes", "1", "5", "--reps", "3", "--out", str(report.resolve())]
        run_timed(command, args.out / "translate.log", args.project_dir, args.budget.timeout())
    rows = json.loads(report.with_suffix(".json").read_text(encoding="utf-8"))["results"]
    return {"checkpoint": run.name, **{row["mode"]: {"sentences_per_s": row["sentences_per_s"],
                                                     "bleu": row.get("bleu")} for row in rows}}


def search_part(args: argparse.Namespace) -> dict[str, Any]:
    """Greedy and beam 5 on test2016, eager against graphs, their outputs compared; then back-translating the
    task-2 English captions, eager against graphs."""
    run, folder = trained_run(args), args.out / "search"
    translate: dict[str, Any] = {}
    for precision in args.search_precisions:  # auto: "eager", "graphs"; fp32: "eager_fp32", "graphs_fp32"
        eager, graphs = (path + ("" if precision == "auto" else f"_{precision}") for path in ("eager", "graphs"))
        for name in (eager, graphs):
            translate[name] = attempt(args, lambda name=name, precision=precision: search_translate(
                args, run, name, precision))
        if all("greedy" in translate[name] for name in (eager, graphs)):
            translate[f"graphs_against_eager{eager[5:]}"] = {
                mode: compare_outputs(folder, mode, (eager, translate[eager][mode]), (graphs, translate[graphs][mode]))
                for mode in translate[eager] if mode in translate[graphs] and mode.startswith(("greedy", "beam"))}
    model = attempt(args, lambda: bt_model(args))
    backtranslate: dict[str, Any] = {"model": model}
    if "checkpoint" in model:
        for path in ("eager", "graphs"):
            backtranslate[path] = attempt(args, lambda path=path: search_backtranslate(args, Path(model["checkpoint"]),
                                                                                        path))
        if all("seconds" in backtranslate[path] for path in ("eager", "graphs")):
            backtranslate["graphs_over_eager"] = backtranslate["eager"]["seconds"] / backtranslate["graphs"]["seconds"]
    return {"checkpoint": run.name, "batch_tokens": args.search_batch_tokens, "translate": translate,
            "backtranslate": backtranslate}


def search_translate(args: argparse.Namespace, run: Path, name: str, precision: str) -> dict[str, Any]:
    """benchmark.py translate in ``precision`` with ``--cuda-graphs`` false (``name`` eager...) or true (graphs...),
    translations kept."""
    folder = args.out / "search"
    report = folder / f"translate_{name}"
    if not report.with_suffix(".json").is_file():
        args.budget.need(SECONDS["translate"], f"translate {name}")
        command = [sys.executable, "scripts/benchmark.py", "translate", "--checkpoint", str(run.resolve()),
                   "--beam-sizes", "1", "5", "--reps", str(args.search_reps), "--batch-tokens",
                   str(args.search_batch_tokens), "--cuda-graphs", "true" if name.startswith("graphs") else "false",
                   "--precision", precision, "--save-translations", str((folder / f"{name}_translations").resolve()),
                   "--out", str(report.resolve())]
        run_timed(command, folder / f"translate_{name}.log", args.project_dir, args.budget.timeout())
    rows = json.loads(report.with_suffix(".json").read_text(encoding="utf-8"))["results"]
    return {row["mode"]: {"sentences_per_s": row["sentences_per_s"], "seconds_median": row.get("seconds_median"),
                          "sentences": row.get("sentences"), "bleu": row.get("bleu")} for row in rows}


def compare_outputs(folder: Path, mode: str, eager_run: tuple[str, dict[str, Any]],
                    graphs_run: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """Graphs against eager for one mode (each run: its name and figures): the speed ratio, the lines that differ,
    the BLEU difference."""
    (eager_name, eager), (graphs_name, graphs) = eager_run, graphs_run
    lines = [(folder / f"{name}_translations" / f"{mode}.txt").read_text(encoding="utf-8").splitlines()
             for name in (eager_name, graphs_name)]
    differ = sum(a != b for a, b in zip(*lines)) + abs(len(lines[0]) - len(lines[1]))
    bleu = None if eager.get("bleu") is None or graphs.get("bleu") is None else graphs["bleu"] - eager["bleu"]
    return {"graphs_over_eager": graphs["sentences_per_s"] / eager["sentences_per_s"], "lines": len(lines[0]),
            "differing_lines": differ, "same_translations": differ == 0, "bleu_graphs_minus_eager": bleu}


def bt_model(args: argparse.Namespace) -> dict[str, Any]:
    """The en→de model that back-translates: ``--bt-checkpoint``, else ``--bt-model-steps`` of the recipe trained
    here in that direction (the default cuda_graphs)."""
    if args.bt_checkpoint:
        return {"checkpoint": str(args.bt_checkpoint), "trained_here": False}
    steps = args.bt_model_steps
    run = train(args, args.out / "search" / "bt_model", ["data.src_lang=en", "data.tgt_lang=de",
                f"trainer.max_steps={steps}", f"trainer.validate_every={steps}"], train_seconds(steps, "graphs") + 15)
    return {"checkpoint": str((args.out / "search" / "bt_model").resolve()), "trained_here": True, "steps": steps,
            "test_bleu": run_summary(run)["test_bleu"], "process_seconds": run["process_seconds"]}


def search_backtranslate(args: argparse.Namespace, model: Path, path: str) -> dict[str, Any]:
    """benchmark.py backtranslate (beam) of the task-2 English captions with ``--cuda-graphs`` false or true."""
    folder = args.out / "search"
    report = folder / f"backtranslate_{path}"
    if not report.with_suffix(".json").is_file():
        args.budget.need(SECONDS[f"backtranslate_{path}"], f"back-translating the captions, {path}")
        command = [sys.executable, "scripts/benchmark.py", "backtranslate", "--checkpoint", str(model),
                   "--input", "multi30k_task2", "--lang", "en", "--limit", str(args.bt_limit), "--methods", "beam",
                   "--cuda-graphs", "true" if path == "graphs" else "false",
                   "--set", f"batch_tokens={args.search_batch_tokens}", "--out", str(report.resolve())]
        run_timed(command, folder / f"backtranslate_{path}.log", args.project_dir, args.budget.timeout())
    row = json.loads(report.with_suffix(".json").read_text(encoding="utf-8"))["results"][0]
    return {key: row.get(key) for key in ("lines", "translated", "seconds", "sentences_per_s", "options")}


def parallel_part(args: argparse.Namespace) -> dict[str, Any]:
    """``--parallel-counts`` graph-replayed trainings at once, as separate processes (and under MPS with ``--mps``):
    tokens/s together against one alone; the best count, also as ``<out>/measured_parallel.json``."""
    ways = ["processes", *(["mps"] if args.mps else [])]
    report: dict[str, Any] = {"steps": args.parallel_steps,
                              "ways": {way: attempt(args, lambda way=way: parallel_way(args, way)) for way in ways}}
    found = [(way, int(n), r) for way, rounds in report["ways"].items() for n, r in rounds.items()
             if isinstance(r, dict) and "tokens_per_s_together" in r]
    if found:
        way, n, best = max(found, key=lambda item: item[2]["tokens_per_s_together"])
        report["best"] = {"way": way, "trainings_at_once": n, "tokens_per_s_together": best["tokens_per_s_together"],
                          "over_one_alone": best.get("over_one_alone"), "card": best["device"]}
        machine = machine_info(args.project_dir)
        entry = {"trainings_at_once": n, "tokens_per_s_together": round(best["tokens_per_s_together"]),
                 "over_one_alone": best.get("over_one_alone") and round(best["over_one_alone"], 2),
                 "mps": way == "mps", "measured": f"{machine['date'][:10]}, {machine['commit']}, PyTorch "
                 f"{machine['pytorch']}"}
        alone = report["ways"][way].get("1") or {}
        if alone.get("card_memory_mib_max"):  # what one training took of the card: reproduce's memory check
            entry["mib_per_training"] = round(alone["card_memory_mib_max"])
        write_json_durably(args.out / "measured_parallel.json", {
            "about": "Graph-replayed trainings of experiment=multi30k_best at once on one card, as separate "
                     "processes (mps: under CUDA MPS): the count with the most target tokens/s together, measured by "
                     "scripts/gpu_check.py --parts parallel; reproduce.py parallel=auto follows it.",
            "cards": {best["device"]: entry}})
    return report


def parallel_way(args: argparse.Namespace, way: str) -> dict[str, Any]:
    """Each of ``--parallel-counts`` as one round, ``way`` ``processes`` or ``mps`` (its daemon around them all)."""
    with (mps_daemon(args.out / "mps") if way == "mps" else nullcontext({})) as variables:
        env = {**os.environ, **variables} if variables else {}
        rounds = {str(n): attempt(args, lambda n=n: parallel_round(args, way, n, env)) for n in args.parallel_counts}
    alone = rounds.get("1", {}).get("tokens_per_s_together")
    for measured in rounds.values():
        if alone and "tokens_per_s_together" in measured:
            measured["over_one_alone"] = measured["tokens_per_s_together"] / alone
    return rounds


def parallel_round(args: argparse.Namespace, way: str, n: int, env: dict[str, str]) -> dict[str, Any]:
    """``n`` trainings started together, each its own process, seed and run dir: tokens/s together (the sum of each
    run's, and all target tokens over the round's wall time)."""
    folder = args.out / f"parallel_{way}_n{n}"
    runs = [folder / f"run{i}" for i in range(n)]
    timing = folder / "round.json"
    if not (timing.is_file() and all((run / "results.json").is_file() for run in runs)):
        args.budget.need(SECONDS["parallel_round"] + n * SECONDS["parallel_per_run"], f"{n} trainings at once")
        shutil.rmtree(folder, ignore_errors=True)  # a round is measured whole or not at all
        folder.mkdir(parents=True)
        steps = args.parallel_steps
        commands = [[sys.executable, "train.py", f"experiment={args.experiment}", f"trainer.seed={args.seed + i}",
                     *args.overrides, f"trainer.max_steps={steps}", f"trainer.validate_every={steps}",
                     "trainer.cuda_graphs=true", f"hydra.run.dir={run.resolve()}"] for i, run in enumerate(runs)]
        write_json_durably(timing, run_together(commands, [folder / f"run{i}.log" for i in range(n)],
                                                args.project_dir, args.budget.timeout(), env or None))
    took = json.loads(timing.read_text(encoding="utf-8"))
    failed = [f"run{i}" for i, status in enumerate(took["exit_status"]) if status != 0]
    if failed:
        raise SystemExit(f"gpu_check.py: {', '.join(failed)} of {n} at once failed; their output: {folder}/*.log")
    results = [json.loads((run / "results.json").read_text(encoding="utf-8")) for run in runs]
    speeds = [r["train_target_tokens_per_s"] for r in results]
    tokens = sum(r["train_target_tokens_per_s"] * r["train_seconds"] for r in results)
    memory = [(r.get("gpu_utilisation") or {}).get("memory_used_mib_max") for r in results]
    return {"trainings": n, "device": results[0].get("device"), "tokens_per_s_together": sum(speeds),
            "card_memory_mib_max": max((m for m in memory if m is not None), default=None),  # nvidia-smi: all of it
            "tokens_per_s_each": speeds, "target_tokens": tokens, "wall_seconds": took["wall_seconds"],
            "tokens_per_s_over_wall": tokens / took["wall_seconds"],
            "train_seconds_longest": max(r["train_seconds"] for r in results)}


def run_together(commands: list[list[str]], logs: list[Path], cwd: Path, timeout: float | None,
                 env: dict[str, str] | None) -> dict[str, Any]:
    """The commands started at once, each into its log: their exit statuses and the wall seconds until the last
    ended. Past ``timeout`` every one is stopped and Stopped raised."""
    started = time.perf_counter()
    sinks = [log.open("a", encoding="utf-8") for log in logs]
    processes = []
    try:
        for command, sink in zip(commands, sinks):
            print(f"gpu_check: {' '.join(command)}", flush=True)
            processes.append(subprocess.Popen(command, cwd=cwd, stdout=sink, stderr=subprocess.STDOUT, env=env,
                                              start_new_session=True))
        for process in processes:
            left = None if timeout is None else max(0.1, timeout - (time.perf_counter() - started))
            process.wait(timeout=left)
    except subprocess.TimeoutExpired:
        for process in processes:
            stop_group(process)
        raise Stopped(f"{len(commands)} trainings at once stopped at the end of the budget after "
                      f"{time.perf_counter() - started:.0f} s; their output: {logs[0].parent}") from None
    finally:
        for sink in sinks:
            sink.close()
    return {"exit_status": [p.returncode for p in processes], "wall_seconds": time.perf_counter() - started}


def chain_part(args: argparse.Namespace) -> dict[str, Any]:
    """reproduce.py's whole chain with ``--parallel`` stages at once; this invocation's wall time."""
    data = [o for o in args.overrides if o.startswith("data.")]
    command = [sys.executable, "reproduce.py", f"recipe={args.recipe}", f"parallel={args.parallel}",
               f"workdir={(args.out / 'chain').resolve()}", *data]
    args.budget.need(SECONDS["chain"], f"recipe={args.recipe}")
    seconds = run_timed(command, args.out / "chain.log", args.project_dir, args.budget.timeout())
    return {"recipe": args.recipe, "parallel": args.parallel, "wall_minutes": seconds / 60,
            "log": str(args.out / "chain.log")}


def study_part(args: argparse.Namespace) -> dict[str, Any]:
    """reproduce.py recipe=attention_study within the study's budget; then what finished and its report files."""
    workdir = args.out / "study"
    left = args.budget.left()
    budget = args.study_budget if args.study_budget is not None else (
        None if left is None else left - STUDY_STOP_SECONDS)
    if budget is not None and left is not None:
        budget = min(budget, left - STUDY_STOP_SECONDS)
    if budget is not None and budget < SECONDS["study"]:
        raise Skipped(f"the study: needs about {SECONDS['study']:.0f} s at least, {max(0.0, budget):.0f} s for it")
    data = [o for o in args.overrides if o.startswith("data.")]
    command = [sys.executable, "reproduce.py", "recipe=attention_study", f"workdir={workdir.resolve()}",
               f"parallel={args.study_parallel}", *([] if budget is None else [f"budget={int(budget)}s"]), *data]
    report: dict[str, Any] = {"command": " ".join(["python", *command[1:]]), "budget_seconds": budget}
    try:
        report["exit_status"], report["seconds"] = run_logged(command, args.out / "study.log", args.project_dir,
                                                              args.budget.timeout())
    except Stopped as why:
        report["stopped"] = str(why)
    finished = sorted(workdir.glob("runs/study_*/seed*/results.json"))
    report["trainings_finished"] = {
        f"{path.parent.parent.name}/{path.parent.name}": json.loads(path.read_text(encoding="utf-8")).get("test")
        for path in finished}
    report["report_files"] = study_files(workdir)
    return report


def study_files(workdir: Path) -> list[str]:
    """The study's report files (relative to ``workdir``), the most useful first, each once."""
    found = [path for pattern in STUDY_FILES for path in sorted((workdir / "runs").glob(pattern))]
    return [str(path.relative_to(workdir)) for path in dict.fromkeys(found)]


def git_commit(project_dir: Path) -> str:
    """``NMT_GIT_COMMIT``, else ``git describe --always --dirty`` of the checkout, else ``unknown``."""
    if os.environ.get("NMT_GIT_COMMIT"):
        return os.environ["NMT_GIT_COMMIT"].strip()
    try:
        found = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=project_dir, capture_output=True,
                               text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return found.stdout.strip() if found.returncode == 0 and found.stdout.strip() else "unknown"


def machine_info(project_dir: Path) -> dict[str, Any]:
    """The card, PyTorch, CUDA, cuDNN and Python versions, the project's commit and the date (UTC)."""
    import torch

    from nmt.common.provenance import library_versions

    versions = library_versions()
    return {"card": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "pytorch": versions["torch"], "cuda": versions["cuda"], "cudnn": versions["cudnn"],
            "python": versions["python"], "commit": git_commit(project_dir),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def part_status(figures: Any) -> str:
    """``done``, or the skip, stop or failure a part's figures record."""
    if isinstance(figures, dict):
        for key in ("skipped", "stopped", "failed"):
            if key in figures:
                return f"{key}: {figures[key]}"
    return "done"


def pack(args: argparse.Namespace, report: dict[str, Any], argv: list[str]) -> list[Path]:
    """At most MAX_FILES files into ``args.pack``: gpu_check.json, README.md, measured_parallel.json (when the
    parallel part wrote it), gpu_check_files.tar.gz (the logs, results and reports under ``--out``), and the
    study's report files in the slots left."""
    dest, out = args.pack, args.out
    dest.mkdir(parents=True, exist_ok=True)
    written = [write_json_durably(dest / "gpu_check.json", report)]
    if (out / "measured_parallel.json").is_file():
        written.append(Path(shutil.copyfile(out / "measured_parallel.json", dest / "measured_parallel.json")))
    tarball, left_out = dest / "gpu_check_files.tar.gz", []
    members, total = [], 0
    candidates = [p for p in sorted(out.rglob("*")) if p.is_file() and p.suffix in TAR_SUFFIXES
                  and "checkpoints" not in p.relative_to(out).parts]
    for path in sorted(candidates, key=lambda p: p.stat().st_size):
        size = path.stat().st_size
        if total + size > TAR_MAX_BYTES:
            left_out.append(f"{path.relative_to(out)} ({size} bytes)")
            continue
        members.append(path)
        total += size
    with tarfile.open(tarball, "w:gz") as tar:
        for path in sorted(members):
            tar.add(path, arcname=str(Path("gpu_check") / path.relative_to(out)))
    written.append(tarball)
    slots = MAX_FILES - len(written) - 1  # README.md last
    study = [out / "study" / name for name in (report.get("study") or {}).get("report_files", [])]
    copied = [Path(shutil.copyfile(path, dest / path.name)) for path in study[:max(0, slots)]]
    written += copied
    written.append(write_text_durably(dest / "README.md", readme(args, report, argv, written, left_out)))
    files = sorted(p.name for p in dest.iterdir())
    if len(files) > MAX_FILES:
        raise SystemExit(f"gpu_check.py: {dest} holds {len(files)} files, more than the {MAX_FILES} a device call "
                         f"brings back: {', '.join(files)}")
    return written


def readme(args: argparse.Namespace, report: dict[str, Any], argv: list[str], files: list[Path],
           left_out: list[str]) -> str:
    """README.md of a packed check: card, versions, commit, the command, each part's status, each file."""
    machine = report.get("machine", {})
    lines = [f"# GPU check: {machine.get('card') or 'no GPU'}, project {machine.get('commit', 'unknown')}", "",
             f"PyTorch {machine.get('pytorch')}, CUDA {machine.get('cuda')}, cuDNN {machine.get('cudnn')}, Python "
             f"{machine.get('python')}; measured {machine.get('date')}.", "",
             "```", " ".join(["python scripts/gpu_check.py", *argv]), "```", "",
             "| part | seconds | status |", "| --- | ---: | --- |"]
    seconds = report.get("seconds", {})
    lines += [f"| {part} | {seconds.get(part, 0.0):.0f} | {part_status(report[part])} |"
              for part in PARTS if part in report]
    what = {"gpu_check.json": "every part's figures, the machine and the commit",
            "measured_parallel.json": "the best count of trainings at once on this card, for nmt/analysis/",
            "gpu_check_files.tar.gz": "the runs' logs, results.json, train logs, benchmark reports and translations, "
                                      "the CUDA tests' output, the study's reports (no checkpoints)",
            "README.md": "this file"}
    lines += ["", "| file | what it is |", "| --- | --- |"]
    lines += [f"| {path.name} | {what.get(path.name, 'a report of the attention study')} |"
              for path in [*files, Path("README.md")]]
    if left_out:
        lines += ["", "Left out of the tarball (too large): " + ", ".join(left_out)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None, project_dir: Path | None = None) -> dict[str, Any]:
    """Run the chosen parts in order, merge them into ``<out>/gpu_check.json`` (earlier parts kept); returns it."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv, project_dir or Path.cwd())
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "gpu_check.json"
    report = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    report["machine"] = machine_info(args.project_dir)
    report.setdefault("seconds", {})
    measure = {"tests": tests_part, "graphs": graphs_part, "precision": precision_part, "recipe": recipe_part,
               "translate": translate_part, "search": search_part, "parallel": parallel_part, "chain": chain_part,
               "study": study_part}
    for part in [p for p in PARTS if p in args.parts]:  # in PARTS' order, whatever order was given
        started = time.perf_counter()
        report[part] = attempt(args, lambda part=part: measure[part](args))
        report["seconds"][part] = time.perf_counter() - started
        write_json_durably(path, report)
        print(f"gpu_check: {part}: {json.dumps(report[part], default=str)[:400]}", flush=True)
    print(f"gpu_check: wrote {path}", flush=True)
    if args.pack is not None:
        files = pack(args, report, argv)
        print(f"gpu_check: packed {len(files)} files into {args.pack}: {', '.join(p.name for p in files)}", flush=True)
    return report
