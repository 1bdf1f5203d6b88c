"""nmt.analysis.compare on fake run dirs: tables, length buckets, plots, and the translate-now fallback.

No training: each run dir gets a ``results.json`` and a ``config.yaml`` (the real configs shrunk to the
tiny reversal corpus of test_training.py) and either saved translations or an untrained checkpoint.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from nmt.analysis import compare as compare_runs
from nmt.analysis.cli import RunError
from nmt.common.settings import to_plain_dict
from nmt.data import prepare_data
from nmt.model.checkpoint import save_checkpoint
from nmt.model.seq2seq import Seq2Seq
from tests.test_training import tiny_config

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def fake_results(attention: str, run_dir: Path) -> dict[str, Any]:
    """A results.json as train.py writes it (the fields compare_runs reads, plus a few more)."""
    sig = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
    return {
        "checkpoint": "best", "checkpoint_step": 200, "beam_size": 2, "length_penalty": 1.0,
        "valid": {"bleu": 50.0, "chrf": 60.0, "bleu_signature": sig, "loss": 1.0},
        "test": {"test": {"bleu": 0.0, "chrf": 0.0, "bleu_signature": sig}},
        "attention": attention, "parameters": 12345, "steps": 200, "epochs": 2.5, "stopped_early": False,
        "best_val_bleu_greedy": 50.0, "best_step": 200, "train_seconds": 3725.0,
        "train_target_tokens_per_s": 1000.0, "device": "cpu", "world_size": 1, "torch": "2.13.0+cpu",
        "nmt": "0.1.0", "src_lang": "de", "tgt_lang": "en", "run_dir": str(run_dir),
    }


def make_run(root: Path, cfg: Any, attention: str, hyps: list[str] | None) -> Path:
    run = root / f"attention={attention}"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps(fake_results(attention, run)))
    OmegaConf.save(OmegaConf.create(to_plain_dict(cfg)), run / "config.yaml")
    if hyps is not None:
        (run / "translations").mkdir()
        (run / "translations" / "test.en").write_text("".join(h + "\n" for h in hyps))
    return run


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], list[str]]:
    """A fake multirun: ``additive`` perfect, ``none`` wrong on long sentences, ``dot`` untranslated."""
    torch.set_num_threads(1)  # tiny models: a second thread only adds contention
    tmp = tmp_path_factory.mktemp("compare")
    cfg = tiny_config(tmp, [])
    data = prepare_data(cfg.data)
    srcs, refs = data.tests["test"].src_text, data.tests["test"].tgt_text
    rng = random.Random(0)
    # the no-attention stand-in drops words from sentences over 5 symbols, as a fixed-size state would
    degraded = [ref if len(src.split()) <= 5 else " ".join(rng.sample(ref.split(), 2)) for src, ref in zip(srcs, refs)]
    root = tmp / "multirun"
    make_run(root, cfg, "additive", refs)
    make_run(root, cfg, "none", degraded)
    dot_cfg = tiny_config(tmp, ["attention=dot"])  # the same corpus files and cache
    dot = make_run(root, dot_cfg, "dot", None)
    model = Seq2Seq.from_config(cfg.model, dot_cfg.attention, data.tokenizer.src_vocab_size,
                                data.tokenizer.tgt_vocab_size)  # untrained: only the fallback path is tested
    save_checkpoint(dot / "checkpoints" / "best.pt", {"config": to_plain_dict(dot_cfg),
                                                       "tokenizer": data.tokenizer.to_state(),
                                                       "model": model.state_dict()})
    return root, srcs, refs


def test_sweep_tables_buckets_and_plots(sweep: tuple[Path, list[str], list[str]], tmp_path: Path) -> None:
    root, srcs, _ = sweep
    torch.set_num_threads(1)
    out = tmp_path / "results" / "cmp"
    report = compare_runs.main(["--sweep-dir", str(root), "--buckets", "4", "5", "--out", str(out), "--device", "cpu"])

    runs = {r["attention"]: r for r in report["runs"]}
    assert [r["attention"] for r in report["runs"]] == ["none", "additive", "dot"]  # the baseline first
    assert runs["additive"]["test"]["bleu"] == pytest.approx(100.0)
    assert "case:mixed" in runs["additive"]["test"]["bleu_signature"]
    assert "case:lc" in runs["additive"]["tutorial_bleu"]["signature"]
    assert runs["none"]["test"]["bleu"] < 100.0

    ranges = [b["range"] for b in runs["none"]["by_length"]]
    assert ranges == ["<=4", "5-5", ">5"]  # (2-symbol sentences have no 4-grams: BLEU 0)
    counts = [b["n"] for b in runs["none"]["by_length"]]
    assert sum(counts) == len(srcs) == runs["none"]["sentences"]
    assert counts[2] == sum(len(s.split()) > 5 for s in srcs) > 0
    none_bleu = [b["bleu"] for b in runs["none"]["by_length"]]
    assert none_bleu[0] == pytest.approx(100.0) and none_bleu[2] < 50.0  # falls off on long sentences only
    assert all(b["bleu"] == pytest.approx(100.0) for b in runs["additive"]["by_length"])

    # dot had no translations: translated now with its checkpoint and saved for the next call
    assert runs["dot"]["hypotheses"] == "translated now"
    saved = root / "attention=dot" / "translations" / "test.en"
    assert len(saved.read_text().splitlines()) == len(srcs)
    assert runs["additive"]["hypotheses"] == "saved"

    # attention sharpness needs a checkpoint: only dot has one
    assert runs["additive"]["attention_sharpness"] == "no checkpoint"
    dot_stats = runs["dot"]["attention_sharpness"]
    assert 0.0 < dot_stats["normalised_entropy"] <= 1.0 and 0.0 < dot_stats["max_weight"] <= 1.0
    assert dot_stats["tokens"] > len(srcs)

    markdown = Path(f"{out}.md").read_text()
    rows = [line for line in markdown.splitlines() if line.startswith("| none |")]
    assert len(rows) == 4  # score table, tutorial table, length table, attention sharpness
    assert "| additive | 100.00 | 100.00 | 50.00 | 2 | 12,345 | 1:02:05 | cpu (no GPU) | 200 | 2.50 |" in markdown
    assert "Tutorial-style BLEU (lowercased" in markdown and "| *sentences* |" in markdown
    assert "Test BLEU in `results.json` differs" in markdown  # the fake results.json says 0.0
    assert "## How peaked the attention is" in markdown and "| additive | no checkpoint | | |" in markdown
    assert json.loads(Path(f"{out}.json").read_text())["runs"][1]["label"] == "additive"
    for png in (Path(f"{out}.png"), Path(f"{out}_length.png")):
        assert png.read_bytes()[:8] == PNG_SIGNATURE


def test_a_report_over_both_directions_counts_each_ones_sentences_and_target_tokens() -> None:
    """The source side sets a sentence's length bucket, so de-en and en-de runs of one test set fill them
    differently: a report over both directions shows each one's counts, not the first run's for all."""
    def run(direction: str, counts: list[int]) -> dict[str, Any]:
        return {"label": direction, "direction": direction, "test": {"bleu": 30.0},
                "tutorial_bleu": {"bleu": 31.0, "signature": "sig"}, "attention_sharpness": None,
                "by_length": [{"range": r, "n": n, "bleu": 30.0} for r, n in zip(("<=8", ">8"), counts)]}

    both = compare_runs.sentence_counts([run("de-en", [280, 720]), run("de-en", [280, 720]), run("en-de", [174, 826])])
    assert both == ["| *sentences (de-en)* | 280 | 720 |", "| *sentences (en-de)* | 174 | 826 |"]
    assert compare_runs.sentence_counts([run("de-en", [280, 720])]) == ["| *sentences* | 280 | 720 |"]
    tables = compare_runs._more_tables([run("de-en", [1, 2]), run("en-de", [2, 1])])
    sharp = {"normalised_entropy": 0.5, "max_weight": 0.5, "entropy": 1.0}
    runs = [{**run(d, [1, 2]), "attention_sharpness": {**sharp, "tokens": n}} for d, n in (("de-en", 9), ("en-de", 12))]
    assert compare_runs.token_counts(runs) == "the target tokens of each direction (de-en: 9, en-de: 12)"
    assert compare_runs.token_counts(runs[:1]) == "9 target tokens"
    assert "| *sentences (de-en)* | 1 | 2 |" in tables and "| *sentences (en-de)* | 2 | 1 |" in tables


def test_single_run(sweep: tuple[Path, list[str], list[str]], tmp_path: Path) -> None:
    root, _, _ = sweep
    out = tmp_path / "one"
    report = compare_runs.main([str(root / "attention=additive"), "--out", str(out)])
    assert [r["label"] for r in report["runs"]] == ["additive"]
    assert [b["range"] for b in report["runs"][0]["by_length"]] == ["<=8", "9-12", "13-16", "17-20", ">20"]
    assert Path(f"{out}_length.png").read_bytes()[:8] == PNG_SIGNATURE


def test_not_a_run_dir_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="no results.json"):
        compare_runs.main([str(tmp_path), "--out", str(tmp_path / "x")])


def test_from_report_joins_recorded_runs_to_new_ones(sweep: tuple[Path, list[str], list[str]], tmp_path: Path) -> None:
    root, _, _ = sweep
    first = compare_runs.main([str(root / "attention=additive"), str(root / "attention=none"),
                               "--out", str(tmp_path / "first")])
    recorded = {r["attention"]: r for r in first["runs"]}
    # the additive run dir is gone from this machine: only the report remembers it
    second = compare_runs.main([str(root / "attention=none"), "--from-report", str(tmp_path / "first.json"),
                                "--out", str(tmp_path / "second")])
    runs = {r["attention"]: r for r in second["runs"]}
    assert [r["attention"] for r in second["runs"]] == ["none", "additive"]
    assert runs["additive"]["test"] == recorded["additive"]["test"]
    assert runs["additive"]["by_length"] == recorded["additive"]["by_length"]
    assert runs["additive"]["from_report"].startswith("first.json, 20")
    assert "from_report" not in runs["none"]  # analysed afresh, not taken from the report
    markdown = Path(tmp_path / "second.md").read_text()
    assert "As recorded in an earlier comparison (run dir not read again): additive (first.json, 20" in markdown
    # carried through a second report, a row still names the report it was measured for
    third = compare_runs.main(["--from-report", str(tmp_path / "second.json"), "--out", str(tmp_path / "third")])
    assert {r["attention"]: r["from_report"][:10] for r in third["runs"]} == {"none": "second.jso",
                                                                             "additive": "first.json"}


def test_from_report_refuses_what_does_not_fit(sweep: tuple[Path, list[str], list[str]], tmp_path: Path) -> None:
    root, _, _ = sweep
    compare_runs.main([str(root / "attention=additive"), "--out", str(tmp_path / "report")])
    report = tmp_path / "report.json"
    with pytest.raises(RunError, match=r"has length buckets \[8, 12, 16, 20\].*pass --buckets 8 12 16 20"):
        compare_runs.main(["--from-report", str(report), "--buckets", "4", "--out", str(tmp_path / "x")])
    with pytest.raises(RunError, match="test on different splits"):
        compare_runs.main(["--from-report", str(report), "--split", "valid", "--out", str(tmp_path / "x")])
    with pytest.raises(RunError, match="no such file"):
        compare_runs.main(["--from-report", str(tmp_path / "missing.json"), "--out", str(tmp_path / "x")])
    (tmp_path / "results.json").write_text('{"bleu": 1}')
    with pytest.raises(RunError, match="is not a compare_runs.py report"):
        compare_runs.main(["--from-report", str(tmp_path / "results.json"), "--out", str(tmp_path / "x")])
    broken = json.loads(report.read_text())
    del broken["runs"][0]["by_length"]
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    with pytest.raises(RunError, match=r"lacks \['by_length'\]"):
        compare_runs.main(["--from-report", str(tmp_path / "broken.json"), "--out", str(tmp_path / "x")])


def test_device_column_names_bf16_runs() -> None:
    run = {"device": "cpu", "world_size": 1}
    assert compare_runs.format_device(run) == "cpu (no GPU)"  # runs from before trainer.precision
    assert compare_runs.format_device({**run, "bf16_autocast": False}) == "cpu (no GPU)"
    assert compare_runs.format_device({**run, "bf16_autocast": True}) == "cpu, bf16 (no GPU)"
    gpu = {"device": "NVIDIA H100 80GB HBM3", "world_size": 2, "bf16_autocast": True}
    assert compare_runs.format_device(gpu) == "NVIDIA H100 80GB HBM3 x2, bf16"


def test_time_decoding_times_runs_with_a_checkpoint(sweep: tuple[Path, list[str], list[str]], tmp_path: Path) -> None:
    root, _, _ = sweep
    torch.set_num_threads(1)
    report = compare_runs.main([str(root / "attention=dot"), str(root / "attention=additive"), "--time-decoding",
                                "--device", "cpu", "--out", str(tmp_path / "timed")])
    speed = {r["attention"]: r["beam_sentences_per_s"] for r in report["runs"]}
    assert speed["dot"] > 0 and speed["additive"] is None  # additive's run dir holds translations only
