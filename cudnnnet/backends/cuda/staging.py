"""Staging batches from host memory to the compute stream through a second, copy stream.

Each slot is a page-locked host buffer and a device buffer of the same size. A batch goes

    NumPy fills ``pinned``  →  (copy stream) H2D into ``device``, record ``copied``
                            →  (compute stream) wait ``copied``, D2D into the batch tensors, record ``consumed``

so that the host's filling and the H2D copy of the next batch run while the GPU computes the
current step. Only two waits exist, each on one event: the host waits for a slot's last H2D copy
before overwriting its pinned memory, the copy stream waits for a slot's last D2D copy before
overwriting its device memory. Nothing synchronises the device.
"""

from __future__ import annotations

import ctypes
import logging

import numpy as np

from ...errors import OutOfMemoryError, ShapeError
from .bindings import runtime
from .buffer import FLOAT32_BYTES, DeviceBuffer
from .handles import Event, Owned, Stream, release_when_collected

log = logging.getLogger(__name__)


class PinnedBuffer(Owned):
    """``nbytes`` of page-locked host memory (cudaMallocHost), freed by cudaFreeHost when collected or
    closed. ``array()`` views it as flat float32 values; a view keeps the buffer alive."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int):
        try:
            pointer = runtime.malloc_host(nbytes)
        except OutOfMemoryError:
            raise OutOfMemoryError(f"cannot page-lock {nbytes / 2**20:,.1f} MiB of host memory to stage batches; "
                                   "try a smaller batch size") from None
        super().__init__(pointer, runtime.free_host)
        self.nbytes = int(nbytes)

    @property
    def ptr(self) -> int:
        return int(self.handle)

    def array(self) -> np.ndarray:
        """The memory as a flat float32 NumPy array (no copy)."""
        memory = (ctypes.c_float * (self.nbytes // FLOAT32_BYTES)).from_address(self.ptr)
        memory.owner = self  # the array's base is ``memory``: the pinned memory lives as long as a view
        return np.frombuffer(memory, np.float32)


class StagingSlot:
    """One batch in flight: its pinned host values, their device copy and the two events between them."""

    def __init__(self, values: int):
        nbytes = FLOAT32_BYTES * values
        self.pinned = PinnedBuffer(nbytes)
        self.host_values = self.pinned.array()  # (values,) float32, filled by NumPy
        self.device = DeviceBuffer.allocate(nbytes)  # (values,) float32, read by the compute stream
        self.copied = Event(timing=False)  # on the copy stream, after the H2D copy out of ``pinned``
        self.consumed = Event(timing=False)  # on the compute stream, after the D2D copies out of ``device``
        self.sending = False  # an H2D copy out of ``pinned`` may still be running

    def release(self) -> None:
        """Wait for the copies that touch this slot's memory (its two events only), then free it."""
        self.copied.synchronize()
        self.consumed.synchronize()
        for owned in (self.copied, self.consumed, self.pinned):
            owned.close()
        self.device.free()


class CudaStaging:
    """Slots of ``values`` float32 each between host batches and ``context.stream`` (the compute
    stream), copied on a non-blocking copy stream of their own."""

    def __init__(self, context, values: int, slots: int = 2):
        self.values = int(values)
        self.compute_stream = context.stream
        self.copy_stream = Stream()
        self.slots = [StagingSlot(self.values) for _ in range(slots)]
        self._finalizer = release_when_collected(self, _release, self.slots, self.copy_stream)
        log.debug("CUDA staging: %d slots of %d values (pinned and device) and a copy stream", slots, self.values)

    def host_values(self, slot: int) -> np.ndarray:
        """Slot ``slot``'s pinned values, (values,) float32, once its last H2D copy has read them (an
        event wait on the host; the device goes on)."""
        staging = self.slots[slot]
        if staging.sending:
            staging.copied.synchronize()
            staging.sending = False
        return staging.host_values

    def send(self, slot: int, count: int) -> None:
        """Copy the first ``count`` pinned values of ``slot`` to its device memory on the copy stream,
        after the compute stream has finished reading what that memory held."""
        _check_count(count, self.values)
        staging = self.slots[slot]
        runtime.stream_wait_event(self.copy_stream.handle, staging.consumed.handle)
        runtime.memcpy_async(staging.device.ptr, staging.pinned.ptr, FLOAT32_BYTES * count,
                             runtime.MEMCPY_HOST_TO_DEVICE, self.copy_stream.handle)
        staging.copied.record(self.copy_stream)
        staging.sending = True

    def deliver(self, slot: int, parts) -> None:
        """On the compute stream, once ``slot`` has arrived: copy its values from ``offset`` into each
        ``(tensor, offset)`` of ``parts`` (device to device), then mark the slot free to refill."""
        staging = self.slots[slot]
        for tensor, offset in parts:
            _check_count(offset + tensor.size, self.values)
        runtime.stream_wait_event(self.compute_stream.handle, staging.copied.handle)
        for tensor, offset in parts:
            runtime.memcpy_async(tensor.data.ptr, staging.device.ptr + FLOAT32_BYTES * offset, tensor.nbytes,
                                 runtime.MEMCPY_DEVICE_TO_DEVICE, self.compute_stream.handle)
        staging.consumed.record(self.compute_stream)

    def close(self) -> None:
        """Wait for the copies in flight, then free the slots and the copy stream (idempotent)."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive


def _release(slots: list[StagingSlot], copy_stream: Stream) -> None:
    for slot in slots:
        slot.release()
    copy_stream.close()


def _check_count(count: int, capacity: int) -> None:
    if not 0 <= count <= capacity:
        raise ShapeError(f"staging: {count} values do not fit in a slot of {capacity}")
