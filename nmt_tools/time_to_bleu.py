"""Time to BLEU: the wall-clock minutes each toolkit needs to first reach a validation BLEU, from its own logs.

    python scripts/peer_compare.py time-to-bleu --ours RUN_DIR [RUN_DIR ...] \\
        --peer-workdir PEER_WORKDIR --out OUT

Ours: each run's ``results.json`` (``setup_seconds`` plus the ``wall_seconds`` recorded at each
validation: data, model, training and validations, from the start of ``train.py``'s work). The peer:
JoeyNMT's ``models/full/train.log`` in its WORKDIR, the minutes from the log's first line to each
"Evaluation result (greedy)" line, continued by ``--peer-continued`` logs of runs resumed from its
last checkpoint; its final test BLEU from the ``decode`` stage's sacreBLEU JSON.
Both validate with greedy search on Multi30k val and score cased sacreBLEU against the raw references.

A threshold a run never reached is reported as not reached, with the minutes it trained for; the ratio
is then a lower bound. Writes ``<out>.json`` and ``<out>.md``.

Not done here: training either toolkit (``train.py``; the peer's ``run.sh full decode``).
"""

from __future__ import annotations

import argparse
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from nmt.analysis.cli import write_report
from nmt_tools.cli import TEST_SPLIT, parser
from nmt_tools.peer_files import sacrebleu_score

THRESHOLDS = (25.0, 30.0, 35.0)
_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"
_PEER_VALIDATION = re.compile(_STAMP + r" .*Evaluation result \(greedy\): bleu:\s+([\d.]+)")
_PEER_STEP = re.compile(_STAMP + r" .*Epoch\s+(\d+), Step:\s+(\d+),")


def _minutes_between(start: str, end: str) -> float:
    form = "%Y-%m-%d %H:%M:%S,%f"
    return (datetime.strptime(end, form) - datetime.strptime(start, form)).total_seconds() / 60


def our_timeline(results: dict[str, Any]) -> list[dict[str, float]]:
    """``[{minutes, step, bleu}]`` per validation of a ``results.json``, minutes since the run's work began."""
    setup = float(results.get("setup_seconds") or 0.0)
    return [{"minutes": (setup + v["wall_seconds"]) / 60, "step": v["step"], "bleu": v["bleu"]}
            for v in results["validations"]]


def peer_timeline(log_text: str, start_minutes: float = 0.0) -> list[dict[str, float]]:
    """``[{minutes, step, bleu}]`` per validation in JoeyNMT's train.log, minutes since the log's first line.

    ``start_minutes`` is added to each: a run continued from a checkpoint starts where the run that
    wrote it ended.
    """
    first = re.search(_STAMP, log_text)
    if first is None:
        raise SystemExit("the peer's train.log has no timestamped lines; is it JoeyNMT 2.3's models/full/train.log?")
    steps = [(m[1], int(m[3])) for m in _PEER_STEP.finditer(log_text)]
    timeline = []
    for match in _PEER_VALIDATION.finditer(log_text):
        step = max((s for stamp, s in steps if stamp <= match[1]), default=0)  # the last logged step before it
        minutes = start_minutes + _minutes_between(first[1], match[1])
        timeline.append({"minutes": minutes, "step": step, "bleu": float(match[2])})
    return timeline


def _span_minutes(log_text: str) -> float:
    """Minutes from a log's first timestamped line to its last."""
    stamps = re.findall(_STAMP, log_text)
    return _minutes_between(stamps[0], stamps[-1]) if stamps else 0.0


def first_reached(timeline: list[dict[str, float]], threshold: float) -> float | None:
    """Minutes at the first validation with BLEU >= threshold; None if none reached it."""
    return next((point["minutes"] for point in timeline if point["bleu"] >= threshold), None)


def summarize(name: str, timeline: list[dict[str, float]], test_bleu: float | None, source: str) -> dict[str, Any]:
    """One table row: minutes to each threshold, the best validation BLEU, the trained minutes, test BLEU."""
    if not timeline:
        raise SystemExit(f"{source}: no validations recorded")
    return {"system": name, "source": source, "timeline": timeline, "test_bleu": test_bleu,
            "minutes_trained": timeline[-1]["minutes"], "best_val_bleu": max(p["bleu"] for p in timeline),
            "minutes_to": {f"{t:g}": first_reached(timeline, t) for t in THRESHOLDS}}


def load_ours(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "results.json"
    if not path.is_file():
        raise SystemExit(f"no {path}: pass run dirs that train.py finished")
    results = json.loads(path.read_text(encoding="utf-8"))
    test = (results.get("test") or {}).get(TEST_SPLIT) or {}
    name = f"ours ({run_dir.name}: {results.get('attention', '?')}, {results.get('parameters', 0):,} parameters)"
    return {**summarize(name, our_timeline(results), test.get("bleu"), str(path)), "run": run_dir.name}


def load_peer(workdir: Path, continued: list[Path] = ()) -> dict[str, Any]:
    """The peer's row from ``models/full/train.log`` and the logs of runs continued from its last checkpoint.

    JoeyNMT saves the weights when a run ends (``latest.ckpt``), so a run continued from there starts
    at the previous log's last line; only its own start-up (reading data, building the model) is added.
    """
    log = workdir / "models" / "full" / "train.log"
    if not log.is_file():
        raise SystemExit(f"no {log}: run the peer's `run.sh full` with WORKDIR={workdir}")
    text = log.read_text(encoding="utf-8", errors="replace")
    timeline, start = peer_timeline(text), _span_minutes(text)
    for path in continued:
        if not path.is_file():
            raise SystemExit(f"no {path}: pass the train.log of a JoeyNMT run continued from {log.parent}")
        text = path.read_text(encoding="utf-8", errors="replace")
        timeline += peer_timeline(text, start)
        start += _span_minutes(text)
    scores = workdir / "results" / f"sacrebleu_beam5.{TEST_SPLIT}.json"
    test_bleu = sacrebleu_score(json.loads(scores.read_text(encoding="utf-8")), "BLEU") if scores.is_file() else None
    return summarize("JoeyNMT 2.3.0", timeline, test_bleu, " + ".join(map(str, [log, *continued])))


def ratios(ours: dict[str, Any], peer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Peer minutes / our minutes per threshold; a bound ('>=') when the peer never got there."""
    out = {}
    for key, mine in ours["minutes_to"].items():
        theirs = peer["minutes_to"][key]
        if mine is None:
            out[key] = {"ratio": None, "bound": None}
        elif theirs is None:
            out[key] = {"ratio": peer["minutes_trained"] / mine, "bound": "at least"}
        else:
            out[key] = {"ratio": theirs / mine, "bound": None}
    return out


def render_markdown(ours: list[dict[str, Any]], peer: dict[str, Any]) -> str:
    """The table: one row per run, then the peer's minutes over each of our runs' (``peer_time_over_ours``)."""
    def minutes(row: dict[str, Any], key: str) -> str:
        value = row["minutes_to"][key]
        return f"{value:.1f}" if value is not None else f"not reached in {row['minutes_trained']:.0f}"

    keys = [f"{t:g}" for t in THRESHOLDS]
    lines = ["| system | " + " | ".join(f"min to val BLEU {k}" for k in keys) + " | best val BLEU | test BLEU |",
             "| --- | " + " | ".join("---:" for _ in keys) + " | ---: | ---: |"]
    for row in [*ours, peer]:
        test = "" if row["test_bleu"] is None else f"{row['test_bleu']:.2f}"
        lines.append(f"| {row['system']} | " + " | ".join(minutes(row, k) for k in keys)
                     + f" | {row['best_val_bleu']:.2f} | {test} |")
    for row in ours:
        cells = [_ratio_cell(row["peer_time_over_ours"][key]) for key in keys]
        lines.append(f"| JoeyNMT's minutes / ours ({row['run']}) | " + " | ".join(cells) + " | | |")
    return "\n".join(lines) + "\n"


def _ratio_cell(entry: dict[str, Any]) -> str:
    return "" if entry["ratio"] is None else ("≥ " if entry["bound"] else "") + f"{entry['ratio']:.1f}×"


def main(argv: list[str]) -> dict[str, Any]:
    p = parser(__doc__, reports=("out",))
    p.prog = "peer_compare.py time-to-bleu"
    p.add_argument("--ours", type=Path, nargs="+", required=True, help="our run dirs (each with results.json)")
    p.add_argument("--peer-workdir", type=Path, required=True, help="the WORKDIR of the peer's run.sh")
    p.add_argument("--peer-continued", type=Path, nargs="*", default=[], metavar="TRAIN_LOG",
                   help="train.log of JoeyNMT runs continued from the previous one's last checkpoint, in order")
    p.add_argument("--out", type=Path, required=True, help="report path without extension")
    args: argparse.Namespace = p.parse_args(argv)
    from nmt.common.provenance import provenance

    ours = [load_ours(run) for run in args.ours]
    peer = load_peer(args.peer_workdir, args.peer_continued)
    for row in ours:
        row["peer_time_over_ours"] = ratios(row, peer)
    markdown = render_markdown(ours, peer)
    report = {**provenance("scripts/peer_compare.py", ["time-to-bleu", *argv]), "thresholds": list(THRESHOLDS),
              "ours": ours, "peer": peer}
    print(markdown)
    write_report(args.out, report, markdown)
    return report
