"""``benchmark.py overload``: what one hostile client costs ``serve.py``, and how it holds up under a crowd.

Two measurements on one ``serve.py`` subprocess on 127.0.0.1 (a free port), each bounded in time:

1. **The worst request** a client can send under the server's limits (read from ``/v1/model``):
   ``max_sentences`` sentences of ``max_subwords`` subwords each (within ``max_sentence_words`` and the model's
   word limit; words of random consonants, which split into many subwords), at ``beam_size = n_best =
   max_beam_size`` with attention. Reported: its latency, the server's CPU seconds meanwhile
   (``/proc/<pid>/stat``), the answer's size, and the latency of a probe client that sends one short
   sentence at a time meanwhile (what the other clients wait), beside the probe's latency at idle.
2. **A bounded load test**: ``--clients`` threads (at most 300), each on its own kept-open connection,
   send one sentence per request from the input (its lines within the word limits) until ``--seconds``
   (at most 60) or ``--requests`` per client; a 503 is counted and its ``Retry-After`` honoured.
   Reported: the admitted requests' latency p50/p99, the share of 503s, every other outcome by kind
   (there should be none), and the server's peak RSS (``VmHWM`` in ``/proc/<pid>/status``).

Linux only (``/proc``). Not done here: traffic to anything but 127.0.0.1, checking the translations.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from nmt.data import Tokenizer
from nmt.inference.engine import Translator
from nmt.inference.translate_job import read_input_lines
from nmt_tools.cli import mirror_file
from nmt_tools.load import Connection, percentile, request, serve_process

MAX_CLIENTS = 300
MAX_SECONDS = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``overload`` mode's options."""
    parser.add_argument("--checkpoint", required=True, help="run dir or .pt file written by train.py")
    parser.add_argument("--input", help="sentences for the load test (default: $NMT_DATA_MIRROR's test_2016_flickr)")
    parser.add_argument("--clients", type=int, default=300,
                        help=f"concurrent load-test clients (at most {MAX_CLIENTS})")
    parser.add_argument("--seconds", type=float, default=60.0, help=f"load-test length (at most {MAX_SECONDS:g} s)")
    parser.add_argument("--requests", type=int, default=200, help="at most this many requests per load-test client")
    parser.add_argument("--probe-seconds", type=float, default=20.0,
                        help="stop probing after this long even if the worst request is still running")
    parser.add_argument("--skip-worst", action="store_true", help="only the load test")
    parser.add_argument("--skip-load", action="store_true", help="only the worst request")
    parser.add_argument("--threads", type=int, help="the server's torch CPU threads (default: torch's own choice)")
    parser.add_argument("--device", default="cpu", help="the server's device")
    parser.add_argument("--serve", nargs="*", default=[], metavar="KEY=VALUE",
                        help="serve.py settings, e.g. max_queued_sentences=64 batch_wait_ms=5")


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def proc_peak_rss_mib(pid: int) -> float:
    """The peak resident set size of process ``pid`` (``VmHWM``), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc: this benchmark needs Linux")


def worst_sentence(tokenizer: Tokenizer, max_subwords: int, max_sentence_words: int, rng: random.Random) -> str:
    """Random-consonant words (many subwords each): up to ``max_subwords`` subwords and ``max_sentence_words`` words."""
    words: list[str] = []
    while len(words) < max_sentence_words:
        word = "".join(rng.choice("bcdfghjklmnpqrstvwxz") for _ in range(8))
        if len(tokenizer.encode_src(" ".join([*words, word]))) > max_subwords:
            break
        words.append(word)
    return " ".join(words)


def worst_request(url: str, tokenizer: Tokenizer) -> dict[str, Any]:
    """The most expensive body the server's limits let through (see the module docstring)."""
    limits = request(f"{url}/v1/model")["limits"]
    max_sentence_words = min(n for n in (limits["max_sentence_words"], limits["max_input_words"]) if n is not None)
    rng = random.Random(0)
    sentences = [worst_sentence(tokenizer, limits["max_subwords"], max_sentence_words, rng)
                 for _ in range(limits["max_sentences"])]
    body = {"text": sentences, "beam_size": limits["max_beam_size"], "n_best": limits["max_beam_size"],
            "attention": True}
    while len(json.dumps(body, ensure_ascii=False).encode()) > limits["max_body_bytes"]:
        body["text"] = body["text"][:-1]  # the body limit binds first: as many sentences as fit
    return body


def probe(url: str, stop: threading.Event, seconds: float) -> list[float]:
    """One short sentence at a time until ``stop`` or ``seconds``: the latencies another client sees."""
    latencies, connection, deadline = [], Connection(url), time.perf_counter() + seconds
    while not stop.is_set() and time.perf_counter() < deadline:
        start = time.perf_counter()
        connection.post("/v1/translate", {"text": "Ein Hund läuft."})
        latencies.append(time.perf_counter() - start)
        time.sleep(0.05)
    connection.close()
    return latencies


def measure_worst(url: str, pid: int, tokenizer: Tokenizer, probe_seconds: float) -> dict[str, Any]:
    """The worst request's latency and CPU time, and a probe client's latency at idle and meanwhile."""
    body = worst_request(url, tokenizer)
    idle = probe(url, threading.Event(), 2.0)
    stop = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        probing = pool.submit(probe, url, stop, probe_seconds)
        time.sleep(0.2)  # the probe is in its stride
        cpu, start = proc_cpu_seconds(pid), time.perf_counter()
        connection = Connection(url)
        connection.timeout = 3600
        answer = connection.post("/v1/translate", body)
        seconds, cpu = time.perf_counter() - start, proc_cpu_seconds(pid) - cpu
        stop.set()
        during = probing.result()
    connection.close()
    subwords = [len(tokenizer.encode_src(s)) for s in body["text"]]
    out_lengths = [len(t["attention"]["target"]) if t["attention"] else None for t in answer["translations"]]
    return {"sentences": len(body["text"]), "source_subwords": subwords, "beam_size": body["beam_size"],
            "body_bytes": len(json.dumps(body, ensure_ascii=False).encode()),
            "answer_bytes": len(json.dumps(answer).encode()), "output_words": out_lengths,
            "seconds": seconds, "server_cpu_seconds": cpu,
            "probe_idle": _latency_summary(idle), "probe_meanwhile": _latency_summary(during)}


def _latency_summary(latencies: list[float]) -> dict[str, Any]:
    if not latencies:
        return {"requests": 0}
    return {"requests": len(latencies), "p50_ms": 1000 * percentile(latencies, 50),
            "p99_ms": 1000 * percentile(latencies, 99), "max_ms": 1000 * max(latencies)}


def load_client(url: str, lines: list[str], stop_at: float, max_requests: int, seed: int,
                outcomes: Counter, latencies: list[float], lock: threading.Lock) -> None:
    """One client: its own connection, one sentence per request, until ``stop_at`` or ``max_requests``."""
    rng, connection = random.Random(seed), Connection(url)
    for _ in range(max_requests):
        if time.perf_counter() >= stop_at:
            break
        start = time.perf_counter()
        try:
            connection.request("POST", "/v1/translate", json.dumps({"text": rng.choice(lines)}),
                               {"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            outcome, retry_after = str(response.status), response.getheader("Retry-After")
        except (OSError, http.client.HTTPException) as error:
            outcome, retry_after = type(error).__name__, None
            connection.close()  # http.client reconnects on the next request
        with lock:
            outcomes[outcome] += 1
            if outcome == "200":
                latencies.append(time.perf_counter() - start)
        if retry_after:  # a polite client; its kept-alive connection would be closed while it waits
            connection.close()
            time.sleep(min(float(retry_after), max(0.0, stop_at - time.perf_counter())))
    connection.close()


def measure_load(url: str, pid: int, lines: list[str], clients: int, seconds: float, max_requests: int
                 ) -> dict[str, Any]:
    """``clients`` concurrent clients for at most ``seconds``: outcomes, latency of the admitted, peak RSS."""
    outcomes: Counter = Counter()
    latencies: list[float] = []
    lock = threading.Lock()
    start = time.perf_counter()
    stop_at = start + seconds
    with ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(load_client, url, lines, stop_at, max_requests, seed, outcomes, latencies, lock)
                       for seed in range(clients)]:
            future.result()
    wall = time.perf_counter() - start
    health = request(f"{url}/health")
    total = sum(outcomes.values())
    other = {kind: n for kind, n in outcomes.items() if kind not in ("200", "503")}
    return {"clients": clients, "seconds": wall, "requests": total, "outcomes": dict(outcomes),
            "admitted": outcomes["200"], "share_503": outcomes["503"] / total if total else 0.0,
            "other_errors": other, "admitted_per_s": outcomes["200"] / wall, **_latency_summary(latencies),
            "server_peak_rss_mib": proc_peak_rss_mib(pid),
            "server_health": {k: health[k] for k in ("requests", "refused", "overloaded", "abandoned", "batches",
                                                     "sentences")}}


def benchmark_overload(args: argparse.Namespace) -> tuple[dict[str, Any], torch.device]:
    """The ``overload`` mode: the worst request, then the load test; prints each as it comes."""
    if not 1 <= args.clients <= MAX_CLIENTS or not 0 < args.seconds <= MAX_SECONDS or args.requests < 1:
        raise SystemExit(f"benchmark.py overload: --clients must be 1-{MAX_CLIENTS}, --seconds in (0, {MAX_SECONDS:g}]"
                         " and --requests >= 1")
    translator = Translator.from_checkpoint(args.checkpoint, device="cpu")  # for its tokenizer only
    tokenizer, src_lang = translator.tokenizer, translator.info()["src_lang"]
    del translator
    report: dict[str, Any] = {"config": {"checkpoint": str(args.checkpoint), "serve": args.serve,
                                         "threads": args.threads, "clients": args.clients,
                                         "seconds": args.seconds, "requests_per_client": args.requests}}
    report["load_average_before"] = os.getloadavg()  # the cores are shared: say how busy they already were
    with serve_process(args, ["log_level=warning", *args.serve]) as (url, process):
        report["limits"] = request(f"{url}/v1/model")["limits"]
        if not args.skip_worst:
            worst = report["worst_request"] = measure_worst(url, process.pid, tokenizer, args.probe_seconds)
            print(f"worst request: {worst['sentences']} sentences of up to {max(worst['source_subwords'])} subwords, "
                  f"beam {worst['beam_size']}, attention: {worst['seconds']:.1f} s, server CPU "
                  f"{worst['server_cpu_seconds']:.1f} s, answer {worst['answer_bytes'] / 1e6:.1f} MB; a probe client "
                  f"waited p50 {worst['probe_meanwhile'].get('p50_ms', 0):.0f} ms, max "
                  f"{worst['probe_meanwhile'].get('max_ms', 0):.0f} ms meanwhile (idle p50 "
                  f"{worst['probe_idle']['p50_ms']:.0f} ms)", flush=True)
        if not args.skip_load:
            src_path = Path(args.input) if args.input else mirror_file(src_lang)
            longest = min(n for n in (report["limits"]["max_sentence_words"], report["limits"]["max_input_words"]) if n)
            lines = [line for line in read_input_lines(src_path) if 0 < len(line.split()) <= longest]  # admissible
            load = report["load"] = measure_load(url, process.pid, lines, args.clients, args.seconds, args.requests)
            print(f"load: {args.clients} clients, {load['seconds']:.1f} s, {load['requests']} requests: "
                  f"{load['admitted']} admitted ({load['admitted_per_s']:.1f}/s, p50 {load.get('p50_ms', 0):.0f} ms, "
                  f"p99 {load.get('p99_ms', 0):.0f} ms), 503: {load['share_503']:.1%}, other errors: "
                  f"{load['other_errors'] or 'none'}, server peak RSS {load['server_peak_rss_mib']:.0f} MiB",
                  flush=True)
    report["load_average_after"] = os.getloadavg()
    return report, torch.device(args.device)
