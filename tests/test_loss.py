"""The hand-written loss equals PyTorch's cross-entropy, value and gradient, PAD rows skipped."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nmt.data import PAD_ID
from nmt.model.loss import sequence_loss


def _batch(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=generator, dtype=dtype) * 4  # [B, T, V]
    targets = torch.randint(0, 11, (3, 5), generator=generator)
    targets[targets == PAD_ID] = PAD_ID + 1
    targets[0, 3:] = PAD_ID  # a shorter sentence
    targets[2, 1:] = PAD_ID
    return logits, targets


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_loss_and_gradient_equal_pytorch_cross_entropy(smoothing: float) -> None:
    logits, targets = _batch(torch.float64)
    ours_in = logits.clone().requires_grad_()
    ref_in = logits.clone().requires_grad_()
    ours = sequence_loss(ours_in, targets, smoothing)
    reference = F.cross_entropy(ref_in.reshape(-1, 11), targets.reshape(-1), ignore_index=PAD_ID,
                                label_smoothing=smoothing, reduction="sum")
    # sequence_loss computes in float32; compare against float64 PyTorch at float32 accuracy
    assert ours.item() == pytest.approx(reference.item(), rel=1e-6)
    (ours * 0.5).backward()
    (reference * 0.5).backward()
    torch.testing.assert_close(ours_in.grad, ref_in.grad, rtol=1e-5, atol=1e-6)
    assert ours_in.grad[2, 1:].abs().sum() == 0  # PAD positions get no gradient


def test_the_gradient_passes_gradcheck_in_float64() -> None:
    from nmt.model.loss import _SmoothedCrossEntropy

    logits, targets = _batch(torch.float64)
    flat = logits.reshape(-1, 11).requires_grad_()
    assert torch.autograd.gradcheck(lambda z: _SmoothedCrossEntropy.apply(z, targets.reshape(-1), 0.1), (flat,))


def test_large_logit_gaps_stay_finite() -> None:
    logits = torch.tensor([[[200.0, -200.0, 0.0, 50.0]]], requires_grad=True)  # p of the target underflows
    loss = sequence_loss(logits, torch.tensor([[1]]), 0.1)
    reference = F.cross_entropy(logits.detach()[0], torch.tensor([1]), label_smoothing=0.1, reduction="sum")
    assert torch.isfinite(loss) and loss.item() == pytest.approx(reference.item(), rel=1e-6)
    loss.backward()
    assert torch.isfinite(logits.grad).all()


def _vocab_sized_storages(smoothing: float, grad_in_place: bool) -> tuple[torch.Tensor, int]:
    """The logits' gradient, and how many new ``[N, V]`` storages the loss's ops made, forward and backward."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Storages(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: set[int] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            for tensor in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(tensor, torch.Tensor) and tuple(tensor.shape) == (15, 11):
                    self.seen.add(tensor.untyped_storage().data_ptr())
            return out

    logits, targets = _batch(torch.float32)
    flat = logits.reshape(-1, 11).requires_grad_()
    with Storages() as mode:
        sequence_loss(flat, targets, smoothing, grad_in_place=grad_in_place).backward()
    return flat.grad, len(mode.seen - {flat.untyped_storage().data_ptr()})  # views of the input are not new


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_grad_in_place_gives_the_same_gradient_without_a_new_vocabulary_sized_tensor(smoothing: float) -> None:
    grad, storages = _vocab_sized_storages(smoothing, grad_in_place=False)
    grad_in_place, storages_in_place = _vocab_sized_storages(smoothing, grad_in_place=True)
    assert torch.equal(grad_in_place, grad)  # the same op on the same values: bit for bit
    assert (storages, storages_in_place) == (2, 1)  # softmax + gradient, or the softmax alone


def test_grad_in_place_refuses_a_second_backward() -> None:
    logits, targets = _batch(torch.float32)
    logits.requires_grad_()
    loss = sequence_loss(logits, targets, 0.1, grad_in_place=True)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="grad_in_place"):
        loss.backward()
