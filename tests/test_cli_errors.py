"""Every way a user can plausibly get the command-line tools wrong, as the user runs them.

Each case checks: the exit code (2 for bad usage, config, data, checkpoint or image; 1 for a
runtime failure), exactly one non-empty line on stderr (with ``--quiet``) that names the problem, no
traceback (unless ``--debug``), and that the outputs of an earlier run in the output directory are
byte for byte what they were, with no file added.

Every table runs in-process through the tools' own ``main(argv)`` (fast), and a few cases of each
table run the real scripts in subprocesses. Neither can reach the internet or the user's cache.
"""

import gzip
import importlib
import json
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from cudnnnet.io.checkpoint import load_npz, save_npz
from cudnnnet.config.schema import load_config
from cudnnnet.data import mnist
from cudnnnet.network import OPTIMIZER_PREFIX, Network
from cudnnnet.optim.optimizers import SGD
from cudnnnet.train.trainer import build_network
from hostile_files import pyyaml_copies_merged_keys
from run_helpers import NO_NETWORK, REPO_ROOT, offline_tools

MLP_CONFIG = REPO_ROOT / "configs" / "mnist_mlp.yaml"
CNN_CONFIG = REPO_ROOT / "configs" / "mnist_cnn.yaml"

VALID_CONFIG = """\
model:
  - {type: dense, name: fc1, out_size: 32}
  - {type: activation, name: relu1, mode: relu}
  - {type: dense, name: fc2, out_size: 10}
  - {type: softmax, name: softmax}
train:
  batch_size: 32
  optimizer: {lr: 0.1}
"""


# ---- running the scripts ---------------------------------------------------------------------


@pytest.fixture
def cli(tmp_path):
    """cli(script, *arguments): run scripts/<script>.py with --quiet in tmp_path, offline."""
    env = {key: value for key, value in os.environ.items() if key not in ("CUDNNNET_DATA", "no_proxy", "NO_PROXY")}
    env.update(OPENBLAS_NUM_THREADS="1", XDG_CACHE_HOME=str(tmp_path / "cache"), http_proxy=NO_NETWORK,
               https_proxy=NO_NETWORK, HTTP_PROXY=NO_NETWORK, HTTPS_PROXY=NO_NETWORK)

    def run(script: str, *arguments, quiet: bool = True) -> subprocess.CompletedProcess:
        command = [sys.executable, str(REPO_ROOT / "scripts" / f"{script}.py"), *map(str, arguments)]
        command += ["--quiet"] if quiet else []
        return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)

    return run


@pytest.fixture
def tool(tmp_path):
    """tool(script, *arguments): cudnnnet.cli.<script>.main([..., "--quiet"]) with stdout and stderr captured."""
    with offline_tools(tmp_path) as call:
        yield call


def assert_one_line_error(finished: subprocess.CompletedProcess, script: str, code: int, pattern: str) -> str:
    """The run failed with ``code`` and one stderr line ``cudnnnet-SCRIPT: error: ...`` matching ``pattern``."""
    assert finished.returncode == code, finished.stderr
    lines = finished.stderr.splitlines()
    assert len(lines) == 1, f"expected one stderr line, got:\n{finished.stderr}"
    assert lines[0].startswith(f"cudnnnet-{script}: error: ") and lines[0].strip() != f"cudnnnet-{script}: error:"
    assert re.search(pattern, lines[0]), f"{pattern!r} not in {lines[0]!r}"
    assert "Traceback" not in finished.stderr and finished.stdout == ""
    return lines[0]


# ---- what a failing run must leave alone -------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> Path:
    """Checkpoints built in-process (no training): good ones, and each way a checkpoint can be bad."""
    folder = tmp_path_factory.mktemp("checkpoints")
    mlp_config, cnn_config = load_config(MLP_CONFIG), load_config(CNN_CONFIG)
    for name, config in (("mlp", mlp_config), ("cnn", cnn_config)):
        save_untrained(config, folder / f"{name}.npz")
    write_bad_checkpoints(folder, folder / "mlp.npz")
    return folder


def save_untrained(config, path: Path) -> None:
    """What an interrupted run of ``config`` saves after 3 steps: weights, optimiser state, position."""
    network = build_network(config, "host")
    optimizer = SGD(network, config.train.optimizer.lr, config.train.optimizer.momentum)
    network.save(path, extra_arrays=optimizer.state_arrays(OPTIMIZER_PREFIX), config=config.to_dict(), history=[],
                 position={"epoch": 0, "batch": 3, "step": 3})


def write_bad_checkpoints(folder: Path, good: Path) -> None:
    arrays, metadata = load_npz(good)
    save_npz(folder / "narrow.npz", {**arrays, "fc1.weight": arrays["fc1.weight"][:, :700]}, metadata)
    save_npz(folder / "nan.npz", {**arrays, "fc2.bias": np.full(arrays["fc2.bias"].shape, np.nan, np.float32)}, metadata)
    overflowing = {"fc1.bias": np.full(arrays["fc1.bias"].shape, 3e38, np.float32),
                   "fc2.weight": np.full(arrays["fc2.weight"].shape, 3e38, np.float32)}  # finite, but the scores are not
    save_npz(folder / "overflowing.npz", {**arrays, **overflowing}, metadata)
    save_npz(folder / "no_config.npz", arrays, {key: value for key, value in metadata.items() if key != "config"})
    save_npz(folder / "bad_history.npz", arrays, {**metadata, "history": [{"epoch": 1, "steps": "three"}]})
    eleven = [str(label) for label in range(11)]
    save_npz(folder / "eleven_classes.npz", arrays,
             {**metadata, "config": {**metadata["config"], "data": {**metadata["config"]["data"], "classes": eleven}}})
    save_npz(folder / "far_position.npz", arrays, {**metadata, "position": {"epoch": 10**30, "batch": 0, "step": 3}})
    save_npz(folder / "negative_position.npz", arrays, {**metadata, "position": {"epoch": -1, "batch": 3, "step": 3}})
    save_npz(folder / "epoch_past_steps.npz", arrays, {**metadata, "position": {"epoch": 2**31 - 1, "batch": 0,
                                                                               "step": 3}})
    save_npz(folder / "batch_past_epoch.npz", arrays, {**metadata, "position": {"epoch": 0, "batch": 2**31 - 1,
                                                                               "step": 2**31 - 1}})
    save_npz(folder / "far_on.npz", arrays, {**metadata, "position": {"epoch": 2**31 - 2, "batch": 0,
                                                                     "step": 2**31 - 2}})
    save_npz(folder / "negative_step.npz", {**arrays, f"{OPTIMIZER_PREFIX}step": np.array([-5.0], np.float32)}, metadata)
    (folder / "text.npz").write_text("model weights\n")
    (folder / "empty.npz").write_bytes(b"")
    (folder / "pickle.npz").write_bytes(pickle.dumps({"fc1.weight": [0.0]}))
    with np.load(good) as stored:  # a checkpoint whole but for one pickled member
        members = {name: stored[name] for name in stored.files}
    np.savez(folder / "objects.npz", **{**members, "fc1.weight": np.array([{"exploit": 1}], dtype=object)})
    (folder / "truncated.npz").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    Network.load(good).save_original(folder / "truncated_bin")
    (folder / "truncated_bin" / "fc2.bin").write_bytes((folder / "truncated_bin" / "fc2.bin").read_bytes()[:1000])


@pytest.fixture
def previous_run(tmp_path, checkpoints) -> Path:
    """An output folder holding what an earlier run wrote."""
    output = tmp_path / "out"
    output.mkdir()
    shutil.copy(checkpoints / "mlp.npz", output / "model.npz")
    (output / "metrics.json").write_text(json.dumps({"test_accuracy": 0.9876, "steps": 3}) + "\n")
    (output / "history.csv").write_text("epoch,steps\n1,3\n")
    return output


def snapshot(folder: Path) -> dict:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


@pytest.fixture
def untouched(previous_run):
    """The earlier run's folder; afterwards its files must be exactly as they were, none added."""
    before = snapshot(previous_run)
    yield previous_run
    assert snapshot(previous_run) == before


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


def train_args(config, data_dir, output, *extra):
    """A short training of ``config`` into ``output``, replacing what an earlier run published there
    (``untouched``): the failure under test comes first, and must leave that run as it was."""
    return ("--config", config, "--device", "host", "--data-dir", data_dir, "--output", output, "--steps", "2",
            "--overwrite", *extra)


def cases(table: dict, *names: str) -> list:
    """``pytest.param``s of the ``names`` in ``table`` (all of it when none is named)."""
    return [pytest.param(*table[name], id=name) for name in (names or table)]


# ---- config ---------------------------------------------------------------------------------

VALID_LAYERS = VALID_CONFIG.split("train:")[0]
VALID_TRAIN = "train:" + VALID_CONFIG.split("train:")[1]
MLP = "  - {type: dense, out_size: 10}\n  - {type: softmax}\n"

CONFIG_CASES = {
    "not YAML": ("model: [dense, {out_size: 10\n", r"bad\.yaml: not valid YAML: line \d+, column \d+"),
    "tab indentation": ("model:\n\t- {type: dense}\n", r"bad\.yaml: not valid YAML"),
    "empty": ("", r"bad\.yaml: the file is empty; a config needs at least model and train\.optimizer\.lr"),
    "only comments": ("# TODO\n", r"the file is empty"),
    "a list": ("- dense\n- softmax\n", r"the top level must be a mapping with keys model, data, train"),
    "unknown key": (VALID_CONFIG + "learning_rate: 0.1\n",
                    r"learning_rate: unknown key 'learning_rate'; valid keys: model, data, train, device, math"),
    "unknown layer key": ("model:\n  - {type: dense, units: 10}\n  - {type: softmax}\n" + VALID_TRAIN,
                          r"model\[0\]\.units: unknown key 'units' for a dense layer; valid keys: type, name, out_size"),
    "wrong type": ("model:\n  - {type: dense, out_size: ten}\n  - {type: softmax}\n" + VALID_TRAIN,
                   r"model\[0\]\.out_size: expected an integer > 0, got 'ten' \(string\)"),
    "float size": ("model:\n  - {type: dense, out_size: 10.5}\n  - {type: softmax}\n" + VALID_TRAIN,
                   r"model\[0\]\.out_size: expected an integer > 0, got 10\.5 \(number\)"),
    "lr as YAML 1.1 text": ("model:\n" + MLP + "train: {optimizer: {lr: 1e-3}}\n", r"write 1\.0e-3 or 0\.001"),
    "unknown layer kind": ("model:\n  - {type: lstm, out_size: 10}\n  - {type: softmax}\n" + VALID_TRAIN,
                           r"model\[0\]\.type: expected one of dense, activation, softmax, mse, conv2d, pooling, "
                           r"dropout, batchnorm, global_average_pooling, got 'lstm'"),
    "unknown activation": ("model:\n  - {type: dense, out_size: 10}\n  - {type: activation, mode: relu6}\n"
                           "  - {type: softmax}\n" + VALID_TRAIN,
                           r"model\[1\]\.mode: expected one of relu, sigmoid, tanh, clipped_relu, elu, got 'relu6'"),
    "unknown pooling mode": ("model:\n  - {type: pooling, kernel_size: 2, mode: min}\n" + MLP + VALID_TRAIN,
                             r"model\[0\]\.mode: expected one of max, average, got 'min'"),
    "zero size": ("model:\n  - {type: dense, out_size: 0}\n  - {type: softmax}\n" + VALID_TRAIN,
                  r"model\[0\]\.out_size: expected an integer > 0, got 0"),
    "negative kernel": ("model:\n  - {type: conv2d, out_channels: 4, kernel_size: -3}\n" + MLP + VALID_TRAIN,
                        r"model\[0\]\.kernel_size: expected an integer > 0, got -3"),
    "negative padding": ("model:\n  - {type: conv2d, out_channels: 4, kernel_size: 3, padding: -1}\n" + MLP
                         + VALID_TRAIN, r"model\[0\]\.padding: expected an integer >= 0, got -1"),
    "kernel larger than the image": (
        "model:\n  - {type: conv2d, out_channels: 4, kernel_size: 29}\n" + MLP + VALID_TRAIN,
        r"bad\.yaml: model\[0\] \(conv2d\): .*kernel 29 .*larger than its padded input 28×28"),
    "kernel larger than a pooled map": (
        "model:\n  - {type: pooling, kernel_size: 4}\n  - {type: conv2d, out_channels: 4, kernel_size: 9}\n" + MLP
        + VALID_TRAIN, r"bad\.yaml: model\[1\] \(conv2d\): .*kernel 9 .*larger than its padded input 7×7"),
    "pooling window larger than the image": (
        "model:\n  - {type: pooling, kernel_size: 40}\n" + MLP + VALID_TRAIN,
        r"bad\.yaml: model\[0\] \(pooling\): .*window 40 is larger than its padded input 28×28"),
    "dense before conv": (
        "model:\n  - {type: dense, out_size: 50}\n  - {type: conv2d, out_channels: 4, kernel_size: 3}\n" + MLP
        + VALID_TRAIN, r"bad\.yaml: model\[1\] \(conv2d\): .*a Dense layer before it leaves no spatial size"),
    "not ten classes": ("model:\n  - {type: dense, out_size: 7}\n  - {type: softmax}\n" + VALID_TRAIN,
                        r"bad\.yaml: model\[1\]: the model ends in outputs of shape \(7, 1, 1\) per image; "
                        r"mnist needs 10 class scores"),
    "no loss layer": ("model:\n  - {type: dense, out_size: 10}\n" + VALID_TRAIN,
                      r"model\[0\]\.type: the last layer must be a loss layer \(softmax or mse\), got 'dense'"),
    "loss layer not last": ("model:\n  - {type: softmax}\n  - {type: dense, out_size: 10}\n  - {type: softmax}\n"
                            + VALID_TRAIN, r"model\[0\]\.type: loss layer 'softmax' may only be the last layer"),
    "empty model": ("model: []\n" + VALID_TRAIN, r"model: expected a non-empty list of layers"),
    "duplicate names": ("model:\n  - {type: dense, name: fc, out_size: 10}\n  - {type: dense, name: fc, out_size: 10}"
                        "\n  - {type: softmax}\n" + VALID_TRAIN, r"model\[1\]\.name: duplicate layer name 'fc'"),
    "batch size 0": (VALID_LAYERS + "train: {batch_size: 0, optimizer: {lr: 0.1}}\n",
                     r"train\.batch_size: expected an integer > 0, got 0"),
    "learning rate 0": (VALID_LAYERS + "train: {optimizer: {lr: 0}}\n",
                        r"train\.optimizer\.lr: expected a number > 0, got 0"),
    "negative learning rate": (VALID_LAYERS + "train: {optimizer: {lr: -0.1}}\n",
                               r"train\.optimizer\.lr: expected a number > 0, got -0\.1"),
    "infinite learning rate": (VALID_LAYERS + "train: {optimizer: {lr: .inf}}\n", r"lr: .*not finite"),
    "no learning rate": (VALID_LAYERS + "train: {batch_size: 32}\n", r"train\.optimizer: missing required key"),
    "momentum 1": (VALID_LAYERS + "train: {optimizer: {lr: 0.1, momentum: 1.0}}\n",
                   r"train\.optimizer\.momentum: expected a number in \[0, 1\), got 1\.0"),
    "unknown device": (VALID_CONFIG + "device: gpu\n", r"device: expected one of auto, cuda, host, got 'gpu'"),
    "normalize std 0": (VALID_CONFIG + "data: {normalize: {mean: 0.1, std: 0}}\n",
                        r"data\.normalize\.std: expected a number > 0, got 0"),
    "normalize per channel of RGB for grey digits": (
        VALID_CONFIG + "data: {normalize: {mean: [0.5, 0.4, 0.3], std: [0.2, 0.2, 0.2]}}\n",
        r"bad\.yaml: data\.normalize\.mean: 3 values \(one per channel\) for mnist's images of 1 channel; give 1"),
    "YAML merges doubling at each line": (
        "m0: &m0 {k0: 1}\n" + "".join(f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}], k{i}: 1}}\n" for i in range(1, 40)),
        r"bad\.yaml: not valid YAML: line 14, column 6: the merges \(<<\) here bring more than 10000 keys into one "
        r"mapping" if pyyaml_copies_merged_keys() else r"bad\.yaml: m0: unknown key 'm0'"),
    "Python object tag": ('model: !!python/object/apply:os.system ["touch PWNED"]\n' + VALID_TRAIN,
                          r"bad\.yaml: line 1, column 8: refused the tag !!python/object/apply:os\.system: a config "
                          r"may not create Python objects"),
}


@pytest.mark.parametrize("text, pattern", cases(CONFIG_CASES))
def test_bad_config(tool, tmp_path, mnist_dir, untouched, text, pattern):
    finished = tool("train", *train_args(config_file(tmp_path, text), mnist_dir, untouched))
    assert_one_line_error(finished, "train", 2, pattern)
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("text, pattern", cases(CONFIG_CASES, "not YAML", "kernel larger than the image",
                                                "dense before conv", "not ten classes", "Python object tag"))
def test_bad_config_script(cli, tmp_path, mnist_dir, untouched, text, pattern):
    finished = cli("train", *train_args(config_file(tmp_path, text), mnist_dir, untouched))
    assert_one_line_error(finished, "train", 2, pattern)
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("make, pattern", [
    pytest.param(lambda folder: folder / "absent.yaml", r"config file .*absent\.yaml does not exist", id="missing"),
    pytest.param(lambda folder: folder, r"cannot read config file", id="a directory"),
    pytest.param(lambda folder: (folder / "binary.yaml", (folder / "binary.yaml").write_bytes(b"\xff\xd8\xff"))[0],
                 r"binary\.yaml: not UTF-8 text", id="binary"),
])
def test_config_file_that_cannot_be_read(tool, tmp_path, mnist_dir, untouched, make, pattern):
    finished = tool("train", *train_args(make(tmp_path), mnist_dir, untouched))
    assert_one_line_error(finished, "train", 2, pattern)


# ---- flags and the output directory --------------------------------------------------------------

FLAG_CASES = {
    "no config": ("train", [], r"the following arguments are required: --config \(see cudnnnet-train --help\)"),
    "batch 0": ("train", ["--config", MLP_CONFIG, "--batch-size", "0"],
                r"--batch-size: expected a positive integer, got 0"),
    "epochs -1": ("train", ["--config", MLP_CONFIG, "--epochs", "-1"], r"--epochs: expected a positive integer, got -1"),
    "steps text": ("train", ["--config", MLP_CONFIG, "--steps", "ten"],
                   r"--steps: expected a positive integer, got 'ten'"),
    "seed -1": ("train", ["--config", MLP_CONFIG, "--seed", "-1"], r"--seed: expected an integer >= 0, got -1"),
    "device gpu": ("train", ["--config", MLP_CONFIG, "--device", "gpu"], r"--device: invalid choice: 'gpu'"),
    "unknown flag": ("train", ["--config", MLP_CONFIG, "--lr", "0.1"], r"unrecognized arguments: --lr 0\.1"),
    "predict without weights": ("predict", ["digit.png"], r"the following arguments are required: --weights"),
    "predict without images": ("predict", ["--weights", "model.npz"], r"the following arguments are required: IMAGE"),
    "evaluate batch 0": ("evaluate", ["--weights", "model.npz", "--batch-size", "0"],
                         r"--batch-size: expected a positive integer"),
    "log level": ("evaluate", ["--weights", "model.npz", "--log-level", "LOUD"], r"--log-level: invalid choice: 'LOUD'"),
    "empty config": ("train", ["--config", ""], r"argument --config: expected a path, got an empty string"),
    "empty output": ("train", ["--config", MLP_CONFIG, "--output", ""],
                     r"argument --output: expected a path, got an empty string"),
    "empty resume": ("train", ["--config", MLP_CONFIG, "--resume", ""],
                     r"argument --resume: expected a path, got an empty string"),
    "empty weights": ("evaluate", ["--weights", ""], r"argument --weights: expected a path, got an empty string"),
    "evaluate empty data dir": ("evaluate", ["--weights", "model.npz", "--data-dir", ""],
                                r"argument --data-dir: expected a path, got an empty string"),
    "empty image": ("predict", ["--weights", "model.npz", ""], r"argument IMAGE: expected a path, got an empty string"),
    "benchmark empty json": ("benchmark", ["--json", ""], r"argument --json: expected a path, got an empty string"),
}


@pytest.mark.parametrize("script, arguments, pattern", cases(FLAG_CASES))
def test_bad_flags(tool, script, arguments, pattern):
    assert_one_line_error(tool(script, *arguments), script, 2, pattern)


@pytest.mark.parametrize("script, arguments, pattern", cases(FLAG_CASES, "no config", "batch 0", "empty output"))
def test_bad_flags_script(cli, script, arguments, pattern):
    assert_one_line_error(cli(script, *arguments), script, 2, pattern)


def broken_link(path: Path) -> Path:
    path.symlink_to(path.parent / "nowhere")
    return path


@pytest.mark.parametrize("make, pattern", [
    pytest.param(lambda output: output / "metrics.json", r"--output .*metrics\.json is a file, not a directory",
                 id="a file"),
    pytest.param(lambda output: output / "metrics.json" / "run", r"--output .*run: .*metrics\.json is a file",
                 id="under a file"),
    pytest.param(lambda output: broken_link(output.parent / "gone"),
                 r"--output .*gone: .*gone is a broken link \(to .*nowhere\); remove it or give another folder",
                 id="a broken link"),
    pytest.param(lambda output: broken_link(output.parent / "gone") / "run", r"--output .*run: .*gone is a broken link",
                 id="under a broken link"),
])
def test_an_output_that_cannot_be_a_directory(tool, mnist_dir, untouched, make, pattern):
    finished = tool("train", *train_args(MLP_CONFIG, mnist_dir, untouched / "unused", "--output", make(untouched)))
    assert_one_line_error(finished, "train", 2, pattern)


# ---- data -----------------------------------------------------------------------------------

TRAIN_IMAGES, TRAIN_LABELS = mnist.SPLIT_FILES["train"]


def idx_bytes(array, dtype=np.uint8) -> bytes:
    array = np.asarray(array, dtype=dtype)
    return bytes([0, 0, mnist.UBYTE_CODE, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def few_images(count: int = 5, side: int = 28) -> bytes:
    """A gzip images file of ``count`` random digits: a well-formed IDX file that is not MNIST's."""
    return gzip.compress(idx_bytes(np.random.default_rng(0).integers(0, 256, (count, side, side))), compresslevel=1)


def few_labels(labels=(0, 1, 2, 3, 4)) -> bytes:
    return gzip.compress(idx_bytes(labels))


def flipped_middle_byte(data: bytes) -> bytes:
    data = bytearray(data)
    data[len(data) // 2] ^= 0xFF
    return bytes(data)


# name: (train images, train labels: bytes, or None for the real file, or a function of the real folder)
DATA_CASES = {
    "truncated gzip": (lambda real: (real / f"{TRAIN_IMAGES}.gz").read_bytes()[:65536], None,
                       r"train-images-idx3-ubyte\.gz: corrupt or truncated gzip data"),
    "corrupt gzip": (flipped_middle_byte(few_images(50)), few_labels([0] * 50),
                     r"train-images-idx3-ubyte\.gz: corrupt or truncated gzip data"),
    "an HTML page": (b"<!DOCTYPE html><title>404 Not Found</title>", None,
                     r"train-images-idx3-ubyte\.gz: not an IDX file \(magic \d+; MNIST uses 2051 for images and 2049"),
    "labels as images": (lambda real: (real / f"{TRAIN_LABELS}.gz").read_bytes(), None,
                         r"train-images-idx3-ubyte\.gz: magic 2049 is not an MNIST images file \(expected magic 2051"),
    "truncated IDX": (gzip.compress(idx_bytes(np.zeros((60000, 28, 28)))[:1016]), None,
                      r"train-images-idx3-ubyte\.gz: truncated: header dims \(60000, 28, 28\) call for 47040000 data "
                      r"bytes, found 1000"),
    "not 28 x 28": (few_images(side=32), few_labels(), r"images are 32×32, MNIST's are 28×28"),
    "no images": (few_images(0), few_labels(()), r"train-images-idx3-ubyte\.gz holds no images"),
    "count mismatch": (few_images(5), few_labels((0, 1, 2, 3)),
                       r"train-images-idx3-ubyte\.gz holds 5 images but .*train-labels-idx1-ubyte\.gz holds 4 labels"),
    "label out of range": (few_images(5), few_labels((0, 1, 2, 10, 4)),
                           r"train-labels-idx1-ubyte\.gz: label 10 at index 3 is outside 0\.\.9"),
    "wrong checksum": (few_images(5), few_labels(),
                       r"train-images-idx3-ubyte\.gz: checksum mismatch: the uncompressed data has MD5 [0-9a-f]{32}, "
                       r"MNIST's train-images-idx3-ubyte has 6bbc9ace898e44ae57da46a324031adb; the file is damaged or not "
                       r"MNIST's: delete it so it is downloaded again, or check that --data-dir points at the MNIST "
                       r"files$"),
}


def data_dir_with(tmp_path: Path, real: Path, images, labels) -> Path:
    """The real MNIST (linked) with the train images and labels replaced where given."""
    folder = tmp_path / "mnist"
    folder.mkdir()
    for name, content in ((TRAIN_IMAGES, images), (TRAIN_LABELS, labels)):
        content = content(real) if callable(content) else content
        if content is None:
            (folder / f"{name}.gz").symlink_to(real / f"{name}.gz")
        else:
            (folder / f"{name}.gz").write_bytes(content)
    for name in mnist.SPLIT_FILES["test"]:
        (folder / f"{name}.gz").symlink_to(real / f"{name}.gz")
    return folder


def check_bad_data(run, tmp_path, mnist_dir, output, images, labels, pattern) -> None:
    data_dir = data_dir_with(tmp_path, mnist_dir, images, labels)
    before = snapshot(data_dir)
    assert_one_line_error(run("train", *train_args(MLP_CONFIG, data_dir, output)), "train", 2, pattern)
    assert snapshot(data_dir) == before


@pytest.mark.parametrize("images, labels, pattern", cases(DATA_CASES))
def test_bad_data(tool, tmp_path, mnist_dir, untouched, images, labels, pattern):
    check_bad_data(tool, tmp_path, mnist_dir, untouched, images, labels, pattern)


@pytest.mark.parametrize("images, labels, pattern", cases(DATA_CASES, "truncated gzip", "wrong checksum"))
def test_bad_data_script(cli, tmp_path, mnist_dir, untouched, images, labels, pattern):
    check_bad_data(cli, tmp_path, mnist_dir, untouched, images, labels, pattern)


def test_a_missing_data_file_is_named_when_it_cannot_be_downloaded(cli, tmp_path, mnist_dir, untouched):
    data_dir = data_dir_with(tmp_path, mnist_dir, None, None)
    (data_dir / f"{TRAIN_LABELS}.gz").unlink()
    finished = cli("train", *train_args(MLP_CONFIG, data_dir, untouched))
    assert_one_line_error(finished, "train", 2, r"MNIST train files missing from .*mnist: train-labels-idx1-ubyte"
                                                r"\(\.gz\), and could not download train-labels-idx1-ubyte\.gz")
    assert not (data_dir / f"{TRAIN_LABELS}.gz").exists() and not list(data_dir.glob(".*"))


@pytest.mark.parametrize("make, pattern", [
    pytest.param(lambda folder: folder / "nowhere", r"data directory .*nowhere does not exist or is not a directory",
                 id="missing"),
    pytest.param(lambda folder: config_file(folder, "x"),
                 r"data directory .*bad\.yaml does not exist or is not a directory", id="a file"),
])
def test_a_data_directory_that_is_not_one(tool, tmp_path, untouched, make, pattern):
    finished = tool("train", *train_args(MLP_CONFIG, make(tmp_path), untouched))
    assert_one_line_error(finished, "train", 2, pattern)


def test_evaluate_names_missing_test_data(tool, tmp_path, checkpoints):
    folder = tmp_path / "mnist"
    folder.mkdir()
    (folder / "t10k-images-idx3-ubyte.gz").write_bytes(few_images())
    finished = tool("evaluate", "--weights", checkpoints / "mlp.npz", "--data-dir", folder, "--device", "host")
    assert_one_line_error(finished, "evaluate", 2, r"MNIST test files missing from .*t10k-labels-idx1-ubyte\(\.gz\)")


def test_evaluate_reads_the_data_dir_the_checkpoint_was_trained_with(tool, tmp_path, mnist_dir):
    """Without --data-dir, the checkpoint config's data.dir (as --help says), not the empty user cache."""
    save_untrained(load_config(MLP_CONFIG).with_overrides(data_dir=mnist_dir), tmp_path / "trained_here.npz")
    finished = tool("evaluate", "--weights", tmp_path / "trained_here.npz", "--device", "host", "--json")
    assert finished.returncode == 0, finished.stderr
    assert len(json.loads(finished.stdout)["confusion_matrix"]) == 10


def test_a_relative_data_dir_names_the_same_folder_when_evaluate_runs_elsewhere(tmp_path, mnist_dir):
    """The README's train then evaluate, `--data-dir ../shared/data/mnist` relative to where training
    ran: evaluate without --data-dir, from a folder at another depth, reads that same folder."""
    trained_in, elsewhere = tmp_path / "project", tmp_path / "a" / "b" / "c"
    trained_in.mkdir()
    elsewhere.mkdir(parents=True)
    relative = os.path.relpath(mnist_dir, trained_in)
    with offline_tools(trained_in) as tool:
        finished = tool("train", "--config", MLP_CONFIG, "--device", "host", "--data-dir", relative, "--steps", "2",
                        "--output", "out")
    assert finished.returncode == 0, finished.stderr
    assert load_npz(trained_in / "out" / "model.npz")[1]["config"]["data"]["dir"] == os.path.abspath(trained_in / relative)
    with offline_tools(elsewhere) as tool:
        finished = tool("evaluate", "--weights", trained_in / "out", "--device", "host", "--json")
    assert finished.returncode == 0, finished.stderr
    assert sum(map(sum, json.loads(finished.stdout)["confusion_matrix"])) == 10_000


def test_evaluate_says_to_pass_data_dir_when_the_checkpoint_s_data_dir_is_gone(tool, tmp_path, mnist_dir):
    gone = tmp_path / "moved_away"
    gone.mkdir()
    save_untrained(load_config(MLP_CONFIG).with_overrides(data_dir=gone), tmp_path / "trained_there.npz")
    gone.rmdir()
    finished = tool("evaluate", "--weights", tmp_path / "trained_there.npz", "--device", "host")
    line = assert_one_line_error(finished, "evaluate", 2, r"trained_there\.npz: the data directory it was trained "
                                 r"with, .*moved_away \(its data\.dir\), does not exist or is not a directory; pass "
                                 r"--data-dir DIR, the folder holding its mnist test data$")
    assert f" {gone} " in line
    finished = tool("evaluate", "--weights", tmp_path / "trained_there.npz", "--device", "host", "--data-dir",
                    mnist_dir, "--json")
    assert finished.returncode == 0, finished.stderr


# ---- checkpoints ------------------------------------------------------------------------------

CHECKPOINT_CASES = {
    "missing": ("absent.npz", r"absent\.npz: no such checkpoint file"),
    "a directory": (".", r"checkpoints\d*: is a folder, not a checkpoint file"),
    "text": ("text.npz", r"text\.npz: not an \.npz checkpoint \(not a zip archive; starts with b'mode'\)"),
    "empty": ("empty.npz", r"empty\.npz: the checkpoint file is empty \(0 bytes\)"),
    "a raw pickle": ("pickle.npz", r"pickle\.npz: not an \.npz checkpoint \(not a zip archive"),
    "pickled objects": ("objects.npz", r"objects\.npz: array 'fc1\.weight' holds pickled Python objects; refused"),
    "truncated": ("truncated.npz", r"truncated\.npz: truncated or corrupt \.npz checkpoint"),
    "NaN weights": ("nan.npz", r"nan\.npz: fc2\.bias holds NaN or infinite values"),
}
RESUME_CASES = {
    **{name: case for name, case in CHECKPOINT_CASES.items() if name != "a directory"},
    "a folder without a checkpoint": (".", r"--resume .*checkpoints\d*: this folder holds no model\.npz; give an "
                                           r"output folder that a training wrote into, or a checkpoint file"),
    "another architecture": ("cnn.npz", r"cnn\.npz: trained with a different model than .*mnist_mlp\.yaml: model\[0\] "
                                        r"is conv2d 'conv1' \(.*kernel_size=5.*\) in the checkpoint, dense 'fc1' "
                                        r"\(out_size=500\) in the config"),
    "a malformed history": ("bad_history.npz", r"bad_history\.npz: the training history in its metadata is "
                                               r"malformed \(each row needs epoch, steps, .*\); it can be loaded "
                                               r"but not resumed"),
    "a position past any run": ("far_position.npz", r"far_position\.npz: the training position in its metadata is "
                                                    r"malformed \(epoch, batch and step must be integers in \[0, "
                                                    r"2147483647\]\); it can be loaded but not resumed"),
    "a negative position": ("negative_position.npz", r"negative_position\.npz: the training position in its "
                                                     r"metadata is malformed"),
    "an epoch past its steps": ("epoch_past_steps.npz", r"epoch_past_steps\.npz: the training position in its "
                                                        r"metadata \(epoch 2147483647, batch 0, step 3\) cannot be "
                                                        r"reached: at most one epoch a step, and \d+ batches an "
                                                        r"epoch; it can be loaded but not resumed"),
    "a batch past its epoch": ("batch_past_epoch.npz", r"batch_past_epoch\.npz: the training position in its "
                                                       r"metadata \(epoch 0, batch 2147483647, step 2147483647\) "
                                                       r"cannot be reached"),
    "a negative step count": ("negative_step.npz", r"negative_step\.npz: the optimiser's step count is -5; "
                                                   r"expected a whole number in \[0, 2147483647\] \(it cannot be "
                                                   r"resumed from\)"),
    "no training config": ("no_config.npz", r"no_config\.npz: no training config in its metadata; it can be loaded "
                                            r"but not resumed"),
    "wrong shapes": ("narrow.npz", r"narrow\.npz: fc1\.weight: checkpoint has \(500, 700, 1, 1\), network needs "
                                   r"\(500, 784, 1, 1\)"),
}
EVALUATE_CASES = {**{name: case for name, case in CHECKPOINT_CASES.items() if name != "a directory"},
                  "a folder without a checkpoint": (".", r"--weights .*checkpoints\d*: this folder holds no model\.npz; "
                                                         r"give an output folder that a training wrote into, or a "
                                                         r"checkpoint file"),
                  "wrong shapes": RESUME_CASES["wrong shapes"],
                  "class names that do not fit": ("eleven_classes.npz", r"eleven_classes\.npz: its metadata names 11 "
                                                                        r"classes, but the network ends in 10 scores"),
                  "scores that overflow": ("overflowing.npz", r"overflowing\.npz: the network's scores are not finite "
                                                              r"\(NaN or infinite\) for some test images, its test loss "
                                                              r"is nan: its weights overflow float32$")}


@pytest.mark.parametrize("name, pattern", cases(RESUME_CASES))
def test_bad_checkpoint_to_resume(tool, checkpoints, mnist_dir, untouched, name, pattern):
    finished = tool("train", *train_args(MLP_CONFIG, mnist_dir, untouched, "--resume", checkpoints / name))
    assert_one_line_error(finished, "train", 2, pattern)


@pytest.mark.parametrize("name, pattern", cases(RESUME_CASES, "pickled objects", "another architecture"))
def test_bad_checkpoint_to_resume_script(cli, checkpoints, mnist_dir, untouched, name, pattern):
    finished = cli("train", *train_args(MLP_CONFIG, mnist_dir, untouched, "--resume", checkpoints / name))
    assert_one_line_error(finished, "train", 2, pattern)


@pytest.mark.parametrize("name, pattern", cases(EVALUATE_CASES))
def test_bad_checkpoint_to_evaluate(tool, checkpoints, mnist_dir, name, pattern):
    finished = tool("evaluate", "--weights", checkpoints / name, "--data-dir", mnist_dir, "--device", "host")
    assert_one_line_error(finished, "evaluate", 2, pattern)


def test_bad_checkpoint_to_evaluate_script(cli, checkpoints, mnist_dir):
    finished = cli("evaluate", "--weights", checkpoints / "truncated.npz", "--data-dir", mnist_dir)
    assert_one_line_error(finished, "evaluate", 2, CHECKPOINT_CASES["truncated"][1])


@pytest.mark.parametrize("name, pattern", cases(EVALUATE_CASES, "missing", "text", "pickled objects", "truncated",
                                               "class names that do not fit"))
def test_bad_checkpoint_to_predict(tool, checkpoints, tmp_path, name, pattern):
    image = one_pixel(tmp_path / "digit.png")
    finished = tool("predict", "--weights", checkpoints / name, image, "--device", "host")
    assert_one_line_error(finished, "predict", 2, pattern)


@pytest.mark.parametrize("as_json", [False, True])
def test_an_image_whose_scores_overflow_is_named_not_predicted(tool, checkpoints, tmp_path, as_json):
    """The scores of finite weights that overflow float32 were NaN: evaluate printed test loss NaN (NaN in its JSON),
    predict '0 (probability nan)'."""
    digit = np.zeros((28, 28), np.uint8)
    digit[5:23, 13:16] = 255
    image = tmp_path / "one.png"
    Image.fromarray(digit, "L").save(image)
    finished = tool("predict", "--weights", checkpoints / "overflowing.npz", image, "--device", "host",
                    *(["--json"] if as_json else []))
    assert finished.returncode == 2 and "Traceback" not in finished.stderr
    assert finished.stderr.splitlines() == [f"cudnnnet-predict: error: {image}: the network's scores for it are not "
                                            f"finite (NaN or infinite): its weights overflow float32"]
    if as_json:
        [result] = json.loads(finished.stdout)
        assert result["digit"] is None and result["probabilities"] == [] and "not finite" in result["error"]
    else:
        assert finished.stdout == ""


def test_an_output_folder_whose_set_is_gone_is_named_so_to_predict(tool, tmp_path):
    """Its model.npz link points nowhere: the link is named, not the folder read as the original's .bin files."""
    (tmp_path / "run").mkdir()
    broken_link(tmp_path / "run" / "model.npz")
    finished = tool("predict", "--weights", tmp_path / "run", one_pixel(tmp_path / "digit.png"), "--device", "host")
    assert_one_line_error(finished, "predict", 2, r"run/model\.npz: no such checkpoint file$")


@pytest.mark.parametrize("run", ["tool", "cli"])
def test_truncated_bin_files_to_predict(run, request, checkpoints, tmp_path):
    image = one_pixel(tmp_path / "digit.png")
    finished = request.getfixturevalue(run)("predict", "--weights", checkpoints / "truncated_bin", "--config",
                                            MLP_CONFIG, image, "--device", "host")
    assert_one_line_error(finished, "predict", 2, r"truncated_bin/fc2\.bin: expected 20000 bytes \(float32 fc2\.weight "
                                                  r"of shape \(10, 500, 1, 1\)\), found 1000 bytes")


@pytest.mark.parametrize("resume", ["model.npz", "."])
def test_resuming_a_finished_run_asks_for_more_steps(tool, mnist_dir, untouched, resume):
    """From the checkpoint file or from its output folder."""
    finished = tool("train", *train_args(MLP_CONFIG, mnist_dir, untouched, "--resume", untouched / resume))
    assert_one_line_error(finished, "train", 2, r" is at step 3 and the run asks for 2 steps: nothing left "
                                                r"to train; raise --epochs or --steps")


def test_resuming_from_far_beyond_the_run_asks_for_more_steps_without_replaying_the_steps(tool, checkpoints, mnist_dir,
                                                                                          untouched):
    """A position training could reach, two billion steps on: refused as finished, no mask skipped for each step."""
    finished = tool("train", *train_args(MLP_CONFIG, mnist_dir, untouched, "--resume", checkpoints / "far_on.npz"))
    assert_one_line_error(finished, "train", 2, r"far_on\.npz is at step 2147483646 and the run asks for 2 steps: "
                                                r"nothing left to train")


def test_resuming_with_another_batch_size_is_refused(tool, mnist_dir, untouched):
    finished = tool("train", *train_args(MLP_CONFIG, mnist_dir, untouched, "--resume", untouched, "--steps", "9",
                                         "--batch-size", "32"))
    assert_one_line_error(finished, "train", 2, r"model\.npz was trained with batch size 64 and this run asks for 32; "
                                                r"its position counts batches of 64: resume with --batch-size 64$")


def test_an_unusable_export_path_is_refused_before_training(tool, mnist_dir, untouched, monkeypatch):
    from cudnnnet.cli import train

    monkeypatch.setattr(train, "Trainer", pytest.fail)  # nothing may be built, let alone trained
    finished = tool("train", *train_args(MLP_CONFIG, mnist_dir, untouched, "--export-original",
                                         untouched / "metrics.json" / "bins"))
    assert_one_line_error(finished, "train", 2, r"--export-original .*metrics\.json/bins: .*metrics\.json is a file, "
                                                r"not a directory")


def test_a_network_the_original_format_cannot_hold_is_refused_before_training(tool, mnist_dir, untouched,
                                                                              tmp_path, monkeypatch):
    from cudnnnet.cli import train

    monkeypatch.setattr(train.Trainer, "run", lambda self: pytest.fail("trained"))
    finished = tool("train", *train_args(REPO_ROOT / "configs" / "mnist_bn_cnn.yaml", mnist_dir, untouched,
                                         "--export-original", tmp_path / "bins"))
    assert_one_line_error(finished, "train", 2, r"--export-original .*bins: bn1\.running_mean: the original format "
                                                r"stores only L\.weight \(L\.bin\) and L\.bias \(L\.bias\.bin\)$")
    assert not (tmp_path / "bins").exists()


def test_an_export_file_name_taken_by_a_folder_is_refused_before_training(tool, mnist_dir, untouched, tmp_path,
                                                                           monkeypatch):
    from cudnnnet.cli import train

    monkeypatch.setattr(train.Trainer, "run", lambda self: pytest.fail("trained"))
    (tmp_path / "bins" / "fc1.bin").mkdir(parents=True)
    finished = tool("train", *train_args(MLP_CONFIG, mnist_dir, untouched, "--export-original", tmp_path / "bins"))
    assert_one_line_error(finished, "train", 2, r"--export-original .*bins: .*bins/fc1\.bin \(where fc1\.weight goes\) "
                                                r"is a folder; remove it or give another directory$")


# ---- prediction -------------------------------------------------------------------------------


def png_header_only(path: Path, width: int, height: int) -> Path:
    """A PNG whose header declares width × height (no pixel data: Pillow refuses it from the header)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    chunk = b"IHDR" + header
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(header)) + chunk
                     + struct.pack(">I", zlib.crc32(chunk)) + b"\x00\x00\x00\x00IEND\xaeB`\x82")
    return path


def one_pixel(path: Path) -> Path:
    Image.new("L", (1, 1), 255).save(path)
    return path


def written(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


def folder_of_notes(path: Path) -> Path:
    path.mkdir()
    (path / "notes.txt").write_text("no image here\n")
    return path


IMAGE_CASES = {
    "not an image": (lambda path: written(path, b"a digit, honestly\n"), r"notes\.png: not an image file Pillow can read"),
    "empty image file": (lambda path: written(path, b""), r"notes\.png: the file is empty \(0 bytes\)"),
    "1 pixel": (one_pixel, r"notes\.png: no digit found \(the 1x1 image is blank or uniform\)"),
    "20000 x 20000": (lambda path: png_header_only(path, 20_000, 20_000), r"notes\.png: the image is too large to decode"),
    "missing": (lambda path: path, r"notes\.png"),
    "a folder without images": (folder_of_notes, r"no image files in .*notes\.png: a folder is read for its files "
                                                 r"ending in \.bmp, .*, \.webp$"),
}


@pytest.mark.parametrize("make, pattern", cases(IMAGE_CASES))
def test_bad_image(tool, tmp_path, checkpoints, make, pattern):
    image = make(tmp_path / "notes.png")
    finished = tool("predict", "--weights", checkpoints / "mlp.npz", image, "--device", "host")
    assert_one_line_error(finished, "predict", 2, pattern)


@pytest.mark.parametrize("make, pattern", cases(IMAGE_CASES, "not an image", "20000 x 20000", "a folder without images"))
def test_bad_image_script(cli, tmp_path, checkpoints, make, pattern):
    image = make(tmp_path / "notes.png")
    finished = cli("predict", "--weights", checkpoints / "mlp.npz", image, "--device", "host")
    assert_one_line_error(finished, "predict", 2, pattern)


# ---- GPU ------------------------------------------------------------------------------------


def test_device_cuda_without_a_gpu_is_refused_without_fallback(cli, tmp_path, mnist_dir):
    from cudnnnet.backends import cuda_available

    if cuda_available():
        pytest.skip("a GPU is usable here")
    output = tmp_path / "never"
    finished = cli("train", *train_args(MLP_CONFIG, mnist_dir, output, "--device", "cuda"))
    assert_one_line_error(finished, "train", 2, r"(no GPU \(libcuda\.so\.1 cannot be loaded|no usable NVIDIA GPU|no NVIDIA GPU is visible|pip install)")
    assert "use --device host (or auto) to run on the CPU" in finished.stderr
    assert not output.exists()


def test_a_missing_cuda_library_names_the_package(monkeypatch):
    from types import ModuleType

    from cudnnnet.backends.cuda.bindings import loader
    from cudnnnet.errors import DeviceUnavailableError

    def not_found(name):
        raise RuntimeError(f"Failure finding lib{name}.so: no such file")

    pathfinder = ModuleType("cuda.pathfinder")
    pathfinder.load_nvidia_dynamic_lib = not_found
    monkeypatch.setitem(sys.modules, "cuda", ModuleType("cuda"))
    monkeypatch.setitem(sys.modules, "cuda.pathfinder", pathfinder)
    monkeypatch.setitem(sys.modules, "nvidia.cudnn", None)
    with pytest.raises(DeviceUnavailableError, match=r"libcublas was not found .*pip install -e \"\.\[cuda12\]\" from the "
                                                     r"repository checkout, or pip install \"nvidia-cublas-cu12<13\""):
        loader.load_library("cublas", 12)
    with pytest.raises(DeviceUnavailableError, match=r"libcudnn\.so\.9 was not found .*pip install -e \"\.\[cuda13\]\" "
                                                     r"from the repository checkout .*\"nvidia-cudnn-cu13>=9,<10\""):
        loader.load_library("cudnn", 13)


def test_missing_cuda_python_names_the_package(monkeypatch):
    from cudnnnet.backends.cuda.bindings import loader
    from cudnnnet.errors import DeviceUnavailableError

    for name in ("cuda.bindings", "cuda.cuda"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(DeviceUnavailableError, match=r"needs cuda-python, which is not installed .*pip install -e "
                                                     r"\"\.\[cuda13\]\" from the repository checkout"):
        loader.cuda_python.__wrapped__()


class FakeStatus(int):
    """A cudaError_t as cuda-python returns it: an int with a name."""

    def __new__(cls, value: int, name: str):
        status = super().__new__(cls, value)
        status.name = name
        return status


def test_out_of_memory_suggests_a_smaller_batch(monkeypatch):
    from types import SimpleNamespace

    from cudnnnet.backends.cuda import DeviceBuffer
    from cudnnnet.backends.cuda.bindings import runtime
    from cudnnnet.errors import OutOfMemoryError

    fake = SimpleNamespace(cudaMalloc=lambda nbytes: (FakeStatus(2, "cudaErrorMemoryAllocation"), 0),
                           cudaMemGetInfo=lambda: (FakeStatus(0, "cudaSuccess"), 100 << 20, 80 << 30))
    monkeypatch.setattr(runtime, "_runtime", fake)
    with pytest.raises(OutOfMemoryError, match=r"the GPU is out of memory: cannot allocate 4,096\.0 MiB \(100 of "
                                               r"81,920 MiB free\); try a smaller batch size"):
        DeviceBuffer.allocate(4 << 30)


def test_out_of_memory_is_one_line_and_exit_1(tool, monkeypatch, mnist_dir, untouched):
    from cudnnnet.cli import train
    from cudnnnet.errors import OutOfMemoryError

    def out_of_memory(*args, **kwargs):
        raise OutOfMemoryError("the GPU is out of memory: cannot allocate 512.0 MiB; try a smaller batch size")

    monkeypatch.setattr(train, "Trainer", out_of_memory)
    finished = tool("train", *train_args(MLP_CONFIG, mnist_dir, untouched))
    assert_one_line_error(finished, "train", 1, r"the GPU is out of memory: .*; try a smaller batch size$")


@pytest.mark.parametrize("error, message", [(MemoryError(), r"out of host memory$"),
                                            (MemoryError("cannot allocate 8 GiB"), r"out of host memory \(cannot "
                                                                                   r"allocate 8 GiB\)$")])
def test_host_memory_running_out_is_one_line_and_exit_1(tool, monkeypatch, mnist_dir, untouched, error, message):
    from cudnnnet.cli import train

    def out_of_memory(*args, **kwargs):
        raise error

    monkeypatch.setattr(train, "Trainer", out_of_memory)
    assert_one_line_error(tool("train", *train_args(MLP_CONFIG, mnist_dir, untouched)), "train", 1, message)


# ---- runtime failures, tracebacks and logging -------------------------------------------------


def test_a_diverging_loss_is_exit_1_with_the_step_and_no_numpy_warnings(cli, tmp_path, mnist_dir, untouched):
    text = VALID_LAYERS + "train: {batch_size: 32, log_every: 2, optimizer: {lr: 1.0e+30}}\n"
    finished = cli("train", *train_args(config_file(tmp_path, text), mnist_dir, untouched, "--steps", "6"))
    assert_one_line_error(finished, "train", 1, r"the loss became (nan|inf) at step \d+ \(epoch 1\); try a lower "
                                                r"learning rate")


def test_debug_shows_the_traceback_and_keeps_the_exit_code(cli, tmp_path, mnist_dir, untouched):
    text = "model:\n  - {type: dense, out_size: 7}\n  - {type: softmax}\n" + VALID_TRAIN
    finished = cli("train", *train_args(config_file(tmp_path, text), mnist_dir, untouched, "--debug"))
    assert finished.returncode == 2
    assert finished.stderr.startswith("Traceback (most recent call last):")
    assert "cudnnnet.errors.ConfigError: " in finished.stderr
    assert re.fullmatch(r"cudnnnet-train: error: .*bad\.yaml: model\[1\]: the model ends in outputs of shape \(7, 1, "
                        r"1\).*", finished.stderr.splitlines()[-1])


def test_without_quiet_the_error_is_the_last_line_and_no_traceback(cli, checkpoints, mnist_dir, untouched):
    finished = cli("train", *train_args(MLP_CONFIG, mnist_dir, untouched, "--resume", checkpoints / "cnn.npz"),
                   quiet=False)
    assert finished.returncode == 2
    assert finished.stderr.splitlines()[-1].startswith("cudnnnet-train: error: ")
    assert "trained with a different model" in finished.stderr and "Traceback" not in finished.stderr


# ---- fuzzing the CLI's model check -------------------------------------------------------------

_SIZES = st.one_of(st.integers(1, 6), st.integers(-1, 40))  # mostly valid, some not, some too large
_FUZZ_LAYER = st.one_of(
    st.fixed_dictionaries({"type": st.just("conv2d"), "out_channels": st.integers(1, 12), "kernel_size": _SIZES},
                          optional={"stride": _SIZES, "padding": _SIZES, "dilation": _SIZES}),
    st.fixed_dictionaries({"type": st.just("pooling"), "kernel_size": _SIZES},
                          optional={"stride": _SIZES, "padding": _SIZES, "mode": st.sampled_from(["max", "average"])}),
    st.fixed_dictionaries({"type": st.just("dense"), "out_size": st.sampled_from([1, 10, 64])}),
    st.just({"type": "activation", "mode": "relu"}),
)


@settings(max_examples=200, deadline=None)
@given(layers=st.lists(_FUZZ_LAYER, max_size=5), classifier=st.booleans(), pad=st.integers(0, 4))
def test_any_layer_stack_passes_the_model_check_or_is_a_config_error(layers, classifier, pad):
    """Whatever the sizes, the check before training says ConfigError (naming the file) or lets the model build."""
    from cudnnnet.cli.train import check_model
    from cudnnnet.config.schema import ConfigError, parse_config

    head = [{"type": "dense", "out_size": 10}] if classifier else []
    raw = {"model": layers + head + [{"type": "softmax"}], "data": {"pad": pad}, "train": {"optimizer": {"lr": 0.1}}}
    try:
        config = parse_config(raw, source="fuzz.yaml")
        check_model(config)
    except ConfigError as error:
        assert str(error).startswith("fuzz.yaml: ") and "\n" not in str(error)
        return
    network = build_network(config, "host")
    assert network.output_shapes(network.input_shape)[-1] == (10, 1, 1)


def test_an_image_folder_model_too_large_for_one_channel_is_refused_before_its_images_are_decoded():
    """channels auto leaves the input's channels to the images, so the model's sizes were checked only once
    every image had been decoded at data.image_size; one channel, the least the images make, says enough."""
    from cudnnnet.cli.train import check_model
    from cudnnnet.config.schema import ConfigError, load_config, parse_config

    raw = load_config(REPO_ROOT / "configs" / "image_folder.yaml").to_dict()
    raw["data"].update(image_size=[7000, 7000], channels="auto")
    with pytest.raises(ConfigError, match=r"data\.pad: the input for a batch of \d+ of shape \(\d+, 1, 7000, 7000\) "
                                          r"would hold \d+ values"):
        check_model(parse_config(raw, source="image_folder.yaml"))
    raw["data"].update(image_size=[32, 32])
    check_model(parse_config(raw, source="image_folder.yaml"))


@pytest.mark.parametrize("failing, status, pattern", [
    ("free", "cudaErrorMemoryAllocation", r"the GPU \(device 0\) could not be initialised: cudaFree failed with "
                                          r"cudaErrorMemoryAllocation; its memory is taken, probably by another process"),
    ("set_device", "cudaErrorDevicesUnavailable", r"the GPU \(device 0\) could not be initialised: cudaSetDevice failed "
                                                  r"with cudaErrorDevicesUnavailable \(46\)$"),
])
def test_a_gpu_that_cannot_start_is_not_a_batch_too_large(monkeypatch, failing, status, pattern):
    """GPU memory held by another process at start-up: the context cannot be made. The message names
    the CUDA error and does not suggest a smaller batch."""
    from cudnnnet.backends.cuda import context
    from cudnnnet.backends.cuda.bindings import runtime
    from cudnnnet.errors import DeviceInitError

    function = {"free": "cudaFree", "set_device": "cudaSetDevice"}[failing]
    code = {"cudaErrorMemoryAllocation": 2, "cudaErrorDevicesUnavailable": 46}[status]

    def fails(*args):
        raise runtime.status_error(function, FakeStatus(code, status))

    monkeypatch.setattr(context, "open_libraries", lambda device=0: (13, 1))
    monkeypatch.setattr(context.startup, "early_start_pending", lambda: False)
    monkeypatch.setattr(runtime, "set_device", lambda device: None)
    monkeypatch.setattr(runtime, failing, fails)
    with pytest.raises(DeviceInitError) as caught:
        context.CudaContext(0)
    assert re.search(pattern, str(caught.value)) and "smaller batch" not in str(caught.value)


def test_a_reader_that_goes_away_ends_the_tool_quietly(tmp_path, checkpoints):
    """``cudnnnet-predict ... | head``: the reader exits first; the tool stops with 141 (128 + SIGPIPE)
    as Unix tools do, and says nothing."""
    digit = np.zeros((28, 28), np.uint8)
    digit[5:23, 13:16] = 255
    image = tmp_path / "one.png"
    Image.fromarray(digit, "L").save(image)
    predict = [sys.executable, str(REPO_ROOT / "scripts" / "predict.py"), "--weights", str(checkpoints / "mlp.npz"),
               "--device", "host", "--quiet", str(image), str(image)]
    script = f"{' '.join(map(repr, predict))} 2>{tmp_path / 'stderr'} | true; echo ${{PIPESTATUS[0]}}"
    finished = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300)
    assert finished.stdout.strip() == "141", finished.stdout + finished.stderr
    assert (tmp_path / "stderr").read_text() == ""


def test_a_broken_pipe_is_no_error_message(capsys):
    from cudnnnet.cli.common import ArgumentParser, add_common_arguments, run

    def writes_to_a_closed_pipe(args):
        raise BrokenPipeError(32, "Broken pipe")

    parser = ArgumentParser(prog="cudnnnet-x")
    add_common_arguments(parser)
    assert run(writes_to_a_closed_pipe, parser, []) == 141
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("tool_name, progress_bar", [("train", True), ("predict", False), ("evaluate", False)])
def test_quiet_mentions_a_progress_bar_only_where_there_is_one(tool_name, progress_bar):
    module = importlib.import_module(f"cudnnnet.cli.{tool_name}")
    quiet = next(action for action in module.build_parser()._actions if "--quiet" in action.option_strings)
    assert ("progress bar" in quiet.help) == progress_bar and "warnings and errors" in quiet.help


def test_evaluate_s_confusion_matrix_keeps_its_columns_with_names_that_print_escaped():
    """A class name holding a control character prints escaped (longer); the columns are as wide as
    what is printed, so every row of the matrix has the header's length."""
    import numpy as np

    from cudnnnet.cli.evaluate import format_matrix
    from cudnnnet.util.printable import one_line

    text = format_matrix(np.array([[5, 1], [0, 7]]), ["a\x1bb\x07c", "dog"])
    lines = [one_line(line) for line in text.split("\n")]
    assert len({len(line) for line in lines}) == 1, lines
    assert "\\x1b" in lines[0] and "\x1b" not in text
