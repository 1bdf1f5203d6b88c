"""One system of ``export_speed.py`` in a process of its own: the PyTorch engine or ``nmt_runtime``, fp32 or int8.

A process per system, so that its peak memory is its own and the runtime's process never imports PyTorch
(the engine's imports happen only for ``--system engine``). It translates the source batched, greedy and at
beam 5, then the first ``--latency-sentences`` sentences one at a time, writes each batched output to
``--out-dir`` and prints one JSON line: seconds, sentences/s, latencies and peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BEAMS = {"greedy": 1, "beam5": 5}
WARMUP_SENTENCES = 20


def load(system: str, model: str, precision: str, threads: int) -> Callable[[list[str], int], list[str]]:
    """A function ``(sentences, beam_size) -> translations`` of the system asked for."""
    if system == "engine":
        import torch

        from nmt import Translator

        torch.set_num_threads(threads)
        engine = Translator.from_checkpoint(model, device="cpu", precision=precision)
        return lambda lines, beam: [r.text for r in engine.translate(lines, beam_size=beam)]
    from nmt_runtime import Translator as RuntimeTranslator

    runtime = RuntimeTranslator(model, threads=threads)  # an int8 folder holds int8 graphs
    return lambda lines, beam: [r.text for r in runtime.translate(lines, beam_size=beam)]


def measure(translate: Callable[[list[str], int], list[str]], lines: list[str], latency_sentences: int,
            out_dir: Path, name: str) -> dict[str, Any]:
    """Batched sentences/s and one-at-a-time latency per search; the batched outputs go to ``out_dir``."""
    translate(lines[:WARMUP_SENTENCES], 5)  # untimed: allocators, thread pools, lazy initialisation
    rows = {}
    for search, beam in BEAMS.items():
        started = time.perf_counter()
        outputs = translate(lines, beam)
        seconds = time.perf_counter() - started
        (out_dir / f"{name}.{search}.txt").write_text("".join(o + "\n" for o in outputs), encoding="utf-8")
        latencies = []
        for line in lines[:latency_sentences]:
            started = time.perf_counter()
            translate([line], beam)
            latencies.append(1000 * (time.perf_counter() - started))
        rows[search] = {"seconds": seconds, "sentences_per_s": len(lines) / seconds,
                        "latency_ms_mean": statistics.fmean(latencies), "latency_ms_p50": statistics.median(latencies),
                        "latency_ms_p90": statistics.quantiles(latencies, n=10)[-1] if len(latencies) > 1 else None}
    return rows


def peak_memory_mib() -> float:
    """This process's peak resident memory, MiB: ``VmHWM`` of /proc (ru_maxrss would include the parent's, as
    Linux keeps it across the fork and exec that started this worker)."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # elsewhere: KiB on Linux, bytes on macOS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--system", choices=("engine", "runtime"), required=True)
    parser.add_argument("--model", required=True, help="engine: run dir; runtime: export folder")
    parser.add_argument("--precision", choices=("fp32", "int8"), default="fp32")
    parser.add_argument("--source", required=True, type=Path, help="plain UTF-8, one sentence per line")
    parser.add_argument("--latency-sentences", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    lines = args.source.read_text(encoding="utf-8").split("\n")[:-1]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    translate = load(args.system, args.model, args.precision, args.threads)
    load_seconds = time.perf_counter() - started
    name = f"{args.system}_{args.precision}"
    rows = measure(translate, lines, args.latency_sentences, args.out_dir, name)
    peak_mib = peak_memory_mib()
    print(json.dumps({"system": args.system, "precision": args.precision, "load_seconds": load_seconds,
                      "peak_rss_mib": peak_mib, "torch_imported": "torch" in sys.modules, "searches": rows}))


if __name__ == "__main__":
    main()
