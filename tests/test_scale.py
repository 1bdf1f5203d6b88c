"""nmt_tools.scale at a tiny size: the synthetic corpus, the preparation children, the training watcher.

The figures themselves (30k to 4.5M pairs) come from ``scripts/benchmark.py scale``, never from tests.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO_ROOT, data_config

from nmt.data.text import read_lines
from nmt_tools import scale


def _args(tmp_path: Path, mirror: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    scale.add_arguments(parser)
    args = parser.parse_args(["--mirror", str(mirror), "--work-dir", str(tmp_path), *extra])
    args.project_dir = REPO_ROOT  # benchmark.py's --project-dir
    return args


def test_the_synthetic_corpus_resamples_with_noise_and_is_reused(mirror_dir: Path, tmp_path: Path) -> None:
    files = scale.synthetic_corpus(mirror_dir, 2000, 0.1, 0, tmp_path)
    src, tgt = (read_lines(Path(files["train"][side])) for side in ("src", "tgt"))
    assert len(src) == len(tgt) == 2000 and all(src) and all(tgt)
    original = set(read_lines(mirror_dir / "multi30k" / "train.de.gz"))
    assert sum(line in original for line in src) == 0  # every line has at least one new word
    assert len(set(src)) > 1990
    assert Path(files["valid"]["src"]).name == "val.de.gz" and Path(files["test"]["tgt"]).name.startswith("test_2016")
    written = Path(files["train"]["src"]).stat().st_mtime_ns
    assert scale.synthetic_corpus(mirror_dir, 2000, 0.1, 0, tmp_path) == files  # reused, not written again
    assert Path(files["train"]["src"]).stat().st_mtime_ns == written


@pytest.mark.slow
def test_prepare_is_measured_cold_then_cached_in_child_processes(mirror_dir: Path, tmp_path: Path) -> None:
    files = scale.synthetic_corpus(mirror_dir, 2000, 0.1, 0, tmp_path)
    cfg = data_config("files", files=files, valid_split="valid", test_splits=["test"])
    cfg["tokenizer"]["vocab_size"] = 500
    cold = scale.measure_prepare(cfg, tmp_path / "cache", timeout=300, project_dir=REPO_ROOT)
    cached = scale.measure_prepare(cfg, tmp_path / "cache", timeout=300, project_dir=REPO_ROOT)
    assert cold["encoded_cache_hits"] == 0 and cached["encoded_cache_hits"] == 3
    assert cold["fingerprint"] == cached["fingerprint"] and cold["pairs"] == cached["pairs"] <= 2000
    for report in (cold, cached):
        assert report["peak_rss_mb"] >= report["rss_mb"] > 50 and report["process_seconds"] > report["seconds"] > 0
        assert report["sampler_epoch_seconds"] > 0 and "tokenizer" in report["stages_seconds"]


@pytest.mark.slow
def test_setup_memory_is_measured_per_size_with_the_batches_hashed(mirror_dir: Path, tmp_path: Path) -> None:
    args = _args(tmp_path, mirror_dir, "--synthetic-pairs", "1500", "3000", "--setup-memory", "--repeats", "2",
                 "--vocab-size", "500")
    report, device = scale.benchmark_scale(args)
    small, large = report["setup_memory"]
    assert device.type == "cpu" and [small["requested_pairs"], large["requested_pairs"]] == [1500, 3000]
    for size in (small, large):
        assert len(size["runs"]) == 2 and all(run["encoded_cache_hits"] == 3 for run in size["runs"])
        assert len({run["batches_sha256"] for run in size["runs"]}) == 1  # the same batches every process
        assert size["peak_rss_mb"] >= size["rss_mb"] > 50 and size["batches"] > 0
    cost = (large["peak_rss_mb"] - small["peak_rss_mb"]) * scale.MIB / (large["pairs"] - small["pairs"])
    assert report["bytes_per_pair"] == {f"{small['pairs']}-{large['pairs']}": cost}


def test_several_sizes_without_setup_memory_are_one_line_and_exit_2(
    mirror_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        scale.benchmark_scale(_args(tmp_path, mirror_dir, "--synthetic-pairs", "1000", "2000"))
    assert stop.value.code == 2 and capsys.readouterr().err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # refused before any corpus is written


# A stand-in for train.py: a launcher with two "ranks" (children whose command line names train.py)
# that writes a log line per "step", as the trainer's rank 0 does.
FAKE_LAUNCHER = """
import subprocess, sys, time
from pathlib import Path
run = Path(sys.argv[1])
ranks = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "train.py", str(run)]) for _ in "ab"]
(run / "train.log").write_text("training additive: 1000 parameters, 3 batches per epoch\\n")
time.sleep(0.3)
for step in range(1, 100):
    with open(run / "train_log.jsonl", "a") as log:
        log.write('{"step": %d}\\n' % step)
    time.sleep(0.05)
"""


def test_training_is_watched_to_its_first_step_and_stopped_with_its_ranks(tmp_path: Path) -> None:
    script = tmp_path / "launcher.py"
    script.write_text(FAKE_LAUNCHER)
    started = time.perf_counter()
    report = scale.measure_training([sys.executable, str(script), str(tmp_path)], tmp_path, steps=5, ranks=2,
                                    timeout=60, project_dir=REPO_ROOT)
    assert time.perf_counter() - started < 30  # stopped at step 5, not left to sleep on
    assert report["first_step_seconds"] >= 0.3  # the first line comes after the "setup"
    assert len(report["ranks"]) == 2 and all(r["rss_mb"] > 0 and r["pss_mb"] > 0 for r in report["ranks"])
    assert report["parameters"] == 1000 and report["model_optimizer_mb_estimate"] == 1000 * 16 / 2**20
    for _ in range(100):  # the ranks were killed too (a killed process leaves /proc, or keeps no command line)
        if not _running_with(str(tmp_path).encode()):
            break
        time.sleep(0.05)
    assert not _running_with(str(tmp_path).encode())


def _running_with(marker: bytes) -> list[int]:
    """Processes whose command line holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_a_training_run_that_fails_early_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="stopped before step 3.*no corpus here"):
        scale.measure_training([sys.executable, "-c", "import sys; sys.exit('no corpus here')"], tmp_path, 3, 1, 60,
                               REPO_ROOT)


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_the_train_command_composes(mirror_dir: Path, tmp_path: Path, ranks: int) -> None:
    """train.py accepts every override the benchmark gives it (Hydra prints the job config; nothing trains)."""
    import subprocess

    files = scale.synthetic_corpus(mirror_dir, 100, 0.1, 0, tmp_path)
    command = scale.train_command(files, tmp_path / "cache", tmp_path / "run", _args(tmp_path, mirror_dir), ranks)
    if ranks == 2:
        assert command[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
        command = [sys.executable, *command[6:]]  # compose once, without the launcher
    done = subprocess.run([*command, "--cfg", "job"], cwd=REPO_ROOT, env=scale._child_env(REPO_ROOT),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert files["train"]["src"] in done.stdout and "max_steps: 60" in done.stdout


# A stand-in for a whole train.py run: holds 64 MiB of anonymous memory, touches a mapped "encoded" cache file,
# logs two steps and exits.
FAKE_TRAINING = """
import json, mmap, sys, time
from pathlib import Path
run = Path(sys.argv[1])
run.mkdir()
held = bytearray(64 << 20)
held[::4096] = b"x" * len(held[::4096])  # every page touched
(run.parent / "encoded").mkdir(exist_ok=True)
cache = run.parent / "encoded" / "train.tokens.npy"
cache.write_bytes(b"\\1" * (8 << 20))
with open(cache, "rb") as file:
    mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    sum(mapped[i] for i in range(0, len(mapped), 4096))
    (run / "train_log.jsonl").write_text('{"step": 1, "loss": 9.5}\\n{"step": 2, "loss": 9.25}\\n')
    time.sleep(1.5)
"""


def test_a_whole_training_is_measured_to_its_end_anonymous_and_file_backed(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(FAKE_TRAINING)
    report = scale.measure_training_memory([sys.executable, str(script), str(tmp_path / "run")], tmp_path / "run",
                                           timeout=60, project_dir=REPO_ROOT)
    assert report["losses"] == [9.5, 9.25] and report["seconds"] >= 1.5
    assert report["peak_rss_mb"] >= report["at_peak"]["rss_mb"] >= 64  # its own peak, not this process's (torch)
    assert report["peak_rss_mb"] < 200 and report["max_rss_anon_mb"] >= report["at_peak"]["rss_anon_mb"] >= 64
    assert report["max_rss_file_mb"] >= 8
    assert 8 <= report["encoded_maps_mb"] <= 8.1  # the cache file's pages, mapped into the process
    assert (tmp_path / "run.out").exists()


def test_a_training_that_fails_is_an_error_with_its_output(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="exit 3.*no corpus here"):
        scale.measure_training_memory([sys.executable, "-c", "import sys; print('no corpus here'); sys.exit(3)"],
                                      tmp_path / "run", timeout=60, project_dir=REPO_ROOT)


def test_setup_and_train_memory_are_two_benchmarks(
    mirror_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        scale.benchmark_scale(_args(tmp_path, mirror_dir, "--setup-memory", "--train-memory"))
    assert stop.value.code == 2 and "give one" in capsys.readouterr().err
