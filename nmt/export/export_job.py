"""The export job behind ``export.py``: load a checkpoint (or an ensemble), write an ONNX folder or a Hub folder."""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.metadata
import importlib.util
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from nmt.common.batch_tokens import resolve_batch_tokens
from nmt.common.provenance import command_line, library_versions
from nmt.data.fetch import sha256_of
from nmt.export.hub import score_hub_folder, write_hub_folder_of
from nmt.export.onnx_folder import write_onnx_folder
from nmt.inference.engine import USER_ERRORS as ENGINE_USER_ERRORS
from nmt.inference.engine import SearchOptions, Translator, recorded_results
from nmt.model.hub_folder import WEIGHTS_FILE as HUB_WEIGHTS_FILE

log = logging.getLogger(__name__)

FORMATS = ("onnx", "hub")


class ExportError(ValueError):
    """A mistake in an export request (bad format, an output folder in the way): one line."""


@dataclass
class ExportSettings(SearchOptions):
    """What ``export.py`` takes; the search options are the defaults written into the folder (an ONNX folder's
    ``export.json``; a Hub folder's ``config.json`` keeps the beam size, length penalty and length limits).

    Attributes:
        checkpoint: a run dir, a ``.pt`` file, or a list of them (an ensemble; ONNX only).
        output: the folder to write; it must not exist yet, or be empty.
        format: ``onnx`` (graphs for ``nmt_runtime``) or ``hub`` (a Hugging Face Hub folder).
        int8: ONNX only: onnxruntime's dynamic int8 quantisation of every graph.
        half: Hub only: the weights stored in float16 (half the size; loaded back into float32).
        max_input_words: input lines are cut to this many words; ``auto`` = the training ``data.clean.max_len``.
        license: the Hub model card's license (a Hub license id: ``mit``, ``cc-by-4.0``, ``other``, ...).
        license_name, license_link: with ``license=other`` (and only then), the terms' short id and where to read
            them (a URL, or a file in the folder), as the Hub's card metadata asks.
        score: Hub only: translate the run's test splits with the written folder (its weights and search) and
            record those scores in its ``config.json`` and card, in place of the checkpoint's.
    """

    checkpoint: Any = MISSING
    output: str = MISSING
    format: str = "onnx"
    int8: bool = False
    half: bool = False
    max_input_words: Any = "auto"
    license: str = "unknown"
    license_name: Any = None
    license_link: Any = None
    score: bool = False


ConfigStore.instance().store(name="export_settings", node=ExportSettings)


def export_main(cfg: Any) -> Path:
    """Check the settings, load the model(s) on the CPU in float32, write the folder; returns its path."""
    for key in ("checkpoint", "output"):
        if OmegaConf.is_missing(cfg, key) or not cfg[key]:
            raise ExportError(f"no {key} given; pass checkpoint=RUN_DIR output=FOLDER")
    if cfg.format not in FORMATS:
        raise ExportError(f"format={cfg.format} is not valid; use one of {', '.join(FORMATS)}")
    if cfg.int8 and cfg.format != "onnx":
        raise ExportError("int8=true quantises ONNX graphs; use it with format=onnx")
    if cfg.half and cfg.format != "hub":
        raise ExportError("half=true stores a Hub folder's weights in float16; use it with format=hub")
    if cfg.score and cfg.format != "hub":
        raise ExportError("score=true scores a Hub folder as shipped; use it with format=hub")
    card_license = _card_license(cfg)
    missing = [name for name in ("onnx", "onnxruntime") if importlib.util.find_spec(name) is None]
    if cfg.format == "onnx" and missing:
        raise ExportError(f"format=onnx needs {' and '.join(missing)}: pip install -e '.[export]'")
    search = SearchOptions.from_settings(cfg)  # batch_tokens as the torch-free runtime, on the CPU, will use it
    search = dataclasses.replace(search, batch_tokens=resolve_batch_tokens(search.batch_tokens, torch.device("cpu")))
    output = Path(str(cfg.output))
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ExportError(f"output {output} exists and is not an empty folder; name a new folder")
    if cfg.format == "hub" and OmegaConf.is_list(cfg.checkpoint) and len(cfg.checkpoint) > 1:
        raise ExportError("a Hub folder holds one model; export the ensemble with format=onnx, or each member alone")
    translator = Translator.from_checkpoint(cfg.checkpoint, device="cpu", precision="fp32",
                                            max_input_words=cfg.max_input_words)
    partial = output.with_name(f".{output.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)  # what an interrupted export left
    partial.mkdir(parents=True)
    try:
        if cfg.format == "onnx":
            write_onnx_folder(translator, partial, search, provenance_record(translator), bool(cfg.int8))
        else:
            write_hub_folder_of(translator, partial, provenance_record(translator), card_license, bool(cfg.half),
                                search)
            if cfg.score:
                for split, scores in score_hub_folder(partial, card_license)["test"].items():
                    log.info("%s as shipped: BLEU %.2f, chrF %.2f", split, scores["bleu"], scores["chrf"])
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if output.exists():
        output.rmdir()  # empty, checked above
    partial.replace(output)  # the folder appears whole or not at all
    log.info("wrote %s (format=%s%s)", output, cfg.format, ", int8" if cfg.int8 else ", float16" if cfg.half else "")
    return output


def _card_license(cfg: Any) -> dict[str, str]:
    """The card's license metadata: ``license``, with ``license_name`` and ``license_link`` when it is ``other``."""
    given = {key: str(cfg[key]) for key in ("license_name", "license_link") if cfg[key]}
    if cfg.license == "other" and len(given) < 2:
        raise ExportError("license=other needs license_name=ID and license_link=URL (the terms' id and where to "
                          "read them), as the Hub's model card asks")
    if cfg.license != "other" and given:
        raise ExportError(f"{' and '.join(given)} name the terms of license=other; drop them, or pass license=other")
    return {"license": str(cfg.license), **given}


def provenance_record(translator: Translator) -> dict[str, Any]:
    """Where the exported models came from and what exported them: checkpoints with sha256 and recorded scores."""
    # a run's scores are its best.pt's
    sources = [{"checkpoint": str(path), "sha256": sha256_of(path),
                "results": recorded_results(path) if path.name in ("best.pt", HUB_WEIGHTS_FILE) else None}
               for path in translator.checkpoints]
    versions = {**library_versions(), **{name: _version(name) for name in ("onnx", "onnxruntime", "safetensors")}}
    date = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    return {"date": date, "command": command_line("export.py"), "sources": sources, "versions": versions}


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


USER_ERRORS: tuple[type[Exception], ...] = (*ENGINE_USER_ERRORS, ExportError)
"""Errors ``export.py`` reports in one line without a traceback."""
