"""Side by side with JoeyNMT on the same machine, in one run: training and translation speed ratios.

    python scripts/peer_compare.py --checkpoint outputs/RUN_DIR                  # ~45 min on 2 cores
    python scripts/peer_compare.py --checkpoint RUN --skip-peer-run /tmp/joeynmt-peer   # reuse the peer's figures
    python scripts/peer_compare.py --checkpoint RUN --our-steps 200              # a shorter training measurement

The peer is ``../shared/peers/joeynmt`` (``--peer-dir``): JoeyNMT 2.3.0 in its own venv, the same-size
model (BiGRU 256x2 encoder, GRU 512 decoder, Bahdanau attention, embeddings 256) on Multi30k de->en.
Its ``run.sh`` stages ``venv data throughput decode summary`` run first, with ``WORKDIR`` under the
output folder; its figures are read from ``$WORKDIR/results/summary.json`` (``scripts/summarize.py``
there). Right after, on the same machine, our equivalents:

- training: target tokens/s of ``model=default attention=additive`` over one full epoch (or
  ``--our-steps`` steps), timed as ``scripts/benchmark.py`` times it, on CPU unless ``--device``
  says otherwise (the peer runs on CPU). The peer's figure is its one-epoch throughput run:
  target tokens / training seconds, both from JoeyNMT's own epoch log line.
- translation: Multi30k test_2016_flickr (1000 lines) with ``--checkpoint``, greedy and beam 5
  (length penalty 1.0), in batches of 128 sentences, ``--reps`` times each (median), timed two ways
  as the peer is: the whole process (a fresh ``python scripts/peer_compare.py decode-once ...``:
  start-up, imports, checkpoint load, decoding, writing) and decoding alone (encode, search,
  detokenize, timed inside that process). Our batches are length-sorted, as ``translate.py`` always
  does; JoeyNMT's are formed as its ``translate`` command forms them (no length sorting configured).
  BLEU of both outputs is reported next to the speed.

Prints and saves ``<out>.json`` and ``<out>.md`` with the ratios ours/theirs and the targets: >= 2x
training tokens/s, >= 3x beam-5 sentences/s. Nothing here estimates: a figure that was not measured
is left empty, and a measurement made without a GPU says so.

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

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # for benchmark

PEER_STAGES = ("venv", "data", "throughput", "decode", "summary")
SPLIT = "test_2016_flickr"
MODES = {"greedy": 1, "beam5": 5}  # the peer's names for its two decode settings -> beam size
TARGETS = {"training target tokens/s": 2.0, "beam 5 sentences/s (decoding alone)": 3.0,
           "beam 5 sentences/s (whole process)": 3.0}
OUR_TRAINING_OVERRIDES = ["model=default", "attention=additive"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default=None,
                        help="our trained run dir or .pt for the translation figures (without it: training only)")
    parser.add_argument("--peer-dir", type=Path, default=REPO_ROOT.parent / "shared" / "peers" / "joeynmt")
    parser.add_argument("--skip-peer-run", type=Path, default=None, metavar="PEER_WORKDIR",
                        help="do not run the peer; read PEER_WORKDIR/results/summary.json of an earlier run")
    parser.add_argument("--ours-from", type=Path, default=None, metavar="JSON",
                        help="do not measure ours; reuse the 'ours' section of an earlier peer_compare JSON")
    parser.add_argument("--our-steps", type=int, default=None, help="timed training steps (default: one epoch)")
    parser.add_argument("--warmup-steps", type=int, default=10, help="untimed training steps before timing")
    parser.add_argument("--reps", type=int, default=3, help="translation runs per setting; the median counts")
    parser.add_argument("--batch-sentences", type=int, default=128)
    parser.add_argument("--device", default="cpu", help="ours: cpu (as the peer) | cuda | auto")
    parser.add_argument("--mirror", type=Path,
                        default=Path(os.environ.get("NMT_DATA_MIRROR") or REPO_ROOT.parent / "shared" / "corpora"),
                        help="corpus mirror with multi30k/ (both systems read it)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output path without extension (default: docs/results/peer_comparison_<device>)")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="where the peer's WORKDIR and our translations go (default: a new temp dir)")
    return parser.parse_args(argv)


# --------------------------------------------------------------------------------------------------
# The peer: run it, read its summary
# --------------------------------------------------------------------------------------------------


def run_peer(peer_dir: Path, workdir: Path, corpus: Path) -> Path:
    """Run the peer's stages with ``WORKDIR=workdir``; its log goes to ``workdir/run_sh.log``."""
    script = peer_dir / "run.sh"
    if not script.is_file():
        raise SystemExit(f"no {script}; pass --peer-dir (the folder with JoeyNMT's run.sh)")
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "WORKDIR": str(workdir), "CORPUS": str(corpus)}
    print(f"running the peer: WORKDIR={workdir} bash {script} {' '.join(PEER_STAGES)} (~30 min on 2 cores)",
          flush=True)
    log_path = workdir / "run_sh.log"
    with open(log_path, "w") as log:
        done = subprocess.run(["bash", str(script), *PEER_STAGES], env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"the peer's run.sh failed (exit {done.returncode}); see {log_path}")
    return workdir


def _sacrebleu_score(metrics: Any, name: str) -> float | None:
    """A score from sacrebleu's ``-w 2`` JSON output (a list of ``{"name", "score", ...}`` dicts)."""
    if not isinstance(metrics, list):
        return None
    for metric in metrics:
        if metric.get("name") == name:
            return float(metric["score"])
    return None


def load_peer_summary(path: Path) -> dict[str, Any]:
    """The peer's ``results/summary.json`` in the shape our own figures use.

    Training comes from the one-epoch ``throughput`` run (the ``full`` run if that is all there is):
    target tokens and training seconds as JoeyNMT's epoch log reports them. Decoding: the median
    over reps of the whole-process wall time and of JoeyNMT's own "Generation took" time.

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
    run = summary[run_name]
    totals = run["totals"]
    decode = {}
    for mode, beam in MODES.items():
        entry = (summary.get("decode") or {}).get(f"{mode}.{SPLIT}")
        if entry is None:
            continue
        decode[mode] = {
            "beam_size": beam,
            "sentences": entry["n_sents"],
            "reps": len(entry["runs"]),
            "decode_seconds": entry["generation_sec_median"],
            "process_seconds": entry["process_wall_sec_median"],
            "sentences_per_s_decode": entry["sent_per_sec_generation"],
            "sentences_per_s_process": entry["sent_per_sec_process_wall"],
            "bleu": _sacrebleu_score(entry.get("sacrebleu"), "BLEU"),
            "chrf": _sacrebleu_score(entry.get("sacrebleu"), "chrF2"),
        }
    if not decode:
        raise SystemExit(f"{path} has no {SPLIT} decode figures (run.sh stage decode)")
    return {
        "system": "JoeyNMT 2.3.0 (BiGRU + Bahdanau), CPU",
        "training": {
            "source": f"{run_name} run, {totals['epochs']} epoch(s), batches of {run['batch_sentences']} sentences",
            "epochs": totals["epochs"],
            "seconds": totals["train_sec"],
            "target_tokens_per_s": totals["trg_tok_per_sec"],
            "sentences_per_s": totals["sent_per_sec"],
        },
        "decode": decode,
    }


# --------------------------------------------------------------------------------------------------
# Ours: training via scripts/benchmark.py, decoding in a fresh process per rep
# --------------------------------------------------------------------------------------------------


def measure_our_training(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    """Target tokens/s of the peer-sized model over one epoch (or ``--our-steps``), as benchmark.py times it."""
    import benchmark

    from nmt.training import DistInfo, Trainer

    overrides = [*OUR_TRAINING_OVERRIDES, f"trainer.device={args.device}", f"data.mirror={args.mirror}"]
    trainer = Trainer(benchmark.compose_config(overrides), work_dir / "train_run", DistInfo())
    try:
        result = benchmark.measure_training(trainer, args.our_steps, args.warmup_steps)
    finally:
        trainer.logger.close()
    seconds = result["seconds"]
    return {
        "source": f"{result['steps']} steps ({result['steps'] / result['batches_per_epoch']:.2f} epochs) of "
                  f"{' '.join(OUR_TRAINING_OVERRIDES)}, max_tokens {trainer.cfg.data.max_tokens} "
                  f"(~{result['sentences_per_batch_mean']:.0f} sentences per batch)",
        "overrides": overrides,
        "epochs": result["steps"] / result["batches_per_epoch"],
        "seconds": seconds,
        "target_tokens_per_s": result["target_tokens_per_s_total"],
        "target_tokens_per_s_median_step": result["target_tokens_per_s_median"],
        "sentences_per_s": result["sentences_per_s_total"],
        "parameters": result["parameters"],
        "device": str(trainer.device),
    }


def decode_once(argv: list[str]) -> None:
    """The process timed as "whole process": load, translate in sentence batches, write; print timings as JSON."""
    parser = argparse.ArgumentParser(prog="peer_compare.py decode-once")
    for name in ("--checkpoint", "--input", "--output", "--device"):
        parser.add_argument(name, required=True)
    parser.add_argument("--beam-size", type=int, required=True)
    parser.add_argument("--batch-sentences", type=int, required=True)
    args = parser.parse_args(argv)

    import torch

    from nmt.translation import read_input_lines
    from nmt.translator import SearchOptions, Translator

    translator = Translator.from_checkpoint(args.checkpoint, device=args.device, max_input_words=None)
    device, tokenizer, t = translator.device, translator.tokenizer, translator.configs[0]["trainer"]
    lines = read_input_lines(args.input)
    start = time.perf_counter()
    src_ids = translator.encode(lines)
    order = sorted(range(len(src_ids)), key=lambda i: -len(src_ids[i]))  # length-sorted, as translate.py
    hyps = [""] * len(lines)
    for first in range(0, len(order), args.batch_sentences):
        rows = order[first : first + args.batch_sentences]
        # an unlimited token budget makes each call exactly one batch of these sentences
        options = SearchOptions(beam_size=args.beam_size, length_penalty=t["length_penalty"], max_len=t["max_len"],
                                max_len_ratio=t["max_len_ratio"], batch_tokens=sys.maxsize)
        nbest = translator.translate_ids([src_ids[i] for i in rows], options)
        for i, best in zip(rows, nbest):
            hyps[i] = tokenizer.decode_tgt(best[0].tokens)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    decode_seconds = time.perf_counter() - start
    Path(args.output).write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    print(json.dumps({"sentences": len(lines), "decode_seconds": decode_seconds}))


def measure_our_decoding(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    """Greedy and beam 5 on test_2016_flickr: whole-process and decode-only sentences/s, and BLEU."""
    from nmt.evaluation import corpus_scores
    from nmt.translation import read_input_lines

    src = args.mirror / "multi30k" / f"{SPLIT}.de.gz"
    refs = read_input_lines(args.mirror / "multi30k" / f"{SPLIT}.en.gz")
    decode = {}
    for mode, beam in MODES.items():
        output = work_dir / f"ours.{mode}.{SPLIT}.en"
        command = [sys.executable, str(Path(__file__).resolve()), "decode-once", "--checkpoint", str(args.checkpoint),
                   "--input", str(src), "--output", str(output), "--device", args.device,
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
        n = inner["sentences"]
        scores = corpus_scores(output.read_text(encoding="utf-8").splitlines(), refs)
        decode[mode] = {
            "beam_size": beam,
            "sentences": n,
            "reps": args.reps,
            "decode_seconds": statistics.median(decodes),
            "process_seconds": statistics.median(walls),
            "sentences_per_s_decode": n / statistics.median(decodes),
            "sentences_per_s_process": n / statistics.median(walls),
            "bleu": scores["bleu"],
            "chrf": scores["chrf"],
            "bleu_signature": scores["bleu_signature"],
        }
    return decode


# --------------------------------------------------------------------------------------------------
# Ratios and the report
# --------------------------------------------------------------------------------------------------


def ratio_rows(ours: dict[str, Any], theirs: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per compared figure: ours, theirs, ours/theirs, the target and whether it is met.

    A figure missing on either side gives ``None`` for the ratio (never an estimate).
    """
    figures = [("training target tokens/s", ("training", "target_tokens_per_s")),
               ("training sentences/s", ("training", "sentences_per_s"))]
    for mode, name in (("greedy", "greedy"), ("beam5", "beam 5")):
        figures += [(f"{name} sentences/s (decoding alone)", ("decode", mode, "sentences_per_s_decode")),
                    (f"{name} sentences/s (whole process)", ("decode", mode, "sentences_per_s_process"))]

    def get(report: dict[str, Any], keys: tuple[str, ...]) -> float | None:
        for key in keys:
            report = (report or {}).get(key)
        return report

    rows = []
    for figure, keys in figures:
        a, b = get(ours, keys), get(theirs, keys)
        ratio = a / b if a is not None and b else None
        target = TARGETS.get(figure)
        rows.append({"figure": figure, "ours": a, "theirs": b, "ratio": ratio, "target": target,
                     "met": None if ratio is None or target is None else ratio >= target})
    return rows


def render_markdown(report: dict[str, Any]) -> str:
    def num(value: float | None, digits: int = 1) -> str:
        return "not measured" if value is None else f"{value:,.{digits}f}"

    ours, theirs = report["ours"], report["theirs"]
    lines = [
        f"# Ours vs JoeyNMT 2.3.0, same machine ({report['host']['cpu_count']} CPUs), {report['date']}",
        "",
        f"Ours on {report['our_device']}" + (" (measured without a GPU)" if report["measured_without_gpu"] else "")
        + "; JoeyNMT on CPU. Same-size model: BiGRU encoder 256x2, GRU decoder 512, Bahdanau/additive attention.",
        "",
        "| figure | ours | JoeyNMT | ours / JoeyNMT | target | met |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
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
              f"- translation: {SPLIT}, batches of {report['batch_sentences']} sentences (ours length-sorted), "
              "median of the reps; whole process = a fresh process that loads the model, translates and writes; "
              "decoding alone = timed inside it (JoeyNMT: its 'Generation took')",
              f"- peer figures: {report['peer_summary']}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["decode-once"]:
        decode_once(argv[1:])
        return {}
    args = parse_args(argv)
    from nmt.provenance import provenance  # imported here: decode-once's start-up stays lean

    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="peer_compare_"))
    work_dir.mkdir(parents=True, exist_ok=True)
    if args.skip_peer_run is not None:
        peer_workdir = args.skip_peer_run
    else:
        peer_workdir = run_peer(args.peer_dir, work_dir / "joeynmt", args.mirror / "multi30k")
    summary_path = peer_workdir / "results" / "summary.json"
    theirs = load_peer_summary(summary_path)

    if args.ours_from is not None:
        earlier = json.loads(args.ours_from.read_text())
        ours, our_device = earlier["ours"], earlier["our_device"]
    else:
        print("measuring ours: training", flush=True)
        ours = {"training": measure_our_training(args, work_dir)}
        our_device = ours["training"]["device"]
        if args.checkpoint:
            print("measuring ours: translation", flush=True)
            ours["decode"] = measure_our_decoding(args, work_dir)
        else:
            print("no --checkpoint: translation not measured", flush=True)

    report = {
        **provenance("scripts/peer_compare.py", argv),
        "our_device": our_device,
        "measured_without_gpu": not our_device.startswith("cuda"),
        "checkpoint": str(args.checkpoint) if args.checkpoint else None,
        "batch_sentences": args.batch_sentences,
        "peer_summary": str(summary_path),
        "ours": ours,
        "theirs": theirs,
        "ratios": ratio_rows(ours, theirs),
    }
    markdown = render_markdown(report)
    out = args.out or REPO_ROOT / "docs" / "results" / f"peer_comparison_{our_device.split(':')[0]}"
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    Path(f"{out}.md").write_text(markdown, encoding="utf-8")
    print(markdown)
    print(f"wrote {out}.json and {out}.md")
    return report


if __name__ == "__main__":
    main()
