"""nmt.data.batching: token budget, exactly-once epochs, seeded and resumable order, DDP shares, padding.

The sampler plans epochs with numpy; ``reference_epoch_batches`` below is the per-pair algorithm it
replaced (commit e482fb1), kept here only so that the tests can check the batches are the same.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from nmt.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    Batch,
    DataError,
    EncodedSplit,
    PreparedData,
    RaggedIds,
    TokenBucketSampler,
    batching,
    build_loader,
    collate_batch,
)
from nmt.data.batching import cut_sorted, lengths_with_eos, pack_batches, split_until_divisible
from nmt.data.encoded import SplitPart


def _split(n: int = 503, seed: int = 0, max_len: int = 37) -> EncodedSplit:
    """``n`` pairs of random ids with lengths 0..max_len (odd sizes on purpose)."""
    rng = random.Random(seed)
    src = [[rng.randrange(4, 50) for _ in range(rng.randint(0, max_len))] for _ in range(n)]
    tgt = [[rng.randrange(4, 50) for _ in range(max(0, len(s) + rng.randint(-5, 5)))] for s in src]
    return EncodedSplit("toy", src, tgt, [f"s{i}" for i in range(n)], [f"t{i}" for i in range(n)])


def _epoch(sampler: TokenBucketSampler, epoch: int) -> list[list[int]]:
    sampler.set_epoch(epoch)
    return list(sampler)


def test_every_pair_exactly_once_per_epoch_within_the_budget() -> None:
    split = _split()
    sampler = TokenBucketSampler.from_split(split, 211, shuffle=True, seed=3)
    assert len({len(_epoch(sampler, epoch)) for epoch in range(4)}) == 1  # a fixed count per epoch
    for epoch in range(3):
        batches = _epoch(sampler, epoch)
        assert sorted(i for b in batches for i in b) == list(range(len(split)))
        assert len(batches) == len(sampler)
        for b in batches:
            width = max(max(len(split.src_ids[i]), len(split.tgt_ids[i])) + 1 for i in b)
            assert len(b) * width <= 211


def test_a_pair_longer_than_the_budget_gets_its_own_batch() -> None:
    sampler = TokenBucketSampler([3, 50, 4], [3, 60, 2], 20, shuffle=False)
    assert sorted(map(sorted, _epoch(sampler, 0))) == [[0, 2], [1]]


def test_same_seed_same_order_and_new_epochs_reshuffle() -> None:
    split = _split()
    a = TokenBucketSampler.from_split(split, 300, shuffle=True, seed=7)
    b = TokenBucketSampler.from_split(split, 300, shuffle=True, seed=7)
    c = TokenBucketSampler.from_split(split, 300, shuffle=True, seed=8)
    assert _epoch(a, 2) == _epoch(b, 2)
    assert _epoch(a, 2) != _epoch(c, 2)
    assert _epoch(a, 2) != _epoch(a, 3)


def test_iterating_on_moves_to_the_next_epoch() -> None:
    sampler = TokenBucketSampler.from_split(_split(), 300, shuffle=True, seed=1)
    first = list(sampler)
    assert sampler.state_dict() == {"epoch": 1, "position": 0}
    assert list(sampler) == _epoch(TokenBucketSampler.from_split(_split(), 300, shuffle=True, seed=1), 1)
    assert first != list(sampler)


def test_resume_mid_epoch_continues_the_same_order() -> None:
    split = _split()
    full = _epoch(TokenBucketSampler.from_split(split, 250, shuffle=True, seed=5), 4)
    sampler = TokenBucketSampler.from_split(split, 250, shuffle=True, seed=5)
    sampler.set_epoch(4)
    consumed = []
    for batch in sampler:
        consumed.append(batch)
        if len(consumed) == 6:
            break
    state = sampler.state_dict()
    assert state == {"epoch": 4, "position": 6}

    resumed = TokenBucketSampler.from_split(split, 250, shuffle=True, seed=5)
    resumed.load_state_dict(state)
    assert consumed + list(resumed) == full

    loader = build_loader(split, 250, shuffle=True, seed=5)
    loader.batch_sampler.set_epoch(4, start=6)
    assert [b.indices.tolist() for b in loader] == full[6:]


@pytest.mark.parametrize("world_size", [2, 3, 4, 7])
def test_ddp_shares_are_disjoint_cover_the_epoch_and_have_equal_counts(world_size: int) -> None:
    split = _split(n=401)
    for shuffle in (True, False):
        shares = []
        for rank in range(world_size):
            sampler = TokenBucketSampler.from_split(
                split, 400, shuffle=shuffle, seed=11, rank=rank, world_size=world_size
            )
            shares.append(_epoch(sampler, 1))
            assert len(shares[-1]) == len(sampler)
        assert len({len(share) for share in shares}) == 1, [len(s) for s in shares]
        counts = Counter(i for share in shares for b in share for i in b)
        assert sorted(counts) == list(range(len(split))) and set(counts.values()) == {1}


def test_split_until_divisible_splits_the_largest_batches() -> None:
    bounds = np.array([0, 1, 5, 7, 8])  # batches [0], [1, 2, 3, 4], [5, 6], [7]
    out = split_until_divisible(bounds, 3)
    assert out.tolist() == [0, 1, 2, 3, 5, 7, 8]  # [0], [1], [2], [3, 4], [5, 6], [7]: no pair lost, order kept
    with pytest.raises(DataError, match="equal number of batches"):
        split_until_divisible(np.array([0, 1, 2, 3]), 2)


@pytest.mark.parametrize("max_tokens", [1, 7, 40, 211, 4096, 100_003])
def test_cut_sorted_makes_the_cuts_of_pack_batches(max_tokens: int) -> None:
    rng = np.random.default_rng(max_tokens)
    for n in (1, 2, 17, 400):
        widths = np.sort(rng.integers(1, 60, n)).astype(np.uint16)  # the sampler's compact lengths
        for ordered in (widths, widths[::-1].copy()):  # narrowest first (training), widest first (evaluation)
            bounds = cut_sorted(ordered, max_tokens)
            expected = pack_batches(range(n), ordered.tolist(), ordered.tolist(), max_tokens)
            assert [list(range(a, b)) for a, b in zip(bounds[:-1], bounds[1:])] == expected


def test_unshuffled_batches_are_length_sorted_and_fixed() -> None:
    split = _split()
    sampler = TokenBucketSampler.from_split(split, 300, shuffle=False, seed=1)
    first, second = _epoch(sampler, 0), _epoch(sampler, 5)
    assert first == second
    flat = [i for b in first for i in b]
    widths = [max(len(split.src_ids[i]), len(split.tgt_ids[i])) for i in flat]  # what the budget charges
    assert widths == sorted(widths, reverse=True)


def test_collate_pads_and_places_bos_eos() -> None:
    items = [(4, [10, 11, 12], [20]), (9, [13], [21, 22, 23, 24])]
    batch = collate_batch(items)
    assert batch.src.tolist() == [[10, 11, 12, EOS_ID], [13, EOS_ID, PAD_ID, PAD_ID]]
    assert batch.src_lengths.tolist() == [4, 2]
    assert batch.src_mask.tolist() == [[True] * 4, [True, True, False, False]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 20, PAD_ID, PAD_ID, PAD_ID], [BOS_ID, 21, 22, 23, 24]]
    assert batch.tgt_out.tolist() == [[20, EOS_ID, PAD_ID, PAD_ID, PAD_ID], [21, 22, 23, 24, EOS_ID]]
    assert batch.tgt_mask.tolist() == [[True, True, False, False, False], [True] * 5]
    assert batch.indices.tolist() == [4, 9] and batch.size == 2 and batch.num_tgt_tokens == 7
    assert batch.src.dtype == batch.tgt_in.dtype == batch.indices.dtype == torch.long
    assert batch.src_mask.dtype == torch.bool


def test_empty_sentences_still_get_eos() -> None:
    batch = collate_batch([(0, [], [])])
    assert batch.src.tolist() == [[EOS_ID]] and batch.tgt_in.tolist() == [[BOS_ID]]
    assert batch.tgt_out.tolist() == [[EOS_ID]]


def test_loader_yields_batches_that_map_back_to_the_split() -> None:
    split = _split(n=97)
    loader = build_loader(split, 160, shuffle=False)
    assert isinstance(loader.batch_sampler, TokenBucketSampler) and len(loader) == len(loader.batch_sampler)
    seen = []
    for batch in loader:
        assert isinstance(batch, Batch)
        assert batch.size * max(batch.src.size(1), batch.tgt_in.size(1)) <= 160 or batch.size == 1
        for row, i in enumerate(batch.indices.tolist()):
            n = batch.src_lengths[row].item() - 1
            assert batch.src[row, :n].tolist() == split.src_ids[i]
            seen.append(i)
        moved = batch.to("cpu", non_blocking=True)
        assert torch.equal(moved.tgt_out, batch.tgt_out) and moved.num_tgt_tokens == batch.num_tgt_tokens
    assert sorted(seen) == list(range(len(split)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
def test_pinned_loader_batches() -> None:
    batch = next(iter(build_loader(_split(n=20), 400, shuffle=False, pin_memory=True)))
    assert batch.src.is_pinned() and batch.tgt_mask.is_pinned()


def test_bad_arguments_are_clear() -> None:
    with pytest.raises(DataError, match="max_tokens"):
        TokenBucketSampler([1], [1], 0, shuffle=True)
    with pytest.raises(DataError, match="rank=2"):
        TokenBucketSampler([1], [1], 10, shuffle=True, rank=2, world_size=2)


@pytest.mark.slow
def test_multi30k_batches_pad_little(multi30k_data: PreparedData) -> None:
    train = multi30k_data.train
    sampler = TokenBucketSampler.from_split(train, 4096, shuffle=True, seed=0, world_size=2)
    real = padded = 0
    for indices in sampler:
        batch = collate_batch([train[i] for i in indices])
        real += int(batch.src_mask.sum() + batch.tgt_mask.sum())
        padded += batch.src.numel() + batch.tgt_out.numel()
    assert 1 - real / padded <= 0.10


# -- the same batches as before the numpy sampler ------------------------------------------------------


def _reference_generator(seed: int, epoch: int) -> torch.Generator:
    digest = hashlib.sha256(f"nmt-batches:{seed}:{epoch}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def _reference_pack(order: list[int], src_lengths: list[int], tgt_lengths: list[int], max_tokens: int) -> list:
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


def _reference_split(batches: list[list[int]], world_size: int) -> list[list[int]]:
    batches = list(batches)
    while len(batches) % world_size:
        largest = max(range(len(batches)), key=lambda k: len(batches[k]))
        batch = batches[largest]
        half = len(batch) // 2
        batches[largest : largest + 1] = [batch[:half], batch[half:]]
    return batches


def reference_epoch_batches(src_lengths: Sequence[int], tgt_lengths: Sequence[int], max_tokens: int, *,
                            shuffle: bool, seed: int, epoch: int, world_size: int) -> list[list[int]]:
    """All ranks' batches of an epoch, as the sampler made them with torch and per-pair Python (e482fb1)."""
    src_lengths, tgt_lengths = [int(n) for n in src_lengths], [int(n) for n in tgt_lengths]
    src = torch.tensor(src_lengths, dtype=torch.long)
    tgt = torch.tensor(tgt_lengths, dtype=torch.long)
    width = int(torch.maximum(src, tgt).max()) + 1
    key = (torch.maximum(src, tgt) * width + src) * width + tgt
    if shuffle:
        generator = _reference_generator(seed, epoch)
        perm = torch.randperm(len(src_lengths), generator=generator)
        order = perm[torch.argsort(key[perm], stable=True)]
    else:
        generator = None
        order = torch.argsort(-key, stable=True)
    batches = _reference_pack(order.tolist(), src_lengths, tgt_lengths, max_tokens)
    batches = _reference_split(batches, world_size)
    if generator is not None:
        batches = [batches[k] for k in torch.randperm(len(batches), generator=generator).tolist()]
    return batches


def _check_same_batches_as_before(split: EncodedSplit, max_tokens: int, epochs: Sequence[int]) -> None:
    """Every rank's batches, from the start and resumed mid-epoch, equal the reference's, for 1 and 2 ranks."""
    src, tgt = split.src_ids.lengths + 1, split.tgt_ids.lengths + 1
    for shuffle in (True, False):
        for world_size in (1, 2):
            for epoch in epochs:
                expected = reference_epoch_batches(src, tgt, max_tokens, shuffle=shuffle, seed=3, epoch=epoch,
                                                   world_size=world_size)
                for rank in range(world_size):
                    share = expected[rank::world_size]
                    sampler = TokenBucketSampler.from_split(split, max_tokens, shuffle=shuffle, seed=3, rank=rank,
                                                            world_size=world_size)
                    assert _epoch(sampler, epoch) == share
                    middle = len(share) // 2 + 1
                    resumed = TokenBucketSampler.from_split(split, max_tokens, shuffle=shuffle, seed=3, rank=rank,
                                                            world_size=world_size)
                    resumed.load_state_dict({"epoch": epoch, "position": middle})
                    assert list(resumed) == share[middle:]


@pytest.mark.parametrize("max_tokens", [37, 300, 4096])
def test_the_batches_are_the_ones_made_before_numpy(max_tokens: int) -> None:
    _check_same_batches_as_before(_split(n=997, seed=max_tokens, max_len=45), max_tokens, epochs=(0, 1, 5))


def test_lengths_that_do_not_fit_two_bytes_give_the_same_batches() -> None:
    """Lengths over 65,535, and one that overflows uint16 when EOS is added, are planned as the reference does."""
    rng = np.random.default_rng(5)
    src, tgt = rng.integers(1, 40, 300), rng.integers(1, 40, 300)
    src[7], tgt[200] = 65_535, 70_000  # sources stay uint16, targets do not
    for shuffle in (True, False):
        expected = reference_epoch_batches(src, tgt, 200_000, shuffle=shuffle, seed=2, epoch=1, world_size=1)
        assert _epoch(TokenBucketSampler(src, tgt, 200_000, shuffle=shuffle, seed=2), 1) == expected
    ids = RaggedIds.from_rows([[4] * 65_535, [5]])
    assert lengths_with_eos(ids.lengths).tolist() == [65_536, 2]


def test_the_sampler_holds_two_bytes_a_length_and_four_an_index() -> None:
    sampler = TokenBucketSampler.from_split(_split(n=997), 300, shuffle=True, seed=1)
    order, _ = sampler._rank_plan()
    assert sampler.src_lengths.dtype == sampler.tgt_lengths.dtype == np.uint16 and order.dtype == np.int32


def test_each_epoch_plan_gives_its_temporary_arrays_back_to_the_os(monkeypatch: pytest.MonkeyPatch) -> None:
    # glibc would keep the plan's sort keys, permutation and argsort (~20 bytes a pair) in the RSS (issue 66).
    released = []
    monkeypatch.setattr(batching, "release_free_memory", lambda: released.append(True))
    sampler = TokenBucketSampler.from_split(_split(n=997), 300, shuffle=True, seed=1)
    batches = len(sampler)
    assert len(list(sampler)) == batches and len(released) == 1  # epoch 0 planned once, for its length and batches
    list(sampler)
    assert len(released) == 2 and sampler.state_dict()["epoch"] == 2  # and epoch 1 once


def test_a_mixture_epoch_is_the_one_planned_with_int64_lengths_and_indices() -> None:
    """Weighted sources (whole and fractional weights), 1 and 3 ranks: the hash of the batches the sampler made
    before it held compact arrays."""
    rng = np.random.default_rng(7)
    src = rng.integers(1, 60, 2000)
    tgt = np.clip(src + rng.integers(-6, 7, 2000), 1, None)
    parts = [SplitPart("a", 700, 2.0), SplitPart("b", 900, 0.37), SplitPart("c", 400, 1.5)]
    digest = hashlib.sha256()
    for world_size in (1, 3):
        for rank in range(world_size):
            sampler = TokenBucketSampler(src, tgt, 300, shuffle=True, seed=5, rank=rank, world_size=world_size,
                                         parts=parts)
            for epoch in (0, 1, 4):
                for batch in _epoch(sampler, epoch):
                    digest.update(repr(batch).encode())
    assert digest.hexdigest() == "540443462a6a6ee707cbed39698ca3c1560b3895cf83c31d941a13ca490ad042"


@pytest.mark.slow
def test_multi30k_batches_are_the_ones_made_before_numpy(multi30k_data: PreparedData) -> None:
    _check_same_batches_as_before(multi30k_data.train, 4096, epochs=(0, 1, 2))
    _check_same_batches_as_before(multi30k_data.valid, 8192, epochs=(0,))


@pytest.mark.slow
def test_an_epoch_of_millions_of_pairs_covers_each_once_in_equal_shares() -> None:
    """WMT14's size (4.5M pairs): the numpy plan, two ranks; every pair once, equal shares, within the budget."""
    rng = np.random.default_rng(0)
    src = rng.integers(2, 120, 4_500_000)
    tgt = np.clip(src + rng.integers(-9, 10, len(src)), 2, None)
    shares = [TokenBucketSampler(src, tgt, 4096, shuffle=True, seed=1, rank=r, world_size=2) for r in range(2)]
    plans = [sampler._rank_plan() for sampler in shares]
    assert np.array_equal(plans[0][0], plans[1][0]) and len(plans[0][1]) == len(plans[1][1])
    spans = np.concatenate([plans[0][1], plans[1][1]])  # [num_batches, 2]
    sizes = spans[:, 1] - spans[:, 0]
    assert sizes.sum() == len(src) and np.bincount(plans[0][0], minlength=len(src)).max() == 1
    starts = np.sort(spans[:, 0])
    assert np.array_equal(starts[1:], np.sort(spans[:, 1])[:-1])  # the spans tile the order
    widths = np.maximum(src, tgt)[plans[0][0]]
    batch_width = np.maximum.reduceat(widths, starts)
    assert np.all((batch_width * np.diff(np.r_[starts, len(src)]) <= 4096) | (np.diff(np.r_[starts, len(src)]) == 1))
