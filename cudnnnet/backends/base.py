"""The call surface both backends implement, named and shaped after cuBLAS and cuDNN.

A layer is written once against this surface. The ``cuda`` backend hands each call to cuBLAS,
cuDNN or one of our NVRTC kernels; the ``host`` backend computes the same thing with NumPy and is
the oracle the GPU is tested against.

Conventions
-----------
* Arguments called ``x, y, dx, dy, w, dw, bias, A, B, C ...`` are float32 Tensors on this backend
  (16-bit ones are refused: arguments.float32_only), except the activations and their gradients of
  the verbs a 16-bit MLP or CNN calls, which may also hold the 16 bits of the precision in force
  (arguments.activations; each verb says which): those verbs compute in float32 from the stored
  values and round what they store in a 16-bit tensor to nearest even, once. Their ``data`` is the
  backend's storage (of any dtype in the memory calls): a flat ``numpy.ndarray`` on the host, a
  :class:`DeviceBuffer` on CUDA.
* BLAS calls follow cuBLAS exactly: column-major matrices inside flat buffers, leading dimensions,
  ``OP_N``/``OP_T`` transpose flags, ``C = alpha·op(A)·op(B) + beta·C``. A tensor of shape
  (n, c, h, w) read as a column-major matrix with ``ld = c·h·w`` has one sample per column.
* cuDNN calls follow cuDNN: NCHW float32 tensors whose descriptors are derived from the tensors'
  shapes, ``y = alpha·op(x) + beta·y`` blending, cross-correlation convolution, softmax over
  channels (mode CHANNEL, algorithm ACCURATE). Their modes and descriptors: descriptors.py.
* ``alpha``/``beta`` are Python floats, except where a docstring says a one-element tensor is
  accepted (so that a learning rate can live in device memory and be changed under CUDA-graph
  replay).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Union

from ..engine import SLIDES, Engine, get_engine
from ..errors import UsageError
from ..precision import FLOAT32, FP32, PRECISION_NAMES, DType, Precision, get_precision
from . import arguments
from .scoping import IN_FORCE, UNSET, Settings, Using

if TYPE_CHECKING:
    from ..tensor import Tensor
    from .descriptors import ActivationDescriptor, BatchNormMode, ConvolutionDescriptor, PoolingDescriptor

OP_N, OP_T = arguments.OP_N, arguments.OP_T  # the cuBLAS transpose flags, part of the call surface

Scalar = Union[float, "Tensor"]  # a one-element Tensor where documented


class Backend(ABC):
    """What a layer may ask of a backend. One instance per device; ``host`` is a singleton.

    The engine and the precision a call runs in are those of the innermost ``using`` block around
    it (a Network enters its own around its calls), else the backend's defaults (``set_engine``,
    ``set_math``), as Chainer's ``using_config`` scopes its configuration."""

    name: str = "abstract"
    device_name: str = "abstract"  # what a user is told runs the work ("NVIDIA H100 80GB HBM3")
    plan_type: type = object  # what convolution_plan gives, which the convolution calls take
    maths: tuple[str, ...] = PRECISION_NAMES  # the precisions this backend computes as such
    _default_engine: Engine = SLIDES  # where no ``using`` block sets one; per instance once set
    _default_precision: Precision = FP32

    @property
    def engine(self) -> Engine:
        """The engine in force: the innermost ``using`` block's, else the default (``set_engine``)."""
        in_force = IN_FORCE.get()
        engine = in_force.get(id(self), UNSET).engine if in_force else None
        return self._default_engine if engine is None else engine

    @property
    def precision(self) -> Precision:
        """The precision in force: the innermost ``using`` block's, else the default (``set_math``)."""
        in_force = IN_FORCE.get()
        precision = in_force.get(id(self), UNSET).precision if in_force else None
        return self._default_precision if precision is None else precision

    @property
    def math(self) -> str:
        """The name of the precision in force ("fp32", "tf32", "bf16" or "fp16")."""
        return self.precision.name

    def set_engine(self, engine: "str | Engine") -> None:
        """The default engine, for calls outside any ``using`` block: "slides" (the C++ design's library
        calls) or "fast" (our fusions and kernels), or an Engine."""
        self._default_engine = get_engine(engine)

    def set_math(self, math: "str | Precision") -> None:
        """The default precision, for calls outside any ``using`` block (cudnnnet.precision)."""
        self._default_precision = get_precision(math)
        self._use_precision(self.precision)

    def using(self, engine: "str | Engine | None" = None, math: "str | Precision | None" = None):
        """``engine`` and ``math`` for the calls made on this backend inside the block, in this thread or
        task (None: the enclosing block's, else the default, which ``set_engine`` / ``set_math`` may change
        meanwhile); what was in force before it afterwards (Chainer's ``using_config``). Inside a block
        that already sets both to the same, it changes nothing (a network's calls inside its Trainer's)."""
        outer = IN_FORCE.get().get(id(self), UNSET)
        settings = Settings(outer.engine if engine is None else get_engine(engine),
                            outer.precision if math is None else get_precision(math))
        if settings.engine is outer.engine and settings.precision is outer.precision:
            return contextlib.nullcontext(self)
        return Using(self, settings)

    def using_engine(self, engine: "str | Engine"):
        """``using(engine=engine)``: ``engine`` inside the block, the one in force before it afterwards."""
        return self.using(engine=engine)

    def _use_precision(self, precision: Precision) -> None:
        """``precision`` is now in force: a backend whose library holds a mode of its own sets it here."""

    # ---- memory ---------------------------------------------------------------------------
    @abstractmethod
    def empty(self, size: int, dtype: DType = FLOAT32) -> Any:
        """Storage for ``size`` values of ``dtype``, contents undefined."""

    @abstractmethod
    def upload(self, array, dtype: DType = FLOAT32) -> Any:
        """New storage of ``dtype`` holding a flat float32 NumPy array's values, rounded to nearest even."""

    @abstractmethod
    def upload_pixels(self, pixels, pad: int, mean: float, std: float) -> Any:
        """New storage holding the float32 images (N, 1, H+2·pad, W+2·pad) = (pixels/255 − mean)/std,
        the padding being pixel value 0, made from uint8 ``pixels`` (N, H, W): bit for bit
        ``float_images.to_float_images(pixels, (mean, std), pad)``. A GPU receives only the bytes."""

    @abstractmethod
    def download(self, storage, size: int):
        """A new flat float32 NumPy array with the first ``size`` values of ``storage`` (of any dtype)."""

    @abstractmethod
    def write(self, storage, array) -> None:
        """storage[:array.size] = array (a flat float32 host array, rounded to the storage's dtype)."""

    @abstractmethod
    def copy(self, src, dst, size: int) -> None:
        """dst[:size] = src[:size], this backend's storage of one dtype (cudaMemcpyAsync D2D)."""

    @abstractmethod
    def convert(self, src, dst, size: int) -> None:
        """dst[:size] = src[:size] rounded to nearest even to dst's dtype (storage of any two dtypes)."""

    @abstractmethod
    def fill(self, storage, value: float, size: int) -> None:
        """storage[:size] = value, rounded to the storage's dtype."""

    @abstractmethod
    def view(self, storage, offset: int, size: int) -> Any:
        """Storage aliasing ``storage[offset:offset + size]`` (no copy)."""

    def synchronize(self) -> None:
        """Wait until all queued work is done (no-op on the host)."""

    def start_pass(self) -> None:
        """A network's forward and backward begin: the weights, and every GEMM and convolution operand
        once read, keep their values until ``end_pass``. A backend may reuse what it derived from
        them (CUDA under math "bf16": their bfloat16 copies); the host derives nothing."""

    def end_pass(self) -> None:
        """The pass is over: operands may change from here on."""

    supports_graphs = False  # whether ``capture`` records CUDA graphs

    def capture(self):
        """A context manager recording the calls made inside it as a graph with ``launch()`` (CUDA only)."""
        raise UsageError(f"the {self.name} backend cannot capture graphs")

    # ---- cuBLAS -----------------------------------------------------------------------------
    def sgemm(self, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc) -> None:
        """cublasSgemm: C(m×n) = alpha·op(A)(m×k)·op(B)(k×n) + beta·C, column-major. A, B and C may be 16-bit."""
        arguments.check_sgemm(self.precision, transa, transb, m, n, k, A, lda, B, ldb, C, ldc)
        self._sgemm(transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)

    @abstractmethod
    def _sgemm(self, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc) -> None:
        """``sgemm`` on the arguments it has checked."""

    def sgemv(self, trans, m, n, alpha, A, lda, x, incx, beta, y, incy) -> None:
        """cublasSgemv: y = alpha·op(A)·x + beta·y with A m×n column-major. A and x may be 16-bit."""
        arguments.check_sgemv(self.precision, trans, m, n, A, lda, x, incx, y, incy)
        self._sgemv(trans, m, n, alpha, A, lda, x, incx, beta, y, incy)

    @abstractmethod
    def _sgemv(self, trans, m, n, alpha, A, lda, x, incx, beta, y, incy) -> None:
        """``sgemv`` on the arguments it has checked."""

    def saxpy(self, n, alpha: Scalar, x, incx, y, incy) -> None:
        """cublasSaxpy: y = alpha·x + y. ``alpha`` may be a one-element tensor (device pointer mode)."""
        arguments.check_saxpy(n, alpha, x, incx, y, incy)
        self._saxpy(n, alpha, x, incx, y, incy)

    @abstractmethod
    def _saxpy(self, n, alpha: Scalar, x, incx, y, incy) -> None:
        """``saxpy`` on the arguments it has checked."""

    def sscal(self, n, alpha: Scalar, x, incx) -> None:
        """cublasSscal: x = alpha·x. ``alpha`` may be a one-element tensor."""
        arguments.check_sscal(n, alpha, x, incx)
        self._sscal(n, alpha, x, incx)

    @abstractmethod
    def _sscal(self, n, alpha: Scalar, x, incx) -> None:
        """``sscal`` on the arguments it has checked."""

    def scopy(self, n, x, incx, y, incy) -> None:
        """cublasScopy: y = x."""
        arguments.check_scopy(n, x, incx, y, incy)
        self._scopy(n, x, incx, y, incy)

    @abstractmethod
    def _scopy(self, n, x, incx, y, incy) -> None:
        """``scopy`` on the arguments it has checked."""

    # ---- cuDNN ------------------------------------------------------------------------------
    def activation_forward(self, desc: ActivationDescriptor, alpha, x, beta, y) -> None:
        """cudnnActivationForward: y = alpha·f(x) + beta·y. x and y of one dtype, which may be 16-bit."""
        arguments.check_activations("activation_forward", self.precision, x, y)
        self._activation_forward(desc, alpha, x, beta, y)

    @abstractmethod
    def _activation_forward(self, desc: ActivationDescriptor, alpha, x, beta, y) -> None:
        """``activation_forward`` on the arguments it has checked."""

    def activation_backward(self, desc: ActivationDescriptor, alpha, y, dy, x, beta, dx) -> None:
        """cudnnActivationBackward: dx = alpha·f'(x)·dy + beta·dx (f' may be computed from y). x, y, dy and dx
        of one dtype, which may be 16-bit."""
        arguments.check_activations("activation_backward", self.precision, x, y, dy, dx)
        self._activation_backward(desc, alpha, y, dy, x, beta, dx)

    @abstractmethod
    def _activation_backward(self, desc: ActivationDescriptor, alpha, y, dy, x, beta, dx) -> None:
        """``activation_backward`` on the arguments it has checked."""

    def softmax_forward(self, alpha, x, beta, y) -> None:
        """cudnnSoftmaxForward (ACCURATE): softmax over the c·h·w values of each sample.

        cuDNN's MODE_INSTANCE does this; the slides' MODE_CHANNEL is the same for (N, C, 1, 1).
        x may be 16-bit; y (the probabilities) is float32.
        """
        arguments.check_softmax(self.precision, x, y)
        self._softmax_forward(alpha, x, beta, y)

    @abstractmethod
    def _softmax_forward(self, alpha, x, beta, y) -> None:
        """``softmax_forward`` on the arguments it has checked."""

    def add_tensor(self, alpha, bias, beta, y) -> None:
        """cudnnAddTensor: y = alpha·bias + beta·y, bias (1, C, 1, 1) broadcast over N, H, W. A 16-bit y reads
        the bias rounded to its 16 bits (cuDNN takes one data type), then the sum is rounded once."""
        arguments.check_broadcast("add_tensor", bias, y, self.precision)
        self._add_tensor(alpha, bias, beta, y)

    @abstractmethod
    def _add_tensor(self, alpha, bias, beta, y) -> None:
        """``add_tensor`` on the arguments it has checked."""

    @abstractmethod
    def convolution_plan(self, desc: ConvolutionDescriptor, x_shape, y_shape) -> Any:
        """Choose algorithms and size a workspace for these shapes (cudnnFind*/Get*_v7).

        Called again whenever the input shape (the batch size) changes; never inside a CUDA
        graph capture. The returned plan is passed to the four convolution calls below.
        """

    def convolution_forward(self, plan, alpha, x, w, beta, y) -> None:
        """cudnnConvolutionForward: y = alpha·(x ⋆ w) + beta·y. x and y may be 16-bit (w is float32)."""
        arguments.check_plan("convolution_forward", self, plan, x=x, w=w, y=y, result=(y, alpha, beta))
        self._convolution_forward(plan, alpha, x, w, beta, y)

    @abstractmethod
    def _convolution_forward(self, plan, alpha, x, w, beta, y) -> None:
        """``convolution_forward`` on the arguments it has checked."""

    def convolution_backward_data(self, plan, alpha, w, dy, beta, dx) -> None:
        """cudnnConvolutionBackwardData: dx = alpha·(dy ⋆ᵀ w) + beta·dx. dy and dx may be 16-bit."""
        arguments.check_plan("convolution_backward_data", self, plan, x=dx, w=w, y=dy, result=(dx, alpha, beta))
        self._convolution_backward_data(plan, alpha, w, dy, beta, dx)

    @abstractmethod
    def _convolution_backward_data(self, plan, alpha, w, dy, beta, dx) -> None:
        """``convolution_backward_data`` on the arguments it has checked."""

    def convolution_backward_filter(self, plan, alpha, x, dy, beta, dw) -> None:
        """cudnnConvolutionBackwardFilter: dw = alpha·Σₙ (xₙ ⋆ dyₙ) + beta·dw. x and dy may be 16-bit
        (dw float32)."""
        arguments.check_plan("convolution_backward_filter", self, plan, x=x, w=dw, y=dy)
        self._convolution_backward_filter(plan, alpha, x, dy, beta, dw)

    @abstractmethod
    def _convolution_backward_filter(self, plan, alpha, x, dy, beta, dw) -> None:
        """``convolution_backward_filter`` on the arguments it has checked."""

    def convolution_backward_bias(self, alpha, dy, beta, db) -> None:
        """cudnnConvolutionBackwardBias: db(1, K, 1, 1) = alpha·Σ_{n,h,w} dy + beta·db (beta == 0: db is
        overwritten, never read). Deterministic: the same bits on every call with the same dy. dy may be 16-bit."""
        arguments.check_backward_bias(self.precision, dy, db)
        self._convolution_backward_bias(alpha, dy, beta, db)

    @abstractmethod
    def _convolution_backward_bias(self, alpha, dy, beta, db) -> None:
        """``convolution_backward_bias`` on the arguments it has checked."""

    def pooling_forward(self, desc: PoolingDescriptor, alpha, x, beta, y) -> None:
        """cudnnPoolingForward. x and y of one dtype, which may be 16-bit."""
        arguments.check_pooling_forward(self.precision, desc, x, y)
        self._pooling_forward(desc, alpha, x, beta, y)

    @abstractmethod
    def _pooling_forward(self, desc: PoolingDescriptor, alpha, x, beta, y) -> None:
        """``pooling_forward`` on the arguments it has checked."""

    def pooling_backward(self, desc: PoolingDescriptor, alpha, y, dy, x, beta, dx) -> None:
        """cudnnPoolingBackward: dx = alpha·pool'(x)·dy + beta·dx (beta == 0: dx is overwritten, never read).

        Max pooling routes each window's dy to the window's first cell (row-major) equal to its
        maximum, and nothing to its other cells; a window holding a NaN routes its dy nowhere.
        Average pooling spreads dy / window² over the window, padding included. ``y`` must be what
        pooling_forward(desc, 1, x, 0, y) gave: cuDNN may read the maxima from it, the host backend
        and our CUDA kernel recompute them from x. y, dy, x and dx of one dtype, which may be 16-bit.
        """
        arguments.check_pooling_backward(self.precision, desc, y, dy, x, dx)
        self._pooling_backward(desc, alpha, y, dy, x, beta, dx)

    @abstractmethod
    def _pooling_backward(self, desc: PoolingDescriptor, alpha, y, dy, x, beta, dx) -> None:
        """``pooling_backward`` on the arguments it has checked."""

    # ---- DLPack (used by Tensor.__dlpack__ / Tensor.from_dlpack) -------------------------------
    @abstractmethod
    def dlpack(self, tensor, stream=None, **kwargs):
        """A DLPack capsule sharing ``tensor``'s memory."""

    @abstractmethod
    def dlpack_device(self) -> tuple[int, int]:
        """(DLDeviceType, device id) of this backend's memory."""

    @abstractmethod
    def from_dlpack(self, tensor_class, external):
        """A ``tensor_class`` sharing a DLPack producer's memory (a copy where it cannot be shared)."""

    def cuda_array_interface(self, tensor) -> dict:
        """``tensor.__cuda_array_interface__`` (version 3) where its memory is on a GPU; AttributeError
        elsewhere, as CuPy raises for a host array, so that a consumer asking ``hasattr`` falls back."""
        raise AttributeError(f"a tensor on the {self.name} backend is in host memory and has no "
                             f"__cuda_array_interface__; use numpy() or DLPack")

    # ---- our own kernels (NVRTC on CUDA) -------------------------------------------------------
    def cross_entropy_loss(self, predict, target, loss, accumulate: bool = False) -> None:
        """loss[0] (+)= -(1/N)·Σₙ Σ_c target·log(max(predict, 1e-7)). Reads N from predict.shape."""
        arguments.check_metric("cross_entropy_loss", predict, target, loss)
        self._cross_entropy_loss(predict, target, loss, accumulate)

    @abstractmethod
    def _cross_entropy_loss(self, predict, target, loss, accumulate: bool = False) -> None:
        """``cross_entropy_loss`` on the arguments it has checked."""

    def squared_error_loss(self, predict, target, loss, accumulate: bool = False) -> None:
        """loss[0] (+)= (1/N)·Σₙ ½‖predictₙ - targetₙ‖²."""
        arguments.check_metric("squared_error_loss", predict, target, loss)
        self._squared_error_loss(predict, target, loss, accumulate)

    @abstractmethod
    def _squared_error_loss(self, predict, target, loss, accumulate: bool = False) -> None:
        """``squared_error_loss`` on the arguments it has checked."""

    def accuracy_count(self, predict, target, count, accumulate: bool = False) -> None:
        """count[0] (+)= number of samples whose argmax(predict) equals argmax(target)."""
        arguments.check_metric("accuracy_count", predict, target, count)
        self._accuracy_count(predict, target, count, accumulate)

    @abstractmethod
    def _accuracy_count(self, predict, target, count, accumulate: bool = False) -> None:
        """``accuracy_count`` on the arguments it has checked."""

    def record_nonfinite(self, watch, loss) -> None:
        """Training bookkeeping, one step: watch[0] += 1; if watch[1] == 0 and loss[0] is NaN or ±inf,
        watch[1] = watch[0]. ``watch`` holds two int32 counts in float32 storage (their bits), so a
        replayed CUDA graph keeps counting steps and the first non-finite one is known without a sync.
        """
        arguments.check_nonfinite_operands(watch, loss)
        self._record_nonfinite(watch, loss)

    @abstractmethod
    def _record_nonfinite(self, watch, loss) -> None:
        """``record_nonfinite`` on the arguments it has checked."""

    def gather_batch(self, images, labels, order, cursor, x, target) -> None:
        """A batch from a resident data set: j = order[cursor[0] + b]; x[b] = images[j]; target[b] = one_hot(labels[j]).

        ``labels`` and ``order`` hold integers as float32 (exact below 2²⁴); ``cursor`` is a
        one-element tensor, so a replayed CUDA graph gathers whichever batch it points to.
        """
        arguments.check_gather(images, labels, order, cursor, x, target)
        self._gather_batch(images, labels, order, cursor, x, target)

    @abstractmethod
    def _gather_batch(self, images, labels, order, cursor, x, target) -> None:
        """``gather_batch`` on the arguments it has checked."""

    def gather_augmented_batch(self, images, labels, order, cursor, counter, x, target, padding: int, flip: bool,
                               seed: int) -> None:
        """``gather_batch`` with a random crop and flip (``augmentation.py``), then counter[0] += 1.

        Sample b of the batch, j = order[cursor[0] + b], is drawn by the hash of (seed, step, b) with
        step = counter[0]: offsets dy, dx in [−padding, padding] and, where ``flip``, a flip with
        probability ½; x[b, c, y, x'] = images[j, c, y + dy, xs + dx] (xs = W − 1 − x' if flipped),
        0 outside the image; target[b] = one_hot(labels[j]). ``counter`` holds two uint32 in float32
        storage, [step, 0]; advancing it on the device lets a replayed CUDA graph draw fresh crops.
        """
        arguments.check_gather(images, labels, order, cursor, x, target)
        arguments.check_augmented_gather(images, counter, x, padding, seed)
        self._gather_augmented_batch(images, labels, order, cursor, counter, x, target, padding, flip, seed)

    @abstractmethod
    def _gather_augmented_batch(self, images, labels, order, cursor, counter, x, target, padding: int, flip: bool,
                               seed: int) -> None:
        """``gather_augmented_batch`` on the arguments it has checked."""

    def sgd_update(self, param, grad, velocity, lr: Scalar, momentum: float, weight_decay: float) -> None:
        """One SGD step on a parameter, PyTorch's formulation.

        g = grad + weight_decay·param;  v = momentum·v + g  (skipped when momentum == 0, and
        ``velocity`` may then be None);  param = param - lr·v.  ``lr`` may be a one-element tensor.
        """
        arguments.check_sgd_update(param, grad, velocity, lr, momentum)
        self._sgd_update(param, grad, velocity, lr, momentum, weight_decay)

    @abstractmethod
    def _sgd_update(self, param, grad, velocity, lr: Scalar, momentum: float, weight_decay: float) -> None:
        """``sgd_update`` on the arguments it has checked."""

    # ---- fused calls (one launch each on CUDA; checked against the unfused calls above) ---------
    def sgemm_bias_activation(self, transa, transb, m, n, k, A, lda, B, ldb, C, ldc, bias,
                              desc: ActivationDescriptor | None) -> None:
        """C(m×n) = f(op(A)(m×k)·op(B)(k×n) + b·1ᵀ) in one call with a 16-bit C, f a ReLU (``desc``) or
        none (None): on CUDA one cublasLtMatmul with the bias (+ ReLU) epilogue, which reads a bias of
        C's type, so

            C₁₆ = h(f(acc + h(b)))     acc the FP32 sum of the products, h the rounding to C's 16 bits

        A and B as ``sgemm`` reads them (16-bit copies of float32 ones); the bias float32, m values."""
        arguments.check_sgemm_bias_activation(self.precision, transa, transb, m, n, k, A, lda, B, ldb, C, ldc, bias,
                                              desc)
        self._sgemm_bias_activation(transa, transb, m, n, k, A, lda, B, ldb, C, ldc, bias, desc)

    @abstractmethod
    def _sgemm_bias_activation(self, transa, transb, m, n, k, A, lda, B, ldb, C, ldc, bias,
                               desc: ActivationDescriptor | None) -> None:
        """``sgemm_bias_activation`` on the arguments it has checked."""

    def bias_activation_forward(self, desc: ActivationDescriptor | None, bias, y) -> None:
        """y = f(y + b) in place: ``bias`` (C values) broadcast over N, H, W of y (N, C, H, W), then
        the activation ``desc`` (None: no activation). The same as ``add_tensor(1, bias, 1, y)``
        followed by ``activation_forward(desc, 1, y, 0, y)``. y may be 16-bit (rounded once), the bias is float32."""
        arguments.check_bias("bias_activation_forward", bias, y, self.precision)
        self._bias_activation_forward(desc, bias, y)

    @abstractmethod
    def _bias_activation_forward(self, desc: ActivationDescriptor | None, bias, y) -> None:
        """``bias_activation_forward`` on the arguments it has checked."""

    def activation_bias_backward(self, desc: ActivationDescriptor, y, dy, dx, db) -> None:
        """The activation ``desc`` fused after a Dense layer, with that layer's bias gradient, for y,
        dy, dx of shape (N, C, 1, 1) and db of C values:

            dx = f'(y)·dy        f' read from y (the forward pass kept no x)
            db = Σₙ dx

        The same as ``activation_backward(desc, 1, y, dy, y, 0, dx)`` followed by the Dense layer's
        ``sgemv`` of dx with a vector of ones. y, dy, dx may be 16-bit (db sums dx before its rounding)."""
        arguments.check_activation_bias("activation_bias_backward", self.precision, y, dy, dx, db)
        self._activation_bias_backward(desc, y, dy, dx, db)

    @abstractmethod
    def _activation_bias_backward(self, desc: ActivationDescriptor, y, dy, dx, db) -> None:
        """``activation_bias_backward`` on the arguments it has checked."""

    def cross_entropy_backward(self, predict, target, grad, loss, count) -> None:
        """The softmax-output step of training, for predict, target, grad of shape (N, C, 1, 1):

            grad      = (predict - target) / N
            loss[0]  += -(1/N)·Σₙ Σ_c target·log(max(predict, 1e-7))
            count[0] += #{n : argmax predictₙ == argmax targetₙ}   (the first maximum wins ties)

        The same as ``copy`` + ``saxpy`` + ``sscal``, ``cross_entropy_loss(accumulate=True)`` and
        ``accuracy_count(accumulate=True)``; ``loss`` and ``count`` are always added to.
        """
        arguments.check_cross_entropy_backward("cross_entropy_backward", predict, target, grad, loss, count)
        self._cross_entropy_backward(predict, target, grad, loss, count)

    @abstractmethod
    def _cross_entropy_backward(self, predict, target, grad, loss, count) -> None:
        """``cross_entropy_backward`` on the arguments it has checked."""

    def softmax_cross_entropy_backward(self, logits, target, predict, grad, loss, count) -> None:
        """The Softmax layer's forward and ``cross_entropy_backward`` in one call, from ``logits``
        (N, C, 1, 1): ``predict = softmax(logits)``, then grad, loss and count from ``predict`` as
        ``cross_entropy_backward`` computes them. The same as ``softmax_forward(1, logits, 0,
        predict)`` followed by ``cross_entropy_backward(predict, target, grad, loss, count)``. The logits may
        be 16-bit; predict and grad are float32.
        """
        arguments.check_softmax_cross_entropy("softmax_cross_entropy_backward", self.precision, logits, target, loss,
                                              count, predict, grad)
        self._softmax_cross_entropy_backward(logits, target, predict, grad, loss, count)

    @abstractmethod
    def _softmax_cross_entropy_backward(self, logits, target, predict, grad, loss, count) -> None:
        """``softmax_cross_entropy_backward`` on the arguments it has checked."""

    def softmax_cross_entropy_metrics(self, logits, target, loss, count, loss_scale: float) -> None:
        """The evaluation of a batch straight from its ``logits`` (N, C, H, W), softmax over each
        sample's c·h·w values:

            ŷ         = softmax(logits)
            loss[0]  += loss_scale·Σₙ (-Σ_c target·log(max(ŷ, 1e-7)))
            count[0] += #{n : argmax ŷₙ == argmax targetₙ}   (the first maximum wins ties)

        ``loss`` and ``count`` are always added to and nothing else is written (ŷ is not kept). The logits
        may be 16-bit.
        With ``loss_scale = 1/N`` the loss added is the batch mean ``cross_entropy_loss`` computes;
        a NaN logit makes the loss NaN, as there. One launch on CUDA, no cudnnSoftmaxForward.
        """
        arguments.check_softmax_cross_entropy("softmax_cross_entropy_metrics", self.precision, logits, target, loss,
                                              count)
        self._softmax_cross_entropy_metrics(logits, target, loss, count, loss_scale)

    @abstractmethod
    def _softmax_cross_entropy_metrics(self, logits, target, loss, count, loss_scale: float) -> None:
        """``softmax_cross_entropy_metrics`` on the arguments it has checked."""

    def sgd_update_many(self, groups, lr: Scalar, momentum: float, weight_decay: float, loss_scale=None) -> None:
        """``sgd_update`` on every ``(param, grad, velocity_or_None)`` of ``groups``:

            g = grad + weight_decay·param;  v = momentum·v + g  (skipped when momentum == 0);
            param = param - lr·v

        With ``loss_scale`` (the state tensor of ``update_loss_scale``) the gradients carry a loss
        scale: g = grad·unscale + weight_decay·param, and a step whose skip flag is set changes
        nothing (parameters and velocities keep their values).

        ``lr`` is a one-element tensor (read on the device, so it may change under graph replay)
        or a float. On CUDA this is one launch over a device table of the groups' pointers, built
        and uploaded on the first call with a given list: that first call must not be made inside
        a CUDA graph capture (DeviceError).
        """
        arguments.check_sgd_many(groups, lr, momentum, loss_scale)
        self._sgd_update_many(groups, lr, momentum, weight_decay, loss_scale)

    @abstractmethod
    def _sgd_update_many(self, groups, lr: Scalar, momentum: float, weight_decay: float, loss_scale=None) -> None:
        """``sgd_update_many`` on the arguments it has checked."""

    # ---- layers and optimisers of issue 18: Adam, dropout, batch normalisation -------------------
    def adam_update_many(self, groups, lr: Scalar, counter, beta1: float, beta2: float, eps: float,
                         weight_decay: float, decoupled: bool, loss_scale=None) -> None:
        """One Adam (``decoupled`` False) or AdamW step, PyTorch's formulation, on every
        ``(param, grad, m, v)`` of ``groups``, with t = counter[0] + 1:

            AdamW: param = param - lr·weight_decay·param;   Adam: g = grad + weight_decay·param
            m = β1·m + (1 - β1)·g;   v = β2·v + (1 - β2)·g²
            param = param - (lr / (1 - β1ᵗ))·m / (√v / √(1 - β2ᵗ) + eps)
            counter[0] = t

        ``counter`` is a (2,) tensor: the steps taken (exact below 2²⁴) and 0 (scratch the CUDA
        kernel counts its finished blocks in). ``lr`` is a one-element tensor or a float. Both are
        read on the device, so a captured graph follows the schedule and the bias correction. On
        CUDA this is one launch; as with ``sgd_update_many``, the first call with a given list
        must not be made inside a capture. With ``loss_scale`` (as there) g = grad·unscale first, and a
        skipped step changes nothing: parameters, moments and counter[0] keep their values.
        """
        arguments.check_adam_many(groups, lr, counter, loss_scale)
        self._adam_update_many(groups, lr, counter, beta1, beta2, eps, weight_decay, decoupled, loss_scale)

    @abstractmethod
    def _adam_update_many(self, groups, lr: Scalar, counter, beta1: float, beta2: float, eps: float,
                         weight_decay: float, decoupled: bool, loss_scale=None) -> None:
        """``adam_update_many`` on the arguments it has checked."""

    # ---- dynamic loss scaling of math fp16 (cudnnnet/optim/loss_scaling.py) ---------------------------
    def find_nonfinite_gradients(self, grads, loss_scale) -> None:
        """One pass over the flat ``grads``: where any value is inf or NaN, loss_scale[FOUND] = 1 and
        those values become 0 (the step is skipped; a cuBLAS update with coefficient 0 then adds 0).
        ``loss_scale`` is the (6,) state named in ``check_loss_scale``; FOUND must be 0 before."""
        arguments.check_nonfinite_gradients(grads, loss_scale)
        self._find_nonfinite_gradients(grads, loss_scale)

    @abstractmethod
    def _find_nonfinite_gradients(self, grads, loss_scale) -> None:
        """``find_nonfinite_gradients`` on the arguments it has checked."""

    def update_loss_scale(self, loss_scale, growth_interval: int, min_scale: float, max_scale: float) -> None:
        """One thread, after ``find_nonfinite_gradients`` and before the optimiser:

            skip = found;  unscale = 1/S
            found: S = max(S/2, min_scale), clean = 0, skipped += 1
            else:  clean += 1; where clean reaches growth_interval: S = min(2·S, max_scale), clean = 0
            found = 0
        """
        arguments.check_loss_scale("update_loss_scale", loss_scale)
        self._update_loss_scale(loss_scale, growth_interval, min_scale, max_scale)

    @abstractmethod
    def _update_loss_scale(self, loss_scale, growth_interval: int, min_scale: float, max_scale: float) -> None:
        """``update_loss_scale`` on the arguments it has checked."""

    @abstractmethod
    def dropout_state(self, rate: float, seed: int) -> Any:
        """The random state of one dropout layer (cudnnSetDropoutDescriptor with its states buffer
        on CUDA, a seeded NumPy generator on the host): drops each value with probability ``rate``."""

    @abstractmethod
    def dropout_reserve(self, state, x_shape) -> Any:
        """Where ``dropout_forward`` keeps its mask for inputs of ``x_shape``, for the backward pass
        (cudnnDropoutGetReserveSpaceSize bytes on CUDA)."""

    def dropout_forward(self, state, reserve, x, y) -> None:
        """cudnnDropoutForward: y = x·mask/(1 - rate), a new mask (each value kept with probability
        1 - rate) drawn from ``state`` at every call, even a replayed graph's, and kept in ``reserve``. x and y
        of one dtype, which may be 16-bit (y rounded once)."""
        arguments.check_dropout("dropout_forward", self.precision, reserve, x, y, "the input")
        self._dropout_forward(state, reserve, x, y)

    @abstractmethod
    def _dropout_forward(self, state, reserve, x, y) -> None:
        """``dropout_forward`` on the arguments it has checked."""

    def dropout_backward(self, state, reserve, dy, dx) -> None:
        """cudnnDropoutBackward: dx = dy·mask/(1 - rate), with the mask of the last dropout_forward; dy and dx
        may be 16-bit."""
        arguments.check_dropout("dropout_backward", self.precision, reserve, dy, dx, "dy")
        self._dropout_backward(state, reserve, dy, dx)

    @abstractmethod
    def _dropout_backward(self, state, reserve, dy, dx) -> None:
        """``dropout_backward`` on the arguments it has checked."""

    def batch_norm_forward_training(self, mode: "BatchNormMode", x, y, scale, bias, factor: float, running_mean,
                                    running_var, eps: float, save_mean, save_inv_std, relu: bool = False,
                                    communicator=None) -> None:
        """cudnnBatchNormalizationForwardTraining (alpha 1, beta 0), statistics over N (PER_ACTIVATION,
        parameters (1, C, H, W)) or over N, H, W (SPATIAL, parameters (1, C, 1, 1)), m values each:

            μ = mean(x);  σ² = mean((x - μ)²);  y = scale·(x - μ)/√(σ² + eps) + bias
            running_mean = (1 - factor)·running_mean + factor·μ
            running_var  = (1 - factor)·running_var  + factor·σ²·m/(m - 1)
            save_mean = μ;  save_inv_std = 1/√(σ² + eps)

        ``relu`` (the fast engine only): y = max(y, 0) in the same pass. x and y may be 16-bit (y rounded once).

        ``communicator`` (synchronised batch normalisation; the fast engine only on CUDA): the
        per-channel totals (Σ x, Σ x²) and m, laid out as 2C + 1 float64 [(Σ x, Σ x²) per channel,
        then m], are summed over the ranks by ``communicator.all_reduce_sum_float64(totals, 2C + 1)``
        (the backend's storage of them: a device address on CUDA, a NumPy array on the host) before
        normalising: μ, σ² and m are those of every rank's batch together.
        """
        arguments.check_batch_norm("batch_norm_forward_training", self.precision, mode, x, (y,),
                                   (scale, bias, running_mean, running_var, save_mean, save_inv_std))
        self._batch_norm_forward_training(mode, x, y, scale, bias, factor, running_mean, running_var, eps, save_mean,
                                          save_inv_std, relu, communicator)

    @abstractmethod
    def _batch_norm_forward_training(self, mode: "BatchNormMode", x, y, scale, bias, factor: float, running_mean,
                                     running_var, eps: float, save_mean, save_inv_std, relu: bool = False,
                                     communicator=None) -> None:
        """``batch_norm_forward_training`` on the arguments it has checked."""

    def batch_norm_forward_inference(self, mode: "BatchNormMode", x, y, scale, bias, mean, var, eps: float) -> None:
        """cudnnBatchNormalizationForwardInference: y = scale·(x - mean)/√(var + eps) + bias; x, y may be 16-bit."""
        arguments.check_batch_norm("batch_norm_forward_inference", self.precision, mode, x, (y,),
                                   (scale, bias, mean, var))
        self._batch_norm_forward_inference(mode, x, y, scale, bias, mean, var, eps)

    @abstractmethod
    def _batch_norm_forward_inference(self, mode: "BatchNormMode", x, y, scale, bias, mean, var, eps: float) -> None:
        """``batch_norm_forward_inference`` on the arguments it has checked."""

    def batch_norm_backward(self, mode: "BatchNormMode", x, dy, dx, scale, dscale, dbias, eps: float, save_mean,
                            save_inv_std, bias=None, relu: bool = False, communicator=None) -> None:
        """cudnnBatchNormalizationBackward (all alphas 1, betas 0), from the saved μ and 1/√(σ² + eps); x, dy, dx
        may be 16-bit:

            x̂ = (x - μ)/√(σ² + eps);  dbias = Σ dy;  dscale = Σ dy·x̂
            dx = scale/(m·√(σ² + eps))·(m·dy - dbias - x̂·dscale)

        ``relu`` (the fast engine only, with ``bias``): dy is the gradient after the ReLU the forward
        pass applied; dy·[scale·x̂ + bias > 0] takes its place above.

        ``communicator``: as in the forward, the totals (Σ dy, Σ dy·(x - μ)) and m are summed over the
        ranks before dx is computed from them; dscale and dbias are this rank's sums (averaged over
        the ranks afterwards with every other gradient, they become the gradient of the mean loss).
        """
        arguments.check_batch_norm_backward(self.precision, mode, x, dy, dx,
                                            (scale, dscale, dbias, save_mean, save_inv_std), bias, relu)
        self._batch_norm_backward(mode, x, dy, dx, scale, dscale, dbias, eps, save_mean, save_inv_std, bias, relu,
                                  communicator)

    @abstractmethod
    def _batch_norm_backward(self, mode: "BatchNormMode", x, dy, dx, scale, dscale, dbias, eps: float, save_mean,
                             save_inv_std, bias=None, relu: bool = False, communicator=None) -> None:
        """``batch_norm_backward`` on the arguments it has checked."""
