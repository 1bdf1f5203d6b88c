"""nmt.common.metrics (sacreBLEU scores with signatures) and the comparison's extra scores in nmt.analysis.measures."""

from __future__ import annotations

import pytest

from nmt.analysis.measures import TUTORIAL_BLEU_LABEL, bleu_by_length, tutorial_bleu
from nmt.common.metrics import corpus_scores

REFS = ["The cat sat on the mat .", "A dog runs in the park.", "Two men play football together today."]


def test_corpus_scores_perfect_and_signatures() -> None:
    scores = corpus_scores(REFS, REFS)
    assert scores["bleu"] == pytest.approx(100.0)
    assert scores["chrf"] == pytest.approx(100.0)
    assert "case:mixed" in scores["bleu_signature"] and "tok:13a" in scores["bleu_signature"]
    assert "nc:6" in scores["chrf_signature"] and "nw:0" in scores["chrf_signature"]


def test_corpus_scores_is_cased_and_tutorial_bleu_is_not() -> None:
    lowered = [r.lower() for r in REFS]
    assert corpus_scores(lowered, REFS)["bleu"] < 100.0
    tutorial = tutorial_bleu(lowered, REFS)
    assert tutorial["bleu"] == pytest.approx(100.0)
    assert tutorial["label"] == TUTORIAL_BLEU_LABEL and "case:lc" in tutorial["signature"]


def test_length_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="one line per input line"):
        corpus_scores(REFS[:2], REFS)


def test_bleu_by_length_buckets() -> None:
    srcs = ["a " * 3, "b " * 15, "c " * 15, "d " * 45]
    hyps = ["x y z u v", "one two three four", "p q r s", "w"]
    refs = ["x y z u v", "one two three four", "totally different words", "v"]
    rows = bleu_by_length(srcs, hyps, refs)
    assert [r["range"] for r in rows] == ["<=10", "11-20", "21-30", "31-40", ">40"]
    assert [r["n"] for r in rows] == [1, 2, 0, 0, 1]
    assert rows[0]["bleu"] == pytest.approx(100.0)
    assert 0.0 < rows[1]["bleu"] < 100.0
    assert rows[2]["bleu"] is None and rows[4]["max_words"] is None
    with pytest.raises(ValueError, match="strictly increasing"):
        bleu_by_length(srcs, hyps, refs, buckets=[20, 10])
