"""The training job behind ``python train.py``: setup, the loop, validation, checkpoints, the final test.

The loop reads top to bottom, one optimizer step per batch:
    forward (bf16 autocast as ``trainer.precision`` says) -> label-smoothed cross-entropy per target token -> backward
    -> clip -> AdamW step -> learning-rate schedule -> log -> validate + checkpoint when due

Validation reports teacher-forced loss and perplexity (labelled as such), and BLEU / chrF from
sacrebleu on decoded, detokenized output against the raw references. The best checkpoint and early
stopping follow validation BLEU. At the end the best checkpoint is scored on every test split
(beam search) and ``results.json`` is written in the run dir.

Learning-rate schedule (documented choice): linear warmup for ``warmup_steps``, then cosine decay to
``min_lr_ratio * lr`` at the planned last step (default), or inverse square root, or constant.

Runs resume exactly: a checkpoint holds weights, optimizer, scheduler, scaler, RNG states, the step,
the epoch and how many of the epoch's batches were consumed (the sampler continues its shuffled order
from there). Multi-GPU: ``torchrun --nproc_per_node=N train.py`` (DistributedDataParallel; NCCL on
GPU, gloo on CPU); rank 0 alone writes logs and checkpoints.

Deliberately not here: the model (``nmt.model``), search (``nmt.search``), scoring
(``nmt.evaluation``), the checkpoint format (``nmt.checkpoint``).
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from nmt.checkpoint import CHECKPOINT_DIR, load_checkpoint, save_checkpoint
from nmt.config import to_plain_dict, upgrade_saved_config, validate_config
from nmt.data import PAD_ID, Batch, EncodedSplit, PreparedData, Tokenizer, build_loader, prepare_data
from nmt.device import autocast, configure_matmul, resolve_device, slow_bf16_warning, uses_bf16
from nmt.evaluation import corpus_scores
from nmt.gpu_monitor import GpuMonitor
from nmt.model import Seq2Seq, count_parameters
from nmt.provenance import device_name, host, library_versions
from nmt.search import Hypothesis
from nmt.tensorboard import RunLogger
from nmt.translator import SearchOptions, Translator

log = logging.getLogger(__name__)
DISTRIBUTED_TIMEOUT = datetime.timedelta(hours=1)  # how long a rank waits in a collective before the run aborts


@dataclass
class Progress:
    """Where a run stands; saved in every checkpoint."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0  # current epoch (0-based)
    batches_done: int = 0  # this rank's batches consumed in the current epoch
    best_bleu: float = -1.0
    best_step: int = 0
    bad_validations: int = 0  # validations since the last new best
    train_seconds: float = 0.0  # optimizer steps only: batch fetching and validation not included
    wall_seconds: float = 0.0  # the loop's wall-clock time, validations included, summed over resumes
    target_tokens: int = 0  # real target tokens trained on (this rank)
    # One entry per validation: step, epoch, train/wall seconds so far, greedy BLEU, chrF, loss.
    # It answers "how long until the model was this good" (the GPU time-to-BLEU figure).
    validations: list[dict[str, float]] = field(default_factory=list)


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed(device_name: str) -> DistInfo:
    """Join the process group when started by ``torchrun`` (WORLD_SIZE > 1); else a single process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return DistInfo()
    use_cuda = torch.cuda.is_available() and device_name != "cpu"
    if not dist.is_initialized():
        # Rank 0 validates alone while the others wait in a collective: on a large validation set with beam
        # search that can take longer than the default 10-minute collective timeout, which would abort the run.
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", timeout=DISTRIBUTED_TIMEOUT)
    return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def choose_device(name: str, info: DistInfo) -> torch.device:
    """``trainer.device`` resolved (``nmt.device``); under torchrun each process takes its local rank's GPU."""
    device = resolve_device(name, "trainer.device", info.local_rank if info.world_size > 1 else None)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def gather_rng_states(info: DistInfo) -> list[dict[str, Any]]:
    """Every rank's RNG states, indexed by rank. A collective: all ranks call it at the same point."""
    if info.world_size == 1:
        return [rng_state()]
    states: list[Any] = [None] * info.world_size
    dist.all_gather_object(states, rng_state())
    return states


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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


def sequence_loss(logits: Tensor, targets: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """Summed cross-entropy over real target tokens. logits ``[B, T, V]``, targets ``[B, T]`` -> scalar."""
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),  # [B*T, V], float32 for a stable log-softmax
        targets.reshape(-1),
        ignore_index=PAD_ID,
        label_smoothing=label_smoothing,
        reduction="sum",
    )


def run_dir_from_hydra() -> Path:
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)


def resume_config(cfg: DictConfig, state: dict[str, Any]) -> DictConfig:
    """The config of a resumed run: the checkpoint's, with this invocation's ``trainer`` keys on top.

    Under Hydra, only the dotted overrides typed on the command line are applied (so a run started
    with ``experiment=smoke`` keeps its settings when resumed with a bare ``trainer.resume=DIR``).
    """
    saved = OmegaConf.create(upgrade_saved_config(state["config"]))
    try:
        from hydra.core.hydra_config import HydraConfig

        overrides = [o for o in HydraConfig.get().overrides.task if "." in o.split("=")[0]]
        overrides = [o.lstrip("+~") for o in overrides if not o.startswith("hydra.")]
        merged = OmegaConf.merge(saved, OmegaConf.from_dotlist(overrides))
    except ValueError:  # not running under Hydra (tests, notebooks): take this config's trainer section
        merged = OmegaConf.merge(saved, {"trainer": cfg.trainer})
    for group in ("data", "model", "attention"):
        if OmegaConf.select(cfg, group) is not None and OmegaConf.to_container(cfg[group], resolve=True) != \
                OmegaConf.to_container(merged[group], resolve=True):
            log.warning("resuming: using the checkpoint's %s config, not this invocation's", group)
    return merged


class Trainer:
    """Owns the run's objects (data, model, optimizer, logger) and the loop over them.

    Args:
        cfg: the validated config.
        run_dir: where checkpoints, events and results go.
        info: this process's place in a distributed run.
        resume_state: a loaded checkpoint to continue from, or None.
        interrupt_at_step: behave as if SIGINT arrived after this step (tests, preemption drills).
    """

    def __init__(
        self,
        cfg: DictConfig,
        run_dir: Path,
        info: DistInfo,
        resume_state: dict[str, Any] | None = None,
        interrupt_at_step: int | None = None,
    ) -> None:
        setup_start = time.perf_counter()
        self.cfg, self.tcfg, self.run_dir, self.info = cfg, cfg.trainer, run_dir, info
        self.device = choose_device(self.tcfg.device, info)
        self.precision = self.tcfg.precision
        self.use_bf16 = uses_bf16(self.precision, self.device)
        configure_matmul(self.precision, self.device)
        if info.is_main and (warning := slow_bf16_warning(self.precision, self.device)):
            log.warning("trainer.%s", warning)
        self.interrupt_at_step = interrupt_at_step
        self.stop_signal: str | None = None
        seed_everything(self.tcfg.seed + info.rank)  # own dropout stream per rank; DDP copies rank 0's weights

        self.data = self._prepare_data(resume_state)
        self.model = Seq2Seq.from_config(
            cfg.model, cfg.attention, self.data.tokenizer.src_vocab_size, self.data.tokenizer.tgt_vocab_size
        ).to(self.device)
        self.ddp_model: nn.Module = self.model
        if info.world_size > 1:
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp_model = DistributedDataParallel(self.model, device_ids=device_ids)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=self.tcfg.lr, betas=tuple(self.tcfg.betas), weight_decay=self.tcfg.weight_decay
        )
        self.train_loader = build_loader(
            self.data.train, cfg.data.max_tokens, shuffle=True, seed=self.tcfg.seed, rank=info.rank,
            world_size=info.world_size, pin_memory=self.device.type == "cuda", num_workers=cfg.data.num_workers,
        )
        self.batches_per_epoch = len(self.train_loader.batch_sampler)
        self.total_steps = self.tcfg.max_epochs * self.batches_per_epoch
        if self.tcfg.max_steps:
            self.total_steps = min(self.total_steps, self.tcfg.max_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lr_factor(self.tcfg.lr_schedule, self.tcfg.warmup_steps, self.total_steps, self.tcfg.min_lr_ratio),
        )
        # bf16 autocast needs no loss scaling; the scaler is kept (disabled) so checkpoints have one layout.
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=False)
        self.progress = Progress()
        if resume_state is not None:
            self._restore(resume_state)
        self.logger = RunLogger(run_dir, self.total_steps, self.progress.step, enabled=info.is_main)
        self.history_path = run_dir / "train_log.jsonl"
        self._wall_clock_from: tuple[float, float] | None = None  # (perf_counter at fit start, wall_seconds then)
        self.gpu_utilisation: dict[str, Any] = {"available": False, "reason": "not trained yet"}
        self.setup_seconds = time.perf_counter() - setup_start  # data (SentencePiece training when not cached), model

    # ----------------------------------------------------------------------------------- setup
    def _prepare_data(self, resume_state: dict[str, Any] | None) -> PreparedData:
        # Rank 0 prepares (downloads, trains SentencePiece, caches); the others then read its cache.
        if self.info.world_size > 1 and not self.info.is_main:
            dist.barrier()
        data = prepare_data(self.cfg.data)
        if self.info.world_size > 1 and self.info.is_main:
            dist.barrier()
        if resume_state is not None:
            saved = Tokenizer.from_state(resume_state["tokenizer"])
            if saved.to_state() != data.tokenizer.to_state():
                raise RuntimeError("the SentencePiece model prepared now differs from the checkpoint's; "
                                   "resume with the same data settings (the checkpoint's config is used by default)")
        return data

    def _restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.progress = Progress(**state["progress"])
        saved_rng = state["rng"] if isinstance(state["rng"], list) else [state["rng"]]  # older checkpoints: one dict
        if len(saved_rng) != self.info.world_size and self.info.is_main:
            log.warning("the checkpoint holds RNG states for %d process(es), this run has %d: the dropout streams "
                        "(and with another world size, the data shares) differ from the uninterrupted run's",
                        len(saved_rng), self.info.world_size)
        set_rng_state(saved_rng[self.info.rank % len(saved_rng)])
        log.info("resumed at step %d (epoch %d, batch %d of %d)", self.progress.step, self.progress.epoch,
                 self.progress.batches_done, self.batches_per_epoch)

    # ------------------------------------------------------------------------------ checkpoints
    def _checkpoint_state(self, rng_states: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "config": to_plain_dict(self.cfg),
            "tokenizer": self.data.tokenizer.to_state(),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": rng_states,  # one entry per rank
            "progress": asdict(self.progress),
        }

    def save(self, *names: str, rng_states: list[dict[str, Any]] | None = None) -> None:
        """Write ``checkpoints/<name>.pt`` for each name (rank 0 writes).

        Args:
            names: checkpoint names, e.g. ``"last", "best"``.
            rng_states: ``gather_rng_states`` taken at this point; None = gather them here, which every
                rank must then call together.
        """
        rng_states = gather_rng_states(self.info) if rng_states is None else rng_states
        if not self.info.is_main:
            return
        self._update_wall_clock()
        state = self._checkpoint_state(rng_states)
        for name in names:
            save_checkpoint(self.run_dir / CHECKPOINT_DIR / f"{name}.pt", state)

    def _update_wall_clock(self) -> None:
        """Bring ``progress.wall_seconds`` up to now (the loop's time in this process plus earlier runs')."""
        if self._wall_clock_from is not None:
            started, earlier = self._wall_clock_from
            self.progress.wall_seconds = earlier + time.perf_counter() - started

    def _keep_for_averaging(self) -> None:
        """Keep the last ``average_last`` validation checkpoints' weights (for checkpoint averaging)."""
        keep = self.tcfg.average_last
        if keep <= 1 or not self.info.is_main:
            return
        folder = self.run_dir / CHECKPOINT_DIR
        save_checkpoint(folder / f"val_step{self.progress.step:08d}.pt",
                        {"config": to_plain_dict(self.cfg), "tokenizer": self.data.tokenizer.to_state(),
                         "model": self.model.state_dict()})
        for old in sorted(folder.glob("val_step*.pt"))[:-keep]:
            old.unlink()

    # ------------------------------------------------------------------------------------ loop
    def fit(self) -> dict[str, Any]:
        """Train until max_steps / max_epochs / early stopping / a signal; then test. Returns metrics."""
        self._truncate_history()
        previous_handlers = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        if self.info.is_main:
            log.info("training %s: %d parameters, %d batches per epoch, %d steps planned, device %s",
                     self.cfg.attention.name, count_parameters(self.model), self.batches_per_epoch,
                     self.total_steps, self.device)
        self._wall_clock_from = (time.perf_counter(), self.progress.wall_seconds)
        gpu = GpuMonitor.for_device(self.device) if self.info.is_main else GpuMonitor(None)
        try:
            with gpu:
                stopped_early = self._loop()
        finally:
            for sig, handler in previous_handlers.items():
                signal.signal(sig, handler)
        self._update_wall_clock()
        self._wall_clock_from = None  # stopped: the final evaluation is reported on its own
        self.gpu_utilisation = gpu.summary()
        if self.stop_signal is not None:
            self.save("last")
            self.logger.message(
                f"stopped by {self.stop_signal} at step {self.progress.step}; checkpoint saved. Resume with:\n"
                f"  python train.py trainer.resume={self.run_dir}"
            )
            self.logger.close()
            return {"interrupted": True, "step": self.progress.step}
        return self._finish(stopped_early)

    def _loop(self) -> bool:
        """The epochs. Returns True when early stopping ended training."""
        window_loss, window_tokens, window_start = 0.0, 0, time.perf_counter()
        nonfinite_in_row = 0
        while self.progress.step < self.total_steps:
            sampler = self.train_loader.batch_sampler
            sampler.set_epoch(self.progress.epoch, start=self.progress.batches_done)
            for batch in self.train_loader:
                step_start = time.perf_counter()
                loss, tokens, grad_norm, lr = self._train_step(batch)
                self.progress.batches_done += 1
                if loss is None:
                    nonfinite_in_row += 1
                    self.logger.message(f"warning: non-finite loss or gradient at step {self.progress.step + 1}; "
                                        "step skipped")
                    if nonfinite_in_row >= self.tcfg.max_nonfinite_steps:
                        raise FloatingPointError(
                            f"{nonfinite_in_row} non-finite losses in a row at step {self.progress.step}: "
                            "lower trainer.lr or set trainer.clip_grad_norm (now "
                            f"lr={self.tcfg.lr}, clip={self.tcfg.clip_grad_norm})")
                    continue
                nonfinite_in_row = 0
                self.progress.step += 1
                self.progress.target_tokens += tokens
                self.progress.train_seconds += time.perf_counter() - step_start
                window_loss += loss
                window_tokens += tokens
                self._record(loss, tokens, grad_norm, lr)

                if self.progress.step % self.tcfg.log_every == 0 or self.progress.step == self.total_steps:
                    elapsed = time.perf_counter() - window_start
                    self._log_train(window_loss / max(1, window_tokens), window_tokens * self.info.world_size / elapsed,
                                    grad_norm, lr)
                    window_loss, window_tokens, window_start = 0.0, 0, time.perf_counter()
                due = self.tcfg.validate_every and self.progress.step % self.tcfg.validate_every == 0
                if due or self.progress.step == self.total_steps:
                    validation_start = time.perf_counter()
                    if self._validate_and_checkpoint():
                        return True
                    window_start += time.perf_counter() - validation_start  # validation is not training time
                if self.progress.step == self.interrupt_at_step:
                    self.stop_signal = "interrupt_at_step"
                if self._should_stop() or self.progress.step >= self.total_steps:
                    return False
            # epoch finished
            self.progress.epoch += 1
            self.progress.batches_done = 0
            if not self.tcfg.validate_every and self.progress.step < self.total_steps:
                validation_start = time.perf_counter()
                if self._validate_and_checkpoint():
                    return True
                window_start += time.perf_counter() - validation_start
        return False

    def _train_step(self, batch: Batch) -> tuple[float | None, int, float, float]:
        """Forward, backward, clip, step.

        Returns:
            The summed loss (None when the step was skipped), target tokens, gradient norm, and the
            learning rate this step used (the scheduler has moved on to the next step's by then).
        """
        lr = self.scheduler.get_last_lr()[0]
        self.model.train()
        batch = batch.to(self.device, non_blocking=True)
        tokens = batch.num_tgt_tokens
        with autocast(self.precision, self.device):
            logits, _ = self.ddp_model(batch.src, batch.src_lengths, batch.tgt_in)  # [B, T, V]
        loss_sum = sequence_loss(logits, batch.tgt_out, self.tcfg.label_smoothing)
        loss_value = loss_sum.item()
        if not self._all_ranks_finite(loss_value):
            self.optimizer.zero_grad(set_to_none=True)
            return None, tokens, float("nan"), lr
        # Mean over this rank's tokens; DDP averages the gradients over ranks.
        (loss_sum / max(1, tokens)).backward()
        max_norm = self.tcfg.clip_grad_norm or float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        if not math.isfinite(grad_norm):  # identical on every rank: gradients are already all-reduced
            self.optimizer.zero_grad(set_to_none=True)
            return None, tokens, grad_norm, lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return loss_value, tokens, grad_norm, lr

    def _all_ranks_finite(self, loss_value: float) -> bool:
        finite = math.isfinite(loss_value)
        if self.info.world_size > 1:  # every rank must skip together, or DDP's all-reduce would hang
            flag = torch.tensor([1.0 if finite else 0.0], device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            finite = bool(flag.item())
        return finite

    def _should_stop(self) -> bool:
        stop = self.stop_signal is not None
        if self.info.world_size > 1:  # a signal reaching one rank stops them all at the same step
            flag = torch.tensor([1.0 if stop else 0.0], device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            stop = bool(flag.item())
            if stop and self.stop_signal is None:
                self.stop_signal = "another rank's signal"
        return stop

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.stop_signal = signal.Signals(signum).name
        log.warning("%s received: finishing this step, then saving checkpoints/last.pt", self.stop_signal)

    # --------------------------------------------------------------------------------- logging
    def _record(self, loss: float, tokens: int, grad_norm: float, lr: float) -> None:
        """One line per step in train_log.jsonl: the exact loss curve (resume tests compare it)."""
        if not self.info.is_main:
            return
        with self.history_path.open("a") as handle:
            handle.write(json.dumps({"step": self.progress.step, "loss": loss / max(1, tokens),
                                     "lr": lr, "grad_norm": grad_norm}) + "\n")

    def _truncate_history(self) -> None:
        """On resume, drop log lines written after the checkpoint (by the run that was cut off)."""
        if not self.info.is_main or not self.history_path.exists():
            return
        lines = self.history_path.read_text().splitlines()
        kept = [line for line in lines if json.loads(line)["step"] <= self.progress.step]
        self.history_path.write_text("".join(line + "\n" for line in kept))

    def _log_train(self, loss: float, tokens_per_s: float, grad_norm: float, lr: float) -> None:
        values = {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "lr": lr, "grad_norm": grad_norm,
                  "tokens_per_s": tokens_per_s, "epoch": float(self.progress.epoch)}
        self.logger.scalars("train", values, self.progress.step)
        self.logger.progress(self.progress.step, {"epoch": self.progress.epoch, "loss": loss,
                                                  "tok/s": round(tokens_per_s), "lr": lr}, log_line=True)

    # ------------------------------------------------------------------------------ validation
    def _validate_and_checkpoint(self) -> bool:
        """Validate (rank 0), save ``last`` (and ``best``), decide early stopping. True = stop early."""
        stop, improved = False, False
        if self.info.is_main:
            metrics = self.validate()
            improved = metrics["bleu"] > self.progress.best_bleu
            if improved:
                self.progress.best_bleu, self.progress.best_step = metrics["bleu"], self.progress.step
                self.progress.bad_validations = 0
            else:
                self.progress.bad_validations += 1
            self._update_wall_clock()
            p = self.progress
            p.validations.append({"step": p.step, "epoch": p.epoch + p.batches_done / max(1, self.batches_per_epoch),
                                  "train_seconds": p.train_seconds, "wall_seconds": p.wall_seconds,
                                  "bleu": metrics["bleu"], "chrf": metrics["chrf"], "loss": metrics["loss"]})
            patience = self.tcfg.early_stopping_patience
            stop = patience is not None and self.progress.bad_validations >= patience
        rng_states = gather_rng_states(self.info)  # every rank's, for an exact resume
        if self.info.is_main:
            self.save(*(["last", "best"] if improved else ["last"]), rng_states=rng_states)
            self._keep_for_averaging()
            self.logger.message(
                f"validation at step {self.progress.step}: BLEU {metrics['bleu']:.2f} chrF {metrics['chrf']:.2f} "
                f"loss {metrics['loss']:.3f} (teacher-forced ppl {metrics['ppl']:.2f})"
                + (" new best" if improved else f" (best {self.progress.best_bleu:.2f} at {self.progress.best_step})")
            )
        if self.info.world_size > 1:
            flag = [stop, self.progress.best_bleu, self.progress.best_step, self.progress.bad_validations]
            dist.broadcast_object_list(flag, src=0)
            stop, self.progress.best_bleu, self.progress.best_step, self.progress.bad_validations = flag
        if stop and self.info.is_main:
            self.logger.message(f"early stopping: no BLEU gain in {self.tcfg.early_stopping_patience} validations")
        return stop

    @torch.no_grad()
    def teacher_forced_loss(self, split: EncodedSplit) -> tuple[float, int]:
        """Summed cross-entropy (no label smoothing) and token count over ``split``."""
        self.model.eval()
        total, tokens = 0.0, 0
        for batch in build_loader(split, self.cfg.data.valid_max_tokens, shuffle=False):
            batch = batch.to(self.device)
            with autocast(self.precision, self.device):
                logits, _ = self.model(batch.src, batch.src_lengths, batch.tgt_in)
            total += sequence_loss(logits, batch.tgt_out).item()
            tokens += batch.num_tgt_tokens
        return total, tokens

    def best_hypotheses(self, split: EncodedSplit, beam_size: int) -> list[Hypothesis]:
        """The best translation (ids and attention) of each of ``split``'s sources, in its order.

        Decoded by the engine every use of a trained model shares, with the run's length limits and precision.
        """
        t = self.tcfg
        self.model.eval()
        options = SearchOptions(beam_size=beam_size, length_penalty=t.length_penalty, max_len=t.max_len,
                                max_len_ratio=t.max_len_ratio, batch_tokens=self.cfg.data.valid_max_tokens)
        translator = Translator(self.model, self.data.tokenizer, precision=self.precision)
        return [nbest[0] for nbest in translator.translate_ids(split.src_ids, options)]

    def decode(self, split: EncodedSplit, beam_size: int) -> list[str]:
        """Detokenized translations of ``split``'s sources, in its order."""
        return [self.data.tokenizer.decode_tgt(h.tokens) for h in self.best_hypotheses(split, beam_size)]

    def validate(self) -> dict[str, float]:
        """Validation metrics at the current step, logged to TensorBoard (rank 0 only)."""
        split, step = self.data.valid, self.progress.step
        loss_sum, tokens = self.teacher_forced_loss(split)
        best = self.best_hypotheses(split, self.tcfg.val_beam_size)
        hypotheses = [self.data.tokenizer.decode_tgt(h.tokens) for h in best]
        scores = corpus_scores(hypotheses, split.tgt_text)
        loss = loss_sum / max(1, tokens)
        metrics = {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "bleu": scores["bleu"], "chrf": scores["chrf"]}
        self.logger.scalars("val", metrics, step)
        self._log_examples(split, hypotheses, best, step)
        return metrics

    def _log_examples(self, split: EncodedSplit, hypotheses: list[str], best: list[Hypothesis], step: int) -> None:
        """Sample translations as text, and attention heatmaps of a fixed handful of sentences.

        ``best`` are validation's own hypotheses (their attention included), ``hypotheses`` their text.
        """
        rows = [f"**src:** {split.src_text[i]}  \n**ref:** {split.tgt_text[i]}  \n**hyp:** {hypotheses[i]}"
                for i in range(min(self.tcfg.num_samples, len(split)))]
        self.logger.text("samples", "\n\n".join(rows), step)
        if not self.model.has_attention:
            return
        tok = self.data.tokenizer
        for i, (src_ids, hyp) in enumerate(zip(split.src_ids[: self.tcfg.num_heatmaps], best)):
            if hyp.attention is None or hyp.attention.numel() == 0:
                continue
            weights = hyp.attention.float()  # [T_hyp, S]
            src_labels = (tok.src_pieces(src_ids) + ["</s>"])[: weights.shape[1]]
            tgt_labels = (tok.tgt_pieces(hyp.tokens) + ["</s>"])[: weights.shape[0]]
            self.logger.attention(f"attention/{i}", weights[: len(tgt_labels), : len(src_labels)],
                                  src_labels, tgt_labels, step)

    # ----------------------------------------------------------------------------------- final
    def _finish(self, stopped_early: bool) -> dict[str, Any]:
        """Score the best checkpoint on the validation and test splits; write results.json."""
        if self.info.world_size > 1:
            dist.barrier()
        results: dict[str, Any] = {}
        if self.info.is_main:
            evaluation_start = time.perf_counter()
            best = load_checkpoint(self.run_dir / CHECKPOINT_DIR / "best.pt")
            self.model.load_state_dict(best["model"])
            results = self._evaluate_weights("best", best["progress"]["step"])
            averaged = self._averaged_weights()
            if averaged is not None:
                self.model.load_state_dict(averaged)
                results["averaged"] = self._evaluate_weights(f"average of last {self.tcfg.average_last}", None)
                self.model.load_state_dict(best["model"])
            results.update(self._run_summary(stopped_early))
            results["final_evaluation_seconds"] = time.perf_counter() - evaluation_start
            (self.run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
            self._print_results(results)
            hparams = {"attention": self.cfg.attention.name, **{f"model.{k}": v for k, v in self.cfg.model.items()},
                       "lr": self.tcfg.lr, "max_tokens": self.cfg.data.max_tokens,
                       "label_smoothing": self.tcfg.label_smoothing}
            final = {"hparam/val_bleu": results["valid"]["bleu"]}
            final.update({f"hparam/test_bleu_{name}": s["bleu"] for name, s in results["test"].items()})
            self.logger.hparams(hparams, final)
        self.logger.close()
        return results

    def _evaluate_weights(self, label: str, step: int | None) -> dict[str, Any]:
        beam = self.tcfg.test_beam_size
        loss_sum, tokens = self.teacher_forced_loss(self.data.valid)
        valid = corpus_scores(self.decode(self.data.valid, beam), self.data.valid.tgt_text)
        valid["loss"] = loss_sum / max(1, tokens)
        test = {}
        for name, split in self.data.tests.items():
            hypotheses = self.decode(split, beam)
            test[name] = corpus_scores(hypotheses, split.tgt_text)
            if step is not None:  # the best checkpoint's translations, for analysis (scripts/compare_runs.py)
                out = self.run_dir / "translations" / f"{name}.{self.cfg.data.tgt_lang}"
                out.parent.mkdir(exist_ok=True)
                out.write_text("".join(h + "\n" for h in hypotheses))
        return {"checkpoint": label, "checkpoint_step": step, "beam_size": beam,
                "length_penalty": self.tcfg.length_penalty, "valid": valid, "test": test}

    def _averaged_weights(self) -> dict[str, Tensor] | None:
        paths = sorted((self.run_dir / CHECKPOINT_DIR).glob("val_step*.pt"))
        if self.tcfg.average_last <= 1 or len(paths) < 2:
            return None
        states = [load_checkpoint(p)["model"] for p in paths]
        return {k: sum(s[k].float() for s in states).div(len(states)).to(states[0][k].dtype) for k in states[0]}

    def _run_summary(self, stopped_early: bool) -> dict[str, Any]:
        p = self.progress
        return {
            "attention": self.cfg.attention.name,
            "parameters": count_parameters(self.model),
            "steps": p.step,
            "epochs": p.epoch + p.batches_done / max(1, self.batches_per_epoch),
            "stopped_early": stopped_early,
            "best_val_bleu_greedy" if self.tcfg.val_beam_size == 1 else "best_val_bleu": p.best_bleu,
            "best_step": p.best_step,
            "train_seconds": p.train_seconds,
            "train_target_tokens_per_s": p.target_tokens * self.info.world_size / max(1e-9, p.train_seconds),
            "setup_seconds": self.setup_seconds,
            "wall_seconds": p.wall_seconds,
            "gpu_utilisation": self.gpu_utilisation,
            "validations": p.validations,
            "device": device_name(self.device),
            "precision": self.precision,
            "bf16_autocast": self.use_bf16,
            "world_size": self.info.world_size,
            "versions": library_versions(),
            "host": host(),
            "src_lang": self.cfg.data.src_lang,
            "tgt_lang": self.cfg.data.tgt_lang,
            "run_dir": str(self.run_dir),
        }

    def _print_results(self, results: dict[str, Any]) -> None:
        lines = [f"results ({results['checkpoint']} checkpoint, step {results['checkpoint_step']}, "
                 f"beam {results['beam_size']}):",
                 f"  valid  BLEU {results['valid']['bleu']:.2f}  chrF {results['valid']['chrf']:.2f}"]
        for name, scores in results["test"].items():
            lines.append(f"  {name}  BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}")
            lines.append(f"    {scores['bleu_signature']}")
        if "averaged" in results:
            for name, scores in results["averaged"]["test"].items():
                lines.append(f"  {name} (averaged checkpoints)  BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}")
        lines.append(f"  training: {results['steps']} steps in {results['wall_seconds'] / 60:.1f} min wall clock "
                     f"({results['train_seconds'] / 60:.1f} min of them optimizer steps, the rest validation); "
                     f"final evaluation {results['final_evaluation_seconds']:.0f} s")
        if results["gpu_utilisation"]["available"]:
            lines.append(f"  GPU utilisation during training: median "
                         f"{results['gpu_utilisation']['utilisation_percent_median']:.0f}%")
        lines.append(f"  written to {self.run_dir / 'results.json'}")
        print("\n".join(lines), flush=True)


def train(cfg: DictConfig, run_dir: str | Path | None = None, interrupt_at_step: int | None = None) -> dict[str, Any]:
    """Train (or resume) a model as configured; return the final metrics (Hydra sweeps use them).

    Args:
        cfg: the composed config (``data``, ``model``, ``attention``, ``trainer``).
        run_dir: where outputs go; default: Hydra's run dir.
        interrupt_at_step: act as if SIGINT arrived after this optimizer step.
    """
    validate_config(cfg)
    resume_state = None
    if cfg.trainer.resume:
        resume_from = Path(cfg.trainer.resume)
        # A run dir resumes from its last checkpoint (inference would pick best.pt).
        last = resume_from / CHECKPOINT_DIR / "last.pt" if resume_from.is_dir() else resume_from
        resume_state = load_checkpoint(last)
        cfg = resume_config(cfg, resume_state)
        cfg.trainer.resume = None
        validate_config(cfg)
        run_dir = resume_from if resume_from.is_dir() else resume_from.parent.parent  # write on into that run
    run_dir = Path(run_dir) if run_dir is not None else run_dir_from_hydra()
    run_dir.mkdir(parents=True, exist_ok=True)
    info = setup_distributed(cfg.trainer.device)
    try:
        trainer = Trainer(cfg, run_dir, info, resume_state, interrupt_at_step)
        if info.is_main:
            OmegaConf.save(OmegaConf.create(to_plain_dict(cfg)), run_dir / "config.yaml")
        return trainer.fit()
    except torch.cuda.OutOfMemoryError as error:
        raise RuntimeError(
            f"CUDA out of memory: lower data.max_tokens (now {cfg.data.max_tokens}) or "
            f"data.valid_max_tokens (now {cfg.data.valid_max_tokens}), or use a smaller model=..."
        ) from error
    finally:
        if info.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()
