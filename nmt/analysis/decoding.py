"""Choose beam size and length penalty on the validation split: BLEU, chrF and length per setting.

    python scripts/tune_decoding.py outputs/RUN                       # val; beams 1 5 10, α 0 0.6 1 1.4
    python scripts/tune_decoding.py outputs/RUN --beam-sizes 5 --length-penalties 0 0.5 1 1.5 2
    python scripts/tune_decoding.py outputs/RUN --test-split test_2016_flickr --out runs/decoding
    python scripts/tune_decoding.py outputs/RUN_A --checkpoint outputs/RUN_A outputs/RUN_B   # an ensemble

Every (beam, GNMT α) setting (greedy once: α does not change it) translates the tuning split (default:
the run's validation split) with the run's best checkpoint (or ``--checkpoint``: several make one
ensemble; the first member's config sets the splits and limits); each is scored with
cased sacreBLEU BLEU and chrF, the length ratio (output / reference 13a tokens: below 1 the brevity
penalty bites) and the speed. The best is the highest BLEU. With ``--test-split``, the best and the
run's own setting (``trainer.test_beam_size``, ``trainer.length_penalty``) are scored once on that
split: choosing on test would overstate the gain. The run's training config sets the length limits.

Writes ``<out>.md`` (printed too) and ``<out>.json``; ``<out>`` defaults to ``<run_dir>/decoding_grid``.

Not done here: training, checkpoint averaging, or timings worth quoting (``scripts/benchmark.py
translate`` repeats and takes medians; this times each setting once).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nmt.analysis.cli import one_line_errors, parser, write_report
from nmt.common.device import INFERENCE_PRECISIONS, uses_bf16
from nmt.common.metrics import corpus_scores
from nmt.common.provenance import device_name, provenance
from nmt.data import prepare_data
from nmt.inference.engine import SearchOptions, Translator
from nmt.model.checkpoint import resolve_checkpoint


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("run_dir", type=Path, help="run dir written by train.py (outputs go here by default)")
    p.add_argument("--checkpoint", nargs="+",
                   help="checkpoint files or run dirs to decode with, several: one ensemble (default: the run's best)")
    p.add_argument("--split", help="split to tune on (default: the run's validation split)")
    p.add_argument("--test-split", help="after choosing, score the chosen and the run's own setting once on this")
    p.add_argument("--beam-sizes", type=int, nargs="+", default=[1, 5, 10], help="1 = greedy")
    p.add_argument("--length-penalties", type=float, nargs="+", default=[0.0, 0.6, 1.0, 1.4],
                   help="GNMT alpha values (beam only; 0 = raw log-probability)")
    p.add_argument("--batch-tokens", type=int, default=4096, help="padded source tokens per batch")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--precision", default="auto", choices=INFERENCE_PRECISIONS,
                   help="auto (bf16 autocast on CUDA, as train.py's final test; fp32 on CPU) | bf16 | fp32")
    p.add_argument("--out", type=Path, help="output path without extension (default: <run_dir>/decoding_grid)")
    args = p.parse_args(argv)
    bad = [b for b in args.beam_sizes if b < 1] or [a for a in args.length_penalties if a < 0]
    if bad:
        p.error(f"beam sizes must be >= 1 and length penalties >= 0; got {bad}")
    return args


def grid(beam_sizes: Sequence[int], length_penalties: Sequence[float]) -> list[tuple[int, float]]:
    """(beam, α) settings in order, without repeats; greedy (beam 1) once, with α = 0."""
    return list(dict.fromkeys((beam, 0.0 if beam == 1 else alpha) for beam in beam_sizes for alpha in length_penalties))


def score_setting(translator: Translator, src_ids: list[list[int]], refs: list[str], options: SearchOptions
                  ) -> dict[str, Any]:
    """Translate one encoded split with one setting and score it."""
    start = time.perf_counter()
    results = translator.translate_ids(src_ids, options, attention=False)  # only the tokens are scored
    hyps = [translator.tokenizer.decode_tgt(best[0].tokens) for best in results]
    seconds = time.perf_counter() - start
    return {"beam_size": options.beam_size, "length_penalty": options.length_penalty,
            **corpus_scores(hyps, refs), "seconds": seconds, "sentences_per_s": len(refs) / seconds}


def render_markdown(report: dict[str, Any]) -> str:
    """The grid (best in bold), the choice, and the test scores."""
    best, own = report["best"], report["run_setting"]
    lines = [
        f"# Decoding settings: {report['run_dir']}", "",
        f"Checkpoint `{report['checkpoint']}`, tuned on `{report['split']}` ({report['sentences']} sentences), "
        f"device {report['device']} ({'bf16 autocast' if report['bf16_autocast'] else 'float32'}), {report['date']}.",
        f"BLEU: `{report['bleu_signature']}`; chrF: `{report['chrf_signature']}`.",
        "Length ratio: output / reference length (13a tokens); below 1 the brevity penalty applies.", "",
        "| beam | α | BLEU | chrF2 | length ratio | sentences/s |", "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in report["grid"]:
        mark = "**" if (row["beam_size"], row["length_penalty"]) == (best["beam_size"], best["length_penalty"]) else ""
        lines.append(f"| {row['beam_size']} | {row['length_penalty']:g} | {mark}{row['bleu']:.2f}{mark} | "
                     f"{row['chrf']:.2f} | {row['length_ratio']:.3f} | {row['sentences_per_s']:.1f} |")
    lines += ["", f"Best on `{report['split']}`: beam {best['beam_size']}, α = {best['length_penalty']:g} "
                  f"(BLEU {best['bleu']:.2f}); the run's own setting: beam {own['beam_size']}, "
                  f"α = {own['length_penalty']:g}."]
    if report["test"]:
        lines += ["", f"Scored once on `{report['test_split']}`:", "",
                  "| setting | beam | α | BLEU | chrF2 | length ratio |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
        lines += [f"| {name} | {row['beam_size']} | {row['length_penalty']:g} | {row['bleu']:.2f} | "
                  f"{row['chrf']:.2f} | {row['length_ratio']:.3f} |" for name, row in report["test"].items()]
    return "\n".join([*lines, "", f"Command: `{report['command']}`", ""])


def load_splits(cfg: dict[str, Any], split: str, test_split: str | None) -> dict[str, Any]:
    """The tuning and test splits of the run's corpus, by name (refusing to tune on the test split)."""
    data_cfg = dict(cfg["data"])
    if split == test_split:
        raise SystemExit(f"--split and --test-split are both {split!r}: tune on another split than you report")
    if split in (data_cfg.get("test_splits") or []):
        print(f"warning: tuning on {split!r}, one of the run's test splits: its score will overstate what the "
              f"chosen setting gives on unseen text; tune on {data_cfg['valid_split']!r} instead", file=sys.stderr)
    wanted = [s for s in (split, test_split) if s and s != data_cfg["valid_split"]]
    data_cfg["test_splits"] = list(dict.fromkeys([*(data_cfg.get("test_splits") or []), *wanted]))
    data = prepare_data(data_cfg)
    return {data_cfg["valid_split"]: data.valid, **data.tests}


@one_line_errors("tune_decoding.py")
def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Decode the grid, choose, score on test, write the report; returns it."""
    args = parse_args(argv)
    run_dir = args.run_dir.resolve()
    checkpoints = [resolve_checkpoint(path) for path in args.checkpoint or [run_dir]]
    # no input-length cut: the scores are comparable to those train.py reports
    translator = Translator.from_checkpoint(checkpoints, args.device, args.precision, max_input_words=None)
    cfg, t = translator.configs[0], translator.configs[0]["trainer"]
    split = args.split or cfg["data"]["valid_split"]
    splits = load_splits(cfg, split, args.test_split)
    # Encoded with the checkpoint's own tokenizer (prepare_data's cache could hold another one), once per split.
    src_ids = {name: translator.encode(list(splits[name].src_text)) for name in (split, args.test_split) if name}

    def run(name: str, beam: int, alpha: float) -> dict[str, Any]:
        options = SearchOptions(beam_size=beam, length_penalty=alpha, batch_tokens=args.batch_tokens)
        row = score_setting(translator, src_ids[name], list(splits[name].tgt_text), options)
        print(f"{name}: beam {beam:2d}  α {alpha:<4g} BLEU {row['bleu']:6.2f}  chrF {row['chrf']:6.2f}  "
              f"length ratio {row['length_ratio']:.3f}  {row['sentences_per_s']:.1f} sent/s", flush=True)
        return row

    rows = [run(split, beam, alpha) for beam, alpha in grid(args.beam_sizes, args.length_penalties)]
    best = max(rows, key=lambda row: row["bleu"])
    own = {"beam_size": t["test_beam_size"], "length_penalty": t["length_penalty"]}
    test: dict[str, Any] = {}
    if args.test_split:
        test["chosen on " + split] = run(args.test_split, best["beam_size"], best["length_penalty"])
        if (own["beam_size"], own["length_penalty"]) != (best["beam_size"], best["length_penalty"]):
            test["the run's own"] = run(args.test_split, own["beam_size"], own["length_penalty"])
    report = {
        "run_dir": str(run_dir), "checkpoint": ", ".join(map(str, checkpoints)), "attention": cfg["attention"]["name"],
        "split": split, "sentences": len(splits[split]), "grid": rows, "best": best, "run_setting": own,
        "test_split": args.test_split, "test": test, "bleu_signature": rows[0]["bleu_signature"],
        "chrf_signature": rows[0]["chrf_signature"], "device": device_name(translator.device),
        "precision": args.precision, "bf16_autocast": uses_bf16(args.precision, translator.device),
        **provenance("scripts/tune_decoding.py", argv),
    }
    markdown = render_markdown(report)
    print(markdown)
    write_report(args.out or run_dir / "decoding_grid", report, markdown)
    return report
