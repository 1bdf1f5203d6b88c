"""Tests for nmt.inference.words, .plotting and .alignment: subword merging, PNG heatmaps, Pharaoh alignments."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from nmt.inference.alignment import pharaoh_alignment
from nmt.inference.plotting import attention_figure, save_attention_png
from nmt.inference.words import merge_subword_attention, word_groups

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_word_groups_follow_sentencepiece_word_starts() -> None:
    groups, words = word_groups(["▁Ein", "▁Hund", "e", "s", "▁läuft", ".", "</s>"])
    assert groups == [[0], [1, 2, 3], [4, 5], [6]]
    assert words == ["Ein", "Hundes", "läuft.", "</s>"]


def test_merge_sums_source_and_averages_target() -> None:
    src = ["▁a", "b", "▁c", "</s>"]  # words: ab, c, </s>
    tgt = ["▁x", "y", "▁z"]  # words: xy, z
    weights = torch.softmax(torch.randn(3, 4), dim=-1)
    merged, src_words, tgt_words = merge_subword_attention(weights, src, tgt)
    assert src_words == ["ab", "c", "</s>"] and tgt_words == ["xy", "z"]
    assert merged.shape == (2, 3)
    w = weights.numpy()
    assert merged[0, 0] == pytest.approx(((w[0, 0] + w[0, 1]) + (w[1, 0] + w[1, 1])) / 2)
    assert merged[1, 2] == pytest.approx(w[2, 3])
    np.testing.assert_allclose(merged.sum(axis=1), 1.0, rtol=1e-6)  # rows stay distributions
    with pytest.raises(ValueError, match="does not match"):
        merge_subword_attention(weights, src[:3], tgt)


def test_pharaoh_alignment_argmax_per_target_word_skips_eos() -> None:
    src = ["▁ein", "▁Hund", "e", "</s>"]  # words 0: ein, 1: Hunde
    tgt = ["▁a", "▁do", "g", "▁."]  # words 0: a, 1: dog, 2: .
    weights = np.array(
        [
            [0.7, 0.1, 0.1, 0.1],
            [0.1, 0.3, 0.3, 0.3],  # 'do' -> Hunde (0.6 summed)
            [0.1, 0.2, 0.2, 0.5],  # 'g'  -> Hunde
            [0.2, 0.1, 0.1, 0.6],  # '.'  attends EOS most, aligned to the best real word: ein
        ]
    )
    assert pharaoh_alignment(weights, src, tgt) == "0-0 0-2 1-1"
    assert pharaoh_alignment(np.zeros((0, 4)), src, []) == ""


def test_heatmap_png_written_without_pyplot_leaks(tmp_path: Path) -> None:
    before = plt.get_fignums()
    path = tmp_path / "sub" / "0.png"
    weights = torch.softmax(torch.randn(3, 5), dim=-1)
    save_attention_png(path, weights, ["▁Ein", "▁$Hund", "$", "▁.", "</s>"], ["A", "dog", "."], title="1: x")
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    fig = attention_figure(weights.numpy(), list("abcde"), list("xyz"))
    assert len(fig.axes) == 2  # heatmap + colorbar
    assert plt.get_fignums() == before
    with pytest.raises(ValueError, match="does not match"):
        attention_figure(weights, list("abc"), list("xyz"))


def test_target_words_match_the_decoded_text() -> None:
    # SentencePiece decodes <unk> to " ⁇ ": a word of its own on the target side, so Pharaoh index j
    # is the j-th word of the output line; in the source <unk> stands for real characters of a word.
    tgt = ["▁me", "<unk>", "nd", "▁", "<unk>", "▁x", "y", "▁"]  # decodes to "me ⁇ nd ⁇ xy"
    groups, words = word_groups(tgt, unk_is_word=True)
    assert words == ["me", "⁇", "nd", "⁇", "xy"]  # the words of the decoded text, "⁇" included
    assert sorted(i for g in groups for i in g) == list(range(len(tgt)))
    _, src_words = word_groups(["▁5", "<unk>", "▁", "<unk>", "5", "▁", "</s>"])
    assert src_words == ["5<unk>", "<unk>5", "</s>"]
    weights = torch.softmax(torch.randn(len(tgt), 3), dim=-1)
    links = pharaoh_alignment(weights, ["▁a", "▁b", "</s>"], tgt).split()
    assert sorted(int(p.split("-")[1]) for p in links) == list(range(5))
