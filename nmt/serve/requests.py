"""What a ``POST /v1/translate`` request may be: every way a body can be wrong (media type, size, JSON, types,
options, lengths) ends in a ``RequestError`` with a 4xx status before the request reaches the queue, never a 500.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from starlette.requests import Request

from nmt.data import Tokenizer
from nmt.inference.engine import SearchOptions, TranslationError, truncate_words

SEARCH_OVERRIDES = ("beam_size", "n_best", "length_penalty")
"""The search options a request may set (the others are the server's, from its config)."""

FIELDS = ("text", *SEARCH_OVERRIDES, "attention")
MAX_INT_DIGITS = 15  # no option needs more; Python would parse 4,300 digits before refusing
TOO_LONG_CHOICES = ("refuse", "truncate")


class RequestError(Exception):
    """A request the server refuses: the HTTP status, a one-line message for the client, extra headers."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers


@dataclasses.dataclass
class TranslateRequest:
    """A checked ``/v1/translate`` request.

    Attributes:
        options: the server's search options with the request's overrides.
        attention: whether the client asked for word attention.
        truncated: per sentence, whether it will be cut to the model's length limit (``too_long=truncate``).
        subwords: per sentence, the source subwords the model will read (set by ``check_lengths``).
    """

    sentences: list[str]
    options: SearchOptions
    attention: bool
    truncated: list[bool]
    subwords: list[int] | None = None


def check_media_type(request: Request) -> None:
    """415 unless the body is declared ``application/json``: browsers send other types cross-site unasked."""
    declared = request.headers.get("content-type", "")
    if declared.split(";")[0].strip().lower() != "application/json":
        raise RequestError(415, f"POST /v1/translate takes Content-Type: application/json, got "
                                f"{declared[:60]!r}; send the body as JSON with that header")


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


def load_json(body: bytes) -> Any:
    """The JSON value of a UTF-8 body; 422 for anything else (bad bytes, bad JSON, absurd numbers or nesting)."""
    try:
        text = body.decode("utf-8")  # strict: no UTF-16 guessing as json.loads(bytes) does
    except UnicodeDecodeError as error:
        raise RequestError(422, f"the request body is not valid UTF-8 (byte {error.start}); send UTF-8 JSON") from None
    try:
        return json.loads(text, parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_refuse_constant)
    except RecursionError:  # the C parser recurses once per level: "[[[[...]]]]" in 64 KiB exhausts the stack
        raise RequestError(422, "the request body is nested too deeply to be a translate request") from None
    except ValueError as error:
        raise RequestError(422, f"the request body is not valid JSON ({_escaped(str(error))})") from None


def parse_translate_request(body: bytes, limits: Any, defaults: SearchOptions) -> TranslateRequest:
    """Sentences, search options and the attention flag of a ``/v1/translate`` body (within ``max_body_bytes``),
    checked against ``limits`` (``max_sentences``, ``max_sentence_words``, ``max_beam_size``); words, not yet
    subwords. The request's fields override ``defaults``.

    Raises:
        RequestError: 422 for a malformed body, a wrong type or an option out of range; 413 for a limit.
    """
    payload = load_json(body)
    if not isinstance(payload, dict) or "text" not in payload:
        raise RequestError(422, 'the body must be a JSON object with "text": a string or a list of strings')
    unknown = sorted(set(payload) - set(FIELDS))
    if unknown:
        raise RequestError(422, f"unknown field {_escaped(repr(unknown[0])[:40])}; valid fields: {', '.join(FIELDS)}")
    text = payload["text"]
    sentences = [text] if isinstance(text, str) else text
    if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
        raise RequestError(422, '"text" must be a string or a list of strings')
    if len(sentences) > limits.max_sentences:
        raise RequestError(413, f"the request has {len(sentences)} sentences; the limit is "
                                f"max_sentences={limits.max_sentences}")
    for number, sentence in enumerate(sentences, start=1):
        if _escaped(sentence) != sentence:  # it holds a lone surrogate, which JSON escapes can make, UTF-8 cannot hold
            raise RequestError(422, f"sentence {number} holds a lone surrogate (an unpaired \\ud800-\\udfff "
                                    "escape), which is not text; send valid Unicode")
        words = len(sentence.split())
        if words > limits.max_sentence_words:
            raise RequestError(413, f"sentence {number} has {words} words; the limit is "
                                    f"max_sentence_words={limits.max_sentence_words}")
    attention = payload.get("attention", False)
    if not isinstance(attention, bool):
        raise RequestError(422, f'"attention" must be true or false, got {_escaped(repr(attention)[:40])}')
    overrides = {name: payload[name] for name in SEARCH_OVERRIDES if name in payload}
    try:
        options = SearchOptions(**{**dataclasses.asdict(defaults), **overrides}).checked()  # the engine's ranges
    except TranslationError as error:
        raise RequestError(422, _escaped(str(error))) from None
    if options.beam_size > limits.max_beam_size:
        raise RequestError(422, f"beam_size={options.beam_size} is over the limit "
                                f"max_beam_size={limits.max_beam_size}")
    return TranslateRequest(sentences, options, attention, [False] * len(sentences))


def check_lengths(request: TranslateRequest, tokenizer: Tokenizer, max_input_words: int | None,
                  max_subwords: int, too_long: str) -> TranslateRequest:
    """Refuse (413) or mark each sentence over the model's word limit (``max_input_words``; None = none), then
    refuse any over ``max_subwords``, counted on what the model will read (stripped, cut). ``too_long`` is
    ``refuse`` (413) or ``truncate`` (cut, ``"truncated": true`` in the answer).
    """
    lines = [sentence.strip() for sentence in request.sentences]
    over = [max_input_words is not None and len(line.split()) > max_input_words for line in lines]
    if too_long == "refuse" and any(over):
        number = over.index(True) + 1
        raise RequestError(413, f"sentence {number} has {len(lines[number - 1].split())} words; this model was "
                                f"trained on sentences of at most {max_input_words} words (max_input_words); "
                                "split it, or start the server with too_long=truncate")
    lines, _ = truncate_words(lines, max_input_words)
    subwords = [len(tokenizer.encode_src(line)) if line else 0 for line in lines]
    for number, count in enumerate(subwords, start=1):
        if count > max_subwords:
            raise RequestError(413, f"sentence {number} has {count} subwords; the limit is "
                                    f"max_subwords={max_subwords}; send shorter sentences")
    return dataclasses.replace(request, truncated=over, subwords=subwords)


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise RequestError(422, f"a number in the body has {len(digits)} digits; no field takes more than "
                                f"{MAX_INT_DIGITS}")
    return int(digits)


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):  # 1e999 parses to inf without complaint
        raise RequestError(422, f"the number {literal[:40]} is out of range (not finite)")
    return value


def _refuse_constant(name: str) -> None:
    raise RequestError(422, f"{name} is not a JSON number; every number must be finite")


def _escaped(message: str) -> str:
    """A message safe to send as UTF-8 JSON whatever the client put in it (lone surrogates escaped)."""
    return message.encode("utf-8", "backslashreplace").decode("utf-8")
