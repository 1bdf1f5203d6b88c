"""Search replayed from CUDA graphs: ``nmt.model.search``'s greedy and beam step, the same functions, captured once per
shape bucket (rows x source length) and replayed, the source encoded once per batch, finished rows kept in place in
the bucket's static tensors and masked where the plain search compacts them (after NeMo's graphed RNN-T decoding).
Shapes: R rows, K beam, S source, T steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass, replace
from functools import partial
from typing import Any, TypeVar

import torch
from torch import Tensor

from nmt.common import cuda_graphs
from nmt.common.device import autocast, uses_bf16
from nmt.data import BOS_ID, EOS_ID, PAD_ID
from nmt.model.search import (
    Beams,
    Hypothesis,
    Search,
    SearchSpec,
    StepModel,
    beam_step,
    blocked_tokens,
    hypotheses_of,
    read_back,
    steps_until_done,
    token_step,
)

SOURCE_WIDTH = 8  # source lengths padded to a multiple of this, so few buckets recur
MAX_BUCKETS = 32  # captured buckets kept at once (a server meets many shapes and options); the least recent goes
BF16_TOKEN_SHARE = 0.1  # the canary under bf16: at most this share of hypotheses may differ from the plain search's
Hypotheses = TypeVar("Hypotheses", list[Hypothesis], list[list[Hypothesis]])


def bucket_shape(rows: int, src_len: int) -> tuple[int, int]:
    """``(R', S')`` of a batch of ``rows`` sentences of at most ``src_len`` tokens: rows to a power of two (at most
    twice the rows), the length to a multiple of ``SOURCE_WIDTH``."""
    return 1 << (rows - 1).bit_length(), -(-src_len // SOURCE_WIDTH) * SOURCE_WIDTH


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

    def read(self, steps: int, rows: int, src_lengths: Tensor, spec: SearchSpec) -> list[Hypothesis]:
        """The first ``rows`` rows' hypotheses after ``steps`` steps (the batch's one read back; one each)."""
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
        """One ``beam_step``, its results written back into these tensors: what a graph captures."""
        beams = replace(self.beams)  # the step replaces this copy's fields: the static tensors stay as inputs
        keep_slot, keep_token, attn, state = beam_step(model, beams, self.prev, self.state, self.memory, self.step,
                                                       self.alpha, blocked, self.slots, self.row_base,
                                                       keep_attention=self.attention is not None)
        at_step = self.step.view(1)
        self.tokens.index_copy_(0, at_step, keep_token.unsqueeze(0))  # [T, R, K]
        self.back.index_copy_(0, at_step, keep_slot.unsqueeze(0))
        if attn is not None:
            self.attention.index_copy_(0, at_step, attn.unsqueeze(0))  # [T, R, K, S]
        copy_into(self.state, state)
        self.prev.copy_(keep_token.view(-1))
        copy_into(self.beams, beams)
        self.step.add_(1)
        self.all_done.copy_(beams.done.all())

    def read(self, steps: int, rows: int, src_lengths: Tensor, spec: SearchSpec) -> list[list[Hypothesis]]:
        """The first ``rows`` sentences' ``n_best`` hypotheses after ``steps`` steps (read back once)."""
        attention = None if self.attention is None else self.attention[:steps, :rows]
        pool = tree_map(lambda t: t[:rows], self.beams.pool)  # [B, K] each
        return read_back(pool, self.tokens[:steps, :rows], self.back[:steps, :rows], attention, src_lengths,
                         spec.n_best)


def _empty(device: torch.device, *specs: tuple[int | tuple[()], torch.dtype]) -> list[Tensor]:
    """One uninitialised tensor per ``(shape, dtype)``."""
    return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in specs]


@dataclass
class _Bucket:
    graph: Any
    static: _Greedy | _Beam


class SearchGraphs(Search):
    """Greedy and beam search for ``model`` (in eval mode; its weights may change in place between batches), each
    bucket's step captured on first sight under ``precision``'s autocast and replayed (``GraphCache``). Rows never
    leave the batch, so shapes are fixed, and the outputs are the plain search's; with ``check``, each bucket's
    first batch is decoded by the plain search too and compared (the canary). After a failed capture or a
    mismatch the plain search serves.
    """

    def __init__(self, model: StepModel, device: torch.device, precision: str, check: bool) -> None:
        super().__init__(model)
        self.device, self.precision = device, precision
        self.cache = cuda_graphs.GraphCache(
            device, key="cuda_graphs", step_name="the search step", plain_name="the plain search",
            plain_after="decoding goes on without graphs", check=check, max_entries=MAX_BUCKETS)
        self.stats = self.cache.stats
        self.blocked = blocked_tokens(device)

    @torch.no_grad()
    def greedy(self, src: Tensor, src_lengths: Tensor, spec: SearchSpec, lag: int = 0) -> list[Hypothesis]:
        """As ``Search.greedy`` (``src_lengths`` on the host)."""
        return self._replayed("greedy", src, src_lengths, spec, lag, lambda: super(SearchGraphs, self).greedy(
            src, src_lengths, spec, lag))

    @torch.no_grad()
    def beam(self, src: Tensor, src_lengths: Tensor, spec: SearchSpec, lag: int = 0) -> list[list[Hypothesis]]:
        """As ``Search.beam`` (``src_lengths`` on the host)."""
        return self._replayed("beam", src, src_lengths, spec, lag, lambda: super(SearchGraphs, self).beam(
            src, src_lengths, spec, lag))

    def _replayed(self, kind: str, src: Tensor, src_lengths: Tensor, spec: SearchSpec, lag: int,
                  plain: Callable[[], Hypotheses]) -> Hypotheses:
        """The batch's hypotheses from its bucket's replays; from ``plain`` once the graphs no longer serve."""
        found = self._bucket(kind, src, src_lengths, spec) if self.cache.serving else None
        if found is None:
            self.stats.plain_runs += 1
            return plain()
        key, bucket, max_steps = found
        steps = steps_until_done(lambda _: self._replay(bucket), max_steps, self.device, lag)
        self.stats.replays += 1
        found = bucket.static.read(steps, src.shape[0], src_lengths, spec)
        return self.cache.check(key, found, plain, self._difference) if self.cache.check_due(key) else found

    def _replay(self, bucket: _Bucket) -> Tensor:
        """One replay of the bucket's step; its all-done flag (on CUDA copied out as it is posted)."""
        bucket.graph.replay()
        flag = bucket.static.all_done
        return flag if self.device.type == "cuda" else flag.clone()

    def _bucket(self, kind: str, src: Tensor, src_lengths: Tensor, spec: SearchSpec
                ) -> tuple[Any, _Bucket, int] | None:
        """This batch's bucket (its key, the bucket, the steps the batch may take), captured if new and loaded with
        the batch; None after a failed capture."""
        rows, src_len = bucket_shape(*src.shape)
        batch_limits = spec.limits(src_lengths)
        padded_src, padded_lengths, limits = self._pad(src, src_lengths, rows, src_len, batch_limits)
        # what the captured step depends on: the length penalty is loaded at each batch, n_best read at the end
        captured = replace(spec, length_penalty=0.0, n_best=1, keep_attention=spec.keep_attention and
                           self.model.has_attention)
        key = (kind, rows, src_len, captured)
        memory, state = self.model.encode(padded_src, padded_lengths)  # once per batch, eagerly
        bucket = self.cache.get(key) or self.cache.capture(
            key, [kind, rows, src_len], partial(self._capture, kind, memory, state, limits, captured, spec),
            f"the graph search's bucket of {rows} sentences x {src_len} source tokens"
            f"{f' x beam {spec.beam_size}' if kind == 'beam' else ''}", lower="batch_tokens")
        if bucket is None:
            return None
        bucket.static.load(memory, state, limits, spec.length_penalty)  # (again after a capture: its warm-up stepped)
        return key, bucket, max(batch_limits)

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

    def _capture(self, kind: str, memory: Any, state: Any, limits: Tensor, captured: SearchSpec, spec: SearchSpec
                 ) -> _Bucket:
        """The bucket of a batch encoded as ``memory`` and ``state``, its step captured."""
        src_len = leaves(memory)[0].shape[1]
        steps = captured.limits([src_len])[0]  # the most any row of the bucket may take
        keep = captured.keep_attention
        static = (_Greedy.allocate(memory, state, steps, keep) if kind == "greedy"
                  else _Beam.allocate(memory, state, steps, keep, spec.beam_size))
        static.load(memory, state, limits, spec.length_penalty)  # the warm-up run reads real tokens
        with autocast(self.precision, self.device, cache=False):  # cached weight casts would be stale
            graph = cuda_graphs.capture_graph(partial(static.advance, self.model, self.blocked), self.cache.pool,
                                              self.device)
        return _Bucket(graph, static)

    def _difference(self, replayed: Hypotheses, plain: Hypotheses) -> str | None:
        """The canary's test: None if the hypotheses' tokens are the plain search's (under bf16, all but at most
        ``BF16_TOKEN_SHARE`` of them), else how many differ."""
        ours, theirs = _flat(replayed), _flat(plain)
        differing = sum(a.tokens != b.tokens for a, b in zip(ours, theirs)) + abs(len(ours) - len(theirs))
        allowed = BF16_TOKEN_SHARE * len(theirs) if uses_bf16(self.precision, self.device) else 0
        return None if differing <= allowed else f"{differing} of {len(theirs)} hypotheses differ in their tokens"


def _flat(found: list[Hypothesis] | list[list[Hypothesis]]) -> list[Hypothesis]:
    """A greedy search's hypotheses, or a beam search's n-best lists one after the other."""
    return [hyp for item in found for hyp in (item if isinstance(item, list) else [item])]
