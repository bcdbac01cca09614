"""Names that come from files reach the terminal escaped, and what the tools print reaches any terminal.

Every route by which a file's text gets into a line the tools write (an error line, a log line, a
result) is tried with a name holding a terminal control sequence (``ESC [ 2 J`` clears the screen):
the line must show it escaped (``\\x1b[2J``), never the raw byte. The tools run as the user runs
them, in subprocesses, so their real logging and streams are what is checked.
"""

import io
import os
import re
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from cudnnnet.io.checkpoint import load_npz, save_npz
from cudnnnet.train.trainer import Interrupted, Trainer
from run_helpers import NO_NETWORK, REPO_ROOT, interrupted_mlp_checkpoint, offline_tools

MLP_CONFIG = REPO_ROOT / "configs" / "mnist_mlp.yaml"
CLEAR_SCREEN = "\x1b[2J"
SHOWN = "\\x1b[2J"  # how an escaped CLEAR_SCREEN reads


@pytest.fixture
def cli(tmp_path):
    """cli(script, *arguments, quiet=True, encoding=None): scripts/<script>.py in tmp_path, offline; ``encoding``
    sets PYTHONIOENCODING (the encoding of the terminal it writes to)."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("CUDNNNET_DATA", "no_proxy", "NO_PROXY", "PYTHONIOENCODING")}
    env.update(OPENBLAS_NUM_THREADS="1", XDG_CACHE_HOME=str(tmp_path / "cache"), http_proxy=NO_NETWORK,
               https_proxy=NO_NETWORK, HTTP_PROXY=NO_NETWORK, HTTPS_PROXY=NO_NETWORK,
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]))

    def run(script: str, *arguments, quiet: bool = True, encoding: str | None = None) -> subprocess.CompletedProcess:
        command = [sys.executable, str(REPO_ROOT / "scripts" / f"{script}.py"), *map(str, arguments)]
        command += ["--quiet"] if quiet else []
        run_env = env if encoding is None else {**env, "PYTHONIOENCODING": encoding}
        finished = subprocess.run(command, capture_output=True, timeout=300, cwd=tmp_path, env=run_env)
        return subprocess.CompletedProcess(command, finished.returncode, finished.stdout.decode(errors="replace"),
                                           finished.stderr.decode(errors="replace"))

    return run


def assert_shown_escaped(finished: subprocess.CompletedProcess) -> None:
    """No control character but line breaks in what the tool wrote, and the name is there, escaped."""
    written = finished.stdout + finished.stderr
    assert not any(ord(char) < 32 and char != "\n" or ord(char) == 127 for char in written), repr(written)
    assert SHOWN in written, written
    assert "Traceback" not in finished.stderr, finished.stderr


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """An untrained MLP checkpoint as an interrupted run saves it (weights, optimiser state, config)."""
    return interrupted_mlp_checkpoint(tmp_path_factory.mktemp("checkpoint") / "model.npz")


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def digit_png(path: Path) -> Path:
    digit = np.zeros((28, 28), np.uint8)
    digit[6:22, 12:16] = 255
    Image.fromarray(digit).save(path)
    return path


def with_stored_config(checkpoint: Path, path: Path, **data) -> Path:
    """``checkpoint`` copied to ``path`` with ``data`` replacing keys of its stored config's data section."""
    arrays, metadata = load_npz(checkpoint)
    config = metadata["config"]
    save_npz(path, arrays, {**metadata, "config": {**config, "data": {**config["data"], **data}}})
    return path


# ---- item: names from files, escaped ------------------------------------------------------------


@pytest.mark.parametrize("script", ["evaluate", "predict", "train"])
def test_a_checkpoint_member_name_is_escaped_in_the_error(cli, tmp_path, checkpoint, mnist_dir, script):
    hostile = tmp_path / "member.npz"
    hostile.write_bytes(checkpoint.read_bytes())
    with zipfile.ZipFile(hostile, "a") as archive:
        archive.writestr(f"{CLEAR_SCREEN}extra.npy", npy_bytes(np.zeros(3, np.float32)))
    arguments = {"evaluate": ("--weights", hostile, "--device", "host", "--data-dir", mnist_dir),
                 "predict": ("--weights", hostile, "--device", "host", digit_png(tmp_path / "digit.png")),
                 "train": ("--config", MLP_CONFIG, "--resume", hostile, "--device", "host", "--data-dir", mnist_dir,
                           "--output", tmp_path / "run", "--steps", "5")}[script]
    finished = cli(script, *arguments)
    assert finished.returncode == 2, finished.stderr
    assert_shown_escaped(finished)


def test_a_data_directory_stored_in_a_checkpoint_is_escaped(cli, tmp_path, checkpoint):
    stored = with_stored_config(checkpoint, tmp_path / "model.npz", dir=str(tmp_path / f"gone{CLEAR_SCREEN}"))
    finished = cli("evaluate", "--weights", stored, "--device", "host")
    assert finished.returncode == 2, finished.stderr
    assert_shown_escaped(finished)


def test_class_names_stored_in_a_checkpoint_are_escaped(cli, tmp_path, checkpoint):
    classes = [f"{CLEAR_SCREEN}{digit}" for digit in range(10)]
    stored = with_stored_config(checkpoint, tmp_path / "model.npz", classes=classes)
    finished = cli("predict", "--weights", stored, "--device", "host", digit_png(tmp_path / "digit.png"))
    assert finished.returncode == 2, finished.stderr
    assert_shown_escaped(finished)


def test_the_name_of_a_config_file_is_escaped(cli, tmp_path, mnist_dir):
    config = tmp_path / f"{CLEAR_SCREEN}.yaml"
    config.write_text("model: 3\n")
    finished = cli("train", "--config", config, "--device", "host", "--data-dir", mnist_dir)
    assert finished.returncode == 2, finished.stderr
    assert_shown_escaped(finished)


def test_a_data_file_named_in_a_config_is_escaped(cli, tmp_path):
    config = yaml.safe_load(MLP_CONFIG.read_text())
    config["data"] = {"dataset": "npz", "train_file": f"{CLEAR_SCREEN}train.npz", "test_file": "test.npz"}
    (tmp_path / "npz.yaml").write_text(yaml.safe_dump(config))
    finished = cli("train", "--config", tmp_path / "npz.yaml", "--device", "host", "--output", tmp_path / "run")
    assert finished.returncode == 2, finished.stderr
    assert_shown_escaped(finished)


def image_folder(root: Path, broken_name: str) -> Path:
    """Two classes of four grey 8×8 images, and one file that is not an image, named ``broken_name``."""
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
        for index in range(4):
            Image.fromarray(np.full((8, 8), 40 * index, np.uint8)).save(root / name / f"{index}.png")
    (root / "b" / broken_name).write_bytes(b"not a png")
    return root


def test_an_image_file_name_is_escaped_in_the_error(cli, tmp_path):
    root = image_folder(tmp_path / "photos", f"{CLEAR_SCREEN}.png")
    finished = cli("train", "--config", "image_folder", "--data-dir", root, "--device", "host", "--output",
                   tmp_path / "run", "--steps", "1")
    assert finished.returncode == 2, finished.stderr
    assert_shown_escaped(finished)


def test_an_image_file_name_is_escaped_in_a_log_line(cli, tmp_path):
    root = image_folder(tmp_path / "photos", f"{CLEAR_SCREEN}.png")
    config = yaml.safe_load((REPO_ROOT / "configs" / "image_folder.yaml").read_text())
    config["data"].update(dir=str(root), corrupt="skip")
    (tmp_path / "skip.yaml").write_text(yaml.safe_dump(config))
    finished = cli("train", "--config", tmp_path / "skip.yaml", "--device", "host", "--output", tmp_path / "run",
                   "--steps", "1")
    assert finished.returncode == 0, finished.stderr
    assert "WARNING" in finished.stderr
    assert_shown_escaped(finished)


def test_a_path_in_a_warning_is_escaped(cli, tmp_path, checkpoint):
    config = tmp_path / f"{CLEAR_SCREEN}.yaml"
    config.write_text(MLP_CONFIG.read_text())
    finished = cli("predict", "--weights", checkpoint, "--config", config, "--device", "host",
                   digit_png(tmp_path / "digit.png"))
    assert finished.returncode == 0, finished.stderr
    assert_shown_escaped(finished)


def test_the_output_folder_is_escaped_in_the_interrupted_message(tmp_path, mnist_dir, monkeypatch):
    output = tmp_path / f"run{CLEAR_SCREEN}"

    def interrupted_at_step_3(trainer):
        raise Interrupted(signal.SIGINT, 3, trainer.output_dir)

    monkeypatch.setattr(Trainer, "run", interrupted_at_step_3)
    monkeypatch.setattr(Trainer, "writes", True)
    with offline_tools(tmp_path) as tool:
        finished = tool("train", "--config", MLP_CONFIG, "--device", "host", "--data-dir", mnist_dir,
                        "--output", output, "--steps", "5")
    assert finished.returncode == 128 + signal.SIGINT
    assert_shown_escaped(finished)


# ---- NUL bytes in paths: one line, no traceback ---------------------------------------------------

IDX_FILES = {"train_images": "train-images", "train_labels": "train-labels", "test_images": "test-images",
             "test_labels": "test-labels"}
NUL_PATHS = {
    "mnist": ({"dataset": "mnist", "dir": "data\0dir"}, "data.dir"),
    "fashion-mnist": ({"dataset": "fashion-mnist", "dir": "data\0dir"}, "data.dir"),
    "kmnist": ({"dataset": "kmnist", "dir": "data\0dir"}, "data.dir"),
    "cifar10": ({"dataset": "cifar10", "dir": "data\0dir"}, "data.dir"),
    "image-folder": ({"dataset": "image-folder", "dir": "photos\0"}, "data.dir"),
    "idx": ({"dataset": "idx", **IDX_FILES, "test_images": "test\0images"}, "data.test_images"),
    "npz": ({"dataset": "npz", "train_file": "train.npz", "test_file": "test\0.npz"}, "data.test_file"),
}


def assert_one_line(finished: subprocess.CompletedProcess, script: str, pattern: str) -> None:
    assert finished.returncode == 2, finished.stderr
    lines = finished.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"cudnnnet-{script}: error: "), finished.stderr
    assert re.search(pattern, lines[0]), lines[0]


@pytest.mark.parametrize("data, key", NUL_PATHS.values(), ids=NUL_PATHS.keys())
def test_a_nul_byte_in_a_config_path_is_one_line(tmp_path, data, key):
    config = yaml.safe_load(MLP_CONFIG.read_text())
    config["data"] = data
    (tmp_path / "nul.yaml").write_text(yaml.safe_dump(config))
    with offline_tools(tmp_path) as tool:
        finished = tool("train", "--config", tmp_path / "nul.yaml", "--device", "host", "--output", tmp_path / "run")
    assert_one_line(finished, "train", rf"nul\.yaml: {re.escape(key)}: expected .*without NUL bytes")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("data, key", NUL_PATHS.values(), ids=NUL_PATHS.keys())
def test_a_nul_byte_in_a_checkpoint_s_stored_path_is_one_line(tmp_path, checkpoint, data, key):
    arrays, metadata = load_npz(checkpoint)
    stored = tmp_path / "model.npz"
    save_npz(stored, arrays, {**metadata, "config": {**metadata["config"], "data": data}})
    with offline_tools(tmp_path) as tool:
        finished = tool("evaluate", "--weights", stored, "--device", "host")
    assert_one_line(finished, "evaluate", rf"model\.npz: .*{re.escape(key)}: expected .*without NUL bytes")


@pytest.mark.parametrize("script, arguments", [
    ("train", ("--config", "mnist\0.yaml", "--output", "run")),
    ("train", ("--config", MLP_CONFIG, "--output", "run\0")),
    ("train", ("--config", MLP_CONFIG, "--output", "run", "--data-dir", "data\0")),
    ("train", ("--config", MLP_CONFIG, "--output", "run", "--resume", "run\0")),
    ("train", ("--config", MLP_CONFIG, "--output", "run", "--export-original", "bin\0")),
    ("evaluate", ("--weights", "model\0.npz")),
    ("evaluate", ("--weights", "model.npz", "--data-dir", "data\0")),
    ("predict", ("--weights", "model\0.npz", "digit.png")),
    ("predict", ("--weights", "model.npz", "--config", "mnist\0.yaml", "digit.png")),
    ("predict", ("--weights", "model.npz", "digit\0.png")),
    ("benchmark", ("--json", "figures\0.json")),
], ids=lambda value: value if isinstance(value, str) else next(a for a in value if "\0" in str(a)).split("\0")[0])
def test_a_nul_byte_in_a_path_argument_is_one_line(tmp_path, script, arguments):
    with offline_tools(tmp_path) as tool:
        finished = tool(script, *arguments)
    assert_one_line(finished, script, r"argument .*: expected a path without NUL bytes, got '.*\\x00.*'")
    assert sorted(path.name for path in tmp_path.iterdir()) in ([], ["cache"])


# ---- a terminal that cannot show a name ------------------------------------------------------------


def test_predict_on_an_ascii_terminal_writes_a_name_it_cannot_show_escaped(cli, tmp_path, checkpoint):
    digit_png(tmp_path / "猫.png")
    finished = cli("predict", "--weights", checkpoint, "--device", "host", tmp_path / "猫.png", encoding="ascii")
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.startswith(f"{tmp_path}/\\u732b.png: ") and finished.stderr == ""


def two_class_folder(root: Path, classes: tuple[str, str]) -> Path:
    for name in classes:
        (root / name).mkdir(parents=True)
        for index in range(4):
            Image.fromarray(np.full((8, 8), 40 * index, np.uint8)).save(root / name / f"{index}.png")
    return root


def test_train_and_evaluate_on_an_ascii_terminal_write_names_they_cannot_show_escaped(cli, tmp_path):
    root = two_class_folder(tmp_path / "photos", ("猫", "犬"))
    output = tmp_path / "运行"
    trained = cli("train", "--config", "image_folder", "--data-dir", root, "--device", "host", "--output", output,
                  "--steps", "1", quiet=False, encoding="ascii")
    assert trained.returncode == 0, trained.stderr
    assert "\\u8fd0\\u884c" in trained.stderr and "Traceback" not in trained.stderr
    evaluated = cli("evaluate", "--weights", output, "--device", "host", encoding="ascii")
    assert evaluated.returncode == 0, evaluated.stderr
    assert evaluated.stdout.splitlines()[1].split() == ["true\\pred", "\\u72ac", "\\u732b"]


def test_file_names_a_shell_glob_passed_as_stray_arguments_are_escaped(cli, tmp_path):
    """``cudnnnet-train --config c.yaml *``: argparse names the stray arguments, file names among them."""
    finished = cli("train", "--config", MLP_CONFIG, f"{CLEAR_SCREEN}.png")
    assert finished.returncode == 2, finished.stderr
    assert "unrecognized arguments" in finished.stderr
    assert_shown_escaped(finished)
