"""ONNX export (nmt.export): every attention type's graphs, and the runtime's translations equal the engine's."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from conftest import CONFIG_DIR, SRC, TGT, TINY_MAX_WORDS, tokenizer_settings
from omegaconf import OmegaConf

from nmt import Translator
from nmt.data import train_tokenizer
from nmt.export import ExportError, ExportSettings, export_main
from nmt.inference.engine import TranslationError
from nmt.model.checkpoint import CheckpointError, save_checkpoint
from nmt.model.seq2seq import SearchModel, Seq2Seq
from nmt_runtime import Translator as RuntimeTranslator
from nmt_runtime.folder import ExportedModel, ExportFolderError, read_manifest

REPO_ROOT = Path(__file__).resolve().parents[1]
ATTENTIONS = sorted(path.stem for path in (CONFIG_DIR / "attention").glob("*.yaml"))
# conftest's sentences, an empty line, one over the models' 9-word input limit, unseen words, a tab
LINES = [*SRC, "", f"{SRC[0]} {SRC[1]} {SRC[2]}", "Xylophon quietscht zwölfmal!", "Zwei\tHunde", SRC[3].upper()]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)  # tiny models gain nothing from threads, and on shared cores spin-waits cost seconds


def tiny_checkpoint(path: Path, attention: str, seed: int = 0, **model: object) -> Path:
    """A tiny untrained model with configs/attention/<attention>.yaml, odd sizes, weights scaled up so that
    sentences translate differently (as conftest's ``save_tiny_checkpoint``); ``model`` overrides sizes."""
    tokenizer = train_tokenizer(SRC * 3, TGT * 3, tokenizer_settings(vocab_size=60), cache_dir=None)
    attention_cfg = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "attention" / f"{attention}.yaml"))
    if attention == "multihead":
        attention_cfg.update(hidden_size=8, heads=2)
    model_cfg = {"emb_size": 8, "enc_hidden_size": 5, "dec_hidden_size": 7, "enc_layers": 1, "dec_layers": 1,
                 "dropout": 0.0, "tie_embeddings": True, "output_hidden_size": None, "layer_norm": False, **model}
    config = {"model": model_cfg, "attention": attention_cfg,
              "data": {"src_lang": "de", "tgt_lang": "en", "clean": {"max_len": TINY_MAX_WORDS, "max_ratio": 3.0}}}
    torch.manual_seed(seed)
    net = Seq2Seq.from_config(model_cfg, attention_cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(3.0)
    return save_checkpoint(path, {"config": config, "tokenizer": tokenizer.to_state(), "model": net.state_dict()})


def export(checkpoint: object, output: Path, **settings: object) -> Path:
    """``export.py`` in process: the settings dataclass as Hydra would compose it."""
    return export_main(OmegaConf.structured(ExportSettings(checkpoint=checkpoint, output=str(output), **settings)))


MODELS = {name: (name, {}) for name in ATTENTIONS}
# a two-layer, layer-normalised, untied decoder over a two-layer encoder: GateNorm, GRUCells, the deep output
MODELS["deep"] = ("additive", {"enc_layers": 2, "dec_layers": 2, "layer_norm": True, "tie_embeddings": False,
                               "output_hidden_size": 6})


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Per model: its run dir and its ONNX folder."""
    root = tmp_path_factory.mktemp("export")
    made = {}
    for seed, (name, (attention, sizes)) in enumerate(MODELS.items()):
        run = tiny_checkpoint(root / name / "checkpoints" / "best.pt", attention, seed, **sizes).parent.parent
        made[name] = (run, export(str(run), root / f"{name}.onnx"))
    return made


def nbest(results: list) -> list[list[tuple[str, float]]]:
    """(text, score) per candidate, per sentence, from either translator's results."""
    return [[(c.text, c.score) if hasattr(c, "text") else c for c in r.nbest] for r in results]


def assert_same(engine: list, runtime: list) -> None:
    """Equal texts for every candidate, and scores equal to float rounding.

    Rounding adds up over a 40-token hypothesis of the deep model: the engine's own score for a sentence moves
    by up to 1.5e-4 (relative) between batch compositions there, hence the 1e-3.
    """
    for expected, got in zip(nbest(engine), nbest(runtime), strict=True):
        assert [text for text, _ in got] == [text for text, _ in expected]
        np.testing.assert_allclose([s for _, s in got], [s for _, s in expected], rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("name", list(MODELS))
def test_the_runtime_translates_as_the_engine_greedy_and_beam(exported: dict, name: str) -> None:
    run, folder = exported[name]
    engine = Translator.from_checkpoint(run, device="cpu")
    runtime = RuntimeTranslator(folder, threads=1)
    for options in ({"beam_size": 1}, {"beam_size": 5, "n_best": 3},
                    {"beam_size": 3, "max_len": 4, "max_len_ratio": None}):
        assert_same(engine.translate(LINES, **options), runtime.translate(LINES, **options))


def test_the_graphs_compute_the_search_models_step(exported: dict) -> None:
    """Encoder, preparation and step against SearchModel on a batch shaped unlike the traced one (B=3, G=3)."""
    run, folder = exported["multihead"]
    engine = Translator.from_checkpoint(run, device="cpu")
    model = engine.model
    assert isinstance(model, SearchModel)
    src = torch.tensor([[5, 6, 3, 0, 0, 0], [8, 9, 10, 11, 12, 3], [7, 3, 0, 0, 0, 0]])
    lengths = torch.tensor([3, 6, 2])
    runtime = ExportedModel(folder, read_manifest(folder), threads=1)
    memory, state = runtime.encode(src.numpy(), lengths.numpy())
    with torch.no_grad():
        torch_memory, torch_state = model.encode(src, lengths)
        np.testing.assert_allclose(memory.members[0]["enc_out"], torch_memory.enc_out, atol=1e-5)
        np.testing.assert_allclose(memory.members[0]["prepared_keys"], torch_memory.prepared_keys, atol=1e-5)
        np.testing.assert_allclose(state.members[0], torch_state, atol=1e-5)
        prev = torch.tensor([4, 5, 6, 7, 8, 9, 10, 11, 12])
        log_probs, new_state = runtime.step(prev.numpy(), state.repeat(3), memory)
        top, top_tokens, top_state = runtime.step_top(prev.numpy(), state.repeat(3), memory, 4)
        logits, torch_new_state, _ = model.decode_step(prev, torch_state.repeat_interleave(3, dim=1), torch_memory)
    np.testing.assert_allclose(log_probs, torch.log_softmax(logits, dim=-1), atol=1e-4)
    np.testing.assert_allclose(new_state.members[0], torch_new_state, atol=1e-5)
    # the graph's TopK: the 4 largest log-probabilities, PAD and BOS blocked, largest first, the lower token on ties
    assert runtime.graph_top_k
    log_probs[:, [0, 2]] = -np.inf
    best = np.argsort(-log_probs, axis=1, kind="stable")[:, :4]
    np.testing.assert_array_equal(top_tokens, best)
    np.testing.assert_array_equal(top, np.take_along_axis(log_probs, best, axis=1))
    np.testing.assert_array_equal(top_state.members[0], new_state.members[0])


def test_the_folder_has_dynamic_axes_the_tokenizer_and_provenance(exported: dict) -> None:
    run, folder = exported["additive"]
    manifest = json.loads((folder / "export.json").read_text())
    assert (manifest["src_lang"], manifest["tgt_lang"], manifest["max_input_words"]) == ("de", "en", TINY_MAX_WORDS)
    assert manifest["search"]["beam_size"] == 5 and manifest["int8"] is False
    source = manifest["provenance"]["sources"][0]
    assert source["checkpoint"] == str(run / "checkpoints" / "best.pt") and len(source["sha256"]) == 64
    assert {"torch", "onnx", "onnxruntime"} <= set(manifest["provenance"]["versions"])
    assert (folder / manifest["tokenizer"]["source"]).is_file()
    step = onnx.load(str(folder / "step.onnx")).graph
    axes = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in step.input}
    assert axes["prev_tokens"] == ["rows"] and axes["enc_out"][:2] == ["batch", "src_len"] and axes["top_k"] == [1]
    assert [output.name for output in step.output] == ["log_probs", "new_state", "top_log_probs", "top_tokens"]


def test_a_format_1_folder_searches_in_numpy_with_the_same_results(exported: dict, tmp_path: Path) -> None:
    """Format 1 (a step graph without the TopK) still reads, and its numpy candidate search gives exactly what the
    graph's TopK gives; a format this runtime does not know is refused in one line."""
    _, folder = exported["additive"]
    old = tmp_path / "format1"
    shutil.copytree(folder, old)
    step = onnx.load(str(old / "step.onnx"))
    graph = step.graph
    for part, names in ((graph.node, {"WantsTopK", "TopKIfAsked"}), (graph.input, {"top_k"}),
                        (graph.output, {"top_log_probs", "top_tokens"}),
                        (graph.initializer, {"blocked_tokens", "zero_k"})):
        for i in reversed(range(len(part))):
            if part[i].name in names:
                del part[i]
    onnx.save(step, str(old / "step.onnx"))
    manifest = json.loads((old / "export.json").read_text())
    (old / "export.json").write_text(json.dumps({**manifest, "format_version": 1}))
    numpy_search, graph_search = RuntimeTranslator(old, threads=1), RuntimeTranslator(folder, threads=1)
    assert graph_search.model.graph_top_k and not numpy_search.model.graph_top_k
    for options in ({"beam_size": 1}, {"beam_size": 5, "n_best": 5}, {"beam_size": 2, "max_len": 3}):
        assert nbest(graph_search.translate(LINES, **options)) == nbest(numpy_search.translate(LINES, **options))
    (old / "export.json").write_text(json.dumps({**manifest, "format_version": 3}))
    with pytest.raises(ExportFolderError, match="has export format 3; this runtime reads formats 1 and 2"):
        read_manifest(old)


def test_an_ensemble_exports_as_several_step_graphs_and_decodes_as_the_engines(exported: dict, tmp_path: Path) -> None:
    runs = [str(exported["general"][0]), str(exported["none"][0])]  # a member without attention too
    folder = export(runs, tmp_path / "ensemble", beam_size=3)
    manifest = read_manifest(folder)
    assert [m["graphs"]["step"] for m in manifest["members"]] == ["member0.step.onnx", "member1.step.onnx"]
    engine = Translator.from_checkpoint(runs, device="cpu")
    runtime = RuntimeTranslator(folder, threads=1)
    assert runtime.defaults.beam_size == 3 and not runtime.model.graph_top_k  # the members' mean first
    for options in ({"beam_size": 1}, {"beam_size": 3, "n_best": 2}):
        assert_same(engine.translate(LINES, **options), runtime.translate(LINES, **options))


def test_int8_quantises_the_graphs_and_still_translates(exported: dict, tmp_path: Path) -> None:
    run, folder = exported["additive"]
    quantised = export(str(run), tmp_path / "int8", int8=True)
    assert read_manifest(quantised)["int8"] is True
    ops = {node.op_type for node in onnx.load(str(quantised / "step.onnx")).graph.node}
    assert ops & {"MatMulInteger", "DynamicQuantizeLinear", "DynamicQuantizeMatMul"}
    results = RuntimeTranslator(quantised, threads=1).translate(LINES, beam_size=2)
    assert [bool(r.text) for r in results] == [bool(line.strip()) for line in LINES]


def test_batched_equals_one_at_a_time(exported: dict) -> None:
    runtime = RuntimeTranslator(exported["dot"][1], threads=1)
    for beam in (1, 4):
        batched = runtime.translate(LINES, beam_size=beam)
        assert_same([runtime.translate([line], beam_size=beam)[0] for line in LINES], batched)


def test_bad_requests_are_refused_before_anything_is_written(exported: dict, tmp_path: Path) -> None:
    run = str(exported["additive"][0])
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ExportError, match="not an empty folder"):
        export(run, tmp_path / "full")
    with pytest.raises(ExportError, match="format=zip is not valid"):
        export(run, tmp_path / "a", format="zip")
    with pytest.raises(ExportError, match="one model"):
        export([run, run], tmp_path / "b", format="hub")
    with pytest.raises(ExportError, match="int8"):
        export(run, tmp_path / "c", format="hub", int8=True)
    with pytest.raises(TranslationError, match="beam_size must be"):
        export(run, tmp_path / "d", beam_size=0)
    with pytest.raises(CheckpointError, match="does not exist"):
        export(str(tmp_path / "missing"), tmp_path / "e")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]


def test_export_py_writes_a_folder_and_refuses_in_one_line(exported: dict, tmp_path: Path) -> None:
    run = exported["none"][0]
    command = [sys.executable, str(REPO_ROOT / "export.py"), f"checkpoint={run}", f"output={tmp_path / 'out'}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert read_manifest(tmp_path / "out")["members"][0]["attention"] == "none"
    for bad, message in (([f"checkpoint={tmp_path / 'missing'}", f"output={tmp_path / 'o2'}"], "does not exist"),
                         ([f"checkpoint={run}", f"output={tmp_path / 'o4'}", "int9=true"], "int8")):
        done = subprocess.run([sys.executable, str(REPO_ROOT / "export.py"), *bad], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
