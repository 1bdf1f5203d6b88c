"""reproduce.py's chain (nmt.chain): the plan from the real recipe and experiment configs, and a
resume after a kill in every stage, driven with stand-ins for train.py, backtranslate.py and tune_decoding.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.chain import card as sharing
from nmt.chain import clock as chain_clock
from nmt.chain import command, schedule
from nmt.chain import plan as chain_plan
from nmt.chain import settings as chain_settings
from nmt.chain.card import CardError
from nmt.chain.settings import ChainError

REPO_ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = {"train": ["t"], "backtranslate": ["b"], "tune": ["d"], "compare": ["c"]}

# One stand-in for the four commands: it records its call, writes what the real one writes when it ends
# (results.json, a complete provenance.json, the tune report), and, when it is the stage named in FAKE_KILL,
# first writes what a real one leaves when killed midway (last.pt, a partial provenance.json) and SIGKILLs itself;
# a training named in FAKE_HANG runs until SIGTERM (touching ./hung once it waits), then saves last.pt.
FAKE = r'''
import json, os, signal, sys
from pathlib import Path
KIND = "{kind}"
args = sys.argv[1:]
value = lambda key: next((a.split("=", 1)[1] for a in args if a.startswith(key + "=")), None)
stage = os.environ["NMT_CHAIN_STAGE"]
with open("calls.log", "a") as log:
    log.write(json.dumps([stage, args]) + "\n")
if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):  # started as a client of an MPS daemon
    with open("mps_clients.log", "a") as log:
        log.write(stage + "\n")
dying = os.environ.get("FAKE_KILL") == stage
if KIND == "train":
    run = Path(value("trainer.resume") or value("hydra.run.dir"))
    (run / "checkpoints").mkdir(parents=True, exist_ok=True)
    (run / "checkpoints" / "last.pt").write_text("weights")
    if dying:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("FAKE_HANG") == stage:  # runs until SIGTERM, then saves last.pt and exits 0, as train.py does
        def saved(*_):
            (run / "checkpoints" / "last.pt").write_text("saved at SIGTERM")
            sys.exit(0)
        signal.signal(signal.SIGTERM, saved)
        Path("hung").touch()
        signal.alarm(60)  # never outlive a test that forgot it
        while True:
            signal.pause()
    results = {{"valid": {{"bleu": 40.0}}, "test": {{"test_2016_flickr": {{"bleu": 41.0}}}}, "wall_seconds": 60}}
    (run / "results.json").write_text(json.dumps(results))
    (run / "translations").mkdir(exist_ok=True)
    (run / "translations" / "test_2016_flickr.en").write_text("a translation\n")
elif KIND == "backtranslate":
    out = Path(value("output"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "provenance.json").write_text(json.dumps({{"status": "partial"}}))
    if dying:
        os.kill(os.getpid(), signal.SIGKILL)
    (out / "provenance.json").write_text(json.dumps({{"status": "complete"}}))
elif KIND == "compare":
    if dying:
        os.kill(os.getpid(), signal.SIGKILL)
    Path(args[args.index("--out") + 1] + ".json").write_text(json.dumps({{"args": args}}))
else:
    if dying:
        os.kill(os.getpid(), signal.SIGKILL)
    out = Path(args[args.index("--out") + 1])
    out.parent.mkdir(parents=True, exist_ok=True)
    nobt = "kd_nobt" in " ".join(args)
    row = {{"beam_size": 5, "length_penalty": 1.0, "bleu": 43.0 if nobt else 42.0, "chrf": 61.25}}
    plain = {{**row, "bleu": 42.5 if nobt else 41.0}}
    test = {{"chosen on valid": {{**row, "bleu": 43.0}}}}
    if "--rerank-checkpoint" in args:  # reranking wins on val: the plain best is scored too
        row.update(rerank_weight=0.3, rerank_length_weight=0.5)
        test["chosen on valid without reranking"] = {{**plain, "bleu": 42.25}}
    first = args.index("--checkpoint") + 1
    members = args[first:next(i for i in range(first, len(args)) if args[i].startswith("--"))]
    report = {{"best": row, "grid": [plain, row] if "rerank_weight" in row else [row], "split": "valid",
               "test": test, "checkpoint": ", ".join(members), "test_split": args[args.index("--test-split") + 1]}}
    Path(str(out) + ".json").write_text(json.dumps(report))
'''


@pytest.fixture
def fake_repo(tmp_path: Path) -> Path:
    """A folder with the real configs/ and stand-ins for the four commands."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "configs").symlink_to(REPO_ROOT / "configs")
    for kind, path in (("train", "train.py"), ("backtranslate", "backtranslate.py"),
                       ("tune", "scripts/tune_decoding.py"), ("compare", "scripts/compare_runs.py")):
        (repo / path).write_text(FAKE.format(kind=kind))
    return repo


def calls(workdir: Path) -> list[tuple[str, list[str]]]:
    log = workdir / "calls.log"
    return [tuple(json.loads(line)) for line in log.read_text().splitlines()] if log.is_file() else []


def test_the_plan_follows_the_recipe_and_the_experiment_configs(fake_repo: Path, tmp_path: Path) -> None:
    chain = chain_plan.Chain(tmp_path, PROGRAMS,
                            chain_settings.load_recipe(REPO_ROOT / "configs" / "recipe", "bt_best"), "bt_best", [],
                            REPO_ROOT / "configs")
    stages = {s.name: s for s in chain_plan.plan(chain)}
    assert len(stages) == 2 + 1 + 4 + 1 + 4 + 2 + 2 + 10
    # the captions of each direction are back-translated by the run its experiment names, once
    assert stages["backtranslate bt_en"].after == ["base en-de seed42"]
    assert stages["backtranslate bt_de"].after == ["bt de-en seed42"]  # iterative: by the de-en bt model
    assert stages["bt en-de seed3"].after == ["backtranslate bt_de"]
    teachers = [f"bt de-en seed{s}" for s in (42, 1, 2, 3)]
    assert stages["student de-en seed42"].after == ["backtranslate bt_en", *teachers]
    # the two students share the distilled folder: the first makes it, the second waits for it
    assert stages["student_nobt de-en seed42"].after == [*teachers, "student de-en seed42"]
    assert set(stages["tune de-en ensemble reranked"].after) == {f"bt {p} seed{s}" for p in ("de-en", "en-de")
                                                                 for s in (42, 1, 2, 3)}


def test_the_chain_resumes_after_a_kill_in_every_stage(fake_repo: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    args = ["recipe=bt_best", f"workdir={workdir}", "device=cpu", "data.mirror=/corpora",
            "data.test_splits=[test_2016_flickr,test_2017_flickr]"]
    names = [s.name for s in chain_plan.plan(chain_plan.Chain(
        workdir, PROGRAMS, chain_settings.load_recipe(REPO_ROOT / "configs" / "recipe", "bt_best"), "bt_best",
        args[-2:], REPO_ROOT / "configs"))]
    killed = None
    for name in names:
        monkeypatch.setenv("FAKE_KILL", name)
        seen = len(calls(workdir))
        with pytest.raises(ChainError, match=f"stage '{name}' failed \\(exit -9\\); its log: .*run the same command "
                                             "again to resume") as raised:
            command.main(args, fake_repo)
        assert "\n" not in str(raised.value)
        ran = [stage for stage, _ in calls(workdir)[seen:]]
        assert ran == ([killed] if killed else []) + [name]  # what was complete was skipped
        if killed and killed.split()[0] in ("base", "bt", "student"):  # a killed training resumes from last.pt
            assert calls(workdir)[seen][1] == [f"trainer.resume={workdir / 'runs'}/" + run_folder(killed)]
        killed = name
    monkeypatch.delenv("FAKE_KILL")
    report = command.main(args, fake_repo)
    assert [stage for stage, _ in calls(workdir)].count(names[-1]) == 2 and len(report["systems"]) == 10
    first = calls(workdir)[0][1]  # train.py's data overrides reach every training, and the mirror every job
    assert "data.mirror=/corpora" in first and "data.test_splits=[test_2016_flickr,test_2017_flickr]" in first
    assert "mirror=/corpora" in next(a for stage, a in calls(workdir) if stage.startswith("backtranslate"))
    table = (workdir / "runs" / "reproduce_bt_best.md").read_text()
    assert "| de-en ensemble reranked | beam 5, α = 1, λ = 0.3, γ = 0.5 | 42.00 | 43.00 | 61.25 | 43.00 |" in table
    assert report["test_split"] == "test_2016_flickr"  # the recipe's split, not the last extra one
    assert ("| system | chosen on val | val BLEU | test_2016_flickr BLEU | test_2016_flickr chrF2 | test_2017_flickr "
            "BLEU |") in table and "| bt de-en seed1 | 40.00 | 41.00 | – | 1.0 |" in table  # the fake runs: no chrF
    # the extra test split: the setting chosen on val, scored once more
    name = "score de-en ensemble reranked test_2017_flickr"
    score = " ".join(next(a for stage, a in calls(workdir) if stage == name))
    assert score.count("--test-split test_2017_flickr --out") == 1 and "--rerank-weights 0.3" in score
    assert score.endswith("--rerank-length-weights 0.5") and "--beam-sizes 5 --length-penalties 1.0" in score
    assert report["student_chosen_on_val"] == {p: f"{p} student_nobt reranked" for p in ("de-en", "en-de")}
    assert "Student chosen on val for en-de: en-de student_nobt reranked." in table
    # the model to ship per direction: one model (no ensemble) and no reranking, chosen on val (the nobt student's
    # 42.50 without reranking beats the single model's 42.00 and the other student's 41.00); its test score is that
    # setting's, scored once
    shipped = report["one_model_chosen_on_val"]["de-en"]
    assert shipped["system"] == "de-en student_nobt reranked" and shipped["choice"] == "beam 5, α = 1"
    assert (shipped["val_bleu"], shipped["test_bleu"]) == (42.5, 42.25)
    assert shipped["checkpoint"] == "runs/kd_nobt_de-en/seed42"
    assert shipped["translations"] == "runs/systems/de-en/student_nobt_reranked.without_reranking.test_2016_flickr.en"
    assert not next(s for s in report["systems"] if s["system"] == "de-en ensemble reranked")["alone"]
    assert ("One model to ship for en-de, chosen on val without reranking: en-de student_nobt reranked at beam 5, "
            "α = 1 (val BLEU 42.50; test_2016_flickr BLEU 42.25, chrF2 61.25; runs/kd_nobt_en-de/seed42).") in table
    assert command.main(args, fake_repo) is not None and len(calls(workdir)) == len(names) * 2  # all skipped


def run_folder(stage: str) -> str:
    """``bt de-en seed1`` -> ``bt_best_de-en/seed1``."""
    kind, pair, seed = stage.split()
    return f"{ {'base': 'best', 'bt': 'bt_best', 'student': 'kd_best'}[kind]}_{pair}/{seed}"


def test_stages_that_do_not_wait_for_each_other_run_at_once(fake_repo: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    # each training says how many were running when it started, then takes a while
    (fake_repo / "train.py").write_text(
        "import os, time\nfrom pathlib import Path\nPath('running').mkdir(exist_ok=True)\n"
        "mine = Path('running', str(os.getpid()))\nmine.touch()\n"
        "open('overlap.log', 'a').write(f\"{len(os.listdir('running'))}\\n\")\ntime.sleep(0.5)\n"
        + (fake_repo / "train.py").read_text() + "\nmine.unlink()\n")
    command.main(["recipe=bt_best", f"workdir={workdir}", "device=cpu", "parallel=4"], fake_repo)
    times = json.loads((workdir / "runs" / ".reproduce" / "times.json").read_text())
    assert len(times["bt"]) == 8 and len(times["base"]) == 2 and len(times["tune"]) == 10
    assert max(int(n) for n in (workdir / "overlap.log").read_text().split()) > 1


@pytest.mark.parametrize(("args", "message"), [
    (["recipe=bt_bets"], "recipe=bt_bets is not in .*; valid: attention_study, attention_study_cpu, bt_best, tiny"),
    (["paralel=2"], "unknown config key paralel: did you mean parallel\\?"),
    (["parallel=0"], "parallel=0 must be auto \\(on a GPU the card's measured figure, else 4; 1 on a CPU\\) or a whole "
                     "number >= 1"),
    (["device=tpu"], "device='tpu' must be auto, cpu or cuda"),
    (["data.no_such_key=1"], "train.py experiment=multi30k_best .*data.no_such_key=1: .*no_such_key"),
    (["--dry-run"], "'--dry-run' is not key=value \\(python reproduce.py --help lists them\\)"),
    (["budget=8 mins"], "budget='8 mins' is not a duration; give seconds \\(600\\), or hours, minutes and seconds "
                        "\\(90s, 45m, 1h30m, 1h30m15s\\)"),
    (["budget=1h30"], "budget='1h30' is not a duration \\(a number after h or m needs its unit\\)"),
    (["budget=0s"], "budget='0s' leaves no time"),
    (["deadline=25:99"], "deadline='25:99' is not a time of day; give HH:MM or HH:MM:SS"),
    (["deadline=2020-01-01T00:00"], "deadline='2020-01-01T00:00' has passed"),
    (["recipe=attention_study", "device=cpu", "budget=40m"],
     "budget=40m \\(39m\\d\\ds left\\) is shorter than the shortest stage that can start now, 'none de-en seed42' "
     "\\(about 45m00s\\); give a budget of at least that"),
])
def test_a_mistake_is_one_line_and_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(REPO_ROOT / "reproduce.py"), *args, f"workdir={tmp_path}",
                           "dry_run=true"], capture_output=True, text=True)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("reproduce.py: error: ") and re.search(message, done.stderr), done.stderr


def test_a_dry_run_shows_every_stage_and_runs_nothing(fake_repo: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    args = ["recipe=tiny", f"workdir={workdir}", "dry_run=true", "data.test_splits=[test_2016_flickr,test_2017]"]
    assert command.main(args, fake_repo) is None and calls(workdir) == []
    shown = capsys.readouterr().out.splitlines()
    assert len(shown) == 26 + 10 + 1 and all(line.startswith("reproduce.py: to run ") for line in shown[:-1])
    # the tiny recipe's guesses, one at a time (parallel=auto on a CPU)
    assert shown[-1] == ("reproduce.py: ETA 1h38m (cpu, parallel=1, auto: 1 on a CPU); guessed: base, backtranslate, "
                         "bt, student, student_nobt, tune")
    assert "trainer.max_steps=20" in shown[0] and any("score de-en single test_2017: built from " in s for s in shown)


def test_the_eta_schedules_the_rest_as_the_runner_would(tmp_path: Path) -> None:
    def stage(name: str, kind: str, after: list[str]) -> chain_plan.Stage:
        return chain_plan.Stage(name, kind, [], [], lambda: [], lambda: False, after)

    clock = chain_clock.Clock(tmp_path / "times.json", {"train": 60, "tune": 10})
    stages = [stage("a", "train", []), stage("b", "train", []), stage("c", "tune", ["a", "b"])]
    assert schedule.eta(stages, set(), {}, clock, 1) == "2h10m"  # one at a time: 60 + 60 + 10 minutes
    assert schedule.eta(stages, set(), {}, clock, 2) == "1h10m"  # a and b at once, then c
    assert schedule.eta(stages, {"a"}, {}, clock, 2) == "1h10m"  # b, then c
    clock.record("train", 600.0)  # this workdir's own time replaces the recipe's guess
    assert schedule.eta(stages, set(), {}, clock, 2) == "20m00s"
    for seconds in (5279.0, 1006.0, 886.0):  # the chain's back-translations: the first shared the machine
        clock.record("backtranslate", seconds)
    assert clock.estimate("backtranslate") == 1006.0  # the median; the mean would say 40 minutes


@pytest.mark.parametrize(("recipe", "experiment", "runs"), [
    ("attention_study", "multi30k_best", "study"), ("attention_study_cpu", "attention_sweep_cpu", "study_cpu")])
def test_the_attention_study_is_36_trainings_and_a_report_per_test_split(recipe: str, experiment: str, runs: str,
                                                                         tmp_path: Path) -> None:
    data = ["data.test_splits=[test_2016_flickr,test_2017_flickr]"]
    chain = chain_plan.Chain(tmp_path, PROGRAMS, chain_settings.load_recipe(REPO_ROOT / "configs" / "recipe", recipe),
                            recipe, data, REPO_ROOT / "configs")
    stages = chain_plan.plan(chain)
    trainings = [s for s in stages if s.kind != "report"]
    types = ("none", "additive", "dot", "scaled_dot", "general", "multihead")
    expected = {f"{t} {p} seed{s}": (t, p, s) for p in ("de-en", "en-de") for s in (42, 1, 2) for t in types}
    assert [s.name for s in trainings] == list(expected)  # seed by seed: a stopped study already compares the types
    for stage in trainings:
        kind, pair, seed = expected[stage.name]
        src, tgt = pair.split("-")
        assert stage.command() == ["t", f"experiment={experiment}", f"attention={kind}", f"trainer.seed={seed}",
                                   f"data.src_lang={src}", f"data.tgt_lang={tgt}", *data,
                                   f"hydra.run.dir={tmp_path / 'runs' / f'{runs}_{kind}_{pair}' / f'seed{seed}'}"]
        assert stage.after == [] and stage.kind == kind  # all 36 may run at once
    reports = [s for s in stages if s.kind == "report"]
    assert [s.name for s in reports] == ["report test_2016_flickr", "report test_2017_flickr"]
    for report in reports:
        command = report.command()
        # paths from the workdir, where the stage runs: the report names no machine's folders
        assert set(report.after) == set(expected)
        assert command[1:37] == [str(s.outputs[0].relative_to(tmp_path.resolve())) for s in trainings]
        split = report.name.split()[1]
        assert command[37:] == ["--split", split, "--group-by", "attention", "--baseline", "additive",
                                "--time-decoding", "--out", f"runs/{recipe}_{split}"]
    # benchmark.py study-speed's figures, once the workdir has them: one report per direction, both passed
    speeds = [tmp_path / "runs" / f"{recipe}_speed_{pair}.json" for pair in ("en-de", "de-en")]
    speeds[0].parent.mkdir(parents=True, exist_ok=True)
    for speed in speeds:
        speed.write_text("{}")
    assert reports[0].command()[-3:] == ["--speed", *(f"runs/{speed.name}" for speed in sorted(speeds))]


def test_a_stopped_study_resumes_where_it_stopped(fake_repo: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    args = ["recipe=attention_study", f"workdir={workdir}", "device=cpu", "parallel=3"]
    monkeypatch.setenv("FAKE_KILL", "dot en-de seed1")
    with pytest.raises(ChainError, match="stage 'dot en-de seed1' failed"):
        command.main(args, fake_repo)
    first = [stage for stage, _ in calls(workdir)]
    assert "report test_2016_flickr" not in first  # the report waits for every training
    monkeypatch.delenv("FAKE_KILL")
    report = command.main(args, fake_repo)
    second = calls(workdir)[len(first):]
    finished = {stage for stage in first if stage != "dot en-de seed1"}
    assert not finished & {stage for stage, _ in second}  # what was complete is skipped
    assert ("dot en-de seed1", [f"trainer.resume={workdir / 'runs' / 'study_dot_en-de' / 'seed1'}"]) in second
    assert len(finished) + len(second) == 37 and second[-1][0] == "report test_2016_flickr"
    assert report["reports"] == ["runs/attention_study_test_2016_flickr.md"]  # from the workdir: no machine's folders
    assert len(report["runs"]) == 36 and report["systems"] == []
    assert report["runs"][0]["dir"] == "runs/study_none_de-en/seed42"
    assert "The study's report: " in (workdir / "runs" / "reproduce_attention_study.md").read_text()


def test_stages_are_packed_up_to_the_limit_after_what_they_wait_for(tmp_path: Path) -> None:
    # each stand-in logs when it starts and ends; eight independent stages and one that waits for two of them
    script = ("import sys, time; log = open('events.log', 'a'); log.write(f'start {sys.argv[1]} {time.time()}\\n'); "
              "log.flush(); time.sleep(0.3); log.write(f'end {sys.argv[1]} {time.time()}\\n')")
    chain = chain_plan.Chain(tmp_path, PROGRAMS, chain_settings.load_recipe(REPO_ROOT / "configs" / "recipe", "tiny"),
                            "tiny", [], REPO_ROOT / "configs")

    def stage(name: str, after: list[str]) -> chain_plan.Stage:
        return chain_plan.Stage(name, "train", [], [], lambda: [sys.executable, "-c", script, name],
                               lambda: (tmp_path / "events.log").is_file()
                               and f"end {name} " in (tmp_path / "events.log").read_text(), after)

    stages = [stage("late", ["s0", "s7"]), *(stage(f"s{i}", []) for i in range(8))]
    schedule.run_stages(chain, stages, 3, chain_clock.Clock(tmp_path / "times.json", {}))
    events = sorted(((float(t), what, name) for what, name, t in
                     map(str.split, (tmp_path / "events.log").read_text().splitlines())))
    running, most, ended = 0, 0, {}
    for moment, what, name in events:
        running += 1 if what == "start" else -1
        most = max(most, running)
        if what == "end":
            ended[name] = moment
        elif name == "late":
            assert {"s0", "s7"} <= set(ended)  # started only once both had ended
    assert most == 3 and len(ended) == 9


CARD = "Fake GPU 80GB"  # a card measured in the stand-in measured_parallel.json below
MEASURED = {"trainings_at_once": 6, "tokens_per_s_together": 300000, "over_one_alone": 4.6,
            "measured": "2026-11-28, abc1234, PyTorch 2.5"}


@pytest.mark.parametrize(("device", "card", "parallel", "how"), [
    ("cpu", None, 1, "auto: 1 on a CPU"),
    ("cuda", (CARD, 80000.0), 6, f"auto: measured on this card, {CARD} (2026-11-28, abc1234, PyTorch 2.5): 4.6x one "
                                 "training alone"),
    ("cuda", ("Other GPU", 80000.0), sharing.PARALLEL_ON_CUDA,
     "auto: the default for a card not measured in measured_parallel.json (Other GPU)"),
    ("cuda", (CARD, 10000.0), 2, f"auto: measured on this card, {CARD} (2026-11-28, abc1234, PyTorch 2.5): 4.6x one "
                                 "training alone, cut to the 2 its free memory holds (10,000 MiB)"),
])
def test_parallel_auto_follows_what_the_card_measured(device: str, card: tuple[str, float] | None, parallel: int,
                                                      how: str, fake_repo: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture) -> None:
    measured = tmp_path / "measured_parallel.json"
    measured.write_text(json.dumps({"about": "a test's", "cards": {CARD: MEASURED}}))
    monkeypatch.setattr(sharing, "MEASURED_PARALLEL", measured)
    monkeypatch.setattr(command, "cuda_card", lambda: card)
    command.main(["recipe=attention_study", f"workdir={tmp_path}", f"device={device}", "dry_run=true"], fake_repo)
    last = capsys.readouterr().out.splitlines()[-1]
    mps = "; no MPS: not measured faster on this card" if device == "cuda" else ""
    assert f"({device}, parallel={parallel}, {how}{mps}); " in last
    if device == "cuda":  # the recipe says which of its estimates were measured
        assert "measured: additive (3m40s and 3m49s" in last and "guessed: none, dot," in last


def test_the_packaged_measured_parallel_file_is_read_as_is(monkeypatch: pytest.MonkeyPatch) -> None:
    about = json.loads(sharing.MEASURED_PARALLEL.read_text())
    assert "gpu_check.py --parts parallel" in about["about"] and isinstance(about["cards"], dict)
    name = next(iter(about["cards"]), "a card nobody measured")
    parallel, how = sharing.choose_parallel("auto", "cuda", (name, 1e9))
    assert (parallel, how.split(",")[0]) == ((about["cards"][name]["trainings_at_once"], "auto: measured on this card")
                                             if about["cards"] else (sharing.PARALLEL_ON_CUDA, how.split(",")[0]))


def test_parallel_beyond_the_card_memory_is_refused_before_any_work(fake_repo: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(command, "cuda_card", lambda: ("Other GPU", 10000.0))
    with pytest.raises(CardError) as raised:
        command.main(["recipe=attention_study", f"workdir={tmp_path}", "device=cuda", "parallel=5"], fake_repo)
    assert str(raised.value) == ("parallel=5 is more than this card's memory holds: 10,000 MiB free on Other GPU, "
                                 "about 4,096 MiB per training (an estimate); parallel=2 would fit")
    assert calls(tmp_path) == []
    command.main(["recipe=attention_study", f"workdir={tmp_path}", "device=cuda", "parallel=2", "dry_run=true"],
                   fake_repo)  # what fits is taken as given


def test_stages_share_the_card_under_mps_when_this_card_measured_it_faster(fake_repo: Path, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch,
                                                                           capsys: pytest.CaptureFixture) -> None:
    from tests.test_gpu_check import write_fake_mps

    mps_log = write_fake_mps(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    measured = tmp_path / "measured_parallel.json"
    measured.write_text(json.dumps({"about": "a test's", "cards": {CARD: {**MEASURED, "mps": True}}}))
    monkeypatch.setattr(sharing, "MEASURED_PARALLEL", measured)
    monkeypatch.setattr(command, "cuda_card", lambda: (CARD, 80000.0))
    workdir = tmp_path / "work"
    command.main(["recipe=tiny", f"workdir={workdir}", "device=cuda", "parallel=2"], fake_repo)
    trainings = [stage for stage, _ in calls(workdir) if stage.startswith(("base", "kd"))]
    assert trainings and set(trainings) <= set((workdir / "mps_clients.log").read_text().splitlines())
    started, stopped = mps_log.read_text().splitlines()
    pipe = started.split()[1]
    assert started == f"start {pipe}" and stopped == f"quit {pipe}"  # its own pipe folder, the clients' too
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ  # given back once the chain is done
    assert "parallel=2 (as given); mps=auto: measured faster on this card" in capsys.readouterr().out
    # mps=false, and one stage at a time, run without it
    for setting in ("mps=false", "parallel=1"):
        assert sharing.choose_mps(setting.partition("=")[2] if setting.startswith("mps") else "auto", "cuda",
                                    1 if setting == "parallel=1" else 2, (CARD, 80000.0))[0] is False


def test_mps_that_cannot_serve_is_one_line(fake_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CardError, match=r"^mps=true needs a CUDA GPU .*; use mps=auto$"):
        command.main(["recipe=tiny", f"workdir={tmp_path}", "device=cpu", "mps=true"], fake_repo)
    mps_log = write_fake_mps_failing(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setattr(command, "cuda_card", lambda: ("Other GPU", 80000.0))
    with pytest.raises(CardError, match=r"nvidia-cuda-mps-control -d failed with exit status 3: .*; run with "
                                         r"mps=false$"):
        command.main(["recipe=tiny", f"workdir={tmp_path / 'w'}", "device=cuda", "mps=true"], fake_repo)
    assert [line.split()[0] for line in mps_log.read_text().splitlines()] == ["start", "quit"]  # stopped all the same
    assert calls(tmp_path / "w") == []
    with pytest.raises(ChainError, match=r"mps='often' must be auto"):
        command.main(["recipe=tiny", f"workdir={tmp_path}", "mps=often"], fake_repo)


def write_fake_mps_failing(folder: Path) -> Path:
    from tests.test_gpu_check import write_fake_mps

    return write_fake_mps(folder, start_status=3)


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_the_recipes_the_settings_and_an_example(flag: str) -> None:
    done = subprocess.run([sys.executable, str(REPO_ROOT / "reproduce.py"), flag], capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    recipes = sorted(p.stem for p in (REPO_ROOT / "configs" / "recipe").glob("*.yaml"))
    listed = done.stdout.split("recipes (recipe=NAME):\n")[1].split("\n\n")[0].splitlines()
    assert [line.split()[0] for line in listed] == recipes
    settings = done.stdout.split("settings [default]:\n")[1].split("\n\n")[0]
    named = [line.split("=")[0].strip() for line in settings.splitlines() if not line.startswith(" " * 3)]
    assert named == [*chain_settings.DEFAULTS, "data.KEY", "launcher.KEY"]
    assert "budget=TIME" in settings and "90s, 45m, 1h30m" in settings and "[auto]" in settings
    assert "python reproduce.py recipe=attention_study workdir=study budget=8m" in done.stdout


@pytest.mark.parametrize("args", [["--help"], ["recipe=bt_bets"], ["recipe=tiny", "paralel=2"]])
def test_help_and_a_mistake_answer_without_pytorchs_start_up(args: list[str]) -> None:
    """The chain runs other programs; importing PyTorch (about 2 s here) only to print its help or refuse a setting
    made every answer that slow."""
    probe = ("import runpy, sys\nsys.argv = ['reproduce.py', *sys.argv[1:]]\ntry:\n"
             "    runpy.run_path('reproduce.py', run_name='__main__')\nexcept SystemExit:\n    pass\n"
             "print('torch' in sys.modules, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe, *args], cwd=REPO_ROOT, capture_output=True, text=True)
    assert done.stderr.splitlines()[-1] == "False", done.stderr


# ------------------------------------------------------------------------------------------------ Budget
LENGTHS = {"report": 300.0}  # seconds each kind of stand-in stage takes on the fake clock; a training 600


class FakeClock:
    """The chain's clock in a test: time moves by a stage's set length when it ends, and past any budget once a
    stand-in in FAKE_HANG waits (./hung in the workdir)."""

    def __init__(self) -> None:
        self.now, self.workdirs = 0.0, []

    def __call__(self) -> float:
        for hung in (w / "hung" for w in self.workdirs):
            if hung.exists():
                hung.unlink()
                self.now += 1e6
        return self.now


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    clock = FakeClock()
    monkeypatch.setattr(chain_clock, "monotonic", clock)
    monkeypatch.setattr(chain_clock.Clock, "estimate", lambda self, kind: LENGTHS.get(kind, 600.0))

    def record(self: chain_clock.Clock, kind: str, seconds: float) -> None:
        clock.now += LENGTHS.get(kind, 600.0)

    monkeypatch.setattr(chain_clock.Clock, "record", record)
    return clock


def study(workdir: Path, *more: str) -> list[str]:
    workdir.mkdir(exist_ok=True)
    return ["recipe=attention_study", "device=cpu", "parallel=1", *more, f"workdir={workdir}"]


def test_a_budget_starts_only_what_fits_and_says_how_to_go_on(fake_repo: Path, tmp_path: Path, fake_clock: FakeClock,
                                                              capsys: pytest.CaptureFixture) -> None:
    workdir = tmp_path / "work"
    args = study(workdir, "budget=35m")  # 2100 s: three 600 s trainings, not a fourth
    command.main([*args, "dry_run=true"], fake_repo)
    said = capsys.readouterr().out.splitlines()
    assert said[-1] == "reproduce.py: budget=35m: 3 of the 37 stages left would run in it"
    assert command.main(args, fake_repo) is None
    assert [stage for stage, _ in calls(workdir)] == ["none de-en seed42", "additive de-en seed42", "dot de-en seed42"]
    said = capsys.readouterr().out.splitlines()
    assert said[-2].startswith("reproduce.py: stopped at budget=35m: 3 of 37 stages complete, 34 left (about ")
    assert said[-1] == ("reproduce.py: go on with: python reproduce.py recipe=attention_study device=cpu parallel=1 "
                        f"budget=35m workdir={workdir}  (elsewhere: copy the workdir there first)")
    command.main(args, fake_repo)  # the command it printed: the next three
    assert [stage for stage, _ in calls(workdir)][3:] == ["scaled_dot de-en seed42", "general de-en seed42",
                                                          "multihead de-en seed42"]


def test_the_budget_stops_a_running_training_so_that_it_resumes(fake_repo: Path, tmp_path: Path, fake_clock: FakeClock,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture) -> None:
    workdir = tmp_path / "work"
    fake_clock.workdirs.append(workdir)
    args = study(workdir, "budget=35m")
    monkeypatch.setenv("FAKE_HANG", "additive de-en seed42")
    assert command.main(args, fake_repo) is None  # not an error: the budget ended it
    said = capsys.readouterr().out
    assert "reproduce.py: stop  additive de-en seed42: budget=35m is spent (SIGTERM" in said
    assert "stopped at budget=35m: 1 of 37 stages complete, 36 left" in said
    run = workdir / "runs" / "study_additive_de-en" / "seed42"
    assert (run / "checkpoints" / "last.pt").read_text() == "saved at SIGTERM" and not (run / "results.json").exists()
    monkeypatch.delenv("FAKE_HANG")
    command.main(args, fake_repo)
    assert calls(workdir)[2] == ("additive de-en seed42", [f"trainer.resume={run}"])


def without_checkpoints_of_finished_runs(folder: str, names: list[str]) -> list[str]:
    """shutil.copytree's ignore: what is copied to go on elsewhere, a finished run's checkpoints left behind."""
    return ["checkpoints"] if "results.json" in names else []


def test_the_cpu_studys_estimates_are_the_times_its_kept_workdir_measured() -> None:
    """The CPU study's first dry run said 8 h 42 m and its report stage 30 minutes; its 36 trainings took about
    6 h and the report 2 minutes. Its guesses now come from its own times.json (kept in the repository)."""
    kept = REPO_ROOT / "studies" / "attention_study_cpu" / "runs" / ".reproduce"
    times = json.loads((kept / "times.json").read_text())
    guesses = chain_settings.load_recipe(REPO_ROOT / "configs" / "recipe", "attention_study_cpu").eta_minutes.cpu
    assert set(times) == set(guesses)
    for kind, seconds in times.items():  # within a minute of the mean of what the study measured
        assert abs(60 * guesses[kind] - sum(seconds) / len(seconds)) <= 60, kind


def test_a_study_goes_on_elsewhere_from_results_and_test_outputs_only(fake_repo: Path, tmp_path: Path,
                                                                     fake_clock: FakeClock,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    at_once = command.main(study(tmp_path / "at_once"), fake_repo)  # the whole study in one call, for comparison
    first, second = tmp_path / "first", tmp_path / "second"
    fake_clock.workdirs.append(first)
    monkeypatch.setenv("FAKE_HANG", "dot de-en seed42")
    assert command.main(study(first, "budget=35m"), fake_repo) is None  # none and additive done, dot stopped
    monkeypatch.delenv("FAKE_HANG")
    shutil.copytree(first, second, ignore=without_checkpoints_of_finished_runs)
    finished = [second / "runs" / f"study_{t}_de-en" / "seed42" for t in ("none", "additive")]
    assert all((r / "results.json").is_file() and not (r / "checkpoints").exists() for r in finished)
    sliced = command.main(study(second), fake_repo)
    ran = calls(second)[len(calls(first)):]
    assert ran[0] == ("dot de-en seed42", [f"trainer.resume={second / 'runs' / 'study_dot_de-en' / 'seed42'}"])
    assert not {"none de-en seed42", "additive de-en seed42"} & {stage for stage, _ in ran}  # none trained again
    assert len(ran) == 35 and ran[-1][0] == "report test_2016_flickr"

    def same(report: dict, workdir: Path) -> str:  # the report, wherever it ran
        runs = [{k: v for k, v in r.items() if k != "dir"} for r in report["runs"]]
        return json.dumps([runs, report["reports"]]).replace(str(workdir), "WORKDIR")

    assert same(sliced, second) == same(at_once, tmp_path / "at_once")
    compared = [(w / "runs" / "attention_study_test_2016_flickr.json").read_text().replace(str(w), "WORKDIR")
                for w in (second, tmp_path / "at_once")]
    assert compared[0] == compared[1]  # the report stage read the same runs, in the same order


def test_a_finished_run_without_checkpoints_is_trained_again_where_a_later_stage_reads_them(
        fake_repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A kept workdir on a new machine: the base runs hold results.json but no checkpoints. The one whose
    checkpoint a stage left to run reads is named before any work, with the reason, and trained again (its kept
    files set aside, nothing lost); the one nothing reads is left alone."""
    for pair in ("de-en", "en-de"):  # bt_best's base runs copied with their results only
        run = tmp_path / "runs" / f"best_{pair}" / "seed42"
        (run / "translations").mkdir(parents=True)
        (run / "results.json").write_text(json.dumps({"kept": pair, "valid": {"bleu": 40.0}, "test": {},
                                                      "wall_seconds": 60}))
    args = ["recipe=bt_best", f"workdir={tmp_path}", "device=cpu"]
    command.main([*args, "dry_run=true"], fake_repo)
    said = capsys.readouterr().out
    assert ("retrain base en-de seed42: runs/best_en-de/seed42 keeps results.json but no checkpoints, and stage "
            "'backtranslate bt_en' reads them") in said
    assert "to run   base en-de seed42" in said and "complete base de-en seed42" in said
    assert "retrain base de-en" not in said
    command.main(args, fake_repo)
    ran = [stage for stage, _ in calls(tmp_path)]
    assert ran[0] == "base en-de seed42" and "base de-en seed42" not in ran
    kept = json.loads((tmp_path / "runs/.reproduce/replaced/best_en-de/seed42/results.json").read_text())
    assert kept["kept"] == "en-de"  # set aside, not lost
    assert (tmp_path / "runs/best_en-de/seed42/checkpoints/last.pt").is_file()


def test_a_back_translation_kept_without_its_pairs_is_made_again_by_a_retrained_model(
        fake_repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A kept workdir holds bt_en's provenance.json (complete) but not its synthetic pairs, and the base runs
    without checkpoints: the bt trainings read the pairs, so the back-translation is named and made again, after
    its model is retrained; its kept record is set aside, not lost."""
    for pair in ("de-en", "en-de"):
        run = tmp_path / "runs" / f"best_{pair}" / "seed42"
        (run / "translations").mkdir(parents=True)
        (run / "results.json").write_text(json.dumps({"valid": {"bleu": 40.0}, "test": {}, "wall_seconds": 60}))
    (tmp_path / "runs/bt_en").mkdir()
    (tmp_path / "runs/bt_en/provenance.json").write_text(json.dumps(
        {"status": "complete", "bytes": {"train.de": 8357280, "train.en": 7486758}}))
    args = ["recipe=bt_best", f"workdir={tmp_path}", "device=cpu"]
    command.main([*args, "dry_run=true"], fake_repo)
    said = capsys.readouterr().out
    assert ("retrain backtranslate bt_en: runs/bt_en keeps provenance.json but not its synthetic pairs, and stage "
            "'bt de-en seed42' reads them") in said
    assert "retrain base en-de seed42: runs/best_en-de/seed42 keeps results.json but no checkpoints" in said
    assert "to run   backtranslate bt_en" in said and "retrain base de-en" not in said
    command.main(args, fake_repo)
    ran = [stage for stage, _ in calls(tmp_path)]
    assert ran[:3] == ["base en-de seed42", "backtranslate bt_en", "bt de-en seed42"]
    assert ran.count("backtranslate bt_en") == 1 and "base de-en seed42" not in ran
    aside = json.loads((tmp_path / "runs/.reproduce/replaced/bt_en/provenance.json").read_text())
    assert aside["bytes"]["train.de"] == 8357280


