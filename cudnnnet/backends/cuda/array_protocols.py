"""The array-exchange protocols of the CUDA backend: DLPack (``Tensor.__dlpack__``, ``Tensor.from_dlpack``)
and Numba's CUDA Array Interface, version 3 (``Tensor.__cuda_array_interface__``), which CuPy, Numba
and PyTorch (``torch.as_tensor``) read without a copy:

    {"shape": (n, c, h, w), "typestr": "<f4" (float32) or "<f2" (float16), "data": (pointer, False),
     "strides": None (C-contiguous), "version": 3, "stream": the context stream's handle}

``stream`` is where our work on the memory is queued; the consumer orders its own stream after it.

A mixin of CudaBackend, which provides ``context`` (its device and stream).
"""

from __future__ import annotations

from ...errors import DTypeError, UsageError
from ...tensor import Tensor
from . import dlpack


CUDA_ARRAY_INTERFACE_VERSION = 3
TYPESTRS = {"float32": "<f4", "float16": "<f2"}  # bfloat16 has no typestr in the protocol


def array_interface(pointer: int, shape: tuple[int, ...], dtype: str, stream: int) -> dict:
    """The version-3 CUDA Array Interface of C-contiguous ``dtype`` values at device ``pointer``, written
    by work queued on ``stream`` (a raw stream handle, never 0: the protocol reserves it)."""
    if dtype not in TYPESTRS:
        raise DTypeError(f"__cuda_array_interface__ has no typestr for {dtype} (it describes {', '.join(TYPESTRS)}); "
                         f"export a {dtype} tensor through DLPack (__dlpack__), or convert it with tensor.to('float32')")
    return {"shape": tuple(shape), "typestr": TYPESTRS[dtype], "data": (int(pointer), False), "strides": None,
            "version": CUDA_ARRAY_INTERFACE_VERSION, "stream": int(stream) or 1}


class ArrayProtocols:
    # ---- DLPack -------------------------------------------------------------------------------
    def dlpack(self, tensor: Tensor, stream=None, max_version=None, dl_device=None, copy=None, **kwargs):
        """A "dltensor" capsule sharing the tensor's memory. ``stream`` is the consumer's stream
        (None or 1: legacy default, 2: per-thread default, -1: no ordering): it is made to wait for
        the work queued so far on ours."""
        if copy:
            raise BufferError("the CUDA backend exports without copying; copy=True is not supported")
        if dl_device is not None and tuple(dl_device) != self.dlpack_device():
            raise BufferError(f"cannot export to DLPack device {tuple(dl_device)}; this tensor is on {self.dlpack_device()}")
        if stream != -1:
            self.context.make_stream_wait(1 if stream is None else int(stream))
        return dlpack.export(tensor.data, tensor.shape, self.context.device)

    def dlpack_device(self) -> tuple[int, int]:
        """(kDLCUDA, device id)."""
        return (dlpack.KDL_CUDA, self.context.device)

    def from_dlpack(self, cls, external) -> Tensor:
        """A tensor sharing a CUDA DLPack producer's memory (no copy); the producer's deleter runs
        when the tensor's buffer is freed."""
        if not hasattr(external, "__dlpack__"):
            raise UsageError(f"from_dlpack needs an object with __dlpack__, got {type(external).__name__}")
        device = tuple(external.__dlpack_device__())
        if device != self.dlpack_device():
            raise UsageError(f"from_dlpack: the array is on DLPack device {device}, this backend on {self.dlpack_device()}")
        capsule = external.__dlpack__(stream=self.context.stream.address)
        shape, buffer = dlpack.consume(capsule, self.context.device)
        return cls(shape, self, buffer)

    # ---- CUDA Array Interface -----------------------------------------------------------------
    def cuda_array_interface(self, tensor: Tensor) -> dict:
        """The tensor's memory ("<f4" float32, "<f2" float16; a bfloat16 one is refused), version 3, with
        the context stream as ``stream``."""
        return array_interface(tensor.data.ptr, tensor.shape, tensor.dtype.name, self.context.stream.address)
