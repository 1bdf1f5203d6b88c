"""The training step with no host synchronisation (``train_step``: forward, loss, backward, clip, fused AdamW,
its figures left on the device), and ``TrainingSteps``, which runs it eagerly or, with ``trainer.cuda_graphs`` on a
GPU, replays the graph captured for the batch's shape bucket (``nmt.data.batching.ShapeBuckets``).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn

from nmt.common.device import autocast
from nmt.data import Batch
from nmt.model.loss import sequence_loss

log = logging.getLogger(__name__)

CUDA_GRAPH_CHOICES = ("auto", "true", "false")
WARMUP_STEPS = 1  # eager runs of a new shape before its capture: the optimizer's state and cuBLAS set up outside it


class FastPathError(ValueError):
    """The fast path cannot serve these settings or this shape; the message names the setting and the fix."""


def use_cuda_graphs(setting: str | bool, device: torch.device, world_size: int) -> bool:
    """Whether the run replays CUDA graphs. ``auto`` replays them on one CUDA device (on an H100 the recipe's steps
    ran 6.6x faster at the same loss: docs/results/gpu.md) and stays eager on a CPU and under torchrun, saying why;
    ``true`` asks for them and fails in one line where they cannot serve.

    Raises:
        FastPathError: ``true`` on a CPU, or under torchrun (a DDP all-reduce is not captured here).
    """
    setting = str(setting).lower()  # the command line's true / false arrive as booleans
    if setting not in CUDA_GRAPH_CHOICES:
        raise FastPathError(f"trainer.cuda_graphs={setting!r} is not one of {', '.join(CUDA_GRAPH_CHOICES)}")
    if setting == "false":
        return False
    if device.type != "cuda":
        if setting == "true":
            raise FastPathError(f"trainer.cuda_graphs=true needs a CUDA GPU, and this run is on {device}; "
                                "use trainer.cuda_graphs=auto (or false)")
        return False
    if world_size > 1:
        if setting == "true":
            raise FastPathError(f"trainer.cuda_graphs=true does not work with torchrun's {world_size} processes (the "
                                "DDP all-reduce is not captured); use trainer.cuda_graphs=false with torchrun")
        log.info("trainer.cuda_graphs=auto: eager steps under torchrun's %d processes (the DDP all-reduce is not "
                 "captured)", world_size)
        return False
    return True


@dataclass
class StepResult:
    """One optimizer step as the trainer books it; ``figures`` stay on the device until a window is read."""

    figures: Tensor  # [3]: summed loss over the target tokens, gradient norm, 1.0 if skipped (non-finite)
    tokens: int  # real target tokens (known on the host when the batch was cut)
    lr: float  # the learning rate the step used


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, *, label_smoothing: float,
               max_norm: float | None, precision: str, fixed_shapes: bool, force_skip: Tensor | None = None,
               ) -> Tensor:
    """Forward, loss, backward, clip and update on ``batch`` (on the model's device), reading nothing back.

    A non-finite loss or gradient norm skips the update on the device: the fused AdamW takes it as ``found_inf``
    (as with a GradScaler) and leaves weights, moments and its step count as they were.

    Args:
        model: the model to call (DDP-wrapped under torchrun); its parameters are the optimizer's.
        optimizer: a fused AdamW.
        max_norm: clip the gradient norm to this (None: no clipping, the norm is still measured).
        fixed_shapes: the encoder without packing (``Encoder.unpacked``), as a CUDA graph needs.
        force_skip: ``[]`` 1.0 skips the update whatever the numbers (the warm-up runs before a capture).

    Returns:
        ``[3]`` float32: summed label-smoothed loss, gradient norm before clipping, 1.0 if the update was skipped.
    """
    device = batch.src.device
    # Autocast's weight cache must be off where a graph is captured (the cached casts would be stale on replay).
    with autocast(precision, device, cache=not fixed_shapes):
        logits, _ = model(batch.src, batch.src_lengths, batch.tgt_in, fixed_shapes=fixed_shapes)  # [B, T, V]
    loss_sum = sequence_loss(logits, batch.tgt_out, label_smoothing, grad_in_place=True)  # one backward
    tokens = batch.tgt_lengths.sum().clamp(min=1)  # on the device: a padded bucket row adds 0
    (loss_sum / tokens).backward()  # the mean over this rank's tokens; DDP averages over the ranks
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm or math.inf)
    skipped = (~torch.isfinite(loss_sum) | ~torch.isfinite(grad_norm)).float()
    optimizer.found_inf = skipped if force_skip is None else torch.maximum(skipped, force_skip)  # type: ignore
    optimizer.step()
    del optimizer.found_inf  # type: ignore[attr-defined]
    return torch.stack([loss_sum.detach().float(), grad_norm.detach().float(), skipped])  # [3]


@dataclass
class _Graph:
    """A captured step: the graph, the batch tensors it reads and the ``[3]`` figures it writes."""

    graph: torch.cuda.CUDAGraph
    inputs: Batch
    figures: Tensor


@dataclass
class GraphStats:
    """What the graphs did in a run, for results.json."""

    capture_seconds: float = 0.0
    replayed_steps: int = 0
    eager_steps: int = 0  # batches that fit no bucket (a pair over the budget), or after a failed capture
    fallback: str | None = None  # why the eager path took over, when it did
    shapes: list[list[int]] = field(default_factory=list)  # [rows, S, T] of each captured graph


class TrainingSteps:
    """The trainer's step for each batch: ``train_step`` eagerly, or a CUDA graph per batch shape.

    Args:
        model: the model the optimizer updates; ``forward_model`` is what the step calls (its DDP wrapper).
        graphs: replay CUDA graphs (``use_cuda_graphs``); batches must come padded to ``ShapeBuckets`` shapes.
        step_options: ``train_step``'s keyword settings (label_smoothing, max_norm, precision).
    """

    def __init__(self, model: nn.Module, forward_model: nn.Module, optimizer: torch.optim.Optimizer,
                 device: torch.device, graphs: bool, **step_options: Any) -> None:
        self.model, self.forward_model, self.optimizer, self.device = model, forward_model, optimizer, device
        self.graphs, self.step_options = graphs, step_options
        self.captured: dict[tuple[int, ...], _Graph | None] = {}  # None: that shape fits no bucket
        self.stats = GraphStats()
        if graphs:
            self.pool = torch.cuda.graph_pool_handle()  # the graphs run one at a time, so they share memory
            self.lr = torch.zeros((), device=device)  # the learning rate a graph reads at replay

    def run(self, batch: Batch, lr: float, bucketed: bool) -> Tensor:
        """One optimizer step on ``batch`` (host tensors, pinned on CUDA) at learning rate ``lr``; ``bucketed``:
        the batch has a bucket's shape. Returns the step's ``[3]`` figures on the device.
        """
        if self.graphs and bucketed:
            graph = self._graph_for(batch)
            if graph is not None:
                for name in ("src", "src_lengths", "tgt_in", "tgt_out", "tgt_lengths"):
                    getattr(graph.inputs, name).copy_(getattr(batch, name), non_blocking=True)
                self.lr.fill_(lr)
                graph.graph.replay()
                self.stats.replayed_steps += 1
                return graph.figures.clone()  # the next replay overwrites the graph's own
        if self.graphs:
            self.stats.eager_steps += 1
        # The packed encoder reads the source lengths on the host: it keeps the batch's host copy (no round trip).
        on_device = replace(batch.to(self.device, non_blocking=True), src_lengths=batch.src_lengths)
        figures = train_step(self.forward_model, self.optimizer, on_device, fixed_shapes=False, **self.step_options)
        self.optimizer.zero_grad(set_to_none=True)
        return figures

    def capture_up_front(self, examples: list[Batch]) -> None:
        """Capture the step of each example's shape (``ShapeBuckets.example``) before training, in one pass."""
        for batch in examples:
            self._graph_for(batch)

    def _graph_for(self, batch: Batch) -> _Graph | None:
        """The graph of ``batch``'s shape (host tensors), captured on first sight; None for the eager step."""
        shape = (*batch.src.shape, batch.tgt_in.shape[1])
        if shape not in self.captured and self.stats.fallback is None:
            self.captured[shape] = self._capture(batch, shape)
        return self.captured.get(shape)

    def _capture(self, batch: Batch, shape: tuple[int, ...]) -> _Graph | None:
        """Warm up, then capture the step for ``batch``'s shape; None (and the eager path from then on, with one
        warning line) when the capture fails for a reason other than memory.

        Raises:
            FastPathError: the shape does not fit in GPU memory.
        """
        started = time.perf_counter()
        try:
            graph = self._warm_up_and_capture(batch)
        except torch.cuda.OutOfMemoryError as error:
            rows, src_len, tgt_len = shape
            raise FastPathError(
                f"the training step for a batch of {rows} rows x {src_len} source x {tgt_len} target tokens does not "
                f"fit in GPU memory; lower data.max_tokens (or set trainer.cuda_graphs=false)") from error
        except RuntimeError as error:  # e.g. an operation that cannot be captured
            self.stats.fallback = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            log.warning("trainer.cuda_graphs: capturing the step failed (%s); training goes on eagerly",
                        self.stats.fallback)
            return None
        finally:
            for parameter in self.model.parameters():  # each graph keeps its own gradients; eager starts from none
                parameter.grad = None
        self.stats.capture_seconds += time.perf_counter() - started
        self.stats.shapes.append(list(shape))
        return graph

    def _warm_up_and_capture(self, batch: Batch) -> _Graph:
        inputs = batch.to(self.device)  # the graph's own copy on the device, refilled before every replay
        rng = torch.cuda.get_rng_state(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):  # forced to skip: the weights and the optimizer state stay as they were
                train_step(self.forward_model, self.optimizer, inputs, fixed_shapes=True,
                           force_skip=torch.ones((), device=self.device), **self.step_options)
                self.optimizer.zero_grad(set_to_none=True)
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.set_rng_state(rng, self.device)  # the warm-up's dropout draws leave no trace: resume stays exact
        group = self.optimizer.param_groups[0]
        float_lr, group["lr"] = group["lr"], self.lr  # captured reading the tensor, so a replay sees today's rate
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                figures = train_step(self.forward_model, self.optimizer, inputs, fixed_shapes=True,
                                     **self.step_options)
        finally:
            group["lr"] = float_lr
        return _Graph(graph, inputs, figures)


class StepWindow:
    """The steps since the trainer last read them back: their figures stay on the device until ``read``."""

    def __init__(self) -> None:
        self.pending: list[tuple[int, StepResult]] = []

    def add(self, step: int, result: StepResult) -> None:
        self.pending.append((step, result))

    def read(self) -> list[dict[str, Any]]:
        """The pending steps, in order, read back in one transfer: ``step``, ``tokens``, ``lr``, ``loss_sum``,
        ``grad_norm`` and ``skipped`` each."""
        if not self.pending:
            return []
        figures = torch.stack([result.figures for _, result in self.pending]).tolist()  # [N, 3], the one sync
        rows = [{"step": step, "tokens": result.tokens, "lr": result.lr, "loss_sum": loss, "grad_norm": norm,
                 "skipped": skipped > 0} for (step, result), (loss, norm, skipped) in zip(self.pending, figures)]
        self.pending = []
        return rows
