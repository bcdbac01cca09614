"""Dense (fully connected) layer on cuBLAS, as in the slides.

The weight is the original's (in_size × out_size) column-major matrix W, stored in a tensor of
shape (out_size, in_size, 1, 1) — the same bytes. Inputs and outputs are read as column-major
matrices with one sample per column: x (in_size × N), y (out_size × N).

                               slides engine                    fast engine
    forward   y  = Wᵀ·x        cublasSgemm                      timed GEMM plan (cuBLASLt or cublasSgemm)
              y  = y + b·1ᵀ    rank-1 cublasSgemm               y = f(y + b·1ᵀ): our bias_activation kernel,
                                                                f of the Activation that follows (if any)
                                                                16-bit y, f a ReLU or none: y = f(Wᵀ·x + b·1ᵀ)
                                                                in one cublasLtMatmul, bias and f in its
                                                                epilogue (sgemm_bias_activation)
    backward  db = dy·1        cublasSgemv                      summed by the Activation after it, in its
                                                                backward kernel, where f runs in the bias
                                                                kernel; else cublasSgemv
              dW = x·dyᵀ       cublasSgemm                      timed GEMM plan
                               (2 GPUs: a large dW in blocks of columns, each sent
                                to the peer while the next one is computed)
              dx = W·dy        cublasSgemm                      timed GEMM plan
    in Network.train_step (plain SGD at rate lr), the fast engine's weight gradient is the update:
              W  = W − lr·x·dyᵀ                                 the dW GEMM with alpha = −lr, beta = 1 and
                                                                C = W, after dx has read the W of the forward

Under math bf16 or fp16 in a network that stores 16 bits (layers.base.activation_dtype), x, y, dy and dx
are 16-bit tensors: y and dx are the GEMMs' float32 sums rounded once, W, b, dW and db stay float32. The
epilogue reads the bias in y's 16 bits: y = h(f(Wᵀ·x + h(b)·1ᵀ)), h the rounding, the sum in float32.
"""

from __future__ import annotations

from math import prod

from ..backends.base import OP_N, OP_T
from ..backends.descriptors import in_gemm_epilogue
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
        self.grad_weight_blocks = 1  # dW computed in this many blocks of columns (output units), one GEMM each
        self.grad_weight_ready = None  # called with each block of dW (a view) once its GEMM is queued

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
        fused = b.engine.fuse_bias_activation  # f of the Activation after it runs here
        if fused and b.engine.gemm_epilogue and self.output.dtype.half and in_gemm_epilogue(self.activation):
            # y = f(Wᵀ·x + b·1ᵀ)  (out_size × N): one cuBLASLt GEMM, the bias and a ReLU in its epilogue
            b.sgemm_bias_activation(OP_T, OP_N, self.out_size, n, self.in_size, self.weight, self.in_size, input,
                                    self.in_size, self.output, self.out_size, self.bias, self.activation)
            return self.output
        # y = Wᵀ·x            (out_size × N) = (in_size × out_size)ᵀ · (in_size × N)
        b.sgemm(OP_T, OP_N, self.out_size, n, self.in_size,
                1.0, self.weight, self.in_size, input, self.in_size, 0.0, self.output, self.out_size)
        if fused:
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
        if self.sgd_rate is None and self.grad_weight_blocks == 1:
            # dW = x·dyᵀ      (in_size × out_size) = (in_size × N) · (N × out_size)
            b.sgemm(OP_N, OP_T, self.in_size, self.out_size, n,
                    1.0, self.input, self.in_size, dy, self.out_size, 0.0, self.grad_weight, self.in_size)
        elif self.sgd_rate is None:
            self._weight_gradient_in_blocks(dy)
        if not self.gradient_stop:
            # dx = W·dy       (in_size × N) = (in_size × out_size) · (out_size × N)
            b.sgemm(OP_N, OP_N, self.in_size, n, self.out_size,
                    1.0, self.weight, self.in_size, dy, self.out_size, 0.0, self.grad_input, self.in_size)
        if self.sgd_rate is not None:
            # W = W − lr·x·dyᵀ (in_size × out_size) = (in_size × out_size) − lr·(in_size × N) · (N × out_size)
            b.sgemm(OP_N, OP_T, self.in_size, self.out_size, n,
                    -self.sgd_rate, self.input, self.in_size, dy, self.out_size, 1.0, self.weight, self.in_size)
        return self.grad_input

    def _weight_gradient_in_blocks(self, dy: Tensor) -> None:
        """dW = x·dyᵀ in ``grad_weight_blocks`` blocks of columns, each handed to ``grad_weight_ready``
        once queued: 2 GPUs send a block to each other while the next one's GEMM runs."""
        weight_gradient_in_blocks(self.backend, self.input, dy, self.grad_weight, self.in_size, self.out_size, dy.n,
                                  self.grad_weight_blocks, self.grad_weight_ready)


def weight_gradient_in_blocks(backend, x: Tensor, dy: Tensor, grad_weight: Tensor, in_size: int, out_size: int,
                              n: int, blocks: int, ready=None) -> None:
    """dW = x·dyᵀ one block of columns j ∈ [first, first + count) at a time (column-major dW: each block is
    contiguous), each (a view of dW) handed to ``ready`` once its GEMM is queued."""
    for first, count in column_blocks(out_size, blocks):
        block = grad_weight.view((count * in_size,), first * in_size)  # dW[:, first:first+count]
        dy_rows = dy.view((dy.size - first,), first)  # dy[first:first+count, :], leading dimension out_size
        # dW[:, j] = x·dy[j, :]ᵀ   (in_size × count) = (in_size × N) · (N × count)
        backend.sgemm(OP_N, OP_T, in_size, count, n, 1.0, x, in_size, dy_rows, out_size, 0.0, block, in_size)
        if ready is not None:
            ready(block)


COLUMN_ALIGNMENT = 64  # a block's first column: its dy rows start 256-byte aligned (float32), 128 (16 bits)


def column_blocks(columns: int, blocks: int) -> list[tuple[int, int]]:
    """[(first, count)]: ``columns`` in at most ``blocks`` consecutive blocks as even as multiples of
    COLUMN_ALIGNMENT allow (the last takes the rest)."""
    size = -(-columns // (blocks * COLUMN_ALIGNMENT)) * COLUMN_ALIGNMENT
    return [(first, min(size, columns - first)) for first in range(0, columns, size)]
