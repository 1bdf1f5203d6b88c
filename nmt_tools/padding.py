"""``benchmark.py data``: data preparation time (cold and cached), peak memory, and how much the batches pad.

The data is ``train.py``'s ``data`` section: Multi30k by default, or any other through ``--set``
(``--set data=tatoeba``, or a ``data.mixture``). Measures (1) a cold ``prepare_data`` from the corpus
mirror into an empty cache (copy + sha256 check, read, clean, SentencePiece, encode), with the
process's peak RSS at its end (``ru_maxrss``), (2) the same again from the caches, (3) the training batches at
``--max-tokens``: batches per epoch, pairs per batch, padding fraction (padding slots / all slots of
the src and tgt tensors) for 1..8 DDP ranks, the validation batches at ``--valid-max-tokens``, for
scale the padding of the same budget filled in random order (no length buckets), and (4) the shapes the
training batches take when padded to ``ShapeBuckets`` (``trainer.cuda_graphs``) at bucket widths 4, 8, 16.

Not done here: training or translation speed (the other ``benchmark.py`` modes).
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import resource
import tempfile
import time
from typing import Any

import torch

from nmt.data import EncodedSplit, TokenBucketSampler, prepare_data
from nmt.data.batching import ShapeBuckets, pack_batches
from nmt_tools.timing import compose_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``data`` mode's options."""
    parser.add_argument("--mirror", default=os.environ.get("NMT_DATA_MIRROR"),
                        help="corpus mirror holding multi30k/ (default: $NMT_DATA_MIRROR)")
    parser.add_argument("--src-lang", default="de")
    parser.add_argument("--tgt-lang", default="en")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--valid-max-tokens", type=int, default=8192)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="train.py overrides for the data, e.g. data=tatoeba or 'data.mixture=[...]'")


def padding_stats(split: EncodedSplit, batches: list[list[int]], max_tokens: int) -> dict[str, float]:
    """Padding fraction of src, tgt and both, for batches of ``split`` (lengths incl. EOS/BOS)."""
    real_src = real_tgt = slots_src = slots_tgt = used = 0
    for batch in batches:
        src = [len(split.src_ids[i]) + 1 for i in batch]
        tgt = [len(split.tgt_ids[i]) + 1 for i in batch]
        real_src, real_tgt = real_src + sum(src), real_tgt + sum(tgt)
        slots_src, slots_tgt = slots_src + len(batch) * max(src), slots_tgt + len(batch) * max(tgt)
        used += len(batch) * max(max(s, t) for s, t in zip(src, tgt))
    sizes = [len(b) for b in batches]
    return {
        "batches": len(batches), "pairs_per_batch_mean": round(sum(sizes) / len(sizes), 1),
        "pairs_per_batch_min": min(sizes), "pairs_per_batch_max": max(sizes),
        "padding_fraction_src": round(1 - real_src / slots_src, 4),
        "padding_fraction_tgt": round(1 - real_tgt / slots_tgt, 4),
        "padding_fraction": round(1 - (real_src + real_tgt) / (slots_src + slots_tgt), 4),
        "budget_use": round(used / (len(batches) * max_tokens), 4),  # how full B * max(S, T) is, on average
    }


def bucket_figures(split: EncodedSplit, batches: list[list[int]], max_tokens: int) -> dict[str, Any]:
    """Per bucket width: the distinct shapes one epoch's ``batches`` take padded to ``ShapeBuckets`` (the CUDA graphs
    a run captures), and their ``B * max(S, T)`` slots over the batches' own."""
    figures = {}
    for width in (4, 8, 16):
        buckets, shapes, slots, own = ShapeBuckets(width, max_tokens), set(), 0, 0
        for batch in batches:
            src, tgt = (max(len(ids[i]) + 1 for i in batch) for ids in (split.src_ids, split.tgt_ids))
            shape = buckets.shape(len(batch), src, tgt) or (len(batch), src, tgt)  # no bucket: its own shape
            shapes.add(shape)
            slots, own = slots + shape[0] * max(shape[1:]), own + len(batch) * max(src, tgt)
        figures[str(width)] = {"shapes": len(shapes), "slots_over_unpadded": round(slots / own, 3)}
    return figures


def batch_figures(train: EncodedSplit, valid: EncodedSplit, args: argparse.Namespace) -> dict[str, Any]:
    """Padding of the training batches (length-bucketed and random order), per DDP rank count, and of validation."""
    sampler = TokenBucketSampler.from_split(train, args.max_tokens, shuffle=True, seed=0)
    start = time.perf_counter()
    epoch = sampler.epoch_batches(0)
    sampler_seconds = time.perf_counter() - start
    per_rank = {}
    for world in (1, 2, 4, 8):
        ranks = [len(TokenBucketSampler.from_split(train, args.max_tokens, shuffle=True, rank=r, world_size=world))
                 for r in range(world)]
        per_rank[str(world)] = {"batches_per_rank": ranks[0], "equal": len(set(ranks)) == 1}
    order = list(range(len(train)))
    random.Random(0).shuffle(order)
    lengths = ([len(s) + 1 for s in train.src_ids], [len(t) + 1 for t in train.tgt_ids])
    valid_batches = TokenBucketSampler.from_split(valid, args.valid_max_tokens, shuffle=False).epoch_batches(0)
    return {
        "train_max_tokens": args.max_tokens, "train_batches": padding_stats(train, epoch, args.max_tokens),
        "train_batches_per_rank": per_rank,
        "train_random_order_same_budget": padding_stats(train, pack_batches(order, *lengths, args.max_tokens),
                                                        args.max_tokens),
        "shape_buckets": bucket_figures(train, epoch, args.max_tokens),
        "sampler_epoch_seconds": round(sampler_seconds, 4), "valid_max_tokens": args.valid_max_tokens,
        "valid_batches": padding_stats(valid, valid_batches, args.valid_max_tokens),
    }


def benchmark_data(args: argparse.Namespace) -> tuple[dict[str, Any], torch.device]:
    """The ``data`` mode: preparation times and batch padding; prints a summary."""
    if not args.mirror:
        raise SystemExit("benchmark.py data: no corpus mirror; set NMT_DATA_MIRROR or pass --mirror")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cfg = compose_config([f"data.mirror={args.mirror}", f"data.src_lang={args.src_lang}",
                          f"data.tgt_lang={args.tgt_lang}", f"data.tokenizer.vocab_size={args.vocab_size}",
                          *args.set], args.project_dir).data
    seconds, stages = [], []
    with tempfile.TemporaryDirectory(prefix="nmt_data_bench_") as cache:
        for _ in ("cold", "cached"):
            start = time.perf_counter()
            data = prepare_data(cfg, cache_dir=cache)
            seconds.append(round(time.perf_counter() - start, 3))
            stages.append({k: round(v, 3) for k, v in data.stats["seconds"].items()})
            if not stages[1:]:
                peak_rss_mib = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    batches = batch_figures(data.train, data.valid, args)
    train, unsorted, valid = (batches[k] for k in ("train_batches", "train_random_order_same_budget", "valid_batches"))
    print(f"prepare, cold (sha256, clean, SentencePiece, encode): {seconds[0]:.2f} s, peak RSS {peak_rss_mib} MiB",
          stages[0])
    print(f"prepare, cached:                                      {seconds[1]:.2f} s", stages[1])
    print(f"train @ max_tokens={args.max_tokens}: {train['batches']} batches/epoch, {train['pairs_per_batch_mean']} "
          f"pairs/batch, padding {train['padding_fraction']:.1%} (src {train['padding_fraction_src']:.1%}, tgt "
          f"{train['padding_fraction_tgt']:.1%}); random order would pad {unsorted['padding_fraction']:.1%} in "
          f"{unsorted['batches']} batches")
    print("batches per rank:", {k: v["batches_per_rank"] for k, v in batches["train_batches_per_rank"].items()})
    print("padded to shape buckets (width: shapes, slots over unpadded):",
          {k: (v["shapes"], v["slots_over_unpadded"]) for k, v in batches["shape_buckets"].items()})
    print(f"valid @ max_tokens={args.valid_max_tokens}: {valid['batches']} batches, "
          f"padding {valid['padding_fraction']:.1%}")
    return {
        "corpus": f"{cfg.corpus} {args.src_lang}-{args.tgt_lang} from mirror", "overrides": list(args.set),
        "sources": data.stats.get("sources"), "prepare_cold_peak_rss_mib": peak_rss_mib,
        "tokenizer": f"{cfg.tokenizer.model_type} joint={cfg.tokenizer.joint} vocab={data.tokenizer.src_vocab_size}",
        "pairs": {"train": len(data.train), "valid": len(data.valid), **{k: len(v) for k, v in data.tests.items()}},
        "clean": data.stats["clean"], "prepare_cold_seconds": seconds[0], "prepare_cold_stages_seconds": stages[0],
        "prepare_cached_seconds": seconds[1], "prepare_cached_stages_seconds": stages[1], **batches,
    }, torch.device("cpu")
