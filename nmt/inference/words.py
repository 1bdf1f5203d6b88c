"""Words from subwords: the word each SentencePiece piece belongs to, and a subword attention matrix merged into
words (Bahdanau et al., 2015, Fig. 3): target rows averaged, source columns summed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from torch import Tensor

WORD_START = "\u2581"  # SentencePiece's word-boundary marker "▁"
# Pieces that are never part of a word: they form a word of their own (e.g. the source EOS column).
SPECIAL_PIECES = frozenset({"<s>", "</s>", "<pad>"})
UNK_PIECE = "<unk>"
UNK_TEXT = "\u2047"  # ⁇, what SentencePiece decodes <unk> to


def as_array(weights: Tensor | np.ndarray, tgt: Sequence[str], src: Sequence[str], what: str) -> np.ndarray:
    """``weights`` as a float64 ``[T, S]`` array, checked against T target and S source ``what`` (pieces, labels)."""
    array = np.asarray(weights.detach().float().cpu() if isinstance(weights, Tensor) else weights, dtype=np.float64)
    if array.shape != (len(tgt), len(src)):  # a [T, S] matrix
        raise ValueError(f"attention shape {array.shape} does not match {len(tgt)} target x {len(src)} source {what}")
    return array


def word_groups(pieces: Sequence[str], unk_is_word: bool = False) -> tuple[list[list[int]], list[str]]:
    """Group the SentencePiece pieces of one sentence into words: ``(piece indices per word, word texts)``.

    A piece opens a word when it starts with ``▁``, is first, stands alone, or follows one that does. Specials
    (``</s>``) stand alone, and so does ``<unk>`` when ``unk_is_word`` (target side: it decodes to `` ⁇ `` with
    spaces around; in the source it stands for real characters). A bare ``▁`` joins the next word (or the
    previous one, before a special).
    """

    def alone(piece: str) -> bool:
        return piece in SPECIAL_PIECES or (unk_is_word and piece == UNK_PIECE)

    groups: list[list[int]] = []
    prev_alone = True
    for i, piece in enumerate(pieces):
        if alone(piece) or prev_alone or piece.startswith(WORD_START):
            groups.append([i])
        else:
            groups[-1].append(i)
        prev_alone = alone(piece)

    def special(group: list[int]) -> bool:
        return len(group) == 1 and pieces[group[0]] in SPECIAL_PIECES

    merged: list[list[int]] = []
    pending: list[int] = []  # bare "▁" pieces waiting for the word they precede
    for group in groups:
        if all(pieces[i] == WORD_START for i in group):
            pending += group
            continue
        if pending and not special(group):
            group = pending + group
        elif pending and merged:  # before a special piece they join the previous word
            merged[-1] += pending
        elif pending:
            merged.append(pending)
        merged.append(group)
        pending = []
    if pending and merged and not special(merged[-1]):
        merged[-1] += pending
    elif pending:
        merged.append(pending)
    texts = ["".join(pieces[i] for i in group) for group in merged]
    # <unk> as SentencePiece decodes it, so the words match the translation's text
    words = [UNK_TEXT if unk_is_word and text.replace(WORD_START, "") == UNK_PIECE
             else text.replace(WORD_START, "") or text for text in texts]
    return merged, words


def merge_subword_attention(weights: Tensor | np.ndarray, src_pieces: Sequence[str], tgt_pieces: Sequence[str]
                            ) -> tuple[np.ndarray, list[str], list[str]]:
    """A subword attention matrix ``[T, S]`` as words: ``(weights [Tw, Sw], src_words, tgt_words)``, summed over
    a source word's pieces and averaged over a target word's (rows still sum to 1). A final ``</s>`` stays a
    column of its own; ``<unk>`` is a target word of its own, as in the decoded text.

    Raises:
        ValueError: the matrix does not match the number of pieces.
    """
    array = as_array(weights, tgt_pieces, src_pieces, "pieces")
    src_groups, src_words = word_groups(src_pieces)
    tgt_groups, tgt_words = word_groups(tgt_pieces, unk_is_word=True)  # words of the decoded output
    # membership matrices: sum columns into source words, average rows into target words
    src_member = np.zeros((len(src_pieces), len(src_groups)))  # [S, Sw]
    for k, group in enumerate(src_groups):
        src_member[group, k] = 1.0
    tgt_mean = np.zeros((len(tgt_groups), len(tgt_pieces)))  # [Tw, T]
    for k, group in enumerate(tgt_groups):
        tgt_mean[k, group] = 1.0 / len(group)
    merged = tgt_mean @ array @ src_member  # [Tw, Sw]
    return merged, src_words, tgt_words
