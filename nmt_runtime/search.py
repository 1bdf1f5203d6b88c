"""Greedy and beam search in numpy, step for step the search of ``nmt.model.search`` (GNMT length penalty).

The model is anything with ``encode(src, src_lengths) -> (memory, state)`` and ``step(prev_tokens, state, memory) ->
(log_probs [R, V], state)``, whose memory and state have ``select(rows)`` (and the state ``repeat(k)``); one with
``graph_top_k`` true has ``step_top(prev_tokens, state, memory, k) -> (log_probs [R, C], tokens [R, C], state)``
too, each row's C = min(k, V) best tokens (PAD and BOS blocked), largest first, and the beam search reads only
those. The rules are the engine's: a length limit of ``min(max_len, ceil(max_len_ratio * S) + 5)`` tokens (S
counting EOS); PAD and BOS never output; greedy sums the log-probabilities of its tokens (EOS included); beam search
keeps K hypotheses per sentence, pools those that end with EOS among the first K of the 2K best candidates, ranks
finished hypotheses by ``log P / ((5 + |Y|) / 6) ** alpha`` (|Y| the decoding steps, EOS included), ends a sentence
once K have finished or at its limit (its live hypotheses then finished as they are), and drops finished sentences
from the batch after every step.

Shapes: B sentences, K beam size, R rows (B or B*K), S source length, V target vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
BLOCKED = [PAD_ID, BOS_ID]  # never output; still in the normaliser (the graph's log-softmax is over all V)
NEG_INF = np.float32(-np.inf)


@dataclass
class Hypothesis:
    """Target ids (no BOS/EOS) and the score: summed log-probabilities (greedy) or that over the penalty (beam)."""

    tokens: list[int]
    score: float


def length_limits(src_lengths: np.ndarray, max_len: int, max_len_ratio: float | None) -> np.ndarray:
    """``[B]`` output limits, at least 1: ``min(max_len, ceil(ratio * S) + 5)``, or ``max_len`` with no ratio."""
    if max_len_ratio is None:
        return np.full(len(src_lengths), max_len, dtype=np.int64)
    return np.array([max(1, min(max_len, math.ceil(max_len_ratio * int(n)) + 5)) for n in src_lengths])


def length_penalty_factor(length: int, alpha: float) -> float:
    """GNMT length penalty ``((5 + length) / 6) ** alpha`` (Wu et al., 2016, Eq. 14)."""
    return ((5.0 + length) / 6.0) ** alpha


def greedy_search(model: Any, src: np.ndarray, src_lengths: np.ndarray, max_len: int,
                  max_len_ratio: float | None) -> list[Hypothesis]:
    """The arg-max token at every step. src ``[B, S]`` int64 (EOS-terminated, right-padded), src_lengths ``[B]``."""
    batch = src.shape[0]
    limits = length_limits(src_lengths, max_len, max_len_ratio)
    memory, state = model.encode(src, src_lengths)
    rows = np.arange(batch)  # the sentences still decoding
    prev = np.full(batch, BOS_ID, dtype=np.int64)
    tokens = np.full((batch, int(limits.max())), PAD_ID, dtype=np.int64)
    lengths, scores = limits.copy(), np.zeros(batch, dtype=np.float32)
    for step in range(int(limits.max())):
        # the full distribution: numpy's argmax is faster than onnxruntime's TopK of 1 (0.4 against 2.7 ms, [300, 8k])
        log_probs, state = model.step(prev, state, memory)  # [A, V]
        log_probs[:, BLOCKED] = NEG_INF
        best = log_probs.argmax(axis=1)  # [A]
        scores[rows] += log_probs[np.arange(len(rows)), best]
        tokens[rows, step] = best
        ended = best == EOS_ID
        lengths[rows[ended]] = step
        finished = ended | (step + 1 >= limits[rows])
        if finished.all():
            break
        keep = np.flatnonzero(~finished)
        if len(keep) < len(rows):  # finished rows leave the batch
            memory, state = memory.select(keep), state.select(keep)
        rows, prev = rows[keep], best[keep]
    return [Hypothesis(tokens[b, : lengths[b]].tolist(), float(scores[b])) for b in range(batch)]


def _top(values: np.ndarray, k: int) -> np.ndarray:
    """Column indices of the ``k`` largest entries of each row of ``[N, M]``, largest first."""
    width = values.shape[1]
    part = np.argpartition(values, width - k, axis=1)[:, width - k:] if k < width else \
        np.broadcast_to(np.arange(width), values.shape)
    order = np.argsort(-np.take_along_axis(values, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


TOP_K_BLOCK = 64  # vocabulary entries per block in _row_top_k (as nmt.model.search)


def _row_top_k(values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest entries of each row of ``[N, V]`` and their columns, ``[N, k]`` each, in no order.

    Why blocks: a row's k largest entries lie in the k blocks of ``TOP_K_BLOCK`` entries with the largest
    maxima (or in the last, partial block, which is always searched), so one ``max`` over the row and two
    small partitions replace a partition of all V entries (that was a third of a beam step on a CPU).
    """
    rows, width = values.shape
    if width < 2 * k * TOP_K_BLOCK:  # few blocks: little to save (measured: 1.5x at V = 2000, k = 10; 4x at V = 8000)
        columns = np.argpartition(values, width - k, axis=1)[:, width - k:]
        return np.take_along_axis(values, columns, axis=1), columns
    whole = width - width % TOP_K_BLOCK  # columns in whole blocks; the rest, the tail, is searched as it is
    blocks = values[:, :whole].reshape(rows, -1, TOP_K_BLOCK)  # [N, V/block, block]
    best_blocks = np.argpartition(blocks.max(axis=2), blocks.shape[1] - k, axis=1)[:, -k:]  # [N, k]
    inside = np.take_along_axis(blocks, best_blocks[:, :, None], axis=1).reshape(rows, k * TOP_K_BLOCK)
    searched = np.concatenate([inside, values[:, whole:]], axis=1)  # [N, k*block + tail]
    position = np.argpartition(searched, searched.shape[1] - k, axis=1)[:, -k:]  # [N, k]
    in_block = position < k * TOP_K_BLOCK
    block_column = np.take_along_axis(best_blocks, np.minimum(position // TOP_K_BLOCK, k - 1), axis=1) * TOP_K_BLOCK
    columns = np.where(in_block, block_column + position % TOP_K_BLOCK, whole + position - k * TOP_K_BLOCK)
    return np.take_along_axis(searched, position, axis=1), columns


def _row_candidates(log_probs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``min(2K, V)`` best log-probabilities and tokens, PAD and BOS blocked: ``[A*K, C]`` each, in no
    order. log_probs ``[A*K, V]`` (overwritten)."""
    log_probs[:, BLOCKED] = NEG_INF
    return _row_top_k(log_probs, min(2 * k, log_probs.shape[1]))


def _best_candidates(row_scores: np.ndarray, row_tokens: np.ndarray, beam_score: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The 2K best extensions of each sentence's beam: scores, the slot each extends, its token; ``[A, 2K]`` each.

    row_scores, row_tokens ``[A*K, C]``: each row's C = min(2K, V) best log-probabilities and their tokens (any
    order); beam_score ``[A, K]`` summed log-probs (-inf = empty slot). A slot's score is the same for all its
    tokens, so a sentence's 2K best are among the 2K best tokens of each slot.
    """
    n_active, k = beam_score.shape
    per_row = row_scores.shape[1]
    scores = (beam_score.reshape(-1, 1) + row_scores).reshape(n_active, k * per_row)  # [A, K*C]
    pos = _top(scores, min(2 * k, k * per_row))  # [A, 2K] (C = min(2K, V): min(2K, K*V))
    tokens = np.take_along_axis(row_tokens.reshape(n_active, k * per_row), pos, axis=1)
    return np.take_along_axis(scores, pos, axis=1), pos // per_row, tokens


@dataclass
class _Pool:
    """Finished hypotheses, K per sentence, best first: normalised score (-inf = empty), last step, last slot."""

    score: np.ndarray  # [N, K]
    end: np.ndarray  # [N, K] step of the last token (-1 = empty output)
    slot: np.ndarray  # [N, K] beam slot of that last token

    @staticmethod
    def empty(rows: int, k: int) -> _Pool:
        return _Pool(np.full((rows, k), NEG_INF, dtype=np.float32), np.full((rows, k), -1, dtype=np.int64),
                     np.zeros((rows, k), dtype=np.int64))

    def select(self, rows: np.ndarray) -> _Pool:
        return _Pool(self.score[rows], self.end[rows], self.slot[rows])

    def store(self, rows: np.ndarray, other: _Pool) -> None:
        self.score[rows], self.end[rows], self.slot[rows] = other.score, other.end, other.slot

    def merge(self, *finished: tuple[np.ndarray, np.ndarray, np.ndarray]) -> _Pool:
        """The K best per sentence of this pool and ``finished`` (score, end, slot: ``[N, K]`` each)."""
        parts = [np.concatenate(part, axis=1) for part in zip((self.score, self.end, self.slot), *finished)]
        pick = _top(parts[0], self.score.shape[1])  # [N, K]
        return _Pool(*(np.take_along_axis(part, pick, axis=1) for part in parts))


@dataclass
class _Beams:
    """The A sentences still decoding: row a is sentence ``rows[a]`` of the batch."""

    rows: np.ndarray  # [A]
    limits: np.ndarray  # [A]
    score: np.ndarray  # [A, K] summed log-probs of the live hypotheses (-inf = empty slot)
    n_finished: np.ndarray  # [A] hypotheses finished with EOS
    done: np.ndarray  # [A] K finished or at the limit
    pool: _Pool  # [A, K]

    @staticmethod
    def start(limits: np.ndarray, k: int) -> _Beams:
        batch = len(limits)
        score = np.full((batch, k), NEG_INF, dtype=np.float32)
        score[:, 0] = 0.0  # only slot 0 is live at the start: the first step does not pick K copies of a token
        return _Beams(np.arange(batch), limits, score, np.zeros(batch, dtype=np.int64), np.zeros(batch, dtype=bool),
                      _Pool.empty(batch, k))

    def select(self, rows: np.ndarray) -> _Beams:
        return _Beams(self.rows[rows], self.limits[rows], self.score[rows], self.n_finished[rows], self.done[rows],
                      self.pool.select(rows))

    def advance(self, step: int, cand_score: np.ndarray, cand_slot: np.ndarray, cand_token: np.ndarray,
                alpha: float) -> tuple[np.ndarray, np.ndarray]:
        """Pool the hypotheses that finish at ``step`` and keep the K best that continue: their slots and tokens
        ``[A, K]``. ``cand_*`` are ``_best_candidates``' ``[A, 2K]``."""
        k = self.score.shape[1]
        penalty = length_penalty_factor(step + 1, alpha)  # every hypothesis finished here took step + 1 steps
        is_eos = cand_token == EOS_ID  # [A, 2K]
        # an EOS among the first K candidates finishes a hypothesis whose last token came at step - 1
        eos_ok = is_eos[:, :k] & np.isfinite(cand_score[:, :k]) & ~self.done[:, None]  # [A, K]
        eos_score = np.where(eos_ok, cand_score[:, :k] / penalty, NEG_INF)
        self.n_finished = self.n_finished + eos_ok.sum(axis=1)
        continuing = np.where(is_eos, NEG_INF, cand_score)  # [A, 2K]
        keep = _top(continuing, k)  # [A, K]
        keep_score = np.take_along_axis(continuing, keep, axis=1)
        keep_slot = np.take_along_axis(cand_slot, keep, axis=1)
        keep_token = np.take_along_axis(cand_token, keep, axis=1)
        # at its limit a sentence's live hypotheses are finished as they are (step + 1 tokens)
        at_limit = (step + 1 >= self.limits) & ~self.done  # [A]
        forced_score = np.where(at_limit[:, None] & np.isfinite(keep_score), keep_score / penalty, NEG_INF)
        slots = np.broadcast_to(np.arange(k), keep_slot.shape)
        self.pool = self.pool.merge((eos_score, np.full_like(keep_slot, step - 1), cand_slot[:, :k]),
                                    (forced_score, np.full_like(keep_slot, step), slots))
        self.done = self.done | at_limit | (self.n_finished >= k)
        self.score = np.where(self.done[:, None], NEG_INF, keep_score).astype(np.float32)
        return keep_slot, keep_token


def beam_search(model: Any, src: np.ndarray, src_lengths: np.ndarray, beam_size: int, length_penalty: float,
                max_len: int, max_len_ratio: float | None, n_best: int) -> list[list[Hypothesis]]:
    """Batched beam search: per sentence up to ``n_best`` hypotheses, best first. src ``[B, S]``, lengths ``[B]``."""
    batch, k = src.shape[0], beam_size
    limits = length_limits(src_lengths, max_len, max_len_ratio)
    memory, state = model.encode(src, src_lengths)
    state = state.repeat(k)  # K rows per sentence; the memory keeps one (the step graph groups the rows)
    prev = np.full(batch * k, BOS_ID, dtype=np.int64)
    beams, final = _Beams.start(limits, k), _Pool.empty(batch, k)
    top_k = getattr(model, "graph_top_k", False)
    tokens_hist: list[np.ndarray] = []  # per step [B, K]: the token now in each slot
    back_hist: list[np.ndarray] = []  # per step [B, K]: the slot it extends
    for step in range(int(limits.max())):
        n_active = len(beams.rows)
        if top_k:  # each row's 2K best from the step graph: [A*K, C] each
            row_scores, row_tokens, state = model.step_top(prev, state, memory, 2 * k)
        else:
            log_probs, state = model.step(prev, state, memory)  # [A*K, V]
            row_scores, row_tokens = _row_candidates(log_probs, k)
        candidates = _best_candidates(row_scores, row_tokens, beams.score)
        keep_slot, keep_token = beams.advance(step, *candidates, length_penalty)
        tokens_hist.append(_scatter(keep_token, beams.rows, batch, PAD_ID))
        back_hist.append(_scatter(keep_slot, beams.rows, batch, 0))
        reorder = (np.arange(n_active)[:, None] * k + keep_slot).reshape(-1)  # [A*K] rows of the previous beam
        prev = keep_token.reshape(-1)
        if beams.done.any():
            leaving, staying = np.flatnonzero(beams.done), np.flatnonzero(~beams.done)
            final.store(beams.rows[leaving], beams.pool.select(leaving))
            if not len(staying):
                break
            staying_rows = (staying[:, None] * k + np.arange(k)).reshape(-1)  # [A'*K]
            reorder, prev = reorder[staying_rows], prev[staying_rows]
            memory, beams = memory.select(staying), beams.select(staying)
        state = state.select(reorder)
    else:  # the step limit ended the loop: every sentence still here is done at its limit
        final.store(beams.rows, beams.pool)
    return _read_back(final, np.stack(tokens_hist), np.stack(back_hist), n_best)


def _scatter(values: np.ndarray, rows: np.ndarray, batch: int, fill: int) -> np.ndarray:
    """``values`` ``[A, K]`` into ``[B, K]`` at ``rows``, ``fill`` elsewhere."""
    full = np.full((batch, values.shape[1]), fill, dtype=values.dtype)
    full[rows] = values
    return full


def _read_back(pool: _Pool, tokens: np.ndarray, back: np.ndarray, n_best: int) -> list[list[Hypothesis]]:
    """Follow the back-pointers ``[T, B, K]`` from the ``n_best`` best pooled hypotheses of each sentence."""
    results = []
    for b in range(pool.score.shape[0]):
        hyps = []
        for i in range(n_best):
            if pool.score[b, i] == NEG_INF:
                continue
            slot, path = pool.slot[b, i], []
            for t in range(pool.end[b, i], -1, -1):
                path.append(int(tokens[t, b, slot]))
                slot = back[t, b, slot]
            hyps.append(Hypothesis(path[::-1], float(pool.score[b, i])))
        results.append(hyps)
    return results
