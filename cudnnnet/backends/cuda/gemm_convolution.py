"""Convolution as explicit GEMMs: the engine cudnnnet adds beside cuDNN's algorithms.

im2col (kernels/convolution.cu) lays every receptive field of x out as
``col (N, C·R·S, P)``, P = OH·OW; a convolution is then one cuBLAS call per direction, batched
over the samples (column-major, as cuBLAS reads them: ``colₙ`` is P × CRS, ``yₙ`` and ``dyₙ`` are
P × K, W is CRS × K — the (K, C, R, S) filter's bytes):

    forward    yₙ    = colₙ · W                 batched GEMM (W shared: stride 0)
    backward   dW_g  = Σ_{n∈g} colₙᵀ · dyₙ      batched GEMM over groups g of S samples, then
               dW    = Σ_g dW_g                 cublasSgemv with 1_G
               dcolₙ = dyₙ · Wᵀ                 batched GEMM, then
               dx    = col2im(dcol)             every col entry summed back at its pixel

The weight gradient sums over the samples. S samples per GEMM (``samples_per_gemm``, timed by the
search: 1, 2, 4, …) put S·P in each GEMM's inner dimension: im2col then writes col grouped as
``(G, CRS, S, P)`` and dy is regrouped into ``(G, K, S, P)``, G = ⌈N/S⌉ (samples past N are zeros),
so that each group's rows are one matrix. S = 1 is the per-sample layout itself (no regrouping); a
single group (G = 1) writes dW directly, without the GEMV.

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

    def groups(self, samples_per_gemm: int) -> int:  # G = ⌈N/S⌉
        return -(-self.batch // samples_per_gemm)

    def grouped_col_size(self, samples_per_gemm: int) -> int:  # G·S·CRS·P
        return self.groups(samples_per_gemm) * samples_per_gemm * self.rows * self.positions

    def grouped_dy_size(self, samples_per_gemm: int) -> int:  # G·S·K·P: dy regrouped (none for S = 1)
        if samples_per_gemm == 1:
            return 0
        return self.groups(samples_per_gemm) * samples_per_gemm * self.out_channels * self.positions

    def geometry(self) -> tuple:
        """The kernels' shape arguments after the pointers."""
        return (self.batch, self.channels, self.height, self.width, self.kernel, self.stride, self.padding,
                self.dilation, self.out_height, self.out_width)


INDEX_LIMIT = 2 ** 31  # the kernels index col, x and dx with 32-bit integers


def supports(shape: GemmShape, samples_per_gemm: int = 1) -> bool:
    """Whether the engine can run this convolution (its kernels' 32-bit indices reach every value)."""
    largest = max(shape.grouped_col_size(samples_per_gemm), shape.grouped_dy_size(samples_per_gemm),
                  shape.batch * shape.channels * shape.height * shape.width)
    return samples_per_gemm >= 1 and largest < INDEX_LIMIT


def samples_per_gemm_choices(shape: GemmShape) -> tuple[int, ...]:
    """The S the search times for the weight gradient: 1, 2, 4, … up to the batch."""
    return tuple(2 ** i for i in range(shape.batch.bit_length()))


def workspace_bytes(direction: str, shape: GemmShape, samples_per_gemm: int = 1) -> int:
    """col (forward), dcol (backward_data); for backward_filter the grouped col, the regrouped dy
    and the per-group dW_g (none for one group)."""
    if direction != "backward_filter":
        return FLOAT32_BYTES * shape.col_size
    groups = shape.groups(samples_per_gemm)
    partials = groups * shape.rows * shape.out_channels if groups > 1 else 0
    return FLOAT32_BYTES * (shape.grouped_col_size(samples_per_gemm) + shape.grouped_dy_size(samples_per_gemm)
                            + partials)


def forward(backend, shape: GemmShape, alpha, x, w, beta, y, workspace: int) -> None:
    col = workspace  # (N, CRS, P)
    _im2col(backend, shape, x.data.ptr, col, 1)
    p, k, rows = shape.positions, shape.out_channels, shape.rows
    # yₙ = colₙ · W        (P × K) = (P × CRS) · (CRS × K), for each sample n
    _batched_gemm(backend, OP_N, OP_N, p, k, rows, alpha, col, p, rows * p, w.data.ptr, rows, 0, beta, y.data.ptr, p,
                  k * p, shape.batch)


def backward_filter(backend, shape: GemmShape, alpha, x, dy, beta, dw, workspace: int, ones: int,
                    samples_per_gemm: int = 1) -> None:
    s, groups = samples_per_gemm, shape.groups(samples_per_gemm)
    p, k, rows = shape.positions, shape.out_channels, shape.rows
    col = workspace  # (G, CRS, S, P)
    grouped_dy = col + FLOAT32_BYTES * shape.grouped_col_size(s)  # (G, K, S, P); dy itself for S = 1
    partials = grouped_dy + FLOAT32_BYTES * shape.grouped_dy_size(s)  # (G, K, CRS): dW_g per group
    _im2col(backend, shape, x.data.ptr, col, s)
    if s == 1:
        grouped_dy = dy.data.ptr
    else:
        _regroup(backend, shape, dy.data.ptr, grouped_dy, s)
    if groups == 1:
        # dW = alpha·colᵀ · dy + beta·dW        (CRS × K) = (CRS × S·P) · (S·P × K)
        _batched_gemm(backend, OP_T, OP_N, rows, k, s * p, alpha, col, s * p, 0, grouped_dy, s * p, 0, beta,
                      dw.data.ptr, rows, 0, 1)
        return
    # dW_g = col_gᵀ · dy_g    (CRS × K) = (CRS × S·P) · (S·P × K), for each group g
    _batched_gemm(backend, OP_T, OP_N, rows, k, s * p, 1.0, col, s * p, rows * s * p, grouped_dy, s * p, k * s * p,
                  0.0, partials, rows, rows * k, groups)
    # dW = Σ_g dW_g          (CRS·K) = (CRS·K × G) · 1_G
    cublas.sgemv(backend._cublas, OP_N, rows * k, groups, backend._scalar(alpha), partials, rows * k, ones, 1,
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


def _im2col(backend, shape: GemmShape, x: int, col: int, samples_per_gemm: int) -> None:
    """col (G, CRS, S, P) from x (N, C, H, W), zeros for the samples past N."""
    threads = shape.groups(samples_per_gemm) * samples_per_gemm * shape.channels * shape.positions
    backend.context.kernel("im2col").launch(blocks_for(threads), backend._stream, col, x, *shape.geometry(),
                                            samples_per_gemm)


def _regroup(backend, shape: GemmShape, dy: int, grouped: int, samples_per_gemm: int) -> None:
    """dy (N, K, P) -> (G, K, S, P), zeros for the samples past N: im2col of a 1×1 kernel."""
    k, oh, ow = shape.out_channels, shape.out_height, shape.out_width
    threads = shape.groups(samples_per_gemm) * samples_per_gemm * k * shape.positions
    backend.context.kernel("im2col").launch(blocks_for(threads), backend._stream, grouped, dy, shape.batch, k, oh,
                                            ow, 1, 1, 0, 1, oh, ow, samples_per_gemm)
