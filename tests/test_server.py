"""The translation server over real HTTP on 127.0.0.1: endpoints, bad input, micro-batching, serve.py."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir
from hypothesis import HealthCheck, given, settings
from omegaconf import DictConfig

from nmt.inference.engine import SearchOptions, Translator
from nmt.serve.app import create_app
from tests.conftest import CONFIG_DIR, REPO_ROOT, SRC, TINY_MAX_WORDS, save_tiny_checkpoint, serve_in_thread
from tests.test_server_input import hostile_bodies

LIMITS = ["max_body_bytes=2048", "max_sentences=6", "max_sentence_words=12", "max_beam_size=5"]
SENTENCES = [*SRC, "Ein Mann.", "Hund", "Die Frau spielt Fußball im Park."]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    # tiny models gain nothing from threads, and on shared cores OpenMP spin-waits cost seconds
    torch.set_num_threads(1)


def serve_settings(*overrides: str) -> DictConfig:
    """The real configs/serve.yaml (defaults from ``ServeSettings``), with short outputs and the test limits."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose("serve", overrides=["max_len=8", *LIMITS, *overrides])


def call(url: str, payload: Any = None, *, data: bytes | None = None, method: str | None = None,
         timeout: float = 60) -> tuple[int, Any]:
    """One HTTP request; returns the status and the decoded JSON (or text) body, errors included."""
    if payload is not None:
        data = json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data is not None else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, body, kind = response.status, response.read(), response.headers.get_content_type()
    except urllib.error.HTTPError as error:
        status, body, kind = error.code, error.read(), error.headers.get_content_type()
    return status, json.loads(body) if kind == "application/json" else body.decode()


@pytest.fixture(scope="module")
def reference(tiny_run_dir: Path) -> Translator:
    """A Translator of its own, called from the test thread only, for what a sentence gives alone."""
    return Translator.from_checkpoint(tiny_run_dir, device="cpu")


@pytest.fixture(scope="module")
def server(tiny_run_dir: Path) -> Iterator[tuple[str, Translator]]:
    """A server on a free port (with a 40 ms batching window, wide enough for loaded shared cores)."""
    translator = Translator.from_checkpoint(tiny_run_dir, device="cpu")
    with serve_in_thread(create_app(translator, serve_settings("batch_wait_ms=40"))) as url:
        yield url, translator


def texts(translation: dict[str, Any]) -> list[str]:
    """The 1-best and n-best texts: what must not change with batching (scores may, by float rounding)."""
    return [translation["text"], *(hyp["text"] for hyp in translation["nbest"])]


def assert_same(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert texts(got) == texts(expected)
    assert [h["score"] for h in got["nbest"]] == pytest.approx([h["score"] for h in expected["nbest"]], abs=1e-4)
    if expected["attention"] is None:
        assert got["attention"] is None
    else:
        for key in ("source", "target", "alignment"):
            assert got["attention"][key] == expected["attention"][key]
        for row, expected_row in zip(got["attention"]["weights"], expected["attention"]["weights"]):
            assert row == pytest.approx(expected_row, abs=1e-4)


def alone(reference: Translator, sentence: str, **options: Any) -> dict[str, Any]:
    result = reference.translate([sentence], max_len=8, **options)[0].to_dict()
    return json.loads(json.dumps(result))  # as it comes over JSON


def test_translate_list_string_nbest_and_attention(server: tuple[str, Translator], reference: Translator) -> None:
    url, _ = server
    status, body = call(f"{url}/v1/translate", {"text": SENTENCES[:4]})
    assert status == 200
    assert len(body["translations"]) == 4
    for got, sentence in zip(body["translations"], SENTENCES[:4]):
        assert_same(got, alone(reference, sentence, beam_size=5))
    assert len({t["text"] for t in body["translations"]}) > 1  # the comparison is not vacuous

    status, body = call(f"{url}/v1/translate", {"text": SENTENCES[1], "beam_size": 3, "n_best": 3,
                                                "attention": True, "length_penalty": 0.5})
    assert status == 200 and len(body["translations"]) == 1
    (one,) = body["translations"]
    assert_same(one, alone(reference, SENTENCES[1], beam_size=3, n_best=3, attention=True, length_penalty=0.5))
    assert len(one["nbest"]) == 3 and one["nbest"][0]["text"] == one["text"]
    attention = one["attention"]
    assert attention["source"][-1] == "</s>" and len(attention["weights"]) == len(attention["target"])
    assert all(len(row) == len(attention["source"]) for row in attention["weights"])

    status, body = call(f"{url}/v1/translate", {"text": ["", SENTENCES[0]]})
    assert status == 200
    assert body["translations"][0] == {"text": "", "score": 0.0, "nbest": [{"text": "", "score": 0.0}],
                                       "attention": None, "truncated": False}
    assert body["translations"][1]["text"] == alone(reference, SENTENCES[0])["text"]


def test_health_model_and_page(server: tuple[str, Translator], tiny_run_dir: Path) -> None:
    url, translator = server
    status, before = call(f"{url}/health")
    assert status == 200 and before["status"] == "ok"
    assert (before["attention"], before["src_lang"], before["tgt_lang"]) == ("additive", "de", "en")
    assert before["parameters"] == translator.info()["parameters"] > 0 and before["bleu"] is None
    assert call(f"{url}/v1/translate", {"text": ["Hund", "Ein Mann."]})[0] == 200
    after = call(f"{url}/health")[1]
    assert after["requests"] == before["requests"] + 1 and after["sentences"] == before["sentences"] + 2
    assert after["batches"] == before["batches"] + 1
    assert after["search_calls"] == translator.search_calls > before["search_calls"]

    status, model = call(f"{url}/v1/model")
    assert status == 200
    assert {k: model[k] for k in ("src_lang", "tgt_lang", "attention", "models")} == {
        "src_lang": "de", "tgt_lang": "en", "attention": "additive", "models": 1}
    assert model["limits"] == {"max_body_bytes": 2048, "max_sentences": 6, "max_sentence_words": 12,
                               "max_subwords": 256, "max_beam_size": 5, "max_input_words": TINY_MAX_WORDS,
                               "too_long": "refuse", "max_queued_sentences": 512, "max_queue_wait_s": 10.0}
    assert "checkpoints" not in model and str(tiny_run_dir) not in json.dumps(model)  # no server paths
    assert model["defaults"]["beam_size"] == 5 and model["defaults"]["max_len"] == 8
    assert model["parameters"] > 0 and model["has_attention"] is True

    status, page = call(f"{url}/")
    assert status == 200 and 'id="translate"' in page and 'id="source"' in page
    assert "http://" not in page and "https://" not in page  # self-contained: nothing fetched from elsewhere


def test_model_without_attention_and_an_ensemble(tmp_path: Path) -> None:
    none_ckpt = save_tiny_checkpoint(tmp_path / "none.pt", "none")
    with serve_in_thread(create_app(Translator.from_checkpoint(none_ckpt, device="cpu"), serve_settings())) as url:
        assert call(f"{url}/v1/model")[1]["has_attention"] is False
        status, body = call(f"{url}/v1/translate", {"text": "Hund", "attention": True})
        assert status == 422 and "attention=none" in body["error"]
        assert call(f"{url}/v1/translate", {"text": "Hund"})[0] == 200

    members = [save_tiny_checkpoint(tmp_path / f"m{seed}.pt", "additive", seed=seed) for seed in (0, 1)]
    ensemble = Translator.from_checkpoint(members, device="cpu")
    expected = [t.to_dict()["text"] for t in ensemble.translate(SENTENCES[:3], max_len=8)]
    with serve_in_thread(create_app(Translator.from_checkpoint(members, device="cpu"), serve_settings())) as url:
        assert call(f"{url}/v1/model")[1]["models"] == 2
        status, body = call(f"{url}/v1/translate", {"text": SENTENCES[:3]})
        assert status == 200 and [t["text"] for t in body["translations"]] == expected


BAD_REQUESTS = [
    # (body, status, words the error must contain)
    (b"x" * 3000, 413, "max_body_bytes=2048"),
    (json.dumps({"text": ["Hund"] * 7}).encode(), 413, "7 sentences; the limit is max_sentences=6"),
    (json.dumps({"text": ["Hund", " ".join(["Hund"] * 13)]}).encode(), 413,
     "sentence 2 has 13 words; the limit is max_sentence_words=12"),
    (b'{"text": ["Hund"', 422, "not valid JSON"),
    (b"\xff\xfe", 422, "not valid UTF-8"),
    (b'["Hund"]', 422, '"text"'),
    (b'{"texts": "Hund"}', 422, '"text"'),
    (b'{"text": "Hund", "beam": 3}', 422, "unknown field 'beam'"),
    (b'{"text": 5}', 422, "list of strings"),
    (b'{"text": ["Hund", 3]}', 422, "list of strings"),
    (b'{"text": "Hund", "beam_size": "5"}', 422, "beam_size must be a whole number from 1 to 1000, got '5'"),
    (b'{"text": "Hund", "beam_size": true}', 422, "beam_size must be a whole number from 1 to 1000, got True"),
    (b'{"text": "Hund", "length_penalty": -1}', 422, "length_penalty must be a number from 0 to 10, got -1"),
    (b'{"text": "Hund", "attention": 1}', 422, '"attention" must be true or false'),
    (b'{"text": "Hund", "length_penalty": NaN}', 422, "NaN is not a JSON number"),
    (b'{"text": "Hund", "beam_size": 9}', 422, "beam_size=9 is over the limit max_beam_size=5"),
    (b'{"text": "Hund", "beam_size": 0}', 422, "beam_size must be a whole number from 1 to 1000, got 0"),
    (b'{"text": "Hund", "beam_size": 2, "n_best": 3}', 422, "n_best (3) cannot exceed beam_size (2)"),
]


@pytest.mark.parametrize(("body", "status", "message"), BAD_REQUESTS, ids=[m for _, _, m in BAD_REQUESTS])
def test_bad_requests_get_an_error_and_the_server_goes_on(server: tuple[str, Translator], body: bytes, status: int,
                                                           message: str) -> None:
    url, _ = server
    got_status, got = call(f"{url}/v1/translate", data=body, method="POST")
    assert got_status == status and message in got["error"], got
    assert call(f"{url}/v1/translate", {"text": "Hund"})[0] == 200


def test_wrong_paths_methods_and_chunked_bodies(server: tuple[str, Translator]) -> None:
    url, _ = server
    status, body = call(f"{url}/v2/translate", {"text": "Hund"})
    assert status == 404 and "POST /v1/translate" in body["error"]
    status, body = call(f"{url}/v1/translate")
    assert status == 405 and "GET is not allowed" in body["error"]
    # a chunked body has no Content-Length to check up front: the limit applies while it streams
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    chunks = iter([b'{"text": "', b"Hund " * 500, b'"}'])
    connection.request("POST", "/v1/translate", body=chunks, encode_chunked=True,
                       headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 413 and "max_body_bytes" in json.loads(response.read())["error"]
    connection.close()
    assert call(f"{url}/health")[0] == 200


def test_concurrent_requests_share_searches_and_match_one_at_a_time(server: tuple[str, Translator]) -> None:
    url, translator = server
    jobs = [({"text": SENTENCES[i % len(SENTENCES)], "beam_size": 2 + i % 2}) for i in range(32)]
    one_at_a_time = [call(f"{url}/v1/translate", job)[1]["translations"] for job in jobs]
    calls_before, batches_before = translator.search_calls, call(f"{url}/health")[1]["batches"]
    start = threading.Barrier(len(jobs))

    def send(job: dict[str, Any]) -> tuple[int, Any]:
        start.wait()  # all 32 at once
        return call(f"{url}/v1/translate", job)

    with ThreadPoolExecutor(len(jobs)) as pool:
        together = list(pool.map(send, jobs))
    assert [status for status, _ in together] == [200] * len(jobs)
    assert [texts(t) for _, body in together for t in body["translations"]] == [
        texts(t) for translations in one_at_a_time for t in translations]
    search_calls = translator.search_calls - calls_before
    batches = call(f"{url}/health")[1]["batches"] - batches_before
    assert 2 <= batches < len(jobs) and search_calls < len(jobs)  # two option sets: at least two batches


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_cli(*args: str, cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, str(REPO_ROOT / "serve.py"), *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_serve_py_finishes_in_flight_requests_on_sigterm(tiny_run_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    # a long batching window keeps the request in flight when SIGTERM arrives
    process = serve_cli(f"checkpoint={tiny_run_dir}", f"port={port}", "batch_wait_ms=1500", "max_len=8", cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if call(f"{url}/health", timeout=2)[0] == 200:
                    break
            except OSError:
                assert process.poll() is None, process.communicate()[1]
                assert time.monotonic() < deadline, "serve.py did not start in 120 s"
                time.sleep(0.2)
        with ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(call, f"{url}/v1/translate", {"text": SENTENCES[:3]})
            time.sleep(0.5)
            process.send_signal(signal.SIGTERM)
            status, body = in_flight.result(timeout=60)
        assert status == 200 and len(body["translations"]) == 3
        assert process.wait(timeout=60) == 0, process.communicate()[1]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert list(tmp_path.iterdir()) == []  # no Hydra output folder, no log file


@pytest.mark.parametrize(("args", "message"), [
    (["checkpoint=/no/such/run"], "/no/such/run"),
    (["beam=3"], "unknown config key beam: did you mean beam_size?"),
    (["checkpoint=RUN", "max_sentence_words=0"], "max_sentence_words=0 must be a whole number >= 1"),
    ([], "no checkpoint given; pass checkpoint=PATH"),
])
def test_serve_py_user_errors_are_one_line_exit_2(tiny_run_dir: Path, tmp_path: Path, args: list[str],
                                                  message: str) -> None:
    args = [a.replace("RUN", str(tiny_run_dir)) for a in args]
    process = serve_cli(*args, cwd=tmp_path)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 2 and stdout == ""
    assert stderr.startswith("serve.py: error: ") and stderr.count("\n") == 1 and message in stderr, stderr


def test_benchmark_script_reports_every_level(tiny_run_dir: Path, tmp_path: Path) -> None:
    """The benchmark runs end to end on a tiny model (its figures are not checked: timings stay out of tests)."""
    from nmt_tools.benchmark import main as benchmark

    source = tmp_path / "src.de"
    source.write_text("\n".join(SENTENCES * 3) + "\n", encoding="utf-8")
    out = tmp_path / "bench"
    report = benchmark([
        "server", "--checkpoint", str(tiny_run_dir), "--input", str(source), "--clients", "1", "4", "--seconds", "20",
        "--idle-requests", "3", "--threads", "1", "--device", "cpu", "--out", str(out)])
    assert json.loads((tmp_path / "bench.json").read_text(encoding="utf-8")) == json.loads(json.dumps(report))
    assert report["batch_job"]["sentences"] == len(SENTENCES) * 3
    assert [level["clients"] for level in report["clients"]] == [1, 4]
    assert all(level["sentences"] == len(SENTENCES) * 3 for level in report["clients"])  # each sentence once
    assert report["clients"][0]["sentences_per_batch"] == 1.0 and report["idle"]["requests"] == 3


# ------------------------------------------------------------------ Hostile input, load and slow clients
@settings(max_examples=150, deadline=10_000, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=hostile_bodies)
def test_no_body_gets_a_5xx_over_a_real_socket(server: tuple[str, Translator], body: bytes) -> None:
    url, _ = server
    status, answer = call(f"{url}/v1/translate", data=body, method="POST")
    assert status < 500 and isinstance(answer, dict), (status, answer)
    assert (status == 200) == ("translations" in answer) and (status == 200) != ("error" in answer)


def request_with_headers(url: str, method: str, path: str, headers: dict[str, str], body: bytes | None = None
                         ) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    for name, value in headers.items():
        connection.putheader(name, value)
    connection.endheaders(body)
    response = connection.getresponse()
    answer = response.status, response.read()
    connection.close()
    return answer


def test_cross_site_requests_are_refused(server: tuple[str, Translator]) -> None:
    url, _ = server
    port = url.rsplit(":", 1)[1]
    body = json.dumps({"text": "Hund"}).encode()
    for media_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        headers = {"Host": f"127.0.0.1:{port}", "Content-Length": str(len(body)),
                   **({"Content-Type": media_type} if media_type else {})}
        status, answer = request_with_headers(url, "POST", "/v1/translate", headers, body)
        assert status == 415 and "Content-Type: application/json" in json.loads(answer)["error"], media_type
    json_headers = {"Content-Type": "application/json; charset=utf-8", "Content-Length": str(len(body))}
    for host, status in ((f"localhost:{port}", 200), (f"127.0.0.1:{port}", 200), (f"[::1]:{port}", 200),
                         (f"attacker.example:{port}", 400), ("attacker.example", 400)):
        assert request_with_headers(url, "POST", "/v1/translate", {"Host": host, **json_headers}, body)[0] == status
    assert request_with_headers(url, "GET", "/health", {"Host": "rebound.example"})[0] == 400


class ScriptedTranslator(Translator):
    """A Translator whose decoding waits for ``gate`` and fails on any batch holding the sentence ``BOOM``."""

    gate: threading.Event
    calls: list[list[str]]

    def translate(self, sentences: Any, **options: Any) -> Any:
        self.calls.append(list(sentences))
        assert self.gate.wait(60), "the test never opened the gate"
        if "BOOM" in sentences:
            raise RuntimeError("this input breaks the search")
        return super().translate(sentences, **options)


@pytest.fixture
def scripted(tiny_run_dir: Path) -> Iterator[tuple[str, ScriptedTranslator]]:
    translator = ScriptedTranslator.from_checkpoint(tiny_run_dir, device="cpu")
    translator.gate, translator.calls = threading.Event(), []
    translator.gate.set()
    app = create_app(translator, serve_settings("max_queued_sentences=2", "request_timeout_s=0.5"))
    with serve_in_thread(app) as url:
        yield url, translator
    translator.gate.set()


def wait_for_health(url: str, condition: Any) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while not condition(health := call(f"{url}/health")[1]):
        assert time.monotonic() < deadline, health
        time.sleep(0.02)
    return health


def test_one_request_that_breaks_a_batch_fails_alone(scripted: tuple[str, ScriptedTranslator],
                                                     reference: Translator) -> None:
    url, translator = scripted
    translator.gate.clear()  # the worker holds the first request, so the next two queue and share a batch
    jobs = [{"text": "Hund"}, {"text": SENTENCES[0]}, {"text": "BOOM"}]
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = []
        for queued, job in enumerate(jobs):
            futures.append(pool.submit(call, f"{url}/v1/translate", job))
            if queued == 0:
                wait_for_health(url, lambda h: len(translator.calls) == 1)
            else:
                wait_for_health(url, lambda h, n=queued: h["queued"] == n)
        status, answer = call(f"{url}/v1/translate", {"text": "Ein Mann."})  # max_queued_sentences=2: refused
        assert status == 503 and "max_queued_sentences=2" in answer["error"]
        translator.gate.set()
        answers = [future.result() for future in futures]
    assert [status for status, _ in answers] == [200, 200, 500]
    for (_, answer), job in zip(answers[:2], jobs):
        assert answer["translations"][0]["text"] == alone(reference, job["text"])["text"]
    assert "internal error" in answers[2][1]["error"]
    assert [SENTENCES[0], "BOOM"] in translator.calls  # they shared a batch; then each was decoded alone
    assert [SENTENCES[0]] in translator.calls and ["BOOM"] in translator.calls


def test_a_full_queue_answers_503_and_abandoned_requests_are_not_decoded(
        scripted: tuple[str, ScriptedTranslator]) -> None:
    url, translator = scripted
    translator.gate.clear()
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(call, f"{url}/v1/translate", {"text": "Hund"})
        wait_for_health(url, lambda h: len(translator.calls) == 1)  # the worker is busy with it
        host, port = url.removeprefix("http://").split(":")
        leaving = socket.create_connection((host, int(port)))  # a client that sends a request, then goes
        body = json.dumps({"text": "Ein Mann."}).encode()
        leaving.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        wait_for_health(url, lambda h: h["queued_sentences"] == 1)
        status, answer, retry_after = post_with_headers(url, {"text": ["Zwei Hunde.", "Ein Mann."]})
        assert status == 503 and "1 sentences are waiting" in answer["error"] and int(retry_after) >= 1
        assert "max_queued_sentences=2" in answer["error"]
        health = call(f"{url}/health")[1]
        assert health["status"] == "overloaded" and health["overloaded"] == 1
        leaving.close()
        wait_for_health(url, lambda h: h["queued"] == 0)  # withdrawn once its client went
        translator.gate.set()
        assert first.result()[0] == 200
    health = wait_for_health(url, lambda h: h["abandoned"] == 1)
    assert health["sentences"] == 1 and translator.calls == [["Hund"]]  # "Ein Mann." was never decoded
    assert call(f"{url}/v1/translate", {"text": "Ein Mann."})[0] == 200  # and the server goes on


def test_the_queue_is_bounded_in_seconds_of_work_too(tiny_run_dir: Path) -> None:
    """With decoding measured at 1 s per sentence, max_queue_wait_s=3 admits 3 waiting sentences, not 4."""
    from nmt.serve.batcher import MicroBatcher
    from nmt.serve.requests import RequestError

    async def scenario() -> list[int]:
        batcher = MicroBatcher(Translator.from_checkpoint(tiny_run_dir, device="cpu"),
                               serve_settings("max_queued_sentences=100", "max_queue_wait_s=3.0"))
        batcher.busy_seconds, batcher.sentences = 10.0, 10  # as if measured
        statuses = []
        for _ in range(5):
            try:
                batcher.check_room(1)
                batcher.submit(["Hund"], SearchOptions(), False, [1])
                statuses.append(200)
            except RequestError as error:
                statuses.append(error.status)
        assert batcher.overloaded()
        batcher.close()
        return statuses

    assert asyncio.run(scenario()) == [200, 200, 200, 503, 503]


def post_with_headers(url: str, payload: Any) -> tuple[int, Any, str | None]:
    request = urllib.request.Request(f"{url}/v1/translate", data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read()), response.headers.get("Retry-After")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), error.headers.get("Retry-After")


def test_a_large_request_is_decoded_in_slices_with_others_in_between(tiny_run_dir: Path,
                                                                      reference: Translator) -> None:
    translator = ScriptedTranslator.from_checkpoint(tiny_run_dir, device="cpu")
    translator.gate, translator.calls = threading.Event(), []
    big = SENTENCES[:5]
    costs = [5 * (len(translator.tokenizer.encode_src(s)) + 1) for s in big]  # beam 5 x (subwords + EOS)
    budget = max(costs)  # each slice holds one or more sentences; the whole request is over it
    with serve_in_thread(create_app(translator, serve_settings(f"slice_subwords={budget}"))) as url, \
            ThreadPoolExecutor(2) as pool:
        large = pool.submit(call, f"{url}/v1/translate", {"text": big})
        wait_for_health(url, lambda h: len(translator.calls) == 1)  # its first slice is being decoded
        small = pool.submit(call, f"{url}/v1/translate", {"text": "Hund"})
        wait_for_health(url, lambda h: h["queued"] == 1)
        translator.gate.set()
        (status, answer), (small_status, _) = large.result(), small.result()
    assert status == small_status == 200
    assert translator.calls[1] == ["Hund"]  # after the first slice, not after the whole request
    slices = [translator.calls[0], *translator.calls[2:]]
    assert [s for piece in slices for s in piece] == big and len(slices) > 1
    assert all(len(piece) == 1 or sum(costs[big.index(s)] for s in piece) <= budget for piece in slices)
    assert [t["text"] for t in answer["translations"]] == [alone(reference, s)["text"] for s in big]


def test_slow_clients_are_closed(scripted: tuple[str, ScriptedTranslator]) -> None:
    url, _ = scripted  # request_timeout_s=0.5
    host, port = url.removeprefix("http://").split(":")
    partial_requests = [
        b"",  # connects and says nothing
        b"POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\n",  # half a head, then silence (slowloris)
        b"POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n{\"text\": ",  # a body that never ends
    ]
    for sent in partial_requests:
        with socket.create_connection((host, int(port))) as slow:
            slow.sendall(sent)
            slow.settimeout(20)  # far over the 0.5 s deadline: a server that never closes fails here
            assert slow.recv(1024) == b"", sent
    status, answer = call(f"{url}/v1/translate", {"text": "Hund"})
    assert status == 200


def test_too_long_sentences_are_truncated_when_asked_and_say_so(tiny_run_dir: Path, reference: Translator) -> None:
    long = " ".join(SRC[2].split() * 2)  # 14 words: over the model's 9
    app = create_app(Translator.from_checkpoint(tiny_run_dir, device="cpu"),
                     serve_settings("too_long=truncate", "max_sentence_words=20"))
    with serve_in_thread(app) as url:
        status, answer = call(f"{url}/v1/translate", {"text": [long, SENTENCES[0]]})
    assert status == 200
    assert [t["truncated"] for t in answer["translations"]] == [True, False]
    cut = " ".join(long.split()[:TINY_MAX_WORDS])
    assert answer["translations"][0]["text"] == alone(reference, cut)["text"]


@pytest.mark.parametrize(("override", "message"), [
    ("port=70000", "port=70000 is not a TCP port; choose one from 0 to 65535"),
    ("port=-1", "port=-1 is not a TCP port"),
    ("host=not a host", "host=not a host is not an address this machine can bind"),
    ("log_level=loud", "log_level=loud is not a log level; choose one of critical, error, warning, info"),
    ("max_subwords=0", "max_subwords=0 must be a whole number >= 1"),
    ("max_queued_sentences=0", "max_queued_sentences=0 must be a whole number >= 1"),
    ("max_connections=0", "max_connections=0 must be a whole number >= 1"),
    ("request_timeout_s=0", "request_timeout_s=0.0 must be a finite number >= 0.1"),
    ("batch_wait_ms=nan", "batch_wait_ms=nan must be a finite number >= 0"),
    ("too_long=cut", "too_long=cut must be one of refuse, truncate"),
    ("allowed_hosts=[]", "allowed_hosts=[] must be auto, * or a list of host names"),
    ("allowed_hosts=[a*.example.org]", "a wildcard must look like *.example.org"),
    ("length_penalty=11", "length_penalty must be a number from 0 to 10, got 11"),
    ("beam_size=12", "beam_size=12 is over max_beam_size=10"),
])
def test_every_setting_is_checked_before_the_model_loads(override: str, message: str) -> None:
    from nmt.common.settings import ConfigError
    from nmt.inference.engine import TranslationError
    from nmt.serve.settings import check_serve_settings

    with pytest.raises((ConfigError, TranslationError)) as caught:
        check_serve_settings(serve_settings(override, "max_beam_size=10"))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_allowed_hosts_default_to_loopback_names_on_loopback_only() -> None:
    from nmt.serve.settings import LOOPBACK_HOSTS, allowed_hosts

    assert allowed_hosts(serve_settings()) == LOOPBACK_HOSTS
    assert allowed_hosts(serve_settings("host=0.0.0.0")) is None
    assert allowed_hosts(serve_settings("host=0.0.0.0", "allowed_hosts=[nmt.example.org]")) == ["nmt.example.org"]
    assert allowed_hosts(serve_settings("allowed_hosts=*")) is None


def test_serve_py_refuses_a_bad_port_or_one_in_use_before_loading(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # a checkpoint that does not exist: the port's error comes first, so nothing was loaded
        for args, message in (([f"port={port}"], f"cannot listen on 127.0.0.1:{port}: Address already in use"),
                              (["port=70000"], "port=70000 is not a TCP port")):
            process = serve_cli("checkpoint=/no/such/run", *args, cwd=tmp_path)
            stdout, stderr = process.communicate(timeout=120)
            assert process.returncode == 2 and stdout == "" and stderr.count("\n") == 1, stderr
            assert stderr.startswith("serve.py: error: ") and message in stderr, stderr


def test_serve_yaml_documents_every_setting() -> None:
    from dataclasses import fields

    from nmt.serve.settings import ServeSettings

    comments = "\n".join(line for line in (CONFIG_DIR / "serve.yaml").read_text(encoding="utf-8").splitlines()
                         if line.startswith("#"))
    missing = [f.name for f in fields(ServeSettings) if f"#   {f.name} " not in comments]
    assert missing == []


def test_overload_benchmark_runs_end_to_end(tiny_run_dir: Path, tmp_path: Path) -> None:
    """The overload benchmark on a tiny model, briefly (figures unchecked: timings stay out of tests)."""
    from nmt_tools.benchmark import main as benchmark

    source = tmp_path / "src.de"
    source.write_text("\n".join([*SENTENCES, "ein " * (TINY_MAX_WORDS + 1)]) + "\n", encoding="utf-8")
    report = benchmark(["overload", "--checkpoint", str(tiny_run_dir), "--input", str(source), "--clients", "3",
                        "--seconds", "2", "--requests", "5", "--probe-seconds", "5", "--threads", "1",
                        "--serve", "max_sentences=4", "--out", str(tmp_path / "bench")])
    worst, load = report["worst_request"], report["load"]
    assert worst["sentences"] == 4 and max(worst["source_subwords"]) <= 256 and worst["beam_size"] == 10
    assert worst["probe_meanwhile"]["requests"] >= 1
    assert load["other_errors"] == {} and 1 <= load["admitted"] <= 15  # the too-long line is never sent
    assert load["server_peak_rss_mib"] > 0
