"""Translation speed: sentences per second for greedy and beam search with a trained checkpoint.

    python scripts/benchmark_translate.py --checkpoint outputs/RUN_DIR            # greedy + beam 5, 3 reps
    python scripts/benchmark_translate.py --checkpoint RUN --reps 5 --device cpu --beam-sizes 1 5 10

Input: Multi30k test_2016_flickr (1000 sentences) in the checkpoint's source language, read from
``$NMT_DATA_MIRROR/multi30k/test_2016_flickr.<src>.gz`` unless ``--input`` says otherwise; with the
matching reference next to it, BLEU and chrF are recorded too, so speed and quality sit side by side.

Each rep times ``Translator.translate`` (encode, batch, search) plus detokenization of the whole file, after
one untimed warm-up run per setting; the reported speed is the median over reps. The result is printed
and written as JSON (device, versions, config, date, command) to
``docs/results/translate_benchmark_<device>.json`` (``<device>``: ``cpu`` or ``cuda-<gpu name>``).

Not a test: timings never go into the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # run as a script from anywhere, without installing the package

from nmt.device import PRECISIONS, uses_bf16  # noqa: E402
from nmt.evaluation import corpus_scores  # noqa: E402
from nmt.provenance import device_name, device_slug, provenance  # noqa: E402
from nmt.translation import read_input_lines  # noqa: E402
from nmt.translator import Translator  # noqa: E402

SPLIT = "test_2016_flickr"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="run dir or .pt file written by train.py")
    parser.add_argument("--input", default=None,
                        help=f"source file (default: $NMT_DATA_MIRROR/multi30k/{SPLIT}.<src>.gz)")
    parser.add_argument("--reference", default=None,
                        help="reference file for BLEU/chrF (default: the mirror's target side, if present)")
    parser.add_argument("--reps", type=int, default=3, help="timed runs per setting; the median is reported")
    parser.add_argument("--beam-sizes", type=int, nargs="+", default=[1, 5], help="1 = greedy")
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--max-len", type=int, default=200)
    parser.add_argument("--max-len-ratio", type=float, default=2.0)
    parser.add_argument("--length-penalty", type=float, default=1.0)
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--precision", default="auto", choices=PRECISIONS,
                        help="auto (bf16 autocast on CUDA, fp32 on CPU) | bf16 | fp32 (translate.py's precision)")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N sentences (smoke runs)")
    parser.add_argument("--out", default=None,
                        help="JSON path (default: docs/results/translate_benchmark_<device>.json)")
    return parser.parse_args(argv)


def default_paths(train_cfg: dict[str, Any]) -> tuple[Path, Path | None]:
    data = train_cfg.get("data") or {}
    src, tgt = data.get("src_lang", "de"), data.get("tgt_lang", "en")
    mirror = os.environ.get("NMT_DATA_MIRROR")
    if not mirror:
        raise SystemExit("NMT_DATA_MIRROR is not set; pass --input (and --reference) explicitly")
    folder = Path(mirror) / "multi30k"
    ref = folder / f"{SPLIT}.{tgt}.gz"
    return folder / f"{SPLIT}.{src}.gz", ref if ref.is_file() else None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    translator = Translator.from_checkpoint(args.checkpoint, args.device, args.precision, max_input_words=None)
    device, train_cfg = translator.device, translator.configs[0]
    if args.input:
        src_path, ref_path = Path(args.input), None
    else:
        src_path, ref_path = default_paths(train_cfg)
    if args.reference:
        ref_path = Path(args.reference)
    lines = read_input_lines(src_path)
    refs = read_input_lines(ref_path) if ref_path else None
    if args.limit:
        lines = lines[: args.limit]
        refs = refs[: args.limit] if refs else None

    results = []
    for beam in args.beam_sizes:
        options = dict(beam_size=beam, length_penalty=args.length_penalty, max_len=args.max_len,
                       max_len_ratio=args.max_len_ratio, batch_tokens=args.batch_tokens)
        translator.translate(lines[:64], **options)  # warm-up: allocator, kernels, caches
        times, hyps = [], []
        for _ in range(args.reps):
            sync(device)
            start = time.perf_counter()
            hyps = [result.text for result in translator.translate(lines, **options)]
            sync(device)
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        row: dict[str, Any] = {
            "mode": "greedy" if beam == 1 else f"beam{beam}",
            "beam_size": beam,
            "sentences": len(lines),
            "sentences_per_s": len(lines) / median,
            "seconds_median": median,
            "seconds_all": times,
        }
        if refs is not None:
            scores = corpus_scores(hyps, refs)
            row.update(bleu=scores["bleu"], chrf=scores["chrf"], bleu_signature=scores["bleu_signature"])
        results.append(row)
        quality = f", BLEU {row['bleu']:.2f}" if "bleu" in row else ""
        print(f"{row['mode']:>8}: {row['sentences_per_s']:8.1f} sentences/s "
              f"(median of {args.reps}: {median:.2f} s for {len(lines)} sentences{quality})", flush=True)

    report = {
        "benchmark": "translate",
        **provenance("scripts/benchmark_translate.py", argv),
        "device": {"type": device.type, "name": device_name(device)},
        "config": {
            "checkpoint": str(args.checkpoint),
            "input": str(src_path),
            "reference": str(ref_path) if ref_path else None,
            "sentences": len(lines),
            "reps": args.reps,
            "batch_tokens": args.batch_tokens,
            "max_len": args.max_len,
            "max_len_ratio": args.max_len_ratio,
            "length_penalty": args.length_penalty,
            "precision": args.precision,
            "bf16_autocast": uses_bf16(args.precision, device),
            "model": train_cfg.get("model"),
            "attention": train_cfg.get("attention"),
            "direction": "{src_lang}-{tgt_lang}".format_map(
                {"src_lang": "?", "tgt_lang": "?", **(train_cfg.get("data") or {})}
            ),
        },
        "results": results,
    }
    default_out = REPO_ROOT / "docs" / "results" / f"translate_benchmark_{device_slug(device)}.json"
    out_path = Path(args.out) if args.out else default_out
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out_path}")
    return report


if __name__ == "__main__":
    main()
