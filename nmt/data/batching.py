"""Batching: token-budget batches (``B * max(S, T) <= max_tokens``) cut from length-sorted pairs, as Marian's
"mini-batch-fit" does, shared across DDP ranks, resumable mid-epoch, and padded into tensors.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Sampler

from nmt.common.memory import release_free_memory
from nmt.data.encoded import EncodedSplit, SplitPart
from nmt.data.errors import DataError
from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------
# Which pairs go together
# --------------------------------------------------------------------------------------------------


def pack_batches(order: Sequence[int], src_lengths: Sequence[int], tgt_lengths: Sequence[int],
                 max_tokens: int) -> list[list[int]]:
    """Cut ``order`` (pair indices, length-sorted so neighbours pad little) greedily into consecutive batches with
    ``B * max(S, T) <= max_tokens``, one pair at a time; a pair over the budget forms its own batch. Lengths
    count EOS (source) and BOS/EOS (target). The sampler uses ``cut_sorted``, which makes the same cuts.
    """
    batches: list[list[int]] = []
    current: list[int] = []
    current_max = 0
    for i in order:
        length = max(src_lengths[i], tgt_lengths[i])
        new_max = max(current_max, length)
        if current and new_max * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, current_max = [i], length
        else:
            current.append(i)
            current_max = new_max
    if current:
        batches.append(current)
    return batches


def cut_sorted(widths: np.ndarray, max_tokens: int) -> np.ndarray:
    """Where ``pack_batches`` cuts pairs whose ``widths`` ``[N]`` (``max(S, T)``, in batching order) are sorted
    either way, found per batch instead of per pair: ``[num_batches + 1]`` int64 bounds, batch ``k`` holding
    positions ``bounds[k]:bounds[k + 1]``.
    """
    n = len(widths)
    bounds, start = [0], 0
    if n and widths[0] > widths[-1]:  # widest first: a batch's first pair sets its width
        while start < n:
            start = min(n, start + max(1, max_tokens // int(widths[start])))
            bounds.append(start)
        return np.array(bounds, np.int64)
    # Narrowest first: a batch's last pair sets its width. In a run of pairs of width w, a batch that
    # starts at `start` ends before position start + max_tokens // w (and holds at least one pair).
    first = np.flatnonzero(np.r_[True, widths[1:] != widths[:-1]])
    run_start, run_end = first.tolist(), [*first[1:].tolist(), n]
    run_cap = (max_tokens // widths[first].astype(np.int64)).tolist()  # a budget over 65,535 / uint16 widths
    run = 0
    while start < n:
        while run_end[run] <= start:
            run += 1
        q, end = run, n
        while q < len(run_end):
            cut = max(start + run_cap[q], run_start[q], start + 1)
            if cut < run_end[q]:
                end = cut
                break
            q += 1
        bounds.append(end)
        start = end
    return np.array(bounds, np.int64)


def split_until_divisible(bounds: np.ndarray, world_size: int, name: str = "split") -> np.ndarray:
    """Split the batches with the most pairs in two until the batch count divides by ``world_size``.

    Every DDP rank must get the same number of batches (collectives would hang otherwise). The halves stay
    adjacent and only get smaller, so order and budget hold and no pair is lost or repeated.

    Raises:
        DataError: impossible (fewer pairs than ranks, or only single-pair batches left).
    """
    bounds = np.asarray(bounds, np.int64)
    while (len(bounds) - 1) % world_size:
        sizes = np.diff(bounds)
        largest = int(np.argmax(sizes))  # the first of the largest
        if sizes[largest] < 2:
            raise DataError(f"cannot give {world_size} ranks an equal number of batches of {name!r} "
                            f"({int(bounds[-1] - bounds[0])} pairs, {len(sizes)} single-pair batches). Use fewer ranks "
                            "for it, or a larger split.")
        bounds = np.insert(bounds, largest + 1, bounds[largest] + sizes[largest] // 2)
    return bounds


def weighted_pairs(parts: Sequence[SplitPart], widths: np.ndarray, generator: torch.Generator) -> np.ndarray:
    """The pairs one epoch of a mixture sees, ``[M]`` indices into the split: each source's pairs ``weight`` times.

    A whole weight repeats all of a source's pairs; a fraction draws that share anew every epoch
    (``generator``), stratified by width (``[N]`` ``max(S, T)``), so every epoch cuts into the same number of
    batches: the learning-rate schedule and resume count on it.
    """
    chosen, start = [], 0
    dtype = _index_dtype(sum(part.pairs for part in parts))
    for part in parts:
        indices = np.arange(start, start + part.pairs, dtype=dtype)
        whole, fraction = divmod(part.weight, 1.0)
        chosen += [indices] * int(whole)
        if fraction > 1e-9:
            chosen.append(_stratified_draw(indices, widths[indices], fraction, generator))
        start += part.pairs
    return np.concatenate(chosen) if chosen else np.zeros(0, dtype)


def _stratified_draw(indices: np.ndarray, widths: np.ndarray, fraction: float,
                     generator: torch.Generator) -> np.ndarray:
    """``round(fraction * len(indices))`` of ``indices``: a fixed count per width (largest remainder), at random."""
    _, counts = np.unique(widths, return_counts=True)
    exact = fraction * counts
    quota = np.floor(exact).astype(np.int64)
    short = int(round(fraction * len(indices))) - int(quota.sum())
    quota[np.argsort(-(exact - quota), kind="stable")[:short]] += 1  # the same widths every epoch
    perm = torch.randperm(len(indices), generator=generator).numpy()
    shuffled = perm[np.argsort(widths[perm], kind="stable")]  # by width, in random order within a width
    group_start = np.repeat(np.cumsum(counts) - counts, counts)  # [n] where each pair's width group starts
    rank = np.arange(len(indices)) - group_start
    return indices[shuffled[rank < np.repeat(quota, counts)]]


def compact_lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """``lengths`` ``[N]`` as uint16 when every one fits (2 bytes a pair, against int64's 8), else int64."""
    array = np.asarray(lengths)
    fits = array.size == 0 or (int(array.min()) >= 0 and int(array.max()) <= np.iinfo(np.uint16).max)
    return array.astype(np.uint16 if fits else np.int64, copy=False)


def lengths_with_eos(lengths: np.ndarray) -> np.ndarray:
    """``lengths + 1``, the EOS (or BOS) a collated row adds, widened only where uint16 would overflow."""
    if lengths.size and int(lengths.max()) >= np.iinfo(lengths.dtype).max:
        lengths = lengths.astype(np.int64)
    return lengths + 1


def _sort_key(src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> np.ndarray:
    """``[N]`` keys that order pairs by ``max(S, T)``, then S, then T: int32 (4 bytes a pair) where they fit."""
    widths = np.maximum(src_lengths, tgt_lengths)
    width = int(widths.max()) + 1
    key = widths.astype(np.int32 if width**3 <= np.iinfo(np.int32).max else np.int64)
    key *= width
    key += src_lengths
    key *= width
    key += tgt_lengths
    return key


def _index_dtype(count: int) -> np.dtype:
    """int32 for indices below ``count`` where they fit (4 bytes a pair), else int64."""
    return np.dtype(np.int32 if count <= np.iinfo(np.int32).max else np.int64)


def _epoch_generator(seed: int, epoch: int, purpose: str = "batches") -> torch.Generator:
    # A hash of (seed, epoch), so neighbouring seeds don't give related permutations.
    digest = hashlib.sha256(f"nmt-{purpose}:{seed}:{epoch}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


class TokenBucketSampler(Sampler[list[int]]):
    """Yields this rank's batches (lists of pair indices) of one epoch under a token budget.

    The batch count is the same every epoch (only which equal-length pairs share a batch, and the batch order,
    change). An epoch's plan is numpy arrays, ready in about a second for millions of pairs. No Python object per
    pair: it holds 2 bytes per length (uint16 where they fit) and 4 per index of the epoch's order (int32).

    Args:
        src_lengths: ``[N]`` source lengths incl. EOS; tgt_lengths: ``[N]`` target lengths incl. BOS/EOS.
        max_tokens: padded-token budget per batch, ``B * max(S, T)``.
        shuffle: shuffle by ``(seed, epoch)``, the same on every rank (training); else length-sorted batches,
            longest first, so running out of memory shows at once.
        parts: the split's sources with their weights (``EncodedSplit.parts``); with ``shuffle``, an epoch
            sees each source's pairs ``weight`` times. Empty: every pair once.

    A loop that stops early resumes at the next batch when iterated again. ``position`` counts batches
    *yielded*: with ``num_workers > 0`` the DataLoader prefetches, so resume from your own count of consumed
    batches (``set_epoch(epoch, start=consumed)``).
    """

    def __init__(self, src_lengths: Sequence[int] | np.ndarray, tgt_lengths: Sequence[int] | np.ndarray,
                 max_tokens: int, *, shuffle: bool, seed: int = 0, rank: int = 0, world_size: int = 1,
                 name: str = "split", parts: Sequence[SplitPart] = ()) -> None:
        if len(src_lengths) == 0:
            raise DataError(f"cannot batch {name!r}: it has no pairs.")
        if int(max_tokens) <= 0:
            raise DataError(f"max_tokens={max_tokens} must be a positive number of tokens.")
        if world_size < 1 or not 0 <= rank < world_size:
            raise DataError(f"rank={rank} must be in [0, world_size={world_size}).")
        self.src_lengths, self.tgt_lengths = compact_lengths(src_lengths), compact_lengths(tgt_lengths)
        self.max_tokens, self.seed = int(max_tokens), int(seed)
        self.shuffle, self.rank, self.world_size, self.name = shuffle, rank, world_size, name
        # One source seen once is the plain epoch; anything else is planned by weighted_pairs.
        self.parts = tuple(parts) if len(parts) > 1 or any(p.weight != 1.0 for p in parts) else ()
        self.epoch = self.position = 0
        self._cached: tuple[int, np.ndarray, np.ndarray] | None = None  # (epoch, order, this rank's spans)

    @classmethod
    def from_split(cls, split: EncodedSplit, max_tokens: int, **kwargs: Any) -> TokenBucketSampler:
        """A sampler over ``split``'s pairs (lengths counted with EOS / BOS, as collated)."""
        return cls(lengths_with_eos(split.src_ids.lengths), lengths_with_eos(split.tgt_ids.lengths), max_tokens,
                   name=split.name, parts=split.parts, **kwargs)

    def epoch_plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """All ranks' batches of ``epoch``: ``(order [M], spans [num_batches, 2])``, M = N unless weighted.

        Batch ``k`` is ``order[spans[k, 0]:spans[k, 1]]``; rank ``r`` takes batches ``r::world_size``.
        """
        src, tgt = self.src_lengths, self.tgt_lengths  # [N] uint16 (int64 if a length does not fit)
        pairs = None  # every pair once; else the indices a weighted epoch sees
        if self.parts and self.shuffle:
            pairs = weighted_pairs(self.parts, np.maximum(src, tgt), _epoch_generator(self.seed, epoch, "mixture"))
            src, tgt = src[pairs], tgt[pairs]
        # Sort by max(S, T), the quantity the budget charges, then by S, then by T: on Multi30k this
        # pads 4.5% of the slots at 4096 tokens, against 7% when sorting by S then T (the batches that
        # straddle two source lengths mix short and long targets) and 54% in random order.
        generator = _epoch_generator(self.seed, epoch) if self.shuffle else None
        if generator is not None:
            # Shuffle first, then a stable sort: pairs of equal lengths land in a new order (and
            # so in new batches) every epoch. int32 indices draw the same permutation as int64.
            index_dtype = torch.int32 if _index_dtype(len(src)) == np.int32 else torch.int64
            perm = torch.randperm(len(src), generator=generator, dtype=index_dtype).numpy()  # [N]
            order = perm[np.argsort(_sort_key(src[perm], tgt[perm]), kind="stable")]
        else:
            order = np.argsort(-_sort_key(src, tgt), kind="stable")
        if pairs is not None:
            order = pairs[order]  # positions in this epoch's pairs -> pair indices in the split
        widths = np.maximum(self.src_lengths[order], self.tgt_lengths[order])  # [M] in batching order
        bounds = split_until_divisible(cut_sorted(widths, self.max_tokens), self.world_size, self.name)
        spans = np.stack([bounds[:-1], bounds[1:]], axis=1)  # [num_batches, 2]
        if generator is not None:
            spans = spans[torch.randperm(len(spans), generator=generator).numpy()]
        return order, spans

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """All ranks' batches of ``epoch`` in order, as lists; rank ``r`` takes items ``r::world_size``."""
        order, spans = self.epoch_plan(epoch)
        return [order[start:end].tolist() for start, end in spans.tolist()]

    def _rank_plan(self) -> tuple[np.ndarray, np.ndarray]:
        # Non-shuffled batches don't depend on the epoch: compute them once.
        epoch = self.epoch if self.shuffle else 0
        if self._cached is None or self._cached[0] != epoch:
            self._cached = None  # the last epoch's plan goes before this one's is made
            order, spans = self.epoch_plan(epoch)
            self._cached = (epoch, order, spans[self.rank :: self.world_size])
            # The plan's temporary arrays (sort keys, permutation, argsort: ~20 bytes a pair) were freed into glibc's
            # heap, which would keep them in the RSS for the rest of the run; 8 bytes a pair stay (the two uint16
            # lengths and the int32 order).
            release_free_memory()
        return self._cached[1], self._cached[2]

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Select ``epoch``'s order and skip the first ``start`` (>= 0) batches of this rank (resume)."""
        self.epoch = int(epoch)
        self.position = int(start)

    def __len__(self) -> int:
        """This rank's batches per epoch (the whole epoch, whatever ``position`` is)."""
        return len(self._rank_plan()[1])

    def __iter__(self) -> Iterator[list[int]]:
        order, spans = self._rank_plan()
        while self.position < len(spans):
            start, end = spans[self.position]
            self.position += 1
            yield order[start:end].tolist()
        self.epoch += 1
        self.position = 0

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "position"}``: enough, with the same data and settings, to resume exactly."""
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore what ``state_dict`` returned."""
        self.set_epoch(state["epoch"], state["position"])


# --------------------------------------------------------------------------------------------------
# Padding a batch
# --------------------------------------------------------------------------------------------------


@dataclass
class Batch:
    """Padded tensors for one batch (PAD_ID on the right; masks are True on real tokens).

    Attributes:
        src: ``[B, S]`` source ids followed by EOS.
        src_lengths: ``[B]`` source lengths incl. EOS.
        src_mask: ``[B, S]`` True on real source tokens.
        tgt_in: ``[B, T]`` BOS followed by target ids (decoder input, teacher forcing).
        tgt_out: ``[B, T]`` target ids followed by EOS (what the decoder must predict).
        tgt_mask: ``[B, T]`` True on real tokens of ``tgt_in`` / ``tgt_out``.
        tgt_lengths: ``[B]`` target lengths incl. EOS.
        indices: ``[B]`` the pairs' row numbers in the split (to restore input order).
        num_tgt_tokens: real tokens in ``tgt_out``, a plain int (no device sync to read it).
    """

    src: Tensor
    src_lengths: Tensor
    src_mask: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    tgt_mask: Tensor
    tgt_lengths: Tensor
    indices: Tensor
    num_tgt_tokens: int

    @property
    def size(self) -> int:
        """B, the number of pairs."""
        return int(self.src.size(0))

    def _map(self, fn: Callable[[Tensor], Tensor]) -> Batch:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return Batch(**{k: fn(v) if isinstance(v, Tensor) else v for k, v in values.items()})

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """A copy with every tensor on ``device`` (``non_blocking`` pays off from pinned memory)."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        """A copy in page-locked memory; the DataLoader calls this when ``pin_memory=True``."""
        return self._map(lambda t: t.pin_memory())


def _pad(rows: list[list[int]], width: int) -> Tensor:
    return torch.tensor([row + [PAD_ID] * (width - len(row)) for row in rows], dtype=torch.long)


@dataclass(frozen=True)
class ShapeBuckets:
    """Batches padded to a few fixed shapes, so a GPU can replay one captured step per shape (a CUDA graph).

    Lengths are rounded up to a multiple of ``width``; the rows to the most that the ``max_tokens`` budget lets
    through at the narrowest width that rounds up to ``max(S', T')``. So every batch the sampler cuts under that
    budget fits, the batches stay the eager path's own, and few shapes recur (Multi30k's training batches at
    4,096 tokens: 11 shapes at width 8, for 1.5x the padded token slots; docs/guides/training.md).
    """

    width: int
    max_tokens: int

    def shape(self, rows: int, src_len: int, tgt_len: int) -> tuple[int, int, int] | None:
        """``(rows', S', T')`` for a batch of ``rows`` pairs padded to ``[rows, S]`` / ``[rows, T]``; None when it
        fits no bucket. The same batch sizes always give the same shape.
        """
        src_len, tgt_len = (-(-length // self.width) * self.width for length in (src_len, tgt_len))
        narrowest = max(1, max(src_len, tgt_len) - self.width + 1)  # the narrowest batch width in this bucket
        bucket_rows = self.max_tokens // narrowest
        return (bucket_rows, src_len, tgt_len) if rows <= bucket_rows else None

    def shapes_of(self, sampler: TokenBucketSampler, epochs: range) -> list[tuple[int, int, int]]:
        """The shapes ``sampler``'s batches take over ``epochs`` (none for one that fits no bucket), first use first."""
        shapes: dict[tuple[int, int, int], None] = {}
        for epoch in epochs:
            order, spans = sampler.epoch_plan(epoch)
            for start, end in spans.tolist():
                rows = order[start:end]
                shape = self.shape(len(rows), int(sampler.src_lengths[rows].max()),
                                   int(sampler.tgt_lengths[rows].max()))
                if shape is not None:
                    shapes[shape] = None
        return list(shapes)

    def example(self, shape: tuple[int, int, int]) -> Batch:
        """A batch of bucket ``shape`` (one pair of its lengths, padded): what capturing its step needs."""
        _, src_len, tgt_len = shape
        return collate_batch([(0, [EOS_ID] * (src_len - 1), [EOS_ID] * (tgt_len - 1))], self)


def collate_batch(items: Sequence[tuple[int, list[int], list[int]]], buckets: ShapeBuckets | None = None) -> Batch:
    """Pad ``(index, src_ids, tgt_ids)`` items (``EncodedSplit[i]``) into a ``Batch``; with ``buckets``, to its
    bucket's shape: the extra rows hold a lone EOS as source (so no attention row is all padding), an empty
    target (so they add nothing to the loss) and index -1.
    """
    indices = [index for index, _, _ in items]
    src_rows = [list(src) + [EOS_ID] for _, src, _ in items]
    tgt_out_rows = [list(tgt) + [EOS_ID] for _, _, tgt in items]
    tgt_in_rows = [[BOS_ID, *tgt] for _, _, tgt in items]
    s_max, t_max = max(map(len, src_rows)), max(map(len, tgt_out_rows))
    if buckets is not None and (shape := buckets.shape(len(items), s_max, t_max)) is not None:
        extra = shape[0] - len(items)
        src_rows += [[EOS_ID]] * extra
        tgt_out_rows += [[]] * extra
        tgt_in_rows += [[]] * extra
        indices += [-1] * extra
        s_max, t_max = shape[1:]
    src_lengths = torch.tensor([len(r) for r in src_rows], dtype=torch.long)
    tgt_lengths = torch.tensor([len(r) for r in tgt_out_rows], dtype=torch.long)
    return Batch(
        src=_pad(src_rows, s_max),
        src_lengths=src_lengths,
        src_mask=torch.arange(s_max)[None, :] < src_lengths[:, None],  # [B, S]
        tgt_in=_pad(tgt_in_rows, t_max),
        tgt_out=_pad(tgt_out_rows, t_max),
        tgt_mask=torch.arange(t_max)[None, :] < tgt_lengths[:, None],  # [B, T]
        tgt_lengths=tgt_lengths,
        indices=torch.tensor(indices, dtype=torch.long),
        num_tgt_tokens=int(tgt_lengths.sum()),
    )


def build_loader(split: EncodedSplit, max_tokens: int, *, shuffle: bool, seed: int = 0, rank: int = 0,
                 world_size: int = 1, pin_memory: bool = False, num_workers: int = 0,
                 bucket_width: int | None = None) -> DataLoader:
    """A DataLoader of ``Batch`` es over ``split``; ``loader.batch_sampler`` is its ``TokenBucketSampler``.

    Args:
        max_tokens: padded-token budget per batch, ``B * max(S, T)``.
        shuffle: True for training (seeded, per-epoch order); False for validation/test.
        world_size: DDP ranks; each gets a disjoint, equally long share of every epoch.
        pin_memory: page-locked batches for ``Batch.to(cuda, non_blocking=True)``; ignored without CUDA.
        num_workers: DataLoader worker processes (0 = collate in the main process).
        bucket_width: pad every batch to a ``ShapeBuckets`` shape of this length multiple (None: to its own).
    """
    sampler = TokenBucketSampler.from_split(split, max_tokens, shuffle=shuffle, seed=seed, rank=rank,
                                            world_size=world_size)
    buckets = ShapeBuckets(bucket_width, max_tokens) if bucket_width else None
    return DataLoader(
        split,  # type: ignore[arg-type]  # a map-style dataset: __len__ and __getitem__
        batch_sampler=sampler,
        collate_fn=functools.partial(collate_batch, buckets=buckets),
        num_workers=num_workers,
        pin_memory=pin_memory and torch.cuda.is_available(),
        # Its own generator: each new iterator draws a worker seed from it, and drawing from the global
        # RNG instead would shift dropout masks whenever a run resumes with a fresh iterator mid-epoch.
        generator=torch.Generator().manual_seed(seed),
    )


def token_batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Group sentence indices into batches of at most ``batch_tokens`` padded source tokens (``B * S``; lengths
    include EOS), longest first: an out-of-memory error comes at once, and neighbours pad little. A sentence
    over the budget forms its own batch.
    """
    longest_first = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return pack_batches(longest_first, lengths, lengths, batch_tokens)  # no targets: source lengths on both sides
