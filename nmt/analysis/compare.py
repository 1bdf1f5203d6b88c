"""Compare trained runs on a test split: cased sacreBLEU BLEU and chrF, BLEU per source length (Bahdanau et al.,
2015, Fig. 2) and attention sharpness, as ``<out>.md``, ``.json``, ``.png`` and ``_length.png``; ``<out>`` defaults
to ``attention_comparison`` in the sweep dir or the run dirs' common folder (docs/development/benchmarking.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from nmt.analysis.cli import RunError, one_line_errors, parser, write_report
from nmt.analysis.grouped import plot_groups, render_groups
from nmt.analysis.measures import TUTORIAL_BLEU_LABEL, attention_sharpness, bleu_by_length, tutorial_bleu
from nmt.analysis.significance import Output, summarise
from nmt.common.entry_point import check_options_or_exit
from nmt.common.files import write_text_durably
from nmt.common.metrics import corpus_scores
from nmt.common.provenance import provenance
from nmt.data import prepare_data
from nmt.data.batching import EncodedSplit
from nmt.inference.engine import Translator
from nmt.inference.plotting import new_figure, save_png
from nmt.model.checkpoint import CheckpointError, resolve_checkpoint

log = logging.getLogger(__name__)

# The order of configs/attention/ as the write-ups discuss them: the baseline first.
ATTENTION_ORDER = ("none", "additive", "dot", "scaled_dot", "general", "multihead")
# Multi30k test sentences have 1-30 words (most 8-16): these bounds give five buckets that all hold
# sentences; Bahdanau et al.'s WMT buckets (10-word steps up to 60) would leave most of them empty.
DEFAULT_BUCKETS = (8, 12, 16, 20)
# What a run from an earlier report must hold to stand in a table beside freshly analysed ones.
RECORDED_FIELDS = ("run_dir", "attention", "split", "hypotheses", "sentences", "test", "test_in_results_json",
                   "tutorial_bleu", "by_length", "attention_sharpness", "beam_size", "valid_bleu", "parameters",
                   "train_seconds", "device", "world_size", "steps", "epochs")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__, reports=("out",))
    p.add_argument("run_dirs", nargs="*", type=Path, help="run dirs with results.json")
    p.add_argument("--sweep-dir", type=Path, help="also every folder below it with a results.json (a multirun)")
    p.add_argument("--from-report", type=Path, action="append", default=[], metavar="REPORT_JSON",
                   help="also the runs recorded in an earlier comparison's .json (repeatable)")
    p.add_argument("--split", help="test split (default: the first one in results.json)")
    p.add_argument("--buckets", type=int, nargs="+", default=list(DEFAULT_BUCKETS),
                   help="upper bounds (words, inclusive) of the source-length buckets; the last is open")
    p.add_argument("--device", default="auto", help="for runs that must be translated now: auto | cpu | cuda")
    p.add_argument("--out", type=Path, help="output path without extension (default: see above)")
    p.add_argument("--group-by", metavar="KEY", help="group the runs of each direction by KEY (a results.json field "
                   "such as attention, or a config key such as model.hidden_size) over their seeds (trainer.seed)")
    p.add_argument("--baseline", metavar="VALUE", help="with --group-by: test each group against this one, seed by "
                   "seed, by sacrebleu's paired bootstrap resampling and approximate randomisation")
    p.add_argument("--time-decoding", action="store_true", help="beam sentences/s per run: as train.py recorded "
                   "its final test decoding in results.json, else the split translated once more with the run's "
                   "checkpoint and test beam, timed on this machine")
    p.add_argument("--speed", type=Path, nargs="+", metavar="SPEED_JSON", help="with --group-by: the groups' "
                   "training tokens/s and beam sentences/s from `benchmark.py study-speed` (runs timed back to back "
                   "on an idle machine; one report or several, e.g. one per direction); without it those columns "
                   "read 'not measured'")
    args = p.parse_args(argv)
    if args.speed is not None and args.group_by is None:
        p.error("--speed needs --group-by")
    if args.baseline is not None and args.group_by is None:
        p.error("--baseline needs --group-by")
    if args.group_by is not None and args.from_report:
        p.error("--group-by tests the runs' translations, which --from-report runs do not keep; pass their run dirs")
    if not args.run_dirs and args.sweep_dir is None and not args.from_report:
        p.error("give at least one RUN_DIR, --sweep-dir or --from-report")
    if args.out is None and not args.run_dirs and args.sweep_dir is None:
        p.error("--out is required when every run comes from a report")
    return args


def find_run_dirs(run_dirs: Sequence[Path], sweep_dir: Path | None) -> list[Path]:
    """The given run dirs plus every folder under ``sweep_dir`` with a ``results.json``, without repeats."""
    found = list(run_dirs)
    if sweep_dir is not None:
        found += sorted(path.parent for path in sweep_dir.rglob("results.json"))
        if not found:
            raise RunError(f"no results.json found under {sweep_dir}")
    unique = list(dict.fromkeys(path.resolve() for path in found))
    if missing := [path for path in unique if not (path / "results.json").is_file()]:
        raise RunError(f"{missing[0]} has no results.json: pass run dirs of finished train.py runs")
    return unique


def shown(run_dir: Path) -> str:
    """``run_dir`` from the working directory when under it: a report names no machine's folders."""
    cwd = Path.cwd()
    return str(run_dir.relative_to(cwd)) if run_dir.is_relative_to(cwd) else str(run_dir)


def load_report_runs(report_paths: Sequence[Path], buckets: Sequence[int]) -> list[dict[str, Any]]:
    """The runs recorded in earlier reports, once checked to fit this comparison, each marked with the report it came
    from (a mark it already had is kept, so a row carried through several reports names the one it was measured for)."""
    runs = []
    for path in report_paths:
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
            recorded, report_buckets, date = report["runs"], report["buckets"], report["date"]
        except FileNotFoundError:
            raise RunError(f"--from-report {path}: no such file; pass a .json that compare_runs.py wrote") from None
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise RunError(f"--from-report {path} is not a compare_runs.py report ({type(error).__name__}: "
                             f"{error}); pass a .json that compare_runs.py wrote") from None
        if list(report_buckets) != list(buckets):
            raise RunError(f"--from-report {path} has length buckets {report_buckets}, this comparison "
                             f"{list(buckets)}; pass --buckets {' '.join(map(str, report_buckets))}")
        for index, run in enumerate(recorded):
            if missing := [key for key in RECORDED_FIELDS if key not in run]:
                raise RunError(f"--from-report {path}: run {index} ({run.get('run_dir', '?')}) lacks {missing}; "
                                 "run compare_runs.py on that run dir again, or leave the report out")
        runs += [{"from_report": f"{path.name}, {date[:10]}", **run} for run in recorded]
    return runs


def load_hypotheses(run_dir: Path, cfg: dict[str, Any], split: str, srcs: list[str],
                    loaded: Translator | None) -> tuple[list[str], str]:
    """The best checkpoint's translations of ``split``, read from the run (``"saved"``) or made now and
    saved there (``"translated now"``)."""
    path = run_dir / "translations" / f"{split}.{cfg['data']['tgt_lang']}"
    if path.is_file():
        return path.read_text(encoding="utf-8").splitlines(), "saved"
    if loaded is None:
        raise RunError(f"{run_dir} has neither {path} nor a checkpoint to translate {split} with")
    log.warning("%s has no %s: translating %d sentences with its best checkpoint", run_dir, path.name, len(srcs))
    t = cfg["trainer"]  # the settings train.py used for the test scores
    hyps = [r.text for r in loaded.translate(srcs, beam_size=t["test_beam_size"], length_penalty=t["length_penalty"])]
    write_text_durably(path, "".join(h + "\n" for h in hyps))
    return hyps, "translated now"


def analyse_run(run_dir: Path, split: str | None, buckets: Sequence[int], device: str = "auto",
                group_by: str | None = None, time_decoding: bool = False) -> Output:
    """Everything the comparison shows about one run (a JSON-ready dict), with its translations and references.

    Args:
        group_by: a results.json field or config key whose value groups the run (``--group-by``); the run must
            then hold its own test outputs for ``split`` (results.json's scores and the saved translations).
        time_decoding: beam sentences/s: results.json's ``test.<split>.sentences_per_s`` (train.py's final
            decoding) when recorded, else the split translated once more with the checkpoint at its test beam, timed.

    Raises:
        RunError: a run without test outputs for ``split`` (with ``group_by``), or whose outputs do not fit it.
    """
    results = json.loads((run_dir / "results.json").read_text())
    cfg = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"), resolve=True)
    split = split or next(iter(results["test"]))
    if group_by is not None and split not in results["test"]:
        raise RunError(f"{run_dir} has no test outputs for {split}: its results.json scored "
                       f"{sorted(results['test']) or 'no test split'}; pass runs tested on {split}, or --split")
    test_splits = list(dict.fromkeys([*(cfg["data"].get("test_splits") or []), split]))
    text = prepare_data({**cfg["data"], "test_splits": test_splits}).tests[split]
    srcs, refs = list(text.src_text), list(text.tgt_text)
    try:  # no input-length cut, as training scores
        loaded = Translator.from_checkpoint(resolve_checkpoint(run_dir), device=device, max_input_words=None)
    except CheckpointError:
        loaded = None  # a run dir with translations only
    saved = run_dir / "translations" / f"{split}.{cfg['data']['tgt_lang']}"
    if group_by is not None and not saved.is_file():  # a seed comparison tests the run's own test outputs
        raise RunError(f"{run_dir} has no test outputs for {split}: no {saved}")
    hyps, source = load_hypotheses(run_dir, cfg, split, srcs, loaded)
    if len(hyps) != len(refs):
        raise RunError(f"{run_dir}: {len(hyps)} translations of {split} but {len(refs)} references; delete "
                       f"{run_dir / 'translations'} to translate the split again")
    run = {
        "run_dir": shown(run_dir), "attention": results["attention"], "split": split, "hypotheses": source,
        "sentences": len(refs), "test": corpus_scores(hyps, refs), "test_in_results_json": results["test"].get(split),
        "tutorial_bleu": tutorial_bleu(hyps, refs), "by_length": bleu_by_length(srcs, hyps, refs, buckets),
        "attention_sharpness": sharpness(results, split, loaded, text),
        "beam_size": results["beam_size"], "checkpoint_step": results["checkpoint_step"],
        "valid_bleu": results["valid"]["bleu"], "parameters": results["parameters"],
        "train_seconds": results["train_seconds"], "device": results["device"],
        "bf16_autocast": results.get("bf16_autocast"),  # None: a run from before trainer.precision
        "world_size": results.get("world_size", 1), "steps": results["steps"], "epochs": results["epochs"],
        "stopped_early": results.get("stopped_early"), "train_tokens_per_s": results.get("train_target_tokens_per_s"),
        "direction": f"{cfg['data']['src_lang']}-{cfg['data']['tgt_lang']}", "seed": cfg["trainer"]["seed"],
    }
    if group_by is not None:
        run["group"] = results[group_by] if group_by in results else OmegaConf.select(OmegaConf.create(cfg), group_by)
    if time_decoding:
        recorded = (results["test"].get(split) or {}).get("sentences_per_s")  # train.py's final beam decoding
        run["beam_sentences_per_s"] = (recorded if recorded is not None
                                       else decoding_speed(loaded, srcs, cfg) if loaded else None)
    return Output(run, hyps, refs)


def sharpness(results: dict[str, Any], split: str, loaded: Translator | None,
              text: EncodedSplit) -> dict[str, float] | str | None:
    """How peaked the run's attention is on ``split``: as train.py recorded it in results.json when it did (so a run
    copied without its checkpoints reports the same), else measured now with the checkpoint; None without
    attention, ``"no checkpoint"`` when the run dir holds neither."""
    recorded = results["test"].get(split) or {}
    if "attention_sharpness" in recorded:
        return recorded["attention_sharpness"]
    return attention_sharpness(loaded.models[0], text) if loaded else "no checkpoint"


def decoding_speed(loaded: Translator, srcs: list[str], cfg: dict[str, Any]) -> float:
    """Sentences/s of translating ``srcs`` with the run's test beam and length penalty (after the attention
    measurement has warmed the model up)."""
    started = time.perf_counter()
    loaded.translate(srcs, beam_size=cfg["trainer"]["test_beam_size"], length_penalty=cfg["trainer"]["length_penalty"])
    return len(srcs) / max(1e-9, time.perf_counter() - started)


def format_duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_device(run: dict[str, Any]) -> str:
    name = run["device"] + (f" x{run['world_size']}" if run["world_size"] > 1 else "")
    name += ", bf16" if run.get("bf16_autocast") else ""
    return name + " (no GPU)" if run["device"] == "cpu" else name


def _score_table(runs: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"# Attention comparison on {runs[0]['split']} ({runs[0]['sentences']} sentences)", "",
        "Scores of each run's best checkpoint (by validation BLEU), decoded as in `train.py`'s test (beam "
        "column; 1 = greedy). BLEU and chrF are sacreBLEU's on detokenized, cased output against the raw "
        "references; valid BLEU is the same checkpoint's, from `results.json`.", "",
        "| attention | test BLEU | test chrF | valid BLEU | beam | parameters | training time | device "
        "| steps | epochs |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    lines += [f"| {r['label']} | {r['test']['bleu']:.2f} | {r['test']['chrf']:.2f} | {r['valid_bleu']:.2f} "
              f"| {r['beam_size']} | {r['parameters']:,} | {format_duration(r['train_seconds'])} "
              f"| {format_device(r)} | {r['steps']} | {r['epochs']:.2f} |" for r in runs]
    lines += ["", "Signatures:"]
    for key, name in (("bleu_signature", "BLEU"), ("chrf_signature", "chrF")):
        lines += [f"- {name}: `{signature}`" for signature in dict.fromkeys(r["test"][key] for r in runs)]
    # Saved translations reproduce train.py's score exactly; ones made now may differ in the last digits.
    differ = [f"{r['label']} ({r['test_in_results_json']['bleu']:.2f})" for r in runs if r["test_in_results_json"]
              and abs(r["test_in_results_json"]["bleu"] - r["test"]["bleu"]) >= 0.005]
    named = {"As recorded in an earlier comparison (run dir not read again)":  # each note names its runs
             [f"{r['label']} ({r['from_report']})" for r in runs if r.get("from_report")],
             "Translated by this script (no saved translations in the run)":
             [r["label"] for r in runs if r["hypotheses"] != "saved"],
             "Test BLEU in `results.json` differs from the recomputed one for": differ}
    notes = [f"{note}: {', '.join(names)}." for note, names in named.items() if names]
    if any(r["device"] == "cpu" for r in runs):
        notes.insert(0, "Runs whose device reads *cpu (no GPU)* were trained, and timed, without a GPU.")
    return lines + [line for note in notes for line in ("", note)]


def _more_tables(runs: list[dict[str, Any]]) -> list[str]:
    """Tutorial-style BLEU, BLEU by length, and attention sharpness when any run has it measured."""
    buckets = runs[0]["by_length"]
    lines = [
        "", f"## {TUTORIAL_BLEU_LABEL[0].upper() + TUTORIAL_BLEU_LABEL[1:]}", "",
        "Only for comparison with write-ups that score this way; it usually reads higher than the cased "
        "sacreBLEU above and must not be reported in its place.", "",
        "| attention | tutorial-style BLEU | cased sacreBLEU (above) |", "| --- | ---: | ---: |",
        *[f"| {r['label']} | {r['tutorial_bleu']['bleu']:.2f} | {r['test']['bleu']:.2f} |" for r in runs],
        "", f"Signature: `{runs[0]['tutorial_bleu']['signature']}`",
        "", "## BLEU by source length (words)", "",
        "Corpus BLEU (cased sacreBLEU) of the sentences in each bucket, as in Bahdanau et al. (2015, Fig. 2); "
        "buckets with few sentences are noisy.", "",
        "| attention | " + " | ".join(b["range"] for b in buckets) + " |",
        "| --- | " + " | ".join("---:" for _ in buckets) + " |",
        *sentence_counts(runs),
    ]
    for r in runs:
        lines.append(f"| {r['label']} | " + " | ".join("–" if b["bleu"] is None else f"{b['bleu']:.2f}"
                                                       for b in r["by_length"]) + " |")
    measured = [r["attention_sharpness"] for r in runs if isinstance(r["attention_sharpness"], dict)]
    if not measured:
        return lines
    lines += [
        "", "## How peaked the attention is", "",
        "The best checkpoint decodes the references of this split teacher-forced; per target token, the "
        "entropy of its attention over the source, divided by that of the uniform distribution "
        "(0 = all weight on one piece, 1 = spread evenly), and the largest weight; means over "
        f"{token_counts(runs)} (multi-head: the mean over heads).", "",
        "| attention | normalised entropy | largest weight | entropy (nats) |", "| --- | ---: | ---: | ---: |",
    ]
    for r in runs:
        stats = r["attention_sharpness"]
        lines.append(f"| {r['label']} | {stats['normalised_entropy']:.3f} | {stats['max_weight']:.3f} "
                     f"| {stats['entropy']:.3f} |" if isinstance(stats, dict)
                     else f"| {r['label']} | {stats or 'no attention'} | | |")
    return lines


def sentence_counts(runs: list[dict[str, Any]]) -> list[str]:
    """The length buckets' sentence counts: one row, or one per direction when they differ (the source sets the
    bucket)."""
    counts: dict[str | None, list[int]] = {}
    for r in runs:  # a run from an older report has no direction
        counts.setdefault(r.get("direction"), [b["n"] for b in r["by_length"]])
    named = len({tuple(n) for n in counts.values()}) > 1
    return [f"| *sentences{f' ({direction})' if named else ''}* | " + " | ".join(map(str, n)) + " |"
            for direction, n in counts.items()]


def token_counts(runs: list[dict[str, Any]]) -> str:
    """The target tokens the sharpness is a mean over: one count, or each direction's when they differ."""
    counts = {r.get("direction"): r["attention_sharpness"]["tokens"] for r in runs
              if isinstance(r["attention_sharpness"], dict)}
    if len(set(counts.values())) == 1:
        return f"{next(iter(counts.values())):,} target tokens"
    return "the target tokens of each direction (" + ", ".join(f"{d}: {n:,}" for d, n in counts.items()) + ")"


def render_markdown(runs: list[dict[str, Any]]) -> str:
    """The tables (scores, tutorial-style BLEU, BLEU by length, attention sharpness) with signatures and notes."""
    return "\n".join(_score_table(runs) + _more_tables(runs)) + "\n"


def plot(runs: list[dict[str, Any]], out: Path) -> None:
    """``<out>.png``: test BLEU and chrF per run as bars; ``<out>_length.png``: BLEU per length bucket."""
    fig, ax = new_figure(max(5.0, 1.1 * len(runs) + 2), 4.0)
    for offset, key, name in ((-0.19, "bleu", "BLEU"), (0.19, "chrf", "chrF")):
        ax.bar_label(ax.bar([x + offset for x in range(len(runs))], [r["test"][key] for r in runs], 0.38,
                            label=name), fmt="%.1f", fontsize=8)
    ax.set_xticks(range(len(runs)), [r["label"] for r in runs], rotation=20, ha="right")
    ax.set(ylabel="score (sacreBLEU, cased)", title=f"{runs[0]['split']}: test scores by attention type")
    ax.legend()
    fig.tight_layout()
    save_png(fig, f"{out}.png")

    fig, ax = new_figure(6.5, 4.0)
    one_count = len(sentence_counts(runs)) == 1
    labels = [f"{b['range']}\n(n={b['n']})" if one_count else b["range"] for b in runs[0]["by_length"]]
    for r in runs:
        ax.plot(range(len(labels)), [float("nan") if b["bleu"] is None else b["bleu"] for b in r["by_length"]],
                marker="o", label=r["label"])
    ax.set_xticks(range(len(labels)), labels)
    ax.set(xlabel="source sentence length (words)", ylabel="BLEU (sacreBLEU, cased)",
           title=f"{runs[0]['split']}: BLEU by source length")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, f"{out}_length.png")


def check_one_split(runs: list[dict[str, Any]], split: str | None) -> None:
    """Every run tests on ``split`` (by default the first run's).

    Raises:
        RunError: naming the first run on another split.
    """
    wanted = split or runs[0]["split"]
    if other := next((r for r in runs if r["split"] != wanted), None):
        raise RunError(f"{other['run_dir']} tests on {other['split']}, {runs[0]['run_dir']} on {wanted}: the runs "
                       f"test on different splits; pick one with --split")


def label_runs(runs: list[dict[str, Any]]) -> None:
    """Sort the runs (the attention order, then folder) and give each a short label: its attention type, plus
    the folder name (and direction, when the twins differ in it) when the type repeats."""
    runs.sort(key=lambda r: (ATTENTION_ORDER.index(r["attention"]) if r["attention"] in ATTENTION_ORDER
                             else len(ATTENTION_ORDER), r.get("direction", ""), r["run_dir"]))
    for run in runs:
        twins = [r for r in runs if r["attention"] == run["attention"]]
        where = f"{run['direction']} " if len({r.get("direction") for r in twins}) > 1 else ""
        folder = Path(run["run_dir"]).name
        run["label"] = run["attention"] if len(twins) == 1 else f"{run['attention']} ({where}{folder})"


def load_speeds(paths: list[Path], group_by: str) -> dict[str, Any]:
    """``--speed``: ``benchmark.py study-speed`` reports (e.g. one per direction) joined by (direction, group),
    with where each comes from.

    Raises:
        RunError: no such file, not such a report, one that grouped by another key, or a group timed twice.
    """
    by_group: dict[tuple[str, str], Any] = {}
    sources = []
    for path in paths:
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise RunError(f"--speed {path}: cannot read it ({error}); pass the .json of benchmark.py "
                           "study-speed") from None
        if report.get("benchmark") != "study-speed":
            raise RunError(f"--speed {path}: not a benchmark.py study-speed report; make one with "
                           "python scripts/benchmark.py study-speed RUN_DIR... --out PATH")
        if report["group_by"] != group_by:
            raise RunError(f"--speed {path} timed groups of {report['group_by']}, not of --group-by {group_by}")
        for row in report["runs"]:
            key = (row["direction"], str(row["group"]))
            if key in by_group:
                raise RunError(f"--speed {path} times {key[1]} {key[0]} again: pass one report per group and "
                               "direction")
            by_group[key] = row
        sources.append({"file": path.name, "device": report["device"]["name"], "date": report.get("date"),
                        "train_steps": report["train_steps"],
                        "directions": sorted({row["direction"] for row in report["runs"]})})
    return {"by_group": by_group, "source": sources}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Analyse the runs, write the report, the tables and the plots; returns the report.

    Raises:
        RunError: a run the comparison cannot use (one line naming it).
    """
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    run_dirs = find_run_dirs(args.run_dirs, args.sweep_dir)
    out = args.out or (args.sweep_dir or Path(os.path.commonpath(run_dirs))) / "attention_comparison"
    check_options_or_exit("compare_runs.py", reports={"--out": out})  # the default too, before any translation
    outputs = [analyse_run(run_dir, args.split, args.buckets, args.device, args.group_by, args.time_decoding)
               for run_dir in run_dirs]
    runs = [output.run for output in outputs]
    recorded = {r["run_dir"]: r for r in load_report_runs(args.from_report, args.buckets)}  # a later report wins
    runs += [r for run_dir, r in recorded.items() if run_dir not in {shown(d) for d in run_dirs}]  # analysed now wins
    check_one_split(runs, args.split)
    label_runs(runs)
    speeds = load_speeds(args.speed, args.group_by) if args.speed else None
    groups = summarise(outputs, args.group_by, args.baseline, speeds) if args.group_by else None
    markdown = (render_groups(groups, args.group_by, args.baseline, speeds) if groups else "") + render_markdown(runs)
    report = {**provenance("scripts/compare_runs.py", argv), "split": runs[0]["split"],
              "buckets": list(args.buckets), "tutorial_bleu_label": TUTORIAL_BLEU_LABEL, "group_by": args.group_by,
              "baseline": args.baseline, "speed": speeds and speeds["source"], "groups": groups, "runs": runs}
    print(markdown)
    write_report(out, report, markdown)
    plot(runs, out)
    if groups:
        plot_groups(groups, runs[0]["split"], args.group_by, out)
    return report


if __name__ == "__main__":  # python -m nmt.analysis.compare, from a plain install too
    with one_line_errors("compare_runs.py"):
        main()
