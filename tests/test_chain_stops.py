"""nmt.chain stopped and handed bad workdirs: a SIGTERM or SIGKILL to reproduce.py mid-stage, then the command it
printed (or the same one) finishes with every run once; a SIGTERM to gpu_check.py reaches its training; a stage's
time summed over the calls that ran it; another study's workdir or a partial kept run refused in one line."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from nmt.chain import clock as chain_clock
from nmt.chain import command
from nmt.chain.clock import Clock
from nmt.chain.settings import ChainError
from tests.test_reproduce import REPO_ROOT, calls, fake_repo  # noqa: F401  # fake_repo: the chain's stand-ins

HUNG = "additive de-en seed42"  # the study's second training: the one a test stops
RUN = Path("runs") / "study_additive_de-en" / "seed42"


def study_args(workdir: Path) -> list[str]:
    return ["recipe=attention_study", "device=cpu", "parallel=1", f"workdir={workdir}"]


def start_chain(repo: Path, args: list[str], **env: str) -> subprocess.Popen:
    """reproduce.py (the real entry point, beside the stand-ins) as its own process."""
    shutil.copy(REPO_ROOT / "reproduce.py", repo / "reproduce.py")
    environment = {**{k: v for k, v in os.environ.items() if k != "FAKE_HANG"}, "PYTHONPATH": str(REPO_ROOT), **env}
    return subprocess.Popen([sys.executable, str(repo / "reproduce.py"), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=environment)


def wait_for(check, seconds: float = 60.0) -> None:
    ends = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < ends, "timed out"
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def process_state(pid: int) -> str:
    """The state letter of /proc/PID/stat: R, S, T (stopped), Z; '' when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return ""


def hang_and_note_pids(repo: Path) -> None:
    """The training stand-in writes its pid to ./pids first (the tests look for orphans)."""
    train = repo / "train.py"
    train.write_text("import os\nopen('pids', 'a').write(f'{os.getpid()}\\n')\n" + train.read_text())


def stop_mid_stage(repo: Path, workdir: Path, how: signal.Signals) -> tuple[subprocess.Popen, str]:
    """The study started in its own reproduce.py, sent ``how`` once its second training runs: the process ended,
    and what it printed."""
    workdir.mkdir()
    hang_and_note_pids(repo)
    chain = start_chain(repo, study_args(workdir), FAKE_HANG=HUNG)
    wait_for((workdir / "hung").exists)
    time.sleep(2.0)  # a stretch of its time that the resumed stage must add to its own
    chain.send_signal(how)
    out, err = chain.communicate(timeout=120)
    return chain, out + err


def finished_once(workdir: Path) -> None:
    """Every stage ran once to its end, the stopped one twice (resumed from its last.pt), and the report holds
    every training's scores."""
    names = [stage for stage, _ in calls(workdir)]
    assert names.count(HUNG) == 2 and len(names) == 38 and len(set(names)) == 37
    assert calls(workdir)[names.index(HUNG, 2)][1] == [f"trainer.resume={workdir / RUN}"]
    report = json.loads((workdir / "runs" / "reproduce_attention_study.json").read_text())
    assert len(report["runs"]) == 36 and {(r["val_bleu"], r["test_bleu"]) for r in report["runs"]} == {(40.0, 41.0)}


@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_every_stage_and_the_printed_command_goes_on(how: signal.Signals, fake_repo: Path,  # noqa: F811
                                                                     tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    chain, out = stop_mid_stage(fake_repo, workdir, how)
    assert chain.returncode == 128 + how, out
    assert f"reproduce.py: stop  {HUNG}: stopped by {how.name} (SIGTERM: a training saves" in out
    assert f"reproduce.py: stopped by {how.name}: 1 of 37 stages complete, 36 left" in out
    assert (workdir / RUN / "checkpoints" / "last.pt").read_text() == "saved at SIGTERM"
    assert not any(alive(int(pid)) for pid in (workdir / "pids").read_text().split())  # nothing left running
    state = workdir / "runs" / ".reproduce"
    ran_before = json.loads((state / "spent.json").read_text())[HUNG]  # the stopped stage's time is kept
    go_on = shlex.split(next(line for line in out.splitlines() if "go on with: " in line)
                        .split("go on with: ")[1].split("  (elsewhere")[0])
    assert go_on[:2] == ["python", "reproduce.py"]
    again = start_chain(fake_repo, go_on[2:])  # right away
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    finished_once(workdir)
    additive = json.loads((state / "times.json").read_text())["additive"]  # six runs: one per seed and direction
    assert len(additive) == 6 and ran_before >= 2.0 and json.loads((state / "spent.json").read_text()) == {}
    assert [t > ran_before for t in additive].count(True) == 1  # the stopped one: both calls' time, summed


def test_ctrl_z_pauses_the_stage_with_the_chain_and_fg_continues_both(fake_repo: Path,  # noqa: F811
                                                                      tmp_path: Path) -> None:
    # The stage runs in a process group of its own, which job control's SIGTSTP and SIGCONT do not reach.
    workdir = tmp_path / "work"
    workdir.mkdir()
    hang_and_note_pids(fake_repo)
    chain = start_chain(fake_repo, study_args(workdir), FAKE_HANG=HUNG)
    wait_for((workdir / "hung").exists)
    stage = int((workdir / "pids").read_text().split()[-1])
    chain.send_signal(signal.SIGTSTP)
    wait_for(lambda: process_state(chain.pid) == "T" and process_state(stage) == "T", 10)
    chain.send_signal(signal.SIGCONT)
    wait_for(lambda: process_state(chain.pid) in ("R", "S") and process_state(stage) in ("R", "S"), 10)
    chain.send_signal(signal.SIGTERM)
    out, err = chain.communicate(timeout=60)
    assert chain.returncode == 128 + signal.SIGTERM and f"stop  {HUNG}: stopped by SIGTERM" in out, out + err
    assert (workdir / RUN / "checkpoints" / "last.pt").read_text() == "saved at SIGTERM"


@pytest.mark.slow
def test_after_a_sigkill_the_stage_saves_and_a_rerun_takes_over(fake_repo: Path, tmp_path: Path) -> None:  # noqa: F811
    workdir = tmp_path / "work"
    chain, _ = stop_mid_stage(fake_repo, workdir, signal.SIGKILL)
    stage = int((workdir / "pids").read_text().split()[-1])
    wait_for(lambda: not alive(stage), 20.0)  # told by its dying parent (PR_SET_PDEATHSIG), not left to run on
    assert (workdir / RUN / "checkpoints" / "last.pt").read_text() == "saved at SIGTERM"
    again = start_chain(fake_repo, study_args(workdir))
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    took_over = [line for line in err.splitlines() if "taking over the lock" in line]
    assert len(took_over) == 1 and f"reproduce.py (pid {chain.pid})" in took_over[0]
    assert not any(alive(int(pid)) for pid in (workdir / "pids").read_text().split())
    finished_once(workdir)


GPU_CHECK_TRAIN = r'''
import os, signal, sys, time
from pathlib import Path
Path("train.pid").write_text(str(os.getpid()))
def saved(*_):
    Path("saved").write_text("at SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, saved)
time.sleep(60)
'''


def test_sigterm_to_gpu_check_reaches_its_training(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(GPU_CHECK_TRAIN)
    out = tmp_path / "check"
    check = subprocess.Popen([sys.executable, str(REPO_ROOT / "scripts" / "gpu_check.py"), "--out", str(out),
                              "--parts", "precision", "--project-dir", str(project)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    wait_for((project / "train.pid").exists)
    time.sleep(0.3)  # its SIGTERM handler installed
    check.send_signal(signal.SIGTERM)
    _, err = check.communicate(timeout=60)
    assert check.returncode == 128 + signal.SIGTERM, err
    assert (project / "saved").read_text() == "at SIGTERM"
    assert not alive(int((project / "train.pid").read_text()))
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["precision"]["stopped"].startswith("stopped by SIGTERM: its command saved and exited")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the check of a machine without CUDA")
def test_the_device_run_without_cuda_is_one_line_before_any_work(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path / "OUT"), "PYTHON": sys.executable, "PYTHONPATH": str(REPO_ROOT),
           "GPU_CHECK_WORK": str(tmp_path / "work")}
    done = subprocess.run(["bash", "scripts/gpu_device_run.sh"], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "needs a CUDA device" in done.stderr and not (tmp_path / "work" / "gpu_check.json").exists()


def test_a_stage_time_is_summed_over_the_calls_that_ran_it(tmp_path: Path) -> None:
    clock = Clock(tmp_path / "times.json", {"additive": 10})  # a guess of 600 s
    clock.stopped("additive de-en seed42", 65.0)  # a budget stopped it after 65 s
    assert clock.remaining("additive de-en seed42", "additive") == 535.0  # what a budget must still hold
    assert clock.finished("additive de-en seed42", "additive", 308.0) == 373.0  # the resumed call's 308 s, and 65
    again = Clock(tmp_path / "times.json", {})
    assert again.times == {"additive": [373.0]} and again.spent == {}
    assert again.remaining("additive de-en seed42", "additive") == 373.0


def test_a_stopped_training_needs_the_part_of_its_estimate_its_steps_leave(tmp_path: Path) -> None:
    """bt_best's first bt training was stopped at step 4,107 of 4,920 after 9,581 s on a loaded machine, against
    an estimate of 9,000 s: the next call said it had "about 0s" left. What is left follows the steps left."""
    from tests.test_disk_full import tiny_train_py_args

    done = subprocess.run([sys.executable, str(REPO_ROOT / "train.py"), *tiny_train_py_args(tmp_path)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stderr
    run = tmp_path / "run"
    assert chain_clock.training_fraction(run) == 1.0  # train.py's own files: 4 steps of 4 planned
    steps = (run / "train_log.jsonl").read_text().splitlines(keepends=True)
    (run / "train_log.jsonl").write_text("".join(steps[:3]) + steps[3][:9])  # stopped after step 3, cut mid-line
    assert chain_clock.training_fraction(run) is None  # a cut line tells nothing
    (run / "train_log.jsonl").write_text("".join(steps[:3]))
    assert chain_clock.training_fraction(run) == 0.75
    assert chain_clock.training_fraction(tmp_path / "not run") is None

    clock = Clock(tmp_path / "times.json", {"bt": 150})  # 9,000 s
    clock.stopped("bt de-en seed42", 9581.0)
    assert clock.remaining("bt de-en seed42", "bt") == 0.0  # by time spent alone
    clock.note_progress({"bt de-en seed42": chain_clock.training_fraction(run), "bt de-en seed43": None})
    assert clock.remaining("bt de-en seed42", "bt") == 2250.0  # a quarter of 9,000 s
    assert clock.remaining("bt de-en seed43", "bt") == 9000.0


def test_time_the_chain_was_stopped_is_no_stage_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the run loop looks every 0.05 s; between 0.1 and 900.1 the chain's process group was SIGSTOPped
    moments = iter([0.0, 0.05, 0.1, 900.1, 900.15, 900.2])
    monkeypatch.setattr(chain_clock, "monotonic", lambda: next(moments))
    clock = Clock(tmp_path / "times.json", {})
    began = clock.now()
    for _ in range(3):
        clock.now()
    assert clock.finished("none de-en seed42", "none", clock.now() - began) == pytest.approx(0.15)
    assert chain_clock.monotonic() == 900.2  # budgets and deadlines stay on the wall clock: a pause spends them


def test_another_study_or_other_settings_in_a_workdir_are_one_line(fake_repo: Path, tmp_path: Path) -> None:  # noqa: F811
    workdir = tmp_path / "work"
    workdir.mkdir()
    command.main(["recipe=tiny", f"workdir={workdir}", "device=cpu", "data.test_splits=[test_2016_flickr]"],
                 fake_repo)
    recorded = json.loads((workdir / "runs" / ".reproduce" / "chain.json").read_text())
    assert recorded["recipe"] == "tiny" and recorded["data"] == {"data.test_splits": "[test_2016_flickr]"}
    for args, message in (
            (["recipe=bt_best"], "holds recipe=tiny's runs, not recipe=bt_best's"),
            (["recipe=tiny", "data.test_splits=[test_2017_flickr]"],
             "holds runs made with data.test_splits=[test_2016_flickr], not [test_2017_flickr]")):
        done = subprocess.run([sys.executable, str(REPO_ROOT / "reproduce.py"), *args, f"workdir={workdir}",
                               "dry_run=true"], capture_output=True, text=True)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert message in done.stderr and "one report never mixes two studies' runs" in done.stderr
    # a place to read the data from is not what the runs are: the study may move
    command.main(["recipe=tiny", f"workdir={workdir}", "device=cpu", "data.test_splits=[test_2016_flickr]",
                  "data.mirror=/elsewhere", "dry_run=true"], fake_repo)


def test_a_workdir_made_before_the_record_is_taken_and_recorded(fake_repo: Path, tmp_path: Path) -> None:  # noqa: F811
    workdir = tmp_path / "work"
    workdir.mkdir()
    args = ["recipe=tiny", f"workdir={workdir}", "device=cpu"]
    command.main(args, fake_repo)
    (workdir / "runs" / ".reproduce" / "chain.json").unlink()  # as the chain left it before it kept one
    assert command.main(args, fake_repo) is not None
    assert json.loads((workdir / "runs" / ".reproduce" / "chain.json").read_text())["recipe"] == "tiny"


@pytest.mark.parametrize(("damage", "named"), [
    (lambda run: (run / "translations" / "test_2016_flickr.en").unlink(),
     "translations/test_2016_flickr.en is missing"),
    (lambda run: (run / "translations" / "test_2016_flickr.en").write_text("one\ntwo\n"),
     "translations/test_2016_flickr.en holds 2 of the split's 3 lines"),
    (lambda run: (run / "results.json").write_text('{"test": {'), "results.json is not whole"),
])
def test_a_partial_kept_run_is_one_line_naming_the_file(damage, named: str, fake_repo: Path, tmp_path: Path) -> None:  # noqa: F811
    workdir = tmp_path / "work"
    workdir.mkdir()
    args = study_args(workdir)
    run = workdir / "runs" / "study_none_de-en" / "seed42"
    (run / "translations").mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"tgt_lang": "en", "valid": {"bleu": 40.0}, "test": {
        "test_2016_flickr": {"bleu": 41.0, "sentences_per_s": 100.0, "decode_seconds": 0.03}}}))
    (run / "translations" / "test_2016_flickr.en").write_text("one\ntwo\nthree\n")
    command.main([*args, "dry_run=true"], fake_repo)  # whole: taken as complete
    damage(run)
    with pytest.raises(ChainError, match=f"stage 'none de-en seed42': .*{named}.*delete its results.json") as raised:
        command.main(args, fake_repo)
    assert "\n" not in str(raised.value) and calls(workdir) == []


def test_a_real_run_is_whole_until_its_test_output_is_cut(tmp_path: Path) -> None:
    from nmt.chain.workdir import partial_run
    from nmt.train.trainer import train
    from tests.test_training import tiny_config

    run = tmp_path / "run"
    train(tiny_config(tmp_path, ["trainer.max_steps=4", "trainer.validate_every=4"]), run_dir=run)
    assert partial_run(run) is None  # what train.py writes is whole: results.json and every test split's lines
    output = next((run / "translations").iterdir())
    output.write_text("".join(output.read_text().splitlines(keepends=True)[:-1]))
    assert partial_run(run).startswith(f"{output} holds ")


def test_the_gpu_study_on_a_cpu_points_to_its_cpu_recipe(fake_repo: Path, tmp_path: Path,  # noqa: F811
                                                         capsys: pytest.CaptureFixture) -> None:
    command.main(["recipe=attention_study", f"workdir={tmp_path}", "device=cpu", "dry_run=true"], fake_repo)
    eta = capsys.readouterr().out.splitlines()[-1]
    assert eta.startswith("reproduce.py: ETA ") and "on a CPU, recipe=attention_study_cpu runs the same study" in eta
    command.main(["recipe=attention_study_cpu", f"workdir={tmp_path}", "device=cpu", "dry_run=true"], fake_repo)
    assert "recipe=attention_study_cpu runs" not in capsys.readouterr().out


SAVER = r'''
import signal, sys, time
from pathlib import Path
def saved(*_):
    Path("saved").write_text("at SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, saved)
Path("ready").touch()
time.sleep(60)
'''


def test_a_stage_an_earlier_call_left_running_saves_before_the_next_call_takes_over(tmp_path: Path) -> None:
    from nmt.chain.workdir import note_running, stop_left_running

    stage = subprocess.Popen([sys.executable, "-c", SAVER], cwd=tmp_path, start_new_session=True)
    wait_for((tmp_path / "ready").exists)
    note_running(tmp_path, {"bt de-en seed1": (None, stage, 0.0)})  # as the killed call left it
    said: list[str] = []
    stop_left_running(tmp_path, 30.0, said.append)
    assert stage.wait(timeout=10) == 0 and (tmp_path / "saved").read_text() == "at SIGTERM"
    assert said == [f"wait  bt de-en seed1: left running by an earlier call (pid {stage.pid}); SIGTERM, then it "
                    "saves and exits"]
    assert not (tmp_path / "runs" / ".reproduce" / "running.json").exists()
    stop_left_running(tmp_path, 30.0, said.append)  # nothing left: nothing to say
    assert len(said) == 1
