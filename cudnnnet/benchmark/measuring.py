"""Timing calls and epochs, and sampling the device memory a workload takes."""

from __future__ import annotations

import statistics
import time

from .settings import MIB


def median_ms(seconds: list[float]) -> float:
    return 1000.0 * statistics.median(seconds)


def timed_calls(call, repeat: int, synchronize, warmup: int, warmup_seconds: float = 0.0) -> list[float]:
    """Seconds of each of ``repeat`` calls after ``warmup`` untimed ones, and more until ``warmup_seconds``
    have passed (a GPU's clock settles under a steady load), each synchronised."""
    warm_up(call, synchronize, warmup, warmup_seconds)
    return [_timed_call(call, synchronize) for _ in range(repeat)]


def warm_up(call, synchronize, count: int, seconds: float = 0.0) -> int:
    """``count`` untimed calls, then more (each synchronised) until ``seconds`` have passed since the
    first: how many calls were made."""
    started = time.perf_counter()
    for _ in range(count):
        call()
    synchronize()
    while time.perf_counter() - started < seconds:
        call()
        synchronize()
        count += 1
    return count


def steady_state(call, synchronize, seconds: float, replays: int) -> dict:
    """The step at steady state: ``call`` made untimed for ``seconds``, then ``replays`` timed calls, each
    synchronised; step_ms is the median of the last half of them (``steady_last``), where the GPU's
    clock has settled under the load."""
    warmup_replays = warm_up(call, synchronize, 0, seconds)
    times = [_timed_call(call, synchronize) for _ in range(replays)]
    last = steady_last(replays)
    return {"step_ms": median_ms(times[-last:]), "step_ms_all": [1000.0 * s for s in times],
            "warmup_seconds": seconds, "warmup_replays": warmup_replays, "median_of_last": last}


def steady_last(replays: int) -> int:
    """How many of ``replays`` timed replays the steady-state median is taken over: the last half."""
    return max(1, replays // 2)


def _timed_call(call, synchronize) -> float:
    started = time.perf_counter()
    call()
    synchronize()
    return time.perf_counter() - started


def epoch_summary(seconds: list[float], images: int) -> dict:
    return {"epoch_ms": median_ms(seconds), "epoch_ms_all": [1000.0 * s for s in seconds],
            "images_per_second": images / statistics.median(seconds)}


def step_summary(seconds: list[float]) -> dict:
    return {"step_ms": median_ms(seconds), "step_ms_all": [1000.0 * s for s in seconds]}


class DeviceMemory:
    """Peak device memory in use above a baseline: used = total − free (cudaMemGetInfo)."""

    def __init__(self, backend):
        self.backend = backend
        self.memory_info = getattr(backend, "memory_info", None)
        self.baseline = self.peak = self._used()

    def _used(self) -> int | None:
        if self.memory_info is None:
            return None
        self.backend.synchronize()
        free, total = self.memory_info()
        return total - free

    def sample(self) -> None:
        used = self._used()
        if used is not None:
            self.peak = max(self.peak, used)

    @property
    def peak_mib(self) -> float | None:
        return None if self.baseline is None else (self.peak - self.baseline) / MIB
