"""The learning-rate schedules: each config's ``train.schedule`` (parsed by config.py) as the rate
at every step, for the optimisers (optim.py)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from math import isfinite

from ..errors import InvalidArgumentError

SCHEDULES = ("constant", "inverse", "step", "cosine")


@dataclass(frozen=True)
class ScheduleConfig:
    """constant; inverse: lr0 / (1 + decay·step); step: lr0 · gamma^(epoch // step_size);
    cosine: lr0 · ½(1 + cos(π·step / total_steps)), annealing to 0 over the run's planned steps.

    Any of them with ``warmup_steps`` = W > 0 is multiplied by (step + 1) / W for step < W: a
    linear warm-up from lr/W at the first step to the schedule's own rate at step W."""

    name: str = "constant"
    decay: float | None = None
    step_size: int | None = None
    gamma: float | None = None
    warmup_steps: int = 0

    def __post_init__(self):
        """Refuse (InvalidArgumentError) what no schedule computes from: config files are checked by
        ``parse_config`` first, this catches a ScheduleConfig made in Python."""
        if self.name not in SCHEDULES:
            raise InvalidArgumentError(f"unknown schedule {self.name!r}; valid are {', '.join(SCHEDULES)}")
        if not _whole(self.warmup_steps, 0):
            raise InvalidArgumentError(f"warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        if self.name == "inverse" and not _real_at_least(self.decay, 0.0):
            raise InvalidArgumentError(f"the inverse schedule needs decay, a finite number >= 0, got {self.decay!r}")
        if self.name == "step" and not (_whole(self.step_size, 1) and _real_at_least(self.gamma, 0.0)
                                        and 0 < self.gamma <= 1):
            raise InvalidArgumentError(f"the step schedule needs step_size, an integer >= 1, and gamma in (0, 1], got "
                                       f"{self.step_size!r} and {self.gamma!r}")

    def learning_rate(self, base_lr: float, step: int, epoch: int, total_steps: int | None = None) -> float:
        """The learning rate at global ``step`` (from 0) during ``epoch`` (from 0) of a run of ``total_steps``."""
        rate = self._scheduled_rate(base_lr, step, epoch, total_steps)
        if step < self.warmup_steps:
            rate *= (step + 1) / self.warmup_steps
        return rate

    def _scheduled_rate(self, base_lr: float, step: int, epoch: int, total_steps: int | None) -> float:
        """The schedule's rate before any warm-up."""
        if self.name == "cosine":
            if not total_steps:
                raise ValueError("the cosine schedule needs the run's total_steps")
            return base_lr * 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / total_steps))
        if self.name == "inverse":
            return base_lr / (1.0 + self.decay * step)
        if self.name == "step":
            return base_lr * self.gamma ** (epoch // self.step_size)
        return base_lr

    def to_dict(self) -> dict:
        """The keys a config file gives, those left unset (None, or no warm-up) out."""
        given = {"name": self.name, "decay": self.decay, "step_size": self.step_size, "gamma": self.gamma,
                 "warmup_steps": self.warmup_steps or None}
        return {key: value for key, value in given.items() if value is not None}


def _whole(value, least: int) -> bool:
    """Whether ``value`` is an integer (not a boolean) >= ``least``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= least


def _real_at_least(value, least: float) -> bool:
    """Whether ``value`` is a finite real number (not a boolean) >= ``least``."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        return isfinite(value) and value >= least
    except OverflowError:  # an integer beyond any float
        return False
