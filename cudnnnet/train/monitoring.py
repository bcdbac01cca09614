"""The best checkpoint and early stopping: one figure of each epoch's row watched (``train.monitor``).

    train:
      monitor: validation_loss           # auto (the default): validation_loss, or test_loss without data.validation
      early_stopping: {patience: 3, min_delta: 0.001}

After each evaluated epoch the monitored figure is compared with the best so far (lower is better for
a loss, higher for an accuracy): a better one makes that epoch's weights the best, written as
``best.npz`` beside ``model.npz`` in every output set. Early stopping counts the epochs since the
figure last improved by more than ``min_delta`` (Keras's rule) and ends the run once that count
reaches ``patience``. Both states are kept in model.npz's metadata and best.npz, so ``--resume``
carries them on, the patience counter included.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from ..config.monitor import EarlyStoppingConfig
from ..errors import CheckpointError

log = logging.getLogger(__name__)

BEST_NAME = "best.npz"
STATE_KEY = "monitor"  # model.npz's metadata: this module's state


class Monitor:
    """The best epoch so far by one figure, its weights, and early stopping's count."""

    def __init__(self, metric: str, early_stopping: EarlyStoppingConfig | None):
        self.metric = metric
        self.early_stopping = early_stopping
        self.lower_is_better = metric.endswith("_loss")
        self.best: dict | None = None  # {"value", "epoch", "step"} of the best row
        self.best_arrays: dict | None = None  # its weights (host copies)
        self.reference: float | None = None  # early stopping's best: improved by more than min_delta
        self.wait = 0  # evaluated epochs since the reference last improved
        self.stopped_epoch: int | None = None

    def update(self, row: dict, state_dict) -> bool:
        """Take the epoch ``row`` (its weights from ``state_dict()`` where it is the best); returns whether
        it is the best so far. A non-finite figure is never the best."""
        value = row.get(self.metric)
        finite = isinstance(value, (int, float)) and math.isfinite(value)
        improved = finite and (self.best is None or self._better(value, self.best["value"], 0.0))
        if improved:
            self.best = {"value": float(value), "epoch": row["epoch"], "step": row["steps"]}
            self.best_arrays = state_dict()
        if self.early_stopping is not None:
            self._count(value if finite else None, row["epoch"])
        return improved

    def _better(self, value: float, than: float, margin: float) -> bool:
        return value < than - margin if self.lower_is_better else value > than + margin

    def _count(self, value: float | None, epoch: int) -> None:
        if value is not None and (self.reference is None or self._better(value, self.reference,
                                                                          self.early_stopping.min_delta)):
            self.reference, self.wait = value, 0
        else:
            self.wait += 1
        if self.wait >= self.early_stopping.patience and self.stopped_epoch is None:
            self.stopped_epoch = epoch
            log.info("early stopping after epoch %d: %s has not improved by more than %g for %d epochs (best %.4f "
                     "at epoch %d)", epoch, self.metric, self.early_stopping.min_delta, self.wait,
                     self.best["value"] if self.best else math.nan, self.best["epoch"] if self.best else 0)

    @property
    def should_stop(self) -> bool:
        return self.early_stopping is not None and self.wait >= self.early_stopping.patience

    # ---- what the outputs record ---------------------------------------------------------------
    def state(self) -> dict:
        """The state model.npz keeps for --resume."""
        return {"metric": self.metric, "best": self.best, "reference": self.reference, "wait": self.wait,
                "stopped_epoch": self.stopped_epoch}

    def metrics(self) -> dict:
        """metrics.json's record: the best epoch, and early stopping where it is on."""
        record = {"best": None if self.best is None else {"monitor": self.metric, **self.best, "checkpoint": BEST_NAME}}
        if self.early_stopping is not None:
            record["early_stopping"] = {**self.early_stopping.to_dict(), "monitor": self.metric, "wait": self.wait,
                                        "stopped": self.stopped_epoch is not None,
                                        "stopped_epoch": self.stopped_epoch}
        return record

    def save_best(self, path: Path, metadata: dict) -> None:
        """Write the best weights as a checkpoint ``path`` (``metadata``: the network's and its config)."""
        from ..io import checkpoint

        if self.best_arrays is not None:
            checkpoint.save_npz(path, self.best_arrays, {**metadata, "best": {"monitor": self.metric, **self.best}})

    # ---- resuming ------------------------------------------------------------------------------
    def restore(self, path: Path, metadata: dict, load_best) -> None:
        """The state a checkpoint ``path`` kept (none in one from before this module: a fresh start), and
        the best weights from the best.npz beside it where it holds that very epoch. ``load_best(best_path)``
        returns (arrays, metadata) of that file."""
        state = metadata.get(STATE_KEY)
        if state is None:
            return
        if not _is_state(state):
            raise CheckpointError(f"{path}: the monitor state in its metadata is malformed; it can be loaded but not "
                                  f"resumed")
        if state["metric"] != self.metric:
            log.warning("%s watched %s, this run watches %s: the best epoch and early stopping start afresh", path,
                        state["metric"], self.metric)
            return
        self.reference, self.wait, self.stopped_epoch = state["reference"], state["wait"], state["stopped_epoch"]
        self._restore_best(path, state["best"], load_best)

    def _restore_best(self, path: Path, best: dict | None, load_best) -> None:
        best_path = Path(path).resolve().parent / BEST_NAME
        if best is None:
            return
        if not best_path.is_file():
            log.warning("%s: no %s beside it; the best epoch is chosen afresh from here", path, BEST_NAME)
            return
        arrays, metadata = load_best(best_path)
        if metadata.get("best") != {"monitor": self.metric, **best}:
            log.warning("%s is not the best epoch %s records; the best epoch is chosen afresh from here", best_path,
                        path)
            return
        self.best, self.best_arrays = best, arrays


def _is_state(state) -> bool:
    number = (int, float)
    if not isinstance(state, dict) or not isinstance(state.get("metric"), str):
        return False
    best = state.get("best")
    best_ok = best is None or (isinstance(best, dict) and isinstance(best.get("value"), number)
                               and isinstance(best.get("epoch"), int) and isinstance(best.get("step"), int))
    return (best_ok and isinstance(state.get("wait"), int) and state["wait"] >= 0
            and (state.get("reference") is None or isinstance(state["reference"], number))
            and (state.get("stopped_epoch") is None or isinstance(state["stopped_epoch"], int)))
