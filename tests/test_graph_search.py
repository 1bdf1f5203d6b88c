"""The graph search (``nmt.model.graph_search``) on the CPU, each capture replaced by a stand-in that replays the
captured step eagerly: its bucketed, padded step and its whole search against the plain search; on a GPU (``gpu``),
real graphs against the eager search."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from nmt.common import cuda_graphs
from nmt.common.cuda_graphs import CudaGraphError, GraphUse, resolve_cuda_graphs
from nmt.data import PAD_ID
from nmt.inference.engine import TranslationError, Translator
from nmt.model import graph_search
from nmt.model.attention import build_attention
from nmt.model.ensemble import Ensemble
from nmt.model.graph_search import SearchGraphs, bucket_shape
from nmt.model.search import Hypothesis, Search, SearchSpec, beam_search, greedy_search, steps_until_done
from nmt.model.seq2seq import Seq2Seq
from tests.test_fast_step import host_reads
from tests.test_search import LENGTHS, SRC_V, TGT_V, EosBiased, batch, tiny_model

CPU = torch.device("cpu")
ALL_TYPES = ["additive", "dot", "scaled_dot", "general", "multihead", "none"]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


class ReplayedEagerly:
    """A stand-in for a captured ``torch.cuda.CUDAGraph``: ``replay`` runs the captured step on the bucket's own
    static tensors, as the graph would."""

    def __init__(self, run: Callable[[], None]) -> None:
        self.run = run
        self.replays = 0
        self.host_reads: list[str] = []  # what the replays read back from the device (nothing, in a graph)

    def replay(self) -> None:
        self.replays += 1
        with host_reads() as seen:
            self.run()
        self.host_reads += seen


@pytest.fixture
def stand_in_captures(monkeypatch: pytest.MonkeyPatch) -> list[ReplayedEagerly]:
    """Every capture of the test replaced by a stand-in; the list of them."""
    made: list[ReplayedEagerly] = []

    def capture(run: Callable[[], None], pool: Any, device: torch.device) -> ReplayedEagerly:
        made.append(ReplayedEagerly(run))
        return made[-1]

    monkeypatch.setattr(cuda_graphs, "capture_graph", capture)
    return made


def greedy(max_len: int, max_len_ratio: float | None, keep: bool = True) -> SearchSpec:
    return SearchSpec(1, 0.0, 1, max_len, max_len_ratio, keep)


def beam(k: int, alpha: float, max_len: int, max_len_ratio: float | None, n_best: int, keep: bool = True
         ) -> SearchSpec:
    return SearchSpec(k, alpha, n_best, max_len, max_len_ratio, keep)


def as_tuples(hyps: list[Hypothesis]) -> list[tuple[list[int], float]]:
    return [(h.tokens, h.score) for h in hyps]


def assert_same(graph: list[Hypothesis], plain: list[Hypothesis]) -> None:
    """The same tokens, the same scores and attention up to float32 rounding (the search scores in float32)."""
    assert [h.tokens for h in graph] == [h.tokens for h in plain]
    torch.testing.assert_close([h.score for h in graph], [h.score for h in plain], rtol=1e-6, atol=1e-6)
    for ours, theirs in zip(graph, plain):
        assert (ours.attention is None) == (theirs.attention is None)
        if ours.attention is not None:
            torch.testing.assert_close(ours.attention.double(), theirs.attention.double(), rtol=1e-6, atol=1e-7)


def model_of(name: str, seed: int = 0) -> Seq2Seq:
    """A tiny fp64 model whose sizes suit every attention type (query and key both 10 wide, 2 heads)."""
    torch.manual_seed(seed)
    options = {"heads": 2} if name == "multihead" else {}
    attention = build_attention(name, query_size=10, key_size=10, hidden_size=10, **options)
    model = Seq2Seq(SRC_V, TGT_V, attention, emb_size=6, enc_hidden_size=5, dec_hidden_size=10, enc_layers=1,
                    dec_layers=2, dropout=0.0, tie_embeddings=True, output_hidden_size=None, layer_norm=True)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return model.double().eval()


# ---------------------------------------------------------------------------------------- the step
@pytest.mark.parametrize("name", ALL_TYPES)
def test_a_padded_bucket_step_gives_the_unpadded_scores(name: str) -> None:
    """The memory of a batch padded to its bucket (extra rows, extra source columns) gives its real rows the step
    scores, states and attention of the unpadded batch (fp64); the padded columns get no attention."""
    model = model_of(name)
    src, src_lengths = batch([6, 3, 5, 1, 4])  # [5, 6]: three rows and two columns of padding
    rows, src_len = bucket_shape(*src.shape)
    assert (rows, src_len) == (8, 8) and bucket_shape(9, 17) == (16, 24)
    padded = torch.full((rows, src_len), PAD_ID, dtype=torch.long)
    padded[: src.shape[0], : src.shape[1]] = src
    padded[src.shape[0]:, 0] = 2  # EOS
    padded_lengths = torch.cat([src_lengths, torch.ones(rows - src.shape[0], dtype=torch.long)])
    memory, state = model.encode(src, src_lengths)
    padded_memory, padded_state = model.encode(padded, padded_lengths)
    prev = torch.randint(4, TGT_V, (rows,), generator=torch.Generator().manual_seed(2))
    for _ in range(3):
        logits, state, attn = model.decode_step(prev[: src.shape[0]], state, memory)
        padded_logits, padded_state, padded_attn = model.decode_step(prev, padded_state, padded_memory)
        real = slice(0, src.shape[0])
        torch.testing.assert_close(padded_logits[real], logits, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(padded_state[:, real], state, rtol=1e-10, atol=1e-10)
        if model.has_attention:
            torch.testing.assert_close(padded_attn[real, : src.shape[1]], attn, rtol=1e-10, atol=1e-10)
            assert padded_attn[real, src.shape[1]:].abs().max() == 0
        prev = padded_logits.argmax(-1)


# ---------------------------------------------------------------------------------------- the search
@pytest.mark.parametrize("name", ["additive", "multihead", "none"])
def test_the_graph_search_gives_the_plain_search_outputs(name: str, stand_in_captures: list[ReplayedEagerly]) -> None:
    """Greedy, beam, n-best, with and without attention: the plain search's tokens, scores and attention."""
    model = EosBiased(model_of(name), eos_bias=2.0)
    graphs = SearchGraphs(model, CPU, "fp32", check=False)
    src, src_lengths = batch(LENGTHS)
    for keep in (True, False):
        assert_same(graphs.greedy(src, src_lengths, greedy(12, 1.0, keep)),
                    greedy_search(model, src, src_lengths, 12, 1.0, keep_attention=keep))
        for k, n_best, alpha in ((1, 1, 1.0), (3, 3, 0.0), (4, 2, 1.4)):
            graph = graphs.beam(src, src_lengths, beam(k, alpha, 12, 1.0, n_best, keep))
            plain = beam_search(model, src, src_lengths, k, alpha, 12, 1.0, n_best, keep_attention=keep)
            assert [len(n) for n in graph] == [len(n) for n in plain]
            for ours, theirs in zip(graph, plain):
                assert_same(ours, theirs)
    assert len({len(h.tokens) for h in greedy_search(model, src, src_lengths, 12, 1.0)}) > 2  # rows end apart
    kinds = [shape[0] for shape in graphs.stats.shapes]
    kept = 2 if model.has_attention else 1  # with and without attention: a bucket each (none has no attention)
    assert kinds.count("greedy") == kept and kinds.count("beam") == 3 * kept  # and per beam size
    assert graphs.stats.fallback is None and len(stand_in_captures) == 4 * kept and graphs.stats.checks == 0


def test_batches_of_one_bucket_share_its_graph_and_a_late_flag_changes_nothing(
        stand_in_captures: list[ReplayedEagerly]) -> None:
    model = tiny_model("additive", eos_bias=2.0)
    graphs = SearchGraphs(model, CPU, "fp32", check=False)
    for seed, lengths in enumerate(([6, 3, 8, 1, 5], [7, 7, 2, 4, 3, 5], [4, 2, 6, 3, 8, 1, 5, 2])):
        src, src_lengths = batch(lengths, seed=seed)
        plain = greedy_search(model, src, src_lengths, 20, None)
        assert_same(graphs.greedy(src, src_lengths, greedy(20, None), lag=3), plain)
        for ours, theirs in zip(graphs.beam(src, src_lengths, beam(3, 1.0, 20, None, 2), lag=2),
                                beam_search(model, src, src_lengths, 3, 1.0, 20, None, 2)):
            assert_same(ours, theirs)
    assert graphs.stats.shapes == [["greedy", 8, 8], ["beam", 8, 8]]  # every batch pads to 8 x 8
    assert graphs.stats.replays == 6


def test_the_least_recently_used_bucket_makes_room_for_a_new_one(stand_in_captures: list[ReplayedEagerly],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(graph_search, "MAX_BUCKETS", 2)
    model = tiny_model("additive")
    graphs = SearchGraphs(model, CPU, "fp32", check=False)
    batches = [batch(lengths, seed=i) for i, lengths in enumerate(([3, 2], [3, 2, 2], [9, 4], [3, 3]))]
    for src, src_lengths in batches:  # buckets 2x8, 4x8, 2x16, then 2x8 again: evicted by 2x16, captured again
        assert_same(graphs.greedy(src, src_lengths, greedy(10, None)), greedy_search(model, src, src_lengths, 10, None))
    assert [shape[1:] for shape in graphs.stats.shapes] == [[2, 8], [4, 8], [2, 16], [2, 8]]
    assert [key[1:3] for key in graphs.cache.entries] == [(2, 16), (2, 8)]


def test_an_ensemble_searches_from_graphs_as_it_does_without(stand_in_captures: list[ReplayedEagerly]) -> None:
    from nmt.model.seq2seq import SearchModel

    members = [SearchModel(model_of(name, seed)) for seed, name in enumerate(["additive", "none", "general"])]
    ensemble = Ensemble(members)
    graphs = SearchGraphs(ensemble, CPU, "fp32", check=False)
    src, src_lengths = batch(LENGTHS, seed=5)
    assert_same(graphs.greedy(src, src_lengths, greedy(10, 1.5)), greedy_search(ensemble, src, src_lengths, 10, 1.5))
    for ours, theirs in zip(graphs.beam(src, src_lengths, beam(4, 1.0, 10, 1.5, 4, True)),
                            beam_search(ensemble, src, src_lengths, 4, 1.0, 10, 1.5, 4)):
        assert_same(ours, theirs)


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_a_replayed_step_reads_nothing_back(kind: str, stand_in_captures: list[ReplayedEagerly]) -> None:
    """What a captured step does, run eagerly: no ``item``, ``tolist``, ``bool``, ``cpu``, ``nonzero``..."""
    model = EosBiased(model_of("additive"), eos_bias=2.0)
    graphs = SearchGraphs(model, CPU, "fp32", check=False)
    src, src_lengths = batch(LENGTHS)
    if kind == "greedy":
        graphs.greedy(src, src_lengths, greedy(12, 1.0, True))
    else:
        graphs.beam(src, src_lengths, beam(3, 1.0, 12, 1.0, 2, True))
    captured = stand_in_captures[0]
    assert captured.replays > 5 and captured.host_reads == []
    with host_reads() as seen:  # the control: the plain search's compaction reads back, and the check sees it
        beam_search(model, src, src_lengths, 3, 1.0, 12, 1.0, 2)
    assert seen


# ---------------------------------------------------------------------------------------- settings
def test_the_setting_is_checked_in_one_line() -> None:
    assert not resolve_cuda_graphs("auto", CPU).search and not resolve_cuda_graphs(False, CPU).search
    assert resolve_cuda_graphs("auto", torch.device("cuda")).search
    assert resolve_cuda_graphs(True, torch.device("cuda")).search
    with pytest.raises(CudaGraphError, match=r"^cuda_graphs=true needs a CUDA GPU.*cuda_graphs=auto"):
        resolve_cuda_graphs(True, CPU)
    with pytest.raises(CudaGraphError, match=r"'maybe' is not one of auto, true, false"):
        resolve_cuda_graphs("maybe", CPU)


def test_a_capture_that_fails_warns_once_and_the_plain_search_serves(monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    def fail(run: Callable[[], None], pool: Any, device: torch.device) -> None:
        raise RuntimeError("operation not permitted when stream is capturing\nmore lines")

    monkeypatch.setattr(cuda_graphs, "capture_graph", fail)
    model = tiny_model("additive")
    graphs = SearchGraphs(model, CPU, "fp32", check=False)
    src, src_lengths = batch(LENGTHS)
    assert_same(graphs.greedy(src, src_lengths, greedy(12, 1.0)), greedy_search(model, src, src_lengths, 12, 1.0))
    assert not graphs.cache.serving
    for ours, theirs in zip(graphs.beam(src, src_lengths, beam(3, 1.0, 12, 1.0, 1)),
                            beam_search(model, src, src_lengths, 3, 1.0, 12, 1.0, 1)):
        assert_same(ours, theirs)
    assert graphs.stats.plain_runs == 2 and graphs.stats.shapes == []
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "capturing the search step failed (RuntimeError: operation not permitted" in \
        warnings[0] and "\n" not in warnings[0]


class ReplayedWithOtherWeights(ReplayedEagerly):
    """A capture that computes the wrong thing: its replay runs the bucket's step with another model's weights (as
    a graph holding stale weights would)."""

    def __init__(self, run: Callable[[], None], other: Any) -> None:
        step = run.func  # the bucket's advance(model, blocked), bound to its static tensors
        super().__init__(lambda: step(other, *run.args[1:]))


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_the_canary_checks_each_new_bucket_once_and_a_wrong_capture_hands_over_to_the_plain_search(
        kind: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A right capture passes the check, once per bucket; a wrong one is caught at its bucket's first batch: that
    batch gets the plain search's hypotheses, one warning names the bucket, the stats record it, and the plain
    search serves from then on. Without the check the wrong hypotheses would have gone out."""
    model, other = EosBiased(model_of("additive"), eos_bias=2.0), EosBiased(model_of("additive", seed=7), 2.0)
    src, src_lengths = batch(LENGTHS)
    spec = greedy(12, 1.0) if kind == "greedy" else beam(3, 1.0, 12, 1.0, 2)
    plain = getattr(Search(model), kind)(src, src_lengths, spec)

    def flat(found: list[Any]) -> list[Hypothesis]:
        return [hyp for item in found for hyp in (item if isinstance(item, list) else [item])]

    monkeypatch.setattr(cuda_graphs, "capture_graph", lambda run, pool, device: ReplayedEagerly(run))
    right = SearchGraphs(model, CPU, "fp32", check=True)
    for _ in range(2):
        assert [h.tokens for h in flat(getattr(right, kind)(src, src_lengths, spec))] == [h.tokens for h in flat(plain)]
    assert right.stats.checks == 1 and right.stats.mismatches == [] and right.stats.replays == 2

    monkeypatch.setattr(cuda_graphs, "capture_graph", lambda run, pool, device: ReplayedWithOtherWeights(run, other))
    unchecked = SearchGraphs(model, CPU, "fp32", check=False)
    assert [h.tokens for h in flat(getattr(unchecked, kind)(src, src_lengths, spec))] != [h.tokens for h in flat(plain)]
    wrong = SearchGraphs(model, CPU, "fp32", check=True)
    for _ in range(2):
        assert [h.tokens for h in flat(getattr(wrong, kind)(src, src_lengths, spec))] == [h.tokens for h in flat(plain)]
    assert wrong.stats.mismatches == [[kind, 8, 8]] and wrong.stats.fallback.startswith(f"canary: bucket ['{kind}'")
    assert wrong.stats.replays == 1 and wrong.stats.plain_runs == 1 and not wrong.cache.serving
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and warnings[0].startswith(f"cuda_graphs: the first replay of bucket ['{kind}', 8, 8] "
                                                         "disagreed with the plain search (")
    assert warnings[0].endswith("differ in their tokens); decoding goes on without graphs")


def test_a_bucket_over_gpu_memory_names_batch_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    def out_of_memory(run: Callable[[], None], pool: Any, device: torch.device) -> None:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(cuda_graphs, "capture_graph", out_of_memory)
    src, src_lengths = batch(LENGTHS)
    with pytest.raises(CudaGraphError, match=r"bucket of 8 sentences x 8 source tokens x beam 3 does not fit in "
                                             r"GPU memory; lower batch_tokens \(or set cuda_graphs=false\)"):
        SearchGraphs(tiny_model("additive"), CPU, "fp32", check=False).beam(src, src_lengths, beam(3, 1.0, 12, 1.0, 1))


# ---------------------------------------------------------------------------------------- the engine
def test_the_translator_decodes_from_graphs_as_without(tiny_run_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                       stand_in_captures: list[ReplayedEagerly]) -> None:
    """A real checkpoint through ``Translator`` with the graph search switched on on the CPU: the same translations,
    scores and word attention as the plain search, greedy and beam with n-best."""
    sentences = ["Ein Mann fährt Fahrrad.", "", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch."]
    plain = Translator.from_checkpoint(tiny_run_dir, device="cpu", cuda_graphs=False)
    monkeypatch.setattr("nmt.inference.engine.resolve_cuda_graphs", lambda setting, device: GraphUse(True, True))
    graphs = Translator.from_checkpoint(tiny_run_dir, device="cpu")
    assert plain.graphs is None and graphs.graphs is not None
    for options in ({"beam_size": 1}, {"beam_size": 4, "n_best": 3}):
        ours = graphs.translate(sentences, attention=True, **options)
        theirs = plain.translate(sentences, attention=True, **options)
        assert [[c.text for c in t.nbest] for t in ours] == [[c.text for c in t.nbest] for t in theirs]
        torch.testing.assert_close([t.score for t in ours], [t.score for t in theirs], rtol=1e-5, atol=1e-5)
        assert [t.attention.alignment if t.attention else None for t in ours] == \
            [t.attention.alignment if t.attention else None for t in theirs]
    assert len(stand_in_captures) == 2 and graphs.graphs.stats.replays == 2


def test_graphs_forced_where_they_cannot_serve_are_one_line(tiny_run_dir: Path) -> None:
    with pytest.raises(TranslationError, match=r"^cuda_graphs=true needs a CUDA GPU, and this run is on cpu"):
        Translator.from_checkpoint(tiny_run_dir, device="cpu", cuda_graphs=True)


# ---------------------------------------------------------------------------------------- GPU only
def gpu_translators(run: Path, precision: str) -> tuple[Translator, Translator]:
    return (Translator.from_checkpoint(run, device="cuda", precision=precision, cuda_graphs=False),
            Translator.from_checkpoint(run, device="cuda", precision=precision, cuda_graphs=True))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graph_search_gives_the_eager_tokens_on_a_real_checkpoint(tiny_run_dir: Path) -> None:
    eager, graphs = gpu_translators(tiny_run_dir, "fp32")
    sentences = [f"Ein Mann mit {n} Hunden läuft." for n in range(1, 40)] + ["Hallo."]
    for options in ({"beam_size": 1}, {"beam_size": 5}):
        assert [t.text for t in graphs.translate(sentences, **options)] == \
            [t.text for t in eager.translate(sentences, **options)]
    assert graphs.graphs.stats.fallback is None and graphs.graphs.stats.shapes


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_decoding_a_batch_from_graphs_never_synchronises_with_the_host(tiny_run_dir: Path) -> None:
    """The replays of a loaded batch, the late flags included, never wait for the device."""
    _, translator = gpu_translators(tiny_run_dir, "bf16")
    ids = translator.encode(["Ein Hund rennt durch das Gras.", "Zwei Männer spielen Fußball."] * 8)
    lengths = [len(i) + 1 for i in ids]
    src = torch.tensor([[*i, 2] + [PAD_ID] * (max(lengths) - len(i) - 1) for i in ids], device="cuda")
    search = translator.graphs
    with torch.no_grad():
        for _ in range(2):  # captured, then loaded again
            _, bucket, steps = search._bucket("beam", src, torch.tensor(lengths), SearchSpec(5, 1.0, 1, 50, 1.5, False))
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            steps_until_done(lambda _: search._replay(bucket), steps, search.device, lag=0)
        finally:
            torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_canary_passes_real_graphs(tiny_run_dir: Path, precision: str) -> None:
    """Real captures pass their check (fp32: the same tokens; bf16: within the stated share), once per bucket."""
    _, graphs = gpu_translators(tiny_run_dir, precision)
    sentences = [f"Ein Mann mit {n} Hunden läuft." for n in range(1, 40)] + ["Hallo."]
    for options in ({"beam_size": 1}, {"beam_size": 5, "n_best": 2}):
        graphs.translate(sentences, **options)
    stats = graphs.graphs.stats
    assert stats.checks == len(stats.shapes) > 0 and stats.mismatches == [] and stats.fallback is None
