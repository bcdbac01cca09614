"""The multi-GPU tests' rank processes (rank_processes.run_ranks): a rank that raises or dies fails the
test at once, naming it, instead of leaving the test to wait out its timeout."""

import os
import time

import pytest

from rank_processes import run_ranks


def _square(rank, offset):
    return rank * rank + offset


def _rank_1_raises(rank):
    if rank == 1:
        raise ValueError("rank 1 broke")
    return rank


def _rank_1_dies(rank):
    if rank == 1:
        os._exit(3)
    time.sleep(60)  # rank 0 waits for a collective that rank 1 will never join


def test_every_rank_reports_what_it_returned():
    assert run_ranks(_square, 3, (10,), seconds=60) == {0: 10, 1: 11, 2: 14}


def test_a_rank_that_raises_fails_the_test_with_its_traceback():
    with pytest.raises(AssertionError, match=r"(?s)rank 1 failed:.*ValueError: rank 1 broke"):
        run_ranks(_rank_1_raises, 2, (), seconds=60)


def test_a_rank_that_dies_fails_the_test_within_seconds():
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"ranks exited without reporting: \{1: 3\}"):
        run_ranks(_rank_1_dies, 2, (), seconds=60)
    assert time.monotonic() - started < 30
