"""Serving: a trained model (``nmt.inference.engine.Translator``) behind an HTTP API and a page, with micro-batching.

The one concept here is the *translation server* behind ``serve.py``: an ASGI app (Starlette, run by
uvicorn) whose endpoints are

- ``POST /v1/translate``: ``{"text": str | [str], "beam_size", "n_best", "length_penalty", "attention"}``
  (all but ``text`` optional) -> ``{"translations": [Translation.to_dict() + {"truncated"}, ...]}`` in
  input order;
- ``GET /health``: ``{"status": "ok" | "overloaded"}``, what model it serves (attention type, languages,
  parameters, the run's recorded test BLEU) and counters (requests, sentences, batches, search calls,
  refusals, requests abandoned by their client);
- ``GET /v1/model``: ``Translator.info()`` (without file paths) plus this server's defaults and limits;
- ``GET /``: one self-contained HTML page (``nmt/serve/static/translate.html``) with the attention heatmap.

Micro-batching: requests that arrive within ``batch_wait_ms`` of the first waiting one and ask for the
same search options are decoded together, in one ``Translator.translate`` call, on one worker thread
(the Translator is not thread-safe; the event loop never waits on it). The Translator sorts and batches
sentences itself, and a sentence's translation does not depend on its batch-mates, so each sentence gets
the translation it would get alone. While the worker decodes, new requests queue and form the next batch,
whose window opens when the worker is free again (so the clients just answered can join it) and closes
early once as many sentences wait as the last batch held. A batch that fails is decoded again one
request at a time, so a request that breaks the search fails alone.

Hostile input and load (every answer says what happened; no client can hold the others up for long):
requests are checked by ``nmt.serve.requests`` (415, 413, 422; never a 500 for a malformed body); the
queue holds at most ``max_queued_sentences`` (503 with ``Retry-After`` beyond); a request whose client
has gone is not decoded; ``allowed_hosts`` refuses other ``Host`` headers (DNS rebinding; on by default
on a loopback address); a connection must send a whole request within ``request_timeout_s``. uvicorn
and h11 enforce the rest with their own settings: ``max_connections`` (uvicorn's ``limit_concurrency``,
a plain 503 beyond), ``keep_alive_s`` (``timeout_keep_alive``) and the 16 KiB header limit (h11's).

Not done here: batching by tokens, option ranges, device and precision choice (all the Translator's),
TLS, authentication and rate limiting per client (put a reverse proxy in front for anything public).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import ipaddress
import logging
import math
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from typing import Any

import h11
import uvicorn
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from uvicorn.config import LOG_LEVELS
from uvicorn.protocols.http.h11_impl import H11Protocol

from nmt.common.settings import ConfigError
from nmt.inference.engine import EngineSettings, SearchOptions, TranslationError, Translator
from nmt.serve.requests import (
    TOO_LONG_CHOICES,
    RequestError,
    check_lengths,
    check_media_type,
    parse_translate_request,
    read_body,
)

log = logging.getLogger(__name__)

ENDPOINTS = "GET /, GET /health, GET /v1/model, POST /v1/translate"
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "[::1]"]
MAX_HEADER_BYTES = 16 * 1024  # h11's own default, set explicitly: longer request heads get a 400 from uvicorn


@dataclass
class ServeSettings(EngineSettings):
    """``serve.py``'s settings: the engine's (checkpoint, device, precision, search options) and these.

    The defaults here are the only ones; configs/serve.yaml gets them from Hydra's ConfigStore
    (``serve_settings``) and comments every key. The search options are every request's defaults; a
    request may override ``SEARCH_OVERRIDES``.
    """

    host: str = "127.0.0.1"  # this machine only; put a reverse proxy in front for anything public
    port: int = 8000
    allowed_hosts: Any = "auto"  # auto: the loopback names when bound to loopback, else any; or a list
    max_body_bytes: int = 65536
    max_sentences: int = 64
    max_words: int = 200
    max_subwords: int = 256
    max_beam_size: int = 10
    too_long: str = "refuse"  # a sentence over the model's max_input_words: refuse (413) | truncate
    max_queued_sentences: int = 512
    max_queue_wait_s: float = 10.0  # and no more than this much work, at the measured seconds per sentence
    max_connections: int = 1000
    request_timeout_s: float = 5.0
    keep_alive_s: int = 5
    batch_wait_ms: float = 5.0
    batch_sentences: int = 128
    slice_subwords: int = 2048  # beam_size x source subwords per slice of a large request
    shutdown_timeout_s: float = 30.0
    log_level: str = "info"


ConfigStore.instance().store(name="serve_settings", node=ServeSettings)

LIMITS = ("max_body_bytes", "max_sentences", "max_words", "max_subwords", "max_beam_size")
POSITIVE = (*LIMITS, "batch_sentences", "slice_subwords", "max_queued_sentences", "max_connections", "keep_alive_s")


def check_serve_settings(settings: Any) -> SearchOptions:
    """Check ``ServeSettings`` (or a composed ``serve`` config) before anything loads; binds nothing.

    Returns:
        The search options every request starts from.

    Raises:
        ConfigError: the first bad setting (port, host, allowed_hosts, log level, a limit, a timeout).
        TranslationError: a search option the Translator refuses.
    """
    search = SearchOptions.from_settings(settings)
    for name in POSITIVE:
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name}={value} must be a whole number >= 1")
    if search.beam_size > settings.max_beam_size:
        raise ConfigError(f"beam_size={search.beam_size} is over max_beam_size={settings.max_beam_size}; "
                          "raise max_beam_size or lower beam_size")
    for name, low in (("batch_wait_ms", 0.0), ("shutdown_timeout_s", 0.0), ("request_timeout_s", 0.1),
                      ("max_queue_wait_s", 0.1)):
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value < math.inf:
            raise ConfigError(f"{name}={value} must be a finite number >= {low:g}")
    if isinstance(settings.port, bool) or not isinstance(settings.port, int) or not 0 <= settings.port <= 65535:
        raise ConfigError(f"port={settings.port} is not a TCP port; choose one from 0 to 65535 (0: any free port)")
    _check_host(settings.host)
    if str(settings.log_level).lower() not in LOG_LEVELS:
        raise ConfigError(f"log_level={settings.log_level} is not a log level; choose one of {', '.join(LOG_LEVELS)}")
    if settings.too_long not in TOO_LONG_CHOICES:
        raise ConfigError(f"too_long={settings.too_long} must be one of {', '.join(TOO_LONG_CHOICES)}")
    allowed_hosts(settings)
    return search


def _check_host(host: Any) -> None:
    if not isinstance(host, str) or not host:
        raise ConfigError(f"host={host} must be an address or a name to bind, e.g. 127.0.0.1 or 0.0.0.0")
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as error:
        raise ConfigError(f"host={host} is not an address this machine can bind ({error}); use 127.0.0.1 "
                          "(this machine only) or 0.0.0.0 (every interface)") from None


def allowed_hosts(settings: Any) -> list[str] | None:
    """The ``Host`` header values the server answers (None: any), from ``allowed_hosts`` and ``host``.

    ``auto`` allows the loopback names when the server is bound to a loopback address, so that a page on
    another site whose name was rebound to 127.0.0.1 cannot talk to it; bound elsewhere it allows any
    (a reverse proxy in front should check). ``*`` allows any; a list allows those names.
    """
    value = settings.allowed_hosts
    value = OmegaConf.to_object(value) if OmegaConf.is_config(value) else value
    if value == "auto":
        return LOOPBACK_HOSTS if _is_loopback(settings.host) else None
    if value == "*" or value == ["*"]:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(h, str) and h for h in value):
        raise ConfigError(f"allowed_hosts={value} must be auto, * or a list of host names, e.g. "
                          "[translate.example.org,localhost]")
    if any("*" in h[1:] or (h.startswith("*") and not h.startswith("*.")) for h in value):
        raise ConfigError(f"allowed_hosts={value}: a wildcard must look like *.example.org")
    return value


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ------------------ Micro-batching: one worker thread, batches of requests that share their options
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
    def left(self) -> int:
        return len(self.sentences) - len(self.results)

    @property
    def cost_left(self) -> int:
        return sum(self.costs[len(self.results):])

    def slice_size(self, budget: int) -> int:
        """How many of the remaining sentences fit in ``budget`` (at least one)."""
        count, total = 0, 0
        for cost in self.costs[len(self.results):]:
            if count and total + cost > budget:
                break
            count, total = count + 1, total + cost
        return count


def new_engine_thread() -> ThreadPoolExecutor:
    """The one thread that runs every torch call of a server, loading included.

    A thread that has run torch ops keeps its own OpenMP thread team; with the model loaded on one
    thread and decoded on another, the two teams compete for the cores (measured on 2 cores: single
    sentences decode at half speed, 16-sentence batches at about 0.6x).
    """
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="translator")


class MicroBatcher:
    """Collects requests on the event loop and decodes each batch in one worker thread.

    A request whose search would cost more than ``slice_subwords`` (beam size x source subwords, summed
    over its sentences) is decoded a slice of at most that cost at a time (at least one sentence), alone,
    and goes to the back of the queue between slices: the requests that came meanwhile wait for one
    slice, not for all of it.

    Args:
        translator: the engine; only the worker thread calls it.
        wait_s: how long the oldest waiting request holds its batch open for others.
        batch_sentences: at most this many sentences per batch of small requests.
        slice_subwords: the cost budget of a slice of a large request (beam size x source subwords).
        engine_thread: the one-thread executor to decode on; best the one that loaded ``translator``
            (``new_engine_thread()``). None: a new one.
    """

    def __init__(self, translator: Translator, wait_s: float, batch_sentences: int, slice_subwords: int = 2048,
                 engine_thread: ThreadPoolExecutor | None = None) -> None:
        self.translator = translator
        self.wait_s = wait_s
        self.batch_sentences = batch_sentences
        self.slice_subwords = slice_subwords
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
               subwords: list[int] | None = None) -> asyncio.Future[list[dict[str, Any]]]:
        """Queue ``sentences``; the future gets their ``Translation.to_dict()``s. Cancel it to withdraw them.

        ``subwords``: each sentence's source subwords (None: its words stand in for them).
        """
        loop = asyncio.get_running_loop()
        lengths = subwords if subwords is not None else [len(s.split()) for s in sentences]
        costs = [options.beam_size * (n + 1) for n in lengths]
        job = _Job(sentences, (options, attention), loop.create_future(), loop.time(), costs)
        self._pending.append(job)
        self._arrival.set()
        return job.future

    @property
    def queued(self) -> int:
        """Requests waiting for the worker (not the batch it is decoding)."""
        return sum(not job.future.done() for job in self._pending)

    @property
    def queued_sentences(self) -> int:
        return sum(job.left for job in self._pending if not job.future.done())

    def seconds_per_sentence(self) -> float:
        """The worker's mean decoding time per sentence so far (0 before the first batch)."""
        return self.busy_seconds / self.sentences if self.sentences else 0.0

    def check_room(self, sentences: int, max_queued: int, max_wait_s: float = math.inf) -> None:
        """503 when the queue cannot take ``sentences`` more: a bounded wait for everyone admitted.

        Full means ``max_queued`` sentences, or more work than ``max_wait_s`` at the mean decoding time per
        sentence so far (a slower model or busier cores then admit fewer). An empty queue takes any request.

        Raises:
            RequestError: 503 with ``Retry-After``: the queued work in seconds (1-60).
        """
        queued = self.queued_sentences
        wait_s = (queued + sentences) * self.seconds_per_sentence()
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
                "queued": self.queued, "queued_sentences": self.queued_sentences,
                "busy_seconds": round(self.busy_seconds, 3)}

    def overloaded(self, max_queued: int, max_wait_s: float = math.inf) -> bool:
        """The queue is full, or refused a request within the last ``OVERLOAD_MEMORY_S``."""
        queued = self.queued_sentences
        return (queued >= max_queued or queued * self.seconds_per_sentence() >= max_wait_s
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

    async def _next_batch(self) -> list[tuple[_Job, int]]:
        """The next batch: (job, how many of its remaining sentences) pairs, taken out of the queue."""
        loop = asyncio.get_running_loop()
        while True:
            self._drop_abandoned()
            if self._pending:
                break
            self._arrival.clear()
            await self._arrival.wait()
        first = self._pending[0]
        if first.cost_left > self.slice_subwords:  # a large request: one slice, alone, at once
            self._pending.popleft()
            return [(first, first.slice_size(self.slice_subwords))]
        # The window opens when the worker is free, not only when the first job came: under load the clients
        # answered a moment ago are about to send again, and a batch that waits for them holds all the
        # clients instead of half of them (at idle the worker has long been free: the first job's time rules).
        deadline = max(first.arrived, self._free_since) + self.wait_s
        # ... and it closes early once as many sentences wait as the last batch held: under steady load that
        # is every client, and a lone request at idle (last batch: 1) does not wait at all.
        enough = min(self.batch_sentences, self._last_batch_sentences or self.batch_sentences)
        while self._same_key_sentences(first.key) < enough and loop.time() < deadline:
            self._arrival.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._arrival.wait(), deadline - loop.time())
        self._drop_abandoned()
        pieces: list[tuple[_Job, int]] = []
        count, rest = 0, collections.deque()
        for job in self._pending:  # in arrival order: the first small job always, then others that fit
            small = job.cost_left <= self.slice_subwords
            if small and job.key == first.key and (not pieces or count + job.left <= self.batch_sentences):
                pieces.append((job, job.left))
                count += job.left
            else:
                rest.append(job)
        self._pending = rest
        return pieces

    def _same_key_sentences(self, key: tuple[SearchOptions, bool]) -> int:
        return sum(job.left for job in self._pending if job.key == key and not job.future.done())

    async def _decode(self, pieces: list[tuple[_Job, int]]) -> None:
        key = pieces[0][0].key
        sentences = [s for job, n in pieces for s in job.sentences[len(job.results):len(job.results) + n]]
        self._last_batch_sentences = len(sentences)
        try:
            results = await self._run_on_worker(sentences, key)
        except Exception as error:
            if len(pieces) == 1:
                _settle(pieces[0][0].future, error=error)
                return
            # one request can break a shared search (an input the model chokes on): each request is decoded
            # again on its own, so its batch-mates get their answers and only the culprit gets the error
            log.warning("a batch of %d requests failed (%r); decoding them one at a time", len(pieces), error)
            for job, n in pieces:
                if not job.future.done():
                    try:
                        self._deliver(job, await self._run_on_worker(job.sentences[len(job.results):][:n], key))
                    except Exception as alone:  # noqa: BLE001 - handed to that request's handler
                        _settle(job.future, error=alone)
            return
        start = 0
        for job, n in pieces:
            self._deliver(job, results[start:start + n])
            start += n

    def _deliver(self, job: _Job, results: list[dict[str, Any]]) -> None:
        """Add a slice's results to its job: the answer when it was the last slice, else back into the queue."""
        if job.future.done():  # its client has gone
            return
        job.results.extend(results)
        if job.left:
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
        results = self.translator.translate(sentences, attention=attention, **dataclasses.asdict(options))
        return [t.to_dict() for t in results]

    def close(self) -> None:
        """Wait for the batch on the worker thread (if any) and stop the thread."""
        self._executor.shutdown(wait=True)


def _settle(future: asyncio.Future[Any], result: Any = None, error: BaseException | None = None) -> None:
    """Hand a job its result or error, unless its client has gone (a cancelled future)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


# ------------------------------------------------------------------------------------------ The app
def describe_model(translator: Translator, settings: ServeSettings, defaults: SearchOptions) -> dict[str, Any]:
    """``GET /v1/model``'s answer: the engine's info (without checkpoint paths), request defaults and limits."""
    limits = {**{name: getattr(settings, name) for name in LIMITS}, "max_input_words": translator.max_input_words,
              "too_long": settings.too_long, "max_queued_sentences": settings.max_queued_sentences,
              "max_queue_wait_s": settings.max_queue_wait_s}
    info = {key: value for key, value in translator.info().items() if key != "checkpoints"}  # no server paths
    return {**info, "has_attention": translator.has_attention, "defaults": dataclasses.asdict(defaults),
            "limits": limits}


def create_app(translator: Translator, settings: ServeSettings,
               engine_thread: ThreadPoolExecutor | None = None) -> Starlette:
    """The ASGI app serving ``translator`` (see the module docstring for the endpoints).

    Args:
        translator: the engine, used from one worker thread only.
        settings: ``ServeSettings`` or a composed ``serve`` config (its checkpoint is not read):
            request defaults, limits, allowed hosts and the batching window.
        engine_thread: the thread that loaded ``translator`` (``new_engine_thread``), to decode on too.

    Raises:
        ConfigError, TranslationError: settings that cannot work (``check_serve_settings``).
    """
    defaults = check_serve_settings(settings)
    batcher = MicroBatcher(translator, settings.batch_wait_ms / 1000, settings.batch_sentences,
                           settings.slice_subwords, engine_thread)
    model_info = describe_model(translator, settings, defaults)
    page = resources.files("nmt.serve").joinpath("static", "translate.html").read_text(encoding="utf-8")
    counters = {"requests": 0, "refused": 0, "overloaded": 0}
    started = time.monotonic()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        worker = asyncio.create_task(batcher.run())
        yield  # uvicorn lets in-flight requests finish before it gets here on shutdown
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        batcher.close()

    translate = translate_endpoint(translator, settings, defaults, batcher, counters)
    model_summary = {key: model_info[key] for key in ("attention", "src_lang", "tgt_lang", "parameters", "bleu")}

    async def health(request: Request) -> Response:
        overloaded = batcher.overloaded(settings.max_queued_sentences, settings.max_queue_wait_s)
        return JSONResponse({"status": "overloaded" if overloaded else "ok", **model_summary, **counters,
                             **batcher.counters(), "search_calls": translator.search_calls,
                             "uptime_s": round(time.monotonic() - started, 3)})

    async def model(request: Request) -> Response:
        return JSONResponse(model_info)

    async def index(request: Request) -> Response:
        return HTMLResponse(page)

    routes = [
        Route("/", index, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/v1/model", model, methods=["GET"]),
        Route("/v1/translate", translate, methods=["POST"]),
    ]
    hosts = allowed_hosts(settings)
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=hosts)] if hosts else []
    handlers = {HTTPException: http_error, Exception: internal_error}
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                    exception_handlers=handlers)  # type: ignore[arg-type]
    app.state.settings = settings  # for uvicorn_config
    return app


def translate_endpoint(translator: Translator, settings: Any, defaults: SearchOptions, batcher: MicroBatcher,
                       counters: dict[str, int]) -> Callable[[Request], Awaitable[Response]]:
    """``POST /v1/translate``: checks (``nmt.serve.requests``), room in the queue, the batcher, the answer."""
    async def translate(request: Request) -> Response:
        try:
            check_media_type(request)
            body = await read_body(request, settings.max_body_bytes)
            checked = parse_translate_request(body, settings, defaults)
            checked = check_lengths(checked, translator.tokenizer, translator.max_input_words, settings.max_subwords,
                                    settings.too_long)
            batcher.check_room(len(checked.sentences), settings.max_queued_sentences, settings.max_queue_wait_s)
            future = batcher.submit(checked.sentences, checked.options, checked.attention, checked.subwords)
            translations = await answer_unless_gone(request, future)
        except (RequestError, TranslationError) as error:
            status = getattr(error, "status", 422)
            counters["overloaded" if status == 503 else "refused"] += 1
            return error_response(status, str(error), getattr(error, "headers", None))
        except ClientDisconnect:  # gone while sending its body (or closed for being too slow): nobody to answer
            return error_response(400, "the client closed the connection before its request was complete")
        if translations is None:
            return error_response(400, "the client closed the connection before its answer was ready")
        counters["requests"] += 1
        for translation, truncated in zip(translations, checked.truncated):
            translation["truncated"] = truncated
        return JSONResponse({"translations": translations})

    return translate


async def answer_unless_gone(request: Request, future: asyncio.Future[Any]) -> Any:
    """The future's result, or None (and the future cancelled, so the job is not decoded) if the client goes first."""
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({future, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not future.done():
        future.cancel()
        return None
    return future.result()


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body has been read: the server has nothing else to receive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def http_error(request: Request, error: Exception) -> Response:
    """Starlette's own errors (404, 405) as JSON, naming the endpoints."""
    assert isinstance(error, HTTPException)
    if error.status_code == 404:
        return error_response(404, f"no endpoint at {request.url.path}; the endpoints are {ENDPOINTS}")
    if error.status_code == 405:
        return error_response(405, f"{request.method} is not allowed on {request.url.path}; the endpoints are "
                                   f"{ENDPOINTS}")
    return error_response(error.status_code, str(error.detail))


async def internal_error(request: Request, error: Exception) -> Response:
    log.error("%s %s failed: %r", request.method, request.url.path, error)
    return error_response(500, f"internal error ({type(error).__name__}); see the server log")


# ------------------------------------------------------------ Connections: uvicorn's limits, and one more
class RequestDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for receiving each whole request, head and body.

    uvicorn's ``timeout_keep_alive`` closes connections idle *between* requests only: a client that sends
    its request a few bytes at a time (slowloris), or never finishes its body, would otherwise hold its
    connection, and a half-read body its handler, for as long as it likes. The deadline starts when the
    connection opens or its last answer went out, and stops once h11 has the whole request; the time
    the request then waits for the worker is the server's, not the client's.
    """

    request_timeout_s = 5.0  # set per server by ``uvicorn_config``
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state in _REQUEST_RECEIVED:
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start the next (pipelined) request
        if not self.transport.is_closing() and self.conn.their_state not in _REQUEST_RECEIVED:
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.request_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.conn.their_state not in _REQUEST_RECEIVED and not self.transport.is_closing():
            self.logger.info("closed a connection that sent no whole request in %g s", self.request_timeout_s)
            self.transport.close()


_REQUEST_RECEIVED = (h11.DONE, h11.MUST_CLOSE, h11.CLOSED)


def uvicorn_config(app: Starlette, log_level: str | None = None) -> uvicorn.Config:
    """uvicorn's settings for ``app`` (from ``create_app``), from its ``ServeSettings``."""
    settings = app.state.settings
    protocol = type("RequestDeadlineProtocol", (RequestDeadlineProtocol,),
                    {"request_timeout_s": float(settings.request_timeout_s)})
    return uvicorn.Config(
        app, http=protocol, log_level=(log_level or str(settings.log_level)).lower(),
        limit_concurrency=settings.max_connections,  # beyond: uvicorn's own plain 503
        timeout_keep_alive=settings.keep_alive_s, h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        timeout_graceful_shutdown=settings.shutdown_timeout_s or None)


def bind_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (not yet listening), or one line saying why it cannot be.

    Raises:
        ConfigError: the port is in use (or the address is not this machine's).
    """
    family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart need not wait out TIME_WAIT
    try:
        sock.bind(address)
    except OSError as error:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {error.strerror or error}; choose another port= "
                          "or stop the program that uses it") from None
    return sock


# --------------------------------------------------------------------------------------- Running it
def serve_main(cfg: DictConfig) -> None:
    """Load the model(s) of ``cfg.checkpoint`` and serve them until SIGTERM or Ctrl-C (``serve.py``).

    Every setting is checked, and the port taken, before the model loads.

    Raises:
        ConfigError, TranslationError, CheckpointError, DataError: user mistakes, found before the
            server starts (reported in one line by ``serve.py``).
    """
    check_serve_settings(cfg)
    sock = bind_socket(cfg.host, cfg.port)  # a port in use is found now, not after a minute of loading
    engine = new_engine_thread()
    translator = engine.submit(Translator.from_settings, cfg).result()  # checkpoint(s), device, precision
    app = create_app(translator, cfg, engine)
    log.info("serving %s on http://%s:%d/", ", ".join(translator.info()["checkpoints"]), cfg.host,
             sock.getsockname()[1])
    # uvicorn handles SIGTERM/SIGINT itself (graceful shutdown), then re-raises the signal to the handler
    # it found; that handler ends the process with status 0 instead of -15 or a KeyboardInterrupt
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_after_shutdown)
    uvicorn.Server(uvicorn_config(app)).run(sockets=[sock])


def _exit_after_shutdown(signum: int, frame: object) -> None:
    raise SystemExit(0)


@contextlib.contextmanager
def serve_in_thread(app: Starlette) -> Iterator[str]:
    """Run ``app`` (``create_app``) with uvicorn on a background thread, on a free port of 127.0.0.1 (tests);
    yields its base URL."""
    sock = bind_socket("127.0.0.1", 0)  # 0: the system chooses the port
    server = uvicorn.Server(uvicorn_config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="uvicorn")
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server thread did not start; see its log above")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
