"""math "bf16" (backends/cuda/low_precision.py; the host's round_to_bf16): GEMMs and convolutions
read bfloat16-rounded operands and sum in FP32, on both backends, against float64 references on
the rounded operands; one training step on the GPU equals the host's.

Tolerances. A product of two bfloat16 values is exact in FP32, so a GEMM differs from the float64
sum of the rounded products only by FP32 summation: at most about k·2⁻²⁴·Σ|a·b| (``SUM_ERROR``
allows 4k·2⁻²⁴). Not rounding the operands would differ by about 2⁻⁸·Σ|a·b|/√k, many times more
at the sizes used, and the tests check that it would fail. cuDNN writes a bfloat16 convolution
result, so a value whose FP32 sum lies within that summation error of a rounding boundary may
round to either neighbour: those may be one bfloat16 step (2⁻⁸ relative) apart, all others must
match the rounded reference within the summation error.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from cudnnnet.backends.base import OP_N, OP_T
from cudnnnet.backends.descriptors import ConvolutionDescriptor
from cudnnnet.backends.host.backend import round_to_bf16, round_to_fp16
from cudnnnet.errors import UsageError
from cudnnnet.precision import BF16, BFLOAT16, FLOAT16, FLOAT32, FP16, FP32, TF32, get_precision
from cudnnnet.tensor import Tensor
from cudnnnet.train.trainer import build_network
from run_helpers import math_mode
from test_engine import config_of, relative_error, step_and_evaluation

UNIT = 2.0 ** -24  # FP32's unit roundoff
BF16_STEP = 2.0 ** -7  # bfloat16's largest spacing relative to a value (7 stored mantissa bits: 2^-7 at 1.0)


def sum_error(k: int) -> float:
    return 4 * k * UNIT


@pytest.fixture
def rng():
    return np.random.default_rng(18)


def normal(rng, *shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# ---- rounding ------------------------------------------------------------------------------------
def nearest_bf16(values: np.ndarray) -> np.ndarray:
    """The nearest bfloat16 of each finite float32, ties to the even one, by comparing distances."""
    bits = values.view(np.uint32)
    lower = (bits & np.uint32(0xFFFF0000)).view(np.float32).astype(np.float64)
    upper = ((bits & np.uint32(0xFFFF0000)) + np.uint32(0x10000)).view(np.float32).astype(np.float64)
    exact = values.astype(np.float64)
    below, above = np.abs(exact - lower), np.abs(upper - exact)
    lower_is_even = ((bits >> np.uint32(16)) & np.uint32(1)) == 0
    return np.where((below < above) | ((below == above) & lower_is_even), lower, upper).astype(np.float32)


def test_round_to_bf16_is_round_to_nearest_even(rng):
    values = (rng.standard_normal(100_000) * 10.0 ** rng.integers(-30, 30, 100_000)).astype(np.float32)
    ties = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 1 + 2 ** -9], np.float32)
    values = np.concatenate([values, ties])
    np.testing.assert_array_equal(round_to_bf16(values), nearest_bf16(values))
    np.testing.assert_array_equal(round_to_bf16(ties), np.array([1.0, 1 + 2 ** -6, -1.0, 1.0], np.float32))


def test_round_to_bf16_keeps_nan_and_infinity_and_overflows_to_infinity():
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 3.4e38, -3.4e38, 0.0, -0.0], np.float32)
    rounded = round_to_bf16(special)
    assert np.isnan(rounded[:2]).all()
    np.testing.assert_array_equal(rounded[2:], [np.inf, -np.inf, np.inf, -np.inf, 0.0, -0.0])
    assert np.signbit(rounded[-1])


def test_an_unknown_math_mode_names_the_valid_ones(backend):
    with pytest.raises(UsageError, match="bf16"):
        backend.set_math("fp8")


# ---- GEMM ----------------------------------------------------------------------------------------
def column_major(flat: np.ndarray, rows: int, cols: int, ld: int) -> np.ndarray:
    return flat[: ld * cols].reshape(cols, ld)[:, :rows].T.astype(np.float64)


def unrounded(values: np.ndarray) -> np.ndarray:
    return values


# math: (its rounding, a rounding of the operands that would fail the test)
HALF_ROUNDINGS = {"bf16": (round_to_bf16, unrounded), "fp16": (round_to_fp16, round_to_bf16)}


@pytest.mark.parametrize("engine", ["slides", "fast"])
@pytest.mark.parametrize("transa, transb", [(OP_N, OP_N), (OP_T, OP_N), (OP_N, OP_T), (OP_T, OP_T)])
@pytest.mark.parametrize("math", list(HALF_ROUNDINGS))
def test_a_16_bit_sgemm_sums_the_rounded_operands_in_fp32(backend, rng, engine, transa, transb, math):
    """A product of two bfloat16 (or two half) values is exact in FP32: the result is the float64
    sum of the rounded products within the FP32 summation error; operands left in FP32 (for bf16)
    or rounded to bfloat16 (for fp16) would be far outside it."""
    rounding, other = HALF_ROUNDINGS[math]
    m, n, k, alpha, beta = 37, 23, 64, 0.75, -0.5
    a_rows, a_cols = (m, k) if transa == OP_N else (k, m)
    b_rows, b_cols = (k, n) if transb == OP_N else (n, k)
    lda, ldb, ldc = a_rows + 3, b_rows + 1, m + 2  # padded leading dimensions
    a, b, c = normal(rng, lda * a_cols), normal(rng, ldb * b_cols), normal(rng, ldc * n)
    A, B, C = (Tensor.from_numpy(array, backend) for array in (a, b, c))
    with backend.using_engine(engine), math_mode(backend, math):
        backend.sgemm(transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)
    result = column_major(C.numpy().reshape(-1), m, n, ldc)

    def op(flat, trans, rows, cols, ld):
        matrix = column_major(flat, rows, cols, ld)
        return matrix if trans == OP_N else matrix.T

    a16, b16 = op(rounding(a), transa, a_rows, a_cols, lda), op(rounding(b), transb, b_rows, b_cols, ldb)
    c0 = column_major(c, m, n, ldc)
    expected = alpha * (a16 @ b16) + beta * c0
    bound = sum_error(k) * (abs(alpha) * (np.abs(a16) @ np.abs(b16)) + np.abs(beta * c0)) + 1e-30
    assert np.all(np.abs(result - expected) <= bound), f"worst: {np.max(np.abs(result - expected) / bound):.3g} x bound"
    elsewhere = alpha * (op(other(a), transa, a_rows, a_cols, lda) @ op(other(b), transb, b_rows, b_cols, ldb)) + beta * c0
    assert np.max(np.abs(elsewhere - expected) / bound) > 10  # the other operands would fail this test
    untouched = C.numpy().reshape(-1)[: ldc * n].reshape(n, ldc)[:, m:]
    np.testing.assert_array_equal(untouched, c[: ldc * n].reshape(n, ldc)[:, m:])


def test_bf16_sgemm_reads_an_unaligned_view(backend, rng):
    """Operands at an odd offset (no four-value conversion) give the rounded product too."""
    m, n, k = 5, 7, 33
    storage = Tensor.from_numpy(normal(rng, 1 + m * k + k * n), backend)
    A, B = storage.view((m * k,), offset=1), storage.view((k * n,), offset=1 + m * k)
    C = Tensor.zeros((m * n,), backend)
    with math_mode(backend, "bf16"):
        backend.sgemm(OP_N, OP_N, m, n, k, 1.0, A, m, B, k, 0.0, C, m)
    a16, b16 = (round_to_bf16(T.numpy().reshape(-1)).astype(np.float64) for T in (A, B))
    expected = a16.reshape(k, m).T @ b16.reshape(n, k).T
    bound = sum_error(k) * (np.abs(a16.reshape(k, m).T) @ np.abs(b16.reshape(n, k).T))
    assert np.all(np.abs(C.numpy().reshape(n, m).T - expected) <= bound)


# ---- convolution ---------------------------------------------------------------------------------
def convolution_reference(x, w, dy, padding: int):
    """(y, dx, dw, and their Σ|a·b| bounds) of a stride-1 convolution in float64."""
    x, w, dy = (array.astype(np.float64) for array in (x, w, dy))
    r = w.shape[2]
    xpad = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    windows = sliding_window_view(xpad, (r, r), axis=(2, 3))  # (N, C, OH, OW, R, S)
    abs_windows = np.abs(windows)
    y = np.einsum("ncijrs,kcrs->nkij", windows, w)
    y_bound = np.einsum("ncijrs,kcrs->nkij", abs_windows, np.abs(w))
    dw = np.einsum("nkij,ncijrs->kcrs", dy, windows)
    dw_bound = np.einsum("nkij,ncijrs->kcrs", np.abs(dy), abs_windows)
    dxpad, dx_bound = np.zeros_like(xpad), np.zeros_like(xpad)
    oh, ow = dy.shape[2:]
    for i in range(r):
        for j in range(r):
            dxpad[:, :, i:i + oh, j:j + ow] += np.einsum("nkij,kc->ncij", dy, w[:, :, i, j])
            dx_bound[:, :, i:i + oh, j:j + ow] += np.einsum("nkij,kc->ncij", np.abs(dy), np.abs(w[:, :, i, j]))
    inner = (slice(None), slice(None), slice(padding, padding + x.shape[2]), slice(padding, padding + x.shape[3]))
    return (y, y_bound), (dxpad[inner], dx_bound[inner]), (dw, dw_bound)


def check_rounded_result(name: str, result, exact, exact_bound, k: int, alpha: float, beta: float, before):
    """``result`` = alpha·bf16(sum) + beta·before, where the sum is ``exact`` within the FP32
    summation error; a sum that close to a rounding boundary may take either neighbour."""
    sum_bound = sum_error(k) * exact_bound
    rounded = round_to_bf16(exact.astype(np.float32)).astype(np.float64)
    blend_bound = 4 * UNIT * (np.abs(alpha * rounded) + np.abs(beta * before)) + 1e-30
    error = np.abs(result - (alpha * rounded + beta * before))
    near_boundary = np.abs(round_to_bf16((exact + sum_bound).astype(np.float32))
                           - round_to_bf16((exact - sum_bound).astype(np.float32))) > 0
    tolerance = np.where(near_boundary, abs(alpha) * (BF16_STEP * np.abs(exact) + sum_bound), 0) + blend_bound
    assert np.all(error <= tolerance), f"{name}: worst {np.max(error / tolerance):.3g} x tolerance"


@pytest.mark.parametrize("engine", ["slides", "fast"])
def test_bf16_convolution_rounds_operands_and_result(backend, rng, engine):
    desc = ConvolutionDescriptor(4, 3, 3, 1, 1, 1)  # C 3 -> K 4, 3×3, stride 1, padding 1
    x_shape = (5, 3, 9, 9)
    y_shape = desc.output_shape(x_shape)
    x, w, dy = normal(rng, *x_shape), normal(rng, *desc.filter_shape), normal(rng, *y_shape)
    dx0, dw0 = normal(rng, *x_shape), normal(rng, *desc.filter_shape)
    X, W, DY, DX, DW = (Tensor.from_numpy(array, backend) for array in (x, w, dy, dx0, dw0))
    Y = Tensor.zeros(y_shape, backend)
    with backend.using_engine(engine), math_mode(backend, "bf16"):
        plan = backend.convolution_plan(desc, x_shape, y_shape)
        backend.convolution_forward(plan, 1.0, X, W, 0.0, Y)  # y = x ⋆ w
        backend.convolution_backward_data(plan, 1.0, W, DY, 0.5, DX)  # dx = dy ⋆ᵀ w + dx/2
        backend.convolution_backward_filter(plan, 2.0, X, DY, 1.0, DW)  # dw = 2·Σ x ⋆ dy + dw
    (y, y_bound), (dx, dx_bound), (dw, dw_bound) = convolution_reference(
        round_to_bf16(x), round_to_bf16(w), round_to_bf16(dy), 1)
    y_out = Y.numpy().astype(np.float64)
    np.testing.assert_array_equal(y_out, round_to_bf16(Y.numpy()))  # cuDNN's result is a bfloat16
    check_rounded_result("y", y_out, y, y_bound, 27, 1.0, 0.0, 0.0)
    check_rounded_result("dx", DX.numpy().astype(np.float64), dx, dx_bound, 36, 1.0, 0.5, dx0.astype(np.float64))
    check_rounded_result("dw", DW.numpy().astype(np.float64), dw, dw_bound, 405, 2.0, 1.0, dw0.astype(np.float64))


# ---- a training step, GPU == host ----------------------------------------------------------------
def stored_dtypes(network) -> set:
    """The dtypes of the hidden layers' outputs and of every layer's input gradient."""
    return {layer.output.dtype for layer in network.layers[:-1]} | {layer.grad_input.dtype for layer in network.layers}


# the activations' dtype of each config in math bf16, fp16: an MLP's and a CNN's of Conv2D and Pooling are
# 16-bit (test_mlp16.py, test_cnn16.py)
ACTIVATIONS = {("mnist_mlp", "bf16"): BFLOAT16, ("mnist_mlp", "fp16"): FLOAT16, ("mnist_cnn", "bf16"): BFLOAT16,
               ("mnist_cnn", "fp16"): FLOAT16}
NOISE = 1e-6  # an update below this norm in FP32 is rounding noise: a bias right before a BatchNorm has no gradient
# Not mnist_bn_cnn: its 16-bit step is chaotic under rounding. On the host alone, moving 1 % of the inputs
# by one bfloat16 step changes fc2's input gradient by 0.46 %, bn5's by 6.4 % and conv1's weight gradient
# by 11 %: each BatchNorm's dx = k·(m·dy − Σdy − x̂·Σdy·x̂) cancels most of dy, so a value rounded to
# the other neighbour grows about 14× at each. Its layers are compared one at a time (test_cnn16.py).


def moving(in_fp32: dict) -> list[str]:
    """The parameters whose FP32 update is more than rounding noise (those the GPU == host tests compare)."""
    return [name for name, update in in_fp32.items() if np.linalg.norm(update) > NOISE]


def parameter_updates(config, backend, engine: str, start: dict, math: str) -> tuple[dict, tuple, set]:
    """What two SGD steps (test_engine.step_and_evaluation) change in each parameter, the metrics, and the
    dtypes the activations were stored in."""
    with math_mode(backend, math):
        network, totals = step_and_evaluation(config, backend, engine)
    return ({name: value - start[name] for name, value in network.state_dict().items()}, totals.read(),
            stored_dtypes(network))


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["slides", "fast"])
@pytest.mark.parametrize("name", ["mnist_mlp", "mnist_cnn"])  # not mnist_bn_cnn (above)
def test_a_bf16_step_on_the_gpu_equals_the_hosts(name, engine, cuda, host):
    """Each parameter's update over two steps agrees within 1e-2 (relative, in norm): the operands are
    rounded alike, and only values near a bfloat16 rounding boundary may round to the other neighbour
    (one step, 2⁻⁸), a difference the later layers carry on. The host's FP32 updates are 2 to 20 %
    from its bf16 ones (10 % in mnist_cnn), so the test tells the two apart."""
    config = config_of(name)
    start = build_network(config, host).state_dict()
    on_host, (host_loss, host_hits), host_stored = parameter_updates(config, host, engine, start, "bf16")
    on_cuda, (cuda_loss, cuda_hits), cuda_stored = parameter_updates(config, cuda, engine, start, "bf16")
    in_fp32, _, _ = parameter_updates(config, host, engine, start, "fp32")
    assert host_stored == cuda_stored == {ACTIVATIONS[name, "bf16"]}
    compared = moving(in_fp32)
    for parameter in compared:
        error = relative_error(on_cuda[parameter], on_host[parameter])
        assert error <= 1e-2, f"{parameter}: relative error {error:.3g}"
    assert max(relative_error(in_fp32[parameter], on_host[parameter]) for parameter in compared) > 2e-2
    assert cuda_loss == pytest.approx(host_loss, rel=1e-3)
    assert abs(cuda_hits - host_hits) <= 2


# ---- a pass: each operand converted once, the weights' copies made again after an update ------
def test_a_pass_reads_the_weights_written_before_it(backend, rng):
    """A weight packed in one buffer (as the optimiser packs them): a GEMM in a pass reads the values
    it held when the pass began, and the next pass those written in between."""
    m, n, k = 6, 5, 48
    packed = Tensor.zeros((2 * 64 + k * n,), backend)
    W, X = packed.view((m * k,), 0), Tensor.from_numpy(normal(rng, k * n), backend)
    C = Tensor.zeros((m * n,), backend)
    for _ in range(2):
        w = normal(rng, m * k)
        W.copy_(Tensor.from_numpy(w, backend))
        with math_mode(backend, "bf16"):
            backend.start_pass()
            backend.sgemm(OP_N, OP_N, m, n, k, 1.0, W, m, X, k, 0.0, C, m)  # C = W·X
            backend.end_pass()
        w16, x16 = (round_to_bf16(array).astype(np.float64) for array in (w, X.numpy().reshape(-1)))
        expected = w16.reshape(k, m).T @ x16.reshape(n, k).T
        bound = sum_error(k) * (np.abs(w16.reshape(k, m).T) @ np.abs(x16.reshape(n, k).T))
        assert np.all(np.abs(C.numpy().reshape(n, m).T - expected) <= bound)


# ---- math "fp16": IEEE half operands (kernels/fp16.cu; the host's round_to_fp16) -----------------
FP16_STEP = 2.0 ** -10  # half's largest spacing relative to a value (10 stored mantissa bits: 2^-10 at 1.0)


def test_round_to_fp16_is_round_to_nearest_even_with_subnormals(rng):
    values = (rng.standard_normal(100_000) * 10.0 ** rng.integers(-9, 5, 100_000)).astype(np.float32)
    rounded = round_to_fp16(values)
    halves = rounded.astype(np.float16)  # exact: every rounded value is a half
    np.testing.assert_array_equal(halves.astype(np.float32), rounded)
    below, above = np.nextafter(halves, np.float16(-np.inf)), np.nextafter(halves, np.float16(np.inf))
    exact = values.astype(np.float64)
    distance = np.abs(exact - rounded)
    assert np.all(distance <= np.abs(exact - below.astype(np.float64)))
    assert np.all(distance <= np.abs(exact - above.astype(np.float64)))
    ties = np.array([1 + 2 ** -11, 1 + 3 * 2 ** -11, 2 ** -25, 3 * 2 ** -25], np.float32)
    np.testing.assert_array_equal(round_to_fp16(ties), np.array([1.0, 1 + 2 ** -9, 0.0, 2 ** -23], np.float32))


def test_round_to_fp16_overflows_to_infinity_past_65504():
    special = np.array([65504, 65519.99, 65520, -65520, 1e6, np.inf, np.nan, -0.0], np.float32)
    rounded = round_to_fp16(special)
    np.testing.assert_array_equal(rounded[:6], [65504, 65504, np.inf, -np.inf, np.inf, np.inf])
    assert np.isnan(rounded[6]) and rounded[7] == 0 and np.signbit(rounded[7])


def test_an_fp16_operand_past_65504_makes_the_product_infinite(backend):
    """7·10⁴ (finite in FP32 and bfloat16) becomes +inf as a half operand; 6·10⁴ stays finite."""
    A = Tensor.from_numpy(np.array([7e4, 6e4, 1.0, 1.0], np.float32), backend)  # 2×2, column-major
    B = Tensor.from_numpy(np.ones(4, np.float32), backend)
    C = Tensor.zeros((4,), backend)
    with math_mode(backend, "fp16"):
        backend.sgemm(OP_N, OP_N, 2, 2, 2, 1.0, A, 2, B, 2, 0.0, C, 2)
    np.testing.assert_array_equal(C.numpy().reshape(-1), [np.inf, 60000.0 + 1.0, np.inf, 60000.0 + 1.0])


@pytest.mark.parametrize("engine", ["slides", "fast"])
def test_fp16_convolution_rounds_operands_and_result(backend, rng, engine):
    """cuDNN's PSEUDO_HALF_CONFIG: half x, w, dy, FP32 sums, a half result."""
    desc = ConvolutionDescriptor(4, 3, 3, 1, 1, 1)
    x_shape = (5, 3, 9, 9)
    y_shape = desc.output_shape(x_shape)
    x, w, dy = normal(rng, *x_shape), normal(rng, *desc.filter_shape), normal(rng, *y_shape)
    dx0, dw0 = normal(rng, *x_shape), normal(rng, *desc.filter_shape)
    X, W, DY, DX, DW = (Tensor.from_numpy(array, backend) for array in (x, w, dy, dx0, dw0))
    Y = Tensor.zeros(y_shape, backend)
    with backend.using_engine(engine), math_mode(backend, "fp16"):
        plan = backend.convolution_plan(desc, x_shape, y_shape)
        backend.convolution_forward(plan, 1.0, X, W, 0.0, Y)
        backend.convolution_backward_data(plan, 1.0, W, DY, 0.5, DX)
        backend.convolution_backward_filter(plan, 2.0, X, DY, 1.0, DW)
    (y, y_bound), (dx, dx_bound), (dw, dw_bound) = convolution_reference(
        round_to_fp16(x), round_to_fp16(w), round_to_fp16(dy), 1)
    y_out = Y.numpy().astype(np.float64)
    np.testing.assert_array_equal(y_out, round_to_fp16(Y.numpy()))  # cuDNN's result is a half
    check_half_result("y", y_out, y, y_bound, 27, 1.0, 0.0, 0.0)
    check_half_result("dx", DX.numpy().astype(np.float64), dx, dx_bound, 36, 1.0, 0.5, dx0.astype(np.float64))
    check_half_result("dw", DW.numpy().astype(np.float64), dw, dw_bound, 405, 2.0, 1.0, dw0.astype(np.float64))


def check_half_result(name: str, result, exact, exact_bound, k: int, alpha: float, beta: float, before):
    """``check_rounded_result`` for a half result (one half step near a rounding boundary)."""
    sum_bound = sum_error(k) * exact_bound
    rounded = round_to_fp16(exact.astype(np.float32)).astype(np.float64)
    blend_bound = 4 * UNIT * (np.abs(alpha * rounded) + np.abs(beta * before)) + 1e-30
    error = np.abs(result - (alpha * rounded + beta * before))
    near_boundary = np.abs(round_to_fp16((exact + sum_bound).astype(np.float32))
                           - round_to_fp16((exact - sum_bound).astype(np.float32))) > 0
    tolerance = np.where(near_boundary, abs(alpha) * (FP16_STEP * np.abs(exact) + sum_bound), 0) + blend_bound
    assert np.all(error <= tolerance), f"{name}: worst {np.max(error / tolerance):.3g} x tolerance"


# ---- the fast engine's GEMM convolution and flipped-filter backward data in 16 bits --------------
HALF_CHECKS = {"bf16": (round_to_bf16, check_rounded_result), "fp16": (round_to_fp16, check_half_result)}


def forced_plan(backend, plan, algorithms: dict):
    """``plan`` with ``algorithms`` (direction name -> Algorithm) in their directions on the GPU, made by
    convolution.plan_with at the backend's math (workspaces included); the host's plan as it is."""
    if backend.name != "cuda":
        return plan
    from cudnnnet.backends.cuda import backend as cuda_backend, convolution

    chosen = {name: getattr(plan, name) for name in convolution.DIRECTION_NAMES} | algorithms
    forced = convolution.plan_with(backend.context.cudnn.handle, backend.context.descriptors, plan.desc, plan.x_shape, plan.y_shape,
                                   backend.precision, cuda_backend.MATH_MODES[backend.precision][1],
                                   backend.workspace_limit,
                                   chosen)
    assert forced is not None, f"{algorithms} cannot run {plan}"
    backend.context.workspace(forced.workspace_bytes)
    backend.context.ones(plan.x_shape[0])
    return forced


def gemm_engine_algorithms(samples_per_gemm: int) -> dict:
    from cudnnnet.backends.cuda.convolution import Algorithm, GEMM_ALGORITHM

    return {name: Algorithm(GEMM_ALGORITHM, 0, samples_per_gemm=samples_per_gemm if name == "backward_filter" else 1)
            for name in ("forward", "backward_data", "backward_filter")}


@pytest.mark.parametrize("samples_per_gemm", [1, 2, 8])
@pytest.mark.parametrize("math", list(HALF_CHECKS))
def test_the_16_bit_gemm_convolution_rounds_operands_and_result(backend, rng, math, samples_per_gemm):
    """The fast engine's explicit-GEMM convolution forced in every direction under math bf16 and fp16:
    16-bit col, W and dy, FP32 sums, each result rounded once to the format before alpha and beta, as
    cuDNN's 16-bit output is (the host computes it so for every engine). The weight gradient sums 1
    (five GEMMs, then a GEMV), 2 (three groups, the last padded with a zero sample) or 8 samples (one
    GEMM) inside each GEMM; the forward runs with beta 0 (the product rounded in y) and beta 2."""
    rounding, check = HALF_CHECKS[math]
    desc = ConvolutionDescriptor(4, 3, 3, 1, 1, 1)  # C 3 -> K 4, 3×3, stride 1, padding 1
    x_shape = (5, 3, 9, 9)
    y_shape = desc.output_shape(x_shape)
    x, w, dy = normal(rng, *x_shape), normal(rng, *desc.filter_shape), normal(rng, *y_shape)
    y0, dx0, dw0 = normal(rng, *y_shape), normal(rng, *x_shape), normal(rng, *desc.filter_shape)
    X, W, DY, Y0, DX, DW = (Tensor.from_numpy(array, backend) for array in (x, w, dy, y0, dx0, dw0))
    Y = Tensor.zeros(y_shape, backend)
    with backend.using_engine("fast"), math_mode(backend, math):
        plan = backend.convolution_plan(desc, x_shape, y_shape)
        if backend.name == "cuda":
            plan = forced_plan(backend, plan, gemm_engine_algorithms(samples_per_gemm))
        backend.convolution_forward(plan, 1.0, X, W, 0.0, Y)  # y = x ⋆ w
        backend.convolution_forward(plan, 0.5, X, W, 2.0, Y0)  # y0 = (x ⋆ w)/2 + 2·y0
        backend.convolution_backward_data(plan, 1.0, W, DY, 0.5, DX)  # dx = dy ⋆ᵀ w + dx/2
        backend.convolution_backward_filter(plan, 2.0, X, DY, 1.0, DW)  # dw = 2·Σ x ⋆ dy + dw
    if backend.name == "cuda":
        from cudnnnet.backends.cuda.convolution import GEMM_ALGORITHM

        assert {plan.forward.algo, plan.backward_data.algo, plan.backward_filter.algo} == {GEMM_ALGORITHM}
        assert plan.backward_filter.samples_per_gemm == samples_per_gemm
    (y, y_bound), (dx, dx_bound), (dw, dw_bound) = convolution_reference(rounding(x), rounding(w), rounding(dy), 1)
    y_out = Y.numpy().astype(np.float64)
    np.testing.assert_array_equal(y_out, rounding(Y.numpy()))  # rounded to the format, as cuDNN's result
    check("y", y_out, y, y_bound, 27, 1.0, 0.0, 0.0)
    check("y0", Y0.numpy().astype(np.float64), y, y_bound, 27, 0.5, 2.0, y0.astype(np.float64))
    check("dx", DX.numpy().astype(np.float64), dx, dx_bound, 36, 1.0, 0.5, dx0.astype(np.float64))
    check("dw", DW.numpy().astype(np.float64), dw, dw_bound, 405, 2.0, 1.0, dw0.astype(np.float64))


@pytest.mark.parametrize("choice", [0, 1, 2])
@pytest.mark.parametrize("padding", [0, 1])
@pytest.mark.parametrize("math", list(HALF_CHECKS))
def test_16_bit_backward_data_as_a_flipped_forward_rounds_operands_and_result(backend, rng, math, padding, choice):
    """Stride-1 backward data as cudnnConvolutionForward of dy₁₆ with the 16-bit flipped filter, by the
    ``choice``-th exact forward algorithm cuDNN offers for it: the same rounded operands and 16-bit
    result as its backward-data algorithm."""
    rounding, check = HALF_CHECKS[math]
    desc = ConvolutionDescriptor(4, 3, 3, 1, padding, 1)
    x_shape = (6, 3, 9, 9)
    y_shape = desc.output_shape(x_shape)
    w, dy, dx0 = normal(rng, *desc.filter_shape), normal(rng, *y_shape), normal(rng, *x_shape)
    W, DY, DX = (Tensor.from_numpy(array, backend) for array in (w, dy, dx0))
    with backend.using_engine("fast"), math_mode(backend, math):
        plan = backend.convolution_plan(desc, x_shape, y_shape)
        if backend.name == "cuda":
            from cudnnnet.backends.cuda import backend as cuda_backend, bindings, convolution

            math_type = cuda_backend.MATH_MODES[backend.precision][1]
            flipped = convolution.flipped_filter(backend.context.descriptors, desc, backend.precision, math_type)
            found = convolution.by_forward_candidates(backend.context.cudnn.handle, plan.x, plan.y, flipped, backend.workspace_limit,
                                                      math_type)
            plan = forced_plan(backend, plan, {"backward_data": found[choice % len(found)]})
            assert plan.backward_data.by_forward
            bindings.reset_calls()
        backend.convolution_backward_data(plan, 1.0, W, DY, 0.5, DX)  # dx = dy ⋆ᵀ w + dx/2
        if backend.name == "cuda":
            assert bindings.calls["cudnnConvolutionForward"] == 1 and bindings.calls["cudnnConvolutionBackwardData"] == 0
    _, (dx, dx_bound), _ = convolution_reference(np.zeros(x_shape, np.float32), rounding(w), rounding(dy), padding)
    check("dx", DX.numpy().astype(np.float64), dx, dx_bound, 36, 1.0, 0.5, dx0.astype(np.float64))


@pytest.mark.gpu
@pytest.mark.parametrize("math", list(HALF_ROUNDINGS))
def test_an_untimed_batched_16_bit_gemm_runs_cublas_gemm_strided_batched_ex(cuda, rng, math):
    """A batched 16-bit GEMM problem without a timed plan (the heuristic search; a problem first met in a
    capture) runs cublasGemmStridedBatchedEx: Cᵢ = Aᵢ·B for three Aᵢ and a shared B (stride 0)."""
    from cudnnnet.backends.cuda import bindings
    from cudnnnet.backends.cuda.low_precision import half_format
    from cudnnnet.backends.cuda.matmul import GemmProblem, alignment

    rounding, _ = HALF_ROUNDINGS[math]
    m, n, k, batch = 9, 7, 40, 3
    a, b = normal(rng, batch * m * k), normal(rng, k * n)
    A, B, C = Tensor.from_numpy(a, cuda), Tensor.from_numpy(b, cuda), Tensor.zeros((batch * m * n,), cuda)
    precision = get_precision(math)
    a16, b16 = cuda.context.half.scratch.operands((A.data.ptr, A.size), (B.data.ptr, B.size), fmt=half_format(precision))
    problem = GemmProblem(OP_N, OP_N, m, n, k, m, k, m, batch, m * k, 0, m * n, precision, alignment(a16, b16, C.data.ptr))
    bindings.reset_calls()
    cuda._gemm.run(problem, "heuristic", 1.0, a16, b16, 0.0, C.data.ptr)
    assert bindings.calls["cublasGemmStridedBatchedEx"] == 1
    b_matrix = column_major(rounding(b), k, n, k)
    for i in range(batch):
        a_matrix = column_major(rounding(a[i * m * k:(i + 1) * m * k]), m, k, m)
        result = column_major(C.numpy().reshape(-1)[i * m * n:(i + 1) * m * n], m, n, m)
        bound = sum_error(k) * (np.abs(a_matrix) @ np.abs(b_matrix)) + 1e-30
        assert np.all(np.abs(result - a_matrix @ b_matrix) <= bound)


def scaled_updates(config, backend, engine: str, start: dict, math: str) -> tuple[dict, tuple, set]:
    """What two loss-scaled SGD steps (S = 2^12) change in each parameter, the metrics, and the dtypes
    the activations were stored in."""
    from cudnnnet.optim.loss_scaling import LossScaler
    from cudnnnet.optim.optimizers import SGD
    from cudnnnet.train.trainer import Accumulator

    rng = np.random.default_rng(0)
    batch = config.train.batch_size
    with backend.using_engine(engine), math_mode(backend, math):
        network = build_network(config, backend)
        opt = config.train.optimizer
        optimizer = SGD(network, opt.lr, opt.momentum, opt.weight_decay)
        scaler = LossScaler(backend, optimizer.flat_gradients(), 2.0 ** 12)
        optimizer.loss_scale = scaler.state
        totals = Accumulator(backend)
        for _ in range(2):
            x = Tensor.from_numpy(rng.standard_normal((batch,) + network.input_shape).astype(np.float32), backend)
            target = Tensor.from_numpy(np.eye(10, dtype=np.float32)[rng.integers(0, 10, batch)].reshape(batch, 10, 1, 1),
                                       backend)
            network.forward_backward(x, target, totals.loss_sum, totals.correct, loss_scale=scaler.scale)
            scaler.check()
            optimizer.step()
        assert scaler.read().skipped_steps == 0
    return ({name: value - start[name] for name, value in network.state_dict().items()}, totals.read(),
            stored_dtypes(network))


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["slides", "fast"])
@pytest.mark.parametrize("name", ["mnist_mlp", "mnist_cnn"])
def test_a_bf16_step_converts_each_operand_once(name, engine, cuda, monkeypatch):
    """In a training step and an evaluation batch, no float32 buffer is converted to bfloat16 twice
    in one pass: x, W and dy are each converted once and read by every product that takes them."""
    from cudnnnet.backends.cuda import low_precision

    converted = []
    convert = low_precision.convert_to_bf16

    def recording(context, target, source, count, fmt=low_precision.BF16):
        converted.append((source, count))
        convert(context, target, source, count, fmt)

    monkeypatch.setattr(low_precision, "convert_to_bf16", recording)
    pass_starts = []  # len(converted) as each pass began
    start_pass = type(cuda).start_pass

    def recording_start(self):
        pass_starts.append(len(converted))
        start_pass(self)

    monkeypatch.setattr(type(cuda), "start_pass", recording_start)
    config = config_of(name)
    with math_mode(cuda, "bf16"):
        step_and_evaluation(config, cuda, engine)
    bounds = pass_starts[-2:] + [len(converted)]  # the second step's pass and the evaluation's
    for begin, end in zip(bounds, bounds[1:]):
        sources = [source for source, _ in converted[begin:end]]
        assert sources and len(sources) == len(set(sources)), f"converted twice in a pass: {sources}"


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["slides", "fast"])
@pytest.mark.parametrize("name", ["mnist_mlp", "mnist_cnn"])  # not mnist_bn_cnn (above)
def test_an_fp16_step_with_loss_scaling_on_the_gpu_equals_the_hosts(name, engine, cuda, host):
    """Two loss-scaled steps: each parameter's update agrees within ``tolerance`` (relative, in norm);
    only values near a half rounding boundary may take the other neighbour (2⁻¹¹), a difference the
    later layers carry on (more of them in the CNN). The host's FP32 updates are 0.9 % (MLP) and more
    (CNN) from its fp16 ones, its bf16 ones further, so the test tells the three apart."""
    tolerance = {"mnist_mlp": 5e-3, "mnist_cnn": 1e-2}[name]
    config = config_of(name)
    start = build_network(config, host).state_dict()
    on_host, (host_loss, host_hits), host_stored = scaled_updates(config, host, engine, start, "fp16")
    on_cuda, (cuda_loss, cuda_hits), cuda_stored = scaled_updates(config, cuda, engine, start, "fp16")
    assert host_stored == cuda_stored == {ACTIVATIONS[name, "fp16"]}
    compared = moving(scaled_updates(config, host, engine, start, "fp32")[0])
    for parameter in compared:
        error = relative_error(on_cuda[parameter], on_host[parameter])
        assert error <= tolerance, f"{parameter}: relative error {error:.3g}"
    for other in ("fp32", "bf16"):
        elsewhere, _, _ = scaled_updates(config, host, engine, start, other)
        assert max(relative_error(elsewhere[parameter], on_host[parameter]) for parameter in compared) > tolerance
    assert cuda_loss == pytest.approx(host_loss, rel=1e-3)
    assert abs(cuda_hits - host_hits) <= 2


# ---- the plan's precision, not the backend's: the middle tier on host-side fakes -------------------
class FakeContext:
    """The CUDA context's face the middle tier reads, recording the 16-bit formats asked of it."""

    def __init__(self):
        self.formats, self.kernels = [], []
        self.half = SimpleNamespace(operands=self._operands, to_float=self._to_float)
        self.stream, self.cudnn = SimpleNamespace(handle=0), SimpleNamespace(handle=0)

    def _operands(self, *operands, output: int = 0, fmt):
        self.formats.append(fmt)
        return [0x1000 * (index + 1) for index in range(len(operands) + bool(output))]

    def _to_float(self, out, source, alpha, beta, count, fmt):
        self.formats.append(fmt)

    def kernel(self, name: str):
        return SimpleNamespace(launch=lambda *arguments: self.kernels.append(name))

    def scalar(self, value):
        return value

    def workspace(self, nbytes: int) -> int:
        return 0x100000

    def ones(self, count: int) -> int:
        return 0x200000


def fake_backend_in(precision):
    """A backend whose precision in force is ``precision``, its GEMM problems kept in ``problems``."""
    problems = []
    return SimpleNamespace(context=FakeContext(), precision=precision, problems=problems,
                           gemm=lambda problem, *arguments: problems.append(problem))


def fake_tensor(shape, address: int, dtype=FLOAT32):
    size = int(np.prod(shape))
    return SimpleNamespace(shape=shape, size=size, dtype=dtype, data=SimpleNamespace(ptr=address, size=size))


CONVOLUTION = ConvolutionDescriptor(4, 2, 3, padding=1)
X_SHAPE = (1, 2, 5, 5)  # one sample: the weight gradient is one GEMM, no cuBLAS sum over groups


@pytest.mark.parametrize("plan_precision, in_force", [(BF16, FP16), (BF16, FP32), (FP16, BF16)])
@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_filter"])
def test_the_gemm_convolution_converts_and_multiplies_in_its_plan_s_precision(direction, plan_precision, in_force):
    from cudnnnet.backends.cuda import convolution
    from cudnnnet.backends.cuda.gemm_convolution import GemmShape
    from cudnnnet.backends.cuda.low_precision import half_format

    backend = fake_backend_in(in_force)
    shape = GemmShape.of(CONVOLUTION, X_SHAPE, CONVOLUTION.output_shape(X_SHAPE))
    a, b, out = (fake_tensor(X_SHAPE, 0xA000), fake_tensor(CONVOLUTION.filter_shape, 0xB000),
                 fake_tensor(CONVOLUTION.output_shape(X_SHAPE), 0xC000))
    run = {"forward": convolution.FORWARD, "backward_data": convolution.BACKWARD_DATA,
           "backward_filter": convolution.BACKWARD_FILTER}[direction].gemm
    run(backend, shape, 1.0, a, b, 0.0, out, 0x100000, convolution.Algorithm(convolution.GEMM_ALGORITHM, 0),
        plan_precision)
    assert set(backend.context.formats) <= {half_format(plan_precision)}
    assert backend.problems and {problem.precision for problem in backend.problems} == {plan_precision}


@pytest.mark.parametrize("in_force", [BF16, TF32])
def test_an_fp32_gemm_convolution_plan_multiplies_in_fp32_whatever_is_in_force(in_force):
    from cudnnnet.backends.cuda import gemm_convolution

    backend = fake_backend_in(in_force)
    shape = gemm_convolution.GemmShape.of(CONVOLUTION, X_SHAPE, CONVOLUTION.output_shape(X_SHAPE))
    x, w, y = (fake_tensor(X_SHAPE, 0xA000), fake_tensor(CONVOLUTION.filter_shape, 0xB000),
               fake_tensor(CONVOLUTION.output_shape(X_SHAPE), 0xC000))
    gemm_convolution.forward(backend, shape, 1.0, x, w, 0.0, y, 0x100000, FP32)
    assert [problem.precision for problem in backend.problems] == [FP32] and backend.context.formats == []


def test_a_16_bit_cudnn_plan_converts_its_operands_to_its_own_format():
    """ConvolutionPlanner.run under a 16-bit plan: the operands, the result slot and the result's conversion
    back all in the plan's format, while another precision is in force."""
    from cudnnnet.backends.cuda import convolution
    from cudnnnet.backends.cuda.convolution_planner import ConvolutionPlanner
    from cudnnnet.backends.cuda.low_precision import half_format

    backend, runs = fake_backend_in(FP16), []
    direction = dataclasses.replace(convolution.FORWARD, run=lambda *arguments: runs.append(arguments))
    descriptor = SimpleNamespace(handle=1)
    plan = SimpleNamespace(forward=convolution.Algorithm(1, 0), precision=BF16, x=descriptor, w=descriptor,
                           conv=descriptor, y=descriptor)
    x, w, y = (fake_tensor(X_SHAPE, 0xA000), fake_tensor(CONVOLUTION.filter_shape, 0xB000),
               fake_tensor(CONVOLUTION.output_shape(X_SHAPE), 0xC000))
    ConvolutionPlanner(backend, 0).run(direction, plan, 1.0, x, w, 0.0, y)
    assert len(runs) == 1 and backend.context.formats == [half_format(BF16)] * 2


def test_inside_a_pass_an_operand_of_another_format_is_converted_into_scratch(monkeypatch):
    """The pass's copies are in the pass's format: an operand asked for in another is converted now."""
    from cudnnnet.backends.cuda import low_precision

    half, asked = low_precision.HalfOperands(context=None), []
    half.copies.start(low_precision.BF16)
    monkeypatch.setattr(half.copies, "pointer", lambda source: 0xC0)  # the pass's bfloat16 copy
    monkeypatch.setattr(half.scratch, "operands", lambda *pairs, output=0, fmt: asked.append(fmt) or [0x5C] * len(pairs))
    tensor = fake_tensor((4,), 0xA0)
    assert half.operands((tensor, 4), fmt=low_precision.BF16) == [0xC0]
    assert half.operands((tensor, 4), fmt=low_precision.FP16) == [0x5C] and asked[-1] == low_precision.FP16


def test_a_16_bit_operand_of_the_formats_type_is_read_as_it_is(monkeypatch):
    """A 16-bit MLP's activation is a GEMM operand itself: no copy, no scratch; one of the other 16-bit
    type is converted as a float32 one would be."""
    from cudnnnet.backends.cuda import low_precision

    half, asked = low_precision.HalfOperands(context=None), []
    half.copies.start(low_precision.BF16)
    monkeypatch.setattr(half.copies, "pointer", lambda source: asked.append("copy") or 0xC0)
    monkeypatch.setattr(half.scratch, "operands", lambda *pairs, output=0, fmt: asked.extend(pairs) or [0x5C] * len(pairs))
    activation = fake_tensor((4,), 0xA0, BFLOAT16)
    assert half.operands((activation, 4), fmt=low_precision.BF16) == [0xA0] and asked == []
    assert half.operands((fake_tensor((4,), 0xB0, FLOAT16), 4), fmt=low_precision.BF16) == [0xC0]
