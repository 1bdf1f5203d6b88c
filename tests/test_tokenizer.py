"""nmt.data.tokenizer: special ids, round trips, serialisation, caching (tiny vocabularies)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from conftest import data_config, make_tiny_parallel, tokenizer_settings

from nmt.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    DataError,
    PreparedData,
    Tokenizer,
    TokenizerSettings,
    prepare_data,
)
from nmt.data import tokenizer as tokenizer_module
from nmt.data.prepare import resolve_data_config
from nmt.data.tokenizer import train_tokenizer

TEST_SRC, TEST_TGT = make_tiny_parallel(40, seed=1)  # unseen sentences from the same "languages"


def test_special_ids_are_fixed(tiny_tokenizer: Tokenizer) -> None:
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert tiny_tokenizer.src_pieces([0, 1, 2, 3]) == ["<pad>", "<unk>", "<s>", "</s>"]
    ids = [i for line in TEST_SRC for i in tiny_tokenizer.encode_src(line)]
    assert not {PAD_ID, BOS_ID, EOS_ID} & set(ids)  # encode adds no specials


def test_round_trip_on_unseen_sentences(tiny_tokenizer: Tokenizer) -> None:
    for src, tgt in zip(TEST_SRC, TEST_TGT):
        assert tiny_tokenizer.decode_src(tiny_tokenizer.encode_src(src)) == src
        assert tiny_tokenizer.decode_tgt(tiny_tokenizer.encode_tgt(tgt)) == tgt


def test_decode_ignores_pad_bos_eos(tiny_tokenizer: Tokenizer) -> None:
    ids = tiny_tokenizer.encode_tgt(TEST_TGT[0])
    assert tiny_tokenizer.decode_tgt([BOS_ID, *ids, EOS_ID, PAD_ID, PAD_ID]) == TEST_TGT[0]
    assert tiny_tokenizer.decode_tgt(torch.tensor([BOS_ID, *ids, EOS_ID]).tolist()) == TEST_TGT[0]


def test_pieces_match_ids(tiny_tokenizer: Tokenizer) -> None:
    ids = tiny_tokenizer.encode_src(TEST_SRC[0])
    pieces = tiny_tokenizer.src_pieces(ids)
    assert len(pieces) == len(ids) and "".join(pieces).replace("\u2581", " ").strip() == TEST_SRC[0]


def test_state_survives_torch_save_and_weights_only_load(tiny_tokenizer: Tokenizer) -> None:
    state = tiny_tokenizer.to_state()
    assert all(isinstance(v, (str, int, bool, bytes)) for v in state.values())
    buffer = io.BytesIO()
    torch.save({"tokenizer": state}, buffer)
    buffer.seek(0)
    restored = Tokenizer.from_state(torch.load(buffer, weights_only=True)["tokenizer"])
    assert restored.joint and restored.src_vocab_size == tiny_tokenizer.src_vocab_size
    assert restored.fingerprint == tiny_tokenizer.fingerprint
    assert [restored.encode_src(s) for s in TEST_SRC] == [tiny_tokenizer.encode_src(s) for s in TEST_SRC]


def test_save_and_load_model_files(tiny_tokenizer: Tokenizer, tmp_path: Path) -> None:
    assert [p.name for p in tiny_tokenizer.save(tmp_path)] == ["joint.model"]
    assert Tokenizer.load(tmp_path).fingerprint == tiny_tokenizer.fingerprint


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_separate_models_round_trip(model_type: str, tiny_parallel: tuple[list[str], list[str]]) -> None:
    settings = tokenizer_settings(model_type=model_type, vocab_size=300, joint=False)
    tok = train_tokenizer(tiny_parallel[0][:600], tiny_parallel[1][:600], settings)
    assert not tok.joint
    assert tok.src_pieces([EOS_ID]) == tok.tgt_pieces([EOS_ID]) == ["</s>"]
    buffer = io.BytesIO()
    torch.save(tok.to_state(), buffer)
    buffer.seek(0)
    restored = Tokenizer.from_state(torch.load(buffer, weights_only=True))
    assert restored.fingerprint == tok.fingerprint
    for src, tgt in zip(TEST_SRC[:10], TEST_TGT[:10]):
        assert restored.decode_src(restored.encode_src(src)) == src
        assert restored.decode_tgt(restored.encode_tgt(tgt)) == tgt
    # Separate models: the same id means different pieces on the two sides.
    assert tok.src_pieces(range(10, 30)) != tok.tgt_pieces(range(10, 30))


def test_word_model_keeps_whole_words(tiny_parallel: tuple[list[str], list[str]]) -> None:
    settings = tokenizer_settings(model_type="word", vocab_size=300, joint=False)
    tok = train_tokenizer(tiny_parallel[0][:600], tiny_parallel[1][:600], settings)
    # a sentence of in-vocabulary words gives one piece per word, never split
    words = [p[1:] for p in tok.tgt_pieces(range(4, 14))]
    assert tok.tgt_pieces(tok.encode_tgt(" ".join(words))) == ["▁" + w for w in words]
    assert tok.decode_tgt(tok.encode_tgt(" ".join(words))) == " ".join(words)
    # a word it never saw is one UNK, not pieces of it
    unseen = tok.tgt_pieces(tok.encode_tgt(f"{words[0]} qqqzzzxxx {words[1]}"))
    assert unseen == ["▁" + words[0], "<unk>", "▁" + words[1]]


def test_cache_is_keyed_by_text_and_settings(
    tiny_parallel: tuple[list[str], list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, tgt = tiny_parallel[0][:400], tiny_parallel[1][:400]
    settings = tokenizer_settings(vocab_size=200)
    first = train_tokenizer(src, tgt, settings, tmp_path)
    calls: list[int] = []
    real_train = tokenizer_module._train_model

    def counting(sentences: list[str], s: TokenizerSettings, tags: tuple[str, ...] = ()) -> bytes:
        calls.append(len(sentences))
        return real_train(sentences, s, tags)

    monkeypatch.setattr(tokenizer_module, "_train_model", counting)
    assert train_tokenizer(src, tgt, settings, tmp_path).fingerprint == first.fingerprint
    assert calls == []  # reused
    train_tokenizer(src, tgt, tokenizer_settings(vocab_size=250), tmp_path)  # new settings
    train_tokenizer(src[:-1], tgt[:-1], settings, tmp_path)  # new text
    assert len(calls) == 2


def test_bad_settings_name_the_valid_choices() -> None:
    with pytest.raises(DataError, match="unigram, bpe, word"):
        tokenizer_settings(model_type="wordpiece")
    with pytest.raises(DataError, match="valid keys under data.tokenizer."):
        resolve_data_config(data_config(tokenizer={"vocab": 100}))
    with pytest.raises(DataError, match="not a tokenizer state"):
        Tokenizer.from_state({"model": b""})


@pytest.mark.slow
def test_multi30k_joint_round_trip_on_the_test_set(multi30k_data: PreparedData) -> None:
    tok = multi30k_data.tokenizer
    assert tok.joint and tok.src_vocab_size == tok.tgt_vocab_size == 8000
    test = multi30k_data.tests["test_2016_flickr"]
    assert len(test) == 1000 and len(multi30k_data.valid) == 1014
    for ids, text in zip(test.src_ids, test.src_text):
        assert tok.decode_src(ids) == text
    for ids, text in zip(test.tgt_ids, test.tgt_text):
        assert tok.decode_tgt(ids) == text


@pytest.mark.slow
def test_multi30k_second_preparation_is_all_cached(multi30k_data: PreparedData, mirror_dir: Path) -> None:
    cache = Path(multi30k_data.stats["cache_dir"])
    again = prepare_data(data_config(mirror=str(mirror_dir)), cache_dir=cache)
    assert again.stats["encoded_cache_hits"] == 3
    assert again.tokenizer.fingerprint == multi30k_data.tokenizer.fingerprint
    assert again.train.src_ids == multi30k_data.train.src_ids


@pytest.mark.slow
def test_multi30k_streamed_training_gives_the_model_trained_from_lists(
    multi30k_data: PreparedData, mirror_dir: Path, tmp_path: Path
) -> None:
    """prepare_data streams the cleaned pairs from disk into SentencePiece: the same model and ids as from lists."""
    from nmt.data.corpora import Multi30k
    from nmt.data.text import PairFilter, iter_pairs

    train = iter_pairs("train", *Multi30k(tmp_path, mirror=mirror_dir).split_files("train", "de", "en"))
    src, tgt = map(list, zip(*filter(PairFilter(**data_config()["clean"]), train)))
    from_lists = train_tokenizer(src, tgt, TokenizerSettings(**data_config()["tokenizer"]))
    assert from_lists.fingerprint == multi30k_data.tokenizer.fingerprint
    assert multi30k_data.train.src_ids == from_lists.encode_src_batch(src)
    assert multi30k_data.train.tgt_ids == from_lists.encode_tgt_batch(tgt)


def test_the_same_text_gives_the_same_model_bytes_on_any_number_of_cores(
    tiny_parallel: tuple[list[str], list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    models = set()
    for cores in (1, 2, 16):
        monkeypatch.setattr(os, "cpu_count", lambda cores=cores: cores)
        tokenizer = train_tokenizer(*tiny_parallel, tokenizer_settings(vocab_size=300), cache_dir=None)
        models.add(tokenizer.to_state()["src_model"])
    assert len(models) == 1


SAMPLED_MODEL = """
import hashlib, json, sys
from nmt.data import TokenizerSettings, tokenizer
job = json.load(open(sys.argv[1], encoding="utf-8"))
tokenizer.INPUT_SENTENCE_SIZE = 1000  # of the 3,000 sentences the joint model reads
model = tokenizer.train_tokenizer(*job["pairs"], TokenizerSettings(**job["settings"])).to_state()
print(hashlib.sha256(model["src_model"]).hexdigest())
"""


def test_a_corpus_bigger_than_the_sample_gives_the_same_model_bytes_in_every_process(tmp_path: Path) -> None:
    """Over INPUT_SENTENCE_SIZE sentences, SentencePiece's own sample, seeded from the random device, gave another
    model in each process; the fixed sample gives one (separate processes: within one, its seed stays put)."""
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"pairs": make_tiny_parallel(1500),
                               "settings": asdict(tokenizer_settings(vocab_size=300))}), encoding="utf-8")
    digests = {subprocess.run([sys.executable, "-c", SAMPLED_MODEL, str(job)], capture_output=True, text=True,
                              check=True).stdout for _ in range(3)}
    assert len(digests) == 1


def test_a_corrupt_cached_model_is_trained_again_with_a_warning(
    tiny_parallel: tuple[list[str], list[str]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = tokenizer_settings(vocab_size=300)
    first = train_tokenizer(*tiny_parallel, settings, tmp_path)
    (model,) = tmp_path.glob("*.joint.model")
    model.write_bytes(model.read_bytes()[:100])  # torn by a crash or a full disk
    again = train_tokenizer(*tiny_parallel, settings, tmp_path)
    assert again.to_state() == first.to_state() and "cannot be loaded" in caplog.text
    assert Tokenizer(model.read_bytes()).to_state() == first.to_state()  # the cache holds a good model again
