"""Checkpoints: one explicit dict of tensors and plain values (fields: docs/reference/run-files.md), written
atomically and loaded with ``torch.load(weights_only=True)``, so opening one never runs code.
"""

from __future__ import annotations

import pickle
import shutil
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from nmt.common.disk import existing_folder, format_size
from nmt.common.files import write_durably
from nmt.common.version import __version__
from nmt.data import Tokenizer
from nmt.model.hub_folder import CONFIG_FILE, WEIGHTS_FILE, HubFolderError, is_hub_folder, read_hub_folder
from nmt.model.seq2seq import Seq2Seq

CHECKPOINT_FORMAT = 1
CHECKPOINT_DIR = "checkpoints"


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, of another format version, or that does not fit this run."""


def _bytes_to_tensors(state: dict[str, Any]) -> dict[str, Any]:
    return {k: torch.tensor(list(v), dtype=torch.uint8) if isinstance(v, bytes) else v
            for k, v in state.items()}


def _tensors_to_bytes(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v.numpy().tobytes() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` (plus format and version stamps) to ``path`` atomically and durably (temp file, fsync,
    rename): a crash, a full disk or a power cut leaves the previous checkpoint, never a half-written one.
    """
    state = {"format_version": CHECKPOINT_FORMAT, "nmt_version": __version__, **state}
    if "tokenizer" in state:
        state["tokenizer"] = _bytes_to_tensors(state["tokenizer"])
    return write_durably(path, lambda handle: torch.save(state, handle))


def detached_copy(state: Any) -> Any:
    """``state`` with every tensor copied to the CPU (dicts, lists and tuples rebuilt): a snapshot that training,
    going on in place, cannot change while a background thread writes it."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {key: detached_copy(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(detached_copy(value) for value in state)
    return state


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file, a run dir (its ``checkpoints/best.pt``, else ``checkpoints/last.pt``), or a Hub
    folder (its ``model.safetensors``; ``nmt.model.hub_folder``)."""
    path = Path(path)
    if path.is_dir():
        if is_hub_folder(path):
            return path / WEIGHTS_FILE
        if (path / CONFIG_FILE).is_file() and not (path / CHECKPOINT_DIR).is_dir():  # a Hub folder, incomplete
            raise CheckpointError(f"{path / WEIGHTS_FILE} is missing: {path} holds a model's {CONFIG_FILE} but not its "
                                  "weights; copy the whole folder again, or write it with export.py format=hub")
        for candidate in (path / CHECKPOINT_DIR / "best.pt", path / CHECKPOINT_DIR / "last.pt"):
            if candidate.is_file():
                return candidate
        raise CheckpointError(f"{path} is a directory without {CHECKPOINT_DIR}/best.pt or {CHECKPOINT_DIR}/last.pt; "
                              "pass a run dir written by train.py or a checkpoint file")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist; pass a run dir or a .pt file written by train.py")
    return path


def _read_weights_only(path: Path) -> Any:
    """``torch.load`` that never unpickles code, with our own one-line refusals (torch's advises loading unsafely)."""
    fix = "point checkpoint= at a run dir or a .pt file written by train.py"
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"cannot read checkpoint {path}: it is not the zip archive torch.save writes "
                              f"(a truncated copy, or another kind of file); {fix}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(f"cannot read checkpoint {path}: it holds Python objects besides tensors and plain "
                              f"values, so train.py did not write it, and it is not loaded; {fix}") from None
    except Exception as error:  # a damaged archive: torch's first line says where
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"cannot read checkpoint {path}: {reason}; {fix}") from None


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint dict on the CPU, refusing anything that is not this project's format."""
    path = resolve_checkpoint(path)
    if path.name == WEIGHTS_FILE:
        try:
            return {"format_version": CHECKPOINT_FORMAT, **read_hub_folder(path.parent)}
        except HubFolderError as error:
            raise CheckpointError(str(error)) from None
    state = _read_weights_only(path)
    if not isinstance(state, dict) or "format_version" not in state:
        raise CheckpointError(f"{path} is not a checkpoint written by this project's train.py")
    if state["format_version"] != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} has checkpoint format {state['format_version']} (written by nmt "
                              f"{state.get('nmt_version', '?')}); this nmt {__version__} reads format "
                              f"{CHECKPOINT_FORMAT}")
    if "tokenizer" in state:
        state["tokenizer"] = _tensors_to_bytes(state["tokenizer"])
    return state


def upgrade_saved_config(config: dict[str, Any]) -> dict[str, Any]:
    """A config saved by an earlier nmt, with renamed keys brought up to date (for resuming its run).

    ``trainer.amp`` (true: bf16 autocast on CUDA) became ``trainer.precision`` (``auto`` does the same);
    ``model.output_hidden_size`` and ``model.layer_norm`` came later (null and false: what earlier models were);
    ``trainer.max_len`` and ``trainer.max_len_ratio`` went: every search takes ``SearchOptions``' limits.
    """
    trainer = dict(config.get("trainer") or {})
    if "amp" in trainer:
        trainer.setdefault("precision", "auto" if trainer.pop("amp") else "fp32")
    for gone in ("max_len", "max_len_ratio"):
        trainer.pop(gone, None)
    if "trainer" in config:
        config = {**config, "trainer": trainer}
    if "model" in config:
        config = {**config, "model": {"output_hidden_size": None, "layer_norm": False, **config["model"]}}
    return config


def build_model(config: Mapping[str, Any], tokenizer: Tokenizer) -> Seq2Seq:
    """The model described by a training config (a dict or the run's DictConfig, from any nmt version), sized
    for ``tokenizer``'s vocabularies."""
    config = upgrade_saved_config(dict(config))
    return Seq2Seq.from_config(config["model"], config["attention"], tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)


def load_for_inference(path: str | Path, device: str | torch.device = "cpu"
                       ) -> tuple[Seq2Seq, Tokenizer, dict[str, Any]]:
    """The model of a checkpoint file or run dir, in eval mode on ``device``; its tokenizer; its resolved
    training config (a plain dict)."""
    state = load_checkpoint(path)
    tokenizer = Tokenizer.from_state(state["tokenizer"])
    model = build_model(state["config"], tokenizer)
    model.load_state_dict(state["model"])
    return model.to(device).eval(), tokenizer, state["config"]


class RunCheckpoints:
    """A run's ``checkpoints/`` folder, keeping the last ``average_last`` validation checkpoints' weights for
    averaging (<= 1: none). A disabled one (DDP ranks other than 0) writes nothing.
    """

    def __init__(self, run_dir: Path, average_last: int = 0, enabled: bool = True) -> None:
        self.folder = run_dir / CHECKPOINT_DIR
        self.average_last = average_last
        self.enabled = enabled

    def save(self, names: tuple[str, ...], state: dict[str, Any]) -> None:
        """Write ``state`` as ``<name>.pt`` for each name, ``best`` first: ``last.pt`` records the best step, and a
        crash between the two files must not leave it naming a best that ``best.pt`` does not hold.
        """
        if self.enabled:
            for name in sorted(names, key=lambda name: name != "best"):
                save_checkpoint(self.folder / f"{name}.pt", state)

    def save_validation(self, step: int, state: dict[str, Any], best: bool) -> None:
        """Write a validation's checkpoints from ``state`` in an order that a kill at any point resumes from to the
        same kept files: the averaging copy ``val_step<step>.pt`` (weights, config, tokenizer), ``best.pt`` (at a
        new ``best``), then ``last.pt``, where a run resumes; only then does the oldest averaging copy go. Killed
        before ``last.pt`` is written, the resumed run comes back to this validation and writes the same files
        again; killed after it, every file of this validation is already on disk.
        """
        if not self.enabled:
            return
        if self.average_last > 1:
            weights = {key: state[key] for key in ("config", "tokenizer", "model")}
            save_checkpoint(self._averaging_path(step), weights)
        self.save(("best", "last") if best else ("last",), state)
        for old in self._averaging_paths()[: -self.average_last]:
            old.unlink()

    def drop_averaging_after(self, step: int) -> None:
        """Drop the averaging copies of validations after ``step``: a run resumed at ``step`` comes to them again."""
        if self.enabled:
            for path in self._averaging_paths():
                if path.name > self._averaging_path(step).name:
                    path.unlink()

    def _averaging_path(self, step: int) -> Path:
        return self.folder / f"val_step{step:08d}.pt"

    def _averaging_paths(self) -> list[Path]:
        """The averaging copies on disk, oldest first."""
        return sorted(self.folder.glob("val_step*.pt"))

    def averaged_weights(self) -> dict[str, torch.Tensor] | None:
        """The mean of the last ``average_last`` validation checkpoints' weights; None when averaging is off or
        fewer than 2 are kept. (A run killed before it dropped the oldest may hold one more.)"""
        paths = self._averaging_paths()[-self.average_last:] if self.average_last > 1 else []
        if len(paths) < 2:
            return None
        states = [load_checkpoint(p)["model"] for p in paths]
        return {k: sum(s[k].float() for s in states).div(len(states)).to(states[0][k].dtype) for k in states[0]}

    def load(self, name: str) -> dict[str, Any]:
        return load_checkpoint(self.folder / f"{name}.pt")

    def kept(self) -> str | None:
        """What the folder holds for a stopped run to go on from (``checkpoints/last.pt (step 300) and best.pt
        (step 150)``), read from the files themselves; None without a readable ``last.pt``."""
        steps = {}
        for name in ("last", "best"):
            try:
                steps[name] = self.load(name)["progress"]["step"]
            except (CheckpointError, KeyError):  # a best.pt from before progress was recorded: left unnamed
                continue
        if "last" not in steps:
            return None
        best = f" and best.pt (step {steps['best']})" if "best" in steps else ""
        return f"kept: {CHECKPOINT_DIR}/last.pt (step {steps['last']}, where the run resumes){best}"

    def space_warning(self, model: torch.nn.Module) -> str | None:
        """One line when the disk holding the folder has less free space than two checkpoints (``last``, ``best``)
        need; None when it has room. A resumed run's ``last.pt`` gives the size; a new run's is estimated from
        ``model``: weights and AdamW's two moments per parameter."""
        last = self.folder / "last.pt"
        size = last.stat().st_size if last.is_file() else 3 * sum(p.numel() * p.element_size()
                                                                   for p in model.parameters())
        free = shutil.disk_usage(existing_folder(self.folder)).free
        if not self.enabled or free >= 2 * size:
            return None
        return (f"only {format_size(free)} free for {self.folder}, and a checkpoint takes about {format_size(size)} "
                f"(last.pt and best.pt: {format_size(2 * size)}); training goes on, but stops at the first checkpoint "
                "that does not fit: free some space")
