"""The one way the chain and the measuring tools run a command: in its own process group, its output appended to a
log, told to stop if its caller dies, stopped (SIGTERM, then SIGKILL after a grace) at a budget's end or when a
SIGTERM or SIGINT reaches the caller, and paused and continued with the caller by SIGTSTP and SIGCONT."""

from __future__ import annotations

import ctypes
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1  # prctl(2): the signal a child gets when the thread that started it ends
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# After the SIGTERM (the budget's end, or one sent to the chain), how long a stage has to finish its step and save
# checkpoints/last.pt before SIGKILL.
STOP_GRACE_S = 120.0
_STARTED: list[subprocess.Popen] = []  # the commands ``start`` began, for job control to pause and continue


class Interrupted(BaseException):
    """A SIGTERM or SIGINT reached this process (a BaseException, as KeyboardInterrupt: no ``except Exception`` may
    swallow it on its way to the code that stops the commands)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")

    @property
    def exit_status(self) -> int:
        return 128 + self.signum  # what a shell reports for a process ended by the signal


class BudgetSpent(Exception):
    """A command stopped at the end of the budget; the message names it and its log."""


def _signal_commands(signum: int) -> None:
    """``signum`` to the process group of each command still running."""
    for process in _STARTED:
        if process.poll() is None:
            try:
                os.killpg(process.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass


def _pause(_signum: int, _frame: Any) -> None:
    """SIGTSTP: the commands stop (job control cannot reach their groups), then this process; SIGCONT's handler
    continues them."""
    _signal_commands(signal.SIGSTOP)
    os.kill(os.getpid(), signal.SIGSTOP)


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """Inside, SIGTERM and SIGINT raise Interrupted in the main thread (each time: a second one while the first
    stop waits hurries it), SIGTSTP pauses the commands with this process and SIGCONT continues them; the previous
    handlers come back on the way out."""

    def interrupt(signum: int, _frame: Any) -> None:
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, interrupt) for sig in STOP_SIGNALS}
    previous[signal.SIGTSTP] = signal.signal(signal.SIGTSTP, _pause)
    previous[signal.SIGCONT] = signal.signal(signal.SIGCONT, lambda *_: _signal_commands(signal.SIGCONT))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop_with_parent(parent: int) -> Callable[[], None]:
    """The child's first act (``preexec_fn``): SIGTERM when its parent dies, SIGKILL included, so that no stage
    outlives the call that started it; a parent gone before this ran is caught by the ``getppid`` check."""

    def arm() -> None:
        if _LIBC is not None:
            _LIBC.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def start(command: Sequence[str], log: Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``command`` in ``cwd`` in a process group of its own (a Ctrl-C reaches the caller, which stops it, rather
    than it alone), its output appended to ``log`` after a ``$ command`` line."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as sink:
        print(f"$ {shlex.join(command)}", file=sink, flush=True)
        process = subprocess.Popen(list(command), cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                   start_new_session=True, preexec_fn=_stop_with_parent(os.getpid()))
    _STARTED[:] = [p for p in _STARTED if p.poll() is None] + [process]
    return process


def ask_to_stop(process: subprocess.Popen) -> None:
    """SIGTERM to the command itself (a training saves checkpoints/last.pt; a chain stops its own stages)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL to the command's process group: what it left running is gone too (a cluster's job: cancelled)."""
    if not isinstance(process, subprocess.Popen):
        process.kill()
        return
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def stop(processes: Sequence[subprocess.Popen], grace: float) -> None:
    """SIGTERM to each command, ``grace`` seconds for them to save and exit, then SIGKILL to each group; a second
    signal while they save (Interrupted) ends the grace at once."""
    for process in processes:
        ask_to_stop(process)
    ends = time.monotonic() + grace
    try:
        while any(p.poll() is None for p in processes) and time.monotonic() < ends:
            time.sleep(0.05)
    except Interrupted:
        pass
    for process in processes:
        kill_group(process)


def run_logged(command: list[str], log: Path, cwd: Path, timeout: float | None = None,
               env: dict[str, str] | None = None, grace: float = 30.0) -> tuple[int, float]:
    """``command`` (``start``) to its end: its exit status and wall seconds. Past ``timeout`` it is stopped and
    BudgetSpent raised; an Interrupted stops it and goes on up."""
    print(f"{Path(sys.argv[0]).stem}: {' '.join(command)}", flush=True)
    started = time.monotonic()
    process = start(command, log, cwd, env)
    try:
        status = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop([process], grace)
        raise BudgetSpent(f"{command[1]} stopped at the end of the budget after {time.monotonic() - started:.0f} s; "
                          f"its output: {log}") from None
    except BaseException:
        stop([process], grace)
        raise
    kill_group(process)  # what it left behind
    return status, time.monotonic() - started


def run_together(commands: list[list[str]], logs: list[Path], cwd: Path, timeout: float | None,
                 env: dict[str, str] | None, grace: float = 30.0) -> dict[str, Any]:
    """The commands started at once, each into its log: their exit statuses and the wall seconds until the last
    ended. Past ``timeout`` every one is stopped and BudgetSpent raised; an Interrupted stops them and goes on up."""
    started = time.monotonic()
    processes = []
    try:
        for command, log in zip(commands, logs):
            print(f"{Path(sys.argv[0]).stem}: {' '.join(command)}", flush=True)
            processes.append(start(command, log, cwd, env))
        for process in processes:
            left = None if timeout is None else max(0.1, timeout - (time.monotonic() - started))
            process.wait(timeout=left)
    except subprocess.TimeoutExpired:
        stop(processes, grace)
        raise BudgetSpent(f"{len(commands)} trainings at once stopped at the end of the budget after "
                          f"{time.monotonic() - started:.0f} s; their output: {logs[0].parent}") from None
    except BaseException:
        stop(processes, grace)
        raise
    return {"exit_status": [p.returncode for p in processes], "wall_seconds": time.monotonic() - started}
