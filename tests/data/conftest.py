"""Fixtures of the data tests: isolation from the user's cache and the internet, fake IDX files,
and a local HTTP server standing in for the download mirrors."""

import functools
import gzip
import http.server
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from cudnnnet.data import mnist

UNREACHABLE_MIRROR = "http://127.0.0.1:9/"


def idx_bytes(array: np.ndarray) -> bytes:
    """An IDX (ubyte) encoding of ``array``."""
    array = np.asarray(array, dtype=np.uint8)
    header = bytes([0, 0, mnist.UBYTE_CODE, array.ndim])
    header += b"".join(int(size).to_bytes(4, "big") for size in array.shape)
    return header + array.tobytes()


def write_split(directory: Path, split: str, images: np.ndarray, labels: np.ndarray, compress: bool = True) -> None:
    """Write ``images`` (N, H, W) and ``labels`` (N,) as the IDX files of ``split`` in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    for idx_name, array in zip(mnist.SPLIT_FILES[split], (images, labels)):
        data = idx_bytes(array)
        if compress:
            (directory / f"{idx_name}.gz").write_bytes(gzip.compress(data))
        else:
            (directory / idx_name).write_bytes(data)


def fake_split(count: int = 12, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(count, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=count, dtype=np.uint8)
    return images, labels


@pytest.fixture
def idx_tools() -> SimpleNamespace:
    """The helpers above, for test modules (conftest modules are not imported directly)."""
    return SimpleNamespace(idx_bytes=idx_bytes, write_split=write_split, fake_split=fake_split)


@pytest.fixture(autouse=True)
def isolated_data_env(tmp_path, monkeypatch):
    """No test reads the user's cache, honours a $CUDNNNET_DATA set outside, or reaches the internet."""
    monkeypatch.delenv(mnist.DATA_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setattr(mnist, "MIRRORS", (UNREACHABLE_MIRROR,))


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@pytest.fixture
def serve_directory():
    """serve_directory(path) -> base URL of a local HTTP server publishing ``path``."""
    servers = []

    def start(directory: Path) -> str:
        handler = functools.partial(_QuietHandler, directory=str(directory))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
