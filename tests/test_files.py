"""nmt.common.files: durable writes leave the old file or the new one, and a folder lock admits one process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.common.files import FolderInUse, folder_lock, write_durably, write_json_durably


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp_file(tmp_path: Path) -> None:
    path = write_json_durably(tmp_path / "results.json", {"bleu": 1.0})

    def half_then_full_disk(handle) -> None:
        handle.write(b'{"bleu": 2')
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_durably(path, half_then_full_disk)
    assert json.loads(path.read_text()) == {"bleu": 1.0}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_a_second_process_is_refused_in_one_line_naming_the_holder(tmp_path: Path) -> None:
    code = ("import sys; from nmt.common.files import folder_lock\n"
            "with folder_lock(sys.argv[1], 'train.py (pid 1)', 'wait'):\n"
            "    print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderInUse, match=r"in use by train.py \(pid 1\): wait for it"):
            with folder_lock(tmp_path, "me", "wait for it"):
                pass
    finally:
        holder.communicate("", timeout=30)
    with folder_lock(tmp_path, "me", "wait"):  # released when its holder ended
        assert (tmp_path / ".lock").read_text() == "me\n"


def test_a_lock_its_holder_never_let_go_is_taken_over_with_one_line(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    with folder_lock(tmp_path, "me", "wait"):
        pass
    with folder_lock(tmp_path, "me again", "wait"):  # let go on the way out: nothing to say
        pass
    assert capsys.readouterr().err == ""
    code = ("import os, signal, sys; from nmt.common.files import folder_lock\n"
            "with folder_lock(sys.argv[1], 'train.py (pid 7)', 'wait'):\n"
            "    os.kill(os.getpid(), signal.SIGKILL)")
    assert subprocess.run([sys.executable, "-c", code, str(tmp_path)]).returncode == -9
    with folder_lock(tmp_path, "me", "wait"):
        assert (tmp_path / ".lock").read_text() == "me\n"
    taken = capsys.readouterr().err.splitlines()
    assert taken == [f"{tmp_path}: taking over the lock of train.py (pid 7), which ended without letting it go"]
