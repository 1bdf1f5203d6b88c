"""What a user watches during training: TensorBoard events (scalars, heatmaps, samples, hparams) and progress."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from torch import Tensor
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams

from nmt.common.progress import ProgressDisplay
from nmt.inference.plotting import attention_figure

log = logging.getLogger(__name__)


class RunLogger:
    """TensorBoard writer plus progress display (``total_steps`` planned, starting at ``initial_step`` when
    resumed). A disabled logger (DDP ranks other than 0) does nothing.
    """

    def __init__(self, run_dir: Path, total_steps: int, initial_step: int = 0, enabled: bool = True) -> None:
        self.enabled = enabled
        self.writer = SummaryWriter(log_dir=str(run_dir)) if enabled else None
        # the trainer decides when a line is due (trainer.log_every), so every update may log
        self.display = ProgressDisplay(total_steps, " steps", done=initial_step, every_s=0, logger=log, enabled=enabled)

    def scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        """``values`` as ``prefix/name`` scalars at ``step``."""
        if self.writer is None:
            return
        for name, value in values.items():
            self.writer.add_scalar(f"{prefix}/{name}", value, step)

    def progress(self, step: int, line: str, postfix: dict[str, str]) -> None:
        """On a terminal, advance the bar to ``step`` showing ``postfix``; otherwise log ``line``."""
        self.display.move_to(step, line, postfix)

    def end_progress(self) -> None:
        """Close the bar (the loop is over): what follows, the final summary, is printed below it."""
        self.display.close()

    def message(self, text: str) -> None:
        """A log line that does not break the progress bar."""
        self.display.message(text)

    def attention(self, tag: str, weights: Tensor, src_labels: list[str], tgt_labels: list[str], step: int) -> None:
        """A labelled heatmap of weights ``[T, S]`` (target rows x source columns)."""
        if self.writer is None:
            return
        self.writer.add_figure(tag, attention_figure(weights, src_labels, tgt_labels, title=f"step {step}"), step)

    def text(self, tag: str, markdown: str, step: int) -> None:
        if self.writer is not None:
            self.writer.add_text(tag, markdown, step)

    def hparams(self, params: dict[str, Any], metrics: dict[str, float]) -> None:
        """Hyper-parameters with final metrics, in the same event file (TensorBoard's HParams tab)."""
        if self.writer is None:
            return
        plain = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in params.items()}
        for summary in hparams(plain, metrics):
            self.writer.file_writer.add_summary(summary)
        for name, value in metrics.items():
            self.writer.add_scalar(name, value)

    def close(self) -> None:
        self.end_progress()
        if self.writer is not None:
            self.writer.close()
