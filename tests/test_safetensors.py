"""safetensors weight files (cudnnnet.interop.safetensors_file) and the PyTorch name and layout map
(cudnnnet.interop.torch_names): Network.save / Network.load / load_weights and --weights take them."""

import json
import struct

import numpy as np
import pytest

from cudnnnet import Network, Tensor
from cudnnnet.cli import predict as predict_cli
from cudnnnet.config.schema import load_config
from cudnnnet.errors import CheckpointError
from cudnnnet.interop.safetensors_file import load_safetensors, save_safetensors
from cudnnnet.layers import Activation, BatchNorm, Conv2D, Dense, Pooling, Softmax
from cudnnnet.train.trainer import input_shape, model_mapping


def bn_cnn(seed=0, backend="host"):
    """Conv (no bias), BatchNorm per channel, pooling, Dense, BatchNorm per value, Dense, Softmax."""
    layers = [Conv2D("conv1", 3, 3, bias=False), BatchNorm("bn1"), Activation("relu1", "relu"), Pooling("pool1", 2),
              Dense("fc1", 6), BatchNorm("bn2"), Activation("tanh1", "tanh"), Dense("fc2", 4), Softmax("softmax")]
    return Network(layers=layers, seed=seed, backend=backend).build((2, 8, 8))


def with_statistics(network, seed=1):
    """The running statistics set away from their initial 0 and 1, as after training."""
    rng = np.random.default_rng(seed)
    state = network.state_dict()
    for name in state:
        if "running" in name or name.startswith("bn"):
            state[name] = rng.uniform(0.5, 1.5, state[name].shape).astype(np.float32)
    network.load_state_dict(state)
    return network


def inputs(count=5):
    return np.random.default_rng(7).uniform(0, 1, (count, 2, 8, 8)).astype(np.float32)


def assert_same_state(actual, expected):
    assert actual.keys() == expected.keys()
    for name in expected:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)


def test_a_network_saved_as_safetensors_loads_with_its_model_buffers_and_config(tmp_path):
    source = with_statistics(bn_cnn(seed=3))
    config = load_config("mnist_mlp").to_dict()
    source.save(tmp_path / "model.safetensors", config=config)
    loaded = Network.load(tmp_path / "model.safetensors")
    assert loaded.spec() == source.spec() and loaded.input_shape == source.input_shape
    assert "bn1.running_mean" in loaded.state_dict() and "bn2.running_var" in loaded.state_dict()
    assert_same_state(loaded.state_dict(), source.state_dict())
    assert loaded.training_config.data.dataset == "mnist"
    np.testing.assert_array_equal(loaded.predict(inputs()).numpy(), source.predict(inputs()).numpy())


def test_load_weights_reads_a_safetensors_file_into_a_built_network(tmp_path):
    source = with_statistics(bn_cnn(seed=3))
    source.save(tmp_path / "model.safetensors")
    destination = bn_cnn(seed=4)
    destination.load_weights(tmp_path / "model.safetensors")
    assert_same_state(destination.state_dict(), source.state_dict())


def test_the_file_is_the_documented_layout(tmp_path):
    """8-byte length, a JSON header padded to 8 bytes, float32 row-major data in the declared ranges."""
    arrays = {"b": np.arange(3, dtype=np.float32), "a": np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5}
    save_safetensors(tmp_path / "x.safetensors", arrays, {"format": "cudnnnet-checkpoint", "k": [1, 2]})
    blob = (tmp_path / "x.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + length])
    assert length % 8 == 0
    assert json.loads(header["__metadata__"]["cudnnnet"]) == {"format": "cudnnnet-checkpoint", "k": [1, 2]}
    data = blob[8 + length:]
    for name, array in arrays.items():
        entry = header[name]
        begin, end = entry["data_offsets"]
        assert entry["dtype"] == "F32" and entry["shape"] == list(array.shape)
        np.testing.assert_array_equal(np.frombuffer(data[begin:end], "<f4").reshape(array.shape), array)


def test_the_safetensors_package_reads_our_files_and_we_read_its(tmp_path):
    numpy_api = pytest.importorskip("safetensors.numpy")
    source = with_statistics(bn_cnn(seed=3))
    source.save(tmp_path / "ours.safetensors")
    assert_same_state(numpy_api.load_file(tmp_path / "ours.safetensors"), source.state_dict())
    theirs = {name: value.astype(np.float64 if name.startswith("bn") else np.float32)
              for name, value in source.state_dict().items()}
    theirs["bn1.running_var"] = theirs["bn1.running_var"].astype(np.float16)
    numpy_api.save_file(theirs, tmp_path / "theirs.safetensors")
    arrays, metadata = load_safetensors(tmp_path / "theirs.safetensors")
    assert metadata == {}
    assert arrays.keys() == theirs.keys() and all(array.dtype == np.float32 for array in arrays.values())
    np.testing.assert_array_equal(arrays["bn1.running_var"], theirs["bn1.running_var"].astype(np.float32))
    np.testing.assert_array_equal(arrays["fc1.weight"], theirs["fc1.weight"])


def torch_layout(state: dict) -> dict:
    """A cudnnnet state as PyTorch lays out the same model: Linear (out, in), biases and BatchNorm (C,),
    BatchNorm's int64 num_batches_tracked, under DataParallel's ``module.`` prefix."""
    found = {}
    for name, value in state.items():
        if name.endswith(".weight") and value.ndim == 4 and value.shape[2:] == (1, 1) and name.startswith("fc"):
            value = value.reshape(value.shape[:2])
        elif value.shape.count(1) >= value.ndim - 1:
            value = value.reshape(-1)
        found[f"module.{name}"] = value
    found["module.bn1.num_batches_tracked"] = np.array(100, dtype=np.int64)
    return found


def write_safetensors(path, arrays: dict) -> None:
    """A safetensors file of ``arrays`` (float32 or int64) as any writer makes one, without metadata."""
    header, blobs, offset = {}, [], 0
    for name, array in arrays.items():
        blob = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": {"float32": "F32", "int64": "I64"}[str(array.dtype)], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs))


def test_a_pytorch_state_dict_is_mapped_by_name_and_layout(tmp_path):
    source = with_statistics(bn_cnn(seed=3))
    state = torch_layout(source.state_dict())
    assert state["module.fc1.weight"].shape == (6, 27) and state["module.bn1.weight"].shape == (3,)
    write_safetensors(tmp_path / "torch.safetensors", state)
    destination = bn_cnn(seed=4)
    destination.load_weights(tmp_path / "torch.safetensors")
    assert_same_state(destination.state_dict(), source.state_dict())
    np.testing.assert_array_equal(destination.predict(inputs()).numpy(), source.predict(inputs()).numpy())


def test_a_file_without_a_model_description_is_not_a_checkpoint_to_load(tmp_path):
    write_safetensors(tmp_path / "torch.safetensors", torch_layout(bn_cnn().state_dict()))
    with pytest.raises(CheckpointError, match=r"torch\.safetensors: a safetensors file without a cudnnnet model "
                                              r"description .* --config CONFIG"):
        Network.load(tmp_path / "torch.safetensors")


def test_a_pytorch_file_of_another_architecture_is_named_and_changes_nothing(tmp_path):
    state = torch_layout(bn_cnn().state_dict())
    state["module.fc2.weight"] = np.zeros((5, 6), np.float32)
    write_safetensors(tmp_path / "torch.safetensors", state)
    network = bn_cnn(seed=4)
    before = network.state_dict()
    with pytest.raises(CheckpointError, match=r"torch\.safetensors: fc2\.weight: checkpoint has \(5, 6\), network "
                                              r"needs \(4, 6, 1, 1\)"):
        network.load_weights(tmp_path / "torch.safetensors")
    assert_same_state(network.state_dict(), before)


def corrupt(case: str, path) -> str:
    """Spoil a good file; returns the pattern the error must match."""
    blob = bytearray(path.read_bytes())
    (length,) = struct.unpack("<Q", blob[:8])
    if case == "truncated":
        path.write_bytes(bytes(blob[:-10]))
        return r"truncated or corrupt safetensors file"
    if case == "header length beyond the file":
        path.write_bytes(struct.pack("<Q", len(blob)) + bytes(blob[8:]))
        return r"not a safetensors file, or a truncated one"
    if case == "header not JSON":
        blob[8:12] = b"\xff\xfe{["
        path.write_bytes(bytes(blob))
        return r"not a safetensors file \(its header is not UTF-8 JSON"
    if case == "overlapping tensors":
        header = json.loads(blob[8:8 + length])
        first, second = sorted((name for name in header if name != "__metadata__"),
                               key=lambda name: header[name]["data_offsets"])[:2]
        header[second]["data_offsets"] = [value - 4 for value in header[second]["data_offsets"]]
        encoded = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode().ljust(length)
        path.write_bytes(bytes(blob[:8]) + encoded + bytes(blob[8 + length:]))
        return rf"tensor '{second}' starts at byte"
    if case == "empty":
        path.write_bytes(b"")
        return r"empty \(0 bytes\)|truncated safetensors file"
    header = json.loads(blob[8:8 + length])
    header["fc1.weight"]["dtype"] = "C64"
    path.write_bytes(bytes(blob[:8]) + json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode().ljust(length) + bytes(blob[8 + length:]))
    return r"tensor 'fc1\.weight' has dtype 'C64'; readable are F32, F16, F64, BF16"


@pytest.mark.parametrize("case", ["truncated", "header length beyond the file", "header not JSON",
                                  "overlapping tensors", "empty", "unknown dtype"])
def test_a_bad_safetensors_file_is_named_and_changes_no_weight(case, tmp_path):
    path = tmp_path / "model.safetensors"
    bn_cnn(seed=1).save(path)
    pattern = corrupt(case, path)
    network = bn_cnn(seed=2)
    before = network.state_dict()
    with pytest.raises(CheckpointError, match=rf"model\.safetensors: .*({pattern})"):
        network.load_weights(path)
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        Network.load(path)
    assert_same_state(network.state_dict(), before)


def test_predict_takes_a_safetensors_checkpoint_and_a_pytorch_one_with_its_config(tmp_path, capsys):
    config = load_config("mnist_mlp")
    network = Network.from_spec(model_mapping(config), input_shape(config), seed=5)
    network.save(tmp_path / "model.safetensors", config=config.to_dict())
    write_safetensors(tmp_path / "torch.safetensors", torch_layout(network.state_dict()))
    digit = np.zeros((28, 28), np.uint8)
    digit[6:22, 12:16] = 255
    from PIL import Image

    Image.fromarray(digit).save(tmp_path / "one.png")
    outputs = []
    for arguments in (["--weights", str(tmp_path / "model.safetensors")],
                      ["--weights", str(tmp_path / "torch.safetensors"), "--config", "mnist_mlp"]):
        assert predict_cli.main([*arguments, "--json", "--device", "host", str(tmp_path / "one.png")]) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[0] == outputs[1] and len(outputs[0][0]["probabilities"]) == 10


@pytest.mark.gpu
def test_a_pytorch_model_saved_with_safetensors_predicts_as_pytorch_does(tmp_path):
    """The same architecture in PyTorch, its state_dict saved by safetensors.torch, loaded by name and
    layout (interop.torch_names): cudnnnet's probabilities on the GPU are PyTorch's."""
    torch = pytest.importorskip("torch")
    torch_safetensors = pytest.importorskip("safetensors.torch")
    from cudnnnet.backends import cuda_available

    if not cuda_available() or not torch.cuda.is_available():
        pytest.skip("needs a usable GPU for cudnnnet and for PyTorch")
    nn = torch.nn
    torch.manual_seed(0)
    model = nn.Module()
    model.conv1, model.bn1, model.pool1 = nn.Conv2d(2, 3, 3, bias=False), nn.BatchNorm2d(3), nn.MaxPool2d(2)
    model.fc1, model.bn2, model.fc2 = nn.Linear(27, 6), nn.BatchNorm1d(6), nn.Linear(6, 4)
    with torch.no_grad():
        for batch_norm in (model.bn1, model.bn2):
            batch_norm.running_mean.uniform_(-0.5, 0.5)
            batch_norm.running_var.uniform_(0.5, 1.5)
            batch_norm.weight.uniform_(0.5, 1.5)
            batch_norm.bias.uniform_(-0.5, 0.5)
    model.eval()

    def forward(x):
        h = model.pool1(torch.relu(model.bn1(model.conv1(x))))
        return torch.softmax(model.fc2(torch.tanh(model.bn2(model.fc1(torch.flatten(h, 1))))), dim=1)

    torch_safetensors.save_file(model.state_dict(), str(tmp_path / "torch.safetensors"))
    network = bn_cnn(seed=9, backend="cuda")
    network.load_weights(tmp_path / "torch.safetensors")
    with torch.no_grad():
        expected = forward(torch.from_numpy(inputs())).numpy()
    actual = network.predict(Tensor.from_numpy(inputs(), "cuda")).numpy().reshape(expected.shape)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
