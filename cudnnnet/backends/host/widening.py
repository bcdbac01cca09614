"""The host's 16-bit tensors in the verbs that take them: computed in float32 from the stored values,
each 16-bit tensor rounded once, to nearest even, where the verb stores into it — what the GPU's
kernels and cuBLAS (a 16-bit C of cublasGemmEx) store.

``widened`` wraps a verb's implementation: every 16-bit tensor among its arguments is replaced by a
float32 tensor of its values (tensors of one storage share one copy, so an in-place call stays in
place), the float32 implementation runs, and each copy is written back rounded to its storage's
dtype. A tensor the verb only reads holds a 16-bit value already, which rounding gives back unchanged.
"""

from __future__ import annotations

import functools

import numpy as np

from ...tensor import Tensor, storage_dtype
from ..rounding import from_storage, to_storage


def widened(implementation):
    """``implementation`` (a host verb) on float32 copies of its 16-bit tensor arguments, written back rounded."""
    @functools.wraps(implementation)
    def on_float32(backend, *args, **kwargs):
        halves = [value for value in (*args, *kwargs.values()) if isinstance(value, Tensor) and value.dtype.half]
        if not halves:
            return implementation(backend, *args, **kwargs)
        copies = {}  # id(storage) -> (storage, float32 copy of its values)
        for tensor in halves:
            copies.setdefault(id(tensor.data), (tensor.data, from_storage(tensor.data)))

        def widen(value):
            if isinstance(value, Tensor) and value.dtype.half:
                return Tensor(value.shape, backend, copies[id(value.data)][1])
            return value

        result = implementation(backend, *map(widen, args), **{key: widen(value) for key, value in kwargs.items()})
        for storage, values in copies.values():
            np.copyto(storage, to_storage(storage_dtype(storage), values))
        return result
    return on_float32

