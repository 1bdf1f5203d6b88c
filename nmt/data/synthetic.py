"""The synthetic-pairs folder: ``train.<lang>`` per side (aligned by line), ``provenance.json`` and ``.lock``, the
one format that back- and forward-translation write and a mixture reads.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from nmt.common.files import FolderInUse, folder_lock, write_json_durably
from nmt.data.errors import DataError

log = logging.getLogger(__name__)

PROVENANCE = "provenance.json"
LOCK = ".lock"
FORMAT_VERSION = 1
COMPLETE, PARTIAL = "complete", "partial"
DIRECTIONS = ("back", "forward")  # which side the model wrote: the source (back) or the target (forward)


class SyntheticFolderError(DataError):
    """A folder that is not (or not this job's) synthetic-pairs folder, or one another process is writing."""


def pair_file(lang: str) -> str:
    """The name of a folder's file of ``lang`` sentences."""
    return f"train.{lang}"


def new_record(direction: str, real_lang: str, synthetic_lang: str, first_run: dict[str, Any],
               **about: Any) -> dict[str, Any]:
    """The record of a folder not written yet.

    Args:
        direction: ``back`` (the model's output is the pairs' source) or ``forward`` (it is their target).
        real_lang: the language of the input lines, copied as they are.
        synthetic_lang: the language the model writes.
        first_run: the ``provenance`` record of the run that starts the folder.
        **about: what the job records besides (``input``, ``models``, ``job``: what a resume must match).
    """
    real = {"lang": real_lang, "file": pair_file(real_lang), "side": "real"}
    synthetic = {"lang": synthetic_lang, "file": pair_file(synthetic_lang), "side": "synthetic"}
    source, target = (synthetic, real) if direction == "back" else (real, synthetic)
    return {"format_version": FORMAT_VERSION, "status": PARTIAL, "direction": direction, **first_run,
            "finished": None, "pairs": {"source": source, "target": target}, **about,
            "bytes": {synthetic["file"]: 0, real["file"]: 0},
            "runs": [{"date": first_run["date"], "command": first_run["command"], "from_line": 0}]}


def read_record(folder: Path) -> dict[str, Any] | None:
    """A folder's record, or None when it has none.

    Raises:
        SyntheticFolderError: a record that is not valid JSON.
    """
    path = folder / PROVENANCE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise SyntheticFolderError(f"{path} is not valid JSON ({exc}); delete {folder} to start again") from None


def write_record(folder: Path, record: dict[str, Any]) -> None:
    """Replace the folder's record durably: a power cut leaves the old record or the new one."""
    write_json_durably(folder / PROVENANCE, record, indent=1)


def is_complete(folder: Path, with_pairs: bool = True) -> bool:
    """Whether ``folder`` holds a finished job (a missing or unreadable record: no) and, unless ``with_pairs`` is
    False, the pair files its record names (a kept workdir keeps provenance.json, not the pairs)."""
    try:
        record = read_record(folder)
    except SyntheticFolderError:
        return False
    return (record is not None and record.get("status") == COMPLETE
            and not (with_pairs and missing_pairs(folder, record)))


def missing_pairs(folder: Path, record: dict[str, Any]) -> list[str]:
    """The pair files ``record`` names that ``folder`` does not hold."""
    return [name for name in record.get("bytes") or {} if not (folder / name).is_file()]


def check_output_folder(out: Path) -> None:
    """Refuse an ``output=`` that exists but is neither empty nor a synthetic-pairs folder, before writing in it."""
    def ours(name: str) -> bool:  # what a run cut off before its first record may leave (write_durably's temp)
        return name in (PROVENANCE, LOCK) or name.startswith(f".{PROVENANCE}.") and name.endswith(".tmp")

    if out.exists() and (not out.is_dir() or not (out / PROVENANCE).is_file()
                         and not all(map(ours, os.listdir(out)))):
        raise SyntheticFolderError(f"output={out} exists and is not a back-translation folder (no {PROVENANCE} "
                                   "in it); pass a new or empty folder as output=")


@contextmanager
def writing(out: Path, owner: str) -> Iterator[None]:
    """Hold ``out/.lock`` while writing: a second job on the same folder is refused, not interleaved.

    Raises:
        SyntheticFolderError: another process holds the folder.
    """
    try:
        with folder_lock(out, owner, "wait for it to end, or pass another output="):
            yield
    except FolderInUse as error:
        raise SyntheticFolderError(str(error)) from None


def prepare_output(out: Path, record: dict[str, Any]) -> dict[str, Any] | None:
    """The record to go on from, with the files ready to append to; None when ``out`` holds this job finished.
    Call it inside ``writing``. A folder of this job, cut off, has its files truncated to the sizes recorded
    after the last whole chunk.

    Raises:
        SyntheticFolderError: another job's folder, or files shorter than recorded or missing.
    """
    old = read_record(out)
    if old and old["status"] == COMPLETE and old.get("bytes") and len(missing_pairs(out, old)) == len(old["bytes"]):
        log.warning("%s says this folder is complete, but none of its pairs (%s) is here (a kept workdir keeps "
                    "no synthetic pairs): translating again from the first line", out / PROVENANCE,
                    ", ".join(old["bytes"]))
        old = None
    if old is None:
        write_record(out, record)
        return record
    check_same_job(out / PROVENANCE, old.get("job") or {}, record["job"])
    if old["status"] == COMPLETE:
        if missing := missing_pairs(out, old):
            raise SyntheticFolderError(f"{out / missing[0]} is missing from a finished folder ({out / PROVENANCE} "
                                       f"records it); delete {out} to start again")
        return None
    for name, size in old["bytes"].items():
        file = out / name
        if size == 0 and not file.exists():  # cut off before its first chunk
            continue
        if not file.is_file() or file.stat().st_size < size:
            raise SyntheticFolderError(f"{file} is shorter than the {size:,} bytes {out / PROVENANCE} recorded "
                                       f"(changed since?); delete {out} to start again")
        os.truncate(file, size)  # drop what a cut-off chunk appended after the last record
    old["runs"].append({**record["runs"][0], "from_line": old["lines"]["done"]})
    return old


def check_same_job(path: Path, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Refuse to continue a folder that another input, other models or other options began."""
    if "max_words" in old:  # begun before the rename, always a back-translation: the same job under new names
        old = {**{k: v for k, v in old.items() if k != "max_words"}, "max_input_words": old["max_words"],
               "direction": old.get("direction", "back")}
    differ = [key for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]
    if differ:
        shown = "; ".join(f"{key}: {old.get(key)!r} there, {new.get(key)!r} now" for key in differ[:3])
        raise SyntheticFolderError(f"{path} records another back-translation ({shown}); rerun with the same "
                                   "input, models and options to resume it, or pass a new output= to start again")


def append_lines(handle: IO[bytes], lines: list[str]) -> int:
    """Append ``lines`` and force them to disk; the file's size afterwards."""
    handle.write("".join(line + "\n" for line in lines).encode("utf-8"))
    handle.flush()
    os.fsync(handle.fileno())
    return handle.tell()


def pair_files(folder: Path, langs: Sequence[str], where: str) -> tuple[Path, Path, dict[str, Any]]:
    """A finished folder's two files for the pair ``langs`` (source, target) and its record, for a mixture.

    Raises:
        DataError: no such folder, files of another language pair, or an unfinished job (naming its command).
    """
    if not folder.is_dir():
        raise DataError(f"{where}.synthetic = {folder} is not a folder; give the output= folder of backtranslate.py "
                        f"(or add {where}.backtranslate settings: train.py then makes it).")
    src, tgt = (folder / pair_file(lang) for lang in langs)
    if not (src.is_file() and tgt.is_file()):
        have = sorted(p.suffix.lstrip(".") for p in folder.glob("train.*"))
        raise DataError(f"{where}.synthetic = {folder} holds pairs in {'-'.join(have) or 'no language'}, not "
                        f"{langs[0]}-{langs[1]} (no train.{langs[0]} and train.{langs[1]}): two sources with "
                        "different language pairs. Back-translate with a model into this mixture's source language.")
    info = read_record(folder) or {}
    if info.get("status", COMPLETE) != COMPLETE:  # its files may end in a chunk that was never committed
        lines = info.get("lines", {})
        raise DataError(f"{where}.synthetic = {folder} is an unfinished {info.get('direction', 'back')}-translation "
                        f"({lines.get('done', '?'):,} of {lines.get('input', '?'):,} lines): run its command again "
                        f"to finish it: {info.get('command') or 'python backtranslate.py ... output=' + str(folder)}")
    return src, tgt, {"provenance": info} if info else {}
