"""The tools work from a plain install: the project's commands and configs come from ``--project-dir``, never from
where the package's own files happen to lie."""

from __future__ import annotations

import ast
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, SRC, save_tiny_checkpoint

from nmt_tools import benchmark

PACKAGES = ("nmt", "nmt_tools", "nmt_runtime")
REFUSAL = "no train.py/configs here; run from the project checkout or pass --project-dir"


def test_a_tool_run_elsewhere_reads_the_project_dir_it_is_given(tmp_path: Path) -> None:
    """``python -m`` from a folder that is not the checkout, as from a plain install: the configs are the checkout's."""
    run = tmp_path / "run"
    save_tiny_checkpoint(run / "checkpoints" / "best.pt", "additive")
    source = tmp_path / "mono.de"
    source.write_text("".join(line + "\n" for line in SRC), encoding="utf-8")
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, "-m", "nmt_tools.benchmark", "backtranslate", "--project-dir", str(REPO_ROOT),
         "--checkpoint", str(run), "--input", str(source), "--limit", "4", "--warmup", "2", "--methods", "beam",
         "--set", "max_len=6", "device=cpu", "--out", str(tmp_path / "bt")],
        cwd=work, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "bt.json").read_text())
    assert [(row["method"], row["lines"]) for row in report["results"]] == [("beam", 4)]
    assert os.listdir(work) == []  # nothing written where it ran


@pytest.mark.parametrize("given", [False, True])
def test_a_folder_without_the_project_is_refused_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, given: bool) -> None:
    monkeypatch.chdir(tmp_path)  # the default, the current directory, is no checkout
    with pytest.raises(SystemExit) as exit_info:
        benchmark.main(["backtranslate", "--checkpoint", "RUN", "--out", str(tmp_path / "bt"),
                        *(["--project-dir", str(tmp_path)] if given else [])])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert err.endswith(f": error: --project-dir {tmp_path.resolve()}: {REFUSAL}\n")  # after the prog's name
    assert list(tmp_path.iterdir()) == []  # refused before any work


def test_the_scripts_wrapper_defaults_to_its_own_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["benchmark.py", "backtranslate", "--help"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(REPO_ROOT / "scripts" / "benchmark.py"), run_name="__main__")
    assert exit_info.value.code == 0
    assert f"(default: {REPO_ROOT})" in " ".join(capsys.readouterr().out.split())


def uses_of_file(path: Path) -> list[str]:
    """``path:line`` of every ``__file__`` in a module: a package finds its data with importlib.resources, and
    the project's commands and configs through an argument."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if (isinstance(node, ast.Name) and node.id == "__file__") or (
                isinstance(node, ast.Attribute) and node.attr == "__file__"):
            found.append((node.lineno, f"{path}:{node.lineno}"))
    return [hit for _, hit in sorted(found)]


def test_no_package_module_finds_files_relative_to_its_own_source() -> None:
    found = [hit for package in PACKAGES for path in sorted((REPO_ROOT / package).rglob("*.py"))
             for hit in uses_of_file(path)]
    assert not found, "take the path as an argument (or importlib.resources for package data):\n" + "\n".join(found)


def test_the_scan_sees_a_path_from_the_source_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom pathlib import Path\nROOT = Path(__file__).parents[2]\n"
                   "def f(m):\n    return os.path.dirname(m.__file__)\n")
    assert uses_of_file(bad) == [f"{bad}:3", f"{bad}:5"]
