"""Back-translation (Sennrich et al., 2016): a reverse model translates monolingual text line for line into
synthetic training pairs, streamed in chunks, resumable, and recorded in ``provenance.json``.
"""

from __future__ import annotations

import gzip
import logging
import os
import time
import zlib
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, fields, replace
from itertools import islice
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nmt.common.device import uses_bf16
from nmt.common.disk import is_disk_full
from nmt.common.progress import ProgressDisplay, format_duration
from nmt.common.provenance import provenance
from nmt.data.errors import DataError
from nmt.data.fetch import mirror_folder, sha256_of
from nmt.data.mixture import training_source_file
from nmt.data.monolingual import MONOLINGUAL, resolve_monolingual
from nmt.data.synthetic import (
    DIRECTIONS,
    SyntheticFolderError,
    append_lines,
    check_output_folder,
    is_complete,
    new_record,
    prepare_output,
    write_record,
    writing,
)
from nmt.data.text import STRICT_UTF8, iter_decoded
from nmt.inference.engine import EngineSettings, SamplingOptions, SearchOptions, Translator, resolve_max_input_words
from nmt.model.checkpoint import CheckpointError, resolve_checkpoint

log = logging.getLogger(__name__)

METHODS = ("beam", "sample")


class BacktranslationError(ValueError):
    """A back-translation job that cannot run as asked (settings, languages, an output dir of another job)."""


@dataclass
class BacktranslateSettings(EngineSettings):
    """``backtranslate.py``'s keys, types and defaults: the engine's (``EngineSettings``; ``n_best`` stays 1),
    the sampling options (``SamplingOptions``' defaults), and these. ``configs/backtranslate.yaml`` comments
    every key."""

    input: str = MISSING
    lang: str = MISSING
    output: str = MISSING
    direction: str = "back"
    method: str = "beam"
    temperature: float = SamplingOptions.temperature
    top_k: int = SamplingOptions.top_k
    seed: int = SamplingOptions.seed
    chunk_lines: int = 2000
    invalid_utf8: str = STRICT_UTF8
    log_every_s: float = 30.0
    cache_dir: str = "data"
    mirror: Any = "${oc.env:NMT_DATA_MIRROR,null}"


ConfigStore.instance().store(name="backtranslate_schema", node=BacktranslateSettings)


# ------------------------------------------------------------------------------------------- Settings
def check_settings(cfg: DictConfig) -> tuple[SearchOptions, SamplingOptions | None]:
    """The search options (and sampling options for ``method=sample``) of a composed config, all checked.

    Raises:
        BacktranslationError: a required key left out, or a value out of range.
        TranslationError: a search or sampling option the Translator refuses.
    """
    for key, example in (("checkpoint", "checkpoint=RUN_DIR or checkpoint=[RUN_A,RUN_B]"),
                         ("input", "input=FILE (plain or .gz) or input=multi30k_task2"),
                         ("lang", "lang=en (the input's language)"), ("output", "output=DIR")):
        if OmegaConf.is_missing(cfg, key) or cfg[key] in (None, "", []):
            raise BacktranslationError(f"{key} is missing: pass {example}")
    if cfg.direction not in DIRECTIONS:
        raise BacktranslationError(f"direction={cfg.direction!r} is not one of {', '.join(DIRECTIONS)}")
    if cfg.method not in METHODS:
        raise BacktranslationError(f"method={cfg.method!r} is not one of {', '.join(METHODS)}")
    for key in ("chunk_lines", "log_every_s"):
        if cfg[key] <= 0:
            raise BacktranslationError(f"{key}={cfg[key]} must be positive")
    resolve_max_input_words(cfg.max_input_words, [])  # checked now; resolved with the models' configs later
    if cfg.n_best != 1:
        raise BacktranslationError(f"n_best={cfg.n_best}: back-translation writes one translation per line; leave it 1")
    search = SearchOptions(beam_size=cfg.beam_size if cfg.method == "beam" else 1, length_penalty=cfg.length_penalty,
                           max_len=cfg.max_len, max_len_ratio=cfg.max_len_ratio, batch_tokens=cfg.batch_tokens)
    sampling = SamplingOptions(cfg.temperature, cfg.top_k, cfg.seed) if cfg.method == "sample" else None
    return search.checked(), sampling.checked() if sampling else None


def settings_as_arguments(cfg: DictConfig) -> list[str]:
    """Every setting as a ``backtranslate.py`` argument (``checkpoint=[A,B]``, ``mirror=null``), the job first."""
    def value(v: Any) -> str:
        if isinstance(v, (list, tuple)):
            return "[" + ",".join(map(str, v)) + "]"
        return "null" if v is None else str(v)

    plain = OmegaConf.to_container(cfg, resolve=True)
    job = ["checkpoint", "input", "lang", "output"]  # what the job is, then how
    keys = job + [f.name for f in fields(BacktranslateSettings) if f.name not in job]
    return [f"{key}={value(plain[key])}" for key in keys if key in plain]


def search_record(method: str, search: SearchOptions, sampling: SamplingOptions | None) -> dict[str, Any]:
    """The options that decide the output, for provenance.json (what ``method`` does not use is left out)."""
    used = ({"beam_size": search.beam_size, "length_penalty": search.length_penalty} if sampling is None
            else {**asdict(sampling), "seed_per_chunk": "seed + chunk number (0-based)"})
    return {"method": method, **used, "max_len": search.max_len, "max_len_ratio": search.max_len_ratio,
            "batch_tokens": search.batch_tokens}


# ---------------------------------------------------------------------------------------------- Input
@dataclass
class InputText:
    """The monolingual input: where it is, its language, its sha256 and line count (read once before the job)."""

    path: Path
    lang: str
    sha256: str
    lines: int
    corpus: dict[str, Any] | None  # a registered corpus' record (MonolingualText.info); None for a user's file


def open_input(cfg: DictConfig) -> InputText:
    """Resolve ``cfg.input`` (a file or a registered corpus) and read it once: sha256, lines, UTF-8.

    Raises:
        DataError: an unknown corpus, a missing or unreadable file, or invalid UTF-8 (naming the line).
    """
    text = resolve_monolingual(str(cfg.input), str(cfg.lang), cache_dir=cfg.cache_dir, mirror=mirror_folder(cfg.mirror))
    n_lines = sum(1 for _ in iter_input_lines(text.path, cfg.invalid_utf8))
    corpus = text.info if str(cfg.input) in MONOLINGUAL else None
    return InputText(text.path, text.lang, sha256_of(text.path), n_lines, corpus)


def iter_input_lines(path: Path, invalid_utf8: str, skip: int = 0) -> Iterator[str]:
    """The stripped lines of a plain or gzip file after the first ``skip``, streamed (only ``\\n`` ends a line).

    Raises:
        DataError: invalid UTF-8 (``error`` mode: the file, line and fix), or an unreadable or broken gzip file.
    """
    try:
        with open(path, "rb") as probe:
            gz = probe.read(2) == b"\x1f\x8b"
        with (gzip.open(path, "rb") if gz else open(path, "rb")) as stream:
            lines = iter_decoded(stream, str(path), invalid_utf8, fix="pass invalid_utf8=replace")
            yield from islice(lines, skip, None)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"cannot read {path}: {exc}. Is the file truncated or not really gzip?") from None


# --------------------------------------------------------------------------------------------- Models
def load_reverse_model(cfg: DictConfig, text: InputText) -> tuple[Translator, str]:
    """The Translator of ``cfg.checkpoint`` (a run, a .pt file or a list) and the language it writes.

    Raises:
        BacktranslationError: the model does not translate from the input's language, or writes it itself.
        CheckpointError, TranslationError: what ``Translator.from_checkpoint`` refuses.
    """
    # never cut a line: over-long lines are left untranslated instead (max_input_words)
    translator = Translator.from_checkpoint(cfg.checkpoint, device=cfg.device, precision=cfg.precision,
                                            max_input_words=None, cuda_graphs=cfg.cuda_graphs,
                                            cuda_graphs_check=cfg.cuda_graphs_check)
    info = translator.info()
    src, tgt, lang = info["src_lang"], info["tgt_lang"], text.lang
    if src != lang or not tgt or tgt == lang:
        name = " + ".join(str(p) for p in translator.checkpoints)
        raise BacktranslationError(
            f"{name} translates {src}→{tgt}, but the input {text.path} is {lang} (lang={lang}): {cfg.direction}-"
            f"translating it needs a model that translates from {lang} (one trained with data.src_lang={lang}); "
            "pass such a checkpoint, or set lang= to the input's language")
    return translator, tgt


# ---------------------------------------------------------------------------------------------- A chunk
def translate_chunk(translator: Translator, lines: list[str], chunk_index: int, search: SearchOptions,
                    sampling: SamplingOptions | None, max_words: int | None) -> tuple[list[str], Counter[str]]:
    """The synthetic line of each input line (empty for an empty or over-long one), and what was counted."""
    over_long = [max_words is not None and len(line.split()) > max_words for line in lines]
    todo = [i for i, line in enumerate(lines) if line and not over_long[i]]
    counts = Counter(lines=len(lines), empty=lines.count(""), over_long=sum(over_long), translated=len(todo))
    # a seed per chunk: a run resumed at chunk n draws what an uninterrupted run drew there
    chunk_sampling = replace(sampling, seed=sampling.seed + chunk_index) if sampling else None
    results = translator.translate([lines[i] for i in todo], sampling=chunk_sampling, **asdict(search))
    synthetic = [""] * len(lines)
    for i, result in zip(todo, results):
        synthetic[i] = " ".join(result.text.split())  # one line: no newline or tab can split it
    counts["empty_translations"] = sum(1 for i in todo if not synthetic[i])
    return synthetic, counts


# ----------------------------------------------------------------------------------------- The output
def backtranslate(cfg: DictConfig, argv: list[str] | None = None) -> dict[str, Any]:
    """Back-translate ``cfg.input`` into ``cfg.output`` (the composed ``backtranslate`` config), or resume it.

    ``train.<M>`` gets the translation of input line i, ``train.<L>`` the line itself (an empty or over-long line
    gets an empty synthetic line). Each chunk is appended and fsynced before ``provenance.json`` records it, so a
    rerun on the same folder truncates to the last whole chunk and writes the same bytes.

    Args:
        argv: the command line to record; None (from Python): every setting of ``cfg`` as ``key=value``.

    Returns:
        ``{"output", "status", "lines", "done", "translated", "seconds", "sentences_per_s", "max_input_words"}``;
        seconds and sentences/s count this run's chunks only.

    Raises:
        BacktranslationError, TranslationError, CheckpointError, DataError: the user's mistakes, reported in one
            line by ``backtranslate.py``; nothing is written before they are ruled out.
    """
    search, sampling = check_settings(cfg)
    text = open_input(cfg)
    translator, tgt = load_reverse_model(cfg, text)
    max_words = resolve_max_input_words(cfg.max_input_words, translator.configs)
    models = [{"checkpoint": str(path), "sha256": sha256_of(path)} for path in translator.checkpoints]
    # what decides the output: a resumed run must match all of it
    job = {"input_sha256": text.sha256, "input_lines": text.lines, "lang": text.lang,
           "model_sha256": [m["sha256"] for m in models], "model_languages": f"{text.lang}-{tgt}",
           "search": search_record(cfg.method, search, sampling), "max_input_words": max_words,
           "chunk_lines": cfg.chunk_lines, "device": translator.device.type,
           "precision": "int8" if translator.precision == "int8"  # what the models compute in
           else "bf16" if uses_bf16(translator.precision, translator.device) else "fp32",
           "direction": cfg.direction}
    out = Path(str(cfg.output))
    try:
        check_output_folder(out)
        with writing(out, f"backtranslate.py (pid {os.getpid()})"):
            # provenance.json of a job not started yet: the job and what people read (date, command, host, ...)
            first_run = provenance("backtranslate.py", settings_as_arguments(cfg) if argv is None else argv)
            record = prepare_output(out, new_record(
                cfg.direction, text.lang, tgt, first_run, input={**asdict(text), "path": str(text.path)},
                models=models, model_languages={"src": text.lang, "tgt": tgt}, job=job,
                lines={"input": text.lines, "done": 0, "translated": 0, "empty": 0, "over_long": 0,
                       "empty_translations": 0}))
            if record is None:
                log.info("%s already holds this %s-translation, complete: nothing to do", out, cfg.direction)
                return {"output": str(out), "status": "complete", "lines": text.lines, "done": text.lines,
                        "translated": 0, "seconds": 0.0, "sentences_per_s": None, "max_input_words": max_words}
            return _run(translator, text, out, record, search, sampling, max_words, cfg)
    except SyntheticFolderError as error:
        raise BacktranslationError(str(error)) from None


def _run(translator: Translator, text: InputText, out: Path, record: dict[str, Any], search: SearchOptions,
         sampling: SamplingOptions | None, max_words: int | None, cfg: DictConfig) -> dict[str, Any]:
    """Translate the chunks after ``record``'s lines done, committing each, logged before and after;
    ``backtranslate``'s summary."""
    chunk_lines, done = cfg.chunk_lines, record["lines"]["done"]
    log.info("%s-translating %s (%s, %d lines%s) with %s into %s", cfg.direction, text.path, text.lang, text.lines,
             f", from line {done + 1}" if done else "", " + ".join(m["checkpoint"] for m in record["models"]), out)
    sides = {pair["side"]: pair["file"] for pair in record["pairs"].values()}
    synthetic_name, real_name = sides["synthetic"], sides["real"]
    progress = ProgressDisplay(text.lines, " lines", f"{cfg.direction}-translating", done, cfg.log_every_s, log)
    translated, start = 0, time.perf_counter()
    try:
        with open(out / synthetic_name, "ab") as synthetic_file, open(out / real_name, "ab") as real_file:
            lines_in = iter_input_lines(text.path, cfg.invalid_utf8, skip=done)
            chunks = iter(lambda: list(islice(lines_in, chunk_lines)), [])  # the last may be shorter
            for index, lines in enumerate(chunks, start=done // chunk_lines):
                synthetic, counts = translate_chunk(translator, lines, index, search, sampling, max_words)
                sizes = {synthetic_name: append_lines(synthetic_file, synthetic),
                         real_name: append_lines(real_file, lines)}
                commit_chunk(out, record, counts, sizes)
                translated += counts["translated"]
                progress.advance(len(lines))
    except KeyboardInterrupt:
        progress.close()
        log.warning("interrupted: %s holds the first %d of %d lines; run the same command again to go on", out,
                    record["lines"]["done"], text.lines)
        raise
    except OSError as error:  # a full disk: name the folder, which a file object's write does not
        if is_disk_full(error) and not error.filename:
            raise OSError(error.errno, error.strerror, str(out)) from error
        raise
    finally:
        progress.close()
    record.update(status="complete", finished=provenance("backtranslate.py")["date"])
    write_record(out, record)
    seconds = time.perf_counter() - start
    log.info("%s: %d lines (%d translated, %d empty, %d over %s words) in %s; %s", out, text.lines,
             record["lines"]["translated"], record["lines"]["empty"], record["lines"]["over_long"], max_words,
             format_duration(seconds), record["status"])
    return {"output": str(out), "status": record["status"], "lines": text.lines, "done": record["lines"]["done"],
            "translated": translated, "seconds": seconds,
            "sentences_per_s": translated / seconds if seconds > 0 else None, "max_input_words": max_words}


def commit_chunk(out: Path, record: dict[str, Any], counts: Counter[str], sizes: dict[str, int]) -> None:
    """Record a chunk whose lines are on disk: after this, a resumed run starts after it."""
    for key in ("translated", "empty", "over_long", "empty_translations"):
        record["lines"][key] += counts[key]
    record["lines"]["done"] += counts["lines"]
    record["bytes"] = sizes
    write_record(out, record)


# ------------------------------------------------------------------------------- For training mixtures
def job_config(settings: Mapping[str, Any]) -> DictConfig:
    """A job's config from Python: ``BacktranslateSettings``' defaults with ``settings`` on top, type-checked.

    Raises:
        BacktranslationError: an unknown key or a value of the wrong type.
    """
    try:
        return OmegaConf.merge(OmegaConf.structured(BacktranslateSettings), dict(settings))
    except OmegaConfBaseException as error:
        raise BacktranslationError(f"bad back-translation setting: {str(error).splitlines()[0]}") from None


def rebuild_synthetic_sources(data_cfg: Any) -> list[dict[str, Any]]:
    """Translate every ``data.mixture`` source whose ``synthetic`` folder is missing or unfinished and that says how
    (``backtranslate: {checkpoint, input, lang, ...}`` or ``forward_translate: {checkpoint, ...}``; a forward
    translation's input defaults to the training sources). Returns the jobs' summaries, in mixture order.
    """
    summaries = []
    for entry in (OmegaConf.select(data_cfg, "mixture") or []):
        direction = "back" if entry.get("backtranslate") else "forward" if entry.get("forward_translate") else None
        if not entry.get("synthetic") or direction is None or is_complete(Path(str(entry["synthetic"]))):
            continue
        key = f"{direction}_translate" if direction == "forward" else "backtranslate"
        # Resolved here, in the whole config: a ${data.*} in a list of checkpoints would not resolve once copied.
        settings = {**OmegaConf.to_container(entry[key], resolve=True), "output": str(entry["synthetic"]),
                    "direction": direction}
        check_model_exists(entry, key, data_cfg)
        if direction == "forward":
            settings.setdefault("lang", data_cfg.src_lang)
            if "input" not in settings:
                settings["input"] = str(training_source_file(data_cfg))
        log.info("data.mixture: %s-translating into %s first (its folder is missing or unfinished)", direction,
                 entry["synthetic"])
        summaries.append(backtranslate(job_config(settings)))
    return summaries


def check_model_exists(entry: Any, key: str, data_cfg: Any) -> None:
    """Refuse, before any text is fetched, a translation whose model (reverse or teacher) has no checkpoint yet."""
    checkpoints = entry[key].get("checkpoint")
    for checkpoint in [checkpoints] if isinstance(checkpoints, str) else list(checkpoints or []):
        try:
            resolve_checkpoint(str(checkpoint))
        except CheckpointError as error:
            src, tgt = data_cfg.get("src_lang"), data_cfg.get("tgt_lang")
            src, tgt = (entry[key].get("lang"), src) if key == "backtranslate" else (src, tgt)
            role = "reverse model" if key == "backtranslate" else "teacher"
            raise BacktranslationError(
                f"data.mixture: {entry['synthetic']} is to be {key.replace('_', '-').replace('back', 'back-')}d "
                f"first, but its {role} ({key}.checkpoint) is not trained: {error}; train a {src}->{tgt} model there "
                f"first (e.g. the recipe: python train.py experiment=multi30k_best data.src_lang={src} "
                f"data.tgt_lang={tgt} hydra.run.dir={checkpoint}) or point {key}.checkpoint at one") from error
