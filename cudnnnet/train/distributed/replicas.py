"""Data-parallel training over several processes, one GPU each, joined by NCCL.

- ``from_environment``: this process's place (rank, world size, local rank, rank 0's address) as
  the launchers publish it: torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), Open
  MPI (OMPI_COMM_WORLD_*), MPICH / Intel MPI (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID) and Slurm
  (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID); ``cudnnnet-train --gpus N`` sets torchrun's.
- ``rendezvous``: rank 0 listens at MASTER_ADDR:MASTER_PORT; every other rank connects and sends its
  rank, the world size and a digest of its config; rank 0 refuses a mismatch (every rank then stops
  with the reason) or sends back the NCCL unique id. The connections stay open as ``Link``: each side
  sends a heartbeat every second, so a rank that dies (its socket closes) or hangs (silent for
  ``heartbeat_timeout`` s) is noticed by the others, which abort NCCL and exit instead of waiting.
- ``Shard``: every rank draws the same permutation of the training set (same seed) and takes its
  own contiguous part; the set is padded to a multiple of the world size with its first samples, so
  every rank runs the same number of steps (the collectives stay matched) and each epoch covers the
  set once (with ``world_size - 1`` repeats at most).
- ``Replicas``: the trainer's side: the communicator, one average of the flat gradient buffer per step
  (NCCL's all-reduce in buckets; in bfloat16 with train.grad_reduce: bf16; or, for small gradients on
  one host, through the peers' mapped memory: ``backends/cuda/peer_reduce``), the broadcast of rank
  0's weights, the learning-rate rule, stop agreement; the communicator is handed to the ``sync:
  true`` BatchNorm layers too (their statistics summed over the ranks).

Importing this module starts no CUDA: ``pin_device`` must run before the driver starts.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ...errors import ConfigError, UsageError
from ...util.printable import one_line
from .rendezvous import Launch, _seconds, meet
from .rendezvous import RENDEZVOUS_TIMEOUT, config_digest, from_environment, pin_device  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 1.0
HEARTBEAT_TIMEOUT = 60.0  # s of silence after which a peer is taken for lost (CUDNNNET_HEARTBEAT_TIMEOUT overrides)
BUCKET_VALUES = 1 << 18  # floats (1 MiB) of gradients reduced together while the backward pass goes on
BLOCK_VALUES = 1 << 23  # floats (32 MiB): a larger Dense weight gradient copied to the peers may be computed in blocks
MAX_BLOCKS = 8  # the most blocks of columns such a weight gradient is timed in
BLOCK_TOLERANCE = 1.01  # its blocks' GEMMs may take at most this times the one GEMM's time
TEARDOWN_TIMEOUT = 30.0  # s for freeing the communicator after the last step (CUDNNNET_TEARDOWN_TIMEOUT overrides)
HEARTBEAT, GOODBYE = b"h", b"b"
BF16_BYTES = 2


def rendezvous(launch: Launch, digest: bytes, make_unique_id: Callable[[], bytes],
               timeout: float | None = None) -> tuple[bytes, "Link"]:
    """(the NCCL unique id, the Link to the other ranks), once every rank has reached rank 0 with the
    same world size and config digest (``rendezvous.meet``); DistributedError otherwise, on every rank,
    within ``timeout`` seconds. A CUDNNNET_HEARTBEAT_TIMEOUT out of range is refused before any waiting."""
    _seconds("CUDNNNET_HEARTBEAT_TIMEOUT", HEARTBEAT_TIMEOUT)
    unique_id, peers = meet(launch, digest, make_unique_id, timeout)
    return unique_id, Link(launch, peers)


# ---- the link between the ranks while they train ------------------------------------------------------
class Link:
    """The rendezvous connections, kept: heartbeats both ways (a thread, from ``watch`` on), a lost or
    silent peer reported to ``on_failure`` (once), ``poll`` called every heartbeat (the communicator's
    async-error check, once there is one). Both may be replaced while the thread runs."""

    def __init__(self, launch: Launch, peers: dict[int, socket.socket]):
        self.launch, self.peers = launch, peers
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.timeout = _seconds("CUDNNNET_HEARTBEAT_TIMEOUT", HEARTBEAT_TIMEOUT)
        self.on_failure: Callable[[str], None] = exit_now
        self.poll: Callable[[], None] = lambda: None

    def watch(self, on_failure: Callable[[str], None] | None = None) -> None:
        """Start the heartbeat thread."""
        if on_failure is not None:
            self.on_failure = on_failure
        for connection in self.peers.values():
            connection.setblocking(False)
        self._thread = threading.Thread(target=self._beat, name="cudnnnet-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        selector = selectors.DefaultSelector()
        heard = {}
        for rank, connection in self.peers.items():
            selector.register(connection, selectors.EVENT_READ, rank)
            heard[rank] = time.monotonic()
        me = f"rank {self.launch.rank} of {self.launch.world_size}"
        while not self._stop.is_set():
            for rank, connection in list(self.peers.items()):
                try:
                    connection.send(HEARTBEAT)
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    pass  # a closed peer is reported by the read below
            for key, _ in selector.select(HEARTBEAT_SECONDS):
                rank = key.data
                try:
                    data = key.fileobj.recv(4096)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if GOODBYE in data:
                    selector.unregister(key.fileobj)
                    heard.pop(rank, None)
                elif not data:
                    if not self._stop.is_set():
                        self.on_failure(f"{me}: rank {rank} stopped without finishing (its connection closed); "
                                   f"see that rank's output for why")
                    return
                else:
                    heard[rank] = time.monotonic()
            now = time.monotonic()
            silent = [rank for rank, when in heard.items() if now - when > self.timeout]
            if silent and not self._stop.is_set():
                self.on_failure(f"{me}: rank {silent[0]} sent no heartbeat for {self.timeout:g} s "
                           f"(CUDNNNET_HEARTBEAT_TIMEOUT); taking it for lost")
                return
            try:
                self.poll()
            except Exception as error:  # the communicator's asynchronous error
                if not self._stop.is_set():
                    self.on_failure(f"{me}: {error}")
                return

    def close(self, finished: bool) -> None:
        """Stop the heartbeats; ``finished``: say goodbye first, so that the others do not take this rank for lost."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for connection in self.peers.values():
            if finished:
                try:
                    connection.setblocking(True)
                    connection.sendall(GOODBYE)
                except OSError:
                    pass
            connection.close()
        self.peers = {}


def exit_now(message: str) -> None:
    """What a rank does when another is lost before its communicator exists: say why and exit at once
    (the main thread may be waiting for the lost rank)."""
    log.error("%s; exiting", message)
    print(f"cudnnnet-train: {one_line(message)}", file=sys.stderr, flush=True)
    os._exit(1)


# ---- sharding and the learning-rate rule ------------------------------------------------------------
def shard_size(count: int, world_size: int) -> int:
    """Samples per rank per epoch: the set padded to a multiple of the world size, divided."""
    return -(-count // world_size)


def shard(order: "np.ndarray", rank: int, world_size: int) -> "np.ndarray":
    """Rank ``rank``'s part of an epoch's ``order`` (the same on every rank): a contiguous slice of the
    order padded with its own first ids to a multiple of ``world_size``."""
    import numpy as np  # here: the launcher imports this module before NumPy, to start CUDA early

    size = shard_size(len(order), world_size)
    padded = np.concatenate([order, order[:size * world_size - len(order)]])
    return padded[rank * size:(rank + 1) * size]


class Shard:
    """A BatchLoader seen by one rank: its part of every epoch's permutation (``shard``)."""

    def __init__(self, loader, rank: int, world_size: int):
        self.loader, self.rank, self.world_size = loader, rank, world_size
        self.classes = loader.classes
        self.batch_size = loader.batch_size

    @property
    def num_samples(self) -> int:
        return shard_size(self.loader.num_samples, self.world_size)

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.num_samples // self.batch_size)

    def permutation(self, epoch: int) -> "np.ndarray":
        return shard(self.loader.permutation(epoch), self.rank, self.world_size)


def lr_factor(rule: str, world_size: int, warmup_steps: float, step: int) -> float:
    """The factor on the configured learning rate at ``step``: ``linear``: world_size (the global batch
    is world_size times the configured one), reached linearly from 1 over ``warmup_steps``; ``none``: 1."""
    if rule == "none" or world_size == 1:
        return 1.0
    if rule != "linear":
        raise UsageError(f"unknown lr_scaling {rule!r}; valid are linear, none")
    progress = 1.0 if warmup_steps <= 0 else min(step / warmup_steps, 1.0)
    return 1.0 + (world_size - 1) * progress


# ---- joining, and the trainer's side ----------------------------------------------------------------
@dataclass
class Group:
    """What a rank takes into training: its Launch, the NCCL unique id and the Link to the others."""

    launch: Launch
    unique_id: bytes
    link: Link


def join(launch: Launch, config) -> Group:
    """Rendezvous with the other ranks for ``config`` (a Config); rank 0 makes the NCCL unique id."""
    if config.device == "host":
        raise UsageError(f"{launch.launcher} started {launch.world_size} ranks but the device is host; "
                         f"training over several processes needs --device cuda")

    def make_unique_id() -> bytes:
        from ...backends.cuda.communicator import make_unique_id as nccl_unique_id

        return nccl_unique_id()

    unique_id, link = rendezvous(launch, config_digest(config.to_dict()), make_unique_id)
    link.watch()  # from now on a lost rank ends this one, even while it waits in ncclCommInitRank
    return Group(launch, unique_id, link)


class Replicas:
    """The trainer's ranks: one all-reduce of the flat gradient buffer per step, rank 0's weights
    broadcast at the start (after any resume), the learning-rate rule, agreement on stopping."""

    def __init__(self, group: Group, network, optimizer, train_config, steps_per_epoch: int):
        from ...backends.cuda.communicator import Communicator
        from ...optim.optimizers import SGD, pack

        backend = network.backend
        if backend.name != "cuda":
            raise UsageError("training over several processes needs the CUDA backend (--device cuda)")
        self.group, self.rank, self.world_size = group, group.launch.rank, group.launch.world_size
        self.backend = backend
        synchronised = synchronised_batch_norms(network) if self.world_size > 1 else []
        self.communicator = Communicator(backend, self.world_size, self.rank, group.unique_id)
        for layer in synchronised:
            layer.communicator = self.communicator
        parameters = network.parameter_list()
        if isinstance(optimizer, SGD) and optimizer.groups:
            self.values = optimizer.groups[0][0]  # packed by SGD already
        else:  # packed here, before any step: the optimiser's tensors keep their identity
            self.values = pack([p.value for p in parameters], backend)
        self.gradients = optimizer.flat_gradients()  # the optimiser's one buffer (the loss scaler checks it too)
        self.staging = _bf16_staging(self.gradients.size) if train_config.grad_reduce == "bf16" and \
            self.world_size > 1 else None  # the gradients rounded to bfloat16 for the all-reduce
        self.peers = self._connect_peers(train_config.grad_reduce)
        copies = self.peers is not None and self.peers.copies
        self.buckets = _buckets_if_packed(network, self.gradients) if self.peers is None or copies else {}
        self._blocked = self._weight_gradients_in_blocks(network, train_config.batch_size) if copies else []
        self._stepping = self._step_in_average(network, optimizer) if copies else None  # the optimiser it steps
        self._reducing = False  # whether reduce_async queued a bucket this step
        warmup_steps = train_config.lr_warmup_epochs * steps_per_epoch
        optimizer.lr_factor = lambda step: lr_factor(train_config.lr_scaling, self.world_size, warmup_steps, step)
        self.flag = _scalar(backend)  # the stop agreement: the largest signal number any rank received
        group.link.on_failure, group.link.poll = self._fail, self.communicator.check

    def _connect_peers(self, grad_reduce: str):
        """The mailboxes' gradient average (``peer_reduce``) where the config wants it and every rank can
        map every other's memory; else None (NCCL's buckets). Collective where the config wants it."""
        from ...backends.cuda import peer_reduce

        gradients = self.gradients
        mode = peer_reduce.wanted(self.world_size, 4 * gradients.size, grad_reduce)
        if mode is None:
            return None
        return peer_reduce.connect(self.communicator, gradients.size, mode=mode,
                                   usable_here=gradients.data.ptr % 16 == 0)  # the kernels move float4s

    def _step_in_average(self, network, optimizer):
        """``optimizer`` where the copies' average applies its step (``step_for_average``, handed to
        ``PeerReduce.apply_sgd``); else None."""
        step = step_for_average(network, optimizer, self.values)
        if step is None:
            return None
        values, velocity, lr, momentum, weight_decay = step
        self.peers.apply_sgd(values.data.ptr, 0 if velocity is None else velocity.data.ptr, lr.data.ptr, momentum,
                             weight_decay)
        log.info("the optimiser's SGD step applied by the peers' average")
        return optimizer

    def _weight_gradients_in_blocks(self, network, batch: int) -> list:
        """The Dense layers whose weight gradient opens a bucket and holds more than BLOCK_VALUES floats:
        each computes it in the blocks of columns ``timed_weight_blocks`` finds no slower than one GEMM,
        each copied to the peers (``block_done``) while the next block's GEMM runs. Otherwise the
        largest gradient, usually the first layer's, would leave only after the backward pass has ended."""
        from ...layers import Dense

        base = self.gradients.data.ptr
        weights = {id(layer): ((layer.grad_weight.data.ptr - base) // 4, layer.grad_weight.size)
                   for layer in network.layers if isinstance(layer, Dense) and layer.grad_weight is not None}
        buckets, large = weight_blocks(self.buckets, weights, BLOCK_VALUES)
        blocked = []
        for layer in network.layers:
            blocks = timed_weight_blocks(network, layer, batch) if id(layer) in large else 1
            if blocks > 1:
                self.buckets[id(layer)] = buckets[id(layer)]
                layer.grad_weight_blocks, layer.grad_weight_ready = blocks, self.block_done
                blocked.append(layer)
        return blocked

    def block_done(self, grad_weight) -> None:
        """A block of a layer's weight gradient (a view into the flat buffer) is queued: it is copied to
        the peers while the next block is computed."""
        self._send((grad_weight.data.ptr - self.gradients.data.ptr) // 4, grad_weight.size)

    @property
    def steps_in_average(self) -> bool:
        """Whether the gradient average applies the optimiser's step (``_step_in_average``)."""
        return self._stepping is not None

    @property
    def writes(self) -> bool:
        """Rank 0 evaluates and writes the outputs."""
        return self.rank == 0

    def broadcast_weights(self) -> None:
        """Every rank's weights become rank 0's."""
        self.communicator.broadcast(self.values, root=0)
        self.backend.synchronize()

    def layer_done(self, layer) -> None:
        """``layer``'s backward is queued: where it closes a bucket, that bucket's gradients are copied
        to the peers, or averaged by NCCL, on a side stream while the backward pass goes on."""
        bucket = self.buckets.get(id(layer))
        if bucket is not None and bucket[1] > 0:
            self._send(*bucket)

    def _send(self, offset: int, count: int) -> None:
        if self.peers is not None:
            self.peers.copy(self.gradients.data.ptr, offset, count)
        else:
            self.communicator.reduce_async(self.gradients.data.ptr + 4 * offset, count, self._staged(offset))
            self._reducing = True

    def average_gradients(self) -> bool:
        """dW = (1/R)·Σ_r dW_r over the one flat gradient buffer (queued; captured with the step): pushed
        to the peers and averaged, or the buckets reduced during the backward pass are joined, or the
        whole buffer is reduced now. True where the average also applied (and counted) the optimiser's
        step (``_step_in_average``: dW then keeps this rank's own gradients); the caller steps otherwise."""
        if self.peers is not None:
            self.peers.average(self.gradients.data.ptr, self.gradients.size)
            if self._stepping is not None:
                self._stepping.count_step()
                return True
        elif self._reducing:
            self.communicator.join()
            self._reducing = False
        else:
            self.communicator.average(self.gradients.data.ptr, self.gradients.size, self._staged(0))
        return False

    def _staged(self, offset: int) -> int | None:
        """Where the gradients from ``offset`` on are rounded to bfloat16 (train.grad_reduce: bf16), or None."""
        return None if self.staging is None else self.staging.ptr + BF16_BYTES * offset

    def average(self, tensor) -> None:
        """tensor = its mean over the ranks (the epoch's loss and accuracy totals)."""
        self.communicator.all_reduce_average(tensor)

    def agreed_stop(self, signum: int | None) -> int | None:
        """The signal any rank received (the largest number), agreed by every rank; a synchronisation."""
        self.flag.fill_(float(signum or 0))
        self.communicator.all_reduce_max(self.flag)
        agreed = int(self.flag.numpy().reshape(-1)[0])
        return agreed or None

    def agreed(self, flag: bool) -> bool:
        """Whether any rank raised ``flag`` (rank 0's early stop, which only it evaluates); a synchronisation."""
        self.flag.fill_(float(bool(flag)))
        self.communicator.all_reduce_max(self.flag)
        return bool(self.flag.numpy().reshape(-1)[0])

    def finish(self, graphs=(), exit_code: int = 0) -> None:
        """After the last step, in NCCL's order: the CUDA ``graphs`` that captured collectives are
        destroyed (NCCL waits for them), the heartbeats end with a goodbye, the communicator is
        finalized and destroyed. A teardown that outlasts CUDNNNET_TEARDOWN_TIMEOUT ends the process
        with ``exit_code`` (the outputs are written by then) instead of waiting for ever."""
        self.backend.synchronize()
        for layer in self._blocked:
            layer.grad_weight_blocks, layer.grad_weight_ready = 1, None
        for graph in graphs:
            if graph is not None:
                graph.release()
        self.group.link.close(finished=True)
        timeout = _seconds("CUDNNNET_TEARDOWN_TIMEOUT", TEARDOWN_TIMEOUT)
        watchdog = threading.Timer(timeout, _exit_stuck, (self.rank, timeout, exit_code))
        watchdog.daemon = True
        watchdog.start()
        try:
            self.communicator.close()
            if self.peers is not None:
                self.peers.close()
        finally:
            watchdog.cancel()
        if self.staging is not None:
            self.staging.free()

    def _fail(self, message: str) -> None:
        """A peer is lost: abort NCCL (queued collectives return; later ones raise with ``message``),
        say why, and exit at once."""
        reason = f"{message}; NCCL aborted"
        try:
            self.communicator.abort(reason)
        except Exception as error:
            log.error("ncclCommAbort failed too: %s", error)
        exit_now(reason)


def synchronised_batch_norms(network) -> list:
    """``network``'s BatchNorm layers with ``sync`` (their statistics to be summed over the ranks); a
    ConfigError naming the first where the engine runs cuDNN's calls, which see one rank's batch."""
    from ...layers import BatchNorm

    layers = [layer for layer in network.layers if isinstance(layer, BatchNorm) and layer.sync]
    with network.settings():  # the network's own engine, else the backend's in force
        kernels = network.backend.engine.batch_norm_kernel
    if layers and not kernels:
        raise ConfigError(f"layer {layers[0].name!r}: sync: true on several GPUs needs engine: fast (the slides "
                          f"engine's cuDNN calls normalise each GPU's batch alone); set engine: fast or sync: false")
    return layers


def gradient_buckets(layers, sizes: dict[int, list[int]], bucket_values: int = BUCKET_VALUES) -> dict[int, tuple[int, int]]:
    """{id(layer): (offset, count)}: the slices of the packed gradient buffer to reduce once that
    layer's backward has run. ``layers`` in forward order, ``sizes`` {id(layer): its parameters'
    sizes}, packed in that order (``optim.packed_offsets``). Walking backward from the last layer, a
    bucket closes at the first layer that makes it ``bucket_values`` long, and at the first layer
    with parameters; each bucket is contiguous (the layers between two closings)."""
    from ...optim.optimizers import packed_offsets

    owners = [layer for layer in layers if sizes.get(id(layer))]
    offsets, upper = packed_offsets(size for layer in owners for size in sizes[id(layer)])
    starts, index = [], 0
    for layer in owners:
        starts.append(offsets[index])
        index += len(sizes[id(layer)])
    buckets = {}
    for position in reversed(range(len(owners))):
        if upper - starts[position] >= bucket_values or position == 0:
            buckets[id(owners[position])] = (starts[position], upper - starts[position])
            upper = starts[position]
    return buckets


def step_for_average(network, optimizer, values) -> tuple | None:
    """``optimizer.packed_step()`` where the gradient average may apply it instead of a separate pass: SGD
    in the engine whose update is one kernel of ours (the fast one; the slides engine keeps the slides'
    cuBLAS update), without loss scaling, its parameters packed as ``values``; else None. The pass it
    saves: on 2 H200s the micro step's average and SGD update took 0.16 + 0.19 ms after the backward pass."""
    from ...optim.optimizers import SGD

    with network.settings():
        fast = network.backend.engine.sgd_kernel
    step = optimizer.packed_step() if fast and isinstance(optimizer, SGD) else None
    return step if step is not None and step[0] is values else None


def timed_weight_blocks(network, layer, batch: int, max_blocks: int = MAX_BLOCKS,
                        tolerance: float | None = None) -> int:
    """How many blocks of columns the Dense ``layer``'s weight gradient dW = x·dyᵀ is computed in: the
    most, up to ``max_blocks``, whose GEMMs (``dense.column_blocks``) take at most ``tolerance`` times the
    one GEMM's time (None: BLOCK_TOLERANCE), timed on operands of its shapes at ``batch`` samples in the
    network's engine and math; 1 where no split is. A GEMM split into blocks can lose in partly filled
    waves of tiles more than the overlap wins: on an H200, micro's fc1 (10 000 × 5 000 from 5 000
    samples, float32) took 9.3 ms whole, 9.3 ms in 2 or 4 blocks, 10.1 ms in 5 and 10.7 ms in 6."""
    from ...layers.base import activation_dtype
    from ...layers.dense import weight_gradient_in_blocks
    from ...tensor import Tensor

    backend, rows, columns = network.backend, layer.in_size, layer.out_size
    with network.settings():
        dtype = activation_dtype(network.layers, backend.precision)
        x = Tensor((rows * batch,), backend, dtype=dtype).fill_(0.5)  # (in_size × N)
        dy = Tensor((columns * batch,), backend, dtype=dtype).fill_(0.25)  # (out_size × N)
        grad_weight = Tensor((rows * columns,), backend)  # (in_size × out_size)

        def gemms(blocks: int) -> None:
            weight_gradient_in_blocks(backend, x, dy, grad_weight, rows, columns, batch, blocks)

        whole = _gemm_seconds(backend, lambda: gemms(1))
        timed = {blocks: _gemm_seconds(backend, lambda: gemms(blocks)) for blocks in range(2, max_blocks + 1)}
        whole = min(whole, _gemm_seconds(backend, lambda: gemms(1)))
    tolerance = BLOCK_TOLERANCE if tolerance is None else tolerance
    fitting = [blocks for blocks, seconds in timed.items() if seconds <= tolerance * whole]
    chosen = max(fitting, default=1)
    log.info("layer %r: its weight gradient in %d block%s of columns (one GEMM %.2f ms; %s)", layer.name, chosen,
             "" if chosen == 1 else "s", 1e3 * whole,
             ", ".join(f"{blocks} blocks {1e3 * seconds:.2f}" for blocks, seconds in timed.items()))
    return chosen


def _gemm_seconds(backend, call, repeats: int = 5) -> float:
    """Seconds a ``call`` of queued GPU work takes, the mean of ``repeats`` after one to plan and warm up."""
    call()
    backend.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        call()
    backend.synchronize()
    return (time.perf_counter() - started) / repeats


def weight_blocks(buckets: dict[int, tuple[int, int]], weights: dict[int, tuple[int, int]],
                  block_values: int = BLOCK_VALUES) -> tuple[dict[int, tuple[int, int]], dict[int, int]]:
    """(the buckets left, {id(layer): blocks}): a layer in ``weights`` ({id(layer): (offset, size)} of its
    weight gradient in the packed buffer) whose weight gradient opens its bucket and holds more than
    ``block_values`` floats may compute it in up to ceil(size / block_values) blocks, each sent on its
    own; its bucket would keep the rest (its bias, the layers after it), which may be empty."""
    left, blocks = dict(buckets), {}
    for key, (offset, count) in buckets.items():
        weight = weights.get(key)
        if weight is not None and weight[0] == offset and weight[1] > block_values:
            blocks[key] = -(-weight[1] // block_values)
            left[key] = (offset + weight[1], count - weight[1])
    return left, blocks


def _buckets_if_packed(network, gradients) -> dict[int, tuple[int, int]]:
    """``gradient_buckets`` for ``network``, where its gradients lie packed in ``gradients`` in the
    order ``pack`` gives them; else {} (the whole buffer is reduced after the backward pass)."""
    from ...optim.optimizers import packed_offsets

    parameters = network.parameter_list()
    offsets, total = packed_offsets(p.grad.size for p in parameters)
    base = gradients.data.ptr
    if total != gradients.size or any(p.grad.data.ptr != base + 4 * offset for p, offset in zip(parameters, offsets)):
        log.info("the gradients are not packed in parameter order: reduced after the backward pass")
        return {}
    sizes = {id(layer): [p.grad.size for p in layer.parameters()] for layer in network.layers}
    return gradient_buckets(network.layers, sizes)


def _exit_stuck(rank: int, timeout: float, exit_code: int) -> None:
    """The teardown watchdog: NCCL did not let go of the communicator in time; exit without it."""
    message = (f"rank {rank}: freeing the NCCL communicator took over {timeout:g} s "
               f"(CUDNNNET_TEARDOWN_TIMEOUT); exiting without waiting for it")
    log.warning(message)
    print(f"cudnnnet-train: warning: {one_line(message)}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(exit_code)


def _bf16_staging(values: int):
    from ...backends.cuda.buffer import DeviceBuffer
    from ...precision import BFLOAT16

    return DeviceBuffer.allocate(BF16_BYTES * values, BFLOAT16)  # (values,) bfloat16


def _scalar(backend):
    from ...tensor import Tensor

    return Tensor.zeros((1,), backend)
