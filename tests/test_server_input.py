"""The server's request checks (nmt.serve.requests): every malformed body is a 4xx RequestError, never anything else.

``hostile_bodies`` (Hypothesis) is shared with tests/test_server.py, which sends the same bodies to a
running server over a socket.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from nmt.data import Tokenizer
from nmt.inference.engine import SearchOptions, Translator
from nmt.serve.requests import FIELDS, RequestError, TranslateRequest, check_lengths, parse_translate_request
from tests.conftest import TINY_MAX_WORDS

LIMITS = SimpleNamespace(max_sentences=6, max_sentence_words=12, max_beam_size=5)
DEFAULTS = SearchOptions(max_len=8)

# ------------------------------------------------------------------ Hypothesis: bodies a client may send
TEXT = st.text(st.characters(exclude_categories=()), max_size=30)  # every code point but surrogates ...
SURROGATES = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, exclude_categories=()), min_size=1,
                     max_size=3)  # ... which JSON's \ud800 escapes can carry anyway
STRINGS = TEXT | SURROGATES | st.sampled_from(["Ein Hund läuft.", "Hund", " ", "", "Hund" * 100, "a " * 11])
NUMBERS = (st.integers() | st.floats() | st.sampled_from([10**15, 10**16, -(10**40), 1e308, 1e-320])
           | st.integers(-2, 12))
SCALARS = st.none() | st.booleans() | NUMBERS | STRINGS
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(STRINGS, inner,
                                                                                                 max_size=3),
                           max_leaves=10)
FIELD_VALUES = {"text": STRINGS | st.lists(STRINGS, max_size=8) | JSON_VALUES, "beam_size": NUMBERS | JSON_VALUES,
                "n_best": NUMBERS | JSON_VALUES, "length_penalty": NUMBERS | JSON_VALUES,
                "attention": st.booleans() | JSON_VALUES}
REQUESTS = st.builds(lambda known, other: {**other, **known},
                     st.fixed_dictionaries({}, optional=FIELD_VALUES),
                     st.dictionaries(st.sampled_from(["beam", "max_len", "texts", "", "Text"]) | STRINGS, JSON_VALUES,
                                     max_size=2))

PLAUSIBLE = st.fixed_dictionaries(  # near-valid requests, so that the accepted path is fuzzed too
    {"text": st.sampled_from(["Ein Hund läuft.", "Hund", "", " "]) | st.lists(STRINGS, max_size=7)},
    optional={"beam_size": st.integers(0, 6), "n_best": st.integers(0, 4), "attention": st.booleans(),
              "length_penalty": st.floats(-1, 11) | st.sampled_from([0, 10, 10.000001, float("nan")])})


@st.composite
def _damaged(draw: st.DrawFn, bodies: st.SearchStrategy[bytes]) -> bytes:
    """A body with a few bytes replaced, inserted or cut: broken UTF-8, broken JSON, stray quotes."""
    body = bytearray(draw(bodies))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(body)))
        kind = draw(st.sampled_from(["insert", "replace", "cut"]))
        chunk = draw(st.binary(min_size=1, max_size=3) | st.sampled_from([b"\xff", b"\xc3", b'"', b"\\ud800", b"{"]))
        if kind == "insert":
            body[at:at] = chunk
        elif kind == "replace":
            body[at:at + len(chunk)] = chunk
        else:
            del body[at:at + len(chunk)]
    return bytes(body)


JSON_BODIES = REQUESTS.map(lambda r: json.dumps(r).encode())  # NaN and Infinity come out as bare words
hostile_bodies = st.one_of(
    JSON_BODIES,
    PLAUSIBLE.map(lambda r: json.dumps(r).encode()),
    JSON_VALUES.map(lambda v: json.dumps(v, ensure_ascii=False).encode("utf-8", "surrogatepass")),
    _damaged(JSON_BODIES),
    st.binary(max_size=200),
    st.integers(1, 1100).map(lambda depth: b"[" * depth + b"]" * depth),
    st.integers(1, 700).map(lambda depth: b'{"text": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}"),
)


@pytest.fixture(scope="module")
def tokenizer(tiny_run_dir: Path) -> Tokenizer:
    return Translator.from_checkpoint(tiny_run_dir, device="cpu").tokenizer


def check(body: bytes, tokenizer: Tokenizer, too_long: str = "refuse") -> TranslateRequest:
    request = parse_translate_request(body, LIMITS, DEFAULTS)
    return check_lengths(request, tokenizer, TINY_MAX_WORDS, max_subwords=256, too_long=too_long)


@settings(max_examples=300, deadline=1000, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=hostile_bodies)
def test_any_body_is_accepted_or_refused_with_a_4xx(tokenizer: Tokenizer, body: bytes) -> None:
    try:
        request = check(body, tokenizer, too_long="truncate")
    except RequestError as error:
        event(f"refused {error.status}")
        assert 400 <= error.status < 500
        str(error).encode("utf-8")  # the message can be sent whatever the body held
        return
    event("accepted")
    assert all(isinstance(s, str) for s in request.sentences) and len(request.truncated) == len(request.sentences)
    assert 1 <= request.options.beam_size <= LIMITS.max_beam_size and 0 <= request.options.length_penalty <= 10


BAD = [
    # (body, status, words the error must contain)
    (b'{"text": "\\ud800"}', 422, "sentence 1 holds a lone surrogate"),
    (b'{"text": ["ok", "a\\udfffb"]}', 422, "sentence 2 holds a lone surrogate"),
    (b'{"text": "Hund", "\\ud800": 1}', 422, "unknown field '\\ud800'"),
    ('{"text": "Hund"}'.encode("utf-16"), 422, "not valid UTF-8 (byte 0)"),
    (b"\xef\xbb\xbf" + b'{"text": "Hund"}', 422, "not valid JSON"),  # a UTF-8 BOM is not JSON
    (b'{"text": "Hund", "beam_size": 1e999}', 422, "1e999 is out of range (not finite)"),
    (b'{"text": "Hund", "length_penalty": -Infinity}', 422, "-Infinity is not a JSON number"),
    (b'{"text": "Hund", "length_penalty": 1e308}', 422, "length_penalty must be a number from 0 to 10, got 1e+308"),
    (b'{"text": "Hund", "length_penalty": 10.5}', 422, "length_penalty must be a number from 0 to 10"),
    (b'{"text": "Hund", "beam_size": ' + b"9" * 5000 + b"}", 422, "has 5000 digits"),
    (b'{"text": "Hund", "n_best": 3.0}', 422, "n_best must be a whole number from 1 to 1000, got 3.0"),
    (b'{"text": "Hund", "beam_size": [[[[3]]]]}', 422, "beam_size must be a whole number from 1 to 1000, got a list"),
    (b'{"text": {"a": 1}}', 422, '"text" must be a string or a list of strings'),
    (b'{"text": "Hund", "attention": "yes"}', 422, '"attention" must be true or false'),
    (b'{"text": ["' + b"Hund" * 100 + b'"]}', 413, "sentence 1 has 301 subwords"),  # one word, 301 subwords
    (json.dumps({"text": ["Hund", "a " * (TINY_MAX_WORDS + 1)]}).encode(), 413,
     f"sentence 2 has {TINY_MAX_WORDS + 1} words; this model was trained on sentences of at most {TINY_MAX_WORDS}"),
]


@pytest.mark.parametrize(("body", "status", "message"), BAD, ids=[m for _, _, m in BAD])
def test_each_malformed_body_names_its_problem(tokenizer: Tokenizer, body: bytes, status: int, message: str) -> None:
    with pytest.raises(RequestError) as caught:
        check(body, tokenizer)
    assert caught.value.status == status and message in str(caught.value), str(caught.value)


def test_a_deeply_nested_body_is_a_422_on_every_python(tokenizer: Tokenizer) -> None:
    # Before 3.13, Python's JSON parser overflows its stack on 5,000 levels (RecursionError); 3.13's parses them,
    # and the body is then not a translate request. Either way the answer is one 422 that names the problem.
    with pytest.raises(RequestError) as caught:
        check(b"[" * 5000 + b"]" * 5000, tokenizer)
    assert caught.value.status == 422
    assert any(problem in str(caught.value) for problem in ("nested too deeply", 'a JSON object with "text"'))


def test_subwords_not_only_words_are_limited(tokenizer: Tokenizer) -> None:
    word = "Hund" * 100
    subwords = len(tokenizer.encode_src(word))
    assert subwords > 256  # one whitespace word, far over max_subwords
    with pytest.raises(RequestError, match=f"sentence 1 has {subwords} subwords; the limit is max_subwords=256"):
        check(json.dumps({"text": word}).encode(), tokenizer)


def test_too_long_is_refused_or_marked_truncated(tokenizer: Tokenizer) -> None:
    long = " ".join(["Hund"] * (TINY_MAX_WORDS + 2))
    body = json.dumps({"text": ["Ein Hund.", long]}).encode()
    with pytest.raises(RequestError, match="too_long=truncate"):
        check(body, tokenizer, too_long="refuse")
    request = check(body, tokenizer, too_long="truncate")
    assert request.truncated == [False, True] and request.sentences[1] == long  # the engine cuts; the flag tells


def test_fields_are_the_documented_ones() -> None:
    assert FIELDS == ("text", "beam_size", "n_best", "length_penalty", "attention")
    with pytest.raises(RequestError, match="unknown field 'max_len'"):  # the server's, not the client's
        parse_translate_request(b'{"text": "Hund", "max_len": 1000}', LIMITS, DEFAULTS)
