"""The Translator engine: the same output as translate.py, ensembles, option checks, attention as words."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import SRC, save_tiny_checkpoint

from nmt import Translator
from nmt.inference.engine import SamplingOptions, SearchOptions, TranslationError
from nmt.model.checkpoint import load_for_inference
from nmt.model.ensemble import Ensemble
from nmt.model.search import beam_search, greedy_search

REPO_ROOT = Path(__file__).resolve().parents[1]
LINES = [SRC[0], "", SRC[1], SRC[2] + " " + SRC[3], SRC[4]]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)  # tiny models gain nothing from threads


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Run dirs of tiny models: two additive ones (seeds 0, 1) with one tokenizer, and odd ones out."""
    root = tmp_path_factory.mktemp("runs")
    made = {
        "a": save_tiny_checkpoint(root / "a" / "checkpoints" / "best.pt", "additive", seed=0),
        "b": save_tiny_checkpoint(root / "b" / "checkpoints" / "best.pt", "general", seed=1),
        "none": save_tiny_checkpoint(root / "none" / "checkpoints" / "best.pt", "none", seed=2),
        "other_vocab": save_tiny_checkpoint(root / "v" / "checkpoints" / "best.pt", "additive", vocab_size=70),
        "en_de": save_tiny_checkpoint(root / "r" / "checkpoints" / "best.pt", "additive", src_lang="en", tgt_lang="de"),
    }
    return {name: path.parent.parent for name, path in made.items()}


def test_the_engine_gives_translate_py_output_on_the_same_file(runs: dict[str, Path], tmp_path: Path) -> None:
    src = tmp_path / "in.de"
    src.write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    for extra in ([], ["beam_size=3", "n_best=2"]):
        out = tmp_path / "out.en"
        command = [sys.executable, str(REPO_ROOT / "translate.py"), f"checkpoint={runs['a']}", f"input={src}",
                   f"output={out}", "max_len=9", *extra]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        options = dict(arg.split("=") for arg in extra)
        results = Translator.from_checkpoint(runs["a"], device="cpu").translate(
            LINES, max_len=9, **{k: int(v) for k, v in options.items()})
        if options:  # n-best lines: text TAB score pairs; an empty input stays empty
            expected = ["\t".join(f"{c.text}\t{c.score:.4f}" for c in r.nbest) if r.src_ids else "" for r in results]
        else:
            expected = [r.text for r in results]
        assert out.read_text(encoding="utf-8").split("\n")[:-1] == expected


def test_results_carry_text_score_nbest_and_word_attention(runs: dict[str, Path]) -> None:
    translator = Translator.from_checkpoint(runs["a"], device="cpu")
    results = translator.translate(LINES, beam_size=4, n_best=3, max_len=8, attention=True)
    assert len(results) == len(LINES)
    empty = results[1]
    assert (empty.text, empty.score, empty.attention, empty.src_ids) == ("", 0.0, None, [])
    for line, result in zip(LINES, results):
        if not line:
            continue
        assert len(result.nbest) == 3 and result.nbest[0].text == result.text
        assert result.nbest[0].score == result.score >= result.nbest[1].score >= result.nbest[2].score
        words = result.attention
        assert words.source == line.split()[:9] + ["</s>"]  # input words (cut to the training limit), then EOS
        assert words.target == result.text.split()
        assert len(words.weights) == len(words.target) and all(len(row) == len(words.source) for row in words.weights)
        assert all(sum(row) == pytest.approx(1.0, abs=1e-3) for row in words.weights)
        for pair in words.alignment.split():
            i, j = map(int, pair.split("-"))
            assert 0 <= i < len(words.source) - 1 and 0 <= j < len(words.target)
        json.dumps(result.to_dict())  # JSON-ready
    assert [c.text for c in results[0].nbest] == [translator.tokenizer.decode_tgt(h.tokens)
                                                   for h in results[0].hypotheses]


def test_an_ensemble_of_one_model_equals_that_model(runs: dict[str, Path]) -> None:
    model, tokenizer, _ = load_for_inference(runs["a"])
    ensemble = Ensemble([model]).eval()
    src_ids = [tokenizer.encode_src(line) + [3] for line in SRC[:3]]
    width = max(map(len, src_ids))
    src = torch.tensor([ids + [0] * (width - len(ids)) for ids in src_ids])  # [B, S]
    lengths = torch.tensor([len(ids) for ids in src_ids])
    for alone, together in [
        (greedy_search(model, src, lengths, 9, None), greedy_search(ensemble, src, lengths, 9, None)),
        (beam_search(model, src, lengths, 4, 1.0, 9, None, 4)[0],
         beam_search(ensemble, src, lengths, 4, 1.0, 9, None, 4)[0]),
    ]:
        for a, b in zip(alone, together):
            assert a.tokens == b.tokens and a.score == pytest.approx(b.score, abs=1e-5)
            assert torch.allclose(a.attention, b.attention, atol=1e-6)
    one = Translator.from_checkpoint([runs["a"]], device="cpu").translate(SRC, beam_size=3)
    assert [r.text for r in one] == [r.text for r in Translator.from_checkpoint(runs["a"]).translate(SRC, beam_size=3)]


def test_an_ensemble_averages_its_members_log_probabilities(runs: dict[str, Path]) -> None:
    members = [load_for_inference(runs[name])[0] for name in ("a", "b", "none")]
    ensemble = Ensemble(members).eval()
    src, lengths = torch.tensor([[5, 9, 7, 3], [6, 8, 3, 0]]), torch.tensor([4, 3])
    prev = torch.tensor([2, 2])
    memory, state = ensemble.encode(src, lengths)
    log_probs, _, weights = ensemble.decode_step(prev, state, memory)  # [2, V], _, [2, S]
    expected, attended = [], []
    for model in members:
        member_memory, member_state = model.encode(src, lengths)
        logits, _, member_weights = model.decode_step(prev, member_state, member_memory)
        expected.append(F.log_softmax(logits, dim=-1))
        if model.has_attention:
            attended.append(member_weights)
    assert torch.allclose(log_probs, torch.stack(expected).mean(0), atol=1e-6)
    assert torch.allclose(weights, torch.stack(attended).mean(0), atol=1e-6)  # the member without attention left out


def test_an_ensemble_of_two_runs_is_deterministic(runs: dict[str, Path], tmp_path: Path) -> None:
    first = Translator.from_checkpoint([runs["a"], runs["b"]], device="cpu")
    second = Translator.from_checkpoint([runs["a"], runs["b"]], device="cpu")
    results = [t.translate(LINES, beam_size=4, n_best=2, attention=True) for t in (first, second, first)]
    assert [r.to_dict() for r in results[0]] == [r.to_dict() for r in results[1]] == [r.to_dict() for r in results[2]]
    assert first.info()["models"] == 2 and first.info()["attention"] == "additive+general"
    # and it is what translate.py checkpoint=[A,B] writes
    src = tmp_path / "in.de"
    src.write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    done = subprocess.run([sys.executable, str(REPO_ROOT / "translate.py"), f"checkpoint=[{runs['a']},{runs['b']}]",
                           f"input={src}", "beam_size=4"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:-1] == [r.text for r in results[0]]


def test_members_that_do_not_fit_together_are_refused(runs: dict[str, Path]) -> None:
    with pytest.raises(TranslationError, match=r"cannot ensemble .*/a/checkpoints/best.pt and "
                                               r".*/v/checkpoints/best.pt: their SentencePiece models differ"):
        Translator.from_checkpoint([runs["a"], runs["other_vocab"]])
    with pytest.raises(TranslationError, match=r"\(de-en\) and .* \(en-de\): they translate different language pairs"):
        Translator.from_checkpoint([runs["a"], runs["en_de"]])
    with pytest.raises(TranslationError, match="no checkpoint given"):
        Translator.from_checkpoint([])


def test_search_options_are_checked_in_one_place(runs: dict[str, Path]) -> None:
    translator = Translator.from_checkpoint(runs["a"], device="cpu")
    with pytest.raises(TypeError, match="unexpected keyword argument 'beam'"):  # Python's own keyword check
        translator.translate(SRC, beam=3)
    with pytest.raises(TranslationError, match=r"n_best \(3\) cannot exceed beam_size \(2\)"):
        translator.translate(SRC, beam_size=2, n_best=3)
    with pytest.raises(TranslationError, match="beam_size must be a whole number from 1 to 1000, got 0"):
        translator.translate(SRC, beam_size=0)
    with pytest.raises(TranslationError, match="length_penalty must be a number from 0 to 10, got 'x'"):
        translator.translate(SRC, length_penalty="x")
    for bad in (float("nan"), float("inf"), -0.5, 11):  # NaN fails every comparison: it must still be refused
        with pytest.raises(TranslationError, match=f"length_penalty must be a number from 0 to 10, got {bad!r}"):
            translator.translate(SRC, length_penalty=bad)
    with pytest.raises(TranslationError, match="attention=none, which has none"):
        Translator.from_checkpoint(runs["none"]).translate(SRC, attention=True)
    with pytest.raises(TranslationError, match="max_input_words must be auto, null or a whole number >= 1, got 'many'"):
        Translator.from_checkpoint(runs["a"], max_input_words="many")
    with pytest.raises(TranslationError, match="device='tpu' is not valid"):
        Translator.from_checkpoint(runs["a"], device="tpu")
    assert SearchOptions() == SearchOptions(**{}).checked()  # the defaults live in the dataclass and pass the checks


@pytest.mark.parametrize("members", [["a"], ["a", "b"]])
def test_sampling_through_the_engine_is_seeded_for_models_and_ensembles(runs: dict[str, Path],
                                                                        members: list[str]) -> None:
    translator = Translator.from_checkpoint([runs[m] for m in members], device="cpu")
    lines = SRC * 4 + [""]

    def texts(**sampling: float) -> list[str]:
        results = translator.translate(lines, sampling=SamplingOptions(**sampling), max_len=8, batch_tokens=40)
        return [r.text for r in results]

    first = texts(temperature=2.0, seed=1)
    assert first == texts(temperature=2.0, seed=1)
    assert first != texts(temperature=2.0, seed=2)
    assert first[-1] == ""  # an empty line stays empty
    greedy = [r.text for r in translator.translate(lines, beam_size=1, max_len=8)]
    assert texts(top_k=1, seed=5) == greedy


def test_sampling_options_are_checked_in_the_same_place(runs: dict[str, Path]) -> None:
    translator = Translator.from_checkpoint(runs["a"], device="cpu")
    for bad, message in [({"temperature": 0}, "temperature must be a number > 0, got 0"),
                         ({"top_k": -1}, "top_k must be a whole number >= 0, got -1"),
                         ({"seed": 1.5}, "seed must be a whole number >= 0 and < 2\\*\\*62, got 1.5")]:
        with pytest.raises(TranslationError, match=message):
            translator.translate(SRC, sampling=SamplingOptions(**bad))
    with pytest.raises(TranslationError, match="sampling draws one translation per sentence; n_best must be 1"):
        translator.translate(SRC, sampling=SamplingOptions(), n_best=2)


def test_info_reports_the_run_and_its_recorded_bleu(runs: dict[str, Path]) -> None:
    info = Translator.from_checkpoint(runs["a"], device="cpu").info()
    assert (info["attention"], info["src_lang"], info["tgt_lang"], info["models"]) == ("additive", "de", "en", 1)
    assert info["parameters"] > 0 and info["bleu"] is None and info["device"] == "cpu"
    (runs["a"] / "results.json").write_text(json.dumps({"test": {"test_2016_flickr": {"bleu": 39.37}}}))
    try:
        assert Translator.from_checkpoint(runs["a"]).info()["bleu"] == {"test_2016_flickr": 39.37}
    finally:
        (runs["a"] / "results.json").unlink()


def test_long_inputs_are_cut_as_in_training(runs: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    translator = Translator.from_checkpoint(runs["a"], device="cpu")
    long_line = " ".join([SRC[0]] * 4)
    assert translator.max_input_words == 9
    assert translator.encode([long_line]) == translator.encode([" ".join(long_line.split()[:9])])
    assert "1 line(s) longer than 9 words were truncated" in caplog.text
    uncut = Translator.from_checkpoint(runs["a"], max_input_words=None)
    assert len(uncut.encode([long_line])[0]) > len(translator.encode([long_line])[0])


def test_training_does_not_import_the_translate_job() -> None:
    job = "nmt.inference.translate_job"
    code = f"import sys, nmt.train.trainer; assert {job!r} not in sys.modules, '{job} imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
