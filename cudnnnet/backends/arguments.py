"""The arguments of the call surface (base.py): the cuBLAS transpose flags, and the checks of the
arguments every backend's verbs share, each raising a ShapeError or UsageError that names the call and
the problem. Cheap and host-side: a bad size must not become an out-of-bounds access on a GPU.

The computing verbs take float32 tensors, each verb's check refusing a 16-bit tensor among its
operands (``float32_only``, a DTypeError naming the verb and the dtype) rather than misread its bytes;
the verbs of a 16-bit multilayer perceptron or convolutional network (GEMMs, activations, the softmax's
input, the fused bias and loss calls, convolutions, their bias, pooling, dropout, batch normalisation)
also take, for the operands that hold activations or their gradients, 16-bit tensors of the precision
in force (``activations``: its ``activation_dtype``)."""

from __future__ import annotations

import numbers

from ..errors import DTypeError, InvalidArgumentError, ShapeError, UsageError
from ..precision import FLOAT32, DType, Precision
from .descriptors import BatchNormMode, in_gemm_epilogue

OP_N = 0  # CUBLAS_OP_N
OP_T = 1  # CUBLAS_OP_T


def float32_only(call: str, *operands) -> None:
    """A DTypeError unless every tensor among ``operands`` holds float32 values (an operand without a
    DType, a float or None, is passed over): ``call`` computes in float32 and would misread 16-bit storage."""
    for operand in operands:
        dtype = getattr(operand, "dtype", FLOAT32)
        if dtype is not FLOAT32 and isinstance(dtype, DType):
            raise DTypeError(f"{call} takes float32 tensors only, got a {dtype} tensor of shape {operand.shape}; "
                             f"convert it with tensor.to('float32')")


def activations(call: str, precision: Precision, *operands) -> None:
    """A DTypeError unless every tensor among ``operands`` holds float32 values or the 16-bit values of
    ``precision`` (its activation_dtype: bfloat16 under bf16, float16 under fp16)."""
    allowed = precision.activation_dtype
    for operand in operands:
        dtype = getattr(operand, "dtype", FLOAT32)
        if isinstance(dtype, DType) and dtype is not FLOAT32 and dtype is not allowed:
            valid = "float32 tensors only" if allowed is FLOAT32 else f"float32 or {allowed} tensors"
            raise DTypeError(f"{call} takes {valid} under math {precision}, got a {dtype} tensor of shape "
                             f"{operand.shape}; its 16-bit tensors are bfloat16 under math bf16 and float16 under "
                             f"fp16, or convert it with tensor.to('float32')")


def same_dtype(call: str, *operands) -> None:
    """A DTypeError unless the tensors ``operands`` hold values of one dtype."""
    dtypes = {operand.dtype for operand in operands}
    if len(dtypes) > 1:
        raise DTypeError(f"{call}: its tensors must hold values of one dtype, got "
                         f"{', '.join(f'{operand.dtype} {operand.shape}' for operand in operands)}")


def check_activations(call: str, precision: Precision, x, *others) -> None:
    """Tensors of ``x``'s shape and dtype, float32 or the 16 bits of ``precision``, else a ShapeError or
    DTypeError naming ``call``."""
    activations(call, precision, x, *others)
    same_dtype(call, x, *others)
    for other in others:
        same_shape(call, x, other)


def check_softmax(precision: Precision, x, y) -> None:
    """softmax_forward's x (float32, or the 16 bits of ``precision``) and float32 y, of one shape."""
    activations("softmax_forward", precision, x)
    float32_only("softmax_forward", y)
    same_shape("softmax_forward", x, y)


def check_same_dtype(call: str, source, target) -> None:
    """A DTypeError unless the storages ``source`` and ``target`` hold values of one type."""
    if source.dtype != target.dtype:
        from ..tensor import storage_dtype  # tensor.py imports NumPy, which the backends' import defers

        raise DTypeError(f"{call}: storage of {storage_dtype(source)} values cannot be copied into storage of "
                         f"{storage_dtype(target)} values; convert them (Tensor.copy_, Tensor.to)")


def check_elementwise(call: str, x, *others) -> None:
    """float32 tensors of ``x``'s shape, else a DTypeError or ShapeError naming ``call``."""
    float32_only(call, x, *others)
    for other in others:
        same_shape(call, x, other)


def check_bias(call: str, bias, y, precision: Precision | None = None) -> None:
    """A ShapeError unless ``bias`` holds one value per channel of ``y`` (N, C, H, W); float32 both, or
    with ``precision`` y of its 16 bits too."""
    float32_only(call, bias, *(() if precision else (y,)))
    if precision is not None:
        activations(call, precision, y)
    if bias.size != y.c:
        raise ShapeError(f"{call}: the bias must hold one value per channel of y {y.shape} ({y.c}), got shape {bias.shape}")


def check_activation_bias(call: str, precision: Precision, y, dy, dx, db) -> None:
    """A ShapeError unless y, dy and dx share one (N, C, 1, 1) shape and db holds C values; y, dy and dx
    of one dtype, float32 or the 16 bits of ``precision``; db float32."""
    check_activations(call, precision, y, dy, dx)
    if y.h * y.w != 1:
        raise ShapeError(f"{call}: y must be a Dense layer's output (N, C, 1, 1), got {y.shape}")
    check_bias(call, db, y, precision)


LOSS_SCALE_VALUES = 6  # [S, found, skip, unscale, clean steps, skipped steps]: kernels/loss_scale.cu


def check_loss_scale(call: str, loss_scale) -> None:
    """A loss-scaling state holds LOSS_SCALE_VALUES float32 values: [S, found, skip, 1/S, clean, skipped], else a
    ShapeError (a DTypeError)."""
    float32_only(call, loss_scale)
    if loss_scale.size != LOSS_SCALE_VALUES:
        raise ShapeError(f"{call}: the loss-scaling state must hold {LOSS_SCALE_VALUES} values "
                         f"(S, found, skip, unscale, clean, skipped), got shape {loss_scale.shape}")


def check_nonfinite_gradients(grads, loss_scale) -> None:
    """find_nonfinite_gradients' float32 ``grads`` and loss-scaling state."""
    float32_only("find_nonfinite_gradients", grads)
    check_loss_scale("find_nonfinite_gradients", loss_scale)


def check_nonfinite_operands(watch, loss) -> None:
    """record_nonfinite's operands: a two-count ``watch`` and a one-value ``loss``, else a ShapeError."""
    float32_only("record_nonfinite", watch, loss)
    if watch.size != 2 or loss.size != 1:
        raise ShapeError(f"record_nonfinite: watch must hold 2 values and loss 1, got shapes {watch.shape} and {loss.shape}")


def check_augmented_gather(images, counter, x, padding: int, seed: int) -> None:
    """gather_augmented_batch's own operands (gather_batch checks the rest), else a ShapeError or
    InvalidArgumentError naming the problem."""
    from ..augmentation import MAX_CROP_PADDING  # augmentation.py imports NumPy, which the backends' import defers

    float32_only("gather_augmented_batch", counter)
    if counter.size != 2:
        raise ShapeError(f"gather_augmented_batch: counter must hold 2 values [step, 0], got shape {counter.shape}")
    if x.shape[1:] != images.shape[1:]:
        raise ShapeError(f"gather_augmented_batch: x {x.shape} does not hold samples of images {images.shape}")
    if isinstance(padding, bool) or not isinstance(padding, int) or not 0 <= padding <= MAX_CROP_PADDING:
        raise InvalidArgumentError(f"gather_augmented_batch: padding must be an integer in [0, {MAX_CROP_PADDING}], "
                                   f"got {padding!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise InvalidArgumentError(f"gather_augmented_batch: seed must be an integer in [0, 2^64), got {seed!r}")


def check_fits(call: str, storage, offset: int, size: int) -> None:
    """A ShapeError unless [offset, offset + size) lies inside the flat ``storage``."""
    if offset < 0 or size < 0 or offset + size > storage.size:
        raise ShapeError(f"{call}: [{offset}:{offset + size}] does not fit in storage of {storage.size} values")


def stored_shape(trans, rows: int, cols: int, name: str) -> tuple[int, int]:
    """The stored shape of a matrix whose op() is rows×cols."""
    if trans not in (OP_N, OP_T):
        raise UsageError(f"invalid transpose flag for {name}: {trans!r}; valid are OP_N (0) and OP_T (1)")
    return (rows, cols) if trans == OP_N else (cols, rows)


def extent(rows: int, cols: int, ld: int) -> int:
    """The values from a column-major matrix's first to its last (0 for an empty one)."""
    return ld * (cols - 1) + rows if rows and cols else 0


def check_matrix(call: str, name: str, tensor, rows: int, cols: int, ld: int) -> None:
    """A ShapeError unless ``tensor``'s storage holds a rows×cols column-major matrix of leading dimension ``ld``."""
    if ld < max(1, rows):
        raise ShapeError(f"{call}: leading dimension of {name} must be >= max(1, {rows}), got {ld}")
    need = ld * (cols - 1) + rows if rows and cols else 0
    if need > tensor.data.size:
        raise ShapeError(f"{call}: {name} ({rows}x{cols}, ld={ld}) needs {need} values, its storage holds {tensor.data.size}")


def check_vector(call: str, name: str, tensor, n: int, inc: int) -> None:
    """A UsageError for a zero increment, a ShapeError unless ``tensor``'s storage holds n values at stride ``inc``."""
    if inc == 0:
        raise UsageError(f"{call}: increment of {name} must be non-zero, got {inc}")
    need = (n - 1) * abs(inc) + 1 if n > 0 else 0
    if need > tensor.data.size:
        raise ShapeError(f"{call}: {name} (n={n}, inc={inc}) needs {need} values, its storage holds {tensor.data.size}")


def same_shape(call: str, a, b) -> None:
    """A ShapeError unless tensors ``a`` and ``b`` have one shape."""
    if a.shape != b.shape:
        raise ShapeError(f"{call}: tensors must have the same shape, got {a.shape} and {b.shape}")


def expect_shape(call: str, what: str, tensor, shape) -> None:
    """A ShapeError naming ``what`` unless ``tensor`` has ``shape``."""
    if tensor.shape != tuple(shape):
        raise ShapeError(f"{call}: {what} must have shape {tuple(shape)}, got {tensor.shape}")


def check_plan(call: str, backend, plan, x, w, y, result=None) -> None:
    """A UsageError unless ``plan`` is one of ``backend.convolution_plan``'s, a ShapeError unless x, w and y
    have its shapes (the input, filter and output of the convolution, whichever direction runs); w float32,
    x and y of one dtype, float32 or the 16 bits of the backend's precision. ``result``: (out, alpha, beta)
    of a direction writing x or y, a 16-bit out written with alpha 1 and beta 0 only (its product rounded once)."""
    activations(call, backend.precision, x, y)
    same_dtype(call, x, y)
    float32_only(call, w)
    out, alpha, beta = result or (w, 1.0, 0.0)
    plain = all(isinstance(value, numbers.Real) for value in (alpha, beta)) and (alpha, beta) == (1.0, 0.0)
    if out.dtype.half and not plain:
        raise UsageError(f"{call}: a {out.dtype} result takes alpha 1 and beta 0 (it is the product rounded once), "
                         f"got alpha {alpha!r} and beta {beta!r}; blend into a float32 tensor instead")
    if not isinstance(plan, backend.plan_type):
        raise UsageError(f"{call}: expected a plan from {type(backend).__name__}.convolution_plan, "
                         f"got {type(plan).__name__}")
    expect_shape(call, "the input", x, plan.x_shape)
    expect_shape(call, "the filter", w, plan.desc.filter_shape)
    expect_shape(call, "the output", y, plan.y_shape)


def check_gather(images, labels, order, cursor, x, target) -> None:
    """The shapes gather_batch needs, else a ShapeError naming the argument; float32 all."""
    float32_only("gather_batch", images, labels, order, cursor, x, target)
    if x.shape[1:] != images.shape[1:] or target.n != x.n or labels.size != images.n or order.size != images.n:
        raise ShapeError(f"gather_batch: images {images.shape}, labels {labels.shape}, order {order.shape}, "
                         f"x {x.shape}, target {target.shape} do not fit together")
    if cursor.size != 1:
        raise ShapeError(f"gather_batch: cursor must hold one value, got shape {cursor.shape}")


def check_sgemm(precision: Precision, transa, transb, m: int, n: int, k: int, A, lda: int, B, ldb: int, C, ldc: int,
                call: str = "sgemm") -> None:
    """sgemm's flags and matrices, float32 or the 16 bits of ``precision``: op(A) m×k, op(B) k×n, C m×n
    inside their storage."""
    activations(call, precision, A, B, C)
    check_matrix(call, "A", A, *stored_shape(transa, m, k, "A"), lda)
    check_matrix(call, "B", B, *stored_shape(transb, k, n, "B"), ldb)
    check_matrix(call, "C", C, m, n, ldc)


def check_sgemm_bias_activation(precision: Precision, transa, transb, m: int, n: int, k: int, A, lda: int, B,
                                ldb: int, C, ldc: int, bias, desc) -> None:
    """sgemm's matrices with a 16-bit C (so a 16-bit math), a float32 bias of m values, and an activation
    that cuBLASLt's epilogue applies (none or ReLU)."""
    call = "sgemm_bias_activation"
    check_sgemm(precision, transa, transb, m, n, k, A, lda, B, ldb, C, ldc, call)
    if not C.dtype.half:
        raise DTypeError(f"{call} writes a 16-bit C (bfloat16 under math bf16, float16 under fp16), got a "
                         f"{C.dtype} C; use sgemm and bias_activation_forward for a float32 one")
    float32_only(call, bias)
    if bias.size != m:
        raise ShapeError(f"{call}: the bias must hold one value per row of C ({m}), got shape {bias.shape}")
    if not in_gemm_epilogue(desc):
        raise UsageError(f"{call} applies a ReLU or no activation (cuBLASLt's epilogues), got {desc.mode.name.lower()}; "
                         f"use sgemm and bias_activation_forward for it")


def check_sgemv(precision: Precision, trans, m: int, n: int, A, lda: int, x, incx: int, y, incy: int) -> None:
    """sgemv's flag, its m×n matrix A and its vectors: x of op(A)'s columns, y of its rows; A and x float32
    or the 16 bits of ``precision``, y float32."""
    activations("sgemv", precision, A, x)
    float32_only("sgemv", y)
    stored_shape(trans, m, n, "A")
    rows, cols = (m, n) if trans == OP_N else (n, m)  # op(A) is rows×cols; A is stored m×n
    check_matrix("sgemv", "A", A, m, n, lda)
    check_vector("sgemv", "x", x, cols, incx)
    check_vector("sgemv", "y", y, rows, incy)


def check_saxpy(n: int, alpha, x, incx: int, y, incy: int) -> None:
    """saxpy's float32 vectors (and ``alpha``, where a tensor): x and y of n values at their strides."""
    float32_only("saxpy", alpha, x, y)
    check_vector("saxpy", "x", x, n, incx)
    check_vector("saxpy", "y", y, n, incy)


def check_sscal(n: int, alpha, x, incx: int) -> None:
    """sscal's float32 vector (and ``alpha``, where a tensor): x of n values at its stride."""
    float32_only("sscal", alpha, x)
    check_vector("sscal", "x", x, n, incx)


def check_scopy(n: int, x, incx: int, y, incy: int) -> None:
    """scopy's float32 vectors: x and y of n values at their strides."""
    float32_only("scopy", x, y)
    check_vector("scopy", "x", x, n, incx)
    check_vector("scopy", "y", y, n, incy)


def check_broadcast(call: str, bias, y, precision: Precision | None = None) -> None:
    """A ShapeError unless each dimension of ``bias`` is 1 or that of ``y``; float32 both, or with
    ``precision`` y of its 16 bits too."""
    float32_only(call, bias, *(() if precision else (y,)))
    if precision is not None:
        activations(call, precision, y)
    if any(b not in (1, s) for b, s in zip(bias.shape, y.shape)):
        raise ShapeError(f"{call}: bias of shape {bias.shape} does not broadcast to {y.shape}")


def check_backward_bias(precision: Precision, dy, db) -> None:
    """convolution_backward_bias's dy (float32 or the 16 bits of ``precision``) and float32 db, one value
    per channel of dy."""
    activations("convolution_backward_bias", precision, dy)
    float32_only("convolution_backward_bias", db)
    expect_shape("convolution_backward_bias", "db", db, (1, dy.c, 1, 1))


def check_pooling_forward(precision: Precision, desc, x, y) -> None:
    """x and y of one dtype (float32 or the 16 bits of ``precision``), y of the pooling of x by ``desc``."""
    activations("pooling_forward", precision, x, y)
    same_dtype("pooling_forward", x, y)
    expect_shape("pooling_forward", "y", y, desc.output_shape(x.shape))


def check_pooling_backward(precision: Precision, desc, y, dy, x, dx) -> None:
    """dy and y of the pooling of x by ``desc``, dx of x's shape; of one dtype, float32 or the 16 bits of
    ``precision``."""
    activations("pooling_backward", precision, y, dy, x, dx)
    same_dtype("pooling_backward", y, dy, x, dx)
    expect_shape("pooling_backward", "dy", dy, desc.output_shape(x.shape))
    expect_shape("pooling_backward", "y", y, dy.shape)
    expect_shape("pooling_backward", "dx", dx, x.shape)


def check_metric(call: str, predict, target, out) -> None:
    """float32 predict and target of one shape, and ``out`` (a loss or a count) of one value at least."""
    check_elementwise(call, predict, target)
    float32_only(call, out)
    check_fits(call, out.data, 0, 1)


def check_metric_outputs(call: str, loss, count) -> None:
    """A loss and a count each one float32 value at least, else a ShapeError (a DTypeError)."""
    float32_only(call, loss, count)
    check_fits(call, loss.data, 0, 1)
    check_fits(call, count.data, 0, 1)


def check_cross_entropy_backward(call: str, predict, target, grad, loss, count) -> None:
    """predict, target and grad of one shape; loss and count one value each; float32 all."""
    check_elementwise(call, predict, target, grad)
    check_metric_outputs(call, loss, count)


def check_softmax_cross_entropy(call: str, precision: Precision, logits, target, loss, count, *outputs) -> None:
    """``outputs`` (predict, grad), then target, of the logits' shape; loss and count one value each; float32
    all but the logits, which may hold the 16 bits of ``precision``."""
    activations(call, precision, logits)
    float32_only(call, *outputs, target)
    for other in (*outputs, target):
        same_shape(call, logits, other)
    check_metric_outputs(call, loss, count)


def check_sgd_update(param, grad, velocity, lr, momentum: float) -> None:
    """sgd_update's grad, and with a non-zero momentum its velocity, of param's shape; float32 all, and ``lr``
    where a tensor."""
    float32_only("sgd_update", lr)
    _check_sgd_parameter("sgd_update", param, grad, velocity, momentum, "no velocity tensor was given")


def _check_sgd_parameter(call: str, param, grad, velocity, momentum: float, no_velocity: str) -> None:
    """grad, and with a non-zero momentum a velocity (a UsageError saying ``no_velocity`` where there is
    none), of param's shape; float32 all."""
    float32_only(call, param, grad, velocity)
    same_shape(call, param, grad)
    if momentum:
        if velocity is None:
            raise UsageError(f"{call}: momentum is non-zero but {no_velocity}")
        same_shape(call, param, velocity)


def check_sgd_many(groups, lr, momentum: float, loss_scale) -> None:
    """sgd_update_many's loss-scaling state (where given) and each (param, grad, velocity) of ``groups``;
    float32 all, and ``lr`` where a tensor."""
    float32_only("sgd_update_many", lr)
    if loss_scale is not None:
        check_loss_scale("sgd_update_many", loss_scale)
    for param, grad, velocity in groups:
        _check_sgd_parameter("sgd_update_many", param, grad, velocity, momentum, "a parameter has no velocity tensor")


def check_adam_many(groups, lr, counter, loss_scale) -> None:
    """adam_update_many's (2,) counter, its loss-scaling state (where given) and each (param, grad, m, v);
    float32 all, and ``lr`` where a tensor."""
    float32_only("adam_update_many", lr, counter)
    if counter.size != 2:
        raise ShapeError(f"adam_update_many: counter must hold 2 values (steps, 0), got shape {counter.shape}")
    if loss_scale is not None:
        check_loss_scale("adam_update_many", loss_scale)
    for param, *state in groups:
        check_elementwise("adam_update_many", param, *state)


def check_dropout(call: str, precision: Precision, reserve, x, y, what: str) -> None:
    """x and y of one shape, the shape ``reserve`` was made for (``what`` names x); of one dtype, float32 or
    the 16 bits of ``precision``."""
    check_activations(call, precision, x, y)
    expect_shape(call, f"{what} (the reserve's shape)", x, reserve.shape)


def batch_norm_parameter_shape(call: str, mode, x) -> tuple[int, int, int, int]:
    """The shape of batch normalisation's parameters for x (N, C, H, W): (1, C, 1, 1) in mode SPATIAL,
    (1, C, H, W) in PER_ACTIVATION; a UsageError for another mode."""
    if mode == BatchNormMode.SPATIAL:
        return (1, x.c, 1, 1)
    if mode == BatchNormMode.PER_ACTIVATION:
        return (1,) + x.shape[1:]
    raise UsageError(f"{call}: unknown mode {mode!r}; valid are PER_ACTIVATION (0) and SPATIAL (1)")


def check_batch_norm(call: str, precision: Precision, mode, x, others, parameters) -> None:
    """``others`` of x's shape and dtype (float32 or the 16 bits of ``precision``), and each of ``parameters``
    (float32) one value per parameter of ``mode``, else a ShapeError or DTypeError (a UsageError for an
    unknown mode)."""
    check_activations(call, precision, x, *others)
    float32_only(call, *parameters)
    shape = batch_norm_parameter_shape(call, mode, x)
    for tensor in parameters:
        if tensor.size != shape[1] * shape[2] * shape[3]:
            raise ShapeError(f"{call}: a parameter of shape {tensor.shape} does not fit x {x.shape} in mode "
                             f"{BatchNormMode(mode).name}; expected {shape}")


def check_batch_norm_backward(precision: Precision, mode, x, dy, dx, parameters, bias, relu: bool) -> None:
    """check_batch_norm's checks of the backward's tensors, and a UsageError for ``relu`` without ``bias``."""
    check_batch_norm("batch_norm_backward", precision, mode, x, (dy, dx),
                     (*parameters, *(() if bias is None else (bias,))))
    if relu and bias is None:
        raise UsageError("batch_norm_backward: relu needs the bias (the forward's ReLU is recomputed from x)")
