"""The gradient average between the GPUs of one host, without NCCL's collective kernels.

Each rank exports a mailbox (CUDA IPC); every other rank of the host maps it. After the backward pass
two of our kernels (``kernels/peer_reduce.cu``) run on the step's own stream, so a captured step
replays them: ``peer_push`` writes this rank's gradients into every peer's mailbox through the
mapping (NVLink or PCIe) and raises a flag there; ``peer_average`` waits for every peer's flag and
averages, in rank order, what arrived with this rank's own gradients, in place.

Why: a small network's step is short (the LeNet CNN's, batch 256: 355 µs on an H200). Overlapping
NCCL's all-reduce of its 1.7 MB of gradients with the backward pass, on a second stream, costs about
as much in gaps between the step's kernels as it hides; on the step's own stream the all-reduce takes
27 µs. The push and the average are two more kernels on that stream: 13.7 µs for the same 1.7 MB on
2 H200s (each captured, back to back).

Used (``wanted``) for float32 averaging (``train.grad_reduce: fp32``) where each GPU pushes at most
``PEER_PUSH_MAX_BYTES`` a step (its gradients to each of the others), every rank is willing
(``CUDNNNET_PEER_REDUCE`` is not ``0``), and every rank is on one host and maps every other's mailbox
(``connect``). Otherwise the ranks keep NCCL's buckets, overlapped with the backward pass: for more
bytes NCCL's ring (each GPU sends about twice its gradients whatever the number of GPUs) and the
overlap matter more than the latency. On 4 H200s, 6.9 MB of gradients took 75 µs to push and average
against NCCL's 50 µs; 1.7 MB took 26 µs against 25, and the CNN's step was shorter with the push.
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
from .kernel import blocks_for

log = logging.getLogger(__name__)

PEER_PUSH_MAX_BYTES = 8 << 20  # what each GPU may push a step: (ranks - 1) × the gradients' bytes
PEER_REDUCE_ENV = "CUDNNNET_PEER_REDUCE"  # 0: NCCL's buckets always
FLAG_BYTES = 256  # a mailbox's flags (one u64 per rank), before its inboxes; as in peer_reduce.cu
MAX_RANKS = FLAG_BYTES // 8
SLOTS = 2  # inboxes per source rank: a peer one step ahead writes the other one
STRIDE_FLOATS = 64  # each inbox starts 256-byte aligned
HANDLE_BYTES, DIGEST_BYTES = 64, 32
RECORD_BYTES = 128  # what each rank tells the others: its mailbox's IPC handle | host digest | willing
STATE_BYTES = 16  # PeerState: step (u64), pushed (u32), averaged (u32)


def wanted(world_size: int, gradient_bytes: int, grad_reduce: str) -> bool:
    """Whether the config asks for the mailboxes' average (the same answer on every rank)."""
    pushed = (world_size - 1) * gradient_bytes
    return 2 <= world_size <= MAX_RANKS and grad_reduce == "fp32" and 0 < pushed <= PEER_PUSH_MAX_BYTES


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


def mailbox_bytes(world_size: int, count: int) -> int:
    """flags, then SLOTS × world_size inboxes of ``inbox_stride(count)`` floats."""
    return FLAG_BYTES + SLOTS * world_size * inbox_stride(count) * FLOAT32_BYTES


class PeerReduce:
    """Rank ``rank`` of ``world_size``: ``mailboxes[q]`` is rank q's mailbox as mapped here (this rank's
    own at ``rank``), ``count`` floats averaged a step. ``mapped`` are the mappings to close at the end."""

    def __init__(self, context, rank: int, world_size: int, count: int, mailbox: DeviceBuffer,
                 mailboxes: list[int], mapped: tuple[int, ...] = ()):
        self.context, self.rank, self.world_size, self.count = context, rank, world_size, count
        self.stride = inbox_stride(count)
        self.mailbox, self.mapped = mailbox, list(mapped)
        self.state = DeviceBuffer.allocate(STATE_BYTES)
        self.table = DeviceBuffer.allocate(8 * world_size)  # mailboxes[R] as u64, what peer_push reads
        table = (ctypes.c_uint64 * world_size)(*mailboxes)
        stream = context.stream.handle
        runtime.memset_async(self.state.ptr, 0, STATE_BYTES, stream)
        runtime.memcpy_async(self.table.ptr, ctypes.addressof(table), 8 * world_size, runtime.MEMCPY_HOST_TO_DEVICE,
                             stream)
        context.stream.synchronize()

    def average(self, gradients: int, count: int) -> None:
        """g = (1/R)·Σ_ranks g over ``count`` floats at ``gradients`` (16-byte aligned), in place,
        queued on the context's stream: this rank's push, then the average once every peer's push is in."""
        self.push(gradients, count)
        self.combine(gradients, count)

    def push(self, gradients: int, count: int) -> None:
        """Queue peer_push: this rank's gradients into every peer's mailbox, then its flag there."""
        groups = self.world_size - 1  # of blocks, one streaming to each peer
        stream, blocks = self.context.stream.handle, -(-self._blocks(count) // groups) * groups
        # inbox_q[slot][r] = g_r  for every peer q;  flags_q[r] = s + 1
        self.context.kernel("peer_push").launch(blocks, stream, gradients, count, self.stride, self.table.ptr,
                                                self.rank, self.world_size, self.state.ptr)

    def combine(self, gradients: int, count: int) -> None:
        """Queue peer_average: once every peer's flag says its push is in, g = (1/R)·Σ_q g_q in place."""
        stream, blocks = self.context.stream.handle, self._blocks(count)
        # g_r = (1/R)·Σ_q g_q   once flags_r[q] = s + 1 for every peer q
        self.context.kernel("peer_average").launch(blocks, stream, gradients, count, self.stride, self.mailbox.ptr,
                                                   self.rank, self.world_size, 1.0 / self.world_size,
                                                   self.state.ptr)

    def _blocks(self, count: int) -> int:
        if count != self.count:
            raise ValueError(f"the mailboxes hold {self.count} gradients, not {count}")
        return blocks_for(-(-count // 4))  # a float4 a thread

    def close(self) -> None:
        """Unmap the peers' mailboxes and free this rank's (after the last step: nothing is queued)."""
        mapped, self.mapped = self.mapped, []
        for pointer in mapped:
            runtime.ipc_close_mem_handle(pointer)
        for buffer in (self.table, self.state, self.mailbox):
            buffer.free()


def connect(communicator, count: int, usable_here: bool = True) -> PeerReduce | None:
    """Every rank's mailbox mapped by every other (collective: every rank calls it once, in step), or
    None on every rank (logged why) where one is unwilling (``CUDNNNET_PEER_REDUCE=0``, or not
    ``usable_here``), the ranks span hosts, or a mapping fails."""
    context, rank, world_size = communicator.backend.context, communicator.rank, communicator.world_size
    mailbox = DeviceBuffer.allocate(mailbox_bytes(world_size, count))
    runtime.memset_async(mailbox.ptr, 0, FLAG_BYTES, context.stream.handle)
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
    log.info("gradients averaged through the peers' mapped memory (%d floats, %d ranks)", count, world_size)
    return PeerReduce(context, rank, world_size, count, mailbox, mailboxes, tuple(mapped))
