"""Tier 3: CudaBackend, the call surface of ``base.Backend`` on cuBLAS, cuDNN and our NVRTC kernels.

Every call is queued on the context's one stream; only ``download`` and ``synchronize`` wait.
Scalars ``alpha``/``beta`` are host floats (host pointer mode), except the documented one-element
tensors of ``saxpy``, ``sscal``, ``sgd_update`` and ``sgd_update_many``, which are read from device
memory (cuBLAS device pointer mode, or our kernel reading ``lr[0]``) so that they can change under
CUDA-graph replay.

Where a call can run either the slides' library call or our fast path, ``self.engine``
(cudnnnet.engine) decides: cublasSgemm or a timed GEMM plan (sgemm), cuDNN or our kernel (activation
and max-pooling backward, the convolution bias gradient), cuDNN's own algorithm search or ours
with the explicit-GEMM convolution among the candidates, cuBLAS level-1 calls or one launch (SGD).

Math: "fp32" (default) runs cuBLAS in CUBLAS_DEFAULT_MATH and sets CUDNN_FMA_MATH on every
convolution descriptor (cuDNN would otherwise be free to use TF32 on Ampere and later); "tf32"
switches cuBLAS to CUBLAS_TF32_TENSOR_OP_MATH and convolutions to
CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION; "bf16" runs every GEMM as cublasGemmEx and every convolution
in cuDNN's BFLOAT16_CONFIG with CUDNN_TENSOR_OP_MATH, on bfloat16 copies of the float32 operands
with FP32 accumulation (low_precision.py); "fp16" does the same on IEEE half copies (CUDA_R_16F,
cuDNN's PSEUDO_HALF_CONFIG); the other calls stay float32. Plans made before ``set_math`` keep
their math type.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import struct
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ...engine import Engine
from ...precision import Precision
from ...errors import DeviceError, ShapeError, UsageError
from ...tensor import Tensor, as_shape
from ..base import (OP_N, OP_T, ActivationDescriptor, Backend, ConvolutionDescriptor, PoolingDescriptor,
                    check_activation_bias, check_augmented_gather, check_bias, check_loss_scale,
                    check_nonfinite_operands)
from ..base import BatchNormMode
from .dropout import DropoutReserve, DropoutState
from .array_protocols import ArrayProtocols
from .bindings import cublas, cudnn, runtime
from .buffer import FLOAT32_BYTES, DeviceBuffer
from .backward_bias import backward_bias
from .backward_bias import scratch_bytes as bias_scratch_bytes
from .batch_norm import BatchNormKernels
from .channel_sum import ChannelSum
from .context import CudaContext
from .handles import Event
from . import plan_cache
from .convolution import BACKWARD_DATA, BACKWARD_FILTER, DIRECTION_NAMES, FORWARD, ConvolutionPlan, Direction, \
    backward_data_by_forward, make_plan, plan_with
from .gemm_convolution import GEMM_ALGORITHM, INDEX_LIMIT
from .kernel import BLOCK_SIZE, MAX_BLOCKS, blocks_for
from .low_precision import BF16_BYTES, HALF_FORMATS, Bf16Copies, Bf16Scratch
from . import pooling
from .matmul import GemmEngine, GemmProblem, alignment

log = logging.getLogger(__name__)

# mode: (cublasMath_t, cudnnMathType_t of convolutions)
MATH_MODES = {
    "fp32": (cublas.DEFAULT_MATH, cudnn.FMA_MATH),
    "tf32": (cublas.TF32_TENSOR_OP_MATH, cudnn.TENSOR_OP_MATH_ALLOW_CONVERSION),
    "bf16": (cublas.DEFAULT_MATH, cudnn.TENSOR_OP_MATH),
    "fp16": (cublas.DEFAULT_MATH, cudnn.TENSOR_OP_MATH),
}
PLAN_CACHE_SIZE = 64
MAX_ELEMENTWISE_BLOCKS = 65535  # one float4 per thread up to 16.7 M float4s, then grid-stride
SOFTMAX_GROUP = 16  # lanes per sample in softmax_cross_entropy_backward (GROUP there)
SGD_TABLE_CACHE_SIZE = 64  # parameter lists whose device table is kept (one per network in practice)
ACTIVATION_PARTIALS = 1 << 20  # floats of activation_bias_backward's slab sums (4 MiB)
MIN_SLAB_ROWS = 4  # samples a block of activation_bias_backward sums at least (ROWS_AHEAD in activation.cu)
SUM_CHANNELS = 32  # channels a block of activation_bias_sums adds (a warp's run of a row)


@dataclass(frozen=True)
class Slabs:
    """How activation_bias_backward cuts the samples: ``slabs`` slabs of ``slab_rows`` samples, each
    summed by ``column_blocks`` blocks of BLOCK_SIZE columns (a channel, or four in the x4 kernel)."""

    slabs: int
    slab_rows: int
    column_blocks: int

    @property
    def blocks(self) -> int:
        return self.slabs * self.column_blocks


def activation_slabs(samples: int, channels: int, width: int = 1) -> Slabs:
    """About MAX_BLOCKS blocks in all, slabs of at least MIN_SLAB_ROWS samples, their partial sums
    within ACTIVATION_PARTIALS, for a kernel taking ``width`` channels a thread: a function of the
    shape alone, so that every launch adds alike."""
    column_blocks = -(-(channels // width) // BLOCK_SIZE)
    slabs = max(1, min(-(-samples // MIN_SLAB_ROWS), MAX_BLOCKS // column_blocks, ACTIVATION_PARTIALS // channels))
    slab_rows = -(-samples // slabs)
    return Slabs(-(-samples // slab_rows), slab_rows, column_blocks)


@dataclass(frozen=True)
class SgdTable:
    """The device table of one parameter list for kernels/sgd_update_many.cu."""

    buffer: DeviceBuffer  # struct SgdTensor[tensors]: (param, grad, velocity, offset, size) as 64-bit words
    rows: np.ndarray  # the host copy it was uploaded from, (tensors, 5) uint64
    tensors: int
    total: int  # Σ sizes: the kernel's index space


class CudaBackend(ArrayProtocols, Backend):
    """The product: a layer's cuBLAS/cuDNN verbs run on one NVIDIA GPU."""

    name = "cuda"
    maths = tuple(MATH_MODES)

    def __init__(self, device: int = 0, workspace_limit: int = 256 << 20, engine: "str | Engine" = "slides"):
        self.context = CudaContext(device)
        self.device_name = self.context.device_name
        self.workspace_limit = workspace_limit  # bytes a convolution algorithm may use
        self.set_engine(engine)
        self._plans: OrderedDict = OrderedDict()  # (desc, x_shape, math, search) -> ConvolutionPlan
        self._update_scalars: Tensor | None = None  # (3,): −lr, 1 − lr·wd, 1.0 for the cuBLAS SGD with a device rate
        self._sgd_tables: OrderedDict = OrderedDict()  # ((param, grad, velocity, size) pointers...) -> SgdTable
        self._stream = self.context.stream.handle
        self._cublas = self.context.cublas.handle
        self._descriptors = self.context.descriptors
        self._constants = {1.0: ctypes.byref(self.context.one), 0.0: ctypes.byref(self.context.zero),
                           -1.0: ctypes.byref(self.context.minus_one)}
        self._gemm = GemmEngine(self.context, self._scalar)  # sgemm's plans
        self._channel_sum = ChannelSum(self.context)  # convolution_backward_bias, with its scratch
        self._batch_norm = BatchNormKernels(self.context)  # the fast engine's batch normalisation in training
        self._bf16 = Bf16Scratch(self.context)  # math "bf16"/"fp16": one call's operands outside a pass, convolution results
        self._bf16_copies = Bf16Copies(self.context)  # math "bf16"/"fp16": each operand of a pass, converted once
        self._scaled_sgd_scalars: Tensor | None = None  # (6,): the loss-scaled cuBLAS SGD's coefficients
        self._activation_partial_sums: DeviceBuffer | None = None  # activation_bias_backward's slab sums
        self.set_math("fp32")  # the default; cuBLAS's math mode follows the precision in force (_use_precision)

    def __repr__(self) -> str:
        return (f"CudaBackend(device={self.context.device}, {self.device_name!r}, math={self.math!r}, "
                f"engine={self.engine.name!r})")

    @property
    def algorithm_search(self) -> str:
        """How convolution algorithms are chosen, as plan keys name it: the engine's search, and
        whether our explicit-GEMM convolution is among the candidates."""
        engine = self.engine
        search = engine.convolution_search
        label = search if engine.gemm_convolution or search == "find" else f"{search}-cudnn"
        return label if engine.deterministic_convolution else f"{label}-any"

    @property
    def _cudnn(self) -> int:
        """The raw cuDNN handle, which the context creates on the first cuDNN call."""
        return self.context.cudnn.handle

    # ---- configuration ------------------------------------------------------------------------
    def _use_precision(self, precision: Precision) -> None:
        """cuBLAS's math mode is the handle's: set to ``precision``'s whenever the precision in force
        changes ("fp32" exact; "tf32" tensor cores, ~1e-3 relative error; "bf16" and "fp16" run on 16-bit
        copies, ~4e-3 and ~5e-4). A convolution's math type is set on its descriptor instead."""
        cublas.set_math_mode(self._cublas, MATH_MODES[precision.name][0])

    def memory_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory (cudaMemGetInfo)."""
        return runtime.mem_get_info()

    def close(self) -> None:
        """Release the context (handles, workspace, stream). The backend is unusable afterwards."""
        self._plans.clear()
        self._sgd_tables.clear()
        self._update_scalars = None
        self._scaled_sgd_scalars = None
        self._gemm.close()
        self.context.close()
        self._channel_sum.close()
        self._batch_norm.close()
        self._bf16.close()
        self._bf16_copies.close()
        if self._activation_partial_sums is not None:
            self._activation_partial_sums.free()
            self._activation_partial_sums = None

    def _scalar(self, value):
        """A host pointer to ``value`` as float32 (0, 1 and -1 are the context's constants)."""
        if isinstance(value, Tensor):
            raise UsageError("only saxpy, sscal, sgd_update and sgd_update_many take a one-element tensor as a scalar")
        constant = self._constants.get(value)
        return constant if constant is not None else ctypes.byref(ctypes.c_float(value))

    # ---- memory -------------------------------------------------------------------------------
    def empty(self, size: int) -> DeviceBuffer:
        return DeviceBuffer.allocate(FLOAT32_BYTES * int(size))

    def upload(self, array) -> DeviceBuffer:
        """cudaMemcpyAsync H2D (pageable memory is staged before the call returns)."""
        flat = np.ascontiguousarray(array, dtype=np.float32).reshape(-1)
        buffer = DeviceBuffer.allocate(flat.nbytes)
        if flat.nbytes:
            runtime.memcpy_async(buffer.ptr, flat.ctypes.data, flat.nbytes, runtime.MEMCPY_HOST_TO_DEVICE, self._stream)
        return buffer

    def upload_pixels(self, pixels, pad: int, mean: float, std: float) -> DeviceBuffer:
        """kernels/data.cu: the uint8 pixels (N, H, W) are copied (a quarter of the float32 bytes), then
        images (N, 1, H+2·pad, W+2·pad) = (pixels/255 − mean)/std are made on the device."""
        pixels = np.ascontiguousarray(pixels)
        count, height, width = pixels.shape
        images = self.empty(count * (height + 2 * pad) * (width + 2 * pad))
        if images.size == 0:
            return images
        staged = DeviceBuffer.allocate(pixels.nbytes)  # (N, H, W) uint8, freed once the kernel has read it
        try:
            runtime.memcpy_async(staged.ptr, pixels.ctypes.data, pixels.nbytes, runtime.MEMCPY_HOST_TO_DEVICE,
                                 self._stream)
            self.context.kernel("pixels_to_images").launch(blocks_for(images.size), self._stream, images.ptr,
                                                           staged.ptr, count, height, width, pad, mean, std)
            runtime.stream_synchronize(self._stream)
        finally:
            staged.free()
        return images

    def write(self, storage: DeviceBuffer, array) -> None:
        """cudaMemcpyAsync H2D into existing memory (its address stays, as a captured graph needs)."""
        flat = np.ascontiguousarray(array, dtype=np.float32).reshape(-1)
        _check_fits("write", storage, 0, flat.size)
        if flat.nbytes:
            runtime.memcpy_async(storage.ptr, flat.ctypes.data, flat.nbytes, runtime.MEMCPY_HOST_TO_DEVICE, self._stream)

    def download(self, storage: DeviceBuffer, size: int) -> np.ndarray:
        """cudaMemcpyAsync D2H, then cudaStreamSynchronize."""
        _check_fits("download", storage, 0, size)
        array = np.empty(int(size), np.float32)
        if array.nbytes:
            runtime.memcpy_async(array.ctypes.data, storage.ptr, array.nbytes, runtime.MEMCPY_DEVICE_TO_HOST, self._stream)
        self.synchronize()
        return array

    def copy(self, src: DeviceBuffer, dst: DeviceBuffer, size: int) -> None:
        """cudaMemcpyAsync D2D."""
        _check_fits("copy", src, 0, size)
        _check_fits("copy", dst, 0, size)
        if size:
            runtime.memcpy_async(dst.ptr, src.ptr, FLOAT32_BYTES * size, runtime.MEMCPY_DEVICE_TO_DEVICE, self._stream)

    def fill(self, storage: DeviceBuffer, value: float, size: int) -> None:
        """cudaMemsetAsync for +0.0, cuMemsetD32Async with the float's bit pattern otherwise."""
        _check_fits("fill", storage, 0, size)
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
        if bits == 0:
            runtime.memset_async(storage.ptr, 0, FLOAT32_BYTES * size, self._stream)
        elif size:
            runtime.memset_d32_async(storage.ptr, bits, size, self._stream)

    def view(self, storage: DeviceBuffer, offset: int, size: int) -> DeviceBuffer:
        _check_fits("view", storage, offset, size)
        return storage.view(FLOAT32_BYTES * offset, FLOAT32_BYTES * size)

    def synchronize(self) -> None:
        self.context.synchronize()

    supports_graphs = True

    def capture(self):
        """Record the calls made in the block as a CUDA graph (see CudaContext.capture)."""
        return self.context.capture()

    # ---- cuBLAS -------------------------------------------------------------------------------
    def sgemm(self, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc) -> None:
        _check_matrix("sgemm", "A", A, *_stored(transa, m, k, "A"), lda)
        _check_matrix("sgemm", "B", B, *_stored(transb, k, n, "B"), ldb)
        _check_matrix("sgemm", "C", C, m, n, ldc)
        a, b, c = A.data.ptr, B.data.ptr, C.data.ptr
        if self.math in HALF_FORMATS:
            self._gemm_bf16(transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, c, ldc)
            return
        if not self.engine.gemm_plans:
            self.context.finish_warm_up()  # the first GEMM waits for the cuBLAS warm-up thread, as a plan does
            # C = alpha·op(A)·op(B) + beta·C
            cublas.sgemm(self._cublas, transa, transb, m, n, k, self._scalar(alpha), a, lda, b, ldb, self._scalar(beta),
                         c, ldc)
            return
        self.gemm(GemmProblem(transa, transb, m, n, k, lda, ldb, ldc, math=self.math, alignment=alignment(a, b, c)),
                  alpha, a, b, beta, c)

    def _gemm_bf16(self, transa, transb, m, n, k, alpha, A: Tensor, lda: int, B: Tensor, ldb: int, beta, c: int,
                   ldc: int) -> None:
        """C = alpha·op(bf16(A))·op(bf16(B)) + beta·C (fp16 copies under math "fp16"), FP32 accumulation
        and C: cublasGemmEx, or in the fast engine the problem's timed plan (cublasGemmEx or
        cublasLtMatmul, matmul.py)."""
        self.context.finish_warm_up()
        fmt = HALF_FORMATS[self.math]
        a16, b16 = self._bf16_operands((A, _extent(*_stored(transa, m, k, "A"), lda)),
                                       (B, _extent(*_stored(transb, k, n, "B"), ldb)))
        if self.engine.gemm_plans:
            self.gemm(GemmProblem(transa, transb, m, n, k, lda, ldb, ldc, math=self.math, alignment=alignment(a16, b16, c)),
                      alpha, a16, b16, beta, c)
            return
        # C = alpha·op(bf16(A))·op(bf16(B)) + beta·C      (fp16(A), fp16(B) under math "fp16")
        cublas.gemm_ex(self._cublas, transa, transb, m, n, k, self._scalar(alpha), a16, fmt.cublas_type, lda, b16,
                       fmt.cublas_type, ldb, self._scalar(beta), c, cublas.R_32F, ldc, cublas.COMPUTE_32F,
                       cublas.GEMM_DEFAULT)

    def _bf16_operands(self, *operands: tuple[Tensor, int], output: int = 0) -> list[int]:
        """The bfloat16 addresses of each (tensor, values read) of ``operands``: the pass's copies
        (low_precision.Bf16Copies) inside a pass, else scratch slots converted now; then, where
        ``output`` is non-zero, a scratch slot for that many bfloat16 results."""
        pointers = [self._bf16_copies.pointer(tensor.data) for tensor, _ in operands]
        missing = [(tensor.data.ptr, count) for (tensor, count), pointer in zip(operands, pointers) if pointer is None]
        slots = iter(self._bf16.operands(*missing, output=output, fmt=HALF_FORMATS[self.math]))
        pointers = [next(slots) if pointer is None else pointer for pointer in pointers]
        return pointers + ([next(slots)] if output else [])

    def start_pass(self) -> None:
        """A network's forward and backward begin (Network.forward): under math "bf16" or "fp16", each
        GEMM and convolution operand is converted once, where first read, until ``end_pass``."""
        if self.math in HALF_FORMATS:
            self._bf16_copies.start(HALF_FORMATS[self.math])
        else:
            self._bf16_copies.stop()

    def end_pass(self) -> None:
        """The pass's operands may change from here on: every bfloat16 copy is made again when next read."""
        self._bf16_copies.stop()

    def gemm(self, problem: GemmProblem, alpha: float, a: int, b: int, beta: float, c: int) -> None:
        """``problem`` on raw device pointers (sizes checked by the caller), with its timed plan:
        cublasLtMatmul with the fastest algorithm, or cublasSgemm (see matmul.py)."""
        self._gemm.run(problem, "exhaustive", alpha, a, b, beta, c)

    def sgemv(self, trans, m, n, alpha, A, lda, x, incx, beta, y, incy) -> None:
        _stored(trans, m, n, "A")
        rows, cols = (m, n) if trans == OP_N else (n, m)  # op(A) is rows×cols; A is stored m×n
        _check_matrix("sgemv", "A", A, m, n, lda)
        _check_vector("sgemv", "x", x, cols, incx)
        _check_vector("sgemv", "y", y, rows, incy)
        cublas.sgemv(self._cublas, trans, m, n, self._scalar(alpha), A.data.ptr, lda, x.data.ptr, incx,
                     self._scalar(beta), y.data.ptr, incy)

    def saxpy(self, n, alpha, x, incx, y, incy) -> None:
        _check_vector("saxpy", "x", x, n, incx)
        _check_vector("saxpy", "y", y, n, incy)
        self._with_scalar(cublas.saxpy, n, alpha, x.data.ptr, incx, y.data.ptr, incy)

    def sscal(self, n, alpha, x, incx) -> None:
        """A negative ``incx`` scales the same n elements as ``|incx|`` (as the host does; reference
        BLAS and cuBLAS would quietly do nothing)."""
        _check_vector("sscal", "x", x, n, incx)
        self._with_scalar(cublas.sscal, n, alpha, x.data.ptr, abs(incx))

    def scopy(self, n, x, incx, y, incy) -> None:
        _check_vector("scopy", "x", x, n, incx)
        _check_vector("scopy", "y", y, n, incy)
        cublas.scopy(self._cublas, n, x.data.ptr, incx, y.data.ptr, incy)

    def _with_scalar(self, function, n, alpha, *operands) -> None:
        """function(handle, n, &alpha, *operands): a float in host pointer mode, a one-element
        tensor in CUBLAS_POINTER_MODE_DEVICE (host mode restored afterwards)."""
        if not isinstance(alpha, Tensor):
            function(self._cublas, n, self._scalar(alpha), *operands)
            return
        self._check_device_scalar(function.__name__, alpha)
        with self._pointer_mode(device=True):
            function(self._cublas, n, alpha.data.ptr, *operands)

    def _check_device_scalar(self, call: str, value: Tensor) -> None:
        if value.backend is not self:
            raise UsageError(f"{call}: a tensor scalar must be on the {self.name} backend, got one on {value.backend.name}")

    # ---- cuDNN: pointwise ---------------------------------------------------------------------
    def activation_forward(self, desc: ActivationDescriptor, alpha, x, beta, y) -> None:
        _same_shape("activation_forward", x, y)
        t = self._descriptors.tensor(x.shape).handle
        cudnn.activation_forward(self._cudnn, self._descriptors.activation(desc).handle, self._scalar(alpha),
                                 t, x.data.ptr, self._scalar(beta), t, y.data.ptr)

    def activation_backward(self, desc: ActivationDescriptor, alpha, y, dy, x, beta, dx) -> None:
        """cudnnActivationBackward; in the fast engine kernels/activation.cu, which under math "bf16"
        also writes dx's bfloat16 copy where dx is a GEMM or convolution operand of the pass."""
        for other in (y, dy, dx):
            _same_shape("activation_backward", x, other)
        if self.engine.activation_kernel and not isinstance(alpha, Tensor) and not isinstance(beta, Tensor):
            self._activation_backward_kernel(desc, float(alpha), y, dy, x, float(beta), dx)
            return
        # dx = alpha·f'(x)·dy + beta·dx
        t = self._descriptors.tensor(x.shape).handle
        cudnn.activation_backward(self._cudnn, self._descriptors.activation(desc).handle, self._scalar(alpha),
                                  t, y.data.ptr, t, dy.data.ptr, t, x.data.ptr, self._scalar(beta), t, dx.data.ptr)

    def _activation_backward_kernel(self, desc: ActivationDescriptor, alpha: float, y, dy, x, beta: float, dx) -> None:
        """dx = alpha·f'·dy + beta·dx (and dx₁₆ = bf16(dx)): four values a thread where every float32
        operand is 16-byte aligned, the rest one a thread."""
        count, mode, coef = x.size, int(desc.mode), float(desc.coef)
        dx16 = self._bf16_copies.target(dx.data) if self.math == "bf16" and dx.size == dx.data.size else None
        pointers = (dx.data.ptr, x.data.ptr, y.data.ptr, dy.data.ptr)
        vectors = count // 4 if all(pointer % 16 == 0 for pointer in pointers) else 0
        if vectors:
            # dx = alpha·f'·dy + beta·dx      float4s
            blocks = min(-(-vectors // BLOCK_SIZE), MAX_ELEMENTWISE_BLOCKS)
            self.context.kernel("activation_backward_x4").launch(blocks, self._stream, *pointers, mode, coef, alpha,
                                                                 beta, vectors, dx16)
        rest = count - 4 * vectors
        if rest:
            # dx = alpha·f'·dy + beta·dx      the values after the float4s
            offset = 4 * FLOAT32_BYTES * vectors
            self.context.kernel("activation_backward").launch(
                blocks_for(rest), self._stream, *(pointer + offset for pointer in pointers), mode, coef, alpha, beta,
                rest, None if dx16 is None else dx16 + 4 * BF16_BYTES * vectors)

    def softmax_forward(self, alpha, x, beta, y) -> None:
        """Over each sample's c·h·w values: MODE_CHANNEL on an (n, c·h·w, 1, 1) descriptor."""
        _same_shape("softmax_forward", x, y)
        t = self._descriptors.tensor((x.n, x.sample_size, 1, 1)).handle
        cudnn.softmax_forward(self._cudnn, cudnn.SOFTMAX_ACCURATE, cudnn.SOFTMAX_MODE_CHANNEL, self._scalar(alpha),
                              t, x.data.ptr, self._scalar(beta), t, y.data.ptr)

    def add_tensor(self, alpha, bias, beta, y) -> None:
        """cudnnAddTensor."""
        if any(b not in (1, s) for b, s in zip(bias.shape, y.shape)):
            raise ShapeError(f"add_tensor: bias of shape {bias.shape} does not broadcast to {y.shape}")
        cudnn.add_tensor(self._cudnn, self._scalar(alpha), self._descriptors.tensor(bias.shape).handle, bias.data.ptr,
                         self._scalar(beta), self._descriptors.tensor(y.shape).handle, y.data.ptr)

    # ---- cuDNN: convolution -------------------------------------------------------------------
    def convolution_plan(self, desc: ConvolutionDescriptor, x_shape, y_shape) -> ConvolutionPlan:
        """Algorithms for this (descriptor, input shape, math mode), chosen once and cached; the
        shared workspace grows to fit them and the two-pass bias gradient of ``y_shape`` now, so
        that no later call allocates."""
        x_shape, y_shape = as_shape(x_shape), as_shape(y_shape)
        key = (desc, x_shape, self.math, self.algorithm_search)  # the search names the engine's choice
        plan = self._plans.get(key)
        if plan is None:
            _check_convolution_shapes(desc, x_shape, y_shape)
            if self.context.is_capturing():
                raise DeviceError(
                    f"convolution_plan for input {x_shape} was asked for during a CUDA graph capture; "
                    "run one forward pass at this batch size before capturing"
                )
            plan = self._new_plan(desc, x_shape, y_shape)
            self.context.workspace(max(plan.workspace_bytes, bias_scratch_bytes(y_shape)))
            self.context.ones(x_shape[0])
            self._plans[key] = plan
            if len(self._plans) > PLAN_CACHE_SIZE:
                self._plans.popitem(last=False)
        elif plan.y_shape != y_shape:
            _check_convolution_shapes(desc, x_shape, y_shape)
        self._plans.move_to_end(key)
        return plan

    def _new_plan(self, desc: ConvolutionDescriptor, x_shape, y_shape) -> ConvolutionPlan:
        """The plan from the disk cache where it holds a valid one, else the algorithms of a larger
        batch's plan where they run at this one, else searched by ``make_plan`` and written to the
        disk cache."""
        disk_key = self._plan_key(desc, x_shape, y_shape)
        plan = self._plan_from_disk(disk_key) or self._plan_from_larger_batch(desc, x_shape, y_shape)
        if plan is None:
            engine = self.engine
            self.context.finish_warm_up()  # nothing else on the GPU while cuDNN (or our timer) measures
            plan = make_plan(self._cudnn, self._descriptors, desc, x_shape, y_shape, self.math,
                             MATH_MODES[self.math][1], self.workspace_limit, engine.convolution_search,
                             gemm_candidate=engine.gemm_convolution,
                             measure=self._convolution_timer(desc, x_shape, y_shape),
                             deterministic=engine.deterministic_convolution)
            plan_cache.write_plan(disk_key, {name: getattr(plan, name) for name in DIRECTION_NAMES})
        return plan

    def _plan_key(self, desc: ConvolutionDescriptor, x_shape, y_shape) -> plan_cache.PlanKey:
        context = self.context
        return plan_cache.PlanKey(context.device_name, context.compute_capability, context.cudnn_version,
                                  context.cublas_version, desc, x_shape, y_shape, self.math, self.algorithm_search,
                                  self.workspace_limit)

    def _plan_from_disk(self, key: plan_cache.PlanKey) -> ConvolutionPlan | None:
        """The stored plan of ``key`` when cuDNN still runs its algorithms with the stored workspaces."""
        stored = plan_cache.read_plan(key)
        if stored is None:
            return None
        plan = plan_with(self._cudnn, self._descriptors, key.desc, key.x_shape, key.y_shape, self.math,
                         MATH_MODES[self.math][1], self.workspace_limit, stored)
        if plan is None or any(getattr(plan, name) != algorithm for name, algorithm in stored.items()):
            log.debug("the cached convolution plan for %s %s is no longer valid here: searching again", key.desc,
                      key.x_shape)
            return None
        log.debug("convolution plan from the disk cache: %r", plan)
        return plan

    def _plan_from_larger_batch(self, desc: ConvolutionDescriptor, x_shape, y_shape) -> ConvolutionPlan | None:
        """A plan with the algorithms of this convolution's plan at the nearest larger batch (same
        sample shape, math and search), where cuDNN runs them at this batch within the workspace
        limit; workspaces are asked again. Where the engine asks for deterministic algorithms, a larger
        plan holding a non-deterministic one is not reused: this batch may have a deterministic one
        within the limit."""
        larger = [plan for (other, shape, math, search), plan in self._plans.items()
                  if other == desc and math == self.math and search == self.algorithm_search
                  and shape[1:] == x_shape[1:] and shape[0] > x_shape[0]]
        if not larger:
            return None
        source = min(larger, key=lambda plan: plan.x_shape[0])
        algorithms = {name: getattr(source, name) for name in DIRECTION_NAMES}
        if self.engine.deterministic_convolution and not all(algorithm.deterministic for algorithm in algorithms.values()):
            return None
        plan = plan_with(self._cudnn, self._descriptors, desc, x_shape, y_shape, self.math, MATH_MODES[self.math][1],
                         self.workspace_limit, algorithms)
        if plan is not None:
            log.debug("convolution plan from the plan at batch %d: %r", source.x_shape[0], plan)
        return plan

    def _convolution_timer(self, desc: ConvolutionDescriptor, x_shape, y_shape):
        """What times the candidates of an exhaustive search (None for a heuristic one); its scratch
        tensors are allocated at the first measurement (none where every direction has one candidate)."""
        if self.engine.convolution_search != "exhaustive":
            return None
        timers: list[ConvolutionTimer] = []

        def measure(plan: ConvolutionPlan, direction: str) -> float:
            if not timers:
                timers.append(ConvolutionTimer(self, x_shape, desc.filter_shape, y_shape))
            return timers[0].measure(plan, direction)

        return measure

    def convolution_forward(self, plan: ConvolutionPlan, alpha, x, w, beta, y) -> None:
        _check_plan("convolution_forward", plan, x=x, w=w, y=y)
        # y = alpha·(x ⋆ w) + beta·y
        self._convolve(FORWARD, plan, alpha, x, w, beta, y)

    def convolution_backward_data(self, plan: ConvolutionPlan, alpha, w, dy, beta, dx) -> None:
        _check_plan("convolution_backward_data", plan, x=dx, w=w, y=dy)
        # dx = alpha·(dy ⋆ᵀ w) + beta·dx
        self._convolve(BACKWARD_DATA, plan, alpha, w, dy, beta, dx)

    def convolution_backward_filter(self, plan: ConvolutionPlan, alpha, x, dy, beta, dw) -> None:
        _check_plan("convolution_backward_filter", plan, x=x, w=dw, y=dy)
        # dw = alpha·Σₙ xₙ ⋆ dyₙ + beta·dw
        self._convolve(BACKWARD_FILTER, plan, alpha, x, dy, beta, dw)

    def _convolve(self, direction: Direction, plan: ConvolutionPlan, alpha, a, b, beta, out) -> None:
        """One direction with the plan's algorithm: cudnnConvolution{Forward,BackwardData,BackwardFilter}
        (``direction.run``), or our explicit-GEMM engine (``direction.gemm``) where the plan chose it."""
        algorithm = getattr(plan, direction.name)
        workspace = self.context.workspace(algorithm.workspace_bytes)
        if algorithm.algo == GEMM_ALGORITHM:  # in 16 bits under a 16-bit math (gemm_convolution.py)
            direction.gemm(self, plan.gemm_shape, alpha, a, b, beta, out, workspace, algorithm,
                           HALF_FORMATS.get(plan.math))
            return
        if algorithm.by_forward:  # backward data as a forward convolution with the flipped filter
            backward_data_by_forward(self, plan, algorithm, alpha, a, b, beta, out, workspace)
            return
        a_desc, b_desc, conv, out_desc = direction.operands(plan.x.handle, plan.w.handle, plan.conv.handle,
                                                            plan.y.handle)
        if plan.math in HALF_FORMATS:
            # out₁₆ = bf16(a) ⋆ bf16(b), then out = alpha·float(out₁₆) + beta·out   (fp16 under math "fp16")
            fmt = HALF_FORMATS[plan.math]
            a16, b16, out16 = self._bf16_operands((a, a.size), (b, b.size), output=out.size)
            direction.run(self._cudnn, self._scalar(1.0), a_desc, a16, b_desc, b16, conv, algorithm.algo, workspace,
                          algorithm.workspace_bytes, self._scalar(0.0), out_desc, out16)
            self._bf16.to_float(out.data.ptr, out16, alpha, beta, out.size, fmt=fmt)
            return
        direction.run(self._cudnn, self._scalar(alpha), a_desc, a.data.ptr, b_desc, b.data.ptr, conv, algorithm.algo,
                      workspace, algorithm.workspace_bytes, self._scalar(beta), out_desc, out.data.ptr)

    def convolution_backward_bias(self, alpha, dy, beta, db) -> None:
        """cudnnConvolutionBackwardBias, in two passes over reshaped views of dy from 32 samples on
        (see backward_bias.py); in fast mode kernels/channel_sum.cu (see channel_sum.py): one launch,
        deterministic, no library call."""
        _expect_shape("convolution_backward_bias", "db", db, (1, dy.c, 1, 1))
        if self.engine.channel_sum:
            self._channel_sum(alpha, dy, beta, db)
            return
        # db = alpha·Σ_{n,h,w} dy + beta·db      in one call, or two on reshaped views of dy
        backward_bias(self, alpha, dy, beta, db)

    # ---- cuDNN: pooling -----------------------------------------------------------------------
    def pooling_forward(self, desc: PoolingDescriptor, alpha, x, beta, y) -> None:
        _expect_shape("pooling_forward", "y", y, desc.output_shape(x.shape))
        cudnn.pooling_forward(self._cudnn, self._descriptors.pooling(desc).handle, self._scalar(alpha),
                              self._descriptors.tensor(x.shape).handle, x.data.ptr, self._scalar(beta),
                              self._descriptors.tensor(y.shape).handle, y.data.ptr)

    def pooling_backward(self, desc: PoolingDescriptor, alpha, y, dy, x, beta, dx) -> None:
        """cudnnPoolingBackward; in fast mode, max pooling without padding whose windows do not overlap
        (stride ≥ window) runs kernels/pooling.cu (see pooling.py), y not read."""
        _expect_shape("pooling_backward", "dy", dy, desc.output_shape(x.shape))
        _expect_shape("pooling_backward", "y", y, dy.shape)
        _expect_shape("pooling_backward", "dx", dx, x.shape)
        if self.engine.max_pooling_kernel and pooling.supports(desc, x.shape):
            pooling.max_backward(self, desc, alpha, dy, x, beta, dx)
            return
        # dx = alpha·pool'(x, y)·dy + beta·dx
        ty, tx = self._descriptors.tensor(y.shape).handle, self._descriptors.tensor(x.shape).handle
        cudnn.pooling_backward(self._cudnn, self._descriptors.pooling(desc).handle, self._scalar(alpha),
                               ty, y.data.ptr, ty, dy.data.ptr, tx, x.data.ptr, self._scalar(beta), tx, dx.data.ptr)

    # ---- our kernels --------------------------------------------------------------------------
    def cross_entropy_loss(self, predict, target, loss, accumulate: bool = False) -> None:
        """kernels/loss.cu: block sums in shared memory, one atomicAdd per block."""
        self._elementwise_loss("cross_entropy_loss", predict, target, loss, accumulate)

    def squared_error_loss(self, predict, target, loss, accumulate: bool = False) -> None:
        self._elementwise_loss("squared_error_loss", predict, target, loss, accumulate)

    def _elementwise_loss(self, name: str, predict, target, loss, accumulate: bool) -> None:
        _same_shape(name, predict, target)
        self._zero_unless(accumulate, loss)
        total = predict.size  # N·classes
        self.context.kernel(name).launch(blocks_for(total), self._stream, loss.data.ptr, predict.data.ptr,
                                         target.data.ptr, total, 1.0 / predict.n)

    def accuracy_count(self, predict, target, count, accumulate: bool = False) -> None:
        _same_shape("accuracy_count", predict, target)
        self._zero_unless(accumulate, count)
        self.context.kernel("accuracy_count").launch(blocks_for(predict.n), self._stream, count.data.ptr,
                                                     predict.data.ptr, target.data.ptr, predict.n, predict.sample_size)

    def record_nonfinite(self, watch, loss) -> None:
        """kernels/nonfinite.cu: one thread counts the step and notes it if loss[0] is not finite (graph-safe)."""
        check_nonfinite_operands(watch, loss)
        self.context.kernel("record_nonfinite").launch(1, self._stream, watch.data.ptr, loss.data.ptr)

    def gather_batch(self, images, labels, order, cursor, x, target) -> None:
        """kernels/data.cu: x[b] = images[order[cursor + b]], target[b] = one_hot(labels[order[cursor + b]])."""
        _check_gather(images, labels, order, cursor, x, target)
        total = x.size
        self.context.kernel("gather_batch").launch(
            blocks_for(total), self._stream, x.data.ptr, target.data.ptr, images.data.ptr, labels.data.ptr,
            order.data.ptr, cursor.data.ptr, x.n, x.sample_size, target.sample_size)

    def gather_augmented_batch(self, images, labels, order, cursor, counter, x, target, padding: int, flip: bool,
                               seed: int) -> None:
        """kernels/data.cu: gather_batch with the crop and flip drawn by (seed, counter[0], b), in one
        launch that then advances counter[0] (graph-safe)."""
        _check_gather(images, labels, order, cursor, x, target)
        check_augmented_gather(images, counter, x, padding, seed)
        self.context.kernel("gather_augmented_batch").launch(
            blocks_for(x.size), self._stream, x.data.ptr, target.data.ptr, images.data.ptr, labels.data.ptr,
            order.data.ptr, cursor.data.ptr, counter.data.ptr, x.n, x.c, x.h, x.w, target.sample_size, padding,
            int(bool(flip)), seed)

    def _zero_unless(self, accumulate: bool, out) -> None:
        if not accumulate:
            runtime.memset_async(out.data.ptr, 0, FLOAT32_BYTES, self._stream)

    def sgd_update(self, param, grad, velocity, lr, momentum: float, weight_decay: float) -> None:
        """cuBLAS level-1 calls (``_sgd_cublas``); in fast mode kernels/sgd.cu, reading the rate on the
        device where ``lr`` is a one-element tensor. ``grad`` is never modified."""
        _same_shape("sgd_update", param, grad)
        if momentum:
            if velocity is None:
                raise UsageError("sgd_update: momentum is non-zero but no velocity tensor was given")
            _same_shape("sgd_update", param, velocity)
        if isinstance(lr, Tensor):
            self._check_device_scalar("sgd_update", lr)
        if self.engine.sgd_kernel:
            self._sgd_kernel(param, grad, velocity if momentum else None, lr, momentum, weight_decay)
            return
        self._sgd_cublas(((param, grad, velocity),), lr, momentum, weight_decay)

    def _sgd_kernel(self, param, grad, velocity, lr, momentum: float, weight_decay: float) -> None:
        """kernels/sgd.cu: four values a thread where every operand is 16-byte aligned, the rest one."""
        rate, value = (lr.data.ptr, 0.0) if isinstance(lr, Tensor) else (None, float(lr))
        operands = [param.data.ptr, grad.data.ptr, None if velocity is None else velocity.data.ptr]
        count = param.size
        vectors = count // 4 if all(pointer % 16 == 0 for pointer in operands if pointer is not None) else 0
        if vectors:
            # param = param - lr·(momentum·v + grad + wd·param)      float4s
            blocks = min(-(-vectors // BLOCK_SIZE), MAX_ELEMENTWISE_BLOCKS)
            self.context.kernel("sgd_update_x4").launch(blocks, self._stream, *operands, rate, value, momentum,
                                                        weight_decay, vectors)
        rest = count - 4 * vectors
        if rest:
            # the same for the values after the float4s
            offset = 4 * FLOAT32_BYTES * vectors
            self.context.kernel("sgd_update").launch(
                blocks_for(rest), self._stream, *(None if pointer is None else pointer + offset for pointer in operands),
                rate, value, momentum, weight_decay, rest)

    def _sgd_cublas(self, groups, lr, momentum: float, weight_decay: float) -> None:
        """SGD on every (param, grad, velocity) of ``groups`` with cuBLAS level-1 calls only, as the
        slides' cublasSaxpy update. A one-element tensor ``lr`` is read in device pointer mode through
        scalars made from it by cublasScopy/cublasSscal/cublasSaxpy, so a replayed graph follows it."""
        h = self._cublas
        neg_lr, decay, device = self._sgd_scalars(lr, momentum, weight_decay)
        if momentum:
            for param, grad, velocity in groups:
                n, p, g, v = param.size, param.data.ptr, grad.data.ptr, velocity.data.ptr
                cublas.sscal(h, n, self._scalar(momentum), v, 1)  # v = momentum·v
                cublas.saxpy(h, n, self._scalar(1.0), g, 1, v, 1)  # v += grad
                if weight_decay:
                    cublas.saxpy(h, n, self._scalar(weight_decay), p, 1, v, 1)  # v += wd·param
        with self._pointer_mode(device):
            for param, grad, velocity in groups:
                n, p = param.size, param.data.ptr
                if momentum:
                    cublas.saxpy(h, n, neg_lr, velocity.data.ptr, 1, p, 1)  # param -= lr·v
                    continue
                if weight_decay:
                    cublas.sscal(h, n, decay, p, 1)  # param = (1 - lr·wd)·param
                cublas.saxpy(h, n, neg_lr, grad.data.ptr, 1, p, 1)  # param -= lr·grad

    def _sgd_cublas_scaled(self, groups, lr, momentum: float, weight_decay: float, loss_scale) -> None:
        """``_sgd_cublas`` on gradients that carry a loss scale: the same cuBLAS calls, every
        coefficient a device scalar that kernels/loss_scale.cu's sgd_scaled_coefficients makes from the
        rate, 1/S and the skip flag, so that a skipped step scales by 1 and adds 0 (its non-finite
        gradients were set to 0 by find_nonfinite_gradients) and leaves weights and velocities as they were."""
        h, scalars = self._cublas, self._scaled_sgd_scalar_buffer().data.ptr
        keep, unscale, decay, neg_lr, shrink, neg_lr_unscaled = (scalars + FLOAT32_BYTES * i for i in range(6))
        rate, value = (lr.data.ptr, 0.0) if isinstance(lr, Tensor) else (None, float(lr))
        self.context.kernel("sgd_scaled_coefficients").launch(1, self._stream, scalars, rate, value,
                                                              loss_scale.data.ptr, momentum, weight_decay)
        with self._pointer_mode(device=True):
            for param, grad, velocity in groups:
                n, p, g = param.size, param.data.ptr, grad.data.ptr
                if momentum:
                    v = velocity.data.ptr
                    cublas.sscal(h, n, keep, v, 1)  # v = momentum·v
                    cublas.saxpy(h, n, unscale, g, 1, v, 1)  # v += grad/S
                    if weight_decay:
                        cublas.saxpy(h, n, decay, p, 1, v, 1)  # v += wd·param
                    cublas.saxpy(h, n, neg_lr, v, 1, p, 1)  # param -= lr·v
                    continue
                if weight_decay:
                    cublas.sscal(h, n, shrink, p, 1)  # param = (1 - lr·wd)·param
                cublas.saxpy(h, n, neg_lr_unscaled, g, 1, p, 1)  # param -= (lr/S)·grad

    def _scaled_sgd_scalar_buffer(self) -> Tensor:
        """(6,) device floats of sgd_scaled_coefficients, allocated on first use (never in a capture)."""
        if self._scaled_sgd_scalars is None:
            if self.context.is_capturing():
                raise DeviceError("the loss-scaled cuBLAS SGD update was first called during a CUDA graph capture; "
                                  "its device scalars are allocated on that call: run one step before capturing")
            self._scaled_sgd_scalars = Tensor.zeros((6,), self)
        return self._scaled_sgd_scalars

    def find_nonfinite_gradients(self, grads, loss_scale) -> None:
        """kernels/loss_scale.cu: one launch over the flat ``grads``; any inf or NaN sets the found flag
        of ``loss_scale`` and is set to 0."""
        check_loss_scale("find_nonfinite_gradients", loss_scale)
        self._check_device_scalar("find_nonfinite_gradients", loss_scale)
        if grads.size:
            self.context.kernel("find_nonfinite_gradients").launch(blocks_for(grads.size), self._stream,
                                                                   grads.data.ptr, grads.size, loss_scale.data.ptr)

    def update_loss_scale(self, loss_scale, growth_interval: int, min_scale: float, max_scale: float) -> None:
        """kernels/loss_scale.cu: one thread decides this step's skip and the next step's scale."""
        check_loss_scale("update_loss_scale", loss_scale)
        self._check_device_scalar("update_loss_scale", loss_scale)
        self.context.kernel("update_loss_scale").launch(1, self._stream, loss_scale.data.ptr, float(growth_interval),
                                                        float(min_scale), float(max_scale))

    def _sgd_scalars(self, lr, momentum: float, weight_decay: float):
        """(−lr, 1 − lr·wd, device): host pointers for a float ``lr``; for a tensor, pointers into
        ``_update_scalars`` computed from lr[0] on the device, read in device pointer mode."""
        if not isinstance(lr, Tensor):
            lr = float(lr)
            return self._scalar(-lr), self._scalar(1.0 - lr * weight_decay), False
        h, scalars = self._cublas, self._sgd_scalar_buffer().data.ptr
        neg_lr, decay, one = scalars, scalars + FLOAT32_BYTES, scalars + 2 * FLOAT32_BYTES
        # −lr = −1·lr
        cublas.scopy(h, 1, lr.data.ptr, 1, neg_lr, 1)
        cublas.sscal(h, 1, self._scalar(-1.0), neg_lr, 1)
        if weight_decay and not momentum:
            # 1 − lr·wd = 1 + (−wd)·lr
            cublas.scopy(h, 1, one, 1, decay, 1)
            cublas.saxpy(h, 1, self._scalar(-weight_decay), lr.data.ptr, 1, decay, 1)
        return neg_lr, decay, True

    def _sgd_scalar_buffer(self) -> Tensor:
        """(3,) device floats: −lr, 1 − lr·wd and the constant 1.0, allocated on first use (never in a capture)."""
        if self._update_scalars is None:
            if self.context.is_capturing():
                raise DeviceError("the cuBLAS SGD update was first called during a CUDA graph capture; its device "
                                  "scalars are allocated on that call: run one step before capturing")
            self._update_scalars = Tensor.zeros((3,), self)
            self.fill(self._update_scalars.view((1,), 2).data, 1.0, 1)
        return self._update_scalars

    @contextlib.contextmanager
    def _pointer_mode(self, device: bool):
        """CUBLAS_POINTER_MODE_DEVICE inside the block where ``device``; host mode afterwards."""
        if not device:
            yield
            return
        cublas.set_pointer_mode(self._cublas, cublas.POINTER_MODE_DEVICE)
        try:
            yield
        finally:
            cublas.set_pointer_mode(self._cublas, cublas.POINTER_MODE_HOST)

    # ---- fused calls: one launch each ---------------------------------------------------------
    def bias_activation_forward(self, desc: ActivationDescriptor | None, bias, y) -> None:
        """kernels/bias_activation.cu: one launch, y read and written once; under math "bf16", where
        y is a GEMM or convolution operand of the pass (low_precision.Bf16Copies), its bfloat16 copy
        is written in the same launch."""
        check_bias("bias_activation_forward", bias, y)
        if y.size >= INDEX_LIMIT:
            raise ShapeError(f"bias_activation_forward: y {y.shape} holds {y.size} values; the kernel indexes fewer than 2^31")
        mode, coef = (-1, 0.0) if desc is None else (int(desc.mode), float(desc.coef))
        y16 = self._bf16_copies.target(y.data) if self.math == "bf16" and y.size == y.data.size else None
        if y.h * y.w == 1 and y.c % 4 == 0 and (y.data.ptr | bias.data.ptr) % 16 == 0:
            # Dense layers' y as float4s: y (N, C) with C a multiple of 4, 16-byte aligned
            count4 = y.size // 4
            blocks = min(-(-count4 // BLOCK_SIZE), MAX_ELEMENTWISE_BLOCKS)
            self.context.kernel("bias_activation_forward_dense4").launch(blocks, self._stream, y.data.ptr, bias.data.ptr,
                                                                         count4, y.c // 4, mode, coef, y16)
            return
        self.context.kernel("bias_activation_forward").launch(blocks_for(y.size), self._stream, y.data.ptr, bias.data.ptr,
                                                              y.size, y.c, y.h * y.w, mode, coef, y16)

    def activation_bias_backward(self, desc: ActivationDescriptor, y, dy, dx, db) -> None:
        """kernels/activation.cu: dx = f'(y)·dy and each slab of samples' partial sums of dx in one pass
        (with one slab, db itself), then one launch adding the slabs in order; under math "bf16", dx's
        bfloat16 copy as ``activation_backward`` writes it. Four channels a thread where C is a multiple
        of 4 and every float32 operand is 16-byte aligned, else one."""
        check_activation_bias("activation_bias_backward", y, dy, dx, db)
        samples, channels = y.n, y.c
        dx16 = self._bf16_copies.target(dx.data) if self.math == "bf16" and dx.size == dx.data.size else None
        width = 4 if channels % 4 == 0 and all(t.data.ptr % 16 == 0 for t in (y, dy, dx, db)) else 1
        cut = activation_slabs(samples, channels, width)
        partial = db.data.ptr if cut.slabs == 1 else self._activation_partials().ptr
        kernel = "activation_bias_backward_x4" if width == 4 else "activation_bias_backward"
        # dx = f'(y)·dy,  partial[s] = Σ_{n in slab s} dx[n]      blocks (channels / (width·BLOCK_SIZE), slabs)
        self.context.kernel(kernel).launch(cut.blocks, self._stream, dx.data.ptr, y.data.ptr, dy.data.ptr,
                                           int(desc.mode), float(desc.coef), samples, channels // width,
                                           cut.slab_rows, partial, dx16)
        if cut.slabs > 1:
            # db = Σ_s partial[s]
            self.context.kernel("activation_bias_sums").launch(-(-channels // SUM_CHANNELS), self._stream,
                                                               db.data.ptr, partial, cut.slabs, channels)

    def _activation_partials(self) -> DeviceBuffer:
        """ACTIVATION_PARTIALS floats for activation_bias_backward's slab sums, allocated on first use
        (never in a capture) and shared by every launch on the one stream."""
        if self._activation_partial_sums is None:
            if self.context.is_capturing():
                raise DeviceError("activation_bias_backward was first called during a CUDA graph capture; its "
                                  "scratch is allocated on that call: run one step before capturing")
            self._activation_partial_sums = DeviceBuffer.allocate(FLOAT32_BYTES * ACTIVATION_PARTIALS)
        return self._activation_partial_sums

    def cross_entropy_backward(self, predict, target, grad, loss, count) -> None:
        """kernels/cross_entropy_backward.cu: grad = (predict - target)/N, loss[0] += the mean cross
        entropy, count[0] += the hits; block partials in shared memory, one atomicAdd per block and output."""
        _same_shape("cross_entropy_backward", predict, target)
        _same_shape("cross_entropy_backward", predict, grad)
        _check_fits("cross_entropy_backward", loss.data, 0, 1)
        _check_fits("cross_entropy_backward", count.data, 0, 1)
        self.context.kernel("cross_entropy_backward").launch(
            blocks_for(predict.size), self._stream, grad.data.ptr, loss.data.ptr, count.data.ptr, predict.data.ptr,
            target.data.ptr, predict.n, predict.sample_size, 1.0 / predict.n)

    def softmax_cross_entropy_backward(self, logits, target, predict, grad, loss, count) -> None:
        """kernels/cross_entropy_backward.cu: cudnnSoftmaxForward and ``cross_entropy_backward`` in
        one launch, SOFTMAX_GROUP lanes per sample."""
        for other in (predict, grad):
            _same_shape("softmax_cross_entropy_backward", logits, other)
        self._softmax_cross_entropy("softmax_cross_entropy_backward", logits, target, predict.data.ptr, grad.data.ptr,
                                    loss, count, 1.0 / logits.n, 1.0 / logits.n)

    def softmax_cross_entropy_metrics(self, logits, target, loss, count, loss_scale) -> None:
        """kernels/cross_entropy_backward.cu's softmax_cross_entropy_backward with predict and grad null:
        loss[0] and count[0] added to in one launch, nothing else written (no cudnnSoftmaxForward)."""
        self._softmax_cross_entropy("softmax_cross_entropy_metrics", logits, target, 0, 0, loss, count, 0.0,
                                    float(loss_scale))

    def _softmax_cross_entropy(self, call: str, logits, target, predict_ptr: int, grad_ptr: int, loss, count,
                               grad_scale: float, loss_scale: float) -> None:
        """One launch of softmax_cross_entropy_backward after the checks; a null (0) predict or grad
        pointer is not written."""
        _same_shape(call, logits, target)
        _check_fits(call, loss.data, 0, 1)
        _check_fits(call, count.data, 0, 1)
        self.context.kernel("softmax_cross_entropy_backward").launch(
            blocks_for(logits.n * SOFTMAX_GROUP), self._stream, predict_ptr, grad_ptr, loss.data.ptr, count.data.ptr,
            logits.data.ptr, target.data.ptr, logits.n, logits.sample_size, grad_scale, loss_scale)

    def sgd_update_many(self, groups, lr, momentum: float, weight_decay: float, loss_scale=None) -> None:
        """The slides' cuBLAS calls on every parameter (``_sgd_cublas``, or ``_sgd_cublas_scaled`` with
        ``loss_scale``); in fast mode kernels/sgd_update_many.cu: one launch over every parameter of
        ``groups``, through a device table of their pointers uploaded on the first call with this list
        (never inside a capture). ``grad`` is never modified."""
        if loss_scale is not None:
            check_loss_scale("sgd_update_many", loss_scale)
            self._check_device_scalar("sgd_update_many", loss_scale)
        if not self.engine.sgd_kernel:
            for param, grad, velocity in groups:
                _sgd_entry(param, grad, velocity, momentum)
            if isinstance(lr, Tensor):
                self._check_device_scalar("sgd_update_many", lr)
            if groups and loss_scale is not None:
                self._sgd_cublas_scaled(groups, lr, momentum, weight_decay, loss_scale)
            elif groups:
                self._sgd_cublas(groups, lr, momentum, weight_decay)
            return
        table = self._sgd_table(groups, momentum)
        if table is None:
            return
        if isinstance(lr, Tensor):
            self._check_device_scalar("sgd_update_many", lr)
            rate, value = lr.data.ptr, 0.0
        else:
            rate, value = None, float(lr)
        self.context.kernel("sgd_update_many").launch(blocks_for(table.total), self._stream, table.buffer.ptr,
                                                      table.tensors, table.total, rate, value, momentum, weight_decay,
                                                      None if loss_scale is None else loss_scale.data.ptr)

    def _sgd_table(self, groups, momentum: float) -> SgdTable | None:
        """The cached table of this list of pointers (None for an empty list)."""
        key = tuple(_sgd_entry(param, grad, velocity, momentum) for param, grad, velocity in groups)
        if not key:
            return None
        table = self._sgd_tables.get(key)
        if table is None:
            table = self._sgd_tables[key] = self._upload_sgd_table(key)
            if len(self._sgd_tables) > SGD_TABLE_CACHE_SIZE:
                self._sgd_tables.popitem(last=False)
        self._sgd_tables.move_to_end(key)
        return table

    def _upload_sgd_table(self, key) -> SgdTable:
        """struct SgdTensor[] of (param, grad, velocity, offset, size), copied to a new device buffer."""
        if self.context.is_capturing():
            raise DeviceError(
                f"sgd_update_many was first called with this list of {len(key)} parameters during a CUDA graph "
                "capture; its device table is uploaded on that call: run one step before capturing"
            )
        rows, offset = [], 0
        for param, grad, velocity, size in key:
            rows.append((param, grad, velocity, offset, size))
            offset += size
        host_rows = np.array(rows, dtype=np.uint64)
        buffer = DeviceBuffer.allocate(host_rows.nbytes)
        runtime.memcpy_async(buffer.ptr, host_rows.ctypes.data, host_rows.nbytes, runtime.MEMCPY_HOST_TO_DEVICE,
                             self._stream)
        log.debug("sgd_update_many: table of %d parameters, %d values", len(rows), offset)
        return SgdTable(buffer, host_rows, len(rows), offset)

    # ---- layers and optimisers of issue 18: Adam, dropout, batch normalisation -------------------
    def adam_update_many(self, groups, lr, counter, beta1: float, beta2: float, eps: float, weight_decay: float,
                         decoupled: bool, loss_scale=None) -> None:
        """kernels/adam_update_many.cu: one launch over every parameter of ``groups``, through a device
        table of their pointers uploaded on the first call with this list (never inside a capture).
        The kernel reads the step from counter[0] and its last block advances it (not on a step that
        ``loss_scale`` skips)."""
        _check_fits("adam_update_many", counter.data, 0, 2)
        if loss_scale is not None:
            check_loss_scale("adam_update_many", loss_scale)
            self._check_device_scalar("adam_update_many", loss_scale)
        table = self._adam_table(groups)
        if table is None:
            return
        if isinstance(lr, Tensor):
            self._check_device_scalar("adam_update_many", lr)
            rate, value = lr.data.ptr, 0.0
        else:
            rate, value = None, float(lr)
        self.context.kernel("adam_update_many").launch(
            blocks_for(table.total), self._stream, table.buffer.ptr, table.tensors, table.total, rate, value,
            counter.data.ptr, beta1, beta2, eps, weight_decay, int(bool(decoupled)),
            None if loss_scale is None else loss_scale.data.ptr)

    @functools.cached_property
    def _adam_tables(self) -> OrderedDict:
        """((param, grad, m, v, size) pointers...) -> SgdTable of kernels/adam_update_many.cu's rows."""
        return OrderedDict()

    def _adam_table(self, groups) -> SgdTable | None:
        """The cached table of this list of pointers (None for an empty list)."""
        key = tuple(_adam_entry(*group) for group in groups)
        if not key:
            return None
        table = self._adam_tables.get(key)
        if table is None:
            if self.context.is_capturing():
                raise DeviceError(
                    f"adam_update_many was first called with this list of {len(key)} parameters during a CUDA graph "
                    "capture; its device table is uploaded on that call: run one step before capturing")
            table = self._adam_tables[key] = self._upload_adam_table(key)
            if len(self._adam_tables) > SGD_TABLE_CACHE_SIZE:
                self._adam_tables.popitem(last=False)
        self._adam_tables.move_to_end(key)
        return table

    def _upload_adam_table(self, key) -> SgdTable:
        """struct AdamTensor[] of (param, grad, m, v, offset, size), copied to a new device buffer."""
        rows, offset = [], 0
        for param, grad, m, v, size in key:
            rows.append((param, grad, m, v, offset, size))
            offset += size
        host_rows = np.array(rows, dtype=np.uint64)
        buffer = DeviceBuffer.allocate(host_rows.nbytes)
        runtime.memcpy_async(buffer.ptr, host_rows.ctypes.data, host_rows.nbytes, runtime.MEMCPY_HOST_TO_DEVICE,
                             self._stream)
        log.debug("adam_update_many: table of %d parameters, %d values", len(rows), offset)
        return SgdTable(buffer, host_rows, len(rows), offset)

    def dropout_state(self, rate: float, seed: int) -> DropoutState:
        """cudnnDropoutGetStatesSize, then cudnnSetDropoutDescriptor on a new states buffer."""
        return DropoutState(self.context, rate, seed)

    def dropout_reserve(self, state, x_shape) -> DropoutReserve:
        """cudnnDropoutGetReserveSpaceSize bytes for inputs of ``x_shape``."""
        x_shape = as_shape(x_shape)
        nbytes = cudnn.dropout_get_reserve_space_size(self._descriptors.tensor(x_shape).handle)
        return DropoutReserve(x_shape, DeviceBuffer.allocate(max(nbytes, FLOAT32_BYTES)), nbytes)

    def dropout_forward(self, state, reserve, x, y) -> None:
        """cudnnDropoutForward: y = x·mask/(1 - rate), a new mask from the state's generator."""
        _same_shape("dropout_forward", x, y)
        _expect_shape("dropout_forward", "the input (the reserve's shape)", x, reserve.shape)
        t = self._descriptors.tensor(x.shape).handle
        cudnn.dropout_forward(self._cudnn, state.descriptor.handle, t, x.data.ptr, t, y.data.ptr, reserve.buffer.ptr,
                              reserve.nbytes)

    def dropout_backward(self, state, reserve, dy, dx) -> None:
        """cudnnDropoutBackward: dx = dy·mask/(1 - rate), the last forward's mask."""
        _same_shape("dropout_backward", dy, dx)
        _expect_shape("dropout_backward", "dy (the reserve's shape)", dy, reserve.shape)
        t = self._descriptors.tensor(dy.shape).handle
        cudnn.dropout_backward(self._cudnn, state.descriptor.handle, t, dy.data.ptr, t, dx.data.ptr,
                               reserve.buffer.ptr, reserve.nbytes)

    def batch_norm_forward_training(self, mode, x, y, scale, bias, factor: float, running_mean, running_var,
                                    eps: float, save_mean, save_inv_std, relu: bool = False) -> None:
        """cudnnBatchNormalizationForwardTraining; in the fast engine our kernels (batch_norm.py), which
        also apply a ReLU to y where ``relu``."""
        _same_shape("batch_norm_forward_training", x, y)
        p = self._batch_norm_parameters("batch_norm_forward_training", mode, x, scale, bias, running_mean,
                                        running_var, save_mean, save_inv_std)
        if self.engine.batch_norm_kernel:
            self._batch_norm.forward(mode, x, y, scale, bias, factor, running_mean, running_var, eps, save_mean,
                                     save_inv_std, relu)
            return
        _no_relu("batch_norm_forward_training", relu)
        t = self._descriptors.tensor(x.shape).handle
        cudnn.batch_normalization_forward_training(
            self._cudnn, int(mode), self._scalar(1.0), self._scalar(0.0), t, x.data.ptr, t, y.data.ptr, p,
            scale.data.ptr, bias.data.ptr, float(factor), running_mean.data.ptr, running_var.data.ptr, float(eps),
            save_mean.data.ptr, save_inv_std.data.ptr)

    def batch_norm_forward_inference(self, mode, x, y, scale, bias, mean, var, eps: float) -> None:
        """cudnnBatchNormalizationForwardInference."""
        _same_shape("batch_norm_forward_inference", x, y)
        p = self._batch_norm_parameters("batch_norm_forward_inference", mode, x, scale, bias, mean, var)
        t = self._descriptors.tensor(x.shape).handle
        cudnn.batch_normalization_forward_inference(
            self._cudnn, int(mode), self._scalar(1.0), self._scalar(0.0), t, x.data.ptr, t, y.data.ptr, p,
            scale.data.ptr, bias.data.ptr, mean.data.ptr, var.data.ptr, float(eps))

    def batch_norm_backward(self, mode, x, dy, dx, scale, dscale, dbias, eps: float, save_mean,
                            save_inv_std, bias=None, relu: bool = False) -> None:
        """cudnnBatchNormalizationBackward; in the fast engine our kernels (batch_norm.py), which with
        ``relu`` take dy as the gradient after a ReLU applied by the forward pass (``bias`` given)."""
        _same_shape("batch_norm_backward", x, dy)
        _same_shape("batch_norm_backward", x, dx)
        p = self._batch_norm_parameters("batch_norm_backward", mode, x, scale, dscale, dbias, save_mean,
                                        save_inv_std, *(() if bias is None else (bias,)))
        if self.engine.batch_norm_kernel:
            if relu and bias is None:
                raise UsageError("batch_norm_backward: relu needs the bias (the forward's ReLU is recomputed from x)")
            self._batch_norm.backward(mode, x, dy, dx, scale, scale if bias is None else bias, dscale, dbias,
                                      save_mean, save_inv_std, relu)
            return
        _no_relu("batch_norm_backward", relu)
        t = self._descriptors.tensor(x.shape).handle
        one, zero = self._scalar(1.0), self._scalar(0.0)
        cudnn.batch_normalization_backward(
            self._cudnn, int(mode), one, zero, one, zero, t, x.data.ptr, t, dy.data.ptr, t, dx.data.ptr, p,
            scale.data.ptr, dscale.data.ptr, dbias.data.ptr, float(eps), save_mean.data.ptr, save_inv_std.data.ptr)

    def _batch_norm_parameters(self, call: str, mode, x, *parameters) -> int:
        """The descriptor of the per-channel (SPATIAL) or per-value (PER_ACTIVATION) parameter tensors,
        each checked to hold that many values."""
        if mode == BatchNormMode.SPATIAL:
            shape = (1, x.c, 1, 1)
        elif mode == BatchNormMode.PER_ACTIVATION:
            shape = (1,) + x.shape[1:]
        else:
            raise UsageError(f"{call}: unknown mode {mode!r}; valid are PER_ACTIVATION (0) and SPATIAL (1)")
        for tensor in parameters:
            if tensor.size != shape[1] * shape[2] * shape[3]:
                raise ShapeError(f"{call}: a parameter of shape {tensor.shape} does not fit x {x.shape} in mode "
                                 f"{BatchNormMode(mode).name}; expected {shape}")
        return self._descriptors.tensor(shape).handle


class ConvolutionTimer:
    """Times one run of a convolution direction with a candidate plan, on scratch tensors of the
    plan's shapes (zeros), with CUDA events: one warm-up run, then the fastest of three, each queued
    behind the ``spin`` kernel (kernels/timing.cu) so that host launch overhead is not timed."""

    RUNS = 3
    SPIN_NS = 300_000  # more than the host needs to queue one run of a direction

    def __init__(self, backend: CudaBackend, x_shape, w_shape, y_shape):
        self.backend = backend
        self.x, self.dx = Tensor.zeros(x_shape, backend), Tensor.zeros(x_shape, backend)  # (N, C, H, W)
        self.w, self.dw = Tensor.zeros(w_shape, backend), Tensor.zeros(w_shape, backend)  # (K, C, R, S)
        self.dy = Tensor.zeros(y_shape, backend)  # (N, K, OH, OW)
        self.start, self.end = Event(), Event()

    def run(self, plan: ConvolutionPlan, direction: str) -> None:
        b = self.backend
        if direction == "forward":
            b.convolution_forward(plan, 1.0, self.x, self.w, 0.0, self.dy)
        elif direction == "backward_data":
            b.convolution_backward_data(plan, 1.0, self.w, self.dy, 0.0, self.dx)
        else:
            b.convolution_backward_filter(plan, 1.0, self.x, self.dy, 0.0, self.dw)

    def measure(self, plan: ConvolutionPlan, direction: str) -> float:
        """Milliseconds of the fastest of RUNS runs, after one warm-up run."""
        stream = self.backend.context.stream
        self.backend.context.ones(plan.gemm_shape.batch)
        self.run(plan, direction)
        times = []
        for _ in range(self.RUNS):
            # the GPU spins while the host queues the run, so the events time the GPU, not the launches
            self.backend.context.kernel("spin").launch(1, stream.handle, self.SPIN_NS)
            self.start.record(stream)
            self.run(plan, direction)
            self.end.record(stream)
            self.end.synchronize()
            times.append(self.start.elapsed_ms(self.end))
        return min(times)


# ---- argument checks (cheap, host-side: a bad size must not become an out-of-bounds access) -----
def _no_relu(call: str, relu: bool) -> None:
    if relu:
        raise UsageError(f"{call}: relu is applied by the fast engine's kernels only; the slides engine runs "
                         "cuDNN's calls and the Activation layer its own")


def _check_fits(call: str, storage: DeviceBuffer, offset: int, size: int) -> None:
    if offset < 0 or size < 0 or offset + size > storage.size:
        raise ShapeError(f"{call}: [{offset}:{offset + size}] does not fit in storage of {storage.size} values")


def _stored(trans, rows: int, cols: int, name: str) -> tuple[int, int]:
    """The stored shape of a matrix whose op() is rows×cols."""
    if trans not in (OP_N, OP_T):
        raise UsageError(f"invalid transpose flag for {name}: {trans!r}; valid are OP_N (0) and OP_T (1)")
    return (rows, cols) if trans == OP_N else (cols, rows)


def _extent(rows: int, cols: int, ld: int) -> int:
    """The values from a column-major matrix's first to its last (0 for an empty one)."""
    return ld * (cols - 1) + rows if rows and cols else 0


def _check_matrix(call: str, name: str, tensor, rows: int, cols: int, ld: int) -> None:
    if ld < max(1, rows):
        raise ShapeError(f"{call}: leading dimension of {name} must be >= max(1, {rows}), got {ld}")
    need = ld * (cols - 1) + rows if rows and cols else 0
    if need > tensor.data.size:
        raise ShapeError(f"{call}: {name} ({rows}x{cols}, ld={ld}) needs {need} values, its storage holds {tensor.data.size}")


def _check_vector(call: str, name: str, tensor, n: int, inc: int) -> None:
    if inc == 0:
        raise UsageError(f"{call}: increment of {name} must be non-zero, got {inc}")
    need = (n - 1) * abs(inc) + 1 if n > 0 else 0
    if need > tensor.data.size:
        raise ShapeError(f"{call}: {name} (n={n}, inc={inc}) needs {need} values, its storage holds {tensor.data.size}")


def _sgd_entry(param, grad, velocity, momentum: float) -> tuple[int, int, int, int]:
    """(param, grad, velocity or 0, size) of one parameter for sgd_update_many, its shapes checked."""
    _same_shape("sgd_update_many", param, grad)
    if not momentum:
        return (param.data.ptr, grad.data.ptr, 0, param.size)
    if velocity is None:
        raise UsageError("sgd_update_many: momentum is non-zero but a parameter has no velocity tensor")
    _same_shape("sgd_update_many", param, velocity)
    return (param.data.ptr, grad.data.ptr, velocity.data.ptr, param.size)


def _adam_entry(param, grad, m, v) -> tuple[int, int, int, int, int]:
    """(param, grad, m, v, size) pointers of one parameter for adam_update_many, its shapes checked."""
    for other in (grad, m, v):
        _same_shape("adam_update_many", param, other)
    return (param.data.ptr, grad.data.ptr, m.data.ptr, v.data.ptr, param.size)


def _same_shape(call: str, a, b) -> None:
    if a.shape != b.shape:
        raise ShapeError(f"{call}: tensors must have the same shape, got {a.shape} and {b.shape}")


def _expect_shape(call: str, what: str, tensor, shape) -> None:
    if tensor.shape != tuple(shape):
        raise ShapeError(f"{call}: {what} must have shape {tuple(shape)}, got {tensor.shape}")


def _check_convolution_shapes(desc: ConvolutionDescriptor, x_shape, y_shape) -> None:
    if x_shape[1] != desc.in_channels:
        raise ShapeError(f"convolution: input {x_shape} has {x_shape[1]} channels, the filter {desc.in_channels}")
    expected = desc.output_shape(x_shape)
    if y_shape != expected or min(expected) < 1:
        raise ShapeError(f"convolution: input {x_shape} gives output {expected} with {desc}, got {y_shape}")


def _check_plan(call: str, plan, x, w, y) -> None:
    if not isinstance(plan, ConvolutionPlan):
        raise UsageError(f"{call}: expected a plan from CudaBackend.convolution_plan, got {type(plan).__name__}")
    _expect_shape(call, "the input", x, plan.x_shape)
    _expect_shape(call, "the filter", w, plan.desc.filter_shape)
    _expect_shape(call, "the output", y, plan.y_shape)


def _check_gather(images, labels, order, cursor, x, target) -> None:
    """The shapes gather_batch needs, else a ShapeError naming the argument."""
    if x.shape[1:] != images.shape[1:] or target.n != x.n or labels.size != images.n or order.size != images.n:
        raise ShapeError(f"gather_batch: images {images.shape}, labels {labels.shape}, order {order.shape}, "
                         f"x {x.shape}, target {target.shape} do not fit together")
    if cursor.size != 1:
        raise ShapeError(f"gather_batch: cursor must hold one value, got shape {cursor.shape}")
    if x.size >= INDEX_LIMIT:
        raise ShapeError(f"gather_batch: a batch of shape {x.shape} holds {x.size} values; the kernel indexes fewer than 2^31")
