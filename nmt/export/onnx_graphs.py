"""The three ONNX graphs of a model: the encoder, the attention's key preparation, and one decoder step
(``SearchModel.decode_step`` then a log-softmax, and each row's ``top_k`` best tokens), so a runtime's search
needs no PyTorch.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.data import BOS_ID, EOS_ID, PAD_ID
from nmt.model.seq2seq import EncoderMemory, SearchModel

OPSET = 17  # LayerNormalization (a layer-normalised decoder) is an ONNX op from opset 17 on


class EncoderGraph(nn.Module):
    """src ``[B, S]`` int64, src_lengths ``[B]`` int64 -> enc_out ``[B, S, 2He]``, decoder state ``[L, B, Hd]``."""

    def __init__(self, model: SearchModel) -> None:
        super().__init__()
        self.model = model.model

    def forward(self, src: Tensor, src_lengths: Tensor) -> tuple[Tensor, Tensor]:
        enc_out, enc_last = self.model.encoder(src, src_lengths)  # [B, S, 2He], [B, 2He]
        return enc_out, self.model.decoder.init_state(enc_last)  # [L, B, Hd]


class PrepareGraph(nn.Module):
    """enc_out ``[B, S, 2He]`` -> prepared keys (``Attention.prepare``, e.g. ``[B, S, H]``)."""

    def __init__(self, model: SearchModel) -> None:
        super().__init__()
        self.attention = model.model.decoder.attention

    def forward(self, enc_out: Tensor) -> Tensor:
        # "* 1.0" keeps an identity preparation (dot attention with equal sizes) a graph with one node
        return self.attention.prepare(enc_out) * 1.0


class StepGraph(nn.Module):
    """One decoder step over R = G * B rows (G hypotheses per source, consecutive): prev_tokens ``[R]`` int64, state
    ``[L, R, Hd]``, enc_out ``[B, S, 2He]``, prepared_keys, src_mask ``[B, S]`` bool -> log_probs ``[R, V]`` (the
    full distribution), state ``[L, R, Hd]``. ``_add_top_k`` then adds an input ``top_k`` ``[1]`` and the outputs
    ``top_log_probs`` and ``top_tokens`` ``[R, top_k]``.
    """

    def __init__(self, model: SearchModel) -> None:
        super().__init__()
        self.search_model = model

    def forward(self, prev_tokens: Tensor, state: Tensor, enc_out: Tensor, prepared_keys: Tensor,
                src_mask: Tensor) -> tuple[Tensor, Tensor]:
        memory = EncoderMemory(enc_out, prepared_keys, src_mask, self.search_model.gate_table)
        logits, new_state, _ = self.search_model.decode_step(prev_tokens, state, memory)  # [R, V], [L, R, Hd]
        return F.log_softmax(logits.float(), dim=-1), new_state


def _example_inputs(model: SearchModel) -> dict[str, tuple[Tensor, ...]]:
    """Inputs to trace with: 2 sources of lengths 5 and 3, 2 hypotheses each. No traced dimension may be 1 (the
    tracer would fix it), and G = 2 traces the decoder's beam-row path (``Decoder._attend``).
    """
    src = torch.tensor([[4, 5, 6, 7, EOS_ID], [8, 9, EOS_ID, PAD_ID, PAD_ID]])  # [2, 5]
    src_lengths = torch.tensor([5, 3])
    with torch.no_grad():
        memory, state = model.encode(src, src_lengths)  # state [L, 2, Hd]
    # the step: prev_tokens [4] and state [L, 4, Hd], each source's 2 hypotheses in consecutive rows
    return {"encoder": (src, src_lengths), "prepare": (memory.enc_out,),
            "step": (torch.tensor([4, 5, 6, 7]), state.repeat_interleave(2, dim=1), memory.enc_out,
                     memory.prepared_keys, memory.src_mask)}


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """File descriptor 2 to /dev/null: the exporter's C++ shape-inference warnings about ``PackPadded`` (the packed
    encoder GRU; its graph is right, as the parity tests show) would otherwise be all a user sees of an export."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _signatures(prepared_shape: torch.Size) -> dict[str, tuple[list[str], list[str], dict[str, dict[int, str]]]]:
    """Per graph: input names, output names, and the dynamic axes (the same names across graphs). The prepared keys'
    source-length axis is where this attention puts it: the first axis after the batch of size 5 (``[2, 5, ...]``,
    or ``[2, 2, 5, hidden]`` for multihead's stacked keys and values).
    """
    source, prepared = {0: "batch", 1: "src_len"}, {0: "batch", list(prepared_shape).index(5, 1): "src_len"}
    return {
        "encoder": (["src", "src_lengths"], ["enc_out", "state"],
                    {"src": source, "src_lengths": {0: "batch"}, "enc_out": source, "state": {1: "batch"}}),
        "prepare": (["enc_out"], ["prepared_keys"], {"enc_out": source, "prepared_keys": prepared}),
        "step": (["prev_tokens", "state", "enc_out", "prepared_keys", "src_mask"], ["log_probs", "new_state"],
                 {"prev_tokens": {0: "rows"}, "state": {1: "rows"}, "enc_out": source, "src_mask": source,
                  "log_probs": {0: "rows"}, "new_state": {1: "rows"}, "prepared_keys": prepared}),
    }


def export_graphs(model: SearchModel, folder: Path, prefix: str = "") -> dict[str, str]:
    """Write the three graphs of ``model`` (float32, CPU, eval mode) as ``<prefix><name>.onnx`` into ``folder``;
    returns graph name -> file name.
    """
    modules = {"encoder": EncoderGraph(model), "prepare": PrepareGraph(model), "step": StepGraph(model)}
    examples = _example_inputs(model)
    signatures = _signatures(examples["step"][3].shape)
    files = {name: f"{prefix}{name}.onnx" for name in modules}
    # Grad mode on while tracing: under no_grad on a CPU additive attention scores in a Python loop over
    # row chunks (AdditiveAttention._score_in_chunks), which a trace would unroll for the example's batch.
    with warnings.catch_warnings(), torch.enable_grad(), _native_stderr_silenced():
        warnings.simplefilter("ignore")  # tracer warnings about shapes: the parity tests judge the graphs
        for name, module in modules.items():
            inputs, outputs, axes = signatures[name]
            # dynamo=False: the dynamo exporter writes nn.GRU with the wrong linear_before_reset
            # (pytorch#189225) and breaks RNN graphs (pytorch#118740).
            torch.onnx.export(module, examples[name], str(folder / files[name]), dynamo=False,
                              input_names=inputs, output_names=outputs, dynamic_axes=axes, opset_version=OPSET)
    _add_top_k(folder / files["step"], model.vocab_size)
    return files


def _add_top_k(path: Path, vocab: int) -> None:
    """Give the step graph at ``path`` an input ``top_k`` ``[1]`` int64 and two outputs, ``top_log_probs`` and
    ``top_tokens``: for ``top_k`` > 0 each row's ``top_k`` largest log-probabilities with PAD and BOS blocked (-inf)
    and their tokens, ``[R, top_k]``, largest first (ONNX ``TopK``: among equal values the lower token first), so
    that a beam search reads 2K candidates per row instead of V log-probabilities; for ``top_k`` = 0 nothing
    (``[0, 0]``: an ``If`` skips the ``TopK`` for a search that reads ``log_probs``). The values are the
    ``log_probs`` entries themselves (``+ 0``), so a search on them picks what one on ``log_probs`` does.
    """
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def values_and_indices(values: str, indices: str, shape: list[int | None]) -> list[onnx.ValueInfoProto]:
        return [helper.make_tensor_value_info(values, TensorProto.FLOAT, shape),
                helper.make_tensor_value_info(indices, TensorProto.INT64, shape)]

    model = onnx.load(str(path))
    graph = model.graph
    blocked = np.zeros(vocab, dtype=np.float32)
    blocked[[PAD_ID, BOS_ID]] = -np.inf
    graph.initializer.extend([numpy_helper.from_array(blocked, "blocked_tokens"),
                              numpy_helper.from_array(np.zeros(1, dtype=np.int64), "zero_k")])
    graph.input.append(helper.make_tensor_value_info("top_k", TensorProto.INT64, [1]))
    with_top_k = helper.make_graph([
        helper.make_node("Add", ["log_probs", "blocked_tokens"], ["log_probs_blocked"], name="BlockTokens"),
        helper.make_node("TopK", ["log_probs_blocked", "top_k"], ["top_values", "top_indices"], name="RowTopK",
                         axis=-1, largest=1, sorted=1),
    ], "with_top_k", [], values_and_indices("top_values", "top_indices", [None, None]))
    empty = [numpy_helper.from_array(np.zeros((0, 0), dtype=dtype), name)
             for dtype, name in ((np.float32, "no_values"), (np.int64, "no_indices"))]
    without = helper.make_graph([helper.make_node("Constant", [], [tensor.name], value=tensor) for tensor in empty],
                                "without_top_k", [], values_and_indices("no_values", "no_indices", [0, 0]))
    graph.node.extend([
        helper.make_node("Greater", ["top_k", "zero_k"], ["wants_top_k"], name="WantsTopK"),
        helper.make_node("If", ["wants_top_k"], ["top_log_probs", "top_tokens"], name="TopKIfAsked",
                         then_branch=with_top_k, else_branch=without),
    ])
    graph.output.extend(values_and_indices("top_log_probs", "top_tokens", [None, None]))
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
