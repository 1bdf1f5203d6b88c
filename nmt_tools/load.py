"""``benchmark.py server``: sentences/s and latency of ``serve.py`` under 1, 4 and 16 clients, beside the batch job.

All in one run on one machine: (1) the batch job, ``Translator.translate`` on the whole input in this
process after a warm-up: the ceiling micro-batching can approach (and ``translate.py`` on the same file
as a whole process); (2) ``serve.py`` as a subprocess on
127.0.0.1 (a free port); for each client count C, C threads, each on its own kept-open connection,
send the input one sentence per request (each once, in order, stopping after ``--seconds``):
sentences/s, latency p50/p95, and from ``/health`` the sentences per search batch; (3) single-sentence
latency at idle, one request at a time, 50 ms apart.

Not done here: traffic to anything but 127.0.0.1, or checking the translations.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from nmt.common.provenance import device_name
from nmt.inference.engine import Translator
from nmt.inference.translate_job import read_input_lines
from nmt_tools.cli import mirror_file, sync

HOST = "127.0.0.1"  # never anywhere else


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``server`` mode's options."""
    parser.add_argument("--checkpoint", required=True, help="run dir or .pt file written by train.py")
    parser.add_argument("--input", help="source file (default: $NMT_DATA_MIRROR/multi30k/test_2016_flickr.<src>.gz)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16], help="concurrent clients per level")
    parser.add_argument("--seconds", type=float, default=30.0, help="at most this long per client level")
    parser.add_argument("--idle-requests", type=int, default=30, help="single requests for the idle latency")
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--batch-wait-ms", type=float, default=5.0, help="serve.py's micro-batching window")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda (the batch job and the server)")
    parser.add_argument("--threads", type=int, help="torch CPU threads for both (default: torch's own choice)")
    parser.add_argument("--limit", type=int, help="use only the first N sentences (smoke runs)")


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation, as numpy's default."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def request(url: str, payload: dict[str, Any] | None = None, timeout: float = 120) -> dict[str, Any]:
    """GET ``url`` (no payload) or POST ``payload`` as JSON; the JSON answer."""
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as response:
        return json.loads(response.read())


class Connection(http.client.HTTPConnection):
    """One client's HTTP/1.1 connection, kept open across its requests as a real client's would be (a new
    connection per request would spend both processes' CPU, on the same cores, on TCP set-up)."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        super().__init__(parts.hostname, parts.port, timeout=120)

    def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        self.request("POST", path, json.dumps(payload), {"Content-Type": "application/json"})
        response = self.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"POST {path} answered {response.status}: {body[:200]!r}")
        return json.loads(body)


@contextmanager
def serve_process(args: argparse.Namespace, settings: Sequence[str]) -> Iterator[tuple[str, subprocess.Popen]]:
    """``serve.py`` with ``args.checkpoint`` and ``settings`` on a free port of 127.0.0.1; yields its URL and
    process; SIGTERM at the end."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port = sock.getsockname()[1]
    env = {**os.environ, **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {})}
    process = subprocess.Popen([sys.executable, str(args.project_dir / "serve.py"), f"checkpoint={args.checkpoint}",
                                f"host={HOST}", f"port={port}", f"device={args.device}", *settings], env=env)
    url = f"http://{HOST}:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                request(f"{url}/health", timeout=2)
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"serve.py did not start (exit status {process.poll()})") from None
                time.sleep(0.2)
        yield url, process
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


@contextmanager
def running_server(args: argparse.Namespace) -> Iterator[str]:
    """``serve.py`` with this mode's beam size and batching window; yields its URL."""
    settings = [f"beam_size={args.beam_size}", f"batch_wait_ms={args.batch_wait_ms}", "log_level=warning"]
    with serve_process(args, settings) as (url, _):
        yield url


def latencies_ms(latencies: list[float]) -> dict[str, float]:
    return {"latency_p50_ms": 1000 * percentile(latencies, 50), "latency_p95_ms": 1000 * percentile(latencies, 95)}


def client_level(url: str, lines: list[str], clients: int, seconds: float) -> dict[str, Any]:
    """``clients`` threads send ``lines`` one per request, each line once, until done or ``seconds`` pass."""
    before, todo, lock = request(f"{url}/health"), iter(lines), threading.Lock()
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds

    def client() -> None:
        connection = Connection(url)
        while time.perf_counter() < stop_at:
            with lock:
                line = next(todo, None)
            if line is None:
                break
            start = time.perf_counter()
            connection.post("/v1/translate", {"text": line})
            with lock:
                latencies.append(time.perf_counter() - start)
        connection.close()

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(client) for _ in range(clients)]:
            future.result()
    wall = time.perf_counter() - start
    after = request(f"{url}/health")
    batches = after["batches"] - before["batches"]
    return {"clients": clients, "sentences": len(latencies), "seconds": wall,
            "sentences_per_s": len(latencies) / wall, **latencies_ms(latencies), "batches": batches,
            "sentences_per_batch": (after["sentences"] - before["sentences"]) / max(batches, 1),
            "busy_fraction": (after["busy_seconds"] - before["busy_seconds"]) / wall,
            "search_calls": after["search_calls"] - before["search_calls"]}


def idle_latency(url: str, lines: list[str], requests: int) -> dict[str, Any]:
    """Latency of single requests with nothing else in flight (the batching window closes on its own)."""
    latencies, connection = [], Connection(url)
    for line in lines[:requests]:
        time.sleep(0.05)
        start = time.perf_counter()
        connection.post("/v1/translate", {"text": line})
        latencies.append(time.perf_counter() - start)
    connection.close()
    return {"requests": len(latencies), **latencies_ms(latencies)}


def batch_job(translator: Translator, lines: list[str], beam_size: int) -> dict[str, Any]:
    """The whole input in one ``Translator.translate`` call, after a warm-up."""
    translator.translate(lines[:64], beam_size=beam_size)  # warm-up: allocator, kernels, caches
    start = time.perf_counter()
    translator.translate(lines, beam_size=beam_size)
    sync(translator.device)
    seconds = time.perf_counter() - start
    return {"sentences": len(lines), "seconds": seconds, "sentences_per_s": len(lines) / seconds}


def translate_py(args: argparse.Namespace, src_path: Path, sentences: int) -> dict[str, Any]:
    """``translate.py`` on the same file as a whole process (start-up and model loading included)."""
    env = {**os.environ, **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {})}
    with tempfile.TemporaryDirectory(prefix="nmt_bench_") as folder:
        start = time.perf_counter()
        subprocess.run([sys.executable, str(args.project_dir / "translate.py"), f"checkpoint={args.checkpoint}",
                        f"input={src_path}", f"output={Path(folder) / 'out.txt'}", f"device={args.device}",
                        f"beam_size={args.beam_size}", "progress=false"], env=env, check=True, capture_output=True)
        seconds = time.perf_counter() - start
    return {"sentences": sentences, "seconds": seconds, "sentences_per_s": sentences / seconds}


def benchmark_server(args: argparse.Namespace) -> tuple[dict[str, Any], torch.device]:
    """The ``server`` mode: the batch job, each client level, idle latency; prints each as it comes."""
    if args.threads:
        torch.set_num_threads(args.threads)
    translator = Translator.from_checkpoint(args.checkpoint, args.device)
    src_path = Path(args.input) if args.input else mirror_file(translator.info()["src_lang"])
    lines = [line for line in read_input_lines(src_path) if line][: args.limit]
    batch = batch_job(translator, lines, args.beam_size)
    print(f"batch job : {batch['sentences_per_s']:8.1f} sentences/s ({batch['seconds']:.2f} s for "
          f"{len(lines)} sentences, Translator.translate on the whole file)", flush=True)
    if args.limit is None:  # translate.py reads the whole file
        batch["translate_py"] = translate_py(args, src_path, len(lines))
        print(f"translate.py: {batch['translate_py']['sentences_per_s']:6.1f} sentences/s as a whole process "
              f"({batch['translate_py']['seconds']:.2f} s)", flush=True)
    device = translator.device
    del translator  # the server process holds its own copy
    levels = []
    with running_server(args) as url:
        request(f"{url}/v1/translate", {"text": lines[:8]})  # warm-up
        for clients in args.clients:
            levels.append(level := client_level(url, lines, clients, args.seconds))
            print(f"{clients:3d} client{'s' if clients > 1 else ' '}: {level['sentences_per_s']:8.1f} sentences/s, "
                  f"latency p50 {level['latency_p50_ms']:7.1f} ms, p95 {level['latency_p95_ms']:7.1f} ms, "
                  f"{level['sentences_per_batch']:.1f} sentences per batch, decoding {level['busy_fraction']:.0%} of "
                  f"the time ({level['sentences']} sentences)",
                  flush=True)
        idle = idle_latency(url, lines, args.idle_requests)
        print(f"idle      : one sentence, latency p50 {idle['latency_p50_ms']:.1f} ms "
              f"({idle['requests']} requests one at a time)", flush=True)
    config = {"checkpoint": str(args.checkpoint), "input": str(src_path), "sentences": len(lines),
              "beam_size": args.beam_size, "batch_wait_ms": args.batch_wait_ms, "seconds_per_level": args.seconds,
              "threads": args.threads or torch.get_num_threads()}
    return {"device": {"type": device.type, "name": device_name(device)}, "config": config, "batch_job": batch,
            "clients": levels, "idle": idle}, device
