"""The training step with no host synchronisation (``train_step``: forward, loss, backward, clip, fused AdamW,
its figures left on the device), and ``TrainingSteps``, which runs it eagerly or, with ``trainer.cuda_graphs`` on a
GPU, replays the graph captured for the batch's shape bucket (``nmt.data.batching.ShapeBuckets``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from nmt.common.cuda_graphs import GraphCache, GraphStats, capture_graph
from nmt.common.device import autocast, uses_bf16
from nmt.data import Batch
from nmt.model.loss import sequence_loss

WARMUP_STEPS = 1  # eager runs of a new shape before its capture: the optimizer's state and cuBLAS set up outside it
# The canary's tolerance on the summed loss, relative: graph and eager kernels may round differently under bf16
LOSS_TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2}


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


class TrainingSteps:
    """The trainer's step for each batch: ``train_step`` eagerly, or a CUDA graph per batch shape.

    Args:
        model: the model the optimizer updates; ``forward_model`` is what the step calls (its DDP wrapper).
        graphs: replay CUDA graphs (``resolve_cuda_graphs``); batches must come padded to ``ShapeBuckets`` shapes.
        check: check each shape's first replay against the eager step (``trainer.cuda_graphs_check``).
        step_options: ``train_step``'s keyword settings (label_smoothing, max_norm, precision).
    """

    def __init__(self, model: nn.Module, forward_model: nn.Module, optimizer: torch.optim.Optimizer,
                 device: torch.device, graphs: bool, check: bool, **step_options: Any) -> None:
        self.model, self.forward_model, self.optimizer, self.device = model, forward_model, optimizer, device
        self.graphs, self.step_options = graphs, step_options
        self.cache: GraphCache | None = None  # an eager run (any CPU run) builds no graph machinery
        self.stats: GraphStats | None = None
        if graphs:
            self.cache = GraphCache(device, key="trainer.cuda_graphs", step_name="the step",
                                    plain_name="the eager step", plain_after="training goes on eagerly", check=check)
            self.stats = self.cache.stats
            self.lr = torch.zeros((), device=device)  # the learning rate a graph reads at replay
            self.skip = torch.zeros((), device=device)  # 1.0: the replay skips its update (the canary's replay)

    def run(self, batch: Batch, lr: float, bucketed: bool) -> Tensor:
        """One optimizer step on ``batch`` (host tensors, pinned on CUDA) at learning rate ``lr``; ``bucketed``:
        the batch has a bucket's shape. Returns the step's ``[3]`` figures on the device.
        """
        if self.graphs and bucketed:
            shape = (*batch.src.shape, batch.tgt_in.shape[1])
            graph = self._graph_for(batch, shape)
            if graph is not None:
                for name in ("src", "src_lengths", "tgt_in", "tgt_out", "tgt_lengths"):
                    getattr(graph.inputs, name).copy_(getattr(batch, name), non_blocking=True)
                self.lr.fill_(lr)
                if not self.cache.check_due(shape) or self._checked(shape, graph):
                    graph.graph.replay()
                    self.stats.replays += 1
                    return graph.figures.clone()  # the next replay overwrites the graph's own
        if self.graphs:
            self.stats.plain_runs += 1
        # The packed encoder reads the source lengths on the host: it keeps the batch's host copy (no round trip).
        on_device = replace(batch.to(self.device, non_blocking=True), src_lengths=batch.src_lengths)
        figures = train_step(self.forward_model, self.optimizer, on_device, fixed_shapes=False, **self.step_options)
        self.optimizer.zero_grad(set_to_none=True)
        return figures

    def capture_up_front(self, examples: list[Batch]) -> None:
        """Capture the step of each example's shape (``ShapeBuckets.example``) before training, in one pass."""
        for batch in examples:
            self._graph_for(batch, (*batch.src.shape, batch.tgt_in.shape[1]))

    def _graph_for(self, batch: Batch, shape: tuple[int, ...]) -> _Graph | None:
        """The graph of ``batch``'s shape (host tensors), captured on first sight; None for the eager step."""
        if not self.cache.serving:
            return None
        rows, src_len, tgt_len = shape
        return self.cache.get(shape) or self.cache.capture(
            shape, list(shape), lambda: self._capture(batch),
            f"the training step for a batch of {rows} rows x {src_len} source x {tgt_len} target tokens",
            lower="data.max_tokens")

    def _capture(self, batch: Batch) -> _Graph:
        try:
            return self._warm_up_and_capture(batch)
        finally:
            for parameter in self.model.parameters():  # each graph keeps its own gradients; eager starts from none
                parameter.grad = None

    def _warm_up_and_capture(self, batch: Batch) -> _Graph:
        inputs = batch.to(self.device)  # the graph's own copy on the device, refilled before every replay
        rng = torch.cuda.get_rng_state(self.device)

        def warm_up() -> None:  # forced to skip: the weights and the optimizer state stay as they were
            for _ in range(WARMUP_STEPS):
                train_step(self.forward_model, self.optimizer, inputs, fixed_shapes=True,
                           force_skip=torch.ones((), device=self.device), **self.step_options)
                self.optimizer.zero_grad(set_to_none=True)
            torch.cuda.set_rng_state(rng, self.device)  # its dropout draws leave no trace: resume stays exact

        figures: list[Tensor] = []

        def step() -> None:
            group = self.optimizer.param_groups[0]
            float_lr, group["lr"] = group["lr"], self.lr  # captured reading the tensor: a replay sees today's rate
            try:
                figures.append(train_step(self.forward_model, self.optimizer, inputs, fixed_shapes=True,
                                          force_skip=self.skip, **self.step_options))
            finally:
                group["lr"] = float_lr

        graph = capture_graph(step, self.cache.pool, self.device, warm_up=warm_up)
        return _Graph(graph, inputs, figures[0])

    def _checked(self, shape: tuple[int, ...], graph: _Graph) -> bool:
        """The canary on a shape's first replay (its inputs loaded): whether the replayed loss is the eager step's on
        the same batch. Both run with the update skipped and from the same random state (dropout draws alike), and
        that state comes back after them, so the check changes nothing in training: the weights, the optimizer and
        the random numbers stay as they were, and the real step follows, replayed, or eager after a mismatch.
        """
        rng = _random_state(self.device)
        self.skip.fill_(1.0)
        graph.graph.replay()
        replayed = graph.figures.clone()
        self.skip.fill_(0.0)

        def eager() -> Tensor:
            _set_random_state(self.device, rng)
            figures = train_step(self.forward_model, self.optimizer, graph.inputs, fixed_shapes=True,
                                 force_skip=torch.ones((), device=self.device), **self.step_options)
            self.optimizer.zero_grad(set_to_none=True)
            _set_random_state(self.device, rng)
            return figures

        self.cache.check(shape, replayed, eager, self._loss_difference)
        return self.cache.serving

    def _loss_difference(self, replayed: Tensor, eager: Tensor) -> str | None:
        """None if the summed losses agree within ``LOSS_TOLERANCE`` (both non-finite agree), else how they differ."""
        loss, expected = float(replayed[0]), float(eager[0])  # one read back per new shape
        tolerance = LOSS_TOLERANCE["bf16" if uses_bf16(self.step_options["precision"], self.device) else "fp32"]
        if abs(loss - expected) <= tolerance * max(abs(expected), 1.0) or not (math.isfinite(loss)
                                                                               or math.isfinite(expected)):
            return None
        return f"summed loss {loss:.6g} where the eager step gives {expected:.6g}"


def _random_state(device: torch.device) -> Tensor:
    """The state of the generator that ``device``'s dropout draws from."""
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_random_state(device: torch.device, state: Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


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
