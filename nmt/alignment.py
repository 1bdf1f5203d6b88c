"""Attention read as alignment: Pharaoh ``i-j`` word alignments, and how peaked the attention is.

The one concept here is *attention as alignment*: Bahdanau et al. (2015, Sec. 5.2.2) read the soft
alignment ``a_ji`` as a word alignment; taking, for every target word j, the source word i with the
largest weight gives a hard alignment (as in Koehn & Knowles, 2017, "Six Challenges", Sec. 3.5, who
also show how far it can drift from a real word alignment). Subword matrices are merged into words
first (``nmt.plotting.merge_subword_attention``: source pieces summed, target pieces averaged), so
indices are 0-based *word* positions in the whitespace-separated source and target.

``attention_sharpness`` measures how close the soft alignment is to a hard one, teacher-forced on
reference translations: the entropy of each target token's attention distribution, normalised by
the entropy of the uniform distribution over its source (0 = all weight on one piece, 1 = spread
evenly), and the largest weight. It lets attention types be compared on what they attend to, not
only on BLEU.

Shapes: B batch, T target length, S source length (in pieces).

Not done here: symmetrisation, thresholds, multiple links per target word, or scoring against gold
alignments (AER).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from nmt.data.batching import EncodedSplit, collate_batch, token_batches
from nmt.model import Seq2Seq
from nmt.plotting import SPECIAL_PIECES, merge_subword_attention, word_groups


def _real_words(pieces: Sequence[str], unk_is_word: bool) -> list[int]:
    # indices of words that are not a lone special piece such as "</s>"
    groups, _ = word_groups(pieces, unk_is_word)
    return [k for k, g in enumerate(groups) if not (len(g) == 1 and pieces[g[0]] in SPECIAL_PIECES)]


def pharaoh_alignment(
    weights: Tensor | np.ndarray, src_pieces: Sequence[str], tgt_pieces: Sequence[str]
) -> str:
    """Hard word alignment from attention: for each target word, the source word it attends to most.

    Special pieces (a source ``</s>`` column) are merged as words of their own and then left out,
    so indices count real words only and no target word is linked to EOS.

    Args:
        weights: Attention ``[T, S]`` over the pieces.
        src_pieces: The S source pieces.
        tgt_pieces: The T target pieces.

    Returns:
        Space-separated ``i-j`` pairs (source word i, target word j, both 0-based), sorted by
        ``(i, j)``; an empty string when either side has no words.
    """
    merged, _, _ = merge_subword_attention(weights, src_pieces, tgt_pieces)
    src_keep = _real_words(src_pieces, unk_is_word=False)
    tgt_keep = _real_words(tgt_pieces, unk_is_word=True)
    if not src_keep or not tgt_keep:
        return ""
    real = merged[np.ix_(tgt_keep, src_keep)]  # [Tw', Sw'] without special words
    best_src = real.argmax(axis=1)  # [Tw'] index of the most attended source word
    links = sorted((int(i), j) for j, i in enumerate(best_src))
    return " ".join(f"{i}-{j}" for i, j in links)


def attention_sharpness(model: Seq2Seq, split: EncodedSplit, batch_tokens: int = 4096) -> dict[str, float] | None:
    """How peaked the attention is on ``split``, decoding its references teacher-forced.

    Every real target token (EOS included) contributes one attention distribution ``a_j`` over its
    S real source pieces (EOS included, padding excluded); multi-head attention contributes the
    mean over its heads, the distribution the model reports. Sentences with an empty side are
    skipped.

    Args:
        model: The model, in eval mode.
        split: Encoded sentence pairs.
        batch_tokens: Padded source tokens per batch.

    Returns:
        ``{"normalised_entropy", "max_weight", "entropy", "tokens"}``: means over target tokens of
        ``H(a_j) / log S`` (0 = one-hot, 1 = uniform), of ``max_i a_ji`` and of ``H(a_j)`` in nats,
        and the number of target tokens; None for a model without attention.
    """
    if not model.has_attention:
        return None
    device = next(model.parameters()).device
    rows = [i for i in range(len(split)) if split.src_ids[i] and split.tgt_ids[i]]
    totals = {"normalised_entropy": 0.0, "max_weight": 0.0, "entropy": 0.0}
    tokens = 0
    with torch.inference_mode():
        for batch_rows in token_batches([len(split.src_ids[i]) + 1 for i in rows], batch_tokens):
            batch = collate_batch([split[rows[k]] for k in batch_rows])
            _, weights = model(batch.src.to(device), batch.src_lengths, batch.tgt_in.to(device))  # [B, T, S]
            weights = weights.float().cpu()
            entropy = -(weights * weights.clamp_min(1e-12).log()).sum(-1)  # [B, T]; padding has weight 0
            uniform = batch.src_lengths.float().log()[:, None].expand_as(entropy)  # [B, T] log S per sentence
            real = batch.tgt_mask  # [B, T]
            totals["entropy"] += entropy[real].sum().item()
            totals["normalised_entropy"] += (entropy[real] / uniform[real]).sum().item()
            totals["max_weight"] += weights.max(-1).values[real].sum().item()
            tokens += int(real.sum())
    means = {name: total / max(1, tokens) for name, total in totals.items()}
    return {**means, "tokens": tokens}
