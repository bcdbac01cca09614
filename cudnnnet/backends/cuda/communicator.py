"""Tier 2 over the NCCL binding: a communicator of the ranks training together, its collectives
queued on the backend's one stream (so a captured CUDA graph of the step records them too).

NCCL is found by cuda.pathfinder like cuBLAS and cuDNN (``nvidia-nccl-cu12`` / ``-cu13`` wheels).
NVLink multicast (NVLS) is left off: ``NCCL_NVLS_ENABLE=0`` unless the environment says otherwise.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os

from ...errors import DistributedError, NcclError
from ...tensor import Tensor
from .bindings import nccl, runtime
from .bindings.loader import load_library
from .buffer import DeviceBuffer
from .handles import Event, Stream
from .kernel import BLOCK_SIZE, MAX_BLOCKS

log = logging.getLogger(__name__)


@functools.cache
def load_nccl(cuda_major: int | None = None) -> int:
    """Load libnccl once (DeviceUnavailableError naming the wheel if missing); returns its version code."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    nccl.load(load_library("nccl", cuda_major))
    version = nccl.get_version()
    log.info("NCCL %d.%d.%d", version // 10000, version // 100 % 100, version % 100)
    return version


def make_unique_id() -> bytes:
    """Rank 0's ncclUniqueId, to hand to every rank (needs no GPU)."""
    load_nccl()
    return nccl.get_unique_id()


class Communicator:
    """``world_size`` ranks on one GPU each; this process is ``rank``, on ``backend``'s device."""

    def __init__(self, backend, world_size: int, rank: int, unique_id: bytes):
        load_nccl(getattr(backend.context, "cuda_major", None))
        self.backend, self.world_size, self.rank = backend, world_size, rank
        self.stream = backend.context.stream.address  # the raw cudaStream_t
        self.comm: int | None = nccl.comm_init_rank(world_size, unique_id, rank)
        self.aborted_because: str | None = None  # why abort() ended the communicator
        self.side_stream = Stream()  # collectives overlapped with the backward pass (reduce_async)
        self._forked, self._joined = Event(timing=False), Event(timing=False)

    def all_reduce_average(self, tensor: Tensor) -> None:
        """tensor = (1/world_size)·Σ_ranks tensor, in place."""
        # x = Σ_r x_r / R
        nccl.all_reduce(tensor.data.ptr, tensor.data.ptr, tensor.size, nccl.FLOAT32, nccl.AVG, self._live(), self.stream)

    def all_reduce_sum_float64(self, pointer: int, count: int) -> None:
        """``count`` doubles at ``pointer`` = Σ_ranks of them, in place (synchronised BatchNorm's totals)."""
        # x = Σ_r x_r
        nccl.all_reduce(pointer, pointer, count, nccl.FLOAT64, nccl.SUM, self._live(), self.stream)

    def all_reduce_max(self, tensor: Tensor) -> None:
        """tensor = max over the ranks, element-wise, in place."""
        nccl.all_reduce(tensor.data.ptr, tensor.data.ptr, tensor.size, nccl.FLOAT32, nccl.MAX, self._live(), self.stream)

    def broadcast(self, tensor: Tensor, root: int = 0) -> None:
        """Every rank's ``tensor`` takes rank ``root``'s values."""
        nccl.broadcast(tensor.data.ptr, tensor.data.ptr, tensor.size, nccl.FLOAT32, root, self._live(), self.stream)

    def all_gather_bytes(self, record: bytes) -> list[bytes]:
        """Every rank's ``record`` (as long on every rank), in rank order; a synchronisation."""
        size, stream = len(record), self.backend.context.stream
        staging = DeviceBuffer.allocate(size * (self.world_size + 1))
        mine, gathered = ctypes.create_string_buffer(record, size), ctypes.create_string_buffer(size * self.world_size)
        try:
            runtime.memcpy_async(staging.ptr, ctypes.addressof(mine), size, runtime.MEMCPY_HOST_TO_DEVICE,
                                 stream.handle)
            nccl.all_gather(staging.ptr, staging.ptr + size, size, nccl.UINT8, self._live(), stream.address)
            runtime.memcpy_async(ctypes.addressof(gathered), staging.ptr + size, size * self.world_size,
                                 runtime.MEMCPY_DEVICE_TO_HOST, stream.handle)
            stream.synchronize()
        finally:
            staging.free()
        return [gathered.raw[rank * size:(rank + 1) * size] for rank in range(self.world_size)]

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank; a synchronisation."""
        return any(record[0] for record in self.all_gather_bytes(bytes([bool(flag)])))

    def reduce_async(self, pointer: int, count: int, staging: int | None = None) -> None:
        """x = (1/world_size)·Σ_ranks x over ``count`` floats at ``pointer``, in place, on the side
        stream, once everything queued so far on the backend's stream is done; ``join`` waits for it.
        With ``staging`` (room for ``count`` bfloat16) the average is taken in bfloat16 (``average``)."""
        main = self.backend.context.stream
        self._forked.record(main)
        runtime.stream_wait_event(self.side_stream.handle, self._forked.handle)
        # x = Σ_r x_r / R   (on the side stream, overlapping what the backend's stream does next)
        self.average(pointer, count, staging, self.side_stream)

    def average(self, pointer: int, count: int, staging: int | None = None, stream: Stream | None = None) -> None:
        """x = (1/world_size)·Σ_ranks x over ``count`` floats at ``pointer``, in place, queued on ``stream``
        (the backend's by default): in float32, or with ``staging`` rounded to bfloat16 there, averaged
        in bfloat16 (ncclBfloat16, half the bytes) and widened back into x."""
        stream = stream or self.backend.context.stream
        if staging is None:
            nccl.all_reduce(pointer, pointer, count, nccl.FLOAT32, nccl.AVG, self._live(), stream.address)
            return
        blocks, kernel = min(MAX_BLOCKS, -(-count // BLOCK_SIZE)), self.backend.context.kernel
        # s = bf16(x)
        kernel("to_bf16").launch(blocks, stream.handle, staging, pointer, count)
        # s = Σ_r s_r / R   in bfloat16
        nccl.all_reduce(staging, staging, count, nccl.BFLOAT16, nccl.AVG, self._live(), stream.address)
        # x = float(s)
        kernel("bf16_to_float").launch(blocks, stream.handle, pointer, staging, 1.0, 0.0, count)

    def join(self) -> None:
        """The backend's stream waits for every collective queued by ``reduce_async``."""
        self._joined.record(self.side_stream)
        runtime.stream_wait_event(self.backend.context.stream.handle, self._joined.handle)

    def _live(self) -> int:
        """The communicator's handle; DistributedError saying why where it was aborted or closed."""
        if self.comm is None:
            raise DistributedError(self.aborted_because or f"rank {self.rank}: the NCCL communicator is closed")
        return self.comm

    def check(self) -> None:
        """NcclError where the communicator met an asynchronous error (a lost peer, a network failure)."""
        if self.comm is None:
            return
        state = nccl.comm_get_async_error(self.comm)
        if state not in (nccl.SUCCESS, nccl.IN_PROGRESS):
            raise NcclError("ncclCommGetAsyncError", state, nccl.result_name(state), "the communicator failed")

    def abort(self, reason: str) -> None:
        """Stop every queued collective (they return instead of waiting for a lost peer) and free the
        communicator; a collective asked for afterwards raises DistributedError with ``reason``."""
        self.aborted_because = reason
        comm, self.comm = self.comm, None
        if comm is not None:
            nccl.comm_abort(comm)

    def close(self) -> None:
        """Free the communicator once every rank is done with it, in NCCL's order: ncclCommFinalize
        (completes what is queued), then ncclCommDestroy. Destroy the CUDA graphs that captured its
        collectives first: NCCL waits for them."""
        comm, self.comm = self.comm, None
        if comm is not None:
            nccl.comm_finalize(comm)
            nccl.comm_destroy(comm)
