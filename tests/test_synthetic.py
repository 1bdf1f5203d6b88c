"""nmt.data.synthetic: the synthetic-pairs folder's record decides whether a job may resume it."""

from __future__ import annotations

from pathlib import Path

import pytest

from nmt.data.synthetic import (
    COMPLETE,
    SyntheticFolderError,
    check_same_job,
    is_complete,
    new_record,
    prepare_output,
    read_record,
    write_record,
)

JOB = {"input_sha256": "ab", "lang": "en", "max_input_words": 100, "chunk_lines": 64, "direction": "back"}


def test_a_folder_begun_before_max_words_was_renamed_resumes_as_the_same_back_translation() -> None:
    old = {key: value for key, value in JOB.items() if key not in ("max_input_words", "direction")}
    check_same_job(Path("runs/bt_en/provenance.json"), {**old, "max_words": 100}, JOB)
    with pytest.raises(SyntheticFolderError, match="max_input_words: 80 there, 100 now"):
        check_same_job(Path("runs/bt_en/provenance.json"), {**old, "max_words": 80}, JOB)
    with pytest.raises(SyntheticFolderError, match="direction: 'back' there, 'forward' now"):
        check_same_job(Path("runs/bt_en/provenance.json"), {**old, "max_words": 100}, {**JOB, "direction": "forward"})


def job_record(**job: str) -> dict:
    return new_record("back", "en", "de", {"date": "2026-11-28", "command": "python backtranslate.py"},
                      job={**JOB, **job})


def finished_folder(folder: Path, pairs: bool) -> dict:
    """A folder finished by a job: its record, and its pair files unless ``pairs`` is False (a kept workdir)."""
    record = job_record()
    folder.mkdir()
    for name, text in (("train.de", "ein Hund .\n"), ("train.en", "a dog .\n")):
        record["bytes"][name] = len(text)
        if pairs:
            (folder / name).write_text(text)
    write_record(folder, {**record, "status": COMPLETE})
    return record


def test_a_finished_folder_without_its_pairs_is_not_complete_and_a_job_starts_it_over(tmp_path: Path) -> None:
    """A kept workdir keeps provenance.json, not the synthetic pairs: the folder is finished by its record only, a
    mixture does not take it as complete, and the same job (or one by a retrained model) translates it again."""
    kept = tmp_path / "kept"
    record = finished_folder(kept, pairs=False)
    assert is_complete(kept, with_pairs=False) and not is_complete(kept)
    fresh = job_record(model_sha256="retrained")
    assert prepare_output(kept, fresh) is fresh
    assert read_record(kept) == fresh and fresh["bytes"] == {"train.de": 0, "train.en": 0}

    whole = tmp_path / "whole"
    record = finished_folder(whole, pairs=True)
    assert is_complete(whole) and prepare_output(whole, record) is None  # done: nothing to do
    (whole / "train.de").unlink()  # one file gone, the other kept: changed by hand, never overwritten
    with pytest.raises(SyntheticFolderError, match=r"whole/train.de is missing from a finished folder .* delete"):
        prepare_output(whole, record)
    assert (whole / "train.en").read_text() == "a dog .\n"
