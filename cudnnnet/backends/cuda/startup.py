"""CUDA's start-up begun early, on a thread: what ``backends.warm_up`` starts before the caller
imports the rest of the package, reads its data and loads the libraries.

This module imports nothing beyond the standard library, ``background`` and ``bindings.driver_start``
(ctypes on libcuda), so a command-line tool can call ``start_driver`` before its heavy imports (NumPy,
cuda-python): the driver's ~0.2–0.3 s start-up then overlaps them.
"""

from __future__ import annotations

import logging

from ...errors import DeviceError
from ...util.background import Background
from .bindings import driver_start

log = logging.getLogger(__name__)

_early_start: "DriverStart | None" = None  # started by start_driver, taken by the next open_libraries


def start_driver(device: int = 0) -> None:
    """Begin ``DriverStart`` now, for a CudaContext made later in the process (``backends.warm_up``):
    the caller's work until then overlaps the driver's start-up, and that context warms cuBLAS up
    (``CublasWarmUp``). Never raises, and imports nothing: whatever is missing, the context reports
    when made."""
    global _early_start
    if _early_start is None:
        _early_start = DriverStart(device)


def take_driver_start(device: int) -> "DriverStart | None":
    """The early DriverStart for ``device``, if one was begun (each is taken once)."""
    global _early_start
    start, _early_start = _early_start, None
    if start is not None and start.device != device:
        start.join()
        return None
    return start


class DriverStart:
    """cuInit and, for a valid ``device``, its primary context (cuDevicePrimaryCtxRetain) on a daemon
    thread, to overlap them with other work. Through libcuda directly (``bindings.driver_start``), so
    the thread starts at once instead of after cuda-python's import; the runtime then finds the
    primary context made.

    It only warms up: whatever fails here is left for the caller's own CUDA calls to raise, and the
    calling thread still sets its device itself (the current device is per thread).
    """

    def __init__(self, device: int):
        self.device = device
        self._work = Background("cudnnnet-cuda-start", self._run)

    def _run(self) -> None:
        try:
            driver_start.load()
            driver_start.init()
            if 0 <= self.device < driver_start.device_count():
                driver_start.retain_primary_context(self.device)
        except DeviceError as error:
            log.debug("CUDA start-up on a thread: %s (left to the caller to raise)", error)

    def join(self) -> None:
        self._work.join()


def early_start_pending() -> bool:
    """True where ``start_driver`` began a start that no context has taken yet."""
    return _early_start is not None
