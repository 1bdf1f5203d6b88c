"""The translate job behind ``translate.py``: a file (or stdin) in, a file (or stdout) out, one line per input
line; optionally scored against a reference, with heatmaps and Pharaoh alignments.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from nmt.common.disk import WriteStopped, check_writable
from nmt.common.files import write_text_durably
from nmt.common.metrics import corpus_scores
from nmt.common.settings import keys_on_command_line
from nmt.data import DataError
from nmt.data.text import STRICT_UTF8, decode_lines
from nmt.inference.backtranslation import iter_input_lines
from nmt.inference.engine import (
    EngineSettings,
    SearchOptions,
    Translation,
    TranslationError,
    Translator,
    search_over,
)
from nmt.inference.plotting import save_attention_png
from nmt.inference.rerank import Rerank, RerankSettings, check_weights, from_settings

log = logging.getLogger(__name__)

STDIO = "-"
PROGRESS_MIN_LINES = 300  # a bar for short inputs is only noise


# ----------------------------------------------------------------------------------------- Lines in
def read_input_lines(path: str | Path, invalid_utf8: str = STRICT_UTF8) -> list[str]:
    """The stripped lines of a file, a ``.gz`` file, or stdin (``-``), as in training; only ``\\n`` ends a line, so
    the output stays aligned with the input.

    Args:
        invalid_utf8: ``error`` stops at the first invalid line, naming it; ``replace`` substitutes U+FFFD and
            logs one warning with the count and the first bad line.

    Raises:
        TranslationError: missing file, invalid UTF-8 (``error`` mode) or an unknown mode.
    """
    try:
        if str(path) == STDIO:
            # a test's StringIO has no .buffer: its lines are encoded back
            raw = getattr(sys.stdin, "buffer", None) or (s.encode("utf-8", "surrogateescape") for s in sys.stdin)
            return decode_lines(raw, "<stdin>", invalid_utf8, fix="pass invalid_utf8=replace")
        if not Path(path).is_file():
            raise TranslationError(f"file {path} does not exist")
        return list(iter_input_lines(Path(path), invalid_utf8))
    except DataError as exc:  # invalid UTF-8, or an unreadable file (a truncated or fake .gz)
        raise TranslationError(str(exc)) from None


# ---------------------------------------------------------------------- The job behind translate.py
@dataclass
class TranslateSettings(EngineSettings):
    """``translate.py``'s settings: the engine's and these, the one home of their defaults (configs/translate.yaml
    gets them from Hydra's ConfigStore and comments every key).
    """

    input: str = STDIO
    output: str = STDIO
    reference: str | None = None
    invalid_utf8: str = STRICT_UTF8
    progress: Any = "auto"
    attention_dir: str | None = None
    attention_words: bool = True
    alignments: str | None = None
    rerank: RerankSettings = field(default_factory=RerankSettings)


ConfigStore.instance().store(name="translate_settings", node=TranslateSettings)


def format_output(result: Translation, n_best: int) -> str:
    """One output line: the 1-best text, or ``text TAB score`` pairs for ``n_best > 1``; "" for an empty input."""
    if not result.src_ids:  # an empty input line stays an empty output line, n-best or not
        return ""
    texts = [c.text.replace("\n", " ").replace("\t", " ") for c in result.nbest]
    return texts[0] if n_best == 1 else "\t".join(f"{text}\t{c.score:.4f}" for text, c in zip(texts, result.nbest))


def write_output(path: str, lines: list[str]) -> None:
    """Write the output ``lines`` (each ending in a newline) whole: a file through a temp file renamed into place,
    so a full disk leaves the old file (or none), never half of one; stdout, which cannot be taken back, as it goes.

    Raises:
        WriteStopped: stdout was cut (a closed pipe, a full disk under ``> file``); says how many lines got out.
        OSError: a full disk writing the file (named), for the entry point to report.
    """
    if path != STDIO:
        write_text_durably(path, "".join(lines))
        return
    if hasattr(sys.stdout, "reconfigure"):  # UTF-8, whatever the locale says (a test's StringIO is text already)
        sys.stdout.reconfigure(encoding="utf-8")
    written = 0
    try:
        for line in lines:
            sys.stdout.write(line)
            written += 1  # handed to the buffer; how many reached the reader is not known
        sys.stdout.flush()
    except OSError as error:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush must not fail
        raise WriteStopped(f"could not write stdout: {error.strerror} (a closed pipe or a full disk); at most "
                           f"{written} of {len(lines)} lines got out, and stdout cannot be taken back: pass "
                           "output=FILE, which is written whole or not at all, and run again") from None


def _write_attention(cfg: DictConfig, translator: Translator, lines: list[str], results: list[Translation]) -> None:
    """Heatmaps (``attention_dir``) and Pharaoh alignments (``alignments``) of the 1-best outputs."""
    digits = len(str(len(lines)))
    for lineno, (line, result) in enumerate(zip(lines, results), start=1):
        best = result.hypotheses[0]
        if not cfg.attention_dir or result.attention is None or not best.tokens:
            continue
        if cfg.attention_words:
            weights, src_labels, tgt_labels = result.attention.weights, result.attention.source, result.attention.target
        else:  # subwords, as the model saw them
            weights, src_labels = best.attention, translator.tokenizer.src_pieces(result.src_ids) + ["</s>"]
            tgt_labels = translator.tokenizer.tgt_pieces(best.tokens)
        title = f"line {lineno}: {line if len(line) <= 80 else line[:77] + '...'}"
        save_attention_png(Path(cfg.attention_dir) / f"{lineno:0{digits}d}.png", weights, src_labels, tgt_labels,
                           title=title)
    if cfg.alignments:
        write_text_durably(cfg.alignments, "".join((r.attention.alignment if r.attention else "") + "\n"
                                                   for r in results))


def translate_main(cfg: DictConfig) -> dict[str, Any]:
    """Translate ``cfg.input`` to ``cfg.output`` with ``cfg.checkpoint`` (see configs/translate.yaml).

    Returns:
        ``{"lines", "seconds", "sentences_per_s"}``, plus ``corpus_scores``' keys when ``cfg.reference`` is given.

    Raises:
        TranslationError, CheckpointError, DataError, PathNotWritable: user mistakes, reported in one line by
            ``translate.py``.
    """
    options = SearchOptions.from_settings(cfg)  # checked before the model loads
    for key in ("output", "alignments", "attention_dir"):  # now, not after the whole input has been decoded
        if (str(cfg.output) != STDIO) if key == "output" else cfg[key]:
            check_writable(str(cfg[key]), key, folder=key == "attention_dir")
    translator = Translator.from_settings(cfg)
    options = search_over(translator.search_defaults, cfg, keys_on_command_line())  # a Hub folder's own beam, α
    if cfg.rerank.checkpoint:
        check_weights(cfg.rerank, options.beam_size)
    rerank = from_settings(cfg.rerank, translator)
    wants_attention = bool(cfg.attention_dir or cfg.alignments)
    if wants_attention and not translator.has_attention:
        raise TranslationError(f"attention_dir and alignments need attention weights, but this model was trained "
                               f"with attention={translator.attention_name}, which has none; drop those options")
    if str(cfg.input) == str(cfg.output) == STDIO and sys.stdin.isatty() and not (cfg.reference or wants_attention):
        return _interactive(translator, options, cfg.n_best, rerank)

    lines = read_input_lines(str(cfg.input), cfg.invalid_utf8)
    refs = read_input_lines(str(cfg.reference), cfg.invalid_utf8) if cfg.reference else None
    if refs is not None and len(refs) != len(lines):
        raise TranslationError(f"reference {cfg.reference} has {len(refs)} lines but the input has {len(lines)}; "
                               "they must align line by line")
    show_bar = len(lines) > PROGRESS_MIN_LINES if cfg.progress == "auto" else bool(cfg.progress)

    start = time.perf_counter()
    results = translator.translate(lines, attention=wants_attention, progress=show_bar, rerank=rerank,
                                   **asdict(options))
    seconds = time.perf_counter() - start
    write_output(str(cfg.output), [format_output(result, options.n_best) + "\n" for result in results])
    if wants_attention:
        _write_attention(cfg, translator, lines, results)

    metrics: dict[str, Any] = {"lines": len(lines), "seconds": seconds,
                               "sentences_per_s": len(lines) / seconds if seconds > 0 else float("inf")}
    if refs is not None:
        scores = corpus_scores([r.text for r in results], refs)
        metrics.update(scores)
        print(f"BLEU = {scores['bleu']:.2f}  ({scores['bleu_signature']})", file=sys.stderr)
        print(f"chrF2 = {scores['chrf']:.2f}  ({scores['chrf_signature']})", file=sys.stderr)
    log.info("translated %d line(s) in %.1f s (%.1f sentences/s) on %s", len(lines), seconds,
             metrics["sentences_per_s"], translator.device)
    return metrics


def _interactive(translator: Translator, options: SearchOptions, n_best: int, rerank: Rerank | None
                 ) -> dict[str, Any]:
    """A prompt on a terminal: each line typed is translated at once; Ctrl-D ends."""
    print("Type a sentence and press Enter (Ctrl-D to quit).", file=sys.stderr)
    for count in itertools.count():
        print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            print(file=sys.stderr)
            return {"lines": count}
        [result] = translator.translate([line], rerank=rerank, **asdict(options))
        print(format_output(result, n_best), flush=True)
