"""Work started on a thread now and collected later: the driver's start-up, cuBLAS's first GEMM and
the reading of the data set overlap the loading of the libraries and the building of the network.

This module imports only the standard library, so that a launcher can start the driver with it
before its heavy imports (NumPy, cuda-python).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

log = logging.getLogger(__name__)


class Background:
    """``function(*args)`` running on a daemon thread named ``name`` from now on.

    ``result()`` waits for it and returns its value or raises its exception in the caller's thread;
    ``join()`` only waits, for work whose failures are the function's own to handle (an exception it
    lets escape is logged, as an uncaught exception on a thread would be printed).
    """

    def __init__(self, name: str, function: Callable[..., Any], *args: Any):
        self.name = name
        self._outcome: tuple[bool, Any] | None = None  # (True, value) or (False, exception)
        self._thread = threading.Thread(target=self._run, args=(function, args), name=name, daemon=True)
        self._thread.start()

    def _run(self, function: Callable[..., Any], args: tuple) -> None:
        try:
            self._outcome = (True, function(*args))
        except BaseException as error:
            self._outcome = (False, error)

    def result(self) -> Any:
        self._thread.join()
        succeeded, value = self._outcome
        if not succeeded:
            raise value
        return value

    def join(self) -> None:
        self._thread.join()
        succeeded, value = self._outcome
        if not succeeded:
            log.warning("%s failed on its thread", self.name, exc_info=value)
