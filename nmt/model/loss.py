"""The training loss: summed, label-smoothed cross-entropy over real target tokens (Szegedy et al., 2016)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from nmt.data import PAD_ID


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Summed label-smoothed cross-entropy of ``[N, V]`` float logits, rows whose target is PAD skipped.

    ``loss = lse(z) - (1-ε) z_t - ε/V Σ_j z_j``, gradient ``softmax(z) - (1-ε) onehot(t) - ε/V``: the logits
    are read three times and the gradient written once, where ``F.cross_entropy`` materialises the log-softmax
    and scatters into a zero gradient (training steps 1.12× faster on a 2-core CPU; docs/results/speed.md).
    ``grad_in_place`` writes the gradient over the saved softmax instead of a new ``[N, V]`` tensor (one fewer
    allocation of the step's largest size, ~120 MB and ~29k page faults a step for the default model on a CPU);
    its backward then runs once only.
    """

    @staticmethod
    def forward(ctx: Any, logits: Tensor, targets: Tensor, smoothing: float, grad_in_place: bool = False) -> Tensor:
        probs = torch.softmax(logits, dim=-1)  # [N, V]: the gradient needs it, and the log-sum-exp comes from it
        top, top_index = logits.max(dim=-1)  # [N]
        # p at the argmax is at least 1/V, so its log never underflows: lse = max - log p_argmax
        log_sum_exp = top - probs.gather(1, top_index[:, None]).squeeze(1).log()
        per_row = log_sum_exp - (1.0 - smoothing) * logits.gather(1, targets[:, None]).squeeze(1)
        if smoothing:
            per_row = per_row - (smoothing / logits.shape[1]) * logits.sum(dim=-1)
        real = targets != PAD_ID  # [N]
        ctx.save_for_backward(probs, targets, real)
        ctx.smoothing, ctx.grad_in_place, ctx.backward_done = smoothing, grad_in_place, False
        return (per_row * real).sum()

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Tensor, None, None, None]:
        if ctx.grad_in_place and ctx.backward_done:  # checked before autograd's own, less telling version check
            raise RuntimeError("sequence_loss(grad_in_place=True) overwrote its saved softmax in the first backward; "
                               "use grad_in_place=False to run backward twice (retain_graph, gradcheck)")
        ctx.backward_done = True
        probs, targets, real = ctx.saved_tensors
        smoothing = ctx.smoothing
        scale = (grad_loss * real).to(probs.dtype)[:, None]  # [N, 1]: 0 on PAD rows
        # (softmax - ε/V) * scale in one pass, then -(1-ε) * scale at each target
        out = probs if ctx.grad_in_place and not torch.is_grad_enabled() else None
        grad = torch.addcmul((-smoothing / probs.shape[1]) * scale, probs, scale, out=out)  # [N, V]
        grad.scatter_add_(1, targets[:, None], -(1.0 - smoothing) * scale)
        return grad, None, None, None


def sequence_loss(logits: Tensor, targets: Tensor, label_smoothing: float = 0.0, grad_in_place: bool = False) -> Tensor:
    """Summed cross-entropy over real target tokens: logits ``[B, T, V]``, targets ``[B, T]`` -> scalar. Equal to
    ``F.cross_entropy(..., ignore_index=PAD_ID, label_smoothing=..., reduction="sum")`` up to rounding (tested).
    ``grad_in_place``: the gradient reuses the softmax's memory (a training step's one backward; see above).
    """
    flat = logits.reshape(-1, logits.shape[-1]).float()  # [B*T, V], float32 for a stable softmax
    return _SmoothedCrossEntropy.apply(flat, targets.reshape(-1), float(label_smoothing), grad_in_place)
