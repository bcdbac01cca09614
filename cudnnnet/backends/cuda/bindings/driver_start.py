"""The driver calls that start CUDA (cuInit, the device count, a device's primary context) through
ctypes on libcuda.so.1, which every NVIDIA driver installs.

``runtime`` reaches the same driver through cuda-python, but importing cuda-python takes a while
holding the GIL; these calls need no import, so ``startup.DriverStart`` can begin the driver's
~0.2–0.3 s start-up the moment a caller asks for it. Every status is checked and raised as a
CudaError naming the function (its CUresult name from cuGetErrorName).
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, byref, c_char_p, c_int, c_uint, c_void_p

from ....errors import CudaError, DeviceUnavailableError
from . import calls

LIBRARY = "libcuda.so.1"
SIGNATURES = {
    "cuInit": (c_uint,),
    "cuDeviceGetCount": (POINTER(c_int),),
    "cuDeviceGet": (POINTER(c_int), c_int),
    "cuDevicePrimaryCtxRetain": (POINTER(c_void_p), c_int),
    "cuGetErrorName": (c_int, POINTER(c_char_p)),
}

_functions: dict = {}


def load() -> None:
    """Open libcuda.so.1 once and fix the argtypes of the calls above (DeviceUnavailableError if it
    cannot be opened: no NVIDIA driver)."""
    if _functions:
        return
    try:
        library = ctypes.CDLL(LIBRARY)
    except OSError as error:
        raise DeviceUnavailableError(f"{LIBRARY} cannot be loaded ({error}); is the NVIDIA driver installed?") from None
    for name, argtypes in SIGNATURES.items():
        function = getattr(library, name)
        function.argtypes, function.restype = argtypes, c_int
        _functions[name] = function


def _call(function: str, *args) -> None:
    calls[function] += 1
    status = _functions[function](*args)
    if status != 0:
        raise CudaError(function, status, _error_name(status))


def _error_name(status: int) -> str:
    name = c_char_p()
    if _functions["cuGetErrorName"](status, byref(name)) != 0 or name.value is None:
        return f"CUresult {status}"
    return name.value.decode()


def init() -> None:
    """cuInit(0): start the driver (most of the first CUDA call's cost)."""
    _call("cuInit", 0)


def device_count() -> int:
    count = c_int()
    _call("cuDeviceGetCount", byref(count))
    return count.value


def retain_primary_context(ordinal: int) -> None:
    """cuDevicePrimaryCtxRetain: create the device's primary context, the one the runtime uses.

    The reference is kept for the life of the process, as the runtime keeps its own."""
    device = c_int()
    _call("cuDeviceGet", byref(device), ordinal)
    context = c_void_p()
    _call("cuDevicePrimaryCtxRetain", byref(context), device)
