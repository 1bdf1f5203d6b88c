"""The entry points' shared front: ``--help`` lists what each takes, a setting it does not take is one line and exit
2, and a run refused before it starts leaves no folder behind (nmt.common.entry_point, run as real processes).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from nmt.common.settings import config_groups

ENTRY_POINTS = ("train", "translate", "serve", "backtranslate", "export")
GROUPS = sorted(path.name for path in (REPO_ROOT / "configs").iterdir() if path.is_dir() and path.name != "hydra")


def run(script: str, *args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO_ROOT / f"{script}.py"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


def assert_one_line_exit_2(proc: subprocess.CompletedProcess, script: str, *expected: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"{script}.py: error: "), proc.stderr
    assert all(text in proc.stderr for text in expected), proc.stderr


def test_train_takes_its_defaults_groups_and_the_others_none() -> None:
    assert config_groups(REPO_ROOT / "configs", "train") == ["data", "model", "attention", "trainer", "experiment"]
    for script in ENTRY_POINTS[1:]:
        assert config_groups(REPO_ROOT / "configs", script) == []
    assert "recipe" in GROUPS  # reproduce.py's: a folder of configs/ that train.py does not take


@pytest.mark.parametrize("script", ENTRY_POINTS)
def test_help_lists_only_the_groups_the_entry_point_takes(script: str) -> None:
    proc = run(script, "--help")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    taken = config_groups(REPO_ROOT / "configs", script)
    listed = [line.split(":")[0].strip() for line in proc.stdout.split("== Config groups (GROUP=OPTION) ==\n")[1]
              .split("\n\n")[0].splitlines()]
    assert listed == (taken or ["none"])
    assert f"python {script}.py" in proc.stdout and "== Settings (key=value), as composed ==" in proc.stdout
    if script == "train":
        assert "  attention: additive, dot, general, multihead, none, scaled_dot\n" in proc.stdout
        assert "\n  recipe:" not in proc.stdout


def test_help_shows_the_settings_as_the_overrides_compose_them() -> None:
    proc = run("translate", "-h", "beam_size=3")
    assert proc.returncode == 0 and "\nbeam_size: 3\n" in proc.stdout


@pytest.mark.parametrize(("script", "group"), [("translate", "attention=dot"), ("serve", "model=small"),
                                               ("backtranslate", "+experiment=smoke"), ("export", "data=files"),
                                               ("train", "recipe=tiny")])
def test_a_group_the_entry_point_does_not_take_is_one_line_and_exit_2(script: str, group: str) -> None:
    key = group.lstrip("+").split("=")[0]
    assert_one_line_exit_2(run(script, group), script, f"unknown config key {key}: ", "valid keys under the top level")


def test_a_setting_refused_after_composing_leaves_no_run_folder(tmp_path: Path) -> None:
    """The default run dir (outputs/DATE/TIME_attention) is made by Hydra, then refused: all of it goes again."""
    assert_one_line_exit_2(run("train", "trainer.cuda_graphs=maybe", cwd=tmp_path), "train", "cuda_graphs")
    assert list(tmp_path.iterdir()) == []


def test_a_refused_run_keeps_a_folder_that_was_there(tmp_path: Path) -> None:
    """A resumed run's folder, or any folder the user named, is never taken away: only one this process made."""
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "best.pt").write_text("an earlier run's")
    empty = tmp_path / "empty"
    empty.mkdir()
    for folder in (earlier, empty):
        assert_one_line_exit_2(run("train", "trainer.cuda_graphs=maybe", f"hydra.run.dir={folder}", cwd=tmp_path),
                               "train", "cuda_graphs")
        assert folder.is_dir()
    assert (earlier / "best.pt").read_text() == "an earlier run's"
    new = tmp_path / "a" / "b" / "new"
    assert_one_line_exit_2(run("train", "trainer.cuda_graphs=maybe", f"hydra.run.dir={new}", cwd=tmp_path),
                           "train", "cuda_graphs")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["earlier", "empty"]  # a/b/new and a/b, a too
