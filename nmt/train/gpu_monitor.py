"""How busy the GPU is while something runs: ``nvidia-smi --loop-ms`` sampled in the background (the driver's
utilisation over time, with no ``pynvml`` dependency; other processes on the GPU count too).
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
from typing import Any

import torch


def parse_sample(line: str) -> tuple[float, float] | None:
    """``"87, 10240"`` -> (87.0, 10240.0): utilisation in percent, memory used in MiB; None when unreadable."""
    try:
        utilisation, memory = map(float, line.split(","))  # float() ignores the spaces around each field
    except ValueError:  # not two fields, "[N/A]", "[Not Supported]", a warning line
        return None
    return utilisation, memory


def gpu_id(device: torch.device) -> str:
    """What ``nvidia-smi -i`` calls ``device``: its UUID (right under CUDA_VISIBLE_DEVICES), else its index."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid:
        text = str(uuid)
        return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"
    return str(index)


class GpuMonitor:
    """Samples one GPU's utilisation and memory every ``interval_ms`` between ``__enter__`` and ``__exit__``;
    ``gpu`` is an ``nvidia-smi -i`` id, None to record nothing (``unavailable_reason`` says why).
    """

    interval_ms = 200  # nvidia-smi's sampling period (the tests' stand-in prints faster)

    def __init__(self, gpu: str | None, unavailable_reason: str | None = None) -> None:
        self.gpu = gpu
        self.unavailable_reason = unavailable_reason
        self.samples: list[tuple[float, float]] = []
        self._process: subprocess.Popen[str] | None = None

    @classmethod
    def for_device(cls, device: torch.device) -> GpuMonitor:
        if device.type != "cuda":
            return cls(None, f"device is {device.type}, not a GPU")
        if shutil.which("nvidia-smi") is None:
            return cls(None, "nvidia-smi not found on PATH")
        return cls(gpu_id(device))

    def __enter__(self) -> GpuMonitor:
        if self.gpu is None:
            return self
        command = ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits",
                   "-i", self.gpu, f"--loop-ms={self.interval_ms}"]
        try:
            self._process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError as error:
            self.unavailable_reason = f"nvidia-smi failed to start: {error}"
        else:
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
        return self

    def _read(self) -> None:
        for line in self._process.stdout:
            if (sample := parse_sample(line)) is not None:
                self.samples.append(sample)

    def __exit__(self, *exc_info: object) -> None:
        if self._process is None:
            return
        if (exit_code := self._process.poll()) is not None:  # None while it still samples, as it should
            self.unavailable_reason = f"nvidia-smi -i {self.gpu} stopped early with exit code {exit_code}"
        self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._reader.join(timeout=5)

    def summary(self) -> dict[str, Any]:
        """Median / mean / min utilisation (percent) and peak memory used (MiB) over the samples."""
        if not self.samples:
            reason = self.unavailable_reason or "no samples (the work ended before nvidia-smi's first reading)"
            return {"available": False, "reason": reason}
        utilisation = [u for u, _ in self.samples]
        return {
            "available": True,
            "gpu": self.gpu,
            "interval_ms": self.interval_ms,
            "samples": len(self.samples),
            "utilisation_percent_median": statistics.median(utilisation),
            "utilisation_percent_mean": statistics.fmean(utilisation),
            "utilisation_percent_min": min(utilisation),
            "memory_used_mib_max": max(m for _, m in self.samples),
        }
