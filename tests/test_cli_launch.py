"""cudnnnet-train's entry point (cudnnnet/cli/launch.py): the device read from the command line or
the config before any heavy import, and CUDA started early for it."""

import subprocess
import sys

import pytest

from cudnnnet.cli import launch
from run_helpers import REPO_ROOT


@pytest.fixture
def config(tmp_path):
    def write(text: str):
        path = tmp_path / "run.yaml"
        path.write_text(text)
        return str(path)

    return write


@pytest.mark.parametrize("argv, device", [
    (["--config", "c.yaml", "--device", "cuda"], "cuda"),
    (["--device=host", "--config", "c.yaml"], "host"),
    (["--dev", "host"], "host"),  # argparse takes an unambiguous prefix
    (["--device", "cuda", "--device", "host"], "host"),  # the last one wins, as in argparse
    (["--device", "cuda", "--help"], None),
    (["--steps", "5"], None),
])
def test_the_device_comes_from_the_command_line(argv, device):
    assert launch.device_asked_for(argv) == device


@pytest.mark.parametrize("text, device", [
    ("device: cuda\nmodel: []\n", "cuda"),
    ("model: []\n", "auto"),  # the config's default
    ("device: [cuda]\n", None),
    ("- not a mapping\n", None),
    ("device: cuda\n  bad: [indent\n", None),
])
def test_the_device_comes_from_the_config_otherwise(config, text, device):
    assert launch.device_asked_for(["--con", config(text)]) == device
    assert launch.device_asked_for(["--config", config(text), "--device", "host"]) == "host"


def test_an_unreadable_config_tells_nothing(tmp_path):
    assert launch.device_asked_for(["--config", str(tmp_path / "absent.yaml")]) is None
    assert launch.device_asked_for(["--config", str(tmp_path)]) is None  # a directory


def test_cuda_starts_before_numpy_is_imported_and_the_trainer_runs_after(tmp_path):
    """In a fresh interpreter: importing the entry point imports no NumPy; train() calls warm_up
    with the device first, then cli.train reports the bad config as it always has."""
    probe = (
        "import sys\n"
        "from cudnnnet.cli import launch\n"
        "print('numpy imported:', 'numpy' in sys.modules)\n"
        "launch.warm_up = lambda device: print('warm_up', device, 'numpy imported:', 'numpy' in sys.modules)\n"
        f"sys.exit(launch.train(['--config', {str(tmp_path / 'absent.yaml')!r}, '--device', 'auto']))\n"
    )
    finished = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                              cwd=REPO_ROOT)
    assert finished.stdout.splitlines() == ["numpy imported: False", "warm_up auto numpy imported: False"]
    assert finished.returncode == 2 and "absent.yaml" in finished.stderr


def test_the_config_is_read_once_and_handed_on(config, monkeypatch):
    """What the device sniffing read is what cli.train parses: a pipe is not read twice."""
    path = config("device: host\nmodel: []\n")
    handed = {}
    monkeypatch.setattr(launch, "warm_up", lambda device: handed.setdefault("device", device))
    import cudnnnet.cli.train as train_cli_module

    monkeypatch.setattr(train_cli_module, "main", lambda argv, config_text: handed.update(text=config_text) or 0)
    assert launch.train(["--config", path]) == 0
    assert handed == {"device": "host", "text": {path: b"device: host\nmodel: []\n"}}


@pytest.mark.parametrize("device_flag", [[], ["--device", "host"]])
def test_a_config_from_a_pipe_trains(mnist_dir, tmp_path, device_flag):
    """``--config /dev/stdin`` (as ``--config <(...)``): read once, not reported empty."""
    text = (REPO_ROOT / "configs" / "mnist_mlp.yaml").read_text().replace("device: auto", "") + "\ndevice: host\n"
    command = [sys.executable, str(REPO_ROOT / "scripts" / "train.py"), "--config", "/dev/stdin", *device_flag,
               "--data-dir", str(mnist_dir), "--output", str(tmp_path / "run"), "--steps", "2", "--quiet"]
    finished = subprocess.run(command, input=text, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    assert (tmp_path / "run" / "model.npz").is_file()
