"""The translate job: order, batching, empty and over-long lines, stdin/stdout, n-best, plots, alignments."""

from __future__ import annotations

import io
import logging
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import SRC, TGT, TINY_MAX_WORDS, save_tiny_checkpoint
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from nmt.common.disk import PathNotWritable
from nmt.data.batching import token_batches
from nmt.inference.engine import TranslationError, Translator
from nmt.inference.translate_job import translate_main
from nmt.model.checkpoint import load_for_inference
from nmt.model.search import beam_search, greedy_search
from nmt.model.seq2seq import Seq2Seq

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO_ROOT / "configs"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

MAX_WORDS = TINY_MAX_WORDS  # the training config's data.clean.max_len: longer input lines are cut to this


def translate_lines(model: Seq2Seq, tokenizer, lines: list[str], **options) -> list:
    """The engine's raw n-best hypotheses per line."""
    return [result.hypotheses for result in Translator(model, tokenizer).translate(lines, **options)]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    # tiny models gain nothing from threads, and on shared cores OpenMP spin-waits cost seconds
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def no_attention_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("none") / "none.pt", "none")


def translate_cfg(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose("translate", overrides=["max_len=7", "progress=false", *overrides])


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def test_token_batches_respect_budget_and_cover_all() -> None:
    lengths = [3, 9, 4, 1, 7, 7, 20]
    batches = token_batches(lengths, batch_tokens=16)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) == 1 or max(lengths[i] for i in batch) * len(batch) <= 16
    assert batches[0] == [6]  # longest first; over the budget alone


def test_batched_equals_one_by_one_in_input_order(tiny_run_dir: Path) -> None:
    model, tokenizer, _ = load_for_inference(tiny_run_dir)
    lines = SRC + [s.upper() for s in SRC[:2]] + ["Hund", "Ein Mann."]
    random.Random(0).shuffle(lines)
    for beam in (1, 3):
        together = translate_lines(model, tokenizer, lines, beam_size=beam, max_len=8, batch_tokens=40)
        alone = [translate_lines(model, tokenizer, [line], beam_size=beam, max_len=8)[0] for line in lines]
        assert [h[0].tokens for h in together] == [h[0].tokens for h in alone]
    assert len({tuple(h[0].tokens) for h in together}) > 3  # the check is not vacuous


def test_beam_one_is_greedy_and_nbest_sorted(tiny_run_dir: Path) -> None:
    model, tokenizer, _ = load_for_inference(tiny_run_dir)
    greedy = translate_lines(model, tokenizer, SRC, beam_size=1, max_len=8)
    beam1 = translate_lines(model, tokenizer, SRC, beam_size=2, n_best=1, max_len=8)
    nbest = translate_lines(model, tokenizer, SRC, beam_size=4, n_best=4, max_len=8)
    best = translate_lines(model, tokenizer, SRC, beam_size=4, n_best=1, max_len=8)
    assert all(len(h) == 1 for h in greedy) and all(len(h) == 1 for h in beam1)
    for many, one in zip(nbest, best):
        scores = [h.score for h in many]
        assert scores == sorted(scores, reverse=True) and many[0].tokens == one[0].tokens
    # beam 1 through the search functions directly, on the padded batch translate_lines builds
    src_ids = [tokenizer.encode_src(s) + [3] for s in SRC]
    src = torch.zeros(len(src_ids), max(map(len, src_ids)), dtype=torch.long)
    for i, ids in enumerate(src_ids):
        src[i, : len(ids)] = torch.tensor(ids)
    lengths = torch.tensor([len(ids) for ids in src_ids])
    assert [h.tokens for h in greedy_search(model, src, lengths, 8, 2.0)] == [
        b[0].tokens for b in beam_search(model, src, lengths, 1, 1.0, 8, 2.0, 1)
    ]
    with pytest.raises(TranslationError, match="n_best"):
        translate_lines(model, tokenizer, SRC, beam_size=2, n_best=3)


def test_file_job_keeps_one_line_per_input_line(tiny_run_dir: Path, tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    long_line = " ".join(["Hund"] * (MAX_WORDS + 5))
    lines = [SRC[0], "", SRC[1], "   ", long_line, long_line + " Park", SRC[2]]
    src = write_lines(tmp_path / "in.de", lines)
    ref = write_lines(tmp_path / "ref.en", [TGT[0], "", TGT[1], "", "dog", "dog park", TGT[2]])
    out = tmp_path / "out" / "out.en"
    with caplog.at_level(logging.WARNING):
        metrics = translate_main(translate_cfg(f"checkpoint={tiny_run_dir}", f"input={src}", f"output={out}",
                                               f"reference={ref}", "beam_size=3"))
    hyps = read_lines(out)
    assert len(hyps) == len(lines)
    assert hyps[1] == "" and hyps[3] == "" and hyps[0] and hyps[4]
    assert hyps[4] == hyps[5]  # both cut to the same first MAX_WORDS words
    warnings = [r.getMessage() for r in caplog.records if "truncated" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith(f"2 line(s) longer than {MAX_WORDS} words")
    assert metrics["lines"] == len(lines) and 0.0 <= metrics["bleu"] <= 100.0
    assert "tok:13a" in metrics["bleu_signature"] and "nc:6" in metrics["chrf_signature"]


def test_stdin_to_stdout_and_nbest_format(tiny_run_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(f"{SRC[0]}\n\n{SRC[1]}\n".encode())))
    translate_main(translate_cfg(f"checkpoint={tiny_run_dir}", "beam_size=3", "n_best=3"))
    captured = capsys.readouterr()
    rows = captured.out.split("\n")
    assert len(rows) == 4 and rows[3] == "" and rows[1] == ""
    for row in (rows[0], rows[2]):
        fields = row.split("\t")
        assert len(fields) == 6
        scores = [float(s) for s in fields[1::2]]
        assert scores == sorted(scores, reverse=True)
    # one-best of the same input: the first field
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(f"{SRC[0]}\n".encode())))
    translate_main(translate_cfg(f"checkpoint={tiny_run_dir}", "beam_size=3"))
    assert capsys.readouterr().out == rows[0].split("\t")[0] + "\n"


def test_heatmaps_and_alignments(tiny_run_dir: Path, tmp_path: Path) -> None:
    lines = [SRC[0], "", SRC[3]]
    src = write_lines(tmp_path / "in.de", lines)
    out, align, plots = tmp_path / "out.en", tmp_path / "out.align", tmp_path / "plots"
    translate_main(translate_cfg(f"checkpoint={tiny_run_dir}", f"input={src}", f"output={out}",
                                 f"attention_dir={plots}", f"alignments={align}"))
    hyps, links = read_lines(out), read_lines(align)
    assert len(links) == len(lines) and links[1] == ""
    for src_line, hyp, row in zip(lines, hyps, links):
        assert re.fullmatch(r"(\d+-\d+( \d+-\d+)*)?", row)
        pairs = [tuple(map(int, p.split("-"))) for p in row.split()]
        assert all(i < len(src_line.split()) and j < len(hyp.split()) for i, j in pairs)
        assert sorted({j for _, j in pairs}) == list(range(len(hyp.split())))  # each target word once
    pngs = sorted(p.name for p in plots.iterdir())
    assert pngs == ["1.png", "3.png"]  # none for the empty line
    assert all((plots / name).read_bytes()[:8] == PNG_SIGNATURE for name in pngs)
    translate_main(translate_cfg(f"checkpoint={tiny_run_dir}", f"input={src}", f"output={out}",
                                 f"attention_dir={tmp_path / 'sub'}", "attention_words=false"))
    assert (tmp_path / "sub" / "1.png").read_bytes()[:8] == PNG_SIGNATURE


def test_user_errors_say_what_is_wrong(tiny_run_dir: Path, no_attention_ckpt: Path, tmp_path: Path) -> None:
    src = write_lines(tmp_path / "in.de", SRC[:2])
    with pytest.raises(TranslationError, match="pass checkpoint=PATH"):
        translate_main(translate_cfg(f"input={src}"))
    with pytest.raises(ValueError, match="does not exist"):
        translate_main(translate_cfg(f"checkpoint={tmp_path / 'missing.pt'}", f"input={src}"))
    with pytest.raises(TranslationError, match="attention=none"):
        translate_main(translate_cfg(f"checkpoint={no_attention_ckpt}", f"input={src}", f"alignments={tmp_path / 'a'}"))
    bad = tmp_path / "bad.de"
    bad.write_bytes(SRC[0].encode() + b"\nok\n\xff\xfe broken\n")
    with pytest.raises(TranslationError, match=r"line 3: invalid UTF-8"):
        translate_main(translate_cfg(f"checkpoint={tiny_run_dir}", f"input={bad}"))
    out = tmp_path / "out.en"
    translate_main(translate_cfg(f"checkpoint={tiny_run_dir}", f"input={bad}", f"output={out}", "invalid_utf8=replace"))
    assert len(read_lines(out)) == 3
    with pytest.raises(PathNotWritable, match=r"attention_dir=.*in\.de is a file; name a folder to write"):
        translate_main(translate_cfg(f"checkpoint={tiny_run_dir}", f"input={src}", f"attention_dir={src}"))
    with pytest.raises(PathNotWritable, match=r"alignments=.* is a directory; name a file to write"):
        translate_main(translate_cfg(f"checkpoint={tiny_run_dir}", f"input={src}", f"alignments={tmp_path}"))
    ref = write_lines(tmp_path / "short.en", TGT[:1])
    with pytest.raises(TranslationError, match="has 1 lines but the input has 2"):
        translate_main(translate_cfg(f"checkpoint={tiny_run_dir}", f"input={src}", f"reference={ref}"))
    with pytest.raises(TranslationError, match="precision='fp16' is not one of auto, bf16, fp32"):
        translate_main(translate_cfg(f"checkpoint={tiny_run_dir}", f"input={src}", "precision=fp16"))
    old = torch.load(tiny_run_dir / "checkpoints" / "best.pt", weights_only=True)
    old["format_version"] = 999
    torch.save(old, tmp_path / "old.pt")
    with pytest.raises(ValueError, match="format 999"):
        translate_main(translate_cfg(f"checkpoint={tmp_path / 'old.pt'}", f"input={src}"))


def test_cli_stdout_has_only_translations(tiny_run_dir: Path, tmp_path: Path) -> None:
    def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(REPO_ROOT / "translate.py"), *args], input=stdin, text=True,
                              capture_output=True, cwd=tmp_path, timeout=120)

    done = cli(f"checkpoint={tiny_run_dir}", "max_len=5", stdin=f"{SRC[0]}\n\n{SRC[1]}\n")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split("\n")) == 4 and done.stdout.split("\n")[1] == ""
    assert list(tmp_path.iterdir()) == []  # no Hydra output folder, no log file
    (tmp_path / "a_file").write_text("", encoding="utf-8")
    for output, message in ((tmp_path, "is a directory; name a file to write"),
                            (tmp_path / "a_file" / "out.en", "is a file, not a folder")):
        unwritable = cli(f"checkpoint={tiny_run_dir}", f"output={output}", stdin=f"{SRC[0]}\n")
        assert unwritable.returncode == 2 and unwritable.stdout == "", unwritable.stderr
        assert unwritable.stderr.startswith(f"translate.py: error: output={output}") and message in unwritable.stderr
        assert unwritable.stderr.count("\n") == 1 and "translated" not in unwritable.stderr  # refused before decoding
    (tmp_path / "a_file").unlink()
    forced = cli(f"checkpoint={tiny_run_dir}", "cuda_graphs=true", "device=cpu", stdin=f"{SRC[0]}\n")
    assert forced.returncode == 2 and forced.stdout == "" and forced.stderr.count("\n") == 1
    assert forced.stderr.startswith("translate.py: error: cuda_graphs=true needs a CUDA GPU, and this run is on "
                                    "cpu; use cuda_graphs=auto (or false)")
    missing = cli()
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.strip() == (
        "translate.py: error: no checkpoint given; pass checkpoint=PATH (a run dir or a .pt file from train.py), "
        "or checkpoint=[RUN_A,RUN_B] for an ensemble"
    )
