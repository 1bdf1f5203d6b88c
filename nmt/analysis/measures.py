"""What the run comparison measures beyond corpus BLEU: tutorial-style BLEU (labelled as such), BLEU by source length
(Bahdanau et al., 2015, Fig. 2; Luong et al., 2015, Fig. 6) and attention sharpness (``nmt.model.attention_stats``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from sacrebleu.metrics import BLEU

from nmt.common.metrics import check_parallel
from nmt.model.attention_stats import attention_sharpness

__all__ = ["TUTORIAL_BLEU_LABEL", "attention_sharpness", "bleu_by_length", "tutorial_bleu"]

TUTORIAL_BLEU_LABEL = "tutorial-style BLEU (lowercased, 13a-tokenized; not comparable to cased sacreBLEU)"


def tutorial_bleu(hyps: Sequence[str], refs: Sequence[str]) -> dict:
    """BLEU of detokenized ``hyps`` against ``refs`` as the PyTorch/torchtext tutorials compute it, lowercased and
    tokenized (a few points above cased sacreBLEU): only to compare against such numbers, and labelled so.

    Returns:
        ``{"bleu", "signature", "label"}``: the score (0-100), its sacreBLEU signature and a tutorial-style label.

    Raises:
        ValueError: ``hyps`` and ``refs`` differ in length.
    """
    check_parallel(hyps, refs)
    bleu = BLEU(lowercase=True, tokenize="13a")
    score = bleu.corpus_score(list(hyps), [list(refs)])
    return {"bleu": float(score.score), "signature": str(bleu.get_signature()), "label": TUTORIAL_BLEU_LABEL}


def bleu_by_length(srcs: Sequence[str], hyps: Sequence[str], refs: Sequence[str],
                   buckets: Sequence[int] = (10, 20, 30, 40)) -> list[dict]:
    """Corpus BLEU per bucket of source length in whitespace words (by default ``<=10``, ``11-20``, ``21-30``,
    ``31-40``, ``>40``); ``buckets`` are the increasing inclusive upper bounds of all but the last bucket.

    Returns:
        One dict per bucket, shortest first: ``{"range", "min_words", "max_words", "n", "bleu"}``; ``max_words``
        None for the open-ended bucket, ``bleu`` None for an empty one.

    Raises:
        ValueError: unparallel inputs, or bounds that are not strictly increasing.
    """
    check_parallel(hyps, refs)
    check_parallel(srcs, refs)
    bounds = list(buckets)
    if any(b <= a for a, b in zip(bounds, bounds[1:])) or any(b < 0 for b in bounds):
        raise ValueError(f"buckets must be strictly increasing non-negative bounds, got {bounds}")
    members: list[list[int]] = [[] for _ in range(len(bounds) + 1)]
    for i, src in enumerate(srcs):  # into the first bucket whose upper bound holds it; the open-ended one otherwise
        members[bisect_left(bounds, len(src.split()))].append(i)
    labels = ([f"<={bounds[0]}", *(f"{a + 1}-{b}" for a, b in zip(bounds, bounds[1:])), f">{bounds[-1]}"]
              if bounds else ["all"])
    rows = []
    for label, lo, hi, idx in zip(labels, [0] + [b + 1 for b in bounds], [*bounds, None], members):
        bleu = float(BLEU().corpus_score([hyps[i] for i in idx], [[refs[i] for i in idx]]).score) if idx else None
        rows.append({"range": label, "min_words": lo, "max_words": hi, "n": len(idx), "bleu": bleu})
    return rows
