"""``python -m nmt_runtime``: translations on stdout as translate.py writes them, one-line refusals, and no PyTorch."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import SRC
from omegaconf import OmegaConf

from nmt import Translator
from nmt.export import ExportSettings, export_main
from nmt.inference.translate_job import format_output

REPO_ROOT = Path(__file__).resolve().parents[1]
LINES = [SRC[0], "", SRC[1], f"  {SRC[2]}  ", SRC[4]]
RUNTIME_REQUIREMENTS = ("onnxruntime", "numpy", "sentencepiece")  # nmt_runtime/pyproject.toml's dependencies


@pytest.fixture(scope="module")
def folder(tiny_run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("runtime") / "export"
    settings = ExportSettings(checkpoint=str(tiny_run_dir), output=str(output), beam_size=3)
    return export_main(OmegaConf.structured(settings))


def run_runtime(python: str, folder: Path, stdin: bytes, *options: str, env: dict | None = None
                ) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "nmt_runtime", str(folder), "--threads", "1", *options], input=stdin,
                          capture_output=True, timeout=120, env=env, cwd=REPO_ROOT)


def expected_lines(run_dir: Path, n_best: int, **options: object) -> str:
    results = Translator.from_checkpoint(run_dir, device="cpu").translate(LINES, n_best=n_best, **options)
    return "".join(format_output(result, n_best) + "\n" for result in results)


def test_the_command_writes_what_translate_py_writes(folder: Path, tiny_run_dir: Path) -> None:
    stdin = "".join(line + "\n" for line in LINES).encode()
    done = run_runtime(sys.executable, folder, stdin)  # the folder's default beam, 3
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == expected_lines(tiny_run_dir, 1, beam_size=3)
    done = run_runtime(sys.executable, folder, stdin, "--beam-size", "4", "--n-best", "2", "--length-penalty", "0.5")
    assert done.returncode == 0, done.stderr
    # n-best lines: text TAB score pairs; the texts are the same, the scores to rounding (their 4th decimal may
    # differ where float rounding crosses it)
    got, expected = (text.split("\n") for text in (done.stdout.decode(),
                                                    expected_lines(tiny_run_dir, 2, beam_size=4, length_penalty=0.5)))
    assert [line.split("\t")[::2] for line in got] == [line.split("\t")[::2] for line in expected]
    got_scores, expected_scores = ([float(x) for line in lines for x in line.split("\t")[1::2]]
                                   for lines in (got, expected))
    assert got_scores == pytest.approx(expected_scores, abs=2e-4) and len(got_scores) == 8
    done = run_runtime(sys.executable, folder, stdin, "--beam-size=2", "--max-len", "90", "--max-len-ratio=none")
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == expected_lines(tiny_run_dir, 1, beam_size=2, max_len=90, max_len_ratio=None)
    assert done.stdout.decode() != expected_lines(tiny_run_dir, 1, beam_size=2, max_len=90)  # the ratio's limit


def test_mistakes_are_one_line_and_exit_2(folder: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    (broken / "step.onnx").unlink()
    (tmp_path / "empty").mkdir()
    cases = [
        (tmp_path / "nowhere", b"Hallo\n", (), "is not a folder"),
        (tmp_path / "empty", b"Hallo\n", (), "is not an ONNX export"),
        (broken, b"Hallo\n", (), "step.onnx is missing"),
        (folder, b"Hallo\n\xff\xfe Welt\n", (), "line 2: invalid UTF-8"),
        (folder, b"Hallo\n", ("--src-lang", "fr"), "translates de-en; its source language is de, not fr"),
        (folder, b"Hallo\n", ("--tgt-lang", "de"), "its target language is en, not de"),
        (folder, b"Hallo\n", ("--beam-size", "2", "--n-best", "3"), "n_best (3) cannot exceed beam_size (2)"),
        (folder, b"Hallo\n", ("--beam-size", "x"), "invalid int value"),
    ]
    for path, stdin, options, message in cases:
        done = run_runtime(sys.executable, path, stdin, *options)
        stderr = done.stderr.decode()
        assert done.returncode == 2 and done.stdout == b"", (message, stderr)
        assert message in stderr and len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr, stderr


def test_a_cut_stdout_is_one_line_and_exit_74(folder: Path) -> None:
    stdin = "".join(line + "\n" for line in LINES).encode()
    command = [sys.executable, "-m", "nmt_runtime", str(folder), "--threads", "1"]
    with open("/dev/full", "wb") as full:  # stdout on a full disk: ENOSPC
        done = subprocess.run(command, input=stdin, stdout=full, stderr=subprocess.PIPE, timeout=120, cwd=REPO_ROOT)
    reader, writer = os.pipe()
    os.close(reader)  # the reader has gone before the first line: EPIPE
    try:
        closed = subprocess.run(command, input=stdin, stdout=writer, stderr=subprocess.PIPE, timeout=120,
                                cwd=REPO_ROOT)
    finally:
        os.close(writer)
    for proc, reason in ((done, "No space left on device"), (closed, "Broken pipe")):
        stderr = proc.stderr.decode()
        assert proc.returncode == 74 and stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
        assert stderr.startswith(f"nmt_runtime: error: could not write stdout: {reason}"), stderr
        assert re.search(rf"; at most \d of {len(LINES)} lines got out, .* redirect it to a file", stderr), stderr


def _top_level_names(requirements: tuple[str, ...]) -> set[str]:
    """The site-packages entries (packages, modules, their .libs and .dist-info) of ``requirements`` and of all they
    require, whatever this Python's versions of them need."""
    from importlib import metadata

    from packaging.requirements import Requirement

    names, seen, todo = set(), set(), list(requirements)
    while todo:
        name = todo.pop()
        if name.lower() in seen:
            continue
        seen.add(name.lower())
        dist = metadata.distribution(name)
        names |= {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        required = [Requirement(line) for line in dist.requires or []]
        todo += [r.name for r in required if not r.marker or r.marker.evaluate({"extra": ""})]
    return names - {"__pycache__", "bin"}


def _environment_without_torch(root: Path) -> Path:
    """A virtual environment whose site-packages reach only the runtime and its dependencies; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120)
    packages = root / "packages"
    packages.mkdir()
    installed = Path(sysconfig.get_paths()["purelib"])
    for name in _top_level_names(RUNTIME_REQUIREMENTS):
        if (installed / name).exists():
            (packages / name).symlink_to(installed / name)
    (packages / "nmt_runtime").symlink_to(REPO_ROOT / "nmt_runtime")
    [site] = (root / "venv" / "lib").glob("python3*/site-packages")
    (site / "runtime_packages.pth").write_text(f"{packages}\n")
    return root / "venv" / "bin" / "python"


def test_the_runtime_runs_where_torch_cannot_be_imported(folder: Path, tiny_run_dir: Path, tmp_path: Path) -> None:
    python = _environment_without_torch(tmp_path)
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    no_torch = subprocess.run([str(python), "-c", "import torch"], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=60)
    assert no_torch.returncode == 1 and "No module named 'torch'" in no_torch.stderr
    stdin = "".join(line + "\n" for line in LINES).encode()
    done = subprocess.run([str(python), "-m", "nmt_runtime", str(folder), "--beam-size", "1"], input=stdin,
                          capture_output=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode() == expected_lines(tiny_run_dir, 1, beam_size=1)


def test_source_text_is_cut_and_encoded_as_the_engine_does(tmp_path: Path) -> None:
    """Stripping, the word limit and a leading reserved tag (``<bt>``: its one id), on separate src/tgt models."""
    from conftest import TGT, tokenizer_settings

    from nmt.data import train_tokenizer
    from nmt.inference.engine import truncate_words
    from nmt_runtime.text import SubwordText

    tokenizer = train_tokenizer(SRC * 3, TGT * 3, tokenizer_settings(vocab_size=60, joint=False), tags=["<bt>"])
    src_file, tgt_file = tokenizer.save(tmp_path)
    text = SubwordText(src_file, tgt_file, list(tokenizer.tags), max_input_words=4)
    lines = [f"<bt> {SRC[0]}", f"  <bt>\t{SRC[1]} ", SRC[2], "<bt>", "", "Zwei <bt> Hunde", "\tEin  Hund \t"]
    cleaned = [text.clean(line)[0] for line in lines]
    assert cleaned == truncate_words([line.strip() for line in lines], 4)[0]
    assert [text.encode(line) for line in cleaned] == [tokenizer.encode_src(line) if line else [] for line in cleaned]
    tag_id = text.src.piece_to_id("<bt>")
    assert tag_id > 3 and text.encode(cleaned[0])[0] == tag_id and text.encode(cleaned[0])[1] != tag_id
    ids = tokenizer.encode_tgt(TGT[0])
    assert text.decode([2, *ids, 3]) == tokenizer.decode_tgt(ids) == TGT[0]


def test_the_block_top_k_finds_the_rows_k_largest() -> None:
    """The beam's candidate search by blocks (a vocabulary over 2 * 2K * 64) against a full sort, -inf rows too."""
    import numpy as np

    from nmt_runtime.search import _row_top_k

    rng = np.random.default_rng(0)
    values = rng.standard_normal((7, 3001)).astype(np.float32)  # not a multiple of the block
    values[2] = -np.inf  # an empty beam slot
    values[3, :2] = -np.inf  # PAD and BOS blocked
    values[4, 2990:] += 10.0  # the best in the last, padded block
    for k in (1, 10, 20):
        top, columns = _row_top_k(values.copy(), k)
        assert top.shape == columns.shape == (7, k)
        np.testing.assert_array_equal(np.sort(top, axis=1), np.sort(values, axis=1)[:, -k:])
        np.testing.assert_array_equal(np.take_along_axis(values, columns, axis=1), top)
        assert all(len(set(row)) == k for row in columns.tolist())
