"""nmt.data.synthetic: the synthetic-pairs folder's record decides whether a job may resume it."""

from __future__ import annotations

from pathlib import Path

import pytest

from nmt.data.synthetic import SyntheticFolderError, check_same_job

JOB = {"input_sha256": "ab", "lang": "en", "max_input_words": 100, "chunk_lines": 64, "direction": "back"}


def test_a_folder_begun_before_max_words_was_renamed_resumes_as_the_same_back_translation() -> None:
    old = {key: value for key, value in JOB.items() if key not in ("max_input_words", "direction")}
    check_same_job(Path("runs/bt_en/provenance.json"), {**old, "max_words": 100}, JOB)
    with pytest.raises(SyntheticFolderError, match="max_input_words: 80 there, 100 now"):
        check_same_job(Path("runs/bt_en/provenance.json"), {**old, "max_words": 80}, JOB)
    with pytest.raises(SyntheticFolderError, match="direction: 'back' there, 'forward' now"):
        check_same_job(Path("runs/bt_en/provenance.json"), {**old, "max_words": 100}, {**JOB, "direction": "forward"})
