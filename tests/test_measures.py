"""nmt.analysis.measures.attention_sharpness: batched and padded == one sentence at a time; bounds; no attention."""

from __future__ import annotations

import math
import random

import pytest
import torch
from torch.distributions import Categorical

from nmt.analysis.measures import attention_sharpness
from nmt.data import BOS_ID, EOS_ID, EncodedSplit
from nmt.model.seq2seq import Seq2Seq

VOCAB = 40
MODEL = {"emb_size": 12, "enc_hidden_size": 8, "dec_hidden_size": 10, "enc_layers": 1, "dec_layers": 1,
         "dropout": 0.0, "tie_embeddings": True, "output_hidden_size": None, "layer_norm": False}


def tiny_model(attention: str) -> Seq2Seq:
    options = {"name": attention, "hidden_size": None, "dropout": 0.0}
    if attention == "multihead":
        options["heads"] = 2
    return Seq2Seq.from_config(MODEL, options, VOCAB, VOCAB).eval()


def random_split(n: int, seed: int = 0) -> EncodedSplit:
    rng = random.Random(seed)
    src = [[rng.randrange(4, VOCAB) for _ in range(rng.randint(1, 12))] for _ in range(n)]
    tgt = [[rng.randrange(4, VOCAB) for _ in range(rng.randint(1, 12))] for _ in range(n)]
    tgt[3] = []  # an empty side: skipped
    return EncodedSplit("valid", src, tgt, ["x"] * n, ["y"] * n)


def one_at_a_time(model: Seq2Seq, split: EncodedSplit) -> dict[str, float]:
    """The reference: each sentence alone (no padding), entropies from torch.distributions."""
    entropy, normalised, max_weight, tokens = 0.0, 0.0, 0.0, 0
    for src, tgt in zip(split.src_ids, split.tgt_ids):
        if not src or not tgt:
            continue
        with torch.no_grad():
            _, weights = model(torch.tensor([[*src, EOS_ID]]), torch.tensor([len(src) + 1]),
                               torch.tensor([[BOS_ID, *tgt]]))  # [1, T, S]
        h = Categorical(probs=weights[0]).entropy()  # [T]
        entropy += h.sum().item()
        normalised += (h / math.log(len(src) + 1)).sum().item()
        max_weight += weights[0].max(-1).values.sum().item()
        tokens += len(tgt) + 1
    return {"entropy": entropy / tokens, "normalised_entropy": normalised / tokens,
            "max_weight": max_weight / tokens, "tokens": tokens}


@pytest.mark.parametrize("attention", ["additive", "dot", "multihead"])
def test_batched_equals_one_sentence_at_a_time(attention: str) -> None:
    torch.manual_seed(0)
    model, split = tiny_model(attention), random_split(30)
    got = attention_sharpness(model, split, batch_tokens=40)  # several padded batches
    expected = one_at_a_time(model, split)
    assert got["tokens"] == expected["tokens"] == sum(len(t) + 1 for t in split.tgt_ids if t)
    for key in ("entropy", "normalised_entropy", "max_weight"):
        assert got[key] == pytest.approx(expected[key], rel=1e-5), key
    assert 0.0 < got["normalised_entropy"] <= 1.0 and 0.0 < got["max_weight"] <= 1.0


def test_one_piece_sources_attend_with_certainty() -> None:
    # a source of one piece plus EOS: S = 2, so the weights are at least 1/2 at the max
    split = EncodedSplit("valid", [[5], [6]], [[7, 8], [9]], ["a", "b"], ["c", "d"])
    got = attention_sharpness(tiny_model("dot"), split)
    assert got["max_weight"] >= 0.5 and got["tokens"] == 5


def test_no_attention_gives_none() -> None:
    assert attention_sharpness(tiny_model("none"), random_split(5)) is None
