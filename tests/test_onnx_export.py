"""ONNX export (cudnnnet.interop.onnx_export): every shipped config and an image-folder RGB model run
in onnxruntime on the CPU give cudnnnet's host probabilities within 1e-5, from the pixels / 255 with
the checkpoint's padding and normalisation inside the graph."""

import dataclasses
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from cudnnnet import Network, Tensor
from cudnnnet.cli import export as export_cli
from cudnnnet.config.schema import load_config
from cudnnnet.errors import ExportError, MissingExtraError
from cudnnnet.float_images import to_float_images
from cudnnnet.layers import (MSE, Activation, BatchNorm, Conv2D, Dense, Dropout, GlobalAveragePooling, Layer, Pooling,
                             Softmax)
from cudnnnet.config.shipped import shipped_config_names
from cudnnnet.train.trainer import input_shape, model_mapping
from run_helpers import REPO_ROOT

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

IMAGE_FOLDER = {"shape": (3, 32, 32), "normalize": ((0.49, 0.48, 0.45), (0.25, 0.24, 0.26)), "classes": ("cat", "dog")}


def randomised(network: Network, seed: int) -> Network:
    """Every parameter and BatchNorm statistic drawn at random (running variances positive), as a
    trained network holds values far from the initial ones."""
    rng = np.random.default_rng(seed)
    state = {}
    for name, value in network.state_dict().items():
        scale = rng.uniform(0.5, 1.5, value.shape)
        draw = scale if name.endswith("running_var") else value * scale + rng.normal(0.0, 0.05, value.shape)
        state[name] = draw.astype(np.float32)
    network.load_state_dict(state)
    return network


def trained_checkpoint(name: str, tmp_path, seed: int = 0):
    """A checkpoint as cudnnnet-train writes one for the shipped config ``name`` (its classes, shape and
    normalisation filled in), with random weights: (path, its config)."""
    config = load_config(name)
    data = config.data
    if data.dataset == "image-folder":
        data = dataclasses.replace(data, channels=3, **IMAGE_FOLDER)
    if data.normalize == "computed":  # training writes the per-channel values it computed
        channels = input_shape(dataclasses.replace(config, data=data))[0]
        data = dataclasses.replace(data, normalize=tuple(values[:channels] for values in IMAGE_FOLDER["normalize"]))
    config = dataclasses.replace(config, data=data)
    network = randomised(Network.from_spec(model_mapping(config), input_shape(config), seed=seed), seed)
    with_moderate_scores(network, to_float_images(random_pixels(image_shape(config)), data.normalize, data.pad))
    path = tmp_path / f"{name}.npz"
    network.save(path, config=config.to_dict())
    return path, config


def with_moderate_scores(network: Network, x: np.ndarray) -> Network:
    """The last Dense layer's weight and bias scaled so that the scores of ``x`` have a standard deviation
    of 2: random weights saturate the softmax, where a difference in the exported graph could hide."""
    with network.evaluating():
        output = Tensor.from_numpy(x)
        for layer in network.layers[:-1]:
            output = layer.forward(output)
    factor = np.float32(2.0 / output.numpy().std())
    last = [layer for layer in network.layers if isinstance(layer, Dense)][-1]
    state = network.state_dict()
    for name in (f"{last.name}.weight", f"{last.name}.bias"):
        state[name] = state[name] * factor
    network.load_state_dict(state)
    return network


def image_shape(config) -> tuple[int, int, int]:
    """(C, H, W) of the images before the config's padding."""
    channels, height, width = input_shape(config)
    return channels, height - 2 * config.data.pad, width - 2 * config.data.pad


def random_pixels(shape, count=5, seed=1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, *shape), dtype=np.uint8)


def onnx_probabilities(path, scaled_pixels: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (output,) = session.run(None, {"pixels": scaled_pixels})
    return output


@pytest.mark.parametrize("name", shipped_config_names())
def test_every_shipped_config_gives_cudnnnets_probabilities_in_onnxruntime(name, tmp_path):
    path, config = trained_checkpoint(name, tmp_path)
    network = Network.load(path)
    network.export_onnx(tmp_path / "model.onnx")
    model = onnx.load(tmp_path / "model.onnx")
    onnx.checker.check_model(model, full_check=True)
    pixels = random_pixels(image_shape(config), seed=2)
    expected = network.predict(to_float_images(pixels, config.data.normalize, config.data.pad)).numpy()
    expected = expected.reshape(len(pixels), -1)
    actual = onnx_probabilities(tmp_path / "model.onnx", pixels.astype(np.float32) / np.float32(255))
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-5)
    assert np.ptp(expected, axis=0).max() > 1e-3  # the images' probabilities differ: the check has teeth


def test_the_metadata_names_the_classes_and_the_input(tmp_path):
    path, _ = trained_checkpoint("image_folder", tmp_path)
    Network.load(path).export_onnx(tmp_path / "model.onnx")
    model = onnx.load(tmp_path / "model.onnx")
    metadata = {entry.key: entry.value for entry in model.metadata_props}
    assert json.loads(metadata["classes"]) == ["cat", "dog"]
    assert json.loads(metadata["input_shape"]) == [3, 32, 32]
    assert json.loads(metadata["normalize"]) == {"mean": [0.49, 0.48, 0.45], "std": [0.25, 0.24, 0.26]}
    (graph_input,) = model.graph.input
    dims = graph_input.type.tensor_type.shape.dim
    assert graph_input.name == "pixels" and dims[0].dim_param == "N" and [d.dim_value for d in dims[1:]] == [3, 32, 32]
    assert [output.name for output in model.graph.output] == ["probabilities"]


def every_layer_network(loss) -> Network:
    """Each layer type and setting the exporter knows: all activation modes, both pooling modes with
    padding and strides, dilation, a convolution without bias, BatchNorm per channel and per value of a
    plane, Dropout, a Dense before a convolution."""
    layers = [Conv2D("conv1", 4, 3, padding=1, dilation=2, bias=False), BatchNorm("bn1"),
              Activation("elu1", "elu", 0.7), Pooling("max1", 3, padding=1, stride=2),
              BatchNorm("bn_values", mode="per_activation"), Activation("clip1", "clipped_relu", 0.8),
              Conv2D("conv2", 3, 2, stride=1), Activation("sigmoid1", "sigmoid"),
              Pooling("avg1", 2, padding=1, stride=1, mode="average"), Dropout("drop1", 0.5), Dense("fc1", 12),
              BatchNorm("bn2"), Activation("tanh1", "tanh"), Dense("fc2", 16), Activation("relu1", "relu"),
              Conv2D("conv3", 6, 1), GlobalAveragePooling("gap"), Dense("fc3", 5), loss]
    return Network(layers=layers).build((2, 9, 9))


@pytest.mark.parametrize("loss, output", [(Softmax("softmax"), "probabilities"), (MSE("mse"), "outputs")])
def test_every_layer_and_setting_matches_the_host_forward(loss, output, tmp_path):
    x = np.random.default_rng(2).uniform(0, 1, (4, 2, 9, 9)).astype(np.float32)
    network = with_moderate_scores(randomised(every_layer_network(loss), seed=3), x)
    network.export_onnx(tmp_path / "model.onnx")
    onnx.checker.check_model(onnx.load(tmp_path / "model.onnx"), full_check=True)
    expected = network.predict(x).numpy().reshape(4, -1)
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [value.name for value in session.get_outputs()] == [output]
    np.testing.assert_allclose(session.run(None, {"pixels": x})[0], expected, rtol=0, atol=1e-5)
    assert np.ptp(expected, axis=0).max() > 1e-3


def test_the_batch_dimension_is_free(tmp_path):
    path, _ = trained_checkpoint("mnist_mlp", tmp_path)
    network = Network.load(path)
    network.export_onnx(tmp_path / "model.onnx")
    for count in (1, 7):
        pixels = random_pixels((1, 28, 28), count).astype(np.float32) / np.float32(255)
        assert onnx_probabilities(tmp_path / "model.onnx", pixels).shape == (count, 10)


class Scale(Layer):
    """A layer of the user's own, which the exporter knows nothing of."""

    def forward(self, input):
        return input


def test_a_layer_onnx_cannot_express_is_refused_naming_it_and_nothing_is_written(tmp_path):
    network = Network(layers=[Dense("fc1", 4), Scale("my_scale"), Softmax("softmax")]).build((1, 2, 2))
    (tmp_path / "model.onnx").write_bytes(b"earlier")
    with pytest.raises(ExportError, match=r"layer 'my_scale' \(Scale\) cannot be expressed in ONNX"):
        network.export_onnx(tmp_path / "model.onnx")
    assert (tmp_path / "model.onnx").read_bytes() == b"earlier"


def test_without_the_onnx_package_export_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx raises ImportError
    network = Network(layers=[Dense("fc1", 4), Softmax("softmax")]).build((1, 2, 2))
    with pytest.raises(MissingExtraError, match=r"pip install 'cudnnnet\[onnx\]'"):
        network.export_onnx(tmp_path / "model.onnx")
    assert not (tmp_path / "model.onnx").exists()


# ---- cudnnnet-export ----------------------------------------------------------------------------


def test_the_command_exports_a_run_folder_to_onnx(tmp_path):
    path, config = trained_checkpoint("lenet5", tmp_path)
    (tmp_path / "run").mkdir()
    path.rename(tmp_path / "run" / "model.npz")
    assert export_cli.main(["--weights", str(tmp_path / "run"), "--format", "onnx", "--output",
                            str(tmp_path / "lenet5.onnx")]) == 0
    pixels = random_pixels((1, 28, 28))
    expected = Network.load(tmp_path / "run" / "model.npz").predict(
        to_float_images(pixels, config.data.normalize, config.data.pad)).numpy().reshape(len(pixels), -1)
    actual = onnx_probabilities(tmp_path / "lenet5.onnx", pixels.astype(np.float32) / np.float32(255))
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-5)


def test_python_m_exports_to_safetensors_which_loads_as_the_checkpoint(tmp_path):
    path, _ = trained_checkpoint("mnist_bn_cnn", tmp_path)
    result = subprocess.run([sys.executable, "-m", "cudnnnet.cli.export", "--weights", str(path), "--format",
                             "safetensors", "--output", str(tmp_path / "model.safetensors")],
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert result.returncode == 0, result.stderr
    original, exported = Network.load(path), Network.load(tmp_path / "model.safetensors")
    assert exported.spec() == original.spec()
    assert exported.checkpoint_metadata["config"] == original.checkpoint_metadata["config"]
    for name, value in original.state_dict().items():
        np.testing.assert_array_equal(exported.state_dict()[name], value, err_msg=name)


@pytest.mark.parametrize("output, message", [("model.onnx.zip", r"--output .*model\.onnx\.zip: a onnx file ends in "
                                                                r"\.onnx"),
                                              ("folder.onnx", r"folder\.onnx: is a folder")])
def test_a_bad_output_is_one_line_and_exit_2(output, message, tmp_path, capsys):
    path, _ = trained_checkpoint("mnist_mlp", tmp_path)
    (tmp_path / "folder.onnx").mkdir()
    assert export_cli.main(["--weights", str(path), "--format", "onnx", "--output", str(tmp_path / output)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and re.search(message, error)


def test_without_the_extra_the_command_says_which_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)
    path, _ = trained_checkpoint("mnist_mlp", tmp_path)
    assert export_cli.main(["--weights", str(path), "--format", "onnx", "--output", str(tmp_path / "m.onnx")]) == 2
    assert capsys.readouterr().err == ("cudnnnet-export: error: ONNX export needs the onnx package, which is not "
                                       "installed: pip install 'cudnnnet[onnx]'\n")


def test_the_original_bin_files_export_with_their_configs_preprocessing(tmp_path):
    config = load_config("lenet5")
    network = randomised(Network.from_spec(model_mapping(config), input_shape(config)), seed=4)
    network.save_original(tmp_path / "pretrained")
    assert export_cli.main(["--weights", str(tmp_path / "pretrained"), "--config", "lenet5", "--format", "onnx",
                            "--output", str(tmp_path / "lenet5.onnx")]) == 0
    model = onnx.load(tmp_path / "lenet5.onnx")
    metadata = {entry.key: entry.value for entry in model.metadata_props}
    assert json.loads(metadata["input_shape"]) == [1, 28, 28] and metadata["pad"] == "2"
    assert json.loads(metadata["classes"]) == [str(digit) for digit in range(10)]
    pixels = random_pixels((1, 28, 28))
    expected = network.predict(to_float_images(pixels, config.data.normalize, 2)).numpy().reshape(len(pixels), -1)
    actual = onnx_probabilities(tmp_path / "lenet5.onnx", pixels.astype(np.float32) / np.float32(255))
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-5)
