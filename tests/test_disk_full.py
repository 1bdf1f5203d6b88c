"""A full disk, or a place to write that cannot be made: one line, the documented exit status (2 before any work,
74 mid-job), no half-written file, and a training run that resumes to the same result once space is back.

The full disk is injected: a file object that raises ENOSPC after a budget of bytes (in-process), or a file-size
limit (``RLIMIT_FSIZE``: writes past it fail with EFBIG, like a quota) for the commands run as processes.
"""

from __future__ import annotations

import builtins
import errno
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import nmt.common.files
from nmt.chain import command as reproduce
from nmt.common.disk import EXIT_WRITE_STOPPED, PathNotWritable, WriteStopped, check_writable
from nmt.common.files import write_durably
from nmt.model.checkpoint import load_checkpoint
from nmt.train.trainer import train
from tests.conftest import REPO_ROOT
from tests.test_reproduce import fake_repo  # noqa: F401  # a fixture: stand-ins for the chain's commands
from tests.test_training import tiny_config

SOURCE = "ein Hund läuft über die Straße\n"


class FullDiskFile:
    """A file that takes ``budget`` bytes, then fails as a full disk does."""

    def __init__(self, handle: Any, budget: int) -> None:
        self.handle, self.budget = handle, budget

    def write(self, data: Any) -> int:
        self.budget -= len(data)
        if self.budget < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.handle.write(data)

    def __enter__(self) -> FullDiskFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)


def fill_disk_after(monkeypatch: pytest.MonkeyPatch, files_ok: int, budget: int) -> None:
    """Durable writes (``nmt.common.files``) after the first ``files_ok`` find a disk with ``budget`` bytes left."""
    opened = []

    def open_(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = builtins.open(path, mode, *args, **kwargs)
        if "w" not in mode:  # the lock, the fsync before a rename
            return handle
        opened.append(path)
        return FullDiskFile(handle, budget) if len(opened) > files_ok else handle

    monkeypatch.setattr(nmt.common.files, "open", open_, raising=False)


def run(script: str, *args: str, cwd: Path, max_file_bytes: int | None = None,
        stdout: Any = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    """``python SCRIPT ARGS``; with ``max_file_bytes`` no file it writes may grow past that (EFBIG)."""
    def limit() -> None:
        if max_file_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))

    return subprocess.run([sys.executable, str(REPO_ROOT / script), *args], cwd=cwd, text=True, stdout=stdout,
                          stderr=subprocess.PIPE, timeout=300, preexec_fn=limit,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)})  # scripts/ too


def assert_one_line(proc: subprocess.CompletedProcess[str], program: str, status: int, *expected: str) -> None:
    """Exit ``status``, no traceback, and one error line, the last on stderr (after the job's log lines, if any)."""
    assert proc.returncode == status, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    errors = [line for line in lines if line.startswith(f"{program}: error: ")]
    assert "Traceback" not in proc.stderr and errors == lines[-1:], proc.stderr[-3000:]
    for text in expected:
        assert text in lines[-1], lines[-1]


def leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp") or p.name.endswith(".partial")]


# ------------------------------------------------------------------------------ Places that cannot be made
def test_check_writable_refuses_paths_under_a_file_and_under_proc(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("")
    with pytest.raises(PathNotWritable, match=r"^out=.*a_file/x cannot be created: .*a_file is a file, not a folder"):
        check_writable(tmp_path / "a_file" / "x", "out", folder=True)
    with pytest.raises(PathNotWritable, match=r"^workdir=/proc/nmt_nope/x cannot be created: no folder can be made "
                                              r"in /proc \(.*\); choose another path$"):
        check_writable("/proc/nmt_nope/x", "workdir", folder=True)
    check_writable(tmp_path / "new" / "deeper", "out", folder=True)
    assert not (tmp_path / "new").exists()  # the probe leaves nothing behind


@pytest.mark.parametrize(("script", "args"), [
    ("train.py", ["hydra.run.dir={file}/run"]),
    ("translate.py", ["checkpoint={run}", "output=/proc/nmt_nope/out.txt"]),
    ("backtranslate.py", ["checkpoint={run}", "input=in.de", "lang=de", "output={file}/bt"]),
    ("export.py", ["checkpoint={run}", "output=/proc/nmt_nope"]),
    ("serve.py", ["checkpoint={run}", "hydra.run.dir={file}/x"]),
    ("reproduce.py", ["recipe=tiny", "workdir=/proc/nmt_nope"]),
])
def test_an_uncreatable_output_is_one_line_and_exit_2_before_any_work(
        script: str, args: list[str], tiny_run_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "in.de").write_text(SOURCE)
    (tmp_path / "a_file").write_text("")
    args = [a.format(file=tmp_path / "a_file", run=tiny_run_dir) for a in args]
    proc = run(script, *args, cwd=tmp_path)
    key, path = args[-1].split("=", 1)
    assert_one_line(proc, script, 2, f"{key}={path} cannot be created", "choose another path")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "in.de"] and proc.stdout == ""  # no plan either


@pytest.mark.parametrize(("args", "refused"), [
    ([], "hydra.run.dir=outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}_${attention.name} cannot be made: outputs is a file"),
    (["experiment=multi30k_bt"], "hydra.run.dir=runs/bt_best_${data.src_lang}-${data.tgt_lang}/seed${trainer.seed} "
                                 "cannot be made: runs is a file"),  # an experiment's own run dir
    (["-m", "experiment=multi30k_best", "trainer.seed=1,2"], "hydra.sweep.dir=runs/best_${data.src_lang}-"
                                                             "${data.tgt_lang} cannot be made: runs is a file"),
    (["hydra.run.dir=/proc/nmt_nope/${now:%H}"], "hydra.run.dir=/proc/nmt_nope/${now:%H} cannot be made: "
                                                 "/proc/nmt_nope cannot be created: no folder can be made in /proc"),
])
def test_train_py_checks_its_default_run_dir_before_hydra_makes_it(args: list[str], refused: str,
                                                                   tmp_path: Path) -> None:
    for name in ("outputs", "runs"):
        (tmp_path / name).write_text("")
    proc = run("train.py", *args, cwd=tmp_path)
    key = refused.split("=", 1)[0]
    assert_one_line(proc, "train.py", 2, refused, f"(pass {key}=DIR)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs", "runs"] and proc.stdout == ""


@pytest.mark.parametrize(("script", "args"), [
    ("scripts/benchmark.py", ["translate", "--checkpoint", "{run}", "--out", "{file}/bench"]),
    ("scripts/compare_runs.py", ["{run}", "--out", "/proc/nmt_nope/cmp"]),
    ("scripts/export_speed.py", ["--run", "{run}", "--out", "{file}/speed"]),
    ("scripts/gpu_check.py", ["--out", "/proc/nmt_nope"]),
    ("scripts/peer_compare.py", ["--skip-peer-run", "peer", "--out", "r", "--work-dir", "{file}/work"]),
    ("scripts/peer_compare.py", ["time-to-bleu", "--ours", "{run}", "--peer-workdir", "peer", "--out", "{file}/t"]),
    ("scripts/tune_decoding.py", ["{run}", "--out", "{file}/grid"]),
])
def test_a_script_refuses_an_uncreatable_output_in_one_line_before_any_work(
        script: str, args: list[str], tiny_run_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("")
    args = [a.format(file=tmp_path / "a_file", run=tiny_run_dir) for a in args]
    proc = run(script, *args, cwd=tmp_path)
    option, path = args[-2:]
    assert_one_line(proc, Path(script).name + (" time-to-bleu" if "time-to-bleu" in args else ""), 2,
                    f"{option}={path}", "cannot be created", "choose another path")
    assert [p.name for p in tmp_path.iterdir()] == ["a_file"] and proc.stdout == ""


def test_benchmark_py_without_a_place_for_its_report_stops_before_measuring(tiny_run_dir: Path,
                                                                           tmp_path: Path) -> None:
    proc = run("scripts/benchmark.py", "translate", "--checkpoint", str(tiny_run_dir), str(tiny_run_dir),
               cwd=tmp_path)  # an ensemble has no one run dir for the report
    assert_one_line(proc, "benchmark.py translate", 2, "pass --out PATH (without extension)")
    assert proc.stdout == ""


# ------------------------------------------------------------------------------ A disk that fills mid-job
def test_a_durable_write_that_fills_the_disk_keeps_the_old_file_and_names_it(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "last.pt"
    target.write_bytes(b"old")
    fill_disk_after(monkeypatch, files_ok=0, budget=1000)
    with pytest.raises(OSError) as raised:  # torch.save's own "unexpected pos" RuntimeError, unwrapped
        write_durably(target, lambda handle: torch.save({"w": torch.zeros(10_000)}, handle))
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(target)
    assert target.read_bytes() == b"old" and list(tmp_path.iterdir()) == [target]  # no temp file


@pytest.mark.slow
def test_training_on_a_full_disk_keeps_its_checkpoints_and_resumes_to_the_same_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tiny_config(tmp_path, ["trainer.max_steps=24", "trainer.validate_every=8", "trainer.log_every=1",
                                 "trainer.test_beam_size=1"])
    train(cfg, run_dir=tmp_path / "straight")
    run_dir = tmp_path / "full"
    with monkeypatch.context() as patch:
        fill_disk_after(patch, files_ok=3, budget=50_000)  # config.yaml, step 8's best.pt and last.pt fit
        with pytest.raises(WriteStopped) as raised:
            train(cfg, run_dir=run_dir)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"could not write {run_dir}/checkpoints/")
    assert "No space left on device" in message and " free of " in message
    assert "kept: checkpoints/last.pt (step 8, where the run resumes) and best.pt (step 8)" in message
    assert message.endswith(f"go on with: python train.py trainer.resume={run_dir}")
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["progress"]["step"] == 8
    assert leftovers(run_dir) == []
    resume_cfg = cfg.copy()
    resume_cfg.trainer.resume = str(run_dir)
    train(resume_cfg)
    assert (run_dir / "train_log.jsonl").read_text() == (tmp_path / "straight" / "train_log.jsonl").read_text()


@pytest.mark.parametrize(("error", "reason"), [(errno.EACCES, "Permission denied"),
                                               (errno.EPERM, "Operation not permitted"),  # chattr +i
                                               (errno.EIO, "Input/output error")])
def test_a_failed_checkpoint_write_stops_training_at_once_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: int, reason: str) -> None:
    """The validation at step 16 cannot write its checkpoint (on the writer thread, while training goes on): the
    run stops within a step or two, not at the next validation, naming the file and the cause; nothing half-written,
    and step 8's checkpoints stand."""
    cfg = tiny_config(tmp_path, ["trainer.max_steps=40", "trainer.validate_every=8", "trainer.log_every=1",
                                 "trainer.test_beam_size=1"])
    run_dir = tmp_path / "run"
    opened = []

    def open_(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if "w" in mode and Path(path).parent.name == "checkpoints":
            opened.append(path)
            if len(opened) > 2:  # step 8's best.pt and last.pt are written
                raise OSError(error, os.strerror(error), str(path))
        return builtins.open(path, mode, *args, **kwargs)

    monkeypatch.setattr(nmt.common.files, "open", open_, raising=False)
    with pytest.raises(WriteStopped) as raised:
        train(cfg, run_dir=run_dir)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"could not write {run_dir}/checkpoints/")
    fix = "check the disk" if error == errno.EIO else "make its folder writable"
    assert f".pt: {reason}; kept: checkpoints/last.pt (step 8, where the run resumes) and best.pt (step 8); {fix}" \
        in message
    assert message.endswith(f"then go on with: python train.py trainer.resume={run_dir}")
    logged = [json.loads(line)["step"] for line in (run_dir / "train_log.jsonl").read_text().splitlines()]
    assert 16 <= max(logged) < 24, max(logged)  # surfaced at once: the validation at step 24 never started
    assert leftovers(run_dir) == []


def tiny_train_py_args(tmp_path: Path) -> list[str]:
    """``train.py``'s command line for a 4-step run of the tiny task in ``tmp_path/run`` (validating at step 2)."""
    cfg = tiny_config(tmp_path, [])
    files = ", ".join(f"{split}: {{src: '{sides.src}', tgt: '{sides.tgt}'}}" for split, sides in cfg.data.files.items())
    return ["data=files", f"data.files={{{files}}}", f"data.cache_dir={tmp_path}/cache", "model.emb_size=32",
            "model.enc_hidden_size=32", "model.dec_hidden_size=64", "data.tokenizer.vocab_size=20",
            "data.tokenizer.model_type=bpe", "trainer.max_steps=4", "trainer.validate_every=2",
            f"hydra.run.dir={tmp_path}/run"]


def test_train_py_with_an_immutable_checkpoint_folder_is_one_line_and_exit_74(tmp_path: Path) -> None:
    """``chattr +i`` on ``checkpoints/``: even root cannot write there; the first checkpoint fails on the writer
    thread, and train.py says so in one line, with the fix, not in a traceback."""
    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(checkpoints)],
                                                        capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here (not root, or a file system without it)")
    try:
        proc = run("train.py", *tiny_train_py_args(tmp_path), cwd=tmp_path)
    finally:
        subprocess.run(["chattr", "-i", str(checkpoints)], check=True)
    assert_one_line(proc, "train.py", EXIT_WRITE_STOPPED, f"could not write {checkpoints}/best.pt: Operation not "
                    "permitted; no checkpoint was written yet; make its folder writable",
                    "go on with: python train.py data=files")
    assert leftovers(tmp_path / "run") == []


def test_train_py_on_a_full_disk_is_one_line_and_exit_74(tmp_path: Path) -> None:
    args = tiny_train_py_args(tmp_path)
    proc = run("train.py", *args, cwd=tmp_path, max_file_bytes=300_000)  # the first checkpoint does not fit
    assert_one_line(proc, "train.py", EXIT_WRITE_STOPPED, f"could not write {tmp_path}/run/checkpoints/",
                    "File too large", "no checkpoint was written yet", "go on with: python train.py data=files")
    assert leftovers(tmp_path / "run") == []


def test_train_py_with_its_log_file_or_hydra_config_on_a_full_disk_prints_the_one_line_alone(tmp_path: Path) -> None:
    args = tiny_train_py_args(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train.log").symlink_to("/dev/full")  # every line Hydra's file handler writes: ENOSPC
    proc = run("train.py", *args, cwd=tmp_path, max_file_bytes=300_000)  # and the first checkpoint does not fit
    assert_one_line(proc, "train.py", EXIT_WRITE_STOPPED, "File too large", "go on with: python train.py data=files")
    assert "Logging error" not in proc.stderr, proc.stderr[-3000:]
    args[-1] = f"hydra.run.dir={tmp_path}/full"
    proc = run("train.py", *args, cwd=tmp_path, max_file_bytes=1)  # not even .hydra/config.yaml fits
    assert_one_line(proc, "train.py", EXIT_WRITE_STOPPED, f"could not write {tmp_path}/full/.hydra/config.yaml: File "
                    "too large", "no checkpoint was written yet", "go on with: python train.py data=files")
    assert proc.stderr.count("\n") == 1


def test_translate_py_keeps_the_old_output_and_reports_a_cut_stdout(tiny_run_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "in.de").write_text(SOURCE * 400)
    (tmp_path / "out.en").write_text("old\n")
    args = [f"checkpoint={tiny_run_dir}", "input=in.de", "max_len=20", "progress=false"]
    proc = run("translate.py", *args, "output=out.en", cwd=tmp_path, max_file_bytes=4096)
    assert_one_line(proc, "translate.py", EXIT_WRITE_STOPPED, "could not write out.en: File too large",
                    "output= keeps its previous contents", "go on with: python translate.py checkpoint=")
    assert (tmp_path / "out.en").read_text() == "old\n" and leftovers(tmp_path) == []
    with open("/dev/full", "w") as full:  # stdout on a full disk: ENOSPC
        proc = run("translate.py", *args, cwd=tmp_path, stdout=full)
    assert_one_line(proc, "translate.py", EXIT_WRITE_STOPPED, "could not write stdout: No space left on device",
                    "of 400 lines got out", "pass output=FILE")


def test_backtranslate_py_on_a_full_disk_resumes_to_whole_files(tiny_run_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "in.de").write_text("".join(f"ein Hund {i}\n" for i in range(2000)))
    args = [f"checkpoint={tiny_run_dir}", "input=in.de", "lang=de", "output=bt", "chunk_lines=500", "max_len=3"]
    proc = run("backtranslate.py", *args, cwd=tmp_path, max_file_bytes=12_000)
    assert_one_line(proc, "backtranslate.py", EXIT_WRITE_STOPPED, "could not write bt: File too large",
                    "output= keeps the whole chunks provenance.json records", "go on with: python backtranslate.py")
    assert run("backtranslate.py", *args, cwd=tmp_path).returncode == 0
    assert [len((tmp_path / "bt" / f"train.{lang}").read_text().splitlines()) for lang in ("de", "en")] == [2000] * 2


def test_export_py_on_a_full_disk_leaves_no_folder(tiny_run_dir: Path, tmp_path: Path) -> None:
    proc = run("export.py", f"checkpoint={tiny_run_dir}", "output=exp", "format=hub", cwd=tmp_path,
               max_file_bytes=10_000)
    assert_one_line(proc, "export.py", EXIT_WRITE_STOPPED, "File too large", "output= was not made",
                    "go on with: python export.py")
    assert list(tmp_path.iterdir()) == []


def test_a_chain_stage_out_of_space_stops_the_chain_with_exit_74(fake_repo: Path, tmp_path: Path) -> None:  # noqa: F811
    (fake_repo / "train.py").write_text(f"raise SystemExit({EXIT_WRITE_STOPPED})\n")
    with pytest.raises(WriteStopped, match=r"stage 'base.*' ran out of disk space \(.* free of .*; exit 74\); its "
                                           r"log: .*; run the same command again to resume"):
        reproduce.main(["recipe=tiny", f"workdir={tmp_path / 'work'}", "device=cpu"], fake_repo)


def test_a_script_on_a_full_disk_is_one_line_and_exit_74_without_a_half_written_report(tiny_run_dir: Path,
                                                                                      tmp_path: Path) -> None:
    (tmp_path / "in.de").write_text(SOURCE * 2)
    (tmp_path / "bench.json").write_text("{}\n")
    args = ["translate", "--checkpoint", str(tiny_run_dir), "--input", "in.de", "--beam-sizes", "1", "--reps", "1",
            "--device", "cpu", "--out", "bench"]
    proc = run("scripts/benchmark.py", *args, cwd=tmp_path, max_file_bytes=200)  # the report is longer
    assert_one_line(proc, "benchmark.py", EXIT_WRITE_STOPPED, "could not write bench.json: File too large",
                    "every report is written whole or not at all", "go on with: python ")
    assert (tmp_path / "bench.json").read_text() == "{}\n" and leftovers(tmp_path) == []
