"""nmt.data.fetch, corpora, text and prepare_data: fetching, verification, reading, cleaning, bad input.

Never touches the network: an autouse fixture replaces ``download_url`` with one that fails.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import urllib.error
from pathlib import Path

import pytest
from conftest import data_config

from nmt.data import DataError, corpora, fetch, prepare_data
from nmt.data.corpora import MULTI30K_SHA256, MULTI30K_SPLITS, Multi30k, build_corpus
from nmt.data.fetch import fetch_file, mirror_folder
from nmt.data.text import PairFilter, iter_pairs, read_lines

_real_download_url = fetch.download_url


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every download attempt fails (and is recorded), as on a machine without network."""
    attempts: list[str] = []

    def offline(url: str, dest: Path, timeout: float = 0) -> None:
        attempts.append(url)
        raise urllib.error.URLError("network disabled in tests")

    monkeypatch.setattr(fetch, "download_url", offline)
    return attempts


def _gz(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb") as f:
        f.write(text.encode() if isinstance(text, str) else text)
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


# -- fetching and verifying ---------------------------------------------------------------------------


def test_fetch_verifies_and_then_reuses_the_cache(tmp_path: Path, _no_network: list[str]) -> None:
    mirror_file = _gz(tmp_path / "mirror" / "toy" / "train.de.gz", "Hallo Welt\n")
    cache = tmp_path / "cache"
    got = fetch_file(
        "train.de.gz",
        "https://example.invalid/train.de.gz",
        cache,
        sha256=_sha(mirror_file),
        corpus="toy",
        mirror=tmp_path / "mirror",
    )
    assert got == cache / "train.de.gz" and got.read_bytes() == mirror_file.read_bytes()
    assert [p.name for p in cache.iterdir()] == ["train.de.gz"]  # no temporary files left over

    mirror_file.unlink()  # present and verified: not fetched again
    again = fetch_file(
        "train.de.gz",
        "https://example.invalid/train.de.gz",
        cache,
        sha256=_sha(got),
        corpus="toy",
        mirror=tmp_path / "mirror",
    )
    assert again == got and _no_network == []


def test_fetch_accepts_the_flat_mirror_layout(tmp_path: Path) -> None:
    mirror_file = _gz(tmp_path / "mirror" / "val.en.gz", "hello\n")
    got = fetch_file(
        "val.en.gz",
        "https://example.invalid/val.en.gz",
        tmp_path / "cache",
        sha256=_sha(mirror_file),
        corpus="toy",
        mirror=tmp_path / "mirror",
    )
    assert got.read_bytes() == mirror_file.read_bytes()


def test_hash_mismatch_names_both_hashes_and_removes_the_copy(tmp_path: Path) -> None:
    mirror_file = _gz(tmp_path / "mirror" / "toy" / "train.en.gz", "tampered\n")
    expected = "0" * 64
    with pytest.raises(DataError) as err:
        fetch_file(
            "train.en.gz",
            "https://example.invalid/train.en.gz",
            tmp_path / "cache",
            sha256=expected,
            corpus="toy",
            mirror=tmp_path / "mirror",
        )
    message = str(err.value)
    assert expected in message and _sha(mirror_file) in message and "train.en.gz" in message
    assert list((tmp_path / "cache").iterdir()) == []  # neither the file nor a .part remains
    assert mirror_file.exists()  # the mirror is read-only to us


def test_a_corrupt_cached_file_is_fetched_again(tmp_path: Path) -> None:
    mirror_file = _gz(tmp_path / "mirror" / "train.fr.gz", "bonjour\n")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "train.fr.gz").write_bytes(b"garbage")
    got = fetch_file(
        "train.fr.gz",
        "https://example.invalid/x",
        tmp_path / "cache",
        sha256=_sha(mirror_file),
        corpus="toy",
        mirror=tmp_path / "mirror",
    )
    assert got.read_bytes() == mirror_file.read_bytes()


def test_no_network_and_no_mirror_says_which_file_url_and_how_to_set_the_mirror(
    tmp_path: Path, _no_network: list[str]
) -> None:
    corpus = Multi30k(tmp_path / "cache", mirror=None)
    with pytest.raises(DataError) as err:
        corpus.split_files("train", "de", "en")
    message = str(err.value)
    url = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/train.de.gz"
    assert "train.de.gz" in message and url in message
    assert "NMT_DATA_MIRROR" in message and "data.mirror" in message
    assert _no_network == [url]
    assert not (tmp_path / "cache" / "multi30k" / "train.de.gz").exists()


def test_a_saved_mirror_that_is_not_a_folder_here_gives_way_to_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A run's config saved on another machine names a mirror missing here: $NMT_DATA_MIRROR stands in."""
    here = tmp_path / "mirror"
    here.mkdir()
    gone = tmp_path / "elsewhere" / "corpora"
    monkeypatch.setenv("NMT_DATA_MIRROR", str(here))
    with caplog.at_level(logging.WARNING):
        assert mirror_folder(gone) == here
    assert f"{gone} is not a folder; using NMT_DATA_MIRROR={here} instead" in caplog.text
    assert mirror_folder(here) == here and mirror_folder(None) == here  # an unset data.mirror: the environment's
    monkeypatch.setenv("NMT_DATA_MIRROR", str(tmp_path / "also-gone"))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert mirror_folder(gone) is None and mirror_folder(None) is None
    assert f"{gone} is not a folder; ignoring it" in caplog.text
    assert f"{tmp_path / 'also-gone'} is not a folder; ignoring it" in caplog.text
    monkeypatch.delenv("NMT_DATA_MIRROR")
    assert mirror_folder(gone) is None and mirror_folder(None) is None


def test_an_invalid_url_is_a_data_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch, "download_url", _real_download_url)  # the real one; no network used
    monkeypatch.setattr(corpora, "MULTI30K_URL", "file:///nonexistent-nmt-dir/{name}")
    corpus = Multi30k(tmp_path / "cache")
    with pytest.raises(DataError, match=r"val\.en\.gz.*file:///nonexistent-nmt-dir/val\.en\.gz"):
        corpus.fetch("val.en.gz")


def test_multi30k_rejects_unknown_splits_and_languages(tmp_path: Path) -> None:
    corpus = Multi30k(tmp_path)
    with pytest.raises(DataError, match="test_2016_flickr"):  # lists the valid splits
        corpus.split_files("test2016", "de", "en")
    with pytest.raises(DataError, match="has no language 'cs'.*en, de, fr"):
        corpus.split_files("test_2017_mscoco", "cs", "en")


def test_registry_hashes_cover_the_known_splits() -> None:
    for split, langs in MULTI30K_SPLITS.items():  # the 2017 and 2018 test sets too: nothing is fetched unverified
        for lang in langs:
            assert len(MULTI30K_SHA256[f"{split}.{lang}.gz"]) == 64


def test_a_2017_test_file_that_is_not_the_official_one_is_refused(tmp_path: Path) -> None:
    _gz(tmp_path / "mirror" / "multi30k" / "test_2017_flickr.de.gz", "Ein Hund.\n")
    _gz(tmp_path / "mirror" / "multi30k" / "test_2017_flickr.en.gz", "A dog.\n")
    corpus = Multi30k(tmp_path / "cache", mirror=tmp_path / "mirror")
    with pytest.raises(DataError, match=MULTI30K_SHA256["test_2017_flickr.de.gz"]):
        corpus.split_files("test_2017_flickr", "de", "en")


def test_unknown_corpus_lists_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="files, multi30k"):
        build_corpus("wmt14", cache_dir=tmp_path)


# -- reading ------------------------------------------------------------------------------------------


def test_read_lines_plain_and_gz_strip_and_split_only_on_newline(tmp_path: Path) -> None:
    text = "  eins \r\nzwei\u2028drei\n\nvier"
    plain = tmp_path / "a.txt"
    plain.write_text(text, encoding="utf-8")
    expected = ["eins", "zwei\u2028drei", "", "vier"]  # U+2028 is not a line break in a corpus
    assert read_lines(plain) == expected
    assert read_lines(_gz(tmp_path / "a.txt.gz", text)) == expected


def test_line_count_mismatch_names_both_files_and_counts(tmp_path: Path) -> None:
    src = _write(tmp_path / "train.de", ["a", "b", "c"])
    tgt = _write(tmp_path / "train.en", ["a", "b"])
    with pytest.raises(DataError) as err:
        list(iter_pairs("train", src, tgt))
    message = str(err.value)
    assert str(src) in message and str(tgt) in message and "3 lines" in message and "has 2" in message


def test_invalid_utf8_error_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.de"
    bad.write_bytes(b"gut\nnoch gut\n" + b"M\xfcnchen\n")
    with pytest.raises(DataError) as err:
        read_lines(bad)
    assert str(bad) in str(err.value) and "line 3" in str(err.value)
    assert "invalid_utf8=replace" in str(err.value)  # the fix is in the message


def test_invalid_utf8_replace_warns_and_substitutes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bad = _gz(tmp_path / "bad.de.gz", b"ok\nM\xfcnchen\n")
    with caplog.at_level(logging.WARNING, logger="nmt.data.text"):
        lines = read_lines(bad, invalid_utf8="replace")
    assert lines == ["ok", "M\ufffdnchen"]
    assert "line 2" in caplog.text and "1 line(s)" in caplog.text


def test_empty_split_is_a_clear_error(tmp_path: Path) -> None:
    src, tgt = tmp_path / "e.de", tmp_path / "e.en"
    src.write_text("")
    tgt.write_text("")
    with pytest.raises(DataError, match=r"split 'valid' is empty"):
        list(iter_pairs("valid", src, tgt))


def test_a_truncated_gzip_is_a_data_error(tmp_path: Path) -> None:
    path = _gz(tmp_path / "t.en.gz", "hello world\n" * 100)
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(DataError, match="t.en.gz"):
        read_lines(path)


# -- cleaning -----------------------------------------------------------------------------------------


def test_cleaning_counts_each_reason(caplog: pytest.LogCaptureFixture) -> None:
    src = ["ein kurzer satz", "", "a b c d e f", "eins", "x " * 6, "gut so"]
    tgt = ["a short sentence", "empty source", "a", "one two three four", "y " * 6, ""]
    keep = PairFilter(max_len=5, max_ratio=3.0)
    with caplog.at_level(logging.INFO, logger="nmt.data.text"):
        kept = [pair for pair in zip(src, tgt) if keep(pair)]
        stats = keep.report("train")
    assert kept == [("ein kurzer satz", "a short sentence")]
    assert stats.total == 6 and stats.kept == 1
    assert stats.dropped == {"empty side": 2, "longer than 5 words": 2, "length ratio over 3.0": 1}
    assert "kept 1 of 6" in caplog.text


def test_cleaning_everything_away_is_an_error() -> None:
    keep = PairFilter(max_len=1)
    assert not keep(("a b c", "x y z"))
    with pytest.raises(DataError, match="max_len"):
        keep.report("train")


# -- prepare_data with corpus=files -------------------------------------------------------------------


def _files_cfg(tmp_path: Path, train_src: list[str], train_tgt: list[str], **overrides: object) -> dict:
    root = tmp_path / "corpus"
    val = (["kurz .", "", "x " * 200], ["short .", "nothing on the left", "y"])  # would all be cleaned
    files = {
        "train": {"src": str(_write(root / "train.de", train_src)), "tgt": str(_write(root / "train.en", train_tgt))},
        "dev": {"src": str(_write(root / "dev.de", val[0])), "tgt": str(_write(root / "dev.en", val[1]))},
        "tst": {"src": str(_gz(root / "tst.de.gz", "eins\nzwei\n")), "tgt": str(_gz(root / "tst.en.gz", "one\ntwo\n"))},
    }
    cfg = data_config("files", train_split="train", valid_split="dev", test_splits=["tst"], files=files,
                      clean={"max_len": 20, "max_ratio": 3.0})
    cfg["tokenizer"]["vocab_size"] = 300
    cfg.update(overrides)
    return cfg


def test_prepare_files_cleans_train_only(tmp_path: Path, tiny_parallel: tuple[list[str], list[str]]) -> None:
    src, tgt = list(tiny_parallel[0][:300]), list(tiny_parallel[1][:300])
    src[0], tgt[1] = "", ""  # two empty sides to drop
    data = prepare_data(_files_cfg(tmp_path, src, tgt), cache_dir=tmp_path / "cache")
    assert len(data.train) == 298 and data.stats["clean"]["dropped"]["empty side"] == 2
    assert len(data.valid) == 3 and data.valid.src_text[1] == ""  # validation is never filtered
    assert data.valid.src_ids[1] == []
    assert list(data.tests) == ["tst"] and data.tests["tst"].tgt_text == ["one", "two"]


def test_prepare_twice_reuses_tokenizer_and_encodings(
    tmp_path: Path, tiny_parallel: tuple[list[str], list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _files_cfg(tmp_path, tiny_parallel[0][:300], tiny_parallel[1][:300])
    first = prepare_data(cfg, cache_dir=tmp_path / "cache")
    from nmt.data import tokenizer as tokenizer_module

    def no_training(*args: object, **kwargs: object) -> bytes:
        raise AssertionError("the cached model should have been reused")

    monkeypatch.setattr(tokenizer_module, "_train_model", no_training)
    second = prepare_data(cfg, cache_dir=tmp_path / "cache")
    assert second.stats["encoded_cache_hits"] == 3
    assert second.train.src_ids == first.train.src_ids and second.valid.tgt_ids == first.valid.tgt_ids
    assert second.tokenizer.to_state() == first.tokenizer.to_state()


def test_files_corpus_names_a_missing_split_or_path(tmp_path: Path) -> None:
    cfg = _files_cfg(tmp_path, ["a"], ["b"])
    del cfg["files"]["dev"]
    with pytest.raises(DataError, match=r"no entry for split 'dev'.*data\.files\.dev\.src"):
        prepare_data(cfg, cache_dir=tmp_path / "cache")
    cfg = _files_cfg(tmp_path, ["a"], ["b"])
    cfg["files"]["tst"]["tgt"] = str(tmp_path / "missing.en")
    with pytest.raises(DataError, match=r"data\.files\.tst\.tgt = .*missing\.en does not exist"):
        prepare_data(cfg, cache_dir=tmp_path / "cache")
    with pytest.raises(DataError, match="needs data.files"):
        prepare_data({**cfg, "files": None}, cache_dir=tmp_path / "cache")


def test_unknown_config_key_names_the_nearest(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"unknown config key data\.max_tokns: did you mean data\.max_tokens\?"):
        prepare_data({"max_tokns": 10}, cache_dir=tmp_path)
    with pytest.raises(DataError, match=r"unknown config key data\.tokenizer\.vocab: did you mean "
                                        r"data\.tokenizer\.vocab_size\?"):
        prepare_data(data_config(tokenizer={"vocab": 10}), cache_dir=tmp_path)
    with pytest.raises(DataError, match="error, replace"):
        prepare_data({"invalid_utf8": "ignore"}, cache_dir=tmp_path)
    with pytest.raises(DataError, match=r"bad value for data\.max_tokens: Value 'many'"):
        prepare_data(data_config(max_tokens="many"), cache_dir=tmp_path)
    with pytest.raises(DataError, match=r"the data config lacks data\.cache_dir, .*; start from configs/data/"):
        prepare_data({"corpus": "multi30k"}, cache_dir=tmp_path)


# -- the real corpus ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_multi30k_from_the_mirror_matches_the_published_hashes(mirror_dir: Path, tmp_path: Path) -> None:
    sums = dict(
        reversed(line.split()) for line in (mirror_dir / "multi30k" / "SHA256SUMS").read_text().splitlines() if line
    )
    for name, digest in sums.items():
        assert MULTI30K_SHA256[name] == digest
    corpus = Multi30k(tmp_path, mirror=mirror_dir)
    src, tgt = corpus.split_files("train", "de", "en")
    assert _sha(src) == MULTI30K_SHA256["train.de.gz"]
    assert len(list(iter_pairs("train", src, tgt))) == 29000
    assert len(list(iter_pairs("val", *corpus.split_files("val", "en", "cs")))) == 1014


def test_a_utf8_byte_order_mark_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "bom.en"
    path.write_bytes(b"\xef\xbb\xbfHello\nWorld\n")
    assert read_lines(path) == ["Hello", "World"]


# -- at scale: streamed checks, caches that are never trusted half-written, files shared by ranks -----


def _encoded_names(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "encoded").iterdir()) if (cache / "encoded").is_dir() else []


def test_the_training_split_keeps_no_text_and_a_fingerprint_names_the_data(
    tmp_path: Path, tiny_parallel: tuple[list[str], list[str]]
) -> None:
    cfg = _files_cfg(tmp_path, tiny_parallel[0][:300], tiny_parallel[1][:300])
    data = prepare_data(cfg, cache_dir=tmp_path / "cache")
    assert data.train.src_text is None and data.train.tgt_text is None
    assert data.train.src_ids.paths is not None  # memory-mapped
    assert data.fingerprint == prepare_data(cfg, cache_dir=tmp_path / "other_cache").fingerprint
    cfg["clean"] = {"max_len": 5, "max_ratio": 3.0}
    assert prepare_data(cfg, cache_dir=tmp_path / "cache").fingerprint != data.fingerprint


def test_a_line_count_mismatch_names_the_first_line_without_a_partner(
    tmp_path: Path, tiny_parallel: tuple[list[str], list[str]]
) -> None:
    cfg = _files_cfg(tmp_path, tiny_parallel[0][:300], tiny_parallel[1][:299])
    with pytest.raises(DataError) as err:
        prepare_data(cfg, cache_dir=tmp_path / "cache")
    message = str(err.value)
    assert "train.de has 300 lines" in message and "train.en has 299" in message
    assert "line 300 of" in message and message.count("\n") == 0
    assert _encoded_names(tmp_path / "cache") == []


def test_invalid_utf8_deep_in_a_file_names_the_line_and_leaves_no_cache(
    tmp_path: Path, tiny_parallel: tuple[list[str], list[str]]
) -> None:
    cfg = _files_cfg(tmp_path, tiny_parallel[0][:300], tiny_parallel[1][:300])
    dev = Path(cfg["files"]["dev"]["src"])
    dev.write_bytes(b"gut\nnoch gut\nM\xfcnchen\n")  # validation is encoded after the tokenizer is trained
    with pytest.raises(DataError, match=r"dev\.de, line 3: invalid UTF-8.*invalid_utf8=replace"):
        prepare_data(cfg, cache_dir=tmp_path / "cache")
    assert not [name for name in _encoded_names(tmp_path / "cache") if name.startswith(("dev.", ".dev."))]


def test_an_interrupted_preparation_is_done_again(
    tmp_path: Path, tiny_parallel: tuple[list[str], list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from nmt.data import prepare as prepare_module
    from nmt.data.tokenizer import Tokenizer

    cfg = _files_cfg(tmp_path, tiny_parallel[0][:300], tiny_parallel[1][:300])
    expected = prepare_data(cfg, cache_dir=tmp_path / "reference")
    calls = []
    real_encode = Tokenizer.encode_src_batch

    def interrupted(self: Tokenizer, texts: list[str]) -> list[list[int]]:
        calls.append(len(texts))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_encode(self, texts)

    monkeypatch.setattr(prepare_module, "ENCODE_CHUNK_LINES", 100)
    monkeypatch.setattr(Tokenizer, "encode_src_batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(cfg, cache_dir=tmp_path / "cache")
    assert calls == [100, 100, 100] and _encoded_names(tmp_path / "cache") == []  # nothing half-written
    monkeypatch.undo()
    again = prepare_data(cfg, cache_dir=tmp_path / "cache")
    assert again.stats["encoded_cache_hits"] == 0 and again.train.src_ids == expected.train.src_ids


def test_a_damaged_cache_is_rebuilt_with_a_warning(
    tmp_path: Path, tiny_parallel: tuple[list[str], list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    cfg = _files_cfg(tmp_path, tiny_parallel[0][:300], tiny_parallel[1][:300])
    first = prepare_data(cfg, cache_dir=tmp_path / "cache")
    expected, tokens = list(first.train.tgt_ids), Path(first.train.tgt_ids.paths[0])
    del first  # its mapping would see the damage below: caches are only ever replaced, never written in place
    tokens.write_bytes(tokens.read_bytes()[:-10])  # a disk that filled up, a copy cut short
    with caplog.at_level(logging.WARNING):
        second = prepare_data(cfg, cache_dir=tmp_path / "cache")
    assert "does not match its manifest" in caplog.text and tokens.name in caplog.text
    assert second.stats["encoded_cache_hits"] == 2 and second.train.tgt_ids == expected


def test_a_cached_run_reads_no_training_file(
    tmp_path: Path, tiny_parallel: tuple[list[str], list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from nmt.data import prepare as prepare_module

    cfg = _files_cfg(tmp_path, tiny_parallel[0][:300], tiny_parallel[1][:300])
    prepare_data(cfg, cache_dir=tmp_path / "cache")
    read: list[str] = []
    real_iter_pairs = prepare_module.iter_pairs
    monkeypatch.setattr(prepare_module, "iter_pairs",
                        lambda name, *args: read.append(name) or real_iter_pairs(name, *args))
    monkeypatch.setattr(prepare_module, "sha256_of", lambda path: pytest.fail(f"{path} was hashed again"))
    prepare_data(cfg, cache_dir=tmp_path / "cache")
    assert sorted(read) == ["dev", "tst"]  # the text of the scored splits only

    train_src = Path(cfg["files"]["train"]["src"])
    train_src.write_text(train_src.read_text().replace(tiny_parallel[0][5], "ein neuer Satz", 1))
    monkeypatch.undo()
    changed = prepare_data(cfg, cache_dir=tmp_path / "cache")  # a changed file is hashed and prepared again
    assert changed.stats["encoded_cache_hits"] == 0  # a new tokenizer, so every split is encoded again


def test_two_preparations_map_the_same_files(tmp_path: Path, tiny_parallel: tuple[list[str], list[str]]) -> None:
    import os

    cfg = _files_cfg(tmp_path, tiny_parallel[0][:300], tiny_parallel[1][:300])
    rank0, rank1 = (prepare_data(cfg, cache_dir=tmp_path / "cache") for _ in range(2))  # as two ranks on one machine
    for split in ("train", "valid"):
        ids0, ids1 = getattr(rank0, split).src_ids, getattr(rank1, split).src_ids
        assert ids0.paths == ids1.paths and ids0.paths is not None
        assert os.stat(ids0.paths[0]).st_ino == os.stat(ids1.paths[0]).st_ino


@pytest.mark.slow
def test_two_processes_map_the_same_cache_files(tmp_path: Path, tiny_parallel: tuple[list[str], list[str]]) -> None:
    """What DDP ranks on one machine do: both map the files of one cache, so the page cache holds one copy."""
    import json
    import os
    import subprocess
    import sys

    cfg = _files_cfg(tmp_path, tiny_parallel[0][:300], tiny_parallel[1][:300])
    parent = prepare_data(cfg, cache_dir=tmp_path / "cache")  # rank 0 first, as main_process_first does
    child = (
        "import json, sys\n"
        "from nmt.data import prepare_data\n"
        "data = prepare_data(json.loads(sys.argv[1]), cache_dir=sys.argv[2])\n"
        "assert data.train.src_ids[-1] and data.train.tgt_ids[0] is not None  # touch the mapped pages\n"
        "rows = [line.split() for line in open('/proc/self/maps')]\n"
        "mapped = sorted({(int(r[4]), r[5]) for r in rows if len(r) > 5 and r[5].endswith('.npy')})\n"
        "print(json.dumps({'mapped': mapped, 'fingerprint': data.fingerprint}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, "-c", child, json.dumps(cfg), str(tmp_path / "cache")], env=env,
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    reports = [json.loads(rank.communicate(timeout=120)[0].strip().splitlines()[-1]) for rank in ranks]
    assert reports[0] == reports[1] and reports[0]["fingerprint"] == parent.fingerprint
    mapped = {path: inode for inode, path in reports[0]["mapped"]}
    for path in parent.train.src_ids.paths + parent.train.tgt_ids.paths:
        assert mapped[path] == os.stat(path).st_ino
