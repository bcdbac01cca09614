"""Backend selection: ``host`` (NumPy) and ``cuda`` (cuBLAS, cuDNN, NVRTC).

``get_backend("auto")`` returns the CUDA backend where a GPU and the CUDA libraries are usable and
the host backend otherwise; ``get_backend("cuda")`` raises DeviceUnavailableError instead of
falling back.
"""

from __future__ import annotations

import logging

from ..errors import DeviceError, DeviceUnavailableError, UsageError
from .base import Backend

log = logging.getLogger(__name__)

DEVICES = ("auto", "cuda", "host")
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
    try:
        from .cuda import CudaBackend
    except ImportError as error:
        raise DeviceUnavailableError(
            f"the CUDA backend cannot be imported ({error}); install the CUDA extras: "
            f"pip install 'cudnnnet[cuda13]' (or 'cudnnnet[cuda12]')"
        ) from None
    return CudaBackend()


def _auto() -> Backend:
    try:
        backend = get_backend("cuda")
    except DeviceError as error:
        log.info("device auto: no usable GPU (%s); running on the host", error)
        return get_backend("host")
    log.info("device auto: running on the GPU (%s)", backend.device_name)
    return backend


def cuda_available() -> bool:
    """True where the CUDA backend can be created (a GPU, the driver and the CUDA libraries)."""
    try:
        get_backend("cuda")
    except DeviceError:
        return False
    return True
