"""The host (NumPy) backend against independent references.

BLAS calls are checked against NumPy on column-major buffers with padding rows full of garbage;
convolution and pooling against naive float64 loops, as adjoints of each other and by finite
differences; pointwise calls, losses and SGD against their formulas. Shapes are tiny, so loops
in the references are fine.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cudnnnet.backends import get_backend
from cudnnnet.backends.base import OP_N, OP_T
from cudnnnet.backends.descriptors import (ActivationDescriptor, ActivationMode, ConvolutionDescriptor,
                                           PoolingDescriptor, PoolingMode)
from cudnnnet.backends.host import HostBackend
from cudnnnet.errors import ShapeError, UsageError
from cudnnnet.tensor import Tensor

GARBAGE = 7.0e5  # what padding rows hold; it must neither leak into results nor be overwritten


@pytest.fixture(scope="module")
def b() -> HostBackend:
    return get_backend("host")


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def T(array) -> Tensor:
    return Tensor.from_numpy(np.asarray(array, dtype=np.float32), "host")


def col_major(matrix: np.ndarray, ld: int, pad_value: float = GARBAGE) -> np.ndarray:
    """Flat column-major storage of ``matrix`` with leading dimension ``ld``; padding rows = pad_value."""
    rows, cols = matrix.shape
    store = np.full((cols, ld), pad_value, np.float32)
    store[:, :rows] = matrix.T
    return store.reshape(-1)


def read_col_major(flat: np.ndarray, rows: int, cols: int, ld: int) -> np.ndarray:
    return flat[: ld * cols].reshape(cols, ld).T[:rows]


# ---- backend identity and memory --------------------------------------------------------------
def test_host_backend_is_the_registered_singleton(b):
    assert isinstance(b, HostBackend) and b is get_backend("host")
    assert b.name == "host" and b.device_name == "host (NumPy)"


def test_memory_calls_copy_fill_and_alias(b):
    source = np.arange(6, dtype=np.float32)
    stored = b.upload(source)
    source[0] = 99
    assert stored.dtype == np.float32 and stored.flags.c_contiguous and stored[0] == 0
    out = b.download(stored, 4)
    out[1] = -1
    assert list(out) == [0, -1, 2, 3] and stored[1] == 1
    window = b.view(stored, 2, 3)
    window[0] = 42
    assert stored[2] == 42
    b.fill(stored, 5.0, 2)
    assert list(stored[:3]) == [5, 5, 42]
    dst = b.empty(6)
    b.copy(stored, dst, 6)
    assert np.array_equal(dst, stored) and dst is not stored
    b.write(dst, np.array([1, 2], np.float32))
    assert list(dst[:3]) == [1, 2, 42]
    with pytest.raises(ShapeError):
        b.view(stored, 4, 3)


def test_dlpack_round_trip(b):
    t = T(np.arange(24).reshape(2, 3, 2, 2))
    assert t.__dlpack_device__() == (1, 0)
    shared = np.from_dlpack(t)
    assert shared.shape == (2, 3, 2, 2)
    t.data[5] = -7
    assert shared.reshape(-1)[5] == -7  # a view of the storage, not a copy
    back = Tensor.from_dlpack(np.arange(6, dtype=np.float32).reshape(2, 3), b)
    assert back.shape == (2, 3, 1, 1) and np.array_equal(back.numpy().reshape(-1), np.arange(6))


# ---- cuBLAS -----------------------------------------------------------------------------------
@pytest.mark.parametrize("transa, transb", list(itertools.product((OP_N, OP_T), repeat=2)))
@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (0.5, 2.0), (-1.5, 1.0)])
def test_sgemm_every_transpose_with_padded_leading_dimensions(b, rng, transa, transb, alpha, beta):
    m, n, k = 4, 3, 5
    op_a, op_b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    stored_a = op_a if transa == OP_N else op_a.T
    stored_b = op_b if transb == OP_N else op_b.T
    lda, ldb, ldc = stored_a.shape[0] + 2, stored_b.shape[0] + 3, m + 1
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    A = T(col_major(stored_a, lda, np.nan))  # NaN padding: reading it would poison C
    B = T(col_major(stored_b, ldb, np.nan))
    C = T(col_major(c0, ldc))
    b.sgemm(transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)
    a32, b32 = op_a.astype(np.float32).astype(np.float64), op_b.astype(np.float32).astype(np.float64)
    expected = alpha * a32 @ b32 + beta * c0
    np.testing.assert_allclose(read_col_major(C.data, m, n, ldc), expected, rtol=1e-5, atol=1e-5)
    padding = C.data.reshape(n, ldc)[:, m:]
    assert np.all(padding == GARBAGE), "sgemm wrote into C's padding rows"


def test_sgemm_beta_zero_overwrites_nan_and_writes_only_m_by_n(b, rng):
    m, n, k, ldc = 2, 3, 4, 5
    a, bb = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    C = T(np.full(ldc * n, np.nan))
    b.sgemm(OP_N, OP_N, m, n, k, 2.0, T(col_major(a, m)), m, T(col_major(bb, k)), k, 0.0, C, ldc)
    np.testing.assert_allclose(read_col_major(C.data, m, n, ldc), 2 * a.astype(np.float32) @ bb.astype(np.float32),
                               rtol=1e-5)
    assert np.isnan(C.data.reshape(n, ldc)[:, m:]).all()


def test_sgemm_dense_layer_layout(b, rng):
    """A (n, c, h, w) tensor read with ld = c·h·w has one sample per column: y = Wᵀ·x as in Dense."""
    x, w = rng.standard_normal((6, 4)), rng.standard_normal((4, 3))  # x: 6 samples of 4; W: in×out
    X, W, Y = T(x.reshape(6, 4, 1, 1)), T(w.T.reshape(-1)), Tensor((6, 3), "host")
    # W stored column-major (in=4 rows, out=3 cols), ld=4; y(out×batch) = Wᵀ(out×in)·x(in×batch)
    b.sgemm(OP_T, OP_N, 3, 6, 4, 1.0, W, 4, X, 4, 0.0, Y, 3)
    np.testing.assert_allclose(Y.numpy().reshape(6, 3), x @ w, rtol=1e-5)


def test_sgemm_rejects_bad_leading_dimension_and_short_storage(b):
    A = T(np.zeros(12))
    with pytest.raises(ShapeError):
        b.sgemm(OP_N, OP_N, 4, 3, 3, 1.0, A, 3, A, 3, 0.0, A, 4)  # lda < m
    with pytest.raises(ShapeError):
        b.sgemm(OP_N, OP_N, 4, 3, 4, 1.0, A, 4, A, 4, 0.0, T(np.zeros(11)), 4)  # C needs 12 values
    with pytest.raises(UsageError):
        b.sgemm(2, OP_N, 2, 2, 2, 1.0, A, 2, A, 2, 0.0, A, 2)


def strided(values: np.ndarray, inc: int, fill: float = GARBAGE) -> np.ndarray:
    """BLAS vector storage: element i at i·inc (inc > 0) or (n-1-i)·|inc| (inc < 0)."""
    n = len(values)
    store = np.full((n - 1) * abs(inc) + 1, fill, np.float32)
    store[:: abs(inc)] = values if inc > 0 else values[::-1]
    return store


@pytest.mark.parametrize("trans", [OP_N, OP_T])
@pytest.mark.parametrize("incx, incy", [(1, 1), (2, 3), (-2, 1)])
def test_sgemv_both_transposes_with_increments(b, rng, trans, incx, incy):
    m, n, lda = 5, 3, 7
    a = rng.standard_normal((m, n)).astype(np.float32)
    op_a = a if trans == OP_N else a.T
    x = rng.standard_normal(op_a.shape[1]).astype(np.float32)
    y0 = rng.standard_normal(op_a.shape[0]).astype(np.float32)
    Y = T(strided(y0, incy))
    b.sgemv(trans, m, n, 0.5, T(col_major(a, lda, np.nan)), lda, T(strided(x, incx)), incx, -2.0, Y, incy)
    np.testing.assert_allclose(Y.data[::incy], 0.5 * op_a @ x - 2.0 * y0, rtol=1e-5, atol=1e-6)
    untouched = np.ones(Y.size, bool)
    untouched[::incy] = False
    assert np.all(Y.data[untouched] == GARBAGE)


@pytest.mark.parametrize("alpha_as_tensor", [False, True])
def test_saxpy_sscal_scopy_with_increments(b, rng, alpha_as_tensor):
    n = 4
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    alpha = T([0.25]) if alpha_as_tensor else 0.25
    Y = T(strided(y, 2))
    b.saxpy(n, alpha, T(strided(x, 3)), 3, Y, 2)
    np.testing.assert_allclose(Y.data[::2], 0.25 * x + y, rtol=1e-6)
    assert np.all(Y.data[1::2] == GARBAGE)
    X = T(strided(x, 2))
    b.sscal(n, T([-3.0]) if alpha_as_tensor else -3.0, X, 2)
    np.testing.assert_allclose(X.data[::2], -3 * x, rtol=1e-6)
    assert np.all(X.data[1::2] == GARBAGE)
    Z = T(strided(np.zeros(n), 2))
    b.scopy(n, T(strided(x, -1)), -1, Z, 2)
    np.testing.assert_array_equal(Z.data[::2], x)
    assert np.all(Z.data[1::2] == GARBAGE)


# ---- activations ------------------------------------------------------------------------------
COEF = 0.8
FORMULAS = {
    ActivationMode.SIGMOID: lambda x: 1 / (1 + np.exp(-x)),
    ActivationMode.RELU: lambda x: np.maximum(x, 0),
    ActivationMode.TANH: np.tanh,
    ActivationMode.CLIPPED_RELU: lambda x: np.minimum(np.maximum(x, 0), COEF),
    ActivationMode.ELU: lambda x: np.where(x > 0, x, COEF * (np.exp(x) - 1)),
}


def activation_input(rng, shape=(2, 3, 4, 5)):
    """Values in [-3, 3] kept clear of the kinks at 0 and COEF, so finite differences hold."""
    x = rng.uniform(-3, 3, shape)
    near_kink = (np.abs(x) < 0.05) | (np.abs(x - COEF) < 0.05)
    return np.where(near_kink, x + 0.2, x).astype(np.float32)


@pytest.mark.parametrize("mode", list(ActivationMode))
def test_activation_forward_matches_formula_and_blends(b, rng, mode):
    desc = ActivationDescriptor(mode, COEF)
    x = activation_input(rng)
    y = T(np.full(x.shape, np.nan))
    b.activation_forward(desc, 1.0, T(x), 0.0, y)
    np.testing.assert_allclose(y.numpy(), FORMULAS[mode](x.astype(np.float64)), rtol=1e-5, atol=1e-6)
    y0 = rng.standard_normal(x.shape).astype(np.float32)
    y = T(y0)
    b.activation_forward(desc, 2.0, T(x), 0.5, y)
    np.testing.assert_allclose(y.numpy(), 2 * FORMULAS[mode](x.astype(np.float64)) + 0.5 * y0, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", list(ActivationMode))
def test_activation_backward_matches_finite_differences(b, rng, mode):
    desc = ActivationDescriptor(mode, COEF)
    x = activation_input(rng)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    y = T(np.zeros(x.shape))
    b.activation_forward(desc, 1.0, T(x), 0.0, y)
    dx0 = rng.standard_normal(x.shape).astype(np.float32)
    dx = T(dx0)
    b.activation_backward(desc, 1.5, y, T(dy), T(x), 0.5, dx)
    h = 1e-3
    x64 = x.astype(np.float64)
    numeric = (FORMULAS[mode](x64 + h) - FORMULAS[mode](x64 - h)) / (2 * h)
    np.testing.assert_allclose(dx.numpy(), 1.5 * numeric * dy + 0.5 * dx0, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "mode, x, expected",
    [
        (ActivationMode.RELU, [-1.0, 0.0, 1.0], [0, 0, 1]),
        (ActivationMode.CLIPPED_RELU, [0.0, 0.5, COEF, 2.0], [0, 1, 0, 0]),
        (ActivationMode.ELU, [-1.0, 0.0, 2.0], [COEF * np.exp(-1.0), COEF, 1]),
    ],
)
def test_activation_gradient_at_and_beyond_the_kinks(b, mode, x, expected):
    desc = ActivationDescriptor(mode, COEF)
    y = T(np.zeros(len(x)))
    b.activation_forward(desc, 1.0, T(x), 0.0, y)
    dx = T(np.full(len(x), np.nan))
    b.activation_backward(desc, 1.0, y, T(np.ones(len(x))), T(x), 0.0, dx)
    np.testing.assert_allclose(dx.numpy().reshape(-1), expected, rtol=1e-6)


def test_activation_rejects_unknown_mode_and_shape_mismatch(b):
    with pytest.raises(UsageError):
        b.activation_forward(ActivationDescriptor(99), 1.0, T([1.0]), 0.0, T([0.0]))
    with pytest.raises(ShapeError):
        b.activation_forward(ActivationDescriptor(ActivationMode.RELU), 1.0, T([1.0, 2.0]), 0.0, T([0.0]))


# ---- softmax and bias -------------------------------------------------------------------------
def test_softmax_over_each_samples_chw_values_is_stable_and_blends(b, rng):
    x = rng.standard_normal((3, 4, 2, 2)) * 5
    x[0] += 1000.0  # exp would overflow without the max shift
    y = T(np.full(x.shape, np.nan))
    b.softmax_forward(1.0, T(x), 0.0, y)
    flat = x.reshape(3, -1)
    e = np.exp(flat - flat.max(axis=1, keepdims=True))
    expected = (e / e.sum(axis=1, keepdims=True)).reshape(x.shape)
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(y.numpy().reshape(3, -1).sum(axis=1), 1.0, rtol=1e-5)
    y0 = rng.standard_normal(x.shape).astype(np.float32)
    y = T(y0)
    b.softmax_forward(0.5, T(x), 2.0, y)
    np.testing.assert_allclose(y.numpy(), 0.5 * expected + 2 * y0, rtol=1e-5, atol=1e-6)


def test_add_tensor_broadcasts_bias_over_n_h_w(b, rng):
    bias = rng.standard_normal((1, 3, 1, 1)).astype(np.float32)
    y0 = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    y = T(y0)
    b.add_tensor(2.0, T(bias), 0.5, y)
    np.testing.assert_allclose(y.numpy(), 2 * bias + 0.5 * y0, rtol=1e-6)
    y = T(np.full(y0.shape, np.nan))
    b.add_tensor(1.0, T(bias), 0.0, y)
    np.testing.assert_array_equal(y.numpy(), np.broadcast_to(bias, y0.shape))
    with pytest.raises(ShapeError):
        b.add_tensor(1.0, T(np.zeros((1, 2, 1, 1))), 1.0, y)


# ---- convolution ------------------------------------------------------------------------------
def naive_conv(x: np.ndarray, w: np.ndarray, stride: int, pad: int, dil: int) -> np.ndarray:
    """Direct cross-correlation in float64, one output value at a time."""
    n, c, h, wd = x.shape
    k, _, r, _ = w.shape
    oh = (h + 2 * pad - (r - 1) * dil - 1) // stride + 1
    ow = (wd + 2 * pad - (r - 1) * dil - 1) // stride + 1
    y = np.zeros((n, k, oh, ow))
    for ni, ki, i, j in itertools.product(range(n), range(k), range(oh), range(ow)):
        total = 0.0
        for ci, u, v in itertools.product(range(c), range(r), range(r)):
            row, col = i * stride + u * dil - pad, j * stride + v * dil - pad
            if 0 <= row < h and 0 <= col < wd:
                total += float(x[ni, ci, row, col]) * float(w[ki, ci, u, v])
        y[ni, ki, i, j] = total
    return y


CONV_CASES = [  # (stride, padding, dilation, kernel, (n, c, h, w), k)
    (1, 0, 1, 3, (2, 3, 6, 5), 4),
    (2, 1, 1, 3, (2, 2, 7, 6), 3),  # stride 2 leaves the last row/column of x uncovered
    (1, 2, 2, 3, (1, 2, 6, 6), 2),
    (3, 1, 2, 2, (2, 1, 8, 7), 3),
    (1, 1, 1, 1, (2, 3, 4, 4), 2),
    (2, 0, 1, 4, (1, 2, 9, 9), 2),
]


def conv_setup(b, rng, case):
    stride, pad, dil, kernel, x_shape, k = case
    desc = ConvolutionDescriptor(k, x_shape[1], kernel, stride, pad, dil)
    y_shape = desc.output_shape(x_shape)
    plan = b.convolution_plan(desc, x_shape, y_shape)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(desc.filter_shape).astype(np.float32)
    dy = rng.standard_normal(y_shape).astype(np.float32)
    return desc, plan, x, w, dy


@pytest.mark.parametrize("case", CONV_CASES)
def test_convolution_forward_matches_direct_loops(b, rng, case):
    desc, plan, x, w, dy = conv_setup(b, rng, case)
    expected = naive_conv(x, w, desc.stride, desc.padding, desc.dilation)
    y = T(np.full(dy.shape, np.nan))
    b.convolution_forward(plan, 1.0, T(x), T(w), 0.0, y)
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-4, atol=1e-4)
    y0 = rng.standard_normal(dy.shape).astype(np.float32)
    y = T(y0)
    b.convolution_forward(plan, -0.5, T(x), T(w), 1.5, y)
    np.testing.assert_allclose(y.numpy(), -0.5 * expected + 1.5 * y0, rtol=1e-4, atol=1e-4)


def conv_gradients(b, plan, x, w, dy):
    dx, dw = T(np.full(x.shape, np.nan)), T(np.full(w.shape, np.nan))
    b.convolution_backward_data(plan, 1.0, T(w), T(dy), 0.0, dx)
    b.convolution_backward_filter(plan, 1.0, T(x), T(dy), 0.0, dw)
    return dx.numpy().astype(np.float64), dw.numpy().astype(np.float64)


@pytest.mark.parametrize("case", CONV_CASES)
def test_convolution_backward_passes_are_adjoints_of_forward(b, rng, case):
    """⟨x ⋆ w, dy⟩ = ⟨x, bwd_data(w, dy)⟩ = ⟨w, bwd_filter(x, dy)⟩."""
    _, plan, x, w, dy = conv_setup(b, rng, case)
    y = T(np.zeros(dy.shape))
    b.convolution_forward(plan, 1.0, T(x), T(w), 0.0, y)
    dx, dw = conv_gradients(b, plan, x, w, dy)
    forward = np.vdot(y.numpy().astype(np.float64), dy)
    np.testing.assert_allclose(np.vdot(x, dx), forward, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(np.vdot(w, dw), forward, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("case", CONV_CASES[:4])
def test_convolution_backward_matches_finite_differences(b, rng, case):
    """L = ⟨x ⋆ w, dy⟩ is linear in x and in w, so central differences of the naive conv are exact."""
    desc, plan, x, w, dy = conv_setup(b, rng, case)
    dx, dw = conv_gradients(b, plan, x, w, dy)
    h = 0.5

    def loss(xv, wv):
        return np.vdot(naive_conv(xv, wv, desc.stride, desc.padding, desc.dilation), dy)

    for index in rng.choice(x.size, size=min(x.size, 12), replace=False):
        e = np.zeros(x.size)
        e[index] = h
        e = e.reshape(x.shape)
        numeric = (loss(x + e, w) - loss(x - e, w)) / (2 * h)
        assert dx.reshape(-1)[index] == pytest.approx(numeric, rel=1e-4, abs=1e-4)
    for index in rng.choice(w.size, size=min(w.size, 8), replace=False):
        e = np.zeros(w.size)
        e[index] = h
        e = e.reshape(w.shape)
        numeric = (loss(x, w + e) - loss(x, w - e)) / (2 * h)
        assert dw.reshape(-1)[index] == pytest.approx(numeric, rel=1e-4, abs=1e-4)


def test_convolution_uncovered_input_pixels_get_zero_gradient(b, rng):
    _, plan, x, w, dy = conv_setup(b, rng, (2, 0, 1, 3, (1, 1, 6, 6), 1))  # rows/cols 5 never read
    dx, _ = conv_gradients(b, plan, x, w, dy)
    assert np.all(dx[..., 5, :] == 0) and np.all(dx[..., :, 5] == 0) and np.any(dx[..., :5, :5] != 0)


def test_convolution_backward_blends_with_alpha_beta(b, rng):
    _, plan, x, w, dy = conv_setup(b, rng, CONV_CASES[1])
    dx_ref, dw_ref = conv_gradients(b, plan, x, w, dy)
    dx0, dw0 = rng.standard_normal(x.shape).astype(np.float32), rng.standard_normal(w.shape).astype(np.float32)
    dx, dw = T(dx0), T(dw0)
    b.convolution_backward_data(plan, 2.0, T(w), T(dy), 0.5, dx)
    b.convolution_backward_filter(plan, -1.0, T(x), T(dy), 1.0, dw)
    np.testing.assert_allclose(dx.numpy(), 2 * dx_ref + 0.5 * dx0, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw.numpy(), -dw_ref + dw0, rtol=1e-5, atol=1e-5)


def test_convolution_backward_bias_sums_over_n_h_w(b, rng):
    dy = rng.standard_normal((3, 4, 5, 2)).astype(np.float32)
    db0 = rng.standard_normal((1, 4, 1, 1)).astype(np.float32)
    db = T(db0)
    b.convolution_backward_bias(0.5, T(dy), 2.0, db)
    np.testing.assert_allclose(db.numpy(), 0.5 * dy.sum(axis=(0, 2, 3), keepdims=True) + 2 * db0, rtol=1e-5)


def test_convolution_plan_and_calls_reject_wrong_shapes(b):
    desc = ConvolutionDescriptor(4, 3, 3)
    with pytest.raises(ShapeError):
        b.convolution_plan(desc, (2, 3, 8, 8), (2, 4, 5, 5))
    with pytest.raises(ShapeError):
        b.convolution_plan(desc, (2, 2, 8, 8), (2, 4, 6, 6))
    plan = b.convolution_plan(desc, (2, 3, 8, 8), (2, 4, 6, 6))
    with pytest.raises(ShapeError):
        b.convolution_forward(plan, 1.0, T(np.zeros((1, 3, 8, 8))), T(np.zeros(desc.filter_shape)), 0.0,
                              T(np.zeros((2, 4, 6, 6))))


# ---- pooling ----------------------------------------------------------------------------------
def naive_pool(x, mode, window, pad, stride, dy=None):
    """Forward (dy None) or backward of pooling, one window at a time in float64."""
    n, c, h, w = x.shape
    oh, ow = (h + 2 * pad - window) // stride + 1, (w + 2 * pad - window) // stride + 1
    y, dx = np.zeros((n, c, oh, ow)), np.zeros(x.shape)
    for ni, ci, i, j in itertools.product(range(n), range(c), range(oh), range(ow)):
        cells = [
            (i * stride + u - pad, j * stride + v - pad) for u in range(window) for v in range(window)
        ]
        inside = [(r, s) for r, s in cells if 0 <= r < h and 0 <= s < w]
        if mode == PoolingMode.MAX:
            values = [x[ni, ci, r, s] for r, s in inside]
            first = inside[int(np.argmax(values))]  # np.argmax returns the first maximum
            y[ni, ci, i, j] = max(values)
            if dy is not None:
                dx[ni, ci, first[0], first[1]] += dy[ni, ci, i, j]
        else:
            y[ni, ci, i, j] = sum(x[ni, ci, r, s] for r, s in inside) / window**2
            if dy is not None:
                for r, s in inside:
                    dx[ni, ci, r, s] += dy[ni, ci, i, j] / window**2
    return y if dy is None else dx


POOL_CASES = [  # (window, padding, stride)
    (2, 0, 2),
    (3, 1, 2),  # overlapping windows
    (3, 1, 1),
    (2, 1, 1),
    (3, 0, 3),
    (2, 1, 3),  # gaps between windows
]


@pytest.mark.parametrize("mode", [PoolingMode.MAX, PoolingMode.AVERAGE])
@pytest.mark.parametrize("window, pad, stride", POOL_CASES)
def test_pooling_forward_and_backward_match_direct_loops(b, rng, mode, window, pad, stride):
    desc = PoolingDescriptor(mode, window, pad, stride)
    x = rng.integers(-3, 4, (2, 2, 7, 6)).astype(np.float32)  # small integers: many ties
    x[0, 0] = -5.0  # an all-negative plane: zero padding would win a max window, -inf must not
    y_shape = desc.output_shape(x.shape)
    y = T(np.full(y_shape, np.nan))
    b.pooling_forward(desc, 1.0, T(x), 0.0, y)
    np.testing.assert_allclose(y.numpy(), naive_pool(x, mode, window, pad, stride), rtol=1e-6, atol=1e-6)
    dy = rng.standard_normal(y_shape).astype(np.float32)
    dx = T(np.full(x.shape, np.nan))
    b.pooling_backward(desc, 1.0, y, T(dy), T(x), 0.0, dx)
    np.testing.assert_allclose(dx.numpy(), naive_pool(x, mode, window, pad, stride, dy), rtol=1e-5, atol=1e-6)


def test_max_pooling_routes_ties_to_the_first_maximum_in_row_major_order(b):
    desc = PoolingDescriptor(PoolingMode.MAX, 2, 0, 2)
    x = np.array([[1, 5], [5, 5]], np.float32).reshape(1, 1, 2, 2)
    dx = T(np.zeros(x.shape))
    b.pooling_backward(desc, 1.0, T([5.0]), T([3.0]), T(x), 0.0, dx)
    np.testing.assert_array_equal(dx.numpy().reshape(2, 2), [[0, 3], [0, 0]])


def test_max_pooling_routes_nan_and_infinities_as_values(b):
    """A NaN or infinite dy stays in its window's first maximum (0·NaN would spread it); a window
    holding a NaN x has a NaN maximum, equal to no cell: its dy goes nowhere; +inf is a maximum."""
    desc = PoolingDescriptor(PoolingMode.MAX, 2, 0, 2)
    x = np.array([[1, 7, 2, np.nan, np.inf, 0], [3, 4, 9, 9, np.inf, 5]], np.float32).reshape(1, 1, 2, 6)
    dy = np.array([np.nan, 2.0, np.inf], np.float32).reshape(1, 1, 1, 3)
    y = np.array([7.0, np.nan, np.inf], np.float32).reshape(1, 1, 1, 3)
    dx = T(np.full(x.shape, 8.0))
    b.pooling_backward(desc, 1.0, T(y), T(dy), T(x), 0.0, dx)
    np.testing.assert_array_equal(dx.numpy().reshape(2, 6), [[0, np.nan, 0, 0, np.inf, 0], [0, 0, 0, 0, 0, 0]])

@pytest.mark.parametrize("mode", [PoolingMode.MAX, PoolingMode.AVERAGE])
@pytest.mark.parametrize("window, pad, stride", [(3, 1, 2), (2, 1, 1)])
def test_pooling_backward_matches_finite_differences(b, rng, mode, window, pad, stride):
    desc = PoolingDescriptor(mode, window, pad, stride)
    x = (rng.permutation(2 * 3 * 5 * 5).reshape(2, 3, 5, 5) * 0.1 - 3).astype(np.float32)  # distinct
    y_shape = desc.output_shape(x.shape)
    dy = rng.standard_normal(y_shape)
    y, dx = T(np.zeros(y_shape)), T(np.zeros(x.shape))
    b.pooling_forward(desc, 1.0, T(x), 0.0, y)
    b.pooling_backward(desc, 1.0, y, T(dy), T(x), 0.0, dx)
    h = 0.02  # below half the gap between values, so no window's winner changes
    flat_dx = dx.numpy().reshape(-1)
    for index in range(x.size):
        e = np.zeros(x.size, np.float32)
        e[index] = h
        e = e.reshape(x.shape)
        up, down = T(np.zeros(y_shape)), T(np.zeros(y_shape))
        b.pooling_forward(desc, 1.0, T(x + e), 0.0, up)
        b.pooling_forward(desc, 1.0, T(x - e), 0.0, down)
        numeric = np.vdot(up.numpy().astype(np.float64) - down.numpy(), dy) / (2 * h)
        assert flat_dx[index] == pytest.approx(numeric, rel=1e-3, abs=1e-3)


def test_pooling_blends_with_alpha_beta(b, rng):
    desc = PoolingDescriptor(PoolingMode.MAX, 2, 0, 2)
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    pooled = naive_pool(x, PoolingMode.MAX, 2, 0, 2)
    y0 = rng.standard_normal(pooled.shape).astype(np.float32)
    y = T(y0)
    b.pooling_forward(desc, 2.0, T(x), -1.0, y)
    np.testing.assert_allclose(y.numpy(), 2 * pooled - y0, rtol=1e-6, atol=1e-6)
    dy = rng.standard_normal(pooled.shape).astype(np.float32)
    dx0 = rng.standard_normal(x.shape).astype(np.float32)
    dx = T(dx0)
    b.pooling_backward(desc, 0.5, T(pooled), T(dy), T(x), 3.0, dx)
    expected = 0.5 * naive_pool(x, PoolingMode.MAX, 2, 0, 2, dy) + 3 * dx0
    np.testing.assert_allclose(dx.numpy(), expected, rtol=1e-6, atol=1e-6)


def test_pooling_rejects_wrong_output_shape_and_mode(b):
    x = T(np.zeros((1, 1, 4, 4)))
    with pytest.raises(ShapeError):
        b.pooling_forward(PoolingDescriptor(PoolingMode.MAX, 2, 0, 2), 1.0, x, 0.0, T(np.zeros((1, 1, 3, 3))))
    with pytest.raises(UsageError):
        b.pooling_forward(PoolingDescriptor(7, 2, 0, 2), 1.0, x, 0.0, T(np.zeros((1, 1, 2, 2))))


# ---- losses, accuracy, SGD --------------------------------------------------------------------
def one_hot(labels, classes=5):
    return np.eye(classes, dtype=np.float32)[labels].reshape(len(labels), classes, 1, 1)


def test_cross_entropy_loss_clamps_and_accumulates(b, rng):
    p = rng.dirichlet(np.ones(5), size=4).astype(np.float32).reshape(4, 5, 1, 1)
    p[1, 2] = 0.0  # clamped to 1e-7 where the target is 1
    t = one_hot([0, 2, 4, 1])
    expected = -np.sum(t * np.log(np.maximum(p.astype(np.float64), 1e-7))) / 4
    loss = T([np.nan])
    b.cross_entropy_loss(T(p), T(t), loss)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    b.cross_entropy_loss(T(p), T(t), loss, accumulate=True)
    assert loss.item() == pytest.approx(2 * expected, rel=1e-5)


def test_squared_error_loss_and_accumulate(b, rng):
    p, t = rng.standard_normal((3, 4, 1, 1)), rng.standard_normal((3, 4, 1, 1))
    expected = 0.5 * np.sum((p.astype(np.float32) - t.astype(np.float32)).astype(np.float64) ** 2) / 3
    loss = T([np.nan])
    b.squared_error_loss(T(p), T(t), loss)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    b.squared_error_loss(T(p), T(t), loss, accumulate=True)
    assert loss.item() == pytest.approx(2 * expected, rel=1e-5)


def test_accuracy_count_and_accumulate(b):
    predict = np.array([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [0.3, 0.4, 0.3]])
    target = np.eye(3)[[1, 0, 1, 1]]
    count = T([np.nan])
    b.accuracy_count(T(predict.reshape(4, 3, 1, 1)), T(target.reshape(4, 3, 1, 1)), count)
    assert count.item() == 3
    b.accuracy_count(T(predict.reshape(4, 3, 1, 1)), T(target.reshape(4, 3, 1, 1)), count, accumulate=True)
    assert count.item() == 6


@pytest.mark.parametrize("momentum, weight_decay, lr_as_tensor", [(0.0, 0.0, False), (0.9, 1e-2, False),
                                                                  (0.9, 0.0, True), (0.0, 5e-3, True)])
def test_sgd_update_follows_pytorch(b, rng, momentum, weight_decay, lr_as_tensor):
    param = rng.standard_normal(10)
    grads = [rng.standard_normal(10) for _ in range(3)]
    P = T(param)
    V = T(np.zeros(10)) if momentum else None
    p_ref, v_ref = param.astype(np.float32).astype(np.float64), np.zeros(10)
    for grad in grads:
        b.sgd_update(P, T(grad), V, T([0.1]) if lr_as_tensor else 0.1, momentum, weight_decay)
        g = grad.astype(np.float32) + weight_decay * p_ref
        v_ref = momentum * v_ref + g if momentum else g
        p_ref = p_ref - 0.1 * v_ref
    np.testing.assert_allclose(P.numpy().reshape(-1), p_ref, rtol=1e-5, atol=1e-6)
    if momentum:
        np.testing.assert_allclose(V.numpy().reshape(-1), v_ref, rtol=1e-5, atol=1e-6)


def test_sgd_update_with_momentum_needs_velocity(b):
    with pytest.raises(UsageError):
        b.sgd_update(T([1.0]), T([1.0]), None, 0.1, 0.9, 0.0)
