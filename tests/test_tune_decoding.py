"""nmt.analysis.decoding on a briefly trained tiny run: the grid, the choice, the test scores, the files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nmt.analysis import decoding as tune_decoding
from nmt.common.metrics import corpus_scores
from nmt.data import prepare_data
from nmt.inference.engine import Translator
from nmt.train.trainer import train
from tests.test_training import tiny_config


def test_grid_decodes_greedy_once() -> None:
    assert tune_decoding.grid([1, 4], [0.0, 1.0]) == [(1, 0.0), (4, 0.0), (4, 1.0)]
    assert tune_decoding.grid([3, 3], [0.5]) == [(3, 0.5)]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    torch.set_num_threads(1)  # tiny model: a second thread only adds contention
    tmp = tmp_path_factory.mktemp("tune")
    cfg = tiny_config(tmp, ["trainer.max_steps=150", "trainer.validate_every=75", "trainer.test_beam_size=2",
                            "trainer.length_penalty=0.6"])
    train(cfg, run_dir=tmp / "run")
    return tmp / "run", cfg


def test_grid_choice_and_test_scores(trained_run: tuple[Path, object], tmp_path: Path) -> None:
    run_dir, cfg = trained_run
    out = tmp_path / "grid"
    report = tune_decoding.main([str(run_dir), "--beam-sizes", "1", "3", "--length-penalties", "0", "1.0",
                                 "--test-split", "test", "--device", "cpu", "--out", str(out)])

    settings = [(row["beam_size"], row["length_penalty"]) for row in report["grid"]]
    assert settings == [(1, 0.0), (3, 0.0), (3, 1.0)]
    assert report["split"] == "valid" and report["sentences"] == len(prepare_data(cfg.data).valid)
    assert report["best"] == max(report["grid"], key=lambda row: row["bleu"])
    # the arguments main() was given, not pytest's own
    assert report["command"].startswith(f"python scripts/tune_decoding.py {run_dir} --beam-sizes 1 3")

    # each row is what translating the split with that setting scores, computed here independently
    translator = Translator.from_checkpoint(run_dir, device="cpu", max_input_words=None)
    valid = prepare_data(cfg.data).valid
    for row in report["grid"]:
        results = translator.translate(valid.src_text, beam_size=row["beam_size"],
                                       length_penalty=row["length_penalty"])
        expected = corpus_scores([r.text for r in results], valid.tgt_text)
        assert row["bleu"] == pytest.approx(expected["bleu"]) and row["length_ratio"] == pytest.approx(
            expected["length_ratio"])
    assert report["best"]["bleu"] > 20  # 150 steps learn some of the reversal task

    chosen = report["test"]["chosen on valid"]
    assert (chosen["beam_size"], chosen["length_penalty"]) == (report["best"]["beam_size"],
                                                               report["best"]["length_penalty"])
    assert report["run_setting"] == {"beam_size": 2, "length_penalty": 0.6}
    own = report["test"]["the run's own"]  # (2, 0.6) is not in the grid, so it is scored as well
    assert (own["beam_size"], own["length_penalty"]) == (2, 0.6)
    # the system's output: the chosen setting's test translations, beside the report (the tgt language's suffix)
    test = prepare_data(cfg.data).tests["test"]
    expected = translator.translate(test.src_text, beam_size=chosen["beam_size"],
                                    length_penalty=chosen["length_penalty"])
    written = Path(f"{out}.test.{cfg.data.tgt_lang}").read_text(encoding="utf-8").split("\n")
    assert written == [r.text for r in expected] + [""] and "translations" not in chosen

    markdown = Path(f"{out}.md").read_text()
    assert markdown.count("| 3 | 0 |") == 1 and "Scored once on `test`" in markdown
    assert "case:mixed" in markdown
    assert json.loads(Path(f"{out}.json").read_text())["best"]["bleu"] == report["best"]["bleu"]


def test_an_ensemble_is_tuned_as_one_model(trained_run: tuple[Path, object], tmp_path: Path) -> None:
    run_dir, cfg = trained_run
    members = [run_dir / "checkpoints" / "best.pt", run_dir / "checkpoints" / "last.pt"]
    report = tune_decoding.main([str(run_dir), "--checkpoint", *map(str, members), "--beam-sizes", "2",
                                 "--length-penalties", "1.0", "--device", "cpu", "--out", str(tmp_path / "ens")])
    assert report["checkpoint"] == f"{members[0]}, {members[1]}"
    ensemble = Translator.from_checkpoint(members, device="cpu", max_input_words=None)
    valid = prepare_data(cfg.data).valid
    results = ensemble.translate(valid.src_text, beam_size=2, length_penalty=1.0)
    assert report["grid"][0]["bleu"] == pytest.approx(corpus_scores([r.text for r in results], valid.tgt_text)["bleu"])


def test_tuning_on_the_test_split_is_refused(trained_run: tuple[Path, object], tmp_path: Path) -> None:
    run_dir, _ = trained_run
    with pytest.raises(SystemExit, match="both 'test'"):
        tune_decoding.main([str(run_dir), "--split", "test", "--test-split", "test", "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit):
        tune_decoding.main([str(run_dir), "--beam-sizes", "0", "--out", str(tmp_path / "y")])


def test_reranking_weights_are_tuned_on_val_and_the_choice_scored_once(trained_run: tuple[Path, object],
                                                                       tmp_path: Path) -> None:
    """The reversal task is its own reverse: the run, relabelled with mirrored languages, is a reverse model."""
    from nmt.inference.rerank import NoisyChannel, Rerank
    from nmt.model.checkpoint import load_checkpoint, save_checkpoint

    run_dir, cfg = trained_run
    state = load_checkpoint(run_dir / "checkpoints" / "best.pt")
    data = state["config"]["data"]
    data["src_lang"], data["tgt_lang"] = data["tgt_lang"], data["src_lang"]
    reverse = save_checkpoint(tmp_path / "reverse" / "checkpoints" / "best.pt", state)
    report = tune_decoding.main([str(run_dir), "--beam-sizes", "1", "3", "--length-penalties", "1.0",
                                 "--rerank-checkpoint", str(reverse), "--rerank-weights", "0", "1",
                                 "--rerank-length-weights", "0", "0.5", "--rerank-n-best", "3",
                                 "--test-split", "test", "--device", "cpu", "--out", str(tmp_path / "grid")])
    keys = [tune_decoding.setting_key(row) for row in report["grid"]]
    assert keys == [(1, 0.0, None, None), (3, 1.0, 0.0, 0.0), (3, 1.0, 0.0, 0.5), (3, 1.0, 1.0, 0.0),
                    (3, 1.0, 1.0, 0.5)]
    translator = Translator.from_checkpoint(run_dir, device="cpu", max_input_words=None)
    channel = NoisyChannel.load(str(reverse), translator)
    valid = prepare_data(cfg.data).valid
    for row in report["grid"][1:]:  # each row is the engine's reranked output with those weights
        rerank = Rerank(channel, row["rerank_weight"], row["rerank_length_weight"], n_best=3)
        results = translator.translate(valid.src_text, beam_size=3, length_penalty=1.0, rerank=rerank)
        assert row["bleu"] == pytest.approx(corpus_scores([r.text for r in results], valid.tgt_text)["bleu"])
    plain = translator.translate(valid.src_text, beam_size=3, length_penalty=1.0, n_best=3)
    assert report["grid"][1]["bleu"] == pytest.approx(corpus_scores([r.text for r in plain], valid.tgt_text)["bleu"])
    best, chosen = report["best"], report["test"]["chosen on valid"]
    assert best == max(report["grid"], key=lambda row: row["bleu"])
    assert "the run's own" in report["test"]
    assert tune_decoding.setting_key(chosen) == tune_decoding.setting_key(best) or tune_decoding.is_plain(best)
    written = Path(f"{tmp_path / 'grid'}.test.{cfg.data.tgt_lang}").read_text(encoding="utf-8").splitlines()
    test = prepare_data(cfg.data).tests["test"]
    assert len(written) == len(test.src_text)
    plain = "chosen on valid without reranking"
    assert (plain in report["test"]) == (not tune_decoding.is_plain(best))
    if plain in report["test"]:  # reranking won on val: the best plain row, as one model translates it alone
        row = max(filter(tune_decoding.is_plain, report["grid"]), key=lambda row: row["bleu"])
        alone = translator.translate(test.src_text, beam_size=row["beam_size"], length_penalty=row["length_penalty"])
        assert Path(f"{tmp_path / 'grid'}.without_reranking.test.{cfg.data.tgt_lang}").read_text(
            encoding="utf-8").splitlines() == [r.text for r in alone]
    markdown = Path(f"{tmp_path / 'grid'}.md").read_text()
    assert "| beam | α | λ | γ | BLEU |" in markdown and "| 3 | 1 | 1 | 0.5 |" in markdown


def test_when_reranking_wins_the_best_setting_without_it_is_scored_on_test_too() -> None:
    """A reranked system needs its reverse models; the grid's best plain row (λ = γ = 0 is the search's own order)
    is what the model gives alone, shipped in one folder, so it is scored on test as well; the run's own setting
    only when no plain choice is it."""
    rows = [{"beam_size": 1, "length_penalty": 0.0, "bleu": 30.0},
            {"beam_size": 5, "length_penalty": 1.0, "rerank_weight": 0.0, "rerank_length_weight": 0.0, "bleu": 33.0},
            {"beam_size": 5, "length_penalty": 1.0, "rerank_weight": 0.6, "rerank_length_weight": 0.5, "bleu": 34.0},
            {"beam_size": 10, "length_penalty": 1.4, "rerank_weight": 0.0, "rerank_length_weight": 0.0, "bleu": 32.0}]
    choices = tune_decoding.chosen_settings(rows, "val")
    assert list(choices) == ["chosen on val", "chosen on val without reranking"]
    assert choices["chosen on val"] is rows[2] and choices["chosen on val without reranking"] is rows[1]
    calls = []

    def run(split: str, beam: int, alpha: float, weights: list = ()) -> list[dict]:
        calls.append((split, beam, alpha, list(weights)))
        return [{"beam_size": beam, "length_penalty": alpha, "bleu": 0.0}]

    own = {"beam_size": 5, "length_penalty": 1.0}
    test = tune_decoding.scored_on_test(run, choices, own, "test")
    assert calls == [("test", 5, 1.0, [(0.6, 0.5)]), ("test", 5, 1.0, [])] and list(test) == list(choices)
    calls.clear()
    assert list(tune_decoding.scored_on_test(run, choices, {"beam_size": 10, "length_penalty": 0.6}, "test"))[-1] \
        == "the run's own" and calls[-1] == ("test", 10, 0.6, [])
    plain = tune_decoding.chosen_settings(rows[:2], "val")  # a plain best: one choice, scored without reranking
    calls.clear()
    assert list(tune_decoding.scored_on_test(run, plain, own, "test")) == ["chosen on val"]
    assert calls == [("test", 5, 1.0, [])]
