"""Encoder-decoder: masking, teacher forcing vs stepping, packing, the GRU cell, tying, parameter counts."""

from __future__ import annotations

import functools

import pytest
import torch

from nmt.model.attention import build_attention
from nmt.model.seq2seq import Encoder, SearchModel, Seq2Seq, count_parameters, gru_cell

TYPES = ["additive", "dot", "scaled_dot", "general", "multihead", "none"]
SRC_V, TGT_V = 17, 19


def tiny_model(name: str, dec_layers: int = 2, enc_layers: int = 2, layer_norm: bool = False) -> Seq2Seq:
    torch.manual_seed(0)
    options = {"heads": 3} if name == "multihead" else {}
    attention = build_attention(name, query_size=9, key_size=10, hidden_size=9, **options)
    model = Seq2Seq(SRC_V, TGT_V, attention, emb_size=7, enc_hidden_size=5, dec_hidden_size=9,
                    enc_layers=enc_layers, dec_layers=dec_layers, dropout=0.1, tie_embeddings=True,
                    output_hidden_size=None, layer_norm=layer_norm)
    return model.double().eval()


def padded_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int], list[int]]:
    """Three sentences of different lengths, right-padded with 0."""
    gen = torch.Generator().manual_seed(1)
    src_lens, tgt_lens = [6, 3, 1], [4, 5, 2]
    src = torch.zeros(3, max(src_lens), dtype=torch.long)
    tgt = torch.zeros(3, max(tgt_lens), dtype=torch.long)
    for i, (s, t) in enumerate(zip(src_lens, tgt_lens)):
        src[i, :s] = torch.randint(4, SRC_V, (s,), generator=gen)
        tgt[i, :t] = torch.randint(4, TGT_V, (t,), generator=gen)
    return src, torch.tensor(src_lens), tgt, src_lens, tgt_lens


@pytest.mark.parametrize("name", TYPES)
def test_padded_batch_equals_each_sentence_alone(name: str) -> None:
    model = tiny_model(name)
    src, src_lengths, tgt, src_lens, tgt_lens = padded_batch()
    logits, attn = model(src, src_lengths, tgt)
    for i, (s, t) in enumerate(zip(src_lens, tgt_lens)):
        alone_logits, alone_attn = model(src[i : i + 1, :s], src_lengths[i : i + 1], tgt[i : i + 1, :t])
        torch.testing.assert_close(logits[i, :t], alone_logits[0], rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(attn[i, :t, :s], alone_attn[0], rtol=1e-9, atol=1e-10)
        assert torch.all(attn[i, :, s:] == 0.0)


@pytest.mark.parametrize("layer_norm", [False, True])
@pytest.mark.parametrize("name", TYPES)
def test_teacher_forced_logits_equal_step_by_step(name: str, layer_norm: bool) -> None:
    model = tiny_model(name, layer_norm=layer_norm)
    src, src_lengths, tgt, _, _ = padded_batch()
    logits, attn = model(src, src_lengths, tgt)
    memory, state = model.encode(src, src_lengths)
    for step in range(tgt.shape[1]):
        step_logits, state, step_attn = model.decode_step(tgt[:, step], state, memory)
        torch.testing.assert_close(step_logits, logits[:, step], rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(step_attn, attn[:, step], rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", TYPES)
def test_decode_step_with_grouped_rows_equals_repeated_memory(name: str) -> None:
    # beam search passes G rows of state per source and one row of memory per source
    model = tiny_model(name)
    src, src_lengths, tgt, _, _ = padded_batch()
    group = 3
    memory, state = model.encode(src, src_lengths)
    repeated = memory.index_select(torch.arange(src.shape[0]).repeat_interleave(group))
    state = state.repeat_interleave(group, dim=1)  # [L, B*G, Hd]
    state = state + 0.1 * torch.randn_like(state)  # the G hypotheses of a source differ
    prev = torch.randint(4, TGT_V, (src.shape[0] * group,))
    with torch.no_grad():
        grouped = model.decode_step(prev, state, memory)
        expected = model.decode_step(prev, state, repeated)
    for got, want in zip(grouped, expected):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)


def test_a_search_model_looks_the_token_gates_up_in_a_table_derived_from_its_weights() -> None:
    # SearchModel passes a [V, 3Hd] gate table to every step; the plain model computes the gates
    model = tiny_model("additive").eval()
    src, src_lengths, tgt, _, _ = padded_batch()
    with torch.no_grad():
        searched = SearchModel(model)
        assert searched.gate_table.shape == (TGT_V, 3 * 9) and searched.vocab_size == TGT_V
        memory, state = searched.encode(src, src_lengths)
        assert memory.gate_table is searched.gate_table
        assert memory.index_select(torch.tensor([1, 0])).gate_table is searched.gate_table
        from_table = searched.decode_step(tgt[:, 0], state, memory)[0]
        plain_memory, plain_state = model.encode(src, src_lengths)
        assert plain_memory.gate_table is None
        computed = model.decode_step(tgt[:, 0], plain_state, plain_memory)[0]
        torch.testing.assert_close(from_table, computed, rtol=1e-12, atol=1e-12)
        model.decoder.emb_gates.bias.add_(0.5)  # new weights: a new SearchModel sees them
        renewed = SearchModel(model)
        assert not torch.allclose(renewed.decode_step(tgt[:, 0], *reversed(renewed.encode(src, src_lengths)))[0],
                                  from_table)

def test_encoder_packing_equals_unpacked_gru_on_unpadded_rows() -> None:
    torch.manual_seed(0)
    encoder = Encoder(SRC_V, 7, 5, num_layers=2, dropout=0.0, pad_id=0).double().eval()
    src, src_lengths, _, src_lens, _ = padded_batch()
    enc_out, last = encoder(src, src_lengths)
    assert enc_out.shape == (3, 6, 10) and last.shape == (3, 10)
    for i, s in enumerate(src_lens):
        alone, _ = encoder.rnn(encoder.embedding(src[i : i + 1, :s]))  # no padding: no packing needed
        torch.testing.assert_close(enc_out[i, :s], alone[0])
        torch.testing.assert_close(last[i], torch.cat([alone[0, -1, :5], alone[0, 0, 5:]]))
        assert torch.all(enc_out[i, s:] == 0)


def test_gru_cell_equals_torch_grucell() -> None:
    torch.manual_seed(0)
    cell = torch.nn.GRUCell(6, 8).double()
    x, h = torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 8, dtype=torch.float64)
    gates = torch.nn.functional.linear(x, cell.weight_ih, cell.bias_ih)
    torch.testing.assert_close(gru_cell(gates, h, cell.weight_hh, cell.bias_hh), cell(x, h))


def test_tied_embeddings_share_one_matrix_and_untied_do_not() -> None:
    tied = tiny_model("additive")
    assert tied.decoder.output.weight is tied.decoder.embedding.weight
    attention = build_attention("additive", query_size=9, key_size=10, hidden_size=9)
    untied = Seq2Seq(SRC_V, TGT_V, attention, emb_size=7, enc_hidden_size=5, dec_hidden_size=9,
                     enc_layers=1, dec_layers=1, dropout=0.1, tie_embeddings=False, output_hidden_size=None,
                     layer_norm=False)
    assert untied.decoder.output.weight is not untied.decoder.embedding.weight
    assert count_parameters(untied) == count_parameters(tied.float()) + TGT_V * 7 - _layer_diff()


def _layer_diff() -> int:
    """Parameters of the extra encoder and decoder layers in tiny_model (2 layers) vs the 1-layer default."""
    enc_layer2 = 2 * (3 * 5 * 10 + 3 * 5 * 5 + 2 * 3 * 5)  # both directions, input 2He=10
    dec_layer2 = 3 * 9 * 9 * 2 + 2 * 3 * 9  # GRUCell(9, 9)
    bridge_extra = 10 * 9 + 9
    return enc_layer2 + dec_layer2 + bridge_extra


def test_none_model_has_no_attention_and_learns_from_final_state() -> None:
    model = tiny_model("none")
    assert not model.has_attention and tiny_model("dot").has_attention
    src, src_lengths, tgt, _, _ = padded_batch()
    logits, attn = model(src, src_lengths, tgt)
    assert torch.all(attn == 0)
    logits.sum().backward()
    assert model.encoder.embedding.weight.grad.abs().sum() > 0  # gradient reaches the encoder via the bridge


def test_default_model_parameter_count() -> None:
    from hydra import compose, initialize_config_dir

    from tests.conftest import CONFIG_DIR

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train")
    model = Seq2Seq.from_config(cfg.model, cfg.attention, 8000, 8000)
    embeddings = 2 * 8000 * 256  # source + target; the output matrix is tied to the target side
    encoder = 2 * (3 * 256 * 256 + 3 * 256 * 256 + 2 * 3 * 256)  # two directions
    bridge = 512 * 512 + 512
    decoder_gru = (3 * 512 * 256 + 3 * 512) + 3 * 512 * 512 + (3 * 512 * 512 + 3 * 512)  # emb, ctx, hidden
    additive = 512 * 512 + 512 * 512 + 512
    deep_output = (512 + 512 + 256) * 256 + 256
    expected = embeddings + encoder + bridge + decoder_gru + additive + deep_output
    assert expected == 7_970_048
    assert count_parameters(model) == expected


def test_the_joeynmt_shaped_output_is_untied_and_wider() -> None:
    from hydra import compose, initialize_config_dir

    from nmt.train.schema import validate_config
    from tests.conftest import CONFIG_DIR

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["model.tie_embeddings=false", "model.output_hidden_size=512"])
        validate_config(cfg)
        mismatched = compose(config_name="train", overrides=["model.output_hidden_size=512"])
    model = Seq2Seq.from_config(cfg.model, cfg.attention, 8000, 8000)
    assert model.decoder.pre_output.out_features == 512 and model.decoder.output.in_features == 512
    # against the default (7,970,048): the deep output layer 256 -> 512 wide, plus an untied 512 x V matrix
    assert count_parameters(model) == 7_970_048 + (512 + 512 + 256 + 1) * 256 + 512 * 8000
    with pytest.raises(ValueError, match=r"tied embeddings need output_hidden_size \(512\) = emb_size \(256\)"):
        Seq2Seq.from_config(mismatched.model, mismatched.attention, 8000, 8000)
    with pytest.raises(ValueError, match="model.output_hidden_size=512 needs model.tie_embeddings=false"):
        validate_config(mismatched)  # before any work starts


def test_the_layer_normalised_gru_normalises_each_gate_on_its_own() -> None:
    from nmt.model.seq2seq import GateNorm

    norm = GateNorm(4).double()
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([[1.0] * 4, [2.0] * 4, [3.0] * 4]))
    gates = torch.randn(5, 12, dtype=torch.float64) * 7 + 3
    out = norm(gates).view(5, 3, 4)
    assert torch.allclose(out.mean(-1), torch.zeros(5, 3, dtype=torch.float64), atol=1e-12)
    torch.testing.assert_close(out.std(-1, unbiased=False), torch.tensor([1.0, 2.0, 3.0]).double().expand(5, 3),
                               rtol=1e-4, atol=1e-4)  # each gate alone: mean 0, its own gain
    model = tiny_model("additive", layer_norm=True)
    assert count_parameters(model) == count_parameters(tiny_model("additive")) + 2 * 2 * 3 * 9
    # step-by-step decoding equals training's teacher forcing: test_teacher_forced_logits_equal_step_by_step


def test_the_compiled_training_step_computes_what_the_eager_one_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """``compile_step`` traces the per-step body with dynamo (the eager backend: no C++ compiler needed here)."""
    torch._dynamo.reset()
    model, compiled = tiny_model("additive"), tiny_model("additive")
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    compiled.decoder.compile_step()
    src, src_lengths, tgt, _, _ = padded_batch()
    for length in (tgt.shape[1], 3):  # a second target length: dynamic shapes, no recompile needed
        expected, got = model(src, src_lengths, tgt[:, :length]), compiled(src, src_lengths, tgt[:, :length])
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-10)
        expected[0].sum().backward()
        got[0].sum().backward()
        for (name, a), b in zip(model.named_parameters(), compiled.parameters()):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-9, atol=1e-10, msg=name)
    assert "_forward_step" in vars(compiled.decoder)  # the instance now calls the compiled wrapper
