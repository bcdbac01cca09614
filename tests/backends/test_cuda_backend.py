"""The CUDA backend against the host backend (the oracle), call by call, on the same inputs.

Every test is marked ``gpu`` and skips itself where cuda-python, a CUDA library or a GPU is
missing. Each comparison runs one test body on both backends and checks the relative error
‖cuda − host‖ / ‖host‖ of every output (1e-5 in FP32, 1e-3 in TF32). The CUDA backend runs the fast
engine here (timed GEMM plans, our kernels beside cuDNN); a test that checks a library path asks
for it with ``using_engine``.
"""

from __future__ import annotations

import dataclasses
import gc

import numpy as np
import pytest

from cudnnnet.backends import cuda_available, get_backend
from cudnnnet.engine import FAST
from cudnnnet.backends.base import OP_N, OP_T
from cudnnnet.backends.descriptors import (ActivationDescriptor, ActivationMode, ConvolutionDescriptor,
                                           PoolingDescriptor, PoolingMode)
from cudnnnet.errors import CublasError, CudnnError, DeviceError, NvrtcError, OutOfMemoryError, ShapeError, UsageError
from cudnnnet.tensor import Tensor

pytestmark = pytest.mark.gpu

FP32_TOLERANCE = 1e-5
TF32_TOLERANCE = 1e-3
BATCHES = (1, 7, 255, 256, 1000)
LOSS_BATCHES = (1, 7, 255, 256, 1000, 4097)


@pytest.fixture(scope="module")
def cuda():
    if not cuda_available():
        pytest.skip("no usable GPU, cuda-python or CUDA library (get_backend('cuda') says why)")
    backend = get_backend("cuda")
    with backend.using_engine("fast"):
        yield backend
    backend.set_math("fp32")


@pytest.fixture(scope="module")
def host():
    return get_backend("host")


@pytest.fixture
def rng():
    return np.random.default_rng(20240611)


@pytest.fixture
def bindings():
    from cudnnnet.backends.cuda import bindings

    bindings.reset_calls()
    return bindings


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    actual, expected = actual.astype(np.float64), expected.astype(np.float64)
    norm = np.linalg.norm(expected)
    difference = np.linalg.norm(actual - expected)
    return difference / norm if norm else difference


def compare(host, cuda, body, *arrays, tolerance=FP32_TOLERANCE):
    """Run ``body(backend, *tensors)`` on both backends with the same input arrays; every tensor it
    returns must agree within ``tolerance``."""
    expected = body(host, *(Tensor.from_numpy(a, host) for a in arrays))
    actual = body(cuda, *(Tensor.from_numpy(a, cuda) for a in arrays))
    assert len(actual) == len(expected)
    errors = []
    for got, want in zip(actual, expected):
        assert got.backend is cuda and want.backend is host
        assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
        errors.append(relative_error(got.numpy(), want.numpy()))
    assert max(errors) <= tolerance, f"relative errors of the outputs {[f'{e:.3g}' for e in errors]} > {tolerance:g}"


def normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# ---- device and memory -------------------------------------------------------------------------
def test_device_identity(cuda):
    assert cuda.name == "cuda"
    assert isinstance(cuda.device_name, str) and cuda.device_name
    assert cuda.dlpack_device() == (2, cuda.context.device)
    free, total = cuda.memory_info()
    assert 0 < free <= total


@pytest.mark.parametrize("size", [1, 7, 1000, 4097])
def test_upload_download_round_trip(cuda, rng, size):
    values = normal(rng, size)
    tensor = Tensor.from_numpy(values, cuda)
    np.testing.assert_array_equal(tensor.numpy().reshape(-1), values)


def test_copy_fill_view(host, cuda, rng):
    def body(b, x):
        y = Tensor.zeros(x.shape, b)
        y.copy_(x)
        y.view((5,), offset=3).fill_(2.5)
        y.view((4,), offset=20).fill_(-0.0)
        z = Tensor.zeros((7,), b)
        b.copy(y.view((7,), offset=10).data, z.data, 7)
        return [y, z]

    compare(host, cuda, body, normal(rng, 4, 8))


def test_view_keeps_parent_alive(cuda, rng):
    values = normal(rng, 64)
    parent = Tensor.from_numpy(values, cuda)
    child = parent.view((16,), offset=8)
    del parent
    gc.collect()
    np.testing.assert_array_equal(child.numpy().reshape(-1), values[8:24])


def test_view_out_of_range(cuda):
    with pytest.raises(ShapeError):
        cuda.view(cuda.empty(10), 8, 4)


def test_out_of_memory_suggests_smaller_batch(cuda):
    with pytest.raises(OutOfMemoryError, match="smaller batch size"):
        cuda.empty(1 << 42)  # 16 TiB
    Tensor.zeros((4,), cuda).numpy()  # the device still works


# ---- cuBLAS ------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", BATCHES)
@pytest.mark.parametrize("transb", [OP_N, OP_T])
@pytest.mark.parametrize("transa", [OP_N, OP_T])
def test_sgemm(host, cuda, rng, transa, transb, n):
    m, k = 13, 29
    a_rows, a_cols = (m, k) if transa == OP_N else (k, m)
    b_rows, b_cols = (k, n) if transb == OP_N else (n, k)
    lda, ldb, ldc = a_rows + 3, b_rows + 1, m + 2  # padded leading dimensions

    def body(b, A, B, C):
        b.sgemm(transa, transb, m, n, k, 0.75, A, lda, B, ldb, -0.5, C, ldc)
        return [C]

    compare(host, cuda, body, normal(rng, lda * a_cols), normal(rng, ldb * b_cols), normal(rng, ldc * n))


@pytest.mark.parametrize("n", BATCHES)
@pytest.mark.parametrize("trans", [OP_N, OP_T])
def test_sgemv(host, cuda, rng, trans, n):
    m, lda, incx, incy = 17, 19, 2, 1
    x_len, y_len = (n, m) if trans == OP_N else (m, n)

    def body(b, A, x, y):
        b.sgemv(trans, m, n, 1.5, A, lda, x, incx, 0.25, y, incy)
        return [y]

    compare(host, cuda, body, normal(rng, lda * n), normal(rng, incx * x_len), normal(rng, incy * y_len))


@pytest.mark.parametrize("n", BATCHES)
@pytest.mark.parametrize("incx, incy", [(1, 1), (2, 3), (-2, 1)])
@pytest.mark.parametrize("alpha_on_device", [False, True])
def test_saxpy_sscal_scopy(host, cuda, rng, n, incx, incy, alpha_on_device):
    def body(b, x, y, z, alpha):
        scalar = alpha if alpha_on_device else float(alpha.numpy()[0, 0, 0, 0])
        b.saxpy(n, scalar, x, incx, y, incy)  # y = alpha·x + y
        b.sscal(n, scalar, x, incx)  # x = alpha·x
        b.scopy(n, y, incy, z, incx)  # z = y
        b.saxpy(n, -0.5, x, incx, z, incx)  # host pointer mode again after a device scalar
        return [x, y, z]

    size = n * 3
    compare(host, cuda, body, normal(rng, size), normal(rng, size), normal(rng, size), np.array([0.3], np.float32))


# the MLP's GEMMs at batch 256 (Dense 784 → 500 → 10): (transa, transb, m, n, k)
MLP_GEMMS = [(OP_T, OP_N, 500, 256, 784), (OP_N, OP_T, 784, 500, 256), (OP_T, OP_N, 10, 256, 500),
             (OP_N, OP_T, 500, 10, 256), (OP_N, OP_N, 500, 256, 10)]


def gemm_arrays(rng, transa, transb, m, n, k):
    a_rows, a_cols = (m, k) if transa == OP_N else (k, m)
    b_rows, b_cols = (k, n) if transb == OP_N else (n, k)
    return normal(rng, a_rows * a_cols), normal(rng, b_rows * b_cols), normal(rng, m * n), a_rows, b_rows


@pytest.mark.parametrize("gemm", MLP_GEMMS, ids=lambda g: "{}{}-{}x{}x{}".format("NT"[g[0]], "NT"[g[1]], *g[2:]))
def test_sgemm_plan_times_cublas_and_cublaslt_once(host, cuda, rng, bindings, gemm):
    """The first call of a problem asks cuBLASLt for candidates and times them; later calls run the plan."""
    transa, transb, m, n, k = gemm
    a, b, c, lda, ldb = gemm_arrays(rng, *gemm)

    def body(backend, A, B, C):
        for _ in range(2):
            backend.sgemm(transa, transb, m, n, k, 1.0, A, lda, B, ldb, 0.0, C, m)
        return [C]

    compare(host, cuda, body, a, b, c)
    assert bindings.calls["cublasLtMatmulAlgoGetHeuristic"] <= 1  # 0: planned by an earlier test
    plans = [plan for (problem, search), plan in cuda._gemm.plans.items()
             if (problem.transa, problem.transb, problem.m, problem.n, problem.k) == gemm and search == "exhaustive"]
    assert plans and all(plan.microseconds is not None and plan.microseconds > 0 for plan in plans)
    bindings.reset_calls()
    body(cuda, *(Tensor.from_numpy(array, cuda) for array in (a, b, c)))
    cuda.synchronize()
    assert bindings.calls["cublasLtMatmulAlgoGetHeuristic"] == 0
    assert bindings.calls["cublasLtMatmul"] + bindings.calls["cublasSgemm_v2"] == 2


@pytest.mark.parametrize("beta", [0.0, -0.5])
@pytest.mark.parametrize("gemm", MLP_GEMMS + [(OP_T, OP_T, 37, 5, 129)],
                         ids=lambda g: "{}{}-{}x{}x{}".format("NT"[g[0]], "NT"[g[1]], *g[2:]))
def test_every_cublaslt_candidate_matches_the_host(host, cuda, rng, gemm, beta):
    """Whatever algorithm a plan takes computes the same FP32 GEMM: each candidate against the host."""
    from cudnnnet.backends.cuda.matmul import GemmPlan, GemmProblem, LtMatmul, alignment

    transa, transb, m, n, k = gemm
    a, b, c, lda, ldb = gemm_arrays(rng, *gemm)
    expected = Tensor.from_numpy(c, host)
    host.sgemm(transa, transb, m, n, k, 0.75, Tensor.from_numpy(a, host), lda, Tensor.from_numpy(b, host), ldb, beta,
               expected, m)
    A, B = Tensor.from_numpy(a, cuda), Tensor.from_numpy(b, cuda)
    problem = GemmProblem(transa, transb, m, n, k, lda, ldb, m, alignment=alignment(A.data.ptr, B.data.ptr, 256))
    lt = LtMatmul(problem)
    try:
        candidates = lt.algorithms(cuda.context.cublas_lt.handle, cuda.context.cublas_workspace[1], problem)
        assert candidates, "cuBLASLt offered no algorithm"
        for index, candidate in enumerate(candidates):
            C = Tensor.from_numpy(c, cuda)
            plan = GemmPlan(problem, lt, candidate.algo)
            cuda._gemm._execute(plan, cuda.context.scalar(0.75), A.data.ptr, B.data.ptr, cuda.context.scalar(beta), C.data.ptr)
            error = relative_error(C.numpy(), expected.numpy())
            assert error <= FP32_TOLERANCE, f"cuBLASLt candidate {index} of {len(candidates)}: relative error {error:.2e}"
    finally:
        lt.close()


@pytest.mark.parametrize("transa, transb", [(OP_N, OP_T), (OP_N, OP_N), (OP_T, OP_T)], ids=["NT", "NN", "TT"])
def test_transposing_gemm_plan_matches_the_host_eagerly_and_in_a_graph(host, cuda, rng, transa, transb):
    """The candidate that copies the operands to the TN layout (cublasSgeam) before cublasSgemm,
    installed as a problem's plan, computes the same GEMM, also when replayed from a CUDA graph."""
    from cudnnnet.backends.cuda.matmul import GemmPlan, GemmProblem, alignment

    m, n, k = 70, 33, 129
    a, b, c, lda, ldb = gemm_arrays(rng, transa, transb, m, n, k)
    expected = Tensor.from_numpy(c, host)
    host.sgemm(transa, transb, m, n, k, 0.5, Tensor.from_numpy(a, host), lda, Tensor.from_numpy(b, host), ldb, -2.0,
               expected, m)
    A, B, C = (Tensor.from_numpy(array, cuda) for array in (a, b, c))
    problem = GemmProblem(transa, transb, m, n, k, lda, ldb, m, alignment=alignment(A.data.ptr, B.data.ptr, C.data.ptr))
    assert problem.transposed_values > 0
    cuda._gemm.plans[problem, "exhaustive"] = GemmPlan(problem, transposed=True)
    cuda._gemm._grow_scratch(problem.transposed_values)
    cuda.sgemm(transa, transb, m, n, k, 0.5, A, lda, B, ldb, -2.0, C, m)
    assert relative_error(C.numpy(), expected.numpy()) <= FP32_TOLERANCE
    C.write_(c)  # the same address: the graph keeps writing into C
    with cuda.context.capture() as graph:
        cuda.sgemm(transa, transb, m, n, k, 0.5, A, lda, B, ldb, -2.0, C, m)
    graph.launch()
    assert relative_error(C.numpy(), expected.numpy()) <= FP32_TOLERANCE


def test_transposing_candidate_applies_where_an_operand_is_not_k_contiguous(cuda):
    from cudnnnet.backends.cuda.matmul import GemmProblem

    assert GemmProblem(OP_T, OP_N, 8, 8, 8, 8, 8, 8).transposed_values == 0  # TN already
    assert GemmProblem(OP_N, OP_T, 8, 4, 16, 8, 4, 8).transposed_values == 16 * 8 + 16 * 4  # A' and B'
    assert GemmProblem(OP_N, OP_N, 3, 4, 5, 3, 5, 3).transposed_values == 64  # A' (15 floats, 256-byte aligned)


def test_sgemm_on_unaligned_views(host, cuda, rng):
    """Operands at 4-byte offsets get plans for their alignment (cuBLASLt assumes 256 bytes unless told)."""
    m, n, k = 64, 48, 96
    storage = [normal(rng, m * k + 1), normal(rng, k * n + 3), normal(rng, m * n + 5)]

    def body(b, A, B, C):
        views = [t.view((size,), offset) for t, offset, size in ((A, 1, m * k), (B, 3, k * n), (C, 5, m * n))]
        b.sgemm(OP_N, OP_N, m, n, k, 1.0, views[0], m, views[1], k, 0.0, views[2], m)
        return [C]

    compare(host, cuda, body, *storage)


def test_sgemm_in_the_slides_engine_runs_cublas_sgemm_untimed(host, cuda, rng, bindings):
    a, b, c, lda, ldb = gemm_arrays(rng, OP_N, OP_N, 33, 17, 9)
    with cuda.using_engine("slides"):
        compare(host, cuda, lambda bk, A, B, C: [bk.sgemm(OP_N, OP_N, 33, 17, 9, 1.0, A, lda, B, ldb, 0.0, C, 33) or C],
                a, b, c)
    assert bindings.calls["cublasSgemm_v2"] == 1
    assert not any(name.startswith("cublasLt") for name in bindings.calls)


def test_sgemm_first_met_during_capture_runs_cublas_sgemm(host, cuda, rng):
    """Nothing can be timed inside a capture: an unplanned problem takes cublasSgemm there."""
    a, b, c, lda, ldb = gemm_arrays(rng, OP_T, OP_N, 23, 11, 19)
    A, B, C = (Tensor.from_numpy(array, cuda) for array in (a, b, c))
    with cuda.context.capture() as graph:
        cuda.sgemm(OP_T, OP_N, 23, 11, 19, 1.0, A, lda, B, ldb, 0.0, C, 23)
    graph.launch()
    expected = Tensor.from_numpy(c, host)
    host.sgemm(OP_T, OP_N, 23, 11, 19, 1.0, Tensor.from_numpy(a, host), lda, Tensor.from_numpy(b, host), ldb, 0.0,
               expected, 23)
    assert relative_error(C.numpy(), expected.numpy()) <= FP32_TOLERANCE
    plans = [plan for (problem, _), plan in cuda._gemm.plans.items() if (problem.m, problem.n, problem.k) == (23, 11, 19)]
    assert plans and all(plan.algorithm is None and plan.microseconds is None for plan in plans)


def test_blas_checks_sizes_before_the_gpu(cuda):
    small = Tensor.zeros((10,), cuda)
    with pytest.raises(ShapeError, match="C"):
        cuda.sgemm(OP_N, OP_N, 4, 4, 1, 1.0, small, 4, small, 1, 0.0, small, 4)
    with pytest.raises(UsageError, match="transpose"):
        cuda.sgemm(2, OP_N, 1, 1, 1, 1.0, small, 1, small, 1, 0.0, small, 1)


def test_cublas_status_is_raised_with_its_name(cuda):
    t = Tensor.zeros((4,), cuda)
    with pytest.raises(CublasError) as caught:
        cuda.sgemm(OP_N, OP_N, -1, 1, 1, 1.0, t, 1, t, 1, 0.0, t, 1)
    assert caught.value.function == "cublasSgemm_v2"
    assert caught.value.status_name == "CUBLAS_STATUS_INVALID_VALUE"


# ---- cuDNN: pointwise --------------------------------------------------------------------------
ACTIVATIONS = [
    ActivationDescriptor(ActivationMode.SIGMOID),
    ActivationDescriptor(ActivationMode.RELU),
    ActivationDescriptor(ActivationMode.TANH),
    ActivationDescriptor(ActivationMode.CLIPPED_RELU, 0.8),
    ActivationDescriptor(ActivationMode.ELU, 0.7),
]


@pytest.mark.parametrize("n", BATCHES)
@pytest.mark.parametrize("desc", ACTIVATIONS, ids=lambda d: d.mode.name)
def test_activation(host, cuda, rng, desc, n):
    def body(b, x, dy, y, dx, blended):
        b.activation_forward(desc, 1.0, x, 0.0, y)
        b.activation_backward(desc, 1.0, y, dy, x, 0.0, dx)
        b.activation_forward(desc, 0.5, x, 0.25, blended)
        return [y, dx, blended]

    shape = (n, 3, 4, 5)
    compare(host, cuda, body, *(normal(rng, *shape) for _ in range(5)))


@pytest.mark.parametrize("n", BATCHES)
@pytest.mark.parametrize("sample", [(10, 1, 1), (3, 2, 2)])
def test_softmax(host, cuda, rng, n, sample):
    def body(b, x, y, blended):
        b.softmax_forward(1.0, x, 0.0, y)
        b.softmax_forward(2.0, x, 0.5, blended)
        return [y, blended]

    shape = (n, *sample)
    compare(host, cuda, body, 3 * normal(rng, *shape), normal(rng, *shape), normal(rng, *shape))


@pytest.mark.parametrize("bias_shape", [(1, 4, 1, 1), (1, 4, 3, 3), (1, 1, 1, 1)])
def test_add_tensor(host, cuda, rng, bias_shape):
    def body(b, bias, y):
        b.add_tensor(1.0, bias, 1.0, y)
        b.add_tensor(0.5, bias, 2.0, y)
        return [y]

    compare(host, cuda, body, normal(rng, *bias_shape), normal(rng, 7, 4, 3, 3))


def test_pointwise_shape_mismatch(cuda):
    with pytest.raises(ShapeError):
        cuda.activation_forward(ACTIVATIONS[1], 1.0, Tensor.zeros((2, 3), cuda), 0.0, Tensor.zeros((3, 2), cuda))


def test_cudnn_status_is_raised_with_its_name(cuda):
    with pytest.raises(CudnnError) as caught:
        cuda.context.descriptors.tensor((0, 1, 1, 1))
    assert caught.value.function == "cudnnSetTensor4dDescriptor"
    assert caught.value.status_name.startswith("CUDNN_STATUS_BAD_PARAM")


# ---- cuDNN: convolution ------------------------------------------------------------------------
GEOMETRIES = [  # (kernel, stride, padding, dilation)
    (3, 1, 0, 1),
    (3, 1, 1, 1),
    (3, 2, 1, 1),
    (5, 2, 2, 1),
    (3, 1, 2, 2),
    (1, 1, 0, 1),
    (4, 3, 1, 2),
]


def convolution_body(desc):
    def body(b, x, w, y, dy, dx, dw, db):
        plan = b.convolution_plan(desc, x.shape, y.shape)
        b.convolution_forward(plan, 1.0, x, w, 0.0, y)  # y = x ⋆ w
        b.convolution_backward_data(plan, 1.0, w, dy, 0.5, dx)  # dx = dy ⋆ᵀ w + dx/2
        b.convolution_backward_filter(plan, 1.0, x, dy, 0.0, dw)  # dw = Σ x ⋆ dy
        b.convolution_backward_bias(0.5, dy, 1.0, db)  # db += Σ dy / 2
        return [y, dx, dw, db]

    return body


def convolution_arrays(rng, desc, n, size=13):
    x_shape = (n, desc.in_channels, size, size)
    y_shape = desc.output_shape(x_shape)
    return [normal(rng, *shape) for shape in (x_shape, desc.filter_shape, y_shape, y_shape, x_shape,
                                              desc.filter_shape, (1, desc.out_channels, 1, 1))]


@pytest.mark.parametrize("n", BATCHES)
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "k{}s{}p{}d{}".format(*g))
def test_convolution(host, cuda, rng, geometry, n):
    desc = ConvolutionDescriptor(4, 3, *geometry)
    compare(host, cuda, convolution_body(desc), *convolution_arrays(rng, desc, n))


def gemm_engine_plan(backend, plan, samples_per_gemm=1):
    """``plan`` with our explicit-GEMM engine in all three directions, the weight gradient summing
    ``samples_per_gemm`` samples inside each GEMM (the host's plan as it is)."""
    if backend.name != "cuda":
        return plan
    from cudnnnet.backends.cuda import gemm_convolution
    from cudnnnet.backends.cuda.convolution import Algorithm

    def gemm(direction):
        samples = samples_per_gemm if direction == "backward_filter" else 1
        nbytes = gemm_convolution.workspace_bytes(direction, plan.gemm_shape, samples)
        return Algorithm(gemm_convolution.GEMM_ALGORITHM, nbytes, samples_per_gemm=samples)

    return dataclasses.replace(plan, **{direction: gemm(direction)
                                        for direction in ("forward", "backward_data", "backward_filter")})


def gemm_convolution_body(desc, samples_per_gemm=1):
    def body(b, x, w, y, dy, dx, dw, db):
        plan = gemm_engine_plan(b, b.convolution_plan(desc, x.shape, y.shape), samples_per_gemm)
        b.convolution_forward(plan, 1.0, x, w, 0.0, y)  # y = x ⋆ w
        b.convolution_backward_data(plan, 1.0, w, dy, 0.5, dx)  # dx = dy ⋆ᵀ w + dx/2
        b.convolution_backward_filter(plan, 2.0, x, dy, 0.5, dw)  # dw = 2·Σ x ⋆ dy + dw/2
        return [y, dx, dw]

    return body


@pytest.mark.parametrize("samples_per_gemm", [1, 3, 8])
@pytest.mark.parametrize("n", BATCHES)
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "k{}s{}p{}d{}".format(*g))
def test_convolution_gemm_engine(host, cuda, rng, geometry, n, samples_per_gemm, bindings):
    """Our im2col + cuBLAS engine, forced in every direction, against the host (alpha, beta included);
    the weight gradient summing 1, 3 or 8 samples inside one GEMM (the last group padded with zeros
    where the batch is no multiple of it, one group for a batch of at most that many)."""
    desc = ConvolutionDescriptor(4, 3, *geometry)
    compare(host, cuda, gemm_convolution_body(desc, samples_per_gemm), *convolution_arrays(rng, desc, n))
    gemms = sum(bindings.calls[name] for name in ("cublasSgemmStridedBatched", "cublasSgemm_v2", "cublasLtMatmul"))
    assert gemms >= 3  # the engine ran, its GEMMs on cuBLAS or cuBLASLt (a batch of 1 is a plain GEMM)


def by_forward_body(desc, choice):
    """Backward data as a forward convolution of the flipped filter, with the ``choice``-th exact forward
    algorithm cuDNN offers for it (the host's plan as it is)."""
    def body(b, x, w, y, dy, dx, dw, db):
        plan = b.convolution_plan(desc, x.shape, y.shape)
        if b.name == "cuda":
            from cudnnnet.backends.cuda import convolution

            flipped = convolution.flipped_filter(b.context.descriptors, desc, b.precision, convolution.cudnn.FMA_MATH)
            found = convolution.by_forward_candidates(b.context.cudnn.handle, plan.x, plan.y, flipped, b.workspace_limit,
                                                      convolution.cudnn.FMA_MATH)
            plan = dataclasses.replace(plan, backward_data=found[choice % len(found)], flipped=flipped)
        b.convolution_backward_data(plan, 1.0, w, dy, 0.5, dx)  # dx = dy ⋆ᵀ w + dx/2
        return [dx]

    return body


@pytest.mark.parametrize("choice", [0, 1, 2])
@pytest.mark.parametrize("n", [1, 7, 256])
@pytest.mark.parametrize("geometry", [g for g in GEOMETRIES if g[1] == 1], ids=lambda g: "k{}s{}p{}d{}".format(*g))
def test_convolution_backward_data_as_flipped_forward(host, cuda, rng, geometry, n, choice, bindings):
    """Stride-1 backward data by cudnnConvolutionForward over dy and the flipped, transposed filter,
    against the host, with each exact forward algorithm cuDNN offers."""
    desc = ConvolutionDescriptor(4, 3, *geometry)
    compare(host, cuda, by_forward_body(desc, choice), *convolution_arrays(rng, desc, n))
    assert bindings.calls["cudnnConvolutionForward"] >= 1 and bindings.calls["cudnnConvolutionBackwardData"] == 0


@pytest.mark.parametrize("shape", [(256, 1, 28, 28, 20), (256, 20, 12, 12, 50), (1000, 20, 12, 12, 50)],
                         ids=lambda s: "n{}c{}h{}k{}".format(s[0], s[1], s[2], s[4]))
def test_convolution_gemm_engine_at_the_cnn_shapes(host, cuda, rng, shape):
    n, c, h, w, k = shape
    desc = ConvolutionDescriptor(k, c, 5)
    compare(host, cuda, gemm_convolution_body(desc), *convolution_arrays(rng, desc, n, size=h))


def test_convolution_plan_takes_cudnn_or_the_gemm_engine_by_timing(cuda, caplog, monkeypatch):
    """Every direction's algorithm is a deterministic exact cuDNN one or the GEMM engine, and the
    search timed each candidate (logged at DEBUG). A backend of its own, without the disk cache:
    no plan of another test is reused."""
    from cudnnnet.backends.cuda import CudaBackend, convolution

    monkeypatch.setenv("CUDNNNET_NO_CACHE", "1")
    desc = ConvolutionDescriptor(20, 1, 5)
    backend = CudaBackend(engine="fast")
    try:
        with caplog.at_level("DEBUG", logger="cudnnnet.backends.cuda.convolution"):
            plan = backend.convolution_plan(desc, (96, 1, 28, 28), desc.output_shape((96, 1, 28, 28)))
    finally:
        backend.close()
    for direction in ("forward", "backward_data", "backward_filter"):
        algorithm = getattr(plan, direction)
        assert algorithm.deterministic
        listed_as = "forward" if algorithm.by_forward else direction  # backward data as a forward convolution
        assert algorithm.algo == convolution.GEMM_ALGORITHM or algorithm.algo in convolution.EXACT_ALGORITHMS[listed_as]
        assert f"convolution {direction} (96, 1, 28, 28): " in caplog.text
    assert "algorithm -1 " in caplog.text  # the GEMM engine was among the timed candidates
    assert "algorithm -1x32 " in caplog.text  # and its weight gradient with 32 samples inside one GEMM
    assert "algorithm forward-" in caplog.text  # and backward data as a forward convolution of the flipped filter


def test_convolution_heuristic_search(host, cuda, rng):
    """The fast engine times every candidate (exhaustive); cuDNN's first choice must agree with the host too."""
    desc = ConvolutionDescriptor(8, 3, 3, 1, 1, 1)
    with cuda.using_engine(dataclasses.replace(FAST, convolution_search="heuristic")):
        compare(host, cuda, convolution_body(desc), *convolution_arrays(rng, desc, 16))


def test_convolution_in_the_slides_engine_takes_cudnn_find_choice(host, cuda, rng, bindings, monkeypatch):
    """The slides engine asks cudnnFind* in each direction and runs cuDNN's algorithms only (no GEMM
    engine, nothing timed by us), in agreement with the host."""
    from cudnnnet.backends.cuda import convolution

    monkeypatch.setenv("CUDNNNET_NO_CACHE", "1")
    desc = ConvolutionDescriptor(7, 3, 3, 1, 1, 1)
    arrays = convolution_arrays(rng, desc, 13)  # x (13, 3, 13, 13)
    with cuda.using_engine("slides"):
        plan = cuda.convolution_plan(desc, arrays[0].shape, desc.output_shape(arrays[0].shape))
        compare(host, cuda, convolution_body(desc), *arrays)
    for direction in ("forward", "backward_data", "backward_filter"):
        assert getattr(plan, direction).algo in convolution.EXACT_ALGORITHMS[direction]
    assert bindings.calls["cudnnFindConvolutionForwardAlgorithm"] == 1
    assert bindings.calls["cudnnFindConvolutionBackwardDataAlgorithm"] == 1
    assert bindings.calls["cudnnFindConvolutionBackwardFilterAlgorithm"] == 1
    assert bindings.calls["cuLaunchKernel"] == 0  # no im2col, no timing spin


def test_convolution_plans_per_batch_size_and_workspace_only_grows(cuda, bindings, monkeypatch):
    monkeypatch.setenv("CUDNNNET_NO_CACHE", "1")
    desc = ConvolutionDescriptor(16, 8, 3, 1, 1, 1)
    sizes = []
    plans = {}
    for n in (4, 64, 8, 64, 4):
        x_shape = (n, 8, 20, 20)
        plans.setdefault(n, cuda.convolution_plan(desc, x_shape, desc.output_shape(x_shape)))
        assert cuda.convolution_plan(desc, x_shape, desc.output_shape(x_shape)) is plans[n]
        assert cuda.context.workspace_bytes >= plans[n].workspace_bytes
        sizes.append(cuda.context.workspace_bytes)
    assert sizes == sorted(sizes)
    assert plans[4] is not plans[8] and plans[8] is not plans[64]
    assert plans[8].forward.algo == plans[64].forward.algo  # batch 8 runs the algorithms of batch 64
    # 4 and 64 searched (forward, and backward data as a forward convolution of the flipped filter), 8 from 64's plan
    assert bindings.calls["cudnnGetConvolutionForwardAlgorithm_v7"] == 4
    assert bindings.calls["cudnnFindConvolutionForwardAlgorithm"] == 0  # candidates are timed by us, not cudnnFind


def test_convolution_plan_rejects_wrong_shapes(cuda):
    desc = ConvolutionDescriptor(4, 3, 3)
    with pytest.raises(ShapeError):
        cuda.convolution_plan(desc, (2, 3, 8, 8), (2, 4, 8, 8))
    with pytest.raises(ShapeError):
        cuda.convolution_plan(desc, (2, 5, 8, 8), (2, 4, 6, 6))


# ---- cuDNN: pooling ----------------------------------------------------------------------------
POOLINGS = [(2, 0, 2), (3, 1, 1), (3, 1, 2), (2, 0, 1)]  # (window, padding, stride)


@pytest.mark.parametrize("n", BATCHES)
@pytest.mark.parametrize("window, padding, stride", POOLINGS)
@pytest.mark.parametrize("mode", [PoolingMode.MAX, PoolingMode.AVERAGE], ids=lambda m: m.name)
def test_pooling(host, cuda, rng, mode, window, padding, stride, n):
    desc = PoolingDescriptor(mode, window, padding, stride)
    x_shape = (n, 3, 9, 9)
    y_shape = desc.output_shape(x_shape)

    def body(b, x, y, dy, dx):
        b.pooling_forward(desc, 1.0, x, 0.0, y)
        b.pooling_backward(desc, 1.0, y, dy, x, 0.0, dx)
        return [y, dx]

    compare(host, cuda, body, normal(rng, *x_shape), normal(rng, *y_shape), normal(rng, *y_shape), normal(rng, *x_shape))


# ---- our max pooling backward (kernels/pooling.cu) ---------------------------------------------
# (window, stride), no padding: windows that do not overlap, which pooling_backward gives to our kernel.
# On 9×11 images (2, 2) leaves the last row and column in no window, (3, 3) the last two columns;
# (2, 3) and (1, 2) leave gaps between windows too.
KERNEL_POOLINGS = [(2, 2), (3, 3), (2, 3), (1, 2)]
BLENDS = [(1.0, 0.0), (0.5, 0.0), (1.0, 1.0), (-2.0, 0.75)]  # (alpha, beta)


@pytest.fixture
def launches():
    """Launches of our kernels, counted from zero."""
    from cudnnnet.backends.cuda import kernel

    kernel.reset_launches()
    return kernel.launches


def relu_ties(rng, *shape):
    """ReLU outputs rounded to halves: windows of zeros and windows whose maximum is tied."""
    return (np.round(np.maximum(rng.standard_normal(shape), 0.0) * 2) / 2).astype(np.float32)


def pooling_dx(b, desc, alpha, beta, x, dy, dx):
    """dx after y = pool(x) and pooling_backward(desc, alpha, y, dy, x, beta, dx) on backend ``b``."""
    x_tensor, y = Tensor.from_numpy(x, b), Tensor(dy.shape, b)
    b.pooling_forward(desc, 1.0, x_tensor, 0.0, y)
    out = Tensor.from_numpy(dx, b)
    b.pooling_backward(desc, alpha, y, Tensor.from_numpy(dy, b), x_tensor, beta, out)
    return out.numpy()


def dx_mismatches(desc, x, actual, expected, tolerance=0.0) -> str:
    """'' where the two dx agree (within ``tolerance`` relative to max(1, |expected|); NaN equals NaN),
    else how many values differ, how many of them lie in a window whose maximum is tied, and the first
    few with their window's x."""
    with np.errstate(invalid="ignore"):  # inf - inf
        bound = tolerance * np.maximum(1.0, np.abs(expected))
        agree = (actual == expected) | (np.abs(actual - expected) <= bound) | (np.isnan(actual) & np.isnan(expected))
    wrong = [tuple(int(i) for i in index) for index in np.argwhere(~agree)]
    if not wrong:
        return ""
    cells = [window_of(desc, x, *index) for index in wrong]
    tied = sum(1 for cell in cells if cell is not None and np.count_nonzero(cell == cell.max()) > 1)
    lines = [f"{len(wrong)} of {actual.size} dx values differ ({tied} in windows whose maximum is tied):"]
    for index, cell in list(zip(wrong, cells))[:5]:
        where = "in no window" if cell is None else f"window x {cell.tolist()}"
        lines.append(f"  dx{index} = {float(actual[index])!r}, expected {float(expected[index])!r}, {where}")
    return "\n".join(lines)


def window_of(desc, x, n, c, h, w):
    """The x values of the window holding cell (h, w) of a pooling without overlap or padding, or None."""
    _, _, out_h, out_w = desc.output_shape(x.shape)
    oh, ow = h // desc.stride, w // desc.stride
    if oh >= out_h or ow >= out_w or h % desc.stride >= desc.window or w % desc.stride >= desc.window:
        return None
    top, left = oh * desc.stride, ow * desc.stride
    return x[n, c, top:top + desc.window, left:left + desc.window]


@pytest.mark.parametrize("alpha, beta", BLENDS)
@pytest.mark.parametrize("n", [1, 255])
@pytest.mark.parametrize("window, stride", KERNEL_POOLINGS)
def test_max_pooling_kernel_equals_the_host(host, cuda, rng, bindings, launches, window, stride, n, alpha, beta):
    """Ties (ReLU zeros) included, bit for bit: dy at each window's first maximum, 0 elsewhere, blended
    with alpha and beta; with beta = 0 the NaN that dx held is overwritten."""
    desc = PoolingDescriptor(PoolingMode.MAX, window, 0, stride)
    x = relu_ties(rng, n, 3, 9, 11)
    dy = normal(rng, *desc.output_shape(x.shape))
    dx = np.full(x.shape, np.nan, np.float32) if beta == 0 else normal(rng, *x.shape)
    expected = pooling_dx(host, desc, alpha, beta, x, dy, dx)
    actual = pooling_dx(cuda, desc, alpha, beta, x, dy, dx)
    assert launches["max_pooling_backward"] == 1 and bindings.calls["cudnnPoolingBackward"] == 0, \
        f"our kernel was not the one that ran: launches {dict(launches)}, calls {dict(bindings.calls)}"
    report = dx_mismatches(desc, x, actual, expected)
    assert not report, report


@pytest.mark.parametrize("x_shape", [(256, 20, 24, 24), (256, 50, 8, 8)], ids=["pool1", "pool2"])
def test_max_pooling_kernel_at_the_cnn_shapes(host, cuda, rng, x_shape):
    desc = PoolingDescriptor(PoolingMode.MAX, 2, 0, 2)
    x = relu_ties(rng, *x_shape)
    dy = normal(rng, *desc.output_shape(x_shape))
    dx = np.full(x_shape, np.nan, np.float32)
    report = dx_mismatches(desc, x, pooling_dx(cuda, desc, 1.0, 0.0, x, dy, dx), pooling_dx(host, desc, 1.0, 0.0, x, dy, dx))
    assert not report, report


def test_max_pooling_kernel_with_nan_and_infinities_equals_the_host(host, cuda, rng):
    """A window holding a NaN routes its dy nowhere; an infinite maximum takes dy like any other; a
    NaN or infinite dy stays in its window's first maximum."""
    desc = PoolingDescriptor(PoolingMode.MAX, 2, 0, 2)
    x = relu_ties(rng, 4, 3, 8, 10)
    for value, every in ((np.nan, 13), (np.inf, 17), (-np.inf, 19)):
        x.reshape(-1)[every // 2::every] = value
    dy = normal(rng, *desc.output_shape(x.shape))
    dy.reshape(-1)[::7], dy.reshape(-1)[3::11] = np.nan, -np.inf
    for alpha, beta in ((1.0, 0.0), (0.5, 1.0)):
        dx = normal(rng, *x.shape)
        report = dx_mismatches(desc, x, pooling_dx(cuda, desc, alpha, beta, x, dy, dx),
                               pooling_dx(host, desc, alpha, beta, x, dy, dx))
        assert not report, f"alpha {alpha}, beta {beta}: {report}"


@pytest.mark.parametrize("data", ["distinct", "relu_ties"])
@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (-2.0, 0.75)])
@pytest.mark.parametrize("n", [1, 255])
@pytest.mark.parametrize("window, stride", KERNEL_POOLINGS)
def test_max_pooling_kernel_equals_cudnn(cuda, rng, bindings, launches, window, stride, n, alpha, beta, data):
    """The same call through cudnnPoolingBackward (the fast engine's max_pooling_kernel off). With alpha, beta = (1, 0) both
    copy dy: equal bit for bit; otherwise within float32 rounding (cuDNN may fuse a multiply-add). On
    "relu_ties" they are equal only if cuDNN, like the host, gives dy to each window's first maximum:
    the failure message counts the differing values that lie in tied windows."""
    desc = PoolingDescriptor(PoolingMode.MAX, window, 0, stride)
    x = normal(rng, n, 3, 9, 11) if data == "distinct" else relu_ties(rng, n, 3, 9, 11)
    dy = normal(rng, *desc.output_shape(x.shape))
    dx = np.full(x.shape, np.nan, np.float32) if beta == 0 else normal(rng, *x.shape)
    ours = pooling_dx(cuda, desc, alpha, beta, x, dy, dx)
    with cuda.using_engine(dataclasses.replace(FAST, max_pooling_kernel=False)):
        theirs = pooling_dx(cuda, desc, alpha, beta, x, dy, dx)
    assert launches["max_pooling_backward"] == 1 and bindings.calls["cudnnPoolingBackward"] == 1, \
        f"expected one run of each: launches {dict(launches)}, calls {dict(bindings.calls)}"
    report = dx_mismatches(desc, x, ours, theirs, tolerance=0.0 if (alpha, beta) == (1.0, 0.0) else 1e-6)
    assert not report, f"ours against cuDNN's: {report}"


@pytest.mark.parametrize("mode, window, padding, stride", [
    (PoolingMode.MAX, 3, 0, 2),  # overlapping windows
    (PoolingMode.MAX, 2, 1, 2),  # padding
    (PoolingMode.AVERAGE, 2, 0, 2),
], ids=["max-overlapping", "max-padded", "average"])
def test_other_poolings_keep_calling_cudnn(host, cuda, rng, bindings, launches, mode, window, padding, stride):
    desc = PoolingDescriptor(mode, window, padding, stride)
    x = normal(rng, 7, 3, 9, 9)
    dy = normal(rng, *desc.output_shape(x.shape))
    dx = np.full(x.shape, np.nan, np.float32)
    actual = pooling_dx(cuda, desc, 1.0, 0.0, x, dy, dx)
    assert bindings.calls["cudnnPoolingBackward"] == 1 and launches["max_pooling_backward"] == 0, \
        f"{desc} should run on cuDNN: calls {dict(bindings.calls)}, launches {dict(launches)}"
    error = relative_error(actual, pooling_dx(host, desc, 1.0, 0.0, x, dy, dx))
    assert error <= FP32_TOLERANCE, f"relative error {error:.3g} against the host"


def test_max_pooling_kernel_replays_in_a_cuda_graph(host, cuda, rng, launches):
    """pool forward and backward captured once (no allocation, no synchronisation inside), then replayed
    on new x and dy written in place: every replay gives the host's dx for that input."""
    desc = PoolingDescriptor(PoolingMode.MAX, 2, 0, 2)
    x_shape = (255, 20, 24, 24)
    y_shape = desc.output_shape(x_shape)
    x, dy, dx = Tensor.zeros(x_shape, cuda), Tensor.zeros(y_shape, cuda), Tensor.zeros(x_shape, cuda)
    y = Tensor(y_shape, cuda)

    def step():
        cuda.pooling_forward(desc, 1.0, x, 0.0, y)
        cuda.pooling_backward(desc, 1.0, y, dy, x, 0.0, dx)

    step()  # eager: compiles and loads the kernel before the capture
    with cuda.context.capture() as graph:
        step()
    for replay in range(2):
        x_values, dy_values = relu_ties(rng, *x_shape), normal(rng, *y_shape)
        x.write_(x_values)
        dy.write_(dy_values)
        dx.fill_(np.nan)
        graph.launch()
        nan = np.full(x_shape, np.nan, np.float32)
        report = dx_mismatches(desc, x_values, dx.numpy(), pooling_dx(host, desc, 1.0, 0.0, x_values, dy_values, nan))
        assert not report, f"replay {replay}: {report}"
    assert launches["max_pooling_backward"] == 2  # the eager step and the capture: replays run no Python


# ---- our kernels -------------------------------------------------------------------------------
def probabilities(rng, n, classes=10):
    values = rng.random((n, classes)).astype(np.float32)
    values[rng.random((n, classes)) < 0.05] = 0.0  # exercises the log(max(p, 1e-7)) clamp
    return values / np.maximum(values.sum(axis=1, keepdims=True), 1e-6)


def one_hot(rng, n, classes=10):
    target = np.zeros((n, classes), np.float32)
    target[np.arange(n), rng.integers(0, classes, n)] = 1.0
    return target


@pytest.mark.parametrize("n", LOSS_BATCHES)
def test_loss_kernels(host, cuda, rng, n):
    def body(b, predict, target, cross_entropy, squared, count):
        b.cross_entropy_loss(predict, target, cross_entropy)  # zeroes first: the 9s must not survive
        b.cross_entropy_loss(predict, target, cross_entropy, accumulate=True)
        b.squared_error_loss(predict, target, squared)
        b.accuracy_count(predict, target, count)
        b.accuracy_count(predict, target, count, accumulate=True)
        return [cross_entropy, squared, count]

    nines = np.full(1, 9.0, np.float32)
    compare(host, cuda, body, probabilities(rng, n), one_hot(rng, n), nines, nines, nines)


@pytest.mark.parametrize("n", LOSS_BATCHES)
def test_accuracy_count_is_exact(host, cuda, rng, n):
    predict, target = probabilities(rng, n), one_hot(rng, n)
    predict[: n // 2] += 2 * target[: n // 2]  # at least half right
    count = Tensor.zeros((1,), cuda)
    cuda.accuracy_count(Tensor.from_numpy(predict, cuda), Tensor.from_numpy(target, cuda), count)
    assert count.item() == np.count_nonzero(predict.argmax(axis=1) == target.argmax(axis=1))


@pytest.mark.parametrize("engine", ["slides", "fast"])  # cuBLAS level-1 calls; kernels/sgd.cu
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("lr_on_device", [False, True])
@pytest.mark.parametrize("offset", [0, 1])  # float4s and the values after them; one value a thread
def test_sgd_update(host, cuda, rng, lr_on_device, momentum, weight_decay, engine, offset):
    def body(b, param, grad, velocity, lr):
        rate = lr if lr_on_device else float(lr.numpy()[0, 0, 0, 0])
        param, grad, velocity = (t.view((4097,), offset) for t in (param, grad, velocity))
        with b.using_engine(engine):
            for _ in range(3):
                b.sgd_update(param, grad, velocity if momentum else None, rate, momentum, weight_decay)
        return [param, velocity, grad]  # grad must be left as it was

    arrays = normal(rng, 4098), normal(rng, 4098), np.zeros(4098, np.float32)
    compare(host, cuda, body, *arrays, np.array([0.05], np.float32))


def test_fast_sgd_update_keeps_an_infinite_weight_without_weight_decay(host, cuda):
    """g = grad where weight_decay is 0 (no 0·param): an infinite weight stays infinite, as on the host."""
    for backend in (host, cuda):
        with backend.using_engine("fast"):
            param = Tensor.from_numpy(np.array([np.inf, 1.0, -np.inf, 2.0, 3.0], np.float32), backend)
            backend.sgd_update(param, Tensor.from_numpy(np.ones(5, np.float32), backend), None, 0.5, 0.0, 0.0)
            np.testing.assert_array_equal(param.numpy().reshape(-1), [np.inf, 0.5, -np.inf, 1.5, 2.5])


def test_sgd_momentum_needs_velocity(cuda):
    t = Tensor.zeros((3,), cuda)
    with pytest.raises(UsageError, match="velocity"):
        cuda.sgd_update(t, t, None, 0.1, 0.9, 0.0)


def test_nvrtc_error_carries_the_log(cuda):
    from cudnnnet.backends.cuda.kernel import compile_cubin

    with pytest.raises(NvrtcError) as caught:
        compile_cubin(b'extern "C" __global__ void broken(float* x) { x[0] = undefined_name; }', "broken.cu", cuda.context.arch)
    assert caught.value.function == "nvrtcCompileProgram"
    assert "undefined_name" in str(caught.value)


# ---- proof that the libraries ran, and that the hot path creates nothing ----------------------
def test_calls_reach_cublas_cudnn_and_our_kernels(cuda, rng, bindings):
    a = Tensor.from_numpy(normal(rng, 4, 4), cuda)
    x = Tensor.from_numpy(normal(rng, 2, 3, 6, 6), cuda)
    desc = ConvolutionDescriptor(2, 3, 3)
    y = Tensor(desc.output_shape(x.shape), cuda)
    with cuda.using_engine("slides"):  # the libraries' own choices: cublasSgemm, cuDNN; nothing timed by us
        cuda.sgemm(OP_N, OP_N, 4, 4, 4, 1.0, a, 4, a, 4, 0.0, Tensor(a.shape, cuda), 4)
        plan = cuda.convolution_plan(desc, x.shape, y.shape)
    cuda.convolution_forward(plan, 1.0, x, Tensor.zeros(desc.filter_shape, cuda), 0.0, y)
    cuda.activation_forward(ACTIVATIONS[1], 1.0, y, 0.0, y)
    cuda.cross_entropy_loss(a, a, Tensor.zeros((1,), cuda))
    cuda.synchronize()
    assert bindings.calls["cublasSgemm_v2"] == 1
    assert bindings.calls["cudnnConvolutionForward"] == 1
    assert bindings.calls["cudnnActivationForward"] == 1
    assert bindings.calls["cuLaunchKernel"] == 1


def test_hot_path_creates_no_descriptors(cuda, rng, bindings):
    x = Tensor.from_numpy(normal(rng, 5, 2, 3, 3), cuda)
    pooling = PoolingDescriptor(PoolingMode.MAX, 2, 0, 1)
    y = Tensor(pooling.output_shape(x.shape), cuda)
    for _ in range(2):
        bindings.reset_calls()
        cuda.activation_forward(ACTIVATIONS[2], 1.0, x, 0.0, x)
        cuda.softmax_forward(1.0, x, 0.0, x)
        cuda.pooling_forward(pooling, 1.0, x, 0.0, y)
    created = {name: count for name, count in bindings.calls.items() if name.startswith("cudnnCreate")}
    assert created == {}
    assert bindings.calls["cudnnPoolingForward"] == 1


# ---- the cuDNN handle, made on first use ----------------------------------------------------------
@pytest.fixture
def fresh_cuda(cuda):
    """A CudaBackend of its own, so without a cuDNN handle yet; closed after the test."""
    from cudnnnet.backends.cuda import CudaBackend

    backend = CudaBackend()
    yield backend
    backend.close()


def cudnn_calls(bindings) -> set[str]:
    """The cuDNN functions called since the counters were reset, but cudnnGetVersion (read eagerly)."""
    return {name for name in bindings.calls if name.startswith("cudnn") and name != "cudnnGetVersion"}


def test_in_the_fast_engine_an_mlp_trains_and_evaluates_without_ever_making_a_cudnn_handle(bindings, fresh_cuda):
    """In the fast engine Dense → ReLU → Dense → Softmax runs on cuBLAS(Lt) and our kernels only
    (bias + ReLU, ReLU gradient, softmax with the loss, SGD, evaluation), eagerly and from a captured
    graph: no cuDNN call is made, so the handle is never created."""
    from cudnnnet import Network
    from cudnnnet.layers import Activation, Dense, Softmax
    from cudnnnet.optim.optimizers import SGD
    from cudnnnet.train.trainer import ResidentTestSet, evaluate, evaluate_batches

    fresh_cuda.set_engine("fast")
    rng = np.random.default_rng(5)
    images, labels = rng.standard_normal((300, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, 300)
    network = Network([Dense("fc1", 32), Activation("relu1", "relu"), Dense("fc2", 10), Softmax("softmax")],
                      backend=fresh_cuda, seed=0, input_shape=(1, 8, 8))
    optimizer = SGD(network, 0.1, momentum=0.9, weight_decay=1e-4)
    test_set = ResidentTestSet(fresh_cuda, images, labels, 10)
    x, target = next(test_set.batches(64))
    loss, count = Tensor.zeros((1,), fresh_cuda), Tensor.zeros((1,), fresh_cuda)

    def step():
        network.forward_backward(x, target, loss, count)
        optimizer.step()

    step()
    with fresh_cuda.capture() as graph:
        step()
    graph.launch()
    evaluated = [evaluate_batches(network, test_set.batches(128), test_set.count), evaluate(network, images, labels, 100)]
    assert all(np.isfinite(result.loss) and 0 <= result.accuracy <= 1 for result in evaluated)
    assert fresh_cuda.context._cudnn is None
    assert cudnn_calls(bindings) == set(), f"cuDNN was called: {sorted(cudnn_calls(bindings))}"


def test_the_first_cudnn_call_makes_the_handle_once(host, bindings, fresh_cuda, rng):
    values = normal(rng, 5, 10)
    assert fresh_cuda.context._cudnn is None and bindings.calls["cudnnCreate"] == 0
    x, y = Tensor.from_numpy(values, fresh_cuda), Tensor.zeros((5, 10), fresh_cuda)
    for _ in range(2):
        fresh_cuda.softmax_forward(1.0, x, 0.0, y)
    assert bindings.calls["cudnnCreate"] == 1 and bindings.calls["cudnnSetStream"] == 1
    assert bindings.calls["cudnnSoftmaxForward"] == 2
    expected = Tensor.zeros((5, 10), host)
    host.softmax_forward(1.0, Tensor.from_numpy(values, host), 0.0, expected)
    assert relative_error(y.numpy(), expected.numpy()) <= FP32_TOLERANCE


def test_the_cudnn_handle_is_not_made_inside_a_capture(fresh_cuda, rng):
    x, y = Tensor.from_numpy(normal(rng, 5, 10), fresh_cuda), Tensor.zeros((5, 10), fresh_cuda)
    with pytest.raises(DeviceError, match="cuDNN handle would be created during a CUDA graph capture"):
        with fresh_cuda.capture():
            fresh_cuda.softmax_forward(1.0, x, 0.0, y)
    assert not fresh_cuda.context.is_capturing() and fresh_cuda.context._cudnn is None
    fresh_cuda.softmax_forward(1.0, x, 0.0, y)  # outside the capture: the handle is made here
    expected = y.numpy()
    y.fill_(0.0)
    with fresh_cuda.capture() as graph:
        fresh_cuda.softmax_forward(1.0, x, 0.0, y)
    graph.launch()
    np.testing.assert_array_equal(y.numpy(), expected)


def test_a_backend_that_never_called_cudnn_closes(bindings, cuda):
    from cudnnnet.backends.cuda import CudaBackend

    backend = CudaBackend()
    backend.close()
    assert backend.context.closed and bindings.calls["cudnnCreate"] == bindings.calls["cudnnDestroy"] == 0
    with pytest.raises(UsageError, match="closed"):
        backend.context.cudnn  # noqa: B018  (raises)


# ---- CUDA graphs --------------------------------------------------------------------------------
def test_graph_replay_reads_the_learning_rate_from_device_memory(host, cuda, rng):
    n = 1000
    arrays = [normal(rng, n), normal(rng, n), np.zeros(n, np.float32), normal(rng, n)]

    def step(b, param, grad, velocity, other, lr):
        b.sgd_update(param, grad, velocity, lr, 0.9, 0.01)  # kernels/sgd.cu reads lr[0]
        b.saxpy(n, lr, grad, 1, other, 1)  # CUBLAS_POINTER_MODE_DEVICE

    rates = (0.05, 0.2, 0.0)
    expected = [Tensor.from_numpy(a, host) for a in arrays] + [Tensor.from_numpy([0.1], host)]
    actual = [Tensor.from_numpy(a, cuda) for a in arrays] + [Tensor.from_numpy([0.1], cuda)]
    step(host, *expected)
    step(cuda, *actual)  # outside the capture: the kernel is compiled and loaded here
    with cuda.context.capture() as graph:
        step(cuda, *actual)
    for rate in rates:
        expected[-1].fill_(rate)
        step(host, *expected)
        actual[-1].fill_(rate)  # in place: the graph keeps reading the same address
        graph.launch()
    for got, want in zip(actual, expected):
        assert relative_error(got.numpy(), want.numpy()) <= FP32_TOLERANCE


def test_no_planning_during_capture(cuda):
    desc = ConvolutionDescriptor(3, 2, 3, 1, 0, 1)
    x_shape = (3, 2, 7, 7)
    with pytest.raises(DeviceError, match="capture"):
        with cuda.context.capture():
            cuda.convolution_plan(desc, x_shape, desc.output_shape(x_shape))
    assert not cuda.context.is_capturing()
    assert cuda.convolution_plan(desc, x_shape, desc.output_shape(x_shape)).x_shape == x_shape


# ---- TF32 --------------------------------------------------------------------------------------
def test_tf32_within_1e3(host, cuda, rng):
    m = n = k = 192
    desc = ConvolutionDescriptor(16, 8, 3, 1, 1, 1)

    def gemm(b, A, B, C):
        b.sgemm(OP_N, OP_T, m, n, k, 1.0, A, m, B, n, 0.0, C, m)
        return [C]

    cuda.set_math("tf32")
    try:
        compare(host, cuda, gemm, normal(rng, m * k), normal(rng, n * k), normal(rng, m * n), tolerance=TF32_TOLERANCE)
        compare(host, cuda, convolution_body(desc), *convolution_arrays(rng, desc, 32, size=16), tolerance=TF32_TOLERANCE)
    finally:
        cuda.set_math("fp32")


def test_invalid_math_mode(cuda):
    with pytest.raises(UsageError, match="tf32"):
        cuda.set_math("fp8")


# ---- DLPack ------------------------------------------------------------------------------------
def test_dlpack_round_trip_within_the_backend(cuda, rng):
    from cudnnnet.backends.cuda import dlpack

    values = normal(rng, 2, 3, 4, 5)
    source = Tensor.from_numpy(values, cuda)
    shared = Tensor.from_dlpack(source, cuda)
    assert shared.shape == source.shape and shared.data.ptr == source.data.ptr
    del source
    gc.collect()
    np.testing.assert_array_equal(shared.numpy(), values)  # the export kept the memory alive
    shared.fill_(1.5)
    del shared
    gc.collect()
    assert dlpack.exported_count() == 0


def test_dlpack_with_torch(cuda, rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    values = normal(rng, 3, 2, 4, 4)
    ours = Tensor.from_numpy(values, cuda)
    theirs = torch.from_dlpack(ours)
    assert theirs.device.type == "cuda" and tuple(theirs.shape) == ours.shape
    np.testing.assert_array_equal(theirs.cpu().numpy(), values)
    theirs.mul_(2.0)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(ours.numpy(), 2 * values)  # same memory

    source = torch.arange(24, dtype=torch.float32, device="cuda").reshape(2, 3, 4)
    borrowed = Tensor.from_dlpack(source, cuda)
    assert borrowed.shape == (2, 3, 4, 1) and borrowed.data.ptr == source.data_ptr()
    borrowed.fill_(5.0)
    cuda.synchronize()
    assert bool((source == 5.0).all())
    del borrowed
    gc.collect()

    with pytest.raises(ShapeError, match="contiguous"):
        Tensor.from_dlpack(torch.zeros(4, 6, device="cuda").t(), cuda)
    with pytest.raises(UsageError, match="float32"):
        Tensor.from_dlpack(torch.zeros(4, dtype=torch.float64, device="cuda"), cuda)


# ---- lifetime ----------------------------------------------------------------------------------
def test_device_memory_does_not_grow(cuda, rng):
    desc = ConvolutionDescriptor(4, 3, 3, 1, 1, 1)
    values = normal(rng, 80, 3, 8, 8)

    def churn():
        for n in range(1, 81):  # more batch sizes than the plan cache keeps
            x = Tensor.from_numpy(values[:n], cuda)
            cuda.convolution_plan(desc, x.shape, desc.output_shape(x.shape))
            view = x.view((10,), offset=5)
            capsule = x.__dlpack__()
            del x, view, capsule
        gc.collect()
        cuda.synchronize()

    churn()
    free_before = cuda.memory_info()[0]
    for _ in range(3):
        churn()
    free_after = cuda.memory_info()[0]
    assert free_before - free_after <= 4 << 20, f"{(free_before - free_after) / 2**20:.1f} MiB lost"


def test_context_closes(cuda):
    from cudnnnet.backends.cuda import CudaContext

    with CudaContext(cuda.context.device) as context:
        assert context.workspace(1 << 20) != 0
        assert not context.closed
    assert context.closed
    context.close()  # idempotent


# ---- data --------------------------------------------------------------------------------------
@pytest.mark.parametrize("sample_shape", [(1, 28, 28), (2, 2, 2), (1, 3, 3)], ids=["784", "8", "9"])
def test_gather_batch_copies_rows_as_float4s_or_floats(host, cuda, rng, sample_shape):
    """Rows of a multiple of 4 floats are copied as float4s, others one float at a time: both as the host."""
    images = rng.standard_normal((50, *sample_shape)).astype(np.float32)
    labels = rng.integers(0, 10, 50).astype(np.float32)
    order = rng.permutation(50).astype(np.float32)

    def body(b, images, labels, order, cursor, x, target):
        b.gather_batch(images, labels, order, cursor, x, target)
        return [x, target]

    compare(host, cuda, body, images, labels, order, np.array([13], np.float32),
            np.zeros((16, *sample_shape), np.float32), np.zeros((16, 10), np.float32))


# ---- activation backward: kernels/activation.cu against cudnnActivationBackward and the host ------
MODES_AND_COEFS = [(ActivationMode.SIGMOID, 0.0), (ActivationMode.RELU, 0.0), (ActivationMode.TANH, 0.0),
                   (ActivationMode.CLIPPED_RELU, 0.6), (ActivationMode.ELU, 0.7)]
ACTIVATION_SHAPES = [(1, 1, 1, 1), (256, 500, 1, 1), (7, 20, 24, 25)]  # the last: 4 values left after the float4s


def activation_forward_y(mode: ActivationMode, coef: float, x: np.ndarray) -> np.ndarray:
    """y = f(x) in float32, as the forward pass leaves it for the backward pass."""
    x = x.astype(np.float64)
    y = {ActivationMode.SIGMOID: lambda: 1 / (1 + np.exp(-x)), ActivationMode.RELU: lambda: np.maximum(x, 0),
         ActivationMode.TANH: lambda: np.tanh(x), ActivationMode.CLIPPED_RELU: lambda: np.clip(x, 0, coef),
         ActivationMode.ELU: lambda: np.where(x > 0, x, coef * np.expm1(x))}[mode]()
    return y.astype(np.float32)


def activation_dx(backend, desc, alpha, beta, x, y, dy, dx) -> np.ndarray:
    tensors = [Tensor.from_numpy(array, backend) for array in (x, y, dy, dx)]
    backend.activation_backward(desc, alpha, tensors[1], tensors[2], tensors[0], beta, tensors[3])
    return tensors[3].numpy()


def activation_operands(rng, mode, coef, shape, beta, special: bool):
    """(x, y, dy, dx) of ``shape``; x holds -inf and, except where ``special`` is off for ELU (cuDNN takes
    ELU's f'(0) as 1, the host as α: at the kink either is a convention), zeros; where
    ``special``, x holds NaN and dy NaN and inf too; dx is NaN where beta is 0 (it must not be read)."""
    with np.errstate(over="ignore", invalid="ignore"):
        x, dy = normal(rng, *shape), normal(rng, *shape)
        if special or mode != ActivationMode.ELU:
            x.reshape(-1)[::5] = 0.0
        x.reshape(-1)[2::17] = -np.inf
        if special:
            x.reshape(-1)[1::13] = np.nan
            dy.reshape(-1)[3::11], dy.reshape(-1)[4::7] = np.nan, np.inf
        y = activation_forward_y(mode, coef, x)
    dx = np.full(shape, np.nan, np.float32) if beta == 0 else normal(rng, *shape)
    return x, y, dy, dx


@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (-2.0, 0.75)])
@pytest.mark.parametrize("shape", ACTIVATION_SHAPES)
@pytest.mark.parametrize("mode, coef", MODES_AND_COEFS)
def test_activation_kernel_equals_cudnn(cuda, rng, bindings, launches, mode, coef, shape, alpha, beta):
    """The same backward pass through cudnnActivationBackward (the fast engine's activation_kernel off),
    x holding -inf and zeros (not for ELU): within float32 rounding (cuDNN may fuse a multiply-add),
    ReLU with alpha, beta = (1, 0) bit for bit (a NaN in dx does not survive beta = 0)."""
    desc = ActivationDescriptor(mode, coef)
    x, y, dy, dx = activation_operands(rng, mode, coef, shape, beta, special=False)
    ours = activation_dx(cuda, desc, alpha, beta, x, y, dy, dx)
    with cuda.using_engine(dataclasses.replace(FAST, activation_kernel=False)):
        theirs = activation_dx(cuda, desc, alpha, beta, x, y, dy, dx)
    assert launches["activation_backward"] + launches["activation_backward_x4"] >= 1
    assert bindings.calls["cudnnActivationBackward"] == 1
    if (mode, alpha, beta) == (ActivationMode.RELU, 1.0, 0.0):
        np.testing.assert_array_equal(ours, theirs)
    else:
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (-2.0, 0.75)])
@pytest.mark.parametrize("shape", ACTIVATION_SHAPES)
@pytest.mark.parametrize("mode, coef", MODES_AND_COEFS)
def test_activation_kernel_equals_the_host(host, cuda, rng, mode, coef, shape, alpha, beta):
    """Against the host's NumPy formulas, NaNs and infinities in x and dy included: the same values bit
    for bit (each step rounded alike), NaN where NumPy's are."""
    desc = ActivationDescriptor(mode, coef)
    x, y, dy, dx = activation_operands(rng, mode, coef, shape, beta, special=True)
    with np.errstate(invalid="ignore"):
        expected = activation_dx(host, desc, alpha, beta, x, y, dy, dx)
    np.testing.assert_array_equal(activation_dx(cuda, desc, alpha, beta, x, y, dy, dx), expected)


@pytest.mark.parametrize("mode, coef", MODES_AND_COEFS)
def test_fused_activation_backward_reads_f_prime_from_y(host, cuda, rng, mode, coef):
    """Where the activation ran fused into the layer before, y is handed over as x too: the same dx as
    from the true x (x off the kinks at 0 and coef), on both backends."""
    desc = ActivationDescriptor(mode, coef)
    x, dy = normal(rng, 64, 30, 1, 1), normal(rng, 64, 30, 1, 1)
    x[np.abs(x) < 0.05] += 0.1
    x[np.abs(x - coef) < 0.05] += 0.1
    y, dx = activation_forward_y(mode, coef, x), np.zeros_like(x)
    for backend in (host, cuda):
        np.testing.assert_array_equal(activation_dx(backend, desc, 1.0, 0.0, y, y, dy, dx),
                                      activation_dx(backend, desc, 1.0, 0.0, x, y, dy, dx))


@pytest.mark.parametrize("engine", ["slides", "fast"])
def test_activation_backward_writes_the_bf16_copy_that_a_gemm_reads(host, cuda, rng, launches, engine):
    """Math bf16, two passes of dx = f'·dy then C = W·dx: in the second, dx already has a bfloat16 copy,
    which the fast engine's kernel writes (no conversion of dx; the slides engine converts it), and
    the GEMM reads the new dx (dy changed between the passes): C as on the host."""
    m, k, n = 24, 40, 33  # C (m × n) = W (m × k) · dx (k × n)
    desc = ActivationDescriptor(ActivationMode.TANH)
    w, y = normal(rng, m * k), np.tanh(normal(rng, n, k, 1, 1))
    results = {}
    for backend in (host, cuda):
        W, Y, C = Tensor.from_numpy(w, backend), Tensor.from_numpy(y, backend), Tensor.zeros((m * n,), backend)
        dx = Tensor.zeros((n, k, 1, 1), backend)
        with backend.using_engine(engine):
            backend.set_math("bf16")
            try:
                for step in range(2):
                    dy = Tensor.from_numpy(normal(np.random.default_rng(step), n, k, 1, 1), backend)
                    launches.clear()
                    backend.start_pass()
                    backend.activation_backward(desc, 1.0, Y, dy, Y, 0.0, dx)
                    backend.sgemm(OP_N, OP_N, m, n, k, 1.0, W, m, dx, k, 0.0, C, m)
                    backend.end_pass()
            finally:
                backend.set_math("fp32")
        results[backend.name] = C.numpy()
    conversions = launches["to_bf16"] + launches["to_bf16_x4"]
    assert conversions == (1 if engine == "fast" else 2)  # W; and dx in the slides engine
    assert relative_error(results["cuda"], results["host"]) < FP32_TOLERANCE


@pytest.mark.parametrize("k", [40, 38])  # four channels a thread, and one
def test_activation_bias_backward_writes_the_bf16_copy_that_a_gemm_reads(host, cuda, rng, launches, k):
    """Math bf16 in the fast engine, two passes of dx = f'·dy with db = Σₙ dx, then C = W·dx: in the
    second, dx's bfloat16 copy is written by the summing kernel (no conversion of dx), and the GEMM
    reads the new dx: C and db as on the host."""
    m, n = 24, 33  # C (m × n) = W (m × k) · dx (k × n); 33 samples make several slabs
    desc = ActivationDescriptor(ActivationMode.TANH)
    w, y = normal(rng, m * k), np.tanh(normal(rng, n, k, 1, 1))
    results = {}
    for backend in (host, cuda):
        W, Y, C = Tensor.from_numpy(w, backend), Tensor.from_numpy(y, backend), Tensor.zeros((m * n,), backend)
        dx, db = Tensor.zeros((n, k, 1, 1), backend), Tensor.zeros((k,), backend)
        with backend.using_engine("fast"):
            backend.set_math("bf16")
            try:
                for step in range(2):
                    dy = Tensor.from_numpy(normal(np.random.default_rng(step), n, k, 1, 1), backend)
                    launches.clear()
                    backend.start_pass()
                    backend.activation_bias_backward(desc, Y, dy, dx, db)
                    backend.sgemm(OP_N, OP_N, m, n, k, 1.0, W, m, dx, k, 0.0, C, m)
                    backend.end_pass()
            finally:
                backend.set_math("fp32")
        results[backend.name] = C.numpy(), db.numpy()
    assert launches["to_bf16"] + launches["to_bf16_x4"] == 1  # W
    for ours, theirs in zip(results["cuda"], results["host"]):
        assert relative_error(ours, theirs) < FP32_TOLERANCE


@pytest.mark.gpu
def test_a_buffer_whose_last_reference_goes_inside_a_capture_is_freed_after_it(cuda):
    """A capture is invalidated by cudaFree: a layer replacing its input inside one drops the last
    reference of the evaluation batch's view, and with it that view's bfloat16 copy."""
    from cudnnnet.backends.cuda import bindings

    kept = Tensor.zeros((1024,), cuda)
    doomed = Tensor.zeros((1 << 20,), cuda)
    frees = bindings.calls["cudaFree"]
    with cuda.context.capture() as graph:
        kept.fill_(2.0)
        del doomed
        kept.fill_(3.0)
        frees_inside = bindings.calls["cudaFree"] - frees
    assert frees_inside == 0 and bindings.calls["cudaFree"] - frees == 1
    graph.launch()
    cuda.synchronize()
    np.testing.assert_array_equal(kept.numpy().reshape(-1), np.full(1024, 3.0, np.float32))
