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
cuDNN's PSEUDO_HALF_CONFIG); the other calls stay float32. A 16-bit multilayer perceptron's
activations are 16-bit tensors: its GEMMs read them as they are and write a 16-bit C (cublasGemmEx or
cuBLASLt, rounded once from the FP32 sum: under bf16 and fp16 cuBLAS runs with
CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION, and cuBLASLt's algorithms of a 16-bit C are asked
for without the reduction scheme that sums a split K in C's type), sgemv becomes that GEMM, cuDNN's activation calls take
16-bit descriptors, the softmax converts its 16-bit logits to float32 (in the cuDNN workspace)
first, and the fast engine's kernels have 16-bit twins (``*16``). Plans made before ``set_math``
keep their math type.
"""

from __future__ import annotations

import numpy as np

from ...engine import Engine
from ...errors import ShapeError, UsageError
from ...precision import BF16, FLOAT32, FP16, FP32, TF32, DType, Precision
from ...tensor import Tensor, as_shape
from ..arguments import OP_N, OP_T, batch_norm_parameter_shape, check_fits, check_same_dtype, extent, stored_shape
from ..base import Backend
from ..descriptors import ActivationDescriptor, ConvolutionDescriptor, PoolingDescriptor
from ..rounding import from_storage, to_storage
from .dropout import DropoutReserve, DropoutState
from .array_protocols import ArrayProtocols
from .bindings import cublas, cublaslt, cudnn, runtime
from .buffer import FLOAT32_BYTES, DeviceBuffer
from .backward_bias import backward_bias
from .batch_norm import BatchNormKernels
from .channel_sum import ChannelSum
from .context import CudaContext
from .convolution import BACKWARD_DATA, BACKWARD_FILTER, FORWARD, ConvolutionPlan
from .convolution_planner import ConvolutionPlanner, search_label
from .gemm_convolution import INDEX_LIMIT
from .kernel import blocks_for
from .conversion import convert_storage
from .low_precision import HALF_FORMATS, half_format, through_float32
from . import pooling
from .activation_kernels import ActivationKernels
from .matmul import GemmEngine, GemmProblem, alignment
from .optimisers import CudaOptimisers, check_device_scalar

# precision: (cublasMath_t, cudnnMathType_t of convolutions)
MATH_MODES = {
    FP32: (cublas.DEFAULT_MATH, cudnn.FMA_MATH),
    TF32: (cublas.TF32_TENSOR_OP_MATH, cudnn.TENSOR_OP_MATH_ALLOW_CONVERSION),
    BF16: (cublas.DEFAULT_MATH | cublas.DISALLOW_REDUCED_PRECISION_REDUCTION, cudnn.TENSOR_OP_MATH),
    FP16: (cublas.DEFAULT_MATH | cublas.DISALLOW_REDUCED_PRECISION_REDUCTION, cudnn.TENSOR_OP_MATH),
}
SOFTMAX_GROUP = 16  # lanes per sample in softmax_cross_entropy_backward (GROUP there)


class CudaBackend(ArrayProtocols, Backend):
    """The product: a layer's cuBLAS/cuDNN verbs run on one NVIDIA GPU."""

    name = "cuda"
    plan_type = ConvolutionPlan  # what convolution_plan gives
    maths = tuple(precision.name for precision in MATH_MODES)

    def __init__(self, device: int = 0, workspace_limit: int = 256 << 20, engine: "str | Engine" = "slides"):
        self.context = CudaContext(device)
        self.device_name = self.context.device_name
        self.set_engine(engine)
        self._convolutions = ConvolutionPlanner(self, workspace_limit)  # convolution plans, their search and timing
        self._stream = self.context.stream.handle
        self._cublas = self.context.cublas.handle
        self._gemm = GemmEngine(self.context, self.context.scalar)  # sgemm's plans
        self._channel_sum = ChannelSum(self.context)  # convolution_backward_bias, with its scratch
        self._batch_norm = BatchNormKernels(self.context)  # the fast engine's batch normalisation in training
        self._optimisers = CudaOptimisers(self)  # SGD and Adam: cuBLAS paths, kernels, parameter tables
        self._activations = ActivationKernels(self.context)  # the fast engine's activation and bias kernels
        self.set_math(FP32)  # the default; cuBLAS's math mode follows the precision in force (_use_precision)

    def __repr__(self) -> str:
        return (f"CudaBackend(device={self.context.device}, {self.device_name!r}, math={self.math!r}, "
                f"engine={self.engine.name!r})")

    @property
    def algorithm_search(self) -> str:
        """How convolution algorithms are chosen, as plan keys name it (convolution_planner.search_label)."""
        return search_label(self.engine)

    @property
    def workspace_limit(self) -> int:
        """Bytes a convolution algorithm may use."""
        return self._convolutions.workspace_limit

    # ---- configuration ------------------------------------------------------------------------
    def _use_precision(self, precision: Precision) -> None:
        """cuBLAS's math mode is the handle's: set to ``precision``'s whenever the precision in force
        changes ("fp32" exact; "tf32" tensor cores, ~1e-3 relative error; "bf16" and "fp16" run on 16-bit
        copies, ~4e-3 and ~5e-4). A convolution's math type is set on its descriptor instead."""
        cublas.set_math_mode(self._cublas, MATH_MODES[precision][0])

    def memory_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory (cudaMemGetInfo)."""
        return runtime.mem_get_info()

    def close(self) -> None:
        """Release the context (handles, workspace, stream). The backend is unusable afterwards."""
        self._convolutions.close()
        self._optimisers.close()
        self._gemm.close()
        self.context.close()
        self._channel_sum.close()
        self._batch_norm.close()
        self._activations.close()

    # ---- memory: 16-bit values are rounded on the host (backends/rounding.py) and their bits copied -----
    def empty(self, size: int, dtype: DType = FLOAT32) -> DeviceBuffer:
        return DeviceBuffer.allocate(dtype.itemsize * int(size), dtype)

    def upload(self, array, dtype: DType = FLOAT32) -> DeviceBuffer:
        """cudaMemcpyAsync H2D of the values rounded to ``dtype`` (pageable memory is staged before the call returns)."""
        flat = to_storage(dtype, array)
        buffer = DeviceBuffer.allocate(flat.nbytes, dtype)
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
        """cudaMemcpyAsync H2D into existing memory (its address stays, as a captured graph needs), the
        values rounded to the storage's dtype."""
        flat = to_storage(storage.dtype, array)
        check_fits("write", storage, 0, flat.size)
        if flat.nbytes:
            runtime.memcpy_async(storage.ptr, flat.ctypes.data, flat.nbytes, runtime.MEMCPY_HOST_TO_DEVICE, self._stream)

    def download(self, storage: DeviceBuffer, size: int) -> np.ndarray:
        """cudaMemcpyAsync D2H, then cudaStreamSynchronize; float32 values whatever the storage's dtype."""
        check_fits("download", storage, 0, size)
        array = np.empty(int(size), storage.dtype.storage)
        if array.nbytes:
            runtime.memcpy_async(array.ctypes.data, storage.ptr, array.nbytes, runtime.MEMCPY_DEVICE_TO_HOST, self._stream)
        self.synchronize()
        return array if storage.dtype is FLOAT32 else from_storage(array)

    def copy(self, src: DeviceBuffer, dst: DeviceBuffer, size: int) -> None:
        """cudaMemcpyAsync D2D, storage of one dtype."""
        check_same_dtype("copy", src, dst)
        check_fits("copy", src, 0, size)
        check_fits("copy", dst, 0, size)
        if size:
            runtime.memcpy_async(dst.ptr, src.ptr, src.dtype.itemsize * size, runtime.MEMCPY_DEVICE_TO_DEVICE,
                                 self._stream)

    def convert(self, src: DeviceBuffer, dst: DeviceBuffer, size: int) -> None:
        """dst[:size] = src[:size] rounded to dst's dtype: kernels/bf16.cu and fp16.cu (low_precision.py),
        through float32 scratch between two 16-bit types."""
        check_fits("convert", src, 0, size)
        check_fits("convert", dst, 0, size)
        if src.dtype is dst.dtype:
            self.copy(src, dst, size)
        elif size:
            convert_storage(self.context, src, dst, size)

    def fill(self, storage: DeviceBuffer, value: float, size: int) -> None:
        """cudaMemsetAsync for +0.0, else cuMemsetD32Async (float32) or cuMemsetD16Async (16-bit) with
        the bit pattern of ``value`` rounded to the storage's dtype."""
        check_fits("fill", storage, 0, size)
        bits = int(to_storage(storage.dtype, [value]).view(f"<u{storage.dtype.itemsize}")[0])
        if bits == 0:
            runtime.memset_async(storage.ptr, 0, storage.dtype.itemsize * size, self._stream)
        elif size and storage.dtype is FLOAT32:
            runtime.memset_d32_async(storage.ptr, bits, size, self._stream)
        elif size:
            runtime.memset_d16_async(storage.ptr, bits, size, self._stream)

    def view(self, storage: DeviceBuffer, offset: int, size: int) -> DeviceBuffer:
        """``size`` values of the storage's dtype from value ``offset``."""
        check_fits("view", storage, offset, size)
        return storage.view(storage.dtype.itemsize * offset, storage.dtype.itemsize * size)

    def synchronize(self) -> None:
        self.context.synchronize()

    supports_graphs = True

    def capture(self):
        """Record the calls made in the block as a CUDA graph (see CudaContext.capture)."""
        return self.context.capture()

    # ---- cuBLAS -------------------------------------------------------------------------------
    def _sgemm(self, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc) -> None:
        a, b, c = A.data.ptr, B.data.ptr, C.data.ptr
        if self.precision.half:
            self._gemm_bf16(transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)
            return
        if not self.engine.gemm_plans:
            self.context.finish_warm_up()  # the first GEMM waits for the cuBLAS warm-up thread, as a plan does
            # C = alpha·op(A)·op(B) + beta·C
            scalar = self.context.scalar
            cublas.sgemm(self._cublas, transa, transb, m, n, k, scalar(alpha), a, lda, b, ldb, scalar(beta), c, ldc)
            return
        self.gemm(GemmProblem(transa, transb, m, n, k, lda, ldb, ldc, precision=self.precision,
                              alignment=alignment(a, b, c)), alpha, a, b, beta, c)

    def _gemm_bf16(self, transa, transb, m, n, k, alpha, A: Tensor, lda: int, B: Tensor, ldb: int, beta, C: Tensor,
                   ldc: int) -> None:
        """C = alpha·op(bf16(A))·op(bf16(B)) + beta·C (fp16 copies under math "fp16"; a 16-bit A or B read
        as it is), FP32 accumulation, C float32 or 16-bit (rounded once): cublasGemmEx, or in the fast
        engine the problem's timed plan (cublasGemmEx or cublasLtMatmul, matmul.py)."""
        self.context.finish_warm_up()
        precision, c = self.precision, C.data.ptr
        fmt = half_format(precision)
        a16, b16 = self.context.half.operands((A, extent(*stored_shape(transa, m, k, "A"), lda)),
                                              (B, extent(*stored_shape(transb, k, n, "B"), ldb)), fmt=fmt)
        if self.engine.gemm_plans:
            self.gemm(GemmProblem(transa, transb, m, n, k, lda, ldb, ldc, precision=precision,
                                  alignment=alignment(a16, b16, c), c_half=C.dtype.half), alpha, a16, b16, beta, c)
            return
        # C = alpha·op(bf16(A))·op(bf16(B)) + beta·C      (fp16(A), fp16(B) under math "fp16")
        scalar = self.context.scalar
        c_type = fmt.cublas_type if C.dtype.half else cublas.R_32F
        cublas.gemm_ex(self._cublas, transa, transb, m, n, k, scalar(alpha), a16, fmt.cublas_type, lda, b16,
                       fmt.cublas_type, ldb, scalar(beta), c, c_type, ldc, cublas.COMPUTE_32F, cublas.GEMM_DEFAULT)

    def start_pass(self) -> None:
        """A network's forward and backward begin (Network.forward): under math "bf16" or "fp16", each
        GEMM and convolution operand is converted once, where first read, until ``end_pass``."""
        fmt = half_format(self.precision)
        if fmt is not None:
            self.context.half.copies.start(fmt)
        else:
            self.context.half.copies.stop()

    def end_pass(self) -> None:
        """The pass's operands may change from here on: every bfloat16 copy is made again when next read."""
        self.context.half.copies.stop()

    def gemm(self, problem: GemmProblem, alpha: float, a: int, b: int, beta: float, c: int) -> None:
        """``problem`` on raw device pointers (sizes checked by the caller), with its timed plan:
        cublasLtMatmul with the fastest algorithm, or cublasSgemm (see matmul.py)."""
        self._gemm.run(problem, "exhaustive", alpha, a, b, beta, c)

    def _sgemv(self, trans, m, n, alpha, A, lda, x, incx, beta, y, incy) -> None:
        """cublasSgemv; with a 16-bit A or x (a 16-bit MLP's dy), which cublasSgemv cannot read, the GEMM
        yᵀ(1 × rows) = alpha·xᵀ(1 × cols)·op(A)ᵀ + beta·yᵀ of ``_gemm_bf16`` (cublasGemmEx, the other
        operand converted to 16 bits as any GEMM operand is, FP32 sums)."""
        if A.dtype.half or x.dtype.half:
            transa, transb, gemm_m, gemm_n, k = sgemv_as_gemm(trans, m, n, incx, incy)
            # yᵀ = alpha·xᵀ·op(A)ᵀ + beta·yᵀ      (1 × rows) = (1 × cols) · (cols × rows)
            self._gemm_bf16(transa, transb, gemm_m, gemm_n, k, alpha, x, incx, A, lda, beta, y, incy)
            return
        cublas.sgemv(self._cublas, trans, m, n, self.context.scalar(alpha), A.data.ptr, lda, x.data.ptr, incx,
                     self.context.scalar(beta), y.data.ptr, incy)

    def _saxpy(self, n, alpha, x, incx, y, incy) -> None:
        self._with_scalar(cublas.saxpy, n, alpha, x.data.ptr, incx, y.data.ptr, incy)

    def _sscal(self, n, alpha, x, incx) -> None:
        """A negative ``incx`` scales the same n elements as ``|incx|`` (as the host does; reference
        BLAS and cuBLAS would quietly do nothing)."""
        self._with_scalar(cublas.sscal, n, alpha, x.data.ptr, abs(incx))

    def _scopy(self, n, x, incx, y, incy) -> None:
        cublas.scopy(self._cublas, n, x.data.ptr, incx, y.data.ptr, incy)

    def _with_scalar(self, function, n, alpha, *operands) -> None:
        """function(handle, n, &alpha, *operands): a float in host pointer mode, a one-element
        tensor in CUBLAS_POINTER_MODE_DEVICE (host mode restored afterwards)."""
        if not isinstance(alpha, Tensor):
            function(self._cublas, n, self.context.scalar(alpha), *operands)
            return
        check_device_scalar(self, function.__name__, alpha)
        with self.context.pointer_mode(device=True):
            function(self._cublas, n, alpha.data.ptr, *operands)

    def _bf16_target(self, tensor) -> int | None:
        """Where a kernel writing all of ``tensor`` also writes its bfloat16 copy (math "bf16", inside a
        pass, where it is a GEMM or convolution operand: low_precision.Bf16Copies.target), else None."""
        whole = tensor.size == tensor.data.size
        return self.context.half.copies.target(tensor.data) if self.precision == BF16 and whole else None

    # ---- cuDNN: pointwise ---------------------------------------------------------------------
    def _tensor_descriptor(self, tensor, shape=None) -> int:
        """The cuDNN descriptor of ``tensor`` (of ``shape``, default its own): CUDNN_DATA_FLOAT, or
        CUDNN_DATA_BFLOAT16 / CUDNN_DATA_HALF for a 16-bit network's activations."""
        data_type = HALF_FORMATS[tensor.dtype].cudnn_type if tensor.dtype.half else cudnn.DATA_FLOAT
        return self.context.descriptors.tensor(tensor.shape if shape is None else shape, data_type).handle

    def _activation_forward(self, desc: ActivationDescriptor, alpha, x, beta, y) -> None:
        context = self.context
        t, scalar = self._tensor_descriptor(x), context.scalar
        cudnn.activation_forward(context.cudnn.handle, context.descriptors.activation(desc).handle, scalar(alpha), t,
                                 x.data.ptr, scalar(beta), t, y.data.ptr)

    def _activation_backward(self, desc: ActivationDescriptor, alpha, y, dy, x, beta, dx) -> None:
        """cudnnActivationBackward; in the fast engine kernels/activation.cu, which under math "bf16"
        also writes dx's bfloat16 copy where dx is a GEMM or convolution operand of the pass."""
        if self.engine.activation_kernel and not isinstance(alpha, Tensor) and not isinstance(beta, Tensor):
            self._activations.backward(desc, float(alpha), y, dy, x, float(beta), dx, self._bf16_target(dx))
            return
        # dx = alpha·f'(x)·dy + beta·dx
        context = self.context
        t, scalar = self._tensor_descriptor(x), context.scalar
        cudnn.activation_backward(context.cudnn.handle, context.descriptors.activation(desc).handle, scalar(alpha), t,
                                  y.data.ptr, t, dy.data.ptr, t, x.data.ptr, scalar(beta), t, dx.data.ptr)

    def _softmax_forward(self, alpha, x, beta, y) -> None:
        """Over each sample's c·h·w values: MODE_CHANNEL on an (n, c·h·w, 1, 1) descriptor. 16-bit x (a
        16-bit MLP's logits; y is float32): its values are converted into the cuDNN workspace first
        (exact, kernels/bf16.cu or fp16.cu), and the softmax runs in float32 from there."""
        context = self.context
        t, scalar = context.descriptors.tensor((x.n, x.sample_size, 1, 1)).handle, context.scalar
        source = x.data.ptr
        if x.dtype.half:
            source = context.workspace(FLOAT32_BYTES * x.size)
            # x₃₂ = float(x₁₆)
            context.half.to_float(source, x.data.ptr, 1.0, 0.0, x.size, HALF_FORMATS[x.dtype])
        # y = alpha·softmax(x) + beta·y
        cudnn.softmax_forward(context.cudnn.handle, cudnn.SOFTMAX_ACCURATE, cudnn.SOFTMAX_MODE_CHANNEL, scalar(alpha), t,
                              source, scalar(beta), t, y.data.ptr)

    def _add_tensor(self, alpha, bias, beta, y) -> None:
        """cudnnAddTensor; a 16-bit y (a 16-bit CNN's) with the bias's 16-bit copy, as cuDNN takes one data type."""
        context = self.context
        bias_ptr = bias.data.ptr
        if y.dtype.half:
            (bias_ptr,) = context.half.operands((bias, bias.size), fmt=HALF_FORMATS[y.dtype])
        cudnn.add_tensor(context.cudnn.handle, context.scalar(alpha), self._tensor_descriptor(y, bias.shape), bias_ptr,
                         context.scalar(beta), self._tensor_descriptor(y), y.data.ptr)

    # ---- cuDNN: convolution -------------------------------------------------------------------
    def convolution_plan(self, desc: ConvolutionDescriptor, x_shape, y_shape) -> ConvolutionPlan:
        """The planner's plan (convolution_planner.py) for this (descriptor, input shape, math mode),
        chosen once and cached; the shared workspace grows to fit it."""
        precision = self.precision
        return self._convolutions.plan(desc, x_shape, y_shape, precision, MATH_MODES[precision][1], self.engine)

    def _convolution_forward(self, plan: ConvolutionPlan, alpha, x, w, beta, y) -> None:
        # y = alpha·(x ⋆ w) + beta·y
        self._convolutions.run(FORWARD, plan, alpha, x, w, beta, y)

    def _convolution_backward_data(self, plan: ConvolutionPlan, alpha, w, dy, beta, dx) -> None:
        # dx = alpha·(dy ⋆ᵀ w) + beta·dx
        self._convolutions.run(BACKWARD_DATA, plan, alpha, w, dy, beta, dx)

    def _convolution_backward_filter(self, plan: ConvolutionPlan, alpha, x, dy, beta, dw) -> None:
        # dw = alpha·Σₙ xₙ ⋆ dyₙ + beta·dw
        self._convolutions.run(BACKWARD_FILTER, plan, alpha, x, dy, beta, dw)

    def _convolution_backward_bias(self, alpha, dy, beta, db) -> None:
        """cudnnConvolutionBackwardBias, in two passes over reshaped views of dy from 32 samples on
        (see backward_bias.py); in fast mode, and for a 16-bit dy in both, kernels/channel_sum.cu (see
        channel_sum.py): one launch, deterministic, no library call."""
        if self.engine.channel_sum or dy.dtype.half:  # cuDNN's takes one data type; db stays float32
            self._channel_sum(alpha, dy, beta, db)
            return
        # db = alpha·Σ_{n,h,w} dy + beta·db      in one call, or two on reshaped views of dy
        backward_bias(self, alpha, dy, beta, db)

    # ---- cuDNN: pooling -----------------------------------------------------------------------
    def _pooling_forward(self, desc: PoolingDescriptor, alpha, x, beta, y) -> None:
        context = self.context
        scalar, descriptors = context.scalar, context.descriptors
        cudnn.pooling_forward(context.cudnn.handle, descriptors.pooling(desc).handle, scalar(alpha),
                              self._tensor_descriptor(x), x.data.ptr, scalar(beta), self._tensor_descriptor(y),
                              y.data.ptr)

    def _pooling_backward(self, desc: PoolingDescriptor, alpha, y, dy, x, beta, dx) -> None:
        """cudnnPoolingBackward; in fast mode, max pooling without padding whose windows do not overlap
        (stride ≥ window) runs kernels/pooling.cu (see pooling.py), y not read. A 16-bit dx of windows
        that overlap is computed on float32 copies (cuDNN sums a cell's windows in dx's type)."""
        if self.engine.max_pooling_kernel and pooling.supports(desc, x.shape):
            pooling.max_backward(self, desc, alpha, dy, x, beta, dx)
            return
        context = self.context
        scalar, descriptors = context.scalar, context.descriptors
        if dx.dtype.half and pooling.windows_overlap(desc):
            pooling.backward_through_float32(self, desc, alpha, y, dy, x, beta, dx)
            return
        # dx = alpha·pool'(x, y)·dy + beta·dx
        ty, tx = self._tensor_descriptor(y), self._tensor_descriptor(x)
        cudnn.pooling_backward(context.cudnn.handle, descriptors.pooling(desc).handle, scalar(alpha), ty, y.data.ptr, ty,
                               dy.data.ptr, tx, x.data.ptr, scalar(beta), tx, dx.data.ptr)

    # ---- our kernels --------------------------------------------------------------------------
    def _cross_entropy_loss(self, predict, target, loss, accumulate: bool = False) -> None:
        """kernels/loss.cu: block sums in shared memory, one atomicAdd per block."""
        self._elementwise_loss("cross_entropy_loss", predict, target, loss, accumulate)

    def _squared_error_loss(self, predict, target, loss, accumulate: bool = False) -> None:
        self._elementwise_loss("squared_error_loss", predict, target, loss, accumulate)

    def _elementwise_loss(self, name: str, predict, target, loss, accumulate: bool) -> None:
        self._zero_unless(accumulate, loss)
        total = predict.size  # N·classes
        self.context.kernel(name).launch(blocks_for(total), self._stream, loss.data.ptr, predict.data.ptr,
                                         target.data.ptr, total, 1.0 / predict.n)

    def _accuracy_count(self, predict, target, count, accumulate: bool = False) -> None:
        self._zero_unless(accumulate, count)
        self.context.kernel("accuracy_count").launch(blocks_for(predict.n), self._stream, count.data.ptr,
                                                     predict.data.ptr, target.data.ptr, predict.n, predict.sample_size)

    def _record_nonfinite(self, watch, loss) -> None:
        """kernels/nonfinite.cu: one thread counts the step and notes it if loss[0] is not finite (graph-safe)."""
        self.context.kernel("record_nonfinite").launch(1, self._stream, watch.data.ptr, loss.data.ptr)

    def _gather_batch(self, images, labels, order, cursor, x, target) -> None:
        """kernels/data.cu: x[b] = images[order[cursor + b]], target[b] = one_hot(labels[order[cursor + b]])."""
        _check_batch_indexable(x)
        total = x.size
        self.context.kernel("gather_batch").launch(
            blocks_for(total), self._stream, x.data.ptr, target.data.ptr, images.data.ptr, labels.data.ptr,
            order.data.ptr, cursor.data.ptr, x.n, x.sample_size, target.sample_size)

    def _gather_augmented_batch(self, images, labels, order, cursor, counter, x, target, padding: int, flip: bool,
                               seed: int) -> None:
        """kernels/data.cu: gather_batch with the crop and flip drawn by (seed, counter[0], b), in one
        launch that then advances counter[0] (graph-safe)."""
        _check_batch_indexable(x)
        self.context.kernel("gather_augmented_batch").launch(
            blocks_for(x.size), self._stream, x.data.ptr, target.data.ptr, images.data.ptr, labels.data.ptr,
            order.data.ptr, cursor.data.ptr, counter.data.ptr, x.n, x.c, x.h, x.w, target.sample_size, padding,
            int(bool(flip)), seed)

    def _zero_unless(self, accumulate: bool, out) -> None:
        if not accumulate:
            runtime.memset_async(out.data.ptr, 0, FLOAT32_BYTES, self._stream)

    def _sgd_update(self, param, grad, velocity, lr, momentum: float, weight_decay: float) -> None:
        """cuBLAS level-1 calls (optimisers.py: ``sgd_cublas``); in fast mode kernels/sgd.cu, reading the
        rate on the device where ``lr`` is a one-element tensor. ``grad`` is never modified."""
        if isinstance(lr, Tensor):
            check_device_scalar(self, "sgd_update", lr)
        if self.engine.sgd_kernel:
            self._optimisers.sgd_kernel(param, grad, velocity if momentum else None, lr, momentum, weight_decay)
            return
        self._optimisers.sgd_cublas(((param, grad, velocity),), lr, momentum, weight_decay)

    def _find_nonfinite_gradients(self, grads, loss_scale) -> None:
        """kernels/loss_scale.cu: one launch over the flat ``grads``; any inf or NaN sets the found flag
        of ``loss_scale`` and is set to 0."""
        check_device_scalar(self, "find_nonfinite_gradients", loss_scale)
        if grads.size:
            self.context.kernel("find_nonfinite_gradients").launch(blocks_for(grads.size), self._stream,
                                                                   grads.data.ptr, grads.size, loss_scale.data.ptr)

    def _update_loss_scale(self, loss_scale, growth_interval: int, min_scale: float, max_scale: float) -> None:
        """kernels/loss_scale.cu: one thread decides this step's skip and the next step's scale."""
        check_device_scalar(self, "update_loss_scale", loss_scale)
        self.context.kernel("update_loss_scale").launch(1, self._stream, loss_scale.data.ptr, float(growth_interval),
                                                        float(min_scale), float(max_scale))

    # ---- fused calls: one launch each ---------------------------------------------------------
    def _sgemm_bias_activation(self, transa, transb, m, n, k, A, lda, B, ldb, C, ldc, bias, desc) -> None:
        """One cublasLtMatmul, the bias (of C's 16 bits: the pass's copy) and a ReLU in its epilogue; where
        cuBLASLt offers no algorithm for it, the GEMM into float32 scratch, then bias_activation_to_half."""
        self.context.finish_warm_up()
        fmt = half_format(self.precision)
        a_values = extent(*stored_shape(transa, m, k, "A"), lda)
        b_values = extent(*stored_shape(transb, k, n, "B"), ldb)
        a16, b16, bias16 = self.context.half.operands((A, a_values), (B, b_values), (bias, m), fmt=fmt)
        c = C.data.ptr
        epilogue = cublaslt.EPILOGUE_BIAS if desc is None else cublaslt.EPILOGUE_RELU_BIAS
        # C₁₆ = f(op(A₁₆)·op(B₁₆) + b₁₆·1ᵀ)    FP32 sums, C rounded once
        if self._gemm.run(GemmProblem(transa, transb, m, n, k, lda, ldb, ldc, precision=self.precision, c_half=True,
                                      alignment=alignment(a16, b16, c), epilogue=epilogue), "exhaustive",
                          1.0, a16, b16, 0.0, c, bias16):
            return
        if m * n >= INDEX_LIMIT:
            raise ShapeError(f"sgemm_bias_activation: C ({m}x{n}) holds {m * n} values; the kernel indexes fewer than 2^31")
        a16, b16, acc = self.context.half.operands((A, a_values), (B, b_values), output=2 * m * n, fmt=fmt)
        # acc = op(A₁₆)·op(B₁₆)   (m × n) float32
        self.gemm(GemmProblem(transa, transb, m, n, k, lda, ldb, m, precision=self.precision,
                              alignment=alignment(a16, b16, acc)), 1.0, a16, b16, 0.0, acc)
        # C₁₆ = h(f(acc + h(b)))
        mode, coef = (-1, 0.0) if desc is None else (int(desc.mode), float(desc.coef))
        self.context.kernel("bias_activation_to_half").launch(blocks_for(m * n), self._stream, c, acc, bias.data.ptr,
                                                              m, m * n, ldc, mode, coef, fmt.kernel_code)

    def _bias_activation_forward(self, desc: ActivationDescriptor | None, bias, y) -> None:
        """kernels/bias_activation.cu: one launch, y read and written once; under math "bf16", where
        y is a GEMM or convolution operand of the pass (low_precision.Bf16Copies), its bfloat16 copy
        is written in the same launch."""
        if y.size >= INDEX_LIMIT:
            raise ShapeError(f"bias_activation_forward: y {y.shape} holds {y.size} values; the kernel indexes fewer than 2^31")
        self._activations.bias_forward(desc, bias, y, self._bf16_target(y))

    def _activation_bias_backward(self, desc: ActivationDescriptor, y, dy, dx, db) -> None:
        """kernels/activation.cu: dx = f'(y)·dy and each slab of samples' partial sums of dx in one pass
        (with one slab, db itself), then one launch adding the slabs in order; under math "bf16", dx's
        bfloat16 copy as ``activation_backward`` writes it. Four channels a thread where C is a multiple
        of 4 and every float32 operand is 16-byte aligned, else one."""
        self._activations.bias_backward(desc, y, dy, dx, db, self._bf16_target(dx))

    def _cross_entropy_backward(self, predict, target, grad, loss, count) -> None:
        """kernels/cross_entropy_backward.cu: grad = (predict - target)/N, loss[0] += the mean cross
        entropy, count[0] += the hits; block partials in shared memory, one atomicAdd per block and output."""
        self.context.kernel("cross_entropy_backward").launch(
            blocks_for(predict.size), self._stream, grad.data.ptr, loss.data.ptr, count.data.ptr, predict.data.ptr,
            target.data.ptr, predict.n, predict.sample_size, 1.0 / predict.n)

    def _softmax_cross_entropy_backward(self, logits, target, predict, grad, loss, count) -> None:
        """kernels/cross_entropy_backward.cu: cudnnSoftmaxForward and ``cross_entropy_backward`` in
        one launch, SOFTMAX_GROUP lanes per sample."""
        self._softmax_cross_entropy(logits, target, predict.data.ptr, grad.data.ptr, loss, count, 1.0 / logits.n,
                                    1.0 / logits.n)

    def _softmax_cross_entropy_metrics(self, logits, target, loss, count, loss_scale) -> None:
        """kernels/cross_entropy_backward.cu's softmax_cross_entropy_backward with predict and grad null:
        loss[0] and count[0] added to in one launch, nothing else written (no cudnnSoftmaxForward)."""
        self._softmax_cross_entropy(logits, target, 0, 0, loss, count, 0.0, float(loss_scale))

    def _softmax_cross_entropy(self, logits, target, predict_ptr: int, grad_ptr: int, loss, count, grad_scale: float,
                               loss_scale: float) -> None:
        """One launch of softmax_cross_entropy_backward (its 16-bit twin for a 16-bit MLP's logits); a null (0)
        predict or grad pointer is not written."""
        half = logits.dtype.half
        arguments = (predict_ptr, grad_ptr, loss.data.ptr, count.data.ptr, logits.data.ptr, target.data.ptr, logits.n,
                     logits.sample_size, grad_scale, loss_scale) + ((HALF_FORMATS[logits.dtype].kernel_code,) if half
                                                                    else ())
        kernel = "softmax_cross_entropy_backward16" if half else "softmax_cross_entropy_backward"
        self.context.kernel(kernel).launch(blocks_for(logits.n * SOFTMAX_GROUP), self._stream, *arguments)

    def _sgd_update_many(self, groups, lr, momentum: float, weight_decay: float, loss_scale=None) -> None:
        """The slides' cuBLAS calls on every parameter (optimisers.py: ``sgd_cublas``, or
        ``sgd_cublas_scaled`` with ``loss_scale``); in fast mode kernels/sgd_update_many.cu: one launch
        over every parameter of ``groups``, through a device table of their pointers uploaded on the
        first call with this list (never inside a capture). ``grad`` is never modified."""
        if loss_scale is not None:
            check_device_scalar(self, "sgd_update_many", loss_scale)
        if not self.engine.sgd_kernel:
            if isinstance(lr, Tensor):
                check_device_scalar(self, "sgd_update_many", lr)
            if groups and loss_scale is not None:
                self._optimisers.sgd_cublas_scaled(groups, lr, momentum, weight_decay, loss_scale)
            elif groups:
                self._optimisers.sgd_cublas(groups, lr, momentum, weight_decay)
            return
        self._optimisers.sgd_many_kernel(groups, lr, momentum, weight_decay, loss_scale)

    # ---- layers and optimisers of issue 18: Adam, dropout, batch normalisation -------------------
    def _adam_update_many(self, groups, lr, counter, beta1: float, beta2: float, eps: float, weight_decay: float,
                         decoupled: bool, loss_scale=None) -> None:
        """kernels/adam_update_many.cu: one launch over every parameter of ``groups``, through a device
        table of their pointers uploaded on the first call with this list (never inside a capture).
        The kernel reads the step from counter[0] and its last block advances it (not on a step that
        ``loss_scale`` skips)."""
        if loss_scale is not None:
            check_device_scalar(self, "adam_update_many", loss_scale)
        self._optimisers.adam_many_kernel(groups, lr, counter, beta1, beta2, eps, weight_decay, decoupled, loss_scale)

    def dropout_state(self, rate: float, seed: int) -> DropoutState:
        """cudnnDropoutGetStatesSize, then cudnnSetDropoutDescriptor on a new states buffer."""
        return DropoutState(self.context, rate, seed)

    def dropout_reserve(self, state, x_shape) -> DropoutReserve:
        """cudnnDropoutGetReserveSpaceSize bytes for inputs of ``x_shape``."""
        x_shape = as_shape(x_shape)
        nbytes = cudnn.dropout_get_reserve_space_size(self.context.descriptors.tensor(x_shape).handle)
        return DropoutReserve(x_shape, DeviceBuffer.allocate(max(nbytes, FLOAT32_BYTES)), nbytes)

    def _dropout_forward(self, state, reserve, x, y) -> None:
        """cudnnDropoutForward: y = x·mask/(1 - rate), a new mask from the state's generator (16-bit x and y
        through float32 copies: low_precision.through_float32)."""
        t = self.context.descriptors.tensor(x.shape).handle

        def run(source: int, target: int) -> None:
            cudnn.dropout_forward(self.context.cudnn.handle, state.descriptor.handle, t, source, t, target,
                                  reserve.buffer.ptr, reserve.nbytes)
        if x.dtype.half:
            through_float32(self.context, (x,), y, run)
        else:
            run(x.data.ptr, y.data.ptr)

    def _dropout_backward(self, state, reserve, dy, dx) -> None:
        """cudnnDropoutBackward: dx = dy·mask/(1 - rate), the last forward's mask (16-bit dy and dx through
        float32 copies: low_precision.through_float32)."""
        t = self.context.descriptors.tensor(dy.shape).handle

        def run(source: int, target: int) -> None:
            cudnn.dropout_backward(self.context.cudnn.handle, state.descriptor.handle, t, source, t, target,
                                   reserve.buffer.ptr, reserve.nbytes)
        if dy.dtype.half:
            through_float32(self.context, (dy,), dx, run)
        else:
            run(dy.data.ptr, dx.data.ptr)

    def _batch_norm_forward_training(self, mode, x, y, scale, bias, factor: float, running_mean, running_var,
                                     eps: float, save_mean, save_inv_std, relu: bool = False, communicator=None) -> None:
        """cudnnBatchNormalizationForwardTraining; in the fast engine our kernels (batch_norm.py), which
        also apply a ReLU to y where ``relu`` and sum the statistics over a ``communicator``'s ranks."""
        if self.engine.batch_norm_kernel:
            self._batch_norm.forward(mode, x, y, scale, bias, factor, running_mean, running_var, eps, save_mean,
                                     save_inv_std, relu, communicator)
            return
        _no_relu("batch_norm_forward_training", relu, communicator)
        context = self.context
        t, p = self._tensor_descriptor(x), self._batch_norm_parameters(mode, x)
        # y = scale·(x - μ)/√(σ² + eps) + bias;  running averages, saved μ and 1/√(σ² + eps)
        cudnn.batch_normalization_forward_training(
            context.cudnn.handle, int(mode), context.scalar(1.0), context.scalar(0.0), t, x.data.ptr, t, y.data.ptr, p,
            scale.data.ptr, bias.data.ptr, float(factor), running_mean.data.ptr, running_var.data.ptr, float(eps),
            save_mean.data.ptr, save_inv_std.data.ptr)

    def _batch_norm_forward_inference(self, mode, x, y, scale, bias, mean, var, eps: float) -> None:
        """cudnnBatchNormalizationForwardInference (16-bit x and y as they are, as in training)."""
        context = self.context
        t, p = self._tensor_descriptor(x), self._batch_norm_parameters(mode, x)
        # y = scale·(x - mean)/√(var + eps) + bias
        cudnn.batch_normalization_forward_inference(
            context.cudnn.handle, int(mode), context.scalar(1.0), context.scalar(0.0), t, x.data.ptr, t, y.data.ptr, p,
            scale.data.ptr, bias.data.ptr, mean.data.ptr, var.data.ptr, float(eps))

    def _batch_norm_backward(self, mode, x, dy, dx, scale, dscale, dbias, eps: float, save_mean,
                             save_inv_std, bias=None, relu: bool = False, communicator=None) -> None:
        """cudnnBatchNormalizationBackward; in the fast engine our kernels (batch_norm.py), which with
        ``relu`` take dy as the gradient after a ReLU applied by the forward pass (``bias`` given)."""
        if self.engine.batch_norm_kernel:
            self._batch_norm.backward(mode, x, dy, dx, scale, scale if bias is None else bias, dscale, dbias,
                                      save_mean, save_inv_std, relu, communicator)
            return
        _no_relu("batch_norm_backward", relu, communicator)
        context = self.context
        t, p = self._tensor_descriptor(x), self._batch_norm_parameters(mode, x)
        one, zero = context.scalar(1.0), context.scalar(0.0)
        # dbias = Σ dy;  dscale = Σ dy·x̂;  dx = scale/(m·√(σ² + eps))·(m·dy - dbias - x̂·dscale)
        cudnn.batch_normalization_backward(
            context.cudnn.handle, int(mode), one, zero, one, zero, t, x.data.ptr, t, dy.data.ptr, t, dx.data.ptr, p,
            scale.data.ptr, dscale.data.ptr, dbias.data.ptr, float(eps), save_mean.data.ptr, save_inv_std.data.ptr)

    def _batch_norm_parameters(self, mode, x) -> int:
        """The descriptor of the per-channel (SPATIAL) or per-value (PER_ACTIVATION) parameter tensors."""
        return self.context.descriptors.tensor(batch_norm_parameter_shape("batch normalisation", mode, x)).handle


def sgemv_as_gemm(trans, m: int, n: int, incx: int, incy: int) -> tuple[int, int, int, int, int]:
    """(transa, transb, m, n, k) of the GEMM yᵀ(1 × rows) = alpha·xᵀ(1 × cols)·op(A)ᵀ + beta·yᵀ that computes
    sgemv(trans, m, n, alpha, A, lda, x, incx, beta, y, incy), its A being x (a 1 × cols matrix of leading
    dimension incx), its B the sgemv's A (leading dimension lda), its C y (leading dimension incy)."""
    if incx < 0 or incy < 0:
        raise UsageError(f"sgemv: a 16-bit A or x takes positive increments, got incx={incx}, incy={incy}")
    rows, cols = (m, n) if trans == OP_N else (n, m)
    return OP_N, OP_T if trans == OP_N else OP_N, 1, rows, cols


# ---- argument checks (cheap, host-side: a bad size must not become an out-of-bounds access) -----
def _no_relu(call: str, relu: bool, communicator) -> None:
    if relu or communicator is not None:
        raise UsageError(f"{call}: {'relu' if relu else 'a communicator (synchronised statistics)'} is the fast "
                         "engine's kernels' only; the slides engine runs cuDNN's calls on this rank's batch")


def _check_batch_indexable(x) -> None:
    if x.size >= INDEX_LIMIT:
        raise ShapeError(f"gather_batch: a batch of shape {x.shape} holds {x.size} values; the kernel indexes fewer than 2^31")
