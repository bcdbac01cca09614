"""Global average pooling: the mean of each channel's whole plane, (N, C, H, W) → (N, C, 1, 1).

    forward   y[n, c]       = (1/(H·W))·Σ_{h,w} x[n, c, h, w]      cudnnPoolingForward
    backward  dx[n, c, h, w] = dy[n, c] / (H·W)                    cudnnPoolingBackward

The backend's average pooling with one window covering the plane (window = H = W, stride H, no
padding), the Pooling layer's calls; planes must be square, as pooling windows are.
"""

from __future__ import annotations

from ..backends.descriptors import PoolingDescriptor, PoolingMode
from ..errors import ShapeError
from ..tensor import Tensor
from .base import Layer


class GlobalAveragePooling(Layer):
    stores_16_bits = True  # x, y, dy and dx may be 16-bit: the float32 mean and dx rounded once

    def __init__(self, name: str):
        super().__init__(name)
        self.descriptor = None  # average pooling over the whole plane, set at build

    def output_sample_shape(self, input_shape):
        c, h, w = input_shape
        if h != w:
            raise ShapeError(f"layer {self.name!r}: global average pooling needs a square plane (pooling windows "
                             f"are square), got input shape ({c}, {h}, {w})")
        return (c, 1, 1)

    def init_parameters(self, rng):
        side = self.input_sample_shape[1]
        self.descriptor = PoolingDescriptor(PoolingMode.AVERAGE, side, 0, side)

    def forward(self, input: Tensor) -> Tensor:
        self.prepare(input)
        # y = (1/(H·W))·Σ_{h,w} x
        self.backend.pooling_forward(self.descriptor, 1.0, input, 0.0, self.output)
        return self.output

    def backward(self, grad_output: Tensor) -> Tensor:
        if not self.gradient_stop:
            # dx = dy / (H·W) at every position of the plane
            self.backend.pooling_backward(self.descriptor, 1.0, self.output, grad_output, self.input, 0.0,
                                          self.grad_input)
        return self.grad_input
