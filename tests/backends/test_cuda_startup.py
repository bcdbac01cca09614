"""CUDA start-up on the host: the driver's first calls (cuInit, the primary context) run on a thread
while the libraries load, and every failure still surfaces from the calling thread as before. The
CUDA runtime and the library loading are replaced by fakes, so these tests need no GPU."""

from __future__ import annotations

import logging
import threading

import pytest

from cudnnnet import backends
from cudnnnet.backends.cuda import context
from cudnnnet.backends.cuda.bindings import runtime
from cudnnnet.errors import CudaError, DeviceUnavailableError

WAIT = 10.0  # seconds a fake waits for the other thread before giving up


class FakeCuda:
    """The runtime calls open_libraries makes, and the library loading, recording which thread made them."""

    def __init__(self, monkeypatch, devices: int | Exception = 1, library_error: Exception | None = None):
        self.devices, self.library_error = devices, library_error
        self.calls: list[tuple[str, str]] = []
        self.waits: list[bool] = []  # whether each side saw the other start within WAIT seconds
        self.driver_starting, self.libraries_loading = threading.Event(), threading.Event()
        self.set_device_error: Exception | None = None
        monkeypatch.setattr(runtime, "load", lambda: None)
        monkeypatch.setattr(runtime, "runtime_get_version", lambda: 13000)
        monkeypatch.setattr(runtime, "get_device_count", self.get_device_count)
        monkeypatch.setattr(runtime, "set_device", self.set_device)
        monkeypatch.setattr(runtime, "free", lambda pointer: self.record("cudaFree"))
        monkeypatch.setattr(context, "_load_libraries", self.load_libraries)
        monkeypatch.setattr(context, "_early_start", None)

    def record(self, call: str) -> None:
        self.calls.append((call, threading.current_thread().name))

    def get_device_count(self) -> int:
        self.record("cudaGetDeviceCount")
        if threading.current_thread() is not threading.main_thread():
            self.driver_starting.set()
            self.waits.append(self.libraries_loading.wait(WAIT))  # cuInit takes its time: the libraries load meanwhile
        if isinstance(self.devices, Exception):
            raise self.devices
        return self.devices

    def set_device(self, device: int) -> None:
        self.record(f"cudaSetDevice({device})")
        if self.set_device_error is not None:
            raise self.set_device_error

    def load_libraries(self, cuda_major: int) -> None:
        self.record("load libraries")
        self.libraries_loading.set()
        self.waits.append(self.driver_starting.wait(WAIT))
        if self.library_error is not None:
            raise self.library_error

    def threads(self, call: str) -> list[str]:
        return [thread for name, thread in self.calls if name == call]


NO_DEVICE = CudaError("cudaGetDeviceCount", 100, "cudaErrorNoDevice")
NO_CUDNN = DeviceUnavailableError('libcudnn.so.9 was not found (no such file); pip install "cudnnnet[cuda13]"')


def test_the_driver_starts_on_a_thread_while_the_libraries_load(monkeypatch):
    fake = FakeCuda(monkeypatch, devices=2)
    assert context.open_libraries(1) == (13, 2)
    assert fake.waits == [True, True]  # each side saw the other under way: they overlapped
    main = threading.main_thread().name
    assert fake.threads("load libraries") == [main]
    assert fake.threads("cudaSetDevice(1)") == fake.threads("cudaFree") == ["cudnnnet-cuda-start"]
    assert fake.threads("cudaGetDeviceCount") == ["cudnnnet-cuda-start", main]  # the caller checks for itself
    assert not any(thread.name == "cudnnnet-cuda-start" for thread in threading.enumerate())


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
    assert fake.threads("cudaSetDevice(0)") == []


def test_a_missing_library_is_reported_where_there_is_a_gpu(monkeypatch):
    FakeCuda(monkeypatch, devices=1, library_error=NO_CUDNN)
    with pytest.raises(DeviceUnavailableError) as raised:
        context.open_libraries()
    assert raised.value is NO_CUDNN


def test_a_failure_on_the_thread_is_left_to_the_caller(monkeypatch, capfd, caplog):
    fake = FakeCuda(monkeypatch, devices=1)
    fake.set_device_error = CudaError("cudaSetDevice", 46, "cudaErrorDevicesUnavailable")
    caplog.set_level(logging.DEBUG, logger=context.__name__)
    assert context.open_libraries(0) == (13, 1)  # CudaContext's own cudaSetDevice raises it, as before
    assert "cudaErrorDevicesUnavailable" in caplog.text
    assert capfd.readouterr().err == ""


def test_an_invalid_device_gets_no_context(monkeypatch):
    fake = FakeCuda(monkeypatch, devices=1)
    assert context.open_libraries(3) == (13, 1)  # CudaContext then raises its UsageError, as before
    assert not [call for call, _ in fake.calls if call.startswith("cudaSetDevice") or call == "cudaFree"]


def test_an_early_start_is_taken_by_the_next_open_libraries(monkeypatch):
    fake = FakeCuda(monkeypatch, devices=1)
    backends.warm_up("cuda")  # e.g. the trainer, before it reads the data
    assert [thread.name for thread in threading.enumerate()].count("cudnnnet-cuda-start") == 1
    assert context.open_libraries(0) == (13, 1)
    assert fake.waits == [True, True]
    assert fake.threads("cudaSetDevice(0)") == fake.threads("cudaFree") == ["cudnnnet-cuda-start"]  # one thread, once
    assert context._early_start is None


@pytest.mark.parametrize("device", ["host", None])
def test_warm_up_starts_nothing_for_the_host(monkeypatch, device):
    fake = FakeCuda(monkeypatch, devices=1)
    backends.warm_up(device)
    assert context._early_start is None and fake.calls == []


def test_warm_up_without_cuda_python_starts_nothing_and_raises_nothing(monkeypatch):
    FakeCuda(monkeypatch, devices=1)

    def missing():
        raise DeviceUnavailableError("cuda-python is not installed")

    monkeypatch.setattr(runtime, "load", missing)
    backends.warm_up("auto")
    assert context._early_start is None
