"""serve.py's settings, their checks, and which Host headers the server answers."""

from __future__ import annotations

import ipaddress
import math
import socket
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
from uvicorn.config import LOG_LEVELS

from nmt.common.settings import ConfigError, keys_on_command_line
from nmt.inference.engine import EngineSettings, SearchOptions, search_over
from nmt.inference.rerank import RerankSettings, check_weights
from nmt.serve.requests import TOO_LONG_CHOICES

LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "[::1]"]


@dataclass
class ServeSettings(EngineSettings):
    """``serve.py``'s settings: the engine's and these, the one home of their defaults (configs/serve.yaml gets
    them from Hydra's ConfigStore). The search options are every request's defaults; a request may override
    ``SEARCH_OVERRIDES``.
    """

    host: str = "127.0.0.1"  # this machine only; put a reverse proxy in front for anything public
    port: int = 8000
    allowed_hosts: Any = "auto"  # auto: the loopback names when bound to loopback, else any; or a list
    max_body_bytes: int = 65536
    max_sentences: int = 64
    max_sentence_words: int = 200
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
    rerank: RerankSettings = field(default_factory=RerankSettings)  # noisy-channel reranking; off without a checkpoint


ConfigStore.instance().store(name="serve_settings", node=ServeSettings)


LIMITS = ("max_body_bytes", "max_sentences", "max_sentence_words", "max_subwords", "max_beam_size")


POSITIVE = (*LIMITS, "batch_sentences", "slice_subwords", "max_queued_sentences", "max_connections", "keep_alive_s")
FINITE = {"batch_wait_ms": 0.0, "shutdown_timeout_s": 0.0, "request_timeout_s": 0.1, "max_queue_wait_s": 0.1}  # lowest


def check_serve_settings(settings: Any, model_defaults: SearchOptions | None = None) -> SearchOptions:
    """Check the settings (binds nothing); returns the search options requests start from: ``settings``' own, or,
    with the model's ``model_defaults`` (a Hub folder's exported beam and α), those over the options given.

    Raises:
        ConfigError: the first bad setting (port, host, allowed_hosts, log level, a limit, a timeout).
        TranslationError: a search option the Translator refuses.
    """
    search = SearchOptions.from_settings(settings)
    if model_defaults is not None:
        search = search_over(model_defaults, settings, keys_on_command_line())
    rules = [(name, int, 1, math.inf, "must be a whole number >= 1") for name in POSITIVE]  # types, range, message
    rules += [(name, (int, float), low, math.inf, f"must be a finite number >= {low:g}")
              for name, low in FINITE.items()]
    rules.append(("port", int, 0, 65536, "is not a TCP port; choose one from 0 to 65535 (0: any free port)"))
    for name, kind, low, high, rule in rules:
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, kind) or not low <= value < high:
            raise ConfigError(f"{name}={value} {rule}")
    if search.beam_size > settings.max_beam_size:
        raise ConfigError(f"beam_size={search.beam_size} is over max_beam_size={settings.max_beam_size}; "
                          "raise max_beam_size or lower beam_size")
    _check_host(settings.host)
    if str(settings.log_level).lower() not in LOG_LEVELS:
        raise ConfigError(f"log_level={settings.log_level} is not a log level; choose one of {', '.join(LOG_LEVELS)}")
    if settings.too_long not in TOO_LONG_CHOICES:
        raise ConfigError(f"too_long={settings.too_long} must be one of {', '.join(TOO_LONG_CHOICES)}")
    allowed_hosts(settings)
    if settings.rerank.checkpoint:  # a request's beam caps the candidates: min(rerank.n_best, beam_size)
        check_weights(settings.rerank, settings.max_beam_size)
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
    """The ``Host`` header values the server answers (None: any). ``auto``: the loopback names when bound to a
    loopback address (so a site rebound to 127.0.0.1 cannot talk to it), else any (a proxy in front should
    check); ``*``: any; a list: those names.
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
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
