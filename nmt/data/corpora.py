"""Corpora: where parallel text comes from, and how it is fetched, verified, read and cleaned.

The one concept: a *corpus* maps a split name (``train``, ``val``, ``test_2016_flickr``) and a
language direction to two local files, one sentence per line, aligned by line number. Two kinds are
registered in ``CORPORA``:

- ``multi30k``: Multi30k task 1 (Elliott et al., 2016), fetched into a cache folder from a mirror
  folder or the official URL, each file sha256-verified against the hashes embedded below.
- ``files``: the user's own parallel text (WMT, IWSLT, OPUS, ...), a path per split and side.

Reading streams the two files as aligned pairs of stripped lines (``iter_pairs``; UTF-8 and line
counts checked, errors naming the file and line), so a corpus of millions of lines is never held
whole; the small splits that are scored are read into lists (``ParallelText``). Cleaning
(``PairFilter``) drops training pairs that would only hurt (empty side, too long, wild length ratio).

Shapes: none; this module deals in files and lines. Sentences are counted in whitespace words.

What it does not do: subwords (``nmt.data.tokenizer``), caching of anything derived from the text
(``nmt.data.prepare``), or batching (``nmt.data.batching``). It never filters validation or test
data: scores must be comparable with published ones on the full sets.
"""

from __future__ import annotations

import abc
import gzip
import hashlib
import http.client
import logging
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import IO, Any, ClassVar, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

MIRROR_ENV = "NMT_DATA_MIRROR"
DOWNLOAD_TIMEOUT_S = 60.0
_CHUNK = 1 << 20


class DataError(ValueError):
    """A problem with the data that the user can fix; the message names the file and the fix."""


# --------------------------------------------------------------------------------------------------
# Fetching and verifying
# --------------------------------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def download_url(url: str, dest: Path, timeout: float = DOWNLOAD_TIMEOUT_S) -> None:
    """Stream ``url`` into ``dest``. Tests monkeypatch this function so they never touch the network.

    Raises:
        urllib.error.URLError, OSError: the download failed (no network, 404, timeout, ...).
    """
    with urllib.request.urlopen(url, timeout=timeout) as response, open(dest, "wb") as out:
        shutil.copyfileobj(response, out, _CHUNK)


def _mirror_candidates(mirror: Path, corpus: str, name: str) -> list[Path]:
    # Accept both layouts: <mirror>/multi30k/<file> (the shared corpora folder) and <mirror>/<file>.
    return [mirror / corpus / name, mirror / name]


def fetch_file(
    name: str,
    url: str,
    dest_dir: Path,
    *,
    sha256: str | None,
    corpus: str,
    mirror: Path | None = None,
    timeout: float = DOWNLOAD_TIMEOUT_S,
) -> Path:
    """Return ``dest_dir/name``, verified, fetching it from the mirror or ``url`` when needed.

    A file already in ``dest_dir`` whose hash matches is used as is (no fetch). A fetched file is
    written to a temporary file next to its destination and renamed only after its hash checks out,
    so an interrupted or corrupt download never poses as a good one.

    Args:
        name: file name, the same in the cache, the mirror and the URL (``train.de.gz``).
        url: where to download it from when the mirror does not have it.
        dest_dir: the cache folder for this corpus (created if missing).
        sha256: the known hex sha256, or None when unknown (then the file is not verified).
        corpus: the corpus name, used for the ``<mirror>/<corpus>/<name>`` layout and messages.
        mirror: a folder tried before the network.
        timeout: network timeout in seconds.

    Raises:
        DataError: the hash does not match (the bad copy is removed), or the file could not be had
            from the mirror or the network.
    """
    dest = dest_dir / name
    if dest.is_file():
        if sha256 is None:
            return dest
        actual = sha256_of(dest)
        if actual == sha256:
            return dest
        # A cached copy that went bad (disk, manual edit): fetch it again rather than fail.
        log.warning("cached %s has sha256 %s, expected %s; fetching it again", dest, actual, sha256)
        dest.unlink()

    dest_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=dest_dir)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        source = _fill_from_mirror_or_url(tmp, name, url, corpus=corpus, mirror=mirror, timeout=timeout)
        if sha256 is not None:
            actual = sha256_of(tmp)
            if actual != sha256:
                raise DataError(
                    f"sha256 mismatch for {name} (from {source}): expected {sha256}, got {actual}. "
                    f"The bad copy was removed. If it came from the mirror, replace the mirror's file "
                    f"with a fresh download of {url}; otherwise retry (the download may have been cut)."
                )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    log.info("fetched %s from %s%s", dest, source, " (sha256 ok)" if sha256 else "")
    return dest


def _fill_from_mirror_or_url(
    tmp: Path, name: str, url: str, *, corpus: str, mirror: Path | None, timeout: float
) -> str:
    """Copy the file into ``tmp`` from the mirror or the network; return where it came from."""
    if mirror is not None:
        for candidate in _mirror_candidates(mirror, corpus, name):
            if candidate.is_file():
                shutil.copyfile(candidate, tmp)
                return str(candidate)
    try:
        download_url(url, tmp, timeout)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        looked = (
            f"the mirror {mirror} (looked for {' and '.join(map(str, _mirror_candidates(mirror, corpus, name)))})"
            if mirror is not None
            else "no mirror (none set)"
        )
        raise DataError(
            f"could not get {name}: tried {looked}, then {url} ({exc}). Without network, put the "
            f"file in a mirror folder as <mirror>/{corpus}/{name} or <mirror>/{name} and set "
            f"data.mirror=<mirror> or the environment variable {MIRROR_ENV}=<mirror>; or copy it "
            f"into {tmp.parent}/ yourself."
        ) from exc
    return url


# --------------------------------------------------------------------------------------------------
# The corpus registry
# --------------------------------------------------------------------------------------------------


class Corpus(abc.ABC):
    """A source of parallel splits. Subclasses register under ``name`` and say which files a split is.

    Construct with ``build_corpus``; ``split_files`` is the only thing the pipeline asks of one.
    """

    name: ClassVar[str]

    @classmethod
    def from_settings(cls, cache_dir: Path, mirror: Path | None, data_cfg: Mapping[str, Any]) -> Corpus:
        """The corpus for the ``data`` settings (a subclass reads the keys it has, e.g. ``data.files``)."""
        return cls(cache_dir, mirror)  # type: ignore[call-arg]

    @abc.abstractmethod
    def split_files(self, split: str, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
        """Local (fetched, verified) source and target files of ``split``.

        Raises:
            DataError: unknown split or language, or the files cannot be had.
        """


CORPORA: dict[str, type[Corpus]] = {}


def register_corpus(cls: type[Corpus]) -> type[Corpus]:
    """Class decorator: make a corpus selectable as ``data.corpus=<cls.name>``."""
    CORPORA[cls.name] = cls
    return cls


MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}"

# Languages of each Multi30k task 1 split (the 2017 test sets have no Czech).
MULTI30K_SPLITS: dict[str, tuple[str, ...]] = {
    "train": ("en", "de", "fr", "cs"),
    "val": ("en", "de", "fr", "cs"),
    "test_2016_flickr": ("en", "de", "fr", "cs"),
    "test_2017_flickr": ("en", "de", "fr"),
    "test_2017_mscoco": ("en", "de", "fr"),
    "test_2018_flickr": ("en", "de", "fr", "cs"),
}

# sha256 of the official files: every file of every split above. A file missing here would be fetched
# unverified, with a warning.
MULTI30K_SHA256: dict[str, str] = {
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "test_2017_flickr.de.gz": "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
    "test_2017_flickr.en.gz": "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
    "test_2017_flickr.fr.gz": "3ba671ceb2299f3304ffafefea7a833d08632fbaf0ba18546f8a2ec2391af496",
    "test_2017_mscoco.de.gz": "799e4854c25d601cb6cb6be29eabe5667734c61ace2f495e03e429031a0bc338",
    "test_2017_mscoco.en.gz": "aab300bfb4427697987e02cd0aacd44bfe8aa50456231b6474c08038bbed2b58",
    "test_2017_mscoco.fr.gz": "754f3072ba9f124569ba5258b32730fc1d214bbf8e0c6dfb2b74401676220db0",
    "test_2018_flickr.cs.gz": "7d0a9db904f94c554a8c58049a9f3a5357c27f46cc3d710d70cb0b4a2585b8c2",
    "test_2018_flickr.de.gz": "ddd0130c7d97482dc5197a02141dae8dd79f20f03586c480d675c09a32daf608",
    "test_2018_flickr.en.gz": "ef4f4844037d4c5dea75c9a8ed5fd78905967a26f67c255e230cc9780032654d",
    "test_2018_flickr.fr.gz": "fb2b83fcceb937a4f7e3e93c1c51c22aba92f1e342391e6b5ba392b16a920501",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
}


@register_corpus
class Multi30k(Corpus):
    """Multi30k task 1: ~29k English image captions with German, French and Czech translations.

    Args:
        cache_dir: the data cache; files go to ``cache_dir/multi30k/``.
        mirror: a folder holding ``multi30k/<file>`` or ``<file>``, tried before the network.
        url_template: the download URL with a ``{name}`` field (tests point it elsewhere).
        sha256: known hashes by file name.
        timeout: network timeout in seconds.
    """

    name = "multi30k"

    def __init__(
        self,
        cache_dir: Path,
        mirror: Path | None = None,
        *,
        url_template: str = MULTI30K_URL,
        sha256: Mapping[str, str] = MULTI30K_SHA256,
        timeout: float = DOWNLOAD_TIMEOUT_S,
    ) -> None:
        self.dir = Path(cache_dir) / self.name
        self.mirror = mirror
        self.url_template = url_template
        self.sha256 = dict(sha256)
        self.timeout = timeout

    def split_files(self, split: str, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
        if split not in MULTI30K_SPLITS:
            raise DataError(f"multi30k has no split {split!r}; valid splits: {', '.join(MULTI30K_SPLITS)}.")
        langs = MULTI30K_SPLITS[split]
        for lang in (src_lang, tgt_lang):
            if lang not in langs:
                raise DataError(
                    f"multi30k split {split!r} has no language {lang!r}; it has {', '.join(langs)}. "
                    f"Set data.src_lang / data.tgt_lang to two of them, or drop {split!r} from the splits."
                )
        return self.fetch(f"{split}.{src_lang}.gz"), self.fetch(f"{split}.{tgt_lang}.gz")

    def fetch(self, name: str) -> Path:
        """Fetch (or find in the cache) one file by name, verifying its hash when known."""
        sha = self.sha256.get(name)
        if sha is None and not (self.dir / name).is_file():
            log.warning("no known sha256 for multi30k %s; it will not be verified", name)
        return fetch_file(
            name,
            self.url_template.format(name=name),
            self.dir,
            sha256=sha,
            corpus=self.name,
            mirror=self.mirror,
            timeout=self.timeout,
        )


@register_corpus
class ParallelFiles(Corpus):
    """The user's own parallel text: ``{split: {"src": path, "tgt": path}}``, plain or ``.gz``.

    Relative paths resolve against the current working directory. Languages are labels only.
    """

    name = "files"

    @classmethod
    def from_settings(cls, cache_dir: Path, mirror: Path | None, data_cfg: Mapping[str, Any]) -> ParallelFiles:
        return cls(data_cfg.get("files"))

    def __init__(self, files: Mapping[str, Mapping[str, Any]] | None) -> None:
        if not files:
            raise DataError(
                "data.corpus=files needs data.files: a mapping {split: {src: path, tgt: path}} "
                "for the train, validation and test splits (see configs/data/files.yaml)."
            )
        self.files = {str(k): dict(v) if isinstance(v, Mapping) else v for k, v in files.items()}

    def split_files(self, split: str, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
        entry = self.files.get(split)
        if not isinstance(entry, dict):
            raise DataError(
                f"data.files has no entry for split {split!r} (it has: {', '.join(self.files) or 'none'}). "
                f"Add data.files.{split}.src=<path> and data.files.{split}.tgt=<path>."
            )
        paths = []
        for side in ("src", "tgt"):
            value = entry.get(side)
            if not value:
                raise DataError(f"data.files.{split} has no {side!r} path; set data.files.{split}.{side}=<path>.")
            path = Path(str(value)).expanduser()
            if not path.is_file():
                raise DataError(
                    f"data.files.{split}.{side} = {path} does not exist (resolved to {path.absolute()}). "
                    f"Relative paths resolve against the working directory; give an absolute path."
                )
            paths.append(path)
        return paths[0], paths[1]


def build_corpus(
    name: str,
    *,
    cache_dir: Path,
    mirror: str | Path | None = None,
    files: Mapping[str, Mapping[str, Any]] | None = None,
    settings: Mapping[str, Any] | None = None,
) -> Corpus:
    """The registered corpus ``name``, constructed from the data settings.

    Args:
        name: a key of ``CORPORA``.
        cache_dir: the data cache.
        mirror: a folder tried before the network.
        files: ``data.files`` (for ``files``).
        settings: the whole ``data`` section, for corpora with settings of their own (``data.tatoeba``).

    Raises:
        DataError: unknown corpus (the message lists the valid ones), or a bad ``files`` mapping.
    """
    if name not in CORPORA:
        raise DataError(f"unknown corpus {name!r}; valid corpora: {', '.join(sorted(CORPORA))}.")
    mirror_path = Path(str(mirror)).expanduser() if mirror else None
    if mirror_path is not None and not mirror_path.is_dir():
        log.warning("data mirror %s is not a folder; ignoring it", mirror_path)
        mirror_path = None
    return CORPORA[name].from_settings(Path(cache_dir), mirror_path, {**(settings or {}), "files": files})


# --------------------------------------------------------------------------------------------------
# Reading and cleaning, streamed: a corpus of millions of lines is never held as a whole
# --------------------------------------------------------------------------------------------------

INVALID_UTF8_MODES = ("error", "replace")


def iter_decoded(
    raw_lines: Iterable[bytes], name: str, invalid_utf8: str = "error", fix: str = "set data.invalid_utf8=replace"
) -> Iterator[str]:
    """Decode byte lines as UTF-8 and strip them, one at a time, naming the first bad line.

    Args:
        raw_lines: the lines as bytes (a binary file object iterates this way).
        name: the file's name for messages.
        invalid_utf8: ``error`` raises on the first bad line; ``replace`` substitutes U+FFFD and,
            once the lines are done, logs one warning with the count and the first bad line.
        fix: how to switch to ``replace`` in the caller's terms, for the error message.

    Raises:
        DataError: invalid UTF-8 (``error`` mode) or an unknown mode.
    """
    if invalid_utf8 not in INVALID_UTF8_MODES:
        raise DataError(f"invalid_utf8={invalid_utf8!r} is not valid; use one of {', '.join(INVALID_UTF8_MODES)}.")
    first_bad, n_bad = 0, 0
    for lineno, raw in enumerate(raw_lines, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            if invalid_utf8 == "error":
                raise DataError(
                    f"{name}, line {lineno:,}: invalid UTF-8 (byte {raw[exc.start]:#04x} at column "
                    f"{exc.start + 1}). Convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8), or {fix} "
                    "to substitute U+FFFD."
                ) from None
            text = raw.decode("utf-8", errors="replace")
            first_bad, n_bad = first_bad or lineno, n_bad + 1
        if lineno == 1:
            text = text.removeprefix("\ufeff")  # a UTF-8 byte-order mark is not part of the sentence
        yield text.strip()
    if n_bad:
        log.warning("%s: %d line(s) with invalid UTF-8 (first: line %d); bad bytes replaced by U+FFFD",
                    name, n_bad, first_bad)


def decode_lines(
    raw_lines: Iterable[bytes], name: str, invalid_utf8: str = "error", fix: str = "set data.invalid_utf8=replace"
) -> list[str]:
    """``iter_decoded`` as a list (shared by training and translation, whose inputs are small)."""
    return list(iter_decoded(raw_lines, name, invalid_utf8, fix))


def iter_lines(path: Path, invalid_utf8: str = "error") -> Iterator[str]:
    """The stripped lines of a plain or gzip text file (``.gz`` by name or by magic bytes), streamed.

    Only ``\\n`` ends a line (not the Unicode separators ``str.splitlines`` knows), so the line
    numbers of the two sides of a corpus stay aligned.

    Raises:
        DataError: invalid UTF-8 (``error`` mode, naming the line), or a corrupt gzip file.
    """
    try:
        with _open_binary(path) as f:
            lines = terminal_progress(f, f"reading {path.name}", " lines", unit_scale=True)
            yield from iter_decoded(lines, str(path), invalid_utf8)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"cannot read {path}: {exc}. Is the file truncated or not really gzip?") from exc


def read_lines(path: Path, invalid_utf8: str = "error") -> list[str]:
    """``iter_lines`` as a list."""
    return list(iter_lines(path, invalid_utf8))


def terminal_progress(items: Iterable[T], desc: str, unit: str, unit_scale: bool = False) -> Iterable[T]:
    """``items`` behind a tqdm bar on stderr when stderr is a terminal (a large corpus takes minutes); else as is.

    The bar disappears when done (``leave=False``), so logs and tests see nothing of it.
    """
    if not sys.stderr.isatty():
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit=unit, unit_scale=unit_scale, leave=False, mininterval=0.5)


def _open_binary(path: Path) -> IO[bytes]:
    with open(path, "rb") as f:
        magic = f.read(2)
    if path.suffix == ".gz" or magic == b"\x1f\x8b":
        return gzip.open(path, "rb")
    return open(path, "rb")


def iter_pairs(name: str, src_path: Path, tgt_path: Path, invalid_utf8: str = "error") -> Iterator[tuple[str, str]]:
    """The aligned ``(source, target)`` lines of a split, streamed, checking that the files align.

    Raises:
        DataError: different line counts (naming both files, both counts and the first line without
            a partner; raised when the shorter file ends), an empty split, or any error of ``iter_lines``.
    """
    lines = zip_longest(iter_lines(src_path, invalid_utf8), iter_lines(tgt_path, invalid_utf8))
    count = 0
    for count, (src, tgt) in enumerate(lines, start=1):
        if src is None or tgt is None:
            rest = count + sum(1 for _ in lines)  # the longer file's line count
            n_src, n_tgt = (count - 1, rest) if src is None else (rest, count - 1)
            longer = tgt_path if src is None else src_path
            raise DataError(
                f"split {name!r}: source and target have different line counts: {src_path} has {n_src:,} "
                f"lines, {tgt_path} has {n_tgt:,}; line {count:,} of {longer} has no partner. Parallel files must "
                f"align line by line; check for a missing or extra line (or a stray newline inside a sentence)."
            )
        yield src, tgt
    if count == 0:
        raise DataError(
            f"split {name!r} is empty: {src_path} and {tgt_path} have no lines. Point the split at non-empty files."
        )


@dataclass
class ParallelText:
    """One split as two aligned lists of stripped lines (for the splits that are scored: small)."""

    name: str
    src: list[str]
    tgt: list[str]
    src_path: Path | None = None
    tgt_path: Path | None = None

    def __len__(self) -> int:
        return len(self.src)


def read_parallel(name: str, src_path: Path, tgt_path: Path, invalid_utf8: str = "error") -> ParallelText:
    """Read a split's two files into memory, checking they align (``iter_pairs``' errors)."""
    src: list[str] = []
    tgt: list[str] = []
    for s, t in iter_pairs(name, src_path, tgt_path, invalid_utf8):
        src.append(s)
        tgt.append(t)
    return ParallelText(name, src, tgt, src_path, tgt_path)


@dataclass
class CleanStats:
    """How many training pairs cleaning kept, and how many it dropped for each reason."""

    total: int
    kept: int
    dropped: dict[str, int] = field(default_factory=dict)


class PairFilter:
    """Keeps a training pair unless a side is empty, over ``max_len`` words, or the word ratio is over ``max_ratio``.

    Call it on each pair of a stream (``filter(keep, pairs)``); it counts as it goes. Each dropped pair
    counts under the first reason it fails, in the order above. ``None`` turns a limit off.
    """

    def __init__(self, max_len: int | None = None, max_ratio: float | None = None) -> None:
        self.checks: list[tuple[str, Callable[[int, int], bool]]] = [("empty side", lambda s, t: s == 0 or t == 0)]
        if max_len is not None:
            self.checks.append((f"longer than {max_len} words", lambda s, t: max(s, t) > max_len))
        if max_ratio is not None:
            self.checks.append((f"length ratio over {max_ratio}", lambda s, t: max(s, t) > max_ratio * min(s, t)))
        self.stats = CleanStats(total=0, kept=0, dropped={reason: 0 for reason, _ in self.checks})

    def __call__(self, pair: tuple[str, str]) -> bool:
        ns, nt = len(pair[0].split()), len(pair[1].split())
        self.stats.total += 1
        for reason, fails in self.checks:
            if fails(ns, nt):
                self.stats.dropped[reason] += 1
                return False
        self.stats.kept += 1
        return True

    def report(self, name: str) -> CleanStats:
        """Log the counts once the stream is done.

        Raises:
            DataError: cleaning dropped every pair.
        """
        stats, dropped = self.stats, self.stats.dropped
        log.info("cleaned %s: kept %d of %d pairs; dropped %s", name, stats.kept, stats.total,
                 ", ".join(f"{n} ({reason})" for reason, n in dropped.items()) or "none")
        if not stats.kept:
            raise DataError(
                f"cleaning dropped every pair of split {name!r} ({dropped}). Check that the files "
                f"are the right ones, or loosen data.clean.max_len / data.clean.max_ratio (null = off)."
            )
        return stats


def clean_pairs(
    text: ParallelText, max_len: int | None = None, max_ratio: float | None = None
) -> tuple[ParallelText, CleanStats]:
    """``PairFilter`` over a split in memory: the kept pairs (in their original order) and the counts.

    Raises:
        DataError: cleaning dropped every pair.
    """
    keep = PairFilter(max_len, max_ratio)
    kept = [pair for pair in zip(text.src, text.tgt) if keep(pair)]
    stats = keep.report(text.name)
    src, tgt = [s for s, _ in kept], [t for _, t in kept]
    return ParallelText(text.name, src, tgt, text.src_path, text.tgt_path), stats
