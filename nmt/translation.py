"""Translation: a trained checkpoint turns a file (or stdin) into a file (or stdout), line for line.

The one concept here is the *translate job* behind ``translate.py``: read lines, clean and encode them
as in training (stripped, SentencePiece-normalised, over-long lines truncated to the longest training
sentence), decode them in length-sorted token-budget batches (``nmt.search``), detokenize, and write
them back in input order, exactly one output line per input line. Optionally it scores the output
against a reference (sacreBLEU BLEU and chrF, ``nmt.evaluation``), writes one attention heatmap per
sentence (``nmt.plotting``) and Pharaoh word alignments (``nmt.alignment``).

Streams: stdout carries translations only; scores, warnings and the progress bar go to stderr. With
stdin and stdout both left at ``-`` and stdin a terminal, it prompts for one sentence at a time.

Output format: the 1-best translation per line; with ``n_best > 1`` the line holds the n hypotheses
and their scores tab-separated (``hyp_1 TAB score_1 TAB hyp_2 TAB score_2 ...``), so line i of the
output still belongs to line i of the input. An empty input line gives an empty output line.

Shapes: B sentences in a batch, S source length (subwords, EOS included).

Not done here: the search itself (``nmt.search``), checkpoint format (``nmt.checkpoint``), metrics
(``nmt.evaluation``), and any training-side data preparation.
"""

from __future__ import annotations

import gzip
import logging
import sys
import time
import zlib
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import IO, Any

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from nmt.alignment import pharaoh_alignment
from nmt.checkpoint import CheckpointError, load_for_inference
from nmt.data import EOS_ID, PAD_ID, DataError, Tokenizer
from nmt.data.batching import token_batches
from nmt.data.corpora import decode_lines
from nmt.evaluation import corpus_scores
from nmt.model import Seq2Seq
from nmt.plotting import merge_subword_attention, save_attention_png
from nmt.precision import autocast, check_precision, configure_matmul, slow_bf16_warning
from nmt.search import Hypothesis, beam_search, greedy_search

log = logging.getLogger(__name__)

STDIO = "-"
PROGRESS_MIN_LINES = 300  # a bar for short inputs is only noise
DEVICES = ("auto", "cpu", "cuda")


class TranslationError(ValueError):
    """A mistake in the request (missing file, bad option, bad input): reported in one line."""


USER_ERRORS: tuple[type[Exception], ...] = (TranslationError, CheckpointError, DataError)
"""Errors ``translate.py`` reports as one line without a traceback."""


# --------------------------------------------------------------------------------------------------
# Lines in, ids out
# --------------------------------------------------------------------------------------------------


def read_input_lines(path: str | Path, invalid_utf8: str = "error") -> list[str]:
    """The stripped lines of a file, a ``.gz`` file, or stdin (``-``), as in training.

    Only ``\\n`` ends a line, so the output stays aligned with the input line by line.

    Args:
        path: a file or ``-`` for stdin.
        invalid_utf8: ``error`` stops at the first invalid line, naming it; ``replace`` substitutes
            U+FFFD and logs one warning with the count and the first bad line.

    Raises:
        TranslationError: missing file, invalid UTF-8 (``error`` mode) or an unknown mode.
    """
    name = "<stdin>" if str(path) == STDIO else str(path)
    try:
        with _open_input(path) as stream:
            return decode_lines(stream, name, invalid_utf8, fix="pass invalid_utf8=replace")
    except DataError as exc:
        raise TranslationError(str(exc)) from None
    except (OSError, EOFError, zlib.error) as exc:  # unreadable, or a truncated / fake .gz
        raise TranslationError(f"cannot read {name}: {exc}") from exc


def _open_input(path: str | Path) -> AbstractContextManager[Any]:
    if str(path) == STDIO:  # nullcontext: reading must not close stdin
        return nullcontext(getattr(sys.stdin, "buffer", None) or _EncodedText(sys.stdin))
    path = Path(path)
    if not path.is_file():
        raise TranslationError(f"file {path} does not exist")
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if path.suffix == ".gz" or magic == b"\x1f\x8b" else open(path, "rb")


class _EncodedText:
    """Byte lines from a text stream that has no ``.buffer`` (e.g. a test's StringIO)."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def __iter__(self) -> Iterator[bytes]:
        return (line.encode("utf-8", errors="surrogateescape") for line in self.stream)


def truncate_words(lines: Sequence[str], max_words: int | None) -> tuple[list[str], int]:
    """Cut lines to at most ``max_words`` whitespace words.

    Returns:
        The lines (truncated where needed) and how many were cut.
    """
    if max_words is None:
        return list(lines), 0
    out, cut = [], 0
    for line in lines:
        words = line.split()
        if len(words) > max_words:
            out.append(" ".join(words[:max_words]))
            cut += 1
        else:
            out.append(line)
    return out, cut


def encode_lines(tokenizer: Tokenizer, lines: Sequence[str], max_words: int | None = None) -> list[list[int]]:
    """Subword ids (no EOS) of each line, after truncation to ``max_words``; logs one warning if any cut."""
    lines, cut = truncate_words(lines, max_words)
    if cut:
        log.warning(
            "%d line(s) longer than %d words were truncated to %d words (the model never saw longer "
            "sentences in training; set max_input_words to change the limit)", cut, max_words, max_words
        )
    return [tokenizer.encode_src(line) if line else [] for line in lines]


def _model_device(model: Seq2Seq) -> torch.device:
    return next(model.parameters()).device


def resolve_device(device: str | torch.device) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; ``cuda`` without a GPU is an error."""
    if isinstance(device, torch.device):
        return device
    if device not in DEVICES and not str(device).startswith("cuda:"):
        raise TranslationError(f"device={device!r} is not valid; use one of {', '.join(DEVICES)} (or cuda:N)")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise TranslationError(f"device={device} was asked for, but no CUDA GPU is available; use device=cpu")
    return torch.device(device)


def translate_ids(
    model: Seq2Seq,
    src_ids: Sequence[Sequence[int]],
    *,
    beam_size: int = 5,
    length_penalty: float = 1.0,
    max_len: int = 200,
    max_len_ratio: float | None = 2.0,
    n_best: int = 1,
    batch_tokens: int = 4096,
    progress: bool = False,
    precision: str = "auto",
) -> list[list[Hypothesis]]:
    """Decode encoded sentences in length-sorted batches on the model's device, in input order.

    Args:
        model: the model, in eval mode.
        src_ids: subword ids per sentence, without EOS; an empty list is an empty line and gives
            one empty hypothesis without decoding.
        beam_size: 1 = greedy search.
        length_penalty: GNMT alpha (beam only).
        max_len: output limit in subwords.
        max_len_ratio: output limit relative to the source length (None = ``max_len`` only).
        n_best: hypotheses per sentence (at most ``beam_size``).
        batch_tokens: padded source tokens per batch (the beam multiplies the rows by K).
        progress: show a tqdm bar on stderr.
        precision: ``auto`` (bf16 autocast on CUDA, float32 on the CPU), ``bf16`` or ``fp32``
            (``nmt.precision``).

    Returns:
        Per sentence, up to ``n_best`` hypotheses, best first.
    """
    if beam_size < 1 or not 1 <= n_best <= beam_size:
        raise TranslationError(f"need beam_size >= 1 and 1 <= n_best <= beam_size, got beam_size={beam_size}, "
                               f"n_best={n_best}")
    if batch_tokens < 1:
        raise TranslationError(f"batch_tokens must be positive, got {batch_tokens}")
    try:
        check_precision(precision)
    except ValueError as error:
        raise TranslationError(str(error)) from None
    device = _model_device(model)
    results: list[list[Hypothesis]] = [[Hypothesis([], 0.0, None)] for _ in src_ids]
    todo = [i for i, ids in enumerate(src_ids) if ids]
    lengths = [len(src_ids[i]) + 1 for i in todo]  # + EOS
    with tqdm(total=len(src_ids), disable=not progress, file=sys.stderr, unit="sent", desc="translating") as bar, \
            autocast(precision, device):
        bar.update(len(src_ids) - len(todo))
        for batch in token_batches(lengths, batch_tokens):
            rows = [todo[k] for k in batch]
            width = max(lengths[k] for k in batch)
            padded = [[*src_ids[i], EOS_ID] + [PAD_ID] * (width - 1 - len(src_ids[i])) for i in rows]
            src = torch.tensor(padded, dtype=torch.long).to(device)  # [B, S]
            src_lengths = torch.tensor([lengths[k] for k in batch], dtype=torch.long)  # [B]
            if beam_size == 1:
                hyps = [[h] for h in greedy_search(model, src, src_lengths, max_len, max_len_ratio)]
            else:
                hyps = beam_search(model, src, src_lengths, beam_size, length_penalty, max_len, max_len_ratio, n_best)
            for i, nbest in zip(rows, hyps):
                results[i] = nbest
            bar.update(len(rows))
    return results


def translate_lines(
    model: Seq2Seq,
    tokenizer: Tokenizer,
    lines: Sequence[str],
    *,
    beam_size: int = 5,
    length_penalty: float = 1.0,
    max_len: int = 200,
    max_len_ratio: float | None = 2.0,
    n_best: int = 1,
    batch_tokens: int = 4096,
    device: str | torch.device | None = None,
    progress: bool = False,
    max_input_words: int | None = None,
    precision: str = "auto",
) -> list[list[Hypothesis]]:
    """Translate sentences; results come back in input order, one n-best list per line.

    Args:
        model: the model, in eval mode.
        tokenizer: its tokenizer.
        lines: source sentences (stripped here; an empty one gives one empty hypothesis).
        beam_size: 1 = greedy search.
        length_penalty: GNMT alpha (beam only).
        max_len: output limit in subwords.
        max_len_ratio: output limit relative to the source length (None = ``max_len`` only).
        n_best: hypotheses per line.
        batch_tokens: padded source tokens per batch.
        device: move the model here first (``auto``, ``cpu``, ``cuda``); None = where it is.
        progress: show a tqdm bar on stderr.
        max_input_words: truncate longer lines to this many words (one warning), None = no limit.
        precision: ``auto``, ``bf16`` or ``fp32`` (see ``translate_ids``).

    Returns:
        Per line, up to ``n_best`` hypotheses, best first; decode with ``tokenizer.decode_tgt``.
    """
    if device is not None:
        model = model.to(resolve_device(device))
    src_ids = encode_lines(tokenizer, [line.strip() for line in lines], max_input_words)
    return translate_ids(
        model,
        src_ids,
        beam_size=beam_size,
        length_penalty=length_penalty,
        max_len=max_len,
        max_len_ratio=max_len_ratio,
        n_best=n_best,
        batch_tokens=batch_tokens,
        progress=progress,
        precision=precision,
    )


# --------------------------------------------------------------------------------------------------
# The job behind translate.py
# --------------------------------------------------------------------------------------------------


def format_output(tokenizer: Tokenizer, nbest: Sequence[Hypothesis], n_best: int) -> str:
    """One output line: the 1-best text, or ``text TAB score`` pairs for ``n_best > 1``."""
    texts = [tokenizer.decode_tgt(h.tokens).replace("\n", " ").replace("\t", " ") for h in nbest]
    if n_best == 1:
        return texts[0] if texts else ""
    return "\t".join(f"{text}\t{h.score:.4f}" for text, h in zip(texts, nbest))


def _max_input_words(cfg: DictConfig, train_cfg: dict[str, Any]) -> int | None:
    value = cfg.get("max_input_words", "auto")
    if value == "auto":
        clean = (train_cfg.get("data") or {}).get("clean") or {}
        return clean.get("max_len")
    return None if value is None else int(value)


def _open_output(path: str) -> AbstractContextManager[IO[str]]:
    if path == STDIO:
        stream = sys.stdout
        if (getattr(stream, "encoding", None) or "utf-8").lower().replace("-", "") != "utf8" and hasattr(
            stream, "reconfigure"
        ):
            stream.reconfigure(encoding="utf-8")
        return nullcontext(stream)  # writing must not close stdout
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    return open(out, "w", encoding="utf-8", newline="\n")


def _read_reference(path: str, n_lines: int, invalid_utf8: str) -> list[str]:
    refs = read_input_lines(path, invalid_utf8)
    if len(refs) != n_lines:
        raise TranslationError(f"reference {path} has {len(refs)} lines but the input has {n_lines}; "
                               "they must align line by line")
    return refs


def _write_attention(
    cfg: DictConfig, tokenizer: Tokenizer, lines: list[str], src_ids: list[list[int]], results: list[list[Hypothesis]]
) -> None:
    """Heatmaps (``attention_dir``) and Pharaoh alignments (``alignments``) of the 1-best outputs."""
    merge = bool(cfg.get("attention_words", True))
    digits = len(str(len(lines)))
    alignment_lines = []
    for lineno, (line, ids, nbest) in enumerate(zip(lines, src_ids, results), start=1):
        best = nbest[0]
        if not ids or best.attention is None:
            alignment_lines.append("")
            continue
        src_pieces = tokenizer.src_pieces(ids) + ["</s>"]  # the EOS column the model attended to
        tgt_pieces = tokenizer.tgt_pieces(best.tokens)
        if cfg.get("alignments"):
            alignment_lines.append(pharaoh_alignment(best.attention, src_pieces, tgt_pieces))
        if cfg.get("attention_dir") and best.tokens:
            weights, src_labels, tgt_labels = best.attention, src_pieces, tgt_pieces
            if merge:
                weights, src_labels, tgt_labels = merge_subword_attention(weights, src_pieces, tgt_pieces)
            title = f"line {lineno}: {line if len(line) <= 80 else line[:77] + '...'}"
            save_attention_png(Path(cfg.attention_dir) / f"{lineno:0{digits}d}.png", weights, src_labels,
                               tgt_labels, title=title)
    if cfg.get("alignments"):
        path = Path(cfg.alignments)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(a + "\n" for a in alignment_lines), encoding="utf-8")


def translate_main(cfg: DictConfig) -> dict[str, Any]:
    """Translate ``cfg.input`` to ``cfg.output`` with ``cfg.checkpoint``; see configs/translate.yaml.

    Args:
        cfg: the composed ``translate`` config.

    Returns:
        ``{"lines", "seconds", "sentences_per_s"}``, plus ``corpus_scores`` keys (``bleu``, ``chrf``,
        signatures) when ``cfg.reference`` is given.

    Raises:
        TranslationError, CheckpointError, DataError: user mistakes, reported in one line by
            ``translate.py`` (see ``USER_ERRORS``).
    """
    if OmegaConf.is_missing(cfg, "checkpoint") or not cfg.checkpoint:
        raise TranslationError("no checkpoint given; pass checkpoint=PATH (a run dir or a .pt file from train.py)")
    device = resolve_device(cfg.get("device", "auto"))
    options = search_options(cfg)
    try:
        check_precision(options["precision"])
    except ValueError as error:
        raise TranslationError(str(error)) from None
    if warning := slow_bf16_warning(options["precision"], device):
        log.warning(warning)
    configure_matmul(options["precision"], device)
    model, tokenizer, train_cfg = load_for_inference(cfg.checkpoint, device=device)
    wants_attention = bool(cfg.get("attention_dir") or cfg.get("alignments"))
    if wants_attention and not model.has_attention:
        attention_name = (train_cfg.get("attention") or {}).get("name", "none")
        raise TranslationError(
            f"attention_dir and alignments need attention weights, but this model was trained with "
            f"attention={attention_name}, which has none; drop those options"
        )
    invalid_utf8 = cfg.get("invalid_utf8", "error")
    input_path = str(cfg.get("input", STDIO))
    interactive = input_path == STDIO and str(cfg.get("output", STDIO)) == STDIO and sys.stdin.isatty()
    if interactive and not (cfg.get("reference") or wants_attention):
        return _interactive(cfg, model, tokenizer, train_cfg)

    lines = read_input_lines(input_path, invalid_utf8)
    refs = _read_reference(str(cfg.reference), len(lines), invalid_utf8) if cfg.get("reference") else None
    n_best = int(cfg.get("n_best", 1))
    progress = cfg.get("progress", "auto")
    show_bar = len(lines) > PROGRESS_MIN_LINES if progress == "auto" else bool(progress)

    start = time.perf_counter()
    src_ids = encode_lines(tokenizer, lines, _max_input_words(cfg, train_cfg))
    results = translate_ids(model, src_ids, **options, progress=show_bar)
    seconds = time.perf_counter() - start
    with _open_output(str(cfg.get("output", STDIO))) as out:
        for ids, nbest in zip(src_ids, results):
            # an empty input line stays an empty output line, n-best or not
            out.write((format_output(tokenizer, nbest, n_best) if ids else "") + "\n")
        out.flush()
    if wants_attention:
        _write_attention(cfg, tokenizer, lines, src_ids, results)

    metrics: dict[str, Any] = {
        "lines": len(lines),
        "seconds": seconds,
        "sentences_per_s": len(lines) / seconds if seconds > 0 else float("inf"),
    }
    if refs is not None:
        hyps = [tokenizer.decode_tgt(nbest[0].tokens) for nbest in results]
        scores = corpus_scores(hyps, refs)
        metrics.update(scores)
        print(f"BLEU = {scores['bleu']:.2f}  ({scores['bleu_signature']})", file=sys.stderr)
        print(f"chrF2 = {scores['chrf']:.2f}  ({scores['chrf_signature']})", file=sys.stderr)
    log.info("translated %d line(s) in %.1f s (%.1f sentences/s) on %s", len(lines), seconds,
             metrics["sentences_per_s"], device)
    return metrics


def search_options(cfg: DictConfig) -> dict[str, Any]:
    """The search settings and precision of a translate config, as ``translate_ids`` keyword arguments."""
    return {
        "beam_size": int(cfg.get("beam_size", 5)),
        "length_penalty": float(cfg.get("length_penalty", 1.0)),
        "max_len": int(cfg.get("max_len", 200)),
        "max_len_ratio": cfg.get("max_len_ratio", 2.0),
        "n_best": int(cfg.get("n_best", 1)),
        "batch_tokens": int(cfg.get("batch_tokens", 4096)),
        "precision": str(cfg.get("precision", "auto")),
    }


def _interactive(cfg: DictConfig, model: Seq2Seq, tokenizer: Tokenizer, train_cfg: dict[str, Any]) -> dict[str, Any]:
    """A prompt on a terminal: each line typed is translated at once; Ctrl-D ends."""
    print("Type a sentence and press Enter (Ctrl-D to quit).", file=sys.stderr)
    n_best, count = int(cfg.get("n_best", 1)), 0
    while True:
        print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            print(file=sys.stderr)
            return {"lines": count}
        ids = encode_lines(tokenizer, [line.strip()], _max_input_words(cfg, train_cfg))
        nbest = translate_ids(
            model,
            ids,
            **search_options(cfg),
        )[0]
        print(format_output(tokenizer, nbest, n_best) if ids[0] else "", flush=True)
        count += 1
