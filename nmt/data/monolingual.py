"""Monolingual corpora for back-translation: a registered name (``multi30k_task2``, Elliott et al., 2016) made one
verified, deduplicated, cached text file without the lines of the parallel training split.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nmt.common.files import write_bytes_durably
from nmt.data.corpora import Multi30k
from nmt.data.errors import DataError
from nmt.data.fetch import fetch_file
from nmt.data.text import iter_lines

log = logging.getLogger(__name__)
DEDUP_VERSION = 1  # bumped when what is dropped changes

TASK2_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task2/raw/{name}"
TASK2_SHA256: dict[str, str] = {
    "train.1.de.gz": "0002241b52aba5160c08d644ea0d64a9bf46a2dfffcf619c9e3cdaa55b357004",
    "train.1.en.gz": "a0e057f07a9733199c0d755d77f6d583dc6f40a3180734b1130a216e2fdf3a3b",
    "train.2.de.gz": "ac7c29258b90aec0b64d677c5bfc831fc402e6296d0aa9cc7a3433ddbff85c37",
    "train.2.en.gz": "d79dd70a9eafb2d1fe40151621278c4ae69b3c148c5052a53d7c7a41bf3ba023",
    "train.3.de.gz": "ec5e6508813814aa31311b34e26e24f903dd7701f8d0668313259b7f975d7aa0",
    "train.3.en.gz": "86e16fdcc699bcb6bca0f87c3cf1051f7de5ee3674dd588cedc5200194282749",
    "train.4.de.gz": "bcee8ac6eb47d8a7dc8cff47d9a0fbd80b4363cfda22021bacd297f9604221a4",
    "train.4.en.gz": "3771b84e010ad6197806d2a1188cb07c12149e3e0d178dd5966dee5763733686",
    "train.5.de.gz": "dccb0ca6ff25e0b1f0d385f59fb809184e0db89622d88371725e3ec46d43bfc0",
    "train.5.en.gz": "73988689307fe836994eae59735dc840c15da9775455fa76e6ed22606a042a91",
}


@dataclass(frozen=True)
class MonolingualCorpus:
    """A registered monolingual corpus: its files per language and the parallel split it must not repeat.

    Attributes:
        name: the registered name, also its folder in the cache and the mirror.
        file_names: ``{lang}`` in the names of its files, which are read in this order.
        url_template: the public origin, with a ``{name}`` field.
        parallel_train: the registered parallel corpus whose training split is dropped from it.
    """

    name: str
    langs: tuple[str, ...]
    file_names: tuple[str, ...]
    url_template: str
    sha256: dict[str, str]
    parallel_train: type[Multi30k]


MONOLINGUAL: dict[str, MonolingualCorpus] = {
    "multi30k_task2": MonolingualCorpus(
        name="multi30k_task2",
        langs=("en", "de"),
        file_names=tuple(f"train.{i}.{{lang}}.gz" for i in range(1, 6)),
        url_template=TASK2_URL,
        sha256=TASK2_SHA256,
        parallel_train=Multi30k,
    ),
}


@dataclass(frozen=True)
class MonolingualText:
    """A monolingual corpus as one local file.

    Attributes:
        path: the deduplicated text, one sentence per line (plain UTF-8).
        lang: its language.
        info: what it is: name, input files and their sha256, lines read, kept and dropped (by reason).
    """

    path: Path
    lang: str
    info: dict[str, Any]


def monolingual_text(name: str, lang: str, *, cache_dir: str | Path,
                     mirror: str | Path | None = None) -> MonolingualText:
    """The registered monolingual corpus ``name`` in ``lang``: fetched, verified, deduplicated, cached.

    Raises:
        DataError: unknown corpus or language, or a file that cannot be had or does not verify.
    """
    if (corpus := MONOLINGUAL.get(name)) is None:
        raise DataError(f"unknown monolingual corpus {name!r}; registered: {', '.join(sorted(MONOLINGUAL))} "
                        "(or give the path of a text file, one sentence per line).")
    if lang not in corpus.langs:
        raise DataError(f"monolingual corpus {name!r} has no language {lang!r}; it has {', '.join(corpus.langs)}.")
    cache = Path(cache_dir).expanduser().resolve()
    mirror_path = Path(str(mirror)).expanduser() if mirror else None
    names = [pattern.format(lang=lang) for pattern in corpus.file_names]
    inputs = [fetch_file(file, corpus.url_template.format(name=file), cache / corpus.name, sha256=corpus.sha256[file],
                         corpus=corpus.name, mirror=mirror_path) for file in names]
    parallel = corpus.parallel_train(cache, mirror_path)
    task1 = parallel.fetch(f"train.{lang}.gz")
    hashes = [corpus.sha256[p.name] for p in inputs] + [parallel.sha256[task1.name]]
    key = hashlib.sha256(json.dumps([DEDUP_VERSION, hashes]).encode()).hexdigest()[:16]
    out = cache / corpus.name / f"mono.{lang}.{key}.txt"
    info_path = out.with_suffix(".json")
    if out.is_file() and info_path.is_file():
        return MonolingualText(out, lang, json.loads(info_path.read_text()))
    info = _deduplicate(inputs, task1, out)
    info.update(name=name, lang=lang, files={p.name: h for p, h in zip(inputs, hashes)},
                parallel_train={task1.name: hashes[-1]})
    write_bytes_durably(info_path, json.dumps(info, indent=1).encode())
    log.info("%s %s: kept %d of %d lines (dropped %s)", name, lang, info["kept"], info["read"], info["dropped"])
    return MonolingualText(out, lang, info)


def _deduplicate(inputs: list[Path], parallel_side: Path, out: Path) -> dict[str, Any]:
    """Write the lines of ``inputs`` to ``out`` less empty lines, lines of ``parallel_side`` and repeats."""
    parallel = set(iter_lines(parallel_side))
    seen: set[str] = set()
    dropped = {"empty": 0, "in the parallel training split": 0, "repeated": 0}
    kept: list[str] = []
    read = 0
    for path in inputs:
        for line in iter_lines(path):
            read += 1
            if not line:
                dropped["empty"] += 1
            elif line in parallel:
                dropped["in the parallel training split"] += 1
            elif line in seen:
                dropped["repeated"] += 1
            else:
                seen.add(line)
                kept.append(line)
    if not kept:
        raise DataError(f"every line of {', '.join(map(str, inputs))} was dropped ({dropped}); check the files.")
    write_bytes_durably(out, ("\n".join(kept) + "\n").encode())
    return {"read": read, "kept": len(kept), "dropped": dropped}


def resolve_monolingual(name_or_path: str, lang: str, *, cache_dir: str | Path,
                        mirror: str | Path | None = None) -> MonolingualText:
    """A registered monolingual corpus by name, or the user's own text file by path (used as it is).

    Raises:
        DataError: neither a registered name nor an existing file.
    """
    if name_or_path in MONOLINGUAL:
        return monolingual_text(name_or_path, lang, cache_dir=cache_dir, mirror=mirror)
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        raise DataError(f"{name_or_path!r} is neither a registered monolingual corpus "
                        f"({', '.join(sorted(MONOLINGUAL))}) nor a file (resolved to {path.absolute()}).")
    return MonolingualText(path, lang, {"name": str(path), "lang": lang})
