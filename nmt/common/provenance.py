"""Where a figure came from: date (UTC), command, device, host and library versions, recorded the same way by
every report (``{**provenance("scripts/benchmark.py", argv), "results": ...}``).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import shlex
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nmt.common.version import __version__

if TYPE_CHECKING:
    import torch


def command_line(script: str, argv: Sequence[str] | None = None) -> str:
    """The shell command that reproduces this run, ``python <script> <args>`` (``script`` from the repository
    root); ``argv`` None takes this process's ``sys.argv[1:]``, the script's only when started from the shell.
    """
    return shlex.join(["python", script, *(sys.argv[1:] if argv is None else argv)])


def device_name(device: torch.device) -> str:
    """The GPU's name for a CUDA device (``NVIDIA H100 80GB HBM3``), else the device type (``cpu``)."""
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def library_versions() -> dict[str, Any]:
    """Versions of what can move a figure: Python, torch (with its CUDA and cuDNN), nmt, sacrebleu, SentencePiece
    (imported here: the chain starts without them)."""
    import sacrebleu
    import sentencepiece
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nmt": __version__,
        "sacrebleu": sacrebleu.__version__,
        "sentencepiece": sentencepiece.__version__,
    }


def host() -> dict[str, Any]:
    """The machine: CPU count, platform, processor, CPU model, torch's CPU kernels (``AVX512``, ``AVX2``: a CPU run
    repeated on another machine drifts in the low bits) and the threads torch uses."""
    import torch

    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
    }


def cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo``'s first ``model name``), or None where that file does not say."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            return next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), None)
    except OSError:  # not Linux
        return None


def provenance(script: str, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The fields every results file starts with: ``date``, ``command``, ``host``, ``versions``."""
    date = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")  # 2026-11-23T15:40:28+00:00
    return {"date": date, "command": command_line(script, argv), "host": host(), "versions": library_versions()}
