"""Back-translation: aligned output, resume after a kill (identical bytes), language and input checks, provenance."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import SRC, TINY_MAX_WORDS, save_tiny_checkpoint
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

import nmt.inference.backtranslation as bt
from nmt.data import DataError
from nmt.inference.backtranslation import BacktranslationError, backtranslate
from nmt.inference.engine import SamplingOptions, TranslationError, Translator

REPO_ROOT = Path(__file__).resolve().parents[1]
CHUNK = 64


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)  # tiny models gain nothing from threads


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Run dirs of tiny reverse models: two de→en ones with one tokenizer (an ensemble), and an en→de one."""
    root = tmp_path_factory.mktemp("bt_runs")
    made = {"de_en": save_tiny_checkpoint(root / "a" / "checkpoints" / "best.pt", "additive", seed=0),
            "de_en_b": save_tiny_checkpoint(root / "b" / "checkpoints" / "best.pt", "general", seed=1),
            "en_de": save_tiny_checkpoint(root / "r" / "checkpoints" / "best.pt", "additive", src_lang="en",
                                          tgt_lang="de")}
    return {name: path.parent.parent for name, path in made.items()}


def monolingual_lines(n: int, seed: int = 0) -> list[str]:
    """German-ish lines: sentences and their prefixes, every 13th empty, every 17th over the model's max_len."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        if i % 13 == 5:
            lines.append("")
        elif i % 17 == 3:
            lines.append(" ".join(rng.sample(SRC, 3)))  # over TINY_MAX_WORDS words
        else:
            words = rng.choice(SRC).split()
            lines.append(" ".join(words[: rng.randint(1, len(words))]))
    return lines


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def bt_cfg(checkpoint: Path | list[Path], input_path: Path | str, output: Path, *overrides: str,
           lang: str = "de") -> DictConfig:
    """configs/backtranslate.yaml with short outputs (a tiny untrained model rarely stops) and small chunks."""
    ckpt = f"[{','.join(map(str, checkpoint))}]" if isinstance(checkpoint, list) else str(checkpoint)
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
        return compose("backtranslate", overrides=[
            f"checkpoint={ckpt}", f"input={input_path}", f"lang={lang}", f"output={output}", "max_len=6",
            f"chunk_lines={CHUNK}", "batch_tokens=256", "device=cpu", *overrides])


@pytest.fixture(scope="module")
def mono_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_lines(tmp_path_factory.mktemp("mono") / "mono.de", monolingual_lines(300))


def test_lines_stay_aligned_with_empty_and_over_long_lines(runs: dict[str, Path], mono_file: Path,
                                                           tmp_path: Path) -> None:
    summary = backtranslate(bt_cfg(runs["de_en"], mono_file, tmp_path / "bt"))
    lines = read_lines(mono_file)
    real, synthetic = read_lines(tmp_path / "bt" / "train.de"), read_lines(tmp_path / "bt" / "train.en")
    assert real == lines and len(synthetic) == len(lines)
    skipped = [i for i, line in enumerate(lines) if not line or len(line.split()) > TINY_MAX_WORDS]
    assert skipped and any(lines[i] for i in skipped)  # both kinds are there
    assert all(synthetic[i] == "" for i in skipped)
    # every other line is what the engine gives for it (beam 5, the same limits), on one line with single spaces
    translator = Translator.from_checkpoint(runs["de_en"], device="cpu", max_input_words=None)
    todo = [i for i in range(len(lines)) if i not in skipped]
    expected = translator.translate([lines[i] for i in todo], beam_size=5, max_len=6)
    assert [synthetic[i] for i in todo] == [" ".join(r.text.split()) for r in expected]
    record = json.loads((tmp_path / "bt" / "provenance.json").read_text())
    counts = record["lines"]
    # called from Python: the command that reproduces the job, every setting spelled out
    assert record["command"].startswith(f"python backtranslate.py checkpoint={runs['de_en']} input={mono_file}")
    assert " max_len=6 " in record["command"] and " mirror=" in record["command"]
    assert counts["empty"] == lines.count("") and counts["empty"] + counts["over_long"] == len(skipped)
    assert (counts["translated"], counts["done"], summary["status"]) == (len(todo), len(lines), "complete")


class Killed(BaseException):
    """Stands for SIGKILL in-process: nothing catches it, nothing after it runs."""


@pytest.mark.parametrize("method", ["beam", "sample"])
@pytest.mark.parametrize("kill_after_append", [True, False])
def test_a_run_cut_off_midway_resumes_with_identical_output(runs: dict[str, Path], mono_file: Path,
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            method: str, kill_after_append: bool) -> None:
    options = [f"method={method}", "temperature=1.5", "seed=3"]
    backtranslate(bt_cfg(runs["de_en"], mono_file, tmp_path / "whole", *options))
    commit, calls = bt.commit_chunk, []

    def dying_commit(*args: object) -> None:
        calls.append(1)
        if kill_after_append and len(calls) == 3:  # chunk 3's lines are on disk, its record is not
            raise Killed
        commit(*args)
        if not kill_after_append and len(calls) == 2:
            raise Killed

    monkeypatch.setattr(bt, "commit_chunk", dying_commit)
    with pytest.raises(Killed):
        backtranslate(bt_cfg(runs["de_en"], mono_file, tmp_path / "cut", *options))
    monkeypatch.undo()
    record = json.loads((tmp_path / "cut" / "provenance.json").read_text())
    assert (record["status"], record["lines"]["done"]) == ("partial", 2 * CHUNK)
    if kill_after_append:  # the files hold a chunk more than the record: the resume drops it
        assert len(read_lines(tmp_path / "cut" / "train.en")) == 3 * CHUNK
    summary = backtranslate(bt_cfg(runs["de_en"], mono_file, tmp_path / "cut", *options))
    for name in ("train.en", "train.de"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    record = json.loads((tmp_path / "cut" / "provenance.json").read_text())
    assert [run["from_line"] for run in record["runs"]] == [0, 2 * CHUNK]
    assert record["lines"] == json.loads((tmp_path / "whole" / "provenance.json").read_text())["lines"]
    assert summary["translated"] < record["lines"]["translated"]  # the resumed run did only the rest


def test_sigkill_after_the_first_chunk_then_resume_gives_identical_output(runs: dict[str, Path],
                                                                          tmp_path: Path) -> None:
    source = write_lines(tmp_path / "mono.de", monolingual_lines(4000, seed=1))
    options = ["method=sample", "top_k=5", "seed=11"]
    args = [f"checkpoint={runs['de_en']}", f"input={source}", "lang=de", f"output={tmp_path / 'cut'}",
            "max_len=6", f"chunk_lines={CHUNK}", "batch_tokens=256", "device=cpu", *options]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, str(REPO_ROOT / "backtranslate.py"), *args], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    record_path, deadline = tmp_path / "cut" / "provenance.json", time.monotonic() + 120
    try:
        while time.monotonic() < deadline and process.poll() is None:
            if record_path.is_file() and json.loads(record_path.read_text())["lines"]["done"] >= CHUNK:
                break
            time.sleep(0.01)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    record = json.loads(record_path.read_text())
    assert record["status"] == "partial" and record["lines"]["done"] >= CHUNK
    backtranslate(bt_cfg(runs["de_en"], source, tmp_path / "cut", *options))
    backtranslate(bt_cfg(runs["de_en"], source, tmp_path / "whole", *options))
    for name in ("train.en", "train.de"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()


def test_a_model_for_another_language_exits_2_with_one_line(runs: dict[str, Path], mono_file: Path,
                                                            tmp_path: Path) -> None:
    out = tmp_path / "bt"
    done = subprocess.run([sys.executable, str(REPO_ROOT / "backtranslate.py"), f"checkpoint={runs['en_de']}",
                           f"input={mono_file}", "lang=de", f"output={out}"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
    assert "backtranslate.py: error: " in done.stderr and "translates en→de, but the input" in done.stderr
    assert "is de (lang=de)" in done.stderr and "data.src_lang=de" in done.stderr
    assert not out.exists()


@pytest.mark.parametrize(("change", "error", "message"), [
    ({"input": "missing.de"}, DataError, "'.*missing.de' is neither a registered monolingual corpus"),
    ({"input": "multi30k_task9"}, DataError, "neither a registered monolingual corpus \\(multi30k_task2"),
    ({"input": "bad_utf8"}, DataError, "bad.de, line 3: invalid UTF-8 .* pass invalid_utf8=replace"),
    ({"lang": "en"}, BacktranslationError, "translates de→en, but the input .* is en"),
    ({"method": "greedy"}, BacktranslationError, "method='greedy' is not one of beam, sample"),
    ({"temperature": "0", "method": "sample"}, TranslationError, "temperature must be a number > 0"),
    ({"top_k": "-2", "method": "sample"}, TranslationError, "top_k must be a whole number >= 0"),
    ({"beam_size": "0"}, TranslationError, "beam_size must be a whole number from 1 to 1000"),
    ({"chunk_lines": "0"}, BacktranslationError, "chunk_lines=0 must be positive"),
    ({"max_input_words": "0"}, TranslationError, "max_input_words must be auto, null or a whole number >= 1, got 0"),
    ({"direction": "sideways"}, BacktranslationError, "direction='sideways' is not one of back, forward"),
    ({"output": "taken"}, BacktranslationError, "exists and is not a back-translation folder"),
])
def test_bad_input_is_one_line_and_nothing_is_written(runs: dict[str, Path], mono_file: Path, tmp_path: Path,
                                                      change: dict[str, str], error: type, message: str) -> None:
    write_lines(tmp_path / "bad.de", ["gut", "auch gut"]).open("ab").write(b"schlecht \xff\n")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    settings = {"input": str(mono_file), "lang": "de", "output": str(tmp_path / "bt"), **change}
    settings["input"] = {"bad_utf8": str(tmp_path / "bad.de"), "missing.de": str(tmp_path / "missing.de")}.get(
        settings["input"], settings["input"])
    settings["output"] = str(tmp_path / "taken") if settings["output"] == "taken" else settings["output"]
    extra = [f"{k}={v}" for k, v in change.items() if k not in ("input", "lang", "output")]
    cfg = bt_cfg(runs["de_en"], settings["input"], Path(settings["output"]), *extra, lang=settings["lang"])
    with pytest.raises(error, match=message) as raised:
        backtranslate(cfg)
    assert "\n" not in str(raised.value)
    assert not (tmp_path / "bt").exists() and sorted(os.listdir(tmp_path / "taken")) == ["notes.txt"]


def test_a_finished_folder_is_a_no_op_and_another_job_is_refused(runs: dict[str, Path], mono_file: Path,
                                                                 tmp_path: Path) -> None:
    out = tmp_path / "bt"
    backtranslate(bt_cfg(runs["de_en"], mono_file, out))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    summary = backtranslate(bt_cfg(runs["de_en"], mono_file, out))
    assert (summary["status"], summary["translated"]) == ("complete", 0)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    with pytest.raises(BacktranslationError, match=r"records another back-translation \(search: .*'beam_size': 5.* "
                                                   r"there, .*'beam_size': 4.* now\); rerun with the same"):
        backtranslate(bt_cfg(runs["de_en"], mono_file, out, "beam_size=4"))
    other = write_lines(tmp_path / "other.de", ["Ein Hund."])
    with pytest.raises(BacktranslationError, match="input_lines: 300 there, 1 now; input_sha256"):
        backtranslate(bt_cfg(runs["de_en"], other, out))


def test_a_second_job_on_a_folder_being_written_is_refused(runs: dict[str, Path], mono_file: Path,
                                                          tmp_path: Path) -> None:
    out = tmp_path / "bt"
    out.mkdir()
    with open(out / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running backtranslate.py holds it
        with pytest.raises(BacktranslationError, match=f"{out} is in use by another process: wait for it to end"):
            backtranslate(bt_cfg(runs["de_en"], mono_file, out))
    assert sorted(os.listdir(out)) == [".lock"]
    backtranslate(bt_cfg(runs["de_en"], mono_file, out))  # released: it runs
    assert len(read_lines(out / "train.en")) == 300


def test_provenance_records_models_options_input_and_counts(runs: dict[str, Path], mono_file: Path,
                                                            tmp_path: Path) -> None:
    members = [runs["de_en"], runs["de_en_b"]]
    out = tmp_path / "bt"
    backtranslate(bt_cfg(members, mono_file, out, "method=sample", "top_k=4", "temperature=0.7", "seed=9"),
                  argv=["checkpoint=[A,B]", "method=sample"])
    record = json.loads((out / "provenance.json").read_text())
    sha = [hashlib.sha256((m / "checkpoints" / "best.pt").read_bytes()).hexdigest() for m in members]
    assert [m["sha256"] for m in record["models"]] == sha == record["job"]["model_sha256"]
    assert record["model_languages"] == {"src": "de", "tgt": "en"}
    assert record["pairs"] == {"source": {"lang": "en", "file": "train.en", "side": "synthetic"},
                               "target": {"lang": "de", "file": "train.de", "side": "real"}}
    search = record["job"]["search"]
    assert (search["method"], search["top_k"], search["temperature"], search["seed"]) == ("sample", 4, 0.7, 9)
    assert "beam_size" not in search and search["max_len"] == 6
    assert record["input"]["sha256"] == hashlib.sha256(mono_file.read_bytes()).hexdigest()
    assert (record["input"]["lines"], record["input"]["corpus"], record["job"]["max_input_words"]) == (300, None, 9)
    assert record["status"] == "complete" and record["finished"] >= record["date"]
    assert record["command"] == "python backtranslate.py 'checkpoint=[A,B]' method=sample"
    assert record["bytes"] == {name: (out / name).stat().st_size for name in ("train.en", "train.de")}
    # an ensemble samples from its averaged log-probabilities: chunk n is the engine's draw with seed 9 + n
    lines = read_lines(mono_file)[CHUNK : 2 * CHUNK]  # chunk 1
    todo = [i for i, line in enumerate(lines) if line and len(line.split()) <= TINY_MAX_WORDS]
    engine = Translator.from_checkpoint(members, device="cpu", max_input_words=None)
    drawn = engine.translate([lines[i] for i in todo], sampling=SamplingOptions(0.7, 4, 9 + 1), max_len=6,
                             batch_tokens=256)
    synthetic = read_lines(out / "train.en")[CHUNK : 2 * CHUNK]
    assert [synthetic[i] for i in todo] == [" ".join(r.text.split()) for r in drawn]


@pytest.mark.slow
def test_a_registered_corpus_by_name(runs: dict[str, Path], mirror_dir: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    commit = bt.commit_chunk

    def stop_after_one(*args: object) -> None:  # the first chunk is enough: 145k lines would take minutes
        commit(*args)
        raise Killed

    monkeypatch.setattr(bt, "commit_chunk", stop_after_one)
    out = tmp_path / "bt"
    with pytest.raises(Killed):
        backtranslate(bt_cfg(runs["en_de"], "multi30k_task2", out, f"cache_dir={tmp_path / 'cache'}",
                             f"mirror={mirror_dir}", lang="en"))
    record = json.loads((out / "provenance.json").read_text())
    corpus = record["input"]["corpus"]
    assert (corpus["name"], corpus["lang"], record["input"]["lines"]) == ("multi30k_task2", "en", corpus["kept"])
    assert corpus["kept"] > 100_000 and record["lines"]["done"] == CHUNK
    with open(record["input"]["path"], encoding="utf-8") as text:
        expected = [next(text).strip() for _ in range(CHUNK)]
    assert read_lines(out / "train.en") == expected and len(read_lines(out / "train.de")) == CHUNK


def test_a_mixture_makes_its_missing_back_translation_before_training(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """data.mixture's ``backtranslate:`` settings: train.py back-translates a missing folder, once, then mixes it."""
    from conftest import TGT, data_config

    from nmt.data import prepare_data

    mono = tmp_path / "mono.de"
    mono.write_text("".join(line + "\n" for line in monolingual_lines(40)))
    folder = tmp_path / "bt_de"
    entry = {"synthetic": str(folder), "tag": "<bt>",
             "backtranslate": {"checkpoint": str(runs["de_en"]), "input": str(mono), "lang": "de"}}
    cfg = data_config("files", src_lang="en", tgt_lang="de", mixture=[{"corpus": "files"}, entry], files={
        split: {"src": str(_write_lines(tmp_path / f"{split}.en", TGT * 4)),
                "tgt": str(_write_lines(tmp_path / f"{split}.de", SRC * 4))} for split in ("train", "valid", "test")})
    cfg["tokenizer"]["vocab_size"] = 60
    with pytest.raises(DataError, match=r"is not a folder; .* \(or add data.mixture\[1\].backtranslate settings"):
        prepare_data(cfg, cache_dir=tmp_path / "cache")  # from Python, nothing makes it
    untrained = OmegaConf.create(cfg)
    (tmp_path / "started_not_saved").mkdir()  # a reverse run with no checkpoint yet counts as untrained too
    for reverse in ("never_trained", "started_not_saved"):
        untrained.mixture[1].backtranslate.checkpoint = str(tmp_path / reverse)
        refusal = rf"not trained: .*{reverse}.* train a de->en model there first .*hydra.run.dir=\S*{reverse}\)"
        with pytest.raises(bt.BacktranslationError, match=refusal):
            bt.rebuild_synthetic_sources(untrained)
    assert not folder.exists()
    first = bt.rebuild_synthetic_sources(OmegaConf.create(cfg))
    assert [s["status"] for s in first] == ["complete"] and bt.rebuild_synthetic_sources(OmegaConf.create(cfg)) == []
    data = prepare_data(cfg, cache_dir=tmp_path / "cache")
    synthetic = data.stats["sources"][1]
    assert synthetic["tag"] == "<bt>" and synthetic["provenance"]["status"] == "complete"
    assert synthetic["pairs"] == synthetic["clean"]["kept"] and synthetic["clean"]["total"] == 40
    assert synthetic["clean"]["dropped"]["empty side"] >= 6  # the 3 empty and 3 over-long lines, left untranslated


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_forward_translation_writes_a_folder_that_a_mixture_reads(runs: dict[str, Path], tmp_path: Path) -> None:
    """direction=forward (distillation): a de→en teacher ensemble's (real de, synthetic en) pairs, a de→en source."""
    from conftest import TGT, data_config

    from nmt.data import prepare_data

    sources = _write_lines(tmp_path / "train.de", monolingual_lines(40))
    folder = tmp_path / "kd"
    backtranslate(bt_cfg([runs["de_en"], runs["de_en_b"]], sources, folder, "direction=forward"))
    record = json.loads((folder / "provenance.json").read_text())
    assert (record["direction"], record["job"]["direction"], record["status"]) == ("forward", "forward", "complete")
    assert record["pairs"] == {"source": {"lang": "de", "file": "train.de", "side": "real"},
                               "target": {"lang": "en", "file": "train.en", "side": "synthetic"}}
    assert read_lines(folder / "train.de") == read_lines(sources)
    files = {split: {"src": str(_write_lines(tmp_path / f"{split}.de", SRC * 4)),
                     "tgt": str(_write_lines(tmp_path / f"{split}.en", TGT * 4))}
             for split in ("train", "valid", "test")}
    cfg = data_config("files", mixture=[{"corpus": "files"}, {"synthetic": str(folder), "tag": "<kd>"}], files=files)
    cfg["tokenizer"]["vocab_size"] = 60
    data = prepare_data(cfg, cache_dir=tmp_path / "cache")
    distilled = data.stats["sources"][1]
    assert distilled["tag"] == "<kd>" and distilled["provenance"]["direction"] == "forward"
    assert distilled["pairs"] == distilled["clean"]["kept"] and distilled["clean"]["total"] == 40


def test_a_mixture_distils_its_own_training_sources_before_training(runs: dict[str, Path], tmp_path: Path) -> None:
    """``forward_translate: {checkpoint: [...]}``: the teachers translate data.corpus's training sources, once."""
    from conftest import TGT, data_config

    from nmt.data import prepare_data

    files = {split: {"src": str(_write_lines(tmp_path / f"{split}.de", SRC * 4)),
                     "tgt": str(_write_lines(tmp_path / f"{split}.en", TGT * 4))}
             for split in ("train", "valid", "test")}
    folder = tmp_path / "kd_en"
    teachers = [str(runs["de_en"]), str(runs["de_en_b"])]
    entry = {"synthetic": str(folder), "tag": "<kd>", "forward_translate": {"checkpoint": teachers, "max_len": 6}}
    cfg = data_config("files", mixture=[{"corpus": "files"}, entry], files=files, cache_dir=str(tmp_path / "cache"))
    cfg["tokenizer"]["vocab_size"] = 60
    with pytest.raises(bt.BacktranslationError, match=r"forward-translated first, but its teacher .* train a de->en "):
        bt.rebuild_synthetic_sources(OmegaConf.create({**cfg, "mixture": [
            {**entry, "forward_translate": {"checkpoint": str(tmp_path / "untrained")}}]}))
    # As experiment=multi30k_distil names them: a list of teachers through ${data.*}, resolved against the root.
    (tmp_path / "teachers").mkdir()
    for name, run in (("a", runs["de_en"]), ("b", runs["de_en_b"])):
        (tmp_path / "teachers" / f"de-en_{name}").symlink_to(run)
    named = [f"{tmp_path}/teachers/${{data.src_lang}}-${{data.tgt_lang}}_{name}" for name in "ab"]
    root = OmegaConf.create({"data": {**cfg, "mixture": [
        {"corpus": "files"}, {**entry, "forward_translate": {"checkpoint": named, "max_len": 6}}]}})
    [summary] = bt.rebuild_synthetic_sources(root.data)
    assert summary["status"] == "complete" and bt.rebuild_synthetic_sources(OmegaConf.create(cfg)) == []
    record = json.loads((folder / "provenance.json").read_text())
    assert record["direction"] == "forward" and record["input"]["path"] == files["train"]["src"]
    assert read_lines(folder / "train.de") == SRC * 4
    engine = Translator.from_checkpoint(teachers, device="cpu", max_input_words=None)
    assert read_lines(folder / "train.en") == [" ".join(r.text.split()) for r in engine.translate(SRC * 4, max_len=6)]
    data = prepare_data(cfg)
    assert data.stats["sources"][1]["tag"] == "<kd>" and data.stats["sources"][1]["pairs"] > 0


def test_a_mixture_s_forward_translation_stopped_midway_resumes_where_it_stopped(
        runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A student's training stopped while its teachers translate (the chain's SIGTERM, or a kill) goes on from the
    last whole chunk when train.py runs again, not from line 0, and ends with the folder a whole run writes."""
    from conftest import TGT, data_config

    files = {split: {"src": str(_write_lines(tmp_path / f"{split}.de", SRC * 8)),
                     "tgt": str(_write_lines(tmp_path / f"{split}.en", TGT * 8))}
             for split in ("train", "valid", "test")}
    teachers = {"checkpoint": [str(runs["de_en"]), str(runs["de_en_b"])], "max_len": 6, "chunk_lines": 8}

    def data(folder: Path) -> DictConfig:
        entry = {"synthetic": str(folder), "tag": "<kd>", "forward_translate": teachers}
        return OmegaConf.create(data_config("files", mixture=[{"corpus": "files"}, entry], files=files))

    bt.rebuild_synthetic_sources(data(tmp_path / "whole"))
    commit, calls = bt.commit_chunk, []

    def dying_commit(*args: object) -> None:
        commit(*args)
        calls.append(1)
        if len(calls) == 2:
            raise Killed

    monkeypatch.setattr(bt, "commit_chunk", dying_commit)
    with pytest.raises(Killed):
        bt.rebuild_synthetic_sources(data(tmp_path / "cut"))
    monkeypatch.undo()
    [summary] = bt.rebuild_synthetic_sources(data(tmp_path / "cut"))
    record = json.loads((tmp_path / "cut" / "provenance.json").read_text())
    assert [run["from_line"] for run in record["runs"]] == [0, 16] and summary["status"] == "complete"
    assert summary["translated"] == len(SRC * 8) - 16
    for name in ("train.de", "train.en"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()


@pytest.mark.parametrize(("entry", "message"), [
    ({"corpus": "files", "forward_translate": {"checkpoint": "r"}}, r"forward_translate goes with synthetic: FOLDER"),
    ({"synthetic": "f", "backtranslate": {"checkpoint": "r"}, "forward_translate": {"checkpoint": "t"}},
     r"says both backtranslate and forward_translate"),
])
def test_a_mixture_entry_says_one_way_to_make_its_folder(entry: dict, message: str) -> None:
    from nmt.data.mixture import check_entry

    with pytest.raises(DataError, match=message):
        check_entry(1, entry)
