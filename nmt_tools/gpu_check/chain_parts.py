"""The parts that run the chain: ``reproduce.py``'s whole recipe timed, and the attention study within what the
budget has left, with the report files it wrote."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from nmt.chain.budget import NotInBudget
from nmt.chain.runner import BudgetSpent, run_logged
from nmt_tools.gpu_check.registry import part
from nmt_tools.gpu_check.runs import SECONDS, STOP_GRACE_S, run_timed

STUDY_STOP_SECONDS = 30.0  # the study's budget= ends this much before ours: its stages stop and save in time
STUDY_FILES = ("attention_study_*.md", "attention_study_*.json", "attention_study_*_groups.png",
               "attention_study_*.png", "reproduce_attention_study.md", "reproduce_attention_study.json")


@part("chain", 7)
def chain_part(args: argparse.Namespace) -> dict[str, Any]:
    """reproduce.py's whole chain with ``--parallel`` stages at once; this invocation's wall time."""
    data = [o for o in args.overrides if o.startswith("data.")]
    command = [sys.executable, "reproduce.py", f"recipe={args.recipe}", f"parallel={args.parallel}",
               f"workdir={(args.out / 'chain').resolve()}", *data]
    args.budget.need(SECONDS["chain"], f"recipe={args.recipe}")
    seconds = run_timed(command, args.out / "chain.log", args.project_dir, args.budget.timeout())
    return {"recipe": args.recipe, "parallel": args.parallel, "wall_minutes": seconds / 60,
            "log": str(args.out / "chain.log")}


@part("study", 8)
def study_part(args: argparse.Namespace) -> dict[str, Any]:
    """reproduce.py recipe=attention_study within the study's budget; then what finished and its report files."""
    workdir = args.out / "study"
    given = math.inf if args.study_budget is None else args.study_budget
    budget: float | None = min(given, args.budget.left() - STUDY_STOP_SECONDS)  # inf: no budget
    budget = None if math.isinf(budget) else budget
    if budget is not None and budget < SECONDS["study"]:
        raise NotInBudget(f"the study: needs about {SECONDS['study']:.0f} s at least, {max(0.0, budget):.0f} s for it")
    data = [o for o in args.overrides if o.startswith("data.")]
    command = [sys.executable, "reproduce.py", "recipe=attention_study", f"workdir={workdir.resolve()}",
               f"parallel={args.study_parallel}", *([] if budget is None else [f"budget={int(budget)}s"]), *data]
    report: dict[str, Any] = {"command": " ".join(["python", *command[1:]]), "budget_seconds": budget}
    try:
        report["exit_status"], report["seconds"] = run_logged(command, args.out / "study.log", args.project_dir,
                                                              args.budget.timeout(), grace=STOP_GRACE_S)
    except BudgetSpent as why:
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
