"""Running the app under uvicorn: the socket, per-connection deadlines and shutdown."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket

import h11
import uvicorn
from omegaconf import DictConfig
from starlette.applications import Starlette
from uvicorn.protocols.http.h11_impl import H11Protocol

from nmt.common.settings import ConfigError
from nmt.inference.engine import Translator
from nmt.serve.app import create_app
from nmt.serve.batcher import new_engine_thread
from nmt.serve.settings import check_serve_settings

log = logging.getLogger(__name__)


MAX_HEADER_BYTES = 16 * 1024  # h11's own default, set explicitly: longer request heads get a 400 from uvicorn


class RequestDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for receiving each whole request: ``timeout_keep_alive`` only closes
    connections idle *between* requests, so a slowloris client could otherwise hold one forever. It runs from
    the connection opening or its last answer until h11 has the request; waiting for the worker is not counted.
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
            self._deadline.cancel()  # (nothing, when it has fired)

    def _too_slow(self) -> None:
        if self.conn.their_state not in _REQUEST_RECEIVED and not self.transport.is_closing():
            self.logger.info("closed a connection that sent no whole request in %g s", self.request_timeout_s)
            self.transport.close()


_REQUEST_RECEIVED = (h11.DONE, h11.MUST_CLOSE, h11.CLOSED)


def uvicorn_config(app: Starlette) -> uvicorn.Config:
    """uvicorn's settings for ``app`` (from ``create_app``), from its ``ServeSettings``."""
    settings = app.state.settings
    protocol = type("RequestDeadlineProtocol", (RequestDeadlineProtocol,),
                    {"request_timeout_s": float(settings.request_timeout_s)})
    return uvicorn.Config(app, http=protocol, log_level=str(settings.log_level).lower(),
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


def serve_main(cfg: DictConfig) -> None:
    """Load the model(s) of ``cfg.checkpoint`` and serve them until SIGTERM or Ctrl-C (``serve.py``); every setting
    is checked, and the port taken, before the model loads.

    Raises:
        ConfigError, TranslationError, CheckpointError, DataError: user mistakes, reported in one line.
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

