"""Faults from outside: a process killed while it writes a checkpoint or trains, a signal, a full disk,
two trainings in one folder, device memory over many networks.

(A NaN loss and Ctrl-C/SIGTERM during training are in test_training.py.)
"""

import errno
import gc
import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cudnnnet.io.checkpoint import load_npz, save_npz
from cudnnnet.config.schema import load_config
from cudnnnet.errors import CheckpointError
from cudnnnet.tensor import Tensor
from cudnnnet.train.trainer import build_network
from run_helpers import REPO_ROOT

VALUES = 4 << 20  # float32 values in the big array: a 16 MiB checkpoint, tens of milliseconds to write
KILLS = 5

# Saves versions first, first + 1, ... of a checkpoint over TARGET until it is killed. Version v
# holds arrays full of v and {"version": v}, so a torn file cannot pass for a complete one.
WRITER = """
import sys
import numpy as np
from cudnnnet.io.checkpoint import save_npz

target, first, values = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
print("ready", flush=True)
version = first
while True:
    save_npz(target, {"big": np.full(values, version, np.float32), "small": np.full(7, version, np.float32)},
             {"version": version})
    version += 1
"""


def check_complete_version(path) -> int:
    """The version of the checkpoint at ``path``; fails unless it is one complete version."""
    arrays, metadata = load_npz(path)
    version = metadata["version"]
    assert sorted(arrays) == ["big", "small"]
    assert arrays["big"].shape == (VALUES,) and arrays["small"].shape == (7,)
    assert (arrays["big"] == version).all() and (arrays["small"] == version).all()
    return version


def kill_while_writing(target, first: int, rng: random.Random) -> None:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(target), str(first), str(VALUES)],
                              stdout=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT)
    try:
        assert writer.stdout.readline().strip() == "ready"
        signal_after = rng.uniform(0.02, 0.4)
        assert writer.wait(timeout=signal_after) is None, "the writer stopped by itself"
    except subprocess.TimeoutExpired:
        pass
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
        writer.stdout.close()
    assert writer.returncode == -signal.SIGKILL


def test_kill_9_while_saving_never_leaves_a_torn_checkpoint(tmp_path):
    target = tmp_path / "model.npz"
    save_npz(target, {"big": np.zeros(VALUES, np.float32), "small": np.zeros(7, np.float32)}, {"version": 0})
    rng = random.Random(1234)
    versions = []
    for kill in range(KILLS):
        first = 1000 * (kill + 1)
        kill_while_writing(target, first, rng)
        version = check_complete_version(target)
        assert version == (versions[-1] if versions else 0) or first <= version < first + 1000
        versions.append(version)
        leftovers = [path.name for path in tmp_path.iterdir() if path != target]
        assert all(name.startswith(".model.npz.") and name.endswith(".tmp") for name in leftovers), leftovers
        assert [path.name for path in tmp_path.glob("*.npz")] == ["model.npz"]
    assert any(version >= 1000 for version in versions), "no save ever completed: the test proved nothing"


@pytest.mark.gpu
def test_no_device_memory_growth_across_network_lifetimes(cuda):
    """Build, train one step, destroy: after a warm-up, free device memory stays where it was."""
    config = load_config(REPO_ROOT / "configs" / "mnist_cnn.yaml")
    rng = np.random.default_rng(0)
    images = Tensor.from_numpy(rng.random((64, 1, 28, 28), dtype=np.float32), cuda)
    targets = Tensor.from_numpy(np.eye(10, dtype=np.float32)[rng.integers(0, 10, 64)], cuda)

    def one_lifetime():
        network = build_network(config, cuda)
        network.forward(images)
        network.backward(targets)
        network.update(0.01)
        cuda.synchronize()
        del network
        gc.collect()

    for _ in range(2):  # workspace, algorithm plans and kernels are allocated once per backend
        one_lifetime()
    free_before, _ = cuda.memory_info()
    for _ in range(20):
        one_lifetime()
    free_after, _ = cuda.memory_info()
    assert free_before - free_after <= 4 << 20, f"{(free_before - free_after) / 2**20:.1f} MiB lost over 20 networks"


# ---- damaged checkpoint files ------------------------------------------------------------------

_SMALL = {"fc.weight": np.arange(12, dtype=np.float32).reshape(3, 4, 1, 1), "fc.bias": np.ones(3, np.float32)}


@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("small") / "small.npz"
    save_npz(path, _SMALL, {"format": "test", "step": 3})
    return path.read_bytes()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 1200), flip=st.integers(0, 4000), bits=st.integers(1, 255))
def test_a_damaged_checkpoint_loads_unchanged_or_is_refused(tmp_path, small_checkpoint, cut, flip, bits):
    """A cut or a flipped byte anywhere: either CheckpointError, or exactly the arrays that were saved."""
    data = bytearray(small_checkpoint[:cut] if cut < len(small_checkpoint) else small_checkpoint)
    if data:
        data[flip % len(data)] ^= bits
    path = tmp_path / "damaged.npz"
    path.write_bytes(bytes(data))
    try:
        arrays, metadata = load_npz(path)
    except CheckpointError as error:
        assert "\n" not in str(error) and str(path) in str(error)
        return
    assert metadata == {"format": "test", "step": 3}
    assert arrays.keys() == _SMALL.keys() and all(np.array_equal(arrays[name], _SMALL[name]) for name in _SMALL)


# ---- an output folder's files are one set at every moment ------------------------------------

TRAIN = [sys.executable, str(REPO_ROOT / "scripts" / "train.py"), "--config",
         str(REPO_ROOT / "configs" / "mnist_mlp.yaml"), "--device", "host", "--quiet"]
SMALL_EPOCHS = ("--batch-size", "6000")  # 10 steps an epoch: a new set about every second on the host


def assert_one_consistent_set(output) -> int:
    """The folder's model.npz, metrics.json, history.csv and curves.png come from one moment of one
    run: the same step everywhere, the same history. Returns that step."""
    arrays, metadata = load_npz(output / "model.npz")
    metrics = json.loads((output / "metrics.json").read_text())
    rows = (output / "history.csv").read_text().splitlines()
    step = metadata["position"]["step"]
    assert metrics["steps"] == step
    assert len(rows) == 1 + len(metadata["history"])
    if metadata["history"]:
        assert rows[-1].split(",")[1] == str(metadata["history"][-1]["steps"])
        assert (output / "curves.png").read_bytes().startswith(b"\x89PNG")
    sets = [path.name for path in output.iterdir() if path.name.startswith(".set-")]
    assert os.readlink(output / "current") in sets
    return step


def train_until_published(mnist_dir, output, *extra: str, sets: int = 1):
    """A training into ``output`` started and waited for until it has published ``sets`` sets."""
    link = output / "current"
    published = lambda: os.readlink(link) if link.is_symlink() else None  # noqa: E731
    last = published()
    process = subprocess.Popen([*TRAIN, "--data-dir", str(mnist_dir), "--output", str(output), *extra],
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    seen = 0
    deadline = time.monotonic() + 120
    while seen < sets and time.monotonic() < deadline and process.poll() is None:
        target = published()
        if target != last:
            seen, last = seen + 1, target
        time.sleep(0.02)
    assert seen >= sets, process.stderr.read() if process.poll() is not None else "no set published in time"
    return process


def test_kill_9_mid_run_leaves_the_last_epoch_set_whole_and_resumes_from_the_folder(mnist_dir, tmp_path):
    output = tmp_path / "run"
    rng = random.Random(7)
    steps = []
    for _ in range(3):
        resume = ("--resume", str(output)) if steps else ()
        process = train_until_published(mnist_dir, output, *SMALL_EPOCHS, "--epochs", "40", *resume)
        time.sleep(rng.uniform(0.0, 1.0))
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        process.stderr.close()
        steps.append(assert_one_consistent_set(output))
        assert steps[-1] % 10 == 0, "every set of a run that is killed is an epoch's checkpoint"
    assert steps == sorted(steps) and steps[-1] > steps[0], steps
    finished = subprocess.run([*TRAIN, "--data-dir", str(mnist_dir), "--output", str(output), *SMALL_EPOCHS,
                               "--steps", str(steps[-1] + 3), "--resume", str(output)], capture_output=True, text=True)
    assert finished.returncode == 0, finished.stderr
    assert assert_one_consistent_set(output) == steps[-1] + 3
    hidden = [path.name for path in output.iterdir() if path.name.startswith(".")]
    assert len(hidden) == 1, f"leftovers of the killed runs: {hidden}"


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_mid_run_publishes_one_consistent_set(mnist_dir, tmp_path, signum, code):
    output = tmp_path / "run"
    process = train_until_published(mnist_dir, output, *SMALL_EPOCHS, "--epochs", "40")
    time.sleep(0.3)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == code, stderr
    step = assert_one_consistent_set(output)
    assert step > 10 and json.loads((output / "metrics.json").read_text())["interrupted"] is True
    assert [line for line in stderr.splitlines() if "Traceback" in line] == []


def test_a_second_training_into_a_busy_folder_is_refused_in_one_line(mnist_dir, tmp_path):
    output = tmp_path / "run"
    first = train_until_published(mnist_dir, output, *SMALL_EPOCHS, "--epochs", "40")
    try:
        second = subprocess.run([*TRAIN, "--data-dir", str(mnist_dir), "--output", str(output), "--steps", "2"],
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr
        assert second.stderr.splitlines() == [
            f"cudnnnet-train: error: --output {output}: another training is writing into this folder; "
            f"wait for it to finish or choose another --output"]
        assert first.poll() is None, "the first training must go on"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        first.stderr.close()
    assert_one_consistent_set(output)


def test_kill_9_of_an_overwriting_run_before_its_first_set_leaves_the_earlier_set_published(mnist_dir, tmp_path):
    output = tmp_path / "run"
    earlier = subprocess.run([*TRAIN, "--data-dir", str(mnist_dir), "--output", str(output), "--steps", "3"],
                             capture_output=True, text=True)
    assert earlier.returncode == 0, earlier.stderr
    before = {name: (output / name).read_bytes() for name in ("model.npz", "metrics.json", "history.csv")}
    earlier_set = os.readlink(output / "current")
    never = tmp_path / "never.yaml"  # one set at the end of 40 epochs: none before the kill
    never.write_text((REPO_ROOT / "configs" / "mnist_mlp.yaml").read_text().replace(
        "  log_every: 100\n", "  log_every: 100\n  checkpoint_every: never\n"))
    command = [*TRAIN[:3], str(never), "--device", "host", "--log-level", "INFO", "--data-dir", str(mnist_dir),
               "--output", str(output), "--epochs", "40", "--overwrite"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    try:
        for line in process.stderr:
            if "training " in line:
                break
        time.sleep(1.0)
        assert process.poll() is None, "the overwriting run ended before it was killed: the test proves nothing"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        process.stderr.close()
    assert os.readlink(output / "current") == earlier_set
    assert {name: (output / name).read_bytes() for name in before} == before
    assert assert_one_consistent_set(output) == 3


def test_a_full_disk_is_exit_1_in_one_line_and_the_published_set_stays(mnist_dir, tmp_path, monkeypatch, capsys):
    """The second set's writes fail with ENOSPC: the first set is still what the folder shows."""
    from cudnnnet.train import trainer as training
    from cudnnnet.cli import train

    output = tmp_path / "run"
    writes = {"count": 0}
    real_write = training.write_atomic

    def disk_fills_up(path, text):
        writes["count"] += 1
        if writes["count"] > 3:  # metrics.json, history.csv and config.yaml of the first set go through
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real_write(path, text)

    monkeypatch.setattr(training, "write_atomic", disk_fills_up)
    code = train.main(["--config", str(REPO_ROOT / "configs" / "mnist_mlp.yaml"), "--device", "host", "--data-dir",
                       str(mnist_dir), "--output", str(output), *SMALL_EPOCHS, "--epochs", "3", "--quiet"])
    stderr = capsys.readouterr().err
    assert code == 1, stderr
    assert stderr.splitlines() == [f"cudnnnet-train: error: cannot write the outputs into {output} (No space left on "
                                   f"device); the outputs published there before are intact"]
    assert assert_one_consistent_set(output) == 10
    assert len([path for path in output.iterdir() if path.name.startswith(".set-")]) == 1
