"""DeviceBuffer: device memory that frees itself (cudaMalloc / cudaFree)."""

from __future__ import annotations

from ...errors import OutOfMemoryError, ShapeError
from ...precision import FLOAT32, DType
from .bindings import runtime
from .handles import release_when_collected

FLOAT32_BYTES = 4


class DeviceBuffer:
    """``nbytes`` of device memory at ``ptr``, holding values of ``dtype`` (a tensor's storage; float32
    unless said otherwise).

    ``release(ptr)`` runs once when the buffer is collected or freed: cudaFree for memory this
    buffer owns, a DLPack deleter for memory borrowed from another framework, nothing for a view
    (which keeps its ``parent`` alive instead).
    """

    __slots__ = ("ptr", "nbytes", "parent", "dtype", "_finalizer", "__weakref__")

    def __init__(self, ptr: int, nbytes: int, release=runtime.free, parent: "DeviceBuffer | None" = None,
                 dtype: DType = FLOAT32):
        self.ptr = int(ptr)
        self.nbytes = int(nbytes)
        self.parent = parent
        self.dtype = dtype
        self._finalizer = release_when_collected(self, release, self.ptr) if release is not None else None

    @classmethod
    def allocate(cls, nbytes: int, dtype: DType = FLOAT32) -> "DeviceBuffer":
        """cudaMalloc(nbytes) for values of ``dtype``; OutOfMemoryError (naming the size and what is free) if it fails."""
        try:
            return cls(runtime.malloc(nbytes), nbytes, dtype=dtype)
        except OutOfMemoryError as error:
            free, total = runtime.mem_get_info()
            raise OutOfMemoryError(
                f"the GPU is out of memory: cannot allocate {nbytes / 2**20:,.1f} MiB "
                f"({free / 2**20:,.0f} of {total / 2**20:,.0f} MiB free); try a smaller batch size",
                error.function, error.status_name,
            ) from None

    @property
    def size(self) -> int:
        """How many values of its dtype fit."""
        return self.nbytes // self.dtype.itemsize

    def view(self, offset: int, size: int) -> "DeviceBuffer":
        """The ``size`` bytes from byte ``offset`` (no copy), values of this buffer's dtype; keeps this buffer alive."""
        if offset < 0 or size < 0 or offset + size > self.nbytes:
            raise ShapeError(f"a view of bytes [{offset}, {offset + size}) does not fit in a buffer of {self.nbytes} bytes")
        return DeviceBuffer(self.ptr + offset, size, release=None, parent=self, dtype=self.dtype)

    def free(self) -> None:
        """Release now instead of when collected (a view releases nothing)."""
        if self._finalizer is not None:
            self._finalizer()

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        view = ", view" if self.parent is not None else ""
        dtype = "" if self.dtype is FLOAT32 else f", dtype={self.dtype.name!r}"
        return f"DeviceBuffer(ptr={self.ptr:#x}, nbytes={self.nbytes}{dtype}{view})"
