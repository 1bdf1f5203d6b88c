"""Corpus-level scoring of detokenized translations: sacreBLEU BLEU and chrF, plus a length analysis.

The one concept here is *how a system output is scored*. Scores are sacreBLEU's (Post, 2018, "A Call
for Clarity in Reporting BLEU Scores"): BLEU (Papineni et al., 2002) cased with the ``13a`` tokenizer,
and chrF2 (Popović, 2015), each returned with its signature so a number can always be traced to the
exact metric that produced it. ``tutorial_bleu`` gives the lowercased, tokenized BLEU that popular
PyTorch tutorials report, labelled as such, so numbers from those write-ups can be compared without
passing them off as sacreBLEU. ``bleu_by_length`` buckets sentences by source length in words, the
analysis of Bahdanau et al. (2015, Fig. 2) and Luong et al. (2015, Fig. 6).

Inputs are plain strings (one sentence each), so there is no tensor shape notation here.

Not done here: tokenization or detokenization (``nmt.data``), decoding (``nmt.search``), and any
significance testing.
"""

from __future__ import annotations

from collections.abc import Sequence

from sacrebleu.metrics import BLEU, CHRF

TUTORIAL_BLEU_LABEL = "tutorial-style BLEU (lowercased, 13a-tokenized; not comparable to cased sacreBLEU)"


def _check_parallel(hyps: Sequence[str], refs: Sequence[str]) -> None:
    if len(hyps) != len(refs):
        raise ValueError(
            f"got {len(hyps)} hypotheses but {len(refs)} references; "
            "the reference file must have one line per input line"
        )


def corpus_scores(hyps: Sequence[str], refs: Sequence[str]) -> dict:
    """Score detokenized hypotheses against one reference each with sacreBLEU.

    Args:
        hyps: System outputs, one detokenized sentence each.
        refs: References, parallel to ``hyps``.

    Returns:
        ``{"bleu", "chrf", "length_ratio", "bleu_signature", "chrf_signature"}``: cased 13a BLEU and
        chrF2 (both 0-100), the hypothesis/reference length ratio in 13a tokens (below 1, BLEU's
        brevity penalty applies) and the sacreBLEU signatures.

    Raises:
        ValueError: When ``hyps`` and ``refs`` differ in length.
    """
    _check_parallel(hyps, refs)
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


def tutorial_bleu(hyps: Sequence[str], refs: Sequence[str]) -> dict:
    """BLEU as the well-known PyTorch/torchtext tutorials compute it: lowercased and tokenized.

    Those tutorials score lowercased, tokenized text, which inflates BLEU by a few points over cased
    sacreBLEU; this function exists only to compare against such numbers and says so in its label.

    Args:
        hyps: System outputs, one detokenized sentence each.
        refs: References, parallel to ``hyps``.

    Returns:
        ``{"bleu", "signature", "label"}``: the score (0-100), its sacreBLEU signature and a
        human-readable label that marks it as tutorial-style.

    Raises:
        ValueError: When ``hyps`` and ``refs`` differ in length.
    """
    _check_parallel(hyps, refs)
    bleu = BLEU(lowercase=True, tokenize="13a")
    score = bleu.corpus_score(list(hyps), [list(refs)])
    return {"bleu": float(score.score), "signature": str(bleu.get_signature()), "label": TUTORIAL_BLEU_LABEL}


def bleu_by_length(
    srcs: Sequence[str],
    hyps: Sequence[str],
    refs: Sequence[str],
    buckets: Sequence[int] = (10, 20, 30, 40),
) -> list[dict]:
    """Corpus BLEU per source-length bucket, length counted in whitespace-separated words.

    With the default ``buckets`` the ranges are ``<=10``, ``11-20``, ``21-30``, ``31-40`` and ``>40``.

    Args:
        srcs: Source sentences (untokenized), parallel to ``hyps`` and ``refs``.
        hyps: System outputs.
        refs: References.
        buckets: Increasing upper bounds (inclusive) of all but the last, open-ended bucket.

    Returns:
        One dict per bucket, shortest first: ``{"range", "min_words", "max_words", "n", "bleu"}``;
        ``max_words`` is None for the open-ended bucket and ``bleu`` is None for an empty bucket.

    Raises:
        ValueError: On unparallel inputs or bucket bounds that are not strictly increasing.
    """
    _check_parallel(hyps, refs)
    _check_parallel(srcs, refs)
    bounds = list(buckets)
    if any(b <= a for a, b in zip(bounds, bounds[1:])) or any(b < 0 for b in bounds):
        raise ValueError(f"buckets must be strictly increasing non-negative bounds, got {bounds}")

    lows = [0] + [b + 1 for b in bounds]
    highs: list[int | None] = [*bounds, None]
    members: list[list[int]] = [[] for _ in lows]
    for i, src in enumerate(srcs):
        n_words = len(src.split())
        # first bucket whose upper bound holds it; the open-ended one otherwise
        k = next((k for k, hi in enumerate(bounds) if n_words <= hi), len(bounds))
        members[k].append(i)

    rows = []
    for lo, hi, idx in zip(lows, highs, members):
        if hi is None:
            label = "all" if lo == 0 else f">{lo - 1}"
        else:
            label = f"<={hi}" if lo == 0 else f"{lo}-{hi}"
        bleu = None
        if idx:
            score = BLEU().corpus_score([hyps[i] for i in idx], [[refs[i] for i in idx]])
            bleu = float(score.score)
        rows.append({"range": label, "min_words": lo, "max_words": hi, "n": len(idx), "bleu": bleu})
    return rows
