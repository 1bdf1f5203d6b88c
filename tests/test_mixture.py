"""Training mixtures (nmt.data.mixture, weighted epochs in nmt.data.batching), tags, and Tatoeba's splits."""

from __future__ import annotations

import gzip
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO_ROOT, data_config, tokenizer_settings

from nmt.data import DataError, TokenBucketSampler, prepare_data
from nmt.data.encoded import SplitPart
from nmt.data.tatoeba import Tatoeba, TatoebaSettings, read_export, write_splits


def _write(path: Path, lines: list[str]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def _mixture_cfg(tmp_path: Path, tiny: tuple[list[str], list[str]], mixture: list[dict]) -> dict:
    root = tmp_path / "corpus"
    files = {"train": {"src": _write(root / "a.de", tiny[0][:200]), "tgt": _write(root / "a.en", tiny[1][:200])},
             "dev": {"src": _write(root / "dev.de", tiny[0][-20:]), "tgt": _write(root / "dev.en", tiny[1][-20:])},
             "tst": {"src": _write(root / "tst.de", tiny[0][-5:]), "tgt": _write(root / "tst.en", tiny[1][-5:])}}
    _write(root / "b.de", tiny[0][200:300])
    _write(root / "b.en", tiny[1][200:300])
    cfg = data_config("files", valid_split="dev", test_splits=["tst"], files=files, mixture=mixture)
    cfg["tokenizer"]["vocab_size"] = 300
    return cfg


def test_a_two_to_one_mixture_sees_two_to_one_pairs_every_epoch() -> None:
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(2, 30, 900), rng.integers(2, 30, 900)
    parts = [SplitPart("a", 300, 2.0), SplitPart("b", 600, 0.5)]
    sampler = TokenBucketSampler(src, tgt, 500, shuffle=True, seed=3, parts=parts)
    counts = []
    for epoch in range(3):
        order, spans = sampler.epoch_plan(epoch)
        seen = np.bincount(order, minlength=900)
        assert (seen[:300] == 2).all()  # a whole weight: every pair, twice
        assert seen[300:].sum() == 300 and set(seen[300:].tolist()) == {0, 1}  # half of b, none twice
        assert seen[:300].sum() == 2 * seen[300:].sum()  # 2 x 300 : 0.5 x 600 = 2 : 1
        counts.append((len(spans), seen[300:]))
    assert len({n for n, _ in counts}) == 1  # the same number of batches every epoch (the schedule relies on it)
    assert (counts[0][1] != counts[1][1]).any()  # a fractional weight draws a new subset each epoch


def test_a_mixture_is_one_training_split_with_its_sources_recorded(
    tmp_path: Path, tiny_parallel: tuple[list[str], list[str]]
) -> None:
    root = tmp_path / "corpus"
    mixture = [{"corpus": "files", "weight": 2}, {"src": str(root / "b.de"), "tgt": str(root / "b.en"),
                                                  "tag": "<bt>", "name": "synthetic"}]
    data = prepare_data(_mixture_cfg(tmp_path, tiny_parallel, mixture), cache_dir=tmp_path / "cache")
    assert [tuple(p) for p in data.train.parts] == [("files", 200, 2.0), ("synthetic", 100, 1.0)]
    sources = data.stats["sources"]
    assert [(s["name"], s["pairs"], s["weight"], s["tag"]) for s in sources] == [
        ("files", 200, 2.0, None), ("synthetic", 100, 1.0, "<bt>")]
    assert all(len(s["files"]) == 2 and all(len(h) == 64 for h in s["files"].values()) for s in sources)
    # The tag reaches the encoder input: the first id of every pair of the tagged source, of none other.
    tag_id = data.tokenizer.encode_src("<bt>")[0]
    assert data.tokenizer.tags == ("<bt>",) and data.tokenizer.src_pieces([tag_id]) == ["<bt>"]
    assert all(data.train.src_ids[i][0] == tag_id for i in range(200, 300))
    assert not any(tag_id in data.train.src_ids[i] for i in range(200))
    sampler = TokenBucketSampler.from_split(data.train, 400, shuffle=True, seed=1)
    assert np.bincount(sampler.epoch_plan(0)[0], minlength=300)[:200].tolist() == [2] * 200


def test_a_tagged_model_translates_with_and_without_the_tag(tiny_parallel: tuple[list[str], list[str]]) -> None:
    from nmt.data import train_tokenizer

    tokenizer = train_tokenizer(*tiny_parallel, tokenizer_settings(vocab_size=400), tags=["<bt>"])
    plain = tiny_parallel[0][0]
    tagged = tokenizer.encode_src(f"<bt> {plain}")
    assert tagged == [tokenizer.encode_src("<bt>")[0], *tokenizer.encode_src(plain)]  # one id, no stray "▁"
    assert tokenizer.encode_src_batch([f"<bt> {plain}", plain]) == [tagged, tokenizer.encode_src(plain)]
    assert tokenizer.decode_src(tokenizer.encode_src(plain)) == plain


@pytest.mark.parametrize(("entry", "message"), [
    ({"corpus": "files", "weight": 0}, "data.mixture[0].weight=0 must be a number > 0"),
    ({"corpus": "files", "weight": -1.5}, "must be a number > 0"),
    ({"corpus": "wmt14"}, "data.mixture[0].corpus='wmt14' is not a registered corpus"),
    ({"corpus": "files", "weigth": 2}, "did you mean data.mixture[0].weight?"),
    ({"src": "a.de"}, "must name exactly one source"),
    ({"corpus": "files", "tag": "<b t>"}, "must be one token without spaces"),
])
def test_a_bad_mixture_entry_names_the_entry_and_the_fix(
    tmp_path: Path, tiny_parallel: tuple[list[str], list[str]], entry: dict, message: str
) -> None:
    with pytest.raises(DataError, match=message.replace("[", r"\[").replace("]", r"\]").replace("?", r"\?")):
        prepare_data(_mixture_cfg(tmp_path, tiny_parallel, [entry]), cache_dir=tmp_path / "cache")


def test_a_synthetic_source_of_another_language_pair_is_refused(
    tmp_path: Path, tiny_parallel: tuple[list[str], list[str]]
) -> None:
    bt = tmp_path / "bt_de"  # back-translated for en -> de: train.en (synthetic) and train.de (real)
    _write(bt / "train.en", ["a"])
    _write(bt / "train.fr", ["b"])
    cfg = _mixture_cfg(tmp_path, tiny_parallel, [{"corpus": "files"}, {"synthetic": str(bt)}])
    with pytest.raises(DataError, match=r"holds pairs in en-fr, not de-en .*different language pairs"):
        prepare_data(cfg, cache_dir=tmp_path / "cache")


def test_an_unfinished_back_translation_is_refused_with_its_command(
    tmp_path: Path, tiny_parallel: tuple[list[str], list[str]]
) -> None:
    bt = tmp_path / "bt_en"
    _write(bt / "train.de", ["ein"])
    _write(bt / "train.en", ["one"])
    (bt / "provenance.json").write_text('{"status": "partial", "lines": {"done": 1, "input": 3}, '
                                       '"command": "python backtranslate.py checkpoint=r input=m.en lang=en output=o"}')
    cfg = _mixture_cfg(tmp_path, tiny_parallel, [{"corpus": "files"}, {"synthetic": str(bt)}])
    with pytest.raises(DataError, match=r"unfinished back-translation \(1 of 3 lines\): run its command again to "
                                        r"finish it: python backtranslate.py checkpoint=r"):
        prepare_data(cfg, cache_dir=tmp_path / "cache")


def test_a_bad_weight_on_the_command_line_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "train.py", "data.mixture=[{corpus:multi30k,weight:0}]", "data.mirror=null",
         f"data.cache_dir={tmp_path}", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().count("\n") == 0 and "data.mixture[0].weight=0" in result.stderr


# --- Tatoeba ---------------------------------------------------------------------------------------

def _export(path: Path, lines: list[str]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("deu.txt", "".join(line + "\n" for line in lines))
        archive.writestr("_about.txt", "terms")
    return path


def test_training_pairs_that_share_a_side_with_the_test_set_are_dropped(tmp_path: Path) -> None:
    export = _export(tmp_path / "deu-eng.zip", [
        "Hi.\tHallo!", "Run!\tLauf!", "I won.\tIch hab gewonnen.", "Wow!\tDonnerwetter!", "Fire!\tFeuer!"])
    tests = {"de": Path(_write(tmp_path / "t.deu", ["Lauf!", "Nichts."])),
             "en": Path(_write(tmp_path / "t.eng", ["Run!", "I won."]))}
    stats = write_splits(export, tests, tmp_path / "out", TatoebaSettings(dev_size=1, dev_seed=0))
    assert stats["dropped_test_overlap"] == 2  # "Run!" (both sides) and "I won." (English side only)
    kept = [line for split in ("train", "dev") for line in (tmp_path / "out" / f"{split}.en").read_text().splitlines()]
    assert sorted(kept) == ["Fire!", "Hi.", "Wow!"]
    assert (tmp_path / "out" / "test.de").read_text() == "Lauf!\nNichts.\n"


def test_the_dev_split_keeps_every_english_sentence_on_one_side(tmp_path: Path) -> None:
    lines = [f"Sentence {i}.\tSatz {i} Variante {v}." for i in range(60) for v in range(1 + i % 3)]
    export = _export(tmp_path / "deu-eng.zip", lines)
    tests = {"de": Path(_write(tmp_path / "t.deu", ["x"])), "en": Path(_write(tmp_path / "t.eng", ["y"]))}
    stats = write_splits(export, tests, tmp_path / "out", TatoebaSettings(dev_size=20, dev_seed=5))
    train, dev = ((tmp_path / "out" / f"{s}.en").read_text().splitlines() for s in ("train", "dev"))
    assert not set(train) & set(dev) and len(dev) >= 20 and len(train) + len(dev) == len(lines)
    assert stats["dev_pairs"] == len(dev)
    again = write_splits(export, tests, tmp_path / "again", TatoebaSettings(dev_size=20, dev_seed=5))
    assert (tmp_path / "again" / "dev.de").read_text() == (tmp_path / "out" / "dev.de").read_text()  # seeded
    assert again == stats


def test_a_line_without_a_tab_names_the_file_and_line(tmp_path: Path) -> None:
    export = _export(tmp_path / "deu-eng.zip", ["Hi.\tHallo!", "just one column"])
    with pytest.raises(DataError, match=r"deu-eng.zip:deu.txt, line 2: no tab"):
        list(read_export(export))


@pytest.mark.parametrize("damage", ["truncated", "not a zip"])
def test_a_corrupt_or_truncated_zip_is_a_data_error(tmp_path: Path, damage: str) -> None:
    good = _export(tmp_path / "good.zip", [f"Sentence {i}.\tSatz {i}." for i in range(2000)]).read_bytes()
    bad = tmp_path / "deu-eng.zip"
    bad.write_bytes(good[: len(good) // 2] if damage == "truncated" else gzip.compress(good))
    with pytest.raises(DataError, match=r"cannot read .*deu-eng.zip.*truncated or corrupt"):
        list(read_export(bad))


def test_another_export_is_refused_with_the_setting_that_accepts_it(tmp_path: Path) -> None:
    newer = _export(tmp_path / "deu-eng-2024.zip", ["Hi.\tHallo!\tCC-BY 2.0 (France) Attribution: tatoeba.org"])
    corpus = Tatoeba(tmp_path / "cache", None, TatoebaSettings(zip=str(newer)))
    with pytest.raises(DataError, match=r"a different Tatoeba export. To train on it anyway, add "
                                        r"data.tatoeba.sha256=[0-9a-f]{64} .* or .* data=files"):
        corpus.split_files("train", "de", "en")
    from nmt.data.fetch import sha256_of

    accepted = TatoebaSettings(zip=str(newer), sha256=sha256_of(newer))
    assert list(read_export(Path(accepted.zip))) == [("Hi.", "Hallo!")]  # extra columns are not read


@pytest.mark.slow
def test_tatoeba_from_the_mirror(mirror_dir: Path, tmp_path: Path) -> None:
    corpus = Tatoeba(tmp_path, mirror_dir)
    src, tgt = corpus.split_files("test", "en", "de")
    assert src.name == "test.en" and len(src.read_text().splitlines()) == 17565
    info = corpus.info()
    assert info["export_pairs"] == 169813 and info["train_pairs"] + info["dev_pairs"] == 159674
    assert info["dropped_test_overlap"] == 169813 - 159674
