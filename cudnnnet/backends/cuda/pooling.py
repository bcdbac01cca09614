"""Max pooling backward on our kernel (kernels/pooling.cu) where the windows do not overlap, in
the fast engine (the slides engine calls cudnnPoolingBackward):

    dx = alpha·route(dy) + beta·dx        route(dy): each window's dy at its first cell (row-major)
                                          equal to the window's maximum, 0 everywhere else

cudnnPoolingBackward reads y as well as x and dy. With no padding and stride ≥ window, every input cell lies in at most one window, so one thread per window can find
its maximum in x and write every dx value of its tile: x and dy are read once, dx written once,
without atomics, in a fixed order. The kernel allocates nothing and never synchronises, so it can
be captured in a CUDA graph. A 16-bit CNN's x, dy and dx take its 16-bit twin (max_pooling_backward16:
the same routing, dx rounded once). Average pooling and any other max pooling keep calling cuDNN
(CudaBackend.pooling_backward decides with ``supports``); where windows overlap, a 16-bit dx is
computed on float32 copies (``backward_through_float32``): cuDNN sums a cell's windows in dx's type.
"""

from __future__ import annotations

from ...errors import UsageError
from ...tensor import Tensor
from ..descriptors import PoolingDescriptor, PoolingMode
from .gemm_convolution import INDEX_LIMIT
from .kernel import BLOCK_SIZE, MAX_BLOCKS, blocks_for
from .bindings import cudnn, runtime
from .buffer import FLOAT32_BYTES
from .low_precision import HALF_FORMATS, through_float32

KERNEL = "max_pooling_backward"
GRID_THREADS = MAX_BLOCKS * BLOCK_SIZE  # the most a grid-stride index can pass the last value by


def supports(desc: PoolingDescriptor, x_shape) -> bool:
    """Whether the kernel runs this backward pass: max pooling, no padding, windows that do not
    overlap (stride ≥ window), at least one window, and 32-bit indices that reach every value of x
    (the grid-stride index stays below 2^31 too)."""
    n, c, h, w = x_shape
    _, _, out_h, out_w = desc.output_shape(x_shape)
    return (desc.mode == PoolingMode.MAX and desc.padding == 0 and 1 <= desc.window <= desc.stride
            and min(out_h, out_w) >= 1 and n * c * h * w + GRID_THREADS < INDEX_LIMIT)


def windows_overlap(desc: PoolingDescriptor) -> bool:
    """Whether an input cell may lie in several windows (stride < window): cuDNN then sums their
    gradients in dx's type, rounding a 16-bit dx at every addition."""
    return desc.stride < desc.window


def max_backward(backend, desc: PoolingDescriptor, alpha, dy, x, beta, dx) -> None:
    """kernels/pooling.cu on the backend's stream, one thread per window. The caller has checked the
    shapes and ``supports(desc, x.shape)``."""
    # dx = alpha·route(dy) + beta·dx      x, dx (N·C, H, W), dy (N·C, OH, OW); 16-bit ones rounded once
    context = backend.context
    half = (HALF_FORMATS[x.dtype].kernel_code,) if x.dtype.half else ()
    context.kernel(KERNEL + "16" if half else KERNEL).launch(
        blocks_for(dy.size), context.stream.handle, dx.data.ptr, x.data.ptr, dy.data.ptr, _host_float("alpha", alpha),
        _host_float("beta", beta), x.n * x.c, x.h, x.w, desc.window, desc.stride, dy.h, dy.w, *half)


def backward_through_float32(backend, desc: PoolingDescriptor, alpha, y, dy, x, beta, dx) -> None:
    """cudnnPoolingBackward of 16-bit tensors on float32 copies (low_precision.through_float32), dx
    rounded once: where windows overlap, cuDNN would sum a cell's gradients in dx's 16 bits."""
    context = backend.context
    scalar, descriptors = context.scalar, context.descriptors
    ty, tx = descriptors.tensor(y.shape).handle, descriptors.tensor(x.shape).handle
    accumulates = float(beta) != 0.0  # then dx's values are read too

    def run(y32, dy32, x32, *dx32s):
        if accumulates:  # dx32 = float(dx)
            runtime.memcpy_async(dx32s[1], dx32s[0], FLOAT32_BYTES * dx.size, runtime.MEMCPY_DEVICE_TO_DEVICE,
                                 context.stream.handle)
        # dx = alpha·pool'(x, y)·dy + beta·dx
        cudnn.pooling_backward(context.cudnn.handle, descriptors.pooling(desc).handle, scalar(alpha), ty, y32, ty,
                               dy32, tx, x32, scalar(beta), tx, dx32s[-1])
    through_float32(context, (y, dy, x) + ((dx,) if accumulates else ()), dx, run)


def _host_float(name: str, value) -> float:
    if isinstance(value, Tensor):
        raise UsageError(f"pooling_backward: {name} must be a float; only saxpy, sscal, sgd_update and "
                         "sgd_update_many take a one-element tensor as a scalar")
    return float(value)
