"""``train.monitor`` and ``train.early_stopping``: which figure of each epoch's row the best checkpoint
and early stopping watch, as the config reads them (the watching itself: train/monitoring.py).

    train:
      monitor: validation_loss           # auto (the default): validation_loss, or test_loss without data.validation
      early_stopping: {patience: 3, min_delta: 0.001}
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

AUTO = "auto"
MONITORS = (AUTO, "validation_loss", "validation_accuracy", "test_loss", "test_accuracy", "train_loss",
            "train_accuracy")


@dataclass(frozen=True)
class EarlyStoppingConfig:
    """``train.early_stopping``: stop after ``patience`` epochs without an improvement above ``min_delta``."""

    patience: int
    min_delta: float = 0.0

    def to_dict(self) -> dict:
        return {"patience": self.patience, "min_delta": self.min_delta}


def parse_monitor(train) -> str:
    """train.monitor from a config section (``config_section._Section``)."""
    return train.choice("monitor", MONITORS, AUTO)


def parse_early_stopping(train) -> EarlyStoppingConfig | None:
    """train.early_stopping: absent, null or false (off), or {patience: integer >= 1, min_delta: number >= 0}."""
    value = train.value.get("early_stopping")
    if value is None or value is False:
        return None
    if not isinstance(value, dict):
        train.fail("early_stopping", f"expected false or a mapping {{patience: P, min_delta: D}} (P an integer >= 1, "
                                     f"D a number >= 0), got {value!r}")
    section = train.section("early_stopping")
    section.only(("patience", "min_delta"), context="early_stopping")
    return EarlyStoppingConfig(patience=section.integer("patience", low=1),
                               min_delta=section.number("min_delta", 0.0, low=0.0))


def monitored(config) -> str:
    """The figure ``config`` (a Config) watches: its train.monitor, ``auto`` resolved."""
    if config.train.monitor != AUTO:
        return config.train.monitor
    return "validation_loss" if config.data.validation is not None else "test_loss"


def check_monitor(config) -> None:
    """ConfigError where train.monitor names a figure the epochs' rows do not hold: validation figures
    need data.validation, and with it the test set is evaluated once, at the end."""
    metric = config.train.monitor
    validating = config.data.validation is not None
    if metric.startswith("validation_") and not validating:
        raise ConfigError(f"{config.source}: train.monitor: {metric} needs data.validation (a fraction of the "
                          f"training set such as 0.1, or a file); without it monitor test_loss or test_accuracy")
    if metric.startswith("test_") and validating:
        raise ConfigError(f"{config.source}: train.monitor: with data.validation the test set is evaluated once, at "
                          f"the end; monitor validation_loss or validation_accuracy")
