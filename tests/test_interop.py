"""Network checkpoints in both formats: our .npz and the C++ original's directory of .bin files."""

import struct

import numpy as np
import pytest

from cudnnnet import Network, Tensor
from cudnnnet.io.checkpoint import save_npz, write_original
from cudnnnet.errors import CheckpointError, InvalidArgumentError
from cudnnnet.layers import Activation, BatchNorm, Conv2D, Dense, Pooling, Softmax

# ---- a network small enough to write its files by hand --------------------------------------

# conv1: 3 filters of 2x2 over one channel, weight[k, 0, r, c] = 4·k + 2·r + c - 6, (out, in, k, k)
CONV_WEIGHT = (np.arange(12, dtype=np.float32) - 6).reshape(3, 1, 2, 2)
CONV_BIAS = np.array([0.5, -0.5, 0.25], np.float32)
# fc1: Dense 3 -> 2 with weight[o, i] = 10·o + i, our layout (out, in, 1, 1)
DENSE_WEIGHT = np.array([[0, 1, 2], [10, 11, 12]], np.float32).reshape(2, 3, 1, 1)
DENSE_BIAS = np.array([1.0, -2.0], np.float32)

# The same weights as the C++ original writes them, byte by byte.
HAND_MADE_FILES = {
    "conv1.bin": struct.pack("<12f", *range(-6, 6)),  # (out, in, k, k) row-major
    "conv1.bias.bin": struct.pack("<3f", 0.5, -0.5, 0.25),
    "fc1.bin": struct.pack("<6f", 0, 1, 2, 10, 11, 12),  # (in, out) column-major: element (i, o) at o·in + i
    "fc1.bias.bin": struct.pack("<2f", 1.0, -2.0),
}


def tiny_network(backend):
    """Conv2D 1 -> 3 (kernel 2) on a 2x2 input, giving 3 values, then Dense 3 -> 2 and Softmax."""
    network = Network(backend=backend, layers=[Conv2D("conv1", 3, 2), Dense("fc1", 2), Softmax("softmax")])
    return network.build((1, 2, 2))


def tiny_weights(network):
    """The hand-chosen weights, shaped as ``network`` holds them."""
    shapes = {name: value.shape for name, value in network.parameters().items()}
    values = {"conv1.weight": CONV_WEIGHT, "conv1.bias": CONV_BIAS, "fc1.weight": DENSE_WEIGHT, "fc1.bias": DENSE_BIAS}
    return {name: value.reshape(shapes[name]) for name, value in values.items()}


def write_hand_made_files(directory):
    directory.mkdir()
    for name, blob in HAND_MADE_FILES.items():
        (directory / name).write_bytes(blob)


def original_forward(files, x):
    """The original's forward pass read straight from its bytes: cross-correlation, then y = Wᵀ·h + b, softmax.

    W is the (in × out) column-major matrix cuBLAS multiplies with: element (i, o) at offset o·in + i.
    """
    conv_weight, conv_bias = struct.unpack("<12f", files["conv1.bin"]), struct.unpack("<3f", files["conv1.bias.bin"])
    dense_weight, dense_bias = struct.unpack("<6f", files["fc1.bin"]), struct.unpack("<2f", files["fc1.bias.bin"])
    probabilities = []
    for sample in x[:, 0]:
        hidden = [sum(conv_weight[4 * k + 2 * r + c] * sample[r, c] for r in range(2) for c in range(2)) + conv_bias[k]
                  for k in range(3)]
        logits = np.array([sum(dense_weight[o * 3 + i] * hidden[i] for i in range(3)) + dense_bias[o] for o in range(2)])
        exponentials = np.exp(logits - logits.max())
        probabilities.append(exponentials / exponentials.sum())
    return np.array(probabilities)


def test_save_original_writes_the_hand_made_bytes(backend, tmp_path):
    network = tiny_network(backend)
    network.load_state_dict(tiny_weights(network))
    network.save_original(tmp_path / "pretrained")
    assert sorted(path.name for path in (tmp_path / "pretrained").iterdir()) == sorted(HAND_MADE_FILES)
    for name, blob in HAND_MADE_FILES.items():
        assert (tmp_path / "pretrained" / name).read_bytes() == blob, name


def test_load_original_reads_hand_written_files_as_the_original_means_them(backend, tmp_path):
    write_hand_made_files(tmp_path / "pretrained")
    network = tiny_network(backend)
    network.load_original(tmp_path / "pretrained")
    for name, expected in tiny_weights(network).items():
        np.testing.assert_array_equal(network.state_dict()[name], expected, err_msg=name)
    x = np.random.default_rng(0).uniform(-0.01, 0.01, (5, 1, 2, 2)).astype(np.float32)
    output = network.predict(Tensor.from_numpy(x, backend)).numpy().reshape(5, 2)
    expected = original_forward(HAND_MADE_FILES, x.astype(np.float64))
    assert 0.05 < expected[:, 0].min() and expected[:, 0].max() < 0.95  # not saturated: the check has teeth
    np.testing.assert_allclose(output, expected, rtol=1e-5, atol=1e-6)


# ---- round trips ------------------------------------------------------------------------------


def small_cnn(backend, seed=0, hidden=16):
    """Conv, pooling, then Dense: the Dense layer reads the pooled (C, H, W) values flattened."""
    network = Network(backend=backend, seed=seed)
    for layer in (Conv2D("conv1", 4, 3), Activation("relu1", "relu"), Pooling("pool1", 2), Dense("fc1", hidden),
                  Activation("tanh1", "tanh"), Dense("fc2", 10), Softmax("softmax")):
        network.add_layer(layer)
    return network.build((1, 10, 10))


def sample_inputs(backend, count=6):
    x = np.random.default_rng(1).standard_normal((count, 1, 10, 10)).astype(np.float32)
    return Tensor.from_numpy(x, backend)


def assert_same_state(actual: dict, expected: dict):
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_array_equal(actual[name], value, err_msg=name)


def test_original_round_trip_gives_the_same_weights_and_predictions(backend, tmp_path):
    source = small_cnn(backend, seed=3)
    source.save_original(tmp_path / "pretrained")
    destination = small_cnn(backend, seed=4)
    destination.load_original(tmp_path / "pretrained")
    assert_same_state(destination.state_dict(), source.state_dict())
    np.testing.assert_array_equal(destination.predict(sample_inputs(backend)).numpy(),
                                  source.predict(sample_inputs(backend)).numpy())


def test_npz_round_trip_rebuilds_the_network_without_training(backend, tmp_path):
    source = small_cnn(backend, seed=3)
    source.save(tmp_path / "model.npz")
    loaded = Network.load(tmp_path / "model.npz", backend=backend)
    assert loaded.spec() == source.spec() and loaded.input_shape == source.input_shape
    assert_same_state(loaded.state_dict(), source.state_dict())
    np.testing.assert_array_equal(loaded.predict(sample_inputs(backend)).numpy(),
                                  source.predict(sample_inputs(backend)).numpy())


def test_the_two_formats_carry_the_same_weights(backend, tmp_path):
    source = small_cnn(backend, seed=3)
    source.save(tmp_path / "model.npz")
    source.save_original(tmp_path / "pretrained")
    from_original = small_cnn(backend, seed=5)
    from_original.load_original(tmp_path / "pretrained")
    assert_same_state(from_original.state_dict(), Network.load(tmp_path / "model.npz", backend=backend).state_dict())


def test_an_unbuilt_network_cannot_save_or_load_the_original_files(tmp_path):
    network = Network(layers=[Dense("fc1", 2), Softmax("softmax")])
    with pytest.raises(InvalidArgumentError, match="not built"):
        network.save_original(tmp_path)
    with pytest.raises(InvalidArgumentError, match="not built"):
        network.load_original(tmp_path)


def test_a_network_with_running_statistics_is_refused_by_the_original_files_naming_them(backend, tmp_path):
    """predict --weights BIN_DIR --config of a BatchNorm network said only 'bn.running_mean: missing from the
    checkpoint', naming neither the folder nor why the files cannot hold it."""
    def network():
        return Network(backend=backend, layers=[Dense("fc", 3), BatchNorm("bn"), Softmax("softmax")]).build((1, 2, 2))

    weights = {name: value for name, value in network().state_dict().items() if "running" not in name}
    write_original(tmp_path / "pretrained", weights)  # .bin files of its weights and biases
    with pytest.raises(CheckpointError, match=r"pretrained: the original's \.bin files hold weights and biases only, "
                                              r"and this network also needs bn\.running_mean, bn\.running_var "
                                              r"\(BatchNorm's running statistics\); load it from a cudnnnet checkpoint"):
        network().load_original(tmp_path / "pretrained")


# ---- bad checkpoints change nothing ----------------------------------------------------------


def truncate(path, keep_bytes):
    path.write_bytes(path.read_bytes()[:keep_bytes])


def corrupt_bin_files(case, directory, backend):
    """Spoil a good .bin directory; returns the pattern the error must match."""
    if case == "last file truncated":
        truncate(directory / "fc2.bias.bin", 36)
        return r"fc2\.bias\.bin: expected 40 bytes .* found 36 bytes"
    if case == "file missing":
        (directory / "conv1.bias.bin").unlink()
        return r"conv1\.bias\.bin: missing"
    if case == "other architecture":
        small_cnn(backend, hidden=20).save_original(directory)
        return r"fc1\.bin: expected 4096 bytes .* found 5120 bytes"
    if case == "not finite":
        (directory / "fc2.bin").write_bytes(struct.pack("<f", float("nan")) * 160)
        return r"fc2\.bin: fc2\.weight holds NaN"
    (directory / "fc1.bin").unlink()
    (directory / "fc1.bin").mkdir()
    return r"fc1\.bin: missing"


@pytest.mark.parametrize("case", ["last file truncated", "file missing", "other architecture", "not finite",
                                  "folder in place of a file"])
def test_a_bad_bin_directory_is_named_and_changes_no_weight(backend, tmp_path, case):
    small_cnn(backend, seed=1).save_original(tmp_path)
    pattern = corrupt_bin_files(case, tmp_path, backend)
    network = small_cnn(backend, seed=2)
    before = network.state_dict()
    with pytest.raises(CheckpointError, match=pattern):
        network.load_original(tmp_path)
    assert_same_state(network.state_dict(), before)


def test_a_missing_bin_directory_is_named(backend, tmp_path):
    network = small_cnn(backend)
    with pytest.raises(CheckpointError, match="absent: no such pretrained-parameter directory"):
        network.load_original(tmp_path / "absent")


def corrupt_npz(case, path, backend):
    """Spoil a good model.npz; returns the pattern the error must match."""
    if case == "truncated":
        truncate(path, path.stat().st_size // 2)
        return r"model\.npz: truncated or corrupt"
    if case == "bytes flipped":
        blob = bytearray(path.read_bytes())
        middle = len(blob) // 2
        blob[middle:middle + 64] = bytes(byte ^ 0xFF for byte in blob[middle:middle + 64])
        path.write_bytes(bytes(blob))
        return r"model\.npz: truncated or corrupt"
    if case == "other architecture":
        small_cnn(backend, hidden=20).save(path)
        return r"model\.npz: fc1\.weight: checkpoint has \(20, 64, 1, 1\), network needs \(16, 64, 1, 1\)"
    arrays = small_cnn(backend).state_dict()
    del arrays["fc2.bias"]
    save_npz(path, arrays, small_cnn(backend).metadata())
    return r"model\.npz: fc2\.bias: missing from the checkpoint"


@pytest.mark.parametrize("case", ["truncated", "bytes flipped", "other architecture", "parameter missing"])
def test_a_bad_npz_is_named_and_changes_no_weight(backend, tmp_path, case):
    path = tmp_path / "model.npz"
    small_cnn(backend, seed=1).save(path)
    pattern = corrupt_npz(case, path, backend)
    network = small_cnn(backend, seed=2)
    before = network.state_dict()
    with pytest.raises(CheckpointError, match=pattern):
        network.load_weights(path)
    assert_same_state(network.state_dict(), before)
