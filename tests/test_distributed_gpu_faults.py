"""``cudnnnet-train --gpus 2`` as a process tree on two real GPUs: every run ends, on every path, within
seconds, and a fault names its cause. Each test marks its processes with a variable of its own and
fails if any of them outlives the run by more than ``LINGER_SECONDS``."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from cudnnnet.train.outputs import checkpoint_to_resume
from run_helpers import REPO_ROOT
from test_distributed_gpu import gpu_count

pytestmark = pytest.mark.gpu

LINGER_SECONDS = 5.0  # the longest any process of a run may live on after the launcher returned
MARKER = "CUDNNNET_TEST_RUN"


@pytest.fixture
def two_gpus():
    if gpu_count() < 2:
        pytest.skip("needs 2 GPUs of one host")


class Run:
    """``python -m cudnnnet.cli.launch ARGS`` (or ``program ARGS``) with a marker in its environment (its
    ranks inherit it)."""

    def __init__(self, *arguments: str, environment: dict | None = None, program: list[str] | None = None):
        self.marker = uuid.uuid4().hex
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), MARKER: self.marker, "PYTHONUNBUFFERED": "1",
               "CUDNNNET_HEARTBEAT_TIMEOUT": "10", **(environment or {})}
        program = program or [sys.executable, "-m", "cudnnnet.cli.launch"]
        self.process = subprocess.Popen([*program, *arguments], cwd=REPO_ROOT,
                                        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.started = time.monotonic()
        self.out, self.err = [], []
        self.readers = [threading.Thread(target=self._read, args=(stream, lines), daemon=True)
                        for stream, lines in ((self.process.stdout, self.out), (self.process.stderr, self.err))]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _read(stream, lines: list) -> None:
        for line in stream:
            lines.append(line)

    def wait_for_output(self, text: str, timeout: float = 120.0) -> None:
        """Until a line of stderr holds ``text``."""
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.err):
            assert time.monotonic() < deadline and self.process.poll() is None, "".join(self.err)[-4000:]
            time.sleep(0.1)

    def pids(self, rank: int | None = None) -> list[int]:
        """The live processes carrying this run's marker (of RANK ``rank`` where given)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                variables = dict(item.split("=", 1) for item in
                                 (entry / "environ").read_bytes().decode(errors="replace").split("\0") if "=" in item)
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if variables.get(MARKER) == self.marker and state != "Z" and (rank is None or variables.get("RANK") == str(rank)):
                found.append(int(entry.name))
        return found

    def wait_for_rank(self, rank: int, timeout: float = 120.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = self.pids(rank)
            if pids:
                return pids[0]
            time.sleep(0.2)
        raise AssertionError(f"rank {rank} never started")

    def finish(self, timeout: float) -> tuple[int, str, str, float]:
        """(exit code, stdout, stderr, seconds) of the launcher; asserts that nothing of the run lingers."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            self.process.wait()
            raise AssertionError(f"the run did not end within {timeout} s; its output:\n{''.join(self.err)[-4000:]}")
        ended = time.monotonic()
        for reader in self.readers:
            reader.join(LINGER_SECONDS)
        out, err = "".join(self.out), "".join(self.err)
        while self.pids() and time.monotonic() - ended < LINGER_SECONDS:
            time.sleep(0.1)
        lingering = self.pids()
        self.kill_all()
        assert not lingering, f"processes {lingering} outlived the launcher by over {LINGER_SECONDS} s\n{err[-4000:]}"
        return self.process.returncode, out, err, ended - self.started

    def kill_all(self) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _train(mnist_dir, output, *extra, quiet=True):
    return ("--config", "mnist_cnn", "--gpus", "2", "--device", "cuda", "--data-dir", str(mnist_dir),
            "--output", str(output), *(("--quiet",) if quiet else ()), *extra)


def _metrics(output) -> dict:
    return json.loads((checkpoint_to_resume(output).parent / "metrics.json").read_text())


@pytest.mark.parametrize("engine", ["fast", "slides"])
def test_a_finished_run_exits_within_seconds_of_publishing(two_gpus, mnist_dir, tmp_path, engine):
    """The step replays a CUDA graph holding the all-reduce: the graph is destroyed before the
    communicator (NCCL waits for it), and every process is gone within seconds of the outputs."""
    output = tmp_path / "run"
    run = Run(*_train(mnist_dir, output, "--steps", "120", "--batch-size", "128", "--engine", engine))
    code, out, err, _ = run.finish(timeout=300)
    assert code == 0, err[-4000:]
    published = (checkpoint_to_resume(output).parent / "metrics.json").stat().st_mtime
    assert time.time() - published < 15.0, "the launcher returned long after the outputs were written"
    assert _metrics(output)["gpus"] == 2 and _metrics(output)["steps"] == 120


def test_a_rank_killed_is_named_with_its_pid_and_signal_and_the_others_exit(two_gpus, mnist_dir, tmp_path):
    run = Run(*_train(mnist_dir, tmp_path / "run", "--epochs", "50"))
    pid = run.wait_for_rank(1)
    time.sleep(12.0)  # into the training steps
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    code, _, err, _ = run.finish(timeout=60)
    assert code != 0
    assert f"rank 1 (pid {pid}) was killed by SIGKILL" in err, err[-4000:]
    assert "comm argument is NULL" not in err
    assert time.monotonic() - killed < 10 + 15, "the others outlived the heartbeat timeout"


def test_sigterm_to_the_launcher_checkpoints_once_and_resume_reaches_the_same_step(two_gpus, mnist_dir, tmp_path):
    epochs = "6"
    whole = Run(*_train(mnist_dir, tmp_path / "whole", "--epochs", epochs, "--engine", "fast"))
    assert whole.finish(timeout=300)[0] == 0
    steps = _metrics(tmp_path / "whole")["steps"]
    output = tmp_path / "stopped"
    run = Run(*_train(mnist_dir, output, "--epochs", epochs, "--engine", "fast", quiet=False))
    run.wait_for_output("epoch 1:")
    run.process.send_signal(signal.SIGTERM)
    code, _, err, _ = run.finish(timeout=120)
    assert code == 128 + signal.SIGTERM, err[-4000:]
    assert err.count("interrupted by SIGTERM") == 1, err[-4000:]
    stopped_at = _metrics(output)["steps"]
    assert 0 < stopped_at < steps, err[-4000:]
    resumed = Run("--resume", str(output), *_train(mnist_dir, output, "--epochs", epochs, "--engine", "fast"))
    code, _, err, _ = resumed.finish(timeout=300)
    assert code == 0, err[-4000:]
    assert _metrics(output)["steps"] == steps
    assert abs(_metrics(output)["test_accuracy"] - _metrics(tmp_path / "whole")["test_accuracy"]) < 0.005


def test_out_of_memory_on_one_gpu_ends_the_run_naming_that_rank(two_gpus, mnist_dir, tmp_path):
    """GPU 1 is filled by another process first; its rank fails, the other exits within the heartbeat timeout."""
    filler = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from cudnnnet.backends.cuda.bindings import runtime\n"
         "runtime.load(); runtime.set_device(0)\n"
         "free, _ = runtime.mem_get_info()\n"
         "runtime.malloc(free - (64 << 20)); print('full', flush=True); time.sleep(600)"],
        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "CUDA_VISIBLE_DEVICES": "1"},
        stdout=subprocess.PIPE, text=True)
    try:
        assert filler.stdout.readline().strip() == "full"
        output = tmp_path / "run"
        run = Run(*_train(mnist_dir, output, "--steps", "200"))
        code, _, err, _ = run.finish(timeout=120)
    finally:
        filler.kill()
        filler.wait()
    assert code != 0
    assert "rank 1" in err and "memory" in err.lower(), err[-4000:]
    assert not (output / "model.npz").exists()


def test_a_rank_that_never_arrives_ends_at_the_rendezvous_deadline(mnist_dir, tmp_path):
    """Rank 0 of 2 alone (one GPU suffices): one line naming the missing rank, within the deadline."""
    from cudnnnet.backends import cuda_available
    from cudnnnet.train.distributed.launcher import free_port

    if not cuda_available():
        pytest.skip("no usable GPU or CUDA libraries")
    environment = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(free_port()), "CUDNNNET_RENDEZVOUS_TIMEOUT": "5"}
    run = Run("--config", "mnist_mlp", "--device", "cuda", "--data-dir", str(mnist_dir), "--output",
              str(tmp_path / "run"), "--quiet", environment=environment)
    code, _, err, seconds = run.finish(timeout=60)
    assert code != 0 and seconds < 30
    lines = [line for line in err.splitlines() if line.startswith("cudnnnet-train")]
    assert len(lines) == 1 and re.search(r"\branks? 1\b", lines[0]), err[-4000:]


# ---- the launchers of clusters, on one host -------------------------------------------------------------------
def _weights_in(output) -> dict:
    with np.load(checkpoint_to_resume(output)) as arrays:
        return {name: arrays[name] for name in arrays.files if arrays[name].dtype == np.float32}


@pytest.mark.parametrize("launcher", ["torchrun", "Slurm", "Open MPI"])
def test_the_cluster_launchers_reach_the_weights_of_gpus_2(two_gpus, mnist_dir, tmp_path, launcher):
    from cudnnnet.train.distributed.launcher import free_port

    arguments = ["--config", "mnist_cnn", "--device", "cuda", "--data-dir", str(mnist_dir), "--steps", "40",
                 "--engine", "fast", "--quiet"]
    # a first run times every GEMM and convolution plan of batch 32 into the plan cache: two ranks timing
    # at once may each pick another algorithm, whose rounding differs; every run after reads the same plans
    warm = Run(*arguments, "--gpus", "2", "--output", str(tmp_path / "warm"))
    assert warm.finish(timeout=300)[0] == 0
    reference = Run(*arguments, "--gpus", "2", "--output", str(tmp_path / "gpus"))
    assert reference.finish(timeout=300)[0] == 0
    port, output = free_port(), tmp_path / launcher.replace(" ", "_")
    where = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    if launcher == "torchrun":
        program = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                   "--rdzv-backend", "static", "--master-addr", "127.0.0.1", "--master-port", str(port)]
        runs = [Run(*arguments, "--output", str(output), environment={"CUDA_VISIBLE_DEVICES": str(rank)},
                    program=[*program, "--node-rank", str(rank), "-m", "cudnnnet.cli.launch"]) for rank in (0, 1)]
    else:
        names = {"Slurm": ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
                 "Open MPI": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK")}[launcher]
        runs = [Run(*arguments, "--output", str(output),
                    environment={"CUDA_VISIBLE_DEVICES": str(rank), **where, names[0]: str(rank), names[1]: "2",
                                 names[2]: "0"}) for rank in (0, 1)]
    for run in runs:
        code, _, err, _ = run.finish(timeout=300)
        assert code == 0, err[-4000:]
    expected = _weights_in(tmp_path / "gpus")
    reached = _weights_in(output)
    assert expected.keys() == reached.keys()
    for name, value in expected.items():
        np.testing.assert_allclose(reached[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_early_stopping_on_two_gpus_ends_every_rank_after_the_same_epoch(two_gpus, mnist_dir, tmp_path):
    """Patience 1 and a min_delta no loss can beat: rank 0's monitor stops the run after epoch 2, and both
    ranks leave the loop there, exit 0 and publish that epoch."""
    output = tmp_path / "run"
    run = Run(*_train(mnist_dir, output, "--epochs", "4", "--batch-size", "256",
                      "--set", "train.early_stopping={patience: 1, min_delta: 10}"))
    code, out, err, _ = run.finish(timeout=300)
    assert code == 0, err[-4000:]
    metrics = _metrics(output)
    assert metrics["gpus"] == 2 and metrics["epochs"] == 2
    assert metrics["early_stopping"]["stopped"] and metrics["early_stopping"]["stopped_epoch"] == 2
    history = (checkpoint_to_resume(output).parent / "history.csv").read_text().splitlines()
    assert len(history) == 1 + 2, history
