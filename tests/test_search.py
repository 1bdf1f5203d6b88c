"""Search: greedy, sampling and batched beam search on tiny models (odd sizes, padding, several attentions)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from nmt.data import BOS_ID, EOS_ID, PAD_ID
from nmt.model.attention import build_attention
from nmt.model.search import (
    LateFlag,
    _row_top_k,
    beam_search,
    best_candidates,
    greedy_search,
    length_limits,
    length_penalty_factor,
    sample_search,
)
from nmt.model.seq2seq import EncoderMemory, Seq2Seq

SRC_V, TGT_V = 17, 23
TYPES = ["additive", "general", "none"]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    # tiny models gain nothing from threads, and on shared cores OpenMP spin-waits cost seconds
    torch.set_num_threads(1)


class EosBiased(nn.Module):
    """A tiny model whose EOS logit is raised, so hypotheses end at different lengths."""

    def __init__(self, model: Seq2Seq, eos_bias: float) -> None:
        super().__init__()
        self.model = model
        self.eos_bias = eos_bias
        self.has_attention = model.has_attention

    def encode(self, src: Tensor, src_lengths: Tensor) -> tuple[EncoderMemory, Tensor]:
        return self.model.encode(src, src_lengths)

    def decode_step(self, prev: Tensor, state: Tensor, memory: EncoderMemory) -> tuple[Tensor, Tensor, Tensor]:
        logits, state, attn = self.model.decode_step(prev, state, memory)
        logits = logits.clone()
        logits[:, EOS_ID] += self.eos_bias
        return logits, state, attn


def tiny_model(name: str = "additive", eos_bias: float = 1.0, seed: int = 0) -> EosBiased:
    torch.manual_seed(seed)
    attention = build_attention(name, query_size=9, key_size=10, hidden_size=7)
    model = Seq2Seq(SRC_V, TGT_V, attention, emb_size=5, enc_hidden_size=5, dec_hidden_size=9,
                    enc_layers=1, dec_layers=2, dropout=0.0, tie_embeddings=True,
                    output_hidden_size=None, layer_norm=False)
    # larger weights than the init give peaked, sentence-dependent distributions
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return EosBiased(model.double().eval(), eos_bias)


def batch(lengths: list[int], seed: int = 1) -> tuple[Tensor, Tensor]:
    """Random sources of the given lengths (EOS included), right-padded."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD_ID, dtype=torch.long)
    for i, n in enumerate(lengths):
        src[i, : n - 1] = torch.randint(4, SRC_V, (n - 1,), generator=gen)
        src[i, n - 1] = EOS_ID
    return src, torch.tensor(lengths)


LENGTHS = [6, 3, 8, 1, 5, 4, 7]


def teacher_forced_logprob(model: EosBiased, src: Tensor, src_lengths: Tensor, tokens: list[int],
                           with_eos: bool) -> float:
    """Sum of log-probs of ``tokens`` (+ EOS) under step-by-step decoding of one sentence."""
    memory, state = model.encode(src, src_lengths)
    prev = torch.tensor([BOS_ID])
    total = 0.0
    for token in tokens + ([EOS_ID] if with_eos else []):
        logits, state, _ = model.decode_step(prev, state, memory)
        total += torch.log_softmax(logits.float(), -1)[0, token].item()
        prev = torch.tensor([token])
    return total


def test_length_limits() -> None:
    lengths = torch.tensor([1, 10, 100])
    assert length_limits(lengths, 50, None) == [50, 50, 50]
    assert length_limits(lengths, 50, 1.5) == [7, 20, 50]
    assert length_penalty_factor(torch.tensor([1.0]), 0.0).item() == 1.0
    assert length_penalty_factor(torch.tensor([7.0]), 1.0).item() == pytest.approx(2.0)


def test_not_keeping_attention_changes_nothing_else() -> None:
    model = tiny_model("additive")
    src, src_lengths = batch(LENGTHS)
    for keep in (True, False):
        greedy = greedy_search(model, src, src_lengths, max_len=12, max_len_ratio=1.0, keep_attention=keep)
        beam = beam_search(model, src, src_lengths, 3, 1.0, 12, 1.0, 3, keep_attention=keep)
        if keep:
            kept_greedy, kept_beam = greedy, beam
            continue
        assert [(h.tokens, h.score) for h in greedy] == [(h.tokens, h.score) for h in kept_greedy]
        assert [[(h.tokens, h.score) for h in n] for n in beam] == [[(h.tokens, h.score) for h in n] for n in kept_beam]
        assert all(h.attention is None for h in greedy) and all(h.attention is None for n in beam for h in n)
        assert all(h.attention is not None for h in kept_greedy)


def as_tuples(hyps: list) -> list:
    return [(h.tokens, h.score, None if h.attention is None else h.attention.tolist()) for h in hyps]


@pytest.mark.parametrize("lag", [1, 3, 8])
def test_learning_late_that_rows_are_done_changes_no_output(lag: int) -> None:
    """On a GPU the search learns that rows are done a few steps late (``LateFlag``), never stalling the device;
    the extra steps change nothing: the same tokens, scores and attention as checking at once."""
    model = tiny_model("additive", eos_bias=2.0)
    src, src_lengths = batch(LENGTHS)
    greedy = [greedy_search(model, src, src_lengths, 12, 1.0, lag=late) for late in (0, lag)]
    assert as_tuples(greedy[0]) == as_tuples(greedy[1])
    for k, n_best in ((1, 1), (3, 3), (4, 2)):
        beams = [beam_search(model, src, src_lengths, k, 1.0, 12, 1.0, n_best, lag=late) for late in (0, lag)]
        assert [as_tuples(n) for n in beams[0]] == [as_tuples(n) for n in beams[1]]
    assert len({len(h.tokens) for h in greedy[0]}) > 2  # rows end at different steps


def test_a_late_flag_is_read_after_its_lag_and_forgets_on_reset() -> None:
    flag = LateFlag(torch.device("cpu"), lag=2)
    flag.post(torch.tensor(False))
    flag.post(torch.tensor(True))
    assert not flag.seen()  # nothing landed yet
    flag.post(torch.tensor(False))
    assert not flag.seen()  # the first (False) landed
    flag.post(torch.tensor(False))
    assert flag.seen()  # the True landed
    flag.post(torch.tensor(True))
    flag.reset()
    flag.post(torch.tensor(False))
    flag.post(torch.tensor(False))
    flag.post(torch.tensor(False))
    assert not flag.seen()


@pytest.mark.parametrize("name", TYPES)
def test_beam_one_equals_greedy(name: str) -> None:
    model = tiny_model(name)
    src, src_lengths = batch(LENGTHS)
    greedy = greedy_search(model, src, src_lengths, max_len=12, max_len_ratio=1.0)
    beam = beam_search(model, src, src_lengths, 1, 1.0, 12, 1.0, 1)
    assert [h.tokens for h in greedy] == [b[0].tokens for b in beam]
    assert len({len(h.tokens) for h in greedy}) > 2  # the test covers EOS at different steps
    for g, (b,) in zip(greedy, beam):
        if g.attention is None:
            assert b.attention is None and not model.has_attention
        else:
            torch.testing.assert_close(g.attention, b.attention)


def test_greedy_scores_attention_and_limits() -> None:
    model = tiny_model()
    src, src_lengths = batch(LENGTHS)
    limits = length_limits(src_lengths, 9, 1.0)
    for i, hyp in enumerate(greedy_search(model, src, src_lengths, max_len=9, max_len_ratio=1.0)):
        assert len(hyp.tokens) <= limits[i]
        assert all(t not in (PAD_ID, BOS_ID, EOS_ID) for t in hyp.tokens)
        ended = len(hyp.tokens) < limits[i]
        n = LENGTHS[i]
        expected = teacher_forced_logprob(model, src[i : i + 1, :n], src_lengths[i : i + 1], hyp.tokens, ended)
        assert hyp.score == pytest.approx(expected, abs=1e-5)
        assert hyp.attention.shape == (len(hyp.tokens), n)
        torch.testing.assert_close(hyp.attention.sum(-1), torch.ones(len(hyp.tokens)))


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_beam_scores_are_length_penalised_logprobs(alpha: float) -> None:
    model = tiny_model()
    src, src_lengths = batch(LENGTHS)
    limits = length_limits(src_lengths, 10, None)
    results = beam_search(model, src, src_lengths, beam_size=4, length_penalty=alpha, max_len=10, max_len_ratio=None,
                          n_best=4)
    for i, nbest in enumerate(results):
        n = LENGTHS[i]
        for hyp in nbest:
            ended = len(hyp.tokens) < limits[i]
            logprob = teacher_forced_logprob(model, src[i : i + 1, :n], src_lengths[i : i + 1], hyp.tokens, ended)
            steps = len(hyp.tokens) + int(ended)
            assert hyp.score == pytest.approx(logprob / ((5 + steps) / 6) ** alpha, abs=1e-5)
            assert hyp.attention.shape == (len(hyp.tokens), n)


def test_nbest_sorted_and_first_is_one_best() -> None:
    model = tiny_model(eos_bias=0.5)
    src, src_lengths = batch(LENGTHS)
    one_best = beam_search(model, src, src_lengths, 5, 1.0, 10, None, 1)
    n_best = beam_search(model, src, src_lengths, 5, 1.0, 10, None, 5)
    for one, many in zip(one_best, n_best):
        assert len(one) == 1 and 1 < len(many) <= 5
        scores = [h.score for h in many]
        assert scores == sorted(scores, reverse=True)
        assert many[0].tokens == one[0].tokens
        assert len({tuple(h.tokens) for h in many}) == len(many)  # distinct hypotheses


@pytest.mark.parametrize("beam_size", [1, 3])
def test_batch_equals_one_by_one(beam_size: int) -> None:
    model = tiny_model("general")
    src, src_lengths = batch(LENGTHS)
    n_best = 2 if beam_size > 1 else 1
    together = beam_search(model, src, src_lengths, beam_size, 1.0, 10, 1.5, n_best)
    for i, n in enumerate(LENGTHS):
        alone = beam_search(model, src[i : i + 1, :n], src_lengths[i : i + 1], beam_size, 1.0, 10, 1.5, n_best)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in together[i]]
        for a, t in zip(alone, together[i]):
            assert a.score == pytest.approx(t.score, abs=1e-6)
            torch.testing.assert_close(a.attention, t.attention)
        greedy_alone = greedy_search(model, src[i : i + 1, :n], src_lengths[i : i + 1], 10, None)[0]
        greedy_all = greedy_search(model, src, src_lengths, 10, None)[i]
        assert greedy_alone.tokens == greedy_all.tokens


def test_beam_never_worse_than_greedy_without_penalty_on_average() -> None:
    model = tiny_model(eos_bias=0.0)
    src, src_lengths = batch(LENGTHS)
    greedy = greedy_search(model, src, src_lengths, 8, None)
    beam = beam_search(model, src, src_lengths, 6, 0.0, 8, None, 1)
    assert sum(b[0].score for b in beam) >= sum(g.score for g in greedy) - 1e-6


def reference_beam_search(model: EosBiased, src: Tensor, src_lengths: Tensor, k: int, alpha: float,
                          limit: int, n_best: int) -> list[tuple[list[int], float]]:
    """The same search for one sentence, written the slow obvious way: Python lists, one row per step.

    Each step: all K x V extensions scored, the 2K best taken; an EOS among the first K finishes a
    hypothesis, the K best non-EOS continue; done after K EOS-finished hypotheses, or at the limit
    (where the live ones are finished as they are). Returns the n_best (tokens, score), best first.
    """
    memory, state = model.encode(src, src_lengths)
    beams = [(0.0, [], state)]  # (summed log-prob, tokens, decoder state)
    finished, n_eos = [], 0
    for step in range(limit):
        penalty = ((5 + step + 1) / 6) ** alpha
        candidates = []
        for logprob, tokens, beam_state in beams:
            prev = torch.tensor([tokens[-1] if tokens else BOS_ID])
            logits, new_state, _ = model.decode_step(prev, beam_state, memory)
            step_lp = torch.log_softmax(logits[0].double(), -1)
            step_lp[[PAD_ID, BOS_ID]] = -math.inf
            candidates += [(logprob + step_lp[v].item(), tokens, v, new_state) for v in range(TGT_V)]
        top = sorted(candidates, key=lambda c: -c[0])[: 2 * k]
        for score, tokens, token, _ in top[:k]:
            if token == EOS_ID and score > -math.inf:
                finished.append((tokens, score / penalty))
                n_eos += 1
        beams = [(score, tokens + [token], st) for score, tokens, token, st in top if token != EOS_ID][:k]
        if step + 1 >= limit and n_eos < k:
            finished += [(tokens, score / penalty) for score, tokens, _ in beams if score > -math.inf]
        if n_eos >= k:
            break
    return sorted(finished, key=lambda f: -f[1])[:n_best]


@pytest.mark.parametrize(("name", "alpha"), [("additive", 1.0), ("general", 0.0), ("none", 0.6)])
def test_beam_equals_slow_reference(name: str, alpha: float) -> None:
    # sentences finish at different steps, so the batch shrinks while the others go on
    model = tiny_model(name, eos_bias=0.8)
    src, src_lengths = batch(LENGTHS)
    limits = length_limits(src_lengths, 9, 1.5)
    results = beam_search(model, src, src_lengths, beam_size=3, length_penalty=alpha, max_len=9,
                          max_len_ratio=1.5, n_best=3)
    for i, n in enumerate(LENGTHS):
        expected = reference_beam_search(model, src[i : i + 1, :n], src_lengths[i : i + 1], 3, alpha, limits[i], 3)
        assert [h.tokens for h in results[i]] == [tokens for tokens, _ in expected]
        assert [h.score for h in results[i]] == pytest.approx([score for _, score in expected], abs=1e-5)


@pytest.mark.parametrize(("width", "k"), [(8000, 10), (8003, 10), (3000, 2), (500, 10)])
def test_row_top_k_equals_topk(width: int, k: int) -> None:
    # widths: a multiple of the block, a padded last block, and narrow enough for the plain topk
    gen = torch.Generator().manual_seed(width)
    values = torch.randn(37, width, generator=gen) * 4
    values[:, :2] = float("-inf")  # blocked tokens, as in the search
    expected_values, expected_columns = values.topk(k, dim=1)
    top_values, columns = _row_top_k(values, k)
    assert torch.equal(top_values, expected_values)
    assert torch.equal(columns, expected_columns)


@pytest.mark.parametrize("scale", [4.0, 1000.0])
def test_best_candidates_equal_log_softmax_reference(scale: float) -> None:
    # logits far beyond exp's float range (scale 1000) and a blocked token holding a row's largest logit
    gen = torch.Generator().manual_seed(7)
    n_active, k, vocab = 6, 3, 8003
    logits = torch.randn(n_active * k, vocab, generator=gen) * scale
    logits[0, PAD_ID] = logits[0].max() + 5.0
    beam_score = torch.randn(n_active, k, generator=gen)
    beam_score[1, 2] = float("-inf")  # an empty slot
    blocked = torch.tensor([PAD_ID, BOS_ID])
    log_probs = torch.log_softmax(logits, dim=1).index_fill(1, blocked, float("-inf"))  # [A*K, V]
    expected = (beam_score.view(-1, 1) + log_probs).view(n_active, k * vocab).topk(2 * k, dim=1)
    scores, slots, tokens = best_candidates(logits.clone(), beam_score, blocked)
    assert torch.allclose(scores, expected.values, rtol=1e-5, atol=1e-3 * max(1.0, scale / 100))
    assert torch.equal(slots * vocab + tokens, expected.indices)


def test_beam_with_block_top_k_equals_plain_topk(monkeypatch: pytest.MonkeyPatch) -> None:
    # a vocabulary wide enough for the block-wise path; the tiny models' 23 words take the plain one
    torch.manual_seed(3)
    attention = build_attention("additive", query_size=9, key_size=10, hidden_size=7)
    wide = Seq2Seq(SRC_V, 3001, attention, emb_size=5, enc_hidden_size=5, dec_hidden_size=9, enc_layers=1,
                   dec_layers=1, dropout=0.0, tie_embeddings=True, output_hidden_size=None,
                   layer_norm=False).eval()
    with torch.no_grad():
        wide.decoder.output.weight.mul_(20.0)  # peaked distributions, so the hypotheses differ by sentence
    src, src_lengths = batch(LENGTHS)
    block_wise = beam_search(wide, src, src_lengths, 5, 1.0, 8, None, 5)
    monkeypatch.setattr("nmt.model.search._row_top_k", lambda values, k: values.topk(k, dim=1))
    plain = beam_search(wide, src, src_lengths, 5, 1.0, 8, None, 5)
    assert [[h.tokens for h in hyps] for hyps in block_wise] == [[h.tokens for h in hyps] for hyps in plain]
    assert [[h.score for h in hyps] for hyps in block_wise] == [[h.score for h in hyps] for hyps in plain]


class Recording(EosBiased):
    """``EosBiased`` that keeps every step's logits ``[B, V]``, to check what sampling drew from."""

    def __init__(self, model: Seq2Seq, eos_bias: float) -> None:
        super().__init__(model, eos_bias)
        self.steps: list[Tensor] = []

    def decode_step(self, prev: Tensor, state: Tensor, memory: EncoderMemory) -> tuple[Tensor, Tensor, Tensor]:
        logits, state, attn = super().decode_step(prev, state, memory)
        self.steps.append(logits.detach().clone())
        return logits, state, attn


def sample(model: nn.Module, seed: int, temperature: float = 1.0, top_k: int = 0, max_len: int = 12) -> list:
    src, src_lengths = batch(LENGTHS)
    return sample_search(model, src, src_lengths, max_len, 1.0, temperature, top_k,
                         torch.Generator().manual_seed(seed))


def test_sampling_is_reproducible_from_its_seed() -> None:
    model = tiny_model(eos_bias=0.0)
    first, again, other = sample(model, 7, 1.5), sample(model, 7, 1.5), sample(model, 8, 1.5)
    assert [(h.tokens, h.score) for h in first] == [(h.tokens, h.score) for h in again]
    assert [h.tokens for h in first] != [h.tokens for h in other]
    greedy = greedy_search(model, *batch(LENGTHS), max_len=12, max_len_ratio=1.0)
    assert [h.tokens for h in first] != [h.tokens for h in greedy]  # it does sample


@pytest.mark.parametrize("name", TYPES)
def test_sampling_top_1_is_greedy(name: str) -> None:
    model = tiny_model(name)
    greedy = greedy_search(model, *batch(LENGTHS), max_len=12, max_len_ratio=1.0)
    for temperature in (0.5, 2.0):
        sampled = sample(model, 3, temperature, top_k=1)
        assert [h.tokens for h in sampled] == [h.tokens for h in greedy]
        assert [h.score for h in sampled] == pytest.approx([h.score for h in greedy])  # the model's log-probs


@pytest.mark.parametrize("top_k", [2, 4])
def test_sampled_tokens_come_from_the_top_k(top_k: int) -> None:
    torch.manual_seed(0)
    attention = build_attention("additive", query_size=9, key_size=10, hidden_size=7)
    inner = Seq2Seq(SRC_V, TGT_V, attention, emb_size=5, enc_hidden_size=5, dec_hidden_size=9, enc_layers=1,
                    dec_layers=2, dropout=0.0, tie_embeddings=True, output_hidden_size=None,
                    layer_norm=False).double().eval()  # flat: any token could come
    model = Recording(inner, eos_bias=0.0)
    hyps = sample(model, 0, temperature=3.0, top_k=top_k)
    for step, logits in enumerate(model.steps):
        logits = logits.float().index_fill(1, torch.tensor([PAD_ID, BOS_ID]), float("-inf"))
        allowed = logits.topk(top_k, dim=1).indices  # [B, k]
        for row, hyp in enumerate(hyps):
            if step < len(hyp.tokens):
                assert hyp.tokens[step] in allowed[row].tolist()
    drawn = {t for h in hyps for t in h.tokens}
    assert len(drawn) > top_k  # not the same few tokens everywhere: the check is not vacuous


def test_sampling_scores_are_the_models_log_probabilities() -> None:
    model = tiny_model()
    src, src_lengths = batch(LENGTHS)
    limits = length_limits(src_lengths, 12, 1.0)
    for i, hyp in enumerate(sample(model, 5, temperature=2.0, top_k=5)):
        n = LENGTHS[i]
        ended = len(hyp.tokens) < limits[i]
        expected = teacher_forced_logprob(model, src[i : i + 1, :n], src_lengths[i : i + 1], hyp.tokens, ended)
        assert hyp.score == pytest.approx(expected, abs=1e-5)
        assert all(t not in (PAD_ID, BOS_ID, EOS_ID) for t in hyp.tokens)


def test_a_one_token_limit_still_scores() -> None:
    # the options' ranges are checked once, by SearchOptions (test_translator); here the smallest limit
    model = tiny_model()
    src, src_lengths = batch([3])
    assert math.isfinite(beam_search(model, src, src_lengths, 2, 1.0, 1, None, 1)[0][0].score)


def test_every_model_the_search_drives_satisfies_its_declared_step_interface() -> None:
    from nmt.model.ensemble import Ensemble
    from nmt.model.search import StepModel
    from nmt.model.seq2seq import SearchModel

    model = tiny_model().model.float()
    for driven in (model, SearchModel(model), Ensemble([model, model]), tiny_model()):
        assert isinstance(driven, StepModel), type(driven).__name__
    assert not isinstance(nn.Linear(2, 2), StepModel)
