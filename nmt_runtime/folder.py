"""An ONNX export folder (``python export.py``) opened with onnxruntime: its manifest and its members' graphs.

``ExportedModel`` runs the graphs as the search needs them: ``encode`` (encoder, then the attention's key
preparation, once per batch), ``step`` (every member's decoder step; an ensemble's log-probabilities
averaged and renormalised, as ``nmt.model.ensemble`` does) and, for one model of format 2, ``step_top``
(each row's best tokens, found by the step graph: the search then never reads the V log-probabilities).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

MANIFEST = "export.json"
FORMAT = "nmt-onnx"
FORMAT_VERSION = 2  # 2: the step graph also returns each row's top_k best tokens
READABLE_VERSIONS = (1, 2)  # a format-1 folder's search finds the best tokens in numpy
GRAPHS = ("encoder", "prepare", "step")


class ExportFolderError(ValueError):
    """A folder that is not a usable export, or a request it cannot serve: one line for the user."""


def read_manifest(folder: Path) -> dict[str, Any]:
    """``export.json`` of ``folder``, checked: format, version, and every file it names present."""
    if not folder.is_dir():
        raise ExportFolderError(f"{folder} is not a folder; pass a folder written by export.py")
    path = folder / MANIFEST
    if not path.is_file():
        raise ExportFolderError(f"{folder} is not an ONNX export (no {MANIFEST}); write one with "
                                f"python export.py checkpoint=RUN_DIR output={folder}")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ExportFolderError(f"cannot read {path}: {error}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ExportFolderError(f"{path} is not the manifest of an ONNX export (format {FORMAT!r})")
    if manifest.get("format_version") not in READABLE_VERSIONS:
        raise ExportFolderError(f"{folder} has export format {manifest.get('format_version')}; this runtime reads "
                                f"formats {' and '.join(map(str, READABLE_VERSIONS))}: export the model again")
    names = [manifest["tokenizer"]["source"], manifest["tokenizer"]["target"]]
    names += [member["graphs"][graph] for member in manifest["members"] for graph in GRAPHS]
    for name in names:
        if not (folder / name).is_file():
            raise ExportFolderError(f"{folder / name} is missing; copy the whole folder, or export it again")
    return manifest


@dataclass
class Memory:
    """Per member: ``enc_out [B, S, 2He]``, ``prepared_keys`` and ``src_mask [B, S]`` (the step graph's inputs)."""

    members: list[dict[str, np.ndarray]]

    def select(self, rows: np.ndarray) -> Memory:
        return Memory([{name: value[rows] for name, value in member.items()} for member in self.members])


@dataclass
class State:
    """Per member the decoder state ``[L, R, Hd]``."""

    members: list[np.ndarray]

    def select(self, rows: np.ndarray) -> State:
        return State([state[:, rows] for state in self.members])

    def repeat(self, k: int) -> State:
        return State([np.repeat(state, k, axis=1) for state in self.members])


class ExportedModel:
    """The members' graphs in onnxruntime sessions.

    Args:
        folder: the export folder.
        manifest: its ``export.json`` (``read_manifest``).
        threads: onnxruntime's intra-op threads; None = its default (all cores).
    """

    def __init__(self, folder: Path, manifest: dict[str, Any], threads: int | None = None) -> None:
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        self.members = []
        for member in manifest["members"]:
            sessions = {graph: _session(folder / member["graphs"][graph], options) for graph in GRAPHS}
            self.members.append((sessions, {i.name for i in sessions["step"].get_inputs()}))
        step_outputs = self.members[0][0]["step"].get_outputs()
        vocab = step_outputs[0].shape[1]
        # one model whose step graph has the TopK (format 2): the search reads each row's best tokens only
        self.graph_top_k = len(self.members) == 1 and isinstance(vocab, int) and \
            "top_tokens" in {output.name for output in step_outputs}
        self.vocab = vocab if isinstance(vocab, int) else None

    def encode(self, src: np.ndarray, src_lengths: np.ndarray) -> tuple[Memory, State]:
        """src ``[B, S]`` int64 (EOS-terminated, right-padded), src_lengths ``[B]`` -> memory and initial state."""
        src_mask = np.arange(src.shape[1])[None, :] < src_lengths[:, None]  # [B, S]
        memories, states = [], []
        for sessions, _ in self.members:
            enc_out, state = sessions["encoder"].run(None, {"src": src, "src_lengths": src_lengths})
            [prepared] = sessions["prepare"].run(None, {"enc_out": enc_out})
            memories.append({"enc_out": enc_out, "prepared_keys": prepared, "src_mask": src_mask})
            states.append(state)
        return Memory(memories), State(states)

    def step(self, prev_tokens: np.ndarray, state: State, memory: Memory) -> tuple[np.ndarray, State]:
        """prev_tokens ``[R]`` -> log-probabilities ``[R, V]`` (float32) and the new state; R = G * B rows."""
        log_probs, states = [], []
        for (sessions, inputs), member_state, member_memory in zip(self.members, state.members, memory.members):
            feeds = {"prev_tokens": prev_tokens, "state": member_state, "top_k": _NO_TOP_K, **member_memory}
            # a graph that does not read an input (attention=none: the keys; format 1: top_k) does not declare it
            member_log_probs, new_state = sessions["step"].run(["log_probs", "new_state"],
                                                               {k: v for k, v in feeds.items() if k in inputs})
            log_probs.append(member_log_probs)
            states.append(new_state)
        if len(log_probs) == 1:
            return log_probs[0], State(states)
        mean = np.mean(log_probs, axis=0, dtype=np.float32)  # [R, V]
        top = mean.max(axis=1, keepdims=True)
        return mean - (np.log(np.exp(mean - top).sum(axis=1, keepdims=True)) + top), State(states)

    def step_top(self, prev_tokens: np.ndarray, state: State, memory: Memory, k: int
                 ) -> tuple[np.ndarray, np.ndarray, State]:
        """One model's step (``graph_top_k`` only): each row's ``min(k, V)`` largest log-probabilities with PAD and
        BOS blocked, and their tokens, ``[R, C]`` each, largest first (equal values: the lower token first)."""
        sessions, inputs = self.members[0]
        feeds = {"prev_tokens": prev_tokens, "state": state.members[0],
                 "top_k": np.array([min(k, self.vocab)], dtype=np.int64), **memory.members[0]}
        values, tokens, new_state = sessions["step"].run(
            ["top_log_probs", "top_tokens", "new_state"], {name: v for name, v in feeds.items() if name in inputs})
        return values, tokens, State([new_state])


_NO_TOP_K = np.array([0], dtype=np.int64)  # top_k for a step whose log-probabilities are read in full: no TopK


def _session(path: Path, options: ort.SessionOptions) -> ort.InferenceSession:
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own types for a corrupt or foreign file
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ExportFolderError(f"cannot load {path}: {first}") from None
