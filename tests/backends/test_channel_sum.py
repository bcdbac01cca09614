"""convolution_backward_bias, db = alpha·Σ_{n,h,w} dy + beta·db (issue 5).

On every backend the call is checked against a float64 reference; on CUDA (marked ``gpu``, skipped
without a GPU) our one-launch kernel (kernels/channel_sum.cu) is checked against the host backend
for batch sizes 1 to 1000, one channel, H·W = 1, a large H·W and more channels than one launch
has partial sums, then proven to take one launch and no library call, and to give the same bits
on every launch, eager or replayed in a CUDA graph.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from cudnnnet.backends.cuda import channel_sum
from cudnnnet.errors import ShapeError, UsageError
from cudnnnet.tensor import Tensor
from run_helpers import every_backend_using

FP32_TOLERANCE = 1e-5
CNN_SHAPES = [(256, 20, 24, 24), (256, 50, 8, 8)]  # conv1's and conv2's dy in configs/mnist_cnn.yaml
SHAPES = CNN_SHAPES + [
    (1, 3, 5, 5),
    (7, 4, 6, 6),
    (255, 20, 24, 24),
    (1000, 6, 3, 3),
    (7, 1, 13, 13),  # one channel
    (1000, 1, 1, 1),  # H·W = 1, one channel
    (255, 64, 1, 1),  # H·W = 1
    (2, 600, 3, 3),  # more channels than MAX_PARTIALS / 2: one block per channel
    (3, 2, 300, 300),  # a large H·W
    (1, 1, 1024, 1024),  # one sample, one channel: MAX_PARTIALS chunks
]
BLENDS = [(1.0, 0.0), (0.5, 2.0), (-1.5, 1.0), (2.0, 0.0)]  # (alpha, beta); beta = 0 starts from NaN


def inputs(shape, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """dy of ``shape`` (mean 0.5, so that no channel's sum cancels to nearly 0) and a db (1, C, 1, 1)."""
    rng = np.random.default_rng([seed, *shape])
    dy = (rng.standard_normal(shape) + 0.5).astype(np.float32)
    return dy, rng.standard_normal((1, shape[1], 1, 1)).astype(np.float32)


def bias_gradient(backend, dy: np.ndarray, db: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    """db after convolution_backward_bias(alpha, dy, beta, db); db starts as NaN where beta == 0."""
    out = Tensor.from_numpy(db, backend)
    if beta == 0.0:
        out.fill_(np.nan)
    backend.convolution_backward_bias(alpha, Tensor.from_numpy(dy, backend), beta, out)
    return out.numpy()


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def describe(shape) -> str:
    n, c, h, w = shape
    cut = channel_sum.split(c, n * h * w)
    return f"dy {shape}: {cut.chunks} chunk(s) of {cut.chunk_length} values per channel, {c * cut.chunks} blocks"


# ---- every backend: the formula ------------------------------------------------------------------
@pytest.mark.parametrize("alpha, beta", BLENDS)
def test_convolution_backward_bias_is_the_blended_sum_over_n_h_w(backend, alpha, beta):
    dy, db = inputs((5, 3, 4, 7))
    got = bias_gradient(backend, dy, db, alpha, beta)
    expected = alpha * dy.astype(np.float64).sum(axis=(0, 2, 3), keepdims=True) + (beta * db if beta else 0.0)
    assert not np.isnan(got).any(), f"beta = {beta}: NaN survived in db {got.ravel()}"
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_convolution_backward_bias_rejects_a_db_of_another_shape(backend):
    with pytest.raises(ShapeError, match=r"db must have shape \(1, 3, 1, 1\)"):
        backend.convolution_backward_bias(1.0, Tensor.zeros((2, 3, 4, 4), backend), 0.0, Tensor.zeros((1, 4), backend))


# ---- the CUDA kernel's split (plain Python) --------------------------------------------------------
@pytest.mark.parametrize("channels", [1, 2, 3, 20, 50, 64, 511, 512, 513, 600, 5000])
@pytest.mark.parametrize("per_channel", [1, 31, 32, 1023, 1024, 1025, 16384, 147456, 1 << 22])
def test_split_covers_each_channel_within_the_partials(channels, per_channel):
    cut = channel_sum.split(channels, per_channel)
    assert cut.chunk_length % channel_sum.CHUNK_ALIGNMENT == 0, cut
    covered = cut.chunks * cut.chunk_length
    assert covered - cut.chunk_length < per_channel <= covered, f"{cut} for {per_channel} values"
    assert cut.chunks == 1 or channels * cut.chunks <= channel_sum.MAX_PARTIALS, f"{cut} for {channels} channels"


@pytest.mark.parametrize("shape", CNN_SHAPES)
def test_split_fills_an_h100_for_the_cnn(shape):
    n, c, h, w = shape
    blocks = c * channel_sum.split(c, n * h * w).chunks
    assert 4 * 132 <= blocks <= channel_sum.MAX_PARTIALS, f"{describe(shape)}: want at least 4 blocks per SM of 132"


def test_fits_indices_counts_what_a_thread_steps_past():
    assert channel_sum.fits_indices((256, 20, 24, 24))
    assert not channel_sum.fits_indices((1, 1, 46340, 46340))  # fewer than 2^31 values, not with a step past them
    assert not channel_sum.fits_indices((2 ** 21, 1024, 1, 1))


# ---- CUDA: the kernel against the host ----------------------------------------------------------------
@pytest.fixture(autouse=True)
def fast_engine():
    """convolution_backward_bias runs this kernel in the fast engine (cudnnConvolutionBackwardBias in the slides one)."""
    with every_backend_using("fast"):
        yield


@pytest.fixture
def counters():
    """The library-call and kernel-launch counters, reset."""
    from cudnnnet.backends.cuda import bindings, kernel

    bindings.reset_calls()
    kernel.reset_launches()
    return bindings.calls, kernel.launches


@pytest.mark.gpu
@pytest.mark.parametrize("alpha, beta", BLENDS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_cuda_convolution_backward_bias_agrees_with_host(host, cuda, shape, alpha, beta):
    dy, db = inputs(shape)
    expected = bias_gradient(host, dy, db, alpha, beta)
    got = bias_gradient(cuda, dy, db, alpha, beta)
    assert not np.isnan(got).any(), f"{describe(shape)}, alpha {alpha}, beta {beta}: NaN in db {got.ravel()}"
    error = relative_error(got, expected)
    worst = int(np.argmax(np.abs(got - expected)))
    assert error < FP32_TOLERANCE, (f"{describe(shape)}, alpha {alpha}, beta {beta}: relative error {error:.3g}; "
                                    f"channel {worst}: cuda {got.ravel()[worst]!r}, host {expected.ravel()[worst]!r}")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(256, 20, 24, 24), (2, 600, 3, 3)], ids=["partials", "one_block_per_channel"])
def test_cuda_convolution_backward_bias_is_one_launch_and_no_library_call(cuda, counters, shape):
    calls, launches = counters
    dy, db = (Tensor.from_numpy(array, cuda) for array in inputs(shape))
    cuda.convolution_backward_bias(1.0, dy, 0.0, db)  # compiles and loads the kernel
    cuda.synchronize()
    calls.clear()
    launches.clear()
    cuda.convolution_backward_bias(1.0, dy, 0.0, db)
    assert dict(launches) == {"channel_sum": 1}, f"{describe(shape)}: launches {dict(launches)}"
    assert dict(calls) == {"cuLaunchKernel": 1}, f"{describe(shape)}: calls {dict(calls)} (no cuBLAS, cuDNN, memset)"


def run_shapes(backend, shapes, alpha=1.0, beta=0.0, start=np.nan) -> list[Tensor]:
    """convolution_backward_bias on each shape's dy, one after another, into db tensors filled with ``start``."""
    results = []
    for shape in shapes:
        dy, _ = inputs(shape)
        db = Tensor((1, shape[1], 1, 1), backend).fill_(start)
        backend.convolution_backward_bias(alpha, Tensor.from_numpy(dy, backend), beta, db)
        results.append(db)
    return results


REPEATED = CNN_SHAPES + [(3, 2, 300, 300), (2, 600, 3, 3)]  # launches of different grids sharing the scratch


def assert_same_bits(got: list[np.ndarray], want: list[np.ndarray], what: str) -> None:
    for shape, a, b in zip(REPEATED, got, want, strict=True):
        differ = np.flatnonzero(a.view(np.uint32) != b.view(np.uint32))
        assert differ.size == 0, (f"{what}, {describe(shape)}: channels {differ[:8].tolist()} differ, "
                                  f"{a.ravel()[differ[:4]]} vs {b.ravel()[differ[:4]]}")


@pytest.mark.gpu
def test_cuda_convolution_backward_bias_gives_the_same_bits_on_every_launch(cuda):
    first = [db.numpy() for db in run_shapes(cuda, REPEATED)]
    again = [db.numpy() for db in run_shapes(cuda, REPEATED)]
    assert_same_bits(again, first, "a second launch (a block counter not reset to 0 leaves NaN)")
    tensors = run_shapes(cuda, REPEATED)
    for shape, db in zip(REPEATED, tensors):
        cuda.convolution_backward_bias(1.0, Tensor.from_numpy(inputs(shape)[0], cuda), 1.0, db)  # db = sum + sum
    assert_same_bits([db.numpy() for db in tensors], [2 * value for value in first], "sum + sum (beta = 1) vs 2·sum")


@pytest.mark.gpu
def test_cuda_convolution_backward_bias_replays_in_a_graph_with_the_eager_bits(cuda, counters):
    calls, _ = counters
    eager = [db.numpy() for db in run_shapes(cuda, REPEATED)]  # the kernel is loaded before the capture
    dys = [Tensor.from_numpy(inputs(shape)[0], cuda) for shape in REPEATED]
    dbs = [Tensor((1, shape[1], 1, 1), cuda) for shape in REPEATED]
    cuda.synchronize()
    calls.clear()
    with cuda.capture() as graph:
        for dy, db in zip(dys, dbs):
            cuda.convolution_backward_bias(1.0, dy, 0.0, db)
    allocated = {name: count for name, count in calls.items() if "Malloc" in name or "Memset" in name}
    assert not allocated, f"the capture allocated or set memory: {allocated}"
    for replay in range(2):
        for db in dbs:
            db.fill_(np.nan)
        graph.launch()
        assert_same_bits([db.numpy() for db in dbs], eager, f"graph replay {replay + 1}")
    assert_same_bits([db.numpy() for db in run_shapes(cuda, REPEATED)], eager, "an eager launch after the replays")


@pytest.mark.gpu
def test_cuda_convolution_backward_bias_takes_float_scalars(cuda):
    dy, db = Tensor.zeros((2, 3, 4, 4), cuda), Tensor.zeros((1, 3, 1, 1), cuda)
    with pytest.raises(UsageError, match="alpha must be a float"):
        cuda.convolution_backward_bias(Tensor.from_numpy([1.0], cuda), dy, 0.0, db)


@pytest.mark.gpu
def test_cuda_convolution_backward_bias_refuses_a_dy_past_32_bit_indices(cuda):
    n, c, h, w = 1, 2, 40000, 30000  # 2.4·10⁹ values: described, never allocated
    dy = types.SimpleNamespace(shape=(n, c, h, w), n=n, c=c, h=h, w=w, size=n * c * h * w)
    with pytest.raises(ShapeError, match="fewer than 2\\^31"):
        cuda.convolution_backward_bias(1.0, dy, 0.0, Tensor.zeros((1, c, 1, 1), cuda))

