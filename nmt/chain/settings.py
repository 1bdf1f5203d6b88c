"""The chain's command line: its settings with their defaults and help, and the recipe they name."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from nmt.chain.card import MEASURED_PARALLEL, PARALLEL_ON_CUDA
from nmt.common.settings import unknown_key_message

DEFAULTS = {"recipe": "bt_best", "workdir": ".", "parallel": "auto", "mps": "auto", "budget": None,
            "deadline": None, "dry_run": False, "device": "auto", "launcher": "local"}
BUDGET_FORMS = "seconds (600), or hours, minutes and seconds (90s, 45m, 1h30m, 1h30m15s)"
DEADLINE_FORMS = "HH:MM or HH:MM:SS (the next time the clock reads it) or an ISO date and time (2026-11-28T14:30)"
AS_WRITTEN = ("budget", "deadline")  # read as text: OmegaConf would turn deadline=14:30 into 870 (YAML's base 60)


class ChainError(ValueError):
    """A chain that cannot run as asked: a bad setting, recipe or workdir, or a stage that failed (one line)."""


def parse_arguments(args: Sequence[str], recipes: Path) -> tuple[dict[str, Any], list[str], DictConfig]:
    """``key=value`` arguments: the chain's settings (``launcher.*`` keys as a list under ``launcher_keys``), the
    ``data.*`` overrides (passed to every stage that reads data), and the recipe (``configs/recipe/<recipe>.yaml``,
    ``defaults: [parent]`` merged first).

    Raises:
        ChainError: an unknown key (naming the nearest), a malformed argument, or an unknown recipe.
    """
    settings, data = {**DEFAULTS, "launcher_keys": []}, []
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep:
            raise ChainError(f"{arg!r} is not key=value (python reproduce.py --help lists them); "
                             "e.g. recipe=bt_best parallel=2 data.mirror=/corpora")
        if key.startswith("data."):
            data.append(arg)
        elif key.startswith("launcher."):
            settings["launcher_keys"].append(arg)
        elif key in AS_WRITTEN:
            settings[key] = value
        elif key in DEFAULTS:
            settings[key] = OmegaConf.from_dotlist([arg])[key]
        else:
            raise ChainError(unknown_key_message("", key, [*DEFAULTS, "data.<key> (train.py's data overrides)",
                                                           "launcher.<key> (the launcher's resources)"]))
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
    "launcher": ("NAME", "local (this machine), submitit_slurm (each wave of stages as one SLURM job array; needs "
                         "the [cluster] extra and a workdir the nodes share) or submitit_local (the same jobs here)"),
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
              "  launcher.KEY=VALUE    a submitit launcher's job resources, as Hydra's hydra.launcher.KEY: partition, "
              "gpus_per_node,", " " * 24 + "cpus_per_task, mem_gb, timeout_min, max_num_timeout, additional_parameters",
              "", "examples:", "  python reproduce.py recipe=attention_study dry_run=true",
              "  python reproduce.py recipe=attention_study workdir=study budget=8m   # then the same again to go on",
              "  python reproduce.py recipe=attention_study workdir=/shared/study launcher=submitit_slurm "
              "launcher.partition=gpu launcher.gpus_per_node=1"]
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
