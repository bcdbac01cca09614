"""Where a process stands among the ranks, and the rendezvous that joins them.

- ``from_environment``: this process's place (rank, world size, local rank, rank 0's address) as
  the launchers publish it: torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), Open
  MPI (OMPI_COMM_WORLD_*), MPICH / Intel MPI (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID) and Slurm
  (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID); ``cudnnnet-train --gpus N`` sets torchrun's.
- ``meet``: rank 0 listens at MASTER_ADDR and the rendezvous port (MASTER_PORT, see
  ``_rendezvous_port``); every other rank connects and sends its rank, the world size and a digest of
  its config; rank 0 refuses a mismatch (every rank then stops with the reason) or sends back the NCCL
  unique id. The connections are returned open: ``distributed.Link`` keeps them for the heartbeats.

Importing this module starts no CUDA and imports no NumPy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import socket
import struct
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from .errors import DistributedError, UsageError

log = logging.getLogger(__name__)

RENDEZVOUS_TIMEOUT = 300.0  # s for every rank to reach rank 0 (CUDNNNET_RENDEZVOUS_TIMEOUT overrides)
MAX_SECONDS = 7 * 24 * 3600.0  # the longest timeout an environment variable may set: a week
MAX_WORLD_SIZE = 1 << 20
MAGIC = b"CDNN\x01"
HELLO = struct.Struct("!5sII32s")  # magic, rank, world size, config digest
UNIQUE_ID_BYTES = 128


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
    on every rank, within ``timeout`` seconds."""
    timeout = _seconds("CUDNNNET_RENDEZVOUS_TIMEOUT", RENDEZVOUS_TIMEOUT) if timeout is None else timeout
    deadline = time.monotonic() + timeout
    if launch.rank == 0:
        return _serve(launch, digest, make_unique_id, deadline, timeout)
    return _join(launch, digest, deadline, timeout)


def _serve(launch: Launch, digest: bytes, make_unique_id, deadline: float, timeout: float):
    host, port = launch.address() if launch.world_size > 1 else ("127.0.0.1", launch.master_port or 0)
    unique_id = make_unique_id()
    peers: dict[int, socket.socket] = {}
    if launch.world_size == 1:
        return unique_id, peers
    try:
        server = socket.create_server((_bind_host(host), port), reuse_port=False)
    except OSError as error:
        raise DistributedError(f"rank 0 cannot listen at {host}:{port} (MASTER_ADDR:MASTER_PORT): {error.strerror or error}") from None
    problems: list[str] = []
    with server:
        while len(peers) + len(problems) < launch.world_size - 1:
            server.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                connection, _ = server.accept()
            except socket.timeout:
                _close_all(peers.values())
                missing = sorted(set(range(1, launch.world_size)) - set(peers))
                raise DistributedError(f"rank 0: ranks {_ranks_text(missing)} did not reach {host}:{port} within "
                                       f"{timeout:g} s (CUDNNNET_RENDEZVOUS_TIMEOUT)") from None
            problem, rank = _greet(connection, launch, digest, peers, deadline)
            if problem:
                problems.append(problem)
                _send_refusal(connection, problem)
            else:
                peers[rank] = connection
    if problems:
        reason = "; ".join(problems)
        for connection in peers.values():
            _send_refusal(connection, reason)
        _close_all(peers.values())
        raise DistributedError(f"rank 0 refused to start: {reason}")
    for connection in peers.values():
        connection.sendall(b"\x00" + unique_id)
    log.info("rank 0: all %d ranks joined at %s:%d", launch.world_size, host, port)
    return unique_id, peers


def _greet(connection: socket.socket, launch: Launch, digest: bytes, peers: dict, deadline: float):
    """(problem or None, the peer's rank) from the peer's hello."""
    try:
        connection.settimeout(max(deadline - time.monotonic(), 0.001))
        magic, rank, world_size, theirs = HELLO.unpack(_receive(connection, HELLO.size))
    except (DistributedError, OSError, struct.error) as error:
        return f"a connection that is not a cudnnnet rank ({error})", -1
    if magic != MAGIC:
        return "a connection that is not a cudnnnet rank of this version", -1
    if world_size != launch.world_size:
        return f"rank {rank} says the world has {world_size} ranks, rank 0 says {launch.world_size}", rank
    if not 0 < rank < launch.world_size or rank in peers:
        return f"rank {rank} joined twice or is outside 1..{launch.world_size - 1}", rank
    if theirs != digest:
        return (f"rank {rank}'s config differs from rank 0's (every rank must train the same config, "
                f"epochs, batch size and seed)"), rank
    return None, rank


def _join(launch: Launch, digest: bytes, deadline: float, timeout: float):
    host, port = launch.address()
    connection = _connect(host, port, launch.rank, deadline, timeout)
    try:
        connection.settimeout(max(deadline - time.monotonic(), 0.001))
        connection.sendall(HELLO.pack(MAGIC, launch.rank, launch.world_size, digest))
        status = _receive(connection, 1)
        if status != b"\x00":
            length, = struct.unpack("!I", _receive(connection, 4))
            reason = _receive(connection, length).decode(errors="replace")
            raise DistributedError(f"rank {launch.rank}: rank 0 refused to start: {reason}")
        unique_id = _receive(connection, UNIQUE_ID_BYTES)
    except socket.timeout:
        connection.close()
        raise DistributedError(f"rank {launch.rank}: rank 0 at {host}:{port} did not answer within {timeout:g} s "
                               f"(CUDNNNET_RENDEZVOUS_TIMEOUT); are all {launch.world_size} ranks started?") from None
    except BaseException:
        connection.close()
        raise
    return unique_id, {0: connection}


def _connect(host: str, port: int, rank: int, deadline: float, timeout: float) -> socket.socket:
    """A connection to rank 0, retried until ``deadline`` (rank 0 may not be listening yet)."""
    while True:
        try:
            return socket.create_connection((host, port), timeout=max(min(deadline - time.monotonic(), 5.0), 0.001))
        except OSError as error:
            if time.monotonic() >= deadline:
                raise DistributedError(f"rank {rank}: cannot reach rank 0 at {host}:{port} (MASTER_ADDR:MASTER_PORT) "
                                       f"within {timeout:g} s: {error.strerror or error}") from None
            time.sleep(0.2)


def _receive(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise DistributedError("the connection closed during the rendezvous")
        data += chunk
    return data


def _send_refusal(connection: socket.socket, reason: str) -> None:
    payload = reason.encode()
    try:
        connection.sendall(b"\x01" + struct.pack("!I", len(payload)) + payload)
    except OSError:
        pass
    connection.close()


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
