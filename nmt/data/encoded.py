"""Encoded splits: the subword ids of many sentences as one flat token array plus offsets, written in chunks to
``.npy`` files (manifest last) and memory-mapped back, so every process shares one page-cache copy.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import IO, Any, NamedTuple

import numpy as np

from nmt.common.files import replace_durably, write_bytes_durably
from nmt.data.errors import DataError
from nmt.data.tokenizer import CACHE_FILE_MODE

log = logging.getLogger(__name__)

FORMAT = 1  # bumped when the layout of the files changes
SIDES = ("src", "tgt")
_COPY_ROWS = 1 << 20  # lengths turned into offsets per read while writing
_LENGTH_ROWS = 1 << 20  # offsets turned into lengths per read


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id of a ``vocab_size`` vocabulary fits (half the disk and page cache), else int32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.int32)


class RaggedIds(Sequence[list[int]]):
    """Rows of token ids stored flat: ``tokens`` ``[N_tok]``, ``offsets`` ``[N + 1]`` int64 row starts (``0`` to
    ``N_tok``); ``ids[i]`` is row ``i`` as a ``list[int]``, ``ids[a:b]`` a list of rows.
    """

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray) -> None:
        self.tokens = tokens
        self.offsets = offsets
        self._files: _FileRows | None = None  # a mapped split's files, opened at the first row read
        self._files_opened = False

    @classmethod
    def from_rows(cls, rows: Iterable[Sequence[int]]) -> RaggedIds:
        """In-memory rows (int32) from lists of ids; a ``RaggedIds`` is returned as it is."""
        if isinstance(rows, RaggedIds):
            return rows
        rows = rows if isinstance(rows, Sequence) else list(rows)
        lengths = np.fromiter(map(len, rows), np.int64, count=len(rows))
        offsets = np.concatenate([np.zeros(1, np.int64), np.cumsum(lengths)])
        return cls(np.fromiter(chain.from_iterable(rows), np.int32, count=int(offsets[-1])), offsets)

    @property
    def lengths(self) -> np.ndarray:
        """``[N]``: the number of ids in each row, uint16 (2 bytes a row; int32 when a row has more than 65,535)."""
        lengths, start = np.empty(len(self), np.uint16), 0
        for chunk in self._length_chunks():
            if chunk.size and chunk.max() > np.iinfo(lengths.dtype).max:
                lengths = lengths.astype(np.int32)
            lengths[start : start + chunk.size] = chunk
            start += chunk.size
        return lengths

    def _length_chunks(self) -> Iterator[np.ndarray]:
        """The rows' lengths, ``_LENGTH_ROWS`` rows at a time. A mapped split's offsets (8 bytes a row) are read
        from their file, not through the mapping: pages touched in a mapping would stay in this process's memory.
        """
        if self.paths is None or not os.path.exists(self.paths[1]):  # in memory, or a cache deleted under its mapping
            for start in range(0, len(self), _LENGTH_ROWS):
                yield np.diff(self.offsets[start : start + _LENGTH_ROWS + 1])
            return
        with open(self.paths[1], "rb") as file:
            read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
            dtype = read_header[np.lib.format.read_magic(file)](file)[2]  # the file position is now the data's
            previous = np.fromfile(file, dtype, count=1)  # offsets[0], where the first row starts
            while (chunk := np.fromfile(file, dtype, count=_LENGTH_ROWS)).size:
                yield np.diff(chunk, prepend=previous)
                previous = chunk[-1:]

    @property
    def paths(self) -> tuple[str, str] | None:
        """The ``.npy`` files of the tokens and offsets when memory-mapped, else None."""
        names = (getattr(self.tokens, "filename", None), getattr(self.offsets, "filename", None))
        return (str(names[0]), str(names[1])) if names[0] and names[1] else None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int | slice) -> Any:
        rows = range(len(self))[index]  # negative indices count from the end; IndexError past it
        if isinstance(rows, range):
            return [self[i] for i in rows]
        if (files := self._files if self._files_opened else self._open_files()) is not None:
            return files.row(rows)
        return self.tokens[self.offsets[rows] : self.offsets[rows + 1]].tolist()

    def _open_files(self) -> _FileRows | None:
        """A mapped split's files, open to read rows from (None in memory, or for a cache deleted under its mapping).
        Rows are read from the files, not through the mapping: a page touched in a mapping stays in this process's
        RSS, and the kernel maps its neighbours with it (64 KiB, or a whole large folio, a fault), so a few batches
        of scattered rows would put most of a big split's files in the memory of every process that reads it.
        """
        self._files_opened = True
        try:
            files = [open(path, "rb", buffering=0) for path in self.paths or ()]  # noqa: SIM115  # kept open
        except OSError:  # a cache deleted under its mapping
            files = []
        arrays = (self.tokens, self.offsets)
        # Whole files' arrays in this machine's byte order (a view of part of one would be read at the wrong place).
        if files and all(os.fstat(f.fileno()).st_size == a.offset + a.nbytes and a.dtype.isnative
                         for f, a in zip(files, arrays)):
            self._files = _FileRows(*zip(files, arrays))
        else:
            for file in files:
                file.close()
        return self._files

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RaggedIds):
            return np.array_equal(self.offsets, other.offsets) and np.array_equal(self.tokens, other.tokens)
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(self) == len(other) and all(row == list(o) for row, o in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable arrays inside

    def __reduce__(self) -> tuple[Any, ...]:
        # A mapped split travels to another process (a DataLoader worker under spawn) as its paths.
        if self.paths is not None:
            return (map_ragged, self.paths)
        return (RaggedIds, (self.tokens, self.offsets))

    def __repr__(self) -> str:
        where = f", mapped from {self.paths[0]}" if self.paths else ""
        return f"RaggedIds({len(self)} rows, {len(self.tokens)} ids, {self.tokens.dtype}{where})"


class _FileRows:
    """Rows of a mapped ``RaggedIds`` read with ``pread`` from its two ``.npy`` files (kept open, so a row stays
    readable when the cache is deleted or rewritten meanwhile): the page cache holds them, not this process."""

    __slots__ = ("files", "fds", "offsets_at", "token_code", "token_size", "tokens_at")

    def __init__(self, tokens: tuple[io.FileIO, np.memmap], offsets: tuple[io.FileIO, np.memmap]) -> None:
        self.files = (tokens[0], offsets[0])
        self.fds = (tokens[0].fileno(), offsets[0].fileno())
        self.tokens_at, self.offsets_at = tokens[1].offset, offsets[1].offset  # where the data starts in each file
        self.token_size, self.token_code = tokens[1].dtype.itemsize, tokens[1].dtype.char  # the offsets are int64

    def row(self, index: int) -> list[int]:
        """Row ``index`` (0 <= index < rows) as a list of ids."""
        start, end = self._read(1, self.offsets_at + 8 * index, 16).cast("q")
        size = self.token_size
        return self._read(0, self.tokens_at + size * start, size * (end - start)).cast(self.token_code).tolist()

    def first_and_last_offset(self, rows: int) -> tuple[int, int]:
        """``offsets[0]`` and ``offsets[rows]``."""
        first, last = (self._read(1, self.offsets_at + 8 * i, 8).cast("q")[0] for i in (0, rows))
        return first, last

    def _read(self, which: int, at: int, size: int) -> memoryview:
        """``size`` bytes at ``at`` of the tokens' (``which`` 0) or the offsets' (1) file."""
        data = os.pread(self.fds[which], size, at)
        if len(data) != size:
            raise DataError(f"{self.files[which].name} ends before byte {at + size}: a cache file changed under "
                            "this process; run again to rebuild it.")
        return memoryview(data)


def map_ragged(tokens_path: str | Path, offsets_path: str | Path) -> RaggedIds:
    """Memory-map the two ``.npy`` files of ``RaggedIds`` (read-only; nothing is read until used)."""
    return RaggedIds(np.load(tokens_path, mmap_mode="r"), np.load(offsets_path, mmap_mode="r"))


class SplitPart(NamedTuple):
    """A run of consecutive pairs of a split that came from one source, and how often an epoch sees them."""

    name: str
    pairs: int
    weight: float = 1.0


@dataclass
class EncodedSplit:
    """One split as subword ids (no BOS/EOS), a map-style dataset: ``split[i]`` is ``(i, src_ids, tgt_ids)``.

    Attributes:
        name: the split name (``train``, ``val``, ``test_2016_flickr``, ...).
        src_ids: source ids per pair (lists of id lists are turned into ``RaggedIds``).
        tgt_ids: target ids per pair.
        src_text: the source lines (stripped); None for the training split, whose text is never held in memory.
        tgt_text: the target lines (stripped), the references sacrebleu scores against; None for training.
        parts: a training split's sources in order with their weights; empty: one source, seen once per epoch.
    """

    name: str
    src_ids: RaggedIds
    tgt_ids: RaggedIds
    src_text: Sequence[str] | None = None
    tgt_text: Sequence[str] | None = None
    parts: Sequence[SplitPart] = ()

    def __post_init__(self) -> None:
        self.src_ids = RaggedIds.from_rows(self.src_ids)
        self.tgt_ids = RaggedIds.from_rows(self.tgt_ids)
        sizes = [None if x is None else len(x) for x in (self.src_ids, self.tgt_ids, self.src_text, self.tgt_text)]
        if len(set(sizes) - {None}) != 1 or sizes.count(None) == 1:
            raise DataError(f"EncodedSplit {self.name!r}: src_ids/tgt_ids/src_text/tgt_text have different lengths "
                            f"{'/'.join(map(str, sizes))}.")

    def __len__(self) -> int:
        return len(self.src_ids)

    def __getitem__(self, index: int) -> tuple[int, list[int], list[int]]:
        return index, self.src_ids[index], self.tgt_ids[index]


# --------------------------------------------------------------------------------------------------
# On disk: written in chunks under temporary names, renamed when complete, checked when opened
# --------------------------------------------------------------------------------------------------


def _side_paths(stem: Path, side: str) -> tuple[Path, Path]:
    return stem.with_name(f"{stem.name}.{side}.tokens.npy"), stem.with_name(f"{stem.name}.{side}.offsets.npy")


def manifest_path(stem: Path) -> Path:
    """The manifest of the split at ``stem``: written last, so its presence means the split is complete."""
    return stem.with_name(f"{stem.name}.json")


class _SideWriter:
    """One side's ids, appended to raw temporary files; ``finish`` makes the two ``.npy`` files (still temporary)."""

    def __init__(self, stem: Path, side: str, dtype: np.dtype, temps: list[Path]) -> None:
        self.stem, self.side, self.dtype, self.temps = stem, side, dtype, temps
        self.tokens, self.lengths = self._temp("tokens.raw")[0], self._temp("lengths.raw")[0]
        self.token_digest, self.length_digest = hashlib.sha256(), hashlib.sha256()
        self.rows = self.count = 0

    def _temp(self, what: str) -> tuple[IO[bytes], Path]:
        prefix = f".{self.stem.name}.{self.side}.{what}."
        fd, name = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=self.stem.parent)
        os.fchmod(fd, CACHE_FILE_MODE)
        self.temps.append(Path(name))
        return os.fdopen(fd, "w+b"), Path(name)

    def append(self, rows: Sequence[Sequence[int]]) -> None:
        lengths = np.fromiter(map(len, rows), np.int64, count=len(rows))
        tokens = np.fromiter(chain.from_iterable(rows), self.dtype, count=int(lengths.sum()))
        self.tokens.write(tokens.tobytes())
        self.token_digest.update(tokens.tobytes())
        self.lengths.write(lengths.tobytes())
        self.length_digest.update(lengths.tobytes())
        self.rows, self.count = self.rows + len(rows), self.count + len(tokens)

    def finish(self) -> tuple[list[tuple[Path, Path]], dict[str, Any]]:
        """The ``.npy`` files as ``(temporary, final)`` paths, and this side's manifest entry."""
        (tokens_npy, tokens_temp), (offsets_npy, offsets_temp) = self._temp("tokens.npy"), self._temp("offsets.npy")
        _write_header(tokens_npy, self.dtype, self.count)
        self.tokens.seek(0)
        shutil.copyfileobj(self.tokens, tokens_npy, 1 << 20)
        _write_header(offsets_npy, np.dtype(np.int64), self.rows + 1)
        offsets_npy.write(np.zeros(1, np.int64).tobytes())
        self.lengths.seek(0)
        start = 0
        while chunk := self.lengths.read(_COPY_ROWS * 8):  # lengths [rows] -> offsets [rows + 1], a chunk at a time
            offsets = np.cumsum(np.frombuffer(chunk, np.int64)) + start
            offsets_npy.write(offsets.tobytes())
            start = int(offsets[-1])
        for file in (self.tokens, self.lengths, tokens_npy, offsets_npy):
            file.flush()
            os.fsync(file.fileno())  # on disk before the rename: a power cut leaves no renamed half file
            file.close()
        digest = hashlib.sha256(self.dtype.str.encode() + self.token_digest.digest() + self.length_digest.digest())
        entry = {"dtype": self.dtype.name, "tokens": self.count, "sha256": digest.hexdigest()}
        final_tokens, final_offsets = _side_paths(self.stem, self.side)
        return [(tokens_temp, final_tokens), (offsets_temp, final_offsets)], entry


def _write_header(file: IO[bytes], dtype: np.dtype, count: int) -> None:
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (count,)}
    np.lib.format.write_array_header_1_0(file, header)


class SplitWriter:
    """Writes a split's ids at ``stem`` (a path prefix) in chunks; nothing appears under the final names before
    ``commit``. As a context manager, leaving without ``commit`` removes the temporary files, and a crash leaves
    only hidden ``.*.tmp`` files that nothing reads.
    """

    def __init__(self, stem: Path, dtype: np.dtype) -> None:
        stem.parent.mkdir(parents=True, exist_ok=True)
        manifest_path(stem).unlink(missing_ok=True)  # a split being rewritten is not trusted until it is done
        self.stem = stem
        self.temps: list[Path] = []
        self.sides = {side: _SideWriter(stem, side, np.dtype(dtype), self.temps) for side in SIDES}

    def append(self, src_rows: Sequence[Sequence[int]], tgt_rows: Sequence[Sequence[int]]) -> None:
        """Add pairs: ``src_rows[i]`` and ``tgt_rows[i]`` (as many) are the ids of one pair."""
        self.sides["src"].append(src_rows)
        self.sides["tgt"].append(tgt_rows)

    @property
    def rows(self) -> int:
        """Pairs appended so far."""
        return self.sides["src"].rows

    def commit(self, extra: dict[str, Any]) -> dict[str, Any]:
        """Rename the arrays into place, then write the manifest (``extra`` included); returns the manifest."""
        manifest: dict[str, Any] = {"format": FORMAT, "pairs": self.sides["src"].rows}
        renames = []
        for side, writer in self.sides.items():
            paths, manifest[side] = writer.finish()
            renames += paths
        for temp, final in renames:
            replace_durably(temp, final)
        write_bytes_durably(manifest_path(self.stem), json.dumps({**manifest, **extra}, indent=1).encode())
        return {**manifest, **extra}

    def __enter__(self) -> SplitWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for side in self.sides.values():
            side.tokens.close()
            side.lengths.close()
        for temp in self.temps:
            temp.unlink(missing_ok=True)


def open_split(stem: Path) -> tuple[RaggedIds, RaggedIds, dict[str, Any]] | None:
    """Memory-map the split written at ``stem``: ``(src_ids, tgt_ids, manifest)``; None (the caller writes it again)
    without a manifest, or, with a warning, when a file is missing or does not match it.
    """
    if not manifest_path(stem).is_file():
        return None
    try:
        manifest = json.loads(manifest_path(stem).read_text())
        if manifest.get("format") != FORMAT:
            raise ValueError(f"format {manifest.get('format')}, expected {FORMAT}")
        src, tgt = (_open_side(stem, side, manifest) for side in SIDES)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("the encoded split %s does not match its manifest (%s); encoding it again", stem, exc)
        return None
    return src, tgt, manifest


def _open_side(stem: Path, side: str, manifest: dict[str, Any]) -> RaggedIds:
    expected = [(manifest[side]["dtype"], manifest[side]["tokens"]), ("int64", manifest["pairs"] + 1)]
    arrays = []
    for path, (dtype, count) in zip(_side_paths(stem, side), expected):
        try:
            array = np.load(path, mmap_mode="r")
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path.name}: {exc}") from exc
        if array.dtype != np.dtype(dtype) or array.shape != (count,):
            raise ValueError(f"{path.name} holds {array.dtype}{list(array.shape)}, the manifest says {dtype}[{count}]")
        if (size := path.stat().st_size) != array.offset + array.nbytes:
            raise ValueError(f"{path.name} has {size} bytes, expected {array.offset + array.nbytes}")
        arrays.append(array)
    ids = RaggedIds(*arrays)
    files = ids._open_files()  # now, while they are there
    first, last = files.first_and_last_offset(len(ids)) if files else (ids.offsets[0], ids.offsets[-1])
    if first != 0 or last != len(ids.tokens):
        raise ValueError(f"the offsets of {stem.name}.{side} do not run from 0 to the token count")
    return ids
