"""``hydra/launcher=submitit_slurm`` on a real SLURM cluster: a one-node cluster on this machine
(``scripts/slurm_cluster.sh``, the ``slurm_cluster`` fixture), a sweep of tiny trainings submitted as SLURM jobs, and
the same scores and translations as the same sweep with Hydra's basic launcher in one local process.

The ``cluster`` tier: deselected by default, ``pytest -m cluster`` runs it (``.ci/run`` does, after installing Debian's
slurm-wlm, munge, slurmdbd and mariadb-server). Without SLURM the fixture skips, unless ``NMT_REQUIRE_SLURM=1``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import SlurmCluster
from tests.test_hydra_plugins import run_dirs, run_train, tiny_configs  # noqa: F401  # tiny_configs: a fixture

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# 2 attention types x 2 seeds of the tiny training of tests/test_hydra_plugins.py (8 steps on a slice of Multi30k)
SWEEP = ("attention=additive,dot", "trainer.seed=1,2", "experiment=plugins_tiny")
# what a run's results.json says of its model, less the clock: the scores, the losses, the steps
TIMINGS = {"decode_seconds", "sentences_per_s"}


def scores(run_dir: Path) -> dict:
    results = json.loads((run_dir / "results.json").read_text())
    return {"valid": results["valid"], "test": {name: {k: v for k, v in split.items() if k not in TIMINGS}
                                                for name, split in results["test"].items()},
            "steps": results["steps"], "best_step": results["best_step"], "attention": results["attention"]}


def translations(run_dir: Path) -> dict[str, str]:
    return {path.name: path.read_text(encoding="utf-8") for path in sorted((run_dir / "translations").iterdir())}


def accounted(cluster: SlurmCluster, job_id: str) -> list[str]:
    """``JobID|State`` of each task of the job array ``job_id``, as ``sacct`` has them."""
    proc = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", job_id], capture_output=True,
                          text=True, env=cluster.env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return sorted(proc.stdout.split())


def test_a_sweep_through_slurm_gives_the_local_runs_scores_and_translations(tiny_configs: Path,  # noqa: F811
        slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))  # for sbatch and sacct, which the launcher calls
    local, slurm = tmp_path / "local", tmp_path / "slurm"
    proc = run_train(f"--config-dir={tiny_configs}", "-m", *SWEEP, f"hydra.sweep.dir={local}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_train(f"--config-dir={tiny_configs}", "-m", "hydra/launcher=submitit_slurm", *SWEEP,
                     "hydra.launcher.partition=debug", "hydra.launcher.timeout_min=10",
                     "hydra.launcher.cpus_per_task=1", f"hydra.sweep.dir={slurm}",
                     f'hydra.launcher.setup=["printenv NMT_DATA_MIRROR >{slurm}/mirror_in_job"]')
    assert proc.returncode == 0, proc.stderr[-3000:]

    names = [path.name for path in run_dirs(local)]
    assert len(names) == 4 and [path.name for path in run_dirs(slurm)] == names
    for name in names:
        assert scores(slurm / name) == scores(local / name), name
        assert translations(slurm / name) == translations(local / name), name
    # the seeds and attention types made different models, so equal translations are not the trivial kind
    assert len({json.dumps(translations(local / name), sort_keys=True) for name in names}) > 1

    # each training ran as a task of one SLURM job array, with this Python and this environment
    jobs = sorted(path.name for path in (slurm / ".submitit").glob("[0-9]*_*"))  # .submitit/<array>_<task>/
    array_id = jobs[0].split("_")[0]
    assert jobs == [f"{array_id}_{task}" for task in range(4)]
    (script,) = (slurm / ".submitit").glob("*/*_submission.sh")
    assert sys.executable in script.read_text()
    assert (slurm / "mirror_in_job").read_text().strip() == os.environ["NMT_DATA_MIRROR"]  # and this environment
    if slurm_cluster.accounting:  # sacct answers: SLURM saw each one complete
        completed = [f"{array_id}_{task}|COMPLETED" for task in range(4)]
        deadline = time.monotonic() + 60  # the launcher returns on the result files, a moment before the jobs end
        while (states := accounted(slurm_cluster, array_id)) != completed and time.monotonic() < deadline:
            time.sleep(1)
        assert states == completed


def test_a_job_cancelled_before_it_starts_ends_for_submitit(slurm_cluster: SlurmCluster, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """What a waiting launcher sees of a job that SLURM ends without running it: submitit reads the state with sacct
    and raises. On a cluster without accounting it would wait for the job's result file forever."""
    submitit = pytest.importorskip("submitit")
    if not slurm_cluster.accounting:
        pytest.skip("the cluster has no accounting (slurmdbd), and submitit would wait for a cancelled job forever")
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    executor = submitit.AutoExecutor(folder=tmp_path, cluster="slurm")
    executor.update_parameters(timeout_min=5, slurm_partition="debug", cpus_per_task=1,
                               slurm_additional_parameters={"begin": "now+600"})  # pending for ten minutes
    job = executor.submit(submitit.helpers.CommandFunction(["true"]))
    job.cancel()
    deadline = time.monotonic() + 60
    while not job.done() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job.state.startswith("CANCELLED")
    with pytest.raises(submitit.core.utils.UncompletedJobError, match=r"not produced any output \(state: CANCELLED"):
        job.result()
