"""Checkpoints keep float32 master weights (issue 29, item 6): a model trained in ``math: bf16`` saves
float32 arrays, loads as float32 parameters, and evaluates and predicts in fp32, bf16 and fp16 alike;
a 16-bit tensor's values reach a checkpoint as float32."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

import cudnnnet
from cudnnnet.data.mnist import MNIST_MEAN, MNIST_STD, read_images, read_labels
from cudnnnet.io.checkpoint import METADATA_KEY, load_npz, save_npz
from cudnnnet.network import Network
from cudnnnet.precision import FLOAT32
from cudnnnet.tensor import Tensor
from run_helpers import REPO_ROOT, train_cli

TEST_DIGITS = 1000


def idx_file(mnist_dir, name: str):
    return next(path for path in sorted(mnist_dir.glob(f"{name}*")) if path.is_file())


@pytest.fixture(scope="module")
def bf16_checkpoint(mnist_dir, tmp_path_factory):
    """model.npz of configs/mnist_mlp.yaml trained 300 steps on the host in ``math: bf16``."""
    folder = tmp_path_factory.mktemp("bf16")
    config = folder / "mlp_bf16.yaml"
    config.write_text((REPO_ROOT / "configs" / "mnist_mlp.yaml").read_text() + "math: bf16\n")
    finished = train_cli(str(config), folder / "run", mnist_dir, "--steps", "300")
    assert finished.returncode == 0, finished.stderr
    return folder / "run" / "model.npz"


@pytest.fixture(scope="module")
def test_digits(mnist_dir):
    images = read_images(idx_file(mnist_dir, "t10k-images-idx3-ubyte"))[:TEST_DIGITS]
    labels = read_labels(idx_file(mnist_dir, "t10k-labels-idx1-ubyte"))[:TEST_DIGITS]
    return images, labels


def test_a_bf16_run_saves_every_array_as_float32(bf16_checkpoint):
    with zipfile.ZipFile(bf16_checkpoint) as archive:
        names = [name[: -len(".npy")] for name in archive.namelist() if name != f"{METADATA_KEY}.npy"]
    with np.load(bf16_checkpoint, allow_pickle=False) as arrays:
        dtypes = {name: arrays[name].dtype for name in names}
    assert {"fc1.weight", "fc2.bias", "optimizer.velocity.fc1.weight"} <= set(dtypes)
    assert set(dtypes.values()) == {np.dtype(np.float32)}


@pytest.mark.parametrize("math", ["fp32", "bf16", "fp16"])
def test_a_bf16_model_loads_float32_weights_and_evaluates_and_predicts_in_any_math(bf16_checkpoint, test_digits,
                                                                                  math):
    images, labels = test_digits
    saved, _ = load_npz(bf16_checkpoint)
    network = Network.load(bf16_checkpoint, backend="host")
    for name, value in network.parameters().items():
        assert value.dtype is FLOAT32
        np.testing.assert_array_equal(value.numpy(), saved[name].reshape(value.shape))
    x = ((images[:, None] / np.float32(255) - MNIST_MEAN) / MNIST_STD).astype(np.float32)
    fp32_scores = network.set_math("fp32").predict(x).numpy().reshape(len(images), -1)
    reference = fp32_scores.argmax(axis=1)
    scores = network.set_math(math).predict(x).numpy().reshape(len(images), -1)
    assert np.isfinite(scores).all()
    assert np.array_equal(scores, fp32_scores) == (math == "fp32")  # 16-bit operands round: the math took effect
    digits = scores.argmax(axis=1)
    assert np.mean(digits == labels) > 0.9
    assert np.mean(digits == reference) > 0.98
    predictions = cudnnnet.predict(network, images[:20])
    assert all(prediction.error is None for prediction in predictions)
    assert np.mean([prediction.digit for prediction in predictions] == labels[:20]) >= 0.8


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_16_bit_tensor_is_saved_as_its_float32_values(host, tmp_path, dtype):
    values = np.array([[1 + 2**-8, -3.25], [1e-3, 65519.0]], np.float32)
    tensor = Tensor.from_numpy(values, host, dtype=dtype)
    save_npz(tmp_path / "state.npz", {"state": tensor.numpy()}, {})
    with np.load(tmp_path / "state.npz", allow_pickle=False) as arrays:
        assert arrays["state"].dtype == np.float32
        np.testing.assert_array_equal(arrays["state"], tensor.numpy())
