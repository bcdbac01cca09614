"""Multilayer perceptrons under math bf16 and fp16 keep their activations and their gradients in 16 bits
(issue 29, item 2): Dense, Activation and the loss layers store bfloat16 (bf16) or float16 (fp16), the
weights, their gradients and the loss stay float32; any other network keeps float32 activations."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from cudnnnet import Network, Tensor
from cudnnnet.backends.base import OP_N, OP_T
from cudnnnet.backends.descriptors import ACTIVATION_MODES, ActivationDescriptor, ActivationMode
from cudnnnet.backends.rounding import round_to
from cudnnnet.engine import get_engine
from cudnnnet.errors import DTypeError, ShapeError, UsageError
from cudnnnet.layers import MSE, Activation, Dense, Softmax
from cudnnnet.precision import BFLOAT16, FLOAT16, FLOAT32, get_precision

HALF_MATHS = {"bf16": BFLOAT16, "fp16": FLOAT16}


def mlp(backend, engine: str, math: str | None, loss=Softmax) -> Network:
    return Network([Dense("fc1", 24), Activation("relu1", "relu"), Dense("fc2", 10), loss("loss")],
                   backend=backend, engine=engine, math=math)


def batch(backend, n: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 1, 5, 5)).astype(np.float32)
    target = np.eye(10, dtype=np.float32)[rng.integers(0, 10, n)].reshape(n, 10, 1, 1)
    return x, Tensor.from_numpy(target, backend)


def dtypes(network: Network) -> list:
    return [(layer.name, layer.output.dtype, layer.grad_input.dtype) for layer in network.layers]


# ---- storage: which dtype each buffer holds ------------------------------------------------------------------
@pytest.mark.parametrize("loss", [Softmax, MSE])
@pytest.mark.parametrize("math", list(HALF_MATHS))
def test_an_mlp_stores_activations_and_gradients_in_the_maths_16_bits(backend, engine, math, loss):
    network = mlp(backend, engine, math, loss)
    x, target = batch(backend)
    network.train_step(x, target, 0.1)
    half = HALF_MATHS[math]
    assert dtypes(network) == [("fc1", half, half), ("relu1", half, half), ("fc2", half, half),
                               ("loss", FLOAT32, half)]
    assert network.layers[-1].loss_gradient.dtype is FLOAT32  # the loss computes in float32
    for parameter in network.parameter_list():
        assert parameter.value.dtype is FLOAT32 and parameter.grad.dtype is FLOAT32


class Float32Activation(Activation):
    """A layer that does not store 16 bits (every layer type of the package does now)."""

    stores_16_bits = False


def test_a_network_with_a_layer_that_does_not_store_16_bits_keeps_float32_activations(backend):
    network = Network([Dense("fc1", 12), Float32Activation("relu", "relu"), Dense("fc", 10), Softmax("softmax")],
                      backend=backend, math="bf16")
    x, target = batch(backend)
    network.forward(x)
    network.backward(target)
    assert {dtype for _, *pair in dtypes(network) for dtype in pair} == {FLOAT32}


def test_the_activations_take_2_bytes_a_value(host):
    """A bf16 MLP's activation buffers are half the bytes of the fp32 MLP's."""
    nbytes = {}
    for math in ("fp32", "bf16"):
        network = mlp(host, "slides", math)
        x, target = batch(host, n=16)
        network.train_step(x, target, 0.1)
        nbytes[math] = sum(layer.output.nbytes + layer.grad_input.nbytes for layer in network.layers[:-1])
    assert nbytes["bf16"] * 2 == nbytes["fp32"]


def test_switching_the_math_switches_the_buffers_and_keeps_each_dtypes_own(backend):
    """fp32 → bf16 → fp32 → bf16: float32 buffers come back in fp32, and each dtype's buffers are the
    same objects every time (a captured graph's addresses stay fixed per batch shape and dtype)."""
    network = mlp(backend, "slides", "fp32")
    x, target = batch(backend)
    seen = {}
    for math in ("fp32", "bf16", "fp32", "bf16"):
        network.set_math(math)
        network.train_step(x, target, 0.1)
        buffers = [(layer.output, layer.grad_input) for layer in network.layers]
        assert {tensor.dtype for pair in buffers[:-1] for tensor in pair} == {get_precision(math).activation_dtype}
        if math in seen:
            assert all(a is b for pair, earlier in zip(buffers, seen[math]) for a, b in zip(pair, earlier))
        seen[math] = buffers


def test_a_float32_input_is_converted_once_into_the_networks_buffer_and_a_16_bit_one_read_as_it_is(backend):
    network = mlp(backend, "slides", "bf16")
    x, _ = batch(backend)
    network.forward(x)
    first = network.layers[0].input
    assert first.dtype is BFLOAT16
    np.testing.assert_array_equal(first.numpy(), round_to(BFLOAT16, x))
    network.forward(x)
    assert network.layers[0].input is first
    x16 = Tensor.from_numpy(x, backend, dtype=BFLOAT16)
    network.forward(x16)
    assert network.layers[0].input is x16
    network.set_math("fp32").forward(x16)
    assert network.layers[0].input.dtype is FLOAT32  # a 16-bit input to a float32 network: its values in float32
    np.testing.assert_array_equal(network.layers[0].input.numpy(), x16.numpy())


# ---- the verbs: a 16-bit result is the float32 one rounded once -------------------------------------------
def bf16_steps_apart(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How many bfloat16 values lie between a and b (both bfloat16 values)."""
    def ordered(values):
        bits = (values.astype(np.float32).view(np.int32) >> 16).astype(np.int64)
        return np.where(bits < 0, -(bits & 0x7FFF), bits)
    return np.abs(ordered(a) - ordered(b))


def test_a_16_bit_c_is_the_float32_product_rounded_once(backend, rng=np.random.default_rng(3)):
    """sgemm with A, B and C bfloat16 (beta 1: C read too) stores what a float32 C would hold, rounded:
    exactly on the host; on the GPU at most one step from it (a sum near a rounding boundary)."""
    m, n, k = 33, 17, 64
    a, b, c = (rng.standard_normal(size).astype(np.float32) for size in (m * k, k * n, m * n))
    with backend.using(math="bf16"):
        A, B = (Tensor.from_numpy(v, backend, dtype=BFLOAT16) for v in (a, b))
        C16, C32 = Tensor.from_numpy(c, backend, dtype=BFLOAT16), Tensor.from_numpy(round_to(BFLOAT16, c), backend)
        for C in (C16, C32):
            backend.sgemm(OP_T, OP_N, m, n, k, 0.5, A, k, B, k, 1.0, C, m)
    expected = round_to(BFLOAT16, C32.numpy())
    apart = bf16_steps_apart(C16.numpy(), expected)
    assert apart.max() <= (0 if backend.name == "host" else 1)
    assert np.mean(apart == 0) > 0.95


@pytest.mark.parametrize("trans, incx, incy", [(OP_N, 1, 1), (OP_T, 1, 1), (OP_N, 2, 3), (OP_T, 3, 2)])
def test_the_gemm_a_16_bit_sgemv_runs_on_cuda_is_the_sgemv(host, trans, incx, incy):
    """cublasSgemv reads float32 only: CUDA runs a 16-bit sgemv as the GEMM yᵀ = xᵀ·op(A)ᵀ
    (cuda.backend.sgemv_as_gemm); on the host oracle that GEMM gives the sgemv's values."""
    from cudnnnet.backends.cuda.backend import sgemv_as_gemm

    rng = np.random.default_rng(7)
    m, n, lda = 5, 7, 6
    rows, cols = (m, n) if trans == OP_N else (n, m)
    A = Tensor.from_numpy(rng.standard_normal(lda * n).astype(np.float32), host)
    x = Tensor.from_numpy(rng.standard_normal(incx * cols).astype(np.float32), host)
    start = rng.standard_normal(incy * rows).astype(np.float32)
    by_sgemv, by_gemm = Tensor.from_numpy(start, host), Tensor.from_numpy(start, host)
    host.sgemv(trans, m, n, 0.5, A, lda, x, incx, 2.0, by_sgemv, incy)
    transa, transb, gemm_m, gemm_n, k = sgemv_as_gemm(trans, m, n, incx, incy)
    host.sgemm(transa, transb, gemm_m, gemm_n, k, 0.5, x, incx, A, lda, 2.0, by_gemm, incy)
    np.testing.assert_allclose(by_gemm.numpy(), by_sgemv.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["relu", "sigmoid", "tanh", "elu"])
@pytest.mark.parametrize("math", list(HALF_MATHS))
def test_a_16_bit_activation_rounds_f_and_its_gradient_once(backend, engine, math, mode):
    dtype = HALF_MATHS[math]
    rng = np.random.default_rng(5)
    x, dy = (round_to(dtype, rng.standard_normal((6, 7, 1, 1)).astype(np.float32)) for _ in range(2))
    desc = ActivationDescriptor(ActivationMode(ACTIVATION_MODES[mode]), 1.0)
    with backend.using(math=math):
        X, DY = (Tensor.from_numpy(v, backend, dtype=dtype) for v in (x, dy))
        Y, DX = Tensor(X.shape, backend, dtype=dtype), Tensor(X.shape, backend, dtype=dtype)
        backend.activation_forward(desc, 1.0, X, 0.0, Y)
        backend.activation_backward(desc, 1.0, Y, DY, X, 0.0, DX)
    with backend.using(math="fp32"):
        Y32, DX32 = Tensor(X.shape, backend), Tensor(X.shape, backend)
        x32, dy32 = Tensor.from_numpy(x, backend), Tensor.from_numpy(dy, backend)
        backend.activation_forward(desc, 1.0, x32, 0.0, Y32)
        backend.activation_backward(desc, 1.0, Tensor.from_numpy(Y.numpy(), backend), dy32, x32, 0.0, DX32)
    tolerance = 0 if backend.name == "host" else 2 ** -7  # cuDNN's f may differ from NumPy's in float32's last bits
    np.testing.assert_allclose(Y.numpy(), round_to(dtype, Y32.numpy()), rtol=tolerance, atol=tolerance * 1e-3)
    np.testing.assert_allclose(DX.numpy(), round_to(dtype, DX32.numpy()), rtol=tolerance, atol=tolerance * 1e-3)


@pytest.mark.parametrize("channels", [24, 12])  # 24: eight values a thread on CUDA (16-byte loads), 12: one
@pytest.mark.parametrize("mode", ["sigmoid", "tanh"])
@pytest.mark.parametrize("math", list(HALF_MATHS))
def test_the_fused_16_bit_bias_activation_and_bias_gradient_are_the_float32_ones_rounded(backend, math, mode,
                                                                                          channels):
    """y = f(y + b) and dx = f'(y)·dy of 16-bit y, dy are the float32 calls' results on the same stored
    values, rounded once; db (float32) sums dx before its rounding, in the float32 call's order."""
    dtype = HALF_MATHS[math]
    rng = np.random.default_rng(6)
    before, dy = (round_to(dtype, rng.standard_normal((37, channels, 1, 1)).astype(np.float32)) for _ in range(2))
    bias = Tensor.from_numpy(rng.standard_normal((1, channels, 1, 1)).astype(np.float32), backend)
    desc = ActivationDescriptor(ActivationMode(ACTIVATION_MODES[mode]), 0.0)
    with backend.using(math=math):
        y, DY = (Tensor.from_numpy(v, backend, dtype=dtype) for v in (before, dy))
        dx, db = Tensor(y.shape, backend, dtype=dtype), Tensor(bias.shape, backend)
        backend.bias_activation_forward(desc, bias, y)
        backend.activation_bias_backward(desc, y, DY, dx, db)
    with backend.using(math="fp32"):
        y32 = Tensor.from_numpy(before, backend)
        backend.bias_activation_forward(desc, bias, y32)
        stored_y = Tensor.from_numpy(y.numpy(), backend)
        dx32, db32 = Tensor(y.shape, backend), Tensor(bias.shape, backend)
        backend.activation_bias_backward(desc, stored_y, Tensor.from_numpy(dy, backend), dx32, db32)
    np.testing.assert_array_equal(y.numpy(), round_to(dtype, y32.numpy()))
    np.testing.assert_array_equal(dx.numpy(), round_to(dtype, dx32.numpy()))
    np.testing.assert_array_equal(db.numpy(), db32.numpy())


# ---- the fast engine's GEMM epilogue: y = f(Wᵀx + b) in one cuBLASLt call --------------------------------------
def epilogue_operands(backend, dtype, rng, m: int = 40, n: int = 24, k: int = 72):
    """A Dense forward's operands: W float32 (k × m, column-major), x of ``dtype`` (k × n), a float32 bias of m
    values most of which ``dtype`` does not hold, and a zeroed 16-bit C (m × n); with their NumPy values."""
    w = rng.standard_normal(m * k).astype(np.float32) / np.sqrt(k)
    x = round_to(dtype, rng.standard_normal(n * k).astype(np.float32))
    b = (rng.standard_normal(m) + 1 / 3).astype(np.float32)
    tensors = (Tensor.from_numpy(w, backend), Tensor.from_numpy(x, backend, dtype=dtype),
               Tensor.from_numpy(b, backend), Tensor.zeros((n, m, 1, 1), backend, dtype=dtype))
    return tensors, (w, x, b)


def epilogue_expected(dtype, w, x, b, relu: bool, m: int = 40, n: int = 24, k: int = 72, bias_rounded: bool = True):
    """h(f(acc + h(b))) as an (n, m) array: acc the float32 product of the 16-bit operands."""
    acc = round_to(dtype, w).reshape(m, k) @ x.reshape(n, k).T  # op(A) = Wᵀ (m × k), B = x (k × n)
    values = acc + (round_to(dtype, b) if bias_rounded else b).reshape(m, 1)
    return round_to(dtype, np.maximum(values, np.float32(0)) if relu else values).T


def steps_apart(a: np.ndarray, b: np.ndarray, dtype) -> np.ndarray:
    """How many representable 16-bit values lie between a and b (both of ``dtype``), elementwise."""
    if dtype is FLOAT16:
        ordered = [v.astype(np.float16).view(np.int16).astype(np.int64) for v in (a, b)]
        ordered = [np.where(v < 0, -(v & 0x7FFF), v) for v in ordered]
        return np.abs(ordered[0] - ordered[1])
    return bf16_steps_apart(a, b)


@pytest.mark.parametrize("relu", [True, False], ids=["relu", "none"])
@pytest.mark.parametrize("math", list(HALF_MATHS))
def test_sgemm_bias_activation_adds_the_bias_in_cs_16_bits_and_rounds_once(backend, math, relu):
    """C = h(f(acc + h(b))), what cuBLASLt's epilogue computes with a bias of C's type: exactly on the host;
    on the GPU at most one step from it (a sum near a rounding boundary)."""
    dtype, rng = HALF_MATHS[math], np.random.default_rng(12)
    (W, X, B, C), (w, x, b) = epilogue_operands(backend, dtype, rng)
    desc = ActivationDescriptor(ActivationMode.RELU, 0.0) if relu else None
    with backend.using(engine="fast", math=math):
        backend.sgemm_bias_activation(OP_T, OP_N, 40, 24, 72, W, 72, X, 72, C, 40, B, desc)
    got, expected = C.numpy().reshape(24, 40), epilogue_expected(dtype, w, x, b, relu)
    assert not np.array_equal(expected, epilogue_expected(dtype, w, x, b, relu, bias_rounded=False))
    apart = steps_apart(got, expected, dtype)
    assert apart.max() <= (0 if backend.name == "host" else 1)
    assert np.mean(apart == 0) > 0.95


@pytest.mark.gpu
@pytest.mark.parametrize("math", list(HALF_MATHS))
def test_where_cublaslt_has_no_algorithm_for_the_epilogue_the_gpu_computes_the_same(cuda, math, monkeypatch):
    """Where cuBLASLt offers no algorithm for the epilogue, the GEMM into float32 and our
    bias_activation_to_half kernel give the epilogue's arithmetic, h(f(acc + h(b)))."""
    from cudnnnet.backends.cuda import kernel

    dtype, rng = HALF_MATHS[math], np.random.default_rng(13)
    (W, X, B, C), (w, x, b) = epilogue_operands(cuda, dtype, rng)
    gemm = cuda._gemm
    monkeypatch.setattr(gemm, "run", lambda problem, *args: False if problem.epilogue else
                        type(gemm).run(gemm, problem, *args))
    kernel.reset_launches()
    with cuda.using(engine="fast", math=math):
        cuda.sgemm_bias_activation(OP_T, OP_N, 40, 24, 72, W, 72, X, 72, C, 40, B, ActivationDescriptor(
            ActivationMode.RELU, 0.0))
    cuda.synchronize()
    assert kernel.launches["bias_activation_to_half"] == 1
    apart = steps_apart(C.numpy().reshape(24, 40), epilogue_expected(dtype, w, x, b, True), dtype)
    assert apart.max() <= 1 and np.mean(apart == 0) > 0.95


def test_sgemm_bias_activation_refuses_a_float32_c_another_activation_and_a_short_bias(backend):
    rng = np.random.default_rng(14)
    (W, X, B, C), _ = epilogue_operands(backend, BFLOAT16, rng)
    tanh = ActivationDescriptor(ActivationMode.TANH, 0.0)
    C32 = Tensor.zeros(C.shape, backend)
    with backend.using(engine="fast", math="bf16"):
        with pytest.raises(DTypeError, match="^sgemm_bias_activation writes a 16-bit C .*got a float32 C; use sgemm"):
            backend.sgemm_bias_activation(OP_T, OP_N, 40, 24, 72, W, 72, X, 72, C32, 40, B, None)
        with pytest.raises(UsageError, match="^sgemm_bias_activation applies a ReLU or no activation .*got tanh"):
            backend.sgemm_bias_activation(OP_T, OP_N, 40, 24, 72, W, 72, X, 72, C, 40, B, tanh)
        with pytest.raises(ShapeError, match=r"^sgemm_bias_activation: the bias must hold one value per row of C "
                                             r"\(40\), got shape \(39, 1, 1, 1\)"):
            backend.sgemm_bias_activation(OP_T, OP_N, 40, 24, 72, W, 72, X, 72, C, 40, B.view((39,)), None)
    assert not C.numpy().any() and not C32.numpy().any()


@pytest.mark.parametrize("engine_name, math, epilogues", [("fast", "bf16", 2), ("fast", "fp16", 2),
                                                          ("fast", "fp32", 0), ("slides", "bf16", 0)])
def test_the_fast_engines_16_bit_dense_takes_the_epilogue_where_relu_or_nothing_follows(host, monkeypatch,
                                                                                        engine_name, math, epilogues):
    """fc1 → ReLU and fc3 → Softmax run in the GEMM's epilogue; fc2 → tanh keeps the GEMM and our bias kernel."""
    calls = {}
    for verb in ("sgemm", "sgemm_bias_activation", "bias_activation_forward"):
        def counted(*args, _verb=verb, _call=getattr(host, verb)):
            calls[_verb] = calls.get(_verb, 0) + 1
            return _call(*args)
        monkeypatch.setattr(host, verb, counted)
    network = Network([Dense("fc1", 24), Activation("relu1", "relu"), Dense("fc2", 16), Activation("tanh2", "tanh"),
                       Dense("fc3", 10), Softmax("loss")], backend=host, engine=engine_name, math=math)
    x, _ = batch(host)
    network.forward(Tensor.from_numpy(x, host))
    fused = engine_name == "fast"
    assert calls.get("sgemm_bias_activation", 0) == epilogues
    assert calls.get("bias_activation_forward", 0) == (3 - epilogues if fused else 0)
    assert calls.get("sgemm", 0) == (3 - epilogues if fused else 6)  # the slides engine: product and rank-1 bias


# ---- the refusals that remain ---------------------------------------------------------------------------------
def test_16_bit_tensors_are_refused_where_a_verb_takes_float32_or_another_type(backend):
    x16 = Tensor.from_numpy(np.ones((4, 3, 1, 1), np.float32), backend, dtype=BFLOAT16)
    h16 = Tensor.from_numpy(np.ones((4, 3, 1, 1), np.float32), backend, dtype=FLOAT16)
    y32 = Tensor.from_numpy(np.ones((4, 3, 1, 1), np.float32), backend)
    relu = ActivationDescriptor(ActivationMode(ACTIVATION_MODES["relu"]), 0.0)
    with backend.using(math="bf16"):
        with pytest.raises(DTypeError, match=r"^sgemm takes float32 or bfloat16 tensors under math bf16, got a "
                                             r"float16 tensor of shape \(4, 3, 1, 1\)"):
            backend.sgemm(OP_N, OP_T, 3, 3, 4, 1.0, h16, 3, y32, 3, 0.0, y32, 3)
        with pytest.raises(DTypeError, match="^activation_forward: its tensors must hold values of one dtype"):
            backend.activation_forward(relu, 1.0, x16, 0.0, y32)
        with pytest.raises(DTypeError, match="^softmax_forward takes float32 tensors only, got a bfloat16"):
            backend.softmax_forward(1.0, y32, 0.0, x16)
        with pytest.raises(DTypeError, match="^bias_activation_forward takes float32 tensors only, got a bfloat16"):
            backend.bias_activation_forward(relu, Tensor.from_numpy(np.ones(3, np.float32), backend, dtype=BFLOAT16),
                                            x16)
        with pytest.raises(DTypeError, match="^sgemv takes float32 tensors only, got a bfloat16"):
            backend.sgemv(OP_N, 3, 4, 1.0, y32, 3, y32, 1, 0.0, x16, 1)
        with pytest.raises(DTypeError, match="^saxpy takes float32 tensors only, got a bfloat16"):
            backend.saxpy(12, 1.0, x16, 1, y32, 1)
    np.testing.assert_array_equal(x16.numpy(), 1.0)  # nothing written


# ---- training: the host oracle learns in 16 bits --------------------------------------------------------------
def test_a_bf16_mlp_learns_mnist_on_the_host(host, mnist_dir):
    """400 SGD steps of the original's MLP (784 → 500 → ReLU → 10) in bf16, activations in bfloat16: over
    91 % of 2000 test images right (92.8 % in fp32, 92.75 % in bf16 when written)."""
    from cudnnnet.data.mnist import read_images, read_labels

    def split(prefix: str, count: int):
        images = read_images(mnist_dir / f"{prefix}-images-idx3-ubyte.gz")[:count].astype(np.float32) / 255.0
        return ((images - 0.1307) / 0.3081).reshape(count, 1, 28, 28), read_labels(
            mnist_dir / f"{prefix}-labels-idx1-ubyte.gz")[:count]

    images, labels = split("train", 400 * 64)
    test_images, test_labels = split("t10k", 2000)
    network = Network([Dense("fc1", 500), Activation("relu1", "relu"), Dense("fc2", 10), Softmax("softmax")],
                      backend=host, engine="fast", math="bf16")
    for step in range(400):
        chunk = slice(64 * step, 64 * step + 64)
        network.train_step(images[chunk], np.eye(10, dtype=np.float32)[labels[chunk]], 0.1)
    assert network.layers[0].output.dtype is BFLOAT16
    predicted = network.predict(test_images).numpy().reshape(2000, 10).argmax(axis=1)
    assert np.mean(predicted == test_labels) > 0.91


# ---- the CUDA launches of the 16-bit kernels, on host-side fakes ---------------------------------------------
class LaunchRecorder:
    """The face of a CUDA context the activation kernels and the fused softmax read: each launch is kept."""

    def __init__(self):
        self.launches = []
        self.stream = SimpleNamespace(handle=0)

    def kernel(self, name: str):
        return SimpleNamespace(launch=lambda blocks, stream, *arguments: self.launches.append((name, arguments)))

    def is_capturing(self) -> bool:
        return False


def fake16(shape, address: int, dtype=BFLOAT16):
    size = int(np.prod(shape))
    n, c, h, w = shape
    return SimpleNamespace(shape=shape, n=n, c=c, h=h, w=w, size=size, sample_size=c * h * w, dtype=dtype,
                           data=SimpleNamespace(ptr=address, size=size))


@pytest.mark.parametrize("channels, forward, summed", [
    (24, "bias_activation_forward16_dense8", "activation_bias_backward16_x8"),  # C a multiple of 8: 16-byte loads
    (12, "bias_activation_forward16", "activation_bias_backward16")])
@pytest.mark.parametrize("dtype, code", [(BFLOAT16, 1), (FLOAT16, 2)])
def test_the_16_bit_kernels_are_launched_with_their_declared_arguments_and_format(dtype, code, channels, forward,
                                                                                  summed):
    """Each 16-bit twin gets as many arguments as kernel.KERNELS declares for it (test_kernel_signatures
    checks those against the .cu files), the last its format: 1 bfloat16, 2 IEEE half; eight values a
    thread where C is a multiple of 8."""
    from ctypes import c_float, c_int, c_longlong, c_void_p

    from cudnnnet.backends.cuda.activation_kernels import ActivationKernels
    from cudnnnet.backends.cuda.backend import CudaBackend
    from cudnnnet.backends.cuda.kernel import KERNELS

    context = LaunchRecorder()
    kernels = ActivationKernels(context)
    relu = ActivationDescriptor(ActivationMode(ACTIVATION_MODES["relu"]), 0.0)
    y, dy, dx = (fake16((4, channels, 1, 1), address, dtype) for address in (0x1000, 0x2000, 0x3000))
    bias = fake16((channels, 1, 1, 1), 0x4000, FLOAT32)
    kernels.bias_forward(relu, bias, y, None)
    kernels.backward(relu, 1.0, y, dy, y, 0.0, dx, None)
    kernels.bias_backward(relu, y, dy, dx, bias, None)
    backend = object.__new__(CudaBackend)
    backend.context, backend._stream = context, 0
    logits, target, scalars = fake16((4, 10, 1, 1), 0x5000, dtype), fake16((4, 10, 1, 1), 0x6000, FLOAT32), \
        fake16((1, 1, 1, 1), 0x7000, FLOAT32)
    backend._softmax_cross_entropy(logits, target, 0x8000, 0x9000, scalars, scalars, 0.25, 0.25)
    names = [name for name, _ in context.launches]
    assert names == [forward, "activation_backward16", summed, "softmax_cross_entropy_backward16"]
    python_types = {c_void_p: (int, type(None)), c_int: int, c_longlong: int, c_float: float}
    for name, arguments in context.launches:
        declared = KERNELS[name][1]
        assert len(arguments) == len(declared), name
        assert all(isinstance(value, python_types[kind]) for value, kind in zip(arguments, declared)), name
        assert arguments[-1] == code, name


class SlidesContext(LaunchRecorder):
    """A CUDA context's face for the slides engine's library calls: descriptors name their data type,
    16-bit operands and conversions are recorded."""

    def __init__(self):
        super().__init__()
        self.descriptor_types, self.conversions = [], []
        self.cudnn = SimpleNamespace(handle=0)
        self.descriptors = SimpleNamespace(tensor=self._tensor, activation=lambda desc: SimpleNamespace(handle=0))
        self.half = SimpleNamespace(operands=self._operands, to_float=self._to_float)

    def _tensor(self, shape, data_type=None):
        from cudnnnet.backends.cuda.bindings import cudnn

        self.descriptor_types.append(cudnn.DATA_FLOAT if data_type is None else data_type)
        return SimpleNamespace(handle=0)

    def _operands(self, *operands, output: int = 0, fmt):
        return [tensor.data.ptr if tensor.dtype is fmt.dtype else 0xC0 for tensor, _ in operands]

    def _to_float(self, out, source, alpha, beta, count, fmt):
        self.conversions.append((out, source, count, fmt.dtype))

    def finish_warm_up(self) -> None:
        pass

    def scalar(self, value):
        return value

    def workspace(self, nbytes: int) -> int:
        return 0xF000


def slides_backend(precision: str):
    from cudnnnet.backends.cuda.backend import CudaBackend

    backend = object.__new__(CudaBackend)
    backend.context, backend._stream, backend._cublas = SlidesContext(), 0, 0
    backend._default_precision, backend._default_engine = get_precision(precision), get_engine("slides")
    return backend


@pytest.mark.parametrize("math", list(HALF_MATHS))
def test_the_slides_engine_gives_cublas_and_cudnn_the_16_bit_types(monkeypatch, math):
    """A 16-bit C is cublasGemmEx's C of that type; a 16-bit sgemv is a cublasGemmEx with a float32 C;
    cuDNN's activation calls get 16-bit descriptors; the softmax converts 16-bit logits into its
    workspace and reads them there."""
    from cudnnnet.backends.cuda import backend as cuda_backend
    from cudnnnet.backends.cuda.bindings import cublas, cudnn
    from cudnnnet.backends.cuda.low_precision import HALF_FORMATS

    dtype = HALF_MATHS[math]
    fmt = HALF_FORMATS[dtype]
    calls = []
    monkeypatch.setattr(cuda_backend.cublas, "gemm_ex", lambda *arguments: calls.append(("gemm_ex", arguments)))
    monkeypatch.setattr(cuda_backend.cudnn, "activation_forward", lambda *arguments: calls.append(("act", arguments)))
    monkeypatch.setattr(cuda_backend.cudnn, "softmax_forward", lambda *arguments: calls.append(("softmax", arguments)))
    backend = slides_backend(math)
    w, ones, bias = fake16((10, 24, 1, 1), 0x100, FLOAT32), fake16((4, 1, 1, 1), 0x200, FLOAT32), \
        fake16((10, 1, 1, 1), 0x300, FLOAT32)
    x, y, dy = fake16((4, 24, 1, 1), 0x400, dtype), fake16((4, 10, 1, 1), 0x500, dtype), \
        fake16((4, 10, 1, 1), 0x600, dtype)
    probabilities = fake16((4, 10, 1, 1), 0x700, FLOAT32)
    backend._sgemm(OP_T, OP_N, 10, 4, 24, 1.0, w, 24, x, 24, 0.0, y, 10)
    backend._sgemv(OP_N, 10, 4, 1.0, dy, 10, ones, 1, 0.0, bias, 1)
    backend._activation_forward(ActivationDescriptor(ActivationMode(ACTIVATION_MODES["relu"]), 0.0), 1.0, y, 0.0, y)
    backend._softmax_forward(1.0, y, 0.0, probabilities)
    (_, product), (_, bias_sum), (_, activation), (_, softmax) = calls
    # (handle, transa, transb, m, n, k, alpha, a, a_type, lda, b, b_type, ldb, beta, c, c_type, ldc, compute, algo)
    assert product[7:9] == (0xC0, fmt.cublas_type) and product[10:12] == (0x400, fmt.cublas_type)
    assert product[14:16] == (0x500, fmt.cublas_type)
    assert bias_sum[1:6] == (OP_N, OP_T, 1, 10, 4) and bias_sum[10] == 0x600 and bias_sum[14:16] == (0x300, cublas.R_32F)
    assert backend.context.descriptor_types[0] == fmt.cudnn_type and activation[4] == activation[7] == 0x500
    assert backend.context.conversions == [(0xF000, 0x500, 40, dtype)]
    assert backend.context.descriptor_types[-1] == cudnn.DATA_FLOAT and softmax[5] == 0xF000 and softmax[8] == 0x700


# ---- GPU == host: the micro network (tanh, sigmoid, MSE) in 16 bits -----------------------------------------
def micro_updates(backend, engine: str, math: str, size: int = 256) -> tuple[dict, set]:
    """What two SGD steps of the benchmark's micro network (x in its activations' dtype) change in each
    parameter, and the dtypes its activations were stored in."""
    from cudnnnet.benchmark import workloads

    network = workloads.build_micro_network(size, backend).set_engine(engine).set_math(math)
    start = network.state_dict()
    inputs, targets = workloads.micro_data(size)
    x = workloads.micro_input(network, Tensor.from_numpy(inputs.reshape(size, size, 1, 1), backend))
    step = workloads.micro_step(network, x, Tensor.from_numpy(targets, backend))
    step()
    step()
    stored = {layer.output.dtype for layer in network.layers[:-1]}
    return {name: value - start[name] for name, value in network.state_dict().items()}, stored


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["slides", "fast"])
@pytest.mark.parametrize("math, tolerance", [("bf16", 1e-2), ("fp16", 5e-3)])
def test_a_16_bit_micro_step_on_the_gpu_equals_the_hosts(cuda, host, engine, math, tolerance):
    """Both backends store the micro MLP's activations in 16 bits and round alike: each parameter's update
    over two steps agrees within ``tolerance`` (relative, in norm); only values near a rounding boundary
    may take the other neighbour, or a tanh or sigmoid computed in float32's last bits otherwise."""
    from test_engine import relative_error

    on_host, host_stored = micro_updates(host, engine, math)
    on_cuda, cuda_stored = micro_updates(cuda, engine, math)
    assert host_stored == cuda_stored == {HALF_MATHS[math]}
    for name, update in on_host.items():
        error = relative_error(on_cuda[name], update)
        assert error <= tolerance, f"{name}: relative error {error:.3g}"
