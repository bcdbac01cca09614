"""Softmax output layer with the cross-entropy loss, as in the slides.

    forward   ŷ  = softmax(x)                        cudnnSoftmaxForward (ACCURATE, CHANNEL)
    loss      J  = -(1/N) Σₙ Σ_c y·log ŷ             our NVRTC kernel (kernels/loss.cu)
    backward  dx = (ŷ - y) / N                       cudaMemcpyAsync + cublasSaxpy + cublasSscal
                                                     (float32; rounded once into a 16-bit grad_input)
    hits      #{n : argmax ŷₙ == argmax yₙ}         our accuracy_count kernel (kernels/loss.cu)

The slides engine runs those calls in turn in training and evaluation (LossLayer). The fast engine
fuses them:

    training  ŷ, dx, J (+=) and hits (+=) from x     one launch (kernels/cross_entropy_backward.cu)
    training  dx, J (+=) and hits (+=) from ŷ        one launch (the same file, without the softmax)
    evaluate  J (+=) and hits (+=) from x, ŷ unkept  one launch (that kernel, ŷ and dx not written)
"""

from __future__ import annotations

from ..tensor import Tensor
from .loss import LossLayer


class Softmax(LossLayer):
    def forward(self, input: Tensor) -> Tensor:
        self.prepare(input)
        # ŷ = softmax(x) over the c·h·w values of each sample
        self.backend.softmax_forward(1.0, input, 0.0, self.output)
        return self.output

    def loss(self, target: Tensor, out: Tensor, accumulate: bool = False) -> Tensor:
        self.check_target(target)
        # J = -(1/N) Σ y·log(max(ŷ, 1e-7))
        self.backend.cross_entropy_loss(self.output, target, out, accumulate)
        return out

    def backward_with_metrics(self, target: Tensor, loss: Tensor, count: Tensor,
                              loss_scale: Tensor | None = None) -> Tensor:
        """backward, loss and correct: in turn (slides), or in one fused call (fast; one launch on CUDA)."""
        if not self.backend.engine.fuse_loss:
            return super().backward_with_metrics(target, loss, count, loss_scale)
        self.check_target(target)
        # dx = (ŷ - y) / N;  J += -(1/N) Σ y·log(max(ŷ, 1e-7));  hits += #{n : argmax ŷₙ == argmax yₙ}
        self.backend.cross_entropy_backward(self.output, target, self.loss_gradient, loss, count)
        return self.hand_back(loss_scale)

    def forward_backward_with_metrics(self, input: Tensor, target: Tensor, loss: Tensor, count: Tensor,
                                      loss_scale: Tensor | None = None) -> Tensor:
        """forward and backward_with_metrics: in turn (slides), or in one fused call (fast; one launch on CUDA)."""
        if not self.backend.engine.fuse_loss:
            return super().forward_backward_with_metrics(input, target, loss, count, loss_scale)
        self.prepare(input)
        self.check_target(target)
        # ŷ = softmax(x);  dx = (ŷ - y) / N;  J += -(1/N) Σ y·log(max(ŷ, 1e-7));  hits += #{n : argmax ŷₙ == argmax yₙ}
        self.backend.softmax_cross_entropy_backward(input, target, self.output, self.loss_gradient, loss, count)
        return self.hand_back(loss_scale)

    def forward_metrics(self, input: Tensor, target: Tensor, loss: Tensor, count: Tensor, loss_scale: float) -> None:
        """An evaluation batch: forward, loss and correct in turn (slides), or one fused call (fast;
        one launch on CUDA, no cudnnSoftmaxForward, and ŷ is not kept: ``self.output`` does not hold
        this batch's probabilities afterwards)."""
        if not self.backend.engine.fuse_loss:
            super().forward_metrics(input, target, loss, count, loss_scale)
            return
        self.prepare(input)
        self.check_target(target)
        # ŷ = softmax(x);  J += -loss_scale·Σ y·log(max(ŷ, 1e-7));  hits += #{n : argmax ŷₙ == argmax yₙ}
        self.backend.softmax_cross_entropy_metrics(input, target, loss, count, loss_scale)
