"""Noisy-channel reranking (nmt.inference.rerank): weight 0 keeps the order, the channel score is the reverse
model's teacher-forced log-probability, batched equals one by one, and a reranker of the wrong languages is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import SRC, save_tiny_checkpoint, serve_in_thread

from nmt import Translator
from nmt.data import BOS_ID, EOS_ID
from nmt.inference.engine import TranslationError
from nmt.inference.rerank import NoisyChannel, Rerank, combine
from nmt.model.search import Hypothesis

REPO_ROOT = Path(__file__).resolve().parents[1]
LINES = [SRC[0], "", SRC[1], SRC[2], SRC[3], SRC[4]]
SEARCH = {"beam_size": 5, "max_len": 6}


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A de→en model, two en→de reverse models (one tokenizer), and a second de→en model."""
    root = tmp_path_factory.mktemp("rerank_runs")
    made = {"de_en": save_tiny_checkpoint(root / "f" / "checkpoints" / "best.pt", "additive", seed=0),
            "de_en_b": save_tiny_checkpoint(root / "g" / "checkpoints" / "best.pt", "general", seed=3),
            "en_de": save_tiny_checkpoint(root / "r" / "checkpoints" / "best.pt", "additive", seed=1,
                                          src_lang="en", tgt_lang="de"),
            "en_de_b": save_tiny_checkpoint(root / "s" / "checkpoints" / "best.pt", "dot", seed=2,
                                            src_lang="en", tgt_lang="de")}
    return {name: path.parent.parent for name, path in made.items()}


@pytest.fixture(scope="module")
def forward(runs: dict[str, Path]) -> Translator:
    return Translator.from_checkpoint(runs["de_en"], device="cpu")


@pytest.fixture(scope="module")
def channel(runs: dict[str, Path], forward: Translator) -> NoisyChannel:
    return NoisyChannel.load([str(runs["en_de"]), str(runs["en_de_b"])], forward)


def test_weight_zero_gives_the_plain_n_best_order(forward: Translator, channel: NoisyChannel) -> None:
    plain = forward.translate(LINES, n_best=5, **SEARCH)
    reranked = forward.translate(LINES, n_best=5, rerank=Rerank(channel, weight=0.0, length_weight=0.0, n_best=5),
                                 **SEARCH)
    assert [[(c.text, c.score) for c in r.nbest] for r in reranked] == [[(c.text, c.score) for c in r.nbest]
                                                                        for r in plain]
    assert len({r.nbest[0].text for r in plain if r.src_ids}) > 1  # the lists are not all alike


def test_a_heavy_channel_weight_puts_the_best_channel_score_first(forward: Translator,
                                                                  channel: NoisyChannel) -> None:
    plain = forward.translate(LINES, n_best=5, **SEARCH)
    best = forward.translate(LINES, rerank=Rerank(channel, weight=1e6, n_best=5), **SEARCH)
    kept = [i for i, r in enumerate(plain) if r.src_ids]
    scores = channel.source_log_probs([LINES[i] for i in kept], [[c.text for c in plain[i].nbest] for i in kept])
    for i, channel_scores in zip(kept, scores):
        winner = max(range(5), key=lambda k: channel_scores[k])
        assert best[i].text == plain[i].nbest[winner].text and len(best[i].nbest) == 1
    assert best[1].text == "" and not best[1].src_ids  # an empty line stays empty


def test_the_channel_score_is_the_teacher_forced_log_probability_batched_or_not(runs: dict[str, Path],
                                                                                forward: Translator) -> None:
    single = NoisyChannel.load(str(runs["en_de"]), forward)
    sources, cands = [SRC[0], SRC[1]], [["A dog runs.", "Two men", ""], ["Two men play football."]]
    batched = single.source_log_probs(sources, cands)
    alone = [[single.source_log_probs([x], [[y]], batch_tokens=1)[0][0] for y in ys] for x, ys in zip(sources, cands)]
    assert torch.allclose(torch.tensor(sum(batched, [])), torch.tensor(sum(alone, [])), atol=1e-5)
    # by hand, step by step: sum of log p(x_t | x_<t, y) over x's subwords and EOS
    reverse = single.reverse
    model, tok = reverse.models[0], reverse.tokenizer
    y, x = tok.encode_src(cands[0][0]) + [EOS_ID], tok.encode_tgt(SRC[0]) + [EOS_ID]
    with torch.no_grad():
        memory, state = model.encode(torch.tensor([y]), torch.tensor([len(y)]))
        prev, total = torch.tensor([BOS_ID]), 0.0
        for token in x:
            logits, state, _ = model.decode_step(prev, state, memory)
            total += torch.log_softmax(logits.float(), -1)[0, token].item()
            prev = torch.tensor([token])
    assert batched[0][0] == pytest.approx(total, abs=1e-4)


def test_combine_adds_the_weighted_channel_and_length_terms() -> None:
    hyps = [Hypothesis([5, 6], -1.0, None), Hypothesis([5, 6, 7, 8], -2.0, None)]
    assert [h.tokens for h in combine(hyps, [-3.0, -1.0], 0.0, 0.0)] == [[5, 6], [5, 6, 7, 8]]
    assert [h.score for h in combine(hyps, [-3.0, -1.0], 1.0, 0.0)] == [-3.0, -4.0]  # -2-1.0, -1-3.0: reordered
    assert [h.tokens for h in combine(hyps, [-3.0, -3.0], 0.0, 1.0)][0] == [5, 6, 7, 8]  # -2+4 beats -1+2


def test_a_reranker_of_the_wrong_languages_is_refused_in_one_line(runs: dict[str, Path],
                                                                  forward: Translator) -> None:
    with pytest.raises(TranslationError, match="translates de→en, but the model translates de→en: a noisy-channel "
                                               "reranker translates the other way, en→de") as raised:
        NoisyChannel.load(str(runs["de_en_b"]), forward)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(("rerank", "message"), [
    ({"n_best": 6}, "rerank.n_best must be a whole number from 1 to beam_size \\(5\\), got 6"),
    ({"weight": float("nan")}, "rerank.weight must be a finite number, got nan"),
])
def test_bad_rerank_options_are_one_line(forward: Translator, channel: NoisyChannel, rerank: dict,
                                         message: str) -> None:
    with pytest.raises(TranslationError, match=message):
        forward.translate(LINES, rerank=Rerank(channel, **rerank), **SEARCH)


def test_translate_py_reranks_and_refuses_a_mirror_mismatch(runs: dict[str, Path], tmp_path: Path) -> None:
    source = tmp_path / "in.de"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    base = [sys.executable, str(REPO_ROOT / "translate.py"), f"checkpoint={runs['de_en']}", f"input={source}",
            "device=cpu", "max_len=6"]
    reranked = subprocess.run([*base, f"rerank.checkpoint={runs['en_de']}", "rerank.weight=1e6", "rerank.n_best=5"],
                              capture_output=True, text=True)
    assert reranked.returncode == 0, reranked.stderr
    forward = Translator.from_checkpoint(runs["de_en"], device="cpu")
    channel = NoisyChannel.load(str(runs["en_de"]), forward)
    expected = forward.translate(LINES, rerank=Rerank(channel, weight=1e6, n_best=5), **SEARCH)
    assert reranked.stdout.split("\n")[:-1] == [r.text for r in expected]
    refused = subprocess.run([*base, f"rerank.checkpoint={runs['de_en_b']}"], capture_output=True, text=True)
    assert refused.returncode == 2 and refused.stdout == "" and len(refused.stderr.strip().splitlines()) == 1
    assert "translate.py: error: " in refused.stderr and "reranker translates the other way, en→de" in refused.stderr


def test_serve_reranks_every_request_and_checks_the_reranker_first(runs: dict[str, Path], forward: Translator,
                                                                   channel: NoisyChannel) -> None:
    import json
    import urllib.request

    from hydra import compose, initialize_config_dir

    from nmt.serve.app import create_app

    def settings(*overrides: str) -> object:
        with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
            return compose("serve", overrides=["max_len=6", *overrides])

    reverse = f"rerank.checkpoint=[{runs['en_de']},{runs['en_de_b']}]"
    app = create_app(Translator.from_checkpoint(runs["de_en"], device="cpu"),
                     settings(reverse, "rerank.weight=1e6", "rerank.n_best=5", "device=cpu"))
    with serve_in_thread(app) as url:
        for options in ({}, {"beam_size": 3, "n_best": 2}):  # a beam under rerank.n_best reranks all it keeps
            request = urllib.request.Request(f"{url}/v1/translate", json.dumps({"text": LINES, **options}).encode(),
                                             {"content-type": "application/json"})
            with urllib.request.urlopen(request, timeout=60) as answer:
                got = [[c["text"] for c in t["nbest"]] for t in json.loads(answer.read())["translations"]]
            n = min(5, options.get("beam_size", 5))
            expected = forward.translate(LINES, rerank=Rerank(channel, weight=1e6, n_best=n),
                                         **{**SEARCH, **options})
            assert got == [[c.text for c in r.nbest] for r in expected]
    with pytest.raises(TranslationError, match="reranker translates the other way"):
        create_app(forward, settings(f"rerank.checkpoint={runs['de_en_b']}"))
    with pytest.raises(TranslationError, match="rerank.n_best must be a whole number from 1 to beam_size \\(10\\)"):
        create_app(forward, settings(reverse, "rerank.n_best=11"))
