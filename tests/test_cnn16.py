"""Convolutional networks under math bf16 and fp16 keep their activations and their gradients in 16 bits
(issue 29, item 2): Conv2D and Pooling (max, average, global average) store bfloat16 (bf16) or float16
(fp16) as Dense and Activation do (test_mlp16.py); the weights, their gradients and every sum stay float32."""

from __future__ import annotations

import numpy as np
import pytest

from cudnnnet import Network, Tensor
from cudnnnet.backends.descriptors import ConvolutionDescriptor, PoolingDescriptor, PoolingMode
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
    return int(np.abs(a.astype(np.float16).view(np.int16).astype(np.int64)
                      - b.astype(np.float16).view(np.int16).astype(np.int64)).max())


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
