"""The parts that translate: beam 1 and 5 on the trained run, and search eager against graphs (the same tokens in
fp32), then back-translating the task-2 captions eager against graphs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from nmt_tools.gpu_check.registry import attempt, part
from nmt_tools.gpu_check.runs import SECONDS, run_summary, run_timed, train, train_seconds, trained_run


@part("translate", 2)
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


@part("search", 3)
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
    measured = json.loads(report.with_suffix(".json").read_text(encoding="utf-8"))
    modes = {row["mode"]: {"sentences_per_s": row["sentences_per_s"], "seconds_median": row.get("seconds_median"),
                           "sentences": row.get("sentences"), "bleu": row.get("bleu")} for row in measured["results"]}
    graphs = measured.get("cuda_graphs") or {}  # the canary: checks run, their seconds, buckets that disagreed
    canary = {key: graphs[key] for key in ("checks", "check_seconds", "mismatches", "fallback") if key in graphs}
    return {**modes, "canary": canary} if canary else modes


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
