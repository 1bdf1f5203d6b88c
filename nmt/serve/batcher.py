"""Micro-batching: requests that wait together and ask for the same search are decoded in one engine call."""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import dataclasses
import itertools
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from nmt.inference.engine import SearchOptions, Translator
from nmt.inference.rerank import Rerank
from nmt.serve.requests import RequestError

log = logging.getLogger(__name__)


OVERLOAD_MEMORY_S = 5.0
"""/health says "overloaded" for this long after the last 503, so a probe between two bursts still sees it."""


@dataclass
class _Job:
    sentences: list[str]
    key: tuple[SearchOptions, bool]  # the search options and the attention flag: jobs batch only with equals
    future: asyncio.Future[list[dict[str, Any]]]  # cancelled when the client has gone: never decoded then
    arrived: float  # event-loop time
    costs: list[int]  # per sentence: beam_size x (source subwords + EOS), what its search costs in proportion
    results: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # of its first sentences, so far

    @property
    def todo(self) -> list[str]:
        return self.sentences[len(self.results):]

    @property
    def cost_left(self) -> int:
        return sum(self.costs[len(self.results):])

    def slice_size(self, budget: int) -> int:
        """How many of the remaining sentences fit in ``budget`` (at least one)."""
        return max(1, bisect.bisect_right(list(itertools.accumulate(self.costs[len(self.results):])), budget))


def new_engine_thread() -> ThreadPoolExecutor:
    """The one thread that runs every torch call of a server, loading included: a thread that has run torch ops
    keeps its own OpenMP team, and two teams compete for the cores (measured on 2 cores: single sentences
    decode at half speed).
    """
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="translator")


class MicroBatcher:
    """Collects requests on the event loop and decodes each batch in one worker thread (the Translator is not
    thread-safe; the event loop never waits on it).

    Requests arriving within ``batch_wait_ms`` of the oldest waiting one, with the same search options, are decoded in
    one ``translate`` call; a sentence's translation does not depend on its batch-mates. The next window opens
    when the worker is free and closes early once as many sentences wait as the last batch held. A failed batch
    is decoded again request by request, so a request that breaks the search fails alone. A request costing
    more than ``slice_subwords`` (beam size x source subwords) is decoded a slice at a time, going to the back
    of the queue between slices, so requests that came meanwhile wait for one slice, not all of it.

    Args:
        settings: ``ServeSettings``: the batching (``batch_*``, ``slice_subwords``) and queue (``max_queue*``) ones.
        engine_thread: the one-thread executor to decode on, best the one that loaded ``translator``
            (``new_engine_thread()``); None: a new one.
        rerank: noisy-channel reranking of every request's n-best (at most its ``beam_size`` candidates).
    """

    def __init__(self, translator: Translator, settings: Any, engine_thread: ThreadPoolExecutor | None = None,
                 rerank: Rerank | None = None) -> None:
        self.translator, self.settings, self.rerank = translator, settings, rerank
        self.batches = 0
        self.sentences = 0
        self.abandoned = 0  # requests dropped from the queue because their client had gone
        self.busy_seconds = 0.0  # time the worker spent decoding: against the uptime, how busy the server is
        self._pending: collections.deque[_Job] = collections.deque()
        self._arrival = asyncio.Event()
        self._free_since = 0.0  # event-loop time the worker last finished a batch
        self._last_batch_sentences = 0  # how many sentences it held (0: none yet)
        self._last_overload = -math.inf  # monotonic time of the last 503
        self._executor = engine_thread or new_engine_thread()

    def submit(self, sentences: list[str], options: SearchOptions, attention: bool,
               subwords: list[int]) -> asyncio.Future[list[dict[str, Any]]]:
        """Queue ``sentences`` (``subwords``: each one's source subwords); the future gets their
        ``Translation.to_dict()``s. Cancel it to withdraw them.
        """
        loop = asyncio.get_running_loop()
        costs = [options.beam_size * (n + 1) for n in subwords]
        job = _Job(sentences, (options, attention), loop.create_future(), loop.time(), costs)
        self._pending.append(job)
        self._arrival.set()
        return job.future

    def queued_sentences(self, key: tuple[SearchOptions, bool] | None = None) -> int:
        """Sentences waiting for the worker (of the requests with this ``key``, if given)."""
        return sum(len(job.todo) for job in self._pending if not job.future.done() and key in (None, job.key))

    def seconds_per_sentence(self) -> float:
        """The worker's mean decoding time per sentence so far (0 before the first batch)."""
        return self.busy_seconds / self.sentences if self.sentences else 0.0

    def check_room(self, sentences: int) -> None:
        """503 when the queue cannot take ``sentences`` more: a bounded wait for everyone admitted.

        Full means ``max_queued_sentences``, or more work than ``max_queue_wait_s`` at the mean decoding time per
        sentence so far (a slower model or busier cores then admit fewer). An empty queue takes any request.

        Raises:
            RequestError: 503 with ``Retry-After``: the queued work in seconds (1-60).
        """
        queued = self.queued_sentences()
        wait_s = (queued + sentences) * self.seconds_per_sentence()
        max_queued, max_wait_s = self.settings.max_queued_sentences, self.settings.max_queue_wait_s
        if queued > 0 and (queued + sentences > max_queued or wait_s > max_wait_s):
            self._last_overload = time.monotonic()
            retry_after = min(60, max(1, math.ceil(queued * self.seconds_per_sentence())))
            raise RequestError(503, f"the server is overloaded: {queued} sentences are waiting, about "
                                    f"{wait_s:.0f} s of work with this request (the limits are max_queued_sentences="
                                    f"{max_queued} and max_queue_wait_s={max_wait_s:g}); retry after {retry_after} s",
                               {"Retry-After": str(retry_after)})

    def counters(self) -> dict[str, Any]:
        """What the queue has done and holds, for ``/health``."""
        return {"abandoned": self.abandoned, "sentences": self.sentences, "batches": self.batches,
                "queued": sum(not job.future.done() for job in self._pending),  # requests, not the batch decoding
                "queued_sentences": self.queued_sentences(), "busy_seconds": round(self.busy_seconds, 3)}

    def overloaded(self) -> bool:
        """The queue is full, or refused a request within the last ``OVERLOAD_MEMORY_S``."""
        queued = self.queued_sentences()
        return (queued >= self.settings.max_queued_sentences
                or queued * self.seconds_per_sentence() >= self.settings.max_queue_wait_s
                or time.monotonic() - self._last_overload < OVERLOAD_MEMORY_S)

    async def run(self) -> None:
        """Forever: wait for a batch to fill (or its window to close), decode it, hand out the results."""
        while True:
            pieces = await self._next_batch()
            if pieces:
                await self._decode(pieces)

    def _drop_abandoned(self) -> None:
        live = collections.deque(job for job in self._pending if not job.future.done())
        self.abandoned += len(self._pending) - len(live)
        self._pending = live

    async def _next_batch(self) -> list[tuple[_Job, list[str]]]:
        """The next batch: (job, the next of its sentences) pairs, taken out of the queue."""
        loop = asyncio.get_running_loop()
        while True:
            self._drop_abandoned()
            if self._pending:
                break
            self._arrival.clear()
            await self._arrival.wait()
        first = self._pending[0]
        batch_sentences, slice_subwords = self.settings.batch_sentences, self.settings.slice_subwords
        if first.cost_left > slice_subwords:  # a large request: one slice, alone, at once
            self._pending.popleft()
            return [(first, first.todo[:first.slice_size(slice_subwords)])]
        # The window opens when the worker is free, not only when the first job came: under load the clients
        # answered a moment ago are about to send again, and a batch that waits for them holds all the
        # clients instead of half of them (at idle the worker has long been free: the first job's time rules).
        deadline = max(first.arrived, self._free_since) + self.settings.batch_wait_ms / 1000
        # ... and it closes early once as many sentences wait as the last batch held: under steady load that
        # is every client, and a lone request at idle (last batch: 1) does not wait at all.
        enough = min(batch_sentences, self._last_batch_sentences or batch_sentences)
        while self.queued_sentences(first.key) < enough and loop.time() < deadline:
            self._arrival.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._arrival.wait(), deadline - loop.time())
        self._drop_abandoned()
        pieces: list[tuple[_Job, list[str]]] = []
        count, rest = 0, collections.deque()
        for job in self._pending:  # in arrival order: the first small job always, then others that fit
            small = job.cost_left <= slice_subwords
            if small and job.key == first.key and (not pieces or count + len(job.todo) <= batch_sentences):
                pieces.append((job, job.todo))
                count += len(job.todo)
            else:
                rest.append(job)
        self._pending = rest
        return pieces

    async def _decode(self, pieces: list[tuple[_Job, list[str]]]) -> None:
        key = pieces[0][0].key
        sentences = [sentence for _, part in pieces for sentence in part]
        self._last_batch_sentences = len(sentences)
        try:
            results = await self._run_on_worker(sentences, key)
        except Exception as error:
            if len(pieces) == 1:
                _fail(pieces[0][0].future, error)
                return
            # one request can break a shared search (an input the model chokes on): each request is decoded
            # again on its own, so its batch-mates get their answers and only the culprit gets the error
            log.warning("a batch of %d requests failed (%r); decoding them one at a time", len(pieces), error)
            for job, part in pieces:
                if not job.future.done():
                    try:
                        self._deliver(job, await self._run_on_worker(part, key))
                    except Exception as alone:  # noqa: BLE001 - handed to that request's handler
                        _fail(job.future, alone)
            return
        answers = iter(results)
        for job, part in pieces:
            self._deliver(job, list(itertools.islice(answers, len(part))))

    def _deliver(self, job: _Job, results: list[dict[str, Any]]) -> None:
        """Add a slice's results to its job: the answer when it was the last slice, else back into the queue."""
        if job.future.done():  # its client has gone
            return
        job.results.extend(results)
        if job.todo:
            self._pending.append(job)  # behind the requests that came while this slice was decoded
            self._arrival.set()
        else:
            job.future.set_result(job.results)

    async def _run_on_worker(self, sentences: list[str], key: tuple[SearchOptions, bool]) -> list[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            results = await loop.run_in_executor(self._executor, self._translate, sentences, *key)
        finally:
            self._free_since = loop.time()
            self.busy_seconds += time.perf_counter() - started
        self.batches += 1
        self.sentences += len(sentences)
        return results

    def _translate(self, sentences: list[str], options: SearchOptions, attention: bool) -> list[dict[str, Any]]:
        """On the worker thread: decode, and build the JSON-ready dicts there too (off the event loop)."""
        rerank = self.rerank and dataclasses.replace(self.rerank, n_best=min(self.rerank.n_best, options.beam_size))
        results = self.translator.translate(sentences, attention=attention, rerank=rerank,
                                            **dataclasses.asdict(options))
        return [t.to_dict() for t in results]

    def close(self) -> None:
        """Wait for the batch on the worker thread (if any) and stop the thread."""
        self._executor.shutdown(wait=True)


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    """Hand a job its error, unless its client has gone (a cancelled future)."""
    if not future.done():
        future.set_exception(error)
