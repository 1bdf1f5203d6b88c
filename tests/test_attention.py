"""Attention plug-ins: each formula by hand, masking invariants, gradients, config files."""

from __future__ import annotations

import math

import pytest
import torch
from hydra import compose, initialize_config_dir

from nmt.model.attention import attention_names, build_attention, masked_softmax
from nmt.model.seq2seq import Seq2Seq
from tests.conftest import CONFIG_DIR

# Tiny odd sizes so that a transposed or mixed-up dimension fails loudly.
B, S, T, DQ, DK, H = 3, 7, 4, 5, 6, 9
SIZED = {"query_size": DQ, "key_size": DK, "hidden_size": H}
ALL_TYPES = ["additive", "dot", "scaled_dot", "general", "multihead", "none"]


def make(name: str, **kwargs) -> torch.nn.Module:
    options = {"heads": 3} if name == "multihead" else {}
    options.update(kwargs)
    return build_attention(name, **SIZED, **options).double()


def inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(B, DQ, generator=gen, dtype=torch.float64)
    keys = torch.randn(B, S, DK, generator=gen, dtype=torch.float64)
    mask = torch.ones(B, S, dtype=torch.bool)
    mask[1, 4:] = False
    mask[2, 1:] = False
    return query, keys, mask


def softmax_over_valid(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Reference softmax, written the slow obvious way: exp over valid positions / their sum."""
    out = torch.zeros_like(scores)
    for b in range(scores.shape[0]):
        valid = mask[b]
        e = torch.exp(scores[b, valid] - scores[b, valid].max())
        out[b, valid] = e / e.sum()
    return out


def reference_scores(attn: torch.nn.Module, name: str, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Each scoring formula written out by hand with the module's own parameters: [B, S]."""
    scores = torch.zeros(B, S, dtype=torch.float64)
    for b in range(B):
        for i in range(S):
            if name == "additive":
                hidden = attn.query_proj.weight @ q[b] + attn.key_proj.weight @ k[b, i]
                scores[b, i] = attn.energy.weight[0] @ torch.tanh(hidden)
            elif name in ("dot", "scaled_dot"):
                key = k[b, i] if attn.key_proj is None else attn.key_proj.weight @ k[b, i]
                scores[b, i] = q[b] @ key / (math.sqrt(DQ) if name == "scaled_dot" else 1.0)
            elif name == "general":
                scores[b, i] = q[b] @ attn.bilinear.weight @ k[b, i]
    return scores


@pytest.mark.parametrize("name", ["additive", "dot", "scaled_dot", "general"])
def test_single_head_types_match_their_formula(name: str) -> None:
    attn = make(name).eval()
    q, k, mask = inputs()
    context, weights = attn(q, k, k, mask)
    expected_w = softmax_over_valid(reference_scores(attn, name, q, k), mask)
    torch.testing.assert_close(weights, expected_w, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(context, torch.einsum("bs,bsd->bd", expected_w, k), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("chunk_elements", [1, 2 * S * H + 1, 1 << 19])
def test_additive_cpu_decoding_path_matches_formula(chunk_elements: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # without gradients on a CPU the additive score runs in cache-sized pieces with tanh rewritten via
    # sigmoid; pieces of one row, of two rows plus a remainder, and of the whole batch must all agree
    attn = make("additive").eval()
    monkeypatch.setattr(type(attn), "cpu_chunk_elements", chunk_elements)
    q, k, mask = inputs()
    queries = torch.stack([q, q.flip(0) * 2.0], dim=1)  # [B, 2, Dq]: several queries per source
    with torch.no_grad():
        context, weights = attn(queries, k, k, mask)
    for t in range(2):
        expected_w = softmax_over_valid(reference_scores(attn, "additive", queries[:, t], k), mask)
        torch.testing.assert_close(weights[:, t], expected_w, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(context[:, t], torch.einsum("bs,bsd->bd", expected_w, k), rtol=1e-10, atol=1e-12)


def test_dot_has_no_parameters_when_sizes_match() -> None:
    assert sum(p.numel() for p in build_attention("dot", query_size=6, key_size=6, hidden_size=3).parameters()) == 0
    assert build_attention("dot", **SIZED).key_proj is not None


def test_multihead_matches_its_formula() -> None:
    heads = 3
    attn = make("multihead", heads=heads).eval()
    q, k, mask = inputs()
    context, weights = attn(q, k, k, mask)
    hs = H // heads
    wq, wk, wv, wo = attn.query_proj.weight, attn.key_proj.weight, attn.value_proj.weight, attn.out_proj.weight
    expected_ctx = torch.zeros(B, DK, dtype=torch.float64)
    expected_w = torch.zeros(B, S, dtype=torch.float64)
    for b in range(B):
        head_contexts = []
        for h in range(heads):
            rows = slice(h * hs, (h + 1) * hs)
            qh = wq[rows] @ q[b]
            scores = torch.stack([qh @ (wk[rows] @ k[b, i]) / math.sqrt(hs) for i in range(S)])
            w = softmax_over_valid(scores[None], mask[b : b + 1])[0]
            expected_w[b] += w / heads
            head_contexts.append(sum(w[i] * (wv[rows] @ k[b, i]) for i in range(S)))
        expected_ctx[b] = wo @ torch.cat(head_contexts)
    torch.testing.assert_close(weights, expected_w, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(context, expected_ctx, rtol=1e-10, atol=1e-12)


def test_none_gives_zero_width_context() -> None:
    attn = make("none")
    q, k, mask = inputs()
    context, weights = attn(q, k, k, mask)
    assert context.shape == (B, 0)
    assert torch.equal(weights, torch.zeros(B, S, dtype=torch.float64))
    assert attn.context_size(DK) == 0


@pytest.mark.parametrize("name", ALL_TYPES[:-1])
def test_weights_sum_to_one_and_padding_is_exactly_zero(name: str) -> None:
    attn = make(name).eval()
    q, k, mask = inputs(1)
    _, weights = attn(q, k, k, mask)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, dtype=torch.float64))
    assert torch.all(weights[~mask] == 0.0)


@pytest.mark.parametrize("name", ALL_TYPES)
def test_all_padding_row_is_finite_zeros(name: str) -> None:
    attn = make(name).eval()
    q, k, mask = inputs(2)
    mask[0] = False
    context, weights = attn(q, k, k, mask)
    assert torch.isfinite(context).all() and torch.isfinite(weights).all()
    assert torch.all(weights[0] == 0.0)
    if context.shape[-1]:
        assert torch.all(context[0] == 0.0) or name == "multihead"  # multihead: out_proj(0) = 0 too
        assert torch.allclose(context[0], torch.zeros_like(context[0]))


@pytest.mark.parametrize("name", ["dot", "scaled_dot", "additive"])
def test_identical_keys_give_uniform_weights_over_valid_prefix(name: str) -> None:
    attn = build_attention(name, query_size=DK, key_size=DK, hidden_size=H).double().eval()
    q, _, mask = inputs(3)
    q = torch.randn(B, DK, dtype=torch.float64)
    keys = torch.randn(1, 1, DK, dtype=torch.float64).expand(B, S, DK)
    _, weights = attn(q, keys, keys, mask)
    expected = mask.double() / mask.sum(-1, keepdim=True)
    torch.testing.assert_close(weights, expected)


@pytest.mark.parametrize("name", ALL_TYPES[:-1])
def test_gradcheck(name: str) -> None:
    attn = make(name).eval()
    q, k, mask = inputs(4)
    q.requires_grad_(True)
    k = k[:, :4].clone().requires_grad_(True)
    mask = mask[:, :4]

    def fn(query: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return attn(query, keys, keys, mask)

    assert torch.autograd.gradcheck(fn, (q, k), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("name", ALL_TYPES)
def test_many_steps_equal_single_steps_and_prepared_keys(name: str) -> None:
    attn = make(name).eval()
    _, k, mask = inputs(5)
    queries = torch.randn(B, T, DQ, dtype=torch.float64)
    prepared = attn.prepare(k)
    ctx_all, w_all = attn(queries, k, k, mask)
    assert w_all.shape == (B, T, S)
    for t in range(T):
        ctx, w = attn(queries[:, t], k, k, mask, prepared_keys=prepared)
        torch.testing.assert_close(ctx, ctx_all[:, t])
        torch.testing.assert_close(w, w_all[:, t])


def test_masked_softmax_broadcasts_and_handles_empty_rows() -> None:
    scores = torch.randn(2, 3, 5)
    mask = torch.tensor([[True, True, False, False, False], [False] * 5])[:, None, :]
    weights = masked_softmax(scores, mask)
    torch.testing.assert_close(weights[0].sum(-1), torch.ones(3))
    assert torch.all(weights[1] == 0) and torch.all(weights[0, :, 2:] == 0)


def test_unknown_name_and_option_list_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="valid types: additive, dot, general, multihead, none, scaled_dot"):
        build_attention("bahdanau", **SIZED)
    with pytest.raises(ValueError, match=r"valid options: \['dropout', 'heads'\]"):
        build_attention("multihead", **SIZED, head=2)
    with pytest.raises(ValueError, match="not divisible"):
        build_attention("multihead", **SIZED, heads=2)


def test_every_config_file_composes_builds_and_steps() -> None:
    files = sorted(p.stem for p in (CONFIG_DIR / "attention").glob("*.yaml"))
    assert set(ALL_TYPES) <= set(files) and set(files) == set(attention_names())
    model_cfg = {"emb_size": 6, "enc_hidden_size": 5, "dec_hidden_size": 9, "enc_layers": 1,
                 "dec_layers": 2, "dropout": 0.0, "tie_embeddings": True, "output_hidden_size": None,
                 "layer_norm": False}
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        for name in files:
            cfg = compose(config_name="train", overrides=[f"attention={name}"])
            assert cfg.attention.name == name
            if name == "multihead":
                cfg.attention.heads = 3
            model = Seq2Seq.from_config(model_cfg, cfg.attention, src_vocab_size=11, tgt_vocab_size=13).eval()
            src = torch.randint(4, 11, (2, 5))
            memory, state = model.encode(src, torch.tensor([5, 3]))
            logits, state, weights = model.decode_step(torch.tensor([2, 2]), state, memory)
            assert logits.shape == (2, 13) and state.shape == (2, 2, 9) and weights.shape == (2, 5)
            assert torch.isfinite(logits).all()
