"""Convolutional networks under math bf16 and fp16 keep their activations and their gradients in 16 bits
(issue 29, item 2): Conv2D, Pooling (max, average, global average), Dropout and BatchNorm store bfloat16
(bf16) or float16 (fp16) as Dense and Activation do (test_mlp16.py); the weights, their gradients, the
statistics and every sum stay float32."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from cudnnnet import Network, Tensor
from cudnnnet.layers import Activation, BatchNorm, Conv2D, Dense, Dropout, GlobalAveragePooling, Pooling, Softmax
from cudnnnet.precision import BFLOAT16, FLOAT32, get_precision
from cudnnnet.backends.descriptors import BatchNormMode, ConvolutionDescriptor, PoolingDescriptor, PoolingMode
from cudnnnet.backends.rounding import round_to
from cudnnnet.errors import UsageError
from test_mlp16 import HALF_MATHS, bf16_steps_apart

MAX_STEPS_APART = {"host": 0, "cuda": 1}  # the GPU may sum a value near a rounding boundary to the other side


def values(rng, dtype, *shape) -> np.ndarray:
    """Normal values that ``dtype`` holds exactly."""
    return round_to(dtype, rng.standard_normal(shape).astype(np.float32))


def steps_apart(dtype, a: np.ndarray, b: np.ndarray) -> int:
    """The most 16-bit steps between a and b (both of ``dtype``'s values)."""
    if dtype is HALF_MATHS["bf16"]:
        return int(bf16_steps_apart(a, b).max())
    def ordered(values):  # sign and magnitude to one integer line: -0 and +0 coincide
        bits = values.astype(np.float16).view(np.int16).astype(np.int64)
        return np.where(bits < 0, -(bits & 0x7FFF), bits)
    return int(np.abs(ordered(a) - ordered(b)).max())


# ---- the verbs: a 16-bit result is the float32 one rounded once ------------------------------------------
@pytest.mark.parametrize("math", list(HALF_MATHS))
def test_a_16_bit_convolution_stores_its_float32_result_rounded_once(backend, engine, math):
    """x, dy 16-bit: y and dx are what float32 y and dx of the same operands hold, rounded (the same plan,
    so the same products and sums); dw and db are float32 and equal the float32 call's."""
    dtype = HALF_MATHS[math]
    rng = np.random.default_rng(11)
    desc = ConvolutionDescriptor(4, 3, 3, 1, 1, 1)  # C 3 -> K 4, 3×3, padding 1
    x_shape = (6, 3, 8, 8)
    y_shape = desc.output_shape(x_shape)
    x, w, dy = values(rng, dtype, *x_shape), rng.standard_normal(desc.filter_shape).astype(np.float32), \
        values(rng, dtype, *y_shape)
    with backend.using(engine=engine, math=math):
        plan = backend.convolution_plan(desc, x_shape, y_shape)
        W = Tensor.from_numpy(w, backend)
        results = {}
        for stored in (dtype, "float32"):
            X, DY = Tensor.from_numpy(x, backend, dtype=stored), Tensor.from_numpy(dy, backend, dtype=stored)
            Y, DX = Tensor(y_shape, backend, dtype=stored), Tensor(x_shape, backend, dtype=stored)
            DW, DB = Tensor(desc.filter_shape, backend), Tensor((1, 4, 1, 1), backend)
            backend.convolution_forward(plan, 1.0, X, W, 0.0, Y)
            backend.convolution_backward_data(plan, 1.0, W, DY, 0.0, DX)
            backend.convolution_backward_filter(plan, 1.0, X, DY, 0.0, DW)
            backend.convolution_backward_bias(1.0, DY, 0.0, DB)
            results[stored] = [tensor.numpy() for tensor in (Y, DX, DW, DB)]
    (y16, dx16, dw16, db16), (y32, dx32, dw32, db32) = results[dtype], results["float32"]
    limit = MAX_STEPS_APART[backend.name]
    assert steps_apart(dtype, y16, round_to(dtype, y32)) <= limit
    assert steps_apart(dtype, dx16, round_to(dtype, dx32)) <= limit
    np.testing.assert_allclose(dw16, dw32, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(db16, db32, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(db16.reshape(4), dy.astype(np.float64).sum(axis=(0, 2, 3)), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("mode, window, stride, padding", [
    (PoolingMode.MAX, 2, 2, 0), (PoolingMode.MAX, 3, 2, 1), (PoolingMode.AVERAGE, 2, 2, 0),
    (PoolingMode.AVERAGE, 6, 6, 0)])
@pytest.mark.parametrize("math", list(HALF_MATHS))
def test_16_bit_pooling_stores_its_float32_result_rounded_once(backend, engine, math, mode, window, stride, padding):
    """Max pooling of 16-bit values is exact; the average is the float32 mean rounded once; dx likewise
    (the fast engine's max-pooling kernel for windows without overlap, cuDNN for the others)."""
    dtype = HALF_MATHS[math]
    rng = np.random.default_rng(12)
    desc = PoolingDescriptor(mode, window, padding, stride)
    x_shape = (3, 4, 6, 6)
    y_shape = desc.output_shape(x_shape)
    x, dy = values(rng, dtype, *x_shape), values(rng, dtype, *y_shape)
    results = {}
    with backend.using(engine=engine, math=math):
        for stored in (dtype, "float32"):
            X, DY = Tensor.from_numpy(x, backend, dtype=stored), Tensor.from_numpy(dy, backend, dtype=stored)
            Y, DX = Tensor(y_shape, backend, dtype=stored), Tensor(x_shape, backend, dtype=stored)
            backend.pooling_forward(desc, 1.0, X, 0.0, Y)
            backend.pooling_backward(desc, 1.0, Y, DY, X, 0.0, DX)
            results[stored] = (Y.numpy(), DX.numpy())
    (y16, dx16), (y32, dx32) = results[dtype], results["float32"]
    if mode == PoolingMode.MAX:
        np.testing.assert_array_equal(y16, y32)
    limit = MAX_STEPS_APART[backend.name]
    assert steps_apart(dtype, y16, round_to(dtype, y32)) <= limit
    assert steps_apart(dtype, dx16, round_to(dtype, dx32)) <= limit


@pytest.mark.parametrize("math", list(HALF_MATHS))
def test_add_tensor_into_a_16_bit_y_reads_the_bias_rounded_to_its_16_bits(backend, math):
    """cuDNN's cudnnAddTensor takes one data type: the slides engine's bias of a 16-bit convolution is
    added from its 16-bit copy, and the sum rounded once."""
    dtype = HALF_MATHS[math]
    rng = np.random.default_rng(13)
    y, bias = values(rng, dtype, 4, 3, 5, 5), (rng.standard_normal((1, 3, 1, 1)) * 0.37).astype(np.float32)
    with backend.using(math=math):
        Y = Tensor.from_numpy(y, backend, dtype=dtype)
        backend.add_tensor(1.0, Tensor.from_numpy(bias, backend), 1.0, Y)
    expected = round_to(dtype, y + round_to(dtype, bias))
    assert steps_apart(dtype, Y.numpy(), expected) <= MAX_STEPS_APART[backend.name]


@pytest.mark.parametrize("math", list(HALF_MATHS))
def test_16_bit_dropout_stores_the_kept_values_scaled_and_rounded_once(backend, math):
    """y = h(x·mask/(1 - rate)) and dx = h(dy·mask/(1 - rate)) with the forward's mask: with dy = 1, dx is
    the scale where a value was kept and 0 elsewhere, and y is x times that scale, rounded once."""
    dtype, rate = HALF_MATHS[math], 0.3
    rng = np.random.default_rng(14)
    x = values(rng, dtype, 16, 8, 4, 4)
    x[x == 0] = 1.0
    with backend.using(math=math):
        state = backend.dropout_state(rate, 7)
        reserve = backend.dropout_reserve(state, x.shape)
        X, Y = Tensor.from_numpy(x, backend, dtype=dtype), Tensor(x.shape, backend, dtype=dtype)
        DY, DX = Tensor.from_numpy(np.ones_like(x), backend, dtype=dtype), Tensor(x.shape, backend, dtype=dtype)
        backend.dropout_forward(state, reserve, X, Y)
        backend.dropout_backward(state, reserve, DY, DX)
    y, dx = Y.numpy(), DX.numpy()
    kept = y != 0
    scale = np.float32(1.0) / np.float32(1.0 - rate)
    assert 0.6 < kept.mean() < 0.8
    np.testing.assert_array_equal(dx, np.where(kept, round_to(dtype, np.full_like(x, scale)), 0))
    expected = np.where(kept, round_to(dtype, x * scale), 0)
    assert steps_apart(dtype, y, expected) <= MAX_STEPS_APART[backend.name]


@pytest.mark.parametrize("mode", [BatchNormMode.SPATIAL, BatchNormMode.PER_ACTIVATION])
@pytest.mark.parametrize("math", list(HALF_MATHS))
def test_16_bit_batch_normalisation_stores_its_float32_result_rounded_once(backend, engine, math, mode):
    """x, dy 16-bit: y (training and evaluation) and dx are the float32 call's, rounded once; the saved and
    running statistics and the parameters' gradients are float32 and the float32 call's."""
    dtype = HALF_MATHS[math]
    rng = np.random.default_rng(15)
    x, dy = round_to(dtype, values(rng, dtype, 6, 3, 4, 4) * 2 + 1), values(rng, dtype, 6, 3, 4, 4)
    shape = (1, 3, 1, 1) if mode == BatchNormMode.SPATIAL else (1, 3, 4, 4)
    scale, bias = (rng.uniform(0.5, 1.5, shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32))
    results = {}
    with backend.using(engine=engine, math=math):
        for stored in (dtype, "float32"):
            X, DY = Tensor.from_numpy(x, backend, dtype=stored), Tensor.from_numpy(dy, backend, dtype=stored)
            Y, DX, Y_EVAL = (Tensor(x.shape, backend, dtype=stored) for _ in range(3))
            SCALE, BIAS = Tensor.from_numpy(scale, backend), Tensor.from_numpy(bias, backend)
            MEAN, VAR = Tensor.zeros(shape, backend), Tensor.from_numpy(np.ones(shape, np.float32), backend)
            SAVED_MEAN, SAVED_INV_STD, DSCALE, DBIAS = (Tensor(shape, backend) for _ in range(4))
            backend.batch_norm_forward_training(mode, X, Y, SCALE, BIAS, 0.1, MEAN, VAR, 1e-5, SAVED_MEAN,
                                                SAVED_INV_STD)
            backend.batch_norm_backward(mode, X, DY, DX, SCALE, DSCALE, DBIAS, 1e-5, SAVED_MEAN, SAVED_INV_STD)
            backend.batch_norm_forward_inference(mode, X, Y_EVAL, SCALE, BIAS, MEAN, VAR, 1e-5)
            results[stored] = [tensor.numpy() for tensor in (Y, DX, Y_EVAL, MEAN, VAR, SAVED_MEAN, SAVED_INV_STD,
                                                             DSCALE, DBIAS)]
    (y16, dx16, eval16, *statistics16), (y32, dx32, eval32, *statistics32) = results[dtype], results["float32"]
    limit = MAX_STEPS_APART[backend.name]
    for name, half, full in (("y", y16, y32), ("dx", dx16, dx32), ("evaluation y", eval16, eval32)):
        assert steps_apart(dtype, half, round_to(dtype, full)) <= limit, name
    for half, full in zip(statistics16, statistics32):
        np.testing.assert_allclose(half, full, rtol=1e-5, atol=1e-6)


def test_a_16_bit_convolution_result_takes_no_blend(backend):
    """A 16-bit y or dx is the product rounded once: alpha other than 1 or beta other than 0 is refused
    before anything is written."""
    desc = ConvolutionDescriptor(2, 1, 3)
    with backend.using(math="bf16"):
        plan = backend.convolution_plan(desc, (1, 1, 5, 5), (1, 2, 3, 3))
        x = Tensor.from_numpy(np.ones((1, 1, 5, 5), np.float32), backend, dtype="bfloat16")
        y = Tensor.from_numpy(np.full((1, 2, 3, 3), 3.0, np.float32), backend, dtype="bfloat16")
        w = Tensor.zeros(desc.filter_shape, backend)
        with pytest.raises(UsageError, match=r"^convolution_forward: a bfloat16 result takes alpha 1 and beta 0 .*"
                                             r"got alpha 1.0 and beta 1.0"):
            backend.convolution_forward(plan, 1.0, x, w, 1.0, y)
        with pytest.raises(UsageError, match="^convolution_backward_data: a bfloat16 result takes alpha 1"):
            backend.convolution_backward_data(plan, 0.5, w, y, 0.0, x)
    np.testing.assert_array_equal(y.numpy(), 3.0)
    np.testing.assert_array_equal(x.numpy(), 1.0)


# ---- networks: which dtype each buffer holds -----------------------------------------------------------------
def cnn(backend, engine: str, math: str | None, pooling: str = "max") -> Network:
    """mnist_cnn's layer types (conv, ReLU, pooling, dense, softmax), small, with a batch normalisation (and
    its ReLU, which the fast engine fuses), a global average pooling and a dropout."""
    return Network([Conv2D("conv1", 4, 3), Activation("relu1", "relu"), Pooling("pool1", 2, mode=pooling),
                    Conv2D("conv2", 6, 3, padding=1, bias=False), BatchNorm("bn2"), Activation("relu2", "relu"),
                    GlobalAveragePooling("gap"), Dropout("drop", 0.25), Dense("fc", 10), Softmax("softmax")],
                   backend=backend, engine=engine, math=math)


def images(backend, n: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 1, 10, 10)).astype(np.float32)
    target = np.eye(10, dtype=np.float32)[rng.integers(0, 10, n)].reshape(n, 10, 1, 1)
    return x, Tensor.from_numpy(target, backend)


@pytest.mark.parametrize("pooling", ["max", "average"])
@pytest.mark.parametrize("math", list(HALF_MATHS))
def test_a_cnn_stores_activations_and_gradients_in_the_maths_16_bits(backend, engine, math, pooling):
    network = cnn(backend, engine, math, pooling)
    x, target = images(backend)
    network.train_step(x, target, 0.1)
    half = HALF_MATHS[math]
    assert [(layer.name, layer.output.dtype, layer.grad_input.dtype) for layer in network.layers] == [
        (layer.name, FLOAT32 if layer.is_loss else half, half) for layer in network.layers]
    for parameter in network.parameter_list():
        assert parameter.value.dtype is FLOAT32 and parameter.grad.dtype is FLOAT32


def test_the_cnn_activations_take_2_bytes_a_value(host):
    """A bf16 CNN's activation buffers are half the bytes of the fp32 CNN's."""
    nbytes = {}
    for math in ("fp32", "bf16"):
        network = cnn(host, "slides", math)
        x, target = images(host, n=16)
        network.train_step(x, target, 0.1)
        hidden = network.layers[:-1]
        assert {layer.output.dtype for layer in hidden} == {get_precision(math).activation_dtype}
        nbytes[math] = sum(layer.output.nbytes + layer.grad_input.nbytes for layer in hidden)
    assert nbytes["bf16"] * 2 == nbytes["fp32"]


def test_switching_the_math_gives_a_cnn_float32_buffers_back(backend, engine):
    """fp32 → bf16 → fp32: float32 buffers (the same objects as before) and a plan of the math in force."""
    network = cnn(backend, engine, "fp32")
    x, target = images(backend)
    seen = {}
    for math in ("fp32", "bf16", "fp32"):
        network.set_math(math)
        network.train_step(x, target, 0.1)
        buffers = [(layer.output, layer.grad_input) for layer in network.layers[:-1]]
        assert {tensor.dtype for pair in buffers for tensor in pair} == {get_precision(math).activation_dtype}
        if math in seen:
            assert all(a is b for pair, earlier in zip(buffers, seen[math]) for a, b in zip(pair, earlier))
        seen[math] = buffers


def test_a_cnn_trained_in_bf16_checkpoints_float32_and_predicts_in_fp32(host, tmp_path):
    network = cnn(host, "fast", "bf16")
    x, target = images(host)
    for _ in range(3):
        network.train_step(x, target, 0.1)
    in_bf16 = network.predict(x).numpy()
    path = network.save(tmp_path / "cnn16.cudnnnet")
    loaded = Network.load(path, backend=host)
    assert {value.dtype for value in loaded.state_dict().values()} == {np.dtype(np.float32)}
    in_fp32 = loaded.set_math("fp32").predict(x).numpy()
    assert loaded.layers[0].output.dtype is FLOAT32
    np.testing.assert_allclose(in_fp32, in_bf16, atol=5e-2)
    assert np.mean(in_fp32.argmax(axis=1) == in_bf16.argmax(axis=1)) >= 0.75


def test_a_bf16_cnn_learns_mnist_on_the_host(host, mnist_dir):
    """300 SGD steps of mnist_cnn (conv 20 5×5, ReLU, max pool, conv 50 5×5, ReLU, max pool, dense 500,
    ReLU, dense 10) in bf16, every activation bfloat16: over 90 % of 1000 test images right."""
    from cudnnnet.data.mnist import read_images, read_labels
    from cudnnnet.train.trainer import build_network
    from test_engine import config_of

    def split(prefix: str, count: int):
        pixels = read_images(mnist_dir / f"{prefix}-images-idx3-ubyte.gz")[:count].astype(np.float32) / 255.0
        return ((pixels - 0.1307) / 0.3081).reshape(count, 1, 28, 28), read_labels(
            mnist_dir / f"{prefix}-labels-idx1-ubyte.gz")[:count]

    steps, size = 300, 32
    train_images, labels = split("train", steps * size)
    test_images, test_labels = split("t10k", 1000)
    network = build_network(config_of("mnist_cnn"), host).set_engine("fast").set_math("bf16")
    for step in range(steps):
        chunk = slice(size * step, size * step + size)
        network.train_step(train_images[chunk], np.eye(10, dtype=np.float32)[labels[chunk]].reshape(size, 10, 1, 1),
                           0.05)
    assert {layer.output.dtype for layer in network.layers[:-1]} == {BFLOAT16}
    predicted = network.predict(test_images).numpy().reshape(1000, 10).argmax(axis=1)
    assert np.mean(predicted == test_labels) > 0.9


@pytest.mark.gpu
def test_the_cnns_peak_device_memory_in_bf16_is_below_fp32s(cuda):
    """mnist_cnn at a batch of 2048: activations and their gradients in bfloat16 take half the bytes
    (about 150 of fp32's 300 MiB), more than the bfloat16 copies of its weights (2 MiB) add. Each math
    runs once first, so the convolution workspaces and plans are made before anything is measured."""
    import gc

    from cudnnnet.benchmark.measuring import DeviceMemory
    from cudnnnet.train.trainer import build_network
    from test_engine import config_of

    def peak_mib(math: str) -> float:
        gc.collect()
        memory = DeviceMemory(cuda)
        network = build_network(config_of("mnist_cnn"), cuda).set_engine("fast").set_math(math)
        x, target = np.zeros((2048, 1, 28, 28), np.float32), np.zeros((2048, 10, 1, 1), np.float32)
        target[:, 0] = 1.0
        for _ in range(2):
            network.train_step(x, Tensor.from_numpy(target, cuda), 0.01)
            memory.sample()
        del network
        gc.collect()
        return memory.peak_mib

    for math in ("fp32", "bf16"):
        peak_mib(math)
    fp32, bf16 = peak_mib("fp32"), peak_mib("bf16")
    assert bf16 < 0.8 * fp32, f"bf16 {bf16:.0f} MiB, fp32 {fp32:.0f} MiB"


# ---- the CUDA launches of the 16-bit CNN, on host-side fakes ---------------------------------------------------
class RecordingContext:
    """The face of a CUDA context the GEMM convolution, pooling and channel-sum launches read: each launch and
    each 16-bit operand asked for is kept; a 16-bit tensor of the format is its own operand."""

    def __init__(self):
        self.launches, self.conversions = [], []
        self.stream, self.cudnn = SimpleNamespace(handle=0), SimpleNamespace(handle=0)
        self.half = SimpleNamespace(operands=self._operands, to_float=self._to_float)

    def kernel(self, name: str):
        return SimpleNamespace(launch=lambda blocks, stream, *arguments: self.launches.append((name, arguments)))

    def _operands(self, *operands, output: int = 0, fmt):
        pointers = [tensor.data.ptr if tensor.dtype is fmt.dtype else 0xC0 for tensor, _ in operands]
        return pointers + ([0x5C] if output else [])

    def _to_float(self, out, source, alpha, beta, count, fmt):
        self.conversions.append((out, source))

    def scalar(self, value):
        return value

    def workspace(self, nbytes: int) -> int:
        return 0x100000


def fake(shape, address: int, dtype=FLOAT32):
    n, c, h, w = shape
    size = n * c * h * w
    return SimpleNamespace(shape=shape, n=n, c=c, h=h, w=w, size=size, dtype=dtype,
                           data=SimpleNamespace(ptr=address, size=size))


def check_declared(launches, code: int) -> None:
    """Each launch passes as many arguments, of the kinds, as kernel.KERNELS declares; a 16-bit twin its format."""
    from ctypes import c_float, c_int, c_longlong, c_void_p

    from cudnnnet.backends.cuda.kernel import KERNELS

    python_types = {c_void_p: (int, type(None)), c_int: int, c_longlong: int, c_float: float}
    for name, arguments in launches:
        declared = KERNELS[name][1]
        assert len(arguments) == len(declared), name
        assert all(isinstance(value, python_types[kind]) for value, kind in zip(arguments, declared)), name
        if name.endswith("16"):
            assert code in arguments, name


@pytest.mark.parametrize("math", list(HALF_MATHS))
def test_the_gemm_convolution_reads_and_writes_16_bit_activations_as_they_are(math):
    """16-bit x and dy go into im2col_half16 as they are (no float32 read), y and dx come from round_result16
    and col2im16 (the FP32 product in the workspace, never in y), dw stays a float32 round_result."""
    from cudnnnet.backends.cuda import gemm_convolution
    from cudnnnet.backends.cuda.low_precision import HALF_FORMATS

    dtype = HALF_MATHS[math]
    precision, code = get_precision(math), HALF_FORMATS[dtype].kernel_code
    desc = ConvolutionDescriptor(4, 2, 3, padding=1)
    x_shape = (2, 2, 5, 5)
    y_shape = desc.output_shape(x_shape)
    shape = gemm_convolution.GemmShape.of(desc, x_shape, y_shape)
    x, y, dy, dx = fake(x_shape, 0xA000, dtype), fake(y_shape, 0xB000, dtype), fake(y_shape, 0xD000, dtype), \
        fake(x_shape, 0xE000, dtype)
    w, dw = fake(desc.filter_shape, 0xF000), fake(desc.filter_shape, 0xF800)
    runs = {}
    for direction, run in {"forward": lambda b: gemm_convolution.forward(b, shape, 1.0, x, w, 0.0, y, 0x100000,
                                                                         precision),
                           "backward_data": lambda b: gemm_convolution.backward_data(b, shape, 1.0, w, dy, 0.0, dx,
                                                                                     0x100000, precision),
                           "backward_filter": lambda b: gemm_convolution.backward_filter(b, shape, 1.0, x, dy, 0.0,
                                                                                         dw, 0x100000, 0x200000, 2,
                                                                                         precision)}.items():
        backend = SimpleNamespace(context=RecordingContext(), gemm=lambda problem, *arguments: None)
        run(backend)
        runs[direction] = backend.context.launches
        check_declared(backend.context.launches, code)
    assert [name for name, _ in runs["forward"]] == ["im2col_half16", "round_result16"]
    (_, im2col), (_, rounding) = runs["forward"]
    assert im2col[1] == 0xA000 and rounding[0] == 0xB000 and rounding[1] != 0xB000
    assert [name for name, _ in runs["backward_data"]] == ["col2im16"] and runs["backward_data"][0][1][0] == 0xE000
    assert [name for name, _ in runs["backward_filter"]] == ["im2col_half16", "im2col_half16", "round_result"]
    assert runs["backward_filter"][1][1][1] == 0xD000 and runs["backward_filter"][2][1][0] == 0xF800


@pytest.mark.parametrize("math", list(HALF_MATHS))
def test_cudnn_writes_a_16_bit_result_into_the_tensor_itself(math):
    """ConvolutionPlanner.run with a 16-bit y: cuDNN's output pointer is y's, nothing converted back; with a
    float32 dw: a scratch slot, converted into dw."""
    import dataclasses

    from cudnnnet.backends.cuda import convolution
    from cudnnnet.backends.cuda.convolution_planner import ConvolutionPlanner

    dtype, precision = HALF_MATHS[math], get_precision(math)
    backend = SimpleNamespace(context=RecordingContext(), precision=precision)
    runs = []
    descriptor = SimpleNamespace(handle=1)
    plan = SimpleNamespace(forward=convolution.Algorithm(1, 0), backward_filter=convolution.Algorithm(1, 0),
                           precision=precision, x=descriptor, w=descriptor, conv=descriptor, y=descriptor)
    x, y = fake((1, 2, 5, 5), 0xA000, dtype), fake((1, 4, 5, 5), 0xB000, dtype)
    w, dw = fake((4, 2, 3, 3), 0xF000), fake((4, 2, 3, 3), 0xF800)
    planner = ConvolutionPlanner(backend, 0)
    for direction, (a, b, out) in ((convolution.FORWARD, (x, w, y)), (convolution.BACKWARD_FILTER, (x, y, dw))):
        recording = dataclasses.replace(direction, run=lambda *arguments: runs.append(arguments))
        planner.run(recording, plan, 1.0, a, b, 0.0, out)
    # (handle, alpha, a_desc, a, b_desc, b, conv, algo, workspace, workspace bytes, beta, out_desc, out)
    assert runs[0][3] == 0xA000 and runs[0][5] == 0xC0 and runs[0][-1] == 0xB000
    assert runs[1][3] == 0xA000 and runs[1][5] == 0xB000 and runs[1][-1] == 0x5C
    assert backend.context.conversions == [(0xF800, 0x5C)]


@pytest.mark.parametrize("math", list(HALF_MATHS))
def test_the_pooling_and_bias_gradient_kernels_take_their_16_bit_twins(math):
    from cudnnnet.backends.cuda import pooling
    from cudnnnet.backends.cuda.channel_sum import ChannelSum
    from cudnnnet.backends.cuda.low_precision import HALF_FORMATS

    dtype = HALF_MATHS[math]
    context = RecordingContext()
    x, dx, dy = fake((2, 3, 4, 4), 0xA000, dtype), fake((2, 3, 4, 4), 0xB000, dtype), fake((2, 3, 2, 2), 0xC000, dtype)
    pooling.max_backward(SimpleNamespace(context=context), PoolingDescriptor(PoolingMode.MAX, 2, 0, 2), 1.0, dy, x,
                         0.0, dx)
    channel_sum = object.__new__(ChannelSum)
    channel_sum.context, channel_sum.scratch, channel_sum.counter = context, SimpleNamespace(ptr=0x9000), 0x9F00
    channel_sum(1.0, dy, 0.0, fake((1, 3, 1, 1), 0xD000))
    assert [name for name, _ in context.launches] == ["max_pooling_backward16", "channel_sum16"]
    check_declared(context.launches, HALF_FORMATS[dtype].kernel_code)
    assert context.launches[0][1][-1] == context.launches[1][1][-1] == HALF_FORMATS[dtype].kernel_code


@pytest.mark.parametrize("math", list(HALF_MATHS))
def test_the_fast_batch_normalisation_takes_its_16_bit_twins(monkeypatch, math):
    from cudnnnet.backends.cuda.batch_norm import BatchNormKernels
    from cudnnnet.backends.cuda.low_precision import HALF_FORMATS

    dtype = HALF_MATHS[math]
    kernels = BatchNormKernels(RecordingContext())
    monkeypatch.setattr(kernels, "_partials", lambda count: 0x9000)
    x, y, dy, dx = (fake((4, 3, 2, 2), address, dtype) for address in (0xA000, 0xB000, 0xC000, 0xD000))
    scale, bias, mean, var, saved_mean, saved_inv_std, dscale, dbias = (
        fake((1, 3, 1, 1), 0x100 * (index + 1)) for index in range(8))
    kernels.forward(BatchNormMode.SPATIAL, x, y, scale, bias, 0.1, mean, var, 1e-5, saved_mean, saved_inv_std, True)
    kernels.backward(BatchNormMode.SPATIAL, x, dy, dx, scale, bias, dscale, dbias, saved_mean, saved_inv_std, True)
    launches = kernels.context.launches
    assert [name for name, _ in launches] == ["batch_norm_sums16", "batch_norm_forward_apply16",
                                              "batch_norm_gradient_sums16", "batch_norm_backward_apply16"]
    code = HALF_FORMATS[dtype].kernel_code
    check_declared(launches, code)
    assert all(arguments[-1] == code for _, arguments in launches)


@pytest.mark.parametrize("math", list(HALF_MATHS))
def test_a_cudnn_call_on_16_bit_tensors_runs_on_float32_copies_rounded_once(math):
    """low_precision.through_float32 (cuDNN's dropout, and pooling's backward where windows overlap, in a
    16-bit network): each input converted exactly into the workspace, the call on those float32 copies,
    its float32 result rounded into the 16-bit output."""
    from cudnnnet.backends.cuda.low_precision import HALF_FORMATS, through_float32

    dtype = HALF_MATHS[math]
    fmt = HALF_FORMATS[dtype]
    context, runs = RecordingContext(), []
    x, dy, dx = (fake(shape, address, dtype) for shape, address in
                 (((4, 3, 2, 2), 0xA000), ((4, 3, 9, 9), 0xB000), ((4, 3, 2, 2), 0xC000)))
    through_float32(context, (x, dy), dx, lambda *pointers: runs.append(pointers))
    copies = (0x100000, 0x100000 + 256, 0x100000 + 256 + 4 * 1024)  # each at its size, in 256-byte slots
    assert context.conversions == [(copies[0], 0xA000), (copies[1], 0xB000)]
    assert runs == [copies]
    assert [name for name, _ in context.launches] == [fmt.to_half_x4]
    assert context.launches[0][1][:2] == (0xC000, copies[2])


@pytest.mark.parametrize("math, stored", [("bf16", BFLOAT16), ("fp32", FLOAT32)])
def test_the_convolution_timer_times_the_activation_dtype_a_network_stores(monkeypatch, host, math, stored):
    """The exhaustive search times each candidate on x, dx and dy of the precision's activation dtype (a
    16-bit network's convolutions read and write 16 bits, which its algorithms' times depend on), w and
    dw float32."""
    from cudnnnet.backends.cuda import convolution_planner
    from cudnnnet.engine import get_engine

    made = []

    class Timer(convolution_planner.ConvolutionTimer):
        def __init__(self, *arguments):
            monkeypatch.setattr(convolution_planner, "Event", lambda: None)
            super().__init__(*arguments)
            made.append(self)

        def measure(self, plan, direction):
            return 1.0

    monkeypatch.setattr(convolution_planner, "ConvolutionTimer", Timer)
    desc = ConvolutionDescriptor(4, 3, 3)
    planner = SimpleNamespace(backend=host)
    measure = convolution_planner.ConvolutionPlanner._timer(planner, desc, (2, 3, 8, 8), (2, 4, 6, 6),
                                                           get_engine("fast"), get_precision(math))
    measure(None, "forward")
    timer = made[0]
    assert (timer.x.dtype, timer.dx.dtype, timer.dy.dtype) == (stored,) * 3
    assert (timer.w.dtype, timer.dw.dtype) == (FLOAT32, FLOAT32)
    assert timer.w.shape == (4, 3, 3, 3) and timer.dy.shape == (2, 4, 6, 6)


@pytest.mark.parametrize("plane", [(4, 4), (3, 3)])  # H·W 16: eight values a thread on CUDA; 9: one
@pytest.mark.parametrize("mode", ["relu", "tanh"])
@pytest.mark.parametrize("math", list(HALF_MATHS))
def test_a_convolutions_16_bit_bias_and_activation_is_the_float32_ones_rounded(backend, math, mode, plane):
    """y = f(y + b) of a 16-bit (N, C, H, W) y, b per channel: the float32 call's result on the same
    stored values, rounded once."""
    from cudnnnet.backends.descriptors import ACTIVATION_MODES, ActivationDescriptor, ActivationMode

    dtype = HALF_MATHS[math]
    rng = np.random.default_rng(8)
    before = values(rng, dtype, 3, 5, *plane)
    bias = Tensor.from_numpy(rng.standard_normal((1, 5, 1, 1)).astype(np.float32), backend)
    desc = ActivationDescriptor(ActivationMode(ACTIVATION_MODES[mode]), 0.0)
    with backend.using(math=math):
        y = Tensor.from_numpy(before, backend, dtype=dtype)
        backend.bias_activation_forward(desc, bias, y)
    with backend.using(math="fp32"):
        y32 = Tensor.from_numpy(before, backend)
        backend.bias_activation_forward(desc, bias, y32)
    np.testing.assert_array_equal(y.numpy(), round_to(dtype, y32.numpy()))


@pytest.mark.parametrize("plane, kernel", [((4, 4), "bias_activation_forward16_spatial8"),
                                           ((3, 3), "bias_activation_forward16")])
def test_a_convolutions_16_bit_bias_kernel_takes_its_declared_arguments(plane, kernel):
    from ctypes import c_float, c_int, c_longlong, c_void_p

    from cudnnnet.backends.cuda.activation_kernels import ActivationKernels
    from cudnnnet.backends.cuda.kernel import KERNELS
    from cudnnnet.backends.descriptors import ACTIVATION_MODES, ActivationDescriptor, ActivationMode
    from test_mlp16 import LaunchRecorder, fake16

    context = LaunchRecorder()
    relu = ActivationDescriptor(ActivationMode(ACTIVATION_MODES["relu"]), 0.0)
    y = fake16((2, 3) + plane, 0x1000)
    ActivationKernels(context).bias_forward(relu, fake16((1, 3, 1, 1), 0x2000, FLOAT32), y, None)
    (name, arguments), = context.launches
    python_types = {c_void_p: (int, type(None)), c_int: int, c_longlong: int, c_float: float}
    assert name == kernel and len(arguments) == len(KERNELS[name][1])
    assert all(isinstance(value, python_types[kind]) for value, kind in zip(arguments, KERNELS[name][1]))
    assert arguments[-1] == 1  # bfloat16
