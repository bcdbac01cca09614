"""DLPack (unversioned, "dltensor" capsules) for CUDA tensors, built with ctypes.

Export: a DLManagedTensor whose deleter releases the DeviceBuffer it points into; the capsule's
destructor calls that deleter if no consumer took the capsule. Import: take a producer's capsule
(rename it "used_dltensor"), wrap its memory in a DeviceBuffer whose release calls the producer's
deleter.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_int, c_int32, c_int64, c_uint8, c_uint16, c_uint64, c_void_p
from math import prod

from ...errors import ShapeError, UsageError
from ...precision import DTYPES, DType
from .buffer import DeviceBuffer

KDL_CUDA = 2  # DLDeviceType kDLCUDA
KDL_FLOAT = 2  # DLDataTypeCode kDLFloat
KDL_BFLOAT = 4  # DLDataTypeCode kDLBfloat
# (code, bits, lanes) -> the tensor dtype: kDLFloat 32 and 16, kDLBfloat 16
DTYPES_BY_DLPACK = {(dtype.dlpack_code, 8 * dtype.itemsize, 1): dtype for dtype in DTYPES.values()}
DLTENSOR = b"dltensor"
USED_DLTENSOR = b"used_dltensor"


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", DLDevice),
        ("ndim", c_int32),
        ("dtype", DLDataType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


DELETER = ctypes.CFUNCTYPE(None, c_void_p)  # void (*deleter)(DLManagedTensor*)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p), ("deleter", DELETER)]


CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, c_void_p)  # void (*)(PyObject*)


def _python_api(name: str, restype, *argtypes):
    function = ctypes.pythonapi[name]  # a fresh function object: its argtypes are ours alone
    function.restype, function.argtypes = restype, argtypes
    return function


_capsule_new = _python_api("PyCapsule_New", ctypes.py_object, c_void_p, c_char_p, c_void_p)
_capsule_get_pointer = _python_api("PyCapsule_GetPointer", c_void_p, ctypes.py_object, c_char_p)
_capsule_set_name = _python_api("PyCapsule_SetName", c_int, ctypes.py_object, c_char_p)
# the destructor receives a capsule whose reference count is already 0: raw pointers only
_raw_capsule_is_valid = _python_api("PyCapsule_IsValid", c_int, c_void_p, c_char_p)
_raw_capsule_get_pointer = _python_api("PyCapsule_GetPointer", c_void_p, c_void_p, c_char_p)

# address of an exported DLManagedTensor: what must live until its deleter runs
_exports: dict[int, tuple] = {}


@DELETER
def _release_export(managed_address):
    _exports.pop(managed_address, None)


@CAPSULE_DESTRUCTOR
def _destroy_unconsumed_capsule(capsule_address):
    if _raw_capsule_is_valid(capsule_address, DLTENSOR):
        _release_export(_raw_capsule_get_pointer(capsule_address, DLTENSOR))


def dlpack_type(dtype: DType) -> tuple[int, int, int]:
    """DLPack's (code, bits, lanes) of ``dtype``: float32 (2, 32, 1), float16 (2, 16, 1), bfloat16 (4, 16, 1)."""
    return (dtype.dlpack_code, 8 * dtype.itemsize, 1)


def export(buffer: DeviceBuffer, shape: tuple[int, ...], device_id: int):
    """A "dltensor" capsule of a C-contiguous CUDA array of ``shape`` at ``buffer.ptr``, of the buffer's dtype."""
    ndim = len(shape)
    shape_array = (c_int64 * ndim)(*shape)
    strides_array = (c_int64 * ndim)(*(prod(shape[axis + 1:]) for axis in range(ndim)))
    managed = DLManagedTensor()
    managed.dl_tensor.data = buffer.ptr
    managed.dl_tensor.device = DLDevice(KDL_CUDA, device_id)
    managed.dl_tensor.ndim = ndim
    managed.dl_tensor.dtype = DLDataType(*dlpack_type(buffer.dtype))
    managed.dl_tensor.shape = ctypes.cast(shape_array, POINTER(c_int64))
    managed.dl_tensor.strides = ctypes.cast(strides_array, POINTER(c_int64))
    managed.dl_tensor.byte_offset = 0
    managed.deleter = _release_export
    address = ctypes.addressof(managed)
    _exports[address] = (managed, shape_array, strides_array, buffer)
    return _capsule_new(address, DLTENSOR, ctypes.cast(_destroy_unconsumed_capsule, c_void_p))


def exported_count() -> int:
    """How many exported tensors are still held by a capsule or a consumer."""
    return len(_exports)


def consume(capsule, device_id: int) -> tuple[tuple[int, ...], DeviceBuffer]:
    """(shape, buffer) of a producer's "dltensor" capsule: float32, bfloat16 or float16 (the buffer's
    dtype), CUDA ``device_id``, C-contiguous, at most 4 dimensions. The buffer borrows the memory and
    calls the producer's deleter when freed."""
    try:
        address = _capsule_get_pointer(capsule, DLTENSOR)
    except ValueError:
        raise UsageError("from_dlpack needs an unused 'dltensor' capsule (each can be consumed once)") from None
    managed = DLManagedTensor.from_address(address)
    tensor = managed.dl_tensor
    shape = _checked_shape(tensor, device_id)
    dtype = DTYPES_BY_DLPACK[(tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes)]
    _capsule_set_name(capsule, USED_DLTENSOR)
    nbytes = prod(shape) * dtype.itemsize
    return shape, DeviceBuffer(tensor.data + tensor.byte_offset, nbytes, release=_deleter_caller(address), dtype=dtype)


def _checked_shape(tensor: DLTensor, device_id: int) -> tuple[int, ...]:
    device = (tensor.device.device_type, tensor.device.device_id)
    if device != (KDL_CUDA, device_id):
        raise UsageError(f"from_dlpack: the array is on DLPack device {device}, this backend on {(KDL_CUDA, device_id)}")
    dtype = (tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes)
    if dtype not in DTYPES_BY_DLPACK:
        accepted = ", ".join(f"{name} {key}" for key, name in DTYPES_BY_DLPACK.items())
        raise UsageError(f"from_dlpack: the array's dtype (code, bits, lanes) is {dtype}; accepted are {accepted}")
    if not 0 <= tensor.ndim <= 4:
        raise ShapeError(f"from_dlpack: a tensor has at most 4 dimensions (n, c, h, w), got {tensor.ndim}")
    shape = tuple(tensor.shape[axis] for axis in range(tensor.ndim)) or (1,)
    if tensor.strides and tensor.ndim:
        strides = tuple(tensor.strides[axis] for axis in range(tensor.ndim))
        expected = tuple(prod(shape[axis + 1:]) for axis in range(len(shape)))
        if any(size > 1 and got != want for size, got, want in zip(shape, strides, expected)):
            raise ShapeError(f"from_dlpack: the array of shape {shape} has strides {strides}, not C-contiguous {expected}")
    return shape


def _deleter_caller(managed_address: int):
    """release(ptr) for a borrowed buffer: the producer's deleter(managed), if it gave one."""

    def release(_pointer: int) -> None:
        managed = DLManagedTensor.from_address(managed_address)
        if managed.deleter:
            managed.deleter(managed_address)

    return release
