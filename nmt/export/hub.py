"""A Hugging Face Hub folder of one model: the weights and tokenizer (``nmt.model.hub_folder``) and a model card,
and the folder's own test scores (``score_hub_folder``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nmt.common.files import write_json_durably, write_text_durably
from nmt.common.metrics import corpus_scores
from nmt.common.version import __version__
from nmt.data import DataError
from nmt.data.corpora import build_corpus
from nmt.data.text import STRICT_UTF8, iter_pairs
from nmt.export.model_card import model_card
from nmt.inference.engine import EXPORTED_SEARCH, SearchOptions, Translator
from nmt.model.hub_folder import CONFIG_FILE, write_hub_folder


def write_hub_folder_of(translator: Translator, folder: Path, provenance: dict[str, Any], card_license: dict[str, str],
                        half: bool = False, search: SearchOptions | None = None) -> Path:
    """Write ``translator``'s one model (float32, or float16 with ``half``) into ``folder``: ``model.safetensors``,
    ``config.json`` (with ``search``'s beam size, length penalty and length limits, which the folder then decodes
    with by default, and the training config less its ``data.mirror``), the SentencePiece model(s) and
    ``README.md``, the model card. Returns the card's path."""
    config = translator.configs[0]
    data = config.get("data") or {}
    if data.get("mirror"):  # a machine's corpus folder, not the model's (score_hub_folder reads $NMT_DATA_MIRROR)
        data = {**data, "mirror": None}
        config = {**config, "data": data}
    results = provenance["sources"][0]["results"]
    state = {"nmt_version": __version__, "config": config, "tokenizer": translator.tokenizer.to_state(),
             "model": translator.models[0].state_dict()}
    extra = {"src_lang": data.get("src_lang"), "tgt_lang": data.get("tgt_lang"),
             "attention": translator.attention_name, "results": results, "provenance": provenance,
             "search": {key: getattr(search or SearchOptions(), key) for key in EXPORTED_SEARCH}}
    write_hub_folder(folder, state, extra, half)
    card = model_card(config, results, card_license, translator.info()["parameters"], provenance, extra["search"])
    return write_text_durably(folder / "README.md", card)


def score_hub_folder(folder: Path, card_license: dict[str, str]) -> dict[str, Any]:
    """Translate the training config's test splits with ``folder`` as shipped (its weights, float16 included, and
    its search), score them with sacreBLEU, and make those the folder's results: ``config.json``'s ``results`` and
    the card's table (the checkpoint's own stay in its ``provenance``). Returns them, as ``recorded_results``.

    Raises:
        DataError: the config names no test split, or a split's files cannot be had (``data.mirror``, else
            ``$NMT_DATA_MIRROR``, else a download into ``data.cache_dir``, as training fetched them).
    """
    translator = Translator.from_pretrained(folder, device="cpu", precision="fp32")
    config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    data = config["training_config"].get("data") or {}
    if not data.get("test_splits") or not data.get("corpus"):
        raise DataError("score=true: the checkpoint's training config names no data.corpus and data.test_splits "
                        "to score; export it without score=true")
    corpus = build_corpus(data["corpus"], cache_dir=Path(data.get("cache_dir") or "data"), mirror=data.get("mirror"),
                          files=data.get("files"), settings=data)
    tests = {}
    for split in data["test_splits"]:
        files = corpus.split_files(split, data["src_lang"], data["tgt_lang"])
        sources, references = zip(*iter_pairs(split, *files, data.get("invalid_utf8") or STRICT_UTF8))
        tests[split] = corpus_scores([r.text for r in translator.translate(list(sources))], references)
    search = translator.search_defaults
    config["results"] = {"test": tests, "beam_size": search.beam_size, "length_penalty": search.length_penalty,
                         "scored_as_shipped": config["weights_dtype"]}  # by this folder itself, not its checkpoint
    write_json_durably(folder / CONFIG_FILE, config)
    card = model_card(config["training_config"], config["results"], card_license, translator.info()["parameters"],
                      config["provenance"], config["search"])
    write_text_durably(folder / "README.md", card)
    return config["results"]
