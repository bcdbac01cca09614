"""What the training loop watches besides its figures: the first non-finite loss (on the device), the
signals that stop a run, and the progress bar (tqdm, imported only where one is shown)."""

from __future__ import annotations

import logging
import signal

import numpy as np

from ..tensor import Tensor

log = logging.getLogger("cudnnnet.train.trainer")


class NonFiniteWatch:
    """The first step whose training loss was NaN or infinite, found on the device at every step
    (``record``, one tiny kernel, graph-safe) and read only where the host synchronises anyway.

    ``watch`` holds two int32 counts in float32 storage: [steps run, first non-finite step or 0].
    The step counter lives on the device so that a replayed CUDA graph counts too.
    """

    def __init__(self, backend):
        self.backend = backend
        self.watch = Tensor.zeros((2,), backend)  # int32 bits: [steps run, first non-finite step (0: none yet)]

    def start(self, step: int) -> None:
        """Count on from ``step`` (the steps already run), no non-finite step seen."""
        self.watch.write_(np.array([step, 0], np.int32).view(np.float32))

    def record(self, loss_sum: Tensor) -> None:
        """After a step that added its loss into ``loss_sum`` (this epoch's sum: non-finite from the
        first non-finite loss on): count the step and note it if ``loss_sum`` is not finite."""
        self.backend.record_nonfinite(self.watch, loss_sum)

    def first_step(self) -> int | None:
        """The first step whose loss was not finite, or None (reads the device)."""
        first = int(self.watch.numpy().reshape(-1).view(np.int32)[1])
        return first or None


class signals_to:
    """Within the block, SIGINT and SIGTERM ask the trainer to stop after the current step."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, trainer):
        self.trainer = trainer
        self.previous = {}

    def __enter__(self):
        for signum in self.SIGNALS:
            try:
                self.previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread: signals stay as they are
                pass
        return self

    def _handle(self, signum, frame):
        log.warning("%s received: stopping after this step", signal.Signals(signum).name)
        self.trainer.stop_signal = signum

    def __exit__(self, *exc):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        return False


class NoProgressBar:
    """What a quiet run shows: nothing (and tqdm is not imported)."""

    def update(self, steps: int) -> None:
        pass

    def set_postfix(self, **values) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(enabled: bool, total: int, initial: int, description: str):
    if not enabled:
        return NoProgressBar()
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=description, disable=not enabled, leave=False, unit="step",
                dynamic_ncols=True)
