"""Search: greedy, sampled and batched beam decoding over any model with the ``StepModel`` interface.

Shapes: B batch, K beam size, S source length, T target length, V target vocabulary, L decoder layers.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.data import BOS_ID, EOS_ID, PAD_ID

NEG_INF = float("-inf")


@runtime_checkable
class StepModel(Protocol):
    """The decoder step a search drives; ``Seq2Seq``, ``SearchModel`` and ``Ensemble`` satisfy it. ``memory`` and
    ``state`` are the model's own (``EncoderMemory``, ``[L, B, H]``); the search only reorders them
    (``memory.index_select(rows)``, ``state.index_select(1, rows)``, ``repeat_interleave``).
    """

    has_attention: bool  # whether decode_step returns real attention weights (False for attention=none)

    def encode(self, src: Tensor, src_lengths: Tensor) -> tuple[Any, Any]:
        """Source ids ``[B, S]`` and lengths ``[B]`` -> (memory, initial decoder state)."""

    def decode_step(self, prev_tokens: Tensor, state: Any, memory: Any) -> tuple[Tensor, Any, Tensor]:
        """Previous tokens ``[R]`` -> (next-token scores ``[R, V]``, new state, attention ``[R, S]``). Scores are
        unnormalised log-probabilities (logits, or an ensemble's mean log-probabilities): the search's log-softmax
        leaves log-probabilities as they are.
        """


@dataclass
class Hypothesis:
    """One output sequence.

    Attributes:
        tokens: target ids, without BOS and EOS.
        score: summed token log-probabilities (EOS included when emitted), divided by the GNMT length
            penalty in beam search.
        attention: ``[T_hyp, S_src]`` on the CPU, row j the attention that emitted ``tokens[j]`` over the real
            source positions (EOS included); None without attention or when not kept.
    """

    tokens: list[int]
    score: float
    attention: Tensor | None = None


@dataclass(frozen=True)
class SearchSpec:
    """What a greedy or beam search looks for, the same for every batch of a call (hashable: it keys the graph
    search's buckets). Attributes as for ``beam_search``; ``beam_size`` 1 is the greedy search."""

    beam_size: int
    length_penalty: float
    n_best: int
    max_len: int
    max_len_ratio: float | None
    keep_attention: bool

    def limits(self, src_lengths: Tensor | Sequence[int]) -> list[int]:
        return length_limits(src_lengths, self.max_len, self.max_len_ratio)


def length_limits(src_lengths: Tensor | Sequence[int], max_len: int, max_len_ratio: float | None) -> list[int]:
    """B output limits, at least 1 each: ``min(max_len, ceil(max_len_ratio * src_len) + 5)``, or ``max_len`` when
    ``max_len_ratio`` is None; ``src_lengths`` ``[B]`` count EOS."""
    lengths = src_lengths.tolist() if isinstance(src_lengths, Tensor) else list(src_lengths)
    if max_len_ratio is None:
        return [max_len] * len(lengths)
    return [max(1, min(max_len, math.ceil(max_len_ratio * n) + 5)) for n in lengths]


def length_penalty_factor(length: int | Tensor, alpha: float) -> float | Tensor:
    """GNMT length penalty ``((5 + length) / 6) ** alpha`` (Wu et al., 2016, Eq. 14), elementwise."""
    return ((5.0 + length) / 6.0) ** alpha


def blocked_tokens(device: torch.device) -> Tensor:
    """Token ids that are never outputs (PAD, BOS): ``[2]``, for ``index_fill_`` on ``[rows, V]``."""
    return torch.tensor([PAD_ID, BOS_ID], device=device)


class LateFlag:
    """A per-step device flag (``all rows finished``, ``some sentence done``; only ever turning True) read without
    stalling the device: on CUDA copied to pinned host memory without blocking and read once landed, so the loop
    learns a step or a few late (finished rows are masked: no output changes); elsewhere at once, or ``lag``
    posts late (tests).
    """

    MAX_AHEAD = 4  # steps the host may queue past the last flag it has read

    def __init__(self, device: torch.device, lag: int = 0) -> None:
        self.on_cuda, self.lag, self.posted = device.type == "cuda", lag, 0
        self.pending: deque[tuple[Any, Tensor]] = deque()  # (CUDA event or None, the flag's host copy)
        # Pinned slots allocated once per search, reused in turn: never more than MAX_AHEAD + 1 are pending.
        self.slots = torch.empty(self.MAX_AHEAD + 2, dtype=torch.bool, pin_memory=True) if self.on_cuda else None

    def post(self, flag: Tensor) -> None:
        """Start reading ``flag`` (a bool scalar on the device)."""
        if self.slots is None:
            self.pending.append((None, flag))
            return
        host = self.slots[self.posted % len(self.slots)]
        self.posted += 1
        host.copy_(flag, non_blocking=True)
        landed = torch.cuda.Event()
        landed.record()
        self.pending.append((landed, host))

    def seen(self) -> bool:
        """Whether a posted flag that has reached the host so far was True."""
        if self.on_cuda and len(self.pending) > self.MAX_AHEAD:
            # A few queued steps keep the GPU busy; more would only be work past the end when it computes slowly.
            self.pending[0][0].synchronize()
        true = False
        while self.pending and (self.pending[0][0].query() if self.on_cuda else len(self.pending) > self.lag):
            true = bool(self.pending.popleft()[1]) or true  # a host tensor here: no device wait
        return true

    def reset(self) -> None:
        """Drop the flags posted so far (they describe rows that have just left the batch)."""
        self.pending.clear()


@torch.no_grad()
def greedy_search(model: StepModel, src: Tensor, src_lengths: Tensor, max_len: int, max_len_ratio: float | None,
                  keep_attention: bool = True, lag: int = 0) -> list[Hypothesis]:
    """Decode a batch by taking the most probable token at every step.

    Args:
        model: the model, in eval mode.
        src: ``[B, S]`` source ids (EOS-terminated, right-padded).
        src_lengths: ``[B]`` real lengths, EOS included.
        max_len: at most this many output tokens per sentence.
        max_len_ratio: if set, also at most ``ceil(ratio * src_len) + 5``.
        keep_attention: record each step's attention (False saves the copies when nobody reads them).
        lag: off CUDA, learn that every row is finished this many steps late (``LateFlag``; for tests).

    Returns:
        One hypothesis per row of ``src``, in order.
    """
    return _token_by_token(model, src, src_lengths, max_len, max_len_ratio, keep_attention,
                           choose=lambda log_probs: log_probs.max(dim=-1), lag=lag)


@torch.no_grad()
def sample_search(model: StepModel, src: Tensor, src_lengths: Tensor, max_len: int, max_len_ratio: float | None,
                  temperature: float, top_k: int, generator: torch.Generator, keep_attention: bool = True
                  ) -> list[Hypothesis]:
    """Decode a batch by drawing every token from ``softmax(log p / temperature)``: one sample per sentence.

    With ``top_k > 0`` the draw is among the ``top_k`` most probable tokens (Edunov et al., 2018 sample
    back-translations both ways); ``top_k = 1`` is greedy. The score sums the drawn tokens' log-probabilities
    under the model itself, so scores compare with greedy's. ``generator`` lives on ``src``'s device: the same
    state, batch and model give the same samples. Other arguments and the result as for ``greedy_search``.
    """

    def draw(log_probs: Tensor) -> tuple[Tensor, Tensor]:  # [B, V] -> token log-probs [B], tokens [B]
        scaled = log_probs / temperature  # [B, V], blocked tokens stay -inf
        if 0 < top_k < scaled.shape[-1]:
            top_values, top_tokens = scaled.topk(top_k, dim=-1)  # [B, k]
            pick = torch.multinomial(top_values.softmax(dim=-1), 1, generator=generator)  # [B, 1]
            tokens = top_tokens.gather(1, pick).squeeze(1)  # [B]
        else:
            tokens = torch.multinomial(scaled.softmax(dim=-1), 1, generator=generator).squeeze(1)  # [B]
        return log_probs.gather(1, tokens.unsqueeze(1)).squeeze(1), tokens

    return _token_by_token(model, src, src_lengths, max_len, max_len_ratio, keep_attention, choose=draw)


def _token_by_token(model: StepModel, src: Tensor, src_lengths: Tensor, max_len: int, max_len_ratio: float | None,
                    keep_attention: bool, choose: Callable[[Tensor], tuple[Tensor, Tensor]], lag: int = 0
                    ) -> list[Hypothesis]:
    """One hypothesis per sentence, one token per step: ``choose(log_probs [B, V]) -> (log-probs [B], tokens [B])``.
    All B rows step until all are finished (a finished row's tokens are discarded), learnt through a ``LateFlag``.
    """
    device, batch = src.device, src.shape[0]
    limits_list = length_limits(src_lengths, max_len, max_len_ratio)
    limits = torch.tensor(limits_list, device=device)  # [B]
    memory, state = model.encode(src, src_lengths)  # state: [L, B, H]
    prev = torch.full((batch,), BOS_ID, dtype=torch.long, device=device)  # [B]
    finished = torch.zeros(batch, dtype=torch.bool, device=device)  # [B]
    out_len = limits.clone()  # [B] tokens kept per row, fixed when EOS comes
    scores = torch.zeros(batch, device=device)  # [B]
    blocked = blocked_tokens(device)
    steps_tokens, steps_attn = [], []  # per step: [B] tokens, [B, S] attention

    def step_of(step: int) -> Tensor:
        nonlocal prev, state, finished, out_len, scores
        prev, state, attn, (finished, out_len, scores) = token_step(
            model, choose, blocked, prev, state, memory, finished, out_len, scores, limits, step)
        steps_tokens.append(prev)
        if keep_attention and model.has_attention:
            steps_attn.append(attn.float())
        return finished.all()

    steps_until_done(step_of, max(limits_list), device, lag)
    attention = torch.stack(steps_attn, dim=1).cpu() if steps_attn else None  # [B, T, S]
    return hypotheses_of(torch.stack(steps_tokens, dim=1).cpu(), attention, out_len, scores, src_lengths)


def steps_until_done(step: Callable[[int], Tensor], max_steps: int, device: torch.device, lag: int,
                     when_seen: Callable[[], bool] | None = None) -> int:
    """The one loop of every greedy and beam search, plain or replayed: ``step(i)`` for i = 0, 1, ... (it returns a
    ``[]`` bool flag) until ``max_steps`` have run or a True flag reaches the host (``LateFlag``: a step or a few late
    on CUDA, ``lag`` steps late off it). Then ``when_seen()`` says whether to stop (None: stop): where the rows live
    decides it. Rows kept in place stop when all are finished; the plain beam search's flag says some sentence is
    done, and ``when_seen`` compacts the rows, stopping once none is left. Returns the steps run.
    """
    flag = LateFlag(device, lag)
    for i in range(max_steps):
        flag.post(step(i))
        if flag.seen():
            flag.reset()  # the flags posted so far describe rows that have left (or the search is over)
            if when_seen is None or when_seen():
                return i + 1
    return max_steps


def token_step(model: StepModel, choose: Callable[[Tensor], tuple[Tensor, Tensor]], blocked: Tensor, prev: Tensor,
               state: Any, memory: Any, finished: Tensor, out_len: Tensor, scores: Tensor, limits: Tensor,
               step: int | Tensor) -> tuple[Tensor, Any, Tensor, tuple[Tensor, Tensor, Tensor]]:
    """One token-by-token step over R rows, reading nothing back (the plain and the graph search run it). ``prev``,
    ``finished``, ``out_len`` (tokens kept), ``scores``, ``limits``: ``[R]``; ``step``: 0-based, an int or a device
    scalar. Returns the tokens ``[R]``, the new state, the attention ``[R, S]`` and the new (finished, out_len, scores).
    """
    logits, state, attn = model.decode_step(prev, state, memory)  # [R, V], [L, R, H], [R, S]
    log_probs = F.log_softmax(logits.float(), dim=-1).index_fill_(1, blocked, NEG_INF)  # [R, V]
    best_lp, best = choose(log_probs)  # [R], [R]
    active = ~finished
    scores = scores + torch.where(active, best_lp, 0.0)  # (a scalar: no zeros tensor every step)
    ended = active & (best == EOS_ID)
    out_len = torch.where(ended, _filled_like(out_len, step), out_len)
    finished = finished | ended | (step + 1 >= limits)
    return best, state, attn, (finished, out_len, scores)


def _filled_like(like: Tensor, value: int | Tensor) -> Tensor:
    """``like``'s shape filled with ``value`` (an int, or a device scalar the host never reads)."""
    return torch.full_like(like, value) if isinstance(value, int) else value.to(like.dtype).expand_as(like)


def hypotheses_of(tokens: Tensor, attention: Tensor | None, lengths: Tensor, scores: Tensor, src_lengths: Tensor
                ) -> list[Hypothesis]:
    """Row r's tokens ``[R, T]`` cut to ``lengths[r]``, its score, its attention ``[R, T, S]`` cut to its source."""
    return [Hypothesis(tokens[r, :n].tolist(), score, None if attention is None else attention[r, :n, :s].clone())
            for r, (n, score, s) in enumerate(zip(lengths.tolist(), scores.tolist(), src_lengths.tolist()))]


@torch.no_grad()
def beam_search(model: StepModel, src: Tensor, src_lengths: Tensor, beam_size: int, length_penalty: float, max_len: int,
                max_len_ratio: float | None, n_best: int, keep_attention: bool = True, lag: int = 0
                ) -> list[list[Hypothesis]]:
    """Batched beam search with the GNMT length penalty (Wu et al., 2016, Eq. 14): a finished Y scores
    ``log P(Y|X) / ((5 + |Y|) / 6) ** alpha``, |Y| counting EOS. All B*K hypotheses step at once; as in fairseq,
    an EOS among the first K of the 2K best candidates goes to the sentence's pool and the K best non-EOS go on.
    A sentence is done with K finished or at its length limit (live ones finish as they are) and leaves the
    batch once the host learns of it (``LateFlag``: at once on a CPU, a step or a few later on a GPU). K=1 is
    token for token the greedy search. Returns, for each row of ``src``, up to ``n_best`` hypotheses, best first.

    Args:
        beam_size: K, hypotheses kept per sentence.
        length_penalty: alpha (0 = none).
        n_best: hypotheses returned per sentence (at most K).
        Others (``lag`` too): as for ``greedy_search``.
    """
    device, batch, k = src.device, src.shape[0], beam_size
    limits = length_limits(src_lengths, max_len, max_len_ratio)
    memory, state = model.encode(src, src_lengths)  # state: [L, B, H]
    # K rows of decoder state per sentence; the memory keeps one row per sentence (see Decoder._attend)
    state = state.repeat_interleave(k, dim=1)  # [L, A*K, H]
    prev = torch.full((batch * k,), BOS_ID, dtype=torch.long, device=device)  # [A*K]
    beams = Beams.start(torch.tensor(limits, device=device), k)
    final = Pool.empty(batch, k, device)  # the pools of the sentences that have left the batch, in original order
    history = _History(batch, keep_attention and model.has_attention)
    blocked = blocked_tokens(device)
    # after a compaction the A active sentences are rows 0..A-1, so the first A rows of these serve
    row_base = (torch.arange(batch, device=device) * k).unsqueeze(1)  # [B, 1] first beam row of each sentence
    slots = torch.arange(k, device=device).expand(batch, k)  # [B, K] slot numbers

    def step_of(step: int) -> Tensor:
        nonlocal state, prev
        n_active = beams.rows.shape[0]
        keep_slot, keep_token, attn, state = beam_step(model, beams, prev, state, memory, step, length_penalty,
                                                       blocked, slots[:n_active], row_base[:n_active],
                                                       history.keep_attention)
        history.record(keep_token, keep_slot, attn, beams.rows)
        prev = keep_token.view(-1)  # [A*K]
        return beams.done.any()

    def compact() -> bool:
        """The done sentences leave the batch, their pools kept; True once none is left."""
        nonlocal state, prev, memory, beams
        leaving, staying = beams.done.nonzero().squeeze(1), (~beams.done).nonzero().squeeze(1)  # [A_done], [A']
        final.store(beams.rows[leaving], beams.pool.select(leaving))
        if staying.numel() == 0:
            return True
        staying_rows = (row_base[staying] + slots[0]).view(-1)  # [A'*K] their beam rows
        state, prev = state.index_select(1, staying_rows), prev.index_select(0, staying_rows)
        memory, beams = memory.index_select(staying), beams.select(staying)
        return False

    steps_until_done(step_of, max(limits), device, lag, when_seen=compact)
    # the sentences still in the batch are done at their limit (or were all just stored: the same values again)
    final.store(beams.rows, beams.pool)
    attn_hist = torch.stack(history.attn) if history.attn else None  # [T, B, K, S]
    return read_back(final, torch.stack(history.tokens), torch.stack(history.back), attn_hist, src_lengths, n_best)


class Search:
    """Greedy or beam search over ``model`` as a ``SearchSpec`` asks, the rows compacted as sentences end (the plain
    search); ``nmt.model.graph_search.SearchGraphs`` keeps them in a static bucket instead."""

    def __init__(self, model: StepModel) -> None:
        self.model = model

    def __call__(self, src: Tensor, src_lengths: Tensor, spec: SearchSpec, lag: int = 0) -> list[list[Hypothesis]]:
        """Each row's hypotheses, best first: one (greedy, ``beam_size`` 1) or up to ``n_best`` (beam)."""
        if spec.beam_size == 1:
            return [[hyp] for hyp in self.greedy(src, src_lengths, spec, lag)]
        return self.beam(src, src_lengths, spec, lag)

    def greedy(self, src: Tensor, src_lengths: Tensor, spec: SearchSpec, lag: int = 0) -> list[Hypothesis]:
        return greedy_search(self.model, src, src_lengths, spec.max_len, spec.max_len_ratio, spec.keep_attention, lag)

    def beam(self, src: Tensor, src_lengths: Tensor, spec: SearchSpec, lag: int = 0) -> list[list[Hypothesis]]:
        return beam_search(self.model, src, src_lengths, spec.beam_size, spec.length_penalty, spec.max_len,
                           spec.max_len_ratio, spec.n_best, spec.keep_attention, lag)


def beam_step(model: StepModel, beams: Beams, prev: Tensor, state: Any, memory: Any, step: int | Tensor,
              alpha: float | Tensor, blocked: Tensor, slots: Tensor, row_base: Tensor, keep_attention: bool
              ) -> tuple[Tensor, Tensor, Tensor | None, Any]:
    """One beam step over A sentences' K rows each, reading nothing back (the plain and the replayed search run it):
    decode, the 2K best candidates, ``beams.advance`` (which replaces ``beams``' fields), the state reordered.

    Args:
        prev: ``[A*K]`` the tokens of the live hypotheses; ``state``: ``[L, A*K, H]``; ``memory``: A rows.
        step, alpha: 0-based step and length penalty, ints or device scalars.
        slots: ``[A, K]`` slot numbers; ``row_base``: ``[A, 1]`` each sentence's first beam row.

    Returns:
        The slot each continuing hypothesis extends and its token (``[A, K]`` each), the attention that emitted it
        (``[A, K, S]`` float32; None unless ``keep_attention``), and the continuing hypotheses' state ``[L, A*K, H]``.
    """
    logits, state, attn = model.decode_step(prev, state, memory)  # [A*K, V], [L, A*K, H], [A*K, S]
    candidates = best_candidates(logits, beams.score, blocked)  # scores, slots, tokens: [A, 2K] each
    keep_slot, keep_token = beams.advance(step, *candidates, alpha, slots)
    reorder = (row_base + keep_slot).view(-1)  # [A*K] rows of the previous beam to continue
    kept_attention = _attention_by_slot(attn, keep_slot) if keep_attention else None
    return keep_slot, keep_token, kept_attention, state.index_select(1, reorder)


@dataclass
class Pool:
    """Finished hypotheses, K per sentence, best first: their scores and where back-tracking starts."""

    score: Tensor  # [N, K] normalised score (-inf = empty entry)
    end: Tensor  # [N, K] step of the last token (-1 = empty output)
    slot: Tensor  # [N, K] beam slot of that last token

    @staticmethod
    def empty(rows: int, k: int, device: torch.device) -> Pool:
        return Pool(torch.full((rows, k), NEG_INF, device=device),
                     torch.full((rows, k), -1, dtype=torch.long, device=device),
                     torch.zeros((rows, k), dtype=torch.long, device=device))

    def select(self, rows: Tensor) -> Pool:
        return Pool(self.score.index_select(0, rows), self.end.index_select(0, rows), self.slot.index_select(0, rows))

    def store(self, rows: Tensor, other: Pool) -> None:
        """``other``'s rows into rows ``rows`` of this pool."""
        self.score[rows], self.end[rows], self.slot[rows] = other.score, other.end, other.slot

    def merge(self, *finished: tuple[Tensor, Tensor, Tensor]) -> Pool:
        """The K best per sentence of this pool and ``finished`` (score, end, slot: ``[N, K]`` each)."""
        scores, ends, slots = (torch.cat(part, dim=1) for part in zip((self.score, self.end, self.slot), *finished))
        score, pick = scores.topk(self.score.shape[1], dim=1)  # [N, K]
        return Pool(score, ends.gather(1, pick), slots.gather(1, pick))


@dataclass
class Beams:
    """The search state of the A sentences still in the batch (row a is ``src`` row ``rows[a]``); a done sentence
    leaves once the host learns of it, so the batch shrinks as sentences end.
    """

    rows: Tensor  # [A]
    limits: Tensor  # [A] output length limit
    score: Tensor  # [A, K] summed log-probs of the live hypotheses (-inf = empty slot)
    n_finished: Tensor  # [A] hypotheses finished with EOS
    done: Tensor  # [A] K finished or at the limit: can add nothing more, leaves when the host learns it
    pool: Pool  # [A, K]

    @staticmethod
    def start(limits: Tensor, k: int) -> Beams:
        batch, device = limits.shape[0], limits.device
        # only slot 0 is live at the start, so the first step does not pick K copies of one token
        score = torch.full((batch, k), NEG_INF, device=device)  # [B, K]
        score[:, 0] = 0.0
        n_finished = torch.zeros(batch, dtype=torch.long, device=device)  # [B]
        return Beams(torch.arange(batch, device=device), limits, score, n_finished, n_finished.bool(),
                      Pool.empty(batch, k, device))

    def select(self, rows: Tensor) -> Beams:
        """Only the sentences at ``rows`` ``[A']``."""
        tensors = (t.index_select(0, rows) for t in (self.rows, self.limits, self.score, self.n_finished, self.done))
        return Beams(*tensors, self.pool.select(rows))

    def advance(self, step: int | Tensor, cand_score: Tensor, cand_slot: Tensor, cand_token: Tensor,
                alpha: float | Tensor,
                slots: Tensor) -> tuple[Tensor, Tensor]:
        """Pool the hypotheses that finish at (0-based) ``step`` and keep the K best that continue; ``cand_*`` are
        ``best_candidates``' ``[A, 2K]``, ``step`` and ``alpha`` ints or device scalars. Returns their slots and tokens.
        """
        k = slots.shape[1]
        # every hypothesis finished at this step took step+1 decoding steps: one penalty for all
        penalty = length_penalty_factor(step + 1, alpha)
        is_eos = cand_token == EOS_ID  # [A, 2K]
        # an EOS among the first K candidates finishes a hypothesis of `step` tokens, the last at step-1
        eos_ok = is_eos[:, :k] & torch.isfinite(cand_score[:, :k]) & ~self.done.unsqueeze(1)  # [A, K]
        eos_score = (cand_score[:, :k] / penalty).masked_fill(~eos_ok, NEG_INF)  # [A, K]
        self.n_finished = self.n_finished + eos_ok.sum(dim=1)
        # the K best non-EOS candidates continue
        keep_score, keep_pos = cand_score.masked_fill(is_eos, NEG_INF).topk(k, dim=1)  # [A, K]
        keep_slot, keep_token = cand_slot.gather(1, keep_pos), cand_token.gather(1, keep_pos)  # [A, K]
        # at its length limit a sentence's live hypotheses are finished as they are (step+1 tokens)
        at_limit = (step + 1 >= self.limits) & ~self.done  # [A]
        forced_ok = at_limit.unsqueeze(1) & torch.isfinite(keep_score)  # [A, K]
        forced_score = (keep_score / penalty).masked_fill(~forced_ok, NEG_INF)  # [A, K]
        # into the pool, keeping the K best: an EOS-finished hypothesis ends at step-1 in the slot it extends,
        # a forced one at this step in its own slot
        self.pool = self.pool.merge((eos_score, _filled_like(cand_slot[:, :k], step - 1), cand_slot[:, :k]),
                                    (forced_score, _filled_like(keep_slot, step), slots))
        self.done = self.done | at_limit | (self.n_finished >= k)
        # until the host learns of it a finished sentence keeps running, but can add nothing more
        self.score = keep_score.masked_fill(self.done.unsqueeze(1), NEG_INF)  # [A, K]
        return keep_slot, keep_token


class _History:
    """Every step's continuing hypotheses in ``src`` rows: tokens, back-pointers, the attention that emitted them."""

    def __init__(self, batch: int, keep_attention: bool) -> None:
        self.batch, self.keep_attention = batch, keep_attention
        self.tokens: list[Tensor] = []  # per step [B, K]: token now in each slot
        self.back: list[Tensor] = []  # per step [B, K]: the slot it extends
        self.attn: list[Tensor] = []  # per step [B, K, S]; empty without attention

    def record(self, token: Tensor, slot: Tensor, attn: Tensor | None, rows: Tensor) -> None:
        """Tokens, back-pointers ``[A, K]`` and attention ``[A, K, S]`` (or None) of sentences ``rows`` ``[A]``."""
        self.tokens.append(self._scatter(token, rows, PAD_ID))  # [B, K]
        self.back.append(self._scatter(slot, rows, 0))  # [B, K]
        if attn is not None:
            self.attn.append(self._scatter(attn, rows, 0.0))  # [B, K, S]

    def _scatter(self, values: Tensor, rows: Tensor, fill: float | int) -> Tensor:
        """``values`` ``[A, ...]`` into ``[B, ...]`` at ``rows``, ``fill`` elsewhere."""
        full = values.new_full((self.batch, *values.shape[1:]), fill)
        full[rows] = values
        return full


def _attention_by_slot(attn: Tensor, slot: Tensor) -> Tensor:
    """The attention ``[A*K, S]`` that emitted each continuing hypothesis of slots ``[A, K]``: ``[A, K, S]`` float32."""
    step_attn = attn.float().view(*slot.shape, -1)  # [A, K, S]
    return step_attn.gather(1, slot.unsqueeze(2).expand_as(step_attn))  # [A, K, S]


def best_candidates(logits: Tensor, beam_score: Tensor, blocked: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The 2K best extensions of each sentence's beam: scores, the slot each extends, and its token.

    A candidate scores ``beam_score[slot] + log p(token)``; the slot's score is shared by its tokens, so a
    sentence's 2K best are among each row's 2K best logits (``_row_top_k``), and only those become
    log-probabilities: no ``[A*K, V]`` softmax is written out (faster on a CPU; docs/results/speed.md).

    Args:
        logits: ``[A*K, V]``, overwritten (nothing reads it afterwards).
        beam_score: ``[A, K]`` summed log-probs (-inf for an empty slot).
        blocked: token ids never output; they still count in the normaliser (the model's full distribution).

    Returns:
        scores, slots and tokens, each ``[A, 2K]`` (``[A, min(2K, K*V)]``), best first.
    """
    n_active, k = beam_score.shape
    vocab = logits.shape[-1]
    logits = logits.float()
    blocked_logits = logits.index_select(1, blocked)  # [A*K, 2], kept for the normaliser
    logits.index_fill_(1, blocked, NEG_INF)
    n_cand = min(2 * k, k * vocab)
    row_logit, row_token = _row_top_k(logits, min(n_cand, vocab))  # [A*K, C]
    log_norm = _log_normaliser(logits, row_logit[:, :1], blocked_logits)  # [A*K, 1]
    per_row = row_logit.shape[1]
    scores = (beam_score.view(-1, 1) + (row_logit - log_norm)).view(n_active, k * per_row)  # [A, K*C]
    cand_score, cand_pos = scores.topk(n_cand, dim=1)  # [A, 2K], sorted
    cand_token = row_token.view(n_active, k * per_row).gather(1, cand_pos)  # [A, 2K]
    return cand_score, cand_pos // per_row, cand_token


def _log_normaliser(logits: Tensor, top_logit: Tensor, blocked_logits: Tensor) -> Tensor:
    """``log Σ_v exp(z_v)`` ``[N, 1]`` over ``logits`` ``[N, V]`` (blocked entries at -inf; overwritten) and the
    blocked entries' values ``[N, b]``, shifted by the row maximum (``top_logit`` is the largest unblocked one).
    In place, where ``torch.logsumexp`` would allocate two ``[N, V]`` temporaries.
    """
    row_max = torch.maximum(top_logit, blocked_logits.amax(dim=1, keepdim=True))  # [N, 1]
    total = logits.sub_(row_max).exp_().sum(dim=1, keepdim=True)  # [N, 1]
    total += (blocked_logits - row_max).exp().sum(dim=1, keepdim=True)
    return total.log_().add_(row_max)


TOP_K_BLOCK = 64  # vocabulary entries per block in _row_top_k (measured fastest of 32 / 64 / 128 at V = 8k)


def _row_top_k(values: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``values.topk(k, dim=1)`` for ``[N, V]``, with the full-width work reduced to one ``amax``.

    A row's k largest entries lie in the k blocks of ``TOP_K_BLOCK`` with the largest maxima, so a top-k over
    block maxima and one inside those blocks find them: about 2x faster on a CPU than ``topk`` over an 8k
    vocabulary. Among exactly equal values the columns picked may differ.

    Returns:
        values and column indices, ``[N, k]`` each, largest first.
    """
    rows, width = values.shape
    if width < 4 * k * TOP_K_BLOCK:  # few blocks: nothing to save
        return values.topk(k, dim=1)
    if width % TOP_K_BLOCK:  # (a copy, so only when the width needs it)
        values = F.pad(values, (0, -width % TOP_K_BLOCK), value=NEG_INF)  # [N, V'], V' a multiple of the block
    blocks = values.reshape(rows, -1, TOP_K_BLOCK)  # [N, V'/block, block]
    best_blocks = blocks.amax(dim=2).topk(k, dim=1).indices  # [N, k]
    inside = blocks.gather(1, best_blocks.unsqueeze(2).expand(rows, k, TOP_K_BLOCK)).view(rows, -1)  # [N, k*block]
    top_values, position = inside.topk(k, dim=1)  # [N, k]
    columns = best_blocks.gather(1, position // TOP_K_BLOCK) * TOP_K_BLOCK + position % TOP_K_BLOCK  # [N, k]
    return top_values, columns


def read_back(pool: Pool, tokens_hist: Tensor, back_hist: Tensor, attn_hist: Tensor | None, src_lengths: Tensor,
              n_best: int) -> list[list[Hypothesis]]:
    """Follow the ``n_best`` best pooled hypotheses ``[B, K]`` back, on the CPU, through the history ``[T, B, K]``."""
    score, end, slot = (t[:, :n_best].cpu() for t in (pool.score, pool.end, pool.slot))  # [B, N] each
    tokens_hist, back_hist = tokens_hist.cpu(), back_hist.cpu()  # [T, B, K]
    attn_hist = None if attn_hist is None else attn_hist.cpu()  # [T, B, K, S]
    steps = tokens_hist.shape[0]
    batch, n = score.shape
    # walk back from the last step, all hypotheses at once; a hypothesis joins when its end is reached
    tokens = torch.full((batch, n, steps), PAD_ID, dtype=torch.long)  # [B, N, T]
    attention = None if attn_hist is None else torch.zeros(batch, n, steps, attn_hist.shape[-1])  # [B, N, T, S]
    cur = slot.clone()  # [B, N]
    for t in range(steps - 1, -1, -1):
        on = t <= end  # [B, N]
        tokens[:, :, t] = torch.where(on, tokens_hist[t].gather(1, cur), tokens[:, :, t])
        if attention is not None:
            idx = cur.unsqueeze(2).expand(batch, n, attn_hist.shape[-1])  # [B, N, S]
            attention[:, :, t] = torch.where(on.unsqueeze(2), attn_hist[t].gather(1, idx), 0.0)
        cur = torch.where(on, back_hist[t].gather(1, cur), cur)
    attention = None if attention is None else attention.flatten(0, 1)  # [B*N, T, S]
    hyps = hypotheses_of(tokens.flatten(0, 1), attention, (end + 1).flatten(), score.flatten(),
                       src_lengths.repeat_interleave(n))  # B*N, empty pool entries (score -inf) included
    return [[hyp for hyp in hyps[b * n:(b + 1) * n] if hyp.score != NEG_INF] for b in range(batch)]
