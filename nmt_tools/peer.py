"""Side by side with JoeyNMT on the same machine, in one run: training and translation speed ratios.

    python scripts/peer_compare.py --checkpoint outputs/RUN --peer-dir PEER_DIR --out runs/peer_cmp   # ~45 min
    python scripts/peer_compare.py --checkpoint RUN --skip-peer-run PEER_WORKDIR --out OUT   # reuse the peer's run
    python scripts/peer_compare.py --checkpoint RUN --our-steps 200 --peer-dir PEER_DIR --out OUT
    python scripts/peer_compare.py time-to-bleu --ours RUN --peer-workdir PEER_WORKDIR --out OUT  # time_to_bleu.py

``PEER_DIR`` holds JoeyNMT 2.3.0's harness: its ``run.sh`` stages ``venv data throughput decode summary``
run with ``WORKDIR`` under ``--work-dir`` and ``CORPUS`` from the mirror (``--mirror``, default
``$NMT_DATA_MIRROR``), and its figures are read from ``$WORKDIR/results/summary.json``. Right after, on
the same machine, ours: training target tokens/s of ``model=default attention=additive`` over one
epoch (or ``--our-steps``), timed as ``benchmark.py train`` times it; and greedy / beam 5 on
test_2016_flickr in batches of 128 sentences, ``--reps`` times (median), timed as the whole process
(a fresh ``python scripts/peer_compare.py decode-once ...``) and as decoding alone, with BLEU.

Writes ``<out>.json`` and ``<out>.md``: ratios ours/theirs against the targets (>= 2x training
tokens/s, >= 3x beam-5 sentences/s). A figure that was not measured is left empty, never estimated.
Details: docs/development/benchmarking.md.

Not done here: training the checkpoint (``train.py``), or installing JoeyNMT anywhere but its own venv.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from nmt.analysis.cli import write_report
from nmt_tools.cli import TEST_SPLIT, add_project_dir, parser, sync
from nmt_tools.peer_files import sacrebleu_score

PEER_STAGES = ("venv", "data", "throughput", "decode", "summary")
MODES = {"greedy": 1, "beam5": 5}  # the peer's names for its two decode settings -> beam size
TARGETS = {"training target tokens/s": 2.0, "beam 5 sentences/s (decoding alone)": 3.0,
           "beam 5 sentences/s (whole process)": 3.0}
OUR_TRAINING_OVERRIDES = ["model=default", "attention=additive"]


def parse_args(argv: list[str], project_dir: Path | None = None) -> argparse.Namespace:
    p = parser(__doc__, folders=("work_dir",), reports=("out",))
    add_project_dir(p, project_dir)  # configs/ for our training, scripts/peer_compare.py for our decoding
    p.add_argument("--checkpoint", help="our run dir or .pt for the translation figures (without: training only)")
    p.add_argument("--peer-dir", type=Path, help="the folder with JoeyNMT's run.sh (not needed with --skip-peer-run)")
    p.add_argument("--skip-peer-run", type=Path, metavar="PEER_WORKDIR",
                   help="do not run the peer; read PEER_WORKDIR/results/summary.json of an earlier run")
    p.add_argument("--ours-from", type=Path, metavar="JSON", help="reuse the 'ours' section of an earlier report")
    p.add_argument("--our-steps", type=int, help="timed training steps (default: one epoch)")
    p.add_argument("--our-overrides", nargs="*", default=[], metavar="KEY=VALUE",
                   help="more Hydra overrides for our training figure, e.g. the JoeyNMT-shaped output: "
                        "model.tie_embeddings=false model.output_hidden_size=512")
    p.add_argument("--warmup-steps", type=int, default=10, help="untimed training steps before timing")
    p.add_argument("--reps", type=int, default=3, help="translation runs per setting; the median counts")
    p.add_argument("--batch-sentences", type=int, default=128)
    p.add_argument("--device", default="cpu", help="ours: cpu (as the peer) | cuda | auto")
    p.add_argument("--mirror", type=Path, default=os.environ.get("NMT_DATA_MIRROR"),
                   help="corpus mirror with multi30k/, read by both systems (default: $NMT_DATA_MIRROR)")
    p.add_argument("--out", type=Path, required=True, help="report path without extension")
    p.add_argument("--work-dir", type=Path, help="the peer's WORKDIR and our translations (default: a temp dir)")
    args = p.parse_args(argv)
    if args.skip_peer_run is None and args.peer_dir is None:
        p.error("pass --peer-dir (the folder with JoeyNMT's run.sh) or --skip-peer-run PEER_WORKDIR")
    if args.mirror is None and (args.skip_peer_run is None or args.ours_from is None):
        p.error("no corpus mirror: set NMT_DATA_MIRROR or pass --mirror")
    return args


def run_peer(peer_dir: Path, workdir: Path, corpus: Path) -> Path:
    """Run the peer's stages with ``WORKDIR=workdir``; its log goes to ``workdir/run_sh.log``."""
    script = peer_dir / "run.sh"
    if not script.is_file():
        raise SystemExit(f"no {script}; pass --peer-dir (the folder with JoeyNMT's run.sh)")
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"running the peer: WORKDIR={workdir} bash {script} {' '.join(PEER_STAGES)} (~30 min on 2 cores)", flush=True)
    log_path = workdir / "run_sh.log"
    with open(log_path, "w") as log:
        done = subprocess.run(["bash", str(script), *PEER_STAGES], stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, "WORKDIR": str(workdir), "CORPUS": str(corpus)})
    if done.returncode != 0:
        raise SystemExit(f"the peer's run.sh failed (exit {done.returncode}); see {log_path}")
    return workdir


def load_peer_summary(path: Path) -> dict[str, Any]:
    """The peer's ``results/summary.json`` in the shape our own figures use.

    Training comes from the one-epoch ``throughput`` run (the ``full`` run if that is all there is):
    target tokens and training seconds as JoeyNMT's epoch log reports them. Decoding: the median over
    reps of the whole-process wall time and of JoeyNMT's own "Generation took" time.

    Raises:
        SystemExit: no summary, or one without training or decode figures.
    """
    if not path.is_file():
        raise SystemExit(f"no peer summary at {path}: run the peer (drop --skip-peer-run) or point it at a WORKDIR "
                         "where run.sh's summary stage ran")
    summary = json.loads(path.read_text())
    run_name = next((name for name in ("throughput", "full") if (summary.get(name) or {}).get("totals")), None)
    if run_name is None:
        raise SystemExit(f"{path} has no training totals (run.sh stage throughput)")
    run, decode = summary[run_name], {}
    for mode, beam in MODES.items():
        entry = (summary.get("decode") or {}).get(f"{mode}.{TEST_SPLIT}")
        if entry is not None:
            decode[mode] = {
                "beam_size": beam, "sentences": entry["n_sents"], "reps": len(entry["runs"]),
                "decode_seconds": entry["generation_sec_median"], "process_seconds": entry["process_wall_sec_median"],
                "sentences_per_s_decode": entry["sent_per_sec_generation"],
                "sentences_per_s_process": entry["sent_per_sec_process_wall"],
                "bleu": sacrebleu_score(entry.get("sacrebleu"), "BLEU"),
                "chrf": sacrebleu_score(entry.get("sacrebleu"), "chrF2"),
            }
    if not decode:
        raise SystemExit(f"{path} has no {TEST_SPLIT} decode figures (run.sh stage decode)")
    totals = run["totals"]
    return {"system": "JoeyNMT 2.3.0 (BiGRU + Bahdanau), CPU", "decode": decode, "training": {
        "source": f"{run_name} run, {totals['epochs']} epoch(s), batches of {run['batch_sentences']} sentences",
        "epochs": totals["epochs"], "seconds": totals["train_sec"], "target_tokens_per_s": totals["trg_tok_per_sec"],
        "sentences_per_s": totals["sent_per_sec"]}}


def measure_our_training(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    """Target tokens/s of the peer-sized model over one epoch (or ``--our-steps``), as ``benchmark.py train``."""
    from nmt.train.trainer import DistInfo, Trainer
    from nmt_tools.timing import compose_config, measure_training  # heavy: not for decode-once

    overrides = [*OUR_TRAINING_OVERRIDES, *args.our_overrides, f"trainer.device={args.device}",
                 f"data.mirror={args.mirror}"]
    trainer = Trainer(compose_config(overrides, args.project_dir), work_dir / "train_run", DistInfo())
    try:
        result = measure_training(trainer, args.our_steps, args.warmup_steps)
    finally:
        trainer.logger.close()
    epochs = result["steps"] / result["batches_per_epoch"]
    return {
        "source": f"{result['steps']} steps ({epochs:.2f} epochs) of {' '.join(overrides[:-2])}, max_tokens "
                  f"{trainer.cfg.data.max_tokens} (~{result['sentences_per_batch_mean']:.0f} sentences per batch)",
        "overrides": overrides, "epochs": epochs, "seconds": result["seconds"],
        "target_tokens_per_s": result["target_tokens_per_s_total"],
        "target_tokens_per_s_median_step": result["target_tokens_per_s_median"],
        "sentences_per_s": result["sentences_per_s_total"], "parameters": result["parameters"],
        "device": str(trainer.device),
    }


def decode_once(argv: list[str]) -> None:
    """The process timed as "whole process": load, translate in sentence batches, write; print timings as JSON."""
    p = argparse.ArgumentParser(prog="peer_compare.py decode-once")
    for name in ("--checkpoint", "--input", "--output", "--device"):
        p.add_argument(name, required=True)
    for name in ("--beam-size", "--batch-sentences"):
        p.add_argument(name, type=int, required=True)
    args = p.parse_args(argv)
    from nmt.inference.engine import SearchOptions, Translator
    from nmt.inference.translate_job import read_input_lines

    translator = Translator.from_checkpoint(args.checkpoint, device=args.device, max_input_words=None)
    t = translator.configs[0]["trainer"]
    # an unlimited token budget makes each call exactly one batch of these sentences
    options = SearchOptions(beam_size=args.beam_size, length_penalty=t["length_penalty"], batch_tokens=sys.maxsize)
    lines = read_input_lines(args.input)
    start = time.perf_counter()
    src_ids = translator.encode(lines)
    order = sorted(range(len(src_ids)), key=lambda i: -len(src_ids[i]))  # length-sorted, as translate.py
    hyps = [""] * len(lines)
    for first in range(0, len(order), args.batch_sentences):
        rows = order[first : first + args.batch_sentences]
        # no attention kept, as translate.py without heatmaps or alignments (and as JoeyNMT's beam search)
        for i, best in zip(rows, translator.translate_ids([src_ids[i] for i in rows], options, attention=False)):
            hyps[i] = translator.tokenizer.decode_tgt(best[0].tokens)
    sync(translator.device)
    decode_seconds = time.perf_counter() - start
    Path(args.output).write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    print(json.dumps({"sentences": len(lines), "decode_seconds": decode_seconds}))


def measure_our_decoding(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    """Greedy and beam 5 on test_2016_flickr: whole-process and decode-only sentences/s, and BLEU."""
    from nmt.common.metrics import corpus_scores
    from nmt.inference.translate_job import read_input_lines

    src = args.mirror / "multi30k" / f"{TEST_SPLIT}.de.gz"
    refs = read_input_lines(args.mirror / "multi30k" / f"{TEST_SPLIT}.en.gz")
    decode = {}
    for mode, beam in MODES.items():
        output = work_dir / f"ours.{mode}.{TEST_SPLIT}.en"
        command = [sys.executable, str(args.project_dir / "scripts" / "peer_compare.py"), "decode-once", "--checkpoint",
                   str(args.checkpoint), "--input", str(src), "--output", str(output), "--device", args.device,
                   "--beam-size", str(beam), "--batch-sentences", str(args.batch_sentences)]
        walls, decodes = [], []
        for rep in range(args.reps):
            start = time.perf_counter()
            done = subprocess.run(command, check=True, capture_output=True, text=True)
            walls.append(time.perf_counter() - start)
            inner = json.loads(done.stdout.strip().splitlines()[-1])
            decodes.append(inner["decode_seconds"])
            print(f"  ours {mode} rep {rep + 1}: whole process {walls[-1]:.1f} s, decoding {decodes[-1]:.1f} s",
                  flush=True)
        n, scores = inner["sentences"], corpus_scores(output.read_text(encoding="utf-8").splitlines(), refs)
        decode[mode] = {"beam_size": beam, "sentences": n, "reps": args.reps,
                        "decode_seconds": statistics.median(decodes), "process_seconds": statistics.median(walls),
                        "sentences_per_s_decode": n / statistics.median(decodes),
                        "sentences_per_s_process": n / statistics.median(walls), "bleu": scores["bleu"],
                        "chrf": scores["chrf"], "bleu_signature": scores["bleu_signature"]}
    return decode


def ratio_rows(ours: dict[str, Any], theirs: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per compared figure: ours, theirs, ours/theirs, the target and whether it is met.

    A figure missing on either side gives ``None`` for the ratio (never an estimate).
    """
    figures = [("training target tokens/s", ("training", "target_tokens_per_s")),
               ("training sentences/s", ("training", "sentences_per_s"))]
    for mode, name in (("greedy", "greedy"), ("beam5", "beam 5")):
        figures += [(f"{name} sentences/s (decoding alone)", ("decode", mode, "sentences_per_s_decode")),
                    (f"{name} sentences/s (whole process)", ("decode", mode, "sentences_per_s_process"))]

    def get(report: Any, keys: tuple[str, ...]) -> float | None:
        for key in keys:
            report = (report or {}).get(key)
        return report

    rows = []
    for figure, keys in figures:
        a, b, target = get(ours, keys), get(theirs, keys), TARGETS.get(figure)
        ratio = a / b if a is not None and b else None
        rows.append({"figure": figure, "ours": a, "theirs": b, "ratio": ratio, "target": target,
                     "met": None if ratio is None or target is None else ratio >= target})
    return rows


def render_markdown(report: dict[str, Any]) -> str:
    """The ratio table, the BLEU of the timed outputs, and where each figure comes from."""
    def num(value: float | None, digits: int = 1) -> str:
        return "not measured" if value is None else f"{value:,.{digits}f}"

    ours, theirs = report["ours"], report["theirs"]
    lines = [
        f"# Ours vs JoeyNMT 2.3.0, same machine ({report['host']['cpu_count']} CPUs), {report['date']}", "",
        f"Ours on {report['our_device']}" + (" (measured without a GPU)" if report["measured_without_gpu"] else "")
        + "; JoeyNMT on CPU. Same-size model: BiGRU encoder 256x2, GRU decoder 512, Bahdanau/additive attention.", "",
        "| figure | ours | JoeyNMT | ours / JoeyNMT | target | met |", "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in report["ratios"]:
        target = f">= {row['target']:g}x" if row["target"] else ""
        met = "" if row["met"] is None else ("yes" if row["met"] else "**no**")
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}x"
        lines.append(f"| {row['figure']} | {num(row['ours'])} | {num(row['theirs'])} | {ratio} | {target} | {met} |")
    lines += ["", "Translation quality of the timed outputs (test_2016_flickr, sacreBLEU cased 13a):", "",
              "| setting | ours BLEU | JoeyNMT BLEU | ours chrF | JoeyNMT chrF |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for mode in MODES:
        a, b = (ours.get("decode") or {}).get(mode, {}), (theirs.get("decode") or {}).get(mode, {})
        lines.append(f"| {mode} | {num(a.get('bleu'), 2)} | {num(b.get('bleu'), 2)} | {num(a.get('chrf'), 2)} "
                     f"| {num(b.get('chrf'), 2)} |")
    lines += ["", "Where the figures come from:", "",
              f"- ours, training: {(ours.get('training') or {}).get('source', 'not measured')}",
              f"- JoeyNMT, training: {theirs['training']['source']}",
              f"- translation: {TEST_SPLIT}, batches of {report['batch_sentences']} sentences (ours length-sorted), "
              "median of the reps; whole process = a fresh process that loads the model, translates and writes; "
              "decoding alone = timed inside it (JoeyNMT: its 'Generation took')",
              f"- peer figures: {report['peer_summary']}"]
    return "\n".join(lines) + "\n"


def measure_ours(args: argparse.Namespace, work_dir: Path) -> tuple[dict[str, Any], str]:
    """Our figures (or those of ``--ours-from``) and the device they were measured on."""
    if args.ours_from is not None:
        earlier = json.loads(args.ours_from.read_text())
        return earlier["ours"], earlier["our_device"]
    print("measuring ours: training", flush=True)
    ours = {"training": measure_our_training(args, work_dir)}
    if args.checkpoint:
        print("measuring ours: translation", flush=True)
        ours["decode"] = measure_our_decoding(args, work_dir)
    else:
        print("no --checkpoint: translation not measured", flush=True)
    return ours, ours["training"]["device"]


def main(argv: list[str] | None = None, project_dir: Path | None = None) -> dict[str, Any]:
    """Run (or read) the peer, measure (or read) ours, write the report; ``decode-once`` is the timed child.

    ``project_dir``: ``--project-dir``'s default.
    """
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["decode-once"]:
        decode_once(argv[1:])
        return {}
    if argv[:1] == ["time-to-bleu"]:
        from nmt_tools import time_to_bleu

        return time_to_bleu.main(argv[1:])
    args = parse_args(argv, project_dir)
    from nmt.common.provenance import provenance  # imported here: decode-once's start-up stays lean

    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="peer_compare_"))
    work_dir.mkdir(parents=True, exist_ok=True)
    peer_workdir = args.skip_peer_run or run_peer(args.peer_dir, work_dir / "joeynmt", args.mirror / "multi30k")
    summary_path = peer_workdir / "results" / "summary.json"
    theirs = load_peer_summary(summary_path)
    ours, our_device = measure_ours(args, work_dir)
    report = {**provenance("scripts/peer_compare.py", argv), "our_device": our_device,
              "measured_without_gpu": not our_device.startswith("cuda"),
              "checkpoint": args.checkpoint, "batch_sentences": args.batch_sentences,
              "peer_summary": str(summary_path), "ours": ours, "theirs": theirs, "ratios": ratio_rows(ours, theirs)}
    markdown = render_markdown(report)
    print(markdown)
    write_report(args.out, report, markdown)
    return report


if __name__ == "__main__":  # python -m nmt_tools.peer, from a plain install too
    main()
