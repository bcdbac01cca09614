"""Faults from outside: a process killed while it writes a checkpoint, device memory over many networks.

(A NaN loss and Ctrl-C/SIGTERM during training are in test_training.py.)
"""

import gc
import os
import random
import signal
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cudnnnet.checkpoint import load_npz, save_npz
from cudnnnet.config import load_config
from cudnnnet.errors import CheckpointError
from cudnnnet.tensor import Tensor
from cudnnnet.training import build_network
from run_helpers import REPO_ROOT

VALUES = 4 << 20  # float32 values in the big array: a 16 MiB checkpoint, tens of milliseconds to write
KILLS = 5

# Saves versions first, first + 1, ... of a checkpoint over TARGET until it is killed. Version v
# holds arrays full of v and {"version": v}, so a torn file cannot pass for a complete one.
WRITER = """
import sys
import numpy as np
from cudnnnet.checkpoint import save_npz

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
