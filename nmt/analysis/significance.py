"""Runs grouped over seeds per direction, and each group against a baseline, seed by seed, by sacrebleu's own paired
bootstrap resampling and approximate randomisation (``sacrebleu.significance.PairedTest``), for BLEU and chrF2."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from nmt.analysis.cli import RunError

TESTS = ("bs", "ar")  # sacrebleu's test types: paired bootstrap resampling, approximate randomisation
ALPHA = 0.05  # a difference counts as significant below this p-value


@dataclass
class Output:
    """One run's translations of the test split and its references (kept out of the report's JSON)."""

    run: dict[str, Any]
    hypotheses: list[str]
    references: list[str]


def paired_p_values(baseline: Sequence[str], system: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
    """p-values of ``system`` against ``baseline`` by each of sacrebleu's paired tests (its default sample counts and
    seed, ``SACREBLEU_SEED``), for BLEU and chrF2.

    A zero difference in a metric is never significant: sacrebleu counts resamples with a strictly larger
    difference, so two identical outputs would read ``p = 1/(n+1)`` (the behaviour it takes from MultEval,
    jhclark/multeval#5); such a p-value is reported as 1.

    Returns:
        ``{"BLEU": {"bs": p, "ar": p}, "chrF2": {...}, "signatures": {"bs": {"BLEU": sig, ...}, "ar": {...}}}``.
    """
    p_values: dict[str, Any] = {"BLEU": {}, "chrF2": {}, "signatures": {}}
    for test in TESTS:
        metrics = {"BLEU": BLEU(), "chrF2": CHRF()}
        signatures, scores = PairedTest([("baseline", list(baseline)), ("system", list(system))], metrics,
                                        [list(references)], test_type=test)()
        for metric in ("BLEU", "chrF2"):
            base, mine = scores[metric]
            p_values[metric][test] = 1.0 if base.score == mine.score else float(mine.p_value)
        p_values["signatures"][test] = {metric: str(signature) for metric, signature in signatures.items()}
    return p_values


def group(outputs: Sequence[Output], key: str) -> dict[tuple[str, str], dict[int, Output]]:
    """The outputs by (direction, value of ``key``), each group's by seed.

    Raises:
        RunError: two runs of one group with the same seed (naming both), or a run tested against other
            references than the first of its direction.
    """
    groups: dict[tuple[str, str], dict[int, Output]] = {}
    first: dict[str, Output] = {}  # per direction: the references every run must share
    for output in outputs:
        run = output.run
        other = first.setdefault(run["direction"], output)
        if output.references != other.references:
            raise RunError(f"{run['run_dir']} scores {run['split']} against other references than "
                           f"{other.run['run_dir']} (another test set); pass runs tested on the same one")
        seeds = groups.setdefault((run["direction"], str(run["group"])), {})
        if (twin := seeds.get(run["seed"])) is not None:
            raise RunError(f"{run['run_dir']} and {twin.run['run_dir']} are both {key}={run['group']} "
                           f"{run['direction']} seed {run['seed']}; pass one run per seed")
        seeds[run["seed"]] = output
    return groups


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """``{"mean", "std", "n"}`` of the values given (None skipped); std is the sample's (None below two values)."""
    present = [v for v in values if v is not None]
    return {"mean": statistics.fmean(present) if present else None,
            "std": statistics.stdev(present) if len(present) > 1 else None, "n": len(present)}


def against_baseline(mine: dict[int, Output], baseline: dict[int, Output]) -> dict[str, Any]:
    """The group against the baseline: the mean differences, and the tests of each seed both have."""
    pairs = []
    for seed in sorted(set(mine) & set(baseline)):
        tested = paired_p_values(baseline[seed].hypotheses, mine[seed].hypotheses, mine[seed].references)
        differences = {f"{m}_difference": mine[seed].run["test"][m] - baseline[seed].run["test"][m]
                       for m in ("bleu", "chrf")}  # a pair's own sign: significant pairs may differ either way
        pairs.append({"seed": seed, **differences, **{m: tested[m] for m in ("BLEU", "chrF2")},
                      "signatures": tested["signatures"]})
    significant = {metric: {test: sum(p[metric][test] < ALPHA for p in pairs) for test in TESTS}
                   for metric in ("BLEU", "chrF2")}
    mean = {m: statistics.fmean(o.run["test"][m] for o in mine.values()) for m in ("bleu", "chrf")}
    base = {m: statistics.fmean(o.run["test"][m] for o in baseline.values()) for m in ("bleu", "chrf")}
    return {"bleu_difference": mean["bleu"] - base["bleu"], "chrf_difference": mean["chrf"] - base["chrf"],
            "pairs": pairs, "significant_pairs": significant, "unpaired_seeds": sorted(set(mine) ^ set(baseline))}


def summarise(outputs: Sequence[Output], key: str, baseline: str | None,
              speeds: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Per direction and group: the scores over seeds (mean, std), the means of BLEU by length, attention
    sharpness, the trainings' wall time as they ran, parameters, speed as ``speeds`` measured it (``load_speeds``;
    None: not measured), and (with ``baseline``) the comparison with the baseline group.

    Raises:
        RunError: a direction without a run of ``baseline``, or two runs of one group and seed.
    """
    groups = group(outputs, key)
    rows = []
    for (direction, value), seeds in groups.items():
        if baseline is not None and (direction, baseline) not in groups:
            raise RunError(f"no run with {key}={baseline} in {direction} to compare the others with; "
                           f"pass its runs or another --baseline")
        runs = [seeds[s].run for s in sorted(seeds)]
        sharp = [r["attention_sharpness"] for r in runs if isinstance(r["attention_sharpness"], dict)]
        timed = (speeds or {}).get("by_group", {}).get((direction, str(value))) or {}
        rows.append({
            "direction": direction, "group": value, "seeds": sorted(seeds), "runs": [r["run_dir"] for r in runs],
            "bleu": spread([r["test"]["bleu"] for r in runs]), "chrf": spread([r["test"]["chrf"] for r in runs]),
            "by_length": [{**bucket, "bleu": spread([r["by_length"][i]["bleu"] for r in runs])["mean"]}
                          for i, bucket in enumerate(runs[0]["by_length"])],
            "normalised_entropy": spread([s["normalised_entropy"] for s in sharp])["mean"],
            "max_weight": spread([s["max_weight"] for s in sharp])["mean"],
            "train_minutes_as_run": spread([r["train_seconds"] / 60 for r in runs]),
            "train_tokens_per_s": timed.get("train_tokens_per_s"),
            "beam_sentences_per_s": timed.get("beam_sentences_per_s"),
            "parameters": runs[0]["parameters"], "devices": sorted({r["device"] for r in runs}),
            "vs_baseline": (against_baseline(seeds, groups[(direction, baseline)])
                            if baseline is not None and value != baseline else None),
        })
    return sorted(rows, key=lambda row: row["direction"])  # stable: the runs' order within a direction
