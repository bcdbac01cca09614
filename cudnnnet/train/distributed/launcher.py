"""``cudnnnet-train --gpus N``: one training process per GPU of this host, as torchrun would start them.

Each child runs ``python -m cudnnnet.cli.launch`` with the same arguments less ``--gpus``, with
torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT: a free port),
its GPU as the only one visible (CUDA_VISIBLE_DEVICES) and NVLink multicast off (NCCL_NVLS_ENABLE=0).
SIGINT and SIGTERM are passed on to every child (they agree on a step, rank 0 publishes one
checkpoint). Where a child fails, the others still running ``FAILURE_GRACE_SECONDS`` later are
terminated: a rank that failed before the rendezvous would otherwise leave the others waiting for it
until CUDNNNET_RENDEZVOUS_TIMEOUT. Where the ranks are stopping on a signal (passed on, or a failing
child's exit code saying it stopped on one) they have ``GRACE_SECONDS``: rank 0 may be publishing its
checkpoint. The exit code is the first failing child's.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time

from ...errors import UsageError
from . import replicas as distributed

log = logging.getLogger(__name__)

GRACE_SECONDS = distributed.HEARTBEAT_TIMEOUT + 30.0  # on a signal, for the ranks to stop on their own
FAILURE_GRACE_SECONDS = 3.0  # after a rank fails, for the others to report it (distributed.Link) and exit
STOPPED_ON_A_SIGNAL = {128 + signal.SIGINT, 128 + signal.SIGTERM}  # a rank's exit code after an agreed stop
GPUS_OPTION = "--gpus"


def without_gpus_option(argv: list[str]) -> list[str]:
    """``argv`` less every ``--gpus N`` / ``--gpus=N`` (or the prefix argparse takes, ``--gpu``)."""
    kept, skip = [], False
    for argument in argv:
        if skip:
            skip = False
            continue
        name, equals, _ = argument.partition("=")
        if len(name) >= 5 and GPUS_OPTION.startswith(name):
            skip = not equals
            continue
        kept.append(argument)
    return kept


def visible_gpus(count: int) -> list[str]:
    """The first ``count`` GPUs this process may use (CUDA_VISIBLE_DEVICES entries, else ordinals);
    UsageError where there are fewer."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        gpus = [entry.strip() for entry in listed.split(",") if entry.strip()]
    else:
        from ...backends import no_gpu_reason

        reason = no_gpu_reason()
        if reason is not None:
            raise UsageError(f"--gpus {count}: no GPU is usable here ({reason})")
        from ...backends.cuda.bindings import driver_start

        gpus = [str(ordinal) for ordinal in range(driver_start.device_count())]
    if len(gpus) < count:
        raise UsageError(f"--gpus {count}: this host has {len(gpus)} usable GPU{'s' if len(gpus) != 1 else ''}; "
                         f"valid are 1 to {len(gpus)}")
    return gpus[:count]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def spawn_ranks(count: int, argv: list[str], module: str = "cudnnnet.cli.launch") -> int:
    """Run ``python -m module`` with ``argv`` (less --gpus) as one rank per GPU for ``count`` GPUs;
    returns the exit code."""
    if distributed.from_environment() is not None:
        raise UsageError("--gpus starts its own processes; under torchrun, srun or mpirun leave --gpus out")
    gpus = visible_gpus(count)
    port = free_port()
    arguments = [sys.executable, "-m", module, *without_gpus_option(argv)]
    children = []
    for rank, gpu in enumerate(gpus):
        environment = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(count), "LOCAL_RANK": "0",
                       "LOCAL_WORLD_SIZE": str(count), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "CUDA_VISIBLE_DEVICES": gpu}
        environment.setdefault("NCCL_NVLS_ENABLE", "0")
        children.append(subprocess.Popen(arguments, env=environment))
    log.info("started %d ranks (GPUs %s), rendezvous at 127.0.0.1:%d", count, ",".join(gpus), port)
    return _wait(children)


def _wait(children: list[subprocess.Popen]) -> int:
    """Wait for every child, passing SIGINT/SIGTERM on; the failing child's exit code (one killed by a
    signal before one that exited with an error, as the others react to it), else 0."""
    forwarded = []

    def forward(signum, frame):
        forwarded.append(signum)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        failure, failed_at = 0, None
        while True:
            running = _poll_all(children)
            stopped = {128 + signum for signum in forwarded}  # the exit code of a rank that stopped as asked
            failed = [rank for rank, child in enumerate(children)
                      if child.returncode not in (None, 0) and _exit_code(child) not in stopped]
            if failed and failed_at is None:
                first = min(failed, key=lambda rank: (children[rank].returncode > 0, rank))
                failure, failed_at = _exit_code(children[first]), time.monotonic()
                log.error("%s%s", how_it_ended(first, children[first]),
                          f"; waiting up to {_grace(forwarded, failure):g} s for the others" if running else "")
            if not running:
                break
            if failed_at is not None and time.monotonic() - failed_at > _grace(forwarded, failure):
                _terminate(children)
            time.sleep(0.1)
        return failure or next((_exit_code(child) for child in children if child.returncode != 0), 0)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _grace(forwarded: list[int], failure: int) -> float:
    """Seconds the other ranks have to exit after one failed: long where they are stopping on a signal."""
    return GRACE_SECONDS if forwarded or failure in STOPPED_ON_A_SIGNAL else FAILURE_GRACE_SECONDS


def _poll_all(children: list[subprocess.Popen]) -> bool:
    """Poll every child (each returncode up to date); whether any still runs."""
    return [child.poll() for child in children].count(None) > 0


def how_it_ended(rank: int, child: subprocess.Popen) -> str:
    """'rank 1 (pid 4242) was killed by SIGKILL' / 'rank 1 (pid 4242) exited with code 1'."""
    if child.returncode < 0:
        try:
            name = signal.Signals(-child.returncode).name
        except ValueError:
            name = f"signal {-child.returncode}"
        return f"rank {rank} (pid {child.pid}) was killed by {name}"
    return f"rank {rank} (pid {child.pid}) exited with code {child.returncode}"


def _exit_code(child: subprocess.Popen) -> int:
    """A child's exit status as a shell reports it (128 + N for a child killed by signal N)."""
    return child.returncode if child.returncode >= 0 else 128 - child.returncode


def _terminate(children: list[subprocess.Popen]) -> None:
    for child in children:
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + 10.0
    for child in children:
        try:
            child.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
