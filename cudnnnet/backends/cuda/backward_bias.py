"""The slides engine's convolution bias gradient: cudnnConvolutionBackwardBias, in one call or two.

    db = alpha·Σₙ Σ_{h,w} dy + beta·db          dy (N, K, H, W), db (1, K, 1, 1)

cuDNN sums each channel in about one block, so with few channels K and many values per channel
N·H·W most of the GPU idles while a few blocks read the whole of dy. Two calls of the same
function spread that work over N·K blocks, each reading one contiguous (h, w) plane:

    s  = Σ_{h,w} dy              dy viewed as (1, N·K, H, W), s (1, N·K, 1, 1)
    db = alpha·Σₙ s + beta·db    s viewed as (N, K, 1, 1)

``passes`` decides from the shape alone (so a shape always adds in the same order); s lives in the
backend's cuDNN workspace, which ``CudaBackend.convolution_plan`` grows to ``scratch_bytes`` of the
plan's output, so that no call allocates (nor can, inside a CUDA graph capture).
"""

from __future__ import annotations

from .bindings import cudnn
from .buffer import FLOAT32_BYTES

# Two passes where cuDNN's one call leaves the GPU idle: fewer channels than MAX_CHANNELS (about
# one block per channel), at least MIN_PLANE values per (n, k) plane (a block of the first pass
# sums one plane) and at least MIN_PER_CHANNEL values per channel; N·K within MAX_PLANES, the
# channels one cuDNN call reduces.
MAX_CHANNELS = 256
MIN_PLANE = 16
MIN_PER_CHANNEL = 4096
MAX_PLANES = 65535


def passes(dy_shape) -> int:
    """How many cudnnConvolutionBackwardBias calls reduce a dy of this shape: 1 or 2."""
    n, k, h, w = dy_shape
    two = (k < MAX_CHANNELS and h * w >= MIN_PLANE and n * h * w >= MIN_PER_CHANNEL and 1 < n
           and n * k <= MAX_PLANES)
    return 2 if two else 1


def scratch_bytes(dy_shape) -> int:
    """Bytes of workspace the two-pass form needs for this dy (0 where one call does it)."""
    n, k, _, _ = dy_shape
    return FLOAT32_BYTES * n * k if passes(dy_shape) == 2 else 0


def backward_bias(backend, alpha, dy, beta, db) -> None:
    """db = alpha·Σ_{n,h,w} dy + beta·db by cudnnConvolutionBackwardBias, in ``passes(dy.shape)``
    calls; the caller has checked db's shape."""
    descriptors, handle, scalar = backend._descriptors, backend._cudnn, backend._scalar
    n, k, h, w = dy.shape
    db_desc = descriptors.tensor(db.shape).handle
    if passes(dy.shape) == 1:
        # db = alpha·Σ_{n,h,w} dy + beta·db
        cudnn.convolution_backward_bias(handle, scalar(alpha), descriptors.tensor(dy.shape).handle, dy.data.ptr,
                                        scalar(beta), db_desc, db.data.ptr)
        return
    planes = backend.context.workspace(scratch_bytes(dy.shape))  # s (N·K,)
    # s = Σ_{h,w} dy      dy as (1, N·K, H, W), s as (1, N·K, 1, 1)
    cudnn.convolution_backward_bias(handle, scalar(1.0), descriptors.tensor((1, n * k, h, w)).handle, dy.data.ptr,
                                    scalar(0.0), descriptors.tensor((1, n * k, 1, 1)).handle, planes)
    # db = alpha·Σₙ s + beta·db      s as (N, K, 1, 1)
    cudnn.convolution_backward_bias(handle, scalar(alpha), descriptors.tensor((n, k, 1, 1)).handle, planes,
                                    scalar(beta), db_desc, db.data.ptr)
