"""Shared pytest fixtures."""

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    """The real MNIST files: $CUDNNNET_TEST_DATA, else ../shared/data/mnist beside the repository."""
    path = Path(os.environ.get("CUDNNNET_TEST_DATA", REPO_ROOT.parent / "shared" / "data" / "mnist"))
    if not path.is_dir():
        pytest.skip(f"real MNIST not found at {path}; set CUDNNNET_TEST_DATA to a directory holding the IDX files")
    return path
