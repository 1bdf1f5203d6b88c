"""Attention heatmaps: one labelled source x target image per translated sentence.

The one concept here is *showing an attention matrix*, as in Bahdanau et al. (2015, Fig. 3): rows are
target tokens, columns are source tokens, cell brightness is the weight ``a_ji``. Subword matrices can
first be merged into words (``merge_subword_attention``): a target word's row is the *average* of its
pieces' rows (each piece's row is a distribution, so the average still sums to 1), and a source word's
column is the *sum* of its pieces' columns (the attention mass that fell anywhere on that word).
SentencePiece marks a word start with ``▁`` (U+2581); target words are those of the detokenized output
(where ``<unk>`` decodes to a word of its own), source words those of the input line.

Shapes: T target length, S source length (in pieces), Tw / Sw the same in words.

Not done here: choosing which sentences to plot (``nmt.translation``), alignments (``nmt.alignment``),
and anything that touches pyplot's global figure registry: figures are built with the object API on
the Agg canvas, so nothing leaks between calls and no display is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor

if TYPE_CHECKING:  # matplotlib is imported when a figure is drawn: translating without plots skips it
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

WORD_START = "\u2581"  # SentencePiece's word-boundary marker "▁"
# Pieces that are never part of a word: they form a word of their own (e.g. the source EOS column).
SPECIAL_PIECES = frozenset({"<s>", "</s>", "<pad>"})
UNK_PIECE = "<unk>"
UNK_TEXT = "\u2047"  # ⁇, what SentencePiece decodes <unk> to


def _as_array(weights: Tensor | np.ndarray, tgt: Sequence[str], src: Sequence[str], what: str) -> np.ndarray:
    """``weights`` as a float64 ``[T, S]`` array, checked against T target and S source ``what`` (pieces, labels)."""
    if isinstance(weights, Tensor):
        weights = weights.detach().float().cpu().numpy()
    array = np.asarray(weights, dtype=np.float64)
    if array.ndim != 2:
        raise ValueError(f"attention weights must be a [T, S] matrix, got shape {tuple(array.shape)}")
    if array.shape != (len(tgt), len(src)):
        raise ValueError(f"attention shape {array.shape} does not match {len(tgt)} target x {len(src)} source {what}")
    return array


def new_figure(width: float, height: float) -> tuple[Figure, Axes]:
    """A Figure with one Axes on an Agg canvas, not registered with pyplot (nothing to close, no display)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def word_groups(pieces: Sequence[str], unk_is_word: bool = False) -> tuple[list[list[int]], list[str]]:
    """Group SentencePiece pieces into words.

    A piece opens a new word when it starts with ``▁``, is the first piece, stands alone, or follows
    a piece that stands alone. Special pieces (``</s>``) stand alone, and so does ``<unk>`` when
    ``unk_is_word``: SentencePiece decodes it to `` ⁇ `` with spaces around, so in *decoded* text it
    is a word of its own (in the source it stands for real characters and stays inside its word). A
    bare ``▁`` piece has no text: it joins the next word (or the previous one, before a special).

    Args:
        pieces: Subword pieces of one sentence, in order.
        unk_is_word: Treat ``<unk>`` as a word of its own (target side).

    Returns:
        ``(groups, words)``: the piece indices of each word, and each word's text (pieces joined,
        ``▁`` removed).
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
    words = []
    for group in merged:
        text = "".join(pieces[i] for i in group)
        if unk_is_word and text.replace(WORD_START, "") == UNK_PIECE:
            text = UNK_TEXT  # as SentencePiece decodes it, so the words match the translation's text
        words.append(text.replace(WORD_START, "") or text)
    return merged, words


def merge_subword_attention(weights: Tensor | np.ndarray, src_pieces: Sequence[str], tgt_pieces: Sequence[str]
                            ) -> tuple[np.ndarray, list[str], list[str]]:
    """Turn a subword attention matrix into a word attention matrix.

    Args:
        weights: Attention ``[T, S]``; row j is the distribution used to emit target piece j.
        src_pieces: The S source pieces (may end with ``</s>``, which stays a column of its own).
        tgt_pieces: The T target pieces (``<unk>`` is a word of its own, as in the decoded text).

    Returns:
        ``(weights_words [Tw, Sw], src_words, tgt_words)``: summed over the pieces of a source word,
        averaged over the pieces of a target word.

    Raises:
        ValueError: When the matrix does not match the number of pieces.
    """
    array = _as_array(weights, tgt_pieces, src_pieces, "pieces")
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


def _escape(label: str) -> str:
    # a '$' pair would switch matplotlib into mathtext and mangle (or fail on) the token
    return label.replace("$", r"\$")


def attention_figure(weights: Tensor | np.ndarray, src_labels: Sequence[str], tgt_labels: Sequence[str],
                     title: str | None = None) -> Figure:
    """Draw an attention heatmap with the source along x (top) and the target along y.

    Args:
        weights: Attention ``[T, S]``.
        src_labels: S column labels.
        tgt_labels: T row labels.
        title: Optional title above the plot.

    Returns:
        A Figure on an Agg canvas, not registered with pyplot (nothing to close).

    Raises:
        ValueError: When the labels do not match the matrix.
    """
    array = _as_array(weights, tgt_labels, src_labels, "labels")
    n_tgt, n_src = array.shape
    # grow with the sentence so labels stay readable, within what a PNG viewer handles
    fig, ax = new_figure(min(40.0, max(4.0, 0.4 * n_src + 2.0)),
                         min(40.0, max(3.0, 0.4 * n_tgt + 1.5 + (0.4 if title else 0.0))))
    image = ax.imshow(array, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(n_src), [_escape(s) for s in src_labels], rotation=60, ha="left", rotation_mode="anchor")
    ax.set_yticks(range(n_tgt), [_escape(t) for t in tgt_labels])
    ax.xaxis.tick_top()
    ax.set(xlabel="source", ylabel="target")
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    if title:
        fig.suptitle(_escape(title), fontsize=10)
    fig.tight_layout()
    return fig


def save_attention_png(path: str | Path, weights: Tensor | np.ndarray, src_labels: Sequence[str],
                       tgt_labels: Sequence[str], title: str | None = None) -> None:
    """Write ``attention_figure(...)`` (weights ``[T, S]``) to ``path`` as a PNG, creating parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    attention_figure(weights, src_labels, tgt_labels, title=title).savefig(path, format="png", dpi=100)
