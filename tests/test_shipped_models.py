"""The trained models shipped in ``models/``: each loads and translates as the kept run it was exported from did.

Each folder's ``config.json`` names its checkpoint (relative to the repository) in its provenance; that run's kept
``results.json`` and test translations are in ``studies/``, so a change that breaks loading or decoding a
shipped folder fails here.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import serve_in_thread

from nmt import Translator
from tests.test_server import call, serve_settings

REPO_ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("multi30k-de-en", "multi30k-en-de")
TEST_SPLIT = "test_2016_flickr"
FIRST_LINES = 50
MAX_MB = 20


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def shipped(name: str) -> tuple[Path, dict, Path]:
    """The folder, its ``config.json``, and the kept run its weights came from."""
    folder = REPO_ROOT / "models" / name
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    checkpoint = Path(config["provenance"]["sources"][0]["checkpoint"])
    assert not checkpoint.is_absolute(), f"{name}: its provenance names a machine's path, {checkpoint}"
    return folder, config, REPO_ROOT / checkpoint.parent.parent


def test_two_models_are_shipped_each_within_the_size_limit() -> None:
    assert sorted(p.name for p in (REPO_ROOT / "models").iterdir() if p.is_dir()) == sorted(SHIPPED)
    for name in SHIPPED:
        size = sum(p.stat().st_size for p in (REPO_ROOT / "models" / name).iterdir())
        assert size <= MAX_MB * 1_000_000, f"{name}: {size / 1e6:.1f} MB"


@pytest.mark.parametrize("name", SHIPPED)
def test_its_card_gives_its_own_scores_within_0_1_bleu_of_its_run_and_the_data_s_terms(name: str) -> None:
    folder, config, run = shipped(name)
    assert (config["src_lang"], config["tgt_lang"]) == tuple(name.split("-", 1)[1].split("-"))
    assert config["results"]["scored_as_shipped"] == config["weights_dtype"] == "float16"
    shipped_scores = config["results"]["test"][TEST_SPLIT]
    kept = json.loads((run / "results.json").read_text(encoding="utf-8"))
    assert (kept["beam_size"], kept["length_penalty"]) == (config["search"]["beam_size"],
                                                           config["search"]["length_penalty"])
    assert abs(shipped_scores["bleu"] - kept["test"][TEST_SPLIT]["bleu"]) <= 0.1
    assert abs(shipped_scores["chrf"] - kept["test"][TEST_SPLIT]["chrf"]) <= 0.1
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert f"| {TEST_SPLIT} | {shipped_scores['bleu']:.2f} |" in card and "Measured on this folder as shipped" in card
    assert "license: other" in card and "license_link: https://github.com/multi30k/dataset" in card
    command = config["provenance"]["command"]
    assert not [arg for arg in command.split() if arg.partition("=")[2].startswith("/")], command  # no machine's path


@pytest.mark.slow  # the real corpus
@pytest.mark.parametrize("name", SHIPPED)
def test_it_translates_the_first_test_lines_as_its_kept_run_did(name: str, mirror_dir: Path) -> None:
    """float16 weights read back into float32 round a little differently from the checkpoint's: one line in a
    thousand may differ, so two of the first fifty may."""
    folder, config, run = shipped(name)
    with gzip.open(mirror_dir / "multi30k" / f"{TEST_SPLIT}.{config['src_lang']}.gz", "rt", encoding="utf-8") as f:
        sources = [next(f).rstrip("\n") for _ in range(FIRST_LINES)]
    kept = (run / "translations" / f"{TEST_SPLIT}.{config['tgt_lang']}").read_text(encoding="utf-8").splitlines()
    translations = [r.text for r in Translator.from_pretrained(folder, device="cpu").translate(sources)]
    same = sum(a == b for a, b in zip(translations, kept[:FIRST_LINES], strict=True))
    assert same >= FIRST_LINES - 2, f"{name}: {same} of {FIRST_LINES} lines as kept"


@pytest.mark.slow  # a translate.py process
def test_translate_py_and_serve_py_take_a_shipped_folder_as_it_is(tmp_path: Path) -> None:
    from nmt.serve.app import create_app

    folder = REPO_ROOT / "models" / "multi30k-de-en"
    lines = ["Ein Hund rennt durch den Schnee.", "Zwei Kinder spielen am Strand."]
    expected = [r.text for r in Translator.from_pretrained(folder, device="cpu").translate(lines)]
    (tmp_path / "in.de").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    done = subprocess.run([sys.executable, str(REPO_ROOT / "translate.py"), "checkpoint=models/multi30k-de-en",
                           f"input={tmp_path / 'in.de'}"], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == expected and "dog" in expected[0]
    settings = serve_settings(f"checkpoint={folder}", "max_len=200")  # the folder's own limit
    with serve_in_thread(create_app(Translator.from_settings(settings), settings)) as url:
        status, body = call(f"{url}/v1/translate", {"text": lines})
        page_status, page = call(url + "/", None)
    assert status == 200 and [t["text"] for t in body["translations"]] == expected
    assert page_status == 200 and "attention" in page.lower()
