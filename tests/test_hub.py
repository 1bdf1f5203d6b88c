"""Hub folders (``export.py format=hub``): files, model card, and loading by path, by repo id and by the tools."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import SRC, TGT, save_tiny_checkpoint, serve_in_thread
from omegaconf import OmegaConf
from safetensors import safe_open
from safetensors.torch import save

from nmt import Translator
from nmt.export import ExportError, ExportSettings, export_main
from nmt.inference.engine import SearchOptions
from nmt.model.checkpoint import CheckpointError, load_checkpoint
from tests.test_server import call, serve_settings

REPO_ROOT = Path(__file__).resolve().parents[1]
LINES = [*SRC, "", "Zwei Hunde spielen im Schnee."]
SCORES = {"bleu": 12.34, "chrf": 40.5, "length_ratio": 1.0, "bleu_signature": "nrefs:1|case:mixed|tok:13a|v:2.6.0",
          "chrf_signature": "nrefs:1|case:mixed|nc:6|nw:0|v:2.6.0"}


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def run_and_hub(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny general-attention run with a results.json, and its Hub folder."""
    root = tmp_path_factory.mktemp("hub")
    run = save_tiny_checkpoint(root / "run" / "checkpoints" / "best.pt", "general", seed=3).parent.parent
    results = {"beam_size": 5, "length_penalty": 1.0, "test": {"test_2016_flickr": SCORES}}
    (run / "results.json").write_text(json.dumps(results))
    settings = ExportSettings(checkpoint=str(run), output=str(root / "hub"), format="hub", license="mit")
    return run, export_main(OmegaConf.structured(settings))


def outputs(translator: Translator) -> list[list[tuple[str, float]]]:
    return [[(c.text, c.score) for c in r.nbest] for options in ({"beam_size": 1}, {"beam_size": 4, "n_best": 2})
            for r in translator.translate(LINES, **options)]


def test_the_folder_holds_weights_config_tokenizer_and_a_model_card(run_and_hub: tuple[Path, Path]) -> None:
    run, hub = run_and_hub
    assert sorted(p.name for p in hub.iterdir()) == ["README.md", "config.json", "joint.model", "model.safetensors"]
    config = json.loads((hub / "config.json").read_text())
    assert (config["src_lang"], config["tgt_lang"], config["attention"]) == ("de", "en", "general")
    assert config["training_config"]["model"]["dec_hidden_size"] == 7
    card = (hub / "README.md").read_text()
    _, header, body = card.split("---\n", 2)
    meta = yaml.safe_load(header)
    assert meta["language"] == ["de", "en"] and meta["license"] == "mit" and meta["pipeline_tag"] == "translation"
    [result] = meta["model-index"][0]["results"]
    assert result["dataset"]["split"] == "test_2016_flickr"
    metrics = {m["type"]: m for m in result["metrics"]}
    assert metrics["bleu"]["value"] == 12.34 and metrics["chrf"]["value"] == 40.5
    assert metrics["bleu"]["args"]["sacrebleu_signature"] == SCORES["bleu_signature"]
    for words in ("Attention: `general`", "Translator.from_pretrained", "## Training config", "12.34",
                  config["provenance"]["sources"][0]["sha256"]):
        assert words in body


def test_from_pretrained_translates_as_the_checkpoint(run_and_hub: tuple[Path, Path]) -> None:
    run, hub = run_and_hub
    expected = outputs(Translator.from_checkpoint(run, device="cpu"))
    assert outputs(Translator.from_pretrained(hub, device="cpu")) == expected
    info = Translator.from_checkpoint(hub, device="cpu").info()
    assert info["attention"] == "general" and info["bleu"] == {"test_2016_flickr": 12.34}
    assert len({texts[0][0] for texts in expected}) > 2  # the sentences translate differently


def test_a_repo_id_loads_from_the_local_hub_cache_offline(run_and_hub: tuple[Path, Path], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    run, hub = run_and_hub
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "cache" / "models--someone--tiny-de-en"
    shutil.copytree(hub, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    translator = Translator.from_pretrained("someone/tiny-de-en", device="cpu")
    assert outputs(translator) == outputs(Translator.from_checkpoint(run, device="cpu"))
    with pytest.raises(CheckpointError, match="someone/missing is neither a local folder nor a Hub repo"):
        Translator.from_pretrained("someone/missing", device="cpu")


def test_translate_py_and_the_server_take_the_folder(run_and_hub: tuple[Path, Path], tmp_path: Path) -> None:
    from nmt.serve.app import create_app

    run, hub = run_and_hub
    reference = Translator.from_checkpoint(run, device="cpu").translate(LINES, beam_size=5)
    source = tmp_path / "in.de"
    source.write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    done = subprocess.run([sys.executable, str(REPO_ROOT / "translate.py"), f"checkpoint={hub}", f"input={source}"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:-1] == [r.text for r in reference]
    settings = serve_settings(f"checkpoint={hub}", "max_len=200")
    with serve_in_thread(create_app(Translator.from_settings(settings), settings)) as url:
        status, body = call(f"{url}/v1/translate", {"text": SRC, "beam_size": 5})
    assert status == 200 and [t["text"] for t in body["translations"]] == [r.text for r in reference[: len(SRC)]]


def test_a_broken_folder_is_one_checkpoint_error(run_and_hub: tuple[Path, Path], tmp_path: Path) -> None:
    _, hub = run_and_hub
    broken = tmp_path / "broken"
    shutil.copytree(hub, broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    with pytest.raises(CheckpointError, match="not the config of an nmt model"):
        load_checkpoint(broken)
    (broken / "config.json").write_text(json.dumps(config))
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="cannot read the model"):
        load_checkpoint(broken)


def test_tied_embeddings_are_stored_once_and_loaded_under_both_names(run_and_hub: tuple[Path, Path],
                                                                     tmp_path: Path) -> None:
    """The tied output matrix is one tensor in model.safetensors (its second copy was a fifth of the default
    model's file); both names come back. A folder written with two copies (before) still loads."""
    run, hub = run_and_hub
    with safe_open(str(hub / "model.safetensors"), framework="pt") as handle:
        stored, twins = set(handle.keys()), json.loads(handle.metadata()["tied"])
    checkpoint = load_checkpoint(run)["model"]
    assert twins and not set(twins) & stored and stored | set(twins) == set(checkpoint)
    assert all(torch.equal(load_checkpoint(hub)["model"][name], tensor) for name, tensor in checkpoint.items())
    older = tmp_path / "older"
    shutil.copytree(hub, older)
    both = {name: tensor.clone() for name, tensor in checkpoint.items()}
    (older / "model.safetensors").write_bytes(save(both, metadata={"format": "pt"}))
    assert all(torch.equal(load_checkpoint(older)["model"][name], tensor) for name, tensor in checkpoint.items())


def test_half_precision_weights_are_half_the_size_and_translate_as_the_checkpoint(
        run_and_hub: tuple[Path, Path], tmp_path: Path) -> None:
    run, hub = run_and_hub
    half = export_main(OmegaConf.structured(ExportSettings(checkpoint=str(run), output=str(tmp_path / "half"),
                                                           format="hub", half=True)))
    ratio = (half / "model.safetensors").stat().st_size / (hub / "model.safetensors").stat().st_size
    assert 0.45 < ratio < 0.6, ratio  # the same header (names, shapes) in both: a tiny model is not quite half
    assert json.loads((half / "config.json").read_text())["weights_dtype"] == "float16"
    loaded = load_checkpoint(half)["model"]
    assert all(t.dtype == torch.float32 for t in loaded.values() if t.is_floating_point())
    reference = Translator.from_checkpoint(run, device="cpu").translate(LINES, beam_size=5)
    halved = Translator.from_pretrained(half, device="cpu").translate(LINES, beam_size=5)
    assert [r.text for r in halved] == [r.text for r in reference]


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_shipped_folder_with_its_weights_missing_or_damaged_is_one_line(run_and_hub: tuple[Path, Path],
                                                                          tmp_path: Path, damage: str) -> None:
    _, hub = run_and_hub
    broken = tmp_path / "model"
    shutil.copytree(hub, broken)
    weights = broken / "model.safetensors"
    if damage == "missing":
        weights.unlink()
    else:
        weights.write_bytes(weights.read_bytes()[:1000])
    source = tmp_path / "in.de"
    source.write_text(LINES[0] + "\n", encoding="utf-8")
    for script in ("translate.py", "serve.py"):
        done = subprocess.run([sys.executable, str(REPO_ROOT / script), f"checkpoint={broken}", f"input={source}"
                               if script == "translate.py" else "port=0"], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr[-2000:]
        assert f"{weights}" in done.stderr and "Traceback" not in done.stderr
        assert ("is missing" if damage == "missing" else "truncated or damaged") in done.stderr


def test_an_unscored_checkpoint_gets_a_card_without_a_model_index(tmp_path: Path) -> None:
    """last.pt has no recorded scores (train.py scores best.pt): the card says so, and its header has no metrics."""
    last = save_tiny_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", "none")
    folder = export_main(OmegaConf.structured(ExportSettings(checkpoint=str(last), output=str(tmp_path / "hub"),
                                                             format="hub")))
    _, header, body = (folder / "README.md").read_text().split("---\n", 2)
    meta = yaml.safe_load(header)
    assert "model-index" not in meta and meta["license"] == "unknown" and "attention-none" in meta["tags"]
    assert "No test scores were recorded" in body and "## License\n\n`unknown`." in body


def test_license_other_names_its_terms_in_the_card_and_is_refused_without_them(run_and_hub: tuple[Path, Path],
                                                                               tmp_path: Path) -> None:
    """The Hub's card metadata asks for ``license_name`` and ``license_link`` with ``license: other``."""
    run, _ = run_and_hub
    terms = {"license_name": "multi30k-terms", "license_link": "https://github.com/multi30k/dataset"}
    folder = export_main(OmegaConf.structured(ExportSettings(checkpoint=str(run), output=str(tmp_path / "hub"),
                                                             format="hub", license="other", **terms)))
    _, header, body = (folder / "README.md").read_text().split("---\n", 2)
    assert {key: yaml.safe_load(header)[key] for key in ("license", *terms)} == {"license": "other", **terms}
    assert "## License\n\n`other`: [multi30k-terms](https://github.com/multi30k/dataset)." in body
    for license_id, given, words in (("other", {"license_name": "x"}, "license=other needs license_name=ID and "
                                      "license_link=URL"), ("mit", terms, "license_name and license_link name")):
        with pytest.raises(ExportError, match=words):
            export_main(OmegaConf.structured(ExportSettings(checkpoint=str(run), output=str(tmp_path / "refused"),
                                                            format="hub", license=license_id, **given)))
        assert not (tmp_path / "refused").exists()


def test_a_folder_decodes_with_the_search_it_was_exported_with(run_and_hub: tuple[Path, Path],
                                                              tmp_path: Path) -> None:
    """export.py's beam_size and length_penalty go into config.json's search: Translator, translate.py and serve.py
    decode with them unless told otherwise (a shipped model chosen on val at beam 10, α 1.4 scores as chosen)."""
    from nmt.serve.app import create_app

    run, _ = run_and_hub
    folder = export_main(OmegaConf.structured(ExportSettings(checkpoint=str(run), output=str(tmp_path / "greedy"),
                                                             format="hub", beam_size=1, length_penalty=0.6)))
    assert json.loads((folder / "config.json").read_text())["search"] == {
        "beam_size": 1, "length_penalty": 0.6, "max_len": 200, "max_len_ratio": 1.5}
    card = (folder / "README.md").read_text()
    assert "decode with beam 1, length penalty 0.6" in card  # the run's scores were at beam 5: the card says so
    assert "Decoded with beam 5, length penalty 1.0. This folder decodes with beam 1, length penalty 0.6" in card
    checkpoint = Translator.from_checkpoint(run, device="cpu")
    greedy = [r.text for r in checkpoint.translate(LINES, beam_size=1, length_penalty=0.6)]
    beam5 = [r.text for r in checkpoint.translate(LINES, beam_size=5)]
    assert greedy != beam5  # else this test could not tell the two searches apart
    shipped = Translator.from_pretrained(folder, device="cpu")
    assert [r.text for r in shipped.translate(LINES)] == greedy
    assert [r.text for r in shipped.translate(LINES, beam_size=5, length_penalty=1.0)] == beam5
    source = tmp_path / "in.de"
    source.write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    for typed, expected in (([], greedy), (["beam_size=5", "length_penalty=1.0"], beam5)):  # typed: even = defaults
        done = subprocess.run([sys.executable, str(REPO_ROOT / "translate.py"), f"checkpoint={folder}",
                               f"input={source}", *typed], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert done.returncode == 0 and done.stdout.split("\n")[:-1] == expected, done.stderr[-2000:]
    settings = serve_settings(f"checkpoint={folder}", "max_len=200")
    with serve_in_thread(create_app(Translator.from_settings(settings), settings)) as url:
        _, model = call(f"{url}/v1/model")
        status, body = call(f"{url}/v1/translate", {"text": SRC})
    assert (model["defaults"]["beam_size"], model["defaults"]["length_penalty"]) == (1, 0.6)
    assert status == 200 and [t["text"] for t in body["translations"]] == greedy[: len(SRC)]


def test_a_folder_with_bad_search_options_is_one_checkpoint_error(run_and_hub: tuple[Path, Path],
                                                                  tmp_path: Path) -> None:
    _, hub = run_and_hub
    broken = tmp_path / "model"
    shutil.copytree(hub, broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "search": {**config["search"], "beam_size": 0}}))
    with pytest.raises(CheckpointError, match=r"config.json: its search options are not valid \(beam_size must be"):
        Translator.from_pretrained(broken, device="cpu")
    del config["search"]  # a folder written before folders kept their search: the defaults
    (broken / "config.json").write_text(json.dumps(config))
    assert Translator.from_pretrained(broken, device="cpu").search_defaults == SearchOptions()


def test_score_true_records_the_folder_s_own_test_scores_as_shipped(run_and_hub: tuple[Path, Path],
                                                                   tmp_path: Path) -> None:
    """export.py score=true: the card and config.json give the test BLEU of the folder itself (float16 weights, its
    search), as sacreBLEU scores what translate.py makes of it; the checkpoint's scores stay in the provenance."""
    from nmt.common.metrics import corpus_scores
    from nmt.model.checkpoint import save_checkpoint

    run, _ = run_and_hub
    (tmp_path / "test.de").write_text("".join(f"{line}\n" for line in SRC), encoding="utf-8")
    (tmp_path / "test.en").write_text("".join(f"{line}\n" for line in TGT), encoding="utf-8")
    checkpoint = load_checkpoint(run)
    checkpoint["config"]["data"].update(corpus="files", test_splits=["test"], mirror=str(tmp_path), files={
        "test": {"src": str(tmp_path / "test.de"), "tgt": str(tmp_path / "test.en")}})
    scored_run = save_checkpoint(tmp_path / "run" / "checkpoints" / "best.pt", checkpoint).parent.parent
    shutil.copy(run / "results.json", scored_run / "results.json")
    folder = export_main(OmegaConf.structured(ExportSettings(
        checkpoint=str(scored_run), output=str(tmp_path / "hub"), format="hub", half=True, score=True, beam_size=3,
        length_penalty=0.6)))
    config = json.loads((folder / "config.json").read_text())
    source = tmp_path / "test.de"
    done = subprocess.run([sys.executable, str(REPO_ROOT / "translate.py"), f"checkpoint={folder}", f"input={source}"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    expected = corpus_scores(done.stdout.split("\n")[:-1], TGT)
    assert config["training_config"]["data"]["mirror"] is None  # this machine's corpus folder is not published
    results = config["results"]
    assert (results["beam_size"], results["length_penalty"], results["scored_as_shipped"]) == (3, 0.6, "float16")
    measured = results["test"]["test"]
    assert (measured["bleu"], measured["chrf"]) == pytest.approx((expected["bleu"], expected["chrf"]))
    assert expected["chrf"] > 0 and expected["bleu"] != SCORES["bleu"]
    assert config["provenance"]["sources"][0]["results"]["test"]["test_2016_flickr"]["bleu"] == SCORES["bleu"]
    _, header, body = (folder / "README.md").read_text().split("---\n", 2)
    metrics = yaml.safe_load(header)["model-index"][0]["results"][0]["metrics"]
    assert metrics[0]["value"] == round(expected["bleu"], 2)
    assert "Measured on this folder as shipped (float16 weights" in body and "do not measure" not in body


def test_score_true_without_a_test_split_is_one_line_and_leaves_no_folder(run_and_hub: tuple[Path, Path],
                                                                         tmp_path: Path) -> None:
    run, _ = run_and_hub
    done = subprocess.run([sys.executable, str(REPO_ROOT / "export.py"), f"checkpoint={run}", "format=hub",
                           "score=true", f"output={tmp_path / 'hub'}"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "names no data.corpus and data.test_splits to score" in done.stderr and ".partial" not in done.stderr
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its partial copy
