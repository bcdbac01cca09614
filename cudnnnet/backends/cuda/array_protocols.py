"""The array-exchange protocols of the CUDA backend: DLPack (``Tensor.__dlpack__``, ``Tensor.from_dlpack``).

A mixin of CudaBackend, which provides ``context`` (its device and stream).
"""

from __future__ import annotations

from ...errors import UsageError
from ...tensor import Tensor
from . import dlpack


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
