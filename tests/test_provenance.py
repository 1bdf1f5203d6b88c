"""nmt.common.provenance: the date, command, device, host and versions block that every results file starts with."""

from __future__ import annotations

import datetime as dt
import shlex
from pathlib import Path

import sacrebleu
import torch

from nmt.common.provenance import command_line, device_name, provenance
from nmt.common.version import __version__
from nmt_tools.cli import device_slug


def test_command_line_quotes_the_arguments_it_was_given() -> None:
    command = command_line("scripts/benchmark.py", ["model=default", "--out", "/tmp/a b.json"])
    assert command == "python scripts/benchmark.py model=default --out '/tmp/a b.json'"
    assert shlex.split(command)[-1] == "/tmp/a b.json"  # pastes back into a shell as the same arguments


def test_cpu_device_is_named_and_slugged_cpu() -> None:
    assert device_name(torch.device("cpu")) == "cpu"
    assert device_slug(torch.device("cpu")) == "cpu"


def test_provenance_block_is_complete_and_true() -> None:
    block = provenance("scripts/x.py", [])
    assert set(block) == {"date", "command", "host", "versions"}
    assert block["command"] == "python scripts/x.py"
    assert dt.datetime.fromisoformat(block["date"]).utcoffset() == dt.timedelta(0)  # UTC, so runs on any host compare
    assert block["versions"]["torch"] == torch.__version__ and block["versions"]["nmt"] == __version__
    assert block["versions"]["sacrebleu"] == sacrebleu.__version__
    assert block["host"]["cpu_count"] >= 1 and block["host"]["torch_threads"] == torch.get_num_threads()
    # what a CPU run's low bits depend on: the kernels' vector instructions, and the CPU model where Linux says it
    assert block["host"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert block["host"]["cpu_capability"] in ("DEFAULT", "VSX", "Z VECTOR", "NO AVX", "AVX2", "AVX512", "SVE256")
    if Path("/proc/cpuinfo").is_file() and "model name" in Path("/proc/cpuinfo").read_text():
        assert block["host"]["cpu_model"] and block["host"]["cpu_model"] in Path("/proc/cpuinfo").read_text()
