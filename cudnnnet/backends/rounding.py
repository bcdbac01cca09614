"""The device's roundings of float32 values to 16 bits, computed with NumPy: what kernels/half.cuh's
bf16_bits and fp16_bits give, so that the host backend rounds where the CUDA backend does."""

from __future__ import annotations

import numpy as np

F32 = np.float32
_BF16_LOW = np.uint32(0x7FFF)
_BF16_KEEP = np.uint32(0xFFFF0000)
_QUIET_NAN = np.uint32(0x00400000)


def round_to_bf16(values) -> np.ndarray:
    """float32 ``values`` rounded to the nearest bfloat16, ties to even, as float32 (a new array):
    kernels/bf16.cu's to_bf16. A NaN stays a quiet NaN; values past the largest bfloat16 become ±inf."""
    bits = np.ascontiguousarray(values, F32).view(np.uint32)
    rounded = (bits + _BF16_LOW + ((bits >> np.uint32(16)) & np.uint32(1))) & _BF16_KEEP
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        rounded = np.where(nan, (bits | _QUIET_NAN) & _BF16_KEEP, rounded)
    return rounded.view(F32)


def round_to_fp16(values) -> np.ndarray:
    """float32 ``values`` rounded to the nearest IEEE half, ties to even, as float32 (a new array):
    kernels/fp16.cu's to_fp16 (cvt.rn.f16.f32). Values past the largest half (65504) become ±inf,
    small ones keep the half's subnormals, a NaN stays a NaN."""
    with np.errstate(over="ignore"):
        return np.asarray(values, F32).astype(np.float16).astype(F32)
