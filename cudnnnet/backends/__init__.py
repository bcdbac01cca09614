"""Backend selection: ``host`` (NumPy) and ``cuda`` (cuBLAS, cuDNN, NVRTC).

``get_backend("auto")`` returns the CUDA backend where a GPU and the CUDA libraries are usable and
the host backend otherwise; ``get_backend("cuda")`` raises DeviceUnavailableError instead of
falling back. ``auto`` first asks the driver whether it sees a GPU (``no_gpu_reason``: libcuda through
ctypes), so a machine without one loads neither cuda-python nor cuBLAS and cuDNN. Where a command
has already begun the driver's start on a thread (``warm_up``), ``auto`` only checks that libcuda
loads, and the libraries load while the driver starts, as for ``cuda``; a GPU missing behind a
driver is then found when the context is made, and ``auto`` still falls back. Whatever a missing or
broken driver raises (an OSError, cuda-python's RuntimeError "Failed to dlopen libcuda.so.1", an
ImportError) reads as "no GPU".
"""

from __future__ import annotations

import logging

from .. import backend_lookup
from ..errors import DeviceError, DeviceUnavailableError, UsageError
from .base import Backend

log = logging.getLogger(__name__)

DEVICES = ("auto", "cuda", "host")
# What a missing or unusable driver or library raises on the way up, besides our own DeviceError:
# cuda-python 12.x raises RuntimeError("Failed to dlopen libcuda.so.1"), ctypes OSError.
NO_DEVICE_ERRORS = (ImportError, OSError, RuntimeError)
_instances: dict[str, Backend] = {}


def get_backend(name: "str | Backend | None" = "host") -> Backend:
    """The backend called ``name`` (one instance per process), or ``name`` itself if a Backend."""
    if isinstance(name, Backend):
        return name
    name = "host" if name is None else name
    if name not in DEVICES:
        raise UsageError(f"unknown device {name!r}; valid devices are {', '.join(DEVICES)}")
    if name == "auto":
        return _auto()
    if name not in _instances:
        _instances[name] = _create(name)
    return _instances[name]


backend_lookup.register(get_backend)


def warm_up(name: "str | Backend | None") -> None:
    """Start the CUDA driver on a thread where ``name`` may run on the GPU ("cuda", "auto") and no
    CUDA backend exists yet, so that the caller's work until ``get_backend(name)`` (reading the
    data, say) overlaps its ~0.2–0.3 s start-up; the backend then warms cuBLAS up on a thread too,
    while the caller builds its network (``context.CublasWarmUp``). Does nothing for the host;
    never raises (any failure is get_backend's to report)."""
    if name not in ("cuda", "auto") or "cuda" in _instances:
        return
    try:
        from .cuda.startup import start_driver
    except ImportError:
        return
    start_driver()


def _create(name: str) -> Backend:
    if name == "host":
        from .host import HostBackend

        return HostBackend()
    reason = no_gpu_reason(count_devices=False)  # no driver: said before any CUDA library loads (and logs)
    if reason is not None:
        raise DeviceUnavailableError(f"no GPU ({reason})")
    try:
        from .cuda import CudaBackend

        return CudaBackend()
    except NO_DEVICE_ERRORS as error:
        from .cuda.bindings.loader import install_hint

        raise DeviceUnavailableError(
            f"the CUDA backend cannot start ({type(error).__name__}: {_first_line(error)}); is the NVIDIA "
            f"driver installed? The CUDA libraries: {install_hint()}"
        ) from error


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no message"


def no_gpu_reason(count_devices: bool = True) -> str | None:
    """Why the NVIDIA driver sees no GPU (no libcuda.so.1, cuInit failing, no device), or None where
    it counts at least one. Through libcuda with ctypes: no CUDA library is loaded to find out.
    ``count_devices=False`` only checks that libcuda.so.1 loads (milliseconds; cuInit takes ~0.2 s
    where there is a GPU)."""
    try:
        from .cuda.bindings import driver_start

        driver_start.load()
        if not count_devices:
            return None
        driver_start.init()
        count = driver_start.device_count()
    except (DeviceError, *NO_DEVICE_ERRORS) as error:
        return _first_line(error)
    return None if count > 0 else "the NVIDIA driver counts no GPU"


def _driver_starting() -> bool:
    """True where ``warm_up`` began the driver's start on a thread that no context has taken yet."""
    try:
        from .cuda.startup import early_start_pending
    except ImportError:
        return False
    return early_start_pending()


def gpu_visible() -> bool:
    """True where the NVIDIA driver loads and counts at least one GPU (``no_gpu_reason``)."""
    return no_gpu_reason() is None


def _auto() -> Backend:
    if "cuda" not in _instances:
        reason = no_gpu_reason(count_devices=not _driver_starting())
        if reason is not None:  # a machine without a GPU is no fault: why, only for those who ask (DEBUG)
            log.info("device auto: no GPU found; running on the host")
            log.debug("device auto: no GPU: %s", reason)
            return get_backend("host")
    try:
        backend = get_backend("cuda")
    except DeviceError as error:
        log.info("device auto: no usable GPU (%s); running on the host", error)
        return get_backend("host")
    log.info("device auto: running on the GPU (%s)", backend.device_name)
    return backend


def cuda_available() -> bool:
    """True where the CUDA backend can be created (a GPU, the driver and the CUDA libraries); a
    machine without a GPU answers False before any CUDA library is loaded."""
    if "cuda" not in _instances and not gpu_visible():
        return False
    try:
        get_backend("cuda")
    except DeviceError:
        return False
    return True
