"""A Hugging Face Hub folder of one model: the weights and tokenizer (``nmt.model.hub_folder``) and a model card."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nmt.common.files import write_text_durably
from nmt.common.version import __version__
from nmt.export.model_card import model_card
from nmt.inference.engine import EXPORTED_SEARCH, SearchOptions, Translator
from nmt.model.hub_folder import write_hub_folder


def write_hub_folder_of(translator: Translator, folder: Path, provenance: dict[str, Any], license_id: str,
                        half: bool = False, search: SearchOptions | None = None) -> Path:
    """Write ``translator``'s one model (float32, or float16 with ``half``) into ``folder``: ``model.safetensors``,
    ``config.json`` (with ``search``'s beam size, length penalty and length limits, which the folder then decodes
    with by default), the SentencePiece model(s) and ``README.md``, the model card. Returns the card's path."""
    config = translator.configs[0]
    data = config.get("data") or {}
    results = provenance["sources"][0]["results"]
    state = {"nmt_version": __version__, "config": config, "tokenizer": translator.tokenizer.to_state(),
             "model": translator.models[0].state_dict()}
    extra = {"src_lang": data.get("src_lang"), "tgt_lang": data.get("tgt_lang"),
             "attention": translator.attention_name, "results": results, "provenance": provenance,
             "search": {key: getattr(search or SearchOptions(), key) for key in EXPORTED_SEARCH}}
    write_hub_folder(folder, state, extra, half)
    card = model_card(config, results, license_id, translator.info()["parameters"], provenance, extra["search"])
    return write_text_durably(folder / "README.md", card)
