"""What the tools do when a flag is left out or does not fit, as a newcomer meets it: where a resumed run
writes, what a CPU machine is told about its GPU, a data folder that holds no data set, a batch larger
than the data set."""

import json
import shutil
from pathlib import Path

import pytest

from cudnnnet.io.checkpoint import load_npz
from run_helpers import REPO_ROOT, interrupted_mlp_checkpoint, offline_tools

MLP_CONFIG = REPO_ROOT / "configs" / "mnist_mlp.yaml"


@pytest.fixture
def tool(tmp_path):
    """tool(script, *arguments): cudnnnet.cli.<script>.main([..., "--quiet"]) in tmp_path, offline."""
    with offline_tools(tmp_path) as call:
        yield call


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """An MLP checkpoint as a run interrupted after 3 steps saves it."""
    return interrupted_mlp_checkpoint(tmp_path_factory.mktemp("checkpoint") / "model.npz")


def earlier_run(folder: Path, checkpoint: Path) -> Path:
    """An output folder holding what a run stopped at step 3 published."""
    folder.mkdir(parents=True)
    shutil.copy(checkpoint, folder / "model.npz")
    (folder / "metrics.json").write_text(json.dumps({"steps": 3}) + "\n")
    return folder


def step_of(folder: Path) -> int:
    return load_npz(folder / "model.npz")[1]["position"]["step"]


@pytest.mark.parametrize("named", ["folder", "model.npz"])
def test_resuming_a_folder_without_output_writes_there(tool, tmp_path, checkpoint, mnist_dir, named):
    run = earlier_run(tmp_path / "runs" / "mlp", checkpoint)
    resume = run if named == "folder" else run / "model.npz"
    finished = tool("train", "--config", MLP_CONFIG, "--device", "host", "--data-dir", mnist_dir, "--resume",
                    resume, "--steps", "5")
    assert finished.returncode == 0, finished.stderr
    assert step_of(run) == 5
    assert sorted(path.name for path in (tmp_path / "runs").iterdir()) == ["mlp"]


def test_resuming_a_checkpoint_file_outside_an_output_folder_writes_to_the_config_s_folder(tool, tmp_path, checkpoint,
                                                                                           mnist_dir):
    shutil.copy(checkpoint, tmp_path / "saved.npz")
    finished = tool("train", "--config", MLP_CONFIG, "--device", "host", "--data-dir", mnist_dir, "--resume",
                    tmp_path / "saved.npz", "--steps", "5")
    assert finished.returncode == 0, finished.stderr
    assert step_of(tmp_path / "runs" / "mnist_mlp") == 5
    assert load_npz(tmp_path / "saved.npz")[1]["position"]["step"] == 3


@pytest.mark.parametrize("device", ["cuda", "auto", "host"])
def test_a_launcher_on_a_node_without_a_gpu_is_told_how_to_train_on_the_cpu(tool, monkeypatch, mnist_dir, tmp_path,
                                                                              device):
    """Not "use --device host" (the ranks refuse it) nor "needs --device cuda" (there is no GPU): one process."""
    from cudnnnet.backends.cuda.bindings import driver_start
    from cudnnnet.errors import DeviceUnavailableError

    def no_libcuda():
        raise DeviceUnavailableError("libcuda.so.1 cannot be loaded (no such file); is the NVIDIA driver installed?")

    monkeypatch.setattr(driver_start, "load", no_libcuda)
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "0",
                        "NCCL_NVLS_ENABLE": "0"}.items():
        monkeypatch.setenv(name, value)
    finished = tool("train", "--config", MLP_CONFIG, "--device", device, "--data-dir", mnist_dir, "--output",
                    tmp_path / "run", "--steps", "2")
    assert finished.returncode == 2
    [line] = finished.stderr.splitlines()
    problem = "the device is host" if device == "host" else "rank 0 has no GPU (libcuda.so.1 cannot be loaded"
    assert line.startswith(f"cudnnnet-train: error: torchrun started 2 ranks, but {problem}")
    assert line.endswith("to train on the CPU, run one process, without torchrun, with --device host or auto")
    assert "needs --device cuda" not in line and "use --device host" not in line
    assert not (tmp_path / "run").exists()


DATA_SETS = {"mnist": (MLP_CONFIG, "MNIST"),
             "fashion-mnist": (REPO_ROOT / "configs" / "fashion_mnist_cnn.yaml", "Fashion-MNIST"),
             "cifar10": (REPO_ROOT / "configs" / "cifar10_cnn.yaml", "CIFAR-10")}


@pytest.mark.parametrize("config, name", DATA_SETS.values(), ids=DATA_SETS.keys())
def test_a_data_dir_holding_other_files_is_no_data_set_not_a_download_target(tool, tmp_path, config, name):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "cat.png").write_bytes(b"a photo")
    finished = tool("train", "--config", config, "--device", "host", "--data-dir", folder, "--output",
                    tmp_path / "run", "--steps", "1")
    assert finished.returncode == 2
    assert finished.stderr.splitlines() == [
        f"cudnnnet-train: error: no {name} in {folder}: it holds other files ('cat.png', ...) and none of "
        + {"CIFAR-10": "data_batch_1.bin ... test_batch.bin, cifar-10-batches-bin/ or cifar-10-binary.tar.gz"}.get(
            name, "train-images-idx3-ubyte(.gz), train-labels-idx1-ubyte(.gz), t10k-images-idx3-ubyte(.gz), "
                  "t10k-labels-idx1-ubyte(.gz)")
        + "; give --data-dir (data.dir) the folder that holds them, or an empty folder to download them into"]
    assert [path.name for path in folder.iterdir()] == ["cat.png"]


def test_evaluate_with_a_data_dir_holding_other_files_says_no_mnist_there(tool, tmp_path, checkpoint):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "cat.png").write_bytes(b"a photo")
    finished = tool("evaluate", "--weights", checkpoint, "--device", "host", "--data-dir", folder)
    assert finished.returncode == 2
    assert finished.stderr.startswith(f"cudnnnet-evaluate: error: no MNIST in {folder}: it holds other files")


def test_an_empty_data_dir_is_where_mnist_is_downloaded(tool, tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    finished = tool("train", "--config", MLP_CONFIG, "--device", "host", "--data-dir", folder, "--output",
                    tmp_path / "run", "--steps", "1")
    assert finished.returncode == 2 and "could not download train-images-idx3-ubyte.gz" in finished.stderr  # offline


def npz_config(folder: Path, batch_size: int) -> Path:
    """A dense classifier of the ``small_npz`` data set (100 training images of 3×8×8)."""
    path = folder / "npz.yaml"
    path.write_text(f"""\
model:
  - {{type: dense, name: fc, out_size: 10}}
  - {{type: softmax, name: softmax}}
data: {{dataset: npz, train_file: {folder / 'train.npz'}, test_file: {folder / 'test.npz'}}}
train: {{batch_size: {batch_size}, optimizer: {{lr: 0.1}}}}
""")
    return path


def test_a_batch_larger_than_the_training_set_is_said(tool, small_npz, caplog):
    with caplog.at_level("INFO", logger="cudnnnet"):
        finished = tool("train", "--config", npz_config(small_npz, 64), "--device", "host", "--batch-size", "500",
                        "--steps", "2", "--output", small_npz / "run")
    assert finished.returncode == 0, finished.stderr
    said = [(record.levelname, record.getMessage()) for record in caplog.records]
    assert ("WARNING", "train.batch_size 500 is larger than the 100 training images: each step trains on all 100, "
                       "one step per epoch (give --batch-size 50 or less for several steps per epoch)") in said
    assert any(message.endswith("2 steps of batch 100 (epochs: 2)") for _, message in said), said


def test_a_batch_within_the_training_set_is_not_warned_about(tool, small_npz, caplog):
    with caplog.at_level("INFO", logger="cudnnnet"):
        finished = tool("train", "--config", npz_config(small_npz, 100), "--device", "host", "--steps", "2",
                        "--output", small_npz / "run")
    assert finished.returncode == 0, finished.stderr
    assert [record for record in caplog.records if record.levelname == "WARNING"] == []
    assert any(record.getMessage().endswith("2 steps of batch 100 (epochs: 2)") for record in caplog.records)
