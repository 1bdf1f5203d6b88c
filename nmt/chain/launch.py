"""The chain's stages sent to a cluster through submitit (``launcher=submitit_slurm``; ``submitit_local`` runs the
same jobs on this machine): the stages that can start together go as one job array, with the resources of Hydra's
submitit launcher config (``launcher.partition=gpu launcher.gpus_per_node=1 ...``). A job runs its stage's command
as the local runner does, into the stage's log; the scheduler polls, stops and kills jobs as it does processes."""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from nmt.chain.runner import STOP_GRACE_S, start, stop
from nmt.chain.settings import ChainError
from nmt.common.settings import bad_value_message, unknown_key_message

LAUNCHERS = ("local", "submitit_local", "submitit_slurm")
# squeue's states of a job that is still to run or running (a preempted or requeued job comes back as PENDING);
# any other state, or a job squeue no longer knows, has ended.
ALIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
         "RESIZING", "SIGNALING", "STAGE_OUT", "PREEMPTED"}
LOOK_EVERY_S = 5.0  # how often squeue is asked about a job with no result yet (the result file is looked at always)


def launcher_config(name: str, keys: list[str], jobs_folder: Path) -> DictConfig | None:
    """``launcher=NAME``'s settings: Hydra's submitit launcher config with ``keys`` (``launcher.KEY=VALUE``) over it;
    None for the local runner.

    Raises:
        ChainError: an unknown launcher or key (naming the nearest), a bad value, a plugin that is not installed,
            or SLURM without ``sbatch`` or a controller that answers (all before any work).
    """
    if name not in LAUNCHERS:
        raise ChainError(f"launcher={name} is not one of {', '.join(LAUNCHERS)} (joblib runs Python functions; the "
                         "local runner already runs the chain's commands parallel=N at once on this machine)")
    if name == "local":
        if keys:
            raise ChainError(f"{keys[0]} needs launcher=submitit_slurm or launcher=submitit_local (the local runner "
                             "takes parallel=N)")
        return None
    try:
        from hydra_plugins.hydra_submitit_launcher import config as plugin
    except ImportError:
        raise ChainError(f"launcher={name} needs the package hydra-submitit-launcher, which is not installed: "
                         "pip install -e '.[cluster]' (the [cluster] extra brings it)") from None
    schema = OmegaConf.structured(plugin.SlurmQueueConf if name == "submitit_slurm" else plugin.LocalQueueConf)
    with open_dict(schema):  # in place of Hydra's sweep paths and job name: the workdir's and the chain's
        schema.submitit_folder, schema.name = str(jobs_folder / "%j"), "nmt-chain"
        del schema["_target_"]
    given = OmegaConf.from_dotlist([key.removeprefix("launcher.") for key in keys])
    try:
        config = OmegaConf.merge(schema, given)
    except OmegaConfBaseException as error:
        key = str(getattr(error, "full_key", "") or "")
        if type(error).__name__ == "ConfigKeyError":
            raise ChainError(unknown_key_message("launcher.", key.split(".")[0], schema.keys())) from None
        raise ChainError(bad_value_message("launcher.", error, key)) from None
    if name == "submitit_slurm":
        check_slurm_answers()
    return config


def check_slurm_answers() -> None:
    """A ChainError unless ``sbatch`` is on the PATH and the controller answers ``sinfo``."""
    if shutil.which("sbatch") is None:
        raise ChainError("launcher=submitit_slurm needs SLURM's sbatch, which is not on the PATH: run the chain on a "
                         "login node of the cluster, or use launcher=local")
    try:
        answer = subprocess.run(["sinfo", "--noheader", "--summarize"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ChainError(f"launcher=submitit_slurm: sinfo did not answer ({error}); is slurmctld up?") from None
    if answer.returncode != 0:
        why = (answer.stderr.strip().splitlines() or ["no message"])[-1]
        raise ChainError(f"launcher=submitit_slurm: SLURM's controller does not answer (sinfo: {why}); start "
                         "slurmctld or check SLURM_CONF")


class StageJob:
    """What a job runs: its stage's command, built when the job starts (so that a training stopped before, or a
    requeued job, resumes from its last.pt), in the workdir, its output appended to the stage's log; it returns
    the command's exit status. A SIGTERM or SIGINT to the job reaches the command, which saves and stops."""

    def __init__(self, build: Callable[[], list[str]], workdir: Path, log: Path, env: dict[str, str]) -> None:
        self.build, self.workdir, self.log, self.env = build, workdir, log, env
        self.process: subprocess.Popen | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "process": None}  # a process is this job's own, never pickled

    def __call__(self) -> int:
        self.process = start(self.build(), self.log, self.workdir, {**os.environ, **self.env})
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda number, _frame: self.process.send_signal(number))
        return self.process.wait()

    def checkpoint(self, *_args: Any) -> Any:
        """submitit's call on preemption or before the time limit (SIGUSR2): the command saves and stops, and the
        same job goes back in the queue, to resume from that save."""
        from submitit.helpers import DelayedSubmission

        if self.process is not None:
            stop([self.process], STOP_GRACE_S)
        return DelayedSubmission(StageJob(self.build, self.workdir, self.log, self.env))


class SubmittedStage:
    """A stage's job as the scheduler sees a process: ``poll()``, ``returncode``, ``pid`` (the job id), ``args``,
    ``send_signal``, ``kill``; ``describe()`` names it in a line about its stage."""

    def __init__(self, job: Any, args: list[str], slurm: bool) -> None:
        self.job, self.args, self.slurm = job, args, slurm
        self.pid = job.job_id if slurm else int(job.job_id)  # a local job's id is its controller's pid
        self.returncode, self.no_status = None, False
        self._next_look = 0.0

    def poll(self) -> int | None:
        if self.returncode is None and self._ended():
            try:
                self.returncode = int(self.job.result())
            except Exception:  # noqa: BLE001 - submitit's own errors: the job ended without running to its end
                self.returncode, self.no_status = 128 + signal.SIGTERM, True
        return self.returncode

    def describe(self) -> str:
        """The job for a line that says how its stage ended: its id and, on SLURM, its last state."""
        state = f", {self._state() or 'gone from the queue'}" if self.slurm else ""
        return f"job {self.pid}{state}" + ("; it left no exit status" if self.no_status else "")

    def _ended(self) -> bool:
        if self.job.paths.result_pickle.exists():
            return True
        if not self.slurm:
            return self.job.done()
        if time.monotonic() < self._next_look:
            return False
        self._next_look = time.monotonic() + LOOK_EVERY_S
        return self._state() not in ALIVE

    def _state(self) -> str:
        """The job's state as squeue reports it; '' once squeue no longer knows it."""
        answer = subprocess.run(["squeue", "--noheader", "--jobs", str(self.pid), "--states=all", "--format=%T"],
                                capture_output=True, text=True)
        return answer.stdout.strip().split("\n")[0].split(" ")[0] if answer.returncode == 0 else ""

    def send_signal(self, signum: int) -> None:
        """``signum`` to the job's command (SIGTERM: a training saves checkpoints/last.pt and stops)."""
        if self.slurm:
            subprocess.run(["scancel", "--full", f"--signal={signal.Signals(signum).name}", str(self.pid)],
                           capture_output=True)
        elif self.job._process is not None:  # submitit_local's controller, which passes it on to the job
            self.job._process.send_signal(signum)

    def kill(self) -> None:
        """The job ends now, whatever it runs (its last saved checkpoint is what resumes)."""
        if self.slurm:
            subprocess.run(["scancel", str(self.pid)], capture_output=True)
        elif self.job._process is not None:
            self.job._process.kill()


def submit_wave(config: DictConfig, name: str, jobs: list[tuple[StageJob, list[str]]],
                seconds_left: float | None) -> list[SubmittedStage]:
    """``jobs`` (a StageJob and the command it will run) as one job array with ``config``'s resources; with a
    budget, no job's time limit outlasts ``seconds_left`` (plus the grace to save)."""
    import submitit

    settings = OmegaConf.to_container(config, resolve=True)
    cluster = "slurm" if name == "submitit_slurm" else "local"
    executor = submitit.AutoExecutor(folder=settings.pop("submitit_folder"), cluster=cluster,
                                     **({"slurm_max_num_timeout": settings.pop("max_num_timeout")}
                                        if cluster == "slurm" else {}))
    if seconds_left is not None:
        settings["timeout_min"] = min(settings["timeout_min"], math.ceil((seconds_left + STOP_GRACE_S) / 60))
    shared = {"timeout_min", "cpus_per_task", "gpus_per_node", "tasks_per_node", "mem_gb", "nodes", "name",
              "stderr_to_stdout"}  # submitit's own names; the rest are the cluster's (slurm_partition, ...)
    executor.update_parameters(**{key if key in shared else f"{cluster}_{key}": value
                                  for key, value in settings.items()})
    with executor.batch():
        submitted = [executor.submit(job) for job, _ in jobs]
    return [SubmittedStage(job, args, cluster == "slurm") for job, (_, args) in zip(submitted, jobs)]
