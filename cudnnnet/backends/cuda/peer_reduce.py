"""The gradient average between the GPUs of one host, without NCCL's collective kernels.

Each rank exports a mailbox (CUDA IPC); every other rank of the host maps it. Each rank's gradients
reach every peer's mailbox in one of two ways (``kernels/peer_reduce.cu``), then ``peer_average``
waits for every peer's flag and averages, in rank order, what arrived with this rank's own
gradients, in place, on the step's own stream (so a captured step replays it all):

- **push** (``PUSH``, small gradients): after the backward pass ``peer_push`` writes this rank's
  gradients into every peer's mailbox through the mapping (NVLink or PCIe) and raises a flag there.
  Why: a small network's step is short (the LeNet CNN's, batch 256: 355 µs on an H200). Overlapping
  NCCL's all-reduce of its 1.7 MB of gradients with the backward pass, on a second stream, costs about
  as much in gaps between the step's kernels as it hides; on the step's own stream the all-reduce
  takes 27 µs. The push and the average are two more kernels on that stream: 13.7 µs for the same
  1.7 MB on 2 H200s (each captured, back to back).
- **copies** (``COPY``, large gradients on 2 GPUs): as soon as the backward pass has written a bucket
  of them (or a block of a large weight gradient, ``layers.dense``), ``cudaMemcpyAsync`` copies it
  into the peer's mailbox on a side stream: the copy engines move it while the SMs go on with the
  backward pass, where NCCL's kernels would take SMs from its GEMMs. After each copy ``peer_signal``
  tells the peer how many floats have arrived this step. After the backward pass ``peer_average``
  averages each copied range once the peer's count covers it, so the ranges copied early are averaged
  while the last one is still crossing; where the optimiser is SGD in the fast engine (``apply_sgd``)
  each average is its step, W and v updated where the average would be stored. A copy's address is
  fixed in a captured step, so the mailbox has one inbox per peer and a rank's first copy of a step
  waits (``peer_wait_acks``) until the peer has averaged the step before. Why: the micro step's first
  layer writes its 200 MB weight gradient last, so NCCL's all-reduce of it cannot overlap the backward
  pass. On 2 H200s (fast engine, float32, 100 replays of the captured step, median, one machine): two
  GPUs exchanging nothing 22.85 ms, NCCL's buckets 23.90 ms, the copies 23.59 ms (one GPU: 44.81 ms);
  a 183 MB copy beside that layer's GEMM cost 0.09 ms. After the last GEMM (PyTorch's profiler) the
  last block's copy, the whole average and the SGD step took 0.15 + 0.16 + 0.19 ms (0.53 ms in all);
  with the ranges averaged as they arrive and the step in the average, 0.32 ms (another pair), and
  23.14 / 23.24 ms a step against 23.32 / 23.46 ms (alternate runs on that pair). On 4 H200s each GPU
  would copy its gradients to 3 peers: 15.4 ms against NCCL's 12.9 ms, so 3 or more GPUs keep NCCL.

Used (``wanted``) for float32 averaging (``train.grad_reduce: fp32``) where every rank is willing
(``CUDNNNET_PEER_REDUCE`` is not ``0``) and on one host and maps every other's mailbox (``connect``):
the copies where 2 GPUs' gradients take at least ``COPY_MIN_BYTES`` each, the push where each GPU
pushes at most ``PEER_PUSH_MAX_BYTES`` a step (its gradients to each of the others). Otherwise the
ranks keep NCCL's buckets, overlapped with the backward pass: there NCCL's ring (each GPU sends about
twice its gradients whatever the number of GPUs) and the overlap matter more than the latency. On 4
H200s, 6.9 MB of gradients took 75 µs to push and average against NCCL's 50 µs; 1.7 MB took 26 µs
against 25, and the CNN's step was shorter with the push.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import socket
from pathlib import Path

from ...errors import CudaError
from .bindings import runtime
from .buffer import FLOAT32_BYTES, DeviceBuffer
from .handles import Event, Stream
from .kernel import blocks_for

log = logging.getLogger(__name__)

PUSH, COPY = "push", "copy"  # how the gradients reach the peers' mailboxes
PEER_PUSH_MAX_BYTES = 8 << 20  # what each GPU may push a step: (ranks - 1) × the gradients' bytes
COPY_MIN_BYTES = 32 << 20  # the gradients from which 2 GPUs' copy engines move them
PEER_REDUCE_ENV = "CUDNNNET_PEER_REDUCE"  # 0: NCCL's buckets always
FLAG_BYTES = 256  # a mailbox's flags (one u64 per rank), then as many acks; as in peer_reduce.cu
HEADER_BYTES = 2 * FLAG_BYTES  # the flags and the acks, before the inboxes
MAX_RANKS = FLAG_BYTES // 8
SLOTS = {PUSH: 2, COPY: 1}  # inboxes per source rank: a pushing peer one step ahead writes the other one
STRIDE_FLOATS = 64  # each inbox starts 256-byte aligned
HANDLE_BYTES, DIGEST_BYTES = 64, 32
RECORD_BYTES = 128  # what each rank tells the others: its mailbox's IPC handle | host digest | willing
STATE_BYTES = 16  # PeerState: step (u64), pushed (u32), averaged (u32)


def wanted(world_size: int, gradient_bytes: int, grad_reduce: str) -> str | None:
    """How the config asks the mailboxes to be filled (``COPY`` or ``PUSH``), or None for NCCL's buckets
    (the same answer on every rank)."""
    if not (2 <= world_size <= MAX_RANKS and grad_reduce == "fp32" and gradient_bytes > 0):
        return None
    if world_size == 2 and gradient_bytes >= COPY_MIN_BYTES:
        return COPY
    return PUSH if (world_size - 1) * gradient_bytes <= PEER_PUSH_MAX_BYTES else None


def willing() -> bool:
    """This rank's environment allows it (``CUDNNNET_PEER_REDUCE=0`` keeps NCCL's buckets)."""
    return os.environ.get(PEER_REDUCE_ENV, "1").strip() != "0"


def host_digest() -> bytes:
    """Names this host (its name and boot id): ranks with equal digests share a machine."""
    boot = Path("/proc/sys/kernel/random/boot_id")
    boot_id = boot.read_text().strip() if boot.exists() else ""
    return hashlib.sha256(f"{socket.gethostname()}\n{boot_id}".encode()).digest()


def encode_record(handle: bytes, digest: bytes, is_willing: bool) -> bytes:
    """RECORD_BYTES: the mailbox's IPC handle, the host digest, whether this rank is willing."""
    record = handle.ljust(HANDLE_BYTES, b"\0")[:HANDLE_BYTES] + digest[:DIGEST_BYTES] + bytes([is_willing])
    return record.ljust(RECORD_BYTES, b"\0")


def decode_record(record: bytes) -> tuple[bytes, bytes, bool]:
    """(handle, host digest, willing) of ``encode_record``."""
    return (record[:HANDLE_BYTES], record[HANDLE_BYTES:HANDLE_BYTES + DIGEST_BYTES],
            bool(record[HANDLE_BYTES + DIGEST_BYTES]))


def why_not_usable(records: list[bytes]) -> str | None:
    """None where every rank is willing and on one host; else the reason, for the log."""
    decoded = [decode_record(record) for record in records]
    unwilling = [rank for rank, (_, _, is_willing) in enumerate(decoded) if not is_willing]
    if unwilling:
        return f"rank {unwilling[0]} declined ({PEER_REDUCE_ENV}=0, or its gradients are not 16-byte aligned)"
    if len({digest for _, digest, _ in decoded}) > 1:
        return "the ranks are on more than one host"
    return None


def inbox_stride(count: int) -> int:
    """Floats from one inbox to the next: ``count`` rounded up to 256 bytes."""
    return -(-count // STRIDE_FLOATS) * STRIDE_FLOATS


def mailbox_bytes(world_size: int, count: int, mode: str = PUSH) -> int:
    """flags and acks, then SLOTS[mode] × world_size inboxes of ``inbox_stride(count)`` floats."""
    return HEADER_BYTES + SLOTS[mode] * world_size * inbox_stride(count) * FLOAT32_BYTES


class _SgdStep(ctypes.Structure):
    """peer_reduce.cu's SgdStep: W, v (0: none) and the rate's device addresses, momentum, weight decay."""
    _fields_ = [("values", ctypes.c_uint64), ("velocity", ctypes.c_uint64), ("lr", ctypes.c_uint64),
                ("momentum", ctypes.c_float), ("weight_decay", ctypes.c_float)]


class PeerReduce:
    """Rank ``rank`` of ``world_size``: ``mailboxes[q]`` is rank q's mailbox as mapped here (this rank's
    own at ``rank``), ``count`` floats averaged a step, filled by ``mode`` (``PUSH`` or ``COPY``).
    ``mapped`` are the mappings to close at the end."""

    def __init__(self, context, rank: int, world_size: int, count: int, mailbox: DeviceBuffer,
                 mailboxes: list[int], mapped: tuple[int, ...] = (), mode: str = PUSH):
        self.context, self.rank, self.world_size, self.count = context, rank, world_size, count
        self.stride, self.mode, self.slots = inbox_stride(count), mode, SLOTS[mode]
        self.mailbox, self.mailboxes, self.mapped = mailbox, list(mailboxes), list(mapped)
        self.side_stream = Stream() if mode == COPY else None  # the copies, beside the backward pass
        self._forked = Event(timing=False) if mode == COPY else None
        self._copy_events: list[Event] = []  # the k-th recorded after the step's k-th copy (reused each step)
        self._ranges: list[tuple[int, int]] = []  # (offset, count) of each copy this step, in order
        self._copied = 0  # floats copied to the peers so far this step
        self.period = count + 1  # a step's span of the copies' flags: s·period + floats copied
        self.sgd: DeviceBuffer | None = None  # an SgdStep the average applies instead of storing it (apply_sgd)
        self.state = DeviceBuffer.allocate(STATE_BYTES)
        self.table = DeviceBuffer.allocate(8 * world_size)  # mailboxes[R] as u64, what peer_push reads
        table = (ctypes.c_uint64 * world_size)(*mailboxes)
        stream = context.stream.handle
        runtime.memset_async(self.state.ptr, 0, STATE_BYTES, stream)
        runtime.memcpy_async(self.table.ptr, ctypes.addressof(table), 8 * world_size, runtime.MEMCPY_HOST_TO_DEVICE,
                             stream)
        context.stream.synchronize()

    def apply_sgd(self, values: int, velocity: int, lr: int, momentum: float, weight_decay: float) -> None:
        """From now on each average is the optimiser's SGD step, not stored: W = W − lr·(ā + wd·W) (through
        v = m·v + … where ``velocity`` is not 0) for W and v packed as the gradients, ``lr`` a device
        scalar; the gradients keep this rank's own values."""
        step = _SgdStep(values, velocity, lr, momentum, weight_decay)
        self.sgd = DeviceBuffer.allocate(ctypes.sizeof(step))
        runtime.memcpy_async(self.sgd.ptr, ctypes.addressof(step), ctypes.sizeof(step), runtime.MEMCPY_HOST_TO_DEVICE,
                             self.context.stream.handle)
        self.context.stream.synchronize()

    @property
    def copies(self) -> bool:
        """Whether the gradients reach the peers by ``copy`` as the backward pass writes them."""
        return self.mode == COPY

    def average(self, gradients: int, count: int) -> None:
        """g = (1/R)·Σ_ranks g over ``count`` floats at ``gradients`` (16-byte aligned), in place,
        queued on the context's stream: this rank's push, then the average once every peer's gradients
        are in; or, after the copies, each copied range averaged once it is in (``average_copies``)."""
        if self.copies:
            self.average_copies(gradients, count)
        else:
            self.push(gradients, count)
            self.combine(gradients, count)

    def copy(self, gradients: int, offset: int, count: int) -> None:
        """Queue copies of floats [offset, offset + count) of this rank's gradients into every peer's
        inbox, on the side stream once what the step's stream has queued so far is done, then this
        rank's count of floats copied this step at every peer; the step's first copy first waits for
        every peer's ack of the step before."""
        side = self.side_stream.handle
        self._forked.record(self.context.stream)
        runtime.stream_wait_event(side, self._forked.handle)
        if not self._ranges:
            # wait until acks_r[q] >= s for every peer q
            self.context.kernel("peer_wait_acks").launch(1, side, self.table.ptr, self.rank, self.world_size,
                                                         self.state.ptr)
        for peer, mailbox in enumerate(self.mailboxes):
            if peer != self.rank:
                # inbox_q[0][r][offset : offset + count] = g_r[offset : offset + count]
                runtime.memcpy_async(self._inbox(mailbox) + FLOAT32_BYTES * offset, gradients + FLOAT32_BYTES * offset,
                                     FLOAT32_BYTES * count, runtime.MEMCPY_DEVICE_TO_DEVICE, side)
        self._copied += count
        # flags_q[r] = s·(n + 1) + floats copied so far, for every peer q
        self.context.kernel("peer_signal").launch(1, side, self.table.ptr, self.rank, self.world_size, self.state.ptr,
                                                  self.period, self._copied)
        self._copy_event(len(self._ranges)).record(self.side_stream)
        self._ranges.append((offset, count))

    def average_copies(self, gradients: int, count: int) -> None:
        """After the step's copies (all ``count`` floats now if none was queued): each copied range
        averaged in place, in the order of the copies, on the step's stream once this rank's copy of it
        is done (its event) and every peer has copied as many floats as end with it. The ranges copied
        during the backward pass are averaged while the last one is still on its way; the last range's
        average joins the side stream and ends the step."""
        self._blocks(count)
        if not self._ranges:
            self.copy(gradients, 0, count)
        elif self._copied != count:
            raise ValueError(f"{self._copied} of {count} gradients were copied to the peers this step")
        ranges, self._ranges, self._copied = self._ranges, [], 0
        copied = 0
        for index, (offset, size) in enumerate(ranges):
            copied += size
            runtime.stream_wait_event(self.context.stream.handle, self._copy_events[index].handle)
            # g_r[range] = (1/R)·Σ_q g_q[range]   once flags_r[q] >= s·(n + 1) + copied for every peer q
            self._average_range(gradients, offset, size, copied, finish=index == len(ranges) - 1)

    def _copy_event(self, index: int) -> Event:
        while len(self._copy_events) <= index:
            self._copy_events.append(Event(timing=False))
        return self._copy_events[index]

    def _inbox(self, mailbox: int) -> int:
        """The address of this rank's inbox in ``mailbox`` (slot 0)."""
        return mailbox + HEADER_BYTES + self.rank * self.stride * FLOAT32_BYTES

    def push(self, gradients: int, count: int) -> None:
        """Queue peer_push: this rank's gradients into every peer's mailbox, then its flag there."""
        groups = self.world_size - 1  # of blocks, one streaming to each peer
        stream, blocks = self.context.stream.handle, -(-self._blocks(count) // groups) * groups
        # inbox_q[slot][r] = g_r  for every peer q;  flags_q[r] = s + 1
        self.context.kernel("peer_push").launch(blocks, stream, gradients, count, self.stride, self.table.ptr,
                                                self.rank, self.world_size, self.state.ptr)

    def combine(self, gradients: int, count: int) -> None:
        """Queue peer_average: once every peer's flag says its push is in, g = (1/R)·Σ_q g_q in place."""
        self._blocks(count)
        # g_r = (1/R)·Σ_q g_q   once flags_r[q] >= s·1 + 1 for every peer q
        self._average_range(gradients, 0, count, 1, finish=True, period=1)

    def _average_range(self, gradients: int, offset: int, count: int, part: int, finish: bool,
                       period: int | None = None) -> None:
        """Queue peer_average of floats [offset, offset + count) once every peer's flag reaches
        s·period + part (period: ``self.period``); ``finish``: the step's last, which counts the step
        and acks the inbox."""
        blocks = blocks_for(-(-count // 4))  # a float4 a thread
        self.context.kernel("peer_average").launch(blocks, self.context.stream.handle, gradients, offset, count,
                                                   self.stride, self.table.ptr, self.rank, self.world_size, self.slots,
                                                   1.0 / self.world_size, self.state.ptr,
                                                   self.period if period is None else period, part, int(finish),
                                                   0 if self.sgd is None else self.sgd.ptr)

    def _blocks(self, count: int) -> int:
        if count != self.count:
            raise ValueError(f"the mailboxes hold {self.count} gradients, not {count}")
        return blocks_for(-(-count // 4))  # a float4 a thread

    def close(self) -> None:
        """Unmap the peers' mailboxes and free this rank's (after the last step: nothing is queued)."""
        mapped, self.mapped = self.mapped, []
        for pointer in mapped:
            runtime.ipc_close_mem_handle(pointer)
        for buffer in (self.table, self.state, self.mailbox, self.sgd):
            if buffer is not None:
                buffer.free()
        for handle in (self.side_stream, self._forked, *self._copy_events):
            if handle is not None:
                handle.close()


def connect(communicator, count: int, usable_here: bool = True, mode: str = PUSH) -> PeerReduce | None:
    """Every rank's mailbox mapped by every other (collective: every rank calls it once, in step), or
    None on every rank (logged why) where one is unwilling (``CUDNNNET_PEER_REDUCE=0``, or not
    ``usable_here``), the ranks span hosts, or a mapping fails."""
    context, rank, world_size = communicator.backend.context, communicator.rank, communicator.world_size
    mailbox = DeviceBuffer.allocate(mailbox_bytes(world_size, count, mode))
    runtime.memset_async(mailbox.ptr, 0, HEADER_BYTES, context.stream.handle)
    context.stream.synchronize()
    record = encode_record(runtime.ipc_get_mem_handle(mailbox.ptr), host_digest(), willing() and usable_here)
    records = communicator.all_gather_bytes(record)
    reason = why_not_usable(records)
    if reason is not None:
        log.info("gradients averaged by NCCL: %s", reason)
        mailbox.free()
        return None
    mailboxes, mapped, failure = [], [], None
    for peer, peer_record in enumerate(records):
        if peer == rank:
            mailboxes.append(mailbox.ptr)
            continue
        try:
            pointer = runtime.ipc_open_mem_handle(decode_record(peer_record)[0])
        except CudaError as error:
            failure, pointer = f"rank {rank} cannot map rank {peer}'s memory ({error})", 0
        mailboxes.append(pointer)
        mapped += [pointer] if pointer else []
    if communicator.any_rank(failure is not None):
        log.info("gradients averaged by NCCL: %s", failure or "another rank could not map the mailboxes")
        for pointer in mapped:
            runtime.ipc_close_mem_handle(pointer)
        mailbox.free()
        return None
    log.info("gradients averaged through the peers' mapped memory (%d floats, %d ranks, %s)", count, world_size,
             "copied during the backward pass" if mode == COPY else "pushed after the backward pass")
    return PeerReduce(context, rank, world_size, count, mailbox, mailboxes, tuple(mapped), mode)
