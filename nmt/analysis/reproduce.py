"""The chain behind the best models as one resumable command: stages that drive train.py, backtranslate.py and
tune_decoding.py as subprocesses, skip what is complete, resume what stopped, and end in a table of the systems."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from time import monotonic  # one name for the chain's clock (a test replaces it)
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from nmt.analysis.card import MEASURED_PARALLEL, PARALLEL_ON_CUDA, card_sharing, choose_mps, choose_parallel, cuda_card
from nmt.analysis.decoding import setting_label
from nmt.common.disk import EXIT_WRITE_STOPPED, WriteStopped, check_writable, free_space
from nmt.common.files import write_json_durably, write_text_durably
from nmt.common.progress import format_duration
from nmt.common.provenance import provenance
from nmt.common.settings import unknown_key_message
from nmt.data.synthetic import is_complete
from nmt.model.checkpoint import CheckpointError, resolve_checkpoint

DEFAULTS = {"recipe": "bt_best", "workdir": ".", "parallel": "auto", "mps": "auto", "budget": None,
            "deadline": None, "dry_run": False, "device": "auto"}
BUDGET_FORMS = "seconds (600), or hours, minutes and seconds (90s, 45m, 1h30m, 1h30m15s)"
DEADLINE_FORMS = "HH:MM or HH:MM:SS (the next time the clock reads it) or an ISO date and time (2026-11-28T14:30)"
AS_WRITTEN = ("budget", "deadline")  # read as text: OmegaConf would turn deadline=14:30 into 870 (YAML's base 60)
# After the budget's SIGTERM, how long a stage has to finish its step and save checkpoints/last.pt before SIGKILL.
STOP_GRACE_S = 120.0


class ChainError(ValueError):
    """A chain that cannot run as asked: a bad setting or recipe, or a stage that failed (one line)."""


@dataclass
class Stage:
    """One step of the chain.

    Attributes:
        name: what it is, for the log (``bt de-en seed1``).
        kind: its ``eta_minutes`` key (a training's name, ``backtranslate`` or ``tune``).
        outputs: the paths it makes; ``needs``: the paths it reads (other stages' outputs, or existing).
        command: its argv, built when it starts (a run with a checkpoint resumes instead of starting over).
        done: whether its outputs are complete.
    """

    name: str
    kind: str
    outputs: list[Path]
    needs: list[Path]
    command: Callable[[], list[str]]
    done: Callable[[], bool]
    after: list[str] = field(default_factory=list)


@dataclass
class Chain:
    """What every stage shares: where it runs, the programs, the recipe, the data overrides."""

    workdir: Path
    programs: dict[str, list[str]]
    recipe: DictConfig
    recipe_name: str
    data_overrides: list[str]
    configs: Path

    def path(self, value: str | Path) -> Path:
        return (self.workdir / str(value)).resolve()


def parse_arguments(args: Sequence[str], recipes: Path) -> tuple[dict[str, Any], list[str], DictConfig]:
    """``key=value`` arguments: the chain's settings, the ``data.*`` overrides (passed to every stage that
    reads data), and the recipe (``configs/recipe/<recipe>.yaml``, ``defaults: [parent]`` merged first).

    Raises:
        ChainError: an unknown key (naming the nearest), a malformed argument, or an unknown recipe.
    """
    settings, data = dict(DEFAULTS), []
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep:
            raise ChainError(f"{arg!r} is not key=value (python reproduce.py --help lists them); "
                             "e.g. recipe=bt_best parallel=2 data.mirror=/corpora")
        if key.startswith("data."):
            data.append(arg)
        elif key in AS_WRITTEN:
            settings[key] = value
        elif key in DEFAULTS:
            settings[key] = OmegaConf.from_dotlist([arg])[key]
        else:
            raise ChainError(unknown_key_message("", key, [*DEFAULTS, "data.<key> (train.py's data overrides)"]))
    parallel = settings["parallel"]
    if parallel != "auto" and (not isinstance(parallel, int) or isinstance(parallel, bool) or parallel < 1):
        raise ChainError(f"parallel={parallel!r} must be auto (on a GPU the card's measured figure, else "
                         f"{PARALLEL_ON_CUDA}; 1 on a CPU) or a whole number >= 1 (stages run at once)")
    settings["mps"] = str(settings["mps"]).lower()  # the command line's true / false arrive as booleans
    if settings["mps"] not in ("auto", "true", "false"):
        raise ChainError(f"mps={settings['mps']!r} must be auto (what this card measured faster), true or false")
    if settings["device"] not in ("auto", "cpu", "cuda"):
        raise ChainError(f"device={settings['device']!r} must be auto, cpu or cuda (whose eta_minutes to use; "
                         "each run picks its own device)")
    return settings, data, load_recipe(recipes, str(settings["recipe"]))


SETTINGS_HELP = {  # each setting's value form and meaning, for --help (its default comes from DEFAULTS)
    "recipe": ("NAME", "which chain to run: one of the recipes above"),
    "workdir": ("DIR", "where its runs/ go; the same workdir again goes on where a call stopped"),
    "parallel": ("N|auto", f"stages at once; auto: on a GPU the card's figure in {MEASURED_PARALLEL.name}, else "
                           f"{PARALLEL_ON_CUDA}; 1 on a CPU"),
    "mps": ("auto|true|false", "run GPU stages at once under CUDA MPS (started and stopped here); auto: when "
                               f"{MEASURED_PARALLEL.name} says MPS was faster on this card"),
    "budget": ("TIME", f"start only stages expected to end inside it, stop (SIGTERM) what runs at its end: "
                       f"{BUDGET_FORMS}"),
    "deadline": ("WHEN", f"the same as a time on the clock: {DEADLINE_FORMS}; with budget=, the sooner counts"),
    "dry_run": ("BOOL", "list each stage, complete or to run, with its command and the ETA; run nothing"),
    "device": ("auto|cpu|cuda", "whose eta_minutes to use and what parallel=auto means (each run picks its own)"),
}


def usage(recipes: Path) -> str:
    """``--help``: the recipes (each yaml's first comment line), the settings with their defaults, examples."""
    lines = ["usage: python reproduce.py [KEY=VALUE ...] [data.KEY=VALUE ...]", "",
             "Run a recipe's chain of train.py stages (configs/recipe/), resumable from its workdir, with an ETA.", "",
             "recipes (recipe=NAME):"]
    for path in sorted(recipes.glob("*.yaml")):
        first = next((line.lstrip("# ").strip() for line in path.read_text(encoding="utf-8").splitlines()
                      if line.startswith("#")), "")
        lines.append(f"  {path.stem:<22}{first.split(': python')[0].split(':  python')[0]}")
    lines += ["", "settings [default]:"]
    for key, (form, meaning) in SETTINGS_HELP.items():
        default = "none" if DEFAULTS[key] is None else str(DEFAULTS[key]).lower()
        lines += textwrap.wrap(f"{meaning} [{default}]", 110, initial_indent=f"  {key}={form}".ljust(24),
                               subsequent_indent=" " * 24)
    lines += ["  data.KEY=VALUE        train.py's data overrides for every stage that reads data (data.mirror=DIR)",
              "", "examples:", "  python reproduce.py recipe=attention_study dry_run=true",
              "  python reproduce.py recipe=attention_study workdir=study budget=8m   # then the same again to go on"]
    return "\n".join(lines)


def load_recipe(recipes: Path, name: str) -> DictConfig:
    """``recipes/<name>.yaml`` over its ``defaults`` (recipes it inherits from, merged first)."""
    path = recipes / f"{name}.yaml"
    if not path.is_file():
        valid = ", ".join(sorted(p.stem for p in recipes.glob("*.yaml")))
        raise ChainError(f"recipe={name} is not in {recipes}; valid: {valid}")
    recipe = OmegaConf.load(path)
    parents = recipe.pop("defaults", [])
    return OmegaConf.merge(*[load_recipe(recipes, str(parent)) for parent in parents], recipe)  # parents first


# ------------------------------------------------------------------------------------------------ Budget


def parse_budget(value: str) -> float:
    """``budget=`` in seconds (``600``, ``90s``, ``45m``, ``1h30m15s``); anything else is a ChainError."""
    text = value.strip().lower()
    parts = re.fullmatch(r"(?:(\d+(?:\.\d*)?)h)?(?:(\d+(?:\.\d*)?)m)?(?:(\d+(?:\.\d*)?)s?)?", text)
    if not text or parts is None or not any(parts.groups()):
        raise ChainError(f"budget={value!r} is not a duration; give {BUDGET_FORMS}")
    if not text[-1].isalpha() and (parts.group(1) or parts.group(2)):
        raise ChainError(f"budget={value!r} is not a duration (a number after h or m needs its unit); "
                         f"give {BUDGET_FORMS}")
    hours, minutes, seconds = (float(g or 0) for g in parts.groups())
    if hours * 3600 + minutes * 60 + seconds <= 0:
        raise ChainError(f"budget={value!r} leaves no time; give {BUDGET_FORMS}")
    return hours * 3600 + minutes * 60 + seconds


def parse_deadline(value: str, now: datetime) -> float:
    """``deadline=`` as seconds from ``now`` (aware, local): ``HH:MM[:SS]`` the next time the clock reads it, or an
    ISO date and time (local without a zone); another form or a past time is a ChainError."""
    text = value.strip()
    if re.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?", text):
        try:
            clock = datetime.strptime(text, "%H:%M:%S" if text.count(":") == 2 else "%H:%M").time()
        except ValueError:
            raise ChainError(f"deadline={value!r} is not a time of day; give {DEADLINE_FORMS}") from None
        target = now.replace(hour=clock.hour, minute=clock.minute, second=clock.second, microsecond=0)
        target += timedelta(days=1) if target <= now else timedelta()
    else:
        try:
            target = datetime.fromisoformat(text)
        except ValueError:
            raise ChainError(f"deadline={value!r} is not a time; give {DEADLINE_FORMS}") from None
        target = target.astimezone() if target.tzinfo is None else target
        if target <= now:
            raise ChainError(f"deadline={value!r} has passed (it is {now.isoformat(timespec='seconds')} now); "
                             f"give a later one: {DEADLINE_FORMS}")
    return (target - now).total_seconds()


@dataclass
class Budget:
    """When the chain must stop: ``ends`` on ``monotonic()``'s clock, and what set it, for messages."""

    ends: float
    label: str

    def left(self) -> float:
        return self.ends - monotonic()


def time_budget(settings: dict[str, Any], began: float) -> Budget | None:
    """The sooner of ``budget=`` (counted from ``began``, when the call started) and ``deadline=``; None without."""
    limits = []
    if settings["budget"] is not None:
        limits.append((began + parse_budget(str(settings["budget"])), f"budget={settings['budget']}"))
    if settings["deadline"] is not None:
        seconds = parse_deadline(str(settings["deadline"]), datetime.now().astimezone())
        limits.append((monotonic() + seconds, f"deadline={settings['deadline']}"))
    return Budget(*min(limits)) if limits else None


def check_budget(budget: Budget | None, stages: list[Stage], clock: Clock) -> None:
    """A ChainError unless the budget holds the shortest stage that can start now (by the ETA's estimate)."""
    finished = {s.name for s in stages if s.done()}
    ready = [s for s in stages if s.name not in finished and all(a in finished for a in s.after)]
    if budget is None or not ready:
        return
    shortest = min(ready, key=lambda s: clock.estimate(s.kind))
    needed = clock.estimate(shortest.kind)
    if needed > budget.left():
        raise ChainError(f"{budget.label} ({format_duration(budget.left())} left) is shorter than the shortest stage "
                         f"that can start now, '{shortest.name}' (about {format_duration(needed)}); give a budget of "
                         "at least that")


# ------------------------------------------------------------------------------------------------ Stages
def train_overrides(chain: Chain, experiment: str, pair: str, *more: str) -> list[str]:
    """train.py's overrides for ``experiment`` (``more`` right after it) in ``pair``, then the chain's own."""
    src, tgt = pair.split("-")
    return [f"experiment={experiment}", *more, f"data.src_lang={src}", f"data.tgt_lang={tgt}", *chain.data_overrides,
            *chain.recipe.train_overrides]


def compose_training(chain: Chain, experiment: str, pair: str, *more: str) -> DictConfig:
    """train.py's config for ``experiment`` in ``pair`` with ``more`` and the chain's overrides (checked by Hydra as
    it composes; call it inside ``plan``'s ``initialize_config_dir``)."""
    from hydra import compose
    from hydra.errors import HydraException

    overrides = train_overrides(chain, experiment, pair, *more)
    try:
        return compose("train", overrides=overrides)
    except HydraException as error:
        raise ChainError(f"train.py {' '.join(overrides)}: {str(error).splitlines()[0]}") from None


def training_stages(chain: Chain, training: DictConfig, pair: str) -> list[Stage]:
    """One training's runs in ``pair`` (one per seed), and a back-translation stage per folder its mixture
    makes with ``backtranslate:`` (run once before the seeds, which then find it complete). A training's
    ``overrides`` (e.g. ``[attention=dot]``) follow its experiment."""
    experiment = training.experiment if isinstance(training.experiment, str) else training.experiment[pair]
    own = [str(o) for o in training.get("overrides") or []]
    stages, needs, makes = [], [], []
    for entry in [e for e in compose_training(chain, experiment, pair, *own).data.mixture or [] if e.get("synthetic")]:
        folder = chain.path(entry.synthetic)
        if entry.get("backtranslate"):
            stages.append(backtranslate_stage(chain, entry, folder))
        if entry.get("forward_translate"):  # train.py makes it: it needs the teachers
            needs += [chain.path(c) for c in OmegaConf.to_object(entry.forward_translate.checkpoint)]
            makes.append(folder)  # the first training to reach it makes it; the others wait for that one
        needs.append(folder)
    for seed in list(chain.recipe.seeds)[: training.get("seeds") or None]:  # each done once it holds results.json
        run_dir = chain.path(f"runs/{training.runs}_{pair}/seed{seed}")
        stages.append(Stage(f"{training.name} {pair} seed{seed}", training.name, [run_dir, *makes], list(needs),
                            partial(train_command, chain, run_dir, [experiment, *own], pair, seed),
                            (run_dir / "results.json").is_file))
    return stages


def train_command(chain: Chain, run_dir: Path, experiment: list[str], pair: str, seed: int) -> list[str]:
    """train.py into ``run_dir`` (``experiment``: its name, then the training's own overrides), or resumed from its
    last.pt when it has one."""
    if (run_dir / "checkpoints" / "last.pt").is_file():
        return [*chain.programs["train"], f"trainer.resume={run_dir}"]
    return [*chain.programs["train"], *train_overrides(chain, experiment[0], pair, *experiment[1:],
                                                       f"trainer.seed={seed}"), f"hydra.run.dir={run_dir}"]


def backtranslate_stage(chain: Chain, entry: DictConfig, folder: Path) -> Stage:
    """backtranslate.py with a mixture entry's settings; the job resumes itself."""
    settings = OmegaConf.to_container(entry.backtranslate, resolve=True)
    checkpoints = settings["checkpoint"] if isinstance(settings["checkpoint"], list) else [settings["checkpoint"]]
    settings["checkpoint"] = [str(chain.path(c)) for c in checkpoints]
    mirror = [f"mirror={a.split('=', 1)[1]}" for a in chain.data_overrides if a.startswith("data.mirror=")]
    cache = [f"cache_dir={a.split('=', 1)[1]}" for a in chain.data_overrides if a.startswith("data.cache_dir=")]
    args = [f"{k}={'[' + ','.join(v) + ']' if isinstance(v, list) else v}" for k, v in settings.items()]
    command = [*chain.programs["backtranslate"], *args, f"output={folder}", *mirror, *cache]
    return Stage(f"backtranslate {folder.name}", "backtranslate", [folder], list(map(Path, settings["checkpoint"])),
                 lambda: command, lambda: is_complete(folder))


def tune_stage(chain: Chain, system: DictConfig, pair: str) -> Stage:
    """tune_decoding.py on val for one system (a run, an ensemble; reranked by the reverse pair's runs)."""
    out, members, rerank = system_paths(chain, system, pair)
    command = tune_command(chain, members, rerank, out, str(chain.recipe.test_split), chain.recipe.tune)
    report = Path(f"{out}.json")
    return Stage(f"tune {pair} {system.name}", "tune", [report], [*members, *rerank], lambda: command, report.is_file)


def score_stage(chain: Chain, system: DictConfig, pair: str, split: str) -> Stage:
    """The setting a system's tune stage chose on val, scored once on one more test split (``data.test_splits``)."""
    tuned, members, rerank = system_paths(chain, system, pair)
    out = Path(f"{tuned}.{split}")

    def command() -> list[str]:
        best = json.loads(Path(f"{tuned}.json").read_text(encoding="utf-8"))["best"]
        chosen = {"beam_sizes": [best["beam_size"]], "length_penalties": [best["length_penalty"]],
                  "rerank_weights": [best.get("rerank_weight") or 0.0], "rerank_n_best": best.get("rerank_n_best", 1),
                  "rerank_length_weights": [best.get("rerank_length_weight") or 0.0]}
        return tune_command(chain, members, rerank if "rerank_weight" in best else [], out, split, chosen)

    report = Path(f"{out}.json")
    return Stage(f"score {pair} {system.name} {split}", "tune", [report], [Path(f"{tuned}.json")], command,
                 report.is_file)


def system_paths(chain: Chain, system: DictConfig, pair: str) -> tuple[Path, list[Path], list[Path]]:
    """A system's report path (no extension), its member runs, and its reverse runs (none when not reranked)."""
    seeds = list(chain.recipe.seeds)[: system.get("members") or None]
    members = [chain.path(f"runs/{system.runs}_{pair}/seed{seed}") for seed in seeds]
    reverse = "-".join(reversed(pair.split("-")))
    rerank = [chain.path(f"runs/{system.rerank}_{reverse}/seed{s}") for s in chain.recipe.seeds if system.get("rerank")]
    return chain.path(f"runs/systems/{pair}/{system.name.replace(' ', '_')}"), members, rerank


def tune_command(chain: Chain, members: list[Path], rerank: list[Path], out: Path, split: str, grid: Any) -> list[str]:
    """scripts/tune_decoding.py's argv for ``members`` (reranked by ``rerank``, if any) over ``grid``."""
    command = [*chain.programs["tune"], str(members[0]), "--checkpoint", *map(str, members), "--test-split", split,
               "--out", str(out), "--beam-sizes", *map(str, grid["beam_sizes"]),
               "--length-penalties", *map(str, grid["length_penalties"])]
    if rerank:
        command += ["--rerank-checkpoint", *map(str, rerank), "--rerank-n-best", str(grid["rerank_n_best"]),
                    "--rerank-weights", *map(str, grid["rerank_weights"]),
                    "--rerank-length-weights", *map(str, grid["rerank_length_weights"])]
    return command


def report_stage(chain: Chain, runs: list[Path], split: str) -> Stage:
    """scripts/compare_runs.py over the chain's training runs on one test split, grouped as the recipe's ``report``
    says (``group_by``: e.g. attention, each group against ``baseline`` over the seeds, in each direction), with
    beam search timed on this machine (the stage runs after every training, alone)."""
    out = chain.path(f"runs/{chain.recipe_name}_{split}")
    command = [*chain.programs["compare"], *map(str, runs), "--split", split,
               "--group-by", str(chain.recipe.report.group_by), "--baseline", str(chain.recipe.report.baseline),
               "--time-decoding", "--out", str(out)]
    result = Path(f"{out}.json")
    return Stage(f"report {split}", "report", [result], list(runs), lambda: command, result.is_file)


def extra_test_splits(chain: Chain) -> list[str]:
    """The test splits of a ``data.test_splits=[...]`` override besides the recipe's ``test_split``."""
    overrides = OmegaConf.from_dotlist([a for a in chain.data_overrides if a.startswith("data.test_splits=")])
    splits = map(str, OmegaConf.select(overrides, "data.test_splits") or [])  # the last override counts
    return [s for s in splits if s != str(chain.recipe.test_split)]


def plan(chain: Chain) -> list[Stage]:
    """Every stage in order, each knowing the stages it waits for.

    Raises:
        ChainError: a stage that needs a path no stage makes and that does not exist.
    """
    from hydra import initialize_config_dir

    stages: list[Stage] = []
    with initialize_config_dir(config_dir=str(chain.configs), version_base="1.3"):  # once: each compose reuses it
        for training in chain.recipe.trainings:
            for pair in chain.recipe.pairs:
                stages += [s for s in training_stages(chain, training, pair) if s.name not in {t.name for t in stages}]
    if chain.recipe.get("run_order") == "seed_by_seed":
        stages = seed_by_seed(chain, stages)
    runs = [s.outputs[0] for s in stages if s.kind != "backtranslate"]
    stages += [tune_stage(chain, system, pair) for system in chain.recipe.systems for pair in chain.recipe.pairs]
    stages += [score_stage(chain, system, pair, split) for split in extra_test_splits(chain)
               for system in chain.recipe.systems for pair in chain.recipe.pairs]
    if chain.recipe.get("report"):  # a study's report, on every test split the trainings score
        splits = [str(chain.recipe.test_split), *extra_test_splits(chain)]
        stages += [report_stage(chain, runs, split) for split in splits]
    makers = {path: stage.name for stage in reversed(stages) for path in stage.outputs}  # the first stage making it
    for stage in stages:
        if missing := [need for need in stage.needs if need not in makers and not need.exists()]:
            raise ChainError(f"stage '{stage.name}' needs {missing[0]}, which no stage of recipe={chain.recipe_name} "
                             "makes and which does not exist; check the recipe's seeds and trainings")
        stage.after = list(dict.fromkeys(makers[n] for n in stage.needs if makers.get(n, stage.name) != stage.name))
    return stages


def seed_by_seed(chain: Chain, trainings: list[Stage]) -> list[Stage]:
    """Independent trainings reordered direction by direction, one seed of every training at a time: a study
    stopped part way already compares every type in its first direction, on one seed or more."""
    pairs, seeds = list(chain.recipe.pairs), list(chain.recipe.seeds)

    def position(stage: Stage) -> tuple[int, int]:
        run_dir = stage.outputs[0]  # runs/<runs>_<pair>/seed<N>
        return pairs.index(run_dir.parent.name.rsplit("_", 1)[1]), seeds.index(int(run_dir.name.removeprefix("seed")))

    return sorted(trainings, key=position)  # stable: within a seed the recipe's order of trainings


# ----------------------------------------------------------------------------------------------- Running
class Clock:
    """How long each kind of stage takes: this workdir's own times when it has any, else the recipe's guess."""

    def __init__(self, path: Path, guesses: dict[str, float]) -> None:
        self.path, self.guesses = path, guesses
        self.times: dict[str, list[float]] = json.loads(path.read_text()) if path.is_file() else {}

    def estimate(self, kind: str) -> float:
        seen = self.times.get(kind)
        return sum(seen) / len(seen) if seen else 60.0 * float(self.guesses.get(kind, 0))

    def record(self, kind: str, seconds: float) -> None:
        self.times.setdefault(kind, []).append(seconds)
        write_json_durably(self.path, self.times)


def run_stages(chain: Chain, stages: list[Stage], parallel: int, clock: Clock,
               budget: Budget | None = None) -> list[str]:
    """Start each stage once the stages it waits for are done, ``parallel`` at a time; skip done ones. With a
    ``budget``, start only a stage whose estimate ends inside it, and at its end stop the running ones with SIGTERM
    (train.py then saves checkpoints/last.pt; SIGKILL after ``STOP_GRACE_S``).

    Returns:
        The stages left for a later call when the budget ended the chain (none when it is complete).

    Raises:
        ChainError: a stage failed or stopped (after the others running have ended): rerun to resume.
        WriteStopped: the same, for a stage that ran out of disk space (exit 74).
    """
    finished = {s.name for s in stages if s.done()}
    for name in [s.name for s in stages if s.name in finished]:
        say(f"skip  {name}: complete")
    running: dict[str, tuple[Stage, subprocess.Popen, float]] = {}
    failed: list[str] = []
    held: set[str] = set()  # not started: their estimate would overrun the budget
    stopping: float | None = None  # when the budget's SIGTERM went out
    say(f"{len(stages)} stages, {len(finished)} complete, {parallel} at a time; "
        f"ETA {eta(stages, finished, running, clock, parallel)}" + (f"; {budget.label}" if budget else ""))
    while True:
        ready = [s for s in stages if s.name not in finished and s.name not in running
                 and all(a in finished for a in s.after)]
        while ready and len(running) < parallel and not failed and stopping is None:
            stage = ready.pop(0)
            if budget is not None and clock.estimate(stage.kind) > budget.left():
                held.add(stage.name)
                continue
            held.discard(stage.name)
            running[stage.name] = (stage, start(chain, stage), monotonic())
            left = eta(stages, finished, running, clock, parallel)
            say(f"start {stage.name} ({len(finished) + len(running)}/{len(stages)}): about "
                f"{format_duration(clock.estimate(stage.kind))}; chain ETA {left}")
        if not running:
            break
        time.sleep(0.05)  # stages take minutes; polling costs nothing
        if budget is not None and stopping is None and budget.left() <= 0:
            stopping = monotonic()
            for name, (_, process, _) in running.items():
                say(f"stop  {name}: {budget.label} is spent (SIGTERM: a training saves checkpoints/last.pt)")
                process.send_signal(signal.SIGTERM)
        if stopping is not None and monotonic() - stopping > STOP_GRACE_S:
            for _, process, _ in running.values():
                process.kill()  # it had its grace; its last checkpoint on disk is what resumes
        book_ended(chain, running, clock, finished, held, failed, stopped_by_budget=stopping is not None)
    if failed or (len(finished) < len(stages) and not held):
        reason = failed[0] if failed else "a stage's inputs never became complete"
        error = WriteStopped if "ran out of disk space" in reason else ChainError  # 74, not 2: free space, go on
        raise error(f"{reason}; run the same command again to resume (complete stages are skipped)")
    return [s.name for s in stages if s.name not in finished]


def book_ended(chain: Chain, running: dict[str, tuple[Stage, subprocess.Popen, float]], clock: Clock,
               finished: set[str], held: set[str], failed: list[str], stopped_by_budget: bool) -> None:
    """Take the stages whose process ended out of ``running``: into ``finished``, ``held`` (stopped by the budget:
    the next call resumes them) or ``failed`` (a line naming the stage, how it ended and its log)."""
    for name, (stage, process, began) in list(running.items()):
        if process.poll() is None:
            continue
        del running[name]
        seconds = monotonic() - began
        if process.returncode == 0 and stage.done():
            finished.add(name)
            clock.record(stage.kind, seconds)
            say(f"done  {name} in {format_duration(seconds)}")
        elif stopped_by_budget:
            held.add(name)
        else:
            how = f"failed (exit {process.returncode})" if process.returncode else "stopped before it finished"
            if process.returncode == EXIT_WRITE_STOPPED:
                how = f"ran out of disk space ({free_space(chain.workdir)}; exit {EXIT_WRITE_STOPPED})"
            failed.append(f"stage '{name}' {how}; its log: {log_path(chain, stage)}")


def start(chain: Chain, stage: Stage) -> subprocess.Popen:
    """The stage's command, in the workdir, its output appended to its log."""
    command = stage.command()
    log = log_path(chain, stage)
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "NMT_CHAIN_STAGE": stage.name}
    for arg in chain.data_overrides:
        if arg.startswith("data.mirror="):  # tune_decoding.py reads the run's data through the environment's mirror
            env["NMT_DATA_MIRROR"] = arg.split("=", 1)[1]
    with open(log, "a", encoding="utf-8") as handle:
        print(f"$ {' '.join(command)}", file=handle, flush=True)
        say(f"      {' '.join(command)}")
        return subprocess.Popen(command, cwd=chain.workdir, env=env, stdout=handle, stderr=subprocess.STDOUT)


def log_path(chain: Chain, stage: Stage) -> Path:
    return chain.workdir / "runs" / ".reproduce" / "logs" / (stage.name.replace(" ", "_") + ".log")


def schedule(stages: list[Stage], finished: set[str], running: dict[str, Any], clock: Clock, parallel: int,
             within: float | None = None) -> dict[str, float]:
    """When each stage left would end (seconds from now), scheduled as the runner would, by the estimates; with
    ``within``, only those that end inside it."""
    now = monotonic()
    ends = {stage.name: max(0.0, clock.estimate(stage.kind) - (now - began)) for stage, _, began in running.values()}
    slots = sorted([*ends.values(), *[0.0] * max(0, parallel - len(ends))])  # when each slot is free
    for stage in stages:
        if stage.name in finished or stage.name in ends or any(a not in finished and a not in ends
                                                                 for a in stage.after):
            continue
        end = max([slots[0], *(ends[name] for name in stage.after if name in ends)]) + clock.estimate(stage.kind)
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


def show_plan(stages: list[Stage]) -> None:
    """Each stage, complete or to run, with its command (or what it is built from, when that is not made yet)."""
    for stage in stages:
        try:
            command = " ".join(stage.command())
        except FileNotFoundError:  # a score stage reads the choice its tune stage has not made yet
            command = f"built from {', '.join(map(str, stage.needs))} once it exists"
        say(f"{'complete' if stage.done() else 'to run':8} {stage.name}: {command}")


def say(line: str) -> None:
    print(f"reproduce.py: {line}", flush=True)


# ----------------------------------------------------------------------------------------------- Results
def summary(chain: Chain, stages: list[Stage]) -> dict[str, Any]:
    """Each run's val and test BLEU and minutes (results.json), each system's choice on val and test score."""
    split = str(chain.recipe.test_split)
    runs, systems, reports = [], [], []
    for stage in stages:
        output = stage.outputs[0]
        if stage.kind == "report":
            reports.append(str(output.with_suffix(".md")))
        elif stage.name.startswith("tune "):
            report = json.loads(output.read_text(encoding="utf-8"))
            chosen = next(iter(report["test"].values()))
            systems.append({"system": stage.name.removeprefix("tune "), "choice": setting_label(report["best"]),
                            "val_bleu": report["best"]["bleu"], "test_bleu": chosen["bleu"], "report": str(output),
                            "more_tests": {}})
        elif stage.name.startswith("score "):
            system, extra_split = stage.name.removeprefix("score ").rsplit(" ", 1)
            chosen = next(iter(json.loads(output.read_text(encoding="utf-8"))["test"].values()))
            next(s for s in systems if s["system"] == system)["more_tests"][extra_split] = chosen["bleu"]
        elif (output / "results.json").is_file():
            results = json.loads((output / "results.json").read_text(encoding="utf-8"))
            runs.append({"run": stage.name, "dir": str(output), "val_bleu": results["valid"]["bleu"],
                         "test_bleu": (results["test"].get(split) or {}).get("bleu"),
                         "minutes": results.get("wall_seconds", 0) / 60})
    students = {}  # per pair, the student system val prefers (the recipe may train several)
    for pair in chain.recipe.pairs:
        if mine := [s for s in systems if s["system"].startswith(f"{pair} student")]:
            students[pair] = max(mine, key=lambda s: s["val_bleu"])["system"]
    return {"recipe": chain.recipe_name, "test_split": split, "runs": runs, "systems": systems,
            "student_chosen_on_val": students, "reports": reports, **provenance("reproduce.py")}


def render(report: dict[str, Any]) -> str:
    """The runs' table and the systems' (when the recipe has systems), in markdown."""
    split = report["test_split"]
    lines = [f"# recipe={report['recipe']}: {report['date']}", "", f"| run | val BLEU | {split} BLEU | minutes |",
             "| --- | ---: | ---: | ---: |"]
    lines += [f"| {r['run']} | {r['val_bleu']:.2f} | {fmt(r['test_bleu'])} | {r['minutes']:.1f} |"
              for r in report["runs"]]
    more = list(dict.fromkeys(k for s in report["systems"] for k in s["more_tests"]))
    if report["systems"]:
        lines += ["", f"| system | chosen on val | val BLEU | {' | '.join([split, *more])} BLEU (once) |",
                  "| --- | --- | ---: |" + " ---: |" * (1 + len(more))]
    lines += [f"| {s['system']} | {s['choice']} | {s['val_bleu']:.2f} | {s['test_bleu']:.2f} |"
              + "".join(f" {fmt(s['more_tests'].get(k))} |" for k in more) for s in report["systems"]]
    chosen = report["student_chosen_on_val"]
    lines += ["", *(f"Student chosen on val for {pair}: {name}." for pair, name in chosen.items())]
    lines += [f"The study's report: {path}" for path in report.get("reports", [])]
    return "\n".join([*lines, ""])


def fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def check_checkpoints(stages: list[Stage]) -> None:
    """A ChainError naming the stage and run where a stage left to run reads a finished run's checkpoints and they
    were not copied (the report reads results.json and translations/ only)."""
    for stage in stages:
        if stage.kind == "report" or stage.done():
            continue
        for need in stage.needs:
            if (need / "results.json").is_file():
                try:
                    resolve_checkpoint(need)
                except CheckpointError:
                    raise ChainError(f"stage '{stage.name}' reads the checkpoint of {need}, which holds results.json "
                                     "but no checkpoints/best.pt or last.pt: copy its checkpoints/ into the workdir, "
                                     "or delete its results.json to train it again") from None


def go_on_command(args: Sequence[str], workdir: Path) -> str:
    """The call that goes on after a budget's stop: the same settings in the same workdir (made absolute), without
    ``deadline=`` (past by then: give a new budget= or deadline=)."""
    kept = [a for a in args if not a.startswith(("workdir=", "deadline="))]
    return shlex.join(["python", "reproduce.py", *kept, f"workdir={workdir}"])


def main(args: Sequence[str], repo: Path) -> dict[str, Any] | None:
    """Plan the chain of ``args``' recipe, run what is not complete (what fits in the budget, if any), write the
    summary; returns it (None for ``--help``, a dry run, or a stop at the budget).

    Args:
        args: ``key=value`` settings (``recipe``, ``workdir``, ``parallel``, ``mps``, ``budget``, ``deadline``,
            ``dry_run``, ``device``) and ``data.*`` overrides; or ``--help``/``-h``.
        repo: the folder of the commands it drives (train.py, backtranslate.py, scripts/tune_decoding.py)
            and of configs/.

    Raises:
        ChainError: a bad setting or recipe, a budget too short for any stage (both before any work), or a stage
            that failed (rerun to resume).
        CardError: a parallel= the card's memory does not hold, or MPS where it cannot serve (before any work).
        PathNotWritable: a workdir that cannot be made.
    """
    began = monotonic()  # the budget counts from here
    recipes = repo / "configs" / "recipe"
    if "--help" in args or "-h" in args:
        print(usage(recipes), flush=True)
        return None
    settings, data, recipe = parse_arguments(args, recipes)
    budget = time_budget(settings, began)
    scripts = {"train": "train.py", "backtranslate": "backtranslate.py", "tune": "scripts/tune_decoding.py",
               "compare": "scripts/compare_runs.py"}
    programs = {kind: [sys.executable, str(repo / script)] for kind, script in scripts.items()}
    workdir = Path(str(settings["workdir"])).expanduser().resolve()
    check_writable(workdir, "workdir", folder=True)  # before the plan, not in the first stage's traceback
    chain = Chain(workdir, programs, recipe, str(settings["recipe"]), data, repo / "configs")
    stages = plan(chain)
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = auto if settings["device"] == "auto" else settings["device"]  # whose eta_minutes and parallel=auto
    card = cuda_card() if device == "cuda" else None
    parallel, chosen = choose_parallel(settings["parallel"], str(device), card)
    use_mps, mps_reason = choose_mps(settings["mps"], str(device), parallel, card)
    mps_reason = f"; {mps_reason}" if mps_reason else ""
    clock = Clock(workdir / "runs" / ".reproduce" / "times.json", dict(recipe.eta_minutes[str(device)]))
    check_budget(budget, stages, clock)
    check_checkpoints(stages)
    if settings["dry_run"]:
        show_plan(stages)
        done = {s.name for s in stages if s.done()}
        say(f"ETA {eta(stages, done, {}, clock, parallel)} ({device}, parallel={parallel}, {chosen}{mps_reason}); "
            f"{eta_sources(stages, clock, recipe, str(device))}")
        if budget is not None:
            fits = len(schedule(stages, done, {}, clock, parallel, within=budget.left()))
            say(f"{budget.label}: {fits} of the {len(stages) - len(done)} stages left would run in it")
        return None
    return run_chain(chain, stages, parallel, clock, budget, f"parallel={parallel} ({chosen}){mps_reason}", use_mps,
                     go_on_command(args, workdir))


def run_chain(chain: Chain, stages: list[Stage], parallel: int, clock: Clock, budget: Budget | None, how: str,
              use_mps: bool, go_on: str) -> dict[str, Any] | None:
    """Run the stages (``how`` says how many at once and why), then write the summary and return it; at a budget's
    end, say what is left and the command ``go_on`` that goes on, and return None."""
    say(how)
    with card_sharing(use_mps, chain.workdir):
        left = run_stages(chain, stages, parallel, clock, budget)
    if left:
        rest = eta(stages, {s.name for s in stages if s.name not in left}, {}, clock, parallel)
        say(f"stopped at {budget.label if budget else 'the budget'}: {len(stages) - len(left)} of {len(stages)} "
            f"stages complete, {len(left)} left (about {rest} at parallel={parallel}); a stopped training resumes "
            "from its checkpoints/last.pt")
        say(f"go on with: {go_on}  (elsewhere: copy the workdir there first)")
        return None
    report = summary(chain, stages)
    out = chain.workdir / "runs" / f"reproduce_{chain.recipe_name}"
    write_json_durably(f"{out}.json", report)
    write_text_durably(f"{out}.md", render(report))
    say(f"wrote {out}.json and {out}.md")
    print(render(report), flush=True)
    return report
