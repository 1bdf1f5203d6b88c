"""The GPU monitor, without a GPU: a stand-in ``nvidia-smi`` on PATH prints what the real one prints."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
import torch

from nmt.train.gpu_monitor import GpuMonitor, parse_sample

FAKE_NVIDIA_SMI = """#!/bin/sh
# Records its arguments, then prints a sample every 20 ms, like `nvidia-smi --loop-ms=...` does.
echo "$@" > "$(dirname "$0")/args"
echo "[N/A], [N/A]"
while true; do echo "90, 2048"; sleep 0.02; echo "70, 4096"; sleep 0.02; done
"""


def test_parse_sample_reads_numbers_and_skips_the_rest() -> None:
    assert parse_sample("87, 10240\n") == (87.0, 10240.0)
    assert parse_sample("[N/A], [N/A]") is None
    assert parse_sample("No devices were found") is None


def test_cpu_device_records_nothing_and_says_why() -> None:
    with GpuMonitor.for_device(torch.device("cpu")) as monitor:
        pass
    assert monitor.summary() == {"available": False, "reason": "device is cpu, not a GPU"}


def test_samples_utilisation_while_the_work_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text(FAKE_NVIDIA_SMI)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(GpuMonitor, "interval_ms", 20)
    with GpuMonitor("GPU-1234") as monitor:
        deadline = time.monotonic() + 10
        while len(monitor.samples) < 6 and time.monotonic() < deadline:
            time.sleep(0.02)
    summary = monitor.summary()
    assert summary["available"] and summary["samples"] >= 6
    assert summary["utilisation_percent_min"] == 70 and summary["memory_used_mib_max"] == 4096
    assert 70 <= summary["utilisation_percent_median"] <= 90
    assert "-i GPU-1234 --loop-ms=20" in (tmp_path / "args").read_text()
    count = len(monitor.samples)
    time.sleep(0.1)
    assert len(monitor.samples) == count  # the sampler stopped with the block


def test_a_failing_nvidia_smi_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with GpuMonitor("7") as monitor:
        time.sleep(0.3)  # long enough for the stand-in to exit
    assert monitor.summary() == {"available": False, "reason": "nvidia-smi -i 7 stopped early with exit code 6"}
