"""scripts/gpu_check.py (nmt_tools.gpu_check): the parts driven with stand-ins for train.py, benchmark.py and
reproduce.py, their figures computed from what those write, and a stopped check continued without rerunning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nmt_tools import gpu_check

# train.py's stand-in: the losses of a bf16 run sit 0.01 above fp32's, a graphs run's 0.02 above eager's, and a
# graphs run is 3x as fast; validations at steps 10 and 20 reach greedy
# val BLEU 30 and 39, 100 and 220 s into the loop after 5 s of setup. It records each call in calls.log.
FAKE_TRAIN = r'''
import json, sys
from pathlib import Path
args = sys.argv[1:]
value = lambda key: next((a.split("=", 1)[1] for a in args if a.startswith(key + "=")), None)
Path("calls.log").open("a").write(json.dumps(["train", args]) + "\n")
run = Path(value("hydra.run.dir"))
run.mkdir(parents=True)
bf16, graphs = value("trainer.precision") == "bf16", value("trainer.cuda_graphs") == "true"
steps = int(value("trainer.max_steps") or 20)
shift = (0.01 if bf16 else 0.0) + (0.02 if graphs else 0.0)
log = [json.dumps({"step": s, "loss": 5.0 - s / 10 + shift}) for s in range(1, steps + 1)]
(run / "train_log.jsonl").write_text("\n".join(log) + "\n")
validations = [{"step": 10, "bleu": 30.0, "wall_seconds": 100.0}, {"step": 20, "bleu": 39.0, "wall_seconds": 220.0}]
results = {"device": "cuda", "precision": value("trainer.precision") or "auto", "bf16_autocast": bf16,
           "steps": steps, "train_target_tokens_per_s": (9000.0 if bf16 else 6000.0) * (3 if graphs else 1),
           "cuda_graphs": {"shapes": [[64, 16, 16]]} if graphs else None, "validation_seconds": 23.0,
           "gpu_utilisation": {"available": True, "mean_percent": 80.0}, "validations": validations,
           "test": {"test_2016_flickr": {"bleu": 40.0}}, "setup_seconds": 5.0, "wall_seconds": 230.0,
           "final_evaluation_seconds": 10.0, "best_val_bleu_greedy": 39.0}
(run / "results.json").write_text(json.dumps(results))
'''
FAKE_BENCHMARK = r'''
import json, sys
from pathlib import Path
args = sys.argv[1:]
Path("calls.log").open("a").write(json.dumps(["benchmark", args]) + "\n")
rows = [{"mode": "greedy", "sentences_per_s": 900.0, "bleu": 38.0}, {"mode": "beam5", "sentences_per_s": 300.0}]
Path(args[args.index("--out") + 1] + ".json").write_text(json.dumps({"results": rows}))
'''
FAKE_REPRODUCE = r'''
import json, sys
from pathlib import Path
Path("calls.log").open("a").write(json.dumps(["reproduce", sys.argv[1:]]) + "\n")
'''


@pytest.fixture
def fake_project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    (project / "train.py").write_text(FAKE_TRAIN)
    (project / "scripts" / "benchmark.py").write_text(FAKE_BENCHMARK)
    (project / "reproduce.py").write_text(FAKE_REPRODUCE)
    return project


def calls(project: Path) -> list[list]:
    return [json.loads(line) for line in (project / "calls.log").read_text().splitlines()]


def test_every_part_reports_its_figures(fake_project: Path, tmp_path: Path) -> None:
    out = tmp_path / "check"
    report = gpu_check.main(["--out", str(out), "--parts", "translate", "chain", "recipe", "precision",
                             "--steps", "120", "--overrides", "data.mirror=/corpora", "model=small"], fake_project)
    precision = report["precision"]
    assert precision["steps_compared"] == 120
    assert precision["loss_gap_mean"] == pytest.approx(0.01) and precision["loss_gap_max"] == pytest.approx(0.01)
    last = precision["loss_last_100_mean"]
    assert last["bf16"] - last["fp32"] == pytest.approx(0.01)
    assert precision["runs"]["bf16"]["train_target_tokens_per_s"] == 9000.0
    assert precision["runs"]["fp32"]["gpu_utilisation"]["mean_percent"] == 80.0
    recipe = report["recipe"]
    assert recipe["step_at_target"] == 20 and recipe["best_val_bleu"] == 39.0
    overhead = recipe["process_minutes"] * 60 - (5 + 230 + 10)  # what the process took beyond its own clocks
    assert recipe["minutes_to_target"] == pytest.approx((max(0.0, overhead) + 5 + 220) / 60)
    assert report["translate"] == {"checkpoint": "recipe", "greedy": {"sentences_per_s": 900.0, "bleu": 38.0},
                                   "beam5": {"sentences_per_s": 300.0, "bleu": None}}
    assert report["chain"]["parallel"] == 3
    assert json.loads((out / "gpu_check.json").read_text()) == report
    made = calls(fake_project)
    assert [kind for kind, _ in made] == ["train", "train", "train", "benchmark", "reproduce"]  # parts in PARTS order
    fp32 = made[0][1]
    assert {"trainer.precision=fp32", "trainer.max_steps=120", "trainer.validate_every=40", "model=small",
            "experiment=multi30k_best", "trainer.seed=42"} <= set(fp32)
    assert "data.mirror=/corpora" in made[-1][1] and "model=small" not in made[-1][1]  # only data.* reach the chain


def test_the_graphs_part_compares_eager_and_graphs_in_both_precisions(fake_project: Path, tmp_path: Path) -> None:
    report = gpu_check.main(["--out", str(tmp_path / "check"), "--parts", "graphs", "--graph-steps", "50"],
                            fake_project)["graphs"]
    assert report["graphs_over_eager_fp32"] == report["graphs_over_eager_bf16"] == pytest.approx(3.0)
    assert report["bf16_over_fp32"] == {"eager": pytest.approx(1.5), "graphs": pytest.approx(1.5)}
    assert report["loss_gap_bf16"] == {"mean": pytest.approx(0.02), "max": pytest.approx(0.02), "steps": 50}
    assert report["fastest"] == "graphs_bf16"
    graphs_run = report["runs"]["graphs_fp32"]
    assert graphs_run["cuda_graphs"] == {"shapes": [[64, 16, 16]]}
    assert report["runs"]["eager_fp32"]["cuda_graphs"] is None
    assert graphs_run["validation_share_of_wall"] == pytest.approx(23.0 / 230.0)
    made = [args for kind, args in calls(fake_project)]
    assert [("trainer.cuda_graphs=true" in a, "trainer.precision=bf16" in a) for a in made] == [
        (False, False), (False, True), (True, False), (True, True)]
    assert all({"trainer.max_steps=50", "trainer.validate_every=50"} <= set(a) for a in made)


def test_a_continued_check_reuses_finished_runs(fake_project: Path, tmp_path: Path) -> None:
    out = tmp_path / "check"
    gpu_check.main(["--out", str(out), "--parts", "precision"], fake_project)
    report = gpu_check.main(["--out", str(out), "--parts", "precision", "translate"], fake_project)
    assert [kind for kind, _ in calls(fake_project)] == ["train", "train", "benchmark"]
    assert report["translate"]["checkpoint"] == "precision_bf16"  # no recipe run: the bf16 one


def test_translate_without_a_trained_run_says_what_to_add(fake_project: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="add --parts recipe or precision"):
        gpu_check.main(["--out", str(tmp_path / "check"), "--parts", "translate"], fake_project)


def test_a_failing_run_names_its_log(fake_project: Path, tmp_path: Path) -> None:
    (fake_project / "train.py").write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(SystemExit, match=r"train.py failed with exit status 3; its output: .*precision_fp32.log"):
        gpu_check.main(["--out", str(tmp_path / "check"), "--parts", "precision"], fake_project)
