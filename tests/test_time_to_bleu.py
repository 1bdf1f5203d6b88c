"""Time to BLEU from both toolkits' own logs: our results.json and JoeyNMT's train.log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nmt_tools import time_to_bleu

EVAL = "INFO - joeynmt.prediction - Evaluation result (greedy): bleu:"
PEER_LOG = f"""\
2026-01-01 10:00:00,000 - INFO - root - Hello! This is Joey-NMT (version 2.3.0).
2026-01-01 10:00:30,000 - INFO - joeynmt.training - EPOCH 1
2026-01-01 10:05:00,000 - INFO - joeynmt.training - Epoch   1, Step:      200, Batch Loss:     4.1, Batch Acc: 0.3
2026-01-01 10:06:00,000 - {EVAL}  24.50, loss:   3.1, ppl:  22.0, acc:   0.40, 20.0[sec]
2026-01-01 10:15:00,000 - INFO - joeynmt.training - Epoch   2, Step:      400, Batch Loss:     3.1, Batch Acc: 0.4
2026-01-01 10:16:00,000 - {EVAL}  31.00, loss:   2.5, ppl:  12.0, acc:   0.50, 20.0[sec]
2026-01-01 10:40:00,000 - {EVAL}  33.25, loss:   2.4, ppl:  11.0, acc:   0.51, 20.0[sec]
"""


def _our_run(tmp_path: Path) -> Path:
    validations = [{"step": 100, "wall_seconds": 240.0, "bleu": 26.0},
                   {"step": 200, "wall_seconds": 480.0, "bleu": 36.0}]
    results = {"setup_seconds": 60.0, "validations": validations, "attention": "additive", "parameters": 1000,
               "test": {"test_2016_flickr": {"bleu": 38.5}}}
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "results.json").write_text(json.dumps(results))
    return tmp_path


def test_each_timeline_counts_from_the_start_of_the_run() -> None:
    peer = time_to_bleu.peer_timeline(PEER_LOG)
    assert [(p["minutes"], p["step"], p["bleu"]) for p in peer] == [(6.0, 200, 24.5), (16.0, 400, 31.0),
                                                                    (40.0, 400, 33.25)]
    ours = time_to_bleu.our_timeline({"setup_seconds": 60.0, "validations": [{"step": 5, "wall_seconds": 120.0,
                                                                              "bleu": 9.0}]})
    assert ours == [{"minutes": 3.0, "step": 5, "bleu": 9.0}]
    assert time_to_bleu.first_reached(peer, 30.0) == 16.0 and time_to_bleu.first_reached(peer, 35.0) is None


def test_the_report_gives_ratios_and_a_bound_where_the_peer_never_got_there(tmp_path: Path) -> None:
    peer_dir = tmp_path / "peer"
    (peer_dir / "models" / "full").mkdir(parents=True)
    (peer_dir / "models" / "full" / "train.log").write_text(PEER_LOG)
    (peer_dir / "results").mkdir()
    (peer_dir / "results" / "sacrebleu_beam5.test_2016_flickr.json").write_text(json.dumps([{"name": "BLEU",
                                                                                             "score": 31.2}]))
    ours_dir = _our_run(tmp_path / "ours")
    report = time_to_bleu.main(["--ours", str(ours_dir), "--peer-workdir", str(peer_dir), "--out", str(tmp_path / "r")])
    ours = report["ours"][0]
    assert ours["minutes_to"] == {"25": 5.0, "30": 9.0, "35": 9.0} and ours["test_bleu"] == 38.5
    assert report["peer"]["minutes_to"] == {"25": 16.0, "30": 16.0, "35": None} and report["peer"]["test_bleu"] == 31.2
    ratios = ours["peer_time_over_ours"]
    assert ratios["25"] == {"ratio": pytest.approx(3.2), "bound": None}
    assert ratios["35"] == {"ratio": pytest.approx(40.0 / 9.0), "bound": "at least"}  # the peer's 40 trained minutes
    table = (tmp_path / "r.md").read_text()
    assert "not reached in 40" in table and "≥ 4.4×" in table and "| JoeyNMT's minutes / ours (ours) |" in table


def test_each_of_our_runs_gets_its_own_ratio_row(tmp_path: Path) -> None:
    peer_dir = tmp_path / "peer"
    (peer_dir / "models" / "full").mkdir(parents=True)
    (peer_dir / "models" / "full" / "train.log").write_text(PEER_LOG)
    slow = _our_run(tmp_path / "slow")
    fast = _our_run(tmp_path / "fast")
    results = json.loads((fast / "results.json").read_text())
    results["validations"][0]["wall_seconds"] = 60.0  # BLEU 26 after 2 minutes (setup included)
    (fast / "results.json").write_text(json.dumps(results))
    report = time_to_bleu.main(["--ours", str(slow), str(fast), "--peer-workdir", str(peer_dir),
                                "--out", str(tmp_path / "r")])
    assert [row["peer_time_over_ours"]["25"]["ratio"] for row in report["ours"]] == [pytest.approx(3.2),
                                                                                    pytest.approx(8.0)]
    table = (tmp_path / "r.md").read_text()
    assert "| JoeyNMT's minutes / ours (slow) | 3.2× |" in table
    assert "| JoeyNMT's minutes / ours (fast) | 8.0× |" in table


def test_a_missing_log_names_the_file_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="run the peer's `run.sh full`"):
        time_to_bleu.load_peer(tmp_path)


def test_a_continued_peer_run_starts_at_the_checkpoint_it_loaded(tmp_path: Path) -> None:
    peer_dir = tmp_path / "peer"
    (peer_dir / "models" / "full").mkdir(parents=True)
    (peer_dir / "models" / "full" / "train.log").write_text(PEER_LOG)
    continued = tmp_path / "continued.log"
    continued.write_text("2026-01-02 08:00:00,000 - INFO - root - Hello! This is Joey-NMT (version 2.3.0).\n"
                         "2026-01-02 08:10:00,000 - INFO - joeynmt.training - Epoch   3, Step:      700, Batch\n"
                         f"2026-01-02 08:12:00,000 - {EVAL}"
                         "  35.50, loss:   2.3, ppl:  10.0, acc:   0.52, 20.0[sec]\n")
    peer = time_to_bleu.load_peer(peer_dir, [continued])
    assert [p["minutes"] for p in peer["timeline"]] == [6.0, 16.0, 40.0, 52.0]  # the first log ends at 40, + 12
    assert peer["minutes_to"]["35"] == 52.0 and peer["timeline"][-1]["step"] == 700
