"""The chain's report: each run's val BLEU, test BLEU and chrF2 and minutes, each system's choice on val and its test
scores, as JSON and a markdown table."""

from __future__ import annotations

import json
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
            from nmt.analysis.decoding import setting_label  # brings PyTorch: only a recipe with systems needs it

            report = json.loads(output.read_text(encoding="utf-8"))
            chosen = next(iter(report["test"].values()))
            systems.append({"system": stage.name.removeprefix("tune "), "choice": setting_label(report["best"]),
                            "val_bleu": report["best"]["bleu"], "test_bleu": chosen["bleu"],
                            "test_chrf": chosen.get("chrf"),
                            "report": chain.relative(output), "more_tests": {}})
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
    return {"recipe": chain.recipe_name, "test_split": split, "runs": runs, "systems": systems,
            "student_chosen_on_val": students, "reports": reports, **provenance("reproduce.py")}


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
    lines += [f"The study's report: {path}" for path in report.get("reports", [])]
    return "\n".join([*lines, ""])


def fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"
