"""The device's roundings of float32 values to 16 bits, computed with NumPy: what kernels/half.cuh's
bf16_bits and fp16_bits give, so that the host backend rounds where the CUDA backend does; and the
host's storage of each tensor dtype (cudnnnet.precision.DType), which the CUDA backend's uploads and
downloads copy as it is:

    float32   float32 values
    bfloat16  uint16: the high 16 bits of the float32 it rounds to (NumPy has no bfloat16)
    float16   float16 (IEEE half)
"""

from __future__ import annotations

import numpy as np

from ..precision import BFLOAT16, FLOAT16, FLOAT32, DType

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


_ROUNDINGS = {FLOAT32.name: lambda values: np.array(values, F32), BFLOAT16.name: round_to_bf16,
              FLOAT16.name: round_to_fp16}


def round_to(dtype: DType, values) -> np.ndarray:
    """float32 ``values`` rounded to ``dtype`` as the device rounds (nearest, ties to even), as a new
    float32 array: what a tensor of ``dtype`` holds after they are written into it."""
    return _ROUNDINGS[dtype.name](values)


def to_storage(dtype: DType, values) -> np.ndarray:
    """float32 ``values`` rounded to ``dtype``, in the host's storage of that dtype, flat: a new array for
    a 16-bit dtype; for float32 the values themselves where they are a contiguous float32 array."""
    if dtype is FLOAT32:
        with np.errstate(over="ignore"):  # a float beyond float32's range is ±inf, as the device holds it
            return np.ascontiguousarray(values, F32).reshape(-1)
    rounded = round_to(dtype, values).reshape(-1)
    if dtype is BFLOAT16:
        return (rounded.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    return rounded.astype(dtype.storage)


def from_storage(storage: np.ndarray) -> np.ndarray:
    """The float32 values of a host storage array (a new array; every 16-bit value is exact in float32)."""
    if storage.dtype == np.uint16:
        return (storage.astype(np.uint32) << np.uint32(16)).view(F32)
    return storage.astype(F32)
