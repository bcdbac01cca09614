"""Hostile inputs to the command-line tools: small files that declare huge sizes, and generated
configs, checkpoint metadata and image files.

A refused input must cost no more memory than a normal start: the tools run as subprocesses whose
peak resident memory (``ru_maxrss`` from ``wait4``) is compared with that of a run on ordinary
input. The generated inputs run in-process through the tools' ``main(argv)``; every one must end
with exit 0, 1 or 2, a non-zero exit with exactly one line on stderr, never a traceback, and
nothing written.
"""

import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from cudnnnet.io import checkpoint
from cudnnnet.config.schema import load_config
from cudnnnet.data import mnist
from cudnnnet.network import OPTIMIZER_PREFIX
from cudnnnet.optim.optimizers import SGD
from cudnnnet.train.trainer import build_network
from hostile_files import Entry, gzip_bomb, idx_header, npy_header, write_zip
from run_helpers import NO_NETWORK, REPO_ROOT, offline_tools

MLP_CONFIG = REPO_ROOT / "configs" / "mnist_mlp.yaml"
BOMB_MEGABYTES = 1024  # what each bomb inflates to; reading it would take that much memory
ALLOWED_EXTRA_MIB = 300  # a refused input may cost this much above a run on ordinary input
MEMORY_CEILING = 6 << 30  # address space of a measured run: a regression fails the test, not the machine
CPU_SECONDS = 300


# ---- files ---------------------------------------------------------------------------------


def save_untrained(config, path: Path) -> None:
    """A checkpoint as an interrupted run of ``config`` writes it: weights, optimiser state, config."""
    network = build_network(config, "host")
    optimizer = SGD(network, config.train.optimizer.lr, config.train.optimizer.momentum)
    network.save(path, extra_arrays=optimizer.state_arrays(OPTIMIZER_PREFIX), config=config.to_dict(), history=[],
                 position={"epoch": 0, "batch": 3, "step": 3})


def digit_png(path: Path) -> Path:
    digit = np.zeros((28, 28), np.uint8)
    digit[6:22, 12:16] = 255
    Image.fromarray(digit).save(path)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """A good checkpoint and image, and the hostile files: each a few MiB at most on disk."""
    folder = tmp_path_factory.mktemp("hostile")
    save_untrained(load_config(MLP_CONFIG), folder / "model.npz")
    digit_png(folder / "digit.png")
    arrays, metadata = checkpoint.load_npz(folder / "model.npz")
    metadata_text = json.dumps(metadata).encode()
    metadata_entry = Entry(npy_header((len(metadata_text),), "|u1") + metadata_text)
    write_zip(folder / "weight_bomb.npz", {"__metadata__.npy": metadata_entry,
                                           "fc1.weight.npy": Entry(npy_header((2**28,)), BOMB_MEGABYTES)})
    write_zip(folder / "metadata_bomb.npz", {"__metadata__.npy": Entry(npy_header((2**30,), "|u1"), BOMB_MEGABYTES)})
    write_zip(folder / "extra_bomb.npz", {"__metadata__.npy": metadata_entry,
                                          "junk.npy": Entry(npy_header((2**28,)), BOMB_MEGABYTES)})
    huge_model = {**metadata, "model": [{**metadata["model"][0], "out_size": 2**31 - 1}, *metadata["model"][1:]]}
    checkpoint.save_npz(folder / "huge_model.npz", arrays, huge_model)
    checkpoint.save_npz(folder / "huge_input.npz", arrays, {**metadata, "input_shape": [1, 46340, 46340]})
    for name, model in (("huge_dense", "  - {type: dense, out_size: 2147483647}\n  - {type: dense, out_size: 10}\n"),
                        ("huge_conv", "  - {type: conv2d, out_channels: 65536, kernel_size: 3}\n"
                                      "  - {type: dense, out_size: 10}\n"),
                        ("huge_pad", "  - {type: dense, out_size: 10}\n")):
        data = "data: {pad: 30000}\n" if name == "huge_pad" else ""
        (folder / f"{name}.yaml").write_text(f"model:\n{model}  - {{type: softmax}}\n{data}train: {{optimizer: {{lr: 0.1}}}}\n")
    return folder


def mnist_with(folder: Path, real: Path, **replaced: bytes) -> Path:
    """The real MNIST files (linked) with the train ``images`` or ``labels`` replaced."""
    folder.mkdir()
    for split, names in mnist.SPLIT_FILES.items():
        for kind, name in zip(("images", "labels"), names):
            if split == "train" and kind in replaced:
                (folder / f"{name}.gz").write_bytes(replaced[kind])
            else:
                (folder / f"{name}.gz").symlink_to(real / f"{name}.gz")
    return folder


# ---- peak memory of a tool's run -------------------------------------------------------------


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CEILING, MEMORY_CEILING))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))


def run_measured(script: str, *arguments, cwd: Path) -> tuple[subprocess.CompletedProcess, int]:
    """Run scripts/<script>.py offline with --quiet; (the finished process, its peak resident memory in MiB)."""
    env = {key: value for key, value in os.environ.items() if key not in (mnist.DATA_ENV, "no_proxy", "NO_PROXY")}
    env.update(OPENBLAS_NUM_THREADS="1", XDG_CACHE_HOME=str(cwd / "cache"), CUDNNNET_NO_CACHE="1",
               http_proxy=NO_NETWORK, https_proxy=NO_NETWORK, HTTP_PROXY=NO_NETWORK, HTTPS_PROXY=NO_NETWORK)
    command = [sys.executable, str(REPO_ROOT / "scripts" / f"{script}.py"), *map(str, arguments), "--quiet"]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, cwd=cwd, env=env, preexec_fn=_limits)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        finished = subprocess.CompletedProcess(command, process.returncode, out.read().decode(), err.read().decode())
    return finished, usage.ru_maxrss // 1024  # KiB on Linux


def assert_refused_within_memory(finished, peak_mib: int, normal_mib: int, script: str, pattern: str) -> None:
    assert peak_mib <= normal_mib + ALLOWED_EXTRA_MIB, f"peak {peak_mib} MiB, a normal start {normal_mib} MiB"
    assert finished.returncode == 2, finished.stderr
    lines = finished.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"cudnnnet-{script}: error: "), finished.stderr
    assert pattern in lines[0], lines[0]


@pytest.fixture(scope="module")
def normal_predict_mib(files, tmp_path_factory) -> int:
    finished, peak = run_measured("predict", "--weights", files / "model.npz", "--device", "host", files / "digit.png",
                                  cwd=tmp_path_factory.mktemp("normal"))
    assert finished.returncode == 0, finished.stderr
    return peak


@pytest.fixture(scope="module")
def normal_train_mib(files, mnist_dir, tmp_path_factory) -> int:
    """A training run refused at the end of reading its data (60 000 random labels fail the checksum)."""
    cwd = tmp_path_factory.mktemp("normal")
    labels = np.random.default_rng(0).integers(0, 10, 60_000)
    data = mnist_with(cwd / "mnist", mnist_dir, labels=gzip.compress(idx_header((60_000,)) + labels.astype(np.uint8).tobytes()))
    finished, peak = run_measured("train", "--config", MLP_CONFIG, "--device", "host", "--data-dir", data,
                                  "--output", cwd / "out", "--steps", "1", cwd=cwd)
    assert finished.returncode == 2 and "checksum mismatch" in finished.stderr, finished.stderr
    return peak


@pytest.mark.parametrize("name, pattern", [
    ("weight_bomb.npz", "fc1.weight: checkpoint has (268435456,), network needs (500, 784, 1, 1)"),
    ("metadata_bomb.npz", "__metadata__ declares 1073741952 bytes, more than the 16777216"),
    ("extra_bomb.npz", "junk: in the checkpoint, but the network has no such parameter"),
    ("huge_model.npz", "its model description cannot be built: layer 'fc1': its weight of shape (2147483647, 784, 1, 1)"),
    ("huge_input.npz", "its model description cannot be built: layer 'fc1': its weight of shape (500, 2147395600, 1, 1)"),
])
@pytest.mark.parametrize("script", ["predict", "evaluate"])
def test_a_checkpoint_declaring_gigabytes_is_refused_within_the_memory_of_a_normal_start(
        files, normal_predict_mib, tmp_path, script, name, pattern):
    arguments = [files / "digit.png"] if script == "predict" else ["--data-dir", tmp_path]
    finished, peak = run_measured(script, "--weights", files / name, "--device", "host", *arguments, cwd=tmp_path)
    assert_refused_within_memory(finished, peak, normal_predict_mib, script, f"{name}: {pattern}")


@pytest.mark.parametrize("replaced, pattern", [
    ({"labels": gzip_bomb(idx_header((60_000,)), BOMB_MEGABYTES)},
     "train-labels-idx1-ubyte.gz: too long: header dims (60000,) call for 60000 data bytes, the file holds more"),
    ({"images": gzip_bomb(idx_header((2**20, 28, 28)), BOMB_MEGABYTES),
      "labels": gzip_bomb(idx_header((2**20,)), BOMB_MEGABYTES)},
     "train-images-idx3-ubyte.gz: the header declares 1048576 images; MNIST's file holds 60000"),
    ({"images": gzip_bomb(idx_header((60_000, 4096, 4096)), 1)}, "images are 4096×4096, MNIST's are 28×28"),
], ids=["labels inflating past their header", "a header declaring a million images", "a header declaring huge images"])
def test_a_data_file_inflating_to_gigabytes_is_refused_within_the_memory_of_a_normal_start(
        files, mnist_dir, normal_train_mib, tmp_path, replaced, pattern):
    data = mnist_with(tmp_path / "mnist", mnist_dir, **replaced)
    assert sum(path.stat().st_size for path in data.iterdir()) < 64 << 20
    finished, peak = run_measured("train", "--config", MLP_CONFIG, "--device", "host", "--data-dir", data,
                                  "--output", tmp_path / "out", "--steps", "1", cwd=tmp_path)
    assert_refused_within_memory(finished, peak, normal_train_mib, "train", pattern)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name, pattern", [
    ("huge_dense", "model[0] (dense): layer 'dense1': its weight of shape (2147483647, 784, 1, 1) would hold"),
    ("huge_conv", "model[0] (conv2d): layer 'conv2d1': its output for a batch of 1000 of shape (1000, 65536, 26, 26)"),
    ("huge_pad", "data.pad: the input for a batch of 1000 of shape (1000, 1, 60028, 60028) would hold"),
])
def test_a_config_declaring_enormous_shapes_is_refused_within_the_memory_of_a_normal_start(
        files, mnist_dir, normal_train_mib, tmp_path, name, pattern):
    finished, peak = run_measured("train", "--config", files / f"{name}.yaml", "--device", "host", "--data-dir",
                                  mnist_dir, "--output", tmp_path / "out", cwd=tmp_path)
    assert_refused_within_memory(finished, peak, normal_train_mib, "train", f"{name}.yaml: {pattern}")
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def photo_model(tmp_path_factory) -> Path:
    """The checkpoint of a model of 16×16 RGB images (one step on random pixels): predict resizes and crops for it."""
    from cudnnnet.config.schema import parse_config
    from cudnnnet.train.trainer import Trainer

    folder = tmp_path_factory.mktemp("photo-model")
    rng = np.random.default_rng(0)
    np.savez(folder / "data.npz", x=rng.integers(0, 256, (20, 3, 16, 16), dtype=np.uint8), y=np.arange(20) % 2)
    config = {"model": [{"type": "dense", "out_size": 2}, {"type": "softmax"}], "device": "host",
              "data": {"dataset": "npz", "train_file": str(folder / "data.npz"), "test_file": str(folder / "data.npz")},
              "train": {"batch_size": 10, "steps": 1, "optimizer": {"lr": 0.1}}}
    Trainer(parse_config(config, source="<photo model>"), folder / "run", progress=False).run()
    return folder / "run" / "model.npz"


@pytest.mark.parametrize("height, width", [(1, 3_000_000), (3_000_000, 1)], ids=["a strip", "a column"])
def test_an_image_of_an_extreme_shape_is_predicted_within_the_memory_of_a_normal_start(photo_model, tmp_path,
                                                                                       height, width):
    """A 3 KB PNG one pixel high and 3 million wide: covering a 16×16 input means 48 million × 16
    pixels if the whole image is resized before the centre crop, 2.3 GB; only the crop is resampled."""
    ordinary, strip = tmp_path / "ordinary.png", tmp_path / "strip.png"
    Image.fromarray(np.full((20, 30, 3), 128, np.uint8)).save(ordinary)
    Image.fromarray(np.full((height, width), 128, np.uint8)).save(strip)
    normal, normal_peak = run_measured("predict", "--weights", photo_model, "--device", "host", ordinary, cwd=tmp_path)
    assert normal.returncode == 0, normal.stderr
    finished, peak = run_measured("predict", "--weights", photo_model, "--device", "host", strip, cwd=tmp_path)
    assert finished.returncode == 0, finished.stderr
    assert peak <= normal_peak + ALLOWED_EXTRA_MIB, f"peak {peak} MiB, an ordinary image {normal_peak} MiB"
    assert finished.stdout.split(": ", 1)[1] == normal.stdout.split(": ", 1)[1]  # the same grey, the same scores


# ---- generated inputs, in-process -------------------------------------------------------------


def assert_clean_outcome(finished: subprocess.CompletedProcess, script: str) -> None:
    """Exit 0, or 1 or 2 with exactly one error line; never a traceback."""
    assert "Traceback" not in finished.stderr + finished.stdout
    assert finished.returncode in (0, 1, 2), finished
    if finished.returncode:
        lines = finished.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"cudnnnet-{script}: error: "), finished.stderr
        assert lines[0].strip() != f"cudnnnet-{script}: error:"


def snapshot(folder: Path) -> dict:
    return {path: path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file() and "cache" not in path.parts}


HUGE_INTEGERS = st.sampled_from([2**31, 2**31 - 1, 2**63, -(2**63), 10**20, 10**30, 10**300])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 100), HUGE_INTEGERS,
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e20, 1e308, -0.0, 5e-324]),
                    st.text(max_size=6), st.sampled_from(["relu", "softmax", "dense", "sgd", "host", "mnist"]))
KEYS = st.one_of(st.sampled_from(["model", "data", "train", "device", "math", "type", "name", "out_size", "optimizer",
                                  "lr", "normalize", "mean", "std", "pad", "batch_size", "input_shape", "config",
                                  "format", "version", "kernel_size", "out_channels"]), st.text(max_size=5))
VALUES = st.recursive(SCALARS, lambda children: st.one_of(st.lists(children, max_size=4),
                                                         st.dictionaries(KEYS, children, max_size=4)), max_leaves=10)


def paths(value, prefix=()):
    """Every path to a value inside nested dicts and lists, the empty path first."""
    yield prefix
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield from paths(item, prefix + (key,))


def replaced(document, path: tuple, value):
    """A copy of ``document`` with the value at ``path`` replaced (removed when ``value`` is DELETE)."""
    if not path:
        return value
    copy = json.loads(json.dumps(document))
    target = copy
    for key in path[:-1]:
        target = target[key]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return copy


DELETE = object()


@st.composite
def edited(draw, document):
    """``document`` with one value somewhere inside it replaced by a generated one, or removed."""
    path = draw(st.sampled_from(list(paths(document))))
    value = draw(st.one_of(VALUES, st.just(DELETE))) if path else draw(VALUES)
    return replaced(document, path, value)


def nested_text(depth: int, mapping: bool) -> str:
    """A flow-style YAML or JSON value nested ``depth`` levels deep."""
    return ('{"a": ' * depth + "1" + "}" * depth) if mapping else ("[" * depth + "1" + "]" * depth)


VALID_CONFIG = yaml.safe_load(MLP_CONFIG.read_text())
CONFIG_TEXTS = st.one_of(
    edited(VALID_CONFIG).map(lambda document: yaml.safe_dump(document)),
    st.sampled_from(["out_size: 500", "batch_size: 64", "seed: 0", "epochs: 10"]).map(
        lambda setting: MLP_CONFIG.read_text().replace(setting, setting.split(":")[0] + ": -1" + "0" * 5000)),
    st.builds(lambda depth, mapping: "model: " + nested_text(depth, mapping) + "\ntrain: {optimizer: {lr: 0.1}}\n",
              st.integers(30, 3000), st.booleans()),
    VALUES.map(lambda document: yaml.safe_dump(document)),
    st.text(alphabet="{}[]:-,&*!|>#'\"\n %@`0123456789.e", max_size=40),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=CONFIG_TEXTS)
def test_generated_configs_are_refused_in_one_line_and_write_nothing(tmp_path, text):
    with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
        folder = Path(folder)
        (folder / "config.yaml").write_text(text)
        (folder / "mnist").mkdir()
        with offline_tools(folder) as call:
            finished = call("train", "--config", folder / "config.yaml", "--device", "host", "--data-dir",
                            folder / "mnist", "--output", folder / "out", "--steps", "1")
        assert_clean_outcome(finished, "train")
        assert finished.returncode in (1, 2)  # valid configs stop at the missing data
        assert not (folder / "out").exists() and not any((folder / "mnist").iterdir())


def metadata_bytes(document) -> bytes:
    return json.dumps(document, allow_nan=True).encode()


@pytest.fixture(scope="module")
def good_checkpoint(files) -> Path:
    return files / "model.npz"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), how=st.sampled_from(["edit", "edit", "edit", "random", "deep", "bytes"]))
def test_generated_checkpoint_metadata_is_loaded_or_refused_in_one_line(tmp_path, good_checkpoint, data, how):
    arrays, metadata = checkpoint.load_npz(good_checkpoint)
    if how == "edit":
        encoded = metadata_bytes(data.draw(edited(metadata)))
    elif how == "random":
        encoded = metadata_bytes(data.draw(VALUES))
    elif how == "deep":
        encoded = nested_text(data.draw(st.integers(500, 200_000)), data.draw(st.booleans())).encode()
    else:
        encoded = data.draw(st.binary(max_size=64))
    members = {f"{name}.npy": array for name, array in arrays.items()}
    members[f"{checkpoint.METADATA_KEY}.npy"] = np.frombuffer(encoded, np.uint8)
    with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
        folder = Path(folder)
        with open(folder / "model.npz", "wb") as file:
            checkpoint._write_zip(file, members)
        digit_png(folder / "digit.png")
        (folder / "mnist").mkdir()
        before = snapshot(folder)
        with offline_tools(folder) as call:
            predicted = call("predict", "--weights", folder / "model.npz", "--device", "host", folder / "digit.png")
            evaluated = call("evaluate", "--weights", folder / "model.npz", "--device", "host", "--data-dir",
                             folder / "mnist")
        assert_clean_outcome(predicted, "predict")
        assert_clean_outcome(evaluated, "evaluate")
        assert evaluated.returncode == 2  # a loadable checkpoint stops at the missing data
        assert predicted.returncode != 0 or predicted.stdout.startswith(f"{folder / 'digit.png'}: ")
        assert snapshot(folder) == before


def with_normalize(normalize):
    def edit(metadata):
        metadata["config"]["data"]["normalize"] = normalize
    return edit


def without_std(metadata):
    del metadata["config"]["data"]["normalize"]["std"]


METADATA_CASES = {
    "nested too deeply": (None, "invalid __metadata__: JSON nested too deeply to read"),
    "out_size 10**30": (lambda meta: meta["model"][0].update(out_size=10**30),
                        "its model description cannot be built: layer 'fc1': its weight of shape (10000000000000000000"),
    "out_size 1e20": (lambda meta: meta["model"][0].update(out_size=1e20),
                      "its model description cannot be built: layer 'fc1': out_size must be an integer >= 1, got 1e+20"),
    "input_shape 1e20": (lambda meta: meta.update(input_shape=[1, 1e20, 28]), "invalid input_shape [1, 1e+20, 28]"),
    "std 0": (with_normalize({"mean": 0.1, "std": 0}), "data.normalize.std: expected a number > 0, got 0"),
    "std a string": (with_normalize({"mean": 0.1, "std": "0.3"}), "data.normalize.std: expected a number > 0, got '0.3'"),
    "std missing": (without_std, "data.normalize.std: missing required key"),
    "mean NaN": (with_normalize({"mean": float("nan"), "std": 0.3}), "data.normalize.mean: expected a number, got nan"),
    "batch size 10**30": (lambda meta: meta["config"]["train"].update(batch_size=10**30),
                          "train.batch_size: expected an integer > 0 and at most 2147483647"),
}


@pytest.mark.parametrize("edit, message", [pytest.param(*case, id=name) for name, case in METADATA_CASES.items()])
@pytest.mark.parametrize("script", ["predict", "evaluate"])
def test_hostile_checkpoint_metadata_is_named_in_one_line(tmp_path, good_checkpoint, script, edit, message):
    arrays, metadata = checkpoint.load_npz(good_checkpoint)
    members = {f"{name}.npy": array for name, array in arrays.items()}
    if edit is None:
        encoded = nested_text(100_000, False).encode()
    else:
        edit(metadata)
        encoded = metadata_bytes(metadata)
    members[f"{checkpoint.METADATA_KEY}.npy"] = np.frombuffer(encoded, np.uint8)
    with open(tmp_path / "model.npz", "wb") as file:
        checkpoint._write_zip(file, members)
    arguments = [digit_png(tmp_path / "digit.png")] if script == "predict" else ["--data-dir", tmp_path]
    with offline_tools(tmp_path) as call:
        finished = call(script, "--weights", tmp_path / "model.npz", "--device", "host", *arguments)
    assert_clean_outcome(finished, script)
    assert finished.returncode == 2 and "model.npz: " in finished.stderr and message in finished.stderr, finished.stderr


def test_evaluate_names_an_input_shape_that_is_not_mnists(tmp_path, good_checkpoint):
    arrays, metadata = checkpoint.load_npz(good_checkpoint)
    wider = np.zeros((500, 3 * 784, 1, 1), np.float32)  # fc1 of a network taking three channels
    checkpoint.save_npz(tmp_path / "model.npz", {**arrays, "fc1.weight": wider, "optimizer.velocity.fc1.weight": wider},
                        {**metadata, "input_shape": [3, 28, 28]})
    with offline_tools(tmp_path) as call:
        finished = call("evaluate", "--weights", tmp_path / "model.npz", "--device", "host", "--data-dir", tmp_path)
    assert_clean_outcome(finished, "evaluate")
    assert "model.npz: the network takes inputs of shape (3, 28, 28); MNIST's test images are (1, 28 + 2·pad" in finished.stderr


MODES = {  # mode: (NumPy dtype of its samples, the formats that store it)
    "L": (np.uint8, ["png", "tiff", "bmp", "pgm"]), "I;16": (np.uint16, ["png", "tiff"]),
    "I": (np.int32, ["tiff"]), "F": (np.float32, ["tiff", "pfm"]), "RGB": (np.uint8, ["png", "jpeg", "tiff"]),
    "RGBA": (np.uint8, ["png", "tiff"]), "1": (np.bool_, ["png", "bmp"]),
}
FLOAT_SAMPLES = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.sampled_from([0.0, 1.0, 255.0]))


@st.composite
def image_files(draw) -> tuple[bytes | None, str, str | None, np.ndarray | None]:
    """(random bytes, suffix, None, None) or (None, suffix, mode, samples)."""
    if draw(st.booleans()):
        suffix = draw(st.sampled_from(["png", "jpg", "tif", "bmp", "gif", "pfm", "pgm", "webp"]))
        return draw(st.binary(max_size=200)), suffix, None, None
    mode = draw(st.sampled_from(sorted(MODES)))
    dtype, formats = MODES[mode]
    height, width = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    channels = {"RGB": (3,), "RGBA": (4,)}.get(mode, ())
    count = height * width * (channels[0] if channels else 1)
    if dtype == np.float32:
        values = draw(st.lists(FLOAT_SAMPLES, min_size=count, max_size=count))
    elif dtype == np.bool_:
        values = draw(st.lists(st.booleans(), min_size=count, max_size=count))
    else:
        info = np.iinfo(dtype)
        values = draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=count, max_size=count))
    samples = np.array(values, dtype=dtype).reshape((height, width, *channels))
    return None, draw(st.sampled_from(formats)), mode, samples


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(image=image_files())
def test_generated_image_files_are_each_named_and_the_good_one_still_predicted(tmp_path, good_checkpoint, image):
    raw, suffix, mode, samples = image
    with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
        folder = Path(folder)
        shutil.copy(good_checkpoint, folder / "model.npz")
        good = digit_png(folder / "good.png")
        hostile = folder / f"hostile.{suffix}"
        if raw is not None:
            hostile.write_bytes(raw)
        else:
            Image.fromarray(samples).save(hostile)  # the mode follows the dtype and the channels
        before = snapshot(folder)
        with offline_tools(folder) as call:
            finished = call("predict", "--weights", folder / "model.npz", "--device", "host", hostile, good)
        assert "Traceback" not in finished.stderr
        assert finished.returncode in (0, 2), finished
        errors = finished.stderr.splitlines()
        assert errors == [] if finished.returncode == 0 else (
            len(errors) == 1 and errors[0].startswith(f"cudnnnet-predict: error: {hostile}: ")), finished.stderr
        assert finished.stdout.splitlines()[-1].startswith(f"{good}: ")
        assert len(finished.stdout.splitlines()) == (2 if finished.returncode == 0 else 1)
        assert snapshot(folder) == before
