"""The slides engine's convolution bias gradient: cudnnConvolutionBackwardBias, in one call or two.

    db = alpha·Σₙ Σ_{h,w} dy + beta·db          dy (N, K, H, W), db (1, K, 1, 1)

cuDNN's reduction steps through the N samples one after another, so its time grows with N far
more than with K or H·W (small planes of a batch of 256 take several times as long as the bytes
need). Two calls of the same function on reshaped views each step through about √N samples
instead. With N = A·B (sample n = a·B + b), dy is also a packed (A, B·K, H, W) tensor whose
channel b·K + k holds sample a·B + b's channel k, so

    s  = Σ_a Σ_{h,w} dy          dy viewed as (A, B·K, H, W), s (1, B·K, 1, 1)
    db = alpha·Σ_b s + beta·db   s viewed as (B, K, 1, 1)

``passes`` decides from the shape alone (so a shape always adds in the same order); s lives in the
backend's cuDNN workspace, which ``CudaBackend.convolution_plan`` grows to ``scratch_bytes`` of the
plan's output, so that no call allocates (nor can, inside a CUDA graph capture).
"""

from __future__ import annotations

import math

from .bindings import cudnn
from .buffer import FLOAT32_BYTES

MIN_SAMPLES = 32  # below this a second call costs about what it saves
MAX_CHANNELS = 65535  # the most channels B·K of the first call's view


def split(n: int) -> int:
    """B: the largest divisor of n that is at most √n (1 for a prime n)."""
    return next(b for b in range(math.isqrt(n), 0, -1) if n % b == 0)


def passes(dy_shape) -> int:
    """How many cudnnConvolutionBackwardBias calls reduce a dy of this shape: 1 or 2 (from
    MIN_SAMPLES samples on, where they split into A·B with 1 < B ≤ A)."""
    n, k, _, _ = dy_shape
    b = split(n)
    return 2 if n >= MIN_SAMPLES and b > 1 and b * k <= MAX_CHANNELS else 1


def scratch_bytes(dy_shape) -> int:
    """Bytes of workspace the two-pass form needs for this dy: B·K floats (0 where one call does it)."""
    n, k, _, _ = dy_shape
    return FLOAT32_BYTES * split(n) * k if passes(dy_shape) == 2 else 0


def backward_bias(backend, alpha, dy, beta, db) -> None:
    """db = alpha·Σ_{n,h,w} dy + beta·db by cudnnConvolutionBackwardBias, in ``passes(dy.shape)``
    calls; the caller has checked db's shape."""
    context = backend.context
    descriptors, handle, scalar = context.descriptors, context.cudnn.handle, context.scalar
    n, k, h, w = dy.shape
    db_desc = descriptors.tensor(db.shape).handle
    if passes(dy.shape) == 1:
        # db = alpha·Σ_{n,h,w} dy + beta·db
        cudnn.convolution_backward_bias(handle, scalar(alpha), descriptors.tensor(dy.shape).handle, dy.data.ptr,
                                        scalar(beta), db_desc, db.data.ptr)
        return
    b = split(n)
    partial = context.workspace(scratch_bytes(dy.shape))  # s (B·K,)
    # s = Σ_a Σ_{h,w} dy      dy as (A, B·K, H, W), s as (1, B·K, 1, 1)
    cudnn.convolution_backward_bias(handle, scalar(1.0), descriptors.tensor((n // b, b * k, h, w)).handle,
                                    dy.data.ptr, scalar(0.0), descriptors.tensor((1, b * k, 1, 1)).handle, partial)
    # db = alpha·Σ_b s + beta·db      s as (B, K, 1, 1)
    cudnn.convolution_backward_bias(handle, scalar(alpha), descriptors.tensor((b, k, 1, 1)).handle, partial,
                                    scalar(beta), db_desc, db.data.ptr)
