"""Helpers the tests share (not fixtures): the repository root and running the scripts as a user would."""

import contextlib
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def run_script(script: str, *arguments: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """``python scripts/<script>.py ARGUMENTS``; returns the finished process (output captured as text)."""
    command = [sys.executable, str(REPO_ROOT / "scripts" / f"{script}.py"), *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def train_cli(config: str, output: Path, data_dir: Path, *extra: str, device: str = "host"):
    """Run scripts/train.py on ``config`` (relative to the repository) into ``output``."""
    return run_script("train", "--config", str(REPO_ROOT / config), "--device", device, "--data-dir", str(data_dir),
                      "--output", str(output), "--quiet", *extra)


@contextlib.contextmanager
def math_mode(backend, mode: str):
    """The backend in math ``mode`` within the block, as it was after."""
    before = backend.math
    backend.set_math(mode)
    try:
        yield
    finally:
        backend.set_math(before)
