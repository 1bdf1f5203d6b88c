"""The ASGI app: the page, /health, /v1/model and /v1/translate, and how each error is answered."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from nmt.inference.engine import SearchOptions, TranslationError, Translator
from nmt.inference.rerank import from_settings as load_rerank
from nmt.serve.batcher import MicroBatcher
from nmt.serve.requests import RequestError, check_lengths, check_media_type, parse_translate_request, read_body
from nmt.serve.settings import LIMITS, ServeSettings, allowed_hosts, check_serve_settings

log = logging.getLogger(__name__)


ENDPOINTS = "GET /, GET /health, GET /v1/model, POST /v1/translate"


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
    """The ASGI app serving ``translator`` (the page, /health, /v1/model and /v1/translate).

    Args:
        settings: ``ServeSettings`` or a composed ``serve`` config (its checkpoint is not read).
        engine_thread: the thread that loaded ``translator`` (``new_engine_thread``), to decode on too.

    Raises:
        ConfigError, TranslationError: settings that cannot work (``check_serve_settings``), or reverse
            models (``rerank.checkpoint``) that do not mirror the model's languages.
        CheckpointError: a ``rerank.checkpoint`` that cannot be read.
    """
    defaults = check_serve_settings(settings, translator.search_defaults)
    batcher = MicroBatcher(translator, settings, engine_thread, load_rerank(settings.rerank, translator))
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
        return JSONResponse({"status": "overloaded" if batcher.overloaded() else "ok", **model_summary, **counters,
                             **batcher.counters(), "search_calls": translator.search_calls,
                             "uptime_s": round(time.monotonic() - started, 3)})

    routes = [Route("/", HTMLResponse(page), methods=["GET"]),  # the page and /v1/model: fixed answers, built once
              Route("/health", health, methods=["GET"]),
              Route("/v1/model", JSONResponse(model_info), methods=["GET"]),
              Route("/v1/translate", translate, methods=["POST"])]
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
            batcher.check_room(len(checked.sentences))
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
    wrong = {404: "no endpoint at", 405: f"{request.method} is not allowed on"}.get(error.status_code)
    if wrong:
        return error_response(error.status_code, f"{wrong} {request.url.path}; the endpoints are {ENDPOINTS}")
    return error_response(error.status_code, str(error.detail))


async def internal_error(request: Request, error: Exception) -> Response:
    log.error("%s %s failed: %r", request.method, request.url.path, error)
    return error_response(500, f"internal error ({type(error).__name__}); see the server log")
