"""How peaked a trained model's attention is on a split: the entropy and largest weight of each target token's
distribution over the source, decoding the references teacher-forced.
"""

from __future__ import annotations

import torch

from nmt.common.batch_tokens import resolve_batch_tokens
from nmt.data.batching import EncodedSplit, collate_batch, token_batches
from nmt.model.seq2seq import Seq2Seq


def attention_sharpness(model: Seq2Seq, split: EncodedSplit, batch_tokens: int | str = "auto"
                        ) -> dict[str, float] | None:
    """How peaked the attention is on ``split``, decoding its references teacher-forced: every real target token
    (EOS included) gives one distribution ``a_j`` over its S real source pieces (multihead: the heads' mean).
    Sentences with an empty side are skipped.

    Args:
        batch_tokens: padded source tokens per teacher-forced batch, or ``auto`` (``nmt.common.batch_tokens``).

    Returns:
        ``{"normalised_entropy", "max_weight", "entropy", "tokens"}``: means over target tokens of
        ``H(a_j) / log S`` (0 = one-hot, 1 = uniform), of ``max_i a_ji`` and of ``H(a_j)`` in nats, and the
        token count; None for a model without attention.
    """
    if not model.has_attention:
        return None
    device = next(model.parameters()).device
    rows = [i for i in range(len(split)) if split.src_ids[i] and split.tgt_ids[i]]
    totals = {"normalised_entropy": 0.0, "max_weight": 0.0, "entropy": 0.0}
    tokens = 0
    with torch.inference_mode():
        budget = resolve_batch_tokens(batch_tokens, device)
        for batch_rows in token_batches([len(split.src_ids[i]) + 1 for i in rows], budget):
            batch = collate_batch([split[rows[k]] for k in batch_rows])
            # the model's attention weights [B, T, S]
            weights = model(batch.src.to(device), batch.src_lengths, batch.tgt_in.to(device))[1].float().cpu()
            entropy = -(weights * weights.clamp_min(1e-12).log()).sum(-1)  # [B, T]; padding has weight 0
            uniform = batch.src_lengths.float().log()[:, None].expand_as(entropy)  # [B, T] log S per sentence
            real = batch.tgt_mask  # [B, T]
            totals["entropy"] += entropy[real].sum().item()
            totals["normalised_entropy"] += (entropy[real] / uniform[real]).sum().item()
            totals["max_weight"] += weights.max(-1).values[real].sum().item()
            tokens += int(real.sum())
    return {**{name: total / max(1, tokens) for name, total in totals.items()}, "tokens": tokens}
