"""Hydra's launcher and sweeper plugins through the entry points (nmt.common.hydra_plugins): ``hydra/launcher=...``,
``hydra/sweeper=optuna`` and their keys pass the command-line check when the plugin is installed, typos are still
one line, a missing plugin names its package and extra; and real tiny trainings on Multi30k (a slice of the
mirror) run through the joblib and submitit launchers and are tuned by Optuna on validation BLEU.

The plugins come with the ``cluster`` and ``tune`` extras; without them the tests that need one skip.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import CONFIG_DIR, REPO_ROOT

from nmt.common import hydra_plugins
from nmt.common.entry_point import command_line_problem
from nmt.common.hydra_plugins import with_sweeper_direction
from nmt.train.schema import TrainSettings


def problem(*args: str) -> str | None:
    """What ``train.py``'s command-line check says of ``args``, or None."""
    return command_line_problem(CONFIG_DIR, "train", args, TrainSettings)


def run_train(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "train.py", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_a_missing_plugin_names_its_package_and_the_extra_that_brings_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hydra_plugins, "hydra_group_options", lambda group, dirs=(): ["basic"])  # none installed
    assert problem("-m", "hydra/launcher=joblib", "attention=additive,dot") == (
        "hydra/launcher=joblib needs the package hydra-joblib-launcher, which is not installed: pip install -e "
        "'.[cluster]' (the [cluster] extra brings it)")
    assert "hydra-submitit-launcher" in problem("-m", "hydra/launcher=submitit_slurm") and "'.[cluster]'" in problem(
        "-m", "hydra/launcher=submitit_slurm")
    assert problem("-m", "hydra/sweeper=optuna").startswith(
        "hydra/sweeper=optuna needs the package hydra-optuna-sweeper, which is not installed: pip install -e '.[tune]'")


def test_a_plugin_no_extra_brings_is_one_line_and_exit_2() -> None:
    """hydra-ray-launcher is in no extra (and not installed here): one line naming it, before Hydra starts."""
    proc = run_train("-m", "hydra/launcher=ray", "attention=additive,dot")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("train.py: error: hydra/launcher=ray needs the package hydra-ray-launcher")


def test_typos_in_hydra_groups_and_options_name_the_nearest() -> None:
    assert problem("-m", "hydra/launchr=basic").startswith(
        "unknown config group hydra/launchr: did you mean hydra/launcher? Hydra's groups: hydra/env, ")
    assert problem("-m", "hydra/launcher=basc").startswith(
        "unknown hydra/launcher option 'basc': did you mean hydra/launcher=basic? valid options: basic")
    assert problem("-m", "hydra.launcher.n_jobs=2").startswith(  # a joblib key, with the basic launcher
        "unknown config key hydra.launcher.n_jobs: valid keys under hydra.launcher.: _target_ (the launcher is "
        "hydra/launcher=basic)")
    # choice(...) sweeps of our own groups are checked option by option, as a,b is
    assert problem("-m", "attention=choice(dot,genral)").startswith("unknown attention option 'genral': did you mean "
                                                                    "attention=general?")
    assert problem("-m", "attention=choice(dot,general)", "hydra/launcher=basic") is None
    # Hydra cannot set the sweeper's params from the command line: the line says what works, with the user's key
    assert problem("-m", "hydra.sweeper.params={model.dropout: interval(0.1,0.5)}").startswith(
        "hydra.sweeper.params cannot be set on the command line (Hydra cannot merge a dict into the sweeper's empty "
        "params): pass each search space as its own override, model.dropout='interval(0.1,0.5)', or set")


def test_optuna_maximizes_bleu_unless_told_otherwise() -> None:
    assert with_sweeper_direction(["-m", "hydra/sweeper=optuna", "x=1", "--cfg", "job"]) == [
        "-m", "hydra/sweeper=optuna", "hydra.sweeper.direction=maximize", "x=1", "--cfg", "job"]
    told = ["-m", "hydra/sweeper=optuna", "hydra.sweeper.direction=minimize"]
    assert with_sweeper_direction(told) == told
    assert with_sweeper_direction(["-m", "attention=dot,additive"]) == ["-m", "attention=dot,additive"]


def test_help_mentions_the_plugins_and_their_extras() -> None:
    proc = run_train("--help")
    assert proc.returncode == 0, proc.stderr
    assert "== Hydra's plugins (with -m; docs/guides/many-machines.md) ==" in proc.stdout
    assert "pip install -e '.[cluster]'" in proc.stdout and "pip install -e '.[tune]'" in proc.stdout


def test_installed_plugins_and_their_keys_pass_the_check_and_typos_are_caught() -> None:
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    assert problem("-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "attention=additive,dot") is None
    assert problem("-m", "hydra/launcher=submitit_slurm", "hydra.launcher.partition=gpu",
                   "hydra.launcher.gpus_per_node=4", "+hydra.launcher.additional_parameters.mail-type=END",
                   "hydra.launcher.setup=[module load cuda,source /shared/venv/bin/activate]") is None
    assert problem("-m", "hydra/launcher=submitit_slurm", "hydra.launcher.additional_parameters.mail-type=END") == (
        "hydra.launcher.additional_parameters.mail-type is a new key under hydra.launcher.additional_parameters: add "
        "it with a plus, +hydra.launcher.additional_parameters.mail-type=VALUE (the launcher is "
        "hydra/launcher=submitit_slurm)")
    assert problem("-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=3", "model.dropout=interval(0.1,0.5)",
                   "attention=choice(additive,dot)", "hydra.sweeper.sampler.seed=1") is None
    assert problem("-m", "hydra/launcher=joblib", "hydra.launcher.n_job=2").startswith(
        "unknown config key hydra.launcher.n_job: did you mean hydra.launcher.n_jobs? valid keys under hydra.launcher.")
    assert problem("-m", "hydra/launcher=jobib").startswith("unknown hydra/launcher option 'jobib': did you mean "
                                                            "hydra/launcher=joblib? valid options: basic, joblib, ")
    assert problem("-m", "hydra/sweeper=optuna", "model.dropuot=interval(0.1,0.5)").startswith(
        "unknown config key model.dropuot: did you mean model.dropout?")
    assert problem("-m", "hydra/launcher=joblib", "trainer.max_step=3").startswith(
        "unknown config key trainer.max_step: did you mean trainer.max_steps?")


def test_the_keys_an_experiment_file_tunes_are_checked(tmp_path: Path) -> None:
    """A search space kept in an experiment file (docs/guides/many-machines.md) names our keys: a typo among them is
    one line before the sweep starts, not Hydra's error at the first trial."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    (tmp_path / "experiment").mkdir()
    for name, key in (("tune_ok", "model.dropout"), ("tune_typo", "model.dropuot")):
        (tmp_path / "experiment" / f"{name}.yaml").write_text("# @package _global_\n" + yaml.safe_dump(
            {"defaults": [{"override /hydra/sweeper": "optuna"}],
             "hydra": {"sweeper": {"direction": "maximize", "params": {key: "interval(0.1, 0.5)",
                                                                       "attention": "choice(additive, dot)"}}}}))
    assert problem(f"--config-dir={tmp_path}", "-m", "experiment=tune_ok") is None
    assert problem(f"--config-dir={tmp_path}", "-m", "experiment=tune_typo").startswith(
        "unknown config key model.dropuot: did you mean model.dropout? valid keys under model.: ")


def test_the_slurm_launcher_composes_with_its_settings() -> None:
    """No SLURM here: what can be checked is that train.py takes the launcher and its keys and Hydra composes them."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    proc = run_train("hydra/launcher=submitit_slurm", "hydra.launcher.partition=gpu", "hydra.launcher.gpus_per_node=2",
                     "hydra.launcher.timeout_min=600", "--cfg", "hydra")
    assert proc.returncode == 0, proc.stderr
    launcher = yaml.safe_load(proc.stdout)["hydra"]["launcher"]
    assert launcher["_target_"].endswith("SlurmLauncher")
    assert (launcher["partition"], launcher["gpus_per_node"], launcher["timeout_min"]) == ("gpu", 2, 600)


# --- real tiny trainings: a slice of Multi30k from the mirror, a 30k-parameter model, 8 steps ---------------------

@pytest.fixture(scope="module")
def tiny_configs(mirror_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``--config-dir`` with ``data/m30k_slice.yaml`` (500 training pairs of Multi30k de-en, 40 validation and 40
    test pairs, from the mirror) and ``experiment/plugins_tiny.yaml`` (a tiny model, 8 steps, validated at 4 and 8):
    a run of about ten seconds on a CPU, its run dir named by its sweep overrides alone."""
    root = tmp_path_factory.mktemp("plugins")
    corpus = root / "corpus"
    corpus.mkdir()
    for split, name, size in (("train", "train", 500), ("valid", "val", 40), ("test", "test_2016_flickr", 40)):
        for lang in ("de", "en"):
            with gzip.open(mirror_dir / "multi30k" / f"{name}.{lang}.gz", "rt", encoding="utf-8") as lines:
                (corpus / f"{split}.{lang}").write_text("".join(next(lines) for _ in range(size)), encoding="utf-8")
    files = {split: {"src": str(corpus / f"{split}.de"), "tgt": str(corpus / f"{split}.en")}
             for split in ("train", "valid", "test")}
    (root / "data").mkdir()
    (root / "data" / "m30k_slice.yaml").write_text(yaml.safe_dump(
        {"defaults": ["files"], "files": files, "cache_dir": str(root / "cache"),
         "tokenizer": {"model_type": "bpe", "vocab_size": 300}}))
    (root / "experiment").mkdir()
    (root / "experiment" / "plugins_tiny.yaml").write_text("# @package _global_\n" + yaml.safe_dump(
        {"defaults": [{"override /data": "m30k_slice"}],
         "model": {"emb_size": 32, "enc_hidden_size": 32, "dec_hidden_size": 64},
         "trainer": {"max_steps": 8, "validate_every": 4, "warmup_steps": 2, "test_beam_size": 1, "num_heatmaps": 1,
                     "num_samples": 1, "log_every": 4}}))
    return root


def run_dirs(sweep: Path) -> list[Path]:
    return sorted(path.parent for path in sweep.glob("*/results.json"))


@pytest.mark.slow
def test_the_joblib_launcher_runs_two_trainings_at_once(tiny_configs: Path, tmp_path: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep = tmp_path / "sweep"
    proc = run_train(f"--config-dir={tiny_configs}", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                     "attention=additive,dot", "experiment=plugins_tiny", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Joblib.Parallel(n_jobs=2" in proc.stdout + proc.stderr
    runs = run_dirs(sweep)
    assert [path.name for path in runs] == ["attention=additive,experiment=plugins_tiny",
                                            "attention=dot,experiment=plugins_tiny"]
    for run_dir in runs:
        results = json.loads((run_dir / "results.json").read_text())
        assert results["steps"] == 8 and results["attention"] == run_dir.name.split(",")[0].split("=")[1]
        assert 0 <= results["valid"]["bleu"] <= 100
    pids = {path.name.rsplit(".", 2)[-2] for run_dir in runs for path in run_dir.glob("events.out.tfevents.*")}
    assert len(pids) == 2  # each training in its own worker process


@pytest.mark.slow
def test_the_submitit_launcher_runs_a_training_as_a_submitted_job(tiny_configs: Path, tmp_path: Path) -> None:
    """submitit_local: the launcher that submitit_slurm is, with a local process for the cluster's job."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    sweep = tmp_path / "sweep"
    proc = run_train(f"--config-dir={tiny_configs}", "-m", "hydra/launcher=submitit_local", "attention=dot",
                     "experiment=plugins_tiny", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = run_dirs(sweep)
    assert json.loads((run_dir / "results.json").read_text())["steps"] == 8
    assert list((sweep / ".submitit").glob("*/*_result.pkl"))  # it ran as submitit's job


@pytest.mark.slow
def test_optuna_tunes_validation_bleu_in_two_trials(tiny_configs: Path, tmp_path: Path) -> None:
    """Two trials, the search space on the command line (attention) and in an experiment file (dropout): Optuna
    maximizes the validation BLEU that train.py returns, its best is the best trial's results.json, and the study is
    kept in an SQLite storage."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    (tiny_configs / "experiment" / "plugins_tune.yaml").write_text("# @package _global_\n" + yaml.safe_dump(
        {"defaults": ["plugins_tiny"], "hydra": {"sweeper": {"params": {"model.dropout": "interval(0.1, 0.5)"}}}}))
    sweep, storage = tmp_path / "sweep", f"sqlite:///{tmp_path / 'study.db'}"
    proc = run_train(f"--config-dir={tiny_configs}", "-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2",
                     "hydra.sweeper.n_jobs=1", "hydra.sweeper.sampler.seed=0", "attention=choice(additive,dot)",
                     "experiment=plugins_tune", f"hydra.sweep.dir={sweep}", f"hydra.sweeper.storage={storage}",
                     "hydra.sweeper.study_name=tiny")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Directions: ['maximize']" in proc.stdout + proc.stderr  # set by train.py for a sweep of BLEU
    trials = {run_dir: json.loads((run_dir / "results.json").read_text()) for run_dir in run_dirs(sweep)}
    assert len(trials) == 2
    dropouts = {yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["dropout"] for run_dir in trials}
    assert len(dropouts) == 2 and all(0.1 <= dropout <= 0.5 for dropout in dropouts)
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert best["best_value"] == pytest.approx(max(results["valid"]["bleu"] for results in trials.values()))
    assert set(best["best_params"]) == {"model.dropout", "attention"}
    # the study is kept in its storage (the tune extra's SQLAlchemy pin): a later call can go on with it
    study = pytest.importorskip("optuna").load_study(study_name="tiny", storage=storage)
    assert sorted(trial.value for trial in study.trials) == sorted(r["valid"]["bleu"] for r in trials.values())


@pytest.mark.parametrize("script", ["translate", "backtranslate", "export", "serve"])
def test_every_entry_point_checks_the_launcher_keys(script: str) -> None:
    """Each takes -m, so each takes a launcher: a misspelt key of it is one line, with the plugin (the nearest key)
    or without it (the package and extra)."""
    proc = subprocess.run([sys.executable, f"{script}.py", "-m", "hydra/launcher=joblib", "hydra.launcher.n_job=2"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"{script}.py: error: ")
    assert ("did you mean hydra.launcher.n_jobs?" in proc.stderr
            or "needs the package hydra-joblib-launcher" in proc.stderr), proc.stderr
