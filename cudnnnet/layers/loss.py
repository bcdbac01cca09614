"""What the two loss layers (Softmax with cross-entropy, MSE) share.

The loss computes in float32 whatever its input's dtype: its output ŷ (the probabilities, or MSE's copy
of x) and the gradient dJ/dx (``loss_gradient``) are float32; a 16-bit input gets its gradient back in
16 bits (``grad_input``), rounded once from dJ/dx after any loss scale has multiplied it (``hand_back``).
"""

from __future__ import annotations

from ..errors import InvalidArgumentError, ShapeError
from ..precision import FLOAT32
from ..tensor import Tensor
from .base import Layer


class LossLayer(Layer):
    """A last layer that takes the target in ``backward`` and can report its loss."""

    is_loss = True
    stores_16_bits = True  # reads 16-bit logits, hands back a 16-bit gradient; computes in float32
    loss_gradient: Tensor | None = None  # dJ/dx in float32 (grad_input itself where the input is float32)

    def _allocate_buffers(self, input: Tensor) -> dict:
        """ŷ and dJ/dx float32, grad_input of the input's dtype."""
        buffers = super()._allocate_buffers(input)
        if input.dtype is not FLOAT32:
            buffers["output"] = Tensor(buffers["output"].shape, self.backend)
            buffers["loss_gradient"] = Tensor(input.shape, self.backend)
        else:
            buffers["loss_gradient"] = buffers["grad_input"]
        return buffers

    def hand_back(self, loss_scale: Tensor | None = None) -> Tensor:
        """The gradient for the layer before: dJ/dx, times the loss scale S (a one-element tensor) where
        given, in the input's dtype."""
        grad = self.loss_gradient
        if loss_scale is not None:
            # dJ/dx = S·dJ/dx      S read from device memory, before any rounding to 16 bits
            self.backend.sscal(grad.size, loss_scale, grad, 1)
        if grad is not self.grad_input:
            # dx₁₆ = dJ/dx rounded to nearest even
            self.grad_input.copy_(grad)
        return self.grad_input

    def check_target(self, target: Tensor) -> None:
        if self.output is None:
            raise InvalidArgumentError(f"layer {self.name!r}: no output to compare the target with; call forward first")
        if target.shape != self.output.shape:
            raise ShapeError(f"layer {self.name!r}: target has shape {target.shape}, the output has shape "
                             f"{self.output.shape}")

    def backward(self, target: Tensor) -> Tensor:
        """dx = (ŷ - y) / N — the gradient of both cross-entropy over softmax and ½‖ŷ - y‖²."""
        self._loss_gradient(target)
        return self.hand_back()

    def _loss_gradient(self, target: Tensor) -> None:
        """dJ/dx = (ŷ - y) / N into ``loss_gradient``."""
        self.check_target(target)
        b, size, grad = self.backend, self.output.size, self.loss_gradient
        # dx = ŷ
        b.copy(self.output.data, grad.data, size)
        # dx = -1·y + dx
        b.saxpy(size, -1.0, target, 1, grad, 1)
        # dx = (1/N)·dx
        b.sscal(size, 1.0 / target.n, grad, 1)

    def backward_with_metrics(self, target: Tensor, loss: Tensor, count: Tensor,
                              loss_scale: Tensor | None = None) -> Tensor:
        """The training step's last layer: ``backward(target)``, then loss[0] += the batch's mean loss
        and count[0] += its samples whose argmax matches the target's (both always added to); the
        gradient handed back carries ``loss_scale`` where given (``hand_back``).
        Here through the unfused calls; Softmax in the fast engine does it in one fused call."""
        self._loss_gradient(target)
        self.loss(target, loss, accumulate=True)
        self.correct(target, count, accumulate=True)
        return self.hand_back(loss_scale)

    def forward_backward_with_metrics(self, input: Tensor, target: Tensor, loss: Tensor, count: Tensor,
                                      loss_scale: Tensor | None = None) -> Tensor:
        """``forward(input)`` then ``backward_with_metrics``: the training step at the loss layer.
        Here through the two calls; Softmax in the fast engine does both in one fused call."""
        self.forward(input)
        return self.backward_with_metrics(target, loss, count, loss_scale)

    def forward_metrics(self, input: Tensor, target: Tensor, loss: Tensor, count: Tensor, loss_scale: float) -> None:
        """An evaluation batch at the loss layer: ``forward(input)``, then loss[0] += loss_scale·N·(the
        batch's mean loss) and count[0] += its samples whose argmax matches the target's (both always
        added to, on the device: nothing is read back). Here through the unfused calls; Softmax in
        the fast engine does it in one fused call."""
        self.forward(input)
        self.loss(target, self.batch_loss)
        # J_set += (loss_scale·N)·J_batch
        self.backend.saxpy(1, loss_scale * target.n, self.batch_loss, 1, loss, 1)
        self.correct(target, count, accumulate=True)

    def allocate(self, input_shape, output_shape) -> dict:
        """batch_loss: the batch's mean loss in ``forward_metrics`` (1 element)."""
        return {"batch_loss": Tensor((1,), self.backend)}

    def loss(self, target: Tensor, out: Tensor, accumulate: bool = False) -> Tensor:
        """Write (or add) the mean loss of the last forward over the batch into ``out`` (1 element)."""
        raise NotImplementedError

    def correct(self, target: Tensor, out: Tensor, accumulate: bool = False) -> Tensor:
        """Write (or add) the count of samples whose argmax matches the target's into ``out``."""
        self.check_target(target)
        self.backend.accuracy_count(self.output, target, out, accumulate)
        return out
