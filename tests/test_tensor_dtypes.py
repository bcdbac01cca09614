"""Tensors of float32, bfloat16 and float16 values (issue 29, item 1): storage of 2 bytes a value for the
16-bit types, every value written rounded to nearest even as the device rounds, ``numpy()`` in float32,
``to(dtype)``, DLPack of the true dtype, and the float32-only verbs refusing a 16-bit tensor.

One test body runs on each backend (the ``backend`` fixture); the CUDA case is marked ``gpu``."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from cudnnnet.backends.descriptors import ActivationDescriptor, ActivationMode, ConvolutionDescriptor, PoolingDescriptor
from cudnnnet.backends.descriptors import BatchNormMode, PoolingMode
from cudnnnet.errors import DTypeError, UsageError
from cudnnnet.precision import BFLOAT16, DTYPES, FLOAT16, FLOAT32, get_dtype
from cudnnnet.tensor import Tensor

HALF_DTYPES = ["bfloat16", "float16"]

# value -> what it becomes in each 16-bit type: round to nearest, ties to even; past the range ±inf
BF16_CASES = [
    (1.0, 1.0),
    (1 + 2**-8, 1.0),  # a tie between 1 and 1 + 2^-7: to the even one, 1
    (1 + 3 * 2**-8, 1 + 2**-6),  # a tie between 1 + 2^-7 and 1 + 2^-6: to the even one
    (1 + 2**-8 + 2**-20, 1 + 2**-7),  # just past the tie
    (-(1 + 2**-8), -1.0),
    (2**-134, 0.0),  # half the smallest bfloat16 subnormal (2^-133): a tie, to 0
    (3 * 2**-134, 2**-132),  # a tie between two subnormals: to the even one
    (2**-133, 2**-133),  # the smallest subnormal is kept
    (3.3895313892515355e38, 3.3895313892515355e38),  # the largest bfloat16
    (3.4028234663852886e38, np.inf),  # float32's largest rounds past bfloat16's
    (-3.4028234663852886e38, -np.inf),
    (np.inf, np.inf),
    (-np.inf, -np.inf),
    (np.nan, np.nan),
    (-0.0, -0.0),
]
FP16_CASES = [
    (1.0, 1.0),
    (1 + 2**-11, 1.0),  # a tie between 1 and 1 + 2^-10: to 1
    (1 + 3 * 2**-11, 1 + 2**-9),  # a tie: to the even one
    (1 + 2**-11 + 2**-20, 1 + 2**-10),
    (2**-25, 0.0),  # half the smallest half subnormal (2^-24): a tie, to 0
    (3 * 2**-25, 2**-23),  # a tie between 2^-24 and 2^-23: to the even one
    (2**-25 + 2**-30, 2**-24),
    (1e-8, 0.0),
    (65504.0, 65504.0),  # the largest half
    (65519.0, 65504.0),
    (65520.0, np.inf),  # the tie between 65504 and 65536: to the even one, past the range
    (1e6, np.inf),
    (-1e6, -np.inf),
    (np.inf, np.inf),
    (np.nan, np.nan),
    (-0.0, -0.0),
]
CASES = {"bfloat16": BF16_CASES, "float16": FP16_CASES}


def edge_cases(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    values, rounded = zip(*CASES[dtype])
    return np.array(values, np.float32), np.array(rounded, np.float32)


def assert_same_values(actual: np.ndarray, expected: np.ndarray) -> None:
    """Equal values, NaN where NaN, and the sign of each zero."""
    actual, expected = actual.reshape(-1), expected.reshape(-1)
    np.testing.assert_array_equal(actual, expected)
    assert np.array_equal(np.signbit(actual), np.signbit(expected))


# ---- a tensor's dtype and storage -----------------------------------------------------------------
def test_a_tensor_is_float32_unless_asked(backend):
    for tensor in (Tensor((2, 3), backend), Tensor.zeros((2, 3), backend), Tensor.from_numpy(np.ones(6), backend)):
        assert tensor.dtype is FLOAT32 and tensor.nbytes == 4 * 6 and tensor.numpy().dtype == np.float32


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_a_16_bit_tensor_holds_two_bytes_a_value(backend, dtype):
    tensor = Tensor.zeros((3, 5), backend, dtype=dtype)
    assert tensor.dtype is get_dtype(dtype) and tensor.nbytes == 2 * 15 and tensor.data.size == 15
    assert f"dtype={dtype!r}" in repr(tensor)
    if backend.name == "host":
        assert tensor.data.dtype == {"bfloat16": np.uint16, "float16": np.float16}[dtype]
    else:
        assert tensor.data.nbytes == 2 * 15
    np.testing.assert_array_equal(tensor.numpy(), np.zeros((3, 5, 1, 1), np.float32))


def test_an_unknown_dtype_is_refused_naming_the_valid_ones(backend):
    with pytest.raises(UsageError, match="invalid tensor dtype 'float64'; valid are float32, bfloat16, float16"):
        Tensor.zeros((2,), backend, dtype="float64")
    with pytest.raises(UsageError, match="neither|or a dtype: float32, bfloat16, float16"):
        Tensor.zeros((2,), backend).to("half")


# ---- rounding on every store ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_from_numpy_rounds_to_nearest_even(backend, dtype):
    values, rounded = edge_cases(dtype)
    tensor = Tensor.from_numpy(values, backend, dtype=dtype)
    assert tensor.dtype is get_dtype(dtype)
    result = tensor.numpy()
    assert result.dtype == np.float32
    assert_same_values(result, rounded)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_to_a_16_bit_dtype_rounds_to_nearest_even(backend, dtype):
    """On CUDA the conversion kernels round (kernels/bf16.cu, fp16.cu); they must agree with the host."""
    values, rounded = edge_cases(dtype)
    converted = Tensor.from_numpy(values, backend).to(dtype)
    assert converted.dtype is get_dtype(dtype) and converted.backend is backend
    assert_same_values(converted.numpy(), rounded)
    assert_same_values(converted.to("float32").numpy(), rounded)  # back to float32: exact


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_write_and_fill_round_to_the_tensor_dtype(backend, dtype):
    values, rounded = edge_cases(dtype)
    tensor = Tensor.zeros(values.shape, backend, dtype=dtype)
    address = tensor.data.ptr if backend.name == "cuda" else tensor.data.__array_interface__["data"][0]
    tensor.write_(values)
    assert_same_values(tensor.numpy(), rounded)
    for value, expected in CASES[dtype]:
        tensor.fill_(value)
        assert_same_values(tensor.numpy(), np.full(values.shape, expected, np.float32))
    assert address == (tensor.data.ptr if backend.name == "cuda" else tensor.data.__array_interface__["data"][0])


@pytest.mark.parametrize("source", list(DTYPES))
@pytest.mark.parametrize("target", list(DTYPES))
def test_to_converts_between_every_pair_of_dtypes(backend, source, target):
    rng = np.random.default_rng(29)
    values = np.concatenate([rng.standard_normal(37).astype(np.float32) * 100, edge_cases("float16")[0],
                             edge_cases("bfloat16")[0]])
    held = Tensor.from_numpy(values, "host", dtype=source).numpy()  # the source's values
    expected = Tensor.from_numpy(held, "host", dtype=target).numpy()  # each rounded once to the target
    original = Tensor.from_numpy(values, backend, dtype=source)
    converted = original.to(target)
    assert converted.dtype is get_dtype(target) and converted is not original
    assert_same_values(converted.numpy(), expected)
    converted.fill_(7.0)  # a new tensor: the original keeps its values
    assert_same_values(original.numpy(), held)


def test_bfloat16_to_float16_rounds_once_from_the_exact_value(backend):
    """bfloat16 1 + 2^-7 is exact in half; 2^-20 is below half's normal range and rounds to its subnormals."""
    values = np.array([1 + 2**-7, 2**-20, 2**-26, 70000.0], np.float32)
    converted = Tensor.from_numpy(values, backend, dtype="bfloat16").to("float16").numpy().reshape(-1)
    np.testing.assert_array_equal(converted, np.array([1 + 2**-7, 2**-20, 0.0, np.inf], np.float32))


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_copy_into_a_16_bit_tensor_rounds_and_keeps_its_storage(backend, dtype):
    values, rounded = edge_cases(dtype)
    target = Tensor.zeros(values.shape, backend, dtype=dtype)
    storage = target.data
    target.copy_(Tensor.from_numpy(values, backend))  # float32 into 16 bits, on one backend
    assert target.data is storage
    assert_same_values(target.numpy(), rounded)
    target.fill_(0.0).copy_(Tensor.from_numpy(values, "host"))  # from the host
    assert_same_values(target.numpy(), rounded)
    wide = Tensor.zeros(values.shape, backend).copy_(target)  # 16 bits into float32: exact
    assert_same_values(wide.numpy(), rounded)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_the_backend_copy_refuses_storage_of_two_dtypes(backend, dtype):
    half, wide = Tensor.zeros((4,), backend, dtype=dtype), Tensor.zeros((4,), backend)
    with pytest.raises(DTypeError, match=f"copy: storage of float32 values cannot be copied into storage of {dtype}"):
        backend.copy(wide.data, half.data, 4)


# ---- sizes and offsets count values of the dtype --------------------------------------------------
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_views_count_offsets_in_values_of_the_dtype(backend, dtype):
    tensor = Tensor.from_numpy(np.arange(11, dtype=np.float32), backend, dtype=dtype)
    view = tensor.view((4,), offset=3)  # an odd offset: 6 bytes into 16-bit storage
    assert view.dtype is tensor.dtype and view.nbytes == 4 * tensor.dtype.itemsize
    np.testing.assert_array_equal(view.numpy().reshape(-1), [3, 4, 5, 6])
    view.fill_(-2.5)
    view.view((2,), offset=1).write_(np.array([8.0, 9.0]))
    np.testing.assert_array_equal(tensor.numpy().reshape(-1), [0, 1, 2, -2.5, 8, 9, -2.5, 7, 8, 9, 10])
    view.copy_(Tensor.from_numpy(np.array([20.0, 21, 22, 23]), backend, dtype=dtype))
    np.testing.assert_array_equal(tensor.numpy().reshape(-1), [0, 1, 2, 20, 21, 22, 23, 7, 8, 9, 10])
    assert tensor.reshape((11, 1)).dtype is tensor.dtype and tensor.item() == 0.0
    with pytest.raises(UsageError, match="does not fit"):
        tensor.view((4,), offset=8)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_a_16_bit_tensor_keeps_its_dtype_on_another_backend(backend, dtype):
    values, rounded = edge_cases(dtype)
    host = Tensor.from_numpy(values, "host", dtype=dtype)
    moved = host.to(backend)
    assert moved.dtype is host.dtype and moved.backend is backend
    assert_same_values(moved.numpy(), rounded)
    assert_same_values(moved.to("host").numpy(), rounded)


# ---- DLPack and the CUDA Array Interface ---------------------------------------------------------
def dlpack_dtype(capsule) -> tuple[int, int, int]:
    """(code, bits, lanes) of a "dltensor" capsule, read with ctypes."""
    from cudnnnet.backends.cuda import dlpack

    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    dtype = dlpack.DLManagedTensor.from_address(get_pointer(capsule, b"dltensor")).dl_tensor.dtype
    return (dtype.code, dtype.bits, dtype.lanes)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, expected", [("float32", (2, 32, 1)), ("bfloat16", (4, 16, 1)),
                                             ("float16", (2, 16, 1))])
def test_dlpack_exports_the_true_dtype_and_imports_it_back(cuda, dtype, expected):
    values = np.arange(12, dtype=np.float32) / 8
    tensor = Tensor.from_numpy(values.reshape(3, 4), cuda, dtype=dtype)
    assert dlpack_dtype(tensor.__dlpack__()) == expected
    shared = Tensor.from_dlpack(tensor, cuda)
    assert shared.dtype is tensor.dtype and shared.data.ptr == tensor.data.ptr and shared.nbytes == tensor.nbytes
    np.testing.assert_array_equal(shared.numpy(), tensor.numpy())


@pytest.mark.gpu
def test_torch_reads_16_bit_tensors_through_dlpack_and_float16_through_the_array_interface(cuda):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    values = np.array([1.0, 1 + 2**-8, -3.5, 2**-20], np.float32)
    for dtype, theirs_dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        ours = Tensor.from_numpy(values, cuda, dtype=dtype)
        theirs = torch.from_dlpack(ours)
        assert theirs.dtype == theirs_dtype and theirs.data_ptr() == ours.data.ptr
        np.testing.assert_array_equal(theirs.float().cpu().numpy().reshape(-1), ours.numpy().reshape(-1))
        back = Tensor.from_dlpack(torch.full((2, 3), 1.5, dtype=theirs_dtype, device="cuda"), cuda)
        assert back.dtype is get_dtype(dtype) and back.numpy().shape == (2, 3, 1, 1)
    half = Tensor.from_numpy(values, cuda, dtype="float16")
    assert half.__cuda_array_interface__["typestr"] == "<f2"
    assert torch.as_tensor(half, device="cuda").dtype == torch.float16


@pytest.mark.gpu
def test_the_array_interface_refuses_bfloat16_pointing_to_dlpack(cuda):
    tensor = Tensor.zeros((4,), cuda, dtype="bfloat16")
    with pytest.raises(DTypeError, match="no typestr for bfloat16.*through DLPack"):
        tensor.__cuda_array_interface__  # noqa: B018


def test_host_dlpack_exports_float16_and_refuses_bfloat16(host):
    values = np.array([0.5, 1 + 2**-11, 65520.0], np.float32)
    half = Tensor.from_numpy(values, host, dtype="float16")
    shared = np.from_dlpack(half)
    assert shared.dtype == np.float16
    np.testing.assert_array_equal(shared.reshape(-1).astype(np.float32), [0.5, 1.0, np.inf])
    back = Tensor.from_dlpack(np.arange(4, dtype=np.float16), host)
    assert back.dtype is FLOAT16
    with pytest.raises(DTypeError, match="bfloat16 tensor on the host cannot be exported through DLPack"):
        np.from_dlpack(Tensor.zeros((3,), host, dtype="bfloat16"))


# ---- the float32-only verbs refuse a 16-bit tensor -----------------------------------------------
RELU = ActivationDescriptor(ActivationMode.RELU)
SPATIAL = BatchNormMode.SPATIAL


def float32_verbs(backend, half):
    """{verb: a call of it with ``half`` (a 16-bit tensor) among float32 operands of the right shapes}."""
    t = lambda *shape: Tensor.zeros(shape, backend)  # noqa: E731
    x, y = t(4, 3, 1, 1), t(4, 3, 1, 1)
    h = half(4, 3, 1, 1)
    conv = ConvolutionDescriptor(2, 3, 1)
    plan = backend.convolution_plan(conv, (4, 3, 1, 1), (4, 2, 1, 1))
    pool = PoolingDescriptor(PoolingMode.MAX, 1)
    state, scale = t(6).fill_(1.0), t(1)
    return {
        "sgemm": lambda: backend.sgemm(0, 0, 3, 4, 1, 1.0, half(3, 1), 3, t(1, 4), 1, 0.0, t(3, 4), 3),
        "sgemm_bias_activation": lambda: backend.sgemm_bias_activation(0, 0, 3, 4, 1, half(3, 1), 3, t(1, 4), 1,
                                                                       t(3, 4), 3, t(3), None),
        "sgemv": lambda: backend.sgemv(0, 3, 4, 1.0, t(12), 3, t(4), 1, 0.0, half(3), 1),
        "saxpy": lambda: backend.saxpy(12, half(1), x, 1, y, 1),
        "sscal": lambda: backend.sscal(12, 2.0, h, 1),
        "scopy": lambda: backend.scopy(12, x, 1, h, 1),
        "activation_forward": lambda: backend.activation_forward(RELU, 1.0, h, 0.0, y),
        "activation_backward": lambda: backend.activation_backward(RELU, 1.0, y, h, x, 0.0, t(4, 3, 1, 1)),
        "softmax_forward": lambda: backend.softmax_forward(1.0, x, 0.0, h),
        "add_tensor": lambda: backend.add_tensor(1.0, half(1, 3, 1, 1), 1.0, y),
        "convolution_forward": lambda: backend.convolution_forward(plan, 1.0, h, t(2, 3, 1, 1), 0.0, t(4, 2, 1, 1)),
        "convolution_backward_data": lambda: backend.convolution_backward_data(plan, 1.0, half(2, 3, 1, 1),
                                                                               t(4, 2, 1, 1), 0.0, x),
        "convolution_backward_filter": lambda: backend.convolution_backward_filter(plan, 1.0, x, half(4, 2, 1, 1),
                                                                                   0.0, t(2, 3, 1, 1)),
        "convolution_backward_bias": lambda: backend.convolution_backward_bias(1.0, h, 0.0, t(1, 3, 1, 1)),
        "pooling_forward": lambda: backend.pooling_forward(pool, 1.0, h, 0.0, y),
        "pooling_backward": lambda: backend.pooling_backward(pool, 1.0, y, h, x, 0.0, t(4, 3, 1, 1)),
        "cross_entropy_loss": lambda: backend.cross_entropy_loss(x, y, half(1)),
        "squared_error_loss": lambda: backend.squared_error_loss(h, y, t(1)),
        "accuracy_count": lambda: backend.accuracy_count(x, h, t(1)),
        "record_nonfinite": lambda: backend.record_nonfinite(t(2), half(1)),
        "gather_batch": lambda: backend.gather_batch(t(5, 3), t(5), half(5), t(1), t(2, 3), t(2, 3)),
        "gather_augmented_batch": lambda: backend.gather_augmented_batch(t(5, 1, 2, 2), t(5), t(5), t(1), half(2),
                                                                         t(2, 1, 2, 2), t(2, 3), 0, False, 1),
        "sgd_update": lambda: backend.sgd_update(x, h, None, 0.1, 0.0, 0.0),
        "bias_activation_forward": lambda: backend.bias_activation_forward(RELU, half(3), y),
        "activation_bias_backward": lambda: backend.activation_bias_backward(RELU, y, h, x, t(3)),
        "cross_entropy_backward": lambda: backend.cross_entropy_backward(x, y, h, t(1), t(1)),
        "softmax_cross_entropy_backward": lambda: backend.softmax_cross_entropy_backward(x, y, t(4, 3, 1, 1), h,
                                                                                         t(1), t(1)),
        "softmax_cross_entropy_metrics": lambda: backend.softmax_cross_entropy_metrics(x, y, t(1), half(1), 1.0),
        "sgd_update_many": lambda: backend.sgd_update_many([(x, y, None)], half(1), 0.0, 0.0),
        "adam_update_many": lambda: backend.adam_update_many([(x, y, h, t(4, 3, 1, 1))], scale, t(2), 0.9, 0.999,
                                                             1e-8, 0.0, False),
        "find_nonfinite_gradients": lambda: backend.find_nonfinite_gradients(h, state),
        "update_loss_scale": lambda: backend.update_loss_scale(half(6), 10, 1.0, 2.0**24),
        "dropout_forward": lambda: backend.dropout_forward(state_of(backend), reserve_of(backend), h, y),
        "dropout_backward": lambda: backend.dropout_backward(state_of(backend), reserve_of(backend), y, h),
        "batch_norm_forward_training": lambda: backend.batch_norm_forward_training(
            SPATIAL, h, y, t(1, 3, 1, 1), t(1, 3, 1, 1), 0.1, t(1, 3, 1, 1), t(1, 3, 1, 1), 1e-5, t(1, 3, 1, 1),
            t(1, 3, 1, 1)),
        "batch_norm_forward_inference": lambda: backend.batch_norm_forward_inference(
            SPATIAL, x, y, half(1, 3, 1, 1), t(1, 3, 1, 1), t(1, 3, 1, 1), t(1, 3, 1, 1), 1e-5),
        "batch_norm_backward": lambda: backend.batch_norm_backward(
            SPATIAL, x, h, t(4, 3, 1, 1), t(1, 3, 1, 1), t(1, 3, 1, 1), t(1, 3, 1, 1), 1e-5, t(1, 3, 1, 1),
            t(1, 3, 1, 1)),
    }


def state_of(backend):
    return backend.dropout_state(0.5, 1)


def reserve_of(backend):
    return backend.dropout_reserve(state_of(backend), (4, 3, 1, 1))


VERBS = [
    "sgemm", "sgemm_bias_activation", "sgemv", "saxpy", "sscal", "scopy", "activation_forward", "activation_backward", "softmax_forward",
    "add_tensor", "convolution_forward", "convolution_backward_data", "convolution_backward_filter",
    "convolution_backward_bias", "pooling_forward", "pooling_backward", "cross_entropy_loss", "squared_error_loss",
    "accuracy_count", "record_nonfinite", "gather_batch", "gather_augmented_batch", "sgd_update",
    "bias_activation_forward", "activation_bias_backward", "cross_entropy_backward", "softmax_cross_entropy_backward",
    "softmax_cross_entropy_metrics", "sgd_update_many", "adam_update_many", "find_nonfinite_gradients",
    "update_loss_scale", "dropout_forward", "dropout_backward", "batch_norm_forward_training",
    "batch_norm_forward_inference", "batch_norm_backward"]


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("verb", VERBS)
def test_a_float32_verb_refuses_a_16_bit_tensor_naming_itself_and_the_dtype(backend, verb, dtype):
    made = []

    def half(*shape):
        tensor = Tensor.from_numpy(np.full(shape, 3.0, np.float32), backend, dtype=dtype)
        made.append(tensor)
        return tensor

    call = float32_verbs(backend, half)[verb]
    with pytest.raises(DTypeError, match=f"^{verb} takes float32 tensors only( under math fp32)?, got a {dtype} "
                                         f"tensor of shape"):
        call()
    for tensor in made:  # refused before anything was written
        np.testing.assert_array_equal(tensor.numpy(), np.full(tensor.shape, 3.0, np.float32))


def test_every_verb_checked_in_the_base_template_is_tried():
    """A verb whose public face checks its arguments and calls ``_verb`` is in VERBS (so a new one is too)."""
    from cudnnnet.backends.base import Backend

    assert {name[1:] for name in Backend.__abstractmethods__ if name.startswith("_")} == set(VERBS)


def test_storage_of_another_type_or_a_dtype_it_does_not_hold_is_refused(host):
    with pytest.raises(UsageError, match="host storage holds float32, float16 or uint16 .* got float64"):
        Tensor((2,), host, np.zeros(2))
    with pytest.raises(UsageError, match="storage of float16 values cannot make a bfloat16 tensor"):
        Tensor((2,), host, np.zeros(2, np.float16), dtype=BFLOAT16)
