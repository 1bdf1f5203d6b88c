"""Choose beam size and GNMT length penalty α on the validation split: BLEU, chrF, length ratio and speed per
setting; with ``--test-split`` the best (and, when reranking wins, the best without it), and the run's own setting,
are scored once on test, the choices' translations kept beside the report (``scripts/tune_decoding.py``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nmt.analysis.cli import one_line_errors, parser, write_report
from nmt.common.device import INFERENCE_PRECISIONS, uses_bf16
from nmt.common.entry_point import check_options_or_exit
from nmt.common.files import write_text_durably
from nmt.common.metrics import corpus_scores
from nmt.common.provenance import device_name, provenance
from nmt.data import EncodedSplit, prepare_data
from nmt.inference.engine import SearchOptions, Translator
from nmt.inference.rerank import NoisyChannel, RerankSettings, combine
from nmt.model.checkpoint import resolve_checkpoint


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__, reports=("out",))
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
    p.add_argument("--rerank-checkpoint", nargs="+", help="reverse-direction model(s): every beam >= 2 setting is "
                   "also reranked (noisy channel) with each pair of the two weight lists below")
    p.add_argument("--rerank-weights", type=float, nargs="+", default=[0.0, 0.3, 0.6, 1.0],
                   help="lambda values, the weight of log P(x|y); 0 with length weight 0 = no reranking")
    p.add_argument("--rerank-length-weights", type=float, nargs="+", default=[0.0, 0.5, 1.0],
                   help="gamma values, added per output subword")
    p.add_argument("--rerank-n-best", type=int, default=RerankSettings.n_best,
                   help="candidates rescored per sentence (at most the beam size)")
    args = p.parse_args(argv)
    bad = [b for b in [*args.beam_sizes, args.rerank_n_best] if b < 1] or [a for a in args.length_penalties if a < 0]
    if bad:
        p.error(f"beam sizes must be >= 1 and length penalties >= 0; got {bad}")
    return args


def grid(beam_sizes: Sequence[int], length_penalties: Sequence[float]) -> list[tuple[int, float]]:
    """(beam, α) settings in order, without repeats; greedy (beam 1) once, with α = 0."""
    return list(dict.fromkeys((beam, 0.0 if beam == 1 else alpha) for beam in beam_sizes for alpha in length_penalties))


def score_setting(translator: Translator, split: EncodedSplit, src_ids: list[list[int]], options: SearchOptions,
                  channel: NoisyChannel | None, weights: Sequence[tuple[float, float]]) -> list[dict[str, Any]]:
    """Translate one encoded split with one setting and score it: one row; with ``channel``, one row per (λ, γ) of
    ``weights``, its 1-best of ``options.n_best`` candidates (one search and one channel pass for all the pairs).
    Each row's ``translations`` holds its 1-best lines (the caller keeps or drops them; the report has none)."""
    start = time.perf_counter()
    nbest = translator.translate_ids(src_ids, options, attention=False)  # only the tokens are scored
    decode = translator.tokenizer.decode_tgt
    todo = [i for i, ids in enumerate(src_ids) if ids] if channel else []
    texts = [[decode(h.tokens) for h in nbest[i]] for i in todo]
    scores = channel.source_log_probs([split.src_text[i] for i in todo], texts, options.batch_tokens) if todo else []
    seconds = time.perf_counter() - start
    refs, rows = list(split.tgt_text), []
    for pair in weights if channel else [None]:  # None: not reranked
        best = [hyps[0] for hyps in nbest]
        for i, channel_scores in zip(todo, scores):
            best[i] = combine(nbest[i], channel_scores, *pair)[0]
        reranked = {} if pair is None else {"rerank_weight": pair[0], "rerank_length_weight": pair[1],
                                            "rerank_n_best": options.n_best}
        rows.append({"beam_size": options.beam_size, "length_penalty": options.length_penalty, **reranked,
                     **corpus_scores(texts_of := [decode(h.tokens) for h in best], refs), "seconds": seconds,
                     "sentences_per_s": len(refs) / seconds, "translations": texts_of})
    return rows


def setting_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """A row's setting: beam, α, and the reranking weights (None without reranking)."""
    return row["beam_size"], row["length_penalty"], row.get("rerank_weight"), row.get("rerank_length_weight")


def setting_label(row: dict[str, Any]) -> str:
    """``beam 5, α = 1`` (``, λ = 0.3, γ = 0.5`` when reranked)."""
    label = f"beam {row['beam_size']}, α = {row['length_penalty']:g}"
    if row.get("rerank_weight") is not None:
        label += f", λ = {row['rerank_weight']:g}, γ = {row['rerank_length_weight']:g}"
    return label


def is_plain(row: dict[str, Any]) -> bool:
    """A setting without reranking: none tuned, or λ = γ = 0 (the search's own order: what one model gives alone)."""
    return not row.get("rerank_weight") and not row.get("rerank_length_weight")


def chosen_settings(rows: list[dict[str, Any]], split: str) -> dict[str, dict[str, Any]]:
    """The grid's best row on ``split``, and, when that one is reranked, its best row without reranking (what the
    model gives shipped alone, without the reverse models)."""
    best = max(rows, key=lambda row: row["bleu"])
    choices = {f"chosen on {split}": best}
    if not is_plain(best):
        choices[f"chosen on {split} without reranking"] = max(filter(is_plain, rows), key=lambda row: row["bleu"])
    return choices


def scored_on_test(run: Callable[..., list[dict[str, Any]]], choices: dict[str, dict[str, Any]],
                   own: dict[str, Any], test_split: str) -> dict[str, dict[str, Any]]:
    """Each choice scored once on ``test_split``, then the run's own setting when no plain choice is it."""
    test = {}
    for name, row in choices.items():
        weights = [] if is_plain(row) else [(row["rerank_weight"], row["rerank_length_weight"])]
        test[name] = run(test_split, row["beam_size"], row["length_penalty"], weights)[0]
    if not any((r["beam_size"], r["length_penalty"]) == (own["beam_size"], own["length_penalty"]) and is_plain(r)
               for r in choices.values()):
        test["the run's own"] = run(test_split, own["beam_size"], own["length_penalty"])[0]
    return test


def render_markdown(report: dict[str, Any]) -> str:
    """The grid (best in bold), the choice, and the test scores; λ and γ columns when reranking was tuned."""
    best, own = report["best"], report["run_setting"]
    reranked = bool(report.get("rerank_checkpoint"))
    head = f" beam | α |{' λ | γ |' if reranked else ''} BLEU | chrF2 | length ratio |"
    rule = " ---: | ---: |" + " ---: | ---: |" * reranked + " ---: | ---: | ---: |"

    def cells(row: dict[str, Any], mark: str = "") -> str:
        """The columns of ``head``: the setting and its scores."""
        weights = (row.get("rerank_weight"), row.get("rerank_length_weight")) if reranked else ()
        rr = "".join(f" {'–' if w is None else format(w, 'g')} |" for w in weights)
        return (f" {row['beam_size']} | {row['length_penalty']:g} |{rr} {mark}{row['bleu']:.2f}{mark} | "
                f"{row['chrf']:.2f} | {row['length_ratio']:.3f} |")

    lines = [
        f"# Decoding settings: {report['run_dir']}", "",
        f"Checkpoint `{report['checkpoint']}`, tuned on `{report['split']}` ({report['sentences']} sentences), "
        f"device {report['device']} ({'bf16 autocast' if report['bf16_autocast'] else 'float32'}), {report['date']}.",
        f"BLEU: `{report['bleu_signature']}`; chrF: `{report['chrf_signature']}`.",
        "Length ratio: output / reference length (13a tokens); below 1 the brevity penalty applies.", "",
        f"|{head} sentences/s |", f"|{rule} ---: |",
    ]
    lines += [f"|{cells(row, '**' if setting_key(row) == setting_key(best) else '')} {row['sentences_per_s']:.1f} |"
              for row in report["grid"]]
    if reranked:
        lines += ["", f"λ, γ: noisy-channel reranking of the {report['rerank_n_best']}-best with "
                      f"`{report['rerank_checkpoint']}` (score + λ·log P(x|y) + γ·subwords)."]
    lines += ["", f"Best on `{report['split']}`: {setting_label(best)} "
                  f"(BLEU {best['bleu']:.2f}); the run's own setting: beam {own['beam_size']}, "
                  f"α = {own['length_penalty']:g}."]
    if report["test"]:
        lines += ["", f"Scored once on `{report['test_split']}`:", "", f"| setting |{head}", f"| --- |{rule}"]
        lines += [f"| {name} |{cells(row)}" for name, row in report["test"].items()]
    return "\n".join([*lines, "", f"Command: `{report['command']}`", ""])


def load_splits(cfg: dict[str, Any], split: str, test_split: str | None) -> dict[str, Any]:
    """The tuning and test splits of the run's corpus, by name (refusing to tune on the test split)."""
    valid, tests = cfg["data"]["valid_split"], list(cfg["data"].get("test_splits") or [])
    if split == test_split:
        raise SystemExit(f"--split and --test-split are both {split!r}: tune on another split than you report")
    if split in tests:
        print(f"warning: tuning on {split!r}, one of the run's test splits: its score will overstate what the "
              f"chosen setting gives on unseen text; tune on {valid!r} instead", file=sys.stderr)
    wanted = [s for s in (split, test_split) if s and s != valid]
    data = prepare_data({**cfg["data"], "test_splits": list(dict.fromkeys([*tests, *wanted]))})
    return {valid: data.valid, **data.tests}


@one_line_errors("tune_decoding.py")
def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Decode the grid, choose, score on test, write the report; returns it."""
    args = parse_args(argv)
    run_dir = args.run_dir.resolve()
    check_options_or_exit("tune_decoding.py", reports={"--out": args.out or run_dir / "decoding_grid"})
    checkpoints = [resolve_checkpoint(path) for path in args.checkpoint or [run_dir]]
    # no input-length cut: the scores are comparable to those train.py reports
    translator = Translator.from_checkpoint(checkpoints, args.device, args.precision, max_input_words=None)
    cfg, t = translator.configs[0], translator.configs[0]["trainer"]
    split = args.split or cfg["data"]["valid_split"]
    splits = load_splits(cfg, split, args.test_split)
    # Encoded with the checkpoint's own tokenizer (prepare_data's cache could hold another one), once per split.
    src_ids = {name: translator.encode(list(splits[name].src_text)) for name in (split, args.test_split) if name}

    channel = NoisyChannel.load(args.rerank_checkpoint, translator) if args.rerank_checkpoint else None
    pairs = [(weight, length) for weight in args.rerank_weights for length in args.rerank_length_weights]
    outputs: dict[tuple[Any, ...], list[str]] = {}  # (split, setting): its 1-best lines

    def run(name: str, beam: int, alpha: float, weights: Sequence[tuple[float, float]] = ()) -> list[dict[str, Any]]:
        """The rows of one (beam, α): one plain row, or one per (λ, γ) when reranking (beam >= 2)."""
        reranker = channel if beam >= 2 and weights else None
        options = SearchOptions(beam_size=beam, length_penalty=alpha, batch_tokens=args.batch_tokens,
                                n_best=min(args.rerank_n_best, beam) if reranker else 1)
        found = score_setting(translator, splits[name], src_ids[name], options, reranker, weights)
        for row in found:
            outputs[name, setting_key(row)] = row.pop("translations")
            print(f"{name}: {setting_label(row):<36} BLEU {row['bleu']:6.2f}  chrF {row['chrf']:6.2f}  "
                  f"length ratio {row['length_ratio']:.3f}  {row['sentences_per_s']:.1f} sent/s", flush=True)
        return found

    rows = [row for beam, alpha in grid(args.beam_sizes, args.length_penalties)
            for row in run(split, beam, alpha, pairs)]
    best = max(rows, key=lambda row: row["bleu"])
    own = {"beam_size": t["test_beam_size"], "length_penalty": t["length_penalty"]}
    choices = chosen_settings(rows, split)
    test = scored_on_test(run, choices, own, args.test_split) if args.test_split else {}
    report = {
        "run_dir": str(run_dir), "checkpoint": ", ".join(map(str, checkpoints)), "attention": cfg["attention"]["name"],
        "split": split, "sentences": len(splits[split]), "grid": rows, "best": best, "run_setting": own,
        "test_split": args.test_split, "test": test, "bleu_signature": rows[0]["bleu_signature"],
        "chrf_signature": rows[0]["chrf_signature"], "device": device_name(translator.device),
        "precision": args.precision, "bf16_autocast": uses_bf16(args.precision, translator.device),
        "rerank_checkpoint": ", ".join(args.rerank_checkpoint) if channel else None,
        "rerank_n_best": args.rerank_n_best if channel else None, **provenance("scripts/tune_decoding.py", argv),
    }
    out = args.out or run_dir / "decoding_grid"
    for name, suffix in zip(choices, ("", ".without_reranking")) if test else ():  # what the system outputs
        lines = outputs[args.test_split, setting_key(test[name])]
        path = f"{out}{suffix}.{args.test_split}.{cfg['data']['tgt_lang']}"
        write_text_durably(path, "".join(f"{line}\n" for line in lines))
    markdown = render_markdown(report)
    print(markdown)
    write_report(out, report, markdown)
    return report


if __name__ == "__main__":  # python -m nmt.analysis.decoding, from a plain install too
    main()
