"""The GRU encoder-decoder of Bahdanau et al. (2015): a bidirectional encoder, a bridge, and an attentional
decoder with a deep output layer (Pascanu et al., 2014) whose output matrix can be tied to the target
embeddings (Press & Wolf, 2017).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nmt.model.attention import Attention, build_attention


@dataclass
class EncoderMemory:
    """What the decoder attends to, for one source batch. Every field has the batch on dim 0."""

    enc_out: Tensor  # [B, S, 2He], keys and values of the attention
    prepared_keys: Tensor  # attention.prepare(enc_out), e.g. [B, S, H]
    src_mask: Tensor  # [B, S] bool, True = real token
    gate_table: Tensor | None = None  # [V, 3Hd], the same for every row: set by ``SearchModel`` for search

    def index_select(self, index: Tensor) -> EncoderMemory:
        """Rows ``index`` of every batch field (beam search repeats and reorders rows). index ``[B']``."""
        rows = (self.enc_out, self.prepared_keys, self.src_mask)
        return EncoderMemory(*(field.index_select(0, index) for field in rows), self.gate_table)


def gru_cell(input_gates: Tensor, state: Tensor, weight_hh: Tensor, bias_hh: Tensor,
             hidden_norm: GateNorm | None = None) -> Tensor:
    """One GRU step from input gates ``W_ih x + b_ih`` ``[B, 3Hd]`` (reset, update, new; ``nn.GRUCell``'s equations and
    order), state ``[B, Hd]``, ``weight_hh`` ``[3Hd, Hd]``, ``bias_hh`` ``[3Hd]`` -> next state ``[B, Hd]``;
    ``hidden_norm`` normalises ``W_hh h + b_hh`` per gate.
    """
    hidden_gates = F.linear(state, weight_hh, bias_hh)  # [B, 3Hd]
    if hidden_norm is not None:
        hidden_gates = hidden_norm(hidden_gates)
    return gru_update(input_gates, hidden_gates, state)


def gru_update(input_gates: Tensor, hidden_gates: Tensor, state: Tensor) -> Tensor:
    """The GRU's gate arithmetic: input gates ``[..., 3H]`` and recurrent gates ``W_hh h + b_hh`` ``[..., 3H]``
    (reset, update, new), state ``[..., H]`` -> next state ``[..., H]``."""
    i_r, i_z, i_n = input_gates.chunk(3, dim=-1)
    h_r, h_z, h_n = hidden_gates.chunk(3, dim=-1)
    reset = torch.sigmoid(i_r + h_r)
    update = torch.sigmoid(i_z + h_z)
    new = torch.tanh(i_n + reset * h_n)
    return new + update * (state - new)  # = (1 - z) * n + z * h


class GateNorm(nn.Module):
    """Layer normalisation of each of a GRU's three gate pre-activations on its own (Ba et al., 2016), gain and bias
    ``[3, Hd]``: input and recurrent parts keep equal scales, whatever the attention context does.
    """

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3, hidden_size))
        self.bias = nn.Parameter(torch.zeros(3, hidden_size))

    def forward(self, gates: Tensor) -> Tensor:
        """``[B, 3Hd]`` -> ``[B, 3Hd]``, each Hd-wide gate normalised over its own units."""
        per_gate = gates.view(*gates.shape[:-1], 3, -1)  # [B, 3, Hd]
        # normalised over the gain's width, Hd: a constant where a traced ONNX graph needs one
        normed = F.layer_norm(per_gate, self.weight.shape[-1:]) * self.weight + self.bias
        return normed.view(gates.shape)


class Encoder(nn.Module):
    """Embeddings -> dropout -> bidirectional GRU (He per direction) over packed sequences."""

    def __init__(self, vocab_size: int, emb_size: int, hidden_size: int, num_layers: int, dropout: float,
                 pad_id: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, emb_size, padding_idx=pad_id)
        self.dropout = nn.Dropout(dropout)
        self.rnn = nn.GRU(emb_size, hidden_size, num_layers=num_layers, batch_first=True, bidirectional=True,
                          dropout=dropout if num_layers > 1 else 0.0)
        self.output_size = 2 * hidden_size

    def forward(self, src: Tensor, src_lengths: Tensor, fixed_shapes: bool = False) -> tuple[Tensor, Tensor]:
        """src ``[B, S]`` right-padded, src_lengths ``[B]`` (any order: packing sorts and unsorts) -> enc_out
        ``[B, S, 2He]`` (zeros at padding) and the top layer's last states ``[B, 2He]`` = [forward after the last
        real token ; backward after the first]. ``fixed_shapes``: run ``unpacked`` instead (CUDA graphs).
        """
        embedded = self.dropout(self.embedding(src))  # [B, S, E]
        if fixed_shapes:
            return self.unpacked(embedded, src_lengths)
        packed = pack_padded_sequence(embedded, src_lengths.cpu(), batch_first=True, enforce_sorted=False)
        # Outside autocast, in the weights' dtype (float32): PyTorch's autocast wrapper for cuDNN RNNs casts
        # to float16 whatever dtype autocast asks for (aten/src/ATen/cudnn/AutocastRNN.cpp), so under bf16
        # autocast the encoder would run in fp16 with no loss scaling. One cuDNN call per batch; TF32 keeps
        # it fast.
        with torch.autocast(src.device.type, enabled=False):
            packed_out, final = self.rnn(packed)  # final: [layers * 2, B, He]
        enc_out, _ = pad_packed_sequence(packed_out, batch_first=True, total_length=src.shape[1])
        last = torch.cat([final[-2], final[-1]], dim=-1)  # [B, 2He]
        return enc_out, last

    def unpacked(self, embedded: Tensor, src_lengths: Tensor) -> tuple[Tensor, Tensor]:
        """The bidirectional GRU over ``[B, S, E]`` with no packing, so that no step reads the lengths back to the
        host and every shape depends on ``[B, S]`` alone (a CUDA graph replays it); equal to the packed pass up to
        rounding (tested). Both directions step together; the backward one reads each row reversed within its
        length, so padding comes after its real tokens too.
        """
        steps = embedded.shape[1]
        positions = torch.arange(steps, device=embedded.device)[None, :]  # [1, S]
        lengths = src_lengths.to(embedded.device)[:, None]  # [B, 1]
        real = positions < lengths  # [B, S]
        reverse = torch.where(real, lengths - 1 - positions, positions)[..., None]  # [B, S, 1], its own inverse
        last_index = (lengths - 1).clamp(min=0)[..., None]  # [B, 1, 1]
        layer_in = embedded
        for layer in range(self.rnn.num_layers):
            if layer:
                layer_in = F.dropout(layer_in, self.rnn.dropout, self.training)
            weights = [[getattr(self.rnn, f"{name}_l{layer}{suffix}") for suffix in ("", "_reverse")]
                       for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
            w_ih, w_hh, b_ih, b_hh = (torch.stack(pair) for pair in weights)  # [2, 3He, in], [2, 3He, He], [2, 3He]
            inputs = torch.stack([layer_in, layer_in.gather(1, reverse.expand_as(layer_in))])  # [2, B, S, in]
            gates = torch.einsum("dbsi,dgi->dbsg", inputs, w_ih) + b_ih[:, None, None]  # [2, B, S, 3He]
            state = gates.new_zeros(2, gates.shape[1], w_hh.shape[2])  # [2, B, He]
            outputs = []
            for step_gates in gates.unbind(2):  # S x [2, B, 3He]
                hidden_gates = torch.baddbmm(b_hh[:, None], state, w_hh.transpose(1, 2))  # [2, B, 3He]
                state = gru_update(step_gates, hidden_gates, state)
                outputs.append(state)
            forward, backward = torch.stack(outputs, 2).unbind(0)  # [B, S, He] each, backward in reversed order
            last = [out.gather(1, last_index.expand(-1, 1, out.shape[2])).squeeze(1) for out in (forward, backward)]
            backward = backward.gather(1, reverse.expand_as(backward))  # [B, S, He] back in source order
            layer_in = torch.cat([forward, backward], dim=-1) * real[..., None]  # [B, S, 2He], zeros at padding
        return layer_in, torch.cat(last, dim=-1)  # [B, S, 2He], [B, 2He]


class Decoder(nn.Module):
    """Attentional GRU decoder, teacher-forced ``forward`` and single ``step``:

        c_j = sum_i masked_softmax_i(score(s_{j-1}, h_i)) h_i      s_j = GRU([emb(y_{j-1}) ; c_j], s_{j-1})
        logits_j = E_out tanh(W_o [s_j ; c_j ; emb(y_{j-1})])       (the deep output layer)

    The loop over target steps in ``forward`` is the model's only Python loop: the key projection, the first
    layer's embedding gates and the output projection run once, outside it, on all steps.

    Args:
        vocab_size, emb_size, hidden_size, enc_size: V, E, Hd and the encoder states' size 2He.
        num_layers: L stacked GRU layers; the top layer's state is the attention query.
        dropout: on embeddings, between layers and before the output matrix.
        attention: the plug-in; its ``context_size`` may be 0 (no attention).
        tie_embeddings: share the output matrix with the target embeddings.
        output_hidden_size: the deep output layer's width; None = E (needed to tie).
        layer_norm: a layer-normalised first GRU layer (``GateNorm`` on its input and recurrent gates).
    """

    def __init__(self, vocab_size: int, emb_size: int, hidden_size: int, enc_size: int, num_layers: int, dropout: float,
                 attention: Attention, tie_embeddings: bool, pad_id: int, output_hidden_size: int | None = None,
                 layer_norm: bool = False) -> None:
        super().__init__()
        output_hidden_size = output_hidden_size or emb_size
        if tie_embeddings and output_hidden_size != emb_size:
            raise ValueError(f"tied embeddings need output_hidden_size ({output_hidden_size}) = emb_size "
                             f"({emb_size}); set tie_embeddings=false or output_hidden_size=null")
        self.num_layers = num_layers
        self.hidden_size = hidden_size
        self.attention = attention
        self.context_size = attention.context_size(enc_size)
        self.embedding = nn.Embedding(vocab_size, emb_size, padding_idx=pad_id)
        self.dropout = nn.Dropout(dropout)
        self.bridge = nn.Linear(enc_size, num_layers * hidden_size)

        # First layer's input weights, split so the embedding part runs once for all steps.
        self.emb_gates = nn.Linear(emb_size, 3 * hidden_size)  # holds b_ih
        self.ctx_gates = nn.Linear(self.context_size, 3 * hidden_size, bias=False) if self.context_size else None
        self.weight_hh = nn.Parameter(torch.empty(3 * hidden_size, hidden_size))
        self.bias_hh = nn.Parameter(torch.zeros(3 * hidden_size))
        self.input_norm = GateNorm(hidden_size) if layer_norm else None
        self.hidden_norm = GateNorm(hidden_size) if layer_norm else None
        self.upper_layers = nn.ModuleList(nn.GRUCell(hidden_size, hidden_size) for _ in range(num_layers - 1))

        self.pre_output = nn.Linear(hidden_size + self.context_size + emb_size, output_hidden_size)
        self.output = nn.Linear(output_hidden_size, vocab_size, bias=False)
        if tie_embeddings:
            self.output.weight = self.embedding.weight
        for gate_weight in self.weight_hh.view(3, hidden_size, hidden_size):  # each gate's [Hd, Hd] on its own
            nn.init.orthogonal_(gate_weight)

    def init_state(self, enc_last: Tensor) -> Tensor:
        """The bridge: ``[B, 2He]`` -> initial states ``[L, B, Hd]``."""
        batch = enc_last.shape[0]
        state = torch.tanh(self.bridge(enc_last))  # [B, L*Hd]
        return state.view(batch, self.num_layers, self.hidden_size).transpose(0, 1).contiguous()  # [L, B, Hd]

    def _recur(self, emb_gates: Tensor, context: Tensor, state: Tensor) -> Tensor:
        """One step of the stacked GRU. emb_gates ``[B, 3Hd]``, context ``[B, C]``, state ``[L, B, Hd]``."""
        input_gates = emb_gates if self.ctx_gates is None else emb_gates + self.ctx_gates(context)
        if self.input_norm is not None:
            input_gates = self.input_norm(input_gates)
        layer_out = gru_cell(input_gates, state[0], self.weight_hh, self.bias_hh, self.hidden_norm)  # [B, Hd]
        new_states = [layer_out]
        for layer, cell in enumerate(self.upper_layers, start=1):
            layer_out = cell(self.dropout(layer_out), state[layer])  # [B, Hd]
            new_states.append(layer_out)
        return torch.stack(new_states)  # [L, B, Hd]

    def _logits(self, top_state: Tensor, context: Tensor, embedded: Tensor) -> Tensor:
        """Deep output: ``[..., Hd]``, ``[..., C]``, ``[..., E]`` -> logits ``[..., V]``."""
        hidden = torch.tanh(self.pre_output(torch.cat([top_state, context, embedded], dim=-1)))  # [..., O]
        return self.output(self.dropout(hidden))  # [..., V]

    def _attend(self, query: Tensor, memory: EncoderMemory) -> tuple[Tensor, Tensor]:
        """query ``[N, Hd]``, ``N = G * B`` for memory of B sources -> context ``[N, C]``, weights ``[N, S]``. With
        G > 1 (beam hypotheses in consecutive rows) a source's G queries attend to its one copy of the memory together.
        """
        sources = memory.enc_out.shape[0]
        queries = query.view(sources, query.shape[0] // sources, -1)  # [B, G, Hd]
        context, weights = self.attention(queries, memory.enc_out, memory.enc_out, memory.src_mask,
                                          memory.prepared_keys)  # [B, G, C], [B, G, S]
        return context.reshape(query.shape[0], -1), weights.reshape(query.shape[0], -1)

    def forward(self, tgt_in: Tensor, state: Tensor, memory: EncoderMemory) -> tuple[Tensor, Tensor]:
        """Teacher-forced decoding: tgt_in ``[B, T]`` (BOS + target), state ``[L, B, Hd]`` (``init_state``) -> logits
        ``[B, T, V]`` and attention weights ``[B, T, S]``.
        """
        embedded = self.dropout(self.embedding(tgt_in))  # [B, T, E]
        # Once for all steps, then unbound: indexing [:, step] instead would make each step's backward
        # write a zero-filled [B, T, 3Hd] gradient and add it up, T times (measured: ~20% of a CPU step).
        emb_gates = self.emb_gates(embedded).unbind(1)  # T x [B, 3Hd]
        top_states, contexts, weights = [], [], []
        for step_gates in emb_gates:
            state, context, step_weights = self._forward_step(step_gates, state, memory.enc_out, memory.src_mask,
                                                              memory.prepared_keys)  # [L, B, Hd], [B, C], [B, S]
            top_states.append(state[-1])
            contexts.append(context)
            weights.append(step_weights)
        logits = self._logits(torch.stack(top_states, 1), torch.stack(contexts, 1), embedded)  # [B, T, V]
        return logits, torch.stack(weights, 1)  # [B, T, V], [B, T, S]

    def _forward_step(self, step_gates: Tensor, state: Tensor, enc_out: Tensor, src_mask: Tensor,
                      prepared_keys: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One teacher-forced step: ``[B, 3Hd]`` gates, state ``[L, B, Hd]`` -> state, context ``[B, C]``, weights
        ``[B, S]``. Plain tensors in and out, so that ``compile_step`` can hand it to ``torch.compile``."""
        context, weights = self.attention(state[-1], enc_out, enc_out, src_mask, prepared_keys)  # [B, C], [B, S]
        return self._recur(step_gates, context, state), context, weights

    def compile_step(self) -> None:
        """Train with the per-step body compiled by ``torch.compile`` (dynamic shapes). For GPUs, where the step is
        launch-bound; 6% slower than eager on a 2-core CPU, so off by default (``benchmark.py train --compile-step``).
        """
        self._forward_step = torch.compile(self._forward_step, dynamic=True)

    def step(self, prev_tokens: Tensor, state: Tensor, memory: EncoderMemory) -> tuple[Tensor, Tensor, Tensor]:
        """One search step: prev_tokens ``[B]`` (BOS first), state ``[L, B, Hd]`` -> logits ``[B, V]``, state, weights
        ``[B, S]``. ``memory`` has B rows, or B / G when each source has G consecutive rows (beam hypotheses).
        """
        embedded = self.dropout(self.embedding(prev_tokens))  # [B, E]
        context, weights = self._attend(state[-1], memory)  # [B, C], [B, S]
        step_gates = (self.emb_gates(embedded) if memory.gate_table is None
                      else memory.gate_table.index_select(0, prev_tokens))  # [B, 3Hd]
        state = self._recur(step_gates, context, state)  # [L, B, Hd]
        return self._logits(state[-1], context, embedded), state, weights

    def gate_table(self) -> Tensor:
        """``emb_gates`` of every target token, ``[V, 3Hd]`` (eval mode): without gradients a search step looks its
        input gates up here instead of a ``[B, E] x [E, 3Hd]`` matmul (~5% of a CPU beam step).
        """
        return self.emb_gates(self.embedding.weight)


class Seq2Seq(nn.Module):
    """Encoder + attentional decoder. ``forward`` is teacher-forced; search uses ``encode`` + ``decode_step``. Sizes
    as in ``Decoder``, with no defaults here: their one home is configs/model/default.yaml (``from_config``).
    """

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, attention: Attention, *, emb_size: int,
                 enc_hidden_size: int, dec_hidden_size: int, enc_layers: int, dec_layers: int, dropout: float,
                 tie_embeddings: bool, output_hidden_size: int | None, layer_norm: bool, pad_id: int = 0) -> None:
        super().__init__()
        self.encoder = Encoder(src_vocab_size, emb_size, enc_hidden_size, enc_layers, dropout, pad_id)
        self.decoder = Decoder(tgt_vocab_size, emb_size, dec_hidden_size, self.encoder.output_size, dec_layers, dropout,
                               attention, tie_embeddings, pad_id, output_hidden_size, layer_norm)
        self.has_attention = attention.context_size(self.encoder.output_size) > 0
        self.vocab_size = tgt_vocab_size  # V, the target vocabulary
        # N(0, 1/E) keeps tied output logits O(1) at the start (N(0, 1) would make them O(sqrt(E))).
        for embedding in (self.encoder.embedding, self.decoder.embedding):
            nn.init.normal_(embedding.weight, std=emb_size**-0.5)
            with torch.no_grad():
                embedding.weight[pad_id].zero_()

    @classmethod
    def from_config(cls, model_cfg: Any, attention_cfg: Any, src_vocab_size: int, tgt_vocab_size: int,
                    pad_id: int = 0) -> Seq2Seq:
        """Build from the ``model`` and ``attention`` config groups; ``attention_cfg`` holds ``name``, an optional
        ``hidden_size`` (default: the decoder size) and the type's own options.
        """
        options = dict(attention_cfg)
        hidden = options.pop("hidden_size", None) or model_cfg["dec_hidden_size"]
        attention = build_attention(options.pop("name"), query_size=model_cfg["dec_hidden_size"],
                                    key_size=2 * model_cfg["enc_hidden_size"], hidden_size=hidden, **options)
        return cls(src_vocab_size, tgt_vocab_size, attention, pad_id=pad_id, **dict(model_cfg))

    def encode(self, src: Tensor, src_lengths: Tensor, fixed_shapes: bool = False) -> tuple[EncoderMemory, Tensor]:
        """src ``[B, S]`` (+EOS, right-padded), src_lengths ``[B]`` -> the memory, initial state ``[L, B, Hd]``;
        ``fixed_shapes`` as for ``Encoder.forward``."""
        enc_out, enc_last = self.encoder(src, src_lengths, fixed_shapes)  # [B, S, 2He], [B, 2He]
        # non_blocking: host lengths (the packed encoder's) are pinned in training, so no wait for the device
        lengths = src_lengths.to(src.device, non_blocking=True)  # [B]
        src_mask = torch.arange(src.shape[1], device=src.device)[None, :] < lengths[:, None]  # [B, S]
        memory = EncoderMemory(enc_out, self.decoder.attention.prepare(enc_out), src_mask)
        return memory, self.decoder.init_state(enc_last)

    def decode_step(self, prev_tokens: Tensor, state: Tensor, memory: EncoderMemory) -> tuple[Tensor, Tensor, Tensor]:
        """prev_tokens ``[B]``, state ``[L, B, Hd]`` -> logits ``[B, V]``, state ``[L, B, Hd]``, weights ``[B, S]``."""
        return self.decoder.step(prev_tokens, state, memory)

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor,
                fixed_shapes: bool = False) -> tuple[Tensor, Tensor]:
        """Teacher-forced pass: src ``[B, S]``, src_lengths ``[B]``, tgt_in ``[B, T]`` -> logits ``[B, T, V]`` and
        attention weights ``[B, T, S]``. ``fixed_shapes``: no host read of the lengths (``Encoder.unpacked``)."""
        memory, state = self.encode(src, src_lengths, fixed_shapes)
        return self.decoder(tgt_in, state, memory)


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters, counting tied matrices once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class SearchModel(nn.Module):
    """A trained ``Seq2Seq`` in eval mode, with the decoder's gate table (``Decoder.gate_table``) derived once and
    passed to every step in the memory; after the weights change, build a new one or call ``refresh``.
    """

    def __init__(self, model: Seq2Seq) -> None:
        super().__init__()
        self.model = model
        self.has_attention, self.vocab_size = model.has_attention, model.vocab_size
        with torch.no_grad():
            self.gate_table = model.decoder.gate_table()  # [V, 3Hd], in the autocast dtype when built under it

    def refresh(self) -> None:
        """The gate table again, in place (its address stays: a captured search step reads it), after the weights
        changed in place; under the autocast it was built with."""
        self.gate_table.copy_(self.model.decoder.gate_table())

    def encode(self, src: Tensor, src_lengths: Tensor) -> tuple[EncoderMemory, Tensor]:
        """As ``Seq2Seq.encode``, with the gate table in the memory."""
        memory, state = self.model.encode(src, src_lengths)
        return replace(memory, gate_table=self.gate_table), state

    def decode_step(self, prev_tokens: Tensor, state: Tensor, memory: EncoderMemory) -> tuple[Tensor, Tensor, Tensor]:
        """As ``Seq2Seq.decode_step``: logits ``[B, V]``, state ``[L, B, Hd]``, weights ``[B, S]``."""
        return self.model.decode_step(prev_tokens, state, memory)
