"""The Hugging Face Hub folder of a model: ``model.safetensors``, ``config.json`` and the SentencePiece files,
read back into the dict ``nmt.model.checkpoint.load_checkpoint`` returns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import load_file, save

from nmt.common.files import write_bytes_durably, write_json_durably
from nmt.data import DataError, Tokenizer

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
MODEL_TYPE = "nmt-gru-attention"  # config.json's model_type: what a Hub page and this loader look for
HUB_FORMAT = 1


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
    # safetensors refuses tensors that share memory: tied embeddings are written as two copies, and
    # load_state_dict puts both back into the one tied parameter.
    weights = {name: tensor.detach().clone().contiguous() for name, tensor in state["model"].items()}
    if half:
        weights = {name: t.half() if t.is_floating_point() else t for name, t in weights.items()}
    # through the one durable write, with the usual permissions (safetensors' save_file makes the file 0600)
    write_bytes_durably(folder / WEIGHTS_FILE, save(weights, metadata={"format": "pt"}))
    tokenizer = Tokenizer.from_state(state["tokenizer"])
    files = tokenizer.save(folder)
    config = {"model_type": MODEL_TYPE, "hub_format": HUB_FORMAT, "nmt_version": state.get("nmt_version"),
              "weights_dtype": "float16" if half else "float32", "tokenizer_files": [path.name for path in files],
              **extra_config, "training_config": state["config"]}
    write_json_durably(folder / CONFIG_FILE, config)
    return [folder / WEIGHTS_FILE, folder / CONFIG_FILE, *files]


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
    try:  # half-precision weights (export.py half=true) are computed with in float32, as trained
        weights = {name: tensor.float() if tensor.is_floating_point() else tensor
                   for name, tensor in load_file(str(folder / WEIGHTS_FILE)).items()}
    except (OSError, SafetensorError) as error:
        raise HubFolderError(f"cannot read the model in {folder / WEIGHTS_FILE}: {error} (a truncated or damaged "
                             "copy); copy the whole folder again, or write it with export.py format=hub") from None
    return {"nmt_version": config.get("nmt_version"), "config": config["training_config"],
            "tokenizer": tokenizer.to_state(), "model": weights}
