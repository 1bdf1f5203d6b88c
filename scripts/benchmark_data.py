"""Benchmark the data pipeline on Multi30k: preparation time (cold and cached) and batch packing.

Measures, on this machine:
  1. a cold preparation from the mirror into an empty cache: copy + sha256 check, read, clean,
     SentencePiece (8k joint unigram by default), encode;
  2. the same preparation again, reusing every cache;
  3. the training batches at ``max_tokens``: batches per epoch, pairs per batch, padding fraction
     (padding slots / all slots of the src and tgt tensors), for 1..8 DDP ranks; the validation
     batches at ``valid_max_tokens``; and, for scale, the padding of the same budget filled in
     random order (no length buckets).

Prints the figures and writes them, with the date, versions and command, to
docs/results/data_benchmark.json. A benchmark, not a test: it asserts nothing.

    NMT_DATA_MIRROR=../shared/corpora python scripts/benchmark_data.py
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from omegaconf import OmegaConf  # noqa: E402

from nmt.data import EncodedSplit, TokenBucketSampler, prepare_data  # noqa: E402
from nmt.data.batching import pack_batches  # noqa: E402
from nmt.provenance import provenance  # noqa: E402


def padding_stats(split: EncodedSplit, batches: list[list[int]], max_tokens: int) -> dict[str, float]:
    """Padding fraction of src, tgt and both, for batches of ``split`` (lengths incl. EOS/BOS)."""
    real_src = real_tgt = slots_src = slots_tgt = 0
    for batch in batches:
        src = [len(split.src_ids[i]) + 1 for i in batch]
        tgt = [len(split.tgt_ids[i]) + 1 for i in batch]
        real_src, real_tgt = real_src + sum(src), real_tgt + sum(tgt)
        slots_src, slots_tgt = slots_src + len(batch) * max(src), slots_tgt + len(batch) * max(tgt)
    sizes = [len(b) for b in batches]
    return {
        "batches": len(batches),
        "pairs_per_batch_mean": round(sum(sizes) / len(sizes), 1),
        "pairs_per_batch_min": min(sizes),
        "pairs_per_batch_max": max(sizes),
        "padding_fraction_src": round(1 - real_src / slots_src, 4),
        "padding_fraction_tgt": round(1 - real_tgt / slots_tgt, 4),
        "padding_fraction": round(1 - (real_src + real_tgt) / (slots_src + slots_tgt), 4),
        # How full the budget B * max(S, T) is, on average.
        "budget_use": round(
            sum(len(b) * max(max(len(split.src_ids[i]), len(split.tgt_ids[i])) + 1 for i in b) for b in batches)
            / (len(batches) * max_tokens),
            4,
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mirror", default=os.environ.get("NMT_DATA_MIRROR", str(REPO_ROOT.parent / "shared/corpora")))
    parser.add_argument("--src-lang", default="de")
    parser.add_argument("--tgt-lang", default="en")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--valid-max-tokens", type=int, default=8192)
    parser.add_argument("--out", default=str(REPO_ROOT / "docs/results/data_benchmark.json"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    cfg = OmegaConf.load(REPO_ROOT / "configs/data/multi30k.yaml")
    cfg.mirror = args.mirror
    cfg.src_lang, cfg.tgt_lang = args.src_lang, args.tgt_lang
    cfg.tokenizer.vocab_size = args.vocab_size

    with tempfile.TemporaryDirectory(prefix="nmt_data_bench_") as cache:
        start = time.perf_counter()
        data = prepare_data(cfg, cache_dir=cache)
        cold = time.perf_counter() - start
        cold_stages = dict(data.stats["seconds"])
        start = time.perf_counter()
        again = prepare_data(cfg, cache_dir=cache)
        warm = time.perf_counter() - start
        warm_stages = dict(again.stats["seconds"])

    train, valid = data.train, data.valid
    sampler = TokenBucketSampler.from_split(train, args.max_tokens, shuffle=True, seed=0)
    start = time.perf_counter()
    epoch = sampler.epoch_batches(0)
    sampler_seconds = time.perf_counter() - start
    train_stats = padding_stats(train, epoch, args.max_tokens)
    per_rank = {}
    for world_size in (1, 2, 4, 8):
        ranks = [
            len(TokenBucketSampler.from_split(train, args.max_tokens, shuffle=True, rank=r, world_size=world_size))
            for r in range(world_size)
        ]
        per_rank[str(world_size)] = {"batches_per_rank": ranks[0], "equal": len(set(ranks)) == 1}
    order = list(range(len(train)))
    random.Random(0).shuffle(order)
    lengths = ([len(s) + 1 for s in train.src_ids], [len(t) + 1 for t in train.tgt_ids])
    unsorted = padding_stats(train, pack_batches(order, *lengths, args.max_tokens), args.max_tokens)
    valid_batches = TokenBucketSampler.from_split(valid, args.valid_max_tokens, shuffle=False).epoch_batches(0)
    valid_stats = padding_stats(valid, valid_batches, args.valid_max_tokens)

    results: dict[str, Any] = {
        **provenance("scripts/benchmark_data.py"),
        "corpus": f"multi30k {args.src_lang}-{args.tgt_lang} from mirror",
        "tokenizer": f"{cfg.tokenizer.model_type} joint={cfg.tokenizer.joint} vocab={data.tokenizer.src_vocab_size}",
        "pairs": {"train": len(train), "valid": len(valid), **{k: len(v) for k, v in data.tests.items()}},
        "clean": data.stats["clean"],
        "prepare_cold_seconds": round(cold, 3),
        "prepare_cold_stages_seconds": {k: round(v, 3) for k, v in cold_stages.items()},
        "prepare_cached_seconds": round(warm, 3),
        "prepare_cached_stages_seconds": {k: round(v, 3) for k, v in warm_stages.items()},
        "train_max_tokens": args.max_tokens,
        "train_batches": train_stats,
        "train_batches_per_rank": per_rank,
        "train_random_order_same_budget": unsorted,
        "sampler_epoch_seconds": round(sampler_seconds, 4),
        "valid_max_tokens": args.valid_max_tokens,
        "valid_batches": valid_stats,
    }
    print(
        f"prepare, cold (sha256, clean, SentencePiece, encode): {cold:.2f} s",
        results["prepare_cold_stages_seconds"],
    )
    print(
        f"prepare, cached:                                      {warm:.2f} s",
        results["prepare_cached_stages_seconds"],
    )
    print(
        f"train @ max_tokens={args.max_tokens}: {train_stats['batches']} batches/epoch, "
        f"{train_stats['pairs_per_batch_mean']} pairs/batch, padding {train_stats['padding_fraction']:.1%} "
        f"(src {train_stats['padding_fraction_src']:.1%}, tgt {train_stats['padding_fraction_tgt']:.1%}); "
        f"random order would pad {unsorted['padding_fraction']:.1%} in {unsorted['batches']} batches"
    )
    print("batches per rank:", {k: v["batches_per_rank"] for k, v in per_rank.items()})
    print(
        f"valid @ max_tokens={args.valid_max_tokens}: {valid_stats['batches']} batches, "
        f"padding {valid_stats['padding_fraction']:.1%}"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
