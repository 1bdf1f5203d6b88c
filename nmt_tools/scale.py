"""``benchmark.py scale``: what a corpus of N pairs costs to prepare, to load and to start training on.

Builds a synthetic corpus of ``--synthetic-pairs`` N pairs under the system temp dir (Multi30k train
resampled, each line with word noise so that lines differ; reused by later runs with the same N,
noise and seed; never inside the repository), then measures, each in a fresh child process so that
only the page cache is warm:

- ``prepare_data`` into an empty cache (cold), then again (cached): seconds, and the peak RSS of the
  process (``ru_maxrss``: SentencePiece's sample included); the cached run also times the sampler's
  plan of one epoch (``sampler_epoch_seconds``);
- ``python train.py data=files ...`` on that corpus: seconds from the start of the process to its
  first optimizer step (the first line of ``train_log.jsonl``), and its memory after
  ``--train-steps`` steps (RSS, split into anonymous and file-backed pages, and PSS, which divides
  shared pages between the processes that map them), when it is stopped;
- with ``--ranks 2``, the same under ``torchrun --nproc_per_node 2`` (gloo on the CPU), per rank.

With ``--setup-memory`` and several sizes (``--synthetic-pairs 30000 300000 1000000``), only the training
setup is measured, ``--repeats`` times per size: the peak RSS of a process that maps the cached data,
builds the training loader as the trainer does and draws one epoch's batches (hashed, so two versions of
the code can be shown to make the same batches). Its cost per pair is the slope of the median peak RSS
between sizes.

With ``--train-memory`` and several sizes, ``--repeats`` whole ``python train.py`` runs per size, each
``--train-steps`` steps to its end (validation, checkpoints, the final beam search on valid and test), from a
cache prepared first: the peak RSS of the process (the kernel's ``VmHWM``), and from ``/proc`` sampled
every 20 ms the split at the sampled peak into anonymous and file-backed pages, the largest of each, and (sampled
once a second) the pages of the encoded cache files mapped into the process. Each run's step losses are kept,
so two versions of the code can be shown to train on the same batches.

The model and optimizer's share of the RSS is estimated from the parameter count in the run's log
(weights, gradients and AdamW's two moments: 16 bytes a parameter).

Linux only: memory is read from ``/proc``.

Not done here: assertions (a benchmark reports), training to a score.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from nmt.common.entry_point import fail
from nmt.data.corpora import Multi30k
from nmt.data.text import iter_pairs
from nmt_tools.cli import TEST_SPLIT

MIB = 1 << 20
BYTES_PER_PARAMETER = 16  # fp32 weights, gradients, AdamW's exp_avg and exp_avg_sq


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``scale`` mode's options."""
    parser.add_argument("--synthetic-pairs", type=int, nargs="+", default=[30_000],
                        help="training pairs to generate (N); several sizes go with --setup-memory")
    parser.add_argument("--noise", type=float, default=0.1, help="chance that a word is replaced (and one always is)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the resampling and the noise")
    parser.add_argument("--mirror", default=os.environ.get("NMT_DATA_MIRROR"),
                        help="corpus mirror holding multi30k/ (default: $NMT_DATA_MIRROR)")
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "nmt_scale",
                        help="where the corpus, the caches and the runs go (default: <system temp>/nmt_scale)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--train-steps", type=int, default=10, help="optimizer steps before the memory is read")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1], choices=[1, 2],
                        help="1: python train.py; 2: torchrun --nproc_per_node 2 (gloo); e.g. --ranks 1 2")
    parser.add_argument("--device", default="cpu", help="trainer.device of the training runs")
    parser.add_argument("--train-overrides", nargs="*", default=[], help="more train.py overrides, e.g. model=small")
    parser.add_argument("--skip-train", action="store_true", help="measure preparation only")
    parser.add_argument("--setup-memory", action="store_true",
                        help="measure only the training setup's peak RSS per size, and its bytes per pair")
    parser.add_argument("--train-memory", action="store_true",
                        help="per size, the peak RSS of whole train.py runs of --train-steps steps (anonymous and "
                             "file-backed), and its growth between sizes")
    parser.add_argument("--repeats", type=int, default=3,
                        help="setup-memory processes, or train-memory runs, per size (median)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds a child process may take")


# -- the corpus -----------------------------------------------------------------------------------


def _noisy(words: list[str], vocabulary: list[str], noise: float, rng: random.Random) -> str:
    """``words`` with each replaced by a random vocabulary word with probability ``noise``, and one always."""
    words = [rng.choice(vocabulary) if rng.random() < noise else w for w in words]
    if words:
        words[rng.randrange(len(words))] = rng.choice(vocabulary)
    return " ".join(words)


def synthetic_corpus(mirror: Path, pairs: int, noise: float, seed: int, root: Path) -> dict[str, dict[str, str]]:
    """A ``data.files`` mapping: ``train``, ``pairs`` noisy Multi30k pairs (de-en); ``valid``, ``test``: the real ones.

    The folder ``root/corpus_<pairs>_<noise>_<seed>`` is reused when complete (its ``done`` file).
    """
    corpus = Multi30k(root / "multi30k", mirror=mirror)
    folder = root / f"corpus_{pairs}_{noise}_{seed}"
    files = {"train": {"src": str(folder / "train.de"), "tgt": str(folder / "train.en")}}
    for split, name in (("valid", "val"), ("test", TEST_SPLIT)):
        src, tgt = corpus.split_files(name, "de", "en")
        files[split] = {"src": str(src), "tgt": str(tgt)}
    if (folder / "done").is_file():
        return files
    text = list(iter_pairs("train", *corpus.split_files("train", "de", "en")))
    src_words, tgt_words = ([pair[index].split() for pair in text] for index in (0, 1))
    vocabulary = [sorted({w for line in side for w in line}) for side in (src_words, tgt_words)]
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    src, tgt = (open(files["train"][side], "w", encoding="utf-8") for side in ("src", "tgt"))
    with src, tgt:
        for start in range(0, pairs, 10_000):  # in chunks: 4.5M pairs never sit in memory
            rows = [rng.randrange(len(text)) for _ in range(min(10_000, pairs - start))]
            src.write("".join(_noisy(src_words[i], vocabulary[0], noise, rng) + "\n" for i in rows))
            tgt.write("".join(_noisy(tgt_words[i], vocabulary[1], noise, rng) + "\n" for i in rows))
    (folder / "done").write_text(f"{pairs}\n")
    return files


# -- child processes and their memory -----------------------------------------------------------------

# Runs in a fresh interpreter: prepare, plan one epoch, report seconds and memory as one JSON line.
_PREPARE_CHILD = """
import json, resource, sys, time
start = time.perf_counter()
from nmt.data import TokenBucketSampler, prepare_data
imported = time.perf_counter()
cfg = json.loads(sys.argv[1])
data = prepare_data(cfg, cache_dir=sys.argv[2])
prepared = time.perf_counter()
TokenBucketSampler.from_split(data.train, cfg["max_tokens"], shuffle=True).epoch_plan(0)
planned = time.perf_counter()
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
print(json.dumps({"seconds": prepared - imported, "import_seconds": imported - start,
                  "sampler_epoch_seconds": planned - prepared, "pairs": len(data.train),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "rss_mb": int(status["VmRSS"].split()[0]) / 1024, "stages_seconds": data.stats["seconds"],
                  "encoded_cache_hits": data.stats["encoded_cache_hits"], "clean": data.stats["clean"],
                  "fingerprint": data.fingerprint}))
"""


# Runs in a fresh interpreter on a cached split: the training setup (data, loader, one epoch's batches).
_SETUP_CHILD = """
import hashlib, json, sys
import numpy as np
from nmt.data import build_loader, prepare_data
cfg = json.loads(sys.argv[1])
data = prepare_data(cfg, cache_dir=sys.argv[2])
sampler = build_loader(data.train, cfg["max_tokens"], shuffle=True, seed=0).batch_sampler  # as the trainer's
digest, batches = hashlib.sha256(), 0
for indices in sampler:
    digest.update(np.asarray(indices, np.int64).tobytes())
    batches += 1
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
mib = {key: int(status[key].split()[0]) / 1024 for key in ("VmHWM", "VmRSS", "RssAnon", "RssFile")}
print(json.dumps({"pairs": len(data.train), "batches": batches, "batches_sha256": digest.hexdigest(),
                  "encoded_cache_hits": data.stats["encoded_cache_hits"], "peak_rss_mb": mib["VmHWM"],
                  "rss_mb": mib["VmRSS"], "rss_anon_mb": mib["RssAnon"], "rss_file_mb": mib["RssFile"]}))
"""


def _child_env(project_dir: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(project_dir), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def measure_prepare(data_cfg: dict[str, Any], cache: Path, timeout: float, project_dir: Path,
                    child: str = _PREPARE_CHILD) -> dict[str, Any]:
    """``prepare_data`` in a child process: its report (``_PREPARE_CHILD``, or ``child``) plus the wall time from its
    start."""
    start = time.perf_counter()
    # In the project dir: ``python -c`` puts the working directory first on the path, before PYTHONPATH.
    done = subprocess.run([sys.executable, "-c", child, json.dumps(data_cfg), str(cache)], cwd=project_dir,
                          env=_child_env(project_dir), capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"prepare_data failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return {**report, "process_seconds": time.perf_counter() - start}


def process_memory(pid: int) -> dict[str, float]:
    """``/proc``'s view of a process, in MiB: RSS (anonymous + file-backed + shared memory) and PSS."""
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                fields[name] = int(value.split()[0]) / 1024
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Pss:"):
                fields["Pss"] = int(line.split()[1]) / 1024
    return {"rss_mb": fields["VmRSS"], "peak_rss_mb": fields["VmHWM"], "rss_anon_mb": fields["RssAnon"],
            "rss_file_mb": fields["RssFile"], "rss_shmem_mb": fields["RssShmem"], "pss_mb": fields.get("Pss", 0.0)}


def descendants(pid: int) -> list[int]:
    """The process ids below ``pid`` (children, grandchildren, ...), from ``/proc``."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def _python_workers(pid: int, ranks: int) -> list[int]:
    """The training processes: ``pid`` itself, or under torchrun the Python children of its launcher."""
    if ranks == 1:
        return [pid]
    return [p for p in descendants(pid) if b"train.py" in Path(f"/proc/{p}/cmdline").read_bytes()]


def measure_training(command: list[str], run_dir: Path, steps: int, ranks: int, timeout: float,
                     project_dir: Path) -> dict[str, Any]:
    """Start ``command`` (a ``train.py`` run), time its first optimizer step, read its memory after ``steps``.

    The run is killed (with every process it started) once the memory is read.
    """
    log_path = run_dir / "train_log.jsonl"
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=project_dir, env=_child_env(project_dir), start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first_step, report = None, {}
    try:
        while process.poll() is None and time.perf_counter() - start < timeout:
            done = log_path.read_text().count("\n") if log_path.exists() else 0
            if done and first_step is None:
                first_step = time.perf_counter() - start
            if done >= steps:
                report = {"ranks": [process_memory(pid) for pid in _python_workers(process.pid, ranks)]}
                break
            time.sleep(0.05)
    finally:
        for pid in [*descendants(process.pid), process.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, stderr = process.communicate()
    if not report:
        raise RuntimeError(f"{' '.join(command)} stopped before step {steps} (exit {process.returncode}): "
                           f"{stderr.strip()[-2000:]}")
    log = run_dir / "train.log"  # "training additive: 12345678 parameters, ..."
    found = re.search(r"(\d+) parameters", log.read_text()) if log.exists() else None
    parameters = int(found.group(1)) if found else None
    return {"first_step_seconds": first_step, "steps": steps, **report, "parameters": parameters,
            "model_optimizer_mb_estimate": parameters * BYTES_PER_PARAMETER / MIB if parameters else None}


def _sample(pid: int, keys: tuple[str, ...] = ("VmRSS", "VmHWM", "RssAnon", "RssFile")) -> dict[str, float]:
    """``keys`` of ``/proc/<pid>/status``, in MiB."""
    with open(f"/proc/{pid}/status") as status:
        fields = dict(line.split(":", 1) for line in status if ":" in line)
    return {key: int(fields[key].split()[0]) / 1024 for key in keys}


def mapped_mib(pid: int, marker: str) -> float:
    """The RSS of ``pid``'s mappings of files whose path holds ``marker`` (``/proc/<pid>/smaps``), in MiB."""
    total, name = 0, ""
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            head = line.split(maxsplit=5)
            if "-" in head[0] and not head[0].endswith(":"):  # a mapping's first line: address range, ..., path
                name = head[5] if len(head) > 5 else ""
            elif head[0] == "Rss:" and marker in name:
                total += int(head[1])
    return total / 1024


def measure_training_memory(command: list[str], run_dir: Path, timeout: float, project_dir: Path,
                            interval: float = 0.02) -> dict[str, Any]:
    """Run ``command`` (a ``train.py`` run) to its end: its peak RSS and how it splits, its step losses.

    ``peak_rss_mb`` is the kernel's peak (``VmHWM``, last read before the process ends; ``ru_maxrss`` would count the
    fork of this process it started as); ``at_peak`` the sample with the most RSS (every ``interval`` s), split into
    anonymous and file-backed pages; ``encoded_maps_mb`` the most RSS seen (once a
    second) in mappings of the encoded cache files.
    """
    output = run_dir.with_name(run_dir.name + ".out")
    start, samples, maps, last_maps = time.perf_counter(), [], 0.0, 0.0
    with open(output, "w") as out:
        process = subprocess.Popen(command, cwd=project_dir, env=_child_env(project_dir), stdout=out,
                                   stderr=subprocess.STDOUT)
    try:
        while True:
            pid, status, _ = os.wait4(process.pid, os.WNOHANG)
            if pid:
                process.returncode = os.waitstatus_to_exitcode(status)
                break
            if time.perf_counter() - start > timeout:
                raise RuntimeError(f"{' '.join(command)} ran past {timeout:.0f} s")
            try:
                samples.append(_sample(process.pid))
                if time.perf_counter() - last_maps >= 1.0:
                    maps = max(maps, mapped_mib(process.pid, f"{os.sep}encoded{os.sep}"))
                    last_maps = time.perf_counter()
            except (OSError, KeyError, ValueError, IndexError):  # the process is leaving
                pass
            time.sleep(interval)
    finally:
        if process.returncode is None:
            process.kill()
            process.wait()
    if process.returncode != 0 or not samples:
        raise RuntimeError(f"{' '.join(command)} failed (exit {process.returncode}): "
                           f"{output.read_text()[-2000:].strip()}")
    peak = max(samples, key=lambda sample: sample["VmRSS"])
    log = run_dir / "train_log.jsonl"
    losses = [json.loads(line)["loss"] for line in log.read_text().splitlines()] if log.exists() else []
    return {"seconds": time.perf_counter() - start, "peak_rss_mb": max(s["VmHWM"] for s in samples),
            "at_peak": {"rss_mb": peak["VmRSS"], "rss_anon_mb": peak["RssAnon"], "rss_file_mb": peak["RssFile"]},
            "max_rss_anon_mb": max(s["RssAnon"] for s in samples),
            "max_rss_file_mb": max(s["RssFile"] for s in samples), "encoded_maps_mb": maps, "losses": losses}


# -- the benchmark ----------------------------------------------------------------------------------


def train_command(files: dict[str, Any], cache: Path, run_dir: Path, args: argparse.Namespace, ranks: int,
                  max_steps: int | None = None) -> list[str]:
    """``python train.py`` (or ``torchrun --nproc_per_node 2 train.py``) on the synthetic corpus, ``max_steps`` steps
    (default: 50 more than ``--train-steps``, so that a run is stopped while it trains)."""
    launcher = [sys.executable] if ranks == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
    files_value = "{" + ",".join(f"{split}:{{src:'{f['src']}',tgt:'{f['tgt']}'}}" for split, f in files.items()) + "}"
    return [*launcher, str(args.project_dir / "train.py"), "data=files", f"data.files={files_value}",
            "data.valid_split=valid", "data.test_splits=[test]", f"data.cache_dir={cache}",
            f"data.tokenizer.vocab_size={args.vocab_size}", f"trainer.device={args.device}",
            f"trainer.max_steps={max_steps or args.train_steps + 50}", f"hydra.run.dir={run_dir}",
            *args.train_overrides]


def files_data_config(files: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """configs/data/files.yaml with the synthetic corpus's ``files`` and ``--vocab-size``."""
    data_cfg = OmegaConf.to_container(OmegaConf.load(args.project_dir / "configs/data/files.yaml"), resolve=True)
    data_cfg.update(files=files, valid_split="valid", test_splits=["test"])
    data_cfg["tokenizer"]["vocab_size"] = args.vocab_size
    return data_cfg


def benchmark_setup_memory(args: argparse.Namespace) -> dict[str, Any]:
    """``--setup-memory``: per size, the median of ``--repeats`` setup processes (``_SETUP_CHILD``) on a cache
    prepared first; then the bytes per pair between consecutive sizes and between the first and the last."""
    sizes = []
    for n in args.synthetic_pairs:
        data_cfg = files_data_config(synthetic_corpus(Path(args.mirror), n, args.noise, args.seed, args.work_dir), args)
        with tempfile.TemporaryDirectory(prefix=f"cache_{n}_", dir=args.work_dir) as cache_dir:
            measure_prepare(data_cfg, Path(cache_dir), args.timeout, args.project_dir)  # cold: fills the cache
            runs = [measure_prepare(data_cfg, Path(cache_dir), args.timeout, args.project_dir, _SETUP_CHILD)
                    for _ in range(args.repeats)]
        medians = {key: statistics.median(run[key] for run in runs) for key in ("peak_rss_mb", "rss_mb")}
        sizes.append({"requested_pairs": n, **{k: runs[0][k] for k in ("pairs", "batches", "batches_sha256")},
                      **medians, "runs": runs})
        print(f"{runs[0]['pairs']:,} pairs: setup peak RSS {medians['peak_rss_mb']:.1f} MiB (median of "
              f"{len(runs)}), {runs[0]['batches']} batches, sha256 {runs[0]['batches_sha256'][:16]}", flush=True)
    steps = [*zip(sizes, sizes[1:]), *([(sizes[0], sizes[-1])] if len(sizes) > 2 else [])]
    per_pair = {f"{a['pairs']}-{b['pairs']}": (b["peak_rss_mb"] - a["peak_rss_mb"]) * MIB / (b["pairs"] - a["pairs"])
                for a, b in steps}
    for between, cost in per_pair.items():
        print(f"{between} pairs: {cost:.1f} bytes per pair", flush=True)
    return {"noise": args.noise, "seed": args.seed, "repeats": args.repeats, "setup_memory": sizes,
            "bytes_per_pair": per_pair}


def benchmark_training_memory(args: argparse.Namespace) -> dict[str, Any]:
    """``--train-memory``: per size, ``--repeats`` whole ``train.py`` runs of ``--train-steps`` steps on a cache
    prepared first (``measure_training_memory``); then the growth of the median peak RSS between consecutive sizes
    and between the first and the last."""
    sizes = []
    for n in args.synthetic_pairs:
        files = synthetic_corpus(Path(args.mirror), n, args.noise, args.seed, args.work_dir)
        with tempfile.TemporaryDirectory(prefix=f"cache_{n}_", dir=args.work_dir) as cache_dir:
            cache = Path(cache_dir)
            prepared = measure_prepare(files_data_config(files, args), cache, args.timeout, args.project_dir)
            runs = []
            for repeat in range(args.repeats):
                run_dir = cache / f"run_{repeat}"
                command = train_command(files, cache, run_dir, args, 1, max_steps=args.train_steps)
                runs.append(measure_training_memory(command, run_dir, args.timeout, args.project_dir))
                peak = runs[-1]["at_peak"]
                print(f"{prepared['pairs']:,} pairs, run {repeat + 1}: peak RSS {runs[-1]['peak_rss_mb']:.0f} MiB "
                      f"(sampled: anonymous {peak['rss_anon_mb']:.0f}, file-backed {peak['rss_file_mb']:.0f}; encoded "
                      f"cache mapped {runs[-1]['encoded_maps_mb']:.1f}) in {runs[-1]['seconds']:.0f} s", flush=True)
        median = statistics.median(run["peak_rss_mb"] for run in runs)
        sizes.append({"requested_pairs": n, "pairs": prepared["pairs"], "peak_rss_mb": median, "runs": runs})
    steps = [*zip(sizes, sizes[1:]), *([(sizes[0], sizes[-1])] if len(sizes) > 2 else [])]
    growth = {f"{a['pairs']}-{b['pairs']}": b["peak_rss_mb"] - a["peak_rss_mb"] for a, b in steps}
    for between, mib in growth.items():
        print(f"{between} pairs: peak RSS {mib:+.1f} MiB (medians)", flush=True)
    return {"noise": args.noise, "seed": args.seed, "repeats": args.repeats, "train_steps": args.train_steps,
            "train_overrides": args.train_overrides, "train_memory": sizes, "peak_rss_growth_mb": growth}


def benchmark_scale(args: argparse.Namespace) -> tuple[dict[str, Any], torch.device]:
    """The ``scale`` mode: corpus, cold and cached preparation, training start and memory; prints a summary.
    With ``--setup-memory``: the training setup's memory per size only."""
    if not args.mirror:
        fail("benchmark.py scale", "no corpus mirror; set NMT_DATA_MIRROR or pass --mirror")
    if args.setup_memory and args.train_memory:
        fail("benchmark.py scale", "--setup-memory and --train-memory are two benchmarks; give one")
    if args.setup_memory:
        return benchmark_setup_memory(args), torch.device("cpu")
    if args.train_memory:
        return benchmark_training_memory(args), torch.device(args.device if args.device != "auto" else "cpu")
    if len(args.synthetic_pairs) != 1:
        fail("benchmark.py scale", "several --synthetic-pairs sizes go with --setup-memory or --train-memory; "
             "give one size")
    root, n = args.work_dir, args.synthetic_pairs[0]
    start = time.perf_counter()
    files = synthetic_corpus(Path(args.mirror), n, args.noise, args.seed, root)
    generate_seconds = time.perf_counter() - start
    data_cfg = files_data_config(files, args)
    with tempfile.TemporaryDirectory(prefix=f"cache_{n}_", dir=root) as cache_dir:
        cache = Path(cache_dir)
        cold = measure_prepare(data_cfg, cache, args.timeout, args.project_dir)
        cached = measure_prepare(data_cfg, cache, args.timeout, args.project_dir)
        print(f"{n:,} pairs: prepare cold {cold['seconds']:.1f} s (peak RSS {cold['peak_rss_mb']:.0f} MiB), cached "
              f"{cached['seconds']:.2f} s (RSS {cached['rss_mb']:.0f} MiB), epoch plan "
              f"{cached['sampler_epoch_seconds']:.2f} s", flush=True)
        training = {}
        for ranks in [] if args.skip_train else args.ranks:
            run_dir = Path(tempfile.mkdtemp(prefix=f"run_{n}_{ranks}rank_", dir=root))
            training[f"{ranks}_rank"] = run = measure_training(
                train_command(files, cache, run_dir, args, ranks), run_dir, args.train_steps, ranks, args.timeout,
                args.project_dir)
            rss, pss = (", ".join(f"{r[key]:.0f}" for r in run["ranks"]) for key in ("rss_mb", "pss_mb"))
            print(f"train.py x{ranks}: first step after {run['first_step_seconds']:.1f} s; after {args.train_steps} "
                  f"steps RSS {rss} MiB (PSS {pss})", flush=True)
    report = {"pairs": n, "noise": args.noise, "seed": args.seed, "corpus": files["train"],
              "generate_seconds": round(generate_seconds, 2), "prepare_cold": cold, "prepare_cached": cached,
              "training": training}
    return report, torch.device(args.device if args.device != "auto" else "cpu")
