"""What a user watches during training: TensorBoard events (scalars, heatmaps, samples, hparams), the loss curve of
every step, progress, and the summary printed at the end.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from torch import Tensor
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams

from nmt.common.disk import WriteFailed
from nmt.common.files import write_text_durably
from nmt.common.progress import ProgressDisplay
from nmt.inference.plotting import attention_figure, release_figure_memory

log = logging.getLogger(__name__)


class RunLogger:
    """TensorBoard writer, ``train_log.jsonl`` and progress display (``total_steps`` planned, starting at
    ``initial_step`` when resumed). A disabled logger (DDP ranks other than 0) does nothing.
    """

    def __init__(self, run_dir: Path, total_steps: int, initial_step: int = 0, enabled: bool = True) -> None:
        self.writer = SummaryWriter(log_dir=str(run_dir)) if enabled else None
        self.steps_file = run_dir / "train_log.jsonl" if enabled else None
        # the trainer decides when a line is due (trainer.log_every), so every update may log
        self.display = ProgressDisplay(total_steps, " steps", done=initial_step, every_s=0, logger=log, enabled=enabled)

    def scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        """``values`` as ``prefix/name`` scalars at ``step``."""
        if self.writer is not None:
            for name, value in values.items():
                self.writer.add_scalar(f"{prefix}/{name}", value, step)

    def steps(self, records: list[dict[str, float]]) -> None:
        """``train_log.jsonl``'s lines of optimizer steps, ``{"step", "loss", "lr", "grad_norm"}`` each: the loss per
        target token, learning rate and gradient norm (resume tests compare the file byte for byte)."""
        if self.steps_file is None or not records:
            return
        try:
            with self.steps_file.open("a") as handle:
                handle.write("".join(json.dumps(record) + "\n" for record in records))
        except OSError as error:  # a failed write, not a bug: train.py's one line names the file
            raise WriteFailed(error.errno, error.strerror, str(self.steps_file)) from error

    def keep_steps_until(self, step: int) -> None:
        """Drop the lines after ``step`` (a resumed run's checkpoint): the cut-off run wrote them, then lost them."""
        if self.steps_file is None or not self.steps_file.exists():
            return
        kept = []
        for line in self.steps_file.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:  # a line torn by a crash or a power cut: the checkpoint says where the run stands
                continue
            if isinstance(record, dict) and record.get("step", step + 1) <= step:
                kept.append(line)
        write_text_durably(self.steps_file, "".join(line + "\n" for line in kept))

    def attention(self, tag: str, weights: Tensor, src_labels: list[str], tgt_labels: list[str], step: int) -> None:
        """A labelled heatmap of weights ``[T, S]`` (target rows x source columns)."""
        if self.writer is not None:
            self.writer.add_figure(tag, attention_figure(weights, src_labels, tgt_labels, title=f"step {step}"), step)
            release_figure_memory()  # a training runs for hours: keep no figure's memory meanwhile

    def text(self, tag: str, markdown: str, step: int) -> None:
        if self.writer is not None:
            self.writer.add_text(tag, markdown, step)

    def hparams(self, cfg: DictConfig, results: dict[str, Any]) -> None:
        """The run's settings with its final scores, in the same event file (TensorBoard's HParams tab)."""
        if self.writer is None:
            return
        params = {"attention": cfg.attention.name, **{f"model.{k}": v for k, v in cfg.model.items()},
                  "lr": cfg.trainer.lr, "max_tokens": cfg.data.max_tokens,
                  "label_smoothing": cfg.trainer.label_smoothing}
        metrics = {"hparam/val_bleu": results["valid"]["bleu"]}
        metrics.update({f"hparam/test_bleu_{name}": s["bleu"] for name, s in results["test"].items()})
        plain = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in params.items()}
        for summary in hparams(plain, metrics):
            self.writer.file_writer.add_summary(summary)
        for name, value in metrics.items():
            self.writer.add_scalar(name, value)

    def close(self) -> None:
        self.display.close()
        if self.writer is not None:
            self.writer.close()


def format_results(results: dict[str, Any], path: Path) -> str:
    """The summary printed at the end of training: scores with signatures, the clock, where results went."""
    lines = [f"results ({results['checkpoint']} checkpoint, step {results['checkpoint_step']}, "
             f"beam {results['beam_size']}):",
             f"  valid  BLEU {results['valid']['bleu']:.2f}  chrF {results['valid']['chrf']:.2f}"]
    for name, scores in results["test"].items():
        lines.append(f"  {name}  BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}")
        lines.append(f"    {scores['bleu_signature']}")
    if "averaged" in results:
        for name, scores in results["averaged"]["test"].items():
            lines.append(f"  {name} (averaged checkpoints)  BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}")
    lines.append(f"  training: {results['steps']} steps in {results['wall_seconds'] / 60:.1f} min wall clock "
                 f"({results['train_seconds'] / 60:.1f} min of them optimizer steps, the rest validation); "
                 f"final evaluation {results['final_evaluation_seconds']:.0f} s")
    if results["gpu_utilisation"]["available"]:
        lines.append(f"  GPU utilisation during training: median "
                     f"{results['gpu_utilisation']['utilisation_percent_median']:.0f}%")
    lines.append(f"  written to {path}")
    return "\n".join(lines)
