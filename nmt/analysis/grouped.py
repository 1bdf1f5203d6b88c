"""The tables and figures of runs grouped over seeds (``compare_runs.py --group-by``): per direction, each group's
scores as mean ± standard deviation, its comparison with the baseline group, BLEU by length, attention sharpness
and speed; a figure of BLEU with error bars and one of the length curves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nmt.analysis.significance import ALPHA, TESTS
from nmt.inference.plotting import new_figure, save_png

DIFFERENCE = {"BLEU": "bleu_difference", "chrF2": "chrf_difference"}  # significance.against_baseline's keys


def mean_std(spread: dict[str, Any]) -> str:
    """``39.12 ± 0.31`` (the sample standard deviation; none with one seed)."""
    if spread["mean"] is None:
        return "–"
    return f"{spread['mean']:.2f}" + (f" ± {spread['std']:.2f}" if spread["std"] is not None else "")


def number(value: float | None, digits: int = 2, missing: str = "–") -> str:
    return missing if value is None else f"{value:,.{digits}f}"


def versus(row: dict[str, Any], metric: str) -> tuple[str, str]:
    """The difference of the means against the baseline, and ``k/n`` seed pairs significant by bs / ar."""
    vs = row["vs_baseline"]
    if vs is None:
        return "baseline", ""
    pairs = len(vs["pairs"])
    counts = " / ".join(f"{vs['significant_pairs'][metric][test]}/{pairs}" for test in TESTS)
    return f"{vs[DIFFERENCE[metric]]:+.2f}", counts


def direction_tables(rows: list[dict[str, Any]], key: str, baseline: str | None) -> list[str]:
    """One direction's tables: scores and tests; BLEU by length with attention sharpness and speed."""
    base = f" vs {baseline}" if baseline else ""
    lines = [f"| {key} | seeds | BLEU | chrF2 | Δ BLEU{base} | BLEU p < {ALPHA} (bs / ar) | Δ chrF2{base} "
             f"| chrF2 p < {ALPHA} (bs / ar) |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        bleu, chrf = versus(row, "BLEU"), versus(row, "chrF2")
        lines.append(f"| {row['group']} | {', '.join(map(str, row['seeds']))} | {mean_std(row['bleu'])} "
                     f"| {mean_std(row['chrf'])} | {bleu[0]} | {bleu[1]} | {chrf[0]} | {chrf[1]} |")
    buckets = rows[0]["by_length"]
    lines += ["", f"| {key} | " + " | ".join(b["range"] for b in buckets) + " | normalised entropy | largest weight "
              "| train tokens/s | beam sentences/s | training minutes, as run | parameters |",
              "| --- |" + " ---: |" * (len(buckets) + 6), "| *sentences* | "
              + " | ".join(str(b["n"]) for b in buckets) + " | | | | | | |"]
    for row in rows:
        lines.append(f"| {row['group']} | " + " | ".join(number(b["bleu"]) for b in row["by_length"])
                     + f" | {number(row['normalised_entropy'], 3)} | {number(row['max_weight'], 3)} "
                     f"| {number(row['train_tokens_per_s'], 0, 'not measured')} "
                     f"| {number(row['beam_sentences_per_s'], 1, 'not measured')} "
                     f"| {mean_std(row['train_minutes_as_run'])} | {row['parameters']:,} |")
    return lines


def speed_note(speeds: dict[str, Any] | None) -> list[str]:
    """Where the speed columns come from, and why the trainings' own minutes do not compare the groups."""
    as_run = ("Training minutes are each training's own wall time as it ran (mean ± std over the seeds), with "
              "whatever else shared the machine: they do not compare the groups' speed.")
    if speeds is None:
        return [f"Speeds: not measured (`benchmark.py study-speed` on an idle machine, passed as `--speed`). {as_run}"]
    sittings = "; ".join(f"{', '.join(s['directions'])}: {s['train_steps']} training steps, {s['device']}, "
                         f"{s['date']}, `{s['file']}`" for s in speeds["source"])
    return [f"Speeds: training steps (target tokens/s, median of steps) and the test split's beam decoding "
            f"(sentences/s, median of the reps) per group, timed back to back on an idle machine, one sitting per "
            f"report ({sittings}). {as_run}"]


def pair_table(rows: list[dict[str, Any]], key: str) -> list[str]:
    """Every seed pair's differences and p-values."""
    lines = [f"| {key} | seed | Δ BLEU | BLEU bs | BLEU ar | Δ chrF2 | chrF2 bs | chrF2 ar |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        for pair in (row["vs_baseline"] or {}).get("pairs", []):
            cells = [cell for m in ("BLEU", "chrF2")
                     for cell in (f"{pair[DIFFERENCE[m]]:+.2f}", *(f"{pair[m][t]:.4f}" for t in TESTS))]
            lines.append(f"| {row['group']} | {pair['seed']} | " + " | ".join(cells) + " |")
    return lines


def render_groups(groups: list[dict[str, Any]], key: str, baseline: str | None,
                  speeds: dict[str, Any] | None = None) -> str:
    """The grouped tables of every direction, with the tests' signatures, in markdown."""
    lines = [f"# Grouped by {key} over seeds", "",
             f"Per direction, the runs of one {key} are its seeds. Test BLEU and chrF2 (sacreBLEU, cased) of each "
             "run's best checkpoint as train.py decoded it, as mean ± sample standard deviation over the seeds."]
    if baseline:
        lines += ["", f"Against {baseline}: the difference of the means, and in how many seed pairs (a run of seed S "
                  f"against {baseline}'s run of seed S) sacrebleu's paired bootstrap resampling (bs) and approximate "
                  f"randomisation (ar) find the difference significant at p < {ALPHA}. A zero difference is never "
                  "significant."]
    lines += ["", *speed_note(speeds)]
    directions = list(dict.fromkeys(row["direction"] for row in groups))
    for direction in directions:
        rows = [row for row in groups if row["direction"] == direction]
        lines += ["", f"## {direction}", "", *direction_tables(rows, key, baseline)]
        if baseline:
            lines += ["", "Each seed pair: its own differences (the run minus the baseline's run of that seed) "
                      "and p-values:", "", *pair_table(rows, key)]
    signatures = {s for row in groups for p in (row["vs_baseline"] or {}).get("pairs", [])
                  for test in p["signatures"].values() for s in test.values()}
    lines += ["", "Test signatures:", *(f"- `{s}`" for s in sorted(signatures))] if signatures else []
    return "\n".join([*lines, "", ""])


def plot_groups(groups: list[dict[str, Any]], split: str, key: str, out: Path) -> None:
    """``<out>_groups.png``: mean test BLEU with the seeds' standard deviation as error bars, by group and
    direction; ``<out>_groups_length.png``: mean BLEU by source length, one panel per direction."""
    directions = list(dict.fromkeys(row["direction"] for row in groups))
    names = list(dict.fromkeys(row["group"] for row in groups))
    width = 0.8 / len(directions)
    fig, ax = new_figure(max(5.0, 1.1 * len(names) + 2), 4.0)
    for i, direction in enumerate(directions):
        rows = {row["group"]: row for row in groups if row["direction"] == direction}
        xs = [x for x, name in enumerate(names) if name in rows]
        means = [rows[names[x]]["bleu"]["mean"] for x in xs]
        errors = [rows[names[x]]["bleu"]["std"] or 0.0 for x in xs]
        bars = ax.bar([x + (i - (len(directions) - 1) / 2) * width for x in xs], means, width, yerr=errors,
                      capsize=3, label=direction)
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
    ax.set(ylabel="test BLEU (sacreBLEU, cased)", title=f"{split}: BLEU by {key}\n(mean ± std over seeds)")
    ax.legend()
    fig.tight_layout()
    save_png(fig, f"{out}_groups.png")

    fig, first = new_figure(5.5 * len(directions), 4.0)
    fig.delaxes(first)  # one panel per direction instead
    for i, direction in enumerate(directions):
        ax = fig.add_subplot(1, len(directions), i + 1)
        rows = [row for row in groups if row["direction"] == direction]
        labels = [f"{b['range']}\n(n={b['n']})" for b in rows[0]["by_length"]]
        for row in rows:
            ax.plot(range(len(labels)), [float("nan") if b["bleu"] is None else b["bleu"] for b in row["by_length"]],
                    marker="o", label=row["group"])
        ax.set_xticks(range(len(labels)), labels)
        ax.set(xlabel="source length (words)", ylabel="BLEU, mean over seeds", title=f"{direction}, {split}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, f"{out}_groups_length.png")
