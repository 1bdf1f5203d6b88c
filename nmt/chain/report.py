"""The chain's report: each run's val BLEU, test BLEU and chrF2 and minutes, each system's choice on val and its test
scores, as JSON and a markdown table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nmt.chain.plan import Chain, Stage
from nmt.common.provenance import provenance


def summary(chain: Chain, stages: list[Stage]) -> dict[str, Any]:
    """Each run's val BLEU, test BLEU and chrF2 and minutes (results.json), each system's choice on val and test
    scores; paths from the workdir."""
    split = str(chain.recipe.test_split)
    runs, systems, reports = [], [], []
    for stage in stages:
        output = stage.outputs[0]
        if stage.kind == "report":
            reports.append(chain.relative(output.with_suffix(".md")))
        elif stage.name.startswith("tune "):
            systems.append(system_summary(chain, stage.name.removeprefix("tune "), output))
        elif stage.name.startswith("score "):
            system, extra_split = stage.name.removeprefix("score ").rsplit(" ", 1)
            chosen = next(iter(json.loads(output.read_text(encoding="utf-8"))["test"].values()))
            next(s for s in systems if s["system"] == system)["more_tests"][extra_split] = chosen["bleu"]
        elif (output / "results.json").is_file():
            results = json.loads((output / "results.json").read_text(encoding="utf-8"))
            test = results["test"].get(split) or {}
            runs.append({"run": stage.name, "dir": chain.relative(output), "val_bleu": results["valid"]["bleu"],
                         "test_bleu": test.get("bleu"), "test_chrf": test.get("chrf"),
                         "minutes": results.get("wall_seconds", 0) / 60})
    students = {}  # per pair, the student system val prefers (the recipe may train several)
    for pair in chain.recipe.pairs:
        if mine := [s for s in systems if s["system"].startswith(f"{pair} student")]:
            students[pair] = max(mine, key=lambda s: s["val_bleu"])["system"]
    alone = {}  # per pair, the one-model system val prefers without reranking: what a Hub folder ships
    for pair in chain.recipe.pairs:
        if mine := [s for s in systems if s["system"].startswith(f"{pair} ") and s["alone"]]:
            best = max(mine, key=lambda s: s["alone"]["val_bleu"])
            alone[pair] = {"system": best["system"], **best["alone"]}
    return {"recipe": chain.recipe_name, "test_split": split, "runs": runs, "systems": systems,
            "student_chosen_on_val": students, "one_model_chosen_on_val": alone, "reports": reports,
            **provenance("reproduce.py")}


def system_summary(chain: Chain, system: str, output: Path) -> dict[str, Any]:
    """A tune stage's system: its choice on val, that choice's test scores, and, for one model (not an ensemble),
    ``alone``: its best setting without reranking (the reverse models stay behind), with test scores and output."""
    from nmt.analysis.decoding import chosen_settings, setting_label  # brings PyTorch: only a recipe with systems

    report = json.loads(output.read_text(encoding="utf-8"))
    chosen_name = next(iter(report["test"]))  # "chosen on <split>"
    chosen = report["test"][chosen_name]
    summary = {"system": system, "choice": setting_label(report["best"]), "val_bleu": report["best"]["bleu"],
               "test_bleu": chosen["bleu"], "test_chrf": chosen.get("chrf"), "report": chain.relative(output),
               "more_tests": {}, "alone": None}
    if ", " in str(report.get("checkpoint", "")):  # an ensemble: no one folder holds it
        return summary
    *_, (name, row) = chosen_settings(report["grid"], report["split"]).items()  # the last choice is plain
    scored, suffix = report["test"][name], ".without_reranking" if name != chosen_name else ""
    checkpoint, tgt = Path(report["checkpoint"]), system.split()[0].split("-")[1]
    translations = output.with_name(f"{output.stem}{suffix}.{report['test_split']}.{tgt}")
    summary["alone"] = {"choice": f"beam {row['beam_size']}, α = {row['length_penalty']:g}",
                        "beam_size": row["beam_size"], "length_penalty": row["length_penalty"],
                        "val_bleu": row["bleu"], "test_bleu": scored["bleu"], "test_chrf": scored.get("chrf"),
                        "checkpoint": chain.relative(checkpoint) if checkpoint.is_absolute() else str(checkpoint),
                        "translations": chain.relative(translations)}
    return summary


def render(report: dict[str, Any]) -> str:
    """The runs' table and the systems' (when the recipe has systems), in markdown."""
    split = report["test_split"]
    lines = [f"# recipe={report['recipe']}: {report['date']}", "",
             f"| run | val BLEU | {split} BLEU | {split} chrF2 | minutes |", "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['run']} | {r['val_bleu']:.2f} | {fmt(r['test_bleu'])} | {fmt(r.get('test_chrf'))} | "
              f"{r['minutes']:.1f} |" for r in report["runs"]]
    more = list(dict.fromkeys(k for s in report["systems"] for k in s["more_tests"]))
    if report["systems"]:
        lines += ["", f"| system | chosen on val | val BLEU | {split} BLEU | {split} chrF2 |"
                  + "".join(f" {k} BLEU |" for k in more),
                  "| --- | --- | ---: | ---: | ---: |" + " ---: |" * len(more)]
    lines += [f"| {s['system']} | {s['choice']} | {s['val_bleu']:.2f} | {s['test_bleu']:.2f} | "
              f"{fmt(s.get('test_chrf'))} |" + "".join(f" {fmt(s['more_tests'].get(k))} |" for k in more)
              for s in report["systems"]]
    if report["systems"]:
        lines += ["", "Each system's decoding is chosen on val; its test scores are that choice, scored once."]
    chosen = report["student_chosen_on_val"]
    lines += ["", *(f"Student chosen on val for {pair}: {name}." for pair, name in chosen.items())]
    lines += [f"One model to ship for {pair}, chosen on val without reranking: {a['system']} at {a['choice']} (val "
              f"BLEU {a['val_bleu']:.2f}; {split} BLEU {a['test_bleu']:.2f}, chrF2 {fmt(a.get('test_chrf'))}; "
              f"{a['checkpoint']})." for pair, a in report.get("one_model_chosen_on_val", {}).items()]
    lines += [f"The study's report: {path}" for path in report.get("reports", [])]
    return "\n".join([*lines, ""])


def fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"
