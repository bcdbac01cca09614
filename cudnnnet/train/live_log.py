"""What a running training shows besides the progress bar: a log line every ``log_every`` steps where
no bar is drawn (stderr is not a terminal: CI, a cluster job's log), and an optional TensorBoard event
log (``--tensorboard DIR``) written through tensorboardX, the extra ``cudnnnet[tensorboard]``.

The TensorBoard log holds, at their global step: ``train/loss``, ``train/accuracy`` (the epoch's
running means), ``train/learning_rate``, ``train/images_per_second`` and, under math fp16,
``train/loss_scale`` every ``log_every`` steps; each epoch's ``epoch/train_loss``,
``epoch/train_accuracy``, ``epoch/validation_*`` (or ``epoch/test_*``) and ``epoch/learning_rate``;
with a validation set, ``test/loss`` and ``test/accuracy`` at the end.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from ..errors import UsageError

log = logging.getLogger(__name__)

EXTRA = "pip install 'cudnnnet[tensorboard]'"


def progress_line(step: int, total_steps: int, epoch: int, total_epochs: int, values: dict) -> str:
    """"step 200/938 (epoch 1/1): loss 0.3124 accuracy 0.9012 lr 0.05 12,345 img/s" (and the loss scale)."""
    text = (f"step {step}/{total_steps} (epoch {epoch}/{total_epochs}): loss {values['train/loss']:.4f} accuracy "
            f"{values['train/accuracy']:.4f} lr {values['train/learning_rate']:.4g} "
            f"{values['train/images_per_second']:,.0f} img/s")
    if "train/loss_scale" in values:
        text += f" loss scale {values['train/loss_scale']:g}"
    return text


def require_tensorboard(directory) -> None:
    """UsageError naming the extra where tensorboardX is not installed (checked before anything is read)."""
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        raise UsageError(f"--tensorboard {directory}: writing TensorBoard logs needs the tensorboard extra: "
                         f"{EXTRA}") from None


class TensorBoardLog:
    """An event file in ``directory`` (made where missing), scalars added by tag at a global step."""

    def __init__(self, directory):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise UsageError(f"--tensorboard {directory}: writing TensorBoard logs needs the tensorboard extra: "
                             f"{EXTRA}") from None
        self.directory = Path(directory)
        self.writer = SummaryWriter(logdir=str(self.directory))
        log.info("TensorBoard log in %s (tensorboard --logdir %s)", self.directory, self.directory)

    def scalars(self, step: int, values: dict) -> None:
        """Add each finite number of ``values`` ({tag: value}) at ``step``."""
        for tag, value in values.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        """Write what is buffered and close the file (a closed log takes no more scalars)."""
        self.writer.close()
