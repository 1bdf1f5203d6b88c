"""A kept workdir names no machine's folders (nmt.chain.portable): the rewriting of each kind of path, a chain's
own workdir after a call, and the workdirs kept in this repository."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nmt.chain import command
from nmt.chain.portable import leftover_paths, make_portable, portable_text
from tests.test_reproduce import REPO_ROOT, fake_repo  # noqa: F401 (a fixture)


def test_each_kind_of_path_is_rewritten_as_the_workdir_sees_it() -> None:
    roots = ["/srv/old/study", "/home/me/study"]
    text = ("$ /home/me/.venv/bin/python3.11 /home/me/wt/train.py hydra.run.dir=/srv/old/study/runs/a/seed1\n"
            "  mirror: /corpora/mirror\n"
            "fetched /home/me/study/data/multi30k/val.de.gz from /corpora/mirror/multi30k/val.de.gz (sha256 ok)\n"
            "/home/me/main/nmt/analysis/compare.py:323: UserWarning: Tight layout not applied.\n"
            '"run_dir": "/srv/old/study/runs/a/seed1", "files": {"/srv/old/study/data/x.gz": "ab12"}\n'
            "$ /usr/bin/python /home/me/wt/scripts/compare_runs.py runs/a --out /home/me/study 12.5 tok/s\n"
            "see https://example.org/nmt/train.py and https://example.org/env/bin/python\n")
    assert portable_text(text, roots, ["/corpora/mirror"]) == (
        "$ python train.py hydra.run.dir=runs/a/seed1\n"
        "  mirror: '${oc.env:NMT_DATA_MIRROR,null}'\n"
        "fetched data/multi30k/val.de.gz from $NMT_DATA_MIRROR/multi30k/val.de.gz (sha256 ok)\n"
        "nmt/analysis/compare.py:323: UserWarning: Tight layout not applied.\n"
        '"run_dir": "runs/a/seed1", "files": {"data/x.gz": "ab12"}\n'
        "$ python scripts/compare_runs.py runs/a --out . 12.5 tok/s\n"
        "see https://example.org/nmt/train.py and https://example.org/env/bin/python\n")  # addresses stay
    once = portable_text(text, roots, ["/corpora/mirror"])
    assert portable_text(once, roots, ["/corpora/mirror"]) == once  # idempotent


def test_a_config_made_portable_reads_its_mirror_from_the_environment(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(portable_text("data:\n  mirror: /corpora/mirror\n  cache_dir: data\n", [str(tmp_path)]))
    monkeypatch.setenv("NMT_DATA_MIRROR", "/elsewhere")
    assert OmegaConf.to_container(OmegaConf.load(config), resolve=True)["data"]["mirror"] == "/elsewhere"
    monkeypatch.delenv("NMT_DATA_MIRROR")
    assert OmegaConf.to_container(OmegaConf.load(config), resolve=True)["data"]["mirror"] is None


def test_a_workdir_moved_since_its_runs_were_written_is_made_portable(tmp_path: Path) -> None:
    """The roots come from each results.json's run_dir, so a cloned workdir is rewritten as well."""
    run = tmp_path / "runs" / "study_dot_de-en" / "seed42"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"run_dir": "/gone/study/runs/study_dot_de-en/seed42"}))
    (run / "train.log").write_text("reusing cached SentencePiece model(s) /gone/study/data/spm/a.model\n")
    (run / "translations").mkdir()
    (run / "translations" / "test.en").write_text("/gone/study stays: a translation is never touched\n")
    assert leftover_paths(tmp_path)
    assert sorted(make_portable(tmp_path)) == [run / "results.json", run / "train.log"]
    assert leftover_paths(tmp_path) == {} and make_portable(tmp_path) == []
    assert (run / "train.log").read_text() == "reusing cached SentencePiece model(s) data/spm/a.model\n"
    assert (run / "translations" / "test.en").read_text().startswith("/gone/study")


def test_a_chain_call_leaves_its_workdir_portable(fake_repo: Path, tmp_path: Path) -> None:  # noqa: F811
    workdir = tmp_path / "work"
    workdir.mkdir()
    command.main(["recipe=bt_best", f"workdir={workdir}", "device=cpu"], fake_repo)
    assert leftover_paths(workdir) == {}
    first = (workdir / "runs" / ".reproduce" / "logs" / "base_de-en_seed42.log").read_text().splitlines()[0]
    assert first.startswith("$ python train.py experiment=multi30k_best ")
    assert "hydra.run.dir=runs/best_de-en/seed42" in first


def committed(paths: dict[Path, list[str]]) -> dict[Path, list[str]]:
    """The files of ``paths`` that git tracks, as staged: a chain running in a checkout has files it has not made
    portable yet (a stopped training's log, a kept run it trains again), which are not kept until staged and
    committed. Outside git, all of them."""
    listed = subprocess.run(["git", "ls-files", "-z", "studies"], cwd=REPO_ROOT, capture_output=True)
    changed = subprocess.run(["git", "diff", "--name-only", "-z", "studies"], cwd=REPO_ROOT, capture_output=True)
    if listed.returncode != 0 or changed.returncode != 0:
        return paths
    tracked = {REPO_ROOT / name for name in listed.stdout.decode().split("\0") if name}
    running = {REPO_ROOT / name for name in changed.stdout.decode().split("\0") if name}  # changed, not staged
    return {path: hits for path, hits in paths.items() if path in tracked - running}


@pytest.mark.parametrize("kept", sorted(p.name for p in (REPO_ROOT / "studies").iterdir() if p.is_dir()))
def test_the_kept_workdirs_name_no_machines_folders(kept: str) -> None:
    assert committed(leftover_paths(REPO_ROOT / "studies" / kept)) == {}
