"""A chain's workdir as a call finds it: whose study it holds (the recipe and the settings that define its runs,
recorded by the first call), whether its kept runs are whole, the stages an earlier call left running, and the
lock that keeps two calls out of one workdir."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from nmt.chain.plan import Chain, Stage, synthetic_complete
from nmt.chain.settings import ChainError
from nmt.common.files import folder_lock, write_json_durably

PLACES = ("data.mirror", "data.cache_dir")  # where the data is read from, not what it is: a study may move
NOT_DEFINING = ("eta_minutes", "eta_measured", "cpu_recipe")  # a recipe's estimates and hints, not its runs


def state_dir(workdir: Path) -> Path:
    return workdir / "runs" / ".reproduce"


def log_path(workdir: Path, stage: str) -> Path:
    return state_dir(workdir) / "logs" / (stage.replace(" ", "_") + ".log")


@contextmanager
def workdir_lock(workdir: Path) -> Iterator[None]:
    """One call at a time in a workdir (FolderInUse names the other); the lock of a call that died is taken over."""
    with folder_lock(state_dir(workdir), f"reproduce.py (pid {os.getpid()})",
                     "wait for it to end (Ctrl-C stops it and prints the command that goes on), or give another "
                     "workdir="):
        yield


def defining_settings(chain: Chain) -> dict[str, Any]:
    """What defines a workdir's runs: the recipe's name and settings (its estimates and hints left out) and the data
    overrides (the places data is read from left out)."""
    recipe = OmegaConf.to_container(chain.recipe, resolve=True)
    data = dict(arg.split("=", 1) for arg in chain.data_overrides if arg.split("=", 1)[0] not in PLACES)
    return {"recipe": chain.recipe_name, "settings": {k: v for k, v in recipe.items() if k not in NOT_DEFINING},
            "data": data}


def first_difference(recorded: Any, given: Any, key: str = "") -> tuple[str, Any, Any] | None:
    """The first key (dotted) whose value differs between two JSON-like values, with both values; None if none."""
    if isinstance(recorded, dict) and isinstance(given, dict):
        for name in dict.fromkeys([*recorded, *given]):
            found = first_difference(recorded.get(name), given.get(name), f"{key}.{name}" if key else name)
            if found:
                return found
        return None
    return None if recorded == given else (key, recorded, given)


def check_same_study(chain: Chain, record: bool) -> None:
    """A ChainError naming the first difference when the workdir's recorded recipe or settings are not this
    call's; with ``record``, the first call's are written (``runs/.reproduce/chain.json``; a workdir made before
    the record existed gets it now)."""
    path = state_dir(chain.workdir) / "chain.json"
    mine = defining_settings(chain)
    if not path.is_file():
        if record:
            write_json_durably(path, mine)
        return
    found = first_difference(json.loads(path.read_text(encoding="utf-8")), mine)
    if found is None:
        return
    key, recorded, given = found
    if key == "recipe":
        what = f"recipe={recorded}'s runs, not recipe={given}'s"
    elif key.startswith("data."):
        what = f"runs made with {key[5:]}={recorded if recorded is not None else '(not given)'}, not {given}"
    else:
        what = f"runs made with the recipe's {key.removeprefix('settings.')}={recorded}, not {given}"
    raise ChainError(f"workdir {chain.workdir} holds {what} (recorded in {path}): give another workdir=, or the "
                     "settings it was made with; one report never mixes two studies' runs")


def check_kept_runs(stages: list[Stage]) -> None:
    """A ChainError naming the file where a kept run (its results.json written) is not whole: results.json that is
    not JSON, or a test split's translations missing or shorter than the split (a report is never built on part of a
    run)."""
    for stage in stages:
        run = stage.outputs[0] if stage.outputs else None
        if run is None or not (run / "results.json").is_file():
            continue
        if problem := partial_run(run):
            raise ChainError(f"stage '{stage.name}': {problem}; copy the whole run into the workdir, or delete its "
                             "results.json to train it again")


def partial_run(run: Path) -> str | None:
    """What is missing from a kept run, in words naming the file; None when it is whole."""
    path = run / "results.json"
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return f"{path} is not whole (not JSON)"
    for split, scores in (results.get("test") or {}).items():
        found = sorted((run / "translations").glob(f"{split}.{results.get('tgt_lang') or '*'}"))
        if not found:
            return f"{run / 'translations' / split}.{results.get('tgt_lang') or '<language>'} is missing"
        expected = test_sentences(scores)
        lines = found[0].read_bytes().count(b"\n")
        if expected is not None and lines != expected:
            return f"{found[0]} holds {lines} of the split's {expected} lines"
    return None


def test_sentences(scores: dict[str, Any]) -> int | None:
    """A test split's size as results.json records it: its sentences per second times the decoding's seconds."""
    if scores.get("sentences") is not None:
        return int(scores["sentences"])
    if scores.get("sentences_per_s") is None or scores.get("decode_seconds") is None:
        return None
    return round(scores["sentences_per_s"] * max(scores["decode_seconds"], 1e-9))


def runs_to_retrain(stages: list[Stage], workdir: Path) -> dict[str, str]:
    """Finished stages whose outputs a stage left to run reads, and which no longer hold them: trainings without
    their checkpoints, and back-translations without their synthetic pairs (a kept workdir on a new machine keeps
    results.json, config.yaml, translations/ and provenance.json only). Each one's stage name, with the reason in
    words. Such a stage is planned again (``done`` answers False), and so, in turn, are the trainings whose
    checkpoints its own inputs need.

    Raises:
        ChainError: such a run that no stage of the chain makes (it was copied in): naming it and the fix.
    """
    makers = {stage.outputs[0]: stage for stage in stages if stage.outputs and stage.kind not in ("tune", "report")}
    retrain: dict[str, str] = {}
    while True:
        found = {}
        for stage in [s for s in stages if s.kind != "report" and not s.done()]:
            for need, what in lost_outputs(stage, makers):
                if makers[need].name not in retrain:
                    found.setdefault(makers[need].name, (need, stage.name, what))
        if not found:
            return retrain
        for name, (output, reader, what) in found.items():
            stage = makers[output]
            stage.done = (partial(synthetic_complete, output, True) if stage.kind == "backtranslate"
                          else partial(_with_checkpoint, output, stage.done))  # complete again once made again
            retrain[name] = f"{os.path.relpath(output, workdir)} keeps {what}, and stage '{reader}' reads them"


def lost_outputs(stage: Stage, makers: dict[Path, Stage]) -> Iterator[tuple[Path, str]]:
    """The finished outputs ``stage`` reads that lost what it reads: each path, and what it keeps, in words."""
    from nmt.model.checkpoint import CheckpointError, resolve_checkpoint  # brings PyTorch: not for a mistake

    for need in stage.needs:
        if (need / "results.json").is_file():
            try:
                resolve_checkpoint(need)
            except CheckpointError:
                if need not in makers:
                    raise ChainError(f"stage '{stage.name}' reads the checkpoint of {need}, which holds "
                                     "results.json but no checkpoints/best.pt or last.pt: copy its checkpoints/ "
                                     "into the workdir, or delete its results.json to train it again") from None
                yield need, "results.json but no checkpoints"
        elif (maker := makers.get(need)) and maker.kind == "backtranslate" and maker.done() and \
                not synthetic_complete(need, with_pairs=True):
            yield need, "provenance.json but not its synthetic pairs"


def _with_checkpoint(run: Path, done: Callable[[], bool]) -> bool:
    """A training whose checkpoints a later stage reads is complete when it also holds them."""
    from nmt.model.checkpoint import CheckpointError, resolve_checkpoint

    try:
        return done() and resolve_checkpoint(run) is not None
    except CheckpointError:
        return False


def set_aside(run: Path, workdir: Path) -> Path:
    """A finished run's kept files moved to ``runs/.reproduce/replaced/`` (nothing written before is lost), so
    that its training starts again in an empty folder; the folder they went to."""
    target = state_dir(workdir) / "replaced" / os.path.relpath(run, workdir / "runs")
    while target.exists():
        target = target.with_name(target.name + "_")
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(run, target)
    return target


def note_running(workdir: Path, running: dict[str, Any]) -> None:
    """``runs/.reproduce/running.json``: each running stage's pid (a SLURM job: its id) and command, for a call after
    a SIGKILL."""
    write_json_durably(state_dir(workdir) / "running.json", {
        name: {"pid": process.pid, "command": process.args, "job": job_kind(process)}
        for name, (_, process, _) in running.items()})


def job_kind(process: Any) -> str | None:
    """A launcher's job: ``slurm`` or ``local`` (submitit's controller); None for the local runner's process."""
    slurm = getattr(process, "slurm", None)
    return None if slurm is None else "slurm" if slurm else "local"


def stop_left_running(workdir: Path, grace: float, say: Any) -> None:
    """Stages an earlier call left running (it was SIGKILLed: they got SIGTERM as it died; its SLURM jobs run on)
    are given ``grace`` seconds to save and exit, then killed, so that this call can take their run folders over."""
    path = state_dir(workdir) / "running.json"
    left = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    for name, entry in left.items():
        if entry.get("job") == "slurm":
            stop_left_job(name, str(entry["pid"]), grace, say)
            continue
        if entry.get("job") == "local":  # submitit's controller, which passes SIGTERM on to the stage's command
            entry["command"] = process_command(entry["pid"])
            if "submitit" not in " ".join(entry["command"]):
                continue
        if not same_process(entry["pid"], entry["command"]):
            continue
        say(f"wait  {name}: left running by an earlier call (pid {entry['pid']}); SIGTERM, then it saves and exits")
        os.kill(entry["pid"], signal.SIGTERM)
        ends = time.monotonic() + grace
        while same_process(entry["pid"], entry["command"]) and time.monotonic() < ends:
            time.sleep(0.1)
        if same_process(entry["pid"], entry["command"]):  # a stage's own group; a controller shares the dead call's
            os.kill(entry["pid"], signal.SIGKILL) if entry.get("job") else os.killpg(entry["pid"], signal.SIGKILL)
    path.unlink(missing_ok=True)


def stop_left_job(name: str, job: str, grace: float, say: Any) -> None:
    """A SLURM job an earlier call left: SIGTERM to its command, ``grace`` seconds to save, then scancel."""
    def queued() -> bool:
        answer = subprocess.run(["squeue", "--noheader", "--jobs", job, "--format=%T"], capture_output=True, text=True)
        return answer.returncode == 0 and bool(answer.stdout.strip())

    if shutil.which("squeue") is None or not queued():
        return
    say(f"wait  {name}: SLURM job {job} left by an earlier call; SIGTERM, then it saves and exits")
    subprocess.run(["scancel", "--full", "--signal=TERM", job], capture_output=True)
    ends = time.monotonic() + grace
    while queued() and time.monotonic() < ends:
        time.sleep(1.0)
    subprocess.run(["scancel", job], capture_output=True)


def same_process(pid: int, command: list[str]) -> bool:
    """Whether ``pid`` is alive and still runs ``command`` (not a later process given the same pid)."""
    return process_command(pid) == [str(c) for c in command]


def process_command(pid: int) -> list[str]:
    """The command line ``pid`` runs; [] when there is no such process."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    except OSError:
        return []
    return [part.decode(errors="replace") for part in cmdline]
