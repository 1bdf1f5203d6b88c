"""``reproduce.py launcher=...``: the chain's waves of stages sent through submitit as job arrays. Through
``submitit_local`` (the same jobs as on SLURM, each a local process) and on a real one-node SLURM cluster; all but
the cheap ones are in the ``cluster`` tier (``pytest -m cluster``). The stages are the stand-ins of
tests/test_reproduce.py, so only the launching is tested."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from nmt.chain import command, schedule
from nmt.chain.settings import ChainError
from tests.test_chain_stops import alive, hang_and_note_pids, start_chain, wait_for
from tests.test_reproduce import REPO_ROOT, FakeClock, calls, fake_clock, fake_repo  # noqa: F401  # fixtures

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the [cluster] extra brings submitit")


def tiny(workdir: Path, *more: str) -> list[str]:
    workdir.mkdir(exist_ok=True)
    return ["recipe=tiny", "device=cpu", *more, f"workdir={workdir}"]


def waves_recorded(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The stage names of each job array the chain submits, in order."""
    waves: list[list[str]] = []
    submit = schedule.submit_wave

    def recording(config, name, jobs, seconds_left):  # noqa: ANN001, ANN202
        waves.append([job.env["NMT_CHAIN_STAGE"] for job, _ in jobs])
        return submit(config, name, jobs, seconds_left)

    monkeypatch.setattr(schedule, "submit_wave", recording)
    return waves


@pytest.mark.cluster
@pytest.mark.slow
def test_submitit_jobs_reach_the_same_report_as_the_local_runner_one_wave_at_a_time(
        fake_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    local = command.main(tiny(tmp_path / "local"), fake_repo)
    waves = waves_recorded(monkeypatch)
    args, workdir = tiny(tmp_path / "jobs", "launcher=submitit_local"), tmp_path / "jobs"
    # a job that fails: its stage and log named, nothing that waits for it started, the next call retries it
    monkeypatch.setenv("FAKE_KILL", "base en-de seed42")
    with pytest.raises(ChainError, match="stage 'base en-de seed42' failed \\(exit -9; job \\d+\\); its log: .*"
                                         "base_en-de_seed42.log; run the same command again to resume"):
        command.main(args, fake_repo)
    assert waves == [["base de-en seed42", "base en-de seed42"]]  # the first wave: what waits for nothing
    assert not any(stage.startswith("bt") for stage, _ in calls(workdir))
    monkeypatch.delenv("FAKE_KILL")
    launched = command.main(args, fake_repo)
    assert {**launched, "date": ""} == {**local, "date": ""}  # its paths are from the workdir: the same in both
    run = workdir / "runs" / "best_en-de" / "seed42"
    assert calls(workdir)[2] == ("base en-de seed42", [f"trainer.resume={run}"])  # from its last.pt
    same = sorted(str(call).replace(str(workdir), "W") for call in calls(workdir) if call[0] != "base en-de seed42")
    assert same == sorted(str(call).replace(str(tmp_path / "local"), "W") for call in calls(tmp_path / "local")
                          if call[0] != "base en-de seed42")  # the same commands, apart from the resumed one
    stages = [stage for wave in waves[1:] for stage in wave]  # every stage left once, far fewer arrays than stages
    assert sorted(stages) == sorted(stage for stage, _ in calls(workdir)[2:]) and len(waves) < len(stages) / 2
    log = workdir / "runs" / ".reproduce" / "logs" / "base_de-en_seed42.log"
    assert log.read_text().startswith("$ ")  # the job's command wrote where the local runner's does
    again = command.main(args, fake_repo)  # all skipped, nothing submitted
    assert {**again, "date": ""} == {**local, "date": ""} and len(waves) == len([w for w in waves if w])


def test_the_budget_stops_a_job_so_that_it_resumes(fake_repo: Path, tmp_path: Path, fake_clock: FakeClock,  # noqa: F811
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture) -> None:
    workdir = tmp_path / "work"
    fake_clock.workdirs.append(workdir)
    args = tiny(workdir, "launcher=submitit_local", "parallel=1", "budget=35m")
    monkeypatch.setenv("FAKE_HANG", "base de-en seed42")
    assert command.main(args, fake_repo) is None  # the budget ended it: SIGTERM through submitit to the command
    said = capsys.readouterr().out
    assert "reproduce.py: stop  base de-en seed42: budget=35m is spent (SIGTERM" in said
    run = workdir / "runs" / "best_de-en" / "seed42"
    assert (run / "checkpoints" / "last.pt").read_text() == "saved at SIGTERM" and not (run / "results.json").exists()
    monkeypatch.delenv("FAKE_HANG")
    command.main(args, fake_repo)
    assert calls(workdir)[1] == ("base de-en seed42", [f"trainer.resume={run}"])


@pytest.mark.parametrize(("args", "message"), [
    (["launcher=joblib"], "launcher=joblib is not one of local, submitit_local, submitit_slurm (joblib runs Python "
                          "functions; the local runner already runs the chain's commands parallel=N at once"),
    (["launcher.partition=gpu"], "launcher.partition=gpu needs launcher=submitit_slurm or launcher=submitit_local"),
    (["launcher=submitit_local", "launcher.timeout_mins=9"], "unknown config key launcher.timeout_mins: did you "
                                                               "mean launcher.timeout_min? valid keys under launcher."),
    (["launcher=submitit_local", "launcher.timeout_min=soon"], "bad value for launcher.timeout_min: Value 'soon'"),
    (["launcher=submitit_slurm"], "launcher=submitit_slurm needs SLURM's sbatch, which is not on the PATH"),
])
def test_a_launcher_mistake_is_one_line_and_exit_2_before_any_work(args: list[str], message: str,
                                                                   tmp_path: Path) -> None:
    env = {"PATH": str(Path(sys.executable).parent), "NMT_DATA_MIRROR": "/nowhere"}  # no sbatch on this PATH
    done = subprocess.run([sys.executable, "reproduce.py", "recipe=tiny", f"workdir={tmp_path / 'w'}", *args],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert message in done.stderr and not (tmp_path / "w" / "runs").exists()


def test_without_the_plugin_the_launcher_names_the_package_and_extra(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "hydra_plugins.hydra_submitit_launcher", None)  # import fails as if absent
    with pytest.raises(ChainError, match=r"launcher=submitit_slurm needs the package hydra-submitit-launcher, which "
                                         r"is not installed: pip install -e '\.\[cluster\]'"):
        command.main(tiny(tmp_path / "w", "launcher=submitit_slurm"), REPO_ROOT)


def test_a_dry_run_through_a_launcher_counts_every_ready_stage_at_once(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    command.main(tiny(tmp_path / "w", "launcher=submitit_local", "dry_run=true"), REPO_ROOT)
    said = capsys.readouterr().out.splitlines()
    assert said[-1].startswith("reproduce.py: ETA ") and "launcher=submitit_local: each wave of stages as one job " \
                                                          "array" in said[-1]
    assert json.dumps(said).count("to run") == 26


@pytest.mark.cluster
@pytest.mark.slow
def test_a_job_a_killed_call_left_running_saves_before_the_next_call_takes_over(fake_repo: Path,  # noqa: F811
                                                                                 tmp_path: Path) -> None:
    # submitit's local controller outlives a SIGKILLed chain (it is no stage of ours); the next call stops it
    workdir, hung = tmp_path / "work", "base de-en seed42"
    hang_and_note_pids(fake_repo)
    chain = start_chain(fake_repo, tiny(workdir, "launcher=submitit_local", "parallel=1"), FAKE_HANG=hung)
    wait_for((workdir / "hung").exists)
    chain.kill()
    chain.wait(timeout=60)  # not communicate(): the job, still running, holds its pipes open
    stage = int((workdir / "pids").read_text().split()[-1])
    assert alive(stage)
    again = start_chain(fake_repo, tiny(workdir, "launcher=submitit_local"))
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert f"reproduce.py: wait  {hung}: left running by an earlier call (pid " in out and not alive(stage)
    run = workdir / "runs" / "best_de-en" / "seed42"
    resumed = [args for stage, args in calls(workdir) if stage == hung][1]
    assert resumed == [f"trainer.resume={run}"]  # from the last.pt it saved at that SIGTERM


# --- on a real one-node SLURM cluster (tests/conftest.py's slurm_cluster): pytest -m cluster --------------------------

SLURM = ["launcher=submitit_slurm", "launcher.cpus_per_task=1", "launcher.timeout_min=10"]


def hung_on_slurm(cluster, repo: Path, workdir: Path, hung: str) -> tuple[subprocess.Popen, str]:  # noqa: ANN001
    """reproduce.py through SLURM in its own process, once the job of ``hung`` (a stand-in that waits for SIGTERM)
    runs: the chain and that job's id."""
    chain = start_chain(repo, tiny(workdir, *SLURM), FAKE_HANG=hung, SLURM_CONF=str(cluster.conf))
    wait_for((workdir / "hung").exists, 120)
    return chain, running_job(workdir, hung)


def running_job(workdir: Path, stage: str) -> str:
    """The SLURM job id the chain noted for ``stage`` once it runs ('' before)."""
    path = workdir / "runs" / ".reproduce" / "running.json"
    try:
        return str(json.loads(path.read_text()).get(stage, {}).get("pid", ""))
    except (OSError, ValueError):
        return ""


@pytest.mark.cluster
@pytest.mark.slow
def test_the_tiny_chain_reaches_its_report_through_slurm_as_through_the_local_runner(
        slurm_cluster, fake_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001, F811
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    local = command.main(tiny(tmp_path / "local"), fake_repo)
    waves = waves_recorded(monkeypatch)
    launched = command.main(tiny(tmp_path / "slurm", *SLURM), fake_repo)
    assert {**launched, "date": ""} == {**local, "date": ""}
    assert len(waves) < 26 and sorted(s for w in waves for s in w) == sorted(s for s, _ in calls(tmp_path / "local"))
    jobs = [p.name for p in (tmp_path / "slurm" / "runs" / ".reproduce" / "jobs").iterdir() if p.name[0].isdigit()]
    tasks = [job for job in jobs if "_" in job]  # a wave of several stages: one job array, a task per stage
    assert len({task.split("_")[0] for task in tasks}) == len([w for w in waves if len(w) > 1])
    assert len(tasks) == sum(len(w) for w in waves if len(w) > 1)


@pytest.mark.cluster
@pytest.mark.slow
def test_a_job_cancelled_with_scancel_mid_training_resumes_on_the_next_call(
        slurm_cluster, fake_repo: Path, tmp_path: Path) -> None:  # noqa: ANN001, F811
    workdir, hung = tmp_path / "work", "base de-en seed42"
    chain, job = hung_on_slurm(slurm_cluster, fake_repo, workdir, hung)
    subprocess.run(["scancel", job], check=True, env=slurm_cluster.env)
    out, err = chain.communicate(timeout=300)
    assert chain.returncode == 2 and err.count("\n") == 1, err
    # as SLURM ends it: the command saves at the SIGTERM (exit 0) or dies of it; the job is CANCELLED or COMPLETING
    assert re.search(f"reproduce.py: error: stage '{hung}' (stopped before it finished|failed \\(exit -?\\d+); "
                     f"job {job}, [A-Z]+", err), err
    assert "run the same command again to resume" in err
    again = start_chain(fake_repo, tiny(workdir, *SLURM), SLURM_CONF=str(slurm_cluster.conf))
    out, err = again.communicate(timeout=600)
    assert again.returncode == 0, err
    run = workdir / "runs" / "best_de-en" / "seed42"
    assert [args for stage, args in calls(workdir) if stage == hung][1] == [f"trainer.resume={run}"]
    assert (workdir / "runs" / "reproduce_tiny.json").is_file()


@pytest.mark.cluster
@pytest.mark.slow
def test_a_slurm_job_a_killed_call_left_running_saves_before_the_next_call_takes_over(
        slurm_cluster, fake_repo: Path, tmp_path: Path) -> None:  # noqa: ANN001, F811
    workdir, hung = tmp_path / "work", "base de-en seed42"
    chain, job = hung_on_slurm(slurm_cluster, fake_repo, workdir, hung)
    chain.kill()
    chain.wait(timeout=60)
    again = start_chain(fake_repo, tiny(workdir, *SLURM), SLURM_CONF=str(slurm_cluster.conf))
    out, err = again.communicate(timeout=600)
    assert again.returncode == 0, err
    assert f"reproduce.py: wait  {hung}: SLURM job {job} left by an earlier call; SIGTERM, then it saves" in out
    run = workdir / "runs" / "best_de-en" / "seed42"
    assert [args for stage, args in calls(workdir) if stage == hung][1] == [f"trainer.resume={run}"]


def test_a_budget_caps_the_jobs_time_limit_and_the_launcher_keys_reach_submitit(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import submitit

    from nmt.chain.launch import StageJob, launcher_config, submit_wave

    seen: dict = {}

    class Executor:  # submitit's AutoExecutor as far as submit_wave uses it
        def __init__(self, folder: str, cluster: str, **init: object) -> None:
            seen.update(folder=folder, cluster=cluster, init=init)

        def update_parameters(self, **parameters: object) -> None:
            seen["parameters"] = parameters

        def batch(self):  # noqa: ANN202
            return contextlib.nullcontext()

        def submit(self, job: StageJob) -> object:
            return types.SimpleNamespace(job_id="7_0")

    monkeypatch.setattr(submitit, "AutoExecutor", Executor)
    monkeypatch.setattr("nmt.chain.launch.check_slurm_answers", lambda: None)
    config = launcher_config("submitit_slurm", ["launcher.partition=gpu", "launcher.timeout_min=600",
                                                "launcher.max_num_timeout=3"], tmp_path / "jobs")
    job = StageJob(lambda: ["true"], tmp_path, tmp_path / "log", {})
    [submitted] = submit_wave(config, "submitit_slurm", [(job, ["true"])], seconds_left=30 * 60)
    assert submitted.pid == "7_0" and seen["cluster"] == "slurm" and seen["init"] == {"slurm_max_num_timeout": 3}
    assert seen["folder"] == str(tmp_path / "jobs" / "%j")
    parameters = seen["parameters"]
    assert parameters["timeout_min"] == 32  # the 30 minutes left, and the 2 minutes' grace to save
    assert parameters["slurm_partition"] == "gpu" and parameters["name"] == "nmt-chain"
    submit_wave(config, "submitit_slurm", [(job, ["true"])], seconds_left=None)
    assert seen["parameters"]["timeout_min"] == 600  # no budget: the launcher's own limit
