"""``Translator``: sentences in, translations out, from an export folder, with the engine's options and checks."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from nmt_runtime.folder import ExportedModel, ExportFolderError, read_manifest
from nmt_runtime.search import EOS_ID, PAD_ID, Hypothesis, beam_search, greedy_search
from nmt_runtime.text import SubwordText

log = logging.getLogger("nmt_runtime")

OPTION_BOUNDS: dict[str, tuple[float, float]] = {
    "beam_size": (1, 1000), "n_best": (1, 1000), "max_len": (1, 10_000), "batch_tokens": (1, math.inf),
    "length_penalty": (0.0, 10.0), "max_len_ratio": (0.0, 100.0),
}
"""Each search option's inclusive range: ``nmt.inference.engine.OPTION_BOUNDS``, the engine's."""


@dataclass(frozen=True)
class SearchOptions:
    """The engine's search options (``nmt.inference.engine.SearchOptions``); defaults come from the folder."""

    beam_size: int
    length_penalty: float
    n_best: int
    max_len: int
    max_len_ratio: float | None
    batch_tokens: int

    def checked(self) -> SearchOptions:
        """These options if each is in its range; else an ExportFolderError naming it."""
        for name in ("beam_size", "n_best", "max_len", "batch_tokens"):
            value, high = getattr(self, name), OPTION_BOUNDS[name][1]
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
                raise ExportFolderError(f"{name} must be a whole number from 1 to {high}, got {value!r}")
        if self.n_best > self.beam_size:
            raise ExportFolderError(f"n_best ({self.n_best}) cannot exceed beam_size ({self.beam_size})")
        for name in ("length_penalty", "max_len_ratio"):
            value, (low, high) = getattr(self, name), OPTION_BOUNDS[name]
            if value is None and name == "max_len_ratio":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
                raise ExportFolderError(f"{name} must be a number from {low:g} to {high:g}, got {value!r}")
        return self


@dataclass
class Translation:
    """One sentence's result: the best text and score, and the n-best ``(text, score)`` list, best first."""

    text: str
    score: float
    nbest: list[tuple[str, float]]
    src_ids: list[int] = field(default_factory=list, repr=False)


class Translator:
    """An export folder ready to translate on the CPU.

    Args:
        folder: a folder written by ``export.py`` (format onnx).
        threads: onnxruntime's intra-op threads; None = its default.

    Raises:
        ExportFolderError: the folder is not a complete export.
    """

    def __init__(self, folder: str | Path, threads: int | None = None) -> None:
        folder = Path(folder)
        self.manifest = read_manifest(folder)
        tokenizer = self.manifest["tokenizer"]
        self.text = SubwordText(folder / tokenizer["source"], folder / tokenizer["target"],
                                tokenizer.get("source_tags", []), self.manifest.get("max_input_words"))
        self.model = ExportedModel(folder, self.manifest, threads)
        self.defaults = SearchOptions(**{f.name: self.manifest["search"][f.name] for f in fields(SearchOptions)})
        self.src_lang, self.tgt_lang = self.manifest.get("src_lang"), self.manifest.get("tgt_lang")

    def translate(self, sentences: Sequence[str], **options: Any) -> list[Translation]:
        """One result per sentence, in input order (an empty sentence gives ""); ``options`` override the folder's
        search defaults (beam_size, length_penalty, n_best, max_len, max_len_ratio, batch_tokens)."""
        opts = replace(self.defaults, **options).checked()
        cleaned = [self.text.clean(sentence) for sentence in sentences]
        if cut := sum(was_cut for _, was_cut in cleaned):
            log.warning("%d line(s) longer than %d words were truncated to %d words", cut,
                        self.text.max_input_words, self.text.max_input_words)
        src_ids = [self.text.encode(line) for line, _ in cleaned]
        results: list[list[Hypothesis]] = [[Hypothesis([], 0.0)] for _ in src_ids]
        todo = [i for i, ids in enumerate(src_ids) if ids]
        for batch in token_batches([len(src_ids[i]) + 1 for i in todo], opts.batch_tokens):
            rows = [todo[j] for j in batch]
            for i, hyps in zip(rows, self._search([src_ids[i] for i in rows], opts)):
                results[i] = hyps
        return [self._result(ids, hyps) for ids, hyps in zip(src_ids, results)]

    def _search(self, batch_ids: list[list[int]], opts: SearchOptions) -> list[list[Hypothesis]]:
        """One padded batch ``[B, S]`` (each sentence + EOS) through greedy (beam 1) or beam search."""
        lengths = np.array([len(ids) + 1 for ids in batch_ids], dtype=np.int64)
        src = np.full((len(batch_ids), int(lengths.max())), PAD_ID, dtype=np.int64)
        for row, ids in enumerate(batch_ids):
            src[row, : len(ids) + 1] = [*ids, EOS_ID]
        if opts.beam_size == 1:
            return [[h] for h in greedy_search(self.model, src, lengths, opts.max_len, opts.max_len_ratio)]
        return beam_search(self.model, src, lengths, opts.beam_size, opts.length_penalty, opts.max_len,
                           opts.max_len_ratio, opts.n_best)

    def _result(self, src_ids: list[int], hyps: list[Hypothesis]) -> Translation:
        nbest = [(self.text.decode(h.tokens), h.score) for h in hyps]
        return Translation(nbest[0][0], nbest[0][1], nbest, src_ids)


def token_batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Indices into ``lengths`` in batches of at most ``batch_tokens`` padded tokens (B * S), longest first; a
    sentence over the budget is a batch of its own (``nmt.data.batching.token_batches``)."""
    batches: list[list[int]] = []
    current: list[int] = []
    current_max = 0
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        new_max = max(current_max, lengths[i])
        if current and new_max * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current, new_max = [], lengths[i]
        current.append(i)
        current_max = new_max
    return batches + [current] if current else batches
