"""A tensor's values into storage of another dtype on the GPU (``Tensor.to(dtype)``, ``Tensor.copy_``
between dtypes), through the conversion kernels of math "bf16" and "fp16" (low_precision.py):

    float32  -> 16 bits    to_bf16 / to_fp16 (round to nearest, ties to even)
    16 bits  -> float32    bf16_to_float / fp16_to_float (exact)
    16 bits  -> 16 bits    to float32 in scratch (exact), then rounded once to the target type
"""

from __future__ import annotations

from ...errors import DeviceError
from ...precision import BFLOAT16, FLOAT16, FLOAT32
from .buffer import DeviceBuffer
from .low_precision import BF16, FP16, convert_to_bf16

FORMATS = {BFLOAT16.name: BF16, FLOAT16.name: FP16}  # a 16-bit dtype -> its format (kernels)


def convert_storage(context, source: DeviceBuffer, target: DeviceBuffer, count: int) -> None:
    """target[:count] = source[:count] rounded to target's dtype, queued on the context's stream; the
    storages are of two different dtypes."""
    if target.dtype is FLOAT32:
        context.half.to_float(target.ptr, source.ptr, 1.0, 0.0, count, FORMATS[source.dtype.name])
    elif source.dtype is FLOAT32:
        convert_to_bf16(context, target.ptr, source.ptr, count, FORMATS[target.dtype.name])
    else:
        _between_16_bit_types(context, source, target, count)


def _between_16_bit_types(context, source: DeviceBuffer, target: DeviceBuffer, count: int) -> None:
    if context.is_capturing():
        raise DeviceError(f"converting {source.dtype} to {target.dtype} needs float32 scratch, which a CUDA graph "
                          "capture cannot allocate; convert before capturing")
    scratch = DeviceBuffer.allocate(FLOAT32.itemsize * count)
    try:
        context.half.to_float(scratch.ptr, source.ptr, 1.0, 0.0, count, FORMATS[source.dtype.name])
        convert_to_bf16(context, target.ptr, scratch.ptr, count, FORMATS[target.dtype.name])
        context.synchronize()  # the kernels have read the scratch before it is freed
    finally:
        scratch.free()
