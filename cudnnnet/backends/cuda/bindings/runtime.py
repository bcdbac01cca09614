"""CUDA runtime and driver calls through cuda-python, one thin function per C function.

cuda-python returns ``(status, *outputs)``; ``_check`` counts the call, raises on a failing status
(OutOfMemoryError for an allocation failure, CudaError otherwise) and returns the outputs.
"""

from __future__ import annotations

from ....errors import CudaError, OutOfMemoryError
from . import calls
from .loader import cuda_python

_runtime = _driver = None  # cuda-python's modules, bound by load()

MEMCPY_HOST_TO_DEVICE = 1  # cudaMemcpyHostToDevice
MEMCPY_DEVICE_TO_HOST = 2  # cudaMemcpyDeviceToHost
MEMCPY_DEVICE_TO_DEVICE = 3  # cudaMemcpyDeviceToDevice
STREAM_NON_BLOCKING = 1  # cudaStreamNonBlocking
EVENT_DISABLE_TIMING = 2  # cudaEventDisableTiming
CAPTURE_MODE_GLOBAL = 0  # cudaStreamCaptureModeGlobal: unsafe calls (cudaMalloc...) fail the capture
OUT_OF_MEMORY = {"cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY"}


def load() -> None:
    """Import cuda-python's runtime and driver modules (DeviceUnavailableError if missing)."""
    global _runtime, _driver
    _runtime, _driver, _ = cuda_python()


def _check(function: str, result):
    """Count the call; raise on a failing status; return the outputs (None, one value or a tuple)."""
    calls[function] += 1
    status = result[0]
    if status != 0:
        raise status_error(function, status)
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def status_error(function: str, status) -> Exception:
    """The exception for a failing cudaError_t / CUresult."""
    name = getattr(status, "name", str(status))
    if name in OUT_OF_MEMORY:
        return OutOfMemoryError(f"{function} failed with {name}: the GPU is out of memory; try a smaller batch size",
                                function, name)
    return CudaError(function, int(status), name)


# ---- device ----------------------------------------------------------------------------------
def get_device_count() -> int:
    return _check("cudaGetDeviceCount", _runtime.cudaGetDeviceCount())


def set_device(device: int) -> None:
    _check("cudaSetDevice", _runtime.cudaSetDevice(device))


def get_device_properties(device: int):
    """cudaGetDeviceProperties: a cudaDeviceProp (name, major, minor, multiProcessorCount, ...)."""
    return _check("cudaGetDeviceProperties", _runtime.cudaGetDeviceProperties(device))


def runtime_get_version() -> int:
    """cudaRuntimeGetVersion: 1000·major + 10·minor."""
    return _check("cudaRuntimeGetVersion", _runtime.cudaRuntimeGetVersion())


def driver_get_version() -> int:
    return _check("cudaDriverGetVersion", _runtime.cudaDriverGetVersion())


def mem_get_info() -> tuple[int, int]:
    """cudaMemGetInfo: (free, total) bytes on the current device."""
    return _check("cudaMemGetInfo", _runtime.cudaMemGetInfo())


# ---- memory ----------------------------------------------------------------------------------
def malloc(nbytes: int) -> int:
    """cudaMalloc: a device pointer to ``nbytes`` bytes."""
    return int(_check("cudaMalloc", _runtime.cudaMalloc(nbytes)))


def free(pointer: int) -> None:
    _check("cudaFree", _runtime.cudaFree(pointer))


def ipc_get_mem_handle(pointer: int) -> bytes:
    """cudaIpcGetMemHandle: the 64 bytes another process of this host opens to map ``pointer``'s allocation."""
    return bytes(_check("cudaIpcGetMemHandle", _runtime.cudaIpcGetMemHandle(pointer)).reserved)


def ipc_open_mem_handle(handle: bytes) -> int:
    """cudaIpcOpenMemHandle (peer access enabled lazily): another process's allocation, mapped here."""
    ipc_handle = _runtime.cudaIpcMemHandle_t()
    ipc_handle.reserved = handle
    flags = _runtime.cudaIpcMemLazyEnablePeerAccess
    return int(_check("cudaIpcOpenMemHandle", _runtime.cudaIpcOpenMemHandle(ipc_handle, flags)))


def ipc_close_mem_handle(pointer: int) -> None:
    """cudaIpcCloseMemHandle: unmap what ipc_open_mem_handle mapped."""
    _check("cudaIpcCloseMemHandle", _runtime.cudaIpcCloseMemHandle(pointer))


def malloc_host(nbytes: int) -> int:
    """cudaMallocHost: a pointer to ``nbytes`` of page-locked host memory (copies from it can be asynchronous)."""
    return int(_check("cudaMallocHost", _runtime.cudaMallocHost(nbytes)))


def free_host(pointer: int) -> None:
    """cudaFreeHost: release memory from cudaMallocHost."""
    _check("cudaFreeHost", _runtime.cudaFreeHost(pointer))


def memcpy_async(dst: int, src: int, nbytes: int, kind: int, stream) -> None:
    _check("cudaMemcpyAsync", _runtime.cudaMemcpyAsync(dst, src, nbytes, kind, stream))


def memset_async(pointer: int, value: int, nbytes: int, stream) -> None:
    _check("cudaMemsetAsync", _runtime.cudaMemsetAsync(pointer, value, nbytes, stream))


def memset_d32_async(pointer: int, bits: int, count: int, stream) -> None:
    """cuMemsetD32Async: ``count`` 32-bit words set to ``bits`` (a float's bit pattern)."""
    _check("cuMemsetD32Async", _driver.cuMemsetD32Async(pointer, bits, count, stream))


def memset_d16_async(pointer: int, bits: int, count: int, stream) -> None:
    """cuMemsetD16Async: ``count`` 16-bit words set to ``bits`` (a bfloat16's or a half's bit pattern)."""
    _check("cuMemsetD16Async", _driver.cuMemsetD16Async(pointer, bits, count, stream))


# ---- streams and events ----------------------------------------------------------------------
def stream_create_with_flags(flags: int):
    return _check("cudaStreamCreateWithFlags", _runtime.cudaStreamCreateWithFlags(flags))


def stream_destroy(stream) -> None:
    _check("cudaStreamDestroy", _runtime.cudaStreamDestroy(stream))


def stream_synchronize(stream) -> None:
    _check("cudaStreamSynchronize", _runtime.cudaStreamSynchronize(stream))


def stream_is_capturing(stream) -> bool:
    """cudaStreamIsCapturing: True while a CUDA graph capture is active on ``stream``."""
    return int(_check("cudaStreamIsCapturing", _runtime.cudaStreamIsCapturing(stream))) != 0


def stream_wait_event(stream, event) -> None:
    _check("cudaStreamWaitEvent", _runtime.cudaStreamWaitEvent(stream, event, 0))


def event_create_with_flags(flags: int):
    return _check("cudaEventCreateWithFlags", _runtime.cudaEventCreateWithFlags(flags))


def event_destroy(event) -> None:
    _check("cudaEventDestroy", _runtime.cudaEventDestroy(event))


def event_record(event, stream) -> None:
    _check("cudaEventRecord", _runtime.cudaEventRecord(event, stream))


def event_synchronize(event) -> None:
    _check("cudaEventSynchronize", _runtime.cudaEventSynchronize(event))


def event_elapsed_time(start, end) -> float:
    """cudaEventElapsedTime: milliseconds between two recorded events."""
    return float(_check("cudaEventElapsedTime", _runtime.cudaEventElapsedTime(start, end)))


def stream_begin_capture(stream, mode: int) -> None:
    """cudaStreamBeginCapture: queue nothing, record a CUDA graph instead."""
    _check("cudaStreamBeginCapture", _runtime.cudaStreamBeginCapture(stream, _runtime.cudaStreamCaptureMode(mode)))


def stream_end_capture(stream):
    """cudaStreamEndCapture: the captured cudaGraph_t."""
    return _check("cudaStreamEndCapture", _runtime.cudaStreamEndCapture(stream))


def graph_instantiate(graph):
    return _check("cudaGraphInstantiate", _runtime.cudaGraphInstantiate(graph, 0))


def graph_launch(graph_exec, stream) -> None:
    _check("cudaGraphLaunch", _runtime.cudaGraphLaunch(graph_exec, stream))


def graph_exec_destroy(graph_exec) -> None:
    _check("cudaGraphExecDestroy", _runtime.cudaGraphExecDestroy(graph_exec))


def graph_destroy(graph) -> None:
    _check("cudaGraphDestroy", _runtime.cudaGraphDestroy(graph))


def stream_handle(value: int):
    """A cudaStream_t for a raw handle (1 = legacy default stream, 2 = per-thread default stream)."""
    return _runtime.cudaStream_t(value)


# ---- modules and launches (driver API) --------------------------------------------------------
def module_load_data(image_address: int):
    """cuModuleLoadData: load a cubin image from host memory into the current context."""
    return _check("cuModuleLoadData", _driver.cuModuleLoadData(image_address))


def module_unload(module) -> None:
    _check("cuModuleUnload", _driver.cuModuleUnload(module))


def module_get_function(module, name: bytes):
    return _check("cuModuleGetFunction", _driver.cuModuleGetFunction(module, name))


def launch_kernel(function, grid: tuple, block: tuple, shared_bytes: int, stream, params_address: int) -> None:
    """cuLaunchKernel with ``params_address`` the address of a void*[] of argument pointers."""
    _check(
        "cuLaunchKernel",
        _driver.cuLaunchKernel(function, *grid, *block, shared_bytes, stream, params_address, 0),
    )
