"""Choose beam size and length penalty on the validation split: BLEU, chrF and length per setting.

    python scripts/tune_decoding.py outputs/RUN                                  # val; beams 1 5 10, α 0 0.6 1 1.4
    python scripts/tune_decoding.py outputs/RUN --beam-sizes 5 --length-penalties 0 0.5 1 1.5 2
    python scripts/tune_decoding.py outputs/RUN --test-split test_2016_flickr --out docs/results/decoding

Every setting in the grid (beam sizes × GNMT length penalties α; α has no effect on greedy, so beam 1
is decoded once) translates the tuning split (default: the run's validation split) with the run's best
checkpoint (or ``--checkpoint``) and is scored with cased sacreBLEU BLEU and chrF, plus the length
ratio (output words / reference words, after 13a tokenization: below 1 means BLEU's brevity penalty
bites) and the decoding speed. The best setting is the one with the highest BLEU on the tuning split.
With ``--test-split``, that setting and the run's own (``trainer.test_beam_size`` and
``trainer.length_penalty``) are then scored once on the test split: choosing on test would overstate
the gain.

Writes ``<out>.md`` (printed too) and ``<out>.json`` (grid, choice, test scores, checkpoint, device,
versions, date, command). The run's own training config decides the output length limits.

Not done here: training, checkpoint averaging (``trainer.average_last``), or timing runs worth
quoting (``scripts/benchmark_translate.py`` repeats and takes medians; this times each setting once).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # run as a script from anywhere, without installing the package

from nmt.checkpoint import CheckpointError, resolve_checkpoint  # noqa: E402
from nmt.data import DataError, prepare_data  # noqa: E402
from nmt.device import PRECISIONS, uses_bf16  # noqa: E402
from nmt.evaluation import corpus_scores  # noqa: E402
from nmt.provenance import device_name, provenance  # noqa: E402
from nmt.translator import USER_ERRORS, SearchOptions, Translator  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="run dir written by train.py (outputs go here by default)")
    parser.add_argument("--checkpoint", default=None,
                        help="checkpoint file to decode with (default: the run's best checkpoint)")
    parser.add_argument("--split", default=None, help="split to tune on (default: the run's validation split)")
    parser.add_argument("--test-split", default=None,
                        help="after choosing, score the chosen and the run's own setting once on this split")
    parser.add_argument("--beam-sizes", type=int, nargs="+", default=[1, 5, 10], help="1 = greedy")
    parser.add_argument("--length-penalties", type=float, nargs="+", default=[0.0, 0.6, 1.0, 1.4],
                        help="GNMT alpha values (beam only; 0 = raw log-probability)")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="padded source tokens per batch")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--precision", default="auto", choices=PRECISIONS,
                        help="auto (bf16 autocast on CUDA, as train.py's final test; fp32 on CPU) | bf16 | fp32")
    parser.add_argument("--out", type=Path, default=None,
                        help="output path without extension (default: <run_dir>/decoding_grid)")
    args = parser.parse_args(argv)
    bad_beams = [b for b in args.beam_sizes if b < 1]
    bad_alphas = [a for a in args.length_penalties if a < 0]
    if bad_beams or bad_alphas:
        parser.error(f"beam sizes must be >= 1 and length penalties >= 0; got {bad_beams or bad_alphas}")
    return args


def grid(beam_sizes: Sequence[int], length_penalties: Sequence[float]) -> list[tuple[int, float]]:
    """(beam, α) settings in order, without repeats; greedy (beam 1) once, with α = 0."""
    settings = [(beam, 0.0 if beam == 1 else alpha) for beam in beam_sizes for alpha in length_penalties]
    return list(dict.fromkeys(settings))


def score_setting(translator: Translator, src_ids: list[list[int]], refs: list[str], train_cfg: dict,
                  beam: int, alpha: float, batch_tokens: int) -> dict[str, Any]:
    """Translate one split with one (beam, α) and score it."""
    start = time.perf_counter()
    options = SearchOptions(beam_size=beam, length_penalty=alpha, max_len=train_cfg["max_len"],
                            max_len_ratio=train_cfg["max_len_ratio"], batch_tokens=batch_tokens)
    with torch.inference_mode():
        nbest = translator.translate_ids(src_ids, options)
    hyps = [translator.tokenizer.decode_tgt(best[0].tokens) for best in nbest]
    seconds = time.perf_counter() - start
    return {"beam_size": beam, "length_penalty": alpha, **corpus_scores(hyps, refs),
            "seconds": seconds, "sentences_per_s": len(refs) / seconds}


def render_markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Decoding settings: {report['run_dir']}",
        "",
        f"Checkpoint `{report['checkpoint']}`, tuned on `{report['split']}` ({report['sentences']} sentences), "
        f"device {report['device']} ({'bf16 autocast' if report['bf16_autocast'] else 'float32'}), {report['date']}.",
        f"BLEU: `{report['bleu_signature']}`; chrF: `{report['chrf_signature']}`.",
        "Length ratio: output / reference length (13a tokens); below 1 the brevity penalty applies.",
        "",
        "| beam | α | BLEU | chrF2 | length ratio | sentences/s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    best = report["best"]
    for row in report["grid"]:
        mark = "**" if (row["beam_size"], row["length_penalty"]) == (best["beam_size"], best["length_penalty"]) else ""
        lines.append(f"| {row['beam_size']} | {row['length_penalty']:g} | {mark}{row['bleu']:.2f}{mark} | "
                     f"{row['chrf']:.2f} | {row['length_ratio']:.3f} | {row['sentences_per_s']:.1f} |")
    lines += ["", f"Best on `{report['split']}`: beam {best['beam_size']}, α = {best['length_penalty']:g} "
                  f"(BLEU {best['bleu']:.2f}); the run's own setting: beam {report['run_setting']['beam_size']}, "
                  f"α = {report['run_setting']['length_penalty']:g}."]
    if report.get("test"):
        lines += ["", f"Scored once on `{report['test_split']}`:", "",
                  "| setting | beam | α | BLEU | chrF2 | length ratio |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for name, row in report["test"].items():
            lines.append(f"| {name} | {row['beam_size']} | {row['length_penalty']:g} | {row['bleu']:.2f} | "
                         f"{row['chrf']:.2f} | {row['length_ratio']:.3f} |")
    lines += ["", f"Command: `{report['command']}`", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    run_dir = args.run_dir.resolve()
    checkpoint = resolve_checkpoint(args.checkpoint or run_dir)
    # no input-length cut: the scores are comparable to those train.py reports
    translator = Translator.from_checkpoint(checkpoint, args.device, args.precision, max_input_words=None)
    device, cfg = translator.device, translator.configs[0]
    data_cfg = dict(cfg["data"])
    split = args.split or data_cfg["valid_split"]
    if split == args.test_split:
        raise SystemExit(f"--split and --test-split are both {split!r}: tune on another split than you report")
    if split in (data_cfg.get("test_splits") or []):
        print(f"warning: tuning on {split!r}, one of the run's test splits: its score will overstate what the "
              f"chosen setting gives on unseen text; tune on {data_cfg['valid_split']!r} instead", file=sys.stderr)
    wanted = [s for s in (split, args.test_split) if s and s != data_cfg["valid_split"]]
    data_cfg["test_splits"] = list(dict.fromkeys([*(data_cfg.get("test_splits") or []), *wanted]))
    data = prepare_data(data_cfg)
    splits = {data_cfg["valid_split"]: data.valid, **data.tests}

    # Encoded with the checkpoint's own tokenizer (prepare_data's cache could hold another one), once per split.
    src_ids = {name: translator.encode(list(splits[name].src_text)) for name in (split, args.test_split) if name}

    def run(name: str, beam: int, alpha: float) -> dict[str, Any]:
        row = score_setting(translator, src_ids[name], list(splits[name].tgt_text), cfg["trainer"], beam,
                            alpha, args.batch_tokens)
        print(f"{name}: beam {beam:2d}  α {alpha:<4g} BLEU {row['bleu']:6.2f}  chrF {row['chrf']:6.2f}  "
              f"length ratio {row['length_ratio']:.3f}  {row['sentences_per_s']:.1f} sent/s", flush=True)
        return row

    rows = [run(split, beam, alpha) for beam, alpha in grid(args.beam_sizes, args.length_penalties)]
    best = max(rows, key=lambda row: row["bleu"])
    run_setting = {"beam_size": cfg["trainer"]["test_beam_size"], "length_penalty": cfg["trainer"]["length_penalty"]}
    test: dict[str, Any] = {}
    if args.test_split:
        test["chosen on " + split] = run(args.test_split, best["beam_size"], best["length_penalty"])
        if (run_setting["beam_size"], run_setting["length_penalty"]) != (best["beam_size"], best["length_penalty"]):
            test["the run's own"] = run(args.test_split, run_setting["beam_size"], run_setting["length_penalty"])

    report = {
        "run_dir": str(run_dir),
        "checkpoint": str(checkpoint),
        "attention": cfg["attention"]["name"],
        "split": split,
        "sentences": len(splits[split]),
        "grid": rows,
        "best": best,
        "run_setting": run_setting,
        "test_split": args.test_split,
        "test": test,
        "bleu_signature": rows[0]["bleu_signature"],
        "chrf_signature": rows[0]["chrf_signature"],
        "device": device_name(device),
        "precision": args.precision,
        "bf16_autocast": uses_bf16(args.precision, device),
        **provenance("scripts/tune_decoding.py", argv),
    }
    out = args.out or run_dir / "decoding_grid"
    out.parent.mkdir(parents=True, exist_ok=True)
    markdown = render_markdown(report)
    out.with_suffix(".md").write_text(markdown, encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(markdown)
    return report


if __name__ == "__main__":
    try:
        main()
    except (*USER_ERRORS, CheckpointError, DataError) as error:  # a wrong path, split or device: one line
        print(f"tune_decoding.py: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
