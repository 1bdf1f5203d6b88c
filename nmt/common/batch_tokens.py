"""What ``batch_tokens=auto`` means: the padded source tokens of a decoding or scoring batch on each device."""

from __future__ import annotations

import torch

CPU_BATCH_TOKENS = 4096  # on a CPU: larger batches gain nothing there (docs/results/speed.md)
GPU_BATCH_TOKENS = 65_536  # on a GPU: a test set in a few batches, each a few captured steps wide


def resolve_batch_tokens(value: int | str, device: torch.device, budget: int = CPU_BATCH_TOKENS) -> int:
    """``batch_tokens`` as a number. ``auto`` is ``budget`` on a CPU (``CPU_BATCH_TOKENS`` unless the caller has a
    budget of its own, as validation has ``data.valid_max_tokens``) and at least ``GPU_BATCH_TOKENS`` on CUDA."""
    if value != "auto":
        return int(value)
    return max(budget, GPU_BATCH_TOKENS) if device.type == "cuda" else budget
