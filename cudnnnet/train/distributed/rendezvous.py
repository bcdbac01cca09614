"""Where a process stands among the ranks, and the rendezvous that joins them.

- ``from_environment``: this process's place (rank, world size, local rank, rank 0's address) as
  the launchers publish it: torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), Open
  MPI (OMPI_COMM_WORLD_*), MPICH / Intel MPI (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID) and Slurm
  (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID); ``cudnnnet-train --gpus N`` sets torchrun's.
- ``meet``: rank 0 listens at MASTER_ADDR and the rendezvous port (MASTER_PORT, see
  ``_rendezvous_port``); every other rank connects and sends its rank, the world size and a digest of
  its config; rank 0 refuses a mismatch (every rank then stops with the reason) or sends back the NCCL
  unique id. The connections are returned open: ``distributed.Link`` keeps them for the heartbeats.
  One deadline (CUDNNNET_RENDEZVOUS_TIMEOUT) bounds each rank's whole exchange however slowly a peer
  sends; every message has a fixed size or a cap checked before it is read; rank 0 closes and logs a
  connection that does not greet it as a rank does (a port scanner, a health check) and goes on
  waiting for the ranks.

Importing this module starts no CUDA and imports no NumPy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import selectors
import socket
import struct
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from ...errors import DistributedError, UsageError

log = logging.getLogger(__name__)

RENDEZVOUS_TIMEOUT = 300.0  # s for every rank to reach rank 0 (CUDNNNET_RENDEZVOUS_TIMEOUT overrides)
MAX_SECONDS = 7 * 24 * 3600.0  # the longest timeout an environment variable may set: a week
MAX_WORLD_SIZE = 1 << 20
GREETING_SECONDS = 10.0  # for a connection to rank 0 to send its whole hello (a rank sends it at once)
MAX_PENDING = 64  # connections rank 0 greets at once; beyond, the oldest is dropped
SEND_SECONDS = 5.0  # for rank 0's answer to leave
MAGIC = b"CDNN\x01"  # cudnnnet's greeting, then the protocol's version
PROTOCOL = MAGIC[:4]  # what every version's greeting begins with
HELLO = struct.Struct("!5sII32s")  # magic, rank, world size, config digest
UNIQUE_ID_BYTES = 128
ACCEPTED, REFUSED = b"\x00", b"\x01"  # rank 0's answer: then the NCCL unique id, or the reason's length and text
MAX_REFUSAL_BYTES = 16384  # a longer reason is cut


@dataclass(frozen=True)
class Launch:
    """Where this process stands among the ranks, as its launcher said."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str | None
    master_port: int | None
    launcher: str

    def address(self) -> tuple[str, int]:
        """(MASTER_ADDR, MASTER_PORT), or DistributedError saying that they are needed."""
        if not self.master_addr or self.master_port is None:
            raise DistributedError(f"{self.launcher} started {self.world_size} ranks but MASTER_ADDR and MASTER_PORT are "
                                   f"not both set; export them (rank 0's host name or address, and a free TCP port) "
                                   f"for every rank")
        return self.master_addr, self.master_port


# launcher: (rank, world size, local rank) variables, first found wins
LAUNCHERS = (
    ("torchrun", ("RANK", "WORLD_SIZE", "LOCAL_RANK")),
    ("Open MPI", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK")),
    ("MPICH", ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID")),
    ("Slurm", ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")),
)


def from_environment(environ: Mapping[str, str] = os.environ) -> Launch | None:
    """This process's Launch, or None for a single process: torchrun's variables (WORLD_SIZE set, even
    to 1), else the first MPI or Slurm contract whose world size is above 1 (a lone ``srun`` task or
    ``mpirun -n 1`` trains as one process, without NCCL)."""
    for launcher, (rank_name, size_name, local_name) in LAUNCHERS:
        if rank_name not in environ or size_name not in environ:
            continue
        world_size = _integer(environ, size_name, 1, MAX_WORLD_SIZE)
        if launcher != "torchrun" and world_size == 1:
            continue
        rank = _integer(environ, rank_name, 0, MAX_WORLD_SIZE - 1)
        if rank >= world_size:
            raise DistributedError(f"{rank_name}={rank} is not below {size_name}={world_size}")
        local_rank = (_integer(environ, local_name, 0, MAX_WORLD_SIZE - 1) if local_name in environ
                      else _unknown_local_rank(launcher, rank))
        return Launch(rank, world_size, local_rank, environ.get("MASTER_ADDR") or None, _rendezvous_port(environ),
                      launcher)
    return None


def _rendezvous_port(environ: Mapping[str, str]) -> int | None:
    """The TCP port rank 0 listens at: CUDNNNET_RENDEZVOUS_PORT, else MASTER_PORT, except under a
    torchrun agent whose own store listens at MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True; every
    multi-node torchrun): MASTER_PORT + 1 there."""
    if environ.get("CUDNNNET_RENDEZVOUS_PORT"):
        name, offset = "CUDNNNET_RENDEZVOUS_PORT", 0
    elif environ.get("MASTER_PORT"):
        name, offset = "MASTER_PORT", int(environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true")
    else:
        return None
    port = _integer(environ, name, 1, 65535) + offset
    if port > 65535:
        raise DistributedError(f"{name}={environ[name]} is not a TCP port (1..{65535 - offset})")
    return port


def _integer(environ: Mapping[str, str], name: str, low: int, high: int) -> int:
    """``environ[name]`` as an integer from ``low`` to ``high``: ASCII digits only (``str.isdigit`` takes
    "²", which ``int`` refuses), no more of them than ``high`` has (Python 3.11+ refuses 4300 to ``int``)."""
    text = environ[name].strip()
    if not (0 < len(text) <= len(str(high)) and text.isascii() and text.isdigit() and low <= int(text) <= high):
        raise DistributedError(f"{name}={_quoted(environ[name])} is not an integer from {low} to {high}")
    return int(text)


def _quoted(text: str, limit: int = 24) -> str:
    """``text`` as a quoted, escaped Python literal, cut to ``limit`` characters."""
    return repr(text if len(text) <= limit else text[:limit] + "…")


def _unknown_local_rank(launcher: str, rank: int) -> int:
    log.warning("%s gave rank %d no local rank; using GPU 0 of the visible ones", launcher, rank)
    return 0


def pin_device(launch: Launch, environ=os.environ) -> str:
    """Make this rank's GPU the only one it sees (CUDA_VISIBLE_DEVICES), before CUDA starts: entry
    ``local_rank`` of the visible list, or the list itself where it names one GPU (Slurm's
    --gpus-per-task does). Turns NVLink multicast off (NCCL_NVLS_ENABLE=0) unless set. Returns the device."""
    environ.setdefault("NCCL_NVLS_ENABLE", "0")
    visible = [entry.strip() for entry in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if entry.strip()]
    if len(visible) == 1:
        return visible[0]
    if visible and launch.local_rank >= len(visible):
        raise DistributedError(f"local rank {launch.local_rank} has no GPU: CUDA_VISIBLE_DEVICES lists {len(visible)}")
    device = visible[launch.local_rank] if visible else str(launch.local_rank)
    environ["CUDA_VISIBLE_DEVICES"] = device
    return device


def config_digest(config_dict: dict) -> bytes:
    """sha256 of the training config as every rank must share it (the data directory and the device
    may differ between hosts and are left out)."""
    shared = {key: value for key, value in config_dict.items() if key != "device"}
    shared["data"] = {key: value for key, value in config_dict.get("data", {}).items() if key != "dir"}
    return hashlib.sha256(json.dumps(shared, sort_keys=True).encode()).digest()


# ---- rendezvous --------------------------------------------------------------------------------------
def meet(launch: Launch, digest: bytes, make_unique_id: Callable[[], bytes],
         timeout: float | None = None) -> tuple[bytes, dict[int, socket.socket]]:
    """(the NCCL unique id, {rank: the open connection to it}), once every rank has reached rank 0 with
    the same world size and config digest; DistributedError (naming the rank and the reason) otherwise,
    on every rank, within ``timeout`` seconds: one deadline for the whole exchange, whatever a peer sends."""
    timeout = _seconds("CUDNNNET_RENDEZVOUS_TIMEOUT", RENDEZVOUS_TIMEOUT) if timeout is None else timeout
    deadline = time.monotonic() + timeout
    if launch.rank == 0:
        return _serve(launch, digest, make_unique_id, deadline, timeout)
    return _join(launch, digest, deadline, timeout)


def _serve(launch: Launch, digest: bytes, make_unique_id, deadline: float, timeout: float):
    host, port = launch.address() if launch.world_size > 1 else ("127.0.0.1", launch.master_port or 0)
    unique_id = make_unique_id()
    if launch.world_size == 1:
        return unique_id, {}
    try:
        server = socket.create_server((_bind_host(host), port), reuse_port=False)
    except OSError as error:
        raise DistributedError(f"rank 0 cannot listen at {host}:{port} (MASTER_ADDR:MASTER_PORT): {error.strerror or error}") from None
    reception = _Reception(launch, digest, server)
    try:
        reception.gather(deadline)
    except TimeoutError:
        _close_all(reception.peers.values())
        missing = sorted(set(range(1, launch.world_size)) - set(reception.peers))
        raise DistributedError(f"rank 0: ranks {_ranks_text(missing)} did not reach {host}:{port} within "
                               f"{timeout:g} s (CUDNNNET_RENDEZVOUS_TIMEOUT)") from None
    finally:
        reception.close()
    if reception.problems:
        reason = "; ".join(reception.problems)
        for connection in reception.peers.values():
            _send_refusal(connection, reason)
        raise DistributedError(f"rank 0 refused to start: {reason}")
    _send_unique_id(reception.peers, unique_id)
    log.info("rank 0: all %d ranks joined at %s:%d", launch.world_size, host, port)
    return unique_id, reception.peers


class _Greeting:
    """A connection to rank 0 that has not yet sent its whole hello: what it sent, and until when it may."""

    def __init__(self, address, expires: float):
        self.address, self.expires = address, expires
        self.buffer = bytearray(HELLO.size)
        self.received = 0

    def beginning(self) -> bytes:
        return bytes(self.buffer[:min(self.received, len(PROTOCOL))])


class _Reception:
    """Rank 0's side: every connection read at once (none can hold up another), each hello into its own
    buffer of HELLO.size bytes. A connection that does not begin with cudnnnet's greeting, closes before
    its hello is whole or takes longer than GREETING_SECONDS is a stray (a port scanner, a health check):
    it is closed and logged, and rank 0 goes on waiting for the ranks."""

    def __init__(self, launch: Launch, digest: bytes, server: socket.socket):
        self.launch, self.digest, self.server = launch, digest, server
        self.selector = selectors.DefaultSelector()
        self.pending: dict[socket.socket, _Greeting] = {}  # oldest first
        self.peers: dict[int, socket.socket] = {}
        self.problems: list[str] = []
        self.strays = 0
        server.setblocking(False)
        self.selector.register(server, selectors.EVENT_READ)

    def gather(self, deadline: float) -> None:
        """Until every other rank has sent its hello (accepted, or refused with a problem); TimeoutError
        at ``deadline``."""
        while len(self.peers) + len(self.problems) < self.launch.world_size - 1:
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError
            for connection, greeting in list(self.pending.items()):
                if greeting.expires <= now:
                    self._ignore(connection, f"it sent no whole hello within {GREETING_SECONDS:g} s")
            wake = min([deadline, *(greeting.expires for greeting in self.pending.values())])
            for key, _ in self.selector.select(max(wake - now, 0.001)):
                if key.fileobj is self.server:
                    self._accept()
                elif key.fileobj in self.pending:  # not dropped by an accept earlier in this batch
                    self._read(key.fileobj)

    def close(self) -> None:
        """Stop listening; close the connections still being greeted."""
        for connection in list(self.pending):
            self._forget(connection)
            connection.close()
        self.selector.close()
        self.server.close()

    def _accept(self) -> None:
        try:
            connection, address = self.server.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as error:  # out of file descriptors, say: the next select tries again
            log.debug("rank 0: accept failed: %s", error)
            return
        connection.setblocking(False)
        self.pending[connection] = _Greeting(address, time.monotonic() + GREETING_SECONDS)
        self.selector.register(connection, selectors.EVENT_READ)
        if len(self.pending) > MAX_PENDING:
            self._ignore(next(iter(self.pending)), f"more than {MAX_PENDING} connections were waiting to be greeted")

    def _read(self, connection: socket.socket) -> None:
        greeting = self.pending[connection]
        try:
            count = connection.recv_into(memoryview(greeting.buffer)[greeting.received:])
        except (BlockingIOError, InterruptedError):
            return
        except OSError as error:
            self._ignore(connection, f"its connection failed: {error.strerror or error}")
            return
        if not count:
            self._ignore(connection, f"it closed after {greeting.received} of the hello's {HELLO.size} bytes")
            return
        greeting.received += count
        if not PROTOCOL.startswith(greeting.beginning()):
            self._ignore(connection, f"it began with {greeting.beginning()!r}")
        elif greeting.received == HELLO.size:
            self._forget(connection)
            self._settle(connection, HELLO.unpack(greeting.buffer))

    def _settle(self, connection: socket.socket, hello: tuple) -> None:
        problem, rank = self._judge(*hello)
        if problem is None:
            self.peers[rank] = connection
        else:
            self.problems.append(problem)
            _send_refusal(connection, problem)

    def _judge(self, magic: bytes, rank: int, world_size: int, theirs: bytes) -> tuple[str | None, int]:
        """(the problem with a rank's hello or None, its rank)."""
        if magic != MAGIC:
            return (f"a rank of another version of cudnnnet connected (its hello begins {magic!r}, this version's "
                    f"{MAGIC!r}); every rank must run the same version"), rank
        if world_size != self.launch.world_size:
            return f"rank {rank} says the world has {world_size} ranks, rank 0 says {self.launch.world_size}", rank
        if not 0 < rank < self.launch.world_size or rank in self.peers:
            return f"rank {rank} joined twice or is outside 1..{self.launch.world_size - 1}", rank
        if theirs != self.digest:
            return (f"rank {rank}'s config differs from rank 0's (every rank must train the same config, "
                    f"epochs, batch size and seed)"), rank
        return None, rank

    def _ignore(self, connection: socket.socket, why: str) -> None:
        address = self.pending[connection].address
        self._forget(connection)
        connection.close()
        self.strays += 1
        level, further = (logging.WARNING, "; any further ones are logged at debug level") if self.strays == 1 \
            else (logging.DEBUG, "")
        log.log(level, "rank 0: a connection from %s is not a cudnnnet rank; ignored (%s)%s",
                _address_text(address), why, further)

    def _forget(self, connection: socket.socket) -> None:
        self.selector.unregister(connection)
        del self.pending[connection]


def _send_unique_id(peers: dict[int, socket.socket], unique_id: bytes) -> None:
    for rank, connection in peers.items():
        connection.settimeout(SEND_SECONDS)
        try:
            connection.sendall(ACCEPTED + unique_id)
        except OSError as error:
            _close_all(peers.values())
            raise DistributedError(f"rank 0: rank {rank} left before it received the NCCL id "
                                   f"({error.strerror or error})") from None


def _send_refusal(connection: socket.socket, reason: str) -> None:
    payload = reason.encode()[:MAX_REFUSAL_BYTES]  # a character cut in two is decoded as U+FFFD
    try:
        connection.settimeout(SEND_SECONDS)
        connection.sendall(REFUSED + struct.pack("!I", len(payload)) + payload)
    except OSError:
        pass
    connection.close()


def _join(launch: Launch, digest: bytes, deadline: float, timeout: float):
    host, port = launch.address()
    me = f"rank {launch.rank}"
    connection = _connect(host, port, launch.rank, deadline, timeout)
    try:
        _send(connection, HELLO.pack(MAGIC, launch.rank, launch.world_size, digest), deadline)
        unique_id = _answer(connection, me, f"{host}:{port}", deadline)
    except TimeoutError:
        connection.close()
        raise DistributedError(f"{me}: rank 0 at {host}:{port} did not answer within {timeout:g} s "
                               f"(CUDNNNET_RENDEZVOUS_TIMEOUT); are all {launch.world_size} ranks started?") from None
    except EOFError:
        connection.close()
        raise DistributedError(f"{me}: rank 0 at {host}:{port} closed the connection before answering; see rank "
                               f"0's output") from None
    except OSError as error:
        connection.close()
        raise DistributedError(f"{me}: the connection to rank 0 at {host}:{port} failed during the rendezvous: "
                               f"{error.strerror or error}") from None
    except BaseException:
        connection.close()
        raise
    return unique_id, {0: connection}


def _answer(connection: socket.socket, me: str, address: str, deadline: float) -> bytes:
    """Rank 0's answer to this rank's hello: the NCCL unique id, or DistributedError with its refusal.
    A refusal longer than MAX_REFUSAL_BYTES is refused from its length, before it is read."""
    status = _receive(connection, 1, deadline)
    if status == ACCEPTED:
        return _receive(connection, UNIQUE_ID_BYTES, deadline)
    if status != REFUSED:
        raise DistributedError(f"{me}: {address} (MASTER_ADDR:MASTER_PORT) answered {status!r}, which is not a "
                               f"cudnnnet rank 0's answer")
    length, = struct.unpack("!I", _receive(connection, 4, deadline))
    if length > MAX_REFUSAL_BYTES:
        raise DistributedError(f"{me}: {address} (MASTER_ADDR:MASTER_PORT) announced a refusal of {length} bytes, "
                               f"and a cudnnnet rank 0 sends at most {MAX_REFUSAL_BYTES}: it is not a cudnnnet rank 0 "
                               f"of this version")
    reason = _receive(connection, length, deadline).decode(errors="replace")
    raise DistributedError(f"{me}: rank 0 refused to start: {_printable(reason)}")


def _connect(host: str, port: int, rank: int, deadline: float, timeout: float) -> socket.socket:
    """A connection to rank 0, retried until ``deadline`` (rank 0 may not be listening yet)."""
    while True:
        try:
            return socket.create_connection((host, port), timeout=max(min(deadline - time.monotonic(), 5.0), 0.001))
        except OSError as error:
            if time.monotonic() >= deadline:
                raise DistributedError(f"rank {rank}: cannot reach rank 0 at {host}:{port} (MASTER_ADDR:MASTER_PORT) "
                                       f"within {timeout:g} s: {error.strerror or error}") from None
            time.sleep(min(0.2, max(deadline - time.monotonic(), 0.0)))


def _send(connection: socket.socket, data: bytes, deadline: float) -> None:
    """All of ``data``, or TimeoutError at ``deadline``."""
    connection.settimeout(_remaining(deadline))
    connection.sendall(data)  # the timeout bounds the whole call (Python >= 3.5)


def _receive(connection: socket.socket, size: int, deadline: float) -> bytes:
    """Exactly ``size`` bytes, read into one buffer allocated up front; TimeoutError at ``deadline`` however
    slowly the bytes come, EOFError where the peer closes first."""
    buffer = bytearray(size)
    view, received = memoryview(buffer), 0
    while received < size:
        connection.settimeout(_remaining(deadline))
        count = connection.recv_into(view[received:])
        if not count:
            raise EOFError(f"the connection closed after {received} of {size} bytes")
        received += count
    return bytes(buffer)


def _remaining(deadline: float) -> float:
    """Seconds left until ``deadline``; TimeoutError where none are."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the rendezvous deadline passed")
    return left


def _printable(text: str) -> str:
    """``text`` with its control characters escaped (``\\x1b``): what rank 0 sent reaches a terminal."""
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii") for char in text)


def _address_text(address) -> str:
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) and len(address) >= 2 else str(address)


def _close_all(connections) -> None:
    for connection in connections:
        connection.close()


def _bind_host(host: str) -> str:
    """Listen on the loopback only where MASTER_ADDR is a loopback address, else on every interface."""
    try:
        return host if socket.gethostbyname(host).startswith("127.") else ""
    except OSError:
        return ""


def _ranks_text(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def _seconds(name: str, default: float) -> float:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_SECONDS:  # NaN and infinity fail too; a socket timeout must be finite
        raise UsageError(f"{name}={_quoted(text)} is not a number of seconds above 0 and at most {MAX_SECONDS:g} "
                         f"(a week)")
    return value
