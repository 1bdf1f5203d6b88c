"""Search replayed from CUDA graphs: ``nmt.model.search``'s greedy and beam search with the whole decoder step
captured once per shape bucket (rows x source length) and replayed, the source encoded once per batch, finished rows
kept in place and masked (after NeMo's graphed RNN-T decoding). Shapes: R rows, K beam, S source, T steps.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass, replace
from functools import partial
from typing import Any

import torch
from torch import Tensor

from nmt.common.device import autocast
from nmt.data import BOS_ID, EOS_ID, PAD_ID
from nmt.model.search import (
    Beams,
    Hypothesis,
    LateFlag,
    StepModel,
    attention_by_slot,
    best_candidates,
    blocked_tokens,
    hypotheses_of,
    length_limits,
    read_back,
    token_step,
)

log = logging.getLogger(__name__)

GRAPH_CHOICES = ("auto", "true", "false")
SOURCE_WIDTH = 8  # source lengths padded to a multiple of this, so few buckets recur
MAX_BUCKETS = 32  # captured buckets kept at once (a server meets many shapes and options); the least recent goes


class GraphSearchError(ValueError):
    """The graph search cannot serve this setting or batch; the message names the setting and the fix."""


def use_search_graphs(setting: str | bool, device: torch.device) -> bool:
    """Whether decoding replays CUDA graphs: ``auto`` on CUDA, ``true`` there only (else GraphSearchError)."""
    setting = str(setting).lower()  # the command line's true / false arrive as booleans
    if setting not in GRAPH_CHOICES:
        raise GraphSearchError(f"cuda_graphs={setting!r} is not one of {', '.join(GRAPH_CHOICES)}")
    if setting == "true" and device.type != "cuda":
        raise GraphSearchError(f"cuda_graphs=true needs a CUDA GPU, and this search runs on {device}; "
                               "use cuda_graphs=auto (or false)")
    return setting != "false" and device.type == "cuda"


def bucket_shape(rows: int, src_len: int) -> tuple[int, int]:
    """``(R', S')`` of a batch of ``rows`` sentences of at most ``src_len`` tokens: rows to a power of two (at most
    twice the rows), the length to a multiple of ``SOURCE_WIDTH``."""
    return 1 << (rows - 1).bit_length(), -(-src_len // SOURCE_WIDTH) * SOURCE_WIDTH


def capture_graph(run: Callable[[], None], pool: Any, device: torch.device) -> Any:
    """``run`` once on a side stream (cuBLAS handles, allocations), then captured in ``pool``: the graph. (Tests
    replace it with a stand-in that runs ``run`` at each replay.)"""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        run()
    return graph


# ------------------------------------------------------------------------------------ static tensors
def tree_map(fn: Callable[[Tensor], Tensor], tree: Any) -> Any:
    """``fn`` on every tensor of a model's memory or state (a tensor, a dataclass of them, a list; None kept)."""
    if tree is None or isinstance(tree, Tensor):
        return tree if tree is None else fn(tree)
    if is_dataclass(tree):
        return replace(tree, **{f.name: tree_map(fn, getattr(tree, f.name)) for f in fields(tree)})
    if isinstance(tree, (list, tuple)):
        return type(tree)(tree_map(fn, item) for item in tree)
    raise TypeError(f"the graph search cannot hold a {type(tree).__name__} in a static buffer")


def leaves(tree: Any) -> list[Tensor]:
    """The tensors of a ``tree_map`` tree, in order."""
    found: list[Tensor] = []
    tree_map(lambda t: found.append(t) or t, tree)
    return found


def copy_into(static: Any, value: Any) -> None:
    """Copy ``value``'s tensors into ``static``'s (the same tree and shapes), without a host wait."""
    for target, source in zip(leaves(static), leaves(value), strict=True):
        target.copy_(source, non_blocking=True)


@dataclass
class _Greedy:
    """A greedy bucket's static tensors, which its captured step reads and writes in place, and that step."""

    memory: Any  # the model's memory, R rows
    limits: Tensor  # [R]
    prev: Tensor  # [R]
    state: Any  # [L, R, H]
    finished: Tensor  # [R]
    out_len: Tensor  # [R]
    scores: Tensor  # [R]
    step: Tensor  # [] long
    all_done: Tensor  # [] bool
    tokens: Tensor  # [T, R]
    attention: Tensor | None  # [T, R, S]

    @staticmethod
    def allocate(memory: Any, state: Any, steps: int, keep: bool) -> _Greedy:
        """Empty tensors for a batch encoded as ``memory`` and ``state``, ``steps`` steps at most."""
        enc_out = leaves(memory)[0]  # [R, S, 2He]
        (rows, src_len), device = enc_out.shape[:2], enc_out.device
        attention = torch.zeros(steps, rows, src_len, device=device) if keep else None
        return _Greedy(tree_map(torch.empty_like, memory), *_empty(device, (rows, torch.long), (rows, torch.long)),
                       tree_map(torch.empty_like, state),
                       *_empty(device, (rows, torch.bool), (rows, torch.long), (rows, torch.float32),
                               ((), torch.long), ((), torch.bool)),
                       torch.zeros(steps, rows, dtype=torch.long, device=device), attention)

    def load(self, memory: Any, state: Any, limits: Tensor, alpha: float) -> None:
        """The search's start for this batch (no host wait)."""
        copy_into(self.memory, memory)
        copy_into(self.state, state)
        self.limits.copy_(limits)
        self.out_len.copy_(limits)
        self.prev.fill_(BOS_ID)
        for tensor in (self.finished, self.scores, self.step, self.all_done):
            tensor.zero_()

    def advance(self, model: StepModel, blocked: Tensor) -> None:
        """One step of ``token_step``, its results written back into these tensors: what a graph captures."""
        best, state, attn, (finished, out_len, scores) = token_step(
            model, lambda log_probs: log_probs.max(dim=-1), blocked, self.prev, self.state, self.memory,
            self.finished, self.out_len, self.scores, self.limits, self.step)
        at_step = self.step.view(1)
        self.tokens.index_copy_(0, at_step, best.unsqueeze(0))  # [T, R]
        if self.attention is not None:
            self.attention.index_copy_(0, at_step, attn.float().unsqueeze(0))  # [T, R, S]
        for target, value in ((self.prev, best), (self.finished, finished), (self.out_len, out_len),
                              (self.scores, scores)):
            target.copy_(value)
        copy_into(self.state, state)
        self.step.add_(1)
        self.all_done.copy_(finished.all())

    def read(self, steps: int, rows: int, src_lengths: Tensor) -> list[Hypothesis]:
        """The first ``rows`` rows' hypotheses after ``steps`` steps (the batch's one read back)."""
        tokens = self.tokens[:steps, :rows].T.cpu()  # [B, T]
        attention = None if self.attention is None else self.attention[:steps, :rows].transpose(0, 1).cpu()
        return hypotheses_of(tokens, attention, self.out_len[:rows], self.scores[:rows], src_lengths)


@dataclass
class _Beam:
    """A beam bucket's static tensors (``Beams``' fields kept as tensors here), and its step."""

    memory: Any  # R rows, one per sentence
    alpha: Tensor  # [] the length penalty
    prev: Tensor  # [R*K]
    state: Any  # [L, R*K, H]
    beams: Beams  # limits [R], score [R, K], n_finished [R], done [R], pool [R, K]
    step: Tensor
    all_done: Tensor
    tokens: Tensor  # [T, R, K]
    back: Tensor  # [T, R, K]
    attention: Tensor | None  # [T, R, K, S]
    slots: Tensor  # [R, K] slot numbers, made once: not a kernel of every step
    row_base: Tensor  # [R, 1] each sentence's first beam row

    @staticmethod
    def allocate(memory: Any, state: Any, steps: int, keep: bool, k: int) -> _Beam:
        """Empty tensors for a batch encoded as ``memory`` and ``state``, ``steps`` steps at most, beam ``k``."""
        enc_out = leaves(memory)[0]  # [R, S, 2He]
        (rows, src_len), device = enc_out.shape[:2], enc_out.device
        beams = tree_map(torch.empty_like, Beams.start(torch.ones(rows, dtype=torch.long, device=device), k))
        attention = torch.zeros(steps, rows, k, src_len, device=device) if keep else None
        history = [torch.zeros(steps, rows, k, dtype=torch.long, device=device) for _ in range(2)]
        slots = torch.arange(k, device=device).expand(rows, k)  # [R, K]
        row_base = (torch.arange(rows, device=device) * k).unsqueeze(1)  # [R, 1]
        return _Beam(tree_map(torch.empty_like, memory), *_empty(device, ((), torch.float32), (rows * k, torch.long)),
                     tree_map(lambda t: t.repeat_interleave(k, dim=1), state), beams,
                     *_empty(device, ((), torch.long), ((), torch.bool)), *history, attention, slots, row_base)

    @property
    def k(self) -> int:
        return self.tokens.shape[2]

    def load(self, memory: Any, state: Any, limits: Tensor, alpha: float) -> None:
        """The search's start for this batch (no host wait)."""
        copy_into(self.memory, memory)
        copy_into(self.state, tree_map(lambda t: t.repeat_interleave(self.k, dim=1), state))
        copy_into(self.beams, Beams.start(limits, self.k))
        self.prev.fill_(BOS_ID)
        self.alpha.fill_(alpha)
        self.step.zero_()
        self.all_done.zero_()

    def advance(self, model: StepModel, blocked: Tensor) -> None:
        """One beam step (``best_candidates``, ``Beams.advance``), its results written back: what a graph captures."""
        logits, state, attn = model.decode_step(self.prev, self.state, self.memory)  # [R*K, V], [L, R*K, H], [R*K, S]
        beams = replace(self.beams)  # advance() replaces this copy's fields: the static tensors stay as inputs
        candidates = best_candidates(logits, beams.score, blocked)  # [R, 2K] each
        keep_slot, keep_token = beams.advance(self.step, *candidates, self.alpha, self.slots)
        at_step = self.step.view(1)
        self.tokens.index_copy_(0, at_step, keep_token.unsqueeze(0))  # [T, R, K]
        self.back.index_copy_(0, at_step, keep_slot.unsqueeze(0))
        if self.attention is not None:
            self.attention.index_copy_(0, at_step, attention_by_slot(attn, keep_slot).unsqueeze(0))  # [T, R, K, S]
        reorder = (self.row_base + keep_slot).view(-1)  # [R*K] rows of the previous beam to continue
        copy_into(self.state, state.index_select(1, reorder))
        self.prev.copy_(keep_token.view(-1))
        copy_into(self.beams, beams)
        self.step.add_(1)
        self.all_done.copy_(beams.done.all())

    def read(self, steps: int, rows: int, src_lengths: Tensor, n_best: int) -> list[list[Hypothesis]]:
        """The first ``rows`` sentences' ``n_best`` hypotheses after ``steps`` steps (read back once)."""
        attention = None if self.attention is None else self.attention[:steps, :rows]
        pool = tree_map(lambda t: t[:rows], self.beams.pool)  # [B, K] each
        return read_back(pool, self.tokens[:steps, :rows], self.back[:steps, :rows], attention, src_lengths, n_best)


def _empty(device: torch.device, *specs: tuple[int | tuple[()], torch.dtype]) -> list[Tensor]:
    """One uninitialised tensor per ``(shape, dtype)``."""
    return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in specs]


@dataclass
class _Bucket:
    graph: Any
    static: _Greedy | _Beam


@dataclass
class SearchGraphStats:
    """What the graph search did, for results.json and benchmarks."""

    capture_seconds: float = 0.0
    replayed_batches: int = 0
    fallback: str | None = None  # why the plain search took over, when it did
    shapes: list[list[Any]] = field(default_factory=list)  # [kind, R, S] of each captured bucket


class SearchGraphs:
    """Greedy and beam search for ``model`` (in eval mode; its weights may change in place between batches), each
    bucket's step captured on first sight under ``precision``'s autocast and replayed. Rows never leave the batch,
    so shapes are fixed, and the outputs are the plain search's."""

    def __init__(self, model: StepModel, device: torch.device, precision: str) -> None:
        self.model, self.device, self.precision = model, device, precision
        self.buckets: OrderedDict[tuple[Any, ...], _Bucket] = OrderedDict()  # least recently used first
        self.stats = SearchGraphStats()
        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None  # one at a time: shared
        self.blocked = blocked_tokens(device)

    @property
    def serving(self) -> bool:
        """False once a capture failed: the plain search serves from then on."""
        return self.stats.fallback is None

    @torch.no_grad()
    def greedy(self, src: Tensor, src_lengths: Tensor, max_len: int, max_len_ratio: float | None,
               keep_attention: bool, lag: int = 0) -> list[Hypothesis] | None:
        """As ``greedy_search`` (src_lengths on the host); None after a failed capture (the plain search serves)."""
        keep = keep_attention and self.model.has_attention
        found = self._bucket("greedy", src, src_lengths, (max_len, max_len_ratio, keep), 1)
        if found is None:
            return None
        bucket, max_steps = found
        return bucket.static.read(self._replay(bucket, max_steps, lag), src.shape[0], src_lengths)

    @torch.no_grad()
    def beam(self, src: Tensor, src_lengths: Tensor, beam_size: int, length_penalty: float, max_len: int,
             max_len_ratio: float | None, n_best: int, keep_attention: bool, lag: int = 0
             ) -> list[list[Hypothesis]] | None:
        """As ``nmt.model.search.beam_search``; None when the graph cannot serve."""
        keep = keep_attention and self.model.has_attention
        found = self._bucket("beam", src, src_lengths, (beam_size, max_len, max_len_ratio, keep), beam_size,
                             length_penalty)
        if found is None:
            return None
        bucket, max_steps = found
        return bucket.static.read(self._replay(bucket, max_steps, lag), src.shape[0], src_lengths, n_best)

    # ---------------------------------------------------------------------------------- buckets
    def _bucket(self, kind: str, src: Tensor, src_lengths: Tensor, options: tuple[Any, ...], k: int,
                alpha: float = 0.0) -> tuple[_Bucket, int] | None:
        """The bucket of this batch, captured if new, loaded with the batch, and the steps the batch may take; None
        after a failed capture."""
        if not self.serving:
            return None
        rows, src_len = bucket_shape(*src.shape)
        batch_limits = length_limits(src_lengths, *options[-3:-1])
        padded_src, padded_lengths, limits = self._pad(src, src_lengths, rows, src_len, batch_limits)
        key = (kind, rows, src_len, *options)
        memory, state = self.model.encode(padded_src, padded_lengths)  # once per batch, eagerly
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self._capture(kind, memory, state, limits, options, k, alpha)
            if bucket is None:
                return None
            self.buckets[key] = bucket
            if len(self.buckets) > MAX_BUCKETS:  # its graph and static tensors freed; captured again if met again
                self.buckets.popitem(last=False)
        self.buckets.move_to_end(key)
        bucket.static.load(memory, state, limits, alpha)  # (again after a capture: its warm-up run stepped)
        return bucket, max(batch_limits)

    def _pad(self, src: Tensor, src_lengths: Tensor, rows: int, src_len: int, batch_limits: list[int]
             ) -> tuple[Tensor, Tensor, Tensor]:
        """The batch padded to ``[R', S']`` with its lengths (host) and limits: each extra row a lone EOS with a
        1-token limit (done at once)."""
        batch, length = src.shape
        padded = torch.full((rows, src_len), PAD_ID, dtype=src.dtype, device=src.device)  # [R', S']
        padded[:batch, :length] = src
        padded[batch:, 0] = EOS_ID
        lengths = torch.ones(rows, dtype=src_lengths.dtype)  # [R'] host
        lengths[:batch] = src_lengths
        limits = torch.ones(rows, dtype=torch.long)
        limits[:batch] = torch.tensor(batch_limits)
        return padded, lengths, limits.to(self.device, non_blocking=True)

    def _capture(self, kind: str, memory: Any, state: Any, limits: Tensor, options: tuple[Any, ...], k: int,
                 alpha: float) -> _Bucket | None:
        """The bucket of a batch encoded as ``memory`` and ``state``, its step captured; None (one warning, the plain
        search from then on) when the capture fails, a GraphSearchError when it does not fit in GPU memory."""
        started = time.perf_counter()
        rows, src_len = leaves(memory)[0].shape[:2]
        max_len, max_len_ratio, keep = options[-3:]
        steps = max_len if max_len_ratio is None else min(max_len, math.ceil(max_len_ratio * src_len) + 5)
        try:
            static = (_Greedy.allocate(memory, state, steps, keep) if kind == "greedy"
                      else _Beam.allocate(memory, state, steps, keep, k))
            static.load(memory, state, limits, alpha)  # the warm-up run reads real tokens
            step = partial(static.advance, self.model, self.blocked)
            with autocast(self.precision, self.device, cache=False):  # cached weight casts would be stale
                graph = capture_graph(step, self.pool, self.device)
        except torch.cuda.OutOfMemoryError as error:
            raise GraphSearchError(
                f"the graph search's bucket of {rows} sentences x {src_len} source tokens"
                f"{f' x beam {k}' if kind == 'beam' else ''} does not fit in GPU memory; lower batch_tokens "
                "(or set cuda_graphs=false)") from error
        except RuntimeError as error:  # e.g. an operation that cannot be captured
            self.stats.fallback = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            log.warning("cuda_graphs: capturing the search step failed (%s); decoding goes on without graphs",
                        self.stats.fallback)
            return None
        self.stats.capture_seconds += time.perf_counter() - started
        self.stats.shapes.append([kind, rows, src_len])
        return _Bucket(graph, static)

    def _replay(self, bucket: _Bucket, max_steps: int, lag: int) -> int:
        """Replay the step until every row is finished (learnt late, ``LateFlag``) or ``max_steps``; the steps run."""
        all_done, steps = LateFlag(self.device, lag), 0
        on_cuda = self.device.type == "cuda"
        for steps in range(1, max_steps + 1):  # noqa: B007 (the count is the result)
            bucket.graph.replay()
            flag = bucket.static.all_done
            all_done.post(flag if on_cuda else flag.clone())  # (on CUDA the flag is copied out as it is posted)
            if all_done.seen():
                break
        self.stats.replayed_batches += 1
        return steps

