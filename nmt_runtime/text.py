"""Sentences to source ids and target ids to sentences, as the engine does it: SentencePiece, source tags,
stripping and the input word limit."""

from __future__ import annotations

from pathlib import Path

import sentencepiece as spm

SPECIAL_IDS = frozenset((0, 2, 3))  # PAD, BOS, EOS: dropped when decoding (UNK decodes to " ⁇ ")


class SubwordText:
    """The source and target SentencePiece models of an export (the same file for a joint model).

    Args:
        source: the source (or joint) model file.
        target: the target model file.
        source_tags: reserved source tags (``<bt>``): a leading tag is its own id, as in training.
        max_input_words: longer lines are cut to this many words; None = no limit.
    """

    def __init__(self, source: Path, target: Path, source_tags: list[str], max_input_words: int | None) -> None:
        self.src = spm.SentencePieceProcessor(model_file=str(source))
        self.tgt = self.src if target == source else spm.SentencePieceProcessor(model_file=str(target))
        self.tag_ids = {tag: self.src.piece_to_id(tag) for tag in source_tags}
        self.max_input_words = max_input_words

    def clean(self, line: str) -> tuple[str, bool]:
        """The line stripped and cut to ``max_input_words`` words, and whether it was cut."""
        line = line.strip()
        words = line.split()
        if self.max_input_words is None or len(words) <= self.max_input_words:
            return line, False
        return " ".join(words[: self.max_input_words]), True

    def encode(self, line: str) -> list[int]:
        """Source ids of a cleaned line, without EOS ([] for an empty line)."""
        if not line:
            return []
        first = line.split(maxsplit=1)[0]
        if first in self.tag_ids:  # SentencePiece would put a lone "▁" before the tag
            return [self.tag_ids[first], *self.src.encode(line[len(first):].lstrip(), out_type=int)]
        return self.src.encode(line, out_type=int)

    def decode(self, ids: list[int]) -> str:
        """Target text of target ids (special ids dropped)."""
        return self.tgt.decode([i for i in ids if i not in SPECIAL_IDS])
