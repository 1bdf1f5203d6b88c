"""Training end to end on a tiny synthetic task, through the real configs shrunk to tiny sizes.

The task: reverse a short sequence of symbols ("c a f" -> "f a c"). Every attention type must learn
it; resume must reproduce the uninterrupted loss curve exactly; checkpoints, TensorBoard events and
results.json must be complete; bad configs must fail naming the key; 2-process gloo DDP must run and
resume exactly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf, open_dict

from nmt.common.files import FolderInUse
from nmt.common.settings import ConfigError, check_command_line_keys
from nmt.data import DataError, prepare_data
from nmt.inference.engine import Translator
from nmt.inference.translate_job import TranslateSettings
from nmt.model.checkpoint import load_checkpoint
from nmt.train import trainer as trainer_module
from nmt.train.run_logger import RunLogger
from nmt.train.schema import TrainSettings, validate_config
from nmt.train.trainer import Trainer, lr_factor, train
from tests.conftest import CONFIG_DIR, REPO_ROOT

SYMBOLS = "a b c d e f".split()


def write_reversal_corpus(folder: Path, seed: int = 0) -> dict[str, dict[str, str]]:
    """Train/valid/test files of the reversal task; returns the ``data.files`` mapping."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, size in (("train", 1200), ("valid", 60), ("test", 40)):
        src = [" ".join(rng.choice(SYMBOLS) for _ in range(rng.randint(2, 6))) for _ in range(size)]
        tgt = [" ".join(reversed(line.split())) for line in src]
        (folder / f"{split}.src").write_text("\n".join(src) + "\n")
        (folder / f"{split}.tgt").write_text("\n".join(tgt) + "\n")
        files[split] = {"src": str(folder / f"{split}.src"), "tgt": str(folder / f"{split}.tgt")}
    return files


TINY = [
    "data=files", "data.tokenizer.vocab_size=20", "data.tokenizer.model_type=bpe", "data.max_tokens=600",
    "model.emb_size=32", "model.enc_hidden_size=32", "model.dec_hidden_size=64", "model.dropout=0.0",
    "trainer.warmup_steps=20", "trainer.lr=0.01", "trainer.label_smoothing=0.0", "trainer.test_beam_size=2",
    "trainer.num_heatmaps=2", "trainer.num_samples=2", "trainer.log_every=10", "trainer.max_epochs=1000",
]


def tiny_config(tmp_path: Path, overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=TINY + overrides)
    cfg.data.files = write_reversal_corpus(tmp_path / "corpus")
    cfg.data.cache_dir = str(tmp_path / "cache")
    return cfg


def exact_match(run_dir: Path, cfg: DictConfig) -> float:
    translator = Translator.from_checkpoint(run_dir, device="cpu", max_input_words=None)
    valid = prepare_data(cfg.data).valid
    hyps = [r.text for r in translator.translate(valid.src_text, beam_size=1, max_len=50, max_len_ratio=2.0)]
    return sum(h == r for h, r in zip(hyps, valid.tgt_text)) / len(hyps)


@pytest.mark.parametrize("attention", ["additive", "dot", "scaled_dot", "general", "multihead", "none"])
def test_every_attention_type_learns_to_reverse(tmp_path: Path, attention: str) -> None:
    steps = 1000 if attention == "none" else 300  # without attention the whole input must fit the state
    cfg = tiny_config(tmp_path, [f"attention={attention}", f"trainer.max_steps={steps}", "trainer.validate_every=150"])
    results = train(cfg, run_dir=tmp_path / "run")
    history = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    first, last = history[0]["loss"], sum(h["loss"] for h in history[-10:]) / 10
    assert last < 0.2 * first, (first, last)
    assert exact_match(tmp_path / "run", cfg) >= 0.8
    assert results["test"]["test"]["bleu"] > 60
    assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp" in results["test"]["test"]["bleu_signature"]


def interrupted_at(step: int) -> contextlib.AbstractContextManager:
    """Train as if SIGINT arrived during optimizer step ``step``: the trainer finishes it and saves last.pt."""
    signalled = Trainer._signalled

    def signalled_at(self: Trainer) -> bool:
        if self.progress.step == step:
            self.stop_signal = "SIGINT"
        return signalled(self)

    return mock.patch.object(Trainer, "_signalled", signalled_at)


def interrupted_decoding_at(step: int) -> contextlib.AbstractContextManager:
    """Train with a real SIGINT sent while validation decodes at ``step``."""
    decode, sent = Trainer.decode, []

    def decode_signalled(self: Trainer, split: Any, beam_size: int) -> Any:
        if self.progress.step == step and not sent:
            sent.append(signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs here, before decoding goes on
        return decode(self, split, beam_size)

    return mock.patch.object(Trainer, "decode", decode_signalled)


@pytest.mark.parametrize("stop", ["between validations", "at a due validation", "while validation decodes"])
def test_resume_equals_uninterrupted(tmp_path: Path, stop: str) -> None:
    """A signal saves and stops at once; a validation due then (or under way) is left to the resumed run, which
    validates at that step: its log, validations and checkpoints are the uninterrupted run's."""
    common = ["trainer.max_steps=24", "trainer.validate_every=8", "trainer.log_every=1", "model.dropout=0.2",
              "data.max_tokens=300", "trainer.test_beam_size=1"]
    cfg = tiny_config(tmp_path, common)
    train(cfg, run_dir=tmp_path / "straight")
    step = 13 if stop == "between validations" else 16
    with interrupted_decoding_at(step) if stop == "while validation decodes" else interrupted_at(step):
        interrupted = train(cfg, run_dir=tmp_path / "resumed")
    assert interrupted == {"interrupted": True, "step": step}
    saved = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")["progress"]
    assert saved["step"] == step and [v["step"] for v in saved["validations"]] == [8]  # step 16's left to resume
    with (tmp_path / "resumed" / "train_log.jsonl").open("a") as log:
        log.write('{"step": 14, "loss": 3.1')  # a power cut tore the last line: it must not block resume
    resume_cfg = cfg.copy()
    resume_cfg.trainer.resume = str(tmp_path / "resumed")
    train(resume_cfg)
    straight = (tmp_path / "straight" / "train_log.jsonl").read_text().splitlines()
    resumed = (tmp_path / "resumed" / "train_log.jsonl").read_text().splitlines()
    assert len(straight) == 24 and resumed == straight  # bit-identical losses, lrs and grad norms
    # The validation record carries over the interruption: the same steps and scores, a clock that goes on.
    straight_validations = json.loads((tmp_path / "straight" / "results.json").read_text())["validations"]
    resumed_results = json.loads((tmp_path / "resumed" / "results.json").read_text())
    resumed_validations = resumed_results["validations"]
    scores = [(v["step"], v["bleu"], v["loss"]) for v in resumed_validations]
    assert scores == [(v["step"], v["bleu"], v["loss"]) for v in straight_validations]
    assert [v["step"] for v in resumed_validations] == [8, 16, 24]
    clock = [v["wall_seconds"] for v in resumed_validations]
    assert clock == sorted(clock) and clock[-1] <= resumed_results["wall_seconds"]
    a = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


class KilledOutright(BaseException):
    """A kill no handler sees (SIGKILL, a machine taken away): nothing is saved on the way out."""


def test_a_run_killed_outright_resumes_from_its_timed_last_pt_as_if_uninterrupted(tmp_path: Path) -> None:
    """``trainer.checkpoint_every_minutes`` saves ``last.pt`` between validations (at log lines), so a run killed
    outright at step 14 resumes from step 12, not from step 8's validation, to the uninterrupted run's losses,
    validations and weights."""
    common = ["trainer.max_steps=24", "trainer.validate_every=8", "trainer.log_every=3", "model.dropout=0.2",
              "data.max_tokens=300", "trainer.test_beam_size=1"]
    cfg = tiny_config(tmp_path, [*common, "trainer.checkpoint_every_minutes=null"])
    train(cfg, run_dir=tmp_path / "straight")
    killed = cfg.copy()
    killed.trainer.checkpoint_every_minutes = 1e-9  # due at every log line
    real_step = Trainer.train_step

    def step_killed_at_14(self: Trainer, batch: Any) -> Any:
        if self.progress.step == 13:
            raise KilledOutright
        return real_step(self, batch)

    with mock.patch.object(Trainer, "train_step", step_killed_at_14), pytest.raises(KilledOutright):
        train(killed, run_dir=tmp_path / "killed")
    saved = load_checkpoint(tmp_path / "killed" / "checkpoints" / "last.pt")["progress"]
    assert saved["step"] == 12 and [v["step"] for v in saved["validations"]] == [8]
    killed.trainer.resume = str(tmp_path / "killed")
    train(killed)
    straight = (tmp_path / "straight" / "train_log.jsonl").read_text().splitlines()
    assert len(straight) == 24 and (tmp_path / "killed" / "train_log.jsonl").read_text().splitlines() == straight
    scores = [[(v["step"], v["bleu"], v["loss"]) for v in json.loads((tmp_path / run / "results.json").read_text())
               ["validations"]] for run in ("straight", "killed")]
    assert scores[0] == scores[1] and [step for step, _, _ in scores[0]] == [8, 16, 24]
    a, b = (load_checkpoint(tmp_path / run / "checkpoints" / "last.pt")["model"] for run in ("straight", "killed"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_checkpoint_every_minutes_must_be_positive_or_null(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, ["trainer.checkpoint_every_minutes=0"])
    with pytest.raises(ConfigError, match=r"trainer.checkpoint_every_minutes=0.0 must be positive"):
        validate_config(cfg)
    validate_config(tiny_config(tmp_path, ["trainer.checkpoint_every_minutes=null"]))


# Validation BLEU by validation: new bests at steps 2, 4 and 8, then three without gain: patience 3 stops at 14.
SCRIPTED_BLEU = [10.0, 30.0, 20.0, 40.0, 35.0, 30.0, 25.0]


def scripted_validation_scores(seconds: float) -> contextlib.AbstractContextManager:
    """Validation scores from ``SCRIPTED_BLEU``, one per call, each taking ``seconds``: scoring in the background then
    runs on while the next steps are taken. Later calls (the final evaluation) score for real."""
    calls = iter(SCRIPTED_BLEU)
    real = trainer_module.corpus_scores

    def scores(hypotheses: list[str], references: list[str]) -> dict[str, Any]:
        result = real(hypotheses, references)
        bleu = next(calls, None)
        if bleu is not None:
            time.sleep(seconds)
            result["bleu"] = bleu
        return result

    return mock.patch.object(trainer_module, "corpus_scores", scores)


def test_validation_scored_in_the_background_chooses_and_stops_as_in_the_foreground(tmp_path: Path) -> None:
    """Scoring, logging and checkpoints after the training goes on (one process, early stopping not due) give the
    same best checkpoint, the same early stop and the same checkpoints as doing them at once. The scores change
    the best twice and scoring is slow, so a validation that did not wait for the one before would see a stale
    best (and choose step 6's checkpoint)."""
    common = ["trainer.max_steps=200", "trainer.validate_every=2", "trainer.log_every=2",
              "trainer.early_stopping_patience=3", "trainer.average_last=2", "trainer.test_beam_size=1"]
    cfg = tiny_config(tmp_path, common)
    with scripted_validation_scores(seconds=0.3):
        runs = {"background": train(cfg, run_dir=tmp_path / "background")}
    with scripted_validation_scores(seconds=0.0), mock.patch.object(Trainer, "_records_in_background",
                                                                     lambda self: False):
        runs["foreground"] = train(cfg, run_dir=tmp_path / "foreground")
    background, foreground = runs["background"], runs["foreground"]
    assert (foreground["best_step"], foreground["steps"], foreground["stopped_early"]) == (8, 14, True)
    for key in ("steps", "stopped_early", "best_step", "best_val_bleu_greedy", "validations"):
        assert _without_clock(background[key]) == _without_clock(foreground[key]), key
    for name in ("last.pt", "best.pt", "val_step00000012.pt", "val_step00000014.pt"):
        saved = [load_checkpoint(tmp_path / run / "checkpoints" / name) for run in runs]
        assert _without_clock(saved[0].get("progress")) == _without_clock(saved[1].get("progress")), name
        assert all(torch.equal(saved[0]["model"][k], saved[1]["model"][k]) for k in saved[0]["model"]), name
    assert load_checkpoint(tmp_path / "background" / "checkpoints" / "best.pt")["progress"]["step"] == 8
    assert sorted(p.name for p in (tmp_path / "background" / "checkpoints").glob("val_step*")) == \
        ["val_step00000012.pt", "val_step00000014.pt"]
    assert background["averaged"]["test"]["test"]["bleu"] == foreground["averaged"]["test"]["test"]["bleu"]


def _without_clock(record: Any) -> Any:
    """A progress record or validation list with its clock fields (which differ run to run) left out."""
    clock = ("train_seconds", "wall_seconds", "validation_seconds")
    if isinstance(record, list):
        return [_without_clock(item) for item in record]
    if isinstance(record, dict):
        return {key: _without_clock(value) for key, value in record.items() if key not in clock}
    return record


def test_a_resumed_run_uses_its_own_lr_betas_and_weight_decay(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, ["trainer.max_steps=6", "trainer.validate_every=3", "trainer.log_every=1"])
    with interrupted_at(3):
        train(cfg, run_dir=tmp_path / "run")
    resume_cfg = cfg.copy()
    resume_cfg.trainer.resume = str(tmp_path / "run")
    resume_cfg.trainer.lr = cfg.trainer.lr / 2
    resume_cfg.trainer.betas = [0.8, 0.9]
    resume_cfg.trainer.weight_decay = 0.0
    train(resume_cfg)
    lrs = [json.loads(line)["lr"] for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    factor = lr_factor(cfg.trainer.lr_schedule, cfg.trainer.warmup_steps, 6, cfg.trainer.min_lr_ratio)
    assert lrs[3:] == pytest.approx([cfg.trainer.lr / 2 * factor(step) for step in range(3, 6)], rel=1e-6)
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    group = state["optimizer"]["param_groups"][0]
    assert tuple(group["betas"]) == (0.8, 0.9) and group["weight_decay"] == 0.0
    assert state["config"]["trainer"]["lr"] == cfg.trainer.lr / 2  # config.yaml / the checkpoint record what is used


def test_a_second_process_on_a_run_in_use_is_refused(tmp_path: Path) -> None:
    import fcntl

    run = tmp_path / "run"
    run.mkdir()
    with (run / ".lock").open("a+") as held:
        held.write("train.py (pid 12345)\n")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(FolderInUse, match=r"is in use by train.py \(pid 12345\): wait for it"):
            train(tiny_config(tmp_path, ["trainer.max_steps=2"]), run_dir=run)


def test_resuming_with_another_model_shape_is_one_line(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, ["trainer.max_steps=4", "trainer.validate_every=2"])
    with interrupted_at(2):
        train(cfg, run_dir=tmp_path / "run")
    result = subprocess.run([sys.executable, "train.py", f"trainer.resume={tmp_path / 'run'}", "model.emb_size=64"],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr[-2000:]
    assert "cannot resume with model.emb_size=64: the checkpoint's run has model.emb_size=" in result.stderr


def test_checkpoints_events_and_results_are_complete(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, ["trainer.max_steps=20", "trainer.validate_every=10", "trainer.average_last=2"])
    run = tmp_path / "run"
    drawn_on, attention = [], RunLogger.attention

    def attention_drawn(self: RunLogger, *args: Any) -> None:
        drawn_on.append(threading.current_thread().name)
        attention(self, *args)

    with mock.patch.object(RunLogger, "attention", attention_drawn):
        results = train(cfg, run_dir=run)
    # by the validation writer: a thread of their own would keep a glibc arena of the largest figure's size
    assert drawn_on and all(name.startswith("nmt-validation") for name in drawn_on), drawn_on
    for name in ("last.pt", "best.pt"):
        state = torch.load(run / "checkpoints" / name, map_location="cpu", weights_only=True)  # runs no code
        assert {"format_version", "nmt_version", "config", "tokenizer", "model", "optimizer", "scheduler",
                "scaler", "rng", "progress"} <= set(state)
        assert state["config"]["attention"]["name"] == "additive"
        assert isinstance(load_checkpoint(run / "checkpoints" / name)["tokenizer"]["src_model"], bytes)
        assert {"step", "epoch", "batches_done", "best_bleu"} <= set(state["progress"])
    assert not list((run / "checkpoints").glob("*.tmp"))
    assert len((run / "translations" / "test.en").read_text().splitlines()) == 40
    saved = json.loads((run / "results.json").read_text())
    assert saved["test"]["test"]["bleu"] == results["test"]["test"]["bleu"]
    assert {"valid", "test", "parameters", "device", "train_seconds", "averaged"} <= set(saved)
    assert saved["device"] == "cpu" and saved["versions"]["torch"] == torch.__version__ and saved["host"]["cpu_count"]
    assert [v["step"] for v in saved["validations"]] == [10, 20]
    first = json.loads((run / "train_log.jsonl").read_text().splitlines()[0])
    assert first["step"] == 1 and first["lr"] == pytest.approx(0.01 / 20)  # the rate step 1 used: lr / warmup_steps
    assert 0 < saved["train_seconds"] < saved["wall_seconds"]  # wall clock adds the validations
    assert max(v["bleu"] for v in saved["validations"]) == saved["best_val_bleu_greedy"]
    assert saved["final_evaluation_seconds"] > 0 and saved["setup_seconds"] > 0
    assert saved["gpu_utilisation"] == {"available": False, "reason": "device is cpu, not a GPU"}

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run), size_guidance={"images": 0, "tensors": 0}).Reload()
    tags = events.Tags()
    assert {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "val/loss", "val/ppl", "val/bleu",
            "val/chrf"} <= set(tags["scalars"])
    assert {"attention/0", "attention/1"} <= set(tags["images"])
    assert "samples/text_summary" in tags["tensors"]
    assert len(list(run.glob("events.out.tfevents*"))) == 1  # hparams in the same file, not a stray sub-run


def test_bad_config_keys_fail_naming_the_key(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, [])
    with pytest.raises(ConfigError, match=r"trainer\.lrr.*did you mean trainer\.lr\?"):
        bad = cfg.copy()
        OmegaConf.set_struct(bad, False)
        bad.trainer.lrr = 0.1
        validate_config(bad)
    with pytest.raises(ConfigError, match=r"trainer.*max_epochs"):
        bad = cfg.copy()
        bad.trainer.max_epochs = "ten"
        validate_config(bad)
    with pytest.raises(ConfigError, match=r"attention\.head: did you mean attention\.heads\? valid keys under "
                                          r"attention\.: dropout, heads, hidden_size, name"):
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            bad = compose(config_name="train", overrides=["attention=multihead", "+attention.head=3"])
        validate_config(bad)
    with pytest.raises(ConfigError, match="trainer.lr_schedule='linear' is not one of cosine"):
        bad = cfg.copy()
        bad.trainer.lr_schedule = "linear"
        validate_config(bad)
    with pytest.raises(ConfigError, match=r"model\.layer_norm has no value: set it .* or add it to the model YAML"):
        bad = cfg.copy()
        OmegaConf.set_struct(bad, False)
        del bad.model["layer_norm"]  # a user's own model file that predates the key
        validate_config(bad)


def test_command_line_errors_name_the_key_and_choices(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "train.py", *args, f"hydra.run.dir={tmp_path}/cli"],
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)

    typo = run("trainer.max_step=5")
    assert typo.returncode == 2 and "did you mean trainer.max_steps?" in typo.stderr
    assert "Traceback" not in typo.stderr
    option = run("attention=bahdanau")
    assert option.returncode == 2 and option.stderr.count("\n") == 1 and "Traceback" not in option.stderr
    assert "unknown attention option 'bahdanau'" in option.stderr and "additive, dot, general" in option.stderr
    sweep = run("-m", "attention=dot,generl")  # each option of a sweep is checked
    assert sweep.returncode == 2 and "did you mean attention=general?" in sweep.stderr


def test_command_line_key_check_suggests_and_leaves_the_rest_to_hydra() -> None:
    assert check_command_line_keys(CONFIG_DIR, ["checkpoint=x", "beam=3"], TranslateSettings).startswith(
        "unknown config key beam: did you mean beam_size? valid keys under the top level: alignments,")
    message = check_command_line_keys(CONFIG_DIR, ["attention=dot", "model.emb=3"], TrainSettings)
    assert message.startswith("unknown config key model.emb: did you mean model.emb_size? valid keys under model.: ")
    # a misspelt section is named at its own level
    message = check_command_line_keys(CONFIG_DIR, ["trainr.lr=3"], TrainSettings)
    assert message.startswith("unknown config key trainr: did you mean trainer? valid keys under the top level: ")
    # valid keys, additions, sweeps, group choices and hydra.* are not this check's business
    for args in (["trainer.lr=3", "+trainer.extra=1", "hydra.run.dir=/tmp/x"], ["-m", "attention=dot,additive"],
                 ["attention=nope"], ["--config-dir=/nowhere", "data=reversal"]):
        assert check_command_line_keys(CONFIG_DIR, args, TrainSettings) is None
    # a value of the wrong type, where the schema knows the type
    assert check_command_line_keys(CONFIG_DIR, ["trainer.max_epochs=ten"], TrainSettings).startswith(
        "bad value for trainer.max_epochs: Value 'ten' of type 'str' could not be converted to Integer")
    assert check_command_line_keys(CONFIG_DIR, ["checkpoint=x", "beam_size=wide"], TranslateSettings).startswith(
        "bad value for beam_size:")


@pytest.mark.slow
def test_ddp_two_cpu_processes_run_and_resume_exactly(tmp_path: Path) -> None:
    """2-process gloo DDP: it trains, rank 0 alone writes, and a resumed run continues every rank's dropout stream.

    Dropout is on, so the resumed loss curve equals the uninterrupted one only if each rank gets back its own
    RNG state (rank 1's masks shape the averaged gradients that rank 0's logged losses follow).
    """
    cfg = tiny_config(tmp_path, [])
    config_dir = tmp_path / "extra_configs" / "data"
    config_dir.mkdir(parents=True)
    data = OmegaConf.to_container(cfg.data, resolve=True)
    OmegaConf.save(OmegaConf.create(data), config_dir / "reversal.yaml")
    prepare_data(cfg.data)  # warm the cache so the two ranks start together
    overrides = [o for o in TINY if not o.startswith("data.")][1:] + [
        "data=reversal", "trainer.validate_every=3", "trainer.test_beam_size=1", "trainer.device=cpu",
        "model.dropout=0.2", "trainer.log_every=1", "trainer.lr_schedule=constant"]  # constant: max_steps moves no lr

    def torchrun(*extra: str) -> None:
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29517", "train.py",
             f"--config-dir={tmp_path / 'extra_configs'}", *overrides, *extra],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stderr[-3000:]

    straight, resumed = tmp_path / "ddp", tmp_path / "ddp_resumed"
    torchrun("trainer.max_steps=6", f"hydra.run.dir={straight}")
    results = json.loads((straight / "results.json").read_text())
    assert results["world_size"] == 2 and results["steps"] == 6
    tokens, offsets = results["train_files_by_rank"][0]  # both ranks mapped the one cache, not private copies
    assert results["train_files_by_rank"] == [[tokens, offsets]] * 2
    assert Path(tokens).resolve().is_relative_to(Path(cfg.data.cache_dir).resolve()) and tokens.endswith(".npy")
    assert len((straight / "train_log.jsonl").read_text().splitlines()) == 6  # rank 0 alone writes

    torchrun("trainer.max_steps=3", f"hydra.run.dir={resumed}")
    torchrun(f"trainer.resume={resumed}", "trainer.max_steps=6")
    assert (resumed / "train_log.jsonl").read_text() == (straight / "train_log.jsonl").read_text()


def test_bf16_training_learns_and_is_recorded(tmp_path: Path) -> None:
    """trainer.precision=bf16 on the CPU: the matmuls run in bf16, and the reversal task is still learnt."""
    from nmt.train.trainer import DistInfo, Trainer

    cfg = tiny_config(tmp_path, ["trainer.precision=bf16", "trainer.max_steps=300", "trainer.validate_every=150"])
    probe = Trainer(cfg, tmp_path / "probe", DistInfo())
    seen: set[torch.dtype] = set()
    probe.model.decoder.output.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
    probe.train_step(next(iter(probe.train_loader)))
    probe.logger.close()
    assert seen == {torch.bfloat16}

    results = train(cfg, run_dir=tmp_path / "run")
    assert results["precision"] == "bf16" and results["bf16_autocast"] is True
    assert exact_match(tmp_path / "run", cfg) >= 0.8


def test_resuming_a_run_saved_with_the_old_amp_key(tmp_path: Path) -> None:
    from nmt.train.resume import resume_config

    cfg = tiny_config(tmp_path, [])
    legacy = OmegaConf.to_container(cfg, resolve=True)
    legacy["trainer"]["amp"] = legacy["trainer"].pop("precision") == "auto"
    with pytest.raises(ConfigError, match=r"unknown config key trainer\.amp"):
        validate_config(OmegaConf.create(legacy))
    merged = resume_config(cfg, {"config": legacy})
    validate_config(merged)
    assert merged.trainer.precision == "auto" and "amp" not in merged.trainer


def test_resuming_names_each_key_the_checkpoint_keeps(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from nmt.train.resume import resume_config

    cfg = tiny_config(tmp_path, [])
    saved = OmegaConf.to_container(cfg, resolve=True)
    saved["data"]["max_tokens"] = cfg.data.max_tokens + 1
    with caplog.at_level(logging.WARNING, logger="nmt.train.resume"):
        merged = resume_config(cfg, {"config": saved})
    assert merged.data.max_tokens == cfg.data.max_tokens + 1
    assert caplog.messages == [f"resuming with the checkpoint's data.max_tokens={cfg.data.max_tokens + 1} (here "
                               f"{cfg.data.max_tokens}), not this invocation's"]


def test_a_bare_resume_warns_about_nothing_and_a_typed_group_about_its_own_keys(tmp_path: Path) -> None:
    """``trainer.resume=RUN`` alone keeps the checkpoint's settings without a word, however far they are from
    train.yaml's defaults; a setting the user typed that the checkpoint overrides is named, and only such."""
    cfg = tiny_config(tmp_path, ["trainer.max_steps=4", "trainer.validate_every=2", "trainer.test_beam_size=1"])
    with interrupted_at(2):
        train(cfg, run_dir=tmp_path / "run")
    shutil.copytree(tmp_path / "run", tmp_path / "typed")
    for run, typed in (("run", []), ("typed", ["attention=dot"])):
        result = subprocess.run([sys.executable, "train.py", f"trainer.resume={tmp_path / run}", *typed],
                                cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        assert (tmp_path / run / "results.json").exists()
        warnings = [line for line in (tmp_path / run / "train.log").read_text().splitlines()
                    if "resuming with the checkpoint's" in line]
        if not typed:
            assert warnings == []
            continue
        assert len(warnings) == 1 and "attention.name='additive' (here 'dot')" in warnings[0], warnings
        assert "data." not in warnings[0] and "model." not in warnings[0]


def test_resuming_a_checkpoint_with_the_old_single_rng_state(tmp_path: Path) -> None:
    """Checkpoints written before per-rank RNG states held one dict; they still resume exactly."""
    from nmt.model.checkpoint import save_checkpoint

    cfg = tiny_config(tmp_path, ["trainer.max_steps=8", "trainer.validate_every=4", "trainer.log_every=1",
                                 "model.dropout=0.2", "trainer.test_beam_size=1"])
    train(cfg, run_dir=tmp_path / "straight")
    with interrupted_at(6):
        train(cfg, run_dir=tmp_path / "resumed")
    last = tmp_path / "resumed" / "checkpoints" / "last.pt"
    state = load_checkpoint(last)
    assert isinstance(state["rng"], list) and len(state["rng"]) == 1
    state["rng"] = state["rng"][0]  # the old layout
    save_checkpoint(last, {k: v for k, v in state.items() if k not in ("format_version", "nmt_version")})
    resume_cfg = cfg.copy()
    resume_cfg.trainer.resume = str(tmp_path / "resumed")
    train(resume_cfg)
    resumed, straight = (tmp_path / name / "train_log.jsonl" for name in ("resumed", "straight"))
    assert resumed.read_text() == straight.read_text()


def run_train_py(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``python train.py ARGS`` from ``cwd``: anything Hydra makes without being told where lands in ``cwd``."""
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, str(REPO_ROOT / "train.py"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


def assert_one_line_error(proc: subprocess.CompletedProcess, *expected: str) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Error executing job" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: error: "), proc.stderr
    for text in expected:
        assert text in lines[0], lines[0]


def test_train_py_reports_a_corpus_line_count_mismatch_in_one_line(tmp_path: Path) -> None:
    files = write_reversal_corpus(tmp_path / "corpus")
    train_tgt = Path(files["train"]["tgt"])
    train_tgt.write_text("".join(train_tgt.read_text().splitlines(keepends=True)[:-1]))  # one line short
    mapping = ", ".join(f"{split}: {{src: '{sides['src']}', tgt: '{sides['tgt']}'}}" for split, sides in files.items())
    proc = run_train_py(tmp_path / "cwd", "data=files", f"data.files={{{mapping}}}", f"data.cache_dir={tmp_path}/cache")
    assert_one_line_error(proc, str(train_tgt), "1,199", "different line counts")


def test_train_py_reports_a_corrupt_mirror_file_in_one_line(tmp_path: Path, mirror_dir: Path) -> None:
    mirror = tmp_path / "mirror" / "multi30k"
    mirror.mkdir(parents=True)
    for path in (mirror_dir / "multi30k").iterdir():
        (mirror / path.name).symlink_to(path)
    corrupt = mirror / "train.de.gz"
    corrupt.unlink()
    corrupt.write_bytes((mirror_dir / "multi30k" / "train.de.gz").read_bytes()[:-100])  # cut short
    proc = run_train_py(tmp_path / "cwd", f"data.mirror={tmp_path / 'mirror'}", f"data.cache_dir={tmp_path}/cache")
    assert_one_line_error(proc, "sha256 mismatch for train.de.gz", str(corrupt), "expected ", ", got ")


@pytest.mark.parametrize("case", ["config", "device", "cuda_graphs", "missing_run"])
def test_train_py_reports_user_errors_in_one_line(tmp_path: Path, case: str) -> None:
    if case == "config":
        proc = run_train_py(tmp_path, "trainer.lr_schedule=linear")
        assert_one_line_error(proc, "trainer.lr_schedule='linear' is not one of cosine")
    elif case == "cuda_graphs":
        if torch.cuda.is_available():
            pytest.skip("a GPU is present")
        proc = run_train_py(tmp_path / "cwd", "trainer.cuda_graphs=true", f"data.cache_dir={tmp_path}/cache")
        assert_one_line_error(proc, "trainer.cuda_graphs=true needs a CUDA GPU", "trainer.cuda_graphs=auto")
        assert not (tmp_path / "cache").exists()  # refused before any data work
    elif case == "device":
        if torch.cuda.is_available():
            pytest.skip("a GPU is present")
        proc = run_train_py(tmp_path, "trainer.device=cuda")
        assert_one_line_error(proc, "trainer.device=cuda", "no CUDA GPU")
    else:
        proc = run_train_py(tmp_path / "cwd", f"trainer.resume={tmp_path / 'no_such_run'}")
        assert_one_line_error(proc, str(tmp_path / "no_such_run"), "does not exist")
        assert not list((tmp_path / "cwd").iterdir())  # failed before Hydra made a run dir


def test_resuming_with_another_tokenizer_is_a_checkpoint_error(tmp_path: Path) -> None:
    from nmt.model.checkpoint import CheckpointError, save_checkpoint

    cfg = tiny_config(tmp_path, ["trainer.max_steps=4", "trainer.validate_every=4"])
    with interrupted_at(2):
        train(cfg, run_dir=tmp_path / "run")
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    state["config"]["data"]["tokenizer"]["model_type"] = "word"  # the resumed run would prepare another one
    save_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt",
                    {k: v for k, v in state.items() if k not in ("format_version", "nmt_version")})
    resume_cfg = cfg.copy()
    resume_cfg.trainer.resume = str(tmp_path / "run")
    with pytest.raises(CheckpointError, match="SentencePiece model prepared now differs from the checkpoint's"):
        train(resume_cfg)


def test_resume_from_the_command_line_writes_only_into_its_run(tmp_path: Path) -> None:
    """``train.py trainer.resume=RUN`` continues in RUN; Hydra makes no new outputs/<date>/<time>/ beside it."""
    cfg = tiny_config(tmp_path, ["trainer.max_steps=8", "trainer.validate_every=4", "trainer.log_every=2"])
    run = tmp_path / "run"
    with interrupted_at(4):
        train(cfg, run_dir=run)
    elsewhere = tmp_path / "cwd"
    proc = run_train_py(elsewhere, f"trainer.resume={run}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not list(elsewhere.iterdir())  # no outputs/ where it ran
    assert not (run / ".hydra").exists()  # and no second .hydra/ in the run
    assert json.loads((run / "results.json").read_text())["steps"] == 8
    log_text = (run / "train.log").read_text()
    assert "resumed at step 4" in log_text
    # the progress line: where the run stands, how fast, how long so far and to go
    assert re.search(r"step 6/8 \(75%\) \| epoch \d+ \| loss \d+\.\d{3} \| lr \S+ \| [\d,]+ tok/s \| "
                     r"elapsed \d+s \| ETA \d+s", log_text), log_text


def test_a_run_from_before_a_trainer_setting_existed_resumes_with_its_default(tmp_path: Path) -> None:
    """A checkpoint written before ``trainer.cuda_graphs_check`` existed (a study's run stopped under an earlier
    version) resumes under this one, the new setting at its default."""
    cfg = tiny_config(tmp_path, ["trainer.max_steps=8", "trainer.validate_every=4", "trainer.log_every=2"])
    run = tmp_path / "run"
    with interrupted_at(4):
        train(cfg, run_dir=run)
    last = run / "checkpoints" / "last.pt"
    state = torch.load(last, weights_only=False)
    del state["config"]["trainer"]["cuda_graphs_check"]
    torch.save(state, last)
    proc = run_train_py(tmp_path / "cwd", f"trainer.resume={run}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((run / "results.json").read_text())["steps"] == 8


def test_attention_sizes_that_do_not_fit_are_a_config_error(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, ["attention=multihead", "attention.heads=7"])
    with pytest.raises(ConfigError, match="hidden_size 64 is not divisible by heads 7"):
        train(cfg, run_dir=tmp_path / "run")


def test_ranks_that_prepared_different_data_are_refused() -> None:
    from nmt.train.trainer import check_same_data

    same = {"fingerprint": "aa", "train_files": None}
    check_same_data([same, dict(same)])
    with pytest.raises(DataError, match=r"rank 1 prepared data with fingerprint bb, rank 0 with aa: .*data\.cache_dir"):
        check_same_data([same, {"fingerprint": "bb", "train_files": None}])


@pytest.mark.parametrize("name", sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml")))
def test_every_experiment_config_composes_and_validates(name: str) -> None:
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"experiment={name}", "trainer.seed=7"],
                      return_hydra_config=True)
    sweep_dir = f"{cfg.hydra.sweep.dir}/{cfg.hydra.sweep.subdir}"
    with open_dict(cfg):
        del cfg["hydra"]
    validate_config(cfg)
    if name == "multi30k_ensemble":  # one folder per member, named by its seed and direction
        assert sweep_dir == "runs/ensemble_de-en/seed7" and cfg.trainer.max_epochs == 15
    if name == "multi30k_best":  # the recipe chosen on val, also one folder per member
        assert sweep_dir == "runs/best_de-en/seed7"
        assert (cfg.model.layer_norm, cfg.model.dropout, cfg.trainer.max_epochs) == (True, 0.4, 20)


def test_recipe_runs_of_the_other_direction_go_to_their_own_folder() -> None:
    """en→de members of ``experiment=multi30k_best`` go to a folder of their own, beside the de→en runs."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", return_hydra_config=True,
                      overrides=["experiment=multi30k_best", "data.src_lang=en", "data.tgt_lang=de", "trainer.seed=3"])
    assert f"{cfg.hydra.sweep.dir}/{cfg.hydra.sweep.subdir}" == "runs/best_en-de/seed3"
    assert (cfg.data.src_lang, cfg.data.tgt_lang, cfg.model.layer_norm) == ("en", "de", True)


def test_the_en_de_back_translation_experiment_back_translates_with_the_de_en_one() -> None:
    """``multi30k_bt_ende``'s reverse model is the run ``multi30k_bt`` trains, so the two chain."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        de_en = compose(config_name="train", return_hydra_config=True, overrides=["experiment=multi30k_bt"])
        en_de = compose(config_name="train", return_hydra_config=True, overrides=["experiment=multi30k_bt_ende"])
    synthetic = en_de.data.mixture[1]
    assert synthetic.backtranslate.checkpoint == de_en.hydra.run.dir == "runs/bt_best_de-en/seed42"
    assert (synthetic.synthetic, synthetic.backtranslate.lang) == ("runs/bt_de", "de")
    assert (en_de.data.src_lang, en_de.data.tgt_lang, en_de.hydra.run.dir) == ("en", "de", "runs/bt_best_en-de/seed42")
    assert de_en.data.mixture[1].backtranslate.checkpoint == "runs/best_en-de/seed42"
