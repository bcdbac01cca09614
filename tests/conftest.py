"""Shared pytest fixtures."""

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

from run_helpers import REPO_ROOT, every_backend_using, train_cli

# No example database: Hypothesis would keep one in .hypothesis/ of the folder pytest starts in, and
# replay what it holds, so a test's examples would depend on where and after what it runs.
settings.register_profile("isolated", database=None)
settings.load_profile("isolated")


@pytest.fixture(scope="session", autouse=True)
def isolated_user_cache(tmp_path_factory):
    """The tests, and the processes they start, cache under a temporary $XDG_CACHE_HOME, never the user's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        yield


@pytest.fixture(scope="session", autouse=True)
def absolute_pythonpath():
    """$PYTHONPATH's entries made absolute (``PYTHONPATH=.`` in the checkout), so that the processes
    the tests start in other folders import the cudnnnet the tests import."""
    with pytest.MonkeyPatch.context() as patch:
        if os.environ.get("PYTHONPATH"):
            entries = os.environ["PYTHONPATH"].split(os.pathsep)
            patch.setenv("PYTHONPATH", os.pathsep.join(os.path.abspath(entry) for entry in entries))
        yield


@pytest.fixture(autouse=True)
def in_its_own_folder(tmp_path, monkeypatch):
    """Each test runs in its own empty temporary folder, never the checkout: a default output
    (runs/<config name>) or anything else a tool writes or reads relative to the current folder is
    the test's own."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def engines_restored():
    """Each backend's default engine and math after a test are what they were before it (a test may set them)."""
    from cudnnnet.backends import _instances
    from cudnnnet.engine import DEFAULT_ENGINE

    # the defaults (set_engine, set_math), not the settings in force: a module's fixture may hold a
    # ``using`` block open over its tests, and restoring its settings as defaults would outlive it
    before = {name: (backend._default_engine, backend._default_precision.name) for name, backend in _instances.items()}
    yield
    for name, backend in _instances.items():
        engine, math = before.get(name, (DEFAULT_ENGINE, "fp32"))
        backend.set_engine(engine)
        backend.set_math(math)


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    """The real MNIST files: $CUDNNNET_TEST_DATA, else ../shared/data/mnist beside the repository."""
    path = Path(os.environ.get("CUDNNNET_TEST_DATA", REPO_ROOT.parent / "shared" / "data" / "mnist"))
    if not path.is_dir():
        pytest.skip(f"real MNIST not found at {path}; set CUDNNNET_TEST_DATA to a directory holding the IDX files")
    return path


def _cuda_available() -> bool:
    from cudnnnet.backends import cuda_available

    return cuda_available()


BACKENDS = ["host", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(params=BACKENDS)
def backend(request):
    """Each backend in turn: the test body runs on the host and, where a GPU is usable, on CUDA."""
    from cudnnnet.backends import get_backend

    if request.param == "cuda" and not _cuda_available():
        pytest.skip("no usable GPU or CUDA libraries (on a machine with a GPU: pip install -e \".[cuda13,test]\")")
    return get_backend(request.param)


@pytest.fixture
def cuda():
    """The CUDA backend; skips the test where no GPU or CUDA library is usable."""
    from cudnnnet.backends import get_backend

    if not _cuda_available():
        pytest.skip("no usable GPU or CUDA libraries (on a machine with a GPU: pip install -e \".[cuda13,test]\")")
    return get_backend("cuda")


ENGINE_NAMES = ["slides", "fast"]


@pytest.fixture(params=ENGINE_NAMES)
def engine(request):
    """Each engine in turn, set on every backend for the test (restored afterwards)."""
    with every_backend_using(request.param):
        yield request.param


@pytest.fixture
def host():
    from cudnnnet.backends import get_backend

    return get_backend("host")


@pytest.fixture(scope="session")
def trained_mlp(mnist_dir, tmp_path_factory) -> Path:
    """The output folder of one host epoch of configs/mnist_mlp.yaml (trained once per test session)."""
    output = tmp_path_factory.mktemp("mlp")
    finished = train_cli("configs/mnist_mlp.yaml", output, mnist_dir, "--epochs", "1")
    assert finished.returncode == 0, finished.stderr
    return output


@pytest.fixture(scope="session")
def trained_cnn(mnist_dir, tmp_path_factory) -> Path:
    """The output folder of one host epoch of configs/mnist_cnn.yaml (trained once per test session)."""
    output = tmp_path_factory.mktemp("cnn")
    finished = train_cli("configs/mnist_cnn.yaml", output, mnist_dir, "--epochs", "1")
    assert finished.returncode == 0, finished.stderr
    return output


@pytest.fixture
def small_npz(tmp_path):
    """A data set of 100 training and 20 test RGB images of 8×8 (``dataset: npz``), labels of 10 classes."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 100), ("test", 20)):
        np.savez(tmp_path / f"{split}.npz", x=rng.integers(0, 256, (count, 3, 8, 8), dtype=np.uint8),
                 y=rng.integers(0, 10, count))
    return tmp_path
