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

Under a 16-bit precision (``math: bf16`` or ``fp16``, its low_precision.HalfFormat) the GEMMs read 16-bit
A and B, accumulate in FP32 and write FP32 C (matmul.py's plans: cublasLtMatmul, or
cublasGemmStridedBatchedEx): im2col writes col in 16 bits (``im2col_half``: each value rounded as
converting x first would; dy regrouped the same way), W and dy (S = 1) are the pass's 16-bit copies
(low_precision.Bf16Copies). The sum over the groups (GEMV) and col2im stay FP32. Each result is
then rounded once to the 16-bit format before alpha and beta, as cuDNN's 16-bit output is, so
that a convolution computes the same thing whichever engine a plan takes (and the host follows
both):

    forward          y  = alpha·half(col₁₆ · W₁₆) + beta·y      round_result (the product in y
                                                                where beta = 0, else in the workspace)
    backward data    dx = alpha·half(col2im(dy₁₆ · W₁₆ᵀ)) + beta·dx     col2im rounds its sum
    backward filter  dW = alpha·half(Σ_g col₁₆ᵀ · dy₁₆) + beta·dW       round_result after the GEMV

A 16-bit CNN's x, dy, y and dx are 16-bit tensors of the format themselves: im2col_half16 reads x (and
dy, regrouped) as they are, and y and dx (alpha 1, beta 0) are stored rounded once by round_result16 and
col2im16, the FP32 product kept in the workspace; dW stays float32 as above.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...precision import FP32, Precision
from ..base import OP_N, OP_T
from .bindings import cublas
from .buffer import FLOAT32_BYTES
from .kernel import blocks_for
from .low_precision import BF16_BYTES, HalfFormat, half_format
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


def workspace_bytes(direction: str, shape: GemmShape, samples_per_gemm: int = 1, half: bool = False) -> int:
    """col (forward), dcol (backward_data); for backward_filter the grouped col, the regrouped dy
    and the per-group dW_g (none for one group). ``half``: the 16-bit engine's sections (``half_sections``)."""
    if half:
        return sum(half_sections(direction, shape, samples_per_gemm))
    if direction != "backward_filter":
        return FLOAT32_BYTES * shape.col_size
    groups = shape.groups(samples_per_gemm)
    partials = groups * shape.rows * shape.out_channels if groups > 1 else 0
    return FLOAT32_BYTES * (shape.grouped_col_size(samples_per_gemm) + shape.grouped_dy_size(samples_per_gemm)
                            + partials)


SECTION_ALIGNMENT = 256  # bytes: each section of the 16-bit engine's workspace starts aligned, for cuBLASLt


def _aligned(nbytes: int) -> int:
    return -(-nbytes // SECTION_ALIGNMENT) * SECTION_ALIGNMENT


def half_sections(direction: str, shape: GemmShape, samples_per_gemm: int = 1) -> tuple[int, ...]:
    """The bytes of each section of the 16-bit engine's workspace, in order (256-byte multiples):
    forward: col₁₆ (N, CRS, P), the FP32 product (N, K, P) for a beta other than 0;
    backward_data: dcol (N, CRS, P) in FP32;
    backward_filter: col₁₆ (G, CRS, S, P), dy₁₆ regrouped (G, K, S, P; none for S = 1), the FP32 dW_g
    (G, K, CRS; none for one group) and their FP32 sum (K, CRS) before rounding."""
    k, rows, p = shape.out_channels, shape.rows, shape.positions
    if direction == "forward":
        return _aligned(BF16_BYTES * shape.col_size), _aligned(FLOAT32_BYTES * shape.batch * k * p)
    if direction == "backward_data":
        return (_aligned(FLOAT32_BYTES * shape.col_size),)
    groups = shape.groups(samples_per_gemm)
    return (_aligned(BF16_BYTES * shape.grouped_col_size(samples_per_gemm)),
            _aligned(BF16_BYTES * shape.grouped_dy_size(samples_per_gemm)),
            _aligned(FLOAT32_BYTES * groups * rows * k) if groups > 1 else 0,
            _aligned(FLOAT32_BYTES * rows * k))


def _section_pointers(workspace: int, sections: tuple[int, ...]) -> list[int]:
    pointers = []
    for nbytes in sections:
        pointers.append(workspace)
        workspace += nbytes
    return pointers


def forward(backend, shape: GemmShape, alpha, x, w, beta, y, workspace: int, precision: Precision = FP32) -> None:
    fmt = half_format(precision)
    if fmt is not None:
        _forward_half(backend, shape, alpha, x, w, beta, y, workspace, precision, fmt)
        return
    col = workspace  # (N, CRS, P)
    _im2col(backend, shape, x, col, 1)
    p, k, rows = shape.positions, shape.out_channels, shape.rows
    # yₙ = colₙ · W        (P × K) = (P × CRS) · (CRS × K), for each sample n
    _batched_gemm(backend, OP_N, OP_N, p, k, rows, alpha, col, p, rows * p, w.data.ptr, rows, 0, beta, y.data.ptr, p,
                  k * p, shape.batch, precision)


def _forward_half(backend, shape: GemmShape, alpha, x, w, beta, y, workspace: int, precision: Precision,
                  fmt: HalfFormat) -> None:
    col, product = _section_pointers(workspace, half_sections("forward", shape))  # col₁₆ (N, CRS, P)
    if beta == 0 and not y.dtype.half:
        product = y.data.ptr  # (N, K, P), rounded in place
    _im2col(backend, shape, x, col, 1, fmt)
    (w16,) = backend.context.half.operands((w, w.size), fmt=fmt)  # (K, CRS)
    p, k, rows = shape.positions, shape.out_channels, shape.rows
    # productₙ = col₁₆ₙ · W₁₆     (P × K) = (P × CRS) · (CRS × K), for each sample n; FP32 sums
    _batched_gemm(backend, OP_N, OP_N, p, k, rows, 1.0, col, p, rows * p, w16, rows, 0, 0.0, product, p, k * p,
                  shape.batch, precision)
    # y = alpha·half(product) + beta·y      (a 16-bit y: y₁₆ = half(product), alpha 1 and beta 0)
    _round_result(backend, fmt, y, product, alpha, beta, shape.batch * k * p)


def backward_filter(backend, shape: GemmShape, alpha, x, dy, beta, dw, workspace: int, ones: int,
                    samples_per_gemm: int = 1, precision: Precision = FP32) -> None:
    fmt = half_format(precision)
    if fmt is not None:
        _backward_filter_half(backend, shape, alpha, x, dy, beta, dw, workspace, ones, samples_per_gemm, precision,
                              fmt)
        return
    s, groups = samples_per_gemm, shape.groups(samples_per_gemm)
    p, k, rows = shape.positions, shape.out_channels, shape.rows
    col = workspace  # (G, CRS, S, P)
    grouped_dy = col + FLOAT32_BYTES * shape.grouped_col_size(s)  # (G, K, S, P); dy itself for S = 1
    partials = grouped_dy + FLOAT32_BYTES * shape.grouped_dy_size(s)  # (G, K, CRS): dW_g per group
    _im2col(backend, shape, x, col, s)
    if s == 1:
        grouped_dy = dy.data.ptr
    else:
        _regroup(backend, shape, dy, grouped_dy, s)
    if groups == 1:
        # dW = alpha·colᵀ · dy + beta·dW        (CRS × K) = (CRS × S·P) · (S·P × K)
        _batched_gemm(backend, OP_T, OP_N, rows, k, s * p, alpha, col, s * p, 0, grouped_dy, s * p, 0, beta,
                      dw.data.ptr, rows, 0, 1, precision)
        return
    # dW_g = col_gᵀ · dy_g    (CRS × K) = (CRS × S·P) · (S·P × K), for each group g
    _batched_gemm(backend, OP_T, OP_N, rows, k, s * p, 1.0, col, s * p, rows * s * p, grouped_dy, s * p, k * s * p,
                  0.0, partials, rows, rows * k, groups, precision)
    # dW = Σ_g dW_g          (CRS·K) = (CRS·K × G) · 1_G
    context = backend.context
    cublas.sgemv(context.cublas.handle, OP_N, rows * k, groups, context.scalar(alpha), partials, rows * k, ones, 1,
                 context.scalar(beta), dw.data.ptr, 1)


def _backward_filter_half(backend, shape: GemmShape, alpha, x, dy, beta, dw, workspace: int, ones: int,
                          samples_per_gemm: int, precision: Precision, fmt: HalfFormat) -> None:
    s, groups = samples_per_gemm, shape.groups(samples_per_gemm)
    p, k, rows = shape.positions, shape.out_channels, shape.rows
    # col₁₆ (G, CRS, S, P), dy₁₆ (G, K, S, P), dW_g (G, K, CRS), their sum (K, CRS)
    col, grouped_dy, partials, total = _section_pointers(workspace, half_sections("backward_filter", shape, s))
    _im2col(backend, shape, x, col, s, fmt)
    if s == 1:
        # (N, K, P)
        (grouped_dy,) = backend.context.half.operands((dy, dy.size), fmt=fmt)
    else:
        _regroup(backend, shape, dy, grouped_dy, s, fmt)
    if groups == 1:
        # total = col₁₆ᵀ · dy₁₆        (CRS × K) = (CRS × S·P) · (S·P × K)
        _batched_gemm(backend, OP_T, OP_N, rows, k, s * p, 1.0, col, s * p, 0, grouped_dy, s * p, 0, 0.0, total, rows,
                      0, 1, precision)
    else:
        # dW_g = col₁₆_gᵀ · dy₁₆_g    (CRS × K) = (CRS × S·P) · (S·P × K), for each group g
        _batched_gemm(backend, OP_T, OP_N, rows, k, s * p, 1.0, col, s * p, rows * s * p, grouped_dy, s * p,
                      k * s * p, 0.0, partials, rows, rows * k, groups, precision)
        # total = Σ_g dW_g           (CRS·K) = (CRS·K × G) · 1_G
        context = backend.context
        cublas.sgemv(context.cublas.handle, OP_N, rows * k, groups, context.scalar(1.0), partials, rows * k, ones, 1,
                     context.scalar(0.0), total, 1)
    # dW = alpha·half(total) + beta·dW
    _round_result(backend, fmt, dw, total, alpha, beta, rows * k)


def backward_data(backend, shape: GemmShape, alpha, w, dy, beta, dx, workspace: int,
                  precision: Precision = FP32) -> None:
    dcol = workspace  # (N, CRS, P)
    p, k, rows = shape.positions, shape.out_channels, shape.rows
    fmt = half_format(precision)
    if fmt is None:
        w_ptr, dy_ptr, rounding = w.data.ptr, dy.data.ptr, 0
    else:
        w_ptr, dy_ptr = backend.context.half.operands((w, w.size), (dy, dy.size), fmt=fmt)
        rounding = fmt.kernel_code
    # dcolₙ = dyₙ · Wᵀ     (P × CRS) = (P × K) · (K × CRS), for each sample n (16-bit dy₁₆ and W₁₆ under fmt)
    _batched_gemm(backend, OP_N, OP_T, p, rows, k, 1.0, dy_ptr, p, k * p, w_ptr, rows, 0, 0.0, dcol, p,
                  rows * p, shape.batch, precision)
    total = shape.batch * shape.channels * shape.height * shape.width
    if dx.dtype.half:
        # dx₁₆ = half(col2im(dcol))      (a 16-bit CNN's dx, alpha 1 and beta 0)
        _launch(backend, "col2im16", total, dx.data.ptr, dcol, *shape.geometry(), rounding)
        return
    # dx = alpha·col2im(dcol) + beta·dx          (col2im's sum rounded to fmt first)
    _launch(backend, "col2im", total, dx.data.ptr, dcol, float(alpha), float(beta), *shape.geometry(), rounding)


def _batched_gemm(backend, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c,
                  batch, precision: Precision) -> None:
    """Cᵢ = alpha·op(Aᵢ)·op(Bᵢ) + beta·Cᵢ for i < batch (a stride of 0 shares one matrix), with the
    backend's timed GEMM plan (cublasLtMatmul or cublasSgemmStridedBatched, see matmul.py); A and B in
    16 bits where ``precision`` (the plan's) is a 16-bit one."""
    problem = GemmProblem(transa, transb, m, n, k, lda, ldb, ldc, batch, stride_a, stride_b, stride_c,
                          precision, alignment(a, b, c))
    backend.gemm(problem, alpha, a, b, beta, c)


def _im2col(backend, shape: GemmShape, x, col: int, samples_per_gemm: int, fmt: HalfFormat | None = None) -> None:
    """col (G, CRS, S, P) from the tensor x (N, C, H, W), zeros for the samples past N; in ``fmt``'s 16 bits
    where given (from a 16-bit x of that format as it is)."""
    threads = shape.groups(samples_per_gemm) * samples_per_gemm * shape.channels * shape.positions
    if fmt is None:
        _launch(backend, "im2col", threads, col, x.data.ptr, *shape.geometry(), samples_per_gemm)
    else:
        kernel = "im2col_half16" if x.dtype is fmt.dtype else "im2col_half"
        _launch(backend, kernel, threads, col, x.data.ptr, *shape.geometry(), samples_per_gemm, fmt.kernel_code)


def _regroup(backend, shape: GemmShape, dy, grouped: int, samples_per_gemm: int,
             fmt: HalfFormat | None = None) -> None:
    """The tensor dy (N, K, P) -> (G, K, S, P), zeros for the samples past N: im2col of a 1×1 kernel (into
    ``fmt``'s 16 bits where given, from a 16-bit dy of that format as it is)."""
    k, oh, ow = shape.out_channels, shape.out_height, shape.out_width
    threads = shape.groups(samples_per_gemm) * samples_per_gemm * k * shape.positions
    geometry = (shape.batch, k, oh, ow, 1, 1, 0, 1, oh, ow, samples_per_gemm)
    if fmt is None:
        _launch(backend, "im2col", threads, grouped, dy.data.ptr, *geometry)
    else:
        kernel = "im2col_half16" if dy.dtype is fmt.dtype else "im2col_half"
        _launch(backend, kernel, threads, grouped, dy.data.ptr, *geometry, fmt.kernel_code)


def _round_result(backend, fmt: HalfFormat, out, product: int, alpha, beta, count: int) -> None:
    """The tensor out = alpha·half(product) + beta·out over ``count`` floats (``product`` may be out's storage);
    a 16-bit out (alpha 1, beta 0) takes half(product) itself."""
    if out.dtype.half:
        _launch(backend, "round_result16", count, out.data.ptr, product, fmt.kernel_code, count)
        return
    _launch(backend, "round_result", count, out.data.ptr, product, float(alpha), float(beta), fmt.kernel_code, count)


def _launch(backend, kernel: str, threads: int, *arguments) -> None:
    """Our NVRTC ``kernel`` over ``threads`` threads on the context's stream."""
    backend.context.kernel(kernel).launch(blocks_for(threads), backend.context.stream.handle, *arguments)
