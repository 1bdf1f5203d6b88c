"""How the stages of a chain share one GPU: how many at once (what the card measured, held to its free memory) and
whether under CUDA MPS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from nmt.chain.mps import CONTROL as MPS_CONTROL
from nmt.chain.mps import MpsError, mps_available, mps_daemon

# parallel=auto on a GPU without a measured figure (MEASURED_PARALLEL has none for it): four trainings of the recipe
# shared one H200 at 3.5x the throughput of one (98% utilisation; issue 48's measurement); on a CPU, stages at
# once only share the same cores, so auto is 1 there.
PARALLEL_ON_CUDA = 4
# What each card measured (scripts/gpu_check.py --parts parallel writes it): "cards" maps
# torch.cuda.get_device_name() to {"trainings_at_once", "tokens_per_s_together", "over_one_alone", "measured"}.
MEASURED_PARALLEL = resources.files("nmt.chain").joinpath("measured_parallel.json")  # package data
# An estimate of one training's card memory, used to check parallel= against the free memory when no measured
# figure (a card's "mib_per_training") exists: one multi30k_best training alone peaked at 2,975 MiB of card memory
# (nvidia-smi, one H100 at efb7581), rounded up for the CUDA context and a longer batch.
MIB_PER_TRAINING = 4096


class CardError(ValueError):
    """The stages cannot share the card as asked (too many for its memory, MPS where it cannot serve): one line."""


def cuda_card() -> tuple[str, float] | None:
    """This machine's GPU name and free MiB, or None; asked in a child process, so that the chain's own process never
    holds a CUDA context on the card its stages share."""
    import torch  # here: the chain answers a mistake or --help without PyTorch's start-up

    if not torch.cuda.is_available():
        return None
    probe = ("import torch; free, _ = torch.cuda.mem_get_info(); print(free / 2**20); "
             "print(torch.cuda.get_device_name())")
    answer = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False)
    lines = answer.stdout.strip().splitlines()
    return (lines[1], float(lines[0])) if answer.returncode == 0 and len(lines) == 2 else None


def measured_card(name: str | None) -> dict[str, Any] | None:
    """The card's entry in MEASURED_PARALLEL (what scripts/gpu_check.py --parts parallel measured), if any."""
    if name is None or not MEASURED_PARALLEL.is_file():
        return None
    return (json.loads(MEASURED_PARALLEL.read_text(encoding="utf-8")).get("cards") or {}).get(name)


def choose_parallel(setting: Any, device: str, card: tuple[str, float] | None) -> tuple[int, str]:
    """Stages at once, and why: ``auto`` is 1 on a CPU, else the card's measured ``trainings_at_once`` (or
    PARALLEL_ON_CUDA), at most what its free memory holds; a number beyond that memory is a CardError."""
    if device != "cuda":
        return (1, "auto: 1 on a CPU") if setting == "auto" else (int(setting), "as given")
    name, free_mib = card if card is not None else (None, None)
    entry = measured_card(name) or {}
    per_training = float(entry.get("mib_per_training") or MIB_PER_TRAINING)
    fits = None if free_mib is None else max(1, int(free_mib // per_training))
    if setting != "auto":
        if fits is not None and int(setting) > fits:
            how = "as measured on this card" if entry.get("mib_per_training") else "an estimate"
            raise CardError(f"parallel={setting} is more than this card's memory holds: {free_mib:,.0f} MiB free on "
                            f"{name}, about {per_training:,.0f} MiB per training ({how}); parallel={fits} would fit")
        return int(setting), "as given"
    if entry.get("trainings_at_once"):
        parallel = int(entry["trainings_at_once"])
        how = (f"auto: measured on this card, {name} ({entry.get('measured', 'undated')}): "
               f"{entry.get('over_one_alone', '?')}x one training alone")
    elif name is not None:
        parallel = PARALLEL_ON_CUDA
        how = f"auto: the default for a card not measured in {MEASURED_PARALLEL.name} ({name})"
    else:
        parallel, how = PARALLEL_ON_CUDA, "auto: the default for a GPU (none here to look up)"
    if fits is not None and fits < parallel:
        parallel, how = fits, f"{how}, cut to the {fits} its free memory holds ({free_mib:,.0f} MiB)"
    return parallel, how


def choose_mps(setting: str, device: str, parallel: int, card: tuple[str, float] | None) -> tuple[bool, str]:
    """Whether the stages share the card under CUDA MPS, and why ("" where moot): ``auto`` follows the card's
    measured ``mps`` when stages run at once; ``true`` off a GPU or without MPS is a CardError."""
    if setting == "true":
        if device != "cuda":
            raise CardError("mps=true needs a CUDA GPU (CUDA MPS shares one among processes); use mps=auto")
        if not mps_available():
            raise CardError(f"mps=true: {MPS_CONTROL} is not on PATH (it comes with the NVIDIA driver); use mps=auto")
        return True, "mps=true"
    entry = measured_card(card[0] if card else None) or {}
    if setting == "false" or device != "cuda" or parallel < 2:
        return False, ""
    if not entry.get("mps"):
        return False, "no MPS: not measured faster on this card"
    if not mps_available():
        return False, f"mps=auto: measured faster on this card, but {MPS_CONTROL} is not on PATH"
    return True, "mps=auto: measured faster on this card"


@contextmanager
def card_sharing(use_mps: bool, workdir: Path) -> Iterator[None]:
    """With ``use_mps``, the MPS daemon for the stages started inside (they inherit its variables), stopped on the
    way out; a CardError when it does not start."""
    if not use_mps:
        yield
        return
    try:
        with mps_daemon(workdir / "runs" / ".reproduce" / "mps") as variables:
            saved = {name: os.environ.get(name) for name in variables}
            os.environ.update(variables)
            try:
                yield
            finally:
                for name, value in saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
    except MpsError as error:
        raise CardError(f"{error}; run with mps=false") from None
