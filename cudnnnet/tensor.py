"""Tensor: the Blob of the C++ design. NCHW float32 values held by one backend.

On the host the storage is a flat float32 NumPy array; on CUDA it is a DeviceBuffer owning device
memory (freed when the last tensor using it goes). ``to()`` moves values between backends,
``numpy()`` returns a host copy shaped (n, c, h, w).
"""

from __future__ import annotations

import math
import numbers
from math import prod
from typing import Iterable

import numpy as np

from .backend_lookup import backend_named
from .errors import InvalidArgumentError, ShapeError, TensorSizeError


# cuBLAS and cuDNN take sizes, leading dimensions and strides as 32-bit ints: no tensor may hold more values.
MAX_TENSOR_VALUES = 2**31 - 1
# The layers, the optimisers and the loss scale compute in float32: a setting beyond its largest number is inf
# there; an eps below its smallest normal number (a denormal, or 0) lets v = 0 divide m = 0 into NaN weights,
# and a loss scale S there makes 1/S inf.
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 2.0 ** -126


def as_shape(shape: Iterable[int] | int) -> tuple[int, int, int, int]:
    """Normalise 1 to 4 positive sizes to (n, c, h, w), padding missing trailing sizes with 1.

    Raises TensorSizeError for a shape of more than MAX_TENSOR_VALUES values, before anything is allocated.
    """
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if not 1 <= len(dims) <= 4:
        raise ShapeError(f"a tensor has 1 to 4 dimensions (n, c, h, w), got shape {dims!r}")
    for size in dims:
        if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size <= 0:
            raise ShapeError(f"tensor sizes must be positive integers, got shape {dims!r}")
    dims = tuple(int(d) for d in dims)
    check_tensor_values(dims)
    return dims + (1,) * (4 - len(dims))


def check_tensor_values(shape: tuple[int, ...], what: str = "a tensor") -> None:
    """Raise TensorSizeError when ``shape`` holds more than MAX_TENSOR_VALUES values."""
    values = prod(shape)
    if values > MAX_TENSOR_VALUES:
        raise TensorSizeError(f"{what} of shape {shape} would hold {values} values, more than the {MAX_TENSOR_VALUES} "
                         f"(2^31 - 1) that cuBLAS and cuDNN can index")


def float32_values(values, what: str = "Tensor.from_numpy") -> np.ndarray:
    """``values`` (an array-like of real numbers or booleans) as a contiguous float32 array of its shape;
    ShapeError naming ``what`` where it is none (objects, text, complex numbers, ragged lists)."""
    try:
        array = np.asarray(values)
    except (ValueError, TypeError) as error:
        raise ShapeError(f"{what} needs a real numeric array; NumPy cannot make one of this "
                         f"{type(values).__name__} ({' '.join(str(error).split())})") from None
    if array.dtype != np.bool_ and (not np.issubdtype(array.dtype, np.number) or np.iscomplexobj(array)):
        raise ShapeError(f"{what} needs a real numeric array, got dtype {array.dtype}")
    with np.errstate(over="ignore"):  # a float64 beyond float32's range becomes inf, which callers may refuse
        return np.ascontiguousarray(array, dtype=np.float32)


def _resolve(backend):
    return backend_named(backend) if backend is None or isinstance(backend, str) else backend


class Tensor:
    """A float32 NCHW tensor on one backend."""

    __slots__ = ("shape", "backend", "data", "__weakref__")

    def __init__(self, shape, backend=None, data=None):
        self.shape = as_shape(shape)
        self.backend = _resolve(backend)
        self.data = self.backend.empty(self.size) if data is None else data

    # ---- sizes -----------------------------------------------------------------------------
    n = property(lambda self: self.shape[0])
    c = property(lambda self: self.shape[1])
    h = property(lambda self: self.shape[2])
    w = property(lambda self: self.shape[3])

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def sample_size(self) -> int:
        """c·h·w: the leading dimension of the tensor read as a column-major (features × n) matrix."""
        return self.shape[1] * self.shape[2] * self.shape[3]

    @property
    def nbytes(self) -> int:
        return 4 * self.size

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"Tensor(shape={self.shape}, backend={self.backend.name!r})"

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def zeros(cls, shape, backend=None) -> "Tensor":
        tensor = cls(shape, backend)
        tensor.fill_(0.0)
        return tensor

    @classmethod
    def from_numpy(cls, array, backend=None) -> "Tensor":
        """A tensor holding a float32 copy of ``array`` (1 to 4 dimensions, read as n, c, h, w; real
        numbers or booleans)."""
        array = float32_values(array)
        if array.ndim == 0:
            array = array.reshape(1)
        shape = as_shape(array.shape)
        flat = array.reshape(-1)
        backend = _resolve(backend)
        return cls(shape, backend, backend.upload(flat))

    # ---- movement --------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """A host copy shaped (n, c, h, w)."""
        return self.backend.download(self.data, self.size).reshape(self.shape)

    def item(self) -> float:
        """The first value, as a Python float (synchronises a GPU)."""
        return float(self.backend.download(self.data, 1)[0])

    def to(self, backend) -> "Tensor":
        """This tensor on ``backend``: itself when already there, else a copy."""
        backend = _resolve(backend)
        if backend is self.backend:
            return self
        return Tensor(self.shape, backend, backend.upload(self.backend.download(self.data, self.size)))

    def copy_(self, source: "Tensor") -> "Tensor":
        """Overwrite this tensor's values with ``source``'s (same size; either backend), in place: the
        storage keeps its address (a view, or a captured graph, still sees the new values)."""
        if source.size != self.size:
            raise ShapeError(f"cannot copy a tensor of shape {source.shape} into one of shape {self.shape}")
        if source.backend is self.backend:
            self.backend.copy(source.data, self.data, self.size)
        else:
            self.backend.write(self.data, source.backend.download(source.data, source.size))
        return self

    def write_(self, array) -> "Tensor":
        """Overwrite the values in place from a host array of the same size (no new storage)."""
        flat = float32_values(array, "Tensor.write_").reshape(-1)
        if flat.size != self.size:
            raise ShapeError(f"cannot write {flat.size} values into a tensor of shape {self.shape}")
        self.backend.write(self.data, flat)
        return self

    def fill_(self, value: float) -> "Tensor":
        self.backend.fill(self.data, float(value), self.size)
        return self

    def view(self, shape, offset: int = 0) -> "Tensor":
        """A tensor of ``shape`` aliasing this one's values from element ``offset`` (no copy)."""
        shape = as_shape(shape)
        if offset < 0 or offset + prod(shape) > self.size:
            raise ShapeError(f"a view of shape {shape} at offset {offset} does not fit in a tensor of shape {self.shape}")
        return Tensor(shape, self.backend, self.backend.view(self.data, offset, prod(shape)))

    def reshape(self, shape) -> "Tensor":
        """The same values under another shape of the same size (no copy)."""
        shape = as_shape(shape)
        if prod(shape) != self.size:
            raise ShapeError(f"cannot reshape a tensor of shape {self.shape} to {shape}")
        return Tensor(shape, self.backend, self.data)

    # ---- DLPack and the CUDA Array Interface (CUDA tensors hand their memory to PyTorch or CuPy
    # without a copy) ----------------------------------------------------------------------------
    def __dlpack__(self, stream=None, **kwargs):
        return self.backend.dlpack(self, stream=stream, **kwargs)

    def __dlpack_device__(self):
        return self.backend.dlpack_device()

    @property
    def __cuda_array_interface__(self) -> dict:
        """CUDA Array Interface version 3 of a CUDA tensor (``torch.as_tensor``, CuPy and Numba read its
        memory without a copy); AttributeError on the host, as CuPy raises, so that consumers fall back."""
        return self.backend.cuda_array_interface(self)

    @classmethod
    def from_dlpack(cls, external, backend=None) -> "Tensor":
        """A tensor sharing memory with a DLPack producer on this backend's device (copy on host)."""
        backend = _resolve(backend)
        return backend.from_dlpack(cls, external)


def float32_rounded(number: float) -> float:
    """``number`` as float32 holds it: what the device computes with (±inf past float32's range)."""
    with np.errstate(over="ignore"):
        return float(np.float32(number))


def finite_real(value, what: str, valid: str, accepts, float32: bool = False) -> float:
    """``value`` as a float where it is a finite real number (not a boolean) that ``accepts`` takes,
    else InvalidArgumentError naming ``what`` and the ``valid`` range. ``float32``: the device keeps
    it in float32, whose rounding of it ``accepts`` must take too (1 − 1e-12 is 1 there, 1e-50 is 0)."""
    number = math.nan
    if not isinstance(value, bool) and isinstance(value, numbers.Real):
        try:
            number = float(value)
        except OverflowError:  # an integer beyond any float
            number = math.inf
    if not math.isfinite(number) or not accepts(number):
        raise InvalidArgumentError(f"{what} must be a finite number {valid}, got {value!r}")
    rounded = float32_rounded(number)
    if float32 and not accepts(rounded):
        raise InvalidArgumentError(f"{what} must be a finite number {valid}, got {value!r}, which float32 (the "
                                   f"device's arithmetic) rounds to {rounded!r}")
    return number
