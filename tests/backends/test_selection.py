"""Choosing a backend (cudnnnet/backends/__init__.py) on a machine without a GPU, whatever the
driver or cuda-python raise there: ``auto`` falls back to the host, ``cuda_available`` answers
False, ``cuda`` is one DeviceUnavailableError. Everything CUDA is simulated, so this runs anywhere."""

import pytest

from cudnnnet import backends
from cudnnnet.backends.cuda import context, startup
from cudnnnet.backends.cuda.bindings import driver_start, runtime
from cudnnnet.errors import CudaError, DeviceUnavailableError

NO_LIBCUDA = DeviceUnavailableError("libcuda.so.1 cannot be loaded (cannot open shared object file)")
NO_DEVICE = CudaError("cuInit", 100, "CUDA_ERROR_NO_DEVICE")
# What cuda-python/cuda-bindings 12.3-12.8 raise from their first driver call without a driver.
DLOPEN_FAILED = RuntimeError("Failed to dlopen libcuda.so.1")


@pytest.fixture(autouse=True)
def fresh_backends(monkeypatch):
    """No backend made yet in this test: each test chooses afresh."""
    monkeypatch.setattr(backends, "_instances", {})


def simulated_driver(monkeypatch, load=None, init=None, devices=1):
    """driver_start (libcuda through ctypes) raising ``load`` / ``init``, else counting ``devices``."""

    def fail_with(error):
        def call(*_args):
            if error is not None:
                raise error
        return call

    monkeypatch.setattr(driver_start, "load", fail_with(load))
    monkeypatch.setattr(driver_start, "init", fail_with(init))
    monkeypatch.setattr(driver_start, "device_count", lambda: devices)
    monkeypatch.setattr(driver_start, "retain_primary_context", fail_with(None))


@pytest.mark.parametrize(("load", "init", "devices", "reason"), [
    (NO_LIBCUDA, None, 1, "libcuda.so.1 cannot be loaded"),
    (OSError("libcuda.so.1: wrong ELF class"), None, 1, "wrong ELF class"),
    (None, NO_DEVICE, 1, "CUDA_ERROR_NO_DEVICE"),
    (None, DLOPEN_FAILED, 1, "Failed to dlopen libcuda.so.1"),
    (None, None, 0, "counts no GPU"),
], ids=["no libcuda", "OSError", "no device", "RuntimeError", "zero devices"])
def test_without_a_gpu_auto_is_the_host_before_any_cuda_library_loads(monkeypatch, caplog, load, init, devices, reason):
    simulated_driver(monkeypatch, load, init, devices)
    monkeypatch.setattr(context, "open_libraries", lambda *_: pytest.fail("auto loaded the CUDA libraries"))
    assert reason in backends.no_gpu_reason()
    assert backends.cuda_available() is False
    with caplog.at_level("DEBUG", logger="cudnnnet.backends"):
        assert backends.get_backend("auto").name == "host"
    said = {level: [record.getMessage() for record in caplog.records if record.levelname == level]
            for level in ("INFO", "DEBUG")}
    assert said["INFO"] == ["device auto: no GPU found; running on the host"]  # no fault on a machine meant to have none
    assert said["DEBUG"] == [f"device auto: no GPU: {backends.no_gpu_reason()}"]  # why, for who asks


def test_without_a_driver_cuda_is_refused_before_any_cuda_library_loads_or_logs(monkeypatch, caplog):
    simulated_driver(monkeypatch, load=NO_LIBCUDA)
    monkeypatch.setattr(context, "open_libraries", lambda *_: pytest.fail("cuda loaded the CUDA libraries"))
    with caplog.at_level("DEBUG", logger="cudnnnet"), pytest.raises(DeviceUnavailableError) as raised:
        backends.get_backend("cuda")
    assert str(raised.value) == f"no GPU ({NO_LIBCUDA})"
    assert caplog.records == []


def test_with_the_driver_starting_on_a_thread_auto_keeps_the_overlap(monkeypatch, caplog):
    """After warm_up (the command-line tools): libcuda loads, so auto makes the context at once and the
    libraries load while the driver starts; no cuInit waits on the calling thread first."""
    simulated_driver(monkeypatch, init=AssertionError("cuInit on the calling thread"))
    monkeypatch.setattr(startup, "early_start_pending", lambda: True)
    made = []

    def open_libraries(*_):
        made.append(True)
        raise DeviceUnavailableError("no NVIDIA GPU is visible (cudaGetDeviceCount returned 0)")

    monkeypatch.setattr(context, "open_libraries", open_libraries)
    with caplog.at_level("INFO", logger="cudnnnet.backends"):
        assert backends.get_backend("auto").name == "host"  # no GPU behind the driver: found by the context
    assert made == [True] and "no usable GPU" in caplog.text


def test_with_the_driver_starting_but_no_libcuda_auto_loads_nothing(monkeypatch):
    simulated_driver(monkeypatch, load=NO_LIBCUDA)
    monkeypatch.setattr(startup, "early_start_pending", lambda: True)
    monkeypatch.setattr(context, "open_libraries", lambda *_: pytest.fail("auto loaded the CUDA libraries"))
    assert backends.get_backend("auto").name == "host"


def test_a_counted_gpu_is_visible(monkeypatch):
    simulated_driver(monkeypatch, devices=2)
    assert backends.no_gpu_reason() is None and backends.gpu_visible()


def fail_in_cuda_python(monkeypatch, error, at):
    """The driver counts a GPU, but cuda-python raises ``error`` at ``at`` (its import, or its first
    device call, as cuda-bindings 12.8 does without libcuda)."""
    simulated_driver(monkeypatch, devices=1)

    def raise_error(*_args):
        raise error

    monkeypatch.setattr(runtime, "load", raise_error if at == "import" else lambda: None)
    monkeypatch.setattr(runtime, "runtime_get_version", lambda: 12080)
    monkeypatch.setattr(context, "_load_libraries", lambda _major: None)
    monkeypatch.setattr(runtime, "get_device_count", raise_error)


CANNOT_START = 'the CUDA backend cannot start'
INSTALL = 'pip install -e ".[cuda13]" from the repository checkout'


@pytest.mark.parametrize(("error", "at", "said"), [
    (DLOPEN_FAILED, "device count", "no usable NVIDIA GPU: cudaGetDeviceCount failed with Failed to dlopen"),
    (DLOPEN_FAILED, "import", f"{CANNOT_START} (RuntimeError: Failed to dlopen libcuda.so.1)"),
    (OSError("libcudart.so: cannot open shared object file"), "import", f"{CANNOT_START} (OSError: libcudart.so"),
    (ImportError("cannot import name 'runtime' from 'cuda.bindings'"), "import", f"{CANNOT_START} (ImportError: "),
], ids=["RuntimeError at the device count", "RuntimeError at import", "OSError", "ImportError"])
def test_whatever_cuda_python_raises_reads_as_no_gpu(monkeypatch, caplog, error, at, said):
    fail_in_cuda_python(monkeypatch, error, at)
    assert backends.cuda_available() is False
    with caplog.at_level("INFO", logger="cudnnnet.backends"):
        assert backends.get_backend("auto").name == "host"
    assert "no usable GPU" in caplog.text and str(error) in caplog.text
    with pytest.raises(DeviceUnavailableError) as raised:
        backends.get_backend("cuda")
    message = str(raised.value)
    assert message.startswith(said) and "\n" not in message
    assert (INSTALL in message) == message.startswith(CANNOT_START)
