"""Batching: token-budget batches from length buckets, shared across DDP ranks, padded into tensors.

The one concept: turn an ``EncodedSplit`` (subword ids per sentence pair) into a stream of
``Batch`` es whose padded size stays under a token budget. ``TokenBucketSampler`` decides which
pairs go together (Marian's "mini-batch-fit": sort by length, i.e. buckets of equal length, then cut
into batches of at most ``max_tokens`` padded tokens, so each batch holds pairs of near-equal length
and padding stays small); ``collate_batch`` pads one batch into tensors. For inference and
evaluation, ``token_batches`` cuts sentences sorted longest first into batches of at most
``batch_tokens`` padded source tokens (no shuffling, no ranks).

Shapes (batch-first): B pairs in a batch, S source length incl. EOS, T target length incl.
BOS (``tgt_in``) or EOS (``tgt_out``). Token budget: ``B * max(S, T) <= max_tokens``; a single pair
longer than the budget still forms its own batch.

Epochs: every pair appears exactly once per epoch. With ``shuffle=True`` the pairs of equal length
and the order of the batches are shuffled by ``(seed, epoch)``, identically on every rank; rank
``r`` of ``world_size`` takes batches ``r, r + world_size, ...``. All ranks get the same number of
batches (DDP's collectives would hang otherwise): when the batch count does not divide by
``world_size``, the batches with the most pairs are split in two until it does. The sampler's
``position`` (batches yielded this epoch) can be saved and restored to resume mid-epoch.

What it does not do: truncate long sentences, read files or tokenize (``nmt.data.prepare``), or
move batches to the GPU (the training loop calls ``Batch.to``).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Sampler

from nmt.data.corpora import DataError
from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID

log = logging.getLogger(__name__)


@dataclass
class EncodedSplit:
    """One split as subword ids (no BOS/EOS) and the raw stripped lines they came from.

    It is a map-style dataset: ``split[i]`` is ``(i, src_ids, tgt_ids)``.

    Attributes:
        name: the split name (``train``, ``val``, ``test_2016_flickr``, ...).
        src_ids: source subword ids per pair.
        tgt_ids: target subword ids per pair.
        src_text: the source lines (stripped), e.g. for writing translations next to their input.
        tgt_text: the target lines (stripped): the references sacrebleu scores against.
    """

    name: str
    src_ids: list[list[int]]
    tgt_ids: list[list[int]]
    src_text: list[str]
    tgt_text: list[str]

    def __post_init__(self) -> None:
        sizes = {len(self.src_ids), len(self.tgt_ids), len(self.src_text), len(self.tgt_text)}
        if len(sizes) != 1:
            raise DataError(
                f"EncodedSplit {self.name!r}: src_ids/tgt_ids/src_text/tgt_text have different "
                f"lengths {len(self.src_ids)}/{len(self.tgt_ids)}/{len(self.src_text)}/{len(self.tgt_text)}."
            )

    def __len__(self) -> int:
        return len(self.src_ids)

    def __getitem__(self, index: int) -> tuple[int, list[int], list[int]]:
        return index, self.src_ids[index], self.tgt_ids[index]

    def num_tokens(self) -> tuple[int, int]:
        """Source and target tokens in the split, EOS included (what a batch holds unpadded)."""
        return (
            sum(len(ids) + 1 for ids in self.src_ids),
            sum(len(ids) + 1 for ids in self.tgt_ids),
        )


# --------------------------------------------------------------------------------------------------
# Which pairs go together
# --------------------------------------------------------------------------------------------------


def pack_batches(
    order: Sequence[int], src_lengths: Sequence[int], tgt_lengths: Sequence[int], max_tokens: int
) -> list[list[int]]:
    """Cut ``order`` greedily into consecutive batches with ``B * max(S, T) <= max_tokens``.

    Args:
        order: pair indices, already sorted by length so neighbours pad little.
        src_lengths: per pair, source length incl. EOS.
        tgt_lengths: per pair, target length incl. BOS/EOS.
        max_tokens: the padded-token budget of one batch.

    Returns:
        Batches of pair indices, in ``order``'s order; a pair over the budget forms its own batch.
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


def split_until_divisible(batches: list[list[int]], world_size: int, name: str = "split") -> list[list[int]]:
    """Split the batches with the most pairs in two until ``len(batches) % world_size == 0``.

    The halves stay next to each other (length-sorted order is kept). Halving a batch only lowers
    its padded size, so the token budget still holds, and no pair is lost or repeated.

    Raises:
        DataError: impossible (fewer pairs than ranks, or only single-pair batches left).
    """
    batches = list(batches)
    while len(batches) % world_size:
        largest = max(range(len(batches)), key=lambda k: len(batches[k]))
        if len(batches[largest]) < 2:
            n_pairs = sum(len(b) for b in batches)
            raise DataError(
                f"cannot give {world_size} ranks an equal number of batches of {name!r} "
                f"({n_pairs} pairs, {len(batches)} single-pair batches). Use fewer ranks for it, or a "
                f"larger split."
            )
        batch = batches[largest]
        half = len(batch) // 2
        batches[largest : largest + 1] = [batch[:half], batch[half:]]
    return batches


def _epoch_generator(seed: int, epoch: int) -> torch.Generator:
    # A hash of (seed, epoch), so neighbouring seeds don't give related permutations.
    digest = hashlib.sha256(f"nmt-batches:{seed}:{epoch}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


class TokenBucketSampler(Sampler[list[int]]):
    """Yields this rank's batches (lists of pair indices) of one epoch under a token budget.

    Args:
        src_lengths: per pair, source length incl. EOS.
        tgt_lengths: per pair, target length incl. BOS/EOS.
        max_tokens: padded-token budget per batch, ``B * max(S, T)``.
        shuffle: shuffle by ``(seed, epoch)`` (training); else length-sorted batches, longest
            first, in a fixed order (validation/test: the biggest batch comes first, so running
            out of memory shows at once).
        seed: the shuffling seed; the same on every rank.
        rank: this process's rank in ``[0, world_size)``.
        world_size: number of DDP ranks sharing the epoch.
        name: the split's name, for messages.

    The batch count is the same every epoch: the sorted sequence of lengths does not change, only
    which of the pairs with equal lengths share a batch, and the order of the batches.

    A loop that stops early resumes at the next batch when iterated again; finishing an epoch
    moves to the next one (``set_epoch`` sets both explicitly). ``position`` counts batches
    *yielded*: with ``num_workers > 0`` the DataLoader prefetches, so resume from your own count of
    consumed batches (``set_epoch(epoch, start=consumed)``).
    """

    def __init__(
        self,
        src_lengths: Sequence[int],
        tgt_lengths: Sequence[int],
        max_tokens: int,
        *,
        shuffle: bool,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        name: str = "split",
    ) -> None:
        if len(src_lengths) != len(tgt_lengths):
            raise DataError(f"{len(src_lengths)} source lengths but {len(tgt_lengths)} target lengths.")
        if len(src_lengths) == 0:
            raise DataError(f"cannot batch {name!r}: it has no pairs.")
        if int(max_tokens) <= 0:
            raise DataError(f"max_tokens={max_tokens} must be a positive number of tokens.")
        if world_size < 1 or not 0 <= rank < world_size:
            raise DataError(f"rank={rank} must be in [0, world_size={world_size}).")
        self.src_lengths = [int(n) for n in src_lengths]
        self.tgt_lengths = [int(n) for n in tgt_lengths]
        self.max_tokens = int(max_tokens)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.rank = rank
        self.world_size = world_size
        self.name = name
        self.epoch = 0
        self.position = 0
        self._cached: tuple[int, list[list[int]]] | None = None

    @classmethod
    def from_split(cls, split: EncodedSplit, max_tokens: int, **kwargs: Any) -> TokenBucketSampler:
        """A sampler over ``split``'s pairs (lengths counted with EOS / BOS, as collated)."""
        return cls(
            [len(ids) + 1 for ids in split.src_ids],
            [len(ids) + 1 for ids in split.tgt_ids],
            max_tokens,
            name=split.name,
            **kwargs,
        )

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """All ranks' batches of ``epoch`` in order; rank ``r`` takes items ``r::world_size``."""
        n = len(self.src_lengths)
        src = torch.tensor(self.src_lengths, dtype=torch.long)
        tgt = torch.tensor(self.tgt_lengths, dtype=torch.long)
        # Sort by max(S, T), the quantity the budget charges, then by S, then by T: on Multi30k this
        # pads 4.5% of the slots at 4096 tokens, against 7% when sorting by S then T (the batches that
        # straddle two source lengths mix short and long targets) and 54% in random order.
        width = int(torch.maximum(src, tgt).max()) + 1
        key = (torch.maximum(src, tgt) * width + src) * width + tgt
        if self.shuffle:
            generator = _epoch_generator(self.seed, epoch)
            # Shuffle first, then a stable sort: pairs of equal lengths land in a new order (and
            # so in new batches) every epoch.
            perm = torch.randperm(n, generator=generator)
            order = perm[torch.argsort(key[perm], stable=True)]
        else:
            generator = None
            order = torch.argsort(-key, stable=True)
        batches = pack_batches(order.tolist(), self.src_lengths, self.tgt_lengths, self.max_tokens)
        batches = split_until_divisible(batches, self.world_size, self.name)
        if generator is not None:
            batches = [batches[k] for k in torch.randperm(len(batches), generator=generator).tolist()]
        return batches

    def _rank_batches(self) -> list[list[int]]:
        # Non-shuffled batches don't depend on the epoch: compute them once.
        epoch = self.epoch if self.shuffle else 0
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, self.epoch_batches(epoch)[self.rank :: self.world_size])
        return self._cached[1]

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Select ``epoch``'s order and skip the first ``start`` batches of this rank (resume)."""
        if start < 0:
            raise ValueError(f"start={start} must be >= 0")
        self.epoch = int(epoch)
        self.position = int(start)

    def __len__(self) -> int:
        """This rank's batches per epoch (the whole epoch, whatever ``position`` is)."""
        return len(self._rank_batches())

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._rank_batches()
        while self.position < len(batches):
            batch = batches[self.position]
            self.position += 1
            yield list(batch)
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


def collate_batch(items: Sequence[tuple[int, list[int], list[int]]]) -> Batch:
    """Pad ``(index, src_ids, tgt_ids)`` items (``EncodedSplit[i]``) into a ``Batch``."""
    indices = [index for index, _, _ in items]
    src_rows = [list(src) + [EOS_ID] for _, src, _ in items]
    tgt_out_rows = [list(tgt) + [EOS_ID] for _, _, tgt in items]
    tgt_in_rows = [[BOS_ID, *tgt] for _, _, tgt in items]
    src_lengths = torch.tensor([len(r) for r in src_rows], dtype=torch.long)
    tgt_lengths = torch.tensor([len(r) for r in tgt_out_rows], dtype=torch.long)
    s_max, t_max = int(src_lengths.max()), int(tgt_lengths.max())
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


def build_loader(
    split: EncodedSplit,
    max_tokens: int,
    *,
    shuffle: bool,
    seed: int = 0,
    rank: int = 0,
    world_size: int = 1,
    pin_memory: bool = False,
    num_workers: int = 0,
) -> DataLoader:
    """A DataLoader of ``Batch`` es over ``split``; ``loader.batch_sampler`` is its ``TokenBucketSampler``.

    Args:
        split: the encoded pairs.
        max_tokens: padded-token budget per batch, ``B * max(S, T)``.
        shuffle: True for training (seeded, per-epoch order); False for validation/test.
        seed: shuffling seed, the same on every rank.
        rank: this process's DDP rank.
        world_size: number of DDP ranks; each gets a disjoint, equally long share of every epoch.
        pin_memory: page-locked batches for fast ``Batch.to(cuda, non_blocking=True)``; ignored
            without CUDA.
        num_workers: DataLoader worker processes (0 = collate in the main process).
    """
    sampler = TokenBucketSampler.from_split(
        split, max_tokens, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size
    )
    return DataLoader(
        split,  # type: ignore[arg-type]  # a map-style dataset: __len__ and __getitem__
        batch_sampler=sampler,
        collate_fn=collate_batch,
        num_workers=num_workers,
        pin_memory=pin_memory and torch.cuda.is_available(),
        # Its own generator: each new iterator draws a worker seed from it, and drawing from the global
        # RNG instead would shift dropout masks whenever a run resumes with a fresh iterator mid-epoch.
        generator=torch.Generator().manual_seed(seed),
    )


def token_batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Group sentence indices into batches of at most ``batch_tokens`` padded source tokens.

    Sentences are sorted longest first (an out-of-memory error, if any, comes at once, and
    neighbours pad little); a sentence over the budget forms its own batch.

    Args:
        lengths: source lengths (EOS included) per sentence.
        batch_tokens: ``B * S`` budget per batch.

    Returns:
        Batches of sentence indices.
    """
    longest_first = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return pack_batches(longest_first, lengths, lengths, batch_tokens)  # no targets: source lengths on both sides
