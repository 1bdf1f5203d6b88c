"""The ONNX model folder: ``export.json``, each member's ``encoder``, ``prepare`` and ``step`` graphs, and the
SentencePiece models, read by ``nmt_runtime`` with numpy, onnxruntime and SentencePiece only.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from nmt.common.files import write_json_durably
from nmt.export.onnx_graphs import OPSET, export_graphs
from nmt.inference.engine import SearchOptions, Translator
from nmt.model.ensemble import Ensemble
from nmt.model.seq2seq import SearchModel

MANIFEST = "export.json"
FORMAT = "nmt-onnx"
FORMAT_VERSION = 2  # 2: the step graph also returns each row's top_k best tokens (nmt_runtime reads 1 and 2)


def write_onnx_folder(translator: Translator, folder: Path, search: SearchOptions, provenance: dict[str, Any],
                      int8: bool) -> Path:
    """Write ``translator``'s models (float32, CPU) as an ONNX folder into the existing, empty ``folder``; returns
    the manifest's path.

    Args:
        search: the search defaults the runtime starts from.
        provenance: where the models came from (``export_job.provenance_record``).
        int8: replace each graph by onnxruntime's dynamic int8 quantisation of it.
    """
    members: list[SearchModel] = list(translator.model.members) if isinstance(translator.model, Ensemble) \
        else [translator.model]
    entries = []
    for index, (member, config) in enumerate(zip(members, translator.configs)):
        files = export_graphs(member, folder, prefix="" if len(members) == 1 else f"member{index}.")
        if int8:
            for name in files.values():
                quantize_int8(folder / name)
        entries.append({"graphs": files, "attention": (config.get("attention") or {}).get("name")})
    tokenizer_files = [path.name for path in translator.tokenizer.save(folder)]
    data = translator.configs[0].get("data") or {}
    return write_json_durably(folder / MANIFEST, {
        "format": FORMAT, "format_version": FORMAT_VERSION, "src_lang": data.get("src_lang"),
        "tgt_lang": data.get("tgt_lang"),
        "tokenizer": {"source": tokenizer_files[0], "target": tokenizer_files[-1],
                      "source_tags": list(translator.tokenizer.tags)},
        "max_input_words": translator.max_input_words, "search": asdict(search), "members": entries,
        "int8": int8, "opset": OPSET, "provenance": provenance})


def quantize_int8(path: Path) -> None:
    """Replace the graph at ``path`` by its dynamic int8 quantisation (int8 weights of MatMul and Gather,
    activations quantised per call), onnxruntime's CPU recipe for RNN-sized models."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantized = path.with_name(path.name + ".int8")
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # quantize_dynamic warns on the root logger to run its pre-processing first
    try:
        quantize_dynamic(path, quantized, weight_type=QuantType.QInt8)
    finally:
        root.setLevel(level)
    quantized.replace(path)
