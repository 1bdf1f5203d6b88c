"""Preparation: from the ``data`` config to encoded, cached splits and their tokenizer.

The one concept: ``prepare_data(data_cfg)`` runs the pipeline once, in this order, and caches
what is slow so that a second run is near-instant:

    corpus files (fetched, sha256-verified; ``<cache>/multi30k/``)
      -> lines (UTF-8 checked, line counts checked; the training split cleaned)
      -> SentencePiece model(s) trained on the training split (``<cache>/spm/``, keyed by text + settings)
      -> subword ids per split (``<cache>/encoded/``, keyed by tokenizer + text)

Shapes: none; splits are lists of id lists (``EncodedSplit``).

What it does not do: batching (``nmt.data.batching.build_loader``), or coordinate DDP ranks. Under
DDP, let rank 0 prepare first and the others after a barrier, so they find everything cached.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import tempfile
import time
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nmt.data.batching import EncodedSplit
from nmt.data.corpora import (
    INVALID_UTF8_MODES,
    MIRROR_ENV,
    DataError,
    ParallelText,
    build_corpus,
    clean_pairs,
    read_parallel,
    terminal_progress,
)
from nmt.data.tokenizer import Tokenizer, TokenizerSettings, text_hash, train_tokenizer
from nmt.schema import bad_value_message, first_unknown_key

log = logging.getLogger(__name__)
ENCODE_CHUNK_LINES = 50_000  # sentences per SentencePiece batch call (the progress bar moves once per chunk)



@dataclass
class CleanSchema:
    max_len: int | None = MISSING
    max_ratio: float | None = MISSING


@dataclass
class TokenizerSchema:
    model_type: str = MISSING
    vocab_size: int = MISSING
    joint: bool = MISSING
    character_coverage: float = MISSING


@dataclass
class DataSchema:
    """The keys and types of the ``data`` section; the values (and their comments) are in configs/data/*.yaml."""

    corpus: str = MISSING
    src_lang: str = MISSING
    tgt_lang: str = MISSING
    train_split: str = MISSING
    valid_split: str = MISSING
    test_splits: list[str] = MISSING
    files: Any = MISSING
    cache_dir: str = MISSING
    mirror: str | None = MISSING
    invalid_utf8: str = MISSING
    clean: CleanSchema = field(default_factory=CleanSchema)
    tokenizer: TokenizerSchema = field(default_factory=TokenizerSchema)
    max_tokens: int = MISSING
    valid_max_tokens: int = MISSING
    num_workers: int = MISSING


_ENCODED_MAGIC = b"NMTENC1\n"


@dataclass
class PreparedData:
    """Everything training and evaluation need from the data side.

    Attributes:
        tokenizer: the subword model(s), trained on ``train``.
        train: the cleaned training split.
        valid: the validation split (never filtered).
        tests: one split per name in ``data.test_splits`` (never filtered).
        stats: what happened: seconds per stage, cleaning counts, cache hits (for logs/benchmarks).
    """

    tokenizer: Tokenizer
    train: EncodedSplit
    valid: EncodedSplit
    tests: dict[str, EncodedSplit]
    stats: dict[str, Any] = field(default_factory=dict)


def _to_plain(cfg: Any) -> dict[str, Any]:
    """A plain dict from a DictConfig (interpolations resolved) or a mapping."""
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    if not isinstance(cfg, Mapping):
        raise DataError(f"data config must be a mapping or DictConfig, got {type(cfg).__name__}.")
    return dict(cfg)


def resolve_data_config(data_cfg: Any) -> dict[str, Any]:
    """Check a complete ``data`` section (as in configs/data/*.yaml) and return it as plain values.

    Raises:
        DataError: an unknown key (naming the nearest valid one), a wrong type, a missing key or an
            invalid value.
    """
    given = _to_plain(data_cfg)
    if problem := first_unknown_key(given, DataSchema, "data."):
        raise DataError(problem)
    if given.get("invalid_utf8", "error") not in INVALID_UTF8_MODES:
        raise DataError(f"data.invalid_utf8={given['invalid_utf8']!r} is not valid; use one of "
                        f"{', '.join(INVALID_UTF8_MODES)}.")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(DataSchema), given)
    except OmegaConfBaseException as error:
        raise DataError(bad_value_message("data.", error)) from None
    if missing := sorted(OmegaConf.missing_keys(merged)):
        raise DataError(f"the data config lacks {', '.join('data.' + key for key in missing)}; start from "
                        "configs/data/multi30k.yaml or configs/data/files.yaml")
    cfg: dict[str, Any] = OmegaConf.to_container(merged)  # type: ignore[assignment]
    if cfg["src_lang"] == cfg["tgt_lang"] and cfg["corpus"] != "files":
        raise DataError(f"data.src_lang and data.tgt_lang are both {cfg['src_lang']!r}; pick two languages.")
    return cfg


def prepare_data(data_cfg: Any, cache_dir: str | Path | None = None) -> PreparedData:
    """Fetch, verify, read, clean, tokenize and encode the splits named in ``data_cfg``.

    Args:
        data_cfg: the ``data`` config group (DictConfig or plain dict; missing keys take the
            defaults of configs/data/multi30k.yaml).
        cache_dir: overrides ``data_cfg.cache_dir``; relative paths resolve against the working
            directory.

    Raises:
        DataError: anything wrong with the data or the settings; the message says how to fix it.
    """
    cfg = resolve_data_config(data_cfg)
    cache = Path(cache_dir if cache_dir is not None else cfg["cache_dir"]).expanduser().resolve()
    mirror = cfg["mirror"] or os.environ.get(MIRROR_ENV) or None
    stats: dict[str, Any] = {"cache_dir": str(cache), "seconds": {}}
    seconds = stats["seconds"]

    start = time.perf_counter()
    corpus = build_corpus(cfg["corpus"], cache_dir=cache, mirror=mirror, files=cfg["files"])
    names = [cfg["train_split"], cfg["valid_split"], *cfg["test_splits"]]
    paths = {name: corpus.split_files(name, cfg["src_lang"], cfg["tgt_lang"]) for name in dict.fromkeys(names)}
    seconds["fetch_verify"] = time.perf_counter() - start

    start = time.perf_counter()
    texts = {name: read_parallel(name, *paths[name], invalid_utf8=cfg["invalid_utf8"]) for name in paths}
    seconds["read"] = time.perf_counter() - start
    start = time.perf_counter()
    train_text, clean_stats = clean_pairs(texts[cfg["train_split"]], **cfg["clean"])
    seconds["clean"] = time.perf_counter() - start
    stats["clean"] = {"total": clean_stats.total, "kept": clean_stats.kept, "dropped": clean_stats.dropped}

    start = time.perf_counter()
    settings = TokenizerSettings.from_mapping(cfg["tokenizer"])
    tokenizer = train_tokenizer(train_text.src, train_text.tgt, settings, cache / "spm")
    seconds["tokenizer"] = time.perf_counter() - start

    start = time.perf_counter()
    stats["encoded_cache_hits"] = 0
    encoded: dict[str, EncodedSplit] = {}
    for name in paths:
        text = train_text if name == cfg["train_split"] else texts[name]
        encoded[name], hit = encode_split(text, tokenizer, cache / "encoded")
        stats["encoded_cache_hits"] += int(hit)
    seconds["encode"] = time.perf_counter() - start

    data = PreparedData(
        tokenizer=tokenizer,
        train=encoded[cfg["train_split"]],
        valid=encoded[cfg["valid_split"]],
        tests={name: encoded[name] for name in cfg["test_splits"]},
        stats=stats,
    )
    log.info(
        "data %s %s->%s: train %d, %s %d, %s; %s; %.1f s",
        cfg["corpus"],
        cfg["src_lang"],
        cfg["tgt_lang"],
        len(data.train),
        cfg["valid_split"],
        len(data.valid),
        ", ".join(f"{k} {len(v)}" for k, v in data.tests.items()) or "no test splits",
        tokenizer,
        sum(seconds.values()),
    )
    return data


# --------------------------------------------------------------------------------------------------
# The encoded-split cache: flat int32 arrays, loaded in milliseconds
# --------------------------------------------------------------------------------------------------


def encode_split(text: ParallelText, tokenizer: Tokenizer, cache_dir: Path | None) -> tuple[EncodedSplit, bool]:
    """Encode a split with ``tokenizer``, or load it from ``cache_dir`` if already done.

    Returns:
        The encoded split, and whether it came from the cache.
    """
    key = hashlib.sha256(f"{tokenizer.fingerprint}:{text_hash(text.src, text.tgt)}".encode()).hexdigest()[:24]
    path = cache_dir / f"{text.name}.{key}.bin" if cache_dir is not None else None
    if path is not None and path.is_file():
        try:
            src_ids, tgt_ids = _read_encoded(path)
            if len(src_ids) == len(text):
                return EncodedSplit(text.name, src_ids, tgt_ids, text.src, text.tgt), True
        except (OSError, EOFError, ValueError, struct.error):
            pass
        log.warning("ignoring unreadable encoded cache %s", path)
    src_ids, tgt_ids = [], []
    # In chunks, so a terminal shows a bar on a large corpus; each sentence is encoded on its own either way.
    chunks = range(0, len(text), ENCODE_CHUNK_LINES)
    for start in terminal_progress(chunks, f"encoding {text.name} ({len(text):,} lines)", unit=" chunks"):
        src_ids += tokenizer.encode_src_batch(text.src[start : start + ENCODE_CHUNK_LINES])
        tgt_ids += tokenizer.encode_tgt_batch(text.tgt[start : start + ENCODE_CHUNK_LINES])
    if path is not None:
        _write_encoded(path, src_ids, tgt_ids)
    return EncodedSplit(text.name, src_ids, tgt_ids, text.src, text.tgt), False


def _flatten(rows: list[list[int]]) -> tuple[array, array]:
    lengths = array("i", map(len, rows))
    flat = array("i")
    for row in rows:
        flat.extend(row)
    return lengths, flat


def _unflatten(lengths: array, flat: array) -> list[list[int]]:
    values = flat.tolist()
    rows, offset = [], 0
    for n in lengths:
        rows.append(values[offset : offset + n])
        offset += n
    if offset != len(values):
        raise ValueError("encoded cache lengths do not match its ids")
    return rows


def _write_encoded(path: Path, src_ids: list[list[int]], tgt_ids: list[list[int]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = [*_flatten(src_ids), *_flatten(tgt_ids)]
    header = json.dumps({"itemsize": arrays[0].itemsize, "sizes": [len(a) for a in arrays]}).encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_ENCODED_MAGIC + struct.pack("<I", len(header)) + header)
            for a in arrays:
                a.tofile(f)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _read_encoded(path: Path) -> tuple[list[list[int]], list[list[int]]]:
    with open(path, "rb") as f:
        if f.read(len(_ENCODED_MAGIC)) != _ENCODED_MAGIC:
            raise ValueError("not an encoded cache file")
        (header_len,) = struct.unpack("<I", f.read(4))
        header = json.loads(f.read(header_len))
        arrays = []
        for size in header["sizes"]:
            a = array("i")
            if a.itemsize != header["itemsize"]:
                raise ValueError("encoded cache written with another int size")
            a.fromfile(f, size)
            arrays.append(a)
    return _unflatten(arrays[0], arrays[1]), _unflatten(arrays[2], arrays[3])
