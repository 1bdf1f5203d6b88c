"""Trainings side by side on one card, as separate processes and under CUDA MPS: tokens/s together against one
alone, and the best count as ``measured_parallel.json`` (what the chain's parallel=auto follows)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from contextlib import nullcontext
from typing import Any

from nmt.chain.mps import mps_daemon
from nmt.chain.runner import run_together
from nmt.common.files import write_json_durably
from nmt_tools.gpu_check.machine import machine_info
from nmt_tools.gpu_check.registry import attempt, part
from nmt_tools.gpu_check.runs import SECONDS, STOP_GRACE_S


@part("parallel", 6)
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
                                                args.project_dir, args.budget.timeout(), env or None,
                                                STOP_GRACE_S))
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
