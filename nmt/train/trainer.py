"""The training job behind ``python train.py``: setup, then a loop that reads top to bottom (validate and checkpoint
when due, learning rate, forward, backward, clip, AdamW step, log), resumable exactly and multi-GPU under torchrun.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from nmt.common.batch_tokens import resolve_batch_tokens
from nmt.common.cuda_graphs import CudaGraphError, resolve_cuda_graphs
from nmt.common.device import (
    DeviceError,
    autocast,
    configure_matmul,
    no_gpu_note,
    slow_bf16_warning,
    uses_bf16,
)
from nmt.common.disk import WriteStopped, is_write_error, write_stopped_message
from nmt.common.files import FolderInUse, folder_lock, write_json_durably, write_text_durably
from nmt.common.metrics import corpus_scores
from nmt.common.provenance import device_name, host, library_versions
from nmt.common.settings import ConfigError, to_plain_dict
from nmt.data import Batch, DataError, EncodedSplit, PreparedData, Tokenizer, build_loader, prepare_data
from nmt.data.batching import ShapeBuckets
from nmt.inference.backtranslation import BacktranslationError, rebuild_synthetic_sources
from nmt.inference.engine import SearchOptions, TranslationError, Translator
from nmt.model.attention_stats import attention_sharpness
from nmt.model.checkpoint import CheckpointError, RunCheckpoints, build_model, detached_copy, load_checkpoint
from nmt.model.loss import sequence_loss
from nmt.model.search import Hypothesis
from nmt.model.seq2seq import count_parameters
from nmt.train import distributed
from nmt.train.distributed import DistInfo
from nmt.train.fast_step import StepResult, StepWindow, TrainingSteps
from nmt.train.gpu_monitor import GpuMonitor
from nmt.train.progress import Progress, RunClock, progress_line
from nmt.train.resume import restore_run, resume_config, resume_paths
from nmt.train.run_logger import RunLogger, format_results
from nmt.train.schema import validate_config

__all__ = ["USER_ERRORS", "DistInfo", "Trainer", "TrainingError", "lr_factor", "train"]

log = logging.getLogger(__name__)


class TrainingError(RuntimeError):
    """Training cannot go on for a reason the user can fix (memory, a diverging loss); the message says how."""


class ValidationInterrupted(Exception):
    """A signal came while validation decoded (one process): the run saves and stops, its resumed run validates."""


# What ``train`` raises for a mistake the user can fix; the message names the setting or file and the fix.
USER_ERRORS: tuple[type[Exception], ...] = (ConfigError, DataError, CheckpointError, DeviceError, TrainingError,
                                             FolderInUse, BacktranslationError, TranslationError, CudaGraphError)


def lr_factor(schedule: str, warmup_steps: int, total_steps: int, min_ratio: float) -> Callable[[int], float]:
    """Multiplier of the base learning rate at optimizer step ``step`` (0-based): warmup, then ``schedule``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        if schedule == "inverse_sqrt":
            return math.sqrt(warmup_steps / max(step, 1)) if warmup_steps else 1.0 / math.sqrt(step + 1)
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def check_same_data(ranks: list[dict[str, Any]]) -> None:
    """Refuse to train when the ranks' data fingerprints differ: nodes that each prepare their own cache would
    otherwise train silently on a mix of corpus files or settings.
    """
    for rank, seen in enumerate(ranks[1:], start=1):
        if seen["fingerprint"] != ranks[0]["fingerprint"]:
            raise DataError(
                f"rank {rank} prepared data with fingerprint {seen['fingerprint']}, rank 0 with "
                f"{ranks[0]['fingerprint']}: give every node the same corpus files and data.* settings, "
                "or one data.cache_dir on shared storage")


class Trainer:
    """Owns the run's objects (data, model, optimizer, logger, checkpoints) and the loop over them; ``resume_state``
    is a loaded checkpoint to continue from, or None.
    """

    def __init__(self, cfg: DictConfig, run_dir: Path, info: DistInfo,
                 resume_state: dict[str, Any] | None = None) -> None:
        setup_start = time.perf_counter()
        self.cfg, self.tcfg, self.run_dir, self.info = cfg, cfg.trainer, run_dir, info
        self.device = distributed.choose_device(self.tcfg.device, info)
        self.graph_use = resolve_cuda_graphs(self.tcfg.cuda_graphs, self.device, info.world_size, "trainer.cuda_graphs")
        self.use_graphs = self.graph_use.step
        self.precision, self.use_bf16 = self.tcfg.precision, uses_bf16(self.tcfg.precision, self.device)
        configure_matmul(self.precision, self.device)
        if info.is_main:
            self._warn_about_the_device()
        self.stop_signal: str | None = None
        # An own dropout stream per rank; DDP copies rank 0's weights.
        distributed.seed_everything(self.tcfg.seed + info.rank)

        self.data = self._prepare_data(resume_state)
        try:
            self.model = build_model(cfg, self.data.tokenizer).to(self.device)
        except ValueError as error:  # sizes that do not fit together, e.g. multihead heads not dividing hidden_size
            raise ConfigError(f"model/attention settings do not work together: {error}") from error
        self.ddp_model: nn.Module = distributed.wrap_model(self.model, info, self.device)
        t = self.tcfg
        # Fused: one kernel for the update, and it can skip a non-finite step without the host (``found_inf``).
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=t.lr, betas=tuple(t.betas),
                                           weight_decay=t.weight_decay, fused=True, capturable=self.use_graphs)
        self.train_loader = build_loader(self.data.train, cfg.data.max_tokens, shuffle=True, seed=t.seed,
                                         rank=info.rank, world_size=info.world_size,
                                         pin_memory=self.device.type == "cuda", num_workers=cfg.data.num_workers,
                                         bucket_width=t.bucket_width if self.use_graphs else None)
        self.batches_per_epoch = len(self.train_loader.batch_sampler)
        self.total_steps = min(t.max_epochs * self.batches_per_epoch, t.max_steps or math.inf)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_factor(t.lr_schedule, t.warmup_steps, self.total_steps, t.min_lr_ratio))
        # bf16 autocast needs no loss scaling; the scaler is kept (disabled) so checkpoints have one layout.
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=False)
        self.progress = Progress()
        if resume_state is not None:
            self.progress = restore_run(resume_state, self.model, self.optimizer, self.scheduler, self.scaler,
                                        self.tcfg, info)
            log.info("resumed at step %d (epoch %d, batch %d of %d)", self.progress.step, self.progress.epoch,
                     self.progress.batches_done, self.batches_per_epoch)
        # Clock, logs and checkpoint folder of the run; on every rank but 0 they write nothing.
        self.clock = RunClock(self.progress)
        self.logger = RunLogger(run_dir, self.total_steps, self.progress.step, enabled=info.is_main)
        self.checkpoints = RunCheckpoints(run_dir, self.tcfg.average_last, enabled=info.is_main)
        self.validation_writer = ThreadPoolExecutor(1, "nmt-validation")  # scores, logs, saves while training goes on
        self.validation_record: Future[dict[str, Any]] | None = None  # the progress it leaves, once written
        self.decoding_validation = False  # a signal now interrupts validation (one process only)
        self.heatmaps: list[Future[None]] = []  # drawn by the validation writer after the validation's checkpoints
        # The same on every rank (all load one checkpoint), so every rank agrees when validation is due.
        validations = self.progress.validations
        self.validated_at_step = int(validations[-1]["step"]) if validations else None
        self.steps = TrainingSteps(self.model, self.ddp_model, self.optimizer, self.device, self.use_graphs,
                                   check=t.cuda_graphs_check, label_smoothing=t.label_smoothing,
                                   max_norm=t.clip_grad_norm, precision=self.precision)
        self.pending_steps = StepWindow()  # figures still on the device
        self.translator: Translator | None = None  # validation's and the test's decoder, made at the first use
        self.window_loss, self.window_tokens = 0.0, 0  # since the last log line
        self.nonfinite_in_row, self.last_grad_norm = 0, math.nan
        self.setup_seconds = time.perf_counter() - setup_start  # data (SentencePiece training when not cached), model

    # ----------------------------------------------------------------------------------- setup

    def _warn_about_the_device(self) -> None:
        """One warning each: bf16 emulated on a CPU without bf16 instructions, a CUDA build of PyTorch without a GPU."""
        if warning := slow_bf16_warning(self.precision, self.device):
            log.warning("trainer.%s", warning)
        if note := no_gpu_note(self.tcfg.device, self.device):
            log.warning(note)

    def _prepare_data(self, resume_state: dict[str, Any] | None) -> PreparedData:
        # Rank 0 downloads, trains SentencePiece and caches; the others read what it wrote.
        with distributed.main_process_first(self.info):
            rebuild_synthetic_sources(self.cfg.data)  # a mixture's missing back-translations (the others find them)
            data = prepare_data(self.cfg.data)
        self.data_ranks = distributed.gather_from_ranks(
            {"fingerprint": data.fingerprint, "train_files": data.train.src_ids.paths}, self.info)
        check_same_data(self.data_ranks)
        if resume_state and Tokenizer.from_state(resume_state["tokenizer"]).to_state() != data.tokenizer.to_state():
            raise CheckpointError(
                f"cannot resume from {self.run_dir}: the SentencePiece model prepared now differs from the "
                "checkpoint's; resume with the same data settings (the checkpoint's config is used by default)")
        return data

    # ------------------------------------------------------------------------------------ loop
    def fit(self) -> dict[str, Any]:
        """Train until max_steps / max_epochs / early stopping / a signal; then test. Returns metrics."""
        self.logger.keep_steps_until(self.progress.step)  # on resume, drop what the cut-off run wrote later
        self.checkpoints.drop_averaging_after(self.progress.step)
        self.logger.display.message(f"training {self.cfg.attention.name}: {count_parameters(self.model)} parameters, "
                                    f"{self.batches_per_epoch} batches per epoch, {self.total_steps} steps planned, "
                                    f"device {self.device}")
        gpu = GpuMonitor.for_device(self.device) if self.info.is_main else GpuMonitor(None)
        if self.use_graphs:
            self._capture_steps()
        self.clock.start()
        self.last_saved_at = time.monotonic()  # when last.pt was last written, for checkpoint_every_minutes
        with self._signals_stop_training(), gpu:
            try:
                stopped_early = self._loop()
                self._read_steps()  # the steps after the last log line
            finally:
                self._take_validation_record(wait=True)  # on disk (or its error raised) before anything reports it
                self._wait_for_heatmaps()
        self.clock.stop()  # the final evaluation is timed on its own
        self.logger.display.close()  # what follows, the final summary, is printed below the bar
        self.gpu_utilisation = gpu.summary()
        return self._save_interrupted() if self.stop_signal is not None else self._finish(stopped_early)

    def _capture_steps(self) -> None:
        """Every shape the planned epochs' batches take, captured before the first step (one pass, one pool)."""
        sampler, planned = self.train_loader.batch_sampler, math.ceil(self.total_steps / self.batches_per_epoch)
        buckets = ShapeBuckets(self.tcfg.bucket_width, self.cfg.data.max_tokens)
        shapes = buckets.shapes_of(sampler, range(self.progress.epoch, max(planned, self.progress.epoch + 1)))
        examples = [buckets.example(shape) for shape in shapes]
        self.steps.capture_up_front([e.pin_memory() if self.device.type == "cuda" else e for e in examples])
        stats = self.steps.stats
        fallback = f" ({stats.fallback})" if stats.fallback else ""
        self.logger.display.message(f"cuda graphs: {len(stats.shapes)} batch shapes captured in "
                                    f"{stats.capture_seconds:.1f}s{fallback}")

    def _loop(self) -> bool:
        """One optimizer step per batch until the plan, a signal or early stopping ends it. True = early stop."""
        batches, p = self._batches(), self.progress
        while True:
            # The next epoch starts once this one's batches are done (not after the planned last step).
            if p.batches_done >= self.batches_per_epoch and p.step < self.total_steps:
                p.epoch += 1
                p.batches_done = 0
            self._take_validation_record(wait=False)  # once written; a write error surfaces here, at once
            if self._validation_due() and not self._signalled():  # after a signal the resumed run validates
                self._read_steps()  # the log is complete up to the checkpoint
                with self.clock.outside_window():  # validation is not training time
                    if self._validate_and_checkpoint():
                        return True
            if self._should_stop():
                return False
            batch = next(batches)
            step_started = time.perf_counter()
            result = self.train_step(batch)
            p.batches_done += 1
            self._count_step(result, step_started)
            if p.step % self.tcfg.log_every == 0 or p.step == self.total_steps:
                self._read_steps()
                self._log_line(result.lr)
                self._save_last_when_due()

    def train_step(self, batch: Batch) -> StepResult:
        """One optimizer step (forward, backward, clip, AdamW, learning rate), its figures left on the device.

        A non-finite loss or gradient skips the update but counts as a step; ``_read_steps`` reports it.
        """
        lr = self.scheduler.get_last_lr()[0]
        self.model.train()
        figures = self.steps.run(batch, lr, bucketed=self.use_graphs)
        self.scheduler.step()
        return StepResult(figures, batch.num_tgt_tokens, lr)

    def _batches(self) -> Iterator[Batch]:
        """This rank's batches, epoch after epoch, from where the run stands (the sampler's order is seeded)."""
        while True:
            self.train_loader.batch_sampler.set_epoch(self.progress.epoch, start=self.progress.batches_done)
            yield from self.train_loader

    def _validation_due(self) -> bool:
        """Every ``validate_every`` steps (default: at each epoch's end) and at the planned last step; once a step."""
        step, every = self.progress.step, self.tcfg.validate_every
        if step == 0 or step == self.validated_at_step:
            return False
        epoch_ended = not every and self.progress.batches_done == 0
        return step == self.total_steps or epoch_ended or bool(every and step % every == 0)

    def _should_stop(self) -> bool:
        """The planned steps are done, or a signal reached any rank. A collective."""
        return self._signalled() or self.progress.step >= self.total_steps

    def _signalled(self) -> bool:
        """Whether a signal reached any rank (all then stop at the same step). A collective."""
        signalled = distributed.any_rank(self.stop_signal is not None, self.info, self.device)
        if signalled and self.stop_signal is None:
            self.stop_signal = "another rank's signal"
        return signalled

    def _count_step(self, result: StepResult, step_started: float) -> None:
        """Book an optimizer step on the host (progress, clock); its figures wait in ``pending_steps``."""
        self.progress.step += 1
        self.progress.target_tokens += result.tokens
        self.progress.train_seconds += time.perf_counter() - step_started
        self.pending_steps.add(self.progress.step, result)

    def _read_steps(self) -> None:
        """Read the pending steps' figures back (one transfer, the loop's only wait for the device): their
        train_log.jsonl lines, the log window, and the check for non-finite steps in a row.
        """
        waited = time.perf_counter()
        rows = self.pending_steps.read()
        self.progress.train_seconds += time.perf_counter() - waited  # the device finishing the steps' work
        for row in rows:
            self.nonfinite_in_row = self.nonfinite_in_row + 1 if row["skipped"] else 0
            if row["skipped"]:
                self.logger.display.message(f"warning: non-finite loss or gradient at step {row['step']}; "
                                            "its update was skipped")
            else:
                self.window_loss += row["loss_sum"]
                self.window_tokens += row["tokens"]
            if self.nonfinite_in_row >= self.tcfg.max_nonfinite_steps:
                raise TrainingError(
                    f"{self.nonfinite_in_row} non-finite losses in a row at step {row['step']}: lower trainer.lr or "
                    f"set trainer.clip_grad_norm (now lr={self.tcfg.lr}, clip={self.tcfg.clip_grad_norm})")
        self.logger.steps([{"step": row["step"], "loss": row["loss_sum"] / max(1, row["tokens"]), "lr": row["lr"],
                            "grad_norm": row["grad_norm"]} for row in rows])
        self.last_grad_norm = rows[-1]["grad_norm"] if rows else math.nan

    def _log_line(self, lr: float) -> None:
        """TensorBoard's train scalars and the progress line (or bar) for the window since the last one."""
        step, grad_norm = self.progress.step, self.last_grad_norm
        loss = self.window_loss / max(1, self.window_tokens)
        tokens_per_s = self.clock.close_window(self.window_tokens * self.info.world_size)
        self.window_loss, self.window_tokens = 0.0, 0
        self.logger.scalars("train", {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "lr": lr, "grad_norm": grad_norm,
                                      "tokens_per_s": tokens_per_s, "epoch": float(self.progress.epoch)}, step)
        self.clock.sync_wall_clock()
        line = progress_line(step, self.total_steps, self.progress.epoch, loss, lr, tokens_per_s,
                             self.progress.wall_seconds, self.clock.eta_seconds(self.total_steps))
        self.logger.display.move_to(step, line, {"loss": f"{loss:.3f}", "tok/s": f"{tokens_per_s:,.0f}"})

    # ------------------------------------------------------------------------- stop and signals
    @contextmanager
    def _signals_stop_training(self) -> Iterator[None]:
        """SIGINT / SIGTERM finish the current step, then save and stop (instead of killing the process)."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        """Stop within seconds: a validation due (or, in one process, under way) is left to the resumed run, which
        validates at the same step, so its log and checkpoints are the uninterrupted run's."""
        self.stop_signal = signal.Signals(signum).name
        log.warning("%s received: finishing this step, then saving checkpoints/last.pt", self.stop_signal)
        if self.decoding_validation:
            self.decoding_validation = False  # one raise, however many signals follow
            raise ValidationInterrupted

    def _save_last_when_due(self) -> None:
        """``last.pt`` every ``checkpoint_every_minutes`` between validations, so that a kill no handler sees (SIGKILL,
        a machine taken away) loses minutes, not the steps since the last validation. Due when due on any rank, so
        every rank takes part in the save (a collective); rank 0 writes it, as a signal's save does.
        """
        minutes = self.tcfg.checkpoint_every_minutes
        due = minutes is not None and time.monotonic() - self.last_saved_at >= 60 * minutes
        if distributed.any_rank(due, self.info, self.device) and self.progress.step < self.total_steps:
            self.save("last")
            self.last_saved_at = time.monotonic()

    def _save_interrupted(self) -> dict[str, Any]:
        self.save("last")
        self.logger.display.message(f"stopped by {self.stop_signal} at step {self.progress.step}; checkpoint saved. "
                                    f"Resume with:\n  python train.py trainer.resume={self.run_dir}")
        self.logger.close()
        return {"interrupted": True, "step": self.progress.step}

    def _finish(self, stopped_early: bool) -> dict[str, Any]:
        """Rank 0 scores the best (and averaged) weights on every split, writes ``results.json`` (the scores and the
        run's ``summary``) and the TensorBoard HParams, prints a summary; returns results.json's contents (else {}).
        """
        distributed.barrier(self.info)
        if not self.info.is_main:
            return {}
        started = time.perf_counter()
        best = self.checkpoints.load("best")
        self.model.load_state_dict(best["model"])
        results = self._evaluate_weights("best", best["progress"]["step"])
        averaged = self.checkpoints.averaged_weights()
        if averaged is not None:
            self.model.load_state_dict(averaged)
            results["averaged"] = self._evaluate_weights(f"average of last {self.tcfg.average_last}", None)
            self.model.load_state_dict(best["model"])
        results.update(self.summary(stopped_early))
        results["final_evaluation_seconds"] = time.perf_counter() - started
        path = self.run_dir / "results.json"
        write_json_durably(path, results)
        print(format_results(results, path), flush=True)
        self.logger.hparams(self.cfg, results)
        self.logger.close()
        return results

    def _evaluate_weights(self, label: str, step: int | None) -> dict[str, Any]:
        """Beam-search scores of the model's current weights (``label``: ``best``, ``average of last 3``) on the
        validation and test splits; with ``step`` (the best checkpoint's) the test translations are written too.
        """
        beam, data = self.tcfg.test_beam_size, self.data
        loss = self.teacher_forced_loss(data.valid)
        valid = {**corpus_scores(self.decode(data.valid, beam)[0], data.valid.tgt_text), "loss": loss}
        test = {}
        for name, split in data.tests.items():
            started = time.perf_counter()
            hypotheses = self.decode(split, beam)[0]
            seconds = time.perf_counter() - started  # the search's, read back and detokenized: what a user waits
            test[name] = {**corpus_scores(hypotheses, split.tgt_text), "decode_seconds": seconds,
                          "sentences_per_s": len(split) / max(seconds, 1e-9)}
            if step is not None:  # the best checkpoint's translations and sharpness, for the reports (compare_runs.py)
                test[name]["attention_sharpness"] = attention_sharpness(self.model, split)  # kept when checkpoints go
                out = self.run_dir / "translations" / f"{name}.{self.cfg.data.tgt_lang}"
                write_text_durably(out, "".join(h + "\n" for h in hypotheses))
        return {"checkpoint": label, "checkpoint_step": step, "beam_size": beam,
                "length_penalty": self.tcfg.length_penalty, "valid": valid, "test": test}

    def summary(self, stopped_early: bool) -> dict[str, Any]:
        """What the run was and what it took: sizes, steps, the clock, throughput, device, data and versions."""
        p, tcfg, data_cfg = self.progress, self.tcfg, self.cfg.data
        return {
            "attention": self.cfg.attention.name,
            "parameters": count_parameters(self.model),
            "steps": p.step,
            "epochs": p.epoch + p.batches_done / max(1, self.batches_per_epoch),
            "stopped_early": stopped_early,
            "best_val_bleu_greedy" if tcfg.val_beam_size == 1 else "best_val_bleu": p.best_bleu,
            "best_step": p.best_step,
            "train_seconds": p.train_seconds,
            "train_target_tokens_per_s": p.target_tokens * self.info.world_size / max(1e-9, p.train_seconds),
            "setup_seconds": self.setup_seconds,
            "wall_seconds": p.wall_seconds,
            "validation_seconds": p.validation_seconds,
            "cuda_graphs": asdict(self.steps.stats) if self.use_graphs else None,
            "search_graphs": asdict(graphs.stats) if (graphs := getattr(self.translator, "graphs", None)) else None,
            "gpu_utilisation": self.gpu_utilisation,
            "validations": p.validations,
            "device": device_name(self.device),
            "precision": self.precision,
            "bf16_autocast": self.use_bf16,
            "world_size": self.info.world_size,
            "data_fingerprint": self.data.fingerprint,
            "data_sources": self.data.stats.get("sources", []),
            "train_files_by_rank": [seen["train_files"] for seen in self.data_ranks],
            "versions": library_versions(),
            "host": host(),
            "src_lang": data_cfg.src_lang,
            "tgt_lang": data_cfg.tgt_lang,
            "run_dir": str(self.run_dir),
        }

    # ------------------------------------------------------------------------------ checkpoints
    def save(self, *names: str) -> None:
        """Write ``checkpoints/<name>.pt`` for each name (``"last"``, ``"best"``; rank 0 writes) and wait until they
        are on disk. A collective: every rank's RNG states are gathered into it. A validation's checkpoints are
        written by ``_record_and_save``.
        """
        self._take_validation_record(wait=True)  # the progress saved holds the last validation
        state = self._checkpoint_state()
        if state is not None:
            self.checkpoints.save(names, state)

    def _checkpoint_state(self) -> dict[str, Any] | None:
        """Everything a checkpoint holds, copied to the CPU now (rank 0; None elsewhere). A collective."""
        rng_states = distributed.gather_from_ranks(distributed.rng_state(), self.info)  # indexed by rank
        self.clock.sync_wall_clock()
        if not self.info.is_main:
            return None
        return detached_copy({**self._weights_state(), "optimizer": self.optimizer.state_dict(),
                              "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
                              "rng": rng_states, "progress": asdict(self.progress)})

    def _weights_state(self) -> dict[str, Any]:
        """What rebuilds the model with no other file: config, tokenizer, weights."""
        return {"config": to_plain_dict(self.cfg), "tokenizer": self.data.tokenizer.to_state(),
                "model": self.model.state_dict()}

    # ------------------------------------------------------------------------------ validation
    def _validate_and_checkpoint(self) -> bool:
        """Validate (rank 0) and write the validation's checkpoints; decide early stopping on every rank. True = stop
        early. Scoring, logging and writing run on the writer thread from the state copied now: training goes on
        meanwhile where this validation cannot stop the run (``_records_in_background``), else it waits for them.
        """
        self.validated_at_step = self.progress.step
        self.last_saved_at = time.monotonic()  # this validation writes last.pt
        self._take_validation_record(wait=True)  # the previous one's best and patience count hold from here
        try:
            outputs = self._validation_outputs() if self.info.is_main else None
        except ValidationInterrupted:
            return False  # the loop stops at the signal; the resumed run validates this step
        state = self._checkpoint_state()  # a collective: every rank's RNG states
        if state is not None:
            self.validation_record = self.validation_writer.submit(self._record_and_save, outputs, state)
        if self._records_in_background():
            return False
        self._take_validation_record(wait=True)
        p, patience = self.progress, self.tcfg.early_stopping_patience
        p.best_bleu, p.best_step, p.bad_validations = distributed.broadcast_from_main(
            [p.best_bleu, p.best_step, p.bad_validations], self.info)
        stop = patience is not None and p.bad_validations >= patience
        if stop:
            self.logger.display.message(f"early stopping: no BLEU gain in {patience} validations")
        return stop

    def _records_in_background(self) -> bool:
        """Whether this validation's scoring can follow in the background: one process, and no early stop possible."""
        patience = self.tcfg.early_stopping_patience
        return self.info.world_size == 1 and (patience is None or self.progress.bad_validations + 1 < patience)

    def _take_validation_record(self, wait: bool) -> None:
        """Take over the progress the last validation left (best, patience count, record) once its checkpoints are
        written, or (``wait``) after waiting for them: only the training thread changes ``self.progress``.
        Raises the writer's error (a write that failed) at once.
        """
        record = self.validation_record
        if record is None or not (wait or record.done()):
            return
        self.validation_record = None
        left, p = record.result(), self.progress
        p.best_bleu, p.best_step, p.bad_validations = left["best_bleu"], left["best_step"], left["bad_validations"]
        p.validations = list(left["validations"])

    def _validation_outputs(self) -> dict[str, Any]:
        """What validation needs from the device: the teacher-forced loss and the decoded split, and when it was.
        A signal meanwhile (one process) raises ``ValidationInterrupted``: decoding can take minutes."""
        p = self.progress
        self.decoding_validation = self.info.world_size == 1  # with more, the other ranks wait in a collective
        try:
            loss = self.teacher_forced_loss(self.data.valid)
            hypotheses, best = self.decode(self.data.valid, self.tcfg.val_beam_size)
        finally:
            self.decoding_validation = False
        self.clock.sync_wall_clock()
        return {"step": p.step, "epoch": p.epoch + p.batches_done / max(1, self.batches_per_epoch),
                "train_seconds": p.train_seconds, "wall_seconds": p.wall_seconds, "loss": loss,
                "hypotheses": hypotheses, "best": best}

    def _record_and_save(self, outputs: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        """Score and log a validation, then write its checkpoints from ``state`` (copied at it) with the progress it
        leaves, which is returned for the training thread to take over. Runs on the writer thread."""
        progress = state["progress"]  # the copy's: the run's own is the training thread's
        improved = self._record_validation(outputs, progress)
        self.checkpoints.save_validation(outputs["step"], state, best=improved)
        return progress

    def _record_validation(self, outputs: dict[str, Any], progress: dict[str, Any]) -> bool:
        """Score a validation's outputs, log them (scores, samples, heatmaps), and update ``progress`` (a checkpoint's
        copy: the best, the patience count, the record). True = a new best."""
        split, step = self.data.valid, outputs["step"]
        hypotheses, loss = outputs["hypotheses"], outputs["loss"]
        scores = corpus_scores(hypotheses, split.tgt_text)
        metrics = {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "bleu": scores["bleu"], "chrf": scores["chrf"]}
        self.logger.scalars("val", metrics, step)
        improved = metrics["bleu"] > progress["best_bleu"]
        self._log_examples(split, hypotheses, outputs["best"], step, heatmaps=improved)
        if improved:
            progress.update(best_bleu=metrics["bleu"], best_step=step, bad_validations=0)
        else:
            progress["bad_validations"] += 1
        progress["validations"].append({**{k: outputs[k] for k in ("step", "epoch", "train_seconds", "wall_seconds")},
                                        "bleu": metrics["bleu"], "chrf": metrics["chrf"], "loss": metrics["loss"]})
        self.logger.display.message(
            f"validation at step {step}: BLEU {metrics['bleu']:.2f} chrF {metrics['chrf']:.2f} "
            f"loss {metrics['loss']:.3f} (teacher-forced ppl {metrics['ppl']:.2f})"
            + (" new best" if improved else f" (best {progress['best_bleu']:.2f} at {progress['best_step']})"))
        return improved

    @torch.no_grad()
    def teacher_forced_loss(self, split: EncodedSplit) -> float:
        """Cross-entropy (no label smoothing) per target token over ``split``."""
        self.model.eval()
        total, tokens = torch.zeros((), device=self.device), 0
        for batch in build_loader(split, self.cfg.data.valid_max_tokens, shuffle=False):
            batch = batch.to(self.device)
            with autocast(self.precision, self.device):
                logits, _ = self.model(batch.src, batch.src_lengths, batch.tgt_in)
            total += sequence_loss(logits, batch.tgt_out)  # summed on the device: one read at the end
            tokens += batch.num_tgt_tokens
        return total.item() / max(1, tokens)

    def decode(self, split: EncodedSplit, beam_size: int) -> tuple[list[str], list[Hypothesis]]:
        """The best translation of each of ``split``'s sources, in its order: detokenized, and as a hypothesis (ids
        and attention). Decoded by the engine every use of a trained model shares, with the run's precision.
        """
        self.model.eval()
        options = SearchOptions(beam_size=beam_size, length_penalty=self.tcfg.length_penalty,
                                batch_tokens=resolve_batch_tokens("auto", self.device, self.cfg.data.valid_max_tokens))
        translator = self._translator()
        best = [nbest[0] for nbest in translator.translate_ids(split.src_ids, options)]
        return [self.data.tokenizer.decode_tgt(h.tokens) for h in best], best

    def _translator(self) -> Translator:
        """The run's one Translator (its search graphs kept from one validation to the next), with today's weights."""
        if self.translator is None:
            self.translator = Translator(self.model, self.data.tokenizer, precision=self.precision,
                                         cuda_graphs=self.graph_use.search,
                                         cuda_graphs_check=self.tcfg.cuda_graphs_check)
        else:
            self.translator.refresh()  # the weights changed in place since the last decode
        return self.translator

    def _log_examples(self, split: EncodedSplit, hypotheses: list[str], best: list[Hypothesis], step: int,
                      heatmaps: bool) -> None:
        """Sample translations as text, and (with ``heatmaps``) attention heatmaps of a fixed handful of sentences.

        ``best`` are validation's own hypotheses (their attention included), ``hypotheses`` their text. Heatmaps are
        drawn at a new best only, and by the validation writer once the validation's checkpoints are written, while
        training goes on: matplotlib's rendering is the slow part of logging (about 0.1 s a heatmap on a CPU core),
        and the best is what you look at. No thread of their own: glibc would give it a memory arena of its own,
        which keeps what the largest figure needed (tens of MB) for the rest of the run.
        """
        rows = [f"**src:** {split.src_text[i]}  \n**ref:** {split.tgt_text[i]}  \n**hyp:** {hypotheses[i]}"
                for i in range(min(self.tcfg.num_samples, len(split)))]
        self.logger.text("samples", "\n\n".join(rows), step)
        tok = self.data.tokenizer
        for i, (src_ids, hyp) in enumerate(zip(split.src_ids[: self.tcfg.num_heatmaps if heatmaps else 0], best)):
            if hyp.attention is None or hyp.attention.numel() == 0:  # attention=none has no weights
                continue
            weights = hyp.attention.float()  # [T_hyp, S]
            src_labels = (tok.src_pieces(src_ids) + ["</s>"])[: weights.shape[1]]
            tgt_labels = (tok.tgt_pieces(hyp.tokens) + ["</s>"])[: weights.shape[0]]
            self.heatmaps.append(self.validation_writer.submit(
                self.logger.attention, f"attention/{i}", weights[: len(tgt_labels), : len(src_labels)], src_labels,
                tgt_labels, step))

    def _wait_for_heatmaps(self) -> None:
        """Until every heatmap submitted is drawn (its error raised); called once the last record is taken."""
        heatmaps, self.heatmaps = self.heatmaps, []
        for drawn in heatmaps:
            drawn.result()


def train(cfg: DictConfig, run_dir: str | Path | None = None) -> dict[str, Any]:
    """Train (or resume) a model as configured; return the final metrics (Hydra sweeps use them).

    Args:
        run_dir: where outputs go; default: Hydra's run dir. A resumed run writes on into its own.

    Raises:
        ConfigError, DataError, CheckpointError, DeviceError, TrainingError: a problem the user can fix; the
            message says how (``train.py`` prints it in one line and exits with status 2).
        WriteStopped: a write failed (a full disk, no permission, an I/O error); names the file, the cause, the
            checkpoints kept and the ``trainer.resume`` command (status 74).
    """
    validate_config(cfg)
    resume_state = None
    if cfg.trainer.resume:
        checkpoint_path, run_dir = resume_paths(cfg.trainer.resume)
        resume_state = load_checkpoint(checkpoint_path)
        cfg = resume_config(cfg, resume_state)
        cfg.trainer.resume = None
        validate_config(cfg)
    if run_dir is None:
        from hydra.core.hydra_config import HydraConfig

        run_dir = HydraConfig.get().runtime.output_dir
    run_dir = Path(run_dir)  # created by its lock
    info = distributed.setup_distributed(cfg.trainer.device)
    # One train.py writes a run: the main rank holds its lock (the others hold nothing).
    advice = ("wait for it to finish (or stop it), then resume; two processes writing one run would overwrite "
              "each other's checkpoints.")
    lock = folder_lock(run_dir, f"train.py (pid {os.getpid()})", advice) if info.is_main else contextlib.nullcontext()
    results = None
    try:
        with lock:
            trainer = Trainer(cfg, run_dir, info, resume_state)
            if warning := trainer.checkpoints.space_warning(trainer.model):
                log.warning(warning)
            if info.is_main:
                write_text_durably(run_dir / "config.yaml", OmegaConf.to_yaml(to_plain_dict(cfg)))
            results = trainer.fit()
    except torch.cuda.OutOfMemoryError as error:
        raise TrainingError(
            f"CUDA out of memory: lower data.max_tokens (now {cfg.data.max_tokens}) or "
            f"data.valid_max_tokens (now {cfg.data.valid_max_tokens}), or use a smaller model=..."
        ) from error
    except OSError as error:  # a write that failed: the last good checkpoints stand (written whole or not at all)
        kept = RunCheckpoints(run_dir).kept() if is_write_error(error) else None
        if kept is None:  # nothing to resume from: train.py says "run the same command again"
            raise
        raise WriteStopped(write_stopped_message(error, kept, f"python train.py trainer.resume={run_dir}")) from None
    finally:
        distributed.shutdown(info, finished=results is not None)
    return results
