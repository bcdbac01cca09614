"""The slides engine's convolution bias gradient (backends/cuda/backward_bias.py): one
cudnnConvolutionBackwardBias, or two on reshaped views of dy from MIN_SAMPLES samples on.

On the host: the shape rule. On CUDA (marked ``gpu``): both forms agree with the host backend within
float32 rounding for every blend of alpha and beta, make exactly ``passes`` library calls and nothing
else, and replay in a CUDA graph with the eager bits.
"""

from __future__ import annotations

import numpy as np
import pytest

from cudnnnet.backends.cuda import backward_bias
from cudnnnet.tensor import Tensor
from run_helpers import every_backend_using

FP32_TOLERANCE = 1e-5
# the CNN's dy at batch 256 and 32, LeNet-5's at 64, and a batch that splits unevenly (60 = 10·6)
TWO_PASSES = [(256, 20, 24, 24), (256, 50, 8, 8), (32, 20, 24, 24), (64, 6, 28, 28), (64, 120, 1, 1), (60, 7, 3, 5)]
# fewer than MIN_SAMPLES, a prime batch, and more channels B·K than one view may have
ONE_PASS = [(16, 50, 8, 8), (2, 600, 3, 3), (1, 3, 64, 64), (37, 20, 8, 8), (256, 4096, 1, 1)]
BLENDS = [(1.0, 0.0), (0.5, 2.0), (-1.5, 1.0)]  # (alpha, beta); beta = 0 starts from NaN


@pytest.fixture(autouse=True)
def slides_engine():
    """convolution_backward_bias calls cuDNN in the slides engine (our channel_sum kernel in the fast one)."""
    with every_backend_using("slides"):
        yield


def describe(shape) -> str:
    return "dy (" + ", ".join(map(str, shape)) + ")"


def inputs(shape) -> tuple[np.ndarray, np.ndarray]:
    """dy of ``shape`` (mean 0.5, so that no channel's sum cancels to nearly 0) and a db (1, K, 1, 1)."""
    rng = np.random.default_rng([1, *shape])
    dy = (rng.standard_normal(shape) + 0.5).astype(np.float32)
    return dy, rng.standard_normal((1, shape[1], 1, 1)).astype(np.float32)


def bias_gradient(backend, dy: np.ndarray, db: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    out = Tensor.from_numpy(db, backend)
    if beta == 0.0:
        out.fill_(np.nan)
    backend.convolution_backward_bias(alpha, Tensor.from_numpy(dy, backend), beta, out)
    return out.numpy()


# ---- the rule ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", TWO_PASSES, ids=describe)
def test_few_channels_of_many_values_take_two_passes(shape):
    assert backward_bias.passes(shape) == 2
    b = backward_bias.split(shape[0])
    assert 1 < b <= shape[0] // b and shape[0] % b == 0
    assert backward_bias.scratch_bytes(shape) == 4 * b * shape[1]


def test_the_split_is_the_largest_divisor_up_to_the_square_root():
    assert [backward_bias.split(n) for n in (256, 64, 60, 32, 37, 1)] == [16, 8, 6, 4, 1, 1]


@pytest.mark.parametrize("shape", ONE_PASS, ids=describe)
def test_small_or_prime_batches_and_too_many_channels_take_one_call(shape):
    assert backward_bias.passes(shape) == 1
    assert backward_bias.scratch_bytes(shape) == 0


# ---- CUDA against the host ----------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("alpha, beta", BLENDS)
@pytest.mark.parametrize("shape", TWO_PASSES + ONE_PASS, ids=describe)
def test_cuda_bias_gradient_agrees_with_host(host, cuda, shape, alpha, beta):
    dy, db = inputs(shape)
    expected = bias_gradient(host, dy, db, alpha, beta).astype(np.float64)
    got = bias_gradient(cuda, dy, db, alpha, beta).astype(np.float64)
    assert not np.isnan(got).any(), f"{describe(shape)}: NaN in db"
    error = np.linalg.norm(got - expected) / np.linalg.norm(expected)
    assert error < FP32_TOLERANCE, f"{describe(shape)}, alpha {alpha}, beta {beta}: relative error {error:.3g}"


@pytest.fixture
def counters():
    from cudnnnet.backends.cuda import bindings, kernel

    bindings.reset_calls()
    kernel.reset_launches()
    return bindings.calls, kernel.launches


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [TWO_PASSES[0], ONE_PASS[0]], ids=describe)
def test_cuda_bias_gradient_is_passes_library_calls_and_nothing_else(cuda, counters, shape):
    calls, launches = counters
    dy, db = (Tensor.from_numpy(array, cuda) for array in inputs(shape))
    cuda.convolution_backward_bias(1.0, dy, 0.0, db)  # grows the workspace, makes the descriptors
    cuda.synchronize()
    calls.clear()
    cuda.convolution_backward_bias(1.0, dy, 0.0, db)
    assert dict(calls) == {"cudnnConvolutionBackwardBias": backward_bias.passes(shape)}, f"{describe(shape)}: {dict(calls)}"
    assert not launches


@pytest.mark.gpu
def test_cuda_bias_gradient_replays_in_a_graph_with_the_eager_bits(cuda, counters):
    calls, _ = counters
    shapes = TWO_PASSES + ONE_PASS[:2]
    dys = [Tensor.from_numpy(inputs(shape)[0], cuda) for shape in shapes]
    dbs = [Tensor((1, shape[1], 1, 1), cuda) for shape in shapes]
    for dy, db in zip(dys, dbs):
        cuda.convolution_backward_bias(1.0, dy, 0.0, db)
    eager = [db.numpy() for db in dbs]
    calls.clear()
    with cuda.capture() as graph:
        for dy, db in zip(dys, dbs):
            cuda.convolution_backward_bias(1.0, dy, 0.0, db)
    allocated = {name: count for name, count in calls.items() if "Malloc" in name or "Memset" in name}
    assert not allocated, f"the capture allocated or set memory: {allocated}"
    for db in dbs:
        db.fill_(np.nan)
    graph.launch()
    for shape, db, want in zip(shapes, dbs, eager):
        got = db.numpy()
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"{describe(shape)}: {got.ravel()[:4]} vs {want.ravel()[:4]}"
