"""scripts/gpu_check.py (nmt_tools.gpu_check/): the parts driven with stand-ins for train.py, benchmark.py,
reproduce.py, pytest and nvidia-cuda-mps-control, their figures computed from what those write, a stopped check
continued without rerunning, the time budget, and the packing into at most 8 files."""

from __future__ import annotations

import json
import math
import os
import tarfile
from pathlib import Path

import pytest

from nmt_tools import gpu_check
from nmt_tools.gpu_check import training_parts

# train.py's stand-in: the losses of a bf16 run sit 0.01 above fp32's, a graphs run's 0.02 above eager's, and a
# graphs run is 3x as fast; validations at steps 10 and 20 reach greedy
# val BLEU 30 and 39, 100 and 220 s into the loop after 5 s of setup. It records each call (and the MPS pipe it
# was given) in calls.log.
FAKE_TRAIN = r'''
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
value = lambda key: next((a.split("=", 1)[1] for a in args if a.startswith(key + "=")), None)
with Path("calls.log").open("a") as log:
    log.write(json.dumps(["train", args, os.environ.get("CUDA_MPS_PIPE_DIRECTORY")]) + "\n")
run = Path(value("hydra.run.dir"))
run.mkdir(parents=True, exist_ok=True)
bf16, graphs = value("trainer.precision") == "bf16", value("trainer.cuda_graphs") == "true"
steps = int(value("trainer.max_steps") or 20)
shift = (0.01 if bf16 else 0.0) + (0.02 if graphs else 0.0)
log = [json.dumps({"step": s, "loss": 5.0 - s / 10 + shift}) for s in range(1, steps + 1)]
(run / "train_log.jsonl").write_text("\n".join(log) + "\n")
validations = [{"step": 10, "bleu": 30.0, "wall_seconds": 100.0}, {"step": 20, "bleu": 39.0, "wall_seconds": 220.0}]
results = {"device": "cuda", "precision": value("trainer.precision") or "auto", "bf16_autocast": bf16,
           "steps": steps, "train_target_tokens_per_s": (9000.0 if bf16 else 6000.0) * (3 if graphs else 1),
           "train_seconds": 20.0,
           "cuda_graphs": {"shapes": [[64, 16, 16]], "capture_seconds": 1.5} if graphs else None,
           "validation_seconds": 23.0,
           "gpu_utilisation": {"available": True, "utilisation_percent_median": 80.0, "memory_used_mib_max": 2975.0},
           "validations": validations,
           "test": {"test_2016_flickr": {"bleu": 40.0}}, "setup_seconds": 5.0, "wall_seconds": 230.0,
           "final_evaluation_seconds": 10.0, "best_val_bleu_greedy": 39.0}
(run / "results.json").write_text(json.dumps(results))
'''
# benchmark.py's stand-in: translate rows (graphs twice as fast, one line of each output different, BLEU 0.1 lower),
# back-translation rows (graphs 4x as fast).
FAKE_BENCHMARK = r'''
import json, sys
from pathlib import Path
args = sys.argv[1:]
Path("calls.log").open("a").write(json.dumps(["benchmark", args]) + "\n")
option = lambda name, default=None: args[args.index(name) + 1] if name in args else default
graphs = option("--cuda-graphs") == "true"
if args[0] == "backtranslate":
    seconds = 15.0 if graphs else 60.0
    rows = [{"method": "beam", "lines": 115555, "translated": 115555, "seconds": seconds,
             "sentences_per_s": 115555 / seconds, "options": {"beam_size": 5}}]
else:
    rows = [{"mode": "greedy", "sentences_per_s": 1800.0 if graphs else 900.0, "bleu": 37.9 if graphs else 38.0},
            {"mode": "beam5", "sentences_per_s": 600.0 if graphs else 300.0}]
    if option("--save-translations"):
        folder = Path(option("--save-translations"))
        folder.mkdir(parents=True, exist_ok=True)
        for row in rows:
            (folder / (row["mode"] + ".txt")).write_text("a\nb\n" + ("c2" if graphs else "c") + "\n")
canary = {"checks": 2, "check_seconds": 0.5, "mismatches": [], "fallback": None, "replays": 9} if graphs else None
Path(option("--out") + ".json").write_text(json.dumps({"results": rows, "cuda_graphs": canary}))
'''
# reproduce.py's stand-in: the study writes one finished training and its report files.
FAKE_REPRODUCE = r'''
import json, sys
from pathlib import Path
args = sys.argv[1:]
Path("calls.log").open("a").write(json.dumps(["reproduce", args]) + "\n")
workdir = next((Path(a.split("=", 1)[1]) for a in args if a.startswith("workdir=")), None)
if "recipe=attention_study" in args:
    run = workdir / "runs" / "study_additive_de-en" / "seed42"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"test": {"test_2016_flickr": {"bleu": 41.0}}}))
    for name in ("attention_study_test_2016_flickr.md", "attention_study_test_2016_flickr.json",
                 "attention_study_test_2016_flickr.png", "attention_study_test_2016_flickr_groups.png",
                 "attention_study_test_2016_flickr_length.png", "reproduce_attention_study.md"):
        (workdir / "runs" / name).write_text(name)
'''


@pytest.fixture
def fake_project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    (project / "train.py").write_text(FAKE_TRAIN)
    (project / "scripts" / "benchmark.py").write_text(FAKE_BENCHMARK)
    (project / "reproduce.py").write_text(FAKE_REPRODUCE)
    return project


def calls(project: Path) -> list[tuple[str, list[str]]]:
    """(program, its arguments) of each stand-in call, in order."""
    return [tuple(json.loads(line)[:2]) for line in (project / "calls.log").read_text().splitlines()]


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
    assert precision["runs"]["fp32"]["gpu_utilisation"]["utilisation_percent_median"] == 80.0
    recipe = report["recipe"]["auto"]
    assert recipe["step_at_target"] == 20 and recipe["best_val_bleu"] == 39.0
    overhead = recipe["process_minutes"] * 60 - (5 + 230 + 10)  # what the process took beyond its own clocks
    assert recipe["minutes_to_target"] == pytest.approx((max(0.0, overhead) + 5 + 220) / 60)
    assert report["translate"] == {"checkpoint": "recipe_auto", "greedy": {"sentences_per_s": 900.0, "bleu": 38.0},
                                   "beam5": {"sentences_per_s": 300.0, "bleu": None}}
    assert report["chain"]["parallel"] == 3
    assert json.loads((out / "gpu_check.json").read_text()) == report
    made = calls(fake_project)
    # parts in PARTS order: the recipe, its translation, then precision's two runs, then the chain
    assert [kind for kind, _ in made] == ["train", "benchmark", "train", "train", "reproduce"]
    fp32 = made[2][1]
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
    assert graphs_run["cuda_graphs"] == {"shapes": [[64, 16, 16]], "capture_seconds": 1.5}
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


def test_the_recipe_runs_graphs_and_a_capped_eager(fake_project: Path, tmp_path: Path) -> None:
    recipe = gpu_check.main(["--out", str(tmp_path / "check"), "--parts", "recipe", "--recipe-paths", "graphs",
                             "eager", "--eager-max-steps", "30"], fake_project)["recipe"]
    graphs, eager = recipe["graphs"], recipe["eager"]
    assert graphs["capture_seconds"] == 1.5 and graphs["setup_seconds"] == 5.0
    assert graphs["gpu_utilisation_median"] == 80.0 and graphs["validation_share_of_wall"] == pytest.approx(0.1)
    assert graphs["process_seconds_to_test_score"] == graphs["process_seconds"] > 0
    assert "capped_at_steps" not in graphs and eager["capped_at_steps"] == 30 and "not the recipe's" in eager["note"]
    assert recipe["graphs_over_eager_tokens_per_s"] == pytest.approx(3.0)
    made = [args for _, args in calls(fake_project)]
    assert "trainer.cuda_graphs=true" in made[0] and not any(a.startswith("trainer.max_steps") for a in made[0])
    assert {"trainer.cuda_graphs=false", "trainer.max_steps=30"} <= set(made[1])


def test_search_compares_graph_and_eager_outputs_and_back_translation(fake_project: Path, tmp_path: Path) -> None:
    out = tmp_path / "check"
    report = gpu_check.main(["--out", str(out), "--parts", "recipe", "search", "--recipe-paths", "graphs",
                             "--bt-model-steps", "40"], fake_project)["search"]
    assert report["checkpoint"] == "recipe_graphs"
    translate = report["translate"]
    assert translate["eager"]["greedy"]["sentences_per_s"] == 900.0 and "canary" not in translate["eager"]
    assert translate["graphs"]["canary"] == {"checks": 2, "check_seconds": 0.5, "mismatches": [], "fallback": None}
    greedy = translate["graphs_against_eager"]["greedy"]
    assert greedy["graphs_over_eager"] == pytest.approx(2.0) and greedy["lines"] == 3
    assert greedy["differing_lines"] == 1 and greedy["same_translations"] is False
    assert greedy["bleu_graphs_minus_eager"] == pytest.approx(-0.1)
    assert translate["graphs_against_eager"]["beam5"]["bleu_graphs_minus_eager"] is None  # no BLEU: none invented
    backtranslate = report["backtranslate"]
    assert backtranslate["model"]["trained_here"] and backtranslate["model"]["steps"] == 40
    assert backtranslate["eager"]["lines"] == 115555 and backtranslate["graphs_over_eager"] == pytest.approx(4.0)
    made = calls(fake_project)
    assert [kind for kind, _ in made] == ["train", "benchmark", "benchmark", "train", "benchmark", "benchmark"]
    eager, graphs = made[1][1], made[2][1]
    assert eager[eager.index("--cuda-graphs") + 1] == "false" and graphs[graphs.index("--cuda-graphs") + 1] == "true"
    assert graphs[graphs.index("--batch-tokens") + 1] == "auto" and str(out / "recipe_graphs") in graphs
    assert {"data.src_lang=en", "data.tgt_lang=de", "trainer.max_steps=40"} <= set(made[3][1])
    bt = made[4][1]
    assert bt[:1] == ["backtranslate"] and str(out / "search" / "bt_model") in bt
    assert {"--input", "multi30k_task2", "--lang", "en", "batch_tokens=auto"} <= set(bt)

    gpu_check.main(["--out", str(out), "--parts", "search", "--bt-model-steps", "40"], fake_project)
    assert len(calls(fake_project)) == 6  # continued: every report was there
    report = gpu_check.main(["--out", str(out), "--parts", "search", "--search-precisions", "auto", "fp32"],
                            fake_project)["search"]
    fp32 = calls(fake_project)[6:]
    assert len(fp32) == 2 and all(args[args.index("--precision") + 1] == "fp32" for _, args in fp32)
    assert report["translate"]["graphs_against_eager_fp32"]["greedy"]["differing_lines"] == 1
    assert "graphs_against_eager" in report["translate"]  # the auto pair, kept from before


def write_fake_mps(folder: Path, start_status: int = 0) -> Path:
    """nvidia-cuda-mps-control's stand-in on PATH: logs its arguments, stdin and pipe folder to mps.log."""
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "mps.log"
    script = folder / "nvidia-cuda-mps-control"
    script.write_text(f"""#!/bin/sh
if [ "$1" = "-d" ]; then echo "start $CUDA_MPS_PIPE_DIRECTORY" >> {log}; exit {start_status}; fi
read line; echo "$line $CUDA_MPS_PIPE_DIRECTORY" >> {log}
""")
    script.chmod(0o755)
    return log


def test_parallel_rounds_and_the_measured_parallel_file(fake_project: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    mps_log = write_fake_mps(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("NMT_GIT_COMMIT", "abc1234")
    out = tmp_path / "check"
    report = gpu_check.main(["--out", str(out), "--parts", "parallel", "--parallel-counts", "1", "2", "4",
                             "--parallel-steps", "30", "--mps"], fake_project)["parallel"]
    for way in ("processes", "mps"):
        rounds = report["ways"][way]
        assert [rounds[n]["over_one_alone"] for n in ("1", "2", "4")] == [1.0, 2.0, 4.0]
        assert rounds["4"]["tokens_per_s_together"] == 4 * 18000.0
        assert rounds["2"]["target_tokens"] == 2 * 18000.0 * 20.0
    assert report["best"]["trainings_at_once"] == 4 and report["best"]["way"] == "processes"  # the first of a tie
    made = [json.loads(line) for line in (fake_project / "calls.log").read_text().splitlines()]
    assert len(made) == 2 * (1 + 2 + 4)
    assert all({"trainer.cuda_graphs=true", "trainer.max_steps=30"} <= set(args) for _, args, _ in made)
    assert sorted(a for _, args, _ in made[3:7] for a in args if a.startswith("trainer.seed=")) == [
        "trainer.seed=42", "trainer.seed=43", "trainer.seed=44", "trainer.seed=45"]
    pipes = {pipe for _, _, pipe in made}
    assert pipes.__len__() == 2 and None in pipes  # the MPS rounds ran with the daemon's private pipe folder
    (pipe,) = pipes - {None}
    assert mps_log.read_text().splitlines() == [f"start {pipe}", f"quit {pipe}"]
    measured = json.loads((out / "measured_parallel.json").read_text())
    assert set(measured) == {"about", "cards"}
    card = measured["cards"]["cuda"]  # the name train.py recorded: torch.cuda.get_device_name() on a GPU
    assert card["trainings_at_once"] == 4 and card["tokens_per_s_together"] == 72000 and card["mps"] is False
    assert card["over_one_alone"] == 4.0 and ", abc1234, PyTorch " in card["measured"]
    assert card["mib_per_training"] == 2975  # one training's peak card memory: reproduce.py's parallel check


def test_mps_is_stopped_when_its_trainings_or_its_start_fail(fake_project: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    (fake_project / "train.py").write_text("import sys\nsys.exit(3)\n")
    mps_log = write_fake_mps(tmp_path / "bin")
    with pytest.raises(SystemExit, match="run0 of 1 at once failed"):
        gpu_check.main(["--out", str(tmp_path / "a"), "--parts", "parallel", "--parallel-counts", "1", "--mps"],
                       fake_project)
    assert not mps_log.exists()  # the plain processes failed first, without --keep-going: MPS never started

    report = gpu_check.main(["--out", str(tmp_path / "b"), "--parts", "parallel", "--parallel-counts", "1", "--mps",
                             "--keep-going"], fake_project)["parallel"]
    assert "failed" in report["ways"]["mps"]["1"] and "best" not in report
    assert [line.split()[0] for line in mps_log.read_text().splitlines()] == ["start", "quit"]

    mps_log = write_fake_mps(tmp_path / "bin", start_status=1)
    mps_log.unlink()
    report = gpu_check.main(["--out", str(tmp_path / "c"), "--parts", "parallel", "--parallel-counts", "1", "--mps",
                             "--keep-going"], fake_project)["parallel"]
    assert "nvidia-cuda-mps-control -d failed with exit status 1" in report["ways"]["mps"]["failed"]
    assert [line.split()[0] for line in mps_log.read_text().splitlines()] == ["start", "quit"]


def test_the_tests_part_counts_what_pytest_printed(fake_project: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_pytest(command: list[str], log: Path, cwd: Path, timeout: float | None = None,
                    env: dict | None = None, grace: float = 0.0) -> tuple[int, float]:
        assert command[1:] == ["-m", "pytest", "-q", "-m", "gpu", "tests/"] and cwd == fake_project
        log.write_text("....F.s\nFAILED tests/test_x.py::test_y\n3 passed, 1 failed, 2 skipped, 37 deselected in 9s\n")
        return 1, 9.0

    monkeypatch.setattr(training_parts, "run_logged", fake_pytest)
    report = gpu_check.main(["--out", str(tmp_path / "check"), "--parts", "tests"], fake_project)["tests"]
    assert (report["passed"], report["failed"], report["skipped"], report["deselected"]) == (3, 1, 2, 37)
    assert report["exit_status"] == 1 and report["errors"] == 0 and report["log"] == "tests.txt"


def test_the_budget_skips_what_does_not_fit_and_stops_what_overruns(fake_project: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for key, seconds in {"tests": 10_000.0, "train_fixed": 0.0, "eager_step": 0.0, "graphs_step": 0.0,
                         "study": 10_000.0}.items():
        monkeypatch.setitem(gpu_check.SECONDS, key, seconds)
    report = gpu_check.main(["--out", str(tmp_path / "check"), "--parts", "tests", "graphs", "study",
                             "--graph-steps", "20", "--budget-seconds", "600"], fake_project)
    assert "tests" in report and report["tests"]["skipped"].startswith("the CUDA tests: needs about 10000 s")
    assert report["graphs"]["graphs_over_eager_bf16"] == pytest.approx(3.0)  # it fitted: it ran
    assert "the study: needs about 10000 s" in report["study"]["skipped"]
    assert [kind for kind, _ in calls(fake_project)] == ["train"] * 4  # no pytest, no reproduce

    (fake_project / "train.py").write_text("import time\ntime.sleep(60)\n")
    report = gpu_check.main(["--out", str(tmp_path / "late"), "--parts", "precision", "--budget-seconds",
                             str(gpu_check.PACK_SECONDS + 1.0), "--keep-going"], fake_project)
    assert "stopped at the end of the budget" in report["precision"]["stopped"]


def test_the_study_gets_what_is_left_and_its_reports_are_collected(fake_project: Path, tmp_path: Path) -> None:
    out = tmp_path / "check"
    report = gpu_check.main(["--out", str(out), "--parts", "study", "--budget-seconds", "500"], fake_project)["study"]
    (_, args), = calls(fake_project)
    assert {"recipe=attention_study", f"workdir={out / 'study'}", "parallel=auto"} <= set(args)
    budget = next(int(a[len("budget="):-1]) for a in args if a.startswith("budget="))
    assert 500 - gpu_check.PACK_SECONDS - gpu_check.STUDY_STOP_SECONDS - 5 < budget <= 500 - 45
    assert report["exit_status"] == 0 and report["trainings_finished"] == {
        "study_additive_de-en/seed42": {"test_2016_flickr": {"bleu": 41.0}}}
    assert report["report_files"] == [f"runs/attention_study_test_2016_flickr{end}" for end in (
        ".md", ".json", "_groups.png", ".png", "_length.png")] + ["runs/reproduce_attention_study.md"]


def test_packing_brings_back_at_most_8_files(fake_project: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    write_fake_mps(tmp_path / "bin")
    out, dest = tmp_path / "check", tmp_path / "OUT"
    (out / "recipe_graphs" / "checkpoints").mkdir(parents=True)
    (out / "recipe_graphs" / "checkpoints" / "best.pt").write_bytes(b"weights")
    gpu_check.main(["--out", str(out), "--parts", "recipe", "parallel", "study", "--recipe-paths", "graphs",
                    "--parallel-counts", "1", "--pack", str(dest)], fake_project)
    files = sorted(p.name for p in dest.iterdir())
    assert len(files) == gpu_check.DEVICE_RUN["max_files"] == 8
    assert {"gpu_check.json", "README.md", "measured_parallel.json", "gpu_check_files.tar.gz",
            "attention_study_test_2016_flickr.md", "attention_study_test_2016_flickr.json",
            "attention_study_test_2016_flickr_groups.png", "attention_study_test_2016_flickr.png"} == set(files)
    with tarfile.open(dest / "gpu_check_files.tar.gz") as tar:
        names = tar.getnames()
    assert {"gpu_check/recipe_graphs/results.json", "gpu_check/recipe_graphs.log",
            "gpu_check/gpu_check.json"} <= set(names)
    assert "gpu_check/study/runs/attention_study_test_2016_flickr_length.png" in names  # no slot of its own
    assert not any(name.endswith(".pt") for name in names)
    readme = (dest / "README.md").read_text()
    assert "| recipe |" in readme and "| gpu_check_files.tar.gz |" in readme and "python scripts/gpu_check.py" in readme

    for i in range(3):  # a folder already holding other files: refused rather than more than 8 brought back
        (dest / f"stray{i}.txt").write_text("x")
    with pytest.raises(SystemExit, match="more than the 8 a device call brings back"):
        gpu_check.main(["--out", str(out), "--parts", "recipe", "--recipe-paths", "graphs", "--pack", str(dest)],
                       fake_project)


def test_the_device_run_profile_and_what_overrides_it(tmp_path: Path) -> None:
    args = gpu_check.parse_args(["--device-run", "--out", str(tmp_path), "--graph-steps", "100"], tmp_path)
    assert args.parts == ["tests", "recipe", "search", "graphs", "parallel", "study"]
    assert args.budget_seconds == 540.0 and args.keep_going and args.graph_steps == 100  # given: it wins
    assert args.recipe_paths == ["graphs"] and args.parallel_counts == [1, 2, 4]
    assert args.graph_precisions == ["bf16"]
    plain = gpu_check.parse_args(["--out", str(tmp_path)], tmp_path)
    assert plain.budget_seconds is None and not plain.keep_going and math.isinf(plain.budget.left())


def test_the_machine_names_card_versions_and_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NMT_GIT_COMMIT", "efb7581")
    machine = gpu_check.machine_info(tmp_path)
    assert machine["commit"] == "efb7581" and machine["pytorch"] and machine["python"].count(".") == 2
    assert set(machine) == {"card", "pytorch", "cuda", "cudnn", "python", "commit", "date"}
    monkeypatch.delenv("NMT_GIT_COMMIT")
    assert gpu_check.git_commit(tmp_path) == "unknown"  # not a checkout, and no variable
