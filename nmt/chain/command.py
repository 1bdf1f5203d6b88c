"""The chain as one command (``reproduce.py``): its settings read, the workdir checked and held, the plan shown or
run within the budget, and the report written; a stop (the budget's end, SIGTERM, Ctrl-C) prints the command that
goes on."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from nmt.chain import clock as chain_clock
from nmt.chain.budget import Budget, time_budget
from nmt.chain.card import card_sharing, choose_mps, choose_parallel, cuda_card
from nmt.chain.clock import Clock
from nmt.chain.launch import launcher_config
from nmt.chain.plan import Chain, Stage, plan
from nmt.chain.portable import make_portable
from nmt.chain.report import render, summary
from nmt.chain.runner import signals_interrupt
from nmt.chain.schedule import STOP_GRACE_S, check_budget, eta, eta_sources, run_stages, say, schedule
from nmt.chain.settings import parse_arguments, usage
from nmt.chain.workdir import (
    check_kept_runs,
    check_same_study,
    runs_to_retrain,
    set_aside,
    state_dir,
    stop_left_running,
    workdir_lock,
)
from nmt.common.disk import check_writable
from nmt.common.files import write_json_durably, write_text_durably

SCRIPTS = {"train": "train.py", "backtranslate": "backtranslate.py", "tune": "scripts/tune_decoding.py",
           "compare": "scripts/compare_runs.py"}


def main(args: Sequence[str], repo: Path) -> dict[str, Any] | None:
    """Plan the chain of ``args``' recipe, run what is not complete (what fits in the budget, if any), write the
    summary; returns it (None for ``--help``, a dry run, or a stop at the budget).

    Args:
        args: ``key=value`` settings (``recipe``, ``workdir``, ``parallel``, ``mps``, ``budget``, ``deadline``,
            ``dry_run``, ``device``, ``launcher`` and its ``launcher.*`` keys) and ``data.*`` overrides; or
            ``--help``/``-h``.
        repo: the folder of the commands it drives (train.py, backtranslate.py, scripts/tune_decoding.py)
            and of configs/.

    Raises:
        ChainError: a bad setting, recipe or workdir (another study's, a partial kept run), a budget too short for
            any stage (all before any work), or a stage that failed (rerun to resume).
        CardError: a parallel= the card's memory does not hold, or MPS where it cannot serve (before any work).
        PathNotWritable: a workdir that cannot be made. FolderInUse: another call runs in the workdir.
        Interrupted: a SIGTERM or SIGINT stopped the stages (they saved; the command that goes on was printed).
    """
    began = chain_clock.monotonic()  # the budget counts from here
    recipes = repo / "configs" / "recipe"
    if "--help" in args or "-h" in args:
        print(usage(recipes), flush=True)
        return None
    settings, data, recipe = parse_arguments(args, recipes)
    budget = time_budget(settings, began)
    programs = {kind: [sys.executable, str(repo / script)] for kind, script in SCRIPTS.items()}
    workdir = Path(str(settings["workdir"])).expanduser().resolve()
    check_writable(workdir, "workdir", folder=True)  # before the plan, not in the first stage's traceback
    launcher = launcher_config(str(settings["launcher"]), settings["launcher_keys"], state_dir(workdir) / "jobs")
    chain = Chain(workdir, programs, recipe, str(settings["recipe"]), data, repo / "configs",
                  str(settings["launcher"]), launcher)
    check_same_study(chain, record=False)
    stages = plan(chain)
    device = auto_device() if settings["device"] == "auto" else settings["device"]
    card = cuda_card() if device == "cuda" else None
    parallel, chosen = stages_at_once(settings, str(device), card, len(stages))
    use_mps, mps_reason = choose_mps(settings["mps"], str(device), parallel, card)
    mps_reason = f"; {mps_reason}" if mps_reason else ""
    clock = stage_clock(workdir, recipe, str(device), stages)
    hint = cpu_hint(chain, str(device))
    retrain = runs_to_retrain(stages, workdir)
    for name, why in retrain.items():  # before it starts: what a new machine costs
        say(f"retrain {name}: {why}")
    check_budget(budget, stages, clock)
    check_kept_runs([s for s in stages if s.name not in retrain])
    if settings["dry_run"]:
        show_plan(stages, clock, parallel, budget, f"{device}, parallel={parallel}, {chosen}{mps_reason}",
                  eta_sources(stages, clock, recipe, str(device)) + (f"; {hint}" if hint else ""))
        return None
    if hint:
        say(hint)
    with workdir_lock(workdir):
        check_same_study(chain, record=True)
        stop_left_running(workdir, STOP_GRACE_S, say)
        make_portable(workdir)  # what an earlier version or a killed call left naming this machine's folders
        for stage in [s for s in stages if s.name in retrain]:
            aside = set_aside(stage.outputs[0], workdir)
            say(f"retrain {stage.name}: its kept files are now in {chain.relative(aside)}")
        return run_chain(chain, stages, parallel, clock, budget, f"parallel={parallel} ({chosen}){mps_reason}",
                         use_mps, go_on_command(args, workdir))


def stage_clock(workdir: Path, recipe: DictConfig, device: str, stages: list[Stage]) -> Clock:
    """The stages' estimates (this workdir's times, else the recipe's) and the part done of each stopped one."""
    clock = Clock(state_dir(workdir) / "times.json", dict(recipe.eta_minutes[device]))
    clock.note_progress({s.name: s.progress() for s in stages if not s.done()})
    return clock


def stages_at_once(settings: dict[str, Any], device: str, card: Any, stages: int) -> tuple[int, str]:
    """How many stages run at once and why: ``parallel=``, or with a launcher and ``parallel=auto`` every stage
    that can start (the cluster's queue decides what runs when)."""
    if settings["launcher"] != "local" and settings["parallel"] == "auto":
        return stages, f"launcher={settings['launcher']}: each wave of stages as one job array"
    return choose_parallel(settings["parallel"], device, card)


def auto_device() -> str:
    """cuda or cpu; PyTorch is imported only now, so that a mistake or ``--help`` answers without its start-up."""
    from nmt.common.device import resolve_device

    return resolve_device("auto").type


def cpu_hint(chain: Chain, device: str) -> str:
    """On a CPU, the recipe's ``cpu_recipe`` (the same study sized for one), if it names one."""
    if device != "cpu" or not chain.recipe.get("cpu_recipe"):
        return ""
    return (f"recipe={chain.recipe_name} is sized for a GPU; on a CPU, recipe={chain.recipe.cpu_recipe} runs the "
            "same study in a fraction of the time (its report is its own)")


def show_plan(stages: list[Stage], clock: Clock, parallel: int, budget: Budget | None, how: str,
              sources: str) -> None:
    """Each stage, complete or to run, with its command (or what it is built from, when that is not made yet);
    the ETA and, with a budget, how many stages it holds."""
    for stage in stages:
        try:
            command = " ".join(stage.command())
        except FileNotFoundError:  # a score stage reads the choice its tune stage has not made yet
            command = f"built from {', '.join(map(str, stage.needs))} once it exists"
        say(f"{'complete' if stage.done() else 'to run':8} {stage.name}: {command}")
    done = {s.name for s in stages if s.done()}
    say(f"ETA {eta(stages, done, {}, clock, parallel)} ({how}); {sources}")
    if budget is not None:
        fits = len(schedule(stages, done, {}, clock, parallel, within=budget.left()))
        say(f"{budget.label}: {fits} of the {len(stages) - len(done)} stages left would run in it")


def go_on_command(args: Sequence[str], workdir: Path) -> str:
    """The call that goes on after a stop: the same settings in the same workdir (made absolute), without
    ``deadline=`` (past by then: give a new budget= or deadline=)."""
    kept = [a for a in args if not a.startswith(("workdir=", "deadline="))]
    return shlex.join(["python", "reproduce.py", *kept, f"workdir={workdir}"])


def run_chain(chain: Chain, stages: list[Stage], parallel: int, clock: Clock, budget: Budget | None, how: str,
              use_mps: bool, go_on: str) -> dict[str, Any] | None:
    """Run the stages (``how`` says how many at once and why), then write the summary and return it. At a stop
    (the budget's end: None is returned; a signal: Interrupted is raised again once the stages and the MPS daemon
    are stopped) say what is left and the command ``go_on`` that goes on."""
    say(how)
    with signals_interrupt():
        try:
            with card_sharing(use_mps, chain.workdir):
                outcome = run_stages(chain, stages, parallel, clock, budget)
        finally:  # the stages have stopped: what they kept names no machine's folders
            make_portable(chain.workdir)
    if outcome.left:
        rest = eta(stages, {s.name for s in stages if s.name not in outcome.left}, {}, clock, parallel)
        why = outcome.stopped_by if outcome.signal else f"stopped at {budget.label if budget else 'the budget'}"
        say(f"{why}: {len(stages) - len(outcome.left)} of {len(stages)} stages complete, "
            f"{len(outcome.left)} left (about {rest} at parallel={parallel}); a stopped training resumes from its "
            "checkpoints/last.pt")
        say(f"go on with: {go_on}  (elsewhere: copy the workdir there first)")
        if outcome.signal is not None:
            raise outcome.signal
        return None
    report = summary(chain, stages)
    out = chain.workdir / "runs" / f"reproduce_{chain.recipe_name}"
    write_json_durably(f"{out}.json", report)
    write_text_durably(f"{out}.md", render(report))
    say(f"wrote {out}.json and {out}.md")
    print(render(report), flush=True)
    return report
