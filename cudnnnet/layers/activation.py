"""Activation layer on cuDNN: relu, sigmoid, tanh, clipped relu, elu.

                                   slides engine               fast engine
    forward   y  = f(x)            cudnnActivationForward      applied in the bias kernel of the Dense or
                                                               Conv2D before (``fused``), else cuDNN's call
    backward  dx = f'(x) ⊙ dy      cudnnActivationBackward     our kernel (kernels/activation.cu); under
                                                               math bf16 it also writes the bfloat16 copy
                                                               of dx that the layer before reads
              db = Σₙ dx           (the Dense before: sgemv)   fused after a Dense: its bias gradient in
                                                               the same kernel (activation_bias_backward)

When this layer is fused into the layer before it, that layer's bias kernel has already applied f:
forward passes y through, and backward reads f' from y alone (every mode here can: relu, clipped
relu and elu test y > 0 as x > 0, elu's f'(x) = y + α for x ≤ 0, sigmoid's is y(1 − y), tanh's
1 − y²), so y is handed to the backend as x too.

A ReLU after a BatchNorm is applied by the BatchNorm's kernels in the fast engine
(``after_batch_norm``): forward passes y through, and backward passes dy through too, as the
BatchNorm's backward applies f' itself.
"""

from __future__ import annotations

from ..backends.descriptors import ACTIVATION_MODES, ActivationDescriptor, ActivationMode
from ..errors import InvalidArgumentError
from ..tensor import FLOAT32_MAX, Tensor, finite_real
from .base import Layer

# a config's modes, in the order messages list them (ACTIVATION_MODES maps each to cuDNN's)
MODES = ("relu", "sigmoid", "tanh", "clipped_relu", "elu")


class Activation(Layer):
    stores_16_bits = True  # f and f' computed in float32 from 16-bit x, y and dy, stored rounded

    def __init__(self, name: str, mode: str = "relu", coef: float = 0.0):
        super().__init__(name)
        if mode not in MODES:
            raise InvalidArgumentError(
                f"layer {name!r}: unknown activation mode {mode!r}; valid modes are {', '.join(MODES)}"
            )
        coef = finite_real(coef, f"layer {name!r}: coef", f"in [-{FLOAT32_MAX:g}, {FLOAT32_MAX:g}] (float32's range)",
                           lambda value: abs(value) <= FLOAT32_MAX)
        if mode == "clipped_relu" and coef <= 0:
            raise InvalidArgumentError(f"layer {name!r}: clipped_relu needs a clipping threshold coef > 0, got {coef}")
        if mode == "elu" and coef == 0:
            coef = 1.0  # ELU's alpha; 0 would make it a ReLU
        self.mode = mode
        self.coef = coef
        self.descriptor = ActivationDescriptor(ActivationMode(ACTIVATION_MODES[mode]), coef)
        self.after_bias = False  # the layer before is a Dense or Conv2D that can apply f (set by Network)
        self.after_batch_norm = False  # a ReLU after a BatchNorm, which can apply f and f' (set by Network)
        self.dense_before = None  # the Dense before, whose bias gradient the fused backward sums (set by Network)

    def config(self):
        return {"mode": self.mode, "coef": self.coef}

    @property
    def fused(self) -> bool:
        """Whether f runs in the layer before (its bias kernel, or a BatchNorm's kernels): where it can,
        in the fast engine."""
        return self.after_bias and self.backend is not None and self.backend.engine.fuse_bias_activation \
            or self.fused_into_batch_norm

    @property
    def fused_into_batch_norm(self) -> bool:
        """Whether the BatchNorm before applies f and f' (a ReLU, in the fast engine)."""
        return self.after_batch_norm and self.backend is not None and self.backend.engine.batch_norm_kernel

    @property
    def sums_bias_gradient(self) -> bool:
        """Whether backward also writes the bias gradient of the Dense before (db = Σₙ dx), which then
        makes no sgemv of its own: where f runs in that Dense's bias kernel and the engine sums it
        (``activation_sums_bias``)."""
        return self.dense_before is not None and self.fused and not self.gradient_stop \
            and self.backend.engine.activation_sums_bias

    def forward(self, input: Tensor) -> Tensor:
        self.prepare(input)
        if self.fused:
            # y = f(x) is already in the input (the layer before applied f)
            self.output = input
            return input
        # y = f(x)
        self.backend.activation_forward(self.descriptor, 1.0, input, 0.0, self.output)
        return self.output

    def backward(self, grad_output: Tensor) -> Tensor:
        if self.fused_into_batch_norm:
            # dx = dy: the BatchNorm's backward applies f'
            return grad_output
        if self.sums_bias_gradient:
            # dx = f'(y) ⊙ dy,  db = Σₙ dx      (db: the bias gradient of the Dense before)
            self.backend.activation_bias_backward(self.descriptor, self.output, grad_output, self.grad_input,
                                                  self.dense_before.grad_bias)
            return self.grad_input
        if not self.gradient_stop:
            x = self.output if self.fused else self.input  # fused: x no longer exists; f' is read from y
            # dx = f'(x) ⊙ dy
            self.backend.activation_backward(self.descriptor, 1.0, self.output, grad_output, x, 0.0, self.grad_input)
        return self.grad_input
