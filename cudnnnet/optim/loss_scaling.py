"""Dynamic loss scaling for ``math: fp16``, kept on the device.

IEEE half holds magnitudes from 6·10⁻⁸ (subnormal) to 65504: the small gradients of a network
rounded to half as GEMM and convolution operands would mostly vanish. So the loss gradient is
multiplied by a scale S (2¹⁶ to start): every gradient below it carries S, and the optimiser takes
grad/S. When S is too large some operand overflows to inf, the gradients turn inf or NaN and the
step is skipped; S halves. After ``growth_interval`` clean steps in a row S doubles, so it stays
near the largest value that does not overflow (as PyTorch's GradScaler does):

    dJ/dŷ = S·dJ/dŷ                                    cublasSscal, S read from device memory
    backward                                           every dW, db carries S
    found = any(dW, db is inf or NaN)                  find_nonfinite_gradients: one launch over
                                                       the flat gradient buffer (inf, NaN → 0)
    skip = found; u = 1/S; S = S/2 or, after N clean   update_loss_scale: one thread
      steps, 2·S
    W = W - lr·f(u·dW)  unless skip                    the optimiser (sgd_update_many, adam_update_many)
                                                       reads skip and u on the device

Everything is queued on the device (kernels/loss_scale.cu), inside the captured CUDA graph of a
training step: no step waits on the host. The host reads the scale and the skipped steps where it
synchronises anyway (the end of an epoch, the outputs). A skipped step leaves weights, velocities,
Adam's moments and its step count as they were; the schedule's step count still advances.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ..backends.arguments import LOSS_SCALE_VALUES
from ..errors import CheckpointError, InvalidArgumentError
from ..tensor import FLOAT32_TINY, Tensor

log = logging.getLogger(__name__)

SCALE, FOUND, SKIP, UNSCALE, CLEAN, SKIPPED = range(LOSS_SCALE_VALUES)  # the state's slots (loss_scale.cu)
STATE_NAME = "loss_scale"  # checkpoint array, after the optimiser prefix: [S, clean steps, skipped steps]

LOSS_SCALE_INITIAL = 65536.0  # 2^16, the loss scale a math: fp16 run starts from
LOSS_SCALE_GROWTH_INTERVAL = 2000  # clean steps after which the scale doubles
MAX_LOSS_SCALE = 2.0 ** 64  # the scale never grows past this, nor starts there
MIN_LOSS_SCALE = 2.0 ** -24  # nor halves below this (a NaN loss halves it at every step)
MAX_GROWTH_INTERVAL = 1 << 24  # the device counts clean steps in a float32, exact up to 2^24


@dataclass(frozen=True)
class LossScaleConfig:
    """``train.loss_scale`` of ``math: fp16`` (loss_scaling.py): ``dynamic`` (the defaults) or
    ``{initial, growth_interval}``. The scale halves at every step whose gradients overflow (that
    step is skipped) and doubles after ``growth_interval`` clean steps in a row."""

    initial: float = LOSS_SCALE_INITIAL
    growth_interval: int = LOSS_SCALE_GROWTH_INTERVAL

    def to_dict(self) -> dict | None:
        """None for the defaults (``dynamic``), else the mapping."""
        if self == LossScaleConfig():
            return None
        return {"initial": self.initial, "growth_interval": self.growth_interval}


@dataclass(frozen=True)
class LossScaleStatus:
    """What the host reads of the state: the scale of the next step and the steps skipped so far."""

    scale: float
    skipped_steps: int


class LossScaler:
    """The device state of dynamic loss scaling for one network's flat gradient buffer."""

    def __init__(self, backend, gradients: Tensor | None, initial: float = LOSS_SCALE_INITIAL,
                 growth_interval: int = LOSS_SCALE_GROWTH_INTERVAL):
        if not FLOAT32_TINY <= initial <= MAX_LOSS_SCALE:  # float32's normal numbers: 1/S is finite
            raise InvalidArgumentError(f"the initial loss scale must be in [2^-126, 2^64], got {initial!r}")
        if int(growth_interval) != growth_interval or growth_interval < 1:
            raise InvalidArgumentError(f"the loss scale's growth interval must be a whole number of steps >= 1, "
                                       f"got {growth_interval!r}")
        self.backend = backend
        self.gradients = gradients  # every gradient, one flat buffer (None: the network has no parameters)
        self.growth_interval = int(growth_interval)
        self.state = Tensor.zeros((LOSS_SCALE_VALUES,), backend)  # [S, found, skip, 1/S, clean, skipped]
        self.reset(initial)

    @classmethod
    def from_config(cls, backend, gradients: Tensor | None, config: LossScaleConfig) -> LossScaler:
        return cls(backend, gradients, config.initial, config.growth_interval)

    @property
    def scale(self) -> Tensor:
        """S as a one-element device tensor (the loss gradient's multiplier, read under graph replay)."""
        return self.state.view((1,), SCALE)

    def reset(self, scale: float, clean_steps: int = 0, skipped_steps: int = 0) -> None:
        """Start from ``scale``, nothing found or skipped this step."""
        values = np.zeros(LOSS_SCALE_VALUES, np.float32)
        values[[SCALE, UNSCALE, CLEAN, SKIPPED]] = scale, np.float32(1) / np.float32(scale), clean_steps, skipped_steps
        self.state.write_(values)

    def check(self) -> None:
        """After the backward pass (and any all-reduce), before the optimiser: find an overflow, decide
        this step's skip and the next step's scale (two launches, no synchronisation)."""
        if self.gradients is not None:
            self.backend.find_nonfinite_gradients(self.gradients, self.state)
        self.backend.update_loss_scale(self.state, self.growth_interval, MIN_LOSS_SCALE, MAX_LOSS_SCALE)

    def read(self) -> LossScaleStatus:
        """The scale and the skipped steps (reads the device: call where the host synchronises anyway)."""
        values = self.state.numpy().reshape(-1)
        return LossScaleStatus(float(values[SCALE]), int(values[SKIPPED]))

    # ---- state for checkpoints -----------------------------------------------------------------
    def state_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        values = self.state.numpy().reshape(-1)
        return {f"{prefix}{STATE_NAME}": values[[SCALE, CLEAN, SKIPPED]].copy()}

    def load_state_arrays(self, arrays: dict, prefix: str) -> bool:
        """Continue from a checkpoint's scale, clean steps and skipped steps; False (nothing changed)
        where it holds none (a run saved in another precision)."""
        saved = arrays.get(f"{prefix}{STATE_NAME}")
        if saved is None:
            return False
        scale, clean, skipped = (float(value) for value in np.asarray(saved, np.float64).reshape(-1))
        if not (FLOAT32_TINY <= scale <= MAX_LOSS_SCALE and clean >= 0 and skipped >= 0):
            raise CheckpointError(f"the checkpoint's loss scale state {[scale, clean, skipped]} is invalid (the scale "
                                  f"must be in [2^-126, 2^64], the step counts >= 0)")
        self.reset(scale, int(clean), int(skipped))
        return True
