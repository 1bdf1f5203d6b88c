"""Several training processes as one run (``torchrun``): the process group, per-rank seeds and RNG states, and
collectives. Every helper also works in a single process, so the training loop has no ``world_size > 1`` branches.
"""

from __future__ import annotations

import datetime
import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nmt.common.device import resolve_device

DISTRIBUTED_TIMEOUT = datetime.timedelta(hours=1)  # how long a rank waits in a collective before the run aborts


@dataclass
class DistInfo:
    """This process's place in the run: rank 0 of 1 for a single process."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def setup_distributed(device_name: str) -> DistInfo:
    """Join the process group when started by ``torchrun`` (WORLD_SIZE > 1); else a single process."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return DistInfo()
    use_cuda = torch.cuda.is_available() and device_name != "cpu"
    if not dist.is_initialized():
        # Rank 0 validates alone while the others wait in a collective: on a large validation set with beam
        # search that can take longer than the default 10-minute collective timeout, which would abort the run.
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", timeout=DISTRIBUTED_TIMEOUT)
    return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def shutdown(info: DistInfo, finished: bool) -> None:
    """Leave the process group (no-op in a single process).

    After a run that finished, every rank first waits for the others (rank 0 may still be scoring the
    test sets): a rank that tore down its Gloo group while a peer still used it could die in the C++
    threads' teardown ("terminate called without an active exception", SIGABRT) and fail the whole job.
    After an error there is no barrier: the other ranks may never reach it.
    """
    if not (info.distributed and dist.is_initialized()):
        return
    if finished:
        dist.barrier()
    dist.destroy_process_group()


def choose_device(name: str, info: DistInfo) -> torch.device:
    """``trainer.device`` resolved (``nmt.common.device``); under torchrun each process takes its local rank's GPU."""
    device = resolve_device(name, "trainer.device", info.local_rank if info.distributed else None)
    if device.type == "cuda" and device.index is not None:  # plain "cuda" is the current GPU already
        torch.cuda.set_device(device)
    return device


def wrap_model(model: nn.Module, info: DistInfo, device: torch.device) -> nn.Module:
    """``model`` under DistributedDataParallel when there are several ranks (it copies rank 0's weights)."""
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids) if info.distributed else model


# ------------------------------------------------------------------------------------- seeds, RNG
def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def gather_from_ranks(value: Any, info: DistInfo) -> list[Any]:
    """Every rank's ``value`` (a picklable object), indexed by rank. A collective."""
    if not info.distributed:
        return [value]
    values: list[Any] = [None] * info.world_size
    dist.all_gather_object(values, value)
    return values


# ------------------------------------------------------------------------------------ collectives
@contextmanager
def main_process_first(info: DistInfo) -> Iterator[None]:
    """Rank 0 runs the block first (downloads, caches); the others run it after, finding the cache warm."""
    if info.distributed and not info.is_main:
        dist.barrier()
    yield
    if info.distributed and info.is_main:
        dist.barrier()


def barrier(info: DistInfo) -> None:
    """Wait until every rank gets here. A collective."""
    if info.distributed:
        dist.barrier()


def any_rank(flag: bool, info: DistInfo, device: torch.device) -> bool:
    """True when ``flag`` is true on at least one rank. A collective."""
    if not info.distributed:
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=device)  # [1]
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def broadcast_from_main(values: list[Any], info: DistInfo) -> list[Any]:
    """Rank 0's ``values`` on every rank (picklable objects). A collective."""
    if info.distributed:
        dist.broadcast_object_list(values, src=0)
    return values
