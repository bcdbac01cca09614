"""The everyday experience of the command-line tools: entry points, what a run leaves, evaluate, logging."""

import csv
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution, entry_points
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cudnnnet.io.checkpoint import load_npz
from cudnnnet.data.mnist import load_mnist
from run_helpers import REPO_ROOT

TOOLS = {"cudnnnet-train": "train", "cudnnnet-predict": "predict", "cudnnnet-evaluate": "evaluate",
         "cudnnnet-benchmark": "benchmark", "cudnnnet-export": "export"}
ENTRY_POINTS = {**{name: f"cudnnnet.cli.{module}:main" for name, module in TOOLS.items()},
                "cudnnnet-train": "cudnnnet.cli.launch:train"}  # starts CUDA before importing cli.train
OUTPUTS = {"model.npz", "metrics.json", "history.csv", "curves.png", "config.yaml", "best.npz"}
STEPS, BATCH = 45, 2000  # 30 steps an epoch: one whole epoch and half of the next


def run(script: str, *arguments, cwd: Path, cache: Path) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "CUDNNNET_DATA"}
    env.update(OPENBLAS_NUM_THREADS="1", XDG_CACHE_HOME=str(cache))
    command = [sys.executable, str(REPO_ROOT / "scripts" / f"{script}.py"), *map(str, arguments)]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=cwd, env=env)


@pytest.fixture(scope="module")
def short_run(tmp_path_factory, mnist_dir):
    """One short host run of the MLP, not quiet, from an empty working directory with an empty cache."""
    root = tmp_path_factory.mktemp("short_run")
    cwd, cache, output = root / "cwd", root / "cache", root / "out"
    cwd.mkdir()
    cache.mkdir()
    finished = run("train", "--config", REPO_ROOT / "configs" / "mnist_mlp.yaml", "--device", "host", "--data-dir",
                   mnist_dir, "--output", output, "--batch-size", BATCH, "--steps", STEPS, cwd=cwd, cache=cache)
    assert finished.returncode == 0, finished.stderr
    return finished, output, cwd, cache


# ---- entry points ---------------------------------------------------------------------------


@pytest.mark.parametrize("name, module", TOOLS.items())
def test_console_entry_point_resolves_to_main_and_helps(name, module, capsys):
    try:
        distribution("cudnnnet")
    except PackageNotFoundError:
        pytest.skip("cudnnnet is not installed, so it declares no entry points (pip install -e . installs it)")
    (entry,) = entry_points(group="console_scripts", name=name)
    assert entry.value == ENTRY_POINTS[name]
    main = entry.load()
    assert callable(main) and f"{main.__module__}:{main.__name__}" == ENTRY_POINTS[name]
    with pytest.raises(SystemExit) as exit:
        main(["--help"])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {name} ") and "--quiet" in out and "--log-level" in out and "--debug" in out


def test_an_installed_console_script_runs(tmp_path):
    path = shutil.which("cudnnnet-evaluate")
    if path is None:
        pytest.skip("the console scripts are not on PATH (pip install -e . puts them there)")
    finished = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert finished.returncode == 0 and "usage: cudnnnet-evaluate" in finished.stdout


# ---- what a training run leaves --------------------------------------------------------------


def test_a_run_writes_only_its_outputs(short_run):
    _, output, cwd, cache = short_run
    names = {path.name for path in output.iterdir()}
    (published,) = [name for name in names if name.startswith(".set-")]  # one set, no temporary file left behind
    assert names == OUTPUTS | {"current", published} and os.readlink(output / "current") == published
    assert {path.name for path in (output / published).iterdir()} == OUTPUTS
    assert all(os.readlink(output / name) == f"current/{name}" for name in OUTPUTS)
    assert not any(cwd.iterdir())
    assert [path.name for path in cache.iterdir()] == ["cudnnnet"]
    assert [path.name for path in (cache / "cudnnnet").iterdir()] == ["parsed"]  # the parsed MNIST files only
    assert {path.suffix for path in (cache / "cudnnnet" / "parsed").iterdir()} == {".npy", ".json"}


def test_outputs_are_readable_by_others_as_the_umask_allows(short_run):
    _, output, _, _ = short_run
    umask = os.umask(0o022)
    os.umask(umask)
    for path in (output / "current").iterdir():
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask, path.name
    assert (output / "current").stat().st_mode & 0o777 == 0o777 & ~umask


def test_metrics_history_and_summary_agree(short_run):
    finished, output, _, _ = short_run
    metrics = json.loads((output / "metrics.json").read_text())
    rows = list(csv.DictReader((output / "history.csv").open()))
    assert [(row["epoch"], row["steps"]) for row in rows] == [("1", "30"), ("2", "45")]
    for row in rows:
        assert 0 < float(row["train_loss"]) < 3 and 0 < float(row["test_loss"]) < 3
        assert 0.5 < float(row["train_accuracy"]) <= 1 and 0.5 < float(row["test_accuracy"]) <= 1
    assert metrics["steps"] == STEPS and metrics["batch_size"] == BATCH and metrics["epochs"] == 1.5
    assert metrics["test_accuracy"] == pytest.approx(float(rows[-1]["test_accuracy"]), abs=1e-6)
    assert metrics["images_per_second"] > 0 and metrics["device"] == "host (NumPy)"
    summary = json.loads(finished.stdout)
    assert summary["test_accuracy"] == metrics["test_accuracy"] and summary["steps"] == STEPS
    _, metadata = load_npz(output / "model.npz")
    assert metadata["position"] == {"epoch": 1, "batch": 15, "step": STEPS}


def test_curves_png_shows_loss_accuracy_and_learning_rate_panels(short_run):
    _, output, _, _ = short_run
    with Image.open(output / "curves.png") as image:
        assert image.format == "PNG" and image.size == (1500, 400)
        pixels = np.asarray(image.convert("RGB"))
    colours = {tuple(pixel) for pixel in pixels.reshape(-1, 3)[::7]}
    assert len(colours) > 20  # axes, text, grid and two coloured lines: not a blank canvas


def test_logging_goes_to_stderr_and_results_to_stdout(short_run):
    finished, _, _, _ = short_run
    assert re.search(r"^INFO cudnnnet\.train\.trainer: epoch 1: train loss [\d.]+ accuracy [\d.]+ \| test loss [\d.]+ "
                     r"accuracy [\d.]+ \| [\d.]+ s$", finished.stderr, re.M)
    assert "Traceback" not in finished.stderr and "\r" not in finished.stderr  # no progress bar when not a terminal
    assert len(finished.stdout.splitlines()) == 1


def test_a_progress_bar_on_a_terminal_shows_loss_accuracy_and_speed(tmp_path, mnist_dir):
    import fcntl
    import pty
    import termios

    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 160, 0, 0))  # rows, columns: a terminal
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    config = tmp_path / "mlp.yaml"  # the bar shows the figures every log_every steps
    config.write_text((REPO_ROOT / "configs" / "mnist_mlp.yaml").read_text().replace("log_every: 100", "log_every: 1"))
    assert "log_every: 1\n" in config.read_text()
    command = [sys.executable, str(REPO_ROOT / "scripts" / "train.py"), "--config",
               str(config), "--device", "host", "--data-dir", str(mnist_dir),
               "--output", str(tmp_path / "out"), "--batch-size", "1000", "--steps", "3", "--log-level", "WARNING"]
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=secondary, env=env) as process:
        os.close(secondary)
        shown = read_all(primary)
        assert process.wait(timeout=300) == 0, shown
    assert re.search(r"\repoch 1/1: +\d+%\|.*\| \d/3 .*acc=[\d.]+, img_s=[\d,]+, loss=[\d.]+\]", shown), shown


def read_all(descriptor: int) -> str:
    chunks = []
    while True:
        try:
            chunk = os.read(descriptor, 65536)
        except OSError:  # the other end closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(descriptor)
    return b"".join(chunks).decode(errors="replace")


# ---- evaluate --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def test_label_counts(mnist_dir):
    _, labels = load_mnist(mnist_dir, "test", download=False)
    return np.bincount(labels, minlength=10)


def evaluate(short_run, mnist_dir, *extra):
    _, output, cwd, cache = short_run
    return run("evaluate", "--weights", output / "model.npz", "--data-dir", mnist_dir, "--device", "host", *extra,
               cwd=cwd, cache=cache)


def parse_matrix(lines: list[str]) -> np.ndarray:
    assert lines[0].split() == ["true\\pred", *map(str, range(10))]
    rows = [line.split() for line in lines[1:]]
    assert [row[0] for row in rows] == list(map(str, range(10)))
    return np.array([[int(count) for count in row[1:]] for row in rows])


def test_evaluate_prints_accuracy_loss_and_confusion_matrix(short_run, mnist_dir, test_label_counts):
    finished = evaluate(short_run, mnist_dir, "--quiet")
    assert finished.returncode == 0 and finished.stderr == ""
    first, *matrix_lines = finished.stdout.splitlines()
    found = re.fullmatch(r"test accuracy ([\d.]+)  test loss ([\d.]+)  \(10000 images, host \(NumPy\)\)", first)
    assert found, first
    accuracy, loss = float(found.group(1)), float(found.group(2))
    metrics = json.loads((short_run[1] / "metrics.json").read_text())
    assert accuracy == pytest.approx(metrics["test_accuracy"], abs=6e-5)
    assert loss == pytest.approx(metrics["test_loss"], abs=6e-5)
    matrix = parse_matrix(matrix_lines)
    np.testing.assert_array_equal(matrix.sum(axis=1), test_label_counts)  # each row: the images of that digit
    assert np.trace(matrix) / matrix.sum() == pytest.approx(accuracy, abs=6e-5)


def test_evaluate_json_and_logging(short_run, mnist_dir, test_label_counts):
    finished = evaluate(short_run, mnist_dir, "--json")
    assert finished.returncode == 0
    result = json.loads(finished.stdout)
    assert set(result) == {"test_accuracy", "test_loss", "classes", "confusion_matrix", "device"}
    matrix = np.array(result["confusion_matrix"])
    np.testing.assert_array_equal(matrix.sum(axis=1), test_label_counts)
    assert np.trace(matrix) / 10000 == pytest.approx(result["test_accuracy"])
    assert re.search(r"^INFO cudnnnet\.io\.checkpoint: loaded \d+ arrays from .*model\.npz$", finished.stderr, re.M)
    quieter = evaluate(short_run, mnist_dir, "--json", "--log-level", "WARNING")
    assert quieter.returncode == 0 and quieter.stderr == "" and json.loads(quieter.stdout) == result


def test_evaluate_takes_the_output_folder_for_its_checkpoint(short_run, mnist_dir, tmp_path):
    _, output, cwd, cache = short_run
    from_file = evaluate(short_run, mnist_dir, "--json", "--quiet")
    from_folder = run("evaluate", "--weights", output, "--data-dir", mnist_dir, "--device", "host", "--json",
                      "--quiet", cwd=cwd, cache=cache)
    assert from_folder.returncode == 0, from_folder.stderr
    assert json.loads(from_folder.stdout) == json.loads(from_file.stdout)
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = run("evaluate", "--weights", empty, "--data-dir", mnist_dir, "--device", "host", cwd=cwd, cache=cache)
    assert refused.returncode == 2
    assert refused.stderr.strip() == (f"cudnnnet-evaluate: error: --weights {empty}: this folder holds no model.npz; "
                                      "give an output folder that a training wrote into, or a checkpoint file")


def test_no_graph_turns_the_cuda_graph_off_in_the_run_config(mnist_dir, tmp_path):
    """--no-graph reaches the config the run records in its checkpoint (train.graph: false)."""
    from cudnnnet.io.checkpoint import load_npz
    from run_helpers import train_cli

    for flags, expected in (((), True), (("--no-graph",), False)):
        output = tmp_path / str(expected)
        finished = train_cli("configs/mnist_mlp.yaml", output, mnist_dir, "--steps", "3", *flags)
        assert finished.returncode == 0, finished.stderr
        assert load_npz(output / "model.npz")[1]["config"]["train"]["graph"] is expected
