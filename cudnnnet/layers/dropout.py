"""Dropout layer on cuDNN: in training, each value is kept with probability 1 - rate and scaled by
1/(1 - rate) (inverted dropout, so evaluation needs no rescaling); in evaluation, the identity.

    forward   y  = x ⊙ mask / (1 - rate),   mask ~ Bernoulli(1 - rate)     cudnnDropoutForward
    backward  dx = dy ⊙ mask / (1 - rate),  the forward's mask             cudnnDropoutBackward

The mask stream is seeded from the network's seed and the layer's position, so a run is
reproducible. On CUDA the random-number states live in a buffer that cudnnSetDropoutDescriptor
fills once and every cudnnDropoutForward advances, so each replay of a captured training step
draws a new mask; the mask is kept in a reserve space per batch shape for the backward pass.
The host draws its masks with a seeded NumPy generator (not cuDNN's stream). Under math bf16 or
fp16 in a network that stores 16 bits, x, y, dy and dx are 16-bit tensors, y and dx rounded once.

A resumed training run calls ``skip_masks`` with the batch sizes trained before the checkpoint:
the generator then draws, and drops, the masks those steps drew, so the run goes on with the masks
the uninterrupted run would have drawn.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable

from ..errors import InvalidArgumentError
from ..tensor import Tensor, float32_rounded
from .base import Layer

SEED_LIMIT = 2**63  # the layer's seed is drawn below this (cuDNN takes an unsigned 64-bit seed)


class Dropout(Layer):
    stores_16_bits = True  # x, y, dy and dx may be 16-bit: x·mask/(1 - rate) rounded once, the mask as it is

    def __init__(self, name: str, rate: float = 0.5):
        super().__init__(name)
        if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not 0 <= rate < 1:
            raise InvalidArgumentError(f"layer {name!r}: rate must be a number in [0, 1), got {rate!r}")
        if float32_rounded(rate) >= 1:
            raise InvalidArgumentError(f"layer {name!r}: rate must be a number in [0, 1), got {rate!r}, which float32 "
                                       f"(the device's arithmetic) rounds to 1")
        self.rate = float(rate)
        self.seed = None
        self.state = None  # the backend's dropout state: rate and random-number generator
        self.reserve = None  # the last forward's mask, per batch shape

    def config(self):
        return {"rate": self.rate}

    def init_parameters(self, rng):
        self.seed = int(rng.integers(SEED_LIMIT))
        self.state = self.backend.dropout_state(self.rate, self.seed)

    def to(self, backend) -> None:
        """Move to ``backend``: a new state there, seeded as this layer was built."""
        super().to(backend)
        self.state = backend.dropout_state(self.rate, self.seed)

    def allocate(self, input_shape, output_shape):
        return {"reserve": self.backend.dropout_reserve(self.state, input_shape)}

    def skip_masks(self, batches: Iterable[tuple[int, int]]) -> None:
        """Advance the generator past the masks of training steps run before: ``batches`` holds
        (batch size, steps) runs in the order they were trained. Nothing is drawn at rate 0."""
        if self.rate == 0:
            return
        for size, steps in batches:
            shape = (size, *self.input_sample_shape)
            x, y = Tensor.zeros(shape, self.backend), Tensor(shape, self.backend)
            reserve = self.backend.dropout_reserve(self.state, shape)
            for _ in range(steps):
                # y = x ⊙ mask / (1 - rate): a mask drawn as that step drew it, then dropped
                self.backend.dropout_forward(self.state, reserve, x, y)

    def _is_identity(self) -> bool:
        return not self.training or self.rate == 0

    identity_forward = True  # whether the last forward was the identity (evaluation, or rate 0): so is its backward

    def forward(self, input: Tensor) -> Tensor:
        self.identity_forward = self._is_identity()
        if self.identity_forward:
            # y = x
            self.check_input(input)
            return input
        self.prepare(input)
        # y = x ⊙ mask / (1 - rate),  a new mask
        self.backend.dropout_forward(self.state, self.reserve, input, self.output)
        return self.output

    def backward(self, grad_output: Tensor) -> Tensor:
        if self.identity_forward:
            # dx = dy
            return grad_output
        if not self.gradient_stop:
            # dx = dy ⊙ mask / (1 - rate),  the forward's mask
            self.backend.dropout_backward(self.state, self.reserve, grad_output, self.grad_input)
        return self.grad_input
