"""Attention heatmaps, as in Bahdanau et al. (2015, Fig. 3): one labelled target x source image per sentence,
built with matplotlib's object API on the Agg canvas (no pyplot state, no display).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor

from nmt.common.files import write_durably
from nmt.common.memory import release_free_memory
from nmt.inference.words import as_array

if TYPE_CHECKING:  # matplotlib is imported when a figure is drawn: translating without plots skips it
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def new_figure(width: float, height: float) -> tuple[Figure, Axes]:
    """A Figure with one Axes on an Agg canvas, not registered with pyplot (nothing to close, no display)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _escape(label: str) -> str:
    # a '$' pair would switch matplotlib into mathtext and mangle (or fail on) the token
    return label.replace("$", r"\$")


def attention_figure(weights: Tensor | np.ndarray, src_labels: Sequence[str], tgt_labels: Sequence[str],
                     title: str | None = None) -> Figure:
    """An attention heatmap ``[T, S]``, source along x (top), target along y, on an Agg canvas not registered with
    pyplot (nothing to close).

    Raises:
        ValueError: the labels do not match the matrix.
    """
    array = as_array(weights, tgt_labels, src_labels, "labels")
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


def release_figure_memory() -> None:
    """Give the memory a drawn figure freed back to the OS. Drawing the largest heatmap takes about 100 MB, which
    glibc otherwise keeps in the drawing thread's arena for the rest of the process; ``malloc_trim`` returns the
    free pages of every arena."""
    release_free_memory()


def save_png(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` as a PNG whole or not at all (a temp file renamed into place), making its folder."""
    return write_durably(path, lambda handle: fig.savefig(handle, format="png", dpi=100))


def save_attention_png(path: str | Path, weights: Tensor | np.ndarray, src_labels: Sequence[str],
                       tgt_labels: Sequence[str], title: str | None = None) -> None:
    """Write ``attention_figure(...)`` (weights ``[T, S]``) to ``path`` as a PNG, creating parent folders."""
    save_png(attention_figure(weights, src_labels, tgt_labels, title=title), path)
