"""nmt_tools.benchmark and nmt_tools.peer: their JSON, parsing and ratios (no timings asserted).

benchmark.py runs for 3 steps of a tiny model on the reversal corpus of test_training.py; the peer
comparison is checked on a small fake JoeyNMT ``summary.json`` in the layout of its summarize.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import SRC, save_tiny_checkpoint
from omegaconf import OmegaConf

from nmt.analysis import compare
from nmt.common.cuda_graphs import GraphStats
from nmt.common.settings import to_plain_dict
from nmt.data import prepare_data
from nmt.inference.engine import Translator
from nmt.model.checkpoint import save_checkpoint
from nmt.model.seq2seq import Seq2Seq
from nmt_tools import backtranslation_speed, benchmark
from nmt_tools import peer as peer_compare
from tests.test_training import TINY, tiny_config, write_reversal_corpus


def test_benchmark_writes_the_report(tmp_path: Path) -> None:
    torch.set_num_threads(1)  # a 60k-parameter model gains nothing from two threads, and loses when cores are busy
    files = write_reversal_corpus(tmp_path / "corpus")
    files_override = "data.files={" + ",".join(
        f"{split}:{{src:'{paths['src']}',tgt:'{paths['tgt']}'}}" for split, paths in files.items()) + "}"
    overrides = [*TINY, files_override, f"data.cache_dir={tmp_path / 'cache'}", "trainer.device=cpu"]
    out = tmp_path / "bench"
    report = benchmark.main(["train", *overrides, "--train-steps", "3", "--warmup-steps", "1", "--reps", "1",
                             "--translate-limit", "12", "--out", str(out)])

    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved == json.loads(json.dumps(report))
    assert {"benchmark", "date", "command", "host", "device", "measured_without_gpu", "versions", "config",
            "training", "translation"} <= set(saved)
    assert {"torch", "nmt", "python"} <= set(saved["versions"])
    assert saved["host"]["cpu_count"] >= 1 and saved["device"]["type"] == "cpu" and saved["measured_without_gpu"]
    assert saved["config"]["model"]["emb_size"] == 32 and files_override in saved["config"]["overrides"]
    training = saved["training"]
    assert training["steps"] == 3 and training["warmup_steps"] == 1 and training["target_tokens"] > 0
    assert training["target_tokens_per_s_median"] > 0 and training["target_tokens_per_s_total"] > 0
    assert training["gpu_utilisation"] == {"available": False, "reason": "device is cpu, not a GPU"}
    assert training["cuda_peak_memory_allocated_mib"] is None
    translation = saved["translation"]
    assert translation["bleu_meaningful"] is False and "meaningless" in translation["note"]
    assert translation["split"] == "test" and translation["sentences"] == 12
    assert translation["gpu_utilisation"]["available"] is False
    assert [row["mode"] for row in translation["results"]] == ["greedy", "beam5"]
    assert all(row["sentences_per_s"] > 0 and "bleu" in row for row in translation["results"])


def test_profile_counts_matmul_flops_in_every_part_and_groups_the_time(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    files = write_reversal_corpus(tmp_path / "corpus")
    files_override = "data.files={" + ",".join(
        f"{split}:{{src:'{paths['src']}',tgt:'{paths['tgt']}'}}" for split, paths in files.items()) + "}"
    overrides = [*TINY, files_override, f"data.cache_dir={tmp_path / 'cache'}", "trainer.device=cpu"]
    report = benchmark.main(["profile", *overrides, "--steps", "2", "--profile-steps", "1", "--warmup-steps", "1",
                             "--matmul-size", "64", "--out", str(tmp_path / "profile")])
    shares = report["flops_share_by_module"]
    # the encoder is an embedding plus nn.GRU: a share above 0 means the GRU's inner matmuls were counted
    assert shares["Seq2Seq.encoder"] > 0 and shares["Seq2Seq.decoder"] > shares["Seq2Seq.encoder"]
    assert sum(shares.values()) == pytest.approx(1.0)
    assert report["multiply_adds_per_target_token"] == report["matmul_flops_per_target_token"] / 2 > 0
    assert report["achieved_flops"] > 0 and report["measured_matmul_flops"] > 0
    assert report["flop_counted_target_tokens"] == report["timing"]["target_tokens"]  # the timed batches, again
    groups = report["time_by_op_group"]["groups"]
    assert groups["matmul"]["seconds"] > 0 and "outside ATen ops (Python, dispatch, profiler)" in groups
    assert sum(g["share"] for g in groups.values()) == pytest.approx(1.0, abs=0.05)
    assert json.loads((tmp_path / "profile.json").read_text())["benchmark"] == "profile"


# --- peer_compare ---------------------------------------------------------------------------------


def fake_peer_summary(workdir: Path) -> Path:
    """A results/summary.json as the peer's scripts/summarize.py writes it (only the fields we read, and a few)."""
    def decode(n: int, gen: float, wall: float, bleu: float) -> dict[str, Any]:
        return {"runs": [{"rep": f"rep{i}", "n_sents": n, "generation_sec": gen, "process_wall_sec": wall}
                         for i in (1, 2, 3)],
                "n_sents": n, "generation_sec_median": gen, "process_wall_sec_median": wall,
                "sent_per_sec_generation": n / gen, "sent_per_sec_process_wall": n / wall,
                "sacrebleu": [{"name": "BLEU", "score": bleu}, {"name": "chrF2", "score": 49.25}]}

    summary = {
        "throughput": {"log": "logs/throughput_train.log", "batch_sentences": 128, "steps": [], "epochs": [],
                       "validations": [], "interval_tok_per_sec_median": 690,
                       "totals": {"epochs": 1, "train_sec": 600.0, "sec_per_epoch": 600.0,
                                  "trg_tok_per_sec": 640.0, "sent_per_sec": 48.0}},
        "decode": {"greedy.test_2016_flickr": decode(1000, 15.0, 20.0, 28.53),
                   "beam5.test_2016_flickr": decode(1000, 50.0, 62.5, 29.92),
                   "greedy.dev": decode(1014, 15.0, 20.0, 30.0)},
    }
    path = workdir / "results" / "summary.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(summary))
    return path


def test_peer_summary_is_read_in_our_shape(tmp_path: Path) -> None:
    theirs = peer_compare.load_peer_summary(fake_peer_summary(tmp_path))
    assert theirs["training"]["target_tokens_per_s"] == 640.0 and theirs["training"]["sentences_per_s"] == 48.0
    assert "throughput run" in theirs["training"]["source"] and "128 sentences" in theirs["training"]["source"]
    assert set(theirs["decode"]) == {"greedy", "beam5"}  # the dev decode is not compared
    beam = theirs["decode"]["beam5"]
    assert beam["sentences_per_s_decode"] == pytest.approx(20.0) and beam["sentences_per_s_process"] == 16.0
    assert beam["bleu"] == 29.92 and beam["chrf"] == 49.25 and beam["reps"] == 3
    with pytest.raises(SystemExit, match="no peer summary"):
        peer_compare.load_peer_summary(tmp_path / "missing" / "summary.json")


def test_ratios_targets_and_missing_figures() -> None:
    theirs = {"training": {"target_tokens_per_s": 640.0, "sentences_per_s": 48.0},
              "decode": {"greedy": {"sentences_per_s_decode": 60.0, "sentences_per_s_process": 50.0},
                         "beam5": {"sentences_per_s_decode": 20.0, "sentences_per_s_process": 16.0}}}
    ours = {"training": {"target_tokens_per_s": 1600.0, "sentences_per_s": 120.0},
            "decode": {"beam5": {"sentences_per_s_decode": 80.0, "sentences_per_s_process": 40.0}}}
    rows = {row["figure"]: row for row in peer_compare.ratio_rows(ours, theirs)}
    train = rows["training target tokens/s"]
    assert train["ratio"] == pytest.approx(2.5) and train["target"] == 2.0 and train["met"] is True
    assert rows["beam 5 sentences/s (decoding alone)"]["ratio"] == pytest.approx(4.0)
    assert rows["beam 5 sentences/s (decoding alone)"]["met"] is True
    assert rows["beam 5 sentences/s (whole process)"]["ratio"] == pytest.approx(2.5)
    assert rows["beam 5 sentences/s (whole process)"]["met"] is False
    greedy = rows["greedy sentences/s (decoding alone)"]
    assert greedy["ours"] is None and greedy["ratio"] is None and greedy["met"] is None  # not measured: no estimate
    assert rows["training sentences/s"]["target"] is None and rows["training sentences/s"]["met"] is None


def test_peer_compare_main_reuses_both_sides(tmp_path: Path) -> None:
    fake_peer_summary(tmp_path / "peer")
    earlier = {"our_device": "cpu", "ours": {
        "training": {"source": "test", "target_tokens_per_s": 1920.0, "sentences_per_s": 150.0},
        "decode": {m: {"sentences_per_s_decode": 90.0, "sentences_per_s_process": 45.0, "bleu": 31.0, "chrf": 52.0}
                   for m in ("greedy", "beam5")}}}
    (tmp_path / "ours.json").write_text(json.dumps(earlier))
    out = tmp_path / "cmp"
    report = peer_compare.main(["--skip-peer-run", str(tmp_path / "peer"), "--ours-from", str(tmp_path / "ours.json"),
                                "--out", str(out), "--work-dir", str(tmp_path / "work")])
    assert report["measured_without_gpu"] is True
    assert json.loads(Path(f"{out}.json").read_text())["ratios"] == report["ratios"]
    markdown = Path(f"{out}.md").read_text()
    assert "| training target tokens/s | 1,920.0 | 640.0 | 3.00x | >= 2x | yes |" in markdown
    assert "| beam 5 sentences/s (decoding alone) | 90.0 | 20.0 | 4.50x | >= 3x | yes |" in markdown
    assert "| beam 5 sentences/s (whole process) | 45.0 | 16.0 | 2.81x | >= 3x | **no** |" in markdown
    assert "measured without a GPU" in markdown and "| beam5 | 31.00 | 29.92 |" in markdown


def test_decode_once_batches_by_sentences_in_input_order(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    torch.set_num_threads(1)
    cfg = tiny_config(tmp_path, [])
    data = prepare_data(cfg.data)
    model = Seq2Seq.from_config(cfg.model, cfg.attention, data.tokenizer.src_vocab_size,
                                data.tokenizer.tgt_vocab_size).eval()  # untrained: only the batching is tested
    save_checkpoint(tmp_path / "run" / "checkpoints" / "best.pt",
                    {"config": to_plain_dict(cfg), "tokenizer": data.tokenizer.to_state(), "model": model.state_dict()})
    src = tmp_path / "test.src"
    lines = data.tests["test"].src_text
    src.write_text("".join(line + "\n" for line in lines))
    peer_compare.main(["decode-once", "--checkpoint", str(tmp_path / "run"), "--input", str(src), "--output",
                       str(tmp_path / "out.txt"), "--device", "cpu", "--beam-size", "1", "--batch-sentences", "7"])
    timing = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert timing["sentences"] == len(lines) and timing["decode_seconds"] > 0
    expected = [r.text for r in Translator(model, data.tokenizer).translate(lines, beam_size=1)]
    assert (tmp_path / "out.txt").read_text().splitlines() == expected  # batched as 7s equals translate.py's batches


def tiny_run(tmp_path: Path) -> tuple[Path, list[str], Any]:
    """An untrained tiny run dir on the reversal corpus, and its test sources."""
    cfg = tiny_config(tmp_path, [])
    data = prepare_data(cfg.data)
    model = Seq2Seq.from_config(cfg.model, cfg.attention, data.tokenizer.src_vocab_size,
                                data.tokenizer.tgt_vocab_size).eval()
    save_checkpoint(tmp_path / "run" / "checkpoints" / "best.pt",
                    {"config": to_plain_dict(cfg), "tokenizer": data.tokenizer.to_state(), "model": model.state_dict()})
    return tmp_path / "run", list(data.tests["test"].src_text), cfg


def test_translate_mode_writes_into_the_run_dir(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    torch.set_num_threads(1)
    run, lines, _ = tiny_run(tmp_path)
    src = tmp_path / "test.src"
    src.write_text("".join(line + "\n" for line in lines))
    report = benchmark.main(["translate", "--checkpoint", str(run), "--input", str(src), "--reps", "1",
                             "--beam-sizes", "1", "2", "--device", "cpu", "--limit", "10"])
    assert json.loads((run / "benchmark_translate_cpu.json").read_text()) == json.loads(json.dumps(report))
    assert report["benchmark"] == "translate" and report["config"]["reference"] is None
    assert [(row["mode"], row["sentences"]) for row in report["results"]] == [("greedy", 10), ("beam2", 10)]
    assert report["command"].startswith("python scripts/benchmark.py translate --checkpoint")

    with pytest.raises(SystemExit) as exit_info:  # an ensemble has no one run dir to write into
        benchmark.main(["translate", "--checkpoint", str(run), str(run), "--input", str(src), "--reps", "1",
                        "--beam-sizes", "1", "--device", "cpu", "--limit", "3"])
    assert exit_info.value.code == 2 and "error: pass --out PATH" in capsys.readouterr().err
    ensemble = benchmark.main(["translate", "--checkpoint", str(run), str(run), "--input", str(src), "--reps", "1",
                               "--beam-sizes", "1", "--device", "cpu", "--limit", "10", "--out", str(tmp_path / "e")])
    assert ensemble["config"]["checkpoint"] == [str(run)] * 2 and (tmp_path / "e.json").is_file()
    # two copies of one model average to that model: the same output, so the same BLEU-free row shape
    assert [row["sentences"] for row in ensemble["results"]] == [10]


def test_backtranslate_mode_times_beam_and_sampling(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    run = tmp_path / "run"
    save_tiny_checkpoint(run / "checkpoints" / "best.pt", "additive")
    source = tmp_path / "mono.de"
    source.write_text("".join(line + "\n" for line in SRC * 6 + [""]), encoding="utf-8")
    report = benchmark.main(["backtranslate", "--checkpoint", str(run), "--input", str(source), "--limit", "20",
                             "--warmup", "5", "--set", "max_len=6", "device=cpu"])
    assert json.loads((run / "benchmark_backtranslate_cpu.json").read_text()) == json.loads(json.dumps(report))
    assert report["config"]["lang"] == "de" and report["measured_without_gpu"]
    assert [(row["method"], row["lines"], row["translated"]) for row in report["results"]] == [
        ("beam", 20, 20), ("sample", 20, 20)]
    assert report["results"][1]["options"]["top_k"] == 0 and report["results"][0]["options"]["max_input_words"] == 9


def test_modes_without_a_run_dir_or_mirror_say_what_to_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture) -> None:
    monkeypatch.delenv("NMT_DATA_MIRROR", raising=False)
    with pytest.raises(SystemExit, match="no corpus mirror; set NMT_DATA_MIRROR or pass --mirror"):
        benchmark.main(["data", "--out", str(tmp_path / "data")])
    run, _, _ = tiny_run(tmp_path)
    with pytest.raises(SystemExit, match="NMT_DATA_MIRROR is not set"):
        benchmark.main(["translate", "--checkpoint", str(run / "checkpoints" / "best.pt"), "--device", "cpu",
                        "--out", str(tmp_path / "t")])
    src = tmp_path / "one.src"
    src.write_text("a b c\n")
    with pytest.raises(SystemExit) as exit_info:  # a .pt file has no run dir to write into: said before measuring
        benchmark.main(["translate", "--checkpoint", str(run / "checkpoints" / "best.pt"), "--input", str(src),
                        "--reps", "1", "--beam-sizes", "1", "--device", "cpu"])
    assert exit_info.value.code == 2 and "error: pass --out PATH" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # no default outside the repository: the peer's folder is named
        peer_compare.main(["--out", str(tmp_path / "p")])
    assert exit_info.value.code == 2 and "error: pass --peer-dir" in capsys.readouterr().err


def test_data_mode_prepares_any_data_section(tmp_path: Path, mirror_dir: Path) -> None:
    # --set takes train.py's overrides: here a two-source mixture (task 1 twice, then tagged); the report names them
    mixture = "data.mixture=[{corpus:multi30k,weight:2,name:twice},{corpus:multi30k,tag:'<t>'}]"
    report = benchmark.main(["data", "--mirror", str(mirror_dir), "--vocab-size", "1000", "--out", str(tmp_path / "d"),
                             "--set", mixture])
    assert [(s["name"], s["pairs"], s["weight"], s["tag"]) for s in report["sources"]] == [
        ("twice", 28998, 2.0, None), ("multi30k", 28998, 1.0, "<t>")]
    assert report["prepare_cold_peak_rss_mib"] > 0 and report["pairs"]["train"] == 2 * 28998  # weights act per epoch
    assert json.loads((tmp_path / "d.json").read_text())["overrides"] == report["overrides"]


class FakeTranslator:
    """What benchmark.py's translate mode reads of a Translator; ``translate`` records its options and echoes the
    sentences reversed (word by word), so saved translations can be checked against the input."""

    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self.configs = [{"data": {"src_lang": "de", "tgt_lang": "en"}}]
        self.options: list[dict[str, Any]] = []
        self.graphs = SimpleNamespace(stats=GraphStats(replays=3, checks=1, check_seconds=0.25))  # a graph search's

    def translate(self, sentences: list[str], **options: Any) -> list[Any]:
        self.options.append(options)
        return [type("Result", (), {"text": " ".join(reversed(s.split()))})() for s in sentences]


def test_translate_mode_hands_graphs_and_batch_budget_to_the_engine(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    fake, loaded = FakeTranslator(), []
    monkeypatch.setattr(benchmark.Translator, "from_checkpoint",
                        lambda *args, **kwargs: loaded.append((args, kwargs)) or fake)
    src = tmp_path / "in.de"
    src.write_text("a b c\nd e\nf\n")
    report = benchmark.main(["translate", "--checkpoint", "RUN", "--input", str(src), "--reps", "1", "--beam-sizes",
                             "1", "5", "--cuda-graphs", "true", "--batch-tokens", "auto", "--save-translations",
                             str(tmp_path / "hyps"), "--out", str(tmp_path / "t")])
    assert loaded[0][1]["cuda_graphs"] == "true"
    assert {options["batch_tokens"] for options in fake.options} == {"auto"}
    assert {options["beam_size"] for options in fake.options} == {1, 5}
    assert report["config"]["cuda_graphs"] == "true" and report["config"]["batch_tokens"] == "auto"
    for mode in ("greedy", "beam5"):  # the translations go to files, not into the report
        assert (tmp_path / "hyps" / f"{mode}.txt").read_text() == "c b a\ne d\nf\n"
    assert all("translations" not in row for row in report["results"])
    assert report["cuda_graphs"]["checks"] == 1 and report["cuda_graphs"]["check_seconds"] == 0.25  # the canary's cost

    loaded.clear()  # without the option, the engine's own default: no cuda_graphs keyword at all
    benchmark.main(["translate", "--checkpoint", "RUN", "--input", str(src), "--reps", "1", "--beam-sizes", "1",
                    "--out", str(tmp_path / "u")])
    assert "cuda_graphs" not in loaded[0][1] and fake.options[-1]["batch_tokens"] == 4096


def test_graphs_asked_of_an_engine_without_them_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture) -> None:
    def old_engine(path: Any, device: Any = "auto", precision: Any = "auto", max_input_words: Any = "auto") -> None:
        raise AssertionError("not reached: Python refuses the keyword first")

    monkeypatch.setattr(benchmark.Translator, "from_checkpoint", old_engine)
    src = tmp_path / "in.de"
    src.write_text("a b\n")
    with pytest.raises(SystemExit) as exit_info:
        benchmark.main(["translate", "--checkpoint", "RUN", "--input", str(src), "--cuda-graphs", "false",
                        "--out", str(tmp_path / "t")])
    assert exit_info.value.code == 2
    assert "--cuda-graphs false: this engine's Translator takes no cuda_graphs setting" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-3", "many", "1.5"])
def test_a_bad_batch_budget_is_refused(value: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        benchmark.parse_args(["translate", "--checkpoint", "RUN", "--batch-tokens", value])
    assert exit_info.value.code == 2 and "neither auto nor a whole number" in capsys.readouterr().err


def test_backtranslate_mode_hands_cuda_graphs_to_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    run = tmp_path / "run"
    save_tiny_checkpoint(run / "checkpoints" / "best.pt", "additive")
    source = tmp_path / "mono.de"
    source.write_text("".join(line + "\n" for line in SRC), encoding="utf-8")
    composed, compose = [], backtranslation_speed.compose_job

    def compose_without_graphs(overrides: list[str], project_dir: Path) -> Any:  # the key this checkout may lack
        composed.append(list(overrides))
        return compose([o for o in overrides if not o.startswith("cuda_graphs=")], project_dir)

    monkeypatch.setattr(backtranslation_speed, "compose_job", compose_without_graphs)
    report = benchmark.main(["backtranslate", "--checkpoint", str(run), "--input", str(source), "--limit", "4",
                             "--warmup", "2", "--methods", "beam", "--cuda-graphs", "true", "--set", "device=cpu",
                             "max_len=4", "--out", str(tmp_path / "bt")])
    assert composed and all("cuda_graphs=true" in overrides for overrides in composed)
    assert report["config"]["cuda_graphs"] == "true" and "cuda_graphs=true" in report["config"]["settings"]
    assert [(row["method"], row["lines"]) for row in report["results"]] == [("beam", 4)]


def test_study_speed_times_each_run_and_compare_runs_reads_it(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    run, lines, cfg = tiny_run(tmp_path)
    saved = OmegaConf.to_container(cfg)
    del saved["trainer"]["cuda_graphs_check"]  # a run trained before that setting came: today's default fills it
    OmegaConf.save(OmegaConf.create(saved), run / "config.yaml")
    (run / "results.json").write_text(json.dumps({"attention": cfg.attention.name}))
    report = benchmark.main(["study-speed", str(run), "--train-steps", "2", "--warmup-steps", "1", "--reps", "1",
                             "--out", str(tmp_path / "speed")])
    [row] = report["runs"]
    assert (row["group"], row["direction"], row["split"]) == (cfg.attention.name, "de-en", "test")
    assert row["training"]["steps"] == 2 and row["train_tokens_per_s"] > 0
    assert row["decoding"]["sentences"] == len(lines) and row["beam_sentences_per_s"] > 0
    assert row["beam_size"] == cfg.trainer.test_beam_size
    speeds = compare.load_speeds([tmp_path / "speed.json"], "attention")
    assert speeds["by_group"][("de-en", cfg.attention.name)]["train_tokens_per_s"] == row["train_tokens_per_s"]


def test_study_speed_needs_checkpoints(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run, _, cfg = tiny_run(tmp_path)
    OmegaConf.save(cfg, run / "config.yaml")
    (run / "results.json").write_text(json.dumps({"attention": cfg.attention.name}))
    (run / "checkpoints" / "best.pt").unlink()
    with pytest.raises(SystemExit) as exit_info:
        benchmark.main(["study-speed", str(run), "--out", str(tmp_path / "speed")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (f"benchmark.py: error: {run} holds no checkpoint to decode with: pass trained "
                                       "runs whose checkpoints/ are still there\n")
