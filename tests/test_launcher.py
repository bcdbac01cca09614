"""``cudnnnet-train --gpus N``'s process tree without GPUs: how the launcher waits for its ranks and
names the one that failed."""

import logging
import subprocess
import sys

from cudnnnet.train.distributed import launcher


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def test_a_rank_killed_by_a_signal_is_named_with_its_pid_and_signal_before_the_one_that_reacted(caplog):
    """Rank 1 is killed; rank 0 then exits with an error (as it does when its peer's connection
    closes). Both may end between two polls: the killed one is named, and its exit status returned."""
    reacting = _child("import time, sys; time.sleep(0.5); sys.exit(1)")
    killed = _child("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    with caplog.at_level(logging.ERROR, logger="cudnnnet"):
        code = launcher._wait([reacting, killed])
    assert code == 128 + 9
    assert f"rank 1 (pid {killed.pid}) was killed by SIGKILL" in caplog.text
    assert "rank 0" not in caplog.text


def test_every_rank_is_polled_while_an_earlier_one_still_runs(caplog):
    """Rank 1 fails at once while rank 0 trains on: the failure is reported before rank 0 ends."""
    running = _child("import time; time.sleep(3)")
    failing = _child("import sys; sys.exit(3)")
    with caplog.at_level(logging.ERROR, logger="cudnnnet"):
        code = launcher._wait([running, failing])
    assert code == 3
    assert f"rank 1 (pid {failing.pid}) exited with code 3; waiting up to" in caplog.text
