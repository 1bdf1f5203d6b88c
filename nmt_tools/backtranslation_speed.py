"""``benchmark.py backtranslate``: back-translation speed in sentences/s, beam search against sampling.

The real job, once per method: ``nmt.inference.backtranslation.backtranslate`` on the config
``backtranslate.py`` composes (``configs/backtranslate.yaml`` plus ``--set`` overrides, and ``--cuda-graphs`` as
its ``cuda_graphs=``), over the first
``--limit`` lines of the input, into a scratch folder. One untimed warm-up job of ``--warmup`` lines
runs first. The figure is the job's own clock over its chunk loop: reading, searching, writing and
fsyncing included; loading the model and the input's first read (sha256, UTF-8) not. sentences/s
counts the lines translated (empty and over-long lines are skipped, so they are not sentences);
lines/s counts every line.

Not done here: checking the translations, or BLEU (a back-translation has no reference).
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from nmt.common.device import resolve_device
from nmt.common.provenance import device_name
from nmt.inference.backtranslation import backtranslate, iter_input_lines, open_input
from nmt.inference.engine import Translator

METHODS = ("beam", "sample")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``backtranslate`` mode's options."""
    parser.add_argument("--checkpoint", required=True, nargs="+",
                        help="the reverse model: run dir or .pt file written by train.py; several: one ensemble")
    parser.add_argument("--input", default="multi30k_task2", help="monolingual file or registered corpus")
    parser.add_argument("--lang", help="the input's language (default: the model's source language)")
    parser.add_argument("--limit", type=int, default=2000, help="back-translate the first N lines")
    parser.add_argument("--warmup", type=int, default=200, help="lines of the untimed warm-up job")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="backtranslate.py settings, e.g. beam_size=5 top_k=10 device=cuda batch_tokens=8192")
    parser.add_argument("--cuda-graphs", choices=("auto", "true", "false"),
                        help="backtranslate.py's cuda_graphs setting (replayed decoder steps on a GPU); "
                             "default: the job's own")


def compose_job(overrides: list[str], project_dir: Path) -> DictConfig:
    """``project_dir/configs/backtranslate.yaml`` with ``backtranslate.py``-style overrides."""
    with initialize_config_dir(config_dir=str(Path(project_dir, "configs").resolve()), version_base="1.3"):
        return compose(config_name="backtranslate", overrides=list(overrides))


def first_lines(cfg: DictConfig, n: int, dest: Path) -> Path:
    """The input's first ``n`` lines (a registered corpus resolved as the job resolves it) as a file."""
    text = open_input(cfg)
    dest.write_text("".join(line + "\n" for line in itertools.islice(iter_input_lines(text.path, "error"), n)),
                    encoding="utf-8")
    return dest


def benchmark_backtranslation(args: argparse.Namespace) -> tuple[dict[str, Any], torch.device]:
    """Sentences/s of the back-translation job per method, on one machine in one run."""
    checkpoint = args.checkpoint[0] if len(args.checkpoint) == 1 else list(args.checkpoint)
    settings = [*args.set, *([] if args.cuda_graphs is None else [f"cuda_graphs={args.cuda_graphs}"])]
    lang = args.lang or Translator.from_checkpoint(checkpoint, device="cpu").info()["src_lang"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="nmt_bt_benchmark_") as tmp:
        base = compose_job(settings, args.project_dir)
        base.checkpoint, base.input, base.lang, base.output = checkpoint, args.input, lang, os.path.join(tmp, "x")
        source = first_lines(base, args.limit, Path(tmp) / f"input.{lang}")
        warm = first_lines(base, args.warmup, Path(tmp) / f"warmup.{lang}")
        for method in args.methods:
            cfg = compose_job([*settings, f"method={method}"], args.project_dir)
            cfg.checkpoint, cfg.lang, cfg.log_every_s = checkpoint, lang, 1e9
            cfg.input, cfg.output = str(warm), f"{tmp}/warmup_{method}"
            backtranslate(cfg)  # untimed: allocator, kernels, caches
            cfg.input, cfg.output = str(source), f"{tmp}/{method}"
            summary = backtranslate(cfg)
            row = {"method": method, "lines": summary["lines"], "translated": summary["translated"],
                   "seconds": summary["seconds"], "sentences_per_s": summary["sentences_per_s"],
                   "lines_per_s": summary["lines"] / summary["seconds"],
                   "options": {**_options(cfg, method), "max_input_words": summary["max_input_words"]}}
            rows.append(row)
            print(f"{method:>7}: {row['sentences_per_s']:8.1f} sentences/s ({row['translated']} of {row['lines']} "
                  f"lines translated in {row['seconds']:.1f} s)", flush=True)
        device = resolve_device(base.device)
    config = {"checkpoint": checkpoint, "input": args.input, "lang": lang, "limit": args.limit,
              "warmup": args.warmup, "settings": settings, "cuda_graphs": args.cuda_graphs}
    return {"device": {"type": device.type, "name": device_name(device)},
            "measured_without_gpu": device.type != "cuda", "config": config, "results": rows}, device


def _options(cfg: DictConfig, method: str) -> dict[str, Any]:
    keys = ("beam_size", "length_penalty") if method == "beam" else ("temperature", "top_k", "seed")
    return {key: cfg[key] for key in (*keys, "max_len", "max_len_ratio", "batch_tokens", "chunk_lines",
                                      "max_input_words", "device", "precision")}
