"""CudaContext: the CudaContext of the C++ design, in Python.

One device, ONE non-default stream, a cuBLAS and a cuDNN handle bound to that stream, the
``one / zero / minus_one`` constants, a grow-only cuDNN workspace, the descriptor cache and our
NVRTC kernels. ``close()`` (or leaving a ``with`` block) releases everything; so does collection.
The cuDNN handle is created on first use (``cudnn``): a network that never calls cuDNN (an MLP,
whose softmax, loss and ReLU gradient are our kernels) never creates one. The cuDNN library itself
is loaded, and its version read, when the context is made, so a missing cuDNN is reported then.
A context whose start was begun early (``backends.warm_up``) also runs ``CublasWarmUp`` on a
thread, with a stream and a cuBLAS handle of its own, gone before the first GEMM or capture.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
from ctypes import byref, c_float

from ...errors import (CublasError, CudaError, DeviceError, DeviceInitError, DeviceUnavailableError, OutOfMemoryError,
                       UsageError)
from ...tensor import Tensor
from ...util.background import Background
from ..base import OP_N
from . import startup
from .bindings import cublas, cublaslt, cudnn, nvrtc, runtime
from .bindings.loader import load_library
from .buffer import FLOAT32_BYTES, DeviceBuffer
from .descriptors import DescriptorCache
from .handles import CublasHandle, CublasLtHandle, CudaGraph, CudnnHandle, Event, Stream, releases_held_back
from .kernel import KERNELS, Kernel, load_module
from .low_precision import HalfOperands

log = logging.getLogger(__name__)

ONE_BITS = 0x3F800000  # 1.0f
CUBLAS_WORKSPACE_BYTES = 32 << 20  # cuBLAS' recommendation for Hopper; needed for graph capture


def open_libraries(device: int = 0) -> tuple[int, int]:
    """Load cuda-python, NVRTC, cuBLAS(Lt) and cuDNN (once per process) and check for a GPU; returns
    (CUDA major version, device count).

    The first CUDA calls for ``device`` run meanwhile on a thread (``DriverStart``): starting the
    driver and creating the primary context take ~0.2–0.3 s without holding the GIL, while loading
    the libraries (imports, dlopen) holds it. Raises DeviceUnavailableError, naming what to install,
    when anything is missing; a missing GPU is reported before a missing library.
    """
    start = startup.take_driver_start(device) or startup.DriverStart(device)
    try:
        runtime.load()
    except DeviceUnavailableError:
        start.join()
        raise
    cuda_major = runtime.runtime_get_version() // 1000
    try:
        _load_libraries(cuda_major)
    except BaseException:
        start.join()
        _device_count()
        raise
    start.join()
    return cuda_major, _device_count()


@functools.cache
def _load_libraries(cuda_major: int) -> None:
    nvrtc.load(cuda_major)
    cublaslt.load(load_library("cublasLt", cuda_major))
    cublas.load(load_library("cublas", cuda_major))  # before cuDNN, which uses cuBLAS(Lt)
    cudnn.load(load_library("cudnn", cuda_major))
    log.info("CUDA runtime %d, cuDNN %d, NVRTC %s", runtime.runtime_get_version(), cudnn.get_version(), nvrtc.version())


def _device_count() -> int:
    """cudaGetDeviceCount; DeviceUnavailableError where it fails or finds no GPU (cuda-bindings 12.8
    raises RuntimeError "Failed to dlopen libcuda.so.1" where there is no driver)."""
    try:
        device_count = runtime.get_device_count()
    except (CudaError, RuntimeError) as error:
        failure = error.status_name if isinstance(error, CudaError) else str(error).strip()
        raise DeviceUnavailableError(
            f"no usable NVIDIA GPU: cudaGetDeviceCount failed with {failure} "
            "(is the NVIDIA driver installed and a GPU visible?)"
        ) from None
    if device_count == 0:
        raise DeviceUnavailableError("no NVIDIA GPU is visible (cudaGetDeviceCount returned 0)")
    return device_count


class CublasWarmUp:
    """One small cublasSgemm on a stream, handle and buffer of its own, on a daemon thread.

    cuBLAS's first GEMM in a process loads its kernels, tens of milliseconds of host time (and more
    for the first GEMM of another shape). Here that overlaps the caller's work until its own
    first GEMM, which joins this thread (``CudaContext.finish_warm_up``), as do a capture and
    ``close``: everything it made is freed by then, so none of its allocations falls inside a graph
    capture. A failure here only loses the head start; it is logged, never raised.
    """

    SIDE = 8  # C (8×8) = A (8×8)·B (8×8)

    def __init__(self, device: int):
        self.device = device
        self._work = Background("cudnnnet-cublas-warm-up", self._run)

    def _run(self) -> None:
        try:
            runtime.set_device(self.device)  # the current device is per thread
            self._multiply()
        except DeviceError as error:
            log.debug("cuBLAS warm-up on a thread: %s", error)

    def _multiply(self) -> None:
        side, values = self.SIDE, self.SIDE * self.SIDE
        stream = Stream()
        handle = CublasHandle(stream)
        matrices = DeviceBuffer.allocate(3 * values * FLOAT32_BYTES)  # A, B, C
        try:
            runtime.memset_async(matrices.ptr, 0, matrices.nbytes, stream.handle)
            a, b, c = (matrices.ptr + index * values * FLOAT32_BYTES for index in range(3))
            one, zero = c_float(1.0), c_float(0.0)
            # C = 1·A·B + 0·C
            cublas.sgemm(handle.handle, OP_N, OP_N, side, side, side, byref(one), a, side, b, side,
                         byref(zero), c, side)
            stream.synchronize()
        finally:
            handle.close()
            stream.close()
            matrices.free()

    def join(self) -> None:
        self._work.join()


@contextlib.contextmanager
def _initialising(device: int):
    """A failure while the context, stream, handles and workspace are made is reported as the GPU that
    could not be initialised (the CUDA error named), not as a batch too large for its memory."""
    try:
        yield
    except (OutOfMemoryError, CudaError, CublasError) as error:
        if isinstance(error, OutOfMemoryError):
            failure = f"{error.function or 'an allocation'} failed with {error.status_name or 'out of memory'}"
            hint = "; its memory is taken, probably by another process (see nvidia-smi)"
        else:
            failure, hint = str(error), ""
        raise DeviceInitError(f"the GPU (device {device}) could not be initialised: {failure}{hint}") from error


def _text(name) -> str:
    """A C char[] field from cuda-python (bytes, possibly NUL-padded) as str."""
    return name.split(b"\0")[0].decode() if isinstance(name, (bytes, bytearray)) else str(name)


class CudaContext:
    """Everything a backend needs on one device."""

    def __init__(self, device: int = 0):
        started_early = startup.early_start_pending()  # backends.warm_up: the caller wants a head start
        self.cuda_major, device_count = open_libraries(device)
        if not 0 <= device < device_count:
            raise UsageError(f"invalid CUDA device {device!r}; this machine has devices 0 to {device_count - 1}")
        self.device = device
        with _initialising(device):
            runtime.set_device(device)
            runtime.free(0)  # cudaFree(0): create the primary context now, for the driver API too
            properties = runtime.get_device_properties(device)
            self.device_name = _text(properties.name)
            self.compute_capability = (int(properties.major), int(properties.minor))
            self.arch = f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"
            self.stream = Stream()
            self.one, self.zero, self.minus_one = c_float(1.0), c_float(0.0), c_float(-1.0)
            self._constants = {1.0: byref(self.one), 0.0: byref(self.zero), -1.0: byref(self.minus_one)}
            self.cublas = CublasHandle(self.stream)
            self._cublas_workspace = DeviceBuffer.allocate(CUBLAS_WORKSPACE_BYTES)
            cublas.set_workspace(self.cublas.handle, self._cublas_workspace.ptr, CUBLAS_WORKSPACE_BYTES)
            self.cublas_version = cublas.get_version(self.cublas.handle)
            self.cublas_lt = CublasLtHandle()  # its matmuls use the cuBLAS workspace, on the same stream
        self.cublaslt_version = cublaslt.get_version()
        self._cudnn: CudnnHandle | None = None  # created on first use, by the cudnn property
        self.cudnn_version = cudnn.get_version()
        self.descriptors = DescriptorCache()
        self._workspace: DeviceBuffer | None = None  # shared by every convolution plan, grow-only
        self._outgrown_buffers: list[DeviceBuffer] = []  # outgrown workspaces and ones: a captured graph may point to them
        self._ones: DeviceBuffer | None = None  # 1.0 values, grow-only like the workspace
        self._kernels: dict[str, Kernel] = {}
        self._ordering_event: Event | None = None
        self._warm_up = CublasWarmUp(device) if started_early else None
        self.half = HalfOperands(self)  # math "bf16"/"fp16": the 16-bit copies of GEMM and convolution operands
        log.info("CUDA context on device %d (%s, %s), cuDNN %d", device, self.device_name, self.arch, self.cudnn_version)

    def finish_warm_up(self) -> None:
        """Wait for the CublasWarmUp begun with this context, if any (before the first GEMM, a
        capture or ``close``)."""
        if self._warm_up is not None:
            self._warm_up.join()
            self._warm_up = None

    def scalar(self, value):
        """A host pointer to ``value`` as float32, for a library call in host pointer mode (0, 1 and -1
        are the context's constants)."""
        if isinstance(value, Tensor):
            raise UsageError("only saxpy, sscal, sgd_update and sgd_update_many take a one-element tensor as a scalar")
        constant = self._constants.get(value)
        return constant if constant is not None else byref(c_float(value))

    @contextlib.contextmanager
    def pointer_mode(self, device: bool):
        """cuBLAS's CUBLAS_POINTER_MODE_DEVICE inside the block where ``device`` (scalars read from device
        memory); host mode afterwards."""
        if not device:
            yield
            return
        cublas.set_pointer_mode(self.cublas.handle, cublas.POINTER_MODE_DEVICE)
        try:
            yield
        finally:
            cublas.set_pointer_mode(self.cublas.handle, cublas.POINTER_MODE_HOST)

    # ---- cuDNN -------------------------------------------------------------------------------
    @property
    def cudnn(self) -> CudnnHandle:
        """The cuDNN handle bound to the context stream, created (cudnnCreate) on the first call that
        needs it; never inside a CUDA graph capture (DeviceError), where creating it is not allowed."""
        if self._cudnn is None:
            if self.closed:
                raise UsageError("the CUDA context is closed: it has no cuDNN handle to give")
            if self.is_capturing():
                raise DeviceError("the cuDNN handle would be created during a CUDA graph capture; "
                                  "make one cuDNN call (run one step) before capturing")
            self._cudnn = CudnnHandle(self.stream)
            log.debug("cuDNN handle created on device %d", self.device)
        return self._cudnn

    # ---- stream ------------------------------------------------------------------------------
    def synchronize(self) -> None:
        self.stream.synchronize()

    def is_capturing(self) -> bool:
        """True while a CUDA graph capture is active on the context stream."""
        return self.stream.is_capturing()

    @contextlib.contextmanager
    def capture(self):
        """Capture the work queued on the context stream inside the block as a CUDA graph:

            with context.capture() as graph:
                backend.sgd_update(param, grad, velocity, lr_tensor, 0.9, 0.0)   # recorded, not run
            graph.launch()                                                        # runs it

        Plans, workspaces and kernels must exist before (run one step first): nothing may be
        allocated or freed during a capture, so Python's cycle collector (which could free a
        buffer) is paused for the block, and a buffer or handle whose last reference goes inside it
        is released at its end (``releases_held_back``).
        """
        self.finish_warm_up()
        graph = CudaGraph(self.stream)
        collecting = gc.isenabled()
        gc.disable()
        try:
            with releases_held_back():
                graph.begin()
                try:
                    yield graph
                except BaseException:
                    graph.abandon()
                    raise
                graph.end()
        finally:
            if collecting:
                gc.enable()

    def make_stream_wait(self, other_stream: int) -> None:
        """Order ``other_stream`` (a raw handle) after all work queued so far on the context stream."""
        if self._ordering_event is None:
            self._ordering_event = Event(timing=False)
        self._ordering_event.record(self.stream)
        runtime.stream_wait_event(runtime.stream_handle(other_stream), self._ordering_event.handle)

    # ---- workspace ---------------------------------------------------------------------------
    @property
    def cublas_workspace(self) -> tuple[int, int]:
        """(pointer, bytes) of the fixed cuBLAS workspace, which cuBLASLt matmuls share."""
        return self._cublas_workspace.ptr, CUBLAS_WORKSPACE_BYTES

    @property
    def workspace_bytes(self) -> int:
        return self._workspace.nbytes if self._workspace is not None else 0

    def workspace(self, nbytes: int) -> int:
        """The pointer of the shared cuDNN workspace, grown (never shrunk) to ``nbytes`` first."""
        if nbytes > self.workspace_bytes:
            if self.is_capturing():
                raise DeviceError(
                    f"the cuDNN workspace must grow to {nbytes} bytes during a CUDA graph capture; "
                    "run one step at this batch size before capturing"
                )
            if self._workspace is not None:  # a captured CUDA graph may still use it: keep it alive
                self._outgrown_buffers.append(self._workspace)
            self._workspace = DeviceBuffer.allocate(nbytes)
            log.debug("cuDNN workspace grown to %d bytes", nbytes)
        return self._workspace.ptr if self._workspace is not None else 0

    def ones(self, count: int) -> int:
        """The pointer of at least ``count`` float32 ones (a vector that sums by cublasSgemv), grown
        (never shrunk) and filled first if needed."""
        if self._ones is None or self._ones.size < count:
            if self.is_capturing():
                raise DeviceError(f"the vector of ones must grow to {count} values during a CUDA graph capture; "
                                  "run one step at this batch size before capturing")
            if self._ones is not None:
                self._outgrown_buffers.append(self._ones)
            self._ones = DeviceBuffer.allocate(FLOAT32_BYTES * count)
            runtime.memset_d32_async(self._ones.ptr, ONE_BITS, count, self.stream.handle)
        return self._ones.ptr

    # ---- kernels -----------------------------------------------------------------------------
    def kernel(self, name: str) -> Kernel:
        """Our NVRTC kernel ``name`` (compiled and loaded on first use)."""
        kernel = self._kernels.get(name)
        if kernel is None:
            filename, argtypes = KERNELS[name]
            module = next((k.module for k in self._kernels.values() if KERNELS[k.name][0] == filename), None)
            kernel = self._kernels[name] = Kernel(module or load_module(filename, self.arch), name, argtypes)
        return kernel

    # ---- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        """Release handles, descriptors, kernels, workspaces and the stream (idempotent)."""
        if self.stream.closed:
            return
        self.finish_warm_up()
        self.stream.synchronize()
        self.descriptors.clear()
        self.half.close()
        for kernel in self._kernels.values():
            kernel.module.close()
        self._kernels.clear()
        for owned in (self._ordering_event, self._cudnn, self.cublas_lt, self.cublas):  # _cudnn: None if never made
            if owned is not None:
                owned.close()
        for buffer in (self._workspace, self._ones, self._cublas_workspace, *self._outgrown_buffers):
            if buffer is not None:
                buffer.free()
        self._workspace = self._ones = None
        self._outgrown_buffers.clear()
        self.stream.close()

    @property
    def closed(self) -> bool:
        return self.stream.closed

    def __enter__(self) -> "CudaContext":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CudaContext(device={self.device}, {self.device_name!r})"
