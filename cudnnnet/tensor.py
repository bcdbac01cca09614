"""Tensor: the Blob of the C++ design. NCHW values of one dtype held by one backend.

The dtype (cudnnnet.precision.DType) is float32, the default, or bfloat16 or float16, 2 bytes a
value. On the host the storage is a flat NumPy array (float32, float16, or bfloat16 as its uint16
bit patterns); on CUDA it is a DeviceBuffer owning device memory of that type (freed when the last
tensor using it goes). Values written into a 16-bit tensor are rounded to nearest, ties to even, as
the device rounds. ``to()`` moves values between backends or converts them to another dtype;
``numpy()`` returns a float32 host copy shaped (n, c, h, w) whatever the dtype.
"""

from __future__ import annotations

import math
import numbers
from math import prod
from typing import Iterable

import numpy as np

from .backend_lookup import backend_named
from .errors import DeviceError, InvalidArgumentError, ShapeError, TensorSizeError, UsageError
from .precision import DTYPE_NAMES, DTYPES, DTYPES_BY_STORAGE, FLOAT32, DType, get_dtype


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


def storage_dtype(storage) -> DType:
    """The DType of a backend's storage: a DeviceBuffer's own, or that of a host array's NumPy dtype."""
    dtype = storage.dtype
    if isinstance(dtype, DType):
        return dtype
    try:
        return DTYPES_BY_STORAGE[dtype.name]
    except KeyError:
        raise UsageError(f"a tensor's host storage holds float32, float16 or uint16 (bfloat16's bits), got "
                         f"{dtype.name}") from None


class Tensor:
    """An NCHW tensor of float32 (the default), bfloat16 or float16 values on one backend."""

    __slots__ = ("shape", "backend", "data", "dtype", "__weakref__")

    def __init__(self, shape, backend=None, data=None, dtype=None):
        """New storage of ``dtype`` (default float32), or ``data``, the backend's storage, whose type the
        tensor takes (``dtype``, where given, must be it)."""
        self.shape = as_shape(shape)
        self.backend = _resolve(backend)
        if data is None:
            self.dtype = FLOAT32 if dtype is None else get_dtype(dtype)
            self.data = self.backend.empty(self.size, self.dtype)
            return
        self.data, self.dtype = data, storage_dtype(data)
        if dtype is not None and get_dtype(dtype) is not self.dtype:
            raise UsageError(f"storage of {self.dtype} values cannot make a {get_dtype(dtype)} tensor")

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
        return self.dtype.itemsize * self.size

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        dtype = "" if self.dtype is FLOAT32 else f", dtype={self.dtype.name!r}"
        return f"Tensor(shape={self.shape}, backend={self.backend.name!r}{dtype})"

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def zeros(cls, shape, backend=None, dtype=None) -> "Tensor":
        """A tensor of zeros of ``dtype`` (default float32)."""
        tensor = cls(shape, backend, dtype=dtype)
        tensor.fill_(0.0)
        return tensor

    @classmethod
    def from_numpy(cls, array, backend=None, dtype=None) -> "Tensor":
        """A tensor holding a copy of ``array`` (1 to 4 dimensions, read as n, c, h, w; real numbers or
        booleans) as ``dtype`` (default float32): each value as float32, then, for a 16-bit dtype, rounded
        to the nearest value of that type, ties to even (past its range ±inf), as the device rounds."""
        dtype = FLOAT32 if dtype is None else get_dtype(dtype)
        array = float32_values(array)
        if array.ndim == 0:
            array = array.reshape(1)
        shape = as_shape(array.shape)
        flat = array.reshape(-1)
        backend = _resolve(backend)
        return cls(shape, backend, backend.upload(flat, dtype))

    # ---- movement --------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """A float32 host copy shaped (n, c, h, w), whatever the dtype (16-bit values are exact in float32)."""
        return self.backend.download(self.data, self.size).reshape(self.shape)

    def item(self) -> float:
        """The first value, as a Python float (synchronises a GPU)."""
        return float(self.backend.download(self.data, 1)[0])

    def to(self, target) -> "Tensor":
        """A dtype (a DType, or "float32", "bfloat16", "float16"): a new tensor of those values on this
        backend, rounded to nearest even where the new type is narrower. A backend ("host", "cuda",
        "auto" or a Backend): this tensor there, of its dtype; itself when already there, else a copy."""
        if isinstance(target, DType) or (isinstance(target, str) and target in DTYPES):
            return self._converted(get_dtype(target))
        try:
            backend = _resolve(target)
        except UsageError as error:
            if isinstance(error, DeviceError):  # a device, but none usable here
                raise
            raise UsageError(f"Tensor.to: {error}; or a dtype: {', '.join(DTYPE_NAMES)}") from None
        if backend is self.backend:
            return self
        return Tensor(self.shape, backend, backend.upload(self.backend.download(self.data, self.size), self.dtype))

    def _converted(self, dtype: DType) -> "Tensor":
        tensor = Tensor(self.shape, self.backend, dtype=dtype)
        self.backend.convert(self.data, tensor.data, self.size)
        return tensor

    def copy_(self, source: "Tensor") -> "Tensor":
        """Overwrite this tensor's values with ``source``'s (same size; either backend; rounded to this
        tensor's dtype), in place: the storage keeps its address (a view, or a captured graph, still sees
        the new values)."""
        if source.size != self.size:
            raise ShapeError(f"cannot copy a tensor of shape {source.shape} into one of shape {self.shape}")
        if source.backend is not self.backend:
            self.backend.write(self.data, source.backend.download(source.data, source.size))
        elif source.dtype is self.dtype:
            self.backend.copy(source.data, self.data, self.size)
        else:
            self.backend.convert(source.data, self.data, self.size)
        return self

    def write_(self, array) -> "Tensor":
        """Overwrite the values in place from a host array of the same size (no new storage), each value
        as float32, then rounded to this tensor's dtype."""
        flat = float32_values(array, "Tensor.write_").reshape(-1)
        if flat.size != self.size:
            raise ShapeError(f"cannot write {flat.size} values into a tensor of shape {self.shape}")
        self.backend.write(self.data, flat)
        return self

    def fill_(self, value: float) -> "Tensor":
        """Every value ``value``, rounded to this tensor's dtype."""
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
