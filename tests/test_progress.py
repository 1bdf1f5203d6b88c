"""The progress a user sees: the log line with step, tokens/s, elapsed time and ETA; the bars on a terminal."""

from __future__ import annotations

import io
import logging
import sys
from pathlib import Path

import pytest

from nmt.common.progress import format_duration
from nmt.data import text
from nmt.train import progress as progress_module
from nmt.train.progress import Progress, RunClock, progress_line
from nmt.train.run_logger import RunLogger


def test_durations_are_short_and_exact_enough() -> None:
    assert [format_duration(s) for s in (0, 42.4, 60, 192, 3599, 3600, 7500)] == [
        "0s", "42s", "1m00s", "3m12s", "59m59s", "1h00m", "2h05m"]


def test_progress_line_gives_the_step_of_the_plan_speed_and_time() -> None:
    line = progress_line(120, 1845, 0, 3.21449, 6e-4, 2310.4, 192.0, 2765.0)
    assert line == ("step 120/1845 (6%) | epoch 0 | loss 3.214 | lr 6.0e-04 | 2,310 tok/s | elapsed 3m12s | "
                    "ETA 46m05s")
    assert progress_line(0, 10, 0, 1.0, 1e-3, 0.0, 0.0, None).endswith("ETA ?")


def test_clock_eta_follows_this_process_pace_and_goes_on_from_a_resumed_wall_clock(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: now[0])
    progress = Progress(step=40, wall_seconds=500.0)  # a resumed run: 40 steps and 500 s before
    clock = RunClock(progress)
    clock.start()
    assert clock.eta_seconds(100) is None  # no step in this process yet
    progress.step, now[0] = 50, 110.0  # 10 steps in 10 s
    assert clock.eta_seconds(100) == pytest.approx(50.0)
    with clock.outside_window():  # a validation: wall time, not window time
        now[0] = 130.0
    assert clock.close_window(tokens=1000) == pytest.approx(1000 / 10)
    clock.stop()
    assert progress.wall_seconds == pytest.approx(530.0)
    now[0] = 200.0
    clock.sync_wall_clock()  # stopped: the final evaluation is not training time
    assert progress.wall_seconds == pytest.approx(530.0)


def test_a_bar_on_a_terminal_and_log_lines_otherwise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="nmt.train.run_logger")
    plain = RunLogger(tmp_path / "plain", total_steps=10)
    assert plain.display.bar is None
    plain.display.move_to(5, "step 5/10 (50%) | ...", {"loss": "1.000"})
    plain.close()
    assert "step 5/10 (50%) | ..." in caplog.messages

    caplog.clear()
    terminal = io.StringIO()
    terminal.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "stderr", terminal)
    logger = RunLogger(tmp_path / "tty", total_steps=10, initial_step=2)
    assert logger.display.bar is not None
    logger.display.move_to(5, "step 5/10 (50%) | ...", {"loss": "1.000"})
    assert logger.display.bar.n == 5 and not caplog.messages  # the bar shows it; no log line breaks the bar
    logger.display.close()  # the loop is over: the final summary goes below a closed bar
    assert logger.display.bar is None and "5/10" in terminal.getvalue()
    logger.close()


def test_reading_a_corpus_shows_a_bar_only_on_a_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "train.de"
    path.write_text("eins\nzwei\ndrei\n")
    terminal = io.StringIO()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert text.read_lines(path) == ["eins", "zwei", "drei"] and terminal.getvalue() == ""
    terminal.isatty = lambda: True  # type: ignore[method-assign]
    assert text.read_lines(path) == ["eins", "zwei", "drei"]
    assert "reading train.de" in terminal.getvalue()


def test_off_a_terminal_the_display_logs_at_most_every_every_s_and_at_the_end(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from nmt.common import progress as display_module
    from nmt.common.progress import ProgressDisplay

    now = [0.0]
    monkeypatch.setattr(display_module.time, "perf_counter", lambda: now[0])
    caplog.set_level(logging.INFO, logger="nmt.common.progress")
    display = ProgressDisplay(total=300, unit=" lines", every_s=30)
    for second, lines in [(1, 100), (2, 100), (40, 50), (41, 50)]:  # too soon, too soon, due, the end
        now[0] = second
        display.advance(lines)
    assert caplog.messages == ["250/300 lines (83%) | 6.2 lines/s | elapsed 40s | ETA 8s",
                               "300/300 lines (100%) | 7.3 lines/s | elapsed 41s | ETA 0s"]
