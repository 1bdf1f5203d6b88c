"""nmt.model.checkpoint: writes are atomic and durable (nmt.common.files), and a failed write keeps the old one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt.common import files
from nmt.model import checkpoint
from nmt.model.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from tests.conftest import REPO_ROOT


def test_a_checkpoint_is_on_disk_before_it_replaces_the_old_one(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(files.os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(files.os, "replace", lambda a, b: (events.append("replace"), real_replace(a, b))[1])
    path = save_checkpoint(tmp_path / "checkpoints" / "last.pt", {"progress": {"step": 3}})
    assert events == ["fsync", "replace", "fsync"]  # file data, then the rename, then the folder entry
    assert load_checkpoint(path)["progress"] == {"step": 3}
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]


def test_a_failed_write_keeps_the_previous_checkpoint_and_no_temp_file(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    path = save_checkpoint(tmp_path / "last.pt", {"progress": {"step": 1}})

    def disk_full(obj: object, handle: object) -> None:
        handle.write(b"half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(path, {"progress": {"step": 2}})
    assert load_checkpoint(path)["progress"] == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_a_truncated_file_is_refused_by_name(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path / "best.pt", {"model": {"w": torch.ones(1000)}})
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="cannot read checkpoint .*best.pt"):
        load_checkpoint(path)


class _NotAPlainValue:
    pass


def _garbage(tmp_path: Path) -> Path:
    path = tmp_path / "garbage.pt"
    path.write_bytes(bytes(range(256)) * 20)
    return path


def _foreign_pickle(tmp_path: Path) -> Path:
    path = tmp_path / "foreign.pt"
    torch.save({"model": _NotAPlainValue()}, path)
    return path


@pytest.mark.parametrize("make, reason", [(_garbage, "it is not the zip archive torch.save writes"),
                                           (_foreign_pickle, "it holds Python objects besides tensors")])
def test_translate_py_refuses_a_file_that_is_not_a_checkpoint_in_one_line_of_ours(
        tmp_path: Path, make, reason: str) -> None:
    path = make(tmp_path)
    done = subprocess.run([sys.executable, str(REPO_ROOT / "translate.py"), f"checkpoint={path}"], input="Hallo\n",
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and f"cannot read checkpoint {path}: {reason}" in done.stderr
    assert "weights_only" not in done.stderr and "Traceback" not in done.stderr


def test_a_detached_copy_is_a_snapshot_training_cannot_change() -> None:
    """The trainer writes checkpoints in the background from ``detached_copy``: steps taken meanwhile, in place,
    must not reach the file."""
    from nmt.model.checkpoint import detached_copy

    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([weight], lr=0.1)
    weight.grad = torch.ones(3)
    optimizer.step()
    state = {"model": {"w": weight}, "optimizer": optimizer.state_dict(), "progress": {"step": 1}, "tag": b"x"}
    copy = detached_copy(state)
    saved_weight, saved_moment = copy["model"]["w"].clone(), copy["optimizer"]["state"][0]["exp_avg"].clone()
    optimizer.step()  # training goes on, in place
    assert torch.equal(copy["model"]["w"], saved_weight) and not torch.equal(weight.detach(), saved_weight)
    assert torch.equal(copy["optimizer"]["state"][0]["exp_avg"], saved_moment)
    assert not copy["model"]["w"].requires_grad and copy["progress"] == {"step": 1} and copy["tag"] == b"x"
    assert copy["optimizer"]["param_groups"][0]["lr"] == 0.1
