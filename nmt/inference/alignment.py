"""Attention read as alignment (Bahdanau et al., 2015, Sec. 5.2.2): each target word linked to the source word of
largest weight, as Pharaoh ``i-j`` pairs of 0-based word positions (how far this drifts from a real alignment:
Koehn & Knowles, 2017, Sec. 3.5).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from torch import Tensor

from nmt.inference.words import SPECIAL_PIECES, merge_subword_attention, word_groups


def _real_words(pieces: Sequence[str], unk_is_word: bool) -> list[int]:
    # indices of words that are not a lone special piece such as "</s>"
    groups, _ = word_groups(pieces, unk_is_word)
    return [k for k, g in enumerate(groups) if not (len(g) == 1 and pieces[g[0]] in SPECIAL_PIECES)]


def pharaoh_alignment(weights: Tensor | np.ndarray, src_pieces: Sequence[str], tgt_pieces: Sequence[str]) -> str:
    """Hard word alignment from attention ``[T, S]`` over pieces: each target word linked to the source word it
    attends to most. Special pieces (``</s>``) are left out, so no target word links to EOS.

    Returns:
        ``i-j`` pairs (source word i, target word j, 0-based), space-separated and sorted; "" when a side has
        no words.
    """
    merged, _, _ = merge_subword_attention(weights, src_pieces, tgt_pieces)
    src_keep = _real_words(src_pieces, unk_is_word=False)
    tgt_keep = _real_words(tgt_pieces, unk_is_word=True)
    if not src_keep or not tgt_keep:
        return ""
    real = merged[np.ix_(tgt_keep, src_keep)]  # [Tw', Sw'] without special words
    links = sorted((int(i), j) for j, i in enumerate(real.argmax(axis=1)))  # i: the most attended source word
    return " ".join(f"{i}-{j}" for i, j in links)
