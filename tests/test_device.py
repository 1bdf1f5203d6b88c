"""Precision settings: which device/setting pairs mean bf16 autocast, and that they reach the model."""

from __future__ import annotations

import pytest
import torch

from nmt.common import device as device_module
from nmt.common.device import (
    autocast,
    check_inference_precision,
    check_precision,
    quantize_int8,
    slow_bf16_warning,
    uses_bf16,
)
from nmt.inference.engine import SearchOptions, TranslationError, Translator
from nmt.model.attention import build_attention
from nmt.model.checkpoint import upgrade_saved_config
from nmt.model.seq2seq import Seq2Seq
from nmt.train import distributed as dist_module

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_which_settings_mean_bf16() -> None:
    assert uses_bf16("auto", CUDA) and not uses_bf16("auto", CPU)  # the default: bf16 on GPUs only
    assert uses_bf16("bf16", CPU) and uses_bf16("bf16", CUDA)
    assert not uses_bf16("fp32", CPU) and not uses_bf16("fp32", CUDA)
    with pytest.raises(ValueError, match=r"trainer\.precision='fp16' is not one of auto, bf16, fp32"):
        check_precision("fp16", key="trainer.precision")


def _tiny_model() -> Seq2Seq:
    torch.manual_seed(0)
    attention = build_attention("additive", query_size=7, key_size=10, hidden_size=6)
    return Seq2Seq(13, 11, attention, emb_size=4, enc_hidden_size=5, dec_hidden_size=7, enc_layers=1,
                   dec_layers=1, dropout=0.0, tie_embeddings=True, output_hidden_size=None, layer_norm=False).eval()


@pytest.mark.parametrize(("setting", "expected"), [("auto", torch.float32), ("fp32", torch.float32),
                                                   ("bf16", torch.bfloat16)])
def test_the_translator_decodes_in_the_precision_asked_for(setting: str, expected: torch.dtype) -> None:
    model = _tiny_model()
    seen: set[torch.dtype] = set()
    model.decoder.output.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
    src = [[4, 5, 6, 7], [8, 9], [10, 11, 12, 4, 5]]
    for beam in (1, 3):
        translator = Translator(model, tokenizer=None, precision=setting)  # ids in, ids out: no text
        nbest = translator.translate_ids(src, SearchOptions(beam_size=beam, max_len=6))
        assert len(nbest) == 3 and all(torch.isfinite(torch.tensor(h[0].score)) for h in nbest)
    assert seen == {expected}
    with autocast("fp32", CPU):  # the context itself: no autocast for float32
        assert not torch.is_autocast_enabled("cpu")


def test_unknown_precision_is_a_translation_error() -> None:
    with pytest.raises(TranslationError, match="precision='half' is not one of auto, bf16, fp32, int8"):
        Translator(_tiny_model(), tokenizer=None, precision="half")


def test_bf16_on_a_cpu_without_bf16_instructions_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_module, "cpu_has_native_bf16", lambda: False)
    assert "slower than float32" in slow_bf16_warning("bf16", CPU)
    assert slow_bf16_warning("auto", CPU) is None and slow_bf16_warning("bf16", CUDA) is None
    monkeypatch.setattr(device_module, "cpu_has_native_bf16", lambda: True)
    assert slow_bf16_warning("bf16", CPU) is None


def test_configs_saved_with_the_old_amp_key_are_upgraded() -> None:
    old = {"model": {"emb_size": 8}, "trainer": {"amp": True, "lr": 0.1}}
    assert upgrade_saved_config(old) == {"model": {"emb_size": 8, "output_hidden_size": None, "layer_norm": False},
                                         "trainer": {"precision": "auto", "lr": 0.1}}
    assert upgrade_saved_config({"trainer": {"amp": False}})["trainer"] == {"precision": "fp32"}
    assert old["trainer"]["amp"] is True  # the caller's dict is left as it was
    current = {"trainer": {"precision": "bf16"}}
    assert upgrade_saved_config(current) == current


def test_the_encoder_gru_runs_outside_autocast() -> None:
    """Under bf16 autocast the cuDNN GRU would be cast to fp16 (PyTorch's RNN autocast rule); ours stays float32."""
    model = _tiny_model()
    inside: list[bool] = []
    model.encoder.rnn.register_forward_pre_hook(lambda _m, _i: inside.append(torch.is_autocast_enabled("cpu")))
    src, lengths = torch.tensor([[4, 5, 6], [7, 8, 0]]), torch.tensor([3, 2])
    with autocast("bf16", CPU):
        enc_out, last = model.encoder(src, lengths)
        assert torch.is_autocast_enabled("cpu")  # the rest of the model still runs under autocast
    assert inside == [False]
    assert enc_out.dtype == last.dtype == torch.float32


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the cuDNN RNN autocast rule needs CUDA")
def test_bf16_training_step_on_cuda_keeps_the_encoder_in_float32() -> None:
    model = _tiny_model().to(CUDA).train()
    src, lengths = torch.tensor([[4, 5, 6], [7, 8, 0]], device=CUDA), torch.tensor([3, 2], device=CUDA)
    tgt_in = torch.tensor([[2, 4, 5], [2, 6, 0]], device=CUDA)
    with autocast("auto", CUDA):
        enc_out, _ = model.encoder(src, lengths)
        logits, _ = model(src, lengths, tgt_in)
    assert enc_out.dtype == torch.float32 and logits.dtype == torch.bfloat16
    logits.float().sum().backward()
    assert all(p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all() for p in model.encoder.rnn.parameters())


def test_int8_quantizes_the_linear_layers_of_a_copy_and_stays_close_to_float32() -> None:
    from torch.ao.nn.quantized.dynamic import GRU as Int8GRU
    from torch.ao.nn.quantized.dynamic import Linear as Int8Linear

    model = _tiny_model()
    int8 = quantize_int8(model)
    assert isinstance(int8.decoder.output, Int8Linear) and isinstance(int8.decoder.pre_output, Int8Linear)
    assert isinstance(int8.encoder.rnn, Int8GRU)
    assert isinstance(int8.decoder.attention.energy, torch.nn.Linear)  # one output: read directly, kept float
    assert type(model.decoder.output) is torch.nn.Linear  # the original is left as it was
    src, lengths = torch.tensor([[4, 5, 6, 7, 2], [8, 9, 2, 0, 0]]), torch.tensor([5, 3])
    tgt_in = torch.tensor([[1, 4, 5, 6], [1, 7, 8, 0]])
    with torch.no_grad():
        reference, _ = model(src, lengths, tgt_in)
        quantized, _ = int8(src, lengths, tgt_in)
    error = (quantized - reference).abs().max() / reference.abs().max()
    assert 0 < error < 0.05  # int8 rounding: small, but not zero (so the int8 path really ran)


def test_int8_decoding_through_the_translator_and_its_limits() -> None:
    model = _tiny_model()
    src = [[4, 5, 6, 7], [8, 9], [10, 11, 12, 4, 5]]
    translator = Translator(model, tokenizer=None, precision="int8")
    assert translator.model is not model and translator.precision == "int8"
    for beam in (1, 3):
        nbest = translator.translate_ids(src, SearchOptions(beam_size=beam, max_len=6))
        assert len(nbest) == 3 and all(torch.isfinite(torch.tensor(h[0].score)) for h in nbest)
    assert check_inference_precision("int8", CPU) == "int8"
    with pytest.raises(ValueError, match="precision=int8 is for CPU decoding"):
        check_inference_precision("int8", CUDA)
    with pytest.raises(ValueError, match=r"trainer\.precision='int8' is not one of auto, bf16, fp32"):
        check_precision("int8", key="trainer.precision")  # training has no int8


@pytest.mark.parametrize(("name", "distributed", "set_to"), [("cuda", False, None), ("cuda", True, "cuda:1"),
                                                             ("cuda:1", False, "cuda:1"), ("cpu", False, None)])
def test_a_single_process_on_plain_cuda_does_not_pin_a_gpu(monkeypatch: pytest.MonkeyPatch, name: str,
                                                           distributed: bool, set_to: str | None) -> None:
    """torch.cuda.set_device needs an index: a single process asking for "cuda" keeps the current GPU, and each
    torchrun rank pins its local rank's."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    pinned: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "set_device", pinned.append)
    info = dist_module.DistInfo(rank=1, world_size=2, local_rank=1) if distributed else dist_module.DistInfo()
    device = dist_module.choose_device(name, info)
    assert device == torch.device(set_to or name)
    assert pinned == ([torch.device(set_to)] if set_to else [])


@pytest.mark.parametrize(("finished", "calls"), [(True, ["barrier", "destroy"]), (False, ["destroy"])])
def test_ranks_leave_the_group_together_after_a_finished_run(monkeypatch: pytest.MonkeyPatch, finished: bool,
                                                             calls: list[str]) -> None:
    seen: list[str] = []
    monkeypatch.setattr(dist_module.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist_module.dist, "barrier", lambda: seen.append("barrier"))
    monkeypatch.setattr(dist_module.dist, "destroy_process_group", lambda: seen.append("destroy"))
    dist_module.shutdown(dist_module.DistInfo(rank=1, world_size=2, local_rank=1), finished)
    assert seen == calls
    dist_module.shutdown(dist_module.DistInfo(), finished)  # one process: nothing to leave
    assert seen == calls
