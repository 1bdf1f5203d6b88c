"""The Hugging Face Hub folder of a model: ``model.safetensors``, ``config.json`` and the SentencePiece files,
read back into the dict ``nmt.model.checkpoint.load_checkpoint`` returns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save

from nmt.common.files import write_bytes_durably, write_json_durably
from nmt.data import DataError, Tokenizer

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
MODEL_TYPE = "nmt-gru-attention"  # config.json's model_type: what a Hub page and this loader look for
HUB_FORMAT = 1
TIED = "tied"  # model.safetensors' metadata: {left-out name: the name whose tensor it shares}, as JSON


class HubFolderError(ValueError):
    """A Hub folder that is incomplete, unreadable or of another format version."""


def is_hub_folder(path: str | Path) -> bool:
    """True for a folder that holds ``model.safetensors`` and ``config.json``."""
    path = Path(path)
    return (path / WEIGHTS_FILE).is_file() and (path / CONFIG_FILE).is_file()


def write_hub_folder(folder: Path, state: dict[str, Any], extra_config: dict[str, Any],
                     half: bool = False) -> list[Path]:
    """Write a checkpoint dict's weights, config and tokenizer (as ``load_checkpoint`` returns it) into ``folder``
    (created); ``extra_config`` adds keys to ``config.json`` (languages, provenance); ``half``: the floating-point
    weights in float16 (half the size; read back into float32). Returns the files written.
    """
    folder.mkdir(parents=True, exist_ok=True)
    weights, twins = _once_each(state["model"])
    if half:
        weights = {name: t.half() if t.is_floating_point() else t for name, t in weights.items()}
    # through the one durable write, with the usual permissions (safetensors' save_file makes the file 0600)
    write_bytes_durably(folder / WEIGHTS_FILE, save(weights, metadata={"format": "pt", TIED: json.dumps(twins)}))
    tokenizer = Tokenizer.from_state(state["tokenizer"])
    files = tokenizer.save(folder)
    config = {"model_type": MODEL_TYPE, "hub_format": HUB_FORMAT, "nmt_version": state.get("nmt_version"),
              "weights_dtype": "float16" if half else "float32", "tokenizer_files": [path.name for path in files],
              **extra_config, "training_config": state["config"]}
    write_json_durably(folder / CONFIG_FILE, config)
    return [folder / WEIGHTS_FILE, folder / CONFIG_FILE, *files]


def _once_each(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A state dict's tensors, each stored once (safetensors refuses tensors that share memory, and a second copy
    of the tied embeddings is a fifth of the default model), and each left-out name with the name it shares."""
    weights: dict[str, torch.Tensor] = {}
    twins: dict[str, str] = {}
    first: dict[tuple[Any, ...], str] = {}
    for name, tensor in state.items():
        same = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())
        if tensor.numel() and same in first:
            twins[name] = first[same]
        else:
            first[same] = name
            weights[name] = tensor.detach().clone().contiguous()
    return weights, twins


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The weights in float32 (half-precision ones are computed with as trained), each tied name back in."""
    with safe_open(str(path), framework="pt") as handle:
        twins = json.loads((handle.metadata() or {}).get(TIED, "{}"))
    weights = {name: t.float() if t.is_floating_point() else t for name, t in load_file(str(path)).items()}
    return {**weights, **{name: weights[twin] for name, twin in twins.items()}}


def read_hub_folder(folder: str | Path) -> dict[str, Any]:
    """The checkpoint dict (``format_version`` left to the caller) of a Hub folder: config, tokenizer, model.

    Raises:
        HubFolderError: a missing or unreadable file, or a config of another model type or format.
    """
    folder = Path(folder)
    try:
        config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise HubFolderError(f"cannot read {folder / CONFIG_FILE}: {error}") from None
    if not isinstance(config, dict) or config.get("model_type") != MODEL_TYPE:
        raise HubFolderError(f"{folder / CONFIG_FILE} is not the config of an nmt model (model_type "
                             f"{MODEL_TYPE!r}); write the folder with export.py format=hub")
    if config.get("hub_format") != HUB_FORMAT:
        raise HubFolderError(f"{folder} has Hub folder format {config.get('hub_format')}; this nmt reads "
                             f"format {HUB_FORMAT}")
    try:
        tokenizer = Tokenizer.load(folder)
    except (OSError, DataError) as error:
        raise HubFolderError(f"cannot read the model's tokenizer in {folder}: {error}") from None
    try:
        weights = _read_weights(folder / WEIGHTS_FILE)
    except (OSError, SafetensorError, ValueError, KeyError) as error:
        raise HubFolderError(f"cannot read the model in {folder / WEIGHTS_FILE}: {error} (a truncated or damaged "
                             "copy); copy the whole folder again, or write it with export.py format=hub") from None
    return {"nmt_version": config.get("nmt_version"), "config": config["training_config"],
            "tokenizer": tokenizer.to_state(), "model": weights}
