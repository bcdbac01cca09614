"""The host backend: the call surface of ``base.Backend`` computed with NumPy, float32 throughout.

Storage is a flat, C-contiguous ``numpy.ndarray``: float32, or a 16-bit tensor's (float16, bfloat16
as uint16 bits: backends/rounding.py), which the memory calls and the verbs of a 16-bit multilayer
perceptron or convolutional network (dropout and batch normalisation too) take (widening.py: computed in float32 from the stored values), rounding every value they
write to nearest even as the GPU does. BLAS calls read column-major matrices
out of those flat buffers through strided views, so leading dimensions, transposes and in-place
``beta`` blending behave as in cuBLAS. Convolution is im2col + one GEMM per call, with images
held batch-innermost (C, H, W, N) inside the plan and the column buffer laid out
(C·R·S, OH·OW·N), so that each kernel offset is one block copy over long contiguous rows. im2col,
col2im and pooling loop over the kernel / window offsets only, never over pixels or samples.

Math "bf16" rounds where the CUDA backend does (backends/cuda/low_precision.py): a GEMM's and a
convolution's float32 operands to bfloat16 (round to nearest even, ``round_to_bf16``) before the
product, which is then summed in float32, and a convolution's result once more (cuDNN writes it in
bfloat16, and the fast engine's GEMM convolution rounds its FP32 result so too). "fp16" does the same with IEEE half (``round_to_fp16``, as kernels/fp16.cu): a value past
65504 becomes ±inf, as on the GPU. "tf32" computes in FP32: the host has no TF32 rounding.

Dynamic loss scaling (``find_nonfinite_gradients``, ``update_loss_scale`` and the ``loss_scale`` of
the optimisers' calls) follows kernels/loss_scale.cu in float32.
"""

from __future__ import annotations

import logging

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...augmentation import augment
from ...errors import DTypeError, ShapeError, UsageError
from ...float_images import to_float_images
from ...precision import BFLOAT16, FLOAT16, FLOAT32, FP32, PRECISIONS, DType
from ...tensor import Tensor, storage_dtype
from ..arguments import OP_N, check_same_dtype
from ..base import Backend
from ..descriptors import ActivationDescriptor, ActivationMode, ConvolutionDescriptor, PoolingDescriptor, PoolingMode
from ..rounding import from_storage, round_to, round_to_bf16, round_to_fp16, to_storage
from . import batch_norm
from .widening import widened

log = logging.getLogger(__name__)

F32 = np.float32
_ITEM = np.dtype(F32).itemsize


MATHS = tuple(name for name, precision in PRECISIONS.items() if not precision.tensor_cores)  # computed as the GPU does
# the loss-scaling state's slots (kernels/loss_scale.cu)
SCALE, FOUND, SKIP, UNSCALE, CLEAN, SKIPPED = range(6)


# ---- helpers ----------------------------------------------------------------------------------
_ROUNDINGS = {BFLOAT16: round_to_bf16, FLOAT16: round_to_fp16}  # Precision.operand_dtype -> its rounding


def _nd(tensor: Tensor) -> np.ndarray:
    """The tensor's values as an (n, c, h, w) view of its flat storage (no copy)."""
    return tensor.data[: tensor.size].reshape(tensor.shape)


def _scalar(value) -> float:
    """A Python float from a float or a one-element tensor (cuBLAS device pointer mode)."""
    return float(value.data[0]) if isinstance(value, Tensor) else float(value)


def _blend(out: np.ndarray, value, alpha: float, beta: float) -> None:
    """out = alpha·value + beta·out in place; beta == 0 overwrites (NaN in ``out`` never survives)."""
    if beta == 0:
        np.multiply(value, F32(alpha), out=out)
        return
    if beta != 1:
        out *= F32(beta)
    out += value if alpha == 1 else np.multiply(value, F32(alpha))


def _matrix(flat: np.ndarray, rows: int, cols: int, ld: int) -> np.ndarray:
    """The rows×cols column-major matrix with leading dimension ``ld`` inside ``flat`` (a view; the verb
    has checked that it fits)."""
    return as_strided(flat, shape=(rows, cols), strides=(_ITEM, _ITEM * ld), writeable=True)


def _op_matrix(flat, trans, rows: int, cols: int, ld: int) -> np.ndarray:
    """op(M) (rows×cols): M is stored rows×cols (OP_N) or cols×rows (OP_T)."""
    return _matrix(flat, rows, cols, ld) if trans == OP_N else _matrix(flat, cols, rows, ld).T


def _vector(flat: np.ndarray, n: int, inc: int) -> np.ndarray:
    """The n-vector at stride ``inc`` inside ``flat`` (BLAS order: a negative inc runs backwards)."""
    need = (n - 1) * abs(inc) + 1 if n > 0 else 0
    view = flat[:need : abs(inc)]
    return view[::-1] if inc < 0 else view


# ---- softmax and the losses (rows: one sample each) --------------------------------------------
def _rows(tensor: Tensor) -> np.ndarray:
    """The tensor's values as (n, c·h·w): one row per sample (no copy)."""
    return _nd(tensor).reshape(tensor.n, -1)


def _softmax_rows(values: np.ndarray) -> np.ndarray:
    """softmax over each row of ``values``, shifted by the row's maximum (a NaN row stays NaN)."""
    e = np.exp(values - values.max(axis=1, keepdims=True))
    e /= e.sum(axis=1, keepdims=True)
    return e


def _cross_entropy_sum(predict: np.ndarray, target: np.ndarray) -> float:
    """-Σ target·log(max(predict, 1e-7)), summed in float64; NumPy's maximum keeps a NaN."""
    return -np.sum(target * np.log(np.maximum(predict, F32(1e-7))), dtype=np.float64)


def _hits(predict: np.ndarray, target: np.ndarray) -> int:
    """#rows whose argmax(predict) == argmax(target) (NumPy's argmax: the first maximum wins)."""
    return int(np.count_nonzero(np.argmax(predict, axis=1) == np.argmax(target, axis=1)))


# ---- activations ------------------------------------------------------------------------------
# f(x, coef)
_ACTIVATIONS = {
    ActivationMode.SIGMOID: lambda x, c: F32(0.5) + F32(0.5) * np.tanh(F32(0.5) * x),
    ActivationMode.RELU: lambda x, c: np.maximum(x, F32(0)),
    ActivationMode.TANH: lambda x, c: np.tanh(x),
    ActivationMode.CLIPPED_RELU: lambda x, c: np.minimum(np.maximum(x, F32(0)), F32(c)),
    ActivationMode.ELU: lambda x, c: np.where(x > 0, x, F32(c) * np.expm1(np.minimum(x, F32(0)))),
}

# f'(x)·dy, from (x, y, dy, coef), as cuDNN computes it
_GRADIENTS = {
    ActivationMode.SIGMOID: lambda x, y, dy, c: dy * y * (F32(1) - y),
    ActivationMode.RELU: lambda x, y, dy, c: dy * (x > 0),
    ActivationMode.TANH: lambda x, y, dy, c: dy * (F32(1) - y * y),
    ActivationMode.CLIPPED_RELU: lambda x, y, dy, c: dy * ((x > 0) & (x < F32(c))),
    ActivationMode.ELU: lambda x, y, dy, c: np.where(x > 0, dy, dy * (y + F32(c))),
}


def _lookup(table: dict, mode, what: str):
    """table[mode], or a UsageError listing the valid modes."""
    try:
        return table[mode]
    except KeyError:
        raise UsageError(f"unknown {what} mode {mode!r}; valid are {sorted(int(m) for m in table)}") from None


# ---- convolution plan -------------------------------------------------------------------------
class ConvolutionPlan:
    """Shapes, kernel-offset slices and reusable buffers for one (descriptor, input shape) pair.

    Inside the plan images are laid out (C, H, W, N), batch innermost: every im2col block copy and
    col2im block add then runs over long contiguous rows (N at a time) instead of NCHW's short ones.
    """

    def __init__(self, desc: ConvolutionDescriptor, x_shape, y_shape):
        self.desc, self.x_shape, self.y_shape = desc, tuple(x_shape), tuple(y_shape)
        n, c, h, w = self.x_shape
        _, k, oh, ow = self.y_shape
        p, d, st, r = desc.padding, desc.dilation, desc.stride, desc.kernel_size
        self.crs = c * r * r
        self.padded = np.zeros((c, h + 2 * p, w + 2 * p, n), F32)  # (C, Hp, Wp, N), border stays 0
        self.interior = (slice(None), slice(p, p + h), slice(p, p + w), slice(None))
        # (ki, kj, rows, cols): the padded-input pixels that kernel offset (ki, kj) meets
        self.offsets = [
            (i, j, slice(i * d, i * d + (oh - 1) * st + 1, st), slice(j * d, j * d + (ow - 1) * st + 1, st))
            for i in range(r)
            for j in range(r)
        ]
        self.cols = np.empty((self.crs, oh * ow * n), F32)  # (C·R·S, OH·OW·N)
        self.cols6 = self.cols.reshape(c, r, r, oh, ow, n)  # (C, R, S, OH, OW, N)
        self.product = np.empty((k, oh * ow * n), F32)  # (K, OH·OW·N)
        self.product_nchw = self.product.reshape(k, oh, ow, n).transpose(3, 0, 1, 2)  # (N, K, OH, OW)

    def __repr__(self) -> str:
        return f"ConvolutionPlan({self.desc}, x={self.x_shape}, y={self.y_shape})"

    def im2col(self, x: np.ndarray) -> np.ndarray:
        """cols[(c, i, j), (oh, ow, n)] = xpad[n, c, oh·s + i·d, ow·s + j·d]."""
        self.padded[self.interior] = x.transpose(1, 2, 3, 0)
        for i, j, rows, cols in self.offsets:
            np.copyto(self.cols6[:, i, j], self.padded[:, rows, cols])
        return self.cols

    def col2im(self, dcols: np.ndarray) -> np.ndarray:
        """The adjoint of im2col: scatter-add (C·R·S, OH·OW·N) columns back to an (N, C, H, W) view."""
        dxp = np.zeros(self.padded.shape, F32)
        dcols6 = dcols.reshape(self.cols6.shape)
        for i, j, rows, cols in self.offsets:
            dxp[:, rows, cols] += dcols6[:, i, j]
        return dxp[self.interior].transpose(3, 0, 1, 2)

    def dy_by_channel(self, dy: np.ndarray) -> np.ndarray:
        """dy (N, K, OH, OW) rearranged as the (K, OH·OW·N) matrix the GEMMs need (a copy)."""
        np.copyto(self.product_nchw, dy)
        return self.product


# ---- pooling ----------------------------------------------------------------------------------
def _pool_windows(desc: PoolingDescriptor, x: np.ndarray, y_shape):
    """(padded x, [slices of padded x, one per window offset in row-major order]).

    Padding is -inf for max pooling (padding never wins) and 0 for average (it is counted)."""
    if desc.mode not in (PoolingMode.MAX, PoolingMode.AVERAGE):
        raise UsageError(f"unknown pooling mode {desc.mode!r}; valid are MAX (0) and AVERAGE (1)")
    if min(desc.window, desc.stride) < 1 or desc.padding < 0:
        raise ShapeError(f"pooling: window and stride must be >= 1 and padding >= 0, got {desc}")
    p, st = desc.padding, desc.stride
    _, _, oh, ow = y_shape
    if p:
        n, c, h, w = x.shape
        fill = -np.inf if desc.mode == PoolingMode.MAX else 0.0
        xp = np.full((n, c, h + 2 * p, w + 2 * p), fill, F32)
        xp[:, :, p : p + h, p : p + w] = x
    else:
        xp = x
    offsets = [
        (slice(None), slice(None), slice(i, i + (oh - 1) * st + 1, st), slice(j, j + (ow - 1) * st + 1, st))
        for i in range(desc.window)
        for j in range(desc.window)
    ]
    return xp, offsets


def _pool_reduce(desc: PoolingDescriptor, xp: np.ndarray, offsets) -> np.ndarray:
    """The max, or the padding-inclusive mean, of every window."""
    reduce = np.maximum if desc.mode == PoolingMode.MAX else np.add
    out = xp[offsets[0]].copy()
    for window in offsets[1:]:
        reduce(out, xp[window], out=out)
    if desc.mode == PoolingMode.AVERAGE:
        out *= F32(1.0 / desc.window**2)
    return out


def _route_to_first_max(xp: np.ndarray, offsets, best: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """d/dxp of max pooling: each window's dy goes to its first cell (row-major) equal to its max, and
    nothing to its other cells (not even a NaN or infinite dy). A window holding a NaN has a NaN max,
    which equals no cell: its dy goes nowhere."""
    grad = np.zeros(xp.shape, F32)
    free = np.ones(best.shape, bool)  # windows whose maximum has not been met yet
    for window in offsets:
        hit = np.equal(xp[window], best)
        hit &= free
        free ^= hit
        grad[window] += np.where(hit, dy, F32(0))
    return grad


# ---- the backend ------------------------------------------------------------------------------
class HostBackend(Backend):
    """NumPy implementation of the call surface, with cuBLAS/cuDNN semantics. The GPU's oracle."""

    name = "host"
    plan_type = ConvolutionPlan  # what convolution_plan gives
    device_name = "host (NumPy)"
    maths = MATHS  # set_math and using take every precision; "tf32" computes in FP32

    def __repr__(self) -> str:
        return f"HostBackend(math={self.math!r})" if self.precision != FP32 else "HostBackend()"

    def _operand(self, values: np.ndarray) -> np.ndarray:
        """A GEMM or convolution operand as the GPU reads it: rounded to bfloat16 under math "bf16",
        to half under "fp16"."""
        rounding = _ROUNDINGS.get(self.precision.operand_dtype)
        return rounding(values) if rounding is not None else values

    def _convolution_result(self, values: np.ndarray) -> np.ndarray:
        """A convolution's result as cuDNN writes it: rounded to bfloat16 under math "bf16", to half under "fp16"."""
        rounding = _ROUNDINGS.get(self.precision.operand_dtype)
        return rounding(values) if rounding is not None else values

    # ---- memory: storage of a tensor dtype as backends/rounding.py lays it out ------------------
    def empty(self, size: int, dtype: DType = FLOAT32) -> np.ndarray:
        """Uninitialised flat storage of ``dtype``."""
        return np.empty(int(size), dtype.storage)

    def upload(self, array, dtype: DType = FLOAT32) -> np.ndarray:
        """A flat copy of the float32 ``array``, rounded to ``dtype``."""
        return np.array(array, dtype=F32, copy=True).reshape(-1) if dtype is FLOAT32 else to_storage(dtype, array)

    def upload_pixels(self, pixels, pad: int, mean: float, std: float) -> np.ndarray:
        """to_float_images(pixels, (mean, std), pad), flat."""
        return to_float_images(pixels, (mean, std), pad).reshape(-1)

    def download(self, storage, size: int) -> np.ndarray:
        """A float32 copy of the first ``size`` values."""
        return from_storage(storage[:size])

    def write(self, storage, array) -> None:
        """storage[:array.size] = array rounded to the storage's dtype, in place."""
        np.copyto(storage[: array.size], to_storage(storage_dtype(storage), array))

    def copy(self, src, dst, size: int) -> None:
        """dst[:size] = src[:size], storage of one dtype."""
        check_same_dtype("copy", src, dst)
        np.copyto(dst[:size], src[:size])

    def convert(self, src, dst, size: int) -> None:
        """dst[:size] = src[:size] rounded to dst's dtype."""
        np.copyto(dst[:size], to_storage(storage_dtype(dst), from_storage(src[:size])))

    def fill(self, storage, value: float, size: int) -> None:
        """storage[:size] = value rounded to the storage's dtype."""
        storage[:size] = to_storage(storage_dtype(storage), [value])[0]

    def view(self, storage, offset: int, size: int) -> np.ndarray:
        """A slice sharing memory with ``storage``."""
        if offset < 0 or offset + size > storage.size:
            raise ShapeError(f"view [{offset}:{offset + size}] does not fit in storage of {storage.size} values")
        return storage[offset : offset + size]

    # ---- cuBLAS -------------------------------------------------------------------------------
    @widened
    def _sgemm(self, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc) -> None:
        """C(m×n) = alpha·op(A)(m×k)·op(B)(k×n) + beta·C, column-major with leading dimensions."""
        op_a = self._operand(_op_matrix(A.data, transa, m, k, lda))
        op_b = self._operand(_op_matrix(B.data, transb, k, n, ldb))
        _blend(_matrix(C.data, m, n, ldc), op_a @ op_b, _scalar(alpha), _scalar(beta))

    @widened
    def _sgemv(self, trans, m, n, alpha, A, lda, x, incx, beta, y, incy) -> None:
        """y = alpha·op(A)·x + beta·y, A m×n column-major; len(x), len(y) = (n, m) or (m, n) if OP_T."""
        rows, cols = (m, n) if trans == OP_N else (n, m)  # op(A), stored m×n either way
        op_a = _op_matrix(A.data, trans, rows, cols, lda)
        product = op_a @ _vector(x.data, cols, incx)
        _blend(_vector(y.data, rows, incy), product, _scalar(alpha), _scalar(beta))

    def _saxpy(self, n, alpha, x, incx, y, incy) -> None:
        """y = alpha·x + y."""
        _vector(y.data, n, incy)[...] += F32(_scalar(alpha)) * _vector(x.data, n, incx)

    def _sscal(self, n, alpha, x, incx) -> None:
        """x = alpha·x."""
        _vector(x.data, n, incx)[...] *= F32(_scalar(alpha))

    def _scopy(self, n, x, incx, y, incy) -> None:
        """y = x."""
        _vector(y.data, n, incy)[...] = _vector(x.data, n, incx)

    # ---- cuDNN: pointwise ---------------------------------------------------------------------
    @widened
    def _activation_forward(self, desc: ActivationDescriptor, alpha, x, beta, y) -> None:
        """y = alpha·f(x) + beta·y."""
        _blend(_nd(y), _lookup(_ACTIVATIONS, desc.mode, "activation")(_nd(x), desc.coef), alpha, beta)

    @widened
    def _activation_backward(self, desc: ActivationDescriptor, alpha, y, dy, x, beta, dx) -> None:
        """dx = alpha·f'(x)·dy + beta·dx."""
        gradient = _lookup(_GRADIENTS, desc.mode, "activation")
        _blend(_nd(dx), gradient(_nd(x), _nd(y), _nd(dy), desc.coef), alpha, beta)

    @widened
    def _softmax_forward(self, alpha, x, beta, y) -> None:
        """y = alpha·softmax(x over each sample's c·h·w values) + beta·y, shifted by the max."""
        _blend(_rows(y), _softmax_rows(_rows(x)), alpha, beta)

    def _add_tensor(self, alpha, bias, beta, y) -> None:
        """y = alpha·bias + beta·y, bias broadcast over every dimension where its size is 1; a 16-bit y reads
        the bias rounded to its 16 bits, as cuDNN (one data type for both) does."""
        self._add_values(alpha, round_to(y.dtype, _nd(bias)) if y.dtype.half else _nd(bias), beta, y)

    @widened
    def _add_values(self, alpha, values: np.ndarray, beta, y) -> None:
        _blend(_nd(y), values, alpha, beta)

    # ---- cuDNN: convolution -------------------------------------------------------------------
    def convolution_plan(self, desc: ConvolutionDescriptor, x_shape, y_shape) -> ConvolutionPlan:
        """Index slices and buffers for im2col convolution of these shapes."""
        x_shape, y_shape = tuple(x_shape), tuple(y_shape)
        if min(desc.kernel_size, desc.stride, desc.dilation) < 1 or desc.padding < 0:
            raise ShapeError(f"convolution: kernel, stride and dilation must be >= 1 and padding >= 0, got {desc}")
        if x_shape[1] != desc.in_channels:
            raise ShapeError(f"convolution: input has {x_shape[1]} channels, the filter {desc.in_channels}")
        if y_shape != desc.output_shape(x_shape) or min(y_shape) < 1:
            raise ShapeError(
                f"convolution: input {x_shape} gives output {desc.output_shape(x_shape)} with {desc}, got {y_shape}"
            )
        plan = ConvolutionPlan(desc, x_shape, y_shape)
        log.debug("%r: column buffer %s", plan, plan.cols.shape)
        return plan

    @widened
    def _convolution_forward(self, plan: ConvolutionPlan, alpha, x, w, beta, y) -> None:
        """y = alpha·(x ⋆ w) + beta·y: W(K, CRS) @ cols(CRS, OH·OW·N), then back to NCHW."""
        np.matmul(self._operand(_nd(w)).reshape(plan.desc.out_channels, plan.crs), plan.im2col(self._operand(_nd(x))),
                  out=plan.product)
        _blend(_nd(y), self._convolution_result(plan.product_nchw), alpha, beta)

    @widened
    def _convolution_backward_data(self, plan: ConvolutionPlan, alpha, w, dy, beta, dx) -> None:
        """dx = alpha·col2im(Wᵀ(CRS, K) @ dy(K, OH·OW·N)) + beta·dx."""
        dcols = (self._operand(_nd(w)).reshape(plan.desc.out_channels, plan.crs).T
                 @ plan.dy_by_channel(self._operand(_nd(dy))))
        _blend(_nd(dx), self._convolution_result(plan.col2im(dcols)), alpha, beta)

    @widened
    def _convolution_backward_filter(self, plan: ConvolutionPlan, alpha, x, dy, beta, dw) -> None:
        """dw = alpha·dy(K, OH·OW·N) @ colsᵀ(OH·OW·N, CRS) + beta·dw."""
        grad = plan.dy_by_channel(self._operand(_nd(dy))) @ plan.im2col(self._operand(_nd(x))).T
        _blend(_nd(dw).reshape(grad.shape), self._convolution_result(grad), alpha, beta)

    @widened
    def _convolution_backward_bias(self, alpha, dy, beta, db) -> None:
        """db(1, K, 1, 1) = alpha·Σ_{n,h,w} dy + beta·db."""
        _blend(_nd(db), _nd(dy).sum(axis=(0, 2, 3), keepdims=True), alpha, beta)

    # ---- cuDNN: pooling -----------------------------------------------------------------------
    @widened
    def _pooling_forward(self, desc: PoolingDescriptor, alpha, x, beta, y) -> None:
        """y = alpha·(max or padding-inclusive mean of each window) + beta·y."""
        xp, offsets = _pool_windows(desc, _nd(x), y.shape)
        _blend(_nd(y), _pool_reduce(desc, xp, offsets), alpha, beta)

    @widened
    def _pooling_backward(self, desc: PoolingDescriptor, alpha, y, dy, x, beta, dx) -> None:
        """dx = alpha·(dy routed to each window's first maximum, or spread evenly) + beta·dx."""
        xp, offsets = _pool_windows(desc, _nd(x), dy.shape)
        if desc.mode == PoolingMode.MAX:
            grad = _route_to_first_max(xp, offsets, _pool_reduce(desc, xp, offsets), _nd(dy))
        else:
            grad, share = np.zeros(xp.shape, F32), _nd(dy) * F32(1.0 / desc.window**2)
            for window in offsets:
                grad[window] += share
        p = desc.padding
        _blend(_nd(dx), grad[:, :, p : p + x.h, p : p + x.w], alpha, beta)

    # ---- losses and the optimiser (our own kernels on CUDA) -----------------------------------
    def _cross_entropy_loss(self, predict, target, loss, accumulate: bool = False) -> None:
        """loss[0] (+)= -(1/N)·Σ target·log(max(predict, 1e-7))."""
        self._store(loss, _cross_entropy_sum(_nd(predict), _nd(target)) / predict.n, accumulate)

    def _squared_error_loss(self, predict, target, loss, accumulate: bool = False) -> None:
        """loss[0] (+)= (1/N)·Σ ½‖predict - target‖²."""
        diff = _nd(predict) - _nd(target)
        self._store(loss, 0.5 * np.sum(diff * diff, dtype=np.float64) / predict.n, accumulate)

    def _record_nonfinite(self, watch, loss) -> None:
        """watch[0] += 1;  watch[1] = watch[0] where it is 0 and loss[0] is not finite (int32 bits)."""
        counts = watch.data.reshape(-1).view(np.int32)
        counts[0] += 1
        if counts[1] == 0 and not np.isfinite(loss.data.reshape(-1)[0]):
            counts[1] = counts[0]

    def _gather_batch(self, images, labels, order, cursor, x, target) -> None:
        """x[b] = images[order[cursor + b]];  target[b] = one_hot(labels[order[cursor + b]])."""
        start = int(cursor.data[0])
        samples = order.data[start:start + x.n].astype(np.int64)
        if samples.size != x.n:
            raise ShapeError(f"gather_batch: a batch of {x.n} from position {start} runs past {order.size} samples")
        x.data.reshape(x.n, -1)[:] = images.data.reshape(images.n, -1)[samples]
        onehot = target.data.reshape(target.n, -1)
        onehot[:] = 0.0
        onehot[np.arange(x.n), labels.data[samples].astype(np.int64)] = 1.0

    def _gather_augmented_batch(self, images, labels, order, cursor, counter, x, target, padding: int, flip: bool,
                               seed: int) -> None:
        """gather_batch, then x = augmentation.augment(x, seed, counter[0], padding, flip); counter[0] += 1."""
        self.gather_batch(images, labels, order, cursor, x, target)
        steps = counter.data[:1].view(np.uint32)  # uint32 bits in float32 storage
        _nd(x)[...] = augment(_nd(x), seed, int(steps[0]), padding, flip)
        steps += np.uint32(1)

    def _accuracy_count(self, predict, target, count, accumulate: bool = False) -> None:
        """count[0] (+)= #samples with argmax(predict) == argmax(target)."""
        self._store(count, float(_hits(_rows(predict), _rows(target))), accumulate)

    @staticmethod
    def _store(out: Tensor, value: float, accumulate: bool) -> None:
        """out[0] = value, or out[0] += value."""
        out.data[0] = (float(out.data[0]) if accumulate else 0.0) + value

    def _sgd_update(self, param, grad, velocity, lr, momentum: float, weight_decay: float) -> None:
        """g = grad + wd·param; v = momentum·v + g (if momentum); param -= lr·(v or g)."""
        p, g = param.data[: param.size], grad.data[: grad.size]
        if weight_decay:
            g = g + F32(weight_decay) * p
        if momentum:
            v = velocity.data[: velocity.size]
            v *= F32(momentum)
            v += g
            g = v
        p -= F32(_scalar(lr)) * g

    # ---- fused calls: on the host, the unfused formulas in one call -------------------------------
    @widened
    def _sgemm_bias_activation(self, transa, transb, m, n, k, A, lda, B, ldb, C, ldc, bias,
                               desc: ActivationDescriptor | None) -> None:
        """C = f(op(A)·op(B) + h(b)·1ᵀ): the float32 product plus the bias rounded to C's 16 bits, f, and C
        rounded once (``widened``), as cuBLASLt's epilogue computes it."""
        op_a = self._operand(_op_matrix(A.data, transa, m, k, lda))
        op_b = self._operand(_op_matrix(B.data, transb, k, n, ldb))
        values = op_a @ op_b + self._operand(_vector(bias.data, m, 1)).reshape(m, 1)
        if desc is not None:
            values = _lookup(_ACTIVATIONS, desc.mode, "activation")(values, desc.coef)
        _matrix(C.data, m, n, ldc)[...] = values

    @widened
    def _bias_activation_forward(self, desc: ActivationDescriptor | None, bias, y) -> None:
        values = _nd(y)
        values += _nd(bias).reshape(1, y.c, 1, 1)
        if desc is not None:
            values[...] = _lookup(_ACTIVATIONS, desc.mode, "activation")(values, desc.coef)

    @widened
    def _activation_bias_backward(self, desc: ActivationDescriptor, y, dy, dx, db) -> None:
        self.activation_backward(desc, 1.0, y, dy, y, 0.0, dx)
        db.data[: db.size] = _nd(dx).reshape(dx.n, dx.c).sum(axis=0, dtype=F32)

    def _cross_entropy_backward(self, predict, target, grad, loss, count) -> None:
        """grad = (predict - target)/N;  loss[0] += -(1/N)·Σ target·log(max(predict, 1e-7));  count[0] += hits."""
        g = _nd(grad)
        np.subtract(_nd(predict), _nd(target), out=g)
        g *= F32(1.0 / predict.n)
        self.cross_entropy_loss(predict, target, loss, accumulate=True)
        self.accuracy_count(predict, target, count, accumulate=True)

    @widened
    def _softmax_cross_entropy_backward(self, logits, target, predict, grad, loss, count) -> None:
        """predict = softmax(logits), then ``cross_entropy_backward`` from it."""
        self.softmax_forward(1.0, logits, 0.0, predict)
        self.cross_entropy_backward(predict, target, grad, loss, count)

    @widened
    def _softmax_cross_entropy_metrics(self, logits, target, loss, count, loss_scale) -> None:
        """ŷ = softmax(logits) (not kept);  loss[0] += loss_scale·(-Σ target·log(max(ŷ, 1e-7)));  count[0] += hits."""
        predict, y = _softmax_rows(_rows(logits)), _rows(target)
        self._store(loss, float(loss_scale) * _cross_entropy_sum(predict, y), accumulate=True)
        self._store(count, float(_hits(predict, y)), accumulate=True)

    def _sgd_update_many(self, groups, lr, momentum: float, weight_decay: float, loss_scale=None) -> None:
        """``sgd_update`` on each (param, grad, velocity) in turn; with ``loss_scale`` on grad·unscale,
        nothing where the step is skipped."""
        if loss_scale is not None and loss_scale.data[SKIP] != 0:
            return
        for param, grad, velocity in groups:
            if loss_scale is not None:
                grad = Tensor.from_numpy(_nd(grad) * loss_scale.data[UNSCALE], self)
            self.sgd_update(param, grad, velocity, lr, momentum, weight_decay)

    def _find_nonfinite_gradients(self, grads, loss_scale) -> None:
        """found = 1 where any of the flat ``grads`` is inf or NaN; those values become 0."""
        values = grads.data[: grads.size]
        nonfinite = ~np.isfinite(values)
        if nonfinite.any():
            values[nonfinite] = F32(0)
            loss_scale.data[FOUND] = F32(1)

    def _update_loss_scale(self, loss_scale, growth_interval: int, min_scale: float, max_scale: float) -> None:
        """skip = found, unscale = 1/S; then halve S on overflow, double it after ``growth_interval``
        clean steps (float32, as kernels/loss_scale.cu); found = 0."""
        state = loss_scale.data
        scale, found = state[SCALE], state[FOUND] != 0
        state[SKIP] = F32(found)
        state[UNSCALE] = F32(1) / scale
        if found:
            state[SCALE] = max(F32(0.5) * scale, F32(min_scale))
            state[CLEAN] = F32(0)
            state[SKIPPED] += F32(1)
        else:
            clean = state[CLEAN] + F32(1)
            grow = clean >= F32(growth_interval)
            state[SCALE] = min(F32(2) * scale, F32(max_scale)) if grow else scale
            state[CLEAN] = F32(0) if grow else clean
        state[FOUND] = F32(0)

    # ---- DLPack -------------------------------------------------------------------------------
    def dlpack(self, tensor: Tensor, stream=None, **kwargs):
        """The DLPack capsule of the (n, c, h, w) NumPy view of the tensor's storage (float32 or float16;
        NumPy cannot export bfloat16)."""
        if tensor.dtype is BFLOAT16:
            raise DTypeError("a bfloat16 tensor on the host cannot be exported through DLPack (NumPy has no "
                             "bfloat16); export tensor.to('float32'), or use numpy()")
        return _nd(tensor).__dlpack__(stream=stream, **kwargs)

    def dlpack_device(self) -> tuple[int, int]:
        """(kDLCPU, 0)."""
        return (1, 0)

    def from_dlpack(self, cls, external):
        """A host tensor holding a copy of a CPU DLPack producer's values."""
        array = np.from_dlpack(external)
        return cls.from_numpy(array, self, FLOAT16 if array.dtype == np.float16 else FLOAT32)

    # ---- layers and optimisers of issue 18: Adam, dropout, batch normalisation -------------------
    def _adam_update_many(self, groups, lr, counter, beta1: float, beta2: float, eps: float, weight_decay: float,
                         decoupled: bool, loss_scale=None) -> None:
        """Adam or AdamW on each (param, grad, m, v) in turn, float32 like the CUDA kernel; counter[0] += 1
        (an empty list changes nothing, as on CUDA, where no kernel is launched for it). With
        ``loss_scale``: on grad·unscale, and nothing at all where the step is skipped."""
        if loss_scale is not None and loss_scale.data[SKIP] != 0:
            return
        unscale = F32(1) if loss_scale is None else loss_scale.data[UNSCALE]
        if not groups:
            return
        t = float(counter.data[0]) + 1.0
        rate = _scalar(lr)
        # 1 - βᵗ of the float32 β the kernel reads, in float64
        step_size = F32(rate / (1.0 - float(F32(beta1)) ** t))
        root_correction2 = F32(np.sqrt(1.0 - float(F32(beta2)) ** t))
        b1, b2 = F32(beta1), F32(beta2)
        for param, grad, m, v in groups:
            p, g = param.data[: param.size], grad.data[: grad.size]
            if loss_scale is not None:
                g = g * unscale
            if decoupled:
                p -= F32(rate) * F32(weight_decay) * p
            elif weight_decay:
                g = g + F32(weight_decay) * p
            mean, square = m.data[: m.size], v.data[: v.size]
            mean *= b1
            mean += (F32(1) - b1) * g
            square *= b2
            square += (F32(1) - b2) * g * g
            p -= step_size * mean / (np.sqrt(square) / root_correction2 + F32(eps))
        counter.data[0] = t

    def dropout_state(self, rate: float, seed: int) -> HostDropoutState:
        return HostDropoutState(float(rate), np.random.default_rng(int(seed)))

    def dropout_reserve(self, state, x_shape) -> np.ndarray:
        """The scaled mask mask/(1 - rate) as float32 of ``x_shape``."""
        return np.zeros(tuple(x_shape), F32)

    @widened
    def _dropout_forward(self, state, reserve, x, y) -> None:
        """mask ~ Bernoulli(1 - rate) from the layer's generator; y = x·mask/(1 - rate)."""
        keep = state.generator.random(x.shape, dtype=F32) >= F32(state.rate)
        np.multiply(keep, F32(1.0 / (1.0 - state.rate)), out=reserve)
        np.multiply(_nd(x), reserve, out=_nd(y))

    @widened
    def _dropout_backward(self, state, reserve, dy, dx) -> None:
        """dx = dy·mask/(1 - rate), the mask of the last forward."""
        np.multiply(_nd(dy), reserve.reshape(dy.shape), out=_nd(dx))

    @widened
    def _batch_norm_forward_training(self, mode, x, y, scale, bias, factor: float, running_mean, running_var,
                                     eps: float, save_mean, save_inv_std, relu: bool = False, communicator=None) -> None:
        """Batch statistics in float64 (batch_norm.py), over a ``communicator``'s ranks where given."""
        batch_norm.forward_training(mode, x, y, scale, bias, factor, running_mean, running_var, eps, save_mean,
                                    save_inv_std, relu, communicator)

    @widened
    def _batch_norm_forward_inference(self, mode, x, y, scale, bias, mean, var, eps: float) -> None:
        """y = scale·(x - mean)/√(var + eps) + bias."""
        batch_norm.forward_inference(mode, x, y, scale, bias, mean, var, eps)

    @widened
    def _batch_norm_backward(self, mode, x, dy, dx, scale, dscale, dbias, eps: float, save_mean,
                             save_inv_std, bias=None, relu: bool = False, communicator=None) -> None:
        """dbias = Σ dy;  dscale = Σ dy·x̂;  dx = scale·inv_std/m·(m·dy - dbias - x̂·dscale) (batch_norm.py)."""
        batch_norm.backward(mode, x, dy, dx, scale, dscale, dbias, save_mean, save_inv_std, bias, relu, communicator)


class HostDropoutState:
    """A dropout layer's rate and the seeded generator its masks are drawn from."""

    def __init__(self, rate: float, generator: np.random.Generator):
        self.rate, self.generator = rate, generator

