"""Helpers the tests share (not fixtures): the repository root, running the scripts as a user would, and
stopping a training run to resume it."""

import contextlib
import importlib
import io
import signal
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
NO_NETWORK = "http://127.0.0.1:9"  # nothing listens on the discard port: any download fails at once


def run_script(script: str, *arguments: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """``python scripts/<script>.py ARGUMENTS``; returns the finished process (output captured as text)."""
    command = [sys.executable, str(REPO_ROOT / "scripts" / f"{script}.py"), *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def train_cli(config: str, output: Path, data_dir: Path, *extra: str, device: str = "host"):
    """Run scripts/train.py on ``config`` (relative to the repository) into ``output``."""
    return run_script("train", "--config", str(REPO_ROOT / config), "--device", device, "--data-dir", str(data_dir),
                      "--output", str(output), "--quiet", *extra)


@contextlib.contextmanager
def every_backend_using(engine: str):
    """Inside the block the host backend, and the CUDA backend where usable, run ``engine``."""
    from cudnnnet.backends import cuda_available, get_backend

    names = ["host"] + (["cuda"] if cuda_available() else [])
    with contextlib.ExitStack() as stack:
        for name in names:
            stack.enter_context(get_backend(name).using_engine(engine))
        yield


@contextlib.contextmanager
def math_mode(backend, mode: str):
    """The backend in math ``mode`` within the block, as it was after."""
    before = backend.math
    backend.set_math(mode)
    try:
        yield
    finally:
        backend.set_math(before)


def interrupted_then_resumed(config, output: Path, stop_after: int):
    """A Trainer of ``config`` into ``output`` stopped by a signal after step ``stop_after`` (a checkpoint
    published there), and a new Trainer resuming from that folder, returned before it runs."""
    import pytest
    from cudnnnet.train.trainer import Interrupted, Trainer

    interrupted = Trainer(config, output, progress=False)
    train_batch = interrupted.train_batch

    def stop_after_the_step(index):
        size = train_batch(index)
        if interrupted.position.step == stop_after - 1:
            interrupted.stop_signal = signal.SIGINT
        return size

    interrupted.train_batch = stop_after_the_step
    with pytest.raises(Interrupted):
        interrupted.run()
    resumed = Trainer(config, output, resume=output, progress=False)
    assert resumed.position.step == stop_after
    return resumed


@contextlib.contextmanager
def offline_tools(folder: Path):
    """call(script, *arguments) -> CompletedProcess: cudnnnet.cli.<script>.main with --quiet, in ``folder``,
    with a user cache there and every download failing at once."""
    import pytest
    from cudnnnet.cli import common
    from cudnnnet.data import mnist

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.delenv(mnist.DATA_ENV, raising=False)
        patch.setenv("XDG_CACHE_HOME", str(folder / "cache"))
        patch.setattr(mnist, "MIRRORS", (NO_NETWORK + "/",))
        patch.setattr(common, "configure_logging", lambda args: None)  # pytest keeps the logging set-up

        def call(script: str, *arguments) -> subprocess.CompletedProcess:
            main = importlib.import_module(f"cudnnnet.cli.{script}").main
            stdout, stderr = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                try:
                    code = main([*map(str, arguments), "--quiet"])
                except SystemExit as exit:
                    code = exit.code
            return subprocess.CompletedProcess([script, *arguments], code, stdout.getvalue(), stderr.getvalue())

        yield call


def interrupted_mlp_checkpoint(path: Path) -> Path:
    """An untrained configs/mnist_mlp.yaml checkpoint at ``path`` as a run interrupted after 3 steps
    saves it (weights, SGD's state, the config and the position)."""
    from cudnnnet.config.schema import load_config
    from cudnnnet.network import OPTIMIZER_PREFIX
    from cudnnnet.optim.optimizers import SGD
    from cudnnnet.train.trainer import build_network

    config = load_config(REPO_ROOT / "configs" / "mnist_mlp.yaml")
    network = build_network(config, "host")
    optimizer = SGD(network, config.train.optimizer.lr, config.train.optimizer.momentum)
    network.save(path, extra_arrays=optimizer.state_arrays(OPTIMIZER_PREFIX), config=config.to_dict(), history=[],
                 position={"epoch": 0, "batch": 3, "step": 3})
    return path
