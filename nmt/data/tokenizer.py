"""Subwords: SentencePiece models (Kudo & Richardson, 2018) with fixed ids PAD=0, UNK=1, BOS=2, EOS=3, trained on
the training split (unigram LM or BPE) and cached by a hash of the text and the settings.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import sentencepiece as spm

from nmt.common.files import write_bytes_durably
from nmt.data.errors import DataError

log = logging.getLogger(__name__)

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
SPECIAL_IDS = frozenset((PAD_ID, BOS_ID, EOS_ID))  # dropped by decode; UNK decodes to " ⁇ "
# unigram / bpe: subwords; word: whole whitespace-separated words (rarer ones become UNK), the
# no-subword baseline of the ablation in docs/results/recipe.md
MODEL_TYPES = ("unigram", "bpe", "word")
# Bumped when the training recipe changes, so stale cached models are not reused.
_RECIPE_VERSION = 2  # 2: a fixed SentencePiece thread count
_STATE_FORMAT = 1
# SentencePiece holds its training sentences in memory: at most this many from a big corpus, a sample
# of them. 2M sentences give a good vocabulary in a few GB of RAM; Multi30k is far below it.
INPUT_SENTENCE_SIZE = 2_000_000
SAMPLE_SEED = 0  # which sentences of a bigger corpus are the sample (_sampled): the same ones on every machine
# Cache files are readable by all, as open() makes them under the usual umask (mkstemp's 0600 would
# hide a shared cache from the other users of a cluster).
CACHE_FILE_MODE = 0o644
TRAINER_THREADS = 16  # SentencePiece training threads, whatever the machine has (see _train_model)


@dataclass
class TokenizerSettings:
    """How to train the subword model(s): the keys and types of ``data.tokenizer`` (values: configs/data/*.yaml).

    Attributes:
        model_type: ``unigram`` or ``bpe`` (subwords), or ``word`` (whole words).
        vocab_size: pieces per model, the 4 special ids included; a corpus too small to fill it gets a smaller
            vocabulary (logged), not an error.
        joint: one model shared by source and target, or one per side.
        character_coverage: fraction of characters the vocabulary covers (1.0 for Latin scripts; ~0.9995 for CJK).
    """

    model_type: str
    vocab_size: int
    joint: bool
    character_coverage: float

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise DataError(f"data.tokenizer.model_type={self.model_type!r} is not valid; use one of "
                            f"{', '.join(MODEL_TYPES)}.")
        if int(self.vocab_size) <= 4:
            raise DataError(f"data.tokenizer.vocab_size={self.vocab_size} must be > 4 (4 ids are special).")
        if not 0.0 < float(self.character_coverage) <= 1.0:
            raise DataError(f"data.tokenizer.character_coverage={self.character_coverage} must be in (0, 1].")


class Tokenizer:
    """Source and target SentencePiece models behind one interface; it is only its model protos, so it travels
    inside checkpoints. SentencePiece's ``nmt_nfkc`` normalisation applies, so text with unusual Unicode (NBSP,
    full-width forms) may not round-trip byte for byte.

    Args:
        src_model: the serialised source (or joint) model proto.
        tgt_model: the serialised target model proto; None for a joint model.
    """

    def __init__(self, src_model: bytes, tgt_model: bytes | None = None) -> None:
        self._src_model = bytes(src_model)
        self._tgt_model = None if tgt_model is None else bytes(tgt_model)
        self._src = _load_processor(self._src_model)
        self._tgt = self._src if self._tgt_model is None else _load_processor(self._tgt_model)
        self._tag_ids = {piece: self._src.piece_to_id(piece) for piece in _user_defined_pieces(self._src_model)}

    # -- encoding ------------------------------------------------------------------------------------

    def encode_src(self, text: str) -> list[int]:
        """Subword ids of a source sentence, without BOS/EOS; a leading tag (``<bt> ...``) is its one id."""
        return self.encode_src_batch([text])[0] if self._tag_ids else self._src.encode(text, out_type=int)

    def encode_tgt(self, text: str) -> list[int]:
        """Subword ids of a target sentence, without BOS/EOS."""
        return self._tgt.encode(text, out_type=int)

    def encode_src_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """``encode_src`` over many sentences, on all CPU cores."""
        if not self._tag_ids:
            return self._src.encode(list(texts), out_type=int, num_threads=os.cpu_count() or 1)
        # SentencePiece would put a lone "▁" piece before a leading tag: give the tag its one id instead.
        tags = [self._leading_tag(text) for text in texts]
        rests = [text[len(tag):].lstrip() if tag else text for text, tag in zip(texts, tags)]
        ids = self._src.encode(rests, out_type=int, num_threads=os.cpu_count() or 1)
        return [[self._tag_ids[tag], *row] if tag else row for tag, row in zip(tags, ids)]

    def _leading_tag(self, text: str) -> str | None:
        first = text.split(maxsplit=1)[0] if text.strip() else ""
        return first if first in self._tag_ids else None

    @property
    def tags(self) -> tuple[str, ...]:
        """The reserved source tags (SentencePiece user-defined symbols) this tokenizer was trained with."""
        return tuple(self._tag_ids)

    def encode_tgt_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """``encode_tgt`` over many sentences, on all CPU cores."""
        return self._tgt.encode(list(texts), out_type=int, num_threads=os.cpu_count() or 1)

    # -- decoding ------------------------------------------------------------------------------------

    def decode_src(self, ids: Iterable[int]) -> str:
        """Detokenized source text; PAD, BOS and EOS ids are ignored."""
        return self._src.decode([int(i) for i in ids if int(i) not in SPECIAL_IDS])

    def decode_tgt(self, ids: Iterable[int]) -> str:
        """Detokenized target text; PAD, BOS and EOS ids are ignored."""
        return self._tgt.decode([int(i) for i in ids if int(i) not in SPECIAL_IDS])

    def src_pieces(self, ids: Iterable[int]) -> list[str]:
        """The subword string of each source id (``<pad>``, ``<s>``, ``</s>`` for specials)."""
        return [self._src.id_to_piece(int(i)) for i in ids]

    def tgt_pieces(self, ids: Iterable[int]) -> list[str]:
        """The subword string of each target id (``<pad>``, ``<s>``, ``</s>`` for specials)."""
        return [self._tgt.id_to_piece(int(i)) for i in ids]

    # -- properties ----------------------------------------------------------------------------------

    @property
    def joint(self) -> bool:
        """True when source and target share one model (and so one vocabulary)."""
        return self._tgt_model is None

    @property
    def src_vocab_size(self) -> int:
        return self._src.get_piece_size()

    @property
    def tgt_vocab_size(self) -> int:
        return self._tgt.get_piece_size()

    @property
    def fingerprint(self) -> str:
        """A sha256 of the model bytes: equal fingerprints encode identically (a cache key)."""
        return hashlib.sha256(self._src_model + b"\0" + (self._tgt_model or b"")).hexdigest()

    # -- serialisation -------------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """Plain values only (str/int/bool/bytes), so it survives ``torch.load(weights_only=True)``."""
        state = {"format": _STATE_FORMAT, "kind": "sentencepiece", "joint": self.joint, "src_model": self._src_model}
        # A joint model has no "tgt_model": the one proto is not stored twice. (Never b"" either:
        # pickle protocol 2 writes empty bytes as a call to `bytes`, which weights_only refuses.)
        if self._tgt_model is not None:
            state["tgt_model"] = self._tgt_model
        return state

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Tokenizer:
        """Rebuild the tokenizer that ``to_state`` described."""
        if state.get("kind", "sentencepiece") != "sentencepiece" or "src_model" not in state:
            raise DataError(f"not a tokenizer state (keys: {sorted(state)}); expected the dict of "
                            "Tokenizer.to_state().")
        return cls(state["src_model"], None if state.get("joint", False) else state.get("tgt_model"))

    def save(self, directory: str | Path) -> list[Path]:
        """Write ``joint.model`` (or ``src.model`` + ``tgt.model``), standard SentencePiece models, into a folder."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        named = {"joint.model": self._src_model} if self._tgt_model is None else {
            "src.model": self._src_model, "tgt.model": self._tgt_model}
        for name, blob in named.items():
            write_bytes_durably(directory / name, blob)
        return [directory / name for name in named]

    @classmethod
    def load(cls, directory: str | Path) -> Tokenizer:
        """Read what ``save`` wrote."""
        directory = Path(directory)
        if (directory / "joint.model").is_file():
            return cls((directory / "joint.model").read_bytes())
        src, tgt = directory / "src.model", directory / "tgt.model"
        if src.is_file() and tgt.is_file():
            return cls(src.read_bytes(), tgt.read_bytes())
        raise DataError(f"no joint.model or src.model + tgt.model in {directory}.")

    def __repr__(self) -> str:
        if self.joint:
            return f"Tokenizer(joint=True, vocab={self.src_vocab_size})"
        return f"Tokenizer(joint=False, src_vocab={self.src_vocab_size}, tgt_vocab={self.tgt_vocab_size})"


def _load_processor(model: bytes) -> spm.SentencePieceProcessor:
    sp = spm.SentencePieceProcessor(model_proto=model)
    ids = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
    if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
        raise DataError(f"SentencePiece model has special ids pad/unk/bos/eos = {ids}, expected "
                        f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}; retrain it with train_tokenizer.")
    return sp


def _user_defined_pieces(model: bytes) -> list[str]:
    """The user-defined symbols of a model proto: the tags a mixture reserved (none in most models)."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model)
    user_defined = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
    return [piece.piece for piece in proto.pieces if piece.type == user_defined]


def text_hash(*sides: Sequence[str]) -> str:
    """A sha256 of one or more lists of lines (order and boundaries included)."""
    digest = hashlib.sha256()
    for lines in sides:
        digest.update(len(lines).to_bytes(8, "little"))
        for line in lines:
            digest.update(line.encode("utf-8", errors="surrogatepass") + b"\n")
    return digest.hexdigest()


def _sampled(sentences: Iterable[str], count: int) -> Iterable[str]:
    """``sentences`` (``count`` of them), or a fixed sample of ``INPUT_SENTENCE_SIZE`` of them, in their order,
    when there are more: SentencePiece's own sample is seeded from the machine's random device, so two machines
    (or two runs) would train different models on the same corpus."""
    if count <= INPUT_SENTENCE_SIZE:
        return sentences
    keep = bytearray(count)
    for index in random.Random(SAMPLE_SEED).sample(range(count), INPUT_SENTENCE_SIZE):
        keep[index] = 1
    return (sentence for index, sentence in zip(range(count), sentences) if keep[index])


def _train_model(sentences: Iterable[str], settings: TokenizerSettings, tags: Sequence[str] = ()) -> bytes:
    """Train one SentencePiece model in memory; its proto bytes. ``sentences`` may stream, at most
    ``INPUT_SENTENCE_SIZE`` of them (``_sampled``). ``tags`` become user-defined symbols.
    """
    writer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=writer, model_type=settings.model_type,
            vocab_size=int(settings.vocab_size), character_coverage=float(settings.character_coverage),
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            # A soft limit, so tiny corpora (tests, a quick look) get a smaller vocabulary, not an error.
            hard_vocab_limit=False, input_sentence_size=INPUT_SENTENCE_SIZE, shuffle_input_sentence=True,
            # A fixed count, not the machine's cores: SentencePiece's result depends on how many threads
            # share the work, and the same data must give the same model bytes on any machine.
            num_threads=TRAINER_THREADS, user_defined_symbols=list(tags),
            minloglevel=2,  # errors only (its warnings are noise here); we log one summary line ourselves
        )
    except RuntimeError as exc:
        raise DataError(f"SentencePiece training failed: {exc}. With a small corpus, lower "
                        "data.tokenizer.vocab_size or use data.tokenizer.model_type=unigram.") from exc
    return writer.getvalue()


def tokenizer_key(settings: TokenizerSettings, text_key: str) -> str:
    """The cache key of the model(s) trained with ``settings`` on the text that ``text_key`` identifies."""
    key_source = json.dumps({"recipe": _RECIPE_VERSION, **asdict(settings)}, sort_keys=True)
    return hashlib.sha256((key_source + text_key).encode()).hexdigest()[:24]


def _model_paths(key: str, settings: TokenizerSettings, cache_dir: str | Path) -> list[Path]:
    names = ("joint",) if settings.joint else ("src", "tgt")
    return [Path(cache_dir) / f"{key}.{name}.model" for name in names]


def load_cached_tokenizer(key: str, settings: TokenizerSettings, cache_dir: str | Path | None) -> Tokenizer | None:
    """The model(s) cached under ``key`` (``<cache_dir>/<key>.{joint,src,tgt}.model``), or None."""
    paths = _model_paths(key, settings, cache_dir) if cache_dir else []
    if not paths or not all(p.is_file() for p in paths):
        return None
    try:
        tokenizer = Tokenizer(*(p.read_bytes() for p in paths))
    except (OSError, RuntimeError, ValueError) as error:  # a torn or corrupt file: train it again
        log.warning("cached SentencePiece model(s) %s cannot be loaded (%s); training them again",
                    ", ".join(map(str, paths)), str(error).splitlines()[0] if str(error) else type(error).__name__)
        return None
    log.info("reusing cached SentencePiece model(s) %s: %s", ", ".join(map(str, paths)), tokenizer)
    return tokenizer


def train_and_cache(key: str, settings: TokenizerSettings, cache_dir: str | Path | None,
                    sentences: Callable[[str], Iterable[str]], pairs: int, tags: Sequence[str] = ()) -> Tokenizer:
    """Train the model(s) and cache them under ``key`` (from ``tokenizer_key``; no caching when ``cache_dir`` is None).

    Args:
        sentences: the training sentences of one model, ``"joint"`` (all source sentences, then all target
            sentences), ``"src"`` or ``"tgt"``; called once per model, so it may stream.
        pairs: the number of training pairs (each model reads one or two sentences a pair), for the sample and the log.
        tags: reserved source tags, each one piece of the source (or joint) model; they must be part of ``key``.
    """
    start = time.perf_counter()
    names = ("joint",) if settings.joint else ("src", "tgt")
    count = 2 * pairs if settings.joint else pairs
    models = [_train_model(_sampled(sentences(name), count), settings, tags if name != "tgt" else ())
              for name in names]
    tokenizer = Tokenizer(*models)
    paths = _model_paths(key, settings, cache_dir) if cache_dir else []
    for path, blob in zip(paths, models):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_durably(path, blob)
    log.info("trained SentencePiece %s %s on %d pairs in %.1f s: %s%s", settings.model_type,
             "joint" if settings.joint else "src+tgt", pairs, time.perf_counter() - start, tokenizer,
             f" -> {', '.join(map(str, paths))}" if paths else "")
    for side, size in zip(names, (tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)):
        if size < settings.vocab_size:
            log.warning("%s vocabulary has %d pieces, fewer than vocab_size=%d: the corpus is too small to fill it",
                        side, size, settings.vocab_size)
    return tokenizer


def train_tokenizer(src_texts: Sequence[str], tgt_texts: Sequence[str], settings: TokenizerSettings,
                    cache_dir: str | Path | None = None, tags: Sequence[str] = ()) -> Tokenizer:
    """Train (or reuse from ``cache_dir``) the subword model(s) on training sentences in memory.

    The cache key hashes the training text and the settings: changing either trains a new model.

    Args:
        src_texts: training source sentences (the cleaned training split, never validation/test).
        tgt_texts: training target sentences, aligned with ``src_texts``.
        cache_dir: where models are kept (``<cache_dir>/<key>.{joint,src,tgt}.model``); None = no caching.
        tags: reserved source tags, each one piece (``Tokenizer.tags``).
    """
    key = tokenizer_key(settings, text_hash(src_texts, tgt_texts) + (json.dumps(sorted(tags)) if tags else ""))
    if (tokenizer := load_cached_tokenizer(key, settings, cache_dir)) is not None:
        return tokenizer

    def sentences(model: str) -> Sequence[str]:
        return [*src_texts, *tgt_texts] if model == "joint" else src_texts if model == "src" else tgt_texts

    return train_and_cache(key, settings, cache_dir, sentences, len(src_texts), tuple(tags))
