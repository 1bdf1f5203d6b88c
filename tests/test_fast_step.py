"""The training step's fast path: shape buckets, the padded step equal to the unpadded one, a step that reads
nothing back from the device, skipped non-finite steps, the setting's checks; on a GPU, graph replay against eager.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from nmt.common import cuda_graphs
from nmt.common.cuda_graphs import CudaGraphError, GraphUse, resolve_cuda_graphs
from nmt.data.batching import Batch, ShapeBuckets, TokenBucketSampler, collate_batch
from nmt.model.attention import build_attention
from nmt.model.seq2seq import Seq2Seq
from nmt.train.fast_step import StepResult, StepWindow, TrainingSteps, _Graph, train_step
from tests.test_model import TYPES

REPO_ROOT = Path(__file__).resolve().parents[1]

SRC_V, TGT_V = 23, 29


def tiny_model(name: str, layers: int = 1, layer_norm: bool = False, dropout: float = 0.0) -> Seq2Seq:
    torch.manual_seed(0)
    options = {"heads": 3} if name == "multihead" else {}
    attention = build_attention(name, query_size=9, key_size=10, hidden_size=9, **options)
    return Seq2Seq(SRC_V, TGT_V, attention, emb_size=7, enc_hidden_size=5, dec_hidden_size=9, enc_layers=layers,
                   dec_layers=layers, dropout=dropout, tie_embeddings=True, output_hidden_size=None,
                   layer_norm=layer_norm)


def items(count: int = 5, seed: int = 0) -> list[tuple[int, list[int], list[int]]]:
    """``EncodedSplit[i]``-like pairs of ids of assorted lengths."""
    rng = random.Random(seed)
    return [(i, [rng.randrange(4, SRC_V) for _ in range(rng.randint(1, 11))],
             [rng.randrange(4, TGT_V) for _ in range(rng.randint(1, 9))]) for i in range(count)]


def loss_and_gradients(model: Seq2Seq, batch: Batch, fixed_shapes: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The step's summed loss and the gradients it would apply, without updating (``force_skip``)."""
    model.zero_grad(set_to_none=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    figures = train_step(model, optimizer, batch, label_smoothing=0.1, max_norm=None, precision="fp32",
                         fixed_shapes=fixed_shapes, force_skip=torch.ones(()))
    return figures[0], [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("layers", [1, 2])
def test_a_padded_bucket_step_gives_the_loss_and_gradients_of_the_unpadded_one(name: str, layers: int) -> None:
    model = tiny_model(name, layers, layer_norm=layers == 2).double()
    pairs = items()
    plain = collate_batch(pairs)
    padded = collate_batch(pairs, ShapeBuckets(width=8, max_tokens=200))
    assert (*padded.src.shape, padded.tgt_in.shape[1]) == (22, 16, 16) and plain.src.shape[0] == 5  # 200 // 9 rows
    assert padded.num_tgt_tokens == plain.num_tgt_tokens and padded.indices.tolist()[5:] == [-1] * 17
    loss, grads = loss_and_gradients(model, plain, fixed_shapes=False)  # packed encoder, the eager path
    padded_loss, padded_grads = loss_and_gradients(model, padded, fixed_shapes=True)  # the graph's step
    torch.testing.assert_close(padded_loss.double(), loss.double(), rtol=1e-6, atol=1e-9)
    for grad, padded_grad in zip(grads, padded_grads):
        torch.testing.assert_close(padded_grad, grad, rtol=1e-6, atol=1e-9)


def test_the_bucket_of_a_batch_is_deterministic_and_every_sampled_batch_fits_one() -> None:
    buckets = ShapeBuckets(width=8, max_tokens=300)
    assert buckets.shape(20, 9, 14) == buckets.shape(20, 9, 14) == (33, 16, 16)  # 300 // 9: the narrowest width
    assert buckets.shape(34, 9, 14) is None  # 34 x 9 is over the budget: no sampler cuts such a batch
    assert buckets.shape(1, 400, 3) is None  # a pair well over the budget fits no bucket: the eager step takes it
    rng = random.Random(1)
    src, tgt = [rng.randint(2, 60) for _ in range(3000)], [rng.randint(2, 60) for _ in range(3000)]
    batches = TokenBucketSampler(src, tgt, 300, shuffle=True, seed=4).epoch_batches(0)
    shapes = {buckets.shape(len(b), max(src[i] for i in b), max(tgt[i] for i in b)) for b in batches}
    assert None not in shapes and len(shapes) <= 8 * 8  # lengths up to 60: 8 multiples of 8 each way


class HostReads(TorchFunctionMode):
    """Records every tensor method that reads device data back to the host (``.item()``, ``bool(t)``, ...)."""

    READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__float__,
             torch.Tensor.__int__, torch.Tensor.__index__, torch.Tensor.cpu, torch.Tensor.numpy,
             torch.Tensor.nonzero, torch.nonzero, torch.Tensor.masked_select, torch.masked_select}

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func in self.READS:
            self.seen.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


@contextmanager
def host_reads() -> Iterator[list[str]]:
    mode = HostReads()
    with mode:
        yield mode.seen


@pytest.mark.parametrize("name", ["additive", "multihead", "none"])
def test_the_fast_step_reads_nothing_back_from_the_device(name: str) -> None:
    """Everything a captured step does, run eagerly on the CPU: forward, loss, backward, clip, a skipped or taken
    fused AdamW update. The packed encoder (the eager path) reads the lengths back, and the check sees it."""
    model = tiny_model(name, layers=2, dropout=0.2).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    batch = collate_batch(items(), ShapeBuckets(width=8, max_tokens=200))
    for force_skip in (torch.ones(()), None):
        with host_reads() as seen:
            train_step(model, optimizer, batch, label_smoothing=0.1, max_norm=1.0, precision="fp32",
                       fixed_shapes=True, force_skip=force_skip)
        assert seen == []
        optimizer.zero_grad(set_to_none=True)
    with host_reads() as seen:
        train_step(model, optimizer, batch, label_smoothing=0.1, max_norm=1.0, precision="fp32", fixed_shapes=False)
    assert "cpu" in seen  # pack_padded_sequence's lengths: why the graphs use Encoder.unpacked


def test_a_non_finite_step_leaves_weights_and_optimizer_as_they_were() -> None:
    model = tiny_model("additive")
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    batch = collate_batch(items())
    steps = TrainingSteps(model, model, optimizer, torch.device("cpu"), graphs=False, check=True,
                          label_smoothing=0.0, max_norm=1.0, precision="fp32")
    steps.run(batch, 0.01, bucketed=False)  # a real update first, so the optimizer has state
    before = {k: v.clone() for k, v in model.state_dict().items()}
    moments = [state["exp_avg"].clone() for state in optimizer.state.values()]
    hook = model.decoder.output.register_forward_hook(lambda _m, _i, out: out * float("inf"))
    window = StepWindow()
    window.add(2, StepResult(steps.run(batch, 0.01, bucketed=False), tokens=7, lr=0.01))
    hook.remove()
    (row,) = window.read()
    assert row["skipped"] and row["step"] == 2 and row["tokens"] == 7
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(m, state["exp_avg"]) for m, state in zip(moments, optimizer.state.values()))
    assert all(int(state["step"]) == 1 for state in optimizer.state.values())  # the skipped step is not counted
    steps.run(batch, 0.01, bucketed=False)
    assert all(int(state["step"]) == 2 for state in optimizer.state.values())
    assert window.read() == []  # read once


def test_cuda_graphs_settings_are_checked_in_one_line() -> None:
    cpu, key = torch.device("cpu"), "trainer.cuda_graphs"
    assert resolve_cuda_graphs("auto", cpu, 1, key) == resolve_cuda_graphs(False, cpu, 1, key) == GraphUse(False, False)
    with pytest.raises(CudaGraphError, match=r"trainer.cuda_graphs=true needs a CUDA GPU, and this run is on cpu"):
        resolve_cuda_graphs(True, cpu, 1, key)
    with pytest.raises(CudaGraphError, match=r"trainer.cuda_graphs='sometimes' is not one of auto, true, false"):
        resolve_cuda_graphs("sometimes", cpu, 1, key)
    cuda = torch.device("cuda")  # (the decision reads the device's type only: no GPU needed to check it)
    assert resolve_cuda_graphs("auto", cuda, 1, key) == GraphUse(step=True, search=True)
    assert resolve_cuda_graphs("false", cuda, 1, key) == GraphUse(step=False, search=False)


def test_auto_stays_eager_under_torchrun_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    """Under torchrun the step stays eager (its all-reduce is not captured); validation's search still replays."""
    cuda = torch.device("cuda")
    with caplog.at_level("INFO", logger="nmt.common.cuda_graphs"):
        assert resolve_cuda_graphs("auto", cuda, 2, "trainer.cuda_graphs") == GraphUse(step=False, search=True)
    assert [r.getMessage() for r in caplog.records] == [
        "trainer.cuda_graphs=auto: eager steps under torchrun's 2 processes (the DDP all-reduce is not captured)"]
    with pytest.raises(CudaGraphError, match="torchrun's 2 processes"):
        resolve_cuda_graphs("true", cuda, 2, "trainer.cuda_graphs")


def cpu_graph_steps(monkeypatch: pytest.MonkeyPatch, capture_error: Exception) -> TrainingSteps:
    """``TrainingSteps`` with graphs on, on the CPU, whose capture raises ``capture_error`` (the CUDA calls
    replaced): what the trainer sees when capturing fails on a GPU."""
    def fail(self: TrainingSteps, batch: Batch) -> None:
        raise capture_error

    monkeypatch.setattr(TrainingSteps, "_warm_up_and_capture", fail)
    model = tiny_model("additive")
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    return TrainingSteps(model, model, optimizer, torch.device("cpu"), graphs=True, check=True, label_smoothing=0.0,
                         max_norm=1.0, precision="fp32")


def test_a_capture_that_fails_warns_in_one_line_and_trains_on_eagerly(monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    steps = cpu_graph_steps(monkeypatch, RuntimeError("operation not permitted when stream is capturing\nmore"))
    batch = collate_batch(items(), ShapeBuckets(width=8, max_tokens=200))
    before = [p.detach().clone() for p in steps.model.parameters()]
    figures = [steps.run(batch, 0.01, bucketed=True) for _ in range(3)]
    assert all(f.shape == (3,) and not bool(f[2]) for f in figures)  # three real updates
    assert not all(torch.equal(a, b) for a, b in zip(before, steps.model.parameters()))
    assert steps.stats.plain_runs == 3 and steps.stats.shapes == []
    assert steps.stats.fallback == "RuntimeError: operation not permitted when stream is capturing"
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == ["trainer.cuda_graphs: capturing the step failed (RuntimeError: operation not permitted "
                        "when stream is capturing); training goes on eagerly"]  # once, not at every step


def test_a_shape_that_does_not_fit_in_memory_names_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    steps = cpu_graph_steps(monkeypatch, torch.cuda.OutOfMemoryError("CUDA out of memory"))
    batch = collate_batch(items(), ShapeBuckets(width=8, max_tokens=200))
    with pytest.raises(CudaGraphError, match=r"a batch of 22 rows x 16 source x 16 target tokens does not fit in GPU "
                                             r"memory; lower data.max_tokens \(or set trainer.cuda_graphs=false\)"):
        steps.run(batch, 0.01, bucketed=True)
    assert all(p.grad is None for p in steps.model.parameters())


class ReplayedEagerly:
    """A stand-in for a captured ``torch.cuda.CUDAGraph``: ``replay`` runs the captured step on the graph's own
    input tensors, at the learning rate the graph would read, and writes its figures where the graph would."""

    def __init__(self, steps: TrainingSteps, inputs: Batch, figures: torch.Tensor) -> None:
        self.steps, self.inputs, self.figures = steps, inputs, figures

    def replay(self) -> None:
        group = self.steps.optimizer.param_groups[0]
        float_lr, group["lr"] = group["lr"], float(self.steps.lr)
        self.figures.copy_(train_step(self.steps.forward_model, self.steps.optimizer, self.inputs, fixed_shapes=True,
                                      force_skip=self.steps.skip, **self.steps.step_options))
        group["lr"] = float_lr
        self.steps.optimizer.zero_grad(set_to_none=True)


class ReplayedSearchStep:
    """A stand-in for a captured search step: ``replay`` runs it eagerly on its bucket's static tensors."""

    def __init__(self, run: Callable[[], None]) -> None:
        self.replay = run


class ReplayedOnOtherInputs(ReplayedEagerly):
    """A capture that computes the wrong thing: its replay trains on other tensors than those the trainer loads."""

    def replay(self) -> None:
        loaded, self.inputs = self.inputs, collate_batch(items(seed=9), ShapeBuckets(width=8, max_tokens=200))
        try:
            super().replay()
        finally:
            self.inputs = loaded


def steps_with_stand_ins(monkeypatch: pytest.MonkeyPatch, stand_in: type[ReplayedEagerly], check: bool,
                         dropout: float = 0.0) -> TrainingSteps:
    """``TrainingSteps`` with graphs on the CPU, each capture a ``stand_in``."""
    def capture(self: TrainingSteps, batch: Batch) -> _Graph:
        inputs, figures = batch.to(self.device), torch.zeros(3)
        return _Graph(stand_in(self, inputs, figures), inputs, figures)

    monkeypatch.setattr(TrainingSteps, "_warm_up_and_capture", capture)
    model = tiny_model("additive", dropout=dropout).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    return TrainingSteps(model, model, optimizer, torch.device("cpu"), graphs=True, check=check,
                         label_smoothing=0.1, max_norm=1.0, precision="fp32")


def test_the_canary_changes_nothing_in_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """With dropout, a right capture checked at each new shape trains exactly as unchecked: the check's replay and
    eager step skip their updates and give the random numbers back."""
    runs = {}
    for check in (False, True):
        # made afresh for each run: on the CPU a stand-in's inputs are the first batch's own tensors, loaded into
        batches = [collate_batch(items(seed=i % 3), ShapeBuckets(width=8, max_tokens=200)) for i in range(5)]
        steps = steps_with_stand_ins(monkeypatch, ReplayedEagerly, check, dropout=0.3)
        losses = [float(steps.run(b, 0.01, bucketed=True)[0]) for b in batches]
        runs[check] = losses, [p.detach().clone() for p in steps.model.parameters()], steps.stats
    assert runs[True][0] == runs[False][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[True][1], runs[False][1]))
    checked = runs[True][2]
    assert checked.checks == len(checked.shapes) >= 1 and checked.mismatches == [] and checked.replays == 5
    assert runs[False][2].checks == 0


def test_a_wrong_capture_is_caught_before_it_steps_and_training_goes_on_eagerly(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The first replay of a shape whose capture computes the wrong loss: one warning naming the shape, recorded in
    the stats, and every step eager from then on, the first included: the weights are the eager run's."""
    eager = steps_with_stand_ins(monkeypatch, ReplayedEagerly, check=False)
    eager.graphs = False
    wrong = steps_with_stand_ins(monkeypatch, ReplayedOnOtherInputs, check=True)
    for _ in range(3):
        batch = collate_batch(items(), ShapeBuckets(width=8, max_tokens=200))
        torch.testing.assert_close(wrong.run(batch, 0.01, bucketed=True), eager.run(batch, 0.01, bucketed=False))
    assert all(torch.equal(a, b) for a, b in zip(wrong.model.parameters(), eager.model.parameters()))
    assert wrong.stats.mismatches == [[22, 16, 16]] and wrong.stats.fallback.startswith("canary: bucket [22, 16, 16]")
    assert wrong.stats.replays == 0 and wrong.stats.plain_runs == 3 and wrong.stats.checks == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and warnings[0].startswith(
        "trainer.cuda_graphs: the first replay of bucket [22, 16, 16] disagreed with the eager step (summed loss ")
    assert warnings[0].endswith("); training goes on eagerly")


def test_the_trainer_on_the_graph_path_gives_the_eager_losses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """``trainer.cuda_graphs=true`` through the real trainer on the CPU, each capture replaced by a stand-in that
    replays the captured step eagerly: the same batches padded to buckets, the unpacked encoder, the learning rate
    read at replay; the loss curve is the eager path's, and results.json counts the shapes and replays. Validation
    (greedy) and the test (beam 3) decode through the graph search, its captures stand-ins too: the eager scores."""
    from nmt.inference import engine as engine_module
    from nmt.train import trainer as trainer_module
    from tests.test_training import tiny_config

    def capture(self: TrainingSteps, batch: Batch) -> _Graph:
        inputs, figures = batch.to(self.device), torch.zeros(3)
        return _Graph(ReplayedEagerly(self, inputs, figures), inputs, figures)

    common = ["trainer.max_steps=40", "trainer.validate_every=20", "trainer.log_every=1", "trainer.test_beam_size=3"]
    eager = trainer_module.train(tiny_config(tmp_path, common), run_dir=tmp_path / "eager")
    caplog.set_level("INFO", logger="nmt.train")
    for module in (trainer_module, engine_module):  # the trainer's resolver, and the engine's for its Translator
        monkeypatch.setattr(module, "resolve_cuda_graphs", lambda *args: GraphUse(step=True, search=True))
    monkeypatch.setattr(TrainingSteps, "_warm_up_and_capture", capture)
    # the search's graphs too: validation and the test decode through the graph search, stand-ins replaying eagerly
    monkeypatch.setattr(cuda_graphs, "capture_graph", lambda run, pool, device: ReplayedSearchStep(run))
    graphs = trainer_module.train(tiny_config(tmp_path, [*common, "trainer.cuda_graphs=true"]),
                                  run_dir=tmp_path / "graphs")
    curves = [[json.loads(line) for line in (tmp_path / run / "train_log.jsonl").read_text().splitlines()]
              for run in ("eager", "graphs")]
    assert [r["lr"] for r in curves[0]] == [r["lr"] for r in curves[1]]
    torch.testing.assert_close([r["loss"] for r in curves[1]], [r["loss"] for r in curves[0]], rtol=1e-4, atol=1e-5)
    stats = graphs["cuda_graphs"]
    assert eager["cuda_graphs"] is None and stats["replays"] + stats["plain_runs"] == 40
    assert stats["plain_runs"] == 0 and 0 < len(stats["shapes"]) < 40
    # the canary (trainer.cuda_graphs_check, on by default) checked each shape met, and found nothing
    assert 0 < stats["checks"] <= len(stats["shapes"]) and stats["mismatches"] == [] and stats["check_seconds"] > 0
    assert all(shape[1] % 8 == 0 and shape[2] % 8 == 0 for shape in stats["shapes"])
    # every shape captured before the first step, from the sampler's planned batches: none met later for the first time
    messages = [record.getMessage() for record in caplog.records]
    assert any(m.startswith(f"cuda graphs: {len(stats['shapes'])} batch shapes captured in ") for m in messages)
    # the graph search decoded validation and the test: the eager run's scores, its search counted
    search = graphs["search_graphs"]
    assert eager["search_graphs"] is None and search["replays"] > 0 and search["fallback"] is None
    assert search["checks"] == len(search["shapes"]) > 0 and search["mismatches"] == []
    assert [v["bleu"] for v in graphs["validations"]] == [v["bleu"] for v in eager["validations"]]
    for split, scores in eager["test"].items():
        assert graphs["test"][split]["bleu"] == scores["bleu"]
        assert scores["sentences_per_s"] > 0 and scores["decode_seconds"] > 0
        assert set(scores["attention_sharpness"]) == {"normalised_entropy", "max_weight", "entropy", "tokens"}


# ------------------------------------------------------------------------------------------------ GPU only
def gpu_steps(graphs: bool, dropout: float = 0.1) -> tuple[Seq2Seq, TrainingSteps]:
    model = tiny_model("additive", layers=1, dropout=dropout).cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.003, fused=True, capturable=graphs)
    return model, TrainingSteps(model, model, optimizer, torch.device("cuda"), graphs=graphs, check=False,
                                label_smoothing=0.1, max_norm=1.0, precision="bf16")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graph_replay_gives_the_eager_losses_over_50_steps() -> None:
    buckets = ShapeBuckets(width=8, max_tokens=200)
    batches = [collate_batch(items(seed=i % 5), buckets) for i in range(50)]
    losses = {}
    for graphs in (False, True):
        torch.manual_seed(3)
        _, steps = gpu_steps(graphs, dropout=0.0)
        losses[graphs] = torch.stack([steps.run(b.pin_memory(), 0.003, bucketed=True) for b in batches])[:, 0]
        if graphs:
            assert len(steps.stats.shapes) == len({tuple(b.src.shape) for b in batches})
            assert steps.stats.replays == 50 and steps.stats.fallback is None
    torch.testing.assert_close(losses[True], losses[False], rtol=2e-2, atol=2e-2)  # bf16 tolerance


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_the_canary_passes_real_graphs_and_changes_nothing_in_training() -> None:
    """With dropout and bf16, each shape's first replay passes its check against the eager step, and the run's
    losses are those of the same run unchecked (the check gives back the random state it drew from)."""
    buckets = ShapeBuckets(width=8, max_tokens=200)
    losses = {}
    for check in (False, True):
        batches = [collate_batch(items(seed=i % 5), buckets) for i in range(12)]
        torch.manual_seed(3)
        _, steps = gpu_steps(graphs=True, dropout=0.1)
        steps.cache.check_first_replays = check
        losses[check] = torch.stack([steps.run(b.pin_memory(), 0.003, bucketed=True) for b in batches])[:, 0]
        if check:
            assert steps.stats.checks == len(steps.stats.shapes) > 0 and steps.stats.mismatches == []
    assert torch.equal(losses[True], losses[False])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_a_shape_outside_every_bucket_falls_back_to_the_eager_step() -> None:
    _, steps = gpu_steps(graphs=True)
    unbucketed = collate_batch(items())  # its own shape: not padded to a bucket
    figures = steps.run(unbucketed.pin_memory(), 0.003, bucketed=False)
    assert steps.stats.plain_runs == 1 and steps.stats.shapes == [] and figures.shape == (3,)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_a_replayed_step_never_synchronises_with_the_host() -> None:
    _, steps = gpu_steps(graphs=True)
    batch = collate_batch(items(), ShapeBuckets(width=8, max_tokens=200)).pin_memory()
    steps.run(batch, 0.003, bucketed=True)  # captured here
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            steps.run(batch, 0.003, bucketed=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert steps.stats.replays == 4


def test_an_eager_training_and_a_cpu_translator_load_and_build_no_graph_machinery() -> None:
    code = ("import sys; import nmt.train.trainer, nmt.inference.engine; "
            "print(sorted(m for m in sys.modules if m == 'nmt.model.graph_search'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert done.stdout.strip() == "[]"  # the graph search is imported where it serves only
    model = tiny_model("additive")
    optimizer = torch.optim.AdamW(model.parameters())
    steps = TrainingSteps(model, model, optimizer, torch.device("cpu"), graphs=False, check=True)
    assert steps.cache is None and steps.stats is None
