"""CUDA graphs, one home for the training step's and the search's: the ``cuda_graphs`` setting's resolver, and
``GraphCache``, the steps captured per shape bucket (one memory pool, the least recently used dropped) with what they
did (``GraphStats``), the fallback to the plain path with its one warning, and the canary that checks each new
bucket's first replay against the plain path.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

log = logging.getLogger(__name__)

CHOICES = ("auto", "true", "false")
Result = TypeVar("Result")


class CudaGraphError(ValueError):
    """CUDA graphs cannot serve this setting or shape; the message names the setting and the fix."""


@dataclass(frozen=True)
class GraphUse:
    """Where a run replays CUDA graphs: the training step and the search (greedy and beam)."""

    step: bool
    search: bool


def resolve_cuda_graphs(setting: str | bool, device: torch.device, world_size: int = 1,
                        key: str = "cuda_graphs") -> GraphUse:
    """What the setting ``key`` means on ``device`` with ``world_size`` processes. ``auto`` replays graphs on CUDA
    (on an H100 the recipe's steps ran 6.6x faster at the same loss: docs/results/gpu.md), except the training step
    under torchrun, saying why; ``true`` asks for them and fails in one line where they cannot serve.

    Raises:
        CudaGraphError: an unknown value; ``true`` on a CPU, or for training under torchrun (a DDP all-reduce is
            not captured here).
    """
    setting = str(setting).lower()  # the command line's true / false arrive as booleans
    if setting not in CHOICES:
        raise CudaGraphError(f"{key}={setting!r} is not one of {', '.join(CHOICES)}")
    if setting == "true" and device.type != "cuda":
        raise CudaGraphError(f"{key}=true needs a CUDA GPU, and this run is on {device}; use {key}=auto (or false)")
    on_gpu = setting != "false" and device.type == "cuda"
    if on_gpu and world_size > 1:
        if setting == "true":
            raise CudaGraphError(f"{key}=true does not work with torchrun's {world_size} processes (the DDP all-reduce "
                                 f"is not captured); use {key}=false with torchrun")
        log.info("%s=auto: eager steps under torchrun's %d processes (the DDP all-reduce is not captured)", key,
                 world_size)
        return GraphUse(step=False, search=True)
    return GraphUse(step=on_gpu, search=on_gpu)


def capture_graph(run: Callable[[], None], pool: Any, device: torch.device,
                  warm_up: Callable[[], None] | None = None) -> Any:
    """``warm_up`` (default: ``run``) once on a side stream (cuBLAS handles, allocations, optimizer state), then
    ``run`` captured in ``pool``: the graph. (Tests replace it with a stand-in that runs ``run`` at each replay.)"""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        (warm_up or run)()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        run()
    return graph


@dataclass
class GraphStats:
    """What a cache's graphs did, for results.json and benchmarks."""

    capture_seconds: float = 0.0
    replays: int = 0  # steps or batches replayed from a graph
    plain_runs: int = 0  # those the plain path ran instead: no bucket fits, a failed capture, a canary's mismatch
    fallback: str | None = None  # why the plain path took over, when it did
    shapes: list[list[Any]] = field(default_factory=list)  # each captured bucket, as its user describes it
    checks: int = 0  # canary checks run: a new bucket's first replay against the plain path
    check_seconds: float = 0.0  # what they cost: one plain run each
    mismatches: list[list[Any]] = field(default_factory=list)  # the buckets whose replay disagreed


class GraphCache:
    """Captured steps by key, for one user (the training step or the search). Each is captured on first sight in
    the cache's one memory pool (the graphs run one at a time); past ``max_entries`` the least recently used goes
    (captured again if met again). A capture that fails, or a canary check that disagrees, warns once and leaves
    the plain path in charge from then on (``serving`` turns False).

    Args:
        key: the setting's name in messages (``cuda_graphs``, ``trainer.cuda_graphs``).
        step_name: what is captured, in messages (``the step``, ``the search step``).
        plain_name: the plain path, in messages (``the eager step``, ``the plain search``).
        plain_after: what happens after a fallback, in messages (``training goes on eagerly``).
        check: run the canary on each new bucket's first replay (``cuda_graphs_check``).
        max_entries: captured steps kept at once; None = no limit.
    """

    def __init__(self, device: torch.device, *, key: str, step_name: str, plain_name: str, plain_after: str,
                 check: bool, max_entries: int | None = None) -> None:
        self.device, self.key, self.step_name, self.plain_name = device, key, step_name, plain_name
        self.plain_after, self.check_first_replays, self.max_entries = plain_after, check, max_entries
        self.entries: OrderedDict[Hashable, Any] = OrderedDict()  # least recently used first
        self.shape_of: dict[Hashable, list[Any]] = {}
        self.unchecked: set[Hashable] = set()  # captured, their first replay not yet checked
        self.pool: Any = None  # made at the first capture on CUDA
        self.stats = GraphStats()

    @property
    def serving(self) -> bool:
        """False once a capture failed or a check disagreed: the plain path serves from then on."""
        return self.stats.fallback is None

    def get(self, key: Hashable) -> Any | None:
        """The entry captured for ``key``, now the most recently used; None if there is none."""
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
        return entry

    def capture(self, key: Hashable, shape: list[Any], build: Callable[[], Any], too_big: str, lower: str
                ) -> Any | None:
        """``build()`` (which captures, with ``capture_graph``) kept for ``key``; None when it fails for a reason
        other than memory (one warning; the plain path from then on).

        Raises:
            CudaGraphError: it does not fit in GPU memory; names ``too_big`` (what did not fit) and ``lower``.
        """
        started = time.perf_counter()
        if self.pool is None and self.device.type == "cuda":
            self.pool = torch.cuda.graph_pool_handle()
        try:
            entry = build()
        except torch.cuda.OutOfMemoryError as error:
            raise CudaGraphError(f"{too_big} does not fit in GPU memory; lower {lower} (or set {self.key}=false)"
                                 ) from error
        except RuntimeError as error:  # e.g. an operation that cannot be captured
            first_line = str(error).splitlines()[0] if str(error) else ""
            reason = f"{type(error).__name__}: {first_line}"
            self._fall_back(f"capturing {self.step_name} failed", reason, recorded=reason)
            return None
        self.stats.capture_seconds += time.perf_counter() - started
        self.stats.shapes.append(shape)
        self.entries[key], self.shape_of[key] = entry, shape
        if self.check_first_replays:
            self.unchecked.add(key)
        if self.max_entries is not None and len(self.entries) > self.max_entries:
            dropped, _ = self.entries.popitem(last=False)  # its graph and static tensors freed
            self.unchecked.discard(dropped)
        return entry

    def check_due(self, key: Hashable) -> bool:
        """Whether the next replay of ``key`` is its bucket's first, to be checked against the plain path."""
        return key in self.unchecked

    def check(self, key: Hashable, replayed: Result, plain: Callable[[], Result],
              difference: Callable[[Result, Result], str | None]) -> Result:
        """The canary: ``replayed`` if it agrees with ``plain()`` (run now, its time the check's cost), else the plain
        result, with one warning naming the bucket, the bucket recorded in the stats, and the plain path from then
        on. ``difference(replayed, plain)`` says in a few words how they differ (None: they agree).
        """
        self.unchecked.discard(key)
        started = time.perf_counter()
        reference = plain()
        found = difference(replayed, reference)
        self.stats.checks += 1
        self.stats.check_seconds += time.perf_counter() - started
        if found is None:
            return replayed
        shape = self.shape_of[key]
        self.stats.mismatches.append(shape)
        self._fall_back(f"the first replay of bucket {shape} disagreed with {self.plain_name}", found,
                        recorded=f"canary: bucket {shape}: {found}")
        return reference

    def _fall_back(self, what: str, reason: str, recorded: str) -> None:
        """The plain path from now on, said once: ``{key}: {what} ({reason}); {plain_after}``; ``recorded`` in the
        stats."""
        self.stats.fallback = recorded
        log.warning("%s: %s (%s); %s", self.key, what, reason, self.plain_after)
