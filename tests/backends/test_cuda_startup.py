"""CUDA start-up on the host: the driver's first calls (cuInit, the primary context) run on a thread
while the libraries load, cuBLAS's first GEMM runs on another while the caller builds its network,
and every failure still surfaces from the calling thread as before. The driver, the runtime and the
library loading are replaced by fakes, so these tests need no GPU, except the last ones (marked)."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

from cudnnnet import backends
from cudnnnet.backends.cuda import context, startup
from cudnnnet.backends.cuda.bindings import driver_start, runtime
from cudnnnet.errors import CublasError, CudaError, DeviceUnavailableError

WAIT = 10.0  # seconds a fake waits for the other thread before giving up
START_THREAD = "cudnnnet-cuda-start"


class FakeCuda:
    """The driver calls DriverStart makes (through libcuda), the runtime calls open_libraries makes
    and the library loading, recording which thread made them."""

    def __init__(self, monkeypatch, devices: int | Exception = 1, library_error: Exception | None = None):
        self.devices, self.library_error = devices, library_error
        self.calls: list[tuple[str, str]] = []
        self.waits: list[bool] = []  # whether each side saw the other start within WAIT seconds
        self.driver_starting, self.libraries_loading = threading.Event(), threading.Event()
        self.retain_error: Exception | None = None
        self.libcuda_error: Exception | None = None
        monkeypatch.setattr(driver_start, "load", self.load_libcuda)
        monkeypatch.setattr(driver_start, "init", self.init)
        monkeypatch.setattr(driver_start, "device_count", lambda: self.device_count("cuDeviceGetCount"))
        monkeypatch.setattr(driver_start, "retain_primary_context", self.retain_primary_context)
        monkeypatch.setattr(runtime, "load", lambda: self.record("import cuda-python"))
        monkeypatch.setattr(runtime, "runtime_get_version", lambda: 13000)
        monkeypatch.setattr(runtime, "get_device_count", lambda: self.device_count("cudaGetDeviceCount"))
        monkeypatch.setattr(context, "_load_libraries", self.load_libraries)
        monkeypatch.setattr(startup, "_early_start", None)

    def record(self, call: str) -> None:
        self.calls.append((call, threading.current_thread().name))

    def load_libcuda(self) -> None:
        self.record("load libcuda")
        if self.libcuda_error is not None:
            raise self.libcuda_error

    def init(self) -> None:
        self.record("cuInit")
        self.driver_starting.set()
        self.waits.append(self.libraries_loading.wait(WAIT))  # cuInit takes its time: the libraries load meanwhile

    def device_count(self, call: str) -> int:
        self.record(call)
        if isinstance(self.devices, Exception):
            raise self.devices
        return self.devices

    def retain_primary_context(self, device: int) -> None:
        self.record(f"cuDevicePrimaryCtxRetain({device})")
        if self.retain_error is not None:
            raise self.retain_error

    def load_libraries(self, cuda_major: int) -> None:
        self.record("load libraries")
        self.libraries_loading.set()
        self.waits.append(self.driver_starting.wait(WAIT))
        if self.library_error is not None:
            raise self.library_error

    def threads(self, call: str) -> list[str]:
        return [thread for name, thread in self.calls if name == call]


NO_DEVICE = CudaError("cudaGetDeviceCount", 100, "cudaErrorNoDevice")
NO_CUDNN = DeviceUnavailableError('libcudnn.so.9 was not found (no such file); pip install -e ".[cuda13]" from the '
                                  'repository checkout')


def test_the_driver_starts_on_a_thread_while_the_libraries_load(monkeypatch):
    fake = FakeCuda(monkeypatch, devices=2)
    assert context.open_libraries(1) == (13, 2)
    assert fake.waits == [True, True]  # each side saw the other under way: they overlapped
    main = threading.main_thread().name
    assert fake.threads("import cuda-python") == fake.threads("load libraries") == [main]
    assert fake.threads("cuInit") == fake.threads("cuDevicePrimaryCtxRetain(1)") == [START_THREAD]
    assert fake.threads("cudaGetDeviceCount") == [main]  # the caller checks for itself, through the runtime
    assert not any(thread.name == START_THREAD for thread in threading.enumerate())


def test_the_thread_starts_before_cuda_python_is_imported(monkeypatch):
    fake = FakeCuda(monkeypatch, devices=1)
    saw_the_driver_start = []
    monkeypatch.setattr(runtime, "load", lambda: saw_the_driver_start.append(fake.driver_starting.wait(WAIT)))
    context.open_libraries(0)
    assert saw_the_driver_start == [True]  # cuInit was under way while cuda-python was imported


@pytest.mark.parametrize("library_error", [None, NO_CUDNN], ids=["libraries found", "cuDNN missing"])
def test_no_gpu_is_reported_as_before_and_before_a_missing_library(monkeypatch, capfd, library_error):
    FakeCuda(monkeypatch, devices=NO_DEVICE, library_error=library_error)
    with pytest.raises(DeviceUnavailableError, match=r"^no usable NVIDIA GPU: cudaGetDeviceCount failed with "
                                                     r"cudaErrorNoDevice \(is the NVIDIA driver installed"):
        context.open_libraries()
    assert capfd.readouterr().err == ""  # the thread printed nothing


def test_zero_gpus_are_reported_as_before(monkeypatch):
    fake = FakeCuda(monkeypatch, devices=0, library_error=NO_CUDNN)
    with pytest.raises(DeviceUnavailableError, match=r"^no NVIDIA GPU is visible \(cudaGetDeviceCount returned 0\)$"):
        context.open_libraries()
    assert fake.threads("cuDevicePrimaryCtxRetain(0)") == []


def test_a_missing_library_is_reported_where_there_is_a_gpu(monkeypatch):
    FakeCuda(monkeypatch, devices=1, library_error=NO_CUDNN)
    with pytest.raises(DeviceUnavailableError) as raised:
        context.open_libraries()
    assert raised.value is NO_CUDNN


def test_missing_cuda_python_is_reported_once_the_thread_is_done(monkeypatch):
    fake = FakeCuda(monkeypatch, devices=1)
    missing = DeviceUnavailableError("the CUDA backend needs cuda-python, which is not installed")

    def load():
        fake.libraries_loading.set()  # the caller goes on (here: to its error) while cuInit runs
        raise missing

    monkeypatch.setattr(runtime, "load", load)
    with pytest.raises(DeviceUnavailableError) as raised:
        context.open_libraries()
    assert raised.value is missing
    assert not any(thread.name == START_THREAD for thread in threading.enumerate())


def test_a_failure_on_the_thread_is_left_to_the_caller(monkeypatch, capfd, caplog):
    fake = FakeCuda(monkeypatch, devices=1)
    fake.retain_error = CudaError("cuDevicePrimaryCtxRetain", 46, "CUDA_ERROR_DEVICE_UNAVAILABLE")
    caplog.set_level(logging.DEBUG, logger=startup.__name__)
    assert context.open_libraries(0) == (13, 1)  # CudaContext's own cudaSetDevice raises it, as before
    assert "CUDA_ERROR_DEVICE_UNAVAILABLE" in caplog.text
    assert capfd.readouterr().err == ""


def test_no_driver_on_the_thread_is_left_to_the_caller(monkeypatch, capfd):
    fake = FakeCuda(monkeypatch, devices=NO_DEVICE)
    fake.libcuda_error = DeviceUnavailableError("libcuda.so.1 cannot be loaded (no such file)")
    fake.driver_starting.set()  # no cuInit to wait for
    with pytest.raises(DeviceUnavailableError, match=r"^no usable NVIDIA GPU: cudaGetDeviceCount failed"):
        context.open_libraries()
    assert fake.threads("cuInit") == [] and capfd.readouterr().err == ""


def test_an_invalid_device_gets_no_context(monkeypatch):
    fake = FakeCuda(monkeypatch, devices=1)
    assert context.open_libraries(3) == (13, 1)  # CudaContext then raises its UsageError, as before
    assert not [call for call, _ in fake.calls if call.startswith("cuDevicePrimaryCtxRetain")]


def test_an_early_start_is_taken_by_the_next_open_libraries(monkeypatch):
    fake = FakeCuda(monkeypatch, devices=1)
    backends.warm_up("cuda")  # e.g. the trainer, before it reads the data
    assert [thread.name for thread in threading.enumerate()].count(START_THREAD) == 1
    assert fake.threads("import cuda-python") == []  # warm_up imports nothing
    assert context.open_libraries(0) == (13, 1)
    assert fake.waits == [True, True]
    assert fake.threads("cuInit") == fake.threads("cuDevicePrimaryCtxRetain(0)") == [START_THREAD]  # one thread, once
    assert startup._early_start is None


@pytest.mark.parametrize("device", ["host", None])
def test_warm_up_starts_nothing_for_the_host(monkeypatch, device):
    fake = FakeCuda(monkeypatch, devices=1)
    backends.warm_up(device)
    assert startup._early_start is None and fake.calls == []


class FakeCublas:
    """What CublasWarmUp makes and calls, recording the thread of each call and what was released."""

    def __init__(self, monkeypatch, sgemm_error: Exception | None = None):
        self.calls: list[tuple[str, str]] = []
        self.released: list[str] = []
        self.sgemm_error = sgemm_error
        fake = self

        class Stream:
            handle = address = 0x5

            def synchronize(self):
                fake.record("cudaStreamSynchronize")

            def close(self):
                fake.released.append("stream")

        class CublasHandle:
            handle = 0xB

            def __init__(self, stream):
                fake.record("cublasCreate")

            def close(self):
                fake.released.append("cublas handle")

        class DeviceBuffer:
            ptr = 0x1000

            def __init__(self, nbytes):
                self.nbytes = nbytes

            @classmethod
            def allocate(cls, nbytes):
                fake.record(f"cudaMalloc({nbytes})")
                return cls(nbytes)

            def free(self):
                fake.released.append("buffer")

        monkeypatch.setattr(context, "Stream", Stream)
        monkeypatch.setattr(context, "CublasHandle", CublasHandle)
        monkeypatch.setattr(context, "DeviceBuffer", DeviceBuffer)
        monkeypatch.setattr(runtime, "set_device", lambda device: self.record(f"cudaSetDevice({device})"))
        monkeypatch.setattr(runtime, "memset_async", lambda *args: self.record("cudaMemsetAsync"))
        monkeypatch.setattr(context.cublas, "sgemm", self.sgemm)

    def record(self, call: str) -> None:
        self.calls.append((call, threading.current_thread().name))

    def sgemm(self, handle, transa, transb, m, n, k, *args) -> None:
        self.record(f"cublasSgemm({m}, {n}, {k})")
        if self.sgemm_error is not None:
            raise self.sgemm_error


def test_the_cublas_warm_up_multiplies_on_a_thread_of_its_own_and_frees_everything(monkeypatch):
    fake = FakeCublas(monkeypatch)
    warm_up = context.CublasWarmUp(1)
    warm_up.join()
    assert [call for call, _ in fake.calls] == ["cudaSetDevice(1)", "cublasCreate", "cudaMalloc(768)",
                                                "cudaMemsetAsync", "cublasSgemm(8, 8, 8)", "cudaStreamSynchronize"]
    assert {thread for _, thread in fake.calls} == {"cudnnnet-cublas-warm-up"}
    assert sorted(fake.released) == ["buffer", "cublas handle", "stream"]


def test_a_failing_cublas_warm_up_is_logged_and_still_frees_everything(monkeypatch, capfd, caplog):
    fake = FakeCublas(monkeypatch, sgemm_error=CublasError("cublasSgemm_v2", 13, "CUBLAS_STATUS_EXECUTION_FAILED"))
    caplog.set_level(logging.DEBUG, logger=context.__name__)
    warm_up = context.CublasWarmUp(0)
    warm_up.join()
    assert "CUBLAS_STATUS_EXECUTION_FAILED" in caplog.text and capfd.readouterr().err == ""
    assert sorted(fake.released) == ["buffer", "cublas handle", "stream"]


@pytest.mark.gpu
def test_a_context_started_early_warms_cublas_up_until_its_first_capture(cuda):
    startup.start_driver(cuda.context.device)
    with context.CudaContext(cuda.context.device) as started_early:
        assert started_early._warm_up is not None
        ones = started_early.ones(4)  # a pointer to 4 floats of 1.0
        with started_early.capture() as graph:  # no warm-up allocation may fall inside
            runtime.memset_async(ones, 0, 4 * 4, started_early.stream.handle)
        assert started_early._warm_up is None
        graph.launch()
        values = np.ones(4, np.float32)
        runtime.memcpy_async(values.ctypes.data, ones, values.nbytes, runtime.MEMCPY_DEVICE_TO_HOST,
                             started_early.stream.handle)
        started_early.synchronize()
        assert values.tolist() == [0.0] * 4


@pytest.mark.gpu
def test_a_context_made_without_warm_up_starts_no_cublas_thread(cuda):
    with context.CudaContext(cuda.context.device) as plain:
        assert plain._warm_up is None
