"""The chain's plan: a recipe's stages (trainings, back-translations, decoding tuning, scores, the study's
report), each with its command, the paths it makes and reads, and the stages it waits for."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, partial
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from nmt.chain.clock import training_fraction
from nmt.chain.settings import ChainError


@dataclass
class Stage:
    """One step of the chain.

    Attributes:
        name: what it is, for the log (``bt de-en seed1``).
        kind: its ``eta_minutes`` key (a training's name, ``backtranslate`` or ``tune``).
        outputs: the paths it makes; ``needs``: the paths it reads (other stages' outputs, or existing).
        command: its argv, built when it starts (a run with a checkpoint resumes instead of starting over).
        done: whether its outputs are complete.
        progress: the part of it done, from its files, once stopped part way (None: it cannot tell).
    """

    name: str
    kind: str
    outputs: list[Path]
    needs: list[Path]
    command: Callable[[], list[str]]
    done: Callable[[], bool]
    after: list[str] = field(default_factory=list)
    progress: Callable[[], float | None] = lambda: None


@dataclass
class Chain:
    """What every stage shares: where it runs, the programs, the recipe, the data overrides, the launcher."""

    workdir: Path
    programs: dict[str, list[str]]
    recipe: DictConfig
    recipe_name: str
    data_overrides: list[str]
    configs: Path
    launcher_name: str = "local"
    launcher: DictConfig | None = None  # a submitit launcher's settings (nmt.chain.launch); None: the local runner

    def path(self, value: str | Path) -> Path:
        return (self.workdir / str(value)).resolve()

    def relative(self, path: Path) -> str:
        """``path`` as seen from the workdir: what the report and the summary record, so no machine's folders."""
        return os.path.relpath(path, start=self.path("."))


def train_overrides(chain: Chain, experiment: str, pair: str, *more: str) -> list[str]:
    """train.py's overrides for ``experiment`` (``more`` right after it) in ``pair``, then the chain's own."""
    src, tgt = pair.split("-")
    return [f"experiment={experiment}", *more, f"data.src_lang={src}", f"data.tgt_lang={tgt}", *chain.data_overrides,
            *chain.recipe.train_overrides]


def compose_training(chain: Chain, experiment: str, pair: str, *more: str) -> DictConfig:
    """train.py's config for ``experiment`` in ``pair`` with ``more`` and the chain's overrides (checked by Hydra as
    it composes; call it inside ``plan``'s ``initialize_config_dir``), read-only."""
    return _composed(str(chain.configs), tuple(train_overrides(chain, experiment, pair, *more)))


@cache
def _composed(configs: str, overrides: tuple[str, ...]) -> DictConfig:
    """Once per process (about 0.2 s each), for a caller that plans again; ``configs``: the initialized folder."""
    from hydra import compose
    from hydra.errors import HydraException

    try:
        cfg = compose("train", overrides=list(overrides))
    except HydraException as error:
        raise ChainError(f"train.py {' '.join(overrides)}: {str(error).splitlines()[0]}") from None
    OmegaConf.set_readonly(cfg, True)
    return cfg


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
                            (run_dir / "results.json").is_file, progress=partial(training_fraction, run_dir)))
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
                 lambda: command, lambda: synthetic_complete(folder))


def synthetic_complete(folder: Path, with_pairs: bool = False) -> bool:
    """Whether backtranslate.py finished ``folder``; by default whether or not its pairs are kept, which only a stage
    left to run needs (``workdir.runs_to_retrain``). nmt.data brings PyTorch: imported only for such a stage."""
    from nmt.data.synthetic import is_complete

    return is_complete(folder, with_pairs)


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
    says (``group_by``: e.g. attention, each group against ``baseline`` over the seeds, in each direction). Its
    speed columns come from ``runs/<recipe>_speed*.json`` when the workdir holds them (``benchmark.py study-speed``,
    timed back to back on an idle machine, e.g. one per direction); without them they read 'not measured'. Its
    paths are from the workdir, where it runs."""
    out = chain.path(f"runs/{chain.recipe_name}_{split}")
    command = [*chain.programs["compare"], *map(chain.relative, runs), "--split", split,
               "--group-by", str(chain.recipe.report.group_by), "--baseline", str(chain.recipe.report.baseline),
               "--time-decoding", "--out", chain.relative(out)]
    result = Path(f"{out}.json")
    return Stage(f"report {split}", "report", [result], list(runs),
                 lambda: command + speed_option(chain), result.is_file)


def speed_option(chain: Chain) -> list[str]:
    """``--speed`` with the workdir's study-speed reports, found when the report stage starts; none: no option."""
    reports = sorted(chain.path("runs").glob(f"{chain.recipe_name}_speed*.json"))
    return ["--speed", *map(chain.relative, reports)] if reports else []


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
