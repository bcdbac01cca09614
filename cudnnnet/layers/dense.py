"""Dense (fully connected) layer on cuBLAS, as in the slides.

The weight is the original's (in_size × out_size) column-major matrix W, stored in a tensor of
shape (out_size, in_size, 1, 1) — the same bytes. Inputs and outputs are read as column-major
matrices with one sample per column: x (in_size × N), y (out_size × N).

                               slides engine                    fast engine
    forward   y  = Wᵀ·x        cublasSgemm                      timed GEMM plan (cuBLASLt or cublasSgemm)
              y  = y + b·1ᵀ    rank-1 cublasSgemm               y = f(y + b·1ᵀ): our bias_activation kernel,
                                                                f of the Activation that follows (if any)
    backward  db = dy·1        cublasSgemv                      summed by the Activation after it, in its
                                                                backward kernel, where f runs in the bias
                                                                kernel; else cublasSgemv
              dW = x·dyᵀ       cublasSgemm                      timed GEMM plan
              dx = W·dy        cublasSgemm                      timed GEMM plan
    in Network.train_step (plain SGD at rate lr), the fast engine's weight gradient is the update:
              W  = W − lr·x·dyᵀ                                 the dW GEMM with alpha = −lr, beta = 1 and
                                                                C = W, after dx has read the W of the forward

Under math bf16 or fp16 in a network that stores 16 bits (layers.base.activation_dtype), x, y, dy and dx
are 16-bit tensors: y and dx are the GEMMs' float32 sums rounded once, W, b, dW and db stay float32.
"""

from __future__ import annotations

from math import prod

from ..backends.base import OP_N, OP_T
from ..tensor import Tensor
from .base import WeightBiasLayer, he_uniform, positive_int


class Dense(WeightBiasLayer):
    stores_16_bits = True  # x, y, dy and dx may be 16-bit: the GEMMs read them and store y and dx rounded

    def __init__(self, name: str, out_size: int):
        super().__init__(name)
        self.out_size = positive_int(name, "out_size", out_size)
        self.in_size = None
        self.ones = None  # (N,) of 1.0: broadcasts the bias, sums its gradient over the batch
        self.next_activation = None  # the Activation after it (set by Network): its backward may sum db
        self.sgd_rate = None  # lr while Network.train_step has the weight-gradient GEMM apply SGD to W

    def config(self):
        return {"out_size": self.out_size}

    def output_sample_shape(self, input_shape):
        return (self.out_size, 1, 1)

    def parameter_shapes(self, input_shape):
        return {"weight": (self.out_size, prod(input_shape), 1, 1), "bias": (self.out_size, 1, 1, 1)}

    def init_parameters(self, rng):
        self.in_size = prod(self.input_sample_shape)
        self.weight = Tensor.from_numpy(
            he_uniform(rng, (self.out_size, self.in_size, 1, 1), fan_in=self.in_size), self.backend
        )  # W (in_size × out_size), column-major
        self.bias = Tensor.zeros((self.out_size,), self.backend)  # b (out_size)
        self.zero_gradients()

    def allocate(self, input_shape, output_shape):
        return {"ones": Tensor((input_shape[0],), self.backend).fill_(1.0)}

    def forward(self, input: Tensor) -> Tensor:
        self.prepare(input)
        b, n = self.backend, input.n
        # y = Wᵀ·x            (out_size × N) = (in_size × out_size)ᵀ · (in_size × N)
        b.sgemm(OP_T, OP_N, self.out_size, n, self.in_size,
                1.0, self.weight, self.in_size, input, self.in_size, 0.0, self.output, self.out_size)
        if b.engine.fuse_bias_activation:
            # y = f(y + b·1ᵀ)  (out_size × N), b broadcast over the batch; f of the next layer or the identity
            b.bias_activation_forward(self.activation, self.bias, self.output)
        else:
            # y = b·1ᵀ + y     (out_size × N) = (out_size × 1) · (1 × N) + (out_size × N)
            b.sgemm(OP_N, OP_N, self.out_size, n, 1,
                    1.0, self.bias, self.out_size, self.ones, 1, 1.0, self.output, self.out_size)
        return self.output

    def backward(self, grad_output: Tensor) -> Tensor:
        b, n, dy = self.backend, grad_output.n, grad_output
        if self.next_activation is None or not self.next_activation.sums_bias_gradient:
            # db = dy·1       (out_size) = (out_size × N) · (N)
            b.sgemv(OP_N, self.out_size, n, 1.0, dy, self.out_size, self.ones, 1, 0.0, self.grad_bias, 1)
        if self.sgd_rate is None:
            # dW = x·dyᵀ      (in_size × out_size) = (in_size × N) · (N × out_size)
            b.sgemm(OP_N, OP_T, self.in_size, self.out_size, n,
                    1.0, self.input, self.in_size, dy, self.out_size, 0.0, self.grad_weight, self.in_size)
        if not self.gradient_stop:
            # dx = W·dy       (in_size × N) = (in_size × out_size) · (out_size × N)
            b.sgemm(OP_N, OP_N, self.in_size, n, self.out_size,
                    1.0, self.weight, self.in_size, dy, self.out_size, 0.0, self.grad_input, self.in_size)
        if self.sgd_rate is not None:
            # W = W − lr·x·dyᵀ (in_size × out_size) = (in_size × out_size) − lr·(in_size × N) · (N × out_size)
            b.sgemm(OP_N, OP_T, self.in_size, self.out_size, n,
                    -self.sgd_rate, self.input, self.in_size, dy, self.out_size, 1.0, self.weight, self.in_size)
        return self.grad_input
