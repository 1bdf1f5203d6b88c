"""The chain's scheduler: each stage started once those it waits for are done, as many at once as allowed, only
what the budget can hold; at the budget's end or a SIGTERM or SIGINT every running stage is stopped so that it
resumes; and the ETA, scheduled as the runner would run the rest."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from nmt.chain import clock as chain_clock
from nmt.chain.budget import Budget
from nmt.chain.clock import Clock
from nmt.chain.launch import StageJob, submit_wave
from nmt.chain.plan import Chain, Stage
from nmt.chain.runner import STOP_GRACE_S, Interrupted, ask_to_stop, kill_group, start
from nmt.chain.settings import ChainError
from nmt.chain.workdir import log_path, note_running
from nmt.common.disk import EXIT_WRITE_STOPPED, WriteStopped, free_space
from nmt.common.progress import format_duration


def say(line: str) -> None:
    print(f"reproduce.py: {line}", flush=True)


@dataclass
class Outcome:
    """How a call's run ended: the stages left for a later call (none: the chain is complete), and what stopped
    them (the budget's label, or the signal that reached the chain)."""

    left: list[str]
    stopped_by: str = ""
    signal: Interrupted | None = None


Running = dict[str, tuple[Stage, Any, float]]  # stage name -> (stage, its process or job, when it began)


def run_stages(chain: Chain, stages: list[Stage], parallel: int, clock: Clock, budget: Budget | None = None) -> Outcome:
    """Start each stage once the stages it waits for are done, ``parallel`` at a time; skip done ones. With a
    ``budget``, start only a stage whose time left ends inside it. At the budget's end, or when a SIGTERM or SIGINT
    reaches the chain (Interrupted), each running stage gets SIGTERM (a training saves checkpoints/last.pt), then
    SIGKILL after ``STOP_GRACE_S`` (at once on a second signal).

    Raises:
        ChainError: a stage failed or stopped on its own (after the others running have ended): rerun to resume.
        WriteStopped: the same, for a stage that ran out of disk space (exit 74).
    """
    finished = {s.name for s in stages if s.done()}
    for name in [s.name for s in stages if s.name in finished]:
        say(f"skip  {name}: complete")
    running: Running = {}
    failed: list[str] = []
    held: set[str] = set()  # not started: their time left would overrun the budget
    stopping: float | None = None  # when the SIGTERMs went out
    outcome = Outcome([])
    say(f"{len(stages)} stages, {len(finished)} complete, {parallel} at a time; "
        f"ETA {eta(stages, finished, running, clock, parallel)}" + (f"; {budget.label}" if budget else ""))
    while True:
        try:
            if stopping is None and not failed:
                start_ready(chain, stages, finished, running, held, clock, parallel, budget)
            if not running:
                break
            time.sleep(0.05)  # stages take minutes; polling costs nothing
            clock.now()  # a look after each sleep: a longer gap is a stop, not stage time
            if budget is not None and stopping is None and budget.left() <= 0:
                stopping, outcome.stopped_by = chain_clock.monotonic(), budget.label
                stop_running(running, f"{budget.label} is spent")
            if stopping is not None and chain_clock.monotonic() - stopping > STOP_GRACE_S:
                for _, process, _ in running.values():
                    kill_group(process)  # it had its grace; its last checkpoint on disk is what resumes
            book_ended(chain, running, clock, finished, held, failed, stopped=stopping is not None)
        except Interrupted as caught:
            if outcome.signal is not None:  # a second signal: no more grace
                for _, process, _ in running.values():
                    kill_group(process)
                continue
            stopping, outcome.stopped_by, outcome.signal = chain_clock.monotonic(), str(caught.args[0]), caught
            stop_running(running, f"{caught}")
    if failed or (len(finished) < len(stages) and not held and outcome.signal is None):
        reason = failed[0] if failed else "a stage's inputs never became complete"
        error = WriteStopped if "ran out of disk space" in reason else ChainError  # 74, not 2: free space, go on
        raise error(f"{reason}; run the same command again to resume (complete stages are skipped)")
    outcome.left = [s.name for s in stages if s.name not in finished]
    return outcome


def start_ready(chain: Chain, stages: list[Stage], finished: set[str], running: Running, held: set[str],
                clock: Clock, parallel: int, budget: Budget | None) -> None:
    """Start the stages whose inputs are done while slots are free (through a launcher: as one job array); hold
    those the budget cannot hold."""
    ready = [s for s in stages if s.name not in finished and s.name not in running
             and all(a in finished for a in s.after)]
    starting: list[Stage] = []
    while ready and len(running) + len(starting) < parallel:
        stage = ready.pop(0)
        if budget is not None and clock.remaining(stage.name, stage.kind) > budget.left():
            held.add(stage.name)
            continue
        held.discard(stage.name)
        starting.append(stage)
    if not starting:
        return
    for stage, process in zip(starting, start_stages(chain, starting, budget)):
        running[stage.name] = (stage, process, clock.now())
        left = eta(stages, finished, running, clock, parallel)
        say(f"start {stage.name} ({len(finished) + len(running)}/{len(stages)}): about "
            f"{format_duration(clock.remaining(stage.name, stage.kind))}; chain ETA {left}")
    note_running(chain.workdir, running)


def stop_running(running: Running, why: str) -> None:
    for name, (_, process, _) in running.items():
        say(f"stop  {name}: {why} (SIGTERM: a training saves checkpoints/last.pt)")
        ask_to_stop(process)


def start_stages(chain: Chain, stages: list[Stage], budget: Budget | None) -> list[Any]:
    """Each stage's command in the workdir, its output appended to its log: a process each, or with a launcher
    one job array whose jobs build their commands as they start."""
    commands = [stage.command() for stage in stages]
    for command in commands:
        say(f"      {' '.join(command)}")
    if chain.launcher is None:
        return [start(command, log_path(chain.workdir, stage.name), chain.workdir,
                      {**os.environ, **stage_env(chain, stage)}) for stage, command in zip(stages, commands)]
    jobs = [(StageJob(stage.command, chain.workdir, log_path(chain.workdir, stage.name), stage_env(chain, stage)),
             command) for stage, command in zip(stages, commands)]
    return submit_wave(chain.launcher, chain.launcher_name, jobs, None if budget is None else budget.left())


def stage_env(chain: Chain, stage: Stage) -> dict[str, str]:
    """What a stage's command has in its environment besides the chain's own: its name, and the corpus mirror of a
    ``data.mirror=`` override (tune_decoding.py reads a run's data through the environment's mirror)."""
    env = {"NMT_CHAIN_STAGE": stage.name}
    for arg in chain.data_overrides:
        if arg.startswith("data.mirror="):
            env["NMT_DATA_MIRROR"] = arg.split("=", 1)[1]
    return env


def book_ended(chain: Chain, running: Running, clock: Clock, finished: set[str], held: set[str], failed: list[str],
               stopped: bool) -> None:
    """Take the stages whose process ended out of ``running``: into ``finished`` (its time, summed over the calls
    that ran it, recorded), ``held`` (stopped by the budget or a signal: the next call resumes it) or ``failed`` (a
    line naming the stage, how it ended and its log); a stage that did not finish keeps the time it ran."""
    for name, (stage, process, began) in list(running.items()):
        if process.poll() is None:
            continue
        del running[name]
        kill_group(process)  # what the stage left behind
        note_running(chain.workdir, running)
        seconds = clock.now() - began
        if process.returncode == 0 and stage.done():
            finished.add(name)
            say(f"done  {name} in {format_duration(clock.finished(name, stage.kind, seconds))}")
            continue
        clock.stopped(name, seconds)
        if stopped:
            held.add(name)
            continue
        job = f"; {process.describe()}" if hasattr(process, "describe") else ""  # a launcher's job: its id
        how = f"failed (exit {process.returncode}{job})" if process.returncode else f"stopped before it finished{job}"
        if process.returncode == EXIT_WRITE_STOPPED:
            how = f"ran out of disk space ({free_space(chain.workdir)}; exit {EXIT_WRITE_STOPPED})"
        failed.append(f"stage '{name}' {how}; its log: {log_path(chain.workdir, name)}")


def check_budget(budget: Budget | None, stages: list[Stage], clock: Clock) -> None:
    """A ChainError unless the budget holds the shortest stage that can start now (by its time left)."""
    finished = {s.name for s in stages if s.done()}
    ready = [s for s in stages if s.name not in finished and all(a in finished for a in s.after)]
    if budget is None or not ready:
        return
    shortest = min(ready, key=lambda s: clock.remaining(s.name, s.kind))
    needed = clock.remaining(shortest.name, shortest.kind)
    if needed > budget.left():
        raise ChainError(f"{budget.label} ({format_duration(budget.left())} left) is shorter than the shortest stage "
                         f"that can start now, '{shortest.name}' (about {format_duration(needed)}); give a budget of "
                         "at least that")


def schedule(stages: list[Stage], finished: set[str], running: dict[str, Any], clock: Clock, parallel: int,
             within: float | None = None) -> dict[str, float]:
    """When each stage left would end (seconds from now), scheduled as the runner would, by the times left; with
    ``within``, only those that end inside it."""
    now = clock.now()
    ends = {stage.name: max(0.0, clock.remaining(stage.name, stage.kind) - (now - began))
            for stage, _, began in running.values()}
    slots = sorted([*ends.values(), *[0.0] * max(0, parallel - len(ends))])  # when each slot is free
    for stage in stages:
        if stage.name in finished or stage.name in ends or any(a not in finished and a not in ends
                                                                 for a in stage.after):
            continue
        end = max([slots[0], *(ends[name] for name in stage.after if name in ends)])
        end += clock.remaining(stage.name, stage.kind)
        if within is not None and end > within:
            continue
        ends[stage.name] = end
        slots = sorted([*slots[1:], end])
    return ends


def eta(stages: list[Stage], finished: set[str], running: dict[str, Any], clock: Clock, parallel: int) -> str:
    """The time left if each stage takes its estimate (``schedule``)."""
    return format_duration(max(schedule(stages, finished, running, clock, parallel).values(), default=0.0))


def eta_sources(stages: list[Stage], clock: Clock, recipe: DictConfig, device: str) -> str:
    """Where each kind of stage's estimate comes from: this workdir's own times, a time the recipe records as
    measured (``eta_measured.<device>``), or the recipe's guess."""
    measured = (recipe.get("eta_measured") or {}).get(device) or {}
    kinds: dict[str, list[str]] = {"timed here": [], "measured": [], "guessed": []}
    for kind in dict.fromkeys(s.kind for s in stages):
        source = "timed here" if clock.times.get(kind) else "measured" if kind in measured else "guessed"
        kinds[source].append(f"{kind} ({measured[kind]})" if source == "measured" else kind)
    return "; ".join(f"{source}: {', '.join(names)}" for source, names in kinds.items() if names)
