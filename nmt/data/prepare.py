"""Preparation: from the ``data`` config to encoded, cached splits and their tokenizer, streamed so that the training
split is never held in memory, and cached so that a second run only maps files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from itertools import chain, islice
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nmt.common.files import write_bytes_durably
from nmt.common.progress import iterate_with_progress
from nmt.common.settings import bad_value_message, first_unknown_key
from nmt.data.corpora import build_corpus
from nmt.data.encoded import EncodedSplit, RaggedIds, SplitPart, SplitWriter, open_split, token_dtype
from nmt.data.errors import DataError
from nmt.data.fetch import mirror_folder, sha256_of
from nmt.data.mixture import check_entry, resolve_sources
from nmt.data.tatoeba import TatoebaSettings
from nmt.data.text import INVALID_UTF8_MODES, STRICT_UTF8, PairFilter, iter_pairs
from nmt.data.tokenizer import Tokenizer, TokenizerSettings, load_cached_tokenizer, tokenizer_key, train_and_cache

log = logging.getLogger(__name__)
ENCODE_CHUNK_LINES = 50_000  # pairs per SentencePiece batch call (the progress bar moves once per chunk)
# Bumped when reading, cleaning or encoding changes what a cache derived from the same files holds.
PREPARE_VERSION = 3  # 3: splits are lists of sources (mixtures, tags)


@dataclass
class CleanSettings:
    max_len: int | None = MISSING
    max_ratio: float | None = MISSING


@dataclass
class DataSettings:
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
    clean: CleanSettings = field(default_factory=CleanSettings)
    tokenizer: TokenizerSettings = MISSING
    max_tokens: int = MISSING
    valid_max_tokens: int = MISSING
    num_workers: int = MISSING
    mixture: Any = MISSING  # null, or a list of MixtureSourceSettings entries (checked by check_entry)
    tatoeba: TatoebaSettings = field(default_factory=TatoebaSettings)


@dataclass
class PreparedData:
    """Everything training and evaluation need from the data side.

    Attributes:
        tokenizer: the subword model(s), trained on ``train``.
        train: the cleaned training split (memory-mapped ids; no raw text).
        valid: the validation split (never filtered; with its raw text).
        tests: one split per name in ``data.test_splits`` (never filtered; with their raw text).
        stats: what happened: seconds per stage, cleaning counts, cache hits (for logs/benchmarks).
        fingerprint: a sha256 of the tokenizer and every split's ids: equal on two machines means
            they train and score on the same data.
    """

    tokenizer: Tokenizer
    train: EncodedSplit
    valid: EncodedSplit
    tests: dict[str, EncodedSplit]
    stats: dict[str, Any] = field(default_factory=dict)
    fingerprint: str = ""


@dataclass(frozen=True)
class SplitSource:
    """Where a split's pairs come from and how they are read: what its caches are keyed by.

    Attributes:
        src_path: the source file (plain or ``.gz``); tgt_path: the target file, aligned by line.
        sha256: the two files' sha256.
        invalid_utf8: ``error`` or ``replace``.
        clean: the training split's ``data.clean`` limits; None for a split that is never cleaned.
        tag: a training source's reserved token, put before each source sentence when encoding.
        weight: a training source's times per epoch (``data.mixture``); batching applies it.
        info: what the source is, for results.json.
    """

    name: str
    src_path: Path
    tgt_path: Path
    sha256: tuple[str, str]
    invalid_utf8: str
    clean: dict[str, Any] | None
    tag: str | None = None
    weight: float = 1.0
    info: dict[str, Any] = field(default_factory=dict, compare=False)

    def pairs(self, keep: PairFilter | None = None) -> Iterator[tuple[str, str]]:
        """The aligned pairs streamed from disk; with ``keep``, only those it keeps (it counts them)."""
        pairs = iter_pairs(self.name, self.src_path, self.tgt_path, self.invalid_utf8)
        return pairs if keep is None else filter(keep, pairs)

    def new_filter(self) -> PairFilter | None:
        """A fresh ``PairFilter`` with this split's limits; None when it is not cleaned."""
        return None if self.clean is None else PairFilter(**self.clean)

    def identity(self) -> dict[str, Any]:
        """What the pairs depend on: the files' contents and how they are read and cleaned (not where they are)."""
        return {"version": PREPARE_VERSION, "sha256": list(self.sha256), "invalid_utf8": self.invalid_utf8,
                "clean": self.clean, "tag": self.tag}

    def encoded_pairs(self, keep: PairFilter | None = None) -> Iterator[tuple[str, str]]:
        """``pairs`` with the tag (if any) before each source sentence: what the model is trained on."""
        pairs = self.pairs(keep)
        return pairs if self.tag is None else ((f"{self.tag} {s}", t) for s, t in pairs)


def resolve_data_config(data_cfg: Any) -> dict[str, Any]:
    """Check a complete ``data`` section (as in configs/data/*.yaml) and return it as plain values; train.py's
    config check calls it too.

    Raises:
        DataError: an unknown key (naming the nearest valid one), a wrong type, a missing key or a bad value.
    """
    given = OmegaConf.to_container(data_cfg, resolve=True) if isinstance(data_cfg, DictConfig) else dict(data_cfg)
    if problem := first_unknown_key(given, DataSettings, "data."):
        raise DataError(problem)
    if given.get("invalid_utf8", STRICT_UTF8) not in INVALID_UTF8_MODES:
        raise DataError(f"data.invalid_utf8={given['invalid_utf8']!r} is not valid; use one of "
                        f"{', '.join(INVALID_UTF8_MODES)}.")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(DataSettings), given)
    except OmegaConfBaseException as error:
        raise DataError(bad_value_message("data.", error)) from None
    if missing := sorted(OmegaConf.missing_keys(merged)):
        raise DataError(f"the data config lacks {', '.join('data.' + key for key in missing)}; start from "
                        "configs/data/multi30k.yaml or configs/data/files.yaml")
    cfg: dict[str, Any] = OmegaConf.to_container(merged)  # type: ignore[assignment]
    TokenizerSettings(**cfg["tokenizer"])  # its own checks: model type, sizes
    for key in ("max_tokens", "valid_max_tokens"):
        if cfg[key] <= 0:
            raise DataError(f"data.{key}={cfg[key]!r} must be positive")
    if cfg["mixture"] is not None:
        if not isinstance(cfg["mixture"], list):
            raise DataError(f"data.mixture={cfg['mixture']!r} must be a list of sources, e.g. "
                            "[{corpus: multi30k, weight: 2}, {synthetic: runs/bt_en, tag: '<bt>'}], or null.")
        cfg["mixture"] = [asdict(check_entry(index, entry)) for index, entry in enumerate(cfg["mixture"])]
    if cfg["src_lang"] == cfg["tgt_lang"] and cfg["corpus"] != "files":
        raise DataError(f"data.src_lang and data.tgt_lang are both {cfg['src_lang']!r}; pick two languages.")
    return cfg


def prepare_data(data_cfg: Any, cache_dir: str | Path | None = None) -> PreparedData:
    """Fetch, verify, check, clean, tokenize and encode the splits named in ``data_cfg``.

    Under DDP, let rank 0 prepare first and the others after a barrier: they find everything cached and map
    the same files, one page-cache copy for all (ranks on other machines compare ``PreparedData.fingerprint``).

    Args:
        data_cfg: the complete ``data`` config group (DictConfig or plain dict, as in configs/data/).
        cache_dir: overrides ``data_cfg.cache_dir``; relative paths resolve against the working directory.

    Raises:
        DataError: anything wrong with the data or the settings; the message says how to fix it.
    """
    cfg = resolve_data_config(data_cfg)
    cache = Path(cache_dir if cache_dir is not None else cfg["cache_dir"]).expanduser().resolve()
    stats: dict[str, Any] = {"cache_dir": str(cache), "seconds": {}, "encoded_cache_hits": 0}
    seconds = stats["seconds"]
    train_parts, scored = split_sources(cfg, cache, seconds)

    start = time.perf_counter()
    settings = TokenizerSettings(**cfg["tokenizer"])
    tokenizer = prepare_tokenizer(train_parts, settings, cache / "spm")
    seconds["tokenizer"] = time.perf_counter() - start

    start = time.perf_counter()
    encoded, manifests = {}, {}
    for name, parts in [(cfg["train_split"], train_parts), *((n, [source]) for n, source in scored.items())]:
        src_ids, tgt_ids, manifests[name], hit = encode_split(name, parts, tokenizer, cache / "encoded")
        stats["encoded_cache_hits"] += int(hit)
        text = [list(side) for side in zip(*parts[0].pairs())] if name in scored else (None, None)  # small
        split_parts = [SplitPart(p.name, m["pairs"], p.weight) for p, m in zip(parts, manifests[name]["parts"])]
        encoded[name] = EncodedSplit(name, src_ids, tgt_ids, *text, parts=split_parts if name not in scored else ())
    seconds["encode"] = time.perf_counter() - start
    stats["sources"] = source_records(train_parts, manifests[cfg["train_split"]]["parts"])
    stats["clean"] = stats["sources"][0]["clean"] if len(train_parts) == 1 else [s["clean"] for s in stats["sources"]]
    digests = {name: [m["src"]["sha256"], m["tgt"]["sha256"]] for name, m in manifests.items()}
    weights = [p.weight for p in train_parts]
    fingerprint = hashlib.sha256(json.dumps([tokenizer.fingerprint, digests, weights], sort_keys=True).encode())

    data = PreparedData(tokenizer=tokenizer, train=encoded[cfg["train_split"]], valid=encoded[cfg["valid_split"]],
                        tests={name: encoded[name] for name in cfg["test_splits"]}, stats=stats,
                        fingerprint=fingerprint.hexdigest())
    sources = [f"{s['name']} {s['pairs']} x{s['weight']:g}{' ' + s['tag'] if s['tag'] else ''}"
               for s in stats["sources"]]
    log.info("data %s %s->%s: train %d (%s), %s %d, %s; %s; fingerprint %s; %.1f s", cfg["corpus"], cfg["src_lang"],
             cfg["tgt_lang"], len(data.train), ", ".join(sources), cfg["valid_split"], len(data.valid),
             ", ".join(f"{k} {len(v)}" for k, v in data.tests.items()) or "no test splits", tokenizer,
             data.fingerprint[:16], sum(seconds.values()))
    return data


def source_records(parts: list[SplitSource], manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What results.json records of each training source: size, weight, tag, files' sha256, cleaning, origin."""
    return [{"name": p.name, "pairs": m["pairs"], "weight": p.weight, "tag": p.tag,
             "files": {str(p.src_path): p.sha256[0], str(p.tgt_path): p.sha256[1]}, "clean": m["clean"], **p.info}
            for p, m in zip(parts, manifests)]


def split_sources(cfg: dict[str, Any], cache: Path,
                  seconds: dict[str, float]) -> tuple[list[SplitSource], dict[str, SplitSource]]:
    """The training sources and each scored split, fetched, verified and hashed (timed in ``seconds``).

    Returns:
        ``(training sources, {scored split name: source})``: the mixture's sources (or the one training split),
        and the validation and test splits of ``data.corpus``.
    """
    start = time.perf_counter()
    mirror = mirror_folder(cfg["mirror"])
    corpus = build_corpus(cfg["corpus"], cache_dir=cache, mirror=mirror, files=cfg["files"], settings=cfg)
    names = [cfg["valid_split"], *cfg["test_splits"]]
    paths = {name: corpus.split_files(name, cfg["src_lang"], cfg["tgt_lang"]) for name in dict.fromkeys(names)}
    resolved = resolve_sources(cfg, cache, mirror)
    seconds["fetch_verify"] = time.perf_counter() - start
    start = time.perf_counter()

    def hashed(path: Path) -> str:
        return file_sha256(path, cache / "hashes")

    train = [SplitSource(r.name, r.src_path, r.tgt_path, (hashed(r.src_path), hashed(r.tgt_path)), cfg["invalid_utf8"],
                         dict(cfg["clean"]), r.tag, r.weight, r.info) for r in resolved]
    scored = {name: SplitSource(name, src, tgt, (hashed(src), hashed(tgt)), cfg["invalid_utf8"], None)
              for name, (src, tgt) in paths.items()}
    seconds["hash"] = time.perf_counter() - start
    return train, scored


def file_sha256(path: Path, memo_dir: Path) -> str:
    """The sha256 of a corpus file, remembered in ``memo_dir`` by path, size, mtime and inode: a cached run reads no
    corpus file to know nothing changed (4.5M pairs are ~1 GB); a replaced or touched file is hashed again.
    """
    stat = path.stat()
    seen = {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "inode": stat.st_ino}
    memo = memo_dir / f"{hashlib.sha256(seen['path'].encode()).hexdigest()[:24]}.json"
    try:
        known = json.loads(memo.read_text())
        if {key: known.get(key) for key in seen} == seen and isinstance(known.get("sha256"), str):
            return known["sha256"]
    except (OSError, ValueError, AttributeError):
        pass
    digest = sha256_of(path)
    memo_dir.mkdir(parents=True, exist_ok=True)
    write_bytes_durably(memo, json.dumps({**seen, "sha256": digest}).encode())
    return digest


def prepare_tokenizer(train: list[SplitSource], settings: TokenizerSettings, spm_dir: Path) -> Tokenizer:
    """The subword model(s) for the training sources, cached while their files and the settings are unchanged; else
    one pass checks and cleans the pairs (a bad line fails before the slow part), then SentencePiece trains on the
    cleaned sentences, streamed again for each model. Tags become pieces.
    """
    tags = sorted({source.tag for source in train if source.tag is not None})
    key = tokenizer_key(settings, json.dumps([[s.identity() for s in train], tags], sort_keys=True))
    if (tokenizer := load_cached_tokenizer(key, settings, spm_dir)) is not None:
        return tokenizer
    kept = 0
    for source in train:  # training sources are always cleaned
        keep = source.new_filter()
        kept += sum(1 for _ in source.pairs(keep))
        keep.report(source.name)

    def side(index: int) -> Iterator[str]:
        return (pair[index] for source in train for pair in source.pairs(source.new_filter()))

    def sentences(model: str) -> Iterable[str]:
        return chain(side(0), side(1)) if model == "joint" else side(0 if model == "src" else 1)

    return train_and_cache(key, settings, spm_dir, sentences, kept, tags)


def encode_split(name: str, parts: list[SplitSource], tokenizer: Tokenizer,
                 encoded_dir: Path) -> tuple[RaggedIds, RaggedIds, dict[str, Any], bool]:
    """A split's ids (its sources one after the other), memory-mapped from ``encoded_dir``, encoded in chunks and
    written first when not there. Returns ``(src_ids, tgt_ids, manifest, cache_hit)``; ``manifest["parts"]``
    holds each source's pair and cleaning counts.
    """
    key_source = json.dumps({"tokenizer": tokenizer.fingerprint, "sources": [p.identity() for p in parts]},
                            sort_keys=True)
    stem = encoded_dir / f"{name}.{hashlib.sha256(key_source.encode()).hexdigest()[:24]}"
    if (found := open_split(stem)) is not None:
        return (*found, True)
    dtype = token_dtype(max(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size))
    records = []
    with SplitWriter(stem, dtype) as writer:
        for part in parts:
            keep, before = part.new_filter(), writer.rows
            chunks = _chunks(part.encoded_pairs(keep), ENCODE_CHUNK_LINES)
            for chunk in iterate_with_progress(chunks, f"encoding {part.name}", " chunks"):
                writer.append(tokenizer.encode_src_batch([s for s, _ in chunk]),
                              tokenizer.encode_tgt_batch([t for _, t in chunk]))
            clean = asdict(keep.report(part.name)) if keep is not None else None
            records.append({"name": part.name, "pairs": writer.rows - before, "clean": clean})
        writer.commit({"name": name, "tokenizer": tokenizer.fingerprint,
                       "sources": [p.identity() for p in parts], "parts": records})
    if (found := open_split(stem)) is None:
        raise DataError(f"the encoded split {stem} could not be read back after writing it; is {encoded_dir} "
                        "on a full or failing disk?")
    return (*found, False)


def _chunks(pairs: Iterable[tuple[str, str]], size: int) -> Iterator[list[tuple[str, str]]]:
    iterator = iter(pairs)
    while chunk := list(islice(iterator, size)):
        yield chunk
