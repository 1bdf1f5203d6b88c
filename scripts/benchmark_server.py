"""Server speed: sentences/s and latency of ``serve.py`` under 1, 4 and 16 clients, next to the batch job.

    python scripts/benchmark_server.py --checkpoint outputs/RUN_DIR
    python scripts/benchmark_server.py --checkpoint RUN --clients 1 4 16 --seconds 30 --threads 2

(With the package installed, ``pip install -e .``; from a checkout without it, ``PYTHONPATH=.``.)

Input: Multi30k test_2016_flickr in the checkpoint's source language, from
``$NMT_DATA_MIRROR/multi30k/test_2016_flickr.<src>.gz`` unless ``--input`` says otherwise.

What it measures, all in one run on one machine:

1. the batch job: ``Translator.translate`` on the whole file in this process (after a warm-up), the
   ceiling that micro-batching can approach;
2. ``serve.py`` started as a subprocess on 127.0.0.1 (a free port), then for each client count C: C
   threads send the file one sentence per request (each sentence once, in order, stopping after
   ``--seconds``) and wait for each answer; sentences/s = answered / wall time, latency p50/p95 per
   request, and from ``/health`` how many sentences each search batch held on average;
3. single-sentence latency at idle: ``--idle-requests`` requests one at a time, 50 ms apart.

Traffic goes to 127.0.0.1 only. The result is printed and written as JSON (device, versions, config,
date, command) to ``docs/results/server_benchmark_<device>.json`` unless ``--out`` says otherwise.

Not a test: timings never go into the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from nmt.provenance import device_name, device_slug, provenance
from nmt.translation import read_input_lines
from nmt.translator import Translator

REPO_ROOT = Path(__file__).resolve().parents[1]
SPLIT = "test_2016_flickr"
HOST = "127.0.0.1"  # never anywhere else


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="run dir or .pt file written by train.py")
    parser.add_argument("--input", default=None,
                        help=f"source file (default: $NMT_DATA_MIRROR/multi30k/{SPLIT}.<src>.gz)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16], help="concurrent clients per level")
    parser.add_argument("--seconds", type=float, default=30.0, help="at most this long per client level")
    parser.add_argument("--idle-requests", type=int, default=30, help="single requests for the idle latency")
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--batch-wait-ms", type=float, default=5.0, help="serve.py's micro-batching window")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda (both the batch job and the server)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads for both (default: torch's own choice)")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N sentences (smoke runs)")
    parser.add_argument("--out", default=None, help="JSON path (default: docs/results/server_benchmark_<device>.json)")
    return parser.parse_args(argv)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation, as numpy's default."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def post(url: str, payload: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def get(url: str, timeout: float = 10) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


@contextmanager
def running_server(args: argparse.Namespace) -> Iterator[str]:
    """``serve.py`` on a free port of 127.0.0.1; yields its URL; SIGTERM at the end."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port = sock.getsockname()[1]
    env = dict(os.environ)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    command = [sys.executable, str(REPO_ROOT / "serve.py"), f"checkpoint={args.checkpoint}", f"host={HOST}",
               f"port={port}", f"device={args.device}", f"beam_size={args.beam_size}",
               f"batch_wait_ms={args.batch_wait_ms}", "log_level=warning"]
    process = subprocess.Popen(command, env=env)
    url = f"http://{HOST}:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                get(f"{url}/health", timeout=2)
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"serve.py did not start (exit status {process.poll()})") from None
                time.sleep(0.2)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def client_level(url: str, lines: list[str], clients: int, seconds: float) -> dict[str, Any]:
    """``clients`` threads send ``lines`` one per request, each line once, until done or ``seconds`` pass."""
    before = get(f"{url}/health")
    todo = iter(lines)
    lock = threading.Lock()
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds

    def client() -> None:
        while time.perf_counter() < stop_at:
            with lock:
                line = next(todo, None)
            if line is None:
                return
            start = time.perf_counter()
            post(f"{url}/v1/translate", {"text": line})
            with lock:
                latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(client) for _ in range(clients)]:
            future.result()
    wall = time.perf_counter() - start
    after = get(f"{url}/health")
    batches = after["batches"] - before["batches"]
    return {
        "clients": clients,
        "sentences": len(latencies),
        "seconds": wall,
        "sentences_per_s": len(latencies) / wall,
        "latency_p50_ms": 1000 * percentile(latencies, 50),
        "latency_p95_ms": 1000 * percentile(latencies, 95),
        "batches": batches,
        "sentences_per_batch": (after["sentences"] - before["sentences"]) / max(batches, 1),
        "search_calls": after["search_calls"] - before["search_calls"],
    }


def idle_latency(url: str, lines: list[str], requests: int) -> dict[str, Any]:
    latencies = []
    for line in lines[:requests]:
        time.sleep(0.05)  # idle: nothing else in flight, the batching window closes on its own
        start = time.perf_counter()
        post(f"{url}/v1/translate", {"text": line})
        latencies.append(time.perf_counter() - start)
    return {"requests": len(latencies), "latency_p50_ms": 1000 * percentile(latencies, 50),
            "latency_p95_ms": 1000 * percentile(latencies, 95)}


def batch_job(translator: Translator, lines: list[str], beam_size: int) -> dict[str, Any]:
    translator.translate(lines[:64], beam_size=beam_size)  # warm-up: allocator, kernels, caches
    start = time.perf_counter()
    translator.translate(lines, beam_size=beam_size)
    if translator.device.type == "cuda":
        torch.cuda.synchronize(translator.device)
    seconds = time.perf_counter() - start
    return {"sentences": len(lines), "seconds": seconds, "sentences_per_s": len(lines) / seconds}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    translator = Translator.from_checkpoint(args.checkpoint, args.device)
    src_lang = translator.info()["src_lang"]
    if args.input:
        src_path = Path(args.input)
    elif os.environ.get("NMT_DATA_MIRROR"):
        src_path = Path(os.environ["NMT_DATA_MIRROR"]) / "multi30k" / f"{SPLIT}.{src_lang}.gz"
    else:
        raise SystemExit("NMT_DATA_MIRROR is not set; pass --input")
    lines = [line for line in read_input_lines(src_path) if line][: args.limit]

    batch = batch_job(translator, lines, args.beam_size)
    print(f"batch job : {batch['sentences_per_s']:8.1f} sentences/s ({batch['seconds']:.2f} s for "
          f"{len(lines)} sentences, Translator.translate on the whole file)", flush=True)
    device = translator.device
    del translator  # the server process holds its own copy
    levels = []
    with running_server(args) as url:
        post(f"{url}/v1/translate", {"text": lines[:8]})  # warm-up
        for clients in args.clients:
            level = client_level(url, lines, clients, args.seconds)
            levels.append(level)
            print(f"{clients:3d} client{'s' if clients > 1 else ' '}: {level['sentences_per_s']:8.1f} sentences/s, "
                  f"latency p50 {level['latency_p50_ms']:7.1f} ms, p95 {level['latency_p95_ms']:7.1f} ms, "
                  f"{level['sentences_per_batch']:.1f} sentences per batch ({level['sentences']} sentences)",
                  flush=True)
        idle = idle_latency(url, lines, args.idle_requests)
        print(f"idle      : one sentence, latency p50 {idle['latency_p50_ms']:.1f} ms "
              f"({idle['requests']} requests one at a time)", flush=True)

    report = {
        "benchmark": "server",
        **provenance("scripts/benchmark_server.py", argv),
        "device": {"type": device.type, "name": device_name(device)},
        "config": {"checkpoint": str(args.checkpoint), "input": str(src_path), "sentences": len(lines),
                   "beam_size": args.beam_size, "batch_wait_ms": args.batch_wait_ms, "seconds_per_level": args.seconds,
                   "threads": args.threads or torch.get_num_threads()},
        "batch_job": batch,
        "clients": levels,
        "idle": idle,
    }
    default_out = REPO_ROOT / "docs" / "results" / f"server_benchmark_{device_slug(device)}.json"
    out = Path(args.out) if args.out else default_out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
