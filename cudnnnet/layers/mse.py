"""Squared-error output layer (the loss of the course material this design comes from).

    forward   ŷ  = x                                 (identity: a copy)
    loss      J  = (1/N) Σₙ ½‖ŷₙ - yₙ‖²              our NVRTC kernel (kernels/loss.cu)
    backward  dx = (ŷ - y) / N                       cudaMemcpy + cublasSaxpy + cublasSscal
    training  backward, loss and correct in turn     LossLayer.backward_with_metrics (not fused)
    evaluate  forward, loss (saxpy) and correct      LossLayer.forward_metrics (not fused)
"""

from __future__ import annotations

from ..tensor import Tensor
from .loss import LossLayer


class MSE(LossLayer):
    def forward(self, input: Tensor) -> Tensor:
        self.prepare(input)
        # ŷ = x                (float32: a copy, or a conversion of 16-bit x)
        self.output.copy_(input)
        return self.output

    def loss(self, target: Tensor, out: Tensor, accumulate: bool = False) -> Tensor:
        self.check_target(target)
        # J = (1/N) Σ ½‖ŷ - y‖²
        self.backend.squared_error_loss(self.output, target, out, accumulate)
        return out
