"""Pooling layer: max or average (counting padding) over square windows.

    forward   y  = pool(x)              cudnnPoolingForward (both engines)
    backward  dx = pool'(x) · dy        cudnnPoolingBackward (slides engine; fast engine: average pooling
                                        and max pooling whose windows overlap or are padded)
      fast engine, max, no padding, stride ≥ window (windows do not overlap): our kernel, kernels/pooling.cu
              dx[cell] = dy[w] if cell is window w's first cell (row-major) equal to its maximum,
                         0     otherwise (every cell of a window holding a NaN, cells of no window)

The host backend computes the same with NumPy (backends/cuda/pooling.py decides where the kernel
can run). Under math bf16 or fp16 in a network that stores 16 bits, x, y, dy and dx are 16-bit tensors:
the maximum of 16-bit values is one of them, the average (float32) and dx are rounded once.
"""

from __future__ import annotations

from ..backends.descriptors import POOLING_MODES, PoolingDescriptor, PoolingMode
from ..errors import InvalidArgumentError, ShapeError
from ..tensor import Tensor
from .base import Layer, positive_int

MODES = tuple(POOLING_MODES)  # a config's modes, each a cudnnPoolingMode_t


class Pooling(Layer):
    stores_16_bits = True  # x, y, dy and dx may be 16-bit: max exact, the average and dx rounded once

    def __init__(self, name: str, kernel_size: int, padding: int = 0, stride: int | None = None,
                 mode: str = "max"):
        super().__init__(name)
        kernel_size = positive_int(name, "kernel_size", kernel_size)
        padding = positive_int(name, "padding", padding, minimum=0)
        stride = kernel_size if stride is None else positive_int(name, "stride", stride)
        if padding >= kernel_size:
            raise InvalidArgumentError(f"layer {name!r}: padding {padding} must be smaller than kernel_size {kernel_size}")
        if mode not in MODES:
            raise InvalidArgumentError(f"layer {name!r}: unknown pooling mode {mode!r}; valid modes are {', '.join(MODES)}")
        self.kernel_size, self.padding, self.stride, self.mode = kernel_size, padding, stride, mode
        self.descriptor = PoolingDescriptor(PoolingMode(POOLING_MODES[mode]), kernel_size, padding, stride)

    def config(self):
        return {"kernel_size": self.kernel_size, "padding": self.padding, "stride": self.stride, "mode": self.mode}

    def output_sample_shape(self, input_shape):
        c, h, w = input_shape
        if self.kernel_size > h + 2 * self.padding or self.kernel_size > w + 2 * self.padding:
            raise ShapeError(
                f"layer {self.name!r}: pooling window {self.kernel_size} is larger than its padded input "
                f"{h + 2 * self.padding}×{w + 2 * self.padding} from input shape ({c}, {h}, {w})"
            )
        return self.descriptor.output_shape((1, c, h, w))[1:]

    def forward(self, input: Tensor) -> Tensor:
        self.prepare(input)
        # y = pool(x)
        self.backend.pooling_forward(self.descriptor, 1.0, input, 0.0, self.output)
        return self.output

    def backward(self, grad_output: Tensor) -> Tensor:
        if not self.gradient_stop:
            # dx = pool'(x) · dy      (max without overlap: dy at each window's first maximum, 0 elsewhere)
            self.backend.pooling_backward(self.descriptor, 1.0, self.output, grad_output, self.input, 0.0,
                                          self.grad_input)
        return self.grad_input
