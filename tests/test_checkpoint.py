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


# ---------------------------------------------------------------- a kill at any write of a validation's checkpoints
class Killed(BaseException):
    """A kill -9 stand-in: nothing catches it, so nothing after it is written."""


def folder_changes(monkeypatch: pytest.MonkeyPatch, changes: list[str], kill_before: int | None = None) -> None:
    """Record each change a run makes to its checkpoints (``best.pt`` written, ``-val_step...pt`` dropped) in
    ``changes``; with ``kill_before``, the run is killed just before change number ``kill_before`` (0-based)."""
    save, unlink = checkpoint.save_checkpoint, Path.unlink

    def change(name: str) -> None:
        if len(changes) == kill_before:
            raise Killed(name)
        changes.append(name)

    def save_checkpoint_(path: Path, state: dict) -> Path:
        change(Path(path).name)
        return save(path, state)

    def unlink_(path: Path, missing_ok: bool = False) -> None:
        if path.name.startswith("val_step"):
            change(f"-{path.name}")
        unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(checkpoint, "save_checkpoint", save_checkpoint_)
    monkeypatch.setattr(Path, "unlink", unlink_)


def kept_weights(run_dir: Path) -> dict[str, dict[str, torch.Tensor]]:
    return {p.name: load_checkpoint(p)["model"] for p in sorted((run_dir / "checkpoints").glob("val_step*.pt"))}


def test_a_kill_at_any_write_of_a_validation_resumes_to_the_same_kept_checkpoints(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed before each write (and the drop of the oldest averaging copy) of the validation at step 12, then
    resumed: the same kept checkpoints, so the same averaged model, log and validations as the uninterrupted run."""
    from nmt.train.trainer import train
    from tests.test_training import tiny_config

    cfg = tiny_config(tmp_path, ["trainer.max_steps=16", "trainer.validate_every=4", "trainer.average_last=2",
                                 "trainer.log_every=1", "trainer.test_beam_size=1", "trainer.num_heatmaps=0"])
    changes: list[str] = []
    with monkeypatch.context() as patch:
        folder_changes(patch, changes)
        straight = train(cfg, run_dir=tmp_path / "straight")
    first, after = changes.index("val_step00000012.pt"), changes.index("val_step00000016.pt")
    assert changes[first:after] == ["val_step00000012.pt", "last.pt", "-val_step00000004.pt"] or \
        changes[first:after] == ["val_step00000012.pt", "best.pt", "last.pt", "-val_step00000004.pt"], changes
    for kill_before in range(first, after + 1):  # the last: every change of step 12 made, step 16's not begun
        run_dir = tmp_path / f"killed_before_{kill_before}"
        with monkeypatch.context() as patch, pytest.raises(Killed):
            folder_changes(patch, [], kill_before)
            train(cfg, run_dir=run_dir)
        resume_cfg = cfg.copy()
        resume_cfg.trainer.resume = str(run_dir)
        resumed = train(resume_cfg)
        kept, expected = kept_weights(run_dir), kept_weights(tmp_path / "straight")
        assert list(kept) == list(expected) == ["val_step00000012.pt", "val_step00000016.pt"], (kill_before, kept)
        assert all(torch.equal(kept[name][k], expected[name][k]) for name in kept for k in kept[name])
        assert resumed["averaged"]["test"]["test"]["bleu"] == straight["averaged"]["test"]["test"]["bleu"]
        assert [(v["step"], v["bleu"]) for v in resumed["validations"]] == \
            [(v["step"], v["bleu"]) for v in straight["validations"]]
        assert (run_dir / "train_log.jsonl").read_text() == (tmp_path / "straight" / "train_log.jsonl").read_text()
