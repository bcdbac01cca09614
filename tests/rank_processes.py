"""Ranks as spawned processes for the multi-GPU tests: each runs a function of the test module and
reports what it returned, or its traceback; the test fails at once, naming the rank, when a rank raises
or dies without reporting, rather than waiting out a queue's timeout, and fails when a rank outlives
its report by more than a few seconds (a run must end)."""

import faulthandler
import multiprocessing
import queue
import sys
import time
import traceback

EXIT_SECONDS = 20  # a rank's process ends within this long of reporting


def _report(target, rank, arguments, results, seconds):
    faulthandler.dump_traceback_later(max(seconds - 10, 1), exit=True)  # a hung rank prints where it waits, then ends
    try:
        value = target(rank, *arguments)
    except BaseException:  # noqa: BLE001 - the test reports any rank's failure, whatever it was
        results.put((rank, "error", traceback.format_exc()))
        sys.exit(1)
    results.put((rank, "ok", value))


def run_ranks(target, ranks: int, arguments: tuple, seconds: float = 300) -> dict:
    """{rank: target(rank, *arguments)} from ``ranks`` spawned processes; an AssertionError naming the
    rank where one raised, died without reporting, outlived ``seconds`` or its report by EXIT_SECONDS."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=_report, args=(target, rank, arguments, results, seconds))
                 for rank in range(ranks)]
    for process in processes:
        process.start()
    try:
        values = _gather(processes, results, time.monotonic() + seconds)
        _joined(processes)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
    return values


def _gather(processes, results, deadline: float) -> dict:
    values, death_seen = {}, None
    while len(values) < len(processes):
        try:
            rank, status, value = results.get(timeout=1.0)
        except queue.Empty:
            silent = {rank: process.exitcode for rank, process in enumerate(processes)
                      if rank not in values and process.exitcode is not None}
            death_seen = death_seen or (time.monotonic() if silent else None)
            assert not silent or time.monotonic() < death_seen + 5, f"ranks exited without reporting: {silent}"
            missing = sorted(set(range(len(processes))) - set(values))
            assert time.monotonic() < deadline, f"ranks {missing} did not report in time"
            continue
        assert status == "ok", f"rank {rank} failed:\n{value}"
        values[rank] = value
    return values


def _joined(processes) -> None:
    for rank, process in enumerate(processes):
        process.join(EXIT_SECONDS)
        assert not process.is_alive(), f"rank {rank} (pid {process.pid}) outlived its report by {EXIT_SECONDS} s"
        assert process.exitcode == 0, f"rank {rank} exited with {process.exitcode}"
