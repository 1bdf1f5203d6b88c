"""Ensembles: several models decoding as one, ``log p_ens(y_j | y_<j, x) = mean_m log p_m(y_j | y_<j, x)``; each
keeps its own encoder memory and decoder state, and the search normalises the mean again (as Nematus and Marian do).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.model.seq2seq import EncoderMemory, SearchModel, Seq2Seq


@dataclass
class EnsembleMemory:
    """One ``EncoderMemory`` per member, for the same source rows."""

    members: list[EncoderMemory]

    def index_select(self, index: Tensor) -> EnsembleMemory:
        """Rows ``index`` ``[R']`` of every member's memory."""
        return EnsembleMemory([memory.index_select(index) for memory in self.members])


@dataclass
class EnsembleState:
    """One decoder state ``[L_m, R, H_m]`` per member; reordered along the rows like a single state tensor."""

    members: list[Tensor]

    def repeat_interleave(self, repeats: int, dim: int) -> EnsembleState:
        return EnsembleState([state.repeat_interleave(repeats, dim=dim) for state in self.members])

    def index_select(self, dim: int, index: Tensor) -> EnsembleState:
        return EnsembleState([state.index_select(dim, index) for state in self.members])


class Ensemble(nn.Module):
    """Several ``Seq2Seq`` models decoding together: in eval mode, on one device, with one target vocabulary."""

    def __init__(self, models: Sequence[Seq2Seq | SearchModel]) -> None:
        super().__init__()
        if not models:
            raise ValueError("an ensemble needs at least one model")
        vocab_sizes = {model.vocab_size for model in models}
        if len(vocab_sizes) > 1:
            raise ValueError(f"ensemble members have different target vocabularies: {sorted(vocab_sizes)}")
        self.members = nn.ModuleList(models)
        self.has_attention = any(model.has_attention for model in models)

    def encode(self, src: Tensor, src_lengths: Tensor) -> tuple[EnsembleMemory, EnsembleState]:
        """src ``[R, S]``, src_lengths ``[R]`` -> every member's memory and initial decoder state."""
        encoded = [model.encode(src, src_lengths) for model in self.members]
        return EnsembleMemory([m for m, _ in encoded]), EnsembleState([s for _, s in encoded])

    def decode_step(self, prev_tokens: Tensor, state: EnsembleState, memory: EnsembleMemory
                    ) -> tuple[Tensor, EnsembleState, Tensor]:
        """One step of every member; ``memory`` has ``R`` rows, or ``R / K`` for beam search's K hypotheses.

        Returns:
            the mean log-probabilities ``[R, V]`` (float32; the search's log-softmax leaves them as they are), the
            new states, and the mean attention ``[R, S]`` of the members that attend (the first member's if none).
        """
        log_probs, states, weights = [], [], []
        for model, member_state, member_memory in zip(self.members, state.members, memory.members):
            logits, new_state, step_weights = model.decode_step(prev_tokens, member_state, member_memory)
            log_probs.append(F.log_softmax(logits.float(), dim=-1))  # [R, V]
            states.append(new_state)
            if model.has_attention:
                weights.append(step_weights.float())  # [R, S]
        mean_log_probs = torch.stack(log_probs).mean(dim=0)  # [R, V]
        mean_weights = torch.stack(weights).mean(dim=0) if weights else step_weights  # [R, S]
        return mean_log_probs, EnsembleState(states), mean_weights
