"""What the two loss layers (Softmax with cross-entropy, MSE) share."""

from __future__ import annotations

from ..errors import InvalidArgumentError, ShapeError
from ..tensor import Tensor
from .base import Layer


class LossLayer(Layer):
    """A last layer that takes the target in ``backward`` and can report its loss."""

    is_loss = True

    def check_target(self, target: Tensor) -> None:
        if self.output is None:
            raise InvalidArgumentError(f"layer {self.name!r}: no output to compare the target with; call forward first")
        if target.shape != self.output.shape:
            raise ShapeError(f"layer {self.name!r}: target has shape {target.shape}, the output has shape "
                             f"{self.output.shape}")

    def backward(self, target: Tensor) -> Tensor:
        """dx = (ŷ - y) / N — the gradient of both cross-entropy over softmax and ½‖ŷ - y‖²."""
        self.check_target(target)
        b, size = self.backend, self.output.size
        # dx = ŷ
        b.copy(self.output.data, self.grad_input.data, size)
        # dx = -1·y + dx
        b.saxpy(size, -1.0, target, 1, self.grad_input, 1)
        # dx = (1/N)·dx
        b.sscal(size, 1.0 / target.n, self.grad_input, 1)
        return self.grad_input

    def backward_with_metrics(self, target: Tensor, loss: Tensor, count: Tensor) -> Tensor:
        """The training step's last layer: ``backward(target)``, then loss[0] += the batch's mean loss
        and count[0] += its samples whose argmax matches the target's (both always added to).
        Here through the unfused calls; Softmax in the fast engine does it in one fused call."""
        grad = self.backward(target)
        self.loss(target, loss, accumulate=True)
        self.correct(target, count, accumulate=True)
        return grad

    def forward_backward_with_metrics(self, input: Tensor, target: Tensor, loss: Tensor, count: Tensor) -> Tensor:
        """``forward(input)`` then ``backward_with_metrics``: the training step at the loss layer.
        Here through the two calls; Softmax in the fast engine does both in one fused call."""
        self.forward(input)
        return self.backward_with_metrics(target, loss, count)

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
