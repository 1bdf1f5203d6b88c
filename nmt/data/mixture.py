"""Mixtures: the training pairs of one run drawn from several parallel sources (corpus splits, files, synthetic
folders), each with a ``weight`` (times seen per epoch) and an optional ``tag`` token (Caswell et al., 2019).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nmt.common.settings import first_unknown_key
from nmt.data.corpora import CORPORA, build_corpus
from nmt.data.errors import DataError
from nmt.data.fetch import mirror_folder
from nmt.data.synthetic import pair_files

KINDS = ("corpus", "src", "synthetic")  # what a source entry names: exactly one of these keys (src goes with tgt)


@dataclass
class MixtureSourceSettings:
    """One entry of ``data.mixture``; this dataclass is the one home of its defaults. Exactly one kind is given:
    ``corpus`` (+ ``split``), ``src`` + ``tgt``, or ``synthetic``.

    Attributes:
        corpus: a registered parallel corpus (``multi30k``, ``tatoeba``), in ``data.src_lang`` → ``data.tgt_lang``.
        split: which of the corpus's splits.
        src: the user's source file (plain or ``.gz``); tgt: its target file, aligned by line.
        synthetic: a back-translation output folder (``train.<src_lang>``, ``train.<tgt_lang>``, provenance.json).
        weight: times per epoch its pairs are seen; fractional weights draw a new subset every epoch.
        tag: a reserved token (no spaces, e.g. ``<bt>``) put before each of its source sentences.
        name: its label in logs and results.json (default: the corpus, folder or file name).
        backtranslate: with ``synthetic``, backtranslate.py's settings to make a missing or unfinished folder
            (``{checkpoint: RUN, input: multi30k_task2, lang: en}``); train.py runs that job first.
        forward_translate: the same for a forward translation (distillation): teachers of this direction
            translate ``input`` (default: ``data.corpus``'s training sources); ``{checkpoint: [A, B]}`` suffices.
    """

    corpus: str | None = None
    split: str = "train"
    src: str | None = None
    tgt: str | None = None
    synthetic: str | None = None
    weight: float = 1.0
    tag: str | None = None
    name: str | None = None
    backtranslate: Any = None
    forward_translate: Any = None


@dataclass(frozen=True)
class ResolvedSource:
    """A source of training pairs, its files found and checked.

    Attributes:
        name: its label (unique in the mixture).
        src_path: the source-side file; tgt_path: the target-side file, aligned by line.
        weight: times per epoch its pairs are seen.
        tag: the reserved token before each source sentence, or None.
        info: what it is, for results.json (the corpus's statistics, a back-translation's provenance).
    """

    name: str
    src_path: Path
    tgt_path: Path
    weight: float = 1.0
    tag: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


def resolve_sources(cfg: Mapping[str, Any], cache: Path, mirror: str | Path | None) -> list[ResolvedSource]:
    """The training sources of a checked ``data`` section: ``data.mixture``'s, or the one training split.

    Raises:
        DataError: a bad entry (unknown key or corpus, no or two kinds, weight <= 0, a tag with spaces,
            a name used twice), or a source whose files are missing or of another language pair.
    """
    if cfg.get("mixture") is None:
        src, tgt, info = _corpus_split(cfg["corpus"], cfg["train_split"], cfg, cache, mirror)
        return [ResolvedSource(cfg["corpus"], src, tgt, info=info)]
    if not cfg["mixture"]:
        raise DataError("data.mixture is empty; list at least one source, or set data.mixture=null for the "
                        "corpus's own training split.")
    sources = [_resolve(index, entry, cfg, cache, mirror) for index, entry in enumerate(cfg["mixture"])]
    names = [source.name for source in sources]
    if len(set(names)) != len(names):
        raise DataError(f"data.mixture names a source twice ({', '.join(names)}); give each a unique name: key.")
    return sources


def check_entry(index: int, entry: Any) -> MixtureSourceSettings:
    """One ``data.mixture`` entry as its dataclass, with defaults filled in, after checking it.

    Raises:
        DataError: naming ``data.mixture[index]``, the key and the fix.
    """
    where = f"data.mixture[{index}]"
    if not isinstance(entry, Mapping):
        raise DataError(f"{where} is {entry!r}; each source is a mapping such as {{corpus: multi30k, weight: 2}}.")
    if problem := first_unknown_key(entry, MixtureSourceSettings, f"{where}."):
        raise DataError(problem)
    source = MixtureSourceSettings(**entry)
    kinds = [kind for kind in KINDS if getattr(source, kind) is not None]
    if len(kinds) != 1 or (source.src is None) != (source.tgt is None):
        given = [key for key in ("corpus", "split", "src", "tgt", "synthetic") if entry.get(key)]
        raise DataError(f"{where} must name exactly one source: corpus: NAME, or src: PATH with tgt: PATH, or "
                        f"synthetic: FOLDER (it has {', '.join(given) or 'none'}).")
    if source.corpus is not None and source.corpus not in CORPORA:
        raise DataError(f"{where}.corpus={source.corpus!r} is not a registered corpus; valid: "
                        f"{', '.join(sorted(c for c in CORPORA if c != 'files'))} (or src/tgt for your own files).")
    try:
        weight = float(source.weight)
    except (TypeError, ValueError):
        weight = math.nan
    if not (math.isfinite(weight) and weight > 0):
        raise DataError(f"{where}.weight={source.weight!r} must be a number > 0 (times per epoch its pairs are "
                        "seen; 0.5 = half of them); drop the source to leave it out.")
    source.weight = weight
    for key in ("backtranslate", "forward_translate"):
        job = getattr(source, key)
        if job is not None and (source.synthetic is None or not isinstance(job, Mapping)):
            raise DataError(f"{where}.{key} goes with synthetic: FOLDER and holds backtranslate.py's settings, "
                            "e.g. {checkpoint: runs/best_en-de/seed42, input: multi30k_task2, lang: en}.")
    if source.backtranslate is not None and source.forward_translate is not None:
        raise DataError(f"{where} says both backtranslate and forward_translate; a folder is made one way: keep one.")
    if source.tag is not None and (not str(source.tag) or any(c.isspace() for c in str(source.tag))):
        raise DataError(f"{where}.tag={source.tag!r} must be one token without spaces, e.g. <bt>.")
    return source


def _resolve(index: int, entry: Any, cfg: Mapping[str, Any], cache: Path, mirror: str | Path | None) -> ResolvedSource:
    source = check_entry(index, entry)
    where, langs = f"data.mixture[{index}]", (cfg["src_lang"], cfg["tgt_lang"])
    info: dict[str, Any] = {}
    if source.corpus is not None:
        try:
            src, tgt, info = _corpus_split(source.corpus, source.split, cfg, cache, mirror)
        except DataError as error:
            raise DataError(f"{where}: {error}") from None
        default_name = source.corpus if source.split == "train" else f"{source.corpus}.{source.split}"
    elif source.synthetic is not None:
        folder = Path(source.synthetic).expanduser()
        src, tgt, info = pair_files(folder, langs, where)
        default_name = folder.name
    else:
        src, tgt = (Path(str(p)).expanduser() for p in (source.src, source.tgt))
        for side, path in (("src", src), ("tgt", tgt)):
            if not path.is_file():
                raise DataError(f"{where}.{side} = {path} does not exist (resolved to {path.absolute()}).")
        default_name = src.name
    return ResolvedSource(source.name or default_name, src, tgt, source.weight, source.tag, info)


def training_source_file(cfg: Mapping[str, Any]) -> Path:
    """The source-side file of ``data.corpus``'s training split: what a forward translation translates by default."""
    cache = Path(str(cfg["cache_dir"])).expanduser().resolve()
    return _corpus_split(cfg["corpus"], cfg["train_split"], cfg, cache, mirror_folder(cfg["mirror"]))[0]


def _corpus_split(name: str, split: str, cfg: Mapping[str, Any], cache: Path,
                  mirror: str | Path | None) -> tuple[Path, Path, dict[str, Any]]:
    """A registered corpus's split in the ``data`` languages, and the corpus's own statistics (Tatoeba's), if any."""
    corpus = build_corpus(name, cache_dir=cache, mirror=mirror, files=cfg["files"], settings=cfg)
    src, tgt = corpus.split_files(split, cfg["src_lang"], cfg["tgt_lang"])
    info = getattr(corpus, "info", None)
    return src, tgt, {"corpus": info()} if callable(info) else {}
