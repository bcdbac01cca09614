"""A run's history: one row per evaluated epoch, kept in model.npz's metadata and written as history.csv.

Each row holds ``HISTORY_FIELDS``; a run with a validation set (``validation.py``) holds its epochs'
figures as ``validation_loss`` / ``validation_accuracy`` instead of the test set's.
"""

from __future__ import annotations

from pathlib import Path

from ..data.validation import TEST_FIELDS, VALIDATION_FIELDS
from ..errors import CheckpointError

HISTORY_FIELDS = ("epoch", "steps", "learning_rate", "train_loss", "train_accuracy", "test_loss", "test_accuracy",
                  "epoch_seconds")


def history_fields(validating: bool) -> tuple[str, ...]:
    """The columns of a run's rows: HISTORY_FIELDS, with the validation figures where ``validating``."""
    renamed = dict(zip(TEST_FIELDS, VALIDATION_FIELDS)) if validating else {}
    return tuple(renamed.get(key, key) for key in HISTORY_FIELDS)


def history_csv(rows: list[dict], validating: bool) -> str:
    """history.csv's text: a header of ``history_fields``, then a line per row."""
    fields = history_fields(validating)
    lines = [",".join(fields)] + [",".join(_csv_value(row[key]) for key in fields) for row in rows]
    return "\n".join(lines) + "\n"


def check_history(path: Path, history, validating: bool) -> None:
    """CheckpointError unless ``history`` (from the checkpoint ``path``) is a list of rows of this run's
    fields: one trained with(out) a validation set resumes with(out) one."""
    if isinstance(history, list) and all(is_history_row(row, history_fields(validating)) for row in history):
        return
    if isinstance(history, list) and all(is_history_row(row, history_fields(not validating)) for row in history):
        way = "without" if validating else "with"
        raise CheckpointError(f"{path} was trained {way} data.validation; resume it {way} the same data.validation")
    raise CheckpointError(f"{path}: the training history in its metadata is malformed (each row needs "
                          f"{', '.join(history_fields(validating))} as numbers); it can be loaded but not resumed")


def is_history_row(row, fields: tuple[str, ...] = HISTORY_FIELDS) -> bool:
    """A row as the trainer writes it: every key of ``fields``, a number each."""
    return isinstance(row, dict) and all(
        isinstance(row.get(key), (int, float)) and not isinstance(row.get(key), bool) for key in fields)


def _csv_value(value) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)
