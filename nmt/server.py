"""Serving: a trained model (``nmt.translator.Translator``) behind an HTTP API and a page, with micro-batching.

The one concept here is the *translation server* behind ``serve.py``: an ASGI app (Starlette, run by
uvicorn) whose endpoints are

- ``POST /v1/translate``: ``{"text": str | [str], "beam_size", "n_best", "length_penalty", "attention"}``
  (all but ``text`` optional) -> ``{"translations": [Translation.to_dict(), ...]}`` in input order;
- ``GET /health``: ``{"status": "ok"}``, what model it serves (attention type, languages, parameters, the
  run's recorded test BLEU) and counters (requests, sentences, batches, search calls);
- ``GET /v1/model``: ``Translator.info()`` plus this server's request defaults and limits;
- ``GET /``: one self-contained HTML page (``nmt/static/translate.html``) with the attention heatmap.

Micro-batching: requests that arrive within ``batch_wait_ms`` of the first waiting one and ask for the
same search options are decoded together, in one ``Translator.translate`` call, on one worker thread
(the Translator is not thread-safe; the event loop never waits on it). The Translator sorts and batches
sentences itself, and a sentence's translation does not depend on its batch-mates, so each sentence gets
the translation it would get alone. While the worker decodes, new requests queue and form the next batch,
whose window opens when the worker is free again (so the clients just answered can join it) and closes
early once as many sentences wait as the last batch held.

Bad requests get a JSON ``{"error": "..."}`` naming the problem (413 over a size limit, 422 for a wrong
type or an option the Translator refuses, 404/405 for a wrong path or method) and the server goes on.

Not done here: batching by tokens, option checks, device and precision choice (all the Translator's),
TLS, authentication and rate limiting (put a reverse proxy in front for anything public).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from typing import Any

import uvicorn
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from nmt.config import ConfigError
from nmt.translator import EngineSettings, SearchOptions, TranslationError, Translator

log = logging.getLogger(__name__)

SEARCH_OVERRIDES = ("beam_size", "n_best", "length_penalty")
"""The search options a request may set (the others are the server's, from its config)."""

ENDPOINTS = "GET /, GET /health, GET /v1/model, POST /v1/translate"


@dataclass
class ServeSettings(EngineSettings):
    """``serve.py``'s settings: the engine's (checkpoint, device, precision, search options) and these.

    The defaults here are the only ones; configs/serve.yaml gets them from Hydra's ConfigStore
    (``serve_settings``) and comments every key. The search options are every request's defaults; a
    request may override ``SEARCH_OVERRIDES``.
    """

    host: str = "127.0.0.1"  # this machine only; put a reverse proxy in front for anything public
    port: int = 8000
    max_body_bytes: int = 65536
    max_sentences: int = 64
    max_words: int = 200
    max_beam_size: int = 10
    batch_wait_ms: float = 5.0
    batch_sentences: int = 128
    shutdown_timeout_s: float = 30.0
    log_level: str = "info"


ConfigStore.instance().store(name="serve_settings", node=ServeSettings)

LIMITS = ("max_body_bytes", "max_sentences", "max_words", "max_beam_size")


def check_serve_settings(settings: Any) -> SearchOptions:
    """Check ``ServeSettings`` (or a composed ``serve`` config) before anything loads.

    Returns:
        The search options every request starts from.

    Raises:
        ConfigError: a limit that is not positive, or a default beam over ``max_beam_size``.
        TranslationError: a search option the Translator refuses.
    """
    search = SearchOptions.from_settings(settings)
    for name in (*LIMITS, "batch_sentences"):
        if getattr(settings, name) < 1:
            raise ConfigError(f"{name}={getattr(settings, name)} must be positive")
    if search.beam_size > settings.max_beam_size:
        raise ConfigError(f"beam_size={search.beam_size} is over max_beam_size={settings.max_beam_size}; "
                          "raise max_beam_size or lower beam_size")
    if settings.batch_wait_ms < 0 or settings.shutdown_timeout_s < 0:
        raise ConfigError("batch_wait_ms and shutdown_timeout_s must be >= 0")
    return search


class RequestError(Exception):
    """A request the server refuses: the HTTP status and a one-line message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# ------------------------------------------------------------- Requests in: size limits, JSON types
async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, refused with 413 as soon as it passes ``max_bytes`` (declared or streamed)."""
    declared = request.headers.get("content-length", "")
    too_big = RequestError(413, f"the request body is over the limit max_body_bytes={max_bytes}; "
                                "send fewer or shorter sentences per request")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():  # a chunked body has no length to check in advance
        size += len(chunk)
        if size > max_bytes:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


def parse_translate_request(body: bytes, settings: ServeSettings, defaults: SearchOptions
                            ) -> tuple[list[str], SearchOptions, bool]:
    """Sentences, search options and the attention flag of a ``/v1/translate`` body.

    The server checks the JSON and the limits of ``settings``; ``SearchOptions`` (the engine) checks the
    options: ``defaults`` (the config's) with the request's overrides.

    Raises:
        RequestError: 422 for invalid JSON or a wrong type, 413 for a limit.
        TranslationError: a search option the Translator refuses (422).
    """
    try:
        payload = json.loads(body, parse_constant=_refuse_constant)
    except ValueError as error:  # UnicodeDecodeError is a ValueError too
        raise RequestError(422, f"the request body is not valid JSON ({error})") from None
    if not isinstance(payload, dict) or "text" not in payload:
        raise RequestError(422, 'the body must be a JSON object with "text": a string or a list of strings')
    unknown = sorted(set(payload) - {"text", "attention", *SEARCH_OVERRIDES})
    if unknown:
        raise RequestError(422, f"unknown field {unknown[0]!r}; valid fields: text, {', '.join(SEARCH_OVERRIDES)}, "
                                "attention")
    text = payload["text"]
    sentences = [text] if isinstance(text, str) else text
    if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
        raise RequestError(422, '"text" must be a string or a list of strings')
    if len(sentences) > settings.max_sentences:
        raise RequestError(413, f"the request has {len(sentences)} sentences; the limit is "
                                f"max_sentences={settings.max_sentences}")
    for number, sentence in enumerate(sentences, start=1):
        words = len(sentence.split())
        if words > settings.max_words:
            raise RequestError(413, f"sentence {number} has {words} words; the limit is max_words={settings.max_words}")
    attention = payload.get("attention", False)
    if not isinstance(attention, bool):
        raise RequestError(422, f'"attention" must be true or false, got {attention!r}')
    overrides = {name: payload[name] for name in SEARCH_OVERRIDES if name in payload}
    options = SearchOptions.from_mapping({**dataclasses.asdict(defaults), **overrides})  # the engine's checks
    if options.beam_size > settings.max_beam_size:
        raise RequestError(422, f"beam_size={options.beam_size} is over the limit "
                                f"max_beam_size={settings.max_beam_size}")
    return sentences, options, attention


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


# ------------------ Micro-batching: one worker thread, batches of requests that share their options
@dataclass
class _Job:
    sentences: list[str]
    key: tuple[SearchOptions, bool]  # the search options and the attention flag: jobs batch only with equals
    future: asyncio.Future[list[dict[str, Any]]]
    arrived: float  # event-loop time


def new_engine_thread() -> ThreadPoolExecutor:
    """The one thread that runs every torch call of a server, loading included.

    A thread that has run torch ops keeps its own OpenMP thread team; with the model loaded on one
    thread and decoded on another, the two teams compete for the cores (measured on 2 cores: single
    sentences decode at half speed, 16-sentence batches at about 0.6x).
    """
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="translator")


class MicroBatcher:
    """Collects requests on the event loop and decodes each batch in one worker thread.

    Args:
        translator: the engine; only the worker thread calls it.
        wait_s: how long the oldest waiting request holds its batch open for others.
        batch_sentences: at most this many sentences per batch (a larger request goes alone).
        engine_thread: the one-thread executor to decode on; best the one that loaded ``translator``
            (``new_engine_thread()``). None: a new one.
    """

    def __init__(self, translator: Translator, wait_s: float, batch_sentences: int,
                 engine_thread: ThreadPoolExecutor | None = None) -> None:
        self.translator = translator
        self.wait_s = wait_s
        self.batch_sentences = batch_sentences
        self.batches = 0
        self.sentences = 0
        self.busy_seconds = 0.0  # time the worker spent decoding: against the uptime, how busy the server is
        self._pending: collections.deque[_Job] = collections.deque()
        self._arrival = asyncio.Event()
        self._free_since = 0.0  # event-loop time the worker last finished a batch
        self._last_batch_sentences = 0  # how many sentences it held (0: none yet)
        self._executor = engine_thread or new_engine_thread()

    async def translate(self, sentences: list[str], options: SearchOptions, attention: bool) -> list[dict[str, Any]]:
        """The translations of ``sentences`` (``Translation.to_dict()`` each), decoded with other requests."""
        loop = asyncio.get_running_loop()
        job = _Job(sentences, (options, attention), loop.create_future(), loop.time())
        self._pending.append(job)
        self._arrival.set()
        return await job.future

    @property
    def queued(self) -> int:
        return len(self._pending)

    async def run(self) -> None:
        """Forever: wait for a batch to fill (or its window to close), decode it, hand out the results."""
        while True:
            jobs = await self._next_batch()
            await self._decode(jobs)

    async def _next_batch(self) -> list[_Job]:
        loop = asyncio.get_running_loop()
        while not self._pending:
            self._arrival.clear()
            await self._arrival.wait()
        first = self._pending[0]
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
        jobs, count, rest = [], 0, collections.deque()
        for job in self._pending:  # in arrival order: the first job always, then others that fit
            if job.key == first.key and (not jobs or count + len(job.sentences) <= self.batch_sentences):
                jobs.append(job)
                count += len(job.sentences)
            else:
                rest.append(job)
        self._pending = rest
        return jobs

    def _same_key_sentences(self, key: tuple[SearchOptions, bool]) -> int:
        return sum(len(job.sentences) for job in self._pending if job.key == key)

    async def _decode(self, jobs: list[_Job]) -> None:
        sentences = [s for job in jobs for s in job.sentences]
        self._last_batch_sentences = len(sentences)
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            results = await loop.run_in_executor(self._executor, self._translate, sentences, *jobs[0].key)
        except Exception as error:  # each waiting request answers for itself (422 or 500)
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(error)
            return
        finally:
            self._free_since = loop.time()
            self.busy_seconds += time.perf_counter() - started
        self.batches += 1
        self.sentences += len(sentences)
        start = 0
        for job in jobs:
            if not job.future.done():  # done = the client went away
                job.future.set_result(results[start:start + len(job.sentences)])
            start += len(job.sentences)

    def _translate(self, sentences: list[str], options: SearchOptions, attention: bool) -> list[dict[str, Any]]:
        """On the worker thread: decode, and build the JSON-ready dicts there too (off the event loop)."""
        results = self.translator.translate(sentences, attention=attention, **dataclasses.asdict(options))
        return [t.to_dict() for t in results]

    def close(self) -> None:
        """Wait for the batch on the worker thread (if any) and stop the thread."""
        self._executor.shutdown(wait=True)


# ------------------------------------------------------------------------------------------ The app
def create_app(translator: Translator, settings: ServeSettings,
               engine_thread: ThreadPoolExecutor | None = None) -> Starlette:
    """The ASGI app serving ``translator`` (see the module docstring for the endpoints).

    Args:
        translator: the engine, used from one worker thread only.
        settings: ``ServeSettings`` or a composed ``serve`` config (its checkpoint is not read):
            request defaults, limits and the batching window.
        engine_thread: the thread that loaded ``translator`` (``new_engine_thread``), to decode on too.

    Raises:
        ConfigError, TranslationError: settings that cannot work (``check_serve_settings``).
    """
    defaults = check_serve_settings(settings)
    batcher = MicroBatcher(translator, settings.batch_wait_ms / 1000, settings.batch_sentences, engine_thread)
    limits = {name: getattr(settings, name) for name in LIMITS}
    model_info = {**translator.info(), "has_attention": translator.has_attention,
                  "defaults": dataclasses.asdict(defaults), "limits": limits}
    page = resources.files("nmt").joinpath("static", "translate.html").read_text(encoding="utf-8")
    counters = {"requests": 0, "refused": 0}
    started = time.monotonic()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        worker = asyncio.create_task(batcher.run())
        yield  # uvicorn lets in-flight requests finish before it gets here on shutdown
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        batcher.close()

    async def translate(request: Request) -> Response:
        try:
            body = await read_body(request, settings.max_body_bytes)
            sentences, options, attention = parse_translate_request(body, settings, defaults)
            translations = await batcher.translate(sentences, options, attention)
        except (RequestError, TranslationError) as error:
            counters["refused"] += 1
            return error_response(getattr(error, "status", 422), str(error))
        counters["requests"] += 1
        return JSONResponse({"translations": translations})

    model_summary = {key: model_info[key] for key in ("attention", "src_lang", "tgt_lang", "parameters", "bleu")}

    async def health(request: Request) -> Response:
        return JSONResponse({
            "status": "ok", **model_summary, "requests": counters["requests"], "refused": counters["refused"],
            "sentences": batcher.sentences, "batches": batcher.batches,
            "search_calls": translator.search_calls, "queued": batcher.queued,
            "busy_seconds": round(batcher.busy_seconds, 3),
            "uptime_s": round(time.monotonic() - started, 3),
        })

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
    handlers = {HTTPException: http_error, Exception: internal_error}
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)  # type: ignore[arg-type]


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


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


# --------------------------------------------------------------------------------------- Running it
def serve_main(cfg: DictConfig) -> None:
    """Load the model(s) of ``cfg.checkpoint`` and serve them until SIGTERM or Ctrl-C (``serve.py``).

    Raises:
        ConfigError, TranslationError, CheckpointError, DataError: user mistakes, found before the
            server starts (reported in one line by ``serve.py``).
    """
    check_serve_settings(cfg)  # before the model loads
    engine = new_engine_thread()
    translator = engine.submit(Translator.from_settings, cfg).result()  # checkpoint(s), device, precision
    app = create_app(translator, cfg, engine)
    log.info("serving %s on http://%s:%d/", ", ".join(translator.info()["checkpoints"]), cfg.host, cfg.port)
    # uvicorn handles SIGTERM/SIGINT itself (graceful shutdown), then re-raises the signal to the handler
    # it found; that handler ends the process with status 0 instead of -15 or a KeyboardInterrupt
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_after_shutdown)
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level,
                timeout_graceful_shutdown=cfg.shutdown_timeout_s or None)


def _exit_after_shutdown(signum: int, frame: object) -> None:
    raise SystemExit(0)


@contextlib.contextmanager
def serve_in_thread(app: Starlette) -> Iterator[str]:
    """Run ``app`` (``create_app``) with uvicorn on a background thread, on a free port of 127.0.0.1 (tests);
    yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))  # 0: the system chooses the port
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
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
