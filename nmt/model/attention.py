"""Attention plug-ins, ``a = masked_softmax(score(q, K), mask)`` and ``c = sum_i a_i v_i``: additive (Bahdanau et al.,
2015), dot and general (Luong et al., 2015), scaled-dot and multihead (Vaswani et al., 2017) and none (Cho et al.,
2014), one class each, registered by name and selected with ``attention=NAME``.
"""

from __future__ import annotations

import abc
import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

PreparedKeys = Tensor
"""What ``Attention.prepare`` returns: keys in the form ``score`` wants, batch dimension first."""

_REGISTRY: dict[str, type[Attention]] = {}


def register_attention(name: str) -> Callable[[type[Attention]], type[Attention]]:
    """Class decorator that makes an attention type selectable by ``name``."""

    def add(cls: type[Attention]) -> type[Attention]:
        if name in _REGISTRY:
            raise ValueError(f"attention type {name!r} is registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return add


def attention_names() -> list[str]:
    """The names ``build_attention`` accepts, sorted."""
    return sorted(_REGISTRY)


def attention_class(name: str) -> type[Attention]:
    """The class registered as ``name``; an unknown name lists the valid ones."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown attention type {name!r}; valid types: {', '.join(attention_names())}")
    return _REGISTRY[name]


def attention_options(name: str) -> list[str]:
    """Keyword options (beyond the sizes) that attention type ``name`` takes, e.g. ``['dropout', 'heads']``."""
    sizes = {"self", "query_size", "key_size", "hidden_size"}
    params = inspect.signature(attention_class(name).__init__).parameters
    return [p for p in params if p not in sizes]


def build_attention(name: str, query_size: int, key_size: int, hidden_size: int, **options: Any) -> Attention:
    """Build the attention type registered as ``name``.

    Args:
        name: a registered type (see ``attention_names()``).
        query_size: Dq, size of the decoder state that asks.
        key_size: Dk, size of the encoder states that answer (keys and values).
        hidden_size: size of the learned projections (additive's tanh layer, multihead's model size).
        **options: type-specific options such as ``dropout`` or ``heads``; unknown ones raise an error
            that lists the valid ones.
    """
    valid = attention_options(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(f"attention type {name!r} got unknown option(s) {unknown}; valid options: {valid}")
    return attention_class(name)(query_size=query_size, key_size=key_size, hidden_size=hidden_size, **options)


def masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """Softmax over the last dimension that gives masked positions weight exactly 0.

    A row with no valid position gives all zeros, never NaN (the usual ``-inf`` fill makes
    ``exp(-inf - (-inf))`` undefined there).

    Args:
        scores: ``[..., S]`` unnormalised scores.
        mask: bool, broadcastable to ``scores``; True = keep.
    """
    mask = mask.expand_as(scores)
    # The most negative finite value keeps max-subtraction finite; the final multiply makes masked
    # weights exactly 0 and zeroes rows that had no valid position.
    filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(filled, dim=-1) * mask


class Attention(nn.Module, metaclass=abc.ABCMeta):
    """Base class: score -> masked softmax -> weighted sum of values. Subclasses write ``score``.

    Args:
        query_size: Dq.
        key_size: Dk (values have the same size as keys in this project's encoder, but ``forward``
            takes any Dv).
        hidden_size: size of learned projections, where the type has any.
        dropout: dropout on the attention weights (training only).
    """

    name: str = ""

    def __init__(self, query_size: int, key_size: int, hidden_size: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.query_size = query_size
        self.hidden_size = hidden_size
        self.weight_dropout = nn.Dropout(dropout)

    def context_size(self, value_size: int) -> int:
        """Size of the context vector returned for values of size ``value_size``."""
        return value_size

    def prepare(self, keys: Tensor) -> PreparedKeys:
        """Work on the keys that does not depend on the query: once per source batch.

        The result is passed back in by the caller, never stored on the module, so beam search can reorder
        it like any other tensor.

        Args:
            keys: ``[B, S, Dk]``.
        """
        return keys

    @abc.abstractmethod
    def score(self, query: Tensor, prepared_keys: PreparedKeys) -> Tensor:
        """Unnormalised scores. query ``[B, T, Dq]``, prepared keys -> ``[B, T, S]`` (or ``[B, h, T, S]``
        for a type with h heads: any dimensions between B and S)."""

    def attend(self, weights: Tensor, values: Tensor, prepared_keys: PreparedKeys) -> Tensor:
        """Weighted sum. weights ``[B, T, S]``, values ``[B, S, Dv]`` -> context ``[B, T, Dv]``."""
        return torch.bmm(weights, values)  # [B, T, Dv]

    def reported_weights(self, weights: Tensor) -> Tensor:
        """The weights ``forward`` returns (for plots and alignments), ``[B, T, S]``, from ``score``'s shape."""
        return weights

    def forward(self, query: Tensor, keys: Tensor, values: Tensor, mask: Tensor,
                prepared_keys: PreparedKeys | None = None) -> tuple[Tensor, Tensor]:
        """Attend from ``query`` over the source.

        Args:
            query: ``[B, Dq]`` or ``[B, T, Dq]``.
            keys: ``[B, S, Dk]``; ignored when ``prepared_keys`` is given.
            values: ``[B, S, Dv]``.
            mask: ``[B, S]`` bool, True = real token.
            prepared_keys: ``self.prepare(keys)``, computed once per source batch by the caller.

        Returns:
            context ``[B, Dv]`` or ``[B, T, Dv]``, and weights ``[B, S]`` or ``[B, T, S]``.
        """
        single_step = query.dim() == 2
        if single_step:
            query = query.unsqueeze(1)  # [B, 1, Dq]
        if prepared_keys is None:
            prepared_keys = self.prepare(keys)
        scores = self.score(query, prepared_keys)  # [B, T, S] ([B, h, T, S] with heads)
        mask = mask.view(mask.shape[0], *[1] * (scores.dim() - 2), mask.shape[1])  # [B, 1, S] ([B, 1, 1, S])
        weights = masked_softmax(scores, mask)  # as scores
        context = self.attend(self.weight_dropout(weights), values, prepared_keys)  # [B, T, Dv]
        weights = self.reported_weights(weights)  # [B, T, S]
        if single_step:
            return context.squeeze(1), weights.squeeze(1)  # [B, Dv], [B, S]
        return context, weights


@register_attention("additive")
class AdditiveAttention(Attention):
    """Bahdanau et al. (2015): ``score(q, k) = v^T tanh(W_q q + W_k k)``; ``W_k k`` is prepared once."""

    def __init__(self, query_size: int, key_size: int, hidden_size: int, dropout: float = 0.0) -> None:
        super().__init__(query_size, key_size, hidden_size, dropout)
        self.query_proj = nn.Linear(query_size, hidden_size, bias=False)
        self.key_proj = nn.Linear(key_size, hidden_size, bias=False)
        self.energy = nn.Linear(hidden_size, 1, bias=False)

    def prepare(self, keys: Tensor) -> PreparedKeys:
        return self.key_proj(keys)  # [B, S, H]

    # Elements of the tanh input filled at a time when decoding on a CPU (4 bytes each: ~2 MB).
    cpu_chunk_elements = 1 << 19

    def score(self, query: Tensor, prepared_keys: PreparedKeys) -> Tensor:
        q = self.query_proj(query).unsqueeze(2)  # [B, T, 1, H]
        k = prepared_keys.unsqueeze(1)  # [B, 1, S, H]
        if torch.is_grad_enabled() or query.device.type != "cpu":
            return self.energy(torch.tanh(q + k)).squeeze(-1)  # [B, T, S]
        return self._score_in_chunks(q, k)

    def _score_in_chunks(self, q: Tensor, k: Tensor) -> Tensor:
        """The same scores for CPU decoding: q ``[B, T, 1, H]``, k ``[B, 1, S, H]`` -> ``[B, T, S]``.

        ``tanh(q + k)`` is most of a CPU decoding step. Two exact rewrites, ~4x faster together:
        ``v . tanh(x) = 2 v . sigmoid(2x) - sum(v)`` (CPU sigmoid is several times faster than tanh), and a few
        rows at a time, so the ``[B, T, S, H]`` tensor stays in cache.
        """
        batch, steps, _, hidden = q.shape
        src_len = k.shape[2]
        rows = max(1, self.cpu_chunk_elements // (steps * src_len * hidden))
        v = self.energy.weight.t()  # [H, 1]
        scores = q.new_empty(batch, steps, src_len)  # [B, T, S]
        for first in range(0, batch, rows):
            part = torch.add(q[first : first + rows], k[first : first + rows]).mul_(2.0)  # [b, T, S, H]
            torch.sigmoid_(part)
            scores[first : first + rows] = torch.matmul(part, v).squeeze(-1)  # [b, T, S]
        return scores.mul_(2.0).sub_(v.sum())


@register_attention("dot")
class DotAttention(Attention):
    """Luong et al. (2015): ``score(q, k) = q . k``; keys of another size are first projected to the query size
    (prepared once per batch), equal sizes need no parameters.
    """

    def __init__(self, query_size: int, key_size: int, hidden_size: int, dropout: float = 0.0) -> None:
        super().__init__(query_size, key_size, hidden_size, dropout)
        self.key_proj = nn.Linear(key_size, query_size, bias=False) if key_size != query_size else None

    def prepare(self, keys: Tensor) -> PreparedKeys:
        return keys if self.key_proj is None else self.key_proj(keys)  # [B, S, Dq]

    def score(self, query: Tensor, prepared_keys: PreparedKeys) -> Tensor:
        return torch.bmm(query, prepared_keys.transpose(1, 2))  # [B, T, S]


@register_attention("scaled_dot")
class ScaledDotAttention(DotAttention):
    """Vaswani et al. (2017): ``score(q, k) = q . k / sqrt(d)`` with d the query size (keys projected
    to it when sizes differ, as in ``dot``). The scaling keeps softmax out of saturation for large d."""

    def score(self, query: Tensor, prepared_keys: PreparedKeys) -> Tensor:
        return super().score(query, prepared_keys) / math.sqrt(self.query_size)  # [B, T, S]


@register_attention("general")
class GeneralAttention(Attention):
    """Luong et al. (2015): ``score(q, k) = q^T W k``; ``W k`` is prepared once per batch."""

    def __init__(self, query_size: int, key_size: int, hidden_size: int, dropout: float = 0.0) -> None:
        super().__init__(query_size, key_size, hidden_size, dropout)
        self.bilinear = nn.Linear(key_size, query_size, bias=False)  # W: [Dq, Dk]

    def prepare(self, keys: Tensor) -> PreparedKeys:
        return self.bilinear(keys)  # [B, S, Dq]

    score = DotAttention.score  # q . (W k), over the prepared keys


@register_attention("multihead")
class MultiHeadAttention(Attention):
    """Vaswani et al. (2017): scaled-dot attention in ``heads`` subspaces of size ``hidden_size / heads``.

    Contexts are concatenated and projected back, weights reported as the heads' mean; key and value projections
    are prepared once per batch, stacked as ``[B, 2, S, hidden]``.
    """

    def __init__(self, query_size: int, key_size: int, hidden_size: int, dropout: float = 0.0, heads: int = 4) -> None:
        super().__init__(query_size, key_size, hidden_size, dropout)
        if heads < 1 or hidden_size % heads:
            raise ValueError(f"multihead attention: hidden_size {hidden_size} is not divisible by heads {heads}")
        self.heads = heads
        self.head_size = hidden_size // heads
        self.query_proj = nn.Linear(query_size, hidden_size, bias=False)
        self.key_proj = nn.Linear(key_size, hidden_size, bias=False)
        self.value_proj = nn.Linear(key_size, hidden_size, bias=False)
        self.out_proj = nn.Linear(hidden_size, key_size, bias=False)

    def _split_heads(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.heads, self.head_size).transpose(1, 2)  # [B, h, L, hs]

    def prepare(self, keys: Tensor) -> PreparedKeys:
        # Values equal keys in this encoder-decoder, so both projections are prepared here.
        return torch.stack([self.key_proj(keys), self.value_proj(keys)], dim=1)  # [B, 2, S, hidden]

    def score(self, query: Tensor, prepared_keys: PreparedKeys) -> Tensor:
        q = self._split_heads(self.query_proj(query))  # [B, h, T, hs]
        k = self._split_heads(prepared_keys[:, 0])  # [B, h, S, hs]
        return q @ k.transpose(-1, -2) / math.sqrt(self.head_size)  # [B, h, T, S]

    def attend(self, weights: Tensor, values: Tensor, prepared_keys: PreparedKeys) -> Tensor:
        """Per-head weighted sums of the prepared value projections (``values`` itself is not used).

        weights ``[B, h, T, S]`` -> context ``[B, T, Dk]``: the heads concatenated and projected back.
        """
        v = self._split_heads(prepared_keys[:, 1])  # [B, h, S, hs]
        heads_context = weights @ v  # [B, h, T, hs]
        batch, _, steps, _ = heads_context.shape
        merged = heads_context.transpose(1, 2).reshape(batch, steps, self.hidden_size)  # [B, T, hidden]
        return self.out_proj(merged)  # [B, T, Dk]

    def reported_weights(self, weights: Tensor) -> Tensor:
        return weights.mean(dim=1)  # [B, h, T, S] -> [B, T, S]


@register_attention("none")
class NoAttention(Attention):
    """No attention: the context is zero-width (``[B, 0]``), so the decoder sees only its own state,
    which starts from the encoder's final states (the RNNencdec baseline, Cho et al., 2014). The
    returned weights are all zero: there is no alignment to show."""

    def context_size(self, value_size: int) -> int:
        return 0

    def score(self, query: Tensor, prepared_keys: PreparedKeys) -> Tensor:
        """Constant scores ``[B, T, S]``; unused by ``forward``, defined for a uniform interface."""
        return query.new_zeros(query.shape[0], query.shape[1], prepared_keys.shape[1])

    def forward(self, query: Tensor, keys: Tensor, values: Tensor, mask: Tensor,
                prepared_keys: PreparedKeys | None = None) -> tuple[Tensor, Tensor]:
        """Returns context ``[B, 0]`` / ``[B, T, 0]`` and zero weights ``[B, S]`` / ``[B, T, S]``."""
        lead = query.shape[:-1]  # (B,) or (B, T)
        return values.new_zeros(*lead, 0), values.new_zeros(*lead, mask.shape[-1])
