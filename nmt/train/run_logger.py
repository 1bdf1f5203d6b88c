"""What a user watches during training: TensorBoard events and terminal progress.

``RunLogger`` writes one TensorBoard event stream in the run dir (``tensorboard --logdir outputs``):
scalars (``train/*``, ``val/*``), attention heatmaps (``attention/<i>``, source x target subwords),
sample translations (``samples``), and the hyper-parameters with the final metrics (HParams tab).
On a terminal it shows a tqdm progress bar; otherwise (logs, CI, nohup) plain periodic log lines.

Deliberately not here: deciding what to log or when (``nmt.train.trainer``), drawing (``nmt.inference.plotting``).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from torch import Tensor
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams
from tqdm import tqdm

from nmt.inference.plotting import attention_figure

log = logging.getLogger(__name__)


class RunLogger:
    """TensorBoard writer plus progress display. A disabled logger (non-zero DDP ranks) does nothing.

    Args:
        run_dir: where the event file goes.
        total_steps: planned optimizer steps, for the progress bar.
        initial_step: where a resumed run starts.
        enabled: False on every rank but 0.
    """

    def __init__(self, run_dir: Path, total_steps: int, initial_step: int = 0, enabled: bool = True) -> None:
        self.enabled = enabled
        self.writer = SummaryWriter(log_dir=str(run_dir)) if enabled else None
        self.bar = None
        if enabled and sys.stderr.isatty():
            self.bar = tqdm(total=total_steps, initial=initial_step, unit="step", dynamic_ncols=True)

    def scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        """``values`` as ``prefix/name`` scalars at ``step``."""
        if self.writer is None:
            return
        for name, value in values.items():
            self.writer.add_scalar(f"{prefix}/{name}", value, step)

    def progress(self, step: int, line: str, postfix: dict[str, str]) -> None:
        """On a terminal, advance the bar to ``step`` showing ``postfix``; otherwise log ``line``."""
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix(postfix, refresh=False)
        elif self.enabled:
            log.info(line)

    def end_progress(self) -> None:
        """Close the bar (the loop is over): what follows, the final summary, is printed below it."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def message(self, text: str) -> None:
        """A log line that does not break the progress bar."""
        if self.bar is not None:
            self.bar.write(text)
            log.debug(text)
        elif self.enabled:
            log.info(text)

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
