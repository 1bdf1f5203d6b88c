"""Trainings side by side, as ``reproduce.py`` and ``scripts/gpu_check.py --parts parallel`` run them on one card:
separate train.py processes, each with its own seed, batches, logs and results. On the CPU each runs the graph path
with stand-in captures that replay eagerly (as tests/test_fast_step.py does); marked ``gpu``, with real graphs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.test_training import tiny_config

REPO_ROOT = Path(__file__).resolve().parents[1]

# train.py with trainer.cuda_graphs taken as served on the CPU and each capture a stand-in that replays eagerly.
STAND_IN_GRAPHS = """
import runpy, sys, torch
from nmt.common import cuda_graphs
from nmt.inference import engine
from nmt.train import trainer
from nmt.train.fast_step import TrainingSteps, _Graph
from tests.test_fast_step import ReplayedEagerly, ReplayedSearchStep

def capture(self, batch):
    inputs, figures = batch.to(self.device), torch.zeros(3)
    return _Graph(ReplayedEagerly(self, inputs, figures), inputs, figures)

trainer.resolve_cuda_graphs = engine.resolve_cuda_graphs = lambda *args: cuda_graphs.GraphUse(step=True, search=True)
TrainingSteps._warm_up_and_capture = capture
cuda_graphs.capture_graph = lambda run, pool, device: ReplayedSearchStep(run)
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


def train_command(tmp_path: Path, run: str, seed: int, stand_in: bool, *extra: str, cache: str = "cache") -> list[str]:
    cfg = tiny_config(tmp_path, [])  # writes the tiny corpus once per tmp_path
    files = ", ".join(f"{split}: {{src: '{sides.src}', tgt: '{sides.tgt}'}}" for split, sides in cfg.data.files.items())
    args = ["data=files", f"data.files={{{files}}}", f"data.cache_dir={tmp_path}/{cache}", "model.emb_size=32",
            "model.enc_hidden_size=32", "model.dec_hidden_size=64", "data.tokenizer.vocab_size=20",
            "data.tokenizer.model_type=bpe", "trainer.max_steps=20", "trainer.validate_every=10",
            "trainer.log_every=1", "trainer.test_beam_size=2", f"trainer.seed={seed}", "trainer.cuda_graphs=true",
            f"hydra.run.dir={tmp_path}/{run}", *extra]
    program = ["-c", STAND_IN_GRAPHS] if stand_in else [str(REPO_ROOT / "train.py")]
    return [sys.executable, *program, *args]


def start(command: list[str]) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)})


def finished(process: subprocess.Popen) -> None:
    _, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-3000:]


def losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "train_log.jsonl").read_text().splitlines()]


def scores(run_dir: Path) -> tuple[list[float], float]:
    results = json.loads((run_dir / "results.json").read_text())
    return [v["bleu"] for v in results["validations"]], results["test"]["test"]["bleu"]


def side_by_side(tmp_path: Path, stand_in: bool) -> subprocess.Popen:
    """Seeds 1 and 2 alone, each with a data cache of its own; then both again, preparing one fresh data cache
    together, beside a third run of 80 steps, killed midway, after its first validation wrote checkpoints. Returns
    the killed run's process."""
    # every command first: each writes the corpus again, which must not happen under a running training
    alone = [train_command(tmp_path, f"alone{seed}", seed, stand_in, cache=f"alone{seed}_cache") for seed in (1, 2)]
    together = [train_command(tmp_path, f"together{seed}", seed, stand_in, cache="shared") for seed in (1, 2)]
    killed = train_command(tmp_path, "killed", 3, stand_in, "trainer.max_steps=80", cache="shared")
    for process in [start(command) for command in alone]:  # at once: nothing shared, and the losses are the
        finished(process)  # process's own, whatever runs beside it
    together = [start(command) for command in together]
    victim = start(killed)
    log = tmp_path / "killed" / "train_log.jsonl"
    deadline = time.monotonic() + 300
    while not (log.is_file() and log.read_text().count("\n") >= 13) and time.monotonic() < deadline:
        time.sleep(0.05)  # killed past its step-10 validation, while its siblings train
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=60)
    for process in together:
        finished(process)
    return victim


@pytest.mark.slow
def test_runs_side_by_side_give_the_losses_they_give_alone_and_a_failed_one_stops_alone(tmp_path: Path) -> None:
    victim = side_by_side(tmp_path, stand_in=True)
    for seed in (1, 2):
        alone, together = tmp_path / f"alone{seed}", tmp_path / f"together{seed}"
        assert losses(together) == losses(alone) and len(losses(alone)) == 20
        assert scores(together) == scores(alone)
        graphs = json.loads((together / "results.json").read_text())["cuda_graphs"]
        assert graphs["replays"] == 20 and graphs["plain_runs"] == 0  # the stand-in graph path ran
    assert losses(tmp_path / "alone1") != losses(tmp_path / "alone2")  # each its own seed
    # killed midway (not ended on its own: an 80-step run writes results.json when it ends), past a validation that
    # saved checkpoints: a validation leaves no results.json, which a chain would take for a finished run
    killed = tmp_path / "killed"
    assert victim.returncode == -signal.SIGKILL and 13 <= len(losses(killed)) < 80
    assert (killed / "checkpoints" / "last.pt").is_file() and not (killed / "results.json").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graph_replayed_runs_side_by_side_give_the_losses_they_give_alone(tmp_path: Path) -> None:
    side_by_side(tmp_path, stand_in=False)
    for seed in (1, 2):
        alone, together = losses(tmp_path / f"alone{seed}"), losses(tmp_path / f"together{seed}")
        torch.testing.assert_close(together, alone, rtol=2e-3, atol=2e-3)  # CUDA's atomics: not bit for bit
