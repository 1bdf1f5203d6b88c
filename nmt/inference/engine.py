"""The inference engine: ``Translator`` turns sentences into translations with one or more trained models, for
validation, ``translate.py``, ``serve.py``, the analysis scripts and Python users alike.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from omegaconf import MISSING, OmegaConf

from nmt.common.batch_tokens import resolve_batch_tokens
from nmt.common.cuda_graphs import CudaGraphError, resolve_cuda_graphs
from nmt.common.device import (
    DeviceError,
    autocast,
    check_inference_precision,
    configure_matmul,
    quantize_int8,
    resolve_device,
    slow_bf16_warning,
)
from nmt.common.progress import ProgressDisplay
from nmt.data import EOS_ID, PAD_ID, DataError, Tokenizer
from nmt.data.batching import token_batches
from nmt.inference.alignment import pharaoh_alignment
from nmt.inference.words import merge_subword_attention
from nmt.model.checkpoint import CheckpointError, load_for_inference, resolve_checkpoint
from nmt.model.ensemble import Ensemble
from nmt.model.hub_folder import CONFIG_FILE, WEIGHTS_FILE
from nmt.model.search import Hypothesis, Search, SearchSpec, sample_search
from nmt.model.seq2seq import SearchModel, Seq2Seq, count_parameters

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from nmt.model.graph_search import SearchGraphs


class TranslationError(ValueError):
    """A mistake in a translation request (bad option, bad input, models that do not fit): one line."""


@dataclass(unsafe_hash=True)  # hashable so that equal options can key a batch (serve.py); never mutated
class SearchOptions:
    """How to search; the one home of these defaults (translate.py, serve.py and their YAML files use them).

    Attributes:
        beam_size: hypotheses kept per sentence; 1 = greedy search.
        length_penalty: GNMT alpha (beam only): score / ((5 + length) / 6) ** alpha; 0 = raw log-probability.
        n_best: hypotheses returned per sentence, at most ``beam_size``.
        max_len: at most this many output subwords per sentence.
        max_len_ratio: and at most ``ceil(ratio * source subwords) + 5``; None = ``max_len`` only.
        batch_tokens: padded source subwords per batch (the beam multiplies the rows by ``beam_size``); ``auto``:
            4096 on a CPU, 65,536 on a GPU (``nmt.common.batch_tokens``).
    """

    beam_size: int = 5
    length_penalty: float = 1.0
    n_best: int = 1
    max_len: int = 200
    max_len_ratio: float | None = 1.5
    batch_tokens: Any = "auto"  # a whole number or "auto"

    @classmethod
    def from_settings(cls, settings: Any) -> SearchOptions:
        """The search options of a settings object or config that has these keys (translate.py's, serve.py's)."""
        return SearchOptions(**{f.name: _plain(getattr(settings, f.name)) for f in fields(SearchOptions)}).checked()

    def checked(self) -> SearchOptions:
        """These options if they are valid; else a TranslationError naming the option and its range."""
        for name, (low, high) in OPTION_BOUNDS.items():
            value = getattr(self, name)
            if name == "batch_tokens" and value == "auto":
                continue
            if isinstance(low, int):  # a count: beam_size, n_best, max_len, batch_tokens
                wanted = "a whole number " + (">= 1" if high == math.inf else f"from 1 to {high}")
                wanted += " or auto" if name == "batch_tokens" else ""
                check_option(is_number(value, int) and low <= value <= high, name, wanted, value)
            elif value is not None or name != "max_len_ratio":  # (a NaN fails the range test too)
                wanted = f"a number from {low:g} to {high:g}"
                check_option(is_number(value) and low <= value <= high, name, wanted, value)
        if self.n_best > self.beam_size:
            raise TranslationError(f"n_best ({self.n_best}) cannot exceed beam_size ({self.beam_size})")
        return self


@dataclass(frozen=True)
class SamplingOptions:
    """Sampling instead of searching: one translation per sentence, each token drawn from the model (or
    an ensemble's averaged log-probabilities), as ``nmt.model.search.sample_search`` does.

    Attributes:
        temperature: > 0; the distribution is ``softmax(log p / temperature)``.
        top_k: draw among the ``top_k`` most probable tokens; 0 = the whole vocabulary.
        seed: seeds the random numbers of one ``translate`` call; the same seed, sentences, options and
            models give the same samples (on the same device and precision).
    """

    temperature: float = 1.0
    top_k: int = 0
    seed: int = 0

    def checked(self) -> SamplingOptions:
        """These options if they are valid; else a TranslationError naming the option and its range."""
        temperature, top_k, seed = self.temperature, self.top_k, self.seed
        check_option(is_number(temperature) and 0 < temperature < math.inf, "temperature", "a number > 0", temperature)
        check_option(is_number(top_k, int) and top_k >= 0, "top_k", "a whole number >= 0", top_k)
        # below 2**62: room to add a chunk number to the seed
        check_option(is_number(seed, int) and 0 <= seed < 2**62, "seed", "a whole number >= 0 and < 2**62", seed)
        return self


OPTION_BOUNDS: dict[str, tuple[float, float]] = {
    "beam_size": (1, 1000),
    "n_best": (1, 1000),
    "max_len": (1, 10_000),
    "batch_tokens": (1, math.inf),  # a memory budget, not a cost: sys.maxsize means "by sentences" (peer.py)
    "length_penalty": (0.0, 10.0),  # GNMT alpha; useful values lie in 0-2, and alpha = 10 already ranks by length
    "max_len_ratio": (0.0, 100.0),
}
"""The range of each search option, inclusive: the one place translate.py, serve.py and Python users
are checked against (a server narrows ``beam_size`` further with its own ``max_beam_size``)."""


def is_number(value: Any, kind: type | tuple[type, ...] = (int, float)) -> bool:
    """An int or float (an int with ``kind=int``), not a bool, which Python counts as an int."""
    return isinstance(value, kind) and not isinstance(value, bool)


def check_option(ok: bool, name: str, wanted: str, value: Any) -> None:
    """Unless ``ok``, a TranslationError: ``{name} must be {wanted}, got {value}``, the value's ``repr`` in at most
    40 characters (a request may send anything)."""
    if not ok:
        text = repr(value) if isinstance(value, (bool, int, float, str, type(None))) else f"a {type(value).__name__}"
        raise TranslationError(f"{name} must be {wanted}, got {text if len(text) <= 40 else text[:37] + '...'}")


@dataclass
class EngineSettings(SearchOptions):
    """What translate.py and serve.py load a Translator with: the search options plus these.

    Attributes:
        checkpoint: a run dir (its checkpoints/best.pt, else last.pt), a .pt file, or a list (an ensemble).
        device: ``auto`` (CUDA when available) | ``cpu`` | ``cuda`` | ``cuda:N``.
        precision: ``auto`` (bf16 autocast on CUDA, float32 on the CPU) | ``bf16`` | ``fp32`` | ``int8``
            (dynamic int8 linear layers, CPU only).
        max_input_words: longer input lines are cut to this many words (one warning); ``auto`` = the
            training config's ``data.clean.max_len``; None = no limit.
        cuda_graphs: ``auto`` (on a GPU, greedy and beam search replay a captured decoder step:
            ``nmt.model.graph_search``) | ``true`` (the same, and an error off a GPU) | ``false``.
        cuda_graphs_check: with graphs, each new bucket's first batch is decoded by the plain search too and
            compared (tokens equal in fp32; under bf16 at most 10% of hypotheses may differ); a mismatch warns
            once and the plain search serves from then on.
    """

    checkpoint: Any = MISSING
    device: str = "auto"
    precision: str = "auto"
    max_input_words: Any = "auto"
    cuda_graphs: Any = "auto"  # the command line's true / false arrive as booleans
    cuda_graphs_check: bool = True


class NbestReranker(Protocol):
    """What ``Translator.translate(..., rerank=...)`` takes: ``nmt.inference.rerank.Rerank``."""

    n_best: int

    def checked(self, beam_size: int) -> NbestReranker: ...

    def rerank(self, sources: Sequence[str], nbest: list[list[Hypothesis]], texts: list[list[str]]
               ) -> list[list[Hypothesis]]: ...


@dataclass
class Candidate:
    """One entry of an n-best list: detokenized text and its search score."""

    text: str
    score: float


@dataclass
class WordAttention:
    """The attention of a 1-best translation, in words.

    Attributes:
        source: the source words, then ``</s>`` (the end-of-sentence column the model can attend to).
        target: the words of the translation.
        weights: ``[len(target)][len(source)]``: row j is where target word j looked (the mean of its
            subwords' rows; a source word's column sums its subwords' weights), so each row sums to 1.
        alignment: Pharaoh ``i-j`` pairs (source word i, target word j, 0-based, ``</s>`` left out):
            each target word linked to the source word it attended to most.
    """

    source: list[str]
    target: list[str]
    weights: list[list[float]]
    alignment: str


@dataclass
class Translation:
    """The result for one input sentence.

    Attributes:
        text: the best translation, detokenized ("" for an empty input).
        score: its search score (log-probability, length-normalised under beam search; with ``rerank``,
            the reranked score).
        nbest: up to ``n_best`` candidates, best first (the first is ``text``).
        attention: word attention of the best translation, when asked for and the model attends.
        src_ids: the source subword ids the model read (no EOS; [] for an empty input).
        hypotheses: the raw hypotheses (subword ids; subword attention ``[T, S]`` when attention was
            asked for, else None), best first.
    """

    text: str
    score: float
    nbest: list[Candidate]
    attention: WordAttention | None = None
    src_ids: list[int] = field(default_factory=list, repr=False)
    hypotheses: list[Hypothesis] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"text", "score", "nbest": [{"text", "score"}], "attention": {...} | None}``."""
        return {"text": self.text, "score": self.score, "nbest": [asdict(c) for c in self.nbest],
                "attention": asdict(self.attention) if self.attention is not None else None}


class Translator:
    """One or more trained models with their tokenizer, ready to translate. Not thread-safe: call it from one
    thread at a time.

    Args:
        models: the model, or an ensemble's members (same tokenizer and language pair), in eval mode and on
            one device; the Translator does not change their mode or device.
        precision: ``auto``, ``bf16``, ``fp32`` or ``int8`` (CPU decoding with int8 copies of the linear layers).
        max_input_words: longer input lines are cut to this many words (one warning); None = no limit.
        configs: the models' resolved training configs (for ``info``), if known.
        checkpoints: the checkpoint files the models came from, if any.
        cuda_graphs: ``auto``, ``true`` or ``false``: greedy and beam search from CUDA graphs (``EngineSettings``).
        cuda_graphs_check: check each new bucket's first replay against the plain search (``EngineSettings``).
        search_defaults: the search options ``translate`` starts from (a Hub folder's exported ones); None: the
            ``SearchOptions`` defaults.
    """

    def __init__(self, models: Seq2Seq | Sequence[Seq2Seq], tokenizer: Tokenizer, *, precision: str = "auto",
                 max_input_words: int | None = None, configs: Sequence[dict[str, Any]] = (),
                 checkpoints: Sequence[Path] = (), cuda_graphs: str | bool = "auto",
                 cuda_graphs_check: bool = EngineSettings.cuda_graphs_check,
                 search_defaults: SearchOptions | None = None) -> None:
        self.models = [models] if isinstance(models, Seq2Seq) else list(models)
        self.device = next(self.models[0].parameters()).device
        self.precision = _checked_device(self.device, precision)[1]
        if self.precision == "int8":
            self.models = [quantize_int8(model) for model in self.models]  # copies: the caller's stay float32
        with autocast(self.precision, self.device):  # the gate tables in the dtype the search will use
            self.searched = [SearchModel(model) for model in self.models]
        self.model: SearchModel | Ensemble = self.searched[0] if len(self.searched) == 1 else Ensemble(self.searched)
        self.cuda_graphs = str(cuda_graphs).lower()
        try:
            graphs = resolve_cuda_graphs(cuda_graphs, self.device).search
        except CudaGraphError as error:
            raise TranslationError(str(error)) from None
        # the searcher, chosen once: the rows compacted (plain), or kept in captured buckets (graphs); the graph
        # search is imported only where it serves (a CPU's Translator loads none of it)
        self.graph_search: SearchGraphs | None = None
        if graphs:
            from nmt.model.graph_search import SearchGraphs

            self.graph_search = SearchGraphs(self.model, self.device, self.precision, cuda_graphs_check)
        self.searcher: Search = self.graph_search or Search(self.model)
        self.tokenizer = tokenizer
        self.max_input_words = max_input_words
        self.configs = list(configs)
        self.checkpoints = list(checkpoints)
        self.search_defaults = (search_defaults or SearchOptions()).checked()
        self.search_calls = 0  # one per decoded batch: lets a server show how well it batches

    def refresh(self) -> None:
        """Take up new weights of the same models (changed in place, as training does): their gate tables again."""
        with torch.no_grad(), autocast(self.precision, self.device):
            for model in self.searched:
                model.refresh()

    @classmethod
    def from_checkpoint(cls, path: str | Path | Sequence[str | Path], device: str | torch.device = "auto",
                        precision: str = "auto", max_input_words: int | str | None = "auto",
                        cuda_graphs: str | bool = "auto",
                        cuda_graphs_check: bool = EngineSettings.cuda_graphs_check) -> Translator:
        """Load a run dir or ``.pt`` file, or a list of them (an ensemble).

        Args:
            path: a run dir (its ``checkpoints/best.pt``, else ``last.pt``), a checkpoint file, or a list.
            device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
            precision: ``auto``, ``bf16``, ``fp32`` or ``int8`` (CPU only).
            max_input_words: ``auto`` = the training config's ``data.clean.max_len``; a number; None.
            cuda_graphs: ``auto``, ``true`` or ``false`` (``EngineSettings``).
            cuda_graphs_check: check each new bucket's first replay (``EngineSettings``).

        Raises:
            CheckpointError: a missing or unreadable checkpoint.
            TranslationError: an empty list, members whose tokenizers or language pairs differ, or a bad
                device or precision.
        """
        paths = _plain(path)  # an OmegaConf list from a config, too
        paths = [str(p) for p in paths] if isinstance(paths, (list, tuple)) else [str(paths)]
        if not paths:
            raise TranslationError("no checkpoint given; pass a run dir or a .pt file written by train.py")
        device, precision = _checked_device(device, precision)
        if warning := slow_bf16_warning(precision, device):
            log.warning(warning)
        configure_matmul(precision, device)
        files = [resolve_checkpoint(p) for p in paths]
        models, tokenizers, configs = zip(*(load_for_inference(f, device=device) for f in files))
        _check_members(files, tokenizers, configs)
        return cls(models, tokenizers[0], precision=precision, configs=configs, checkpoints=files,
                   max_input_words=resolve_max_input_words(max_input_words, configs), cuda_graphs=cuda_graphs,
                   cuda_graphs_check=cuda_graphs_check, search_defaults=exported_search(files))

    @classmethod
    def from_pretrained(cls, name: str | Path, device: str | torch.device = "auto", precision: str = "auto",
                        max_input_words: int | str | None = "auto") -> Translator:
        """Load a Hub folder (``export.py format=hub``): a local folder, or a repo id such as ``user/model`` fetched by
        ``huggingface_hub.snapshot_download`` (``HF_HUB_OFFLINE=1``: the local cache only). Other arguments as
        ``from_checkpoint``.
        """
        folder = Path(name)
        if not folder.exists():
            from huggingface_hub import snapshot_download  # only this way of loading needs it
            from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError, RepositoryNotFoundError

            try:
                folder = Path(snapshot_download(str(name)))
            except (HFValidationError, LocalEntryNotFoundError, RepositoryNotFoundError, OSError) as error:
                first_line = (str(error).strip() or type(error).__name__).splitlines()[0]
                raise CheckpointError(f"{name} is neither a local folder nor a Hub repo that can be fetched "
                                      f"({first_line})") from None
        return cls.from_checkpoint(folder, device=device, precision=precision, max_input_words=max_input_words)

    @classmethod
    def from_settings(cls, settings: Any) -> Translator:
        """Load what ``EngineSettings`` (or a config with its keys: translate.py's, serve.py's) names."""
        if OmegaConf.is_missing(settings, "checkpoint") or not settings.checkpoint:
            raise TranslationError("no checkpoint given; pass checkpoint=PATH (a run dir or a .pt file from "
                                   "train.py), or checkpoint=[RUN_A,RUN_B] for an ensemble")
        return cls.from_checkpoint(settings.checkpoint, device=str(settings.device), precision=str(settings.precision),
                                   max_input_words=_plain(settings.max_input_words),
                                   cuda_graphs=getattr(settings, "cuda_graphs", "auto"),
                                   cuda_graphs_check=getattr(settings, "cuda_graphs_check",
                                                             EngineSettings.cuda_graphs_check))

    @property
    def graphs(self) -> SearchGraphs | None:
        """The graph search, when it is the searcher (its ``stats`` say what it did)."""
        return self.graph_search

    @property
    def has_attention(self) -> bool:
        return self.model.has_attention

    def encode(self, sentences: Sequence[str]) -> list[list[int]]:
        """Source subword ids (no EOS) of each sentence, stripped and cut to ``max_input_words`` as in training."""
        lines, cut = truncate_words([sentence.strip() for sentence in sentences], self.max_input_words)
        if cut:
            log.warning("%d line(s) longer than %d words were truncated to %d words (the model never saw longer "
                        "sentences in training; set max_input_words to change the limit)",
                        cut, self.max_input_words, self.max_input_words)
        return [self.tokenizer.encode_src(line) if line else [] for line in lines]

    def translate(
        self, sentences: Sequence[str], *, attention: bool = False, progress: bool = False,
        sampling: SamplingOptions | None = None, rerank: NbestReranker | None = None, **options: Any
    ) -> list[Translation]:
        """Translate sentences; one result per sentence, in input order.

        Args:
            sentences: source sentences (an empty one gives an empty translation).
            attention: also return each best translation's word attention and alignment.
            progress: show a tqdm bar on stderr.
            sampling: draw one sample per sentence with these options instead of searching (``n_best`` must be 1).
            rerank: rescore the n-best lists with a noisy channel (``nmt.inference.rerank.Rerank``): the search
                keeps ``max(n_best, rerank.n_best)`` candidates and returns ``n_best``, with the combined score.
            **options: ``SearchOptions`` fields; unset ones take ``search_defaults``'.

        Raises:
            TypeError: an unknown option (Python's own keyword check, by ``SearchOptions``).
            TranslationError: an option out of its range, or attention asked of a model without it.
        """
        search = replace(self.search_defaults, **options)  # checked on the way to the search (translate_ids)
        if attention and not self.has_attention:
            raise TranslationError(f"attention was asked for, but this model was trained with "
                                   f"attention={self.attention_name}, which has none")
        src_ids = self.encode(sentences)
        searched = search if rerank is None else replace(
            search, n_best=max(search.n_best, rerank.checked(search.beam_size).n_best))
        results = self.translate_ids(src_ids, searched, progress=progress, attention=attention, sampling=sampling)
        if rerank is not None:  # the non-empty sentences' n-best lists reranked, cut to n_best
            lines, _ = truncate_words([sentence.strip() for sentence in sentences], self.max_input_words)
            todo = [i for i, ids in enumerate(src_ids) if ids]
            texts = [[self.tokenizer.decode_tgt(h.tokens) for h in results[i]] for i in todo]
            for i, hyps in zip(todo, rerank.rerank([lines[i] for i in todo], [results[i] for i in todo], texts)):
                results[i] = hyps[:search.n_best]
        return [self._result(ids, nbest, attention) for ids, nbest in zip(src_ids, results)]

    def translate_ids(self, src_ids: Sequence[Sequence[int]], options: SearchOptions | None = None,
                      progress: bool = False, attention: bool = True, sampling: SamplingOptions | None = None
                      ) -> list[list[Hypothesis]]:
        """Decode encoded sentences (ids without EOS; an empty one gives one empty hypothesis) in length-sorted token
        batches; per sentence, up to ``n_best`` hypotheses (one when sampling), best first, in input order.
        ``attention`` keeps each hypothesis' subword attention (validation's heatmaps read it); when ``sampling``,
        one generator, seeded once, serves the batches in their deterministic order.
        """
        opts = (options or self.search_defaults).checked()
        generator = None
        if sampling is not None:
            if opts.n_best != 1:
                raise TranslationError(f"sampling draws one translation per sentence; n_best must be 1, "
                                       f"got {opts.n_best}")
            sampling = sampling.checked()
            generator = torch.Generator(device=self.device).manual_seed(sampling.seed)
        results: list[list[Hypothesis]] = [[Hypothesis([], 0.0, None)] for _ in src_ids]
        todo = [i for i, ids in enumerate(src_ids) if ids]
        lengths = [len(src_ids[i]) + 1 for i in todo]  # + EOS
        display = ProgressDisplay(len(src_ids), " sent", "translating", done=len(src_ids) - len(todo),
                                  bar=progress, enabled=progress)
        with autocast(self.precision, self.device):
            for batch in token_batches(lengths, resolve_batch_tokens(opts.batch_tokens, self.device)):
                rows = [todo[k] for k in batch]
                for i, nbest in zip(rows, self._search([src_ids[i] for i in rows], opts, attention, sampling,
                                                       generator)):
                    results[i] = nbest
                display.advance(len(rows))
        display.close()
        return results

    def _search(self, batch_ids: list[Sequence[int]], opts: SearchOptions, attention: bool,
                sampling: SamplingOptions | None, generator: torch.Generator | None) -> list[list[Hypothesis]]:
        """One search call on one padded batch: src ``[B, S]``."""
        lengths = [len(ids) + 1 for ids in batch_ids]
        padded = [[*ids, EOS_ID] + [PAD_ID] * (max(lengths) - 1 - len(ids)) for ids in batch_ids]
        src = torch.tensor(padded, dtype=torch.long).to(self.device)  # [B, S]
        src_lengths = torch.tensor(lengths, dtype=torch.long)  # [B]
        self.search_calls += 1
        if sampling is not None and self.cuda_graphs == "true":
            raise TranslationError("cuda_graphs=true: sampling has no graph search (greedy and beam search have); "
                                   "use cuda_graphs=auto")
        if sampling is not None:
            return [[h] for h in sample_search(self.model, src, src_lengths, opts.max_len, opts.max_len_ratio,
                                               sampling.temperature, sampling.top_k, generator,
                                               keep_attention=attention)]
        spec = SearchSpec(opts.beam_size, opts.length_penalty, opts.n_best, opts.max_len, opts.max_len_ratio,
                          keep_attention=attention)
        try:
            return self.searcher(src, src_lengths, spec)
        except CudaGraphError as error:  # a bucket over GPU memory
            raise TranslationError(str(error)) from None

    def _result(self, src_ids: list[int], nbest: list[Hypothesis], attention: bool) -> Translation:
        candidates = [Candidate(self.tokenizer.decode_tgt(h.tokens), h.score) for h in nbest]
        keeps_attention = attention and src_ids and nbest[0].attention is not None
        words = self.word_attention(src_ids, nbest[0]) if keeps_attention else None
        return Translation(candidates[0].text, candidates[0].score, candidates, words, list(src_ids), nbest)

    def word_attention(self, src_ids: Sequence[int], hypothesis: Hypothesis) -> WordAttention:
        """A hypothesis' subword attention ``[T, S]`` as words, with its Pharaoh alignment."""
        src_pieces = self.tokenizer.src_pieces(src_ids) + ["</s>"]  # the EOS column the model attended to
        tgt_pieces = self.tokenizer.tgt_pieces(hypothesis.tokens)
        weights, src_words, tgt_words = merge_subword_attention(hypothesis.attention, src_pieces, tgt_pieces)
        alignment = pharaoh_alignment(hypothesis.attention, src_pieces, tgt_pieces)
        return WordAttention(src_words, tgt_words, weights.round(5).tolist(), alignment)

    @property
    def attention_name(self) -> str:
        names = {(cfg.get("attention") or {}).get("name", "?") for cfg in self.configs} or {"?"}
        return "+".join(sorted(names))

    def info(self) -> dict[str, Any]:
        """What a client may want to know: attention type, languages, size, and the run's test BLEU if recorded."""
        data = (self.configs[0].get("data") or {}) if self.configs else {}
        results = recorded_results(self.checkpoints[0]) if len(self.checkpoints) == 1 else None  # not an ensemble's
        tests = {name: entry.get("bleu") for name, entry in (results or {"test": {}})["test"].items()
                 if isinstance(entry, dict)}
        bleu = {name: float(score) for name, score in tests.items() if isinstance(score, (int, float))} or None
        return {"attention": self.attention_name, "src_lang": data.get("src_lang"), "tgt_lang": data.get("tgt_lang"),
                "parameters": sum(count_parameters(model) for model in self.models), "models": len(self.models),
                "checkpoints": [str(path) for path in self.checkpoints], "bleu": bleu,  # {test set: BLEU} or None
                "device": str(self.device), "precision": self.precision}


def _plain(value: Any) -> Any:
    """Plain Python values from an OmegaConf node (a ListConfig of checkpoints, say); others unchanged."""
    return OmegaConf.to_object(value) if OmegaConf.is_config(value) else value


def resolve_max_input_words(value: Any, configs: Sequence[dict[str, Any]]) -> int | None:
    """The one resolver of ``max_input_words`` (translate.py, serve.py, backtranslate.py, Python): a number,
    None (no limit), or ``auto``: the largest training ``data.clean.max_len`` of the models' ``configs``.

    Raises:
        TranslationError: any other value.
    """
    if value == "auto":
        limits = [((cfg.get("data") or {}).get("clean") or {}).get("max_len") for cfg in configs]
        return max((n for n in limits if n is not None), default=None)
    check_option(value is None or (is_number(value, int) and value >= 1), "max_input_words",
                 "auto, null or a whole number >= 1", value)
    return value


def truncate_words(lines: Sequence[str], max_words: int | None) -> tuple[list[str], int]:
    """Lines cut to at most ``max_words`` whitespace words (None = no limit), and how many were cut."""
    cut = [max_words is not None and len(line.split()) > max_words for line in lines]
    return [" ".join(line.split()[:max_words]) if long else line for line, long in zip(lines, cut)], sum(cut)


def _checked_device(device: str | torch.device, precision: str) -> tuple[torch.device, str]:
    """The resolved device and ``precision`` if a model can decode in it there; else a TranslationError."""
    try:
        device = resolve_device(device)
        return device, check_inference_precision(precision, device)
    except DeviceError as error:
        raise TranslationError(str(error)) from None


def _check_members(files: list[Path], tokenizers: Sequence[Tokenizer], configs: Sequence[dict[str, Any]]) -> None:
    """Refuse an ensemble whose members would not read and write the same subwords and languages."""
    for path, tokenizer, config in zip(files[1:], tokenizers[1:], configs[1:]):
        if tokenizer.fingerprint != tokenizers[0].fingerprint:
            raise TranslationError(
                f"cannot ensemble {files[0]} and {path}: their SentencePiece models differ "
                f"({tokenizers[0].fingerprint[:12]} vs {tokenizer.fingerprint[:12]}); train the members on "
                "the same data and tokenizer settings")
        pair, first = _language_pair(config), _language_pair(configs[0])
        if pair != first:
            raise TranslationError(f"cannot ensemble {files[0]} ({first}) and {path} ({pair}): "
                                   "they translate different language pairs")


def _language_pair(config: dict[str, Any]) -> str:
    data = config.get("data") or {}
    return f"{data.get('src_lang', '?')}-{data.get('tgt_lang', '?')}"


def recorded_results(checkpoint: Path) -> dict[str, Any] | None:
    """The test scores recorded for ``checkpoint``'s run (its results.json; a Hub folder: what its config.json
    carried over), or None: ``{"test": {set: {"bleu", "chrf", signatures...}}, "beam_size", "length_penalty"}``.
    """
    hub = checkpoint.name == WEIGHTS_FILE
    path = checkpoint.parent / CONFIG_FILE if hub else checkpoint.parent.parent / "results.json"
    with contextlib.suppress(OSError, ValueError, AttributeError):  # missing, unreadable, or not an object
        results = json.loads(path.read_text(encoding="utf-8"))
        results = results.get("results") if hub else results
        if isinstance(results.get("test"), dict):
            return {key: results.get(key) for key in ("test", "beam_size", "length_penalty")}
    return None


EXPORTED_SEARCH = ("beam_size", "length_penalty", "max_len", "max_len_ratio")
"""The search options a Hub folder carries (config.json's ``search``): how its model was chosen to decode."""


def exported_search(checkpoints: Sequence[Path]) -> SearchOptions | None:
    """The search options a lone Hub folder was exported with, or None (a run, an ensemble, an older folder)."""
    if len(checkpoints) != 1 or checkpoints[0].name != WEIGHTS_FILE:
        return None
    config = checkpoints[0].parent / CONFIG_FILE
    saved = json.loads(config.read_text(encoding="utf-8")).get("search")  # readable: the folder just loaded
    if saved is None:
        return None
    try:
        return SearchOptions(**{key: saved[key] for key in EXPORTED_SEARCH if key in saved}).checked()
    except (TypeError, TranslationError) as error:
        raise CheckpointError(f"{config}: its search options are not valid ({error}); write the folder again "
                              "with export.py format=hub") from None


def search_over(defaults: SearchOptions, settings: Any, typed: Sequence[str] | None) -> SearchOptions:
    """translate.py's or serve.py's search options over a model's own ``defaults``: the options in ``typed`` (those
    given on the command line), or, with ``typed`` None (no command line: the caller built ``settings``), those
    whose value differs from ``SearchOptions``'s default."""
    given = asdict(SearchOptions.from_settings(settings))
    keep = set(typed) if typed is not None else {name for name, value in given.items()
                                                if value != getattr(SearchOptions, name)}
    return replace(defaults, **{name: value for name, value in given.items() if name in keep}).checked()


USER_ERRORS: tuple[type[Exception], ...] = (TranslationError, CheckpointError, DataError)
"""Errors the entry points report in one line without a traceback."""
