"""Convolution plans from the disk cache and from a larger batch's plan, on the GPU: no candidate
listing (cudnnGetConvolution*Algorithm_v7) and no timing, the same algorithms, the same results.
The host-side logic, with cuDNN faked, is in test_plan_cache.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from cudnnnet.backends import cuda_available, get_backend
from cudnnnet.backends.descriptors import ConvolutionDescriptor
from cudnnnet.backends.cuda.convolution import EXACT_ALGORITHMS
from cudnnnet.backends.cuda.gemm_convolution import GEMM_ALGORITHM
from cudnnnet.tensor import Tensor

pytestmark = pytest.mark.gpu

DESC = ConvolutionDescriptor(20, 1, 5)  # conv1 of configs/original_cnn.yaml
LISTINGS = ("cudnnGetConvolutionForwardAlgorithm_v7", "cudnnGetConvolutionBackwardDataAlgorithm_v7",
            "cudnnGetConvolutionBackwardFilterAlgorithm_v7")
DIRECTIONS = ("forward", "backward_data", "backward_filter")
# a searched plan lists each direction's algorithms, and the forward ones of the flipped filter
# (DESC has stride 1: backward data as a forward convolution is a candidate)
SEARCH_LISTINGS = 4
FP32_TOLERANCE = 1e-5


@pytest.fixture
def new_backend(tmp_path, monkeypatch):
    """Makes CudaBackends of their own (no plans in memory) over an empty disk cache; closes them after the test."""
    if not cuda_available():
        pytest.skip("no usable GPU, cuda-python or CUDA library (get_backend('cuda') says why)")
    from cudnnnet.backends.cuda import CudaBackend

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.delenv("CUDNNNET_NO_CACHE", raising=False)
    made = []

    def make() -> CudaBackend:
        made.append(CudaBackend(engine="fast"))  # the search these tests check: listed, timed by us
        return made[-1]

    yield make
    for backend in made:
        backend.close()


@pytest.fixture
def bindings():
    from cudnnnet.backends.cuda import bindings

    bindings.reset_calls()
    return bindings


def listings(bindings) -> int:
    return sum(bindings.calls[name] for name in LISTINGS)


def plan_at(backend, batch: int, size: int = 28):
    x_shape = (batch, DESC.in_channels, size, size)
    return backend.convolution_plan(DESC, x_shape, DESC.output_shape(x_shape))


def algorithms(plan) -> list:
    return [getattr(plan, direction) for direction in DIRECTIONS]


def convolution_entries(tmp_path) -> list:
    """The convolution plans' files in the disk cache (the GEMM engine's plans lie beside them)."""
    directory = tmp_path / "xdg-cache" / "cudnnnet" / "plans"
    return [path for path in directory.iterdir() if json.loads(path.read_text())["key"].get("plan") != "gemm"]


def run_convolution(backend, arrays) -> list[np.ndarray]:
    """y = x ⋆ w, dx = dy ⋆ᵀ w, dw = Σ x ⋆ dy with ``backend``'s plan for these shapes."""
    x, w, dy = (Tensor.from_numpy(array, backend) for array in arrays)
    y, dx, dw = Tensor(dy.shape, backend), Tensor(x.shape, backend), Tensor(w.shape, backend)
    plan = backend.convolution_plan(DESC, x.shape, y.shape)
    backend.convolution_forward(plan, 1.0, x, w, 0.0, y)
    backend.convolution_backward_data(plan, 1.0, w, dy, 0.0, dx)
    backend.convolution_backward_filter(plan, 1.0, x, dy, 0.0, dw)
    return [tensor.numpy() for tensor in (y, dx, dw)]


def arrays_for(batch: int, size: int = 28) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    x_shape = (batch, DESC.in_channels, size, size)
    shapes = (x_shape, DESC.filter_shape, DESC.output_shape(x_shape))
    return [rng.standard_normal(shape).astype(np.float32) for shape in shapes]


def assert_close_to_host(outputs, arrays) -> None:
    expected = run_convolution(get_backend("host"), arrays)
    for got, want in zip(outputs, expected):
        assert np.linalg.norm(got - want) <= FP32_TOLERANCE * np.linalg.norm(want)


def test_a_second_backend_takes_the_plan_from_disk_without_listing_or_timing(new_backend, bindings, tmp_path):
    first = new_backend()
    searched = plan_at(first, 256)
    assert listings(bindings) == SEARCH_LISTINGS
    (entry,) = convolution_entries(tmp_path)
    bindings.reset_calls()
    second = new_backend()
    cached = plan_at(second, 256)
    assert listings(bindings) == 0
    assert bindings.calls["cudaEventElapsedTime"] == 0  # nothing timed
    assert algorithms(cached) == algorithms(searched)
    arrays = arrays_for(256)
    from_search, from_disk = run_convolution(first, arrays), run_convolution(second, arrays)
    for a, b in zip(from_search, from_disk):
        assert np.array_equal(a, b)  # the same deterministic algorithms on the same inputs
    assert_close_to_host(from_disk, arrays)
    assert json.loads(entry.read_text())["key"]["x_shape"] == [256, 1, 28, 28]


SECOND_PROCESS = """
import json, sys
from cudnnnet.backends import get_backend
from cudnnnet.backends.descriptors import ConvolutionDescriptor
from cudnnnet.backends.cuda.convolution import EXACT_ALGORITHMS
from cudnnnet.backends.cuda.gemm_convolution import GEMM_ALGORITHM
from cudnnnet.backends.cuda import bindings
backend = get_backend("cuda")
backend.set_engine("fast")
desc = ConvolutionDescriptor(20, 1, 5)
bindings.reset_calls()
plan = backend.convolution_plan(desc, (256, 1, 28, 28), desc.output_shape((256, 1, 28, 28)))
listings = sum(count for name, count in bindings.calls.items() if name.endswith("Algorithm_v7"))
print(json.dumps({"listings": listings, "algorithms": [[getattr(plan, d).algo, getattr(plan, d).workspace_bytes]
                                                      for d in ("forward", "backward_data", "backward_filter")]}))
"""


def test_a_second_process_takes_the_plan_from_disk(new_backend, bindings, tmp_path):
    searched = plan_at(new_backend(), 256)
    assert listings(bindings) == SEARCH_LISTINGS
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg-cache")}
    finished = subprocess.run([sys.executable, "-c", SECOND_PROCESS], capture_output=True, text=True, env=env,
                              timeout=300)
    assert finished.returncode == 0, finished.stderr
    report = json.loads(finished.stdout.strip().splitlines()[-1])
    assert report["listings"] == 0
    assert report["algorithms"] == [[a.algo, a.workspace_bytes] for a in algorithms(searched)]


@pytest.mark.parametrize("algo", [999, 6, -7], ids=["unknown", "winograd", "negative"])
def test_a_cached_algorithm_cudnn_refuses_is_searched_again(new_backend, bindings, tmp_path, algo):
    searched = plan_at(new_backend(), 256)
    (entry,) = convolution_entries(tmp_path)
    content = json.loads(entry.read_text())
    content["algorithms"]["forward"]["algo"] = algo
    entry.write_text(json.dumps(content))
    bindings.reset_calls()
    again = plan_at(new_backend(), 256)
    assert listings(bindings) == SEARCH_LISTINGS
    assert again.forward.algo == GEMM_ALGORITHM or again.forward.algo in EXACT_ALGORITHMS["forward"]
    assert json.loads(entry.read_text())["algorithms"]["forward"]["algo"] == again.forward.algo  # rewritten
    assert searched.x_shape == again.x_shape


def test_a_cached_workspace_that_differs_is_searched_again(new_backend, bindings, tmp_path):
    plan_at(new_backend(), 256)
    (entry,) = convolution_entries(tmp_path)
    content = json.loads(entry.read_text())
    content["algorithms"]["backward_filter"]["workspace_bytes"] += 4
    entry.write_text(json.dumps(content))
    bindings.reset_calls()
    plan_at(new_backend(), 256)
    assert listings(bindings) == SEARCH_LISTINGS


def test_the_no_cache_variable_searches_every_time(new_backend, bindings, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDNNNET_NO_CACHE", "1")
    plan_at(new_backend(), 256)
    plan_at(new_backend(), 256)
    assert listings(bindings) == 2 * SEARCH_LISTINGS
    assert not (tmp_path / "xdg-cache" / "cudnnnet" / "plans").exists()


@pytest.mark.parametrize("batch", [96, 1, 255])
def test_a_smaller_batch_reuses_the_larger_plan_without_listing(new_backend, bindings, batch):
    backend = new_backend()
    large = plan_at(backend, 256)
    bindings.reset_calls()
    small = plan_at(backend, batch)
    assert listings(bindings) == 0
    assert [a.algo for a in algorithms(small)] == [a.algo for a in algorithms(large)]
    assert all(a.deterministic for a in algorithms(small))
    assert backend.context.workspace_bytes >= small.workspace_bytes
    arrays = arrays_for(batch)
    assert_close_to_host(run_convolution(backend, arrays), arrays)


def test_a_larger_batch_is_searched(new_backend, bindings):
    backend = new_backend()
    plan_at(backend, 96)
    bindings.reset_calls()
    plan_at(backend, 256)
    assert listings(bindings) == SEARCH_LISTINGS
