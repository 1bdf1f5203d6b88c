"""Runs grouped over seeds and tested against a baseline (nmt.analysis.significance through compare_runs.py
--group-by): sacrebleu's own numbers on fixed outputs, identical systems never significant, and the runs it refuses.

No training: each run dir gets a results.json, a config.yaml (the tiny reversal corpus of test_training.py) with
its seed, and saved test translations.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from nmt.analysis import compare
from nmt.analysis.cli import RunError
from nmt.analysis.significance import paired_p_values
from nmt.common.settings import to_plain_dict
from nmt.data import prepare_data
from tests.test_compare_runs import PNG_SIGNATURE, fake_results
from tests.test_training import tiny_config

REPO_ROOT = Path(__file__).resolve().parents[1]
REFS = ["a man rides a red bike down the street", "two dogs play in the snow", "a child eats an apple",
        "the woman sings on a stage", "people walk past a shop", "a cat sleeps on the sofa"] * 4
SYSTEM_A = [r.replace("red", "blue") if i % 3 else r for i, r in enumerate(REFS)]
SYSTEM_B = [" ".join(r.split()[:4]) if i % 2 else r for i, r in enumerate(REFS)]


def sacrebleu_p(baseline: list[str], system: list[str], test: str) -> dict[str, float]:
    """p-values as sacrebleu computes them, called directly."""
    _, scores = PairedTest([("b", baseline), ("s", system)], {"BLEU": BLEU(), "chrF2": CHRF()}, [REFS],
                           test_type=test)()
    return {metric: scores[metric][1].p_value for metric in ("BLEU", "chrF2")}


@pytest.mark.parametrize("test", ["bs", "ar"])
def test_the_p_values_are_sacrebleus_own(test: str) -> None:
    mine = paired_p_values(SYSTEM_A, SYSTEM_B, REFS)
    assert {metric: mine[metric][test] for metric in ("BLEU", "chrF2")} == sacrebleu_p(SYSTEM_A, SYSTEM_B, test)
    assert f"{test}:" in mine["signatures"][test]["BLEU"] and "seed:12345" in mine["signatures"][test]["chrF2"]


def test_identical_systems_are_never_significant() -> None:
    for system in (SYSTEM_A, SYSTEM_B, REFS):
        tested = paired_p_values(system, list(system), REFS)
        assert all(tested[m][t] == 1.0 for m in ("BLEU", "chrF2") for t in ("bs", "ar"))
    # why the rule exists: sacrebleu itself gives two identical outputs its smallest p-value
    assert sacrebleu_p(SYSTEM_A, SYSTEM_A, "ar")["BLEU"] < 0.05


def seed_run(root: Path, cfg, attention: str, seed: int, hyps: list[str] | None, split: str = "test") -> Path:
    run = root / f"{attention}_de-en" / f"seed{seed}"
    run.mkdir(parents=True)
    results = fake_results(attention, run)
    results["test"] = {split: results["test"]["test"]}
    (run / "results.json").write_text(json.dumps(results))
    config = OmegaConf.create(to_plain_dict(cfg))
    config.trainer.seed = seed
    config.data.files[split] = config.data.files.test  # "test_2017": the same files under another name
    OmegaConf.save(config, run / "config.yaml")
    if hyps is not None:
        (run / "translations").mkdir()
        (run / "translations" / f"{split}.en").write_text("".join(h + "\n" for h in hyps))
    return run


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path], dict[str, list[list[str]]]]:
    """additive: 3 seeds; dot: seeds 42 and 1 far worse than additive's, seed 2 the same translations."""
    tmp = tmp_path_factory.mktemp("seeds")
    cfg = tiny_config(tmp, [])
    refs = list(prepare_data(cfg.data).tests["test"].tgt_text)
    rng = random.Random(0)
    additive = [[r if rng.random() < 0.9 else r[::-1] for r in refs] for _ in range(3)]
    dot = [[r.split()[0] if len(r.split()) > 2 else r for r in refs] for _ in range(2)] + [additive[2]]
    root = tmp / "runs"
    runs = [seed_run(root, cfg, name, seed, hyps[i]) for name, hyps in (("additive", additive), ("dot", dot))
            for i, seed in enumerate((42, 1, 2))]
    return root, runs, {"additive": additive, "dot": dot, "refs": refs}


def test_grouped_by_attention_over_seeds(seeds: tuple[Path, list[Path], dict], tmp_path: Path) -> None:
    _, runs, texts = seeds
    out = tmp_path / "study"
    report = compare.main([*map(str, runs), "--group-by", "attention", "--baseline", "additive", "--out", str(out)])
    rows = {row["group"]: row for row in report["groups"]}
    assert list(rows) == ["additive", "dot"] and rows["dot"]["seeds"] == [1, 2, 42]
    scores = {r["run_dir"]: r["test"] for r in report["runs"]}
    dot_bleu = [scores[str(run)]["bleu"] for run in runs[3:]]
    assert rows["dot"]["bleu"]["mean"] == pytest.approx(statistics.fmean(dot_bleu))
    assert rows["dot"]["bleu"]["std"] == pytest.approx(statistics.stdev(dot_bleu))
    assert rows["additive"]["vs_baseline"] is None
    vs = rows["dot"]["vs_baseline"]
    additive_bleu = statistics.fmean(scores[str(run)]["bleu"] for run in runs[:3])
    assert vs["bleu_difference"] == pytest.approx(statistics.fmean(dot_bleu) - additive_bleu)
    for pair in vs["pairs"]:  # each seed pair: sacrebleu's own p-values, called directly
        index = (42, 1, 2).index(pair["seed"])
        tested = paired_p_values(texts["additive"][index], texts["dot"][index], texts["refs"])
        assert {m: pair[m] for m in ("BLEU", "chrF2")} == {m: tested[m] for m in ("BLEU", "chrF2")}
    same = next(p for p in vs["pairs"] if p["seed"] == 2)  # the same translations as additive's seed 2
    assert same["BLEU"] == {"bs": 1.0, "ar": 1.0}
    assert vs["significant_pairs"]["BLEU"] == {"bs": 2, "ar": 2}
    markdown = Path(f"{out}.md").read_text()
    assert "## de-en" in markdown and "| dot | 1, 2, 42 | " in markdown and "| 2/3 / 2/3 |" in markdown
    assert "| dot | 2 | +0.00 | 1.0000 | 1.0000 | +0.00 | 1.0000 | 1.0000 |" in markdown
    for pair in vs["pairs"]:  # each pair's own difference: significant pairs can go either way
        mine, base = (scores[str(group[(42, 1, 2).index(pair["seed"])])] for group in (runs[3:], runs[:3]))
        assert pair["bleu_difference"] == pytest.approx(mine["bleu"] - base["bleu"])
        assert (pair["bleu_difference"] < 0) == (pair["seed"] != 2)  # seed 2: the same translations
        assert f"| dot | {pair['seed']} | {pair['bleu_difference']:+.2f} | " in markdown
    for png in ("_groups.png", "_groups_length.png"):
        assert Path(f"{out}{png}").read_bytes()[:8] == PNG_SIGNATURE


def test_a_report_names_runs_under_the_working_directory_by_relative_paths(
        seeds: tuple[Path, list[Path], dict], monkeypatch: pytest.MonkeyPatch) -> None:
    """A report built in a checkout's workdir names no machine's folders, so a fresh clone rebuilds the same JSON."""
    root, runs, _ = seeds
    monkeypatch.chdir(root.parent)
    relative = [str(run.relative_to(root.parent)) for run in runs]
    report = compare.main([*relative[:3], "--out", "first"])
    assert sorted(run["run_dir"] for run in report["runs"]) == sorted(relative[:3])
    assert str(root.parent) not in Path("first.json").read_text()
    again = compare.main([*relative[:2], "--from-report", "first.json", "--out", "second"])  # runs analysed now win
    assert sorted(run["run_dir"] for run in again["runs"]) == sorted(relative[:3])
    assert [run.get("from_report") for run in again["runs"]].count(None) == 2


def test_runs_it_cannot_use_are_refused_naming_them(seeds: tuple[Path, list[Path], dict], tmp_path: Path) -> None:
    root, runs, texts = seeds
    cfg = OmegaConf.load(runs[0] / "config.yaml")
    bare = seed_run(tmp_path, cfg, "general", 42, None)  # trained, but its test translations are gone
    with pytest.raises(RunError, match=f"^{bare} has no test outputs for test: no {bare}/translations/test.en$"):
        compare.main([str(runs[0]), str(bare), "--group-by", "attention", "--out", str(tmp_path / "x")])
    other = seed_run(tmp_path / "b", cfg, "dot", 7, texts["refs"], split="test_2017")  # another test set
    with pytest.raises(RunError, match=f"^{other} has no test outputs for test: its results.json scored "
                                       r"\['test_2017'\]"):
        compare.main([str(runs[0]), str(other), "--group-by", "attention", "--split", "test", "--out", "x"])
    with pytest.raises(RunError, match=f"^{other} tests on test_2017, .* on test: the runs test on different"):
        compare.main([str(runs[0]), str(other), "--out", str(tmp_path / "x")])
    moved = tmp_path / "other.en"  # the same split name, other references
    moved.write_text("".join(f"{r} a\n" for r in texts["refs"]))
    cfg.data.files.test.tgt = str(moved)
    elsewhere = seed_run(tmp_path / "d", cfg, "dot", 42, texts["refs"])
    with pytest.raises(RunError, match=f"^{elsewhere} scores test against other references than {runs[0]}"):
        compare.main([str(runs[0]), str(elsewhere), "--group-by", "attention", "--out", str(tmp_path / "x")])
    cfg = OmegaConf.load(runs[0] / "config.yaml")
    twin = seed_run(tmp_path / "c", cfg, "additive", 42, texts["refs"])
    with pytest.raises(RunError, match="are both attention=additive de-en seed 42; pass one run per seed"):
        compare.main([str(runs[0]), str(twin), "--group-by", "attention", "--out", str(tmp_path / "x")])
    with pytest.raises(RunError, match="no run with attention=none in de-en"):
        compare.main([str(runs[0]), "--group-by", "attention", "--baseline", "none", "--out", str(tmp_path / "x")])
    done = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "compare_runs.py"), str(runs[0]), str(bare),
                           "--group-by", "attention", "--out", str(tmp_path / "x")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})  # this checkout's nmt
    assert done.returncode == 2 and done.stderr.strip() == (f"compare_runs.py: error: {bare} has no test outputs "
                                                            f"for test: no {bare}/translations/test.en"), done.stderr


def speed_report(path: Path, group_by: str = "attention", group: str = "additive", direction: str = "de-en") -> Path:
    """A study-speed report as benchmark.py writes it: ``group`` in ``direction`` timed, nothing else."""
    path.write_text(json.dumps({
        "benchmark": "study-speed", "date": "2026-11-27", "device": {"type": "cpu", "name": "Test CPU"},
        "group_by": group_by, "train_steps": 100,
        "runs": [{"run_dir": "x", "group": group, "direction": direction, "train_tokens_per_s": 1234.4,
                  "beam_sentences_per_s": 56.78}]}))
    return path


def test_speed_columns_come_from_the_back_to_back_benchmark_only(seeds: tuple[Path, list[Path], dict],
                                                                 tmp_path: Path) -> None:
    _, runs, _ = seeds
    args = [*map(str, runs), "--group-by", "attention", "--baseline", "additive"]
    report = compare.main([*args, "--out", str(tmp_path / "plain")])
    assert all(row["train_tokens_per_s"] is None and row["beam_sentences_per_s"] is None for row in report["groups"])
    markdown = Path(f"{tmp_path / 'plain'}.md").read_text()
    assert "| not measured | not measured |" in markdown and "Speeds: not measured" in markdown
    minutes = [json.loads((run / "results.json").read_text())["train_seconds"] / 60 for run in runs[:3]]
    row = next(r for r in report["groups"] if r["group"] == "additive")
    assert row["train_minutes_as_run"]["mean"] == pytest.approx(statistics.fmean(minutes))

    report = compare.main([*args, "--speed", str(speed_report(tmp_path / "speed.json")), "--out", str(tmp_path / "t")])
    rows = {row["group"]: row for row in report["groups"]}
    assert rows["additive"]["train_tokens_per_s"] == 1234.4 and rows["additive"]["beam_sentences_per_s"] == 56.78
    assert rows["dot"]["train_tokens_per_s"] is None  # not in the benchmark: never filled from the runs
    markdown = Path(f"{tmp_path / 't'}.md").read_text()
    assert "| 1,234 | 56.8 |" in markdown
    assert "de-en: 100 training steps, Test CPU, 2026-11-27, `speed.json`" in markdown
    assert [source["device"] for source in report["speed"]] == ["Test CPU"]

    # One report per direction, each timed while its checkpoints were there: they join.
    other = speed_report(tmp_path / "dot.json", group="dot")
    report = compare.main([*args, "--speed", str(tmp_path / "speed.json"), str(other), "--out", str(tmp_path / "u")])
    rows = {row["group"]: row for row in report["groups"]}
    assert rows["additive"]["train_tokens_per_s"] == rows["dot"]["train_tokens_per_s"] == 1234.4
    assert [source["file"] for source in report["speed"]] == ["speed.json", "dot.json"]


def test_a_speed_report_of_another_key_or_kind_is_refused(seeds: tuple[Path, list[Path], dict], tmp_path: Path) -> None:
    _, runs, _ = seeds
    args = [*map(str, runs), "--group-by", "attention", "--out", str(tmp_path / "x")]
    with pytest.raises(RunError, match="timed groups of model.hidden_size, not of --group-by attention"):
        compare.main([*args, "--speed", str(speed_report(tmp_path / "s.json", "model.hidden_size"))])
    (tmp_path / "other.json").write_text('{"benchmark": "train"}')
    with pytest.raises(RunError, match="not a benchmark.py study-speed report"):
        compare.main([*args, "--speed", str(tmp_path / "other.json")])
    with pytest.raises(RunError, match="cannot read it"):
        compare.main([*args, "--speed", str(tmp_path / "missing.json")])
    twice = [str(speed_report(tmp_path / name)) for name in ("a.json", "b.json")]
    with pytest.raises(RunError, match=r"--speed .*b\.json times additive de-en again: pass one report per group"):
        compare.main([*args, "--speed", *twice])
