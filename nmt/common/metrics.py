"""Corpus-level scoring of detokenized translations with sacreBLEU (Post, 2018): cased BLEU (Papineni et al.,
2002) with the ``13a`` tokenizer and chrF2 (Popović, 2015), each with its signature.
"""

from __future__ import annotations

from collections.abc import Sequence

from sacrebleu.metrics import BLEU, CHRF


def check_parallel(hyps: Sequence[str], refs: Sequence[str]) -> None:
    """Raise ValueError unless there is one reference per hypothesis."""
    if len(hyps) != len(refs):
        raise ValueError(f"got {len(hyps)} hypotheses but {len(refs)} references; "
                         "the reference file must have one line per input line")


def corpus_scores(hyps: Sequence[str], refs: Sequence[str]) -> dict:
    """Score detokenized ``hyps`` against parallel ``refs`` (one reference each) with sacreBLEU.

    Returns:
        ``{"bleu", "chrf", "length_ratio", "bleu_signature", "chrf_signature"}``: cased 13a BLEU and chrF2
        (0-100), the hypothesis/reference ratio of 13a tokens (below 1, the brevity penalty applies), signatures.

    Raises:
        ValueError: ``hyps`` and ``refs`` differ in length.
    """
    check_parallel(hyps, refs)
    bleu, chrf = BLEU(), CHRF()  # sacreBLEU defaults: case:mixed, tok:13a; chrF with char order 6, beta 2
    bleu_score = bleu.corpus_score(list(hyps), [list(refs)])
    chrf_score = chrf.corpus_score(list(hyps), [list(refs)])
    return {
        "bleu": float(bleu_score.score),
        "chrf": float(chrf_score.score),
        "length_ratio": bleu_score.sys_len / max(1, bleu_score.ref_len),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }
