"""nmt.data.encoded: flat ids + offsets, written in chunks, memory-mapped back, never trusted half-written."""

from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path

import numpy as np
import pytest

from nmt.data import EncodedSplit, RaggedIds, encoded
from nmt.data.encoded import SplitWriter, manifest_path, open_split, token_dtype

ROWS = [[5, 6, 7], [], [8], [9, 10, 11, 12, 13]]
TGT_ROWS = [[4], [21, 22], [], [23, 24, 25]]


def _write(stem: Path, chunks: int = 2) -> dict:
    with SplitWriter(stem, np.dtype(np.uint16)) as writer:
        step = -(-len(ROWS) // chunks)
        for start in range(0, len(ROWS), step):
            writer.append(ROWS[start : start + step], TGT_ROWS[start : start + step])
        return writer.commit({"note": "test"})


def test_ragged_rows_index_slice_and_compare() -> None:
    ids = RaggedIds.from_rows(ROWS)
    assert len(ids) == 4 and ids[0] == [5, 6, 7] and ids[1] == [] and ids[-1] == [9, 10, 11, 12, 13]
    assert isinstance(ids[0], list) and all(isinstance(i, int) for i in ids[0])
    assert ids[1:3] == [[], [8]] and list(ids) == ROWS
    assert ids.lengths.tolist() == [3, 0, 1, 5] and ids.offsets.tolist() == [0, 3, 3, 4, 9]
    assert ids == ROWS and ids == RaggedIds.from_rows(ROWS) and ids != ROWS[:-1]
    with pytest.raises(IndexError):
        ids[4]
    assert RaggedIds.from_rows(ids) is ids


def test_encoded_split_takes_lists_and_has_no_text_for_training() -> None:
    split = EncodedSplit("train", ROWS, TGT_ROWS)
    assert isinstance(split.src_ids, RaggedIds) and split.src_text is None
    assert split[3] == (3, [9, 10, 11, 12, 13], [23, 24, 25])
    with pytest.raises(ValueError, match="different lengths"):
        EncodedSplit("valid", ROWS, TGT_ROWS, ["a"] * 4, ["b"] * 3)


@pytest.mark.parametrize("chunks", [1, 3])
def test_written_split_maps_back_the_same_in_any_chunking(tmp_path: Path, chunks: int) -> None:
    manifest = _write(tmp_path / "enc" / "train.k", chunks)
    src, tgt, read = open_split(tmp_path / "enc" / "train.k")
    assert src == ROWS and tgt == TGT_ROWS and read == manifest and read["note"] == "test"
    assert isinstance(src.tokens, np.memmap) and src.tokens.dtype == np.uint16 and src.offsets.dtype == np.int64
    assert manifest["pairs"] == 4 and manifest["src"]["tokens"] == 9
    # The digest is of the ids, not of how they were chunked.
    assert manifest["src"]["sha256"] == _write(tmp_path / "again" / "train.k", 4)["src"]["sha256"]
    names = sorted(p.name for p in (tmp_path / "enc").iterdir())
    assert names == ["train.k.json", "train.k.src.offsets.npy", "train.k.src.tokens.npy",
                     "train.k.tgt.offsets.npy", "train.k.tgt.tokens.npy"]  # no temporary file left
    assert np.load(tmp_path / "enc" / "train.k.tgt.tokens.npy").tolist() == [4, 21, 22, 23, 24, 25]  # plain .npy


def test_lengths_take_two_bytes_a_row_and_are_read_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(encoded, "_LENGTH_ROWS", 3)  # chunks of 3 rows: 4 rows cross a chunk boundary
    _write(tmp_path / "train.k", 3)
    src, tgt, _ = open_split(tmp_path / "train.k")
    assert src.paths is not None  # read from the file, not through the mapping
    for mapped, rows in ((src, ROWS), (tgt, TGT_ROWS)):
        assert mapped.lengths.dtype == np.uint16 and mapped.lengths.tolist() == [len(row) for row in rows]
        assert RaggedIds.from_rows(rows).lengths.tolist() == [len(row) for row in rows]
    long_rows = RaggedIds.from_rows([[4], [5] * 70_000, [], [6, 7]])  # a row longer than uint16 counts
    assert long_rows.lengths.dtype == np.int32 and long_rows.lengths.tolist() == [1, 70_000, 0, 2]


def test_a_mapped_split_pickles_as_its_paths(tmp_path: Path) -> None:
    _write(tmp_path / "s")
    src, _, _ = open_split(tmp_path / "s")
    blob = pickle.dumps(src)
    assert str(tmp_path / "s.src.tokens.npy").encode() in blob and len(blob) < 400
    again = pickle.loads(blob)
    assert again == src and isinstance(again.tokens, np.memmap)
    assert pickle.loads(pickle.dumps(RaggedIds.from_rows(ROWS))) == ROWS  # in memory: by value


def _mapped_kib(folder: Path) -> int:
    """The RSS of this process's mappings of files in ``folder`` (``/proc/self/smaps``), KiB."""
    total, name = 0, ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if "-" in head[0] and not head[0].endswith(":"):
            name = head[5] if len(head) > 5 else ""
        elif head[0] == "Rss:" and name.startswith(str(folder)):
            total += int(head[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux: the mappings' pages are read from /proc")
def test_rows_of_a_mapped_split_are_read_from_its_files_not_through_the_mapping(tmp_path: Path) -> None:
    # A page touched through a mapping stays in the process's RSS with its neighbours (64 KiB a fault, or a large
    # folio): a few batches of scattered rows put most of a big training split's files there (issue 66).
    rows = [[i % 7000 + 4] * (i % 13) for i in range(60_000)]  # ~800 KiB of tokens, ~470 KiB of offsets
    with SplitWriter(tmp_path / "train.k", np.dtype(np.uint16)) as writer:
        writer.append(rows, rows[::-1])
        writer.commit({})
    src, tgt, _ = open_split(tmp_path / "train.k")
    picked = np.random.default_rng(0).permutation(len(rows))[:2000].tolist()
    assert [src[i] for i in picked] == [rows[i] for i in picked] and tgt[-1] == rows[0] and src[1:3] == rows[1:3]
    assert src.lengths.tolist() == list(map(len, rows)) and len(src.tokens) == sum(map(len, rows))
    assert _mapped_kib(tmp_path) == 0  # mapped, yet not one page of the four files in this process's memory
    for path in tmp_path.glob("*.npy"):
        path.unlink()  # a cache deleted (or rebuilt) under a run: the files opened stay readable
    assert src[picked[0]] == rows[picked[0]] and src == RaggedIds.from_rows(rows)


def test_a_split_mapped_but_not_yet_read_from_reads_through_the_mapping_once_its_files_are_gone(
    tmp_path: Path,
) -> None:
    _write(tmp_path / "s")
    src = pickle.loads(pickle.dumps(open_split(tmp_path / "s")[0]))  # mapped again, no file opened yet
    for path in tmp_path.glob("*.npy"):
        path.unlink()
    assert list(src) == ROWS and src.lengths.tolist() == [len(row) for row in ROWS]


def test_an_interrupted_write_leaves_nothing(tmp_path: Path) -> None:
    stem = tmp_path / "enc" / "train.k"
    with pytest.raises(KeyboardInterrupt), SplitWriter(stem, np.dtype(np.uint16)) as writer:
        writer.append(ROWS, TGT_ROWS)
        raise KeyboardInterrupt
    assert list((tmp_path / "enc").iterdir()) == [] and open_split(stem) is None


def test_arrays_without_their_manifest_are_not_trusted(tmp_path: Path) -> None:
    stem = tmp_path / "train.k"
    _write(stem)
    manifest_path(stem).unlink()  # as if killed between the renames and the manifest
    assert open_split(stem) is None


@pytest.mark.parametrize("damage", ["truncate", "append", "dtype", "manifest count", "missing", "format"])
def test_files_that_do_not_match_their_manifest_are_rebuilt_with_a_warning(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    stem = tmp_path / "train.k"
    manifest = _write(stem)
    tokens = tmp_path / "train.k.src.tokens.npy"
    if damage == "truncate":
        tokens.write_bytes(tokens.read_bytes()[:-2])
    elif damage == "append":
        tokens.write_bytes(tokens.read_bytes() + b"\0\0")
    elif damage == "dtype":
        np.save(tokens, np.load(tokens).astype(np.int32))  # another header, same ids
    elif damage == "missing":
        tokens.unlink()
    else:
        if damage == "format":
            manifest["format"] = 0
        else:
            manifest["tgt"]["tokens"] += 1
        manifest_path(stem).write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING, logger="nmt.data.encoded"):
        assert open_split(stem) is None
    assert "does not match its manifest" in caplog.text and "encoding it again" in caplog.text


def test_token_dtype_fits_the_vocabulary() -> None:
    assert token_dtype(8000) == np.uint16 and token_dtype(65536) == np.uint16 and token_dtype(65537) == np.int32


def test_cache_files_are_readable_by_all(tmp_path: Path) -> None:
    _write(tmp_path / "s")
    assert {p.stat().st_mode & 0o777 for p in tmp_path.iterdir()} == {0o644}  # a shared cache serves every user
