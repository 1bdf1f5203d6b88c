"""Noisy-channel reranking of an n-best list: log P(y|x) + λ·log P(x|y) + γ·|y| (Yee et al., 2019), the reverse
model(s) scoring the source given each candidate in one teacher-forced, batched pass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from nmt.common.batch_tokens import CPU_BATCH_TOKENS, resolve_batch_tokens
from nmt.common.device import autocast
from nmt.data.batching import Batch, collate_batch, token_batches
from nmt.inference.engine import TranslationError, Translator, check_option, is_number
from nmt.model.search import Hypothesis


@dataclass
class RerankSettings:
    """The ``rerank`` block of translate.py and serve.py; the one home of these defaults.

    Attributes:
        checkpoint: the reverse model(s) (run dirs or .pt files, a list for an ensemble); None = off.
        weight: λ, the weight of log P(x|y); 0 with ``length_weight`` 0 keeps the n-best order.
        length_weight: γ, added per subword of the candidate (> 0 favours longer outputs).
        n_best: candidates rescored per sentence (at most ``beam_size``).
    """

    checkpoint: Any = None
    weight: float = 1.0
    length_weight: float = 0.0
    n_best: int = 5


class NoisyChannel:
    """Reverse models (a Translator of the reverse direction) that score a source given each candidate translation."""

    def __init__(self, reverse: Translator) -> None:
        self.reverse = reverse

    @classmethod
    def load(cls, checkpoint: str | Sequence[str], forward: Translator) -> NoisyChannel:
        """The reverse model(s) at ``checkpoint``, on ``forward``'s device and precision.

        Raises:
            TranslationError: models whose languages do not mirror ``forward``'s (one line).
            CheckpointError: a missing or unreadable checkpoint.
        """
        reverse = Translator.from_checkpoint(checkpoint, device=forward.device, precision=forward.precision,
                                             max_input_words=None)
        mine, theirs = forward.info(), reverse.info()
        if (theirs["src_lang"], theirs["tgt_lang"]) != (mine["tgt_lang"], mine["src_lang"]):
            raise TranslationError(
                f"rerank.checkpoint {' + '.join(map(str, reverse.checkpoints))} translates {theirs['src_lang']}→"
                f"{theirs['tgt_lang']}, but the model translates {mine['src_lang']}→{mine['tgt_lang']}: a "
                f"noisy-channel reranker translates the other way, {mine['tgt_lang']}→{mine['src_lang']}")
        return cls(reverse)

    @torch.inference_mode()
    def source_log_probs(self, sources: Sequence[str], candidates: Sequence[Sequence[str]],
                         batch_tokens: int | str = CPU_BATCH_TOKENS) -> list[list[float]]:
        """log P(x|y): the reverse models' summed token log-probabilities of each source (EOS included) given each of
        its candidates (an ensemble averaged per token, as in its search); per source, one score per candidate.
        ``batch_tokens`` bounds each teacher-forced batch, ``R * max(S, T)``.
        """
        x_ids = self.reverse.tokenizer.encode_tgt_batch(list(sources))
        owners = [i for i, cands in enumerate(candidates) for _ in cands]
        y_ids = self.reverse.encode([y for cands in candidates for y in cands])
        lengths = [max(len(y_ids[k]), len(x_ids[owners[k]])) + 1 for k in range(len(owners))]
        flat = [0.0] * len(owners)
        for rows in token_batches(lengths, resolve_batch_tokens(batch_tokens, self.reverse.device)):
            batch = collate_batch([(k, y_ids[k], x_ids[owners[k]]) for k in rows]).to(self.reverse.device)
            for k, score in zip(rows, self._batch_scores(batch).tolist()):
                flat[k] = score
        scores = iter(flat)  # in the order of owners: each source's candidates in turn
        return [[next(scores) for _ in cands] for cands in candidates]

    def _batch_scores(self, batch: Batch) -> torch.Tensor:
        """Teacher-forced log P(tgt_out | src) per row ``[R]``, the mean over the reverse models."""
        total = torch.zeros(batch.size, device=batch.src.device)
        with autocast(self.reverse.precision, self.reverse.device):
            for model in self.reverse.models:
                logits, _ = model(batch.src, batch.src_lengths, batch.tgt_in)  # [R, T, V]
                log_probs = torch.log_softmax(logits.float(), dim=-1)
                picked = log_probs.gather(-1, batch.tgt_out.unsqueeze(-1)).squeeze(-1)  # [R, T]
                total += (picked * batch.tgt_mask).sum(dim=1)
        return total / len(self.reverse.models)


@dataclass(frozen=True)
class Rerank:
    """What ``Translator.translate(..., rerank=...)`` reranks with: a channel and the weights.

    Attributes:
        channel: the reverse models (``NoisyChannel.load``).
        weight, length_weight, n_best: as ``RerankSettings``'.
    """

    channel: NoisyChannel
    weight: float = RerankSettings.weight
    length_weight: float = RerankSettings.length_weight
    n_best: int = RerankSettings.n_best

    def checked(self, beam_size: int) -> Rerank:
        """These options if valid; else a TranslationError naming the option and its range."""
        check_weights(self, beam_size)
        return self

    def rerank(self, sources: Sequence[str], nbest: list[list[Hypothesis]], texts: list[list[str]]
               ) -> list[list[Hypothesis]]:
        """Each n-best list (search scores log P(y|x), best first) reordered by the combined score, which becomes each
        hypothesis' score; ``texts`` are the candidates detokenized, for the reverse models.
        """
        # weight 0 costs nothing (and an -inf log-probability times 0 cannot turn a score into NaN)
        channel = self.channel.source_log_probs(sources, texts) if self.weight else [[0.0] * len(t) for t in texts]
        return [combine(hyps, scores, self.weight, self.length_weight) for hyps, scores in zip(nbest, channel)]


def check_weights(options: RerankSettings | Rerank, beam_size: int) -> None:
    """Refuse a weight that is not a finite number, or an ``n_best`` outside 1..``beam_size`` (one line)."""
    for name in ("weight", "length_weight"):
        value = getattr(options, name)
        check_option(is_number(value) and math.isfinite(value), f"rerank.{name}", "a finite number", value)
    check_option(is_number(options.n_best, int) and 1 <= options.n_best <= beam_size, "rerank.n_best",
                 f"a whole number from 1 to beam_size ({beam_size})", options.n_best)


def from_settings(settings: Any, forward: Translator) -> Rerank | None:
    """The ``Rerank`` a ``rerank`` settings block (translate.py's, serve.py's) asks for; None when it is off."""
    if settings.checkpoint in (None, "", []):
        return None
    channel = NoisyChannel.load(settings.checkpoint, forward)
    return Rerank(channel, float(settings.weight), float(settings.length_weight), int(settings.n_best))


def combine(hyps: list[Hypothesis], channel: list[float], weight: float, length_weight: float
            ) -> list[Hypothesis]:
    """``hyps`` rescored as score + weight·channel + length_weight·|tokens|, best first (ties keep their order)."""
    rescored = [replace(h, score=h.score + (weight * c if weight else 0.0) + length_weight * len(h.tokens))
                for h, c in zip(hyps, channel)]
    return sorted(rescored, key=lambda h: -h.score)
