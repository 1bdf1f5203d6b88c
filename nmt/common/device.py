"""Where a model runs and in what precision (``auto``, ``bf16``, ``fp32``; ``int8`` for CPU decoding), chosen with
the same rules and errors by training and by every use of a trained model.
"""

from __future__ import annotations

import functools
import warnings
from contextlib import AbstractContextManager
from pathlib import Path

import torch
from torch import nn

PRECISIONS = ("auto", "bf16", "fp32")  # training's choices
INFERENCE_PRECISIONS = (*PRECISIONS, "int8")  # translating's
DEVICES = ("auto", "cpu", "cuda")


class DeviceError(ValueError):
    """A device or precision that is not valid here (reported in one line, naming the setting)."""


def resolve_device(name: str | torch.device, key: str = "device", local_rank: int | None = None) -> torch.device:
    """The device a setting names: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N`` (a
    torch.device is returned as it is); under ``torchrun`` ``cuda`` becomes ``cuda:<local_rank>``. ``key`` names
    the setting in errors.

    Raises:
        DeviceError: an unknown name, or CUDA asked for without a GPU.
    """
    if isinstance(name, torch.device):
        return name
    name = str(name)
    if name not in DEVICES and not name.startswith("cuda:"):
        raise DeviceError(f"{key}={name!r} is not valid; use one of {', '.join(DEVICES)} (or cuda:N)")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceError(f"{key}={name} was asked for, but no CUDA GPU is available; use {key}=auto or cpu")
    if name == "cuda" and local_rank is not None:
        name = f"cuda:{local_rank}"
    return torch.device(name)


def no_gpu_note(name: str | torch.device, device: torch.device) -> str | None:
    """A note when ``name`` is ``auto`` and a CUDA build of PyTorch found no GPU (the GPU image run without
    ``--gpus all``, or on a machine without one): the run goes on on the CPU and says so. None otherwise (a CPU
    build of PyTorch on the CPU is what was meant)."""
    if str(name) != "auto" or device.type != "cpu" or not torch.version.cuda:
        return None
    return (f"no CUDA GPU is visible to this CUDA {torch.version.cuda} build of PyTorch: training on the CPU "
            "(in a container, docker run --gpus all gives it the GPUs)")


def check_precision(precision: str, key: str = "precision", choices: tuple[str, ...] = PRECISIONS) -> str:
    """``precision`` if it is one of ``choices``; else a DeviceError that names ``key`` and the choices."""
    if precision not in choices:
        raise DeviceError(f"{key}={precision!r} is not one of {', '.join(choices)}")
    return precision


def check_inference_precision(precision: str, device: torch.device, key: str = "precision") -> str:
    """``precision`` if a trained model can decode in it on ``device`` (int8: the CPU only); else a DeviceError."""
    check_precision(precision, key, INFERENCE_PRECISIONS)
    if precision == "int8" and device.type != "cpu":
        raise DeviceError(f"{key}=int8 is for CPU decoding (PyTorch's dynamic int8 kernels are CPU kernels); "
                          f"on {device.type} use {key}=auto or bf16")
    return precision


def uses_bf16(precision: str, device: torch.device) -> bool:
    """Whether ``precision`` means bf16 autocast on ``device``: ``auto`` only on CUDA, so CPU numerics never depend on
    the machine. bf16 keeps float32's exponent range, so no loss scaling is needed (fp16, which would, is not offered).
    """
    check_precision(precision, choices=INFERENCE_PRECISIONS)
    return precision == "bf16" or (precision == "auto" and device.type == "cuda")


def quantize_int8(model: nn.Module) -> nn.Module:
    """A copy of ``model`` for ``precision=int8``: its ``nn.Linear`` and ``nn.GRU`` layers quantized dynamically.

    Weights are int8 (per tensor); inputs are quantized per call and accumulate in int32 (fbgemm). One-output
    linear layers stay float32: the additive scorer reads ``energy``'s weight directly. ``torch.ao.quantization``
    is deprecated in favour of ``torchao``, not a dependency here, so the warning is silenced in this one place.
    """
    from torch.ao.quantization import default_dynamic_qconfig, quantize_dynamic

    layers = {name: default_dynamic_qconfig for name, module in model.named_modules()
              if isinstance(module, nn.GRU) or (isinstance(module, nn.Linear) and module.out_features > 1)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", (DeprecationWarning, FutureWarning, UserWarning))
        return quantize_dynamic(model, layers, dtype=torch.qint8)


def autocast(precision: str, device: torch.device, cache: bool = True) -> AbstractContextManager[None]:
    """The autocast context for ``precision`` on ``device`` (a no-op for float32); ``cache=False`` where a CUDA
    graph is captured."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=uses_bf16(precision, device),
                          cache_enabled=cache)


def configure_matmul(precision: str, device: torch.device) -> None:
    """TF32 matmuls and cuDNN convolutions/RNNs on CUDA unless ``precision`` is ``fp32`` (no-op on the CPU)."""
    if device.type == "cuda":
        tf32 = check_precision(precision) != "fp32"
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32


@functools.cache
def cpu_info() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo (``flags``, ``model name``, ``cpu MHz``, ...); {} if unknown."""
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n", 1)[0]
    except OSError:
        return {}
    return {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in first.splitlines())}


def cpu_has_native_bf16() -> bool | None:
    """True if the CPU has bf16 instructions (AVX512-BF16 or AMX-BF16), False if not, None if unknown."""
    flags = cpu_info().get("flags")
    return None if flags is None else bool({"avx512_bf16", "amx_bf16"} & set(flags.split()))


def slow_bf16_warning(precision: str, device: torch.device) -> str | None:
    """A warning when bf16 is asked for on a CPU known to lack bf16 instructions; else None."""
    if device.type == "cpu" and uses_bf16(precision, device) and cpu_has_native_bf16() is False:
        return ("precision=bf16 on a CPU without bf16 instructions (avx512_bf16 / amx_bf16): bf16 is emulated "
                "there and slower than float32; use precision=auto or fp32")
    return None
