"""Convolution as explicit GEMMs: the engine cudnnnet adds beside cuDNN's algorithms.

im2col (kernels/convolution.cu) lays every receptive field of x out as
``col (N, C·R·S, P)``, P = OH·OW; a convolution is then one cuBLAS call per direction, batched
over the samples (column-major, as cuBLAS reads them: ``colₙ`` is P × CRS, ``yₙ`` and ``dyₙ`` are
P × K, W is CRS × K — the (K, C, R, S) filter's bytes):

    forward    yₙ    = colₙ · W                 batched GEMM (W shared: stride 0)
    backward   dWₙ   = colₙᵀ · dyₙ              batched GEMM, then
               dW    = Σₙ dWₙ                   cublasSgemv with 1_N
               dcolₙ = dyₙ · Wᵀ                 batched GEMM, then
               dx    = col2im(dcol)             every col entry summed back at its pixel

A batched GEMM is cublasSgemmStridedBatched or cublasLtMatmul with a batched layout, whichever
the backend's GEMM plan timed faster (matmul.py). Every step is deterministic. ``convolution.py``
times this engine against cuDNN's algorithms and a plan takes it (``GEMM_ALGORITHM``) where it is
faster.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..base import OP_N, OP_T
from .bindings import cublas
from .buffer import FLOAT32_BYTES
from .kernel import blocks_for
from .matmul import GemmProblem, alignment

GEMM_ALGORITHM = -1  # not a cuDNN enum value: a plan's marker for this engine


@dataclass(frozen=True)
class GemmShape:
    """The sizes of one convolution as GEMMs."""

    batch: int  # N
    channels: int  # C
    height: int
    width: int
    kernel: int  # R = S
    stride: int
    padding: int
    dilation: int
    out_channels: int  # K
    out_height: int
    out_width: int

    @classmethod
    def of(cls, desc, x_shape, y_shape) -> "GemmShape":
        n, c, h, w = x_shape
        return cls(n, c, h, w, desc.kernel_size, desc.stride, desc.padding, desc.dilation, y_shape[1], y_shape[2],
                   y_shape[3])

    @property
    def positions(self) -> int:  # P
        return self.out_height * self.out_width

    @property
    def rows(self) -> int:  # C·R·S
        return self.channels * self.kernel * self.kernel

    @property
    def col_size(self) -> int:  # N·CRS·P
        return self.batch * self.rows * self.positions

    def geometry(self) -> tuple:
        """The kernels' shape arguments after the pointers."""
        return (self.batch, self.channels, self.height, self.width, self.kernel, self.stride, self.padding,
                self.dilation, self.out_height, self.out_width)


INDEX_LIMIT = 2 ** 31  # the kernels index col, x and dx with 32-bit integers


def supports(shape: GemmShape) -> bool:
    """Whether the engine can run this convolution (its kernels' 32-bit indices reach every value)."""
    return max(shape.col_size, shape.batch * shape.channels * shape.height * shape.width) < INDEX_LIMIT


def workspace_bytes(direction: str, shape: GemmShape) -> int:
    """col (forward), dcol (backward_data), col and the per-sample dWₙ (backward_filter)."""
    partials = shape.batch * shape.rows * shape.out_channels if direction == "backward_filter" else 0
    return FLOAT32_BYTES * (shape.col_size + partials)


def forward(backend, shape: GemmShape, alpha, x, w, beta, y, workspace: int) -> None:
    col = workspace  # (N, CRS, P)
    _im2col(backend, shape, x, col)
    p, k, rows = shape.positions, shape.out_channels, shape.rows
    # yₙ = colₙ · W        (P × K) = (P × CRS) · (CRS × K), for each sample n
    _batched_gemm(backend, OP_N, OP_N, p, k, rows, alpha, col, p, rows * p, w.data.ptr, rows, 0, beta, y.data.ptr, p,
                  k * p, shape.batch)


def backward_filter(backend, shape: GemmShape, alpha, x, dy, beta, dw, workspace: int, ones: int) -> None:
    col = workspace  # (N, CRS, P)
    partials = workspace + FLOAT32_BYTES * shape.col_size  # (N, K, CRS): dWₙ per sample
    _im2col(backend, shape, x, col)
    p, k, rows, n = shape.positions, shape.out_channels, shape.rows, shape.batch
    # dWₙ = colₙᵀ · dyₙ    (CRS × K) = (CRS × P) · (P × K), for each sample n
    _batched_gemm(backend, OP_T, OP_N, rows, k, p, 1.0, col, p, rows * p, dy.data.ptr, p, k * p, 0.0, partials, rows,
                  rows * k, n)
    # dW = Σₙ dWₙ          (CRS·K) = (CRS·K × N) · 1_N
    cublas.sgemv(backend._cublas, OP_N, rows * k, n, backend._scalar(alpha), partials, rows * k, ones, 1,
                 backend._scalar(beta), dw.data.ptr, 1)


def backward_data(backend, shape: GemmShape, alpha, w, dy, beta, dx, workspace: int) -> None:
    dcol = workspace  # (N, CRS, P)
    p, k, rows = shape.positions, shape.out_channels, shape.rows
    # dcolₙ = dyₙ · Wᵀ     (P × CRS) = (P × K) · (K × CRS), for each sample n
    _batched_gemm(backend, OP_N, OP_T, p, rows, k, 1.0, dy.data.ptr, p, k * p, w.data.ptr, rows, 0, 0.0, dcol, p,
                  rows * p, shape.batch)
    # dx = alpha·col2im(dcol) + beta·dx
    total = shape.batch * shape.channels * shape.height * shape.width
    backend.context.kernel("col2im").launch(blocks_for(total), backend._stream, dx.data.ptr, dcol, float(alpha),
                                            float(beta), *shape.geometry())


def _batched_gemm(backend, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c,
                  batch) -> None:
    """Cᵢ = alpha·op(Aᵢ)·op(Bᵢ) + beta·Cᵢ for i < batch (a stride of 0 shares one matrix), with the
    backend's timed GEMM plan (cublasLtMatmul or cublasSgemmStridedBatched, see matmul.py)."""
    problem = GemmProblem(transa, transb, m, n, k, lda, ldb, ldc, batch, stride_a, stride_b, stride_c, backend.math,
                          alignment(a, b, c))
    backend.gemm(problem, alpha, a, b, beta, c)


def _im2col(backend, shape: GemmShape, x, col: int) -> None:
    backend.context.kernel("im2col").launch(blocks_for(shape.col_size), backend._stream, col, x.data.ptr,
                                            *shape.geometry())
