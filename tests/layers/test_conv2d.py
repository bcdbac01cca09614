import collections

import numpy as np
import pytest

from cudnnnet import Tensor
from cudnnnet.errors import InvalidArgumentError, ShapeError
from cudnnnet.layers import Conv2D
from layer_checks import build, check_layer_gradients, relative_error

GEOMETRIES = [  # (stride, padding, dilation)
    (1, 0, 1),
    (2, 1, 1),
    (1, 2, 1),
    (2, 0, 2),
    (3, 1, 1),
]


def direct_convolution(x, weight, bias, stride, padding, dilation):
    """y[n, k, i, j] = b[k] + Σ_{c,r,s} x[n, c, i·stride + r·dilation - pad, j·stride + s·dilation - pad]·w[k, c, r, s]."""
    n, c, h, w = x.shape
    k_out, _, k, _ = weight.shape
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    span = (k - 1) * dilation + 1
    out_h, out_w = (h + 2 * padding - span) // stride + 1, (w + 2 * padding - span) // stride + 1
    y = np.zeros((n, k_out, out_h, out_w))
    for i in range(out_h):
        for j in range(out_w):
            window = padded[:, :, i * stride:i * stride + span:dilation, j * stride:j * stride + span:dilation]
            y[:, :, i, j] = np.einsum("ncrs,kcrs->nk", window, weight)
    return y + bias.reshape(1, -1, 1, 1)


@pytest.mark.parametrize("stride, padding, dilation", GEOMETRIES)
def test_forward_matches_direct_convolution(backend, stride, padding, dilation):
    rng = np.random.default_rng(0)
    layer = build(Conv2D("conv", 4, 3, stride, padding, dilation), (3, 9, 8), backend)
    bias = rng.standard_normal(4).astype(np.float32)
    layer.bias.write_(bias)
    x = rng.standard_normal((5, 3, 9, 8)).astype(np.float32)
    output = layer.forward(Tensor.from_numpy(x, backend)).numpy()
    expected = direct_convolution(x, layer.weight.numpy(), bias, stride, padding, dilation)
    assert output.shape == expected.shape
    assert relative_error(output, expected) < 1e-5


@pytest.mark.parametrize("stride, padding, dilation", GEOMETRIES)
def test_gradients_match_finite_differences(backend, stride, padding, dilation):
    rng = np.random.default_rng(1)
    layer = build(Conv2D("conv", 2, 3, stride, padding, dilation), (2, 6, 5), backend)
    layer.bias.write_(rng.standard_normal(2))
    layer.gradient_stop = False
    check_layer_gradients(layer, rng.standard_normal((2, 2, 6, 5)).astype(np.float32), eps=1e-2)


def test_without_bias_it_is_the_convolution_alone(backend):
    rng = np.random.default_rng(3)
    layer = build(Conv2D("conv", 4, 3, 1, 1, bias=False), (3, 7, 6), backend)
    assert [parameter.name for parameter in layer.parameters()] == ["conv.weight"]
    assert set(layer.parameter_shapes((3, 7, 6))) == {"weight"} and layer.bias is None
    assert layer.config()["bias"] is False and "bias" not in Conv2D("conv", 4, 3).config()
    x = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    output = layer.forward(Tensor.from_numpy(x, backend)).numpy()
    expected = direct_convolution(x, layer.weight.numpy(), np.zeros(4), 1, 1, 1)
    assert relative_error(output, expected) < 1e-5
    layer.gradient_stop = False
    check_layer_gradients(layer, x, eps=1e-2)


def test_bias_must_be_a_boolean():
    with pytest.raises(InvalidArgumentError, match="bias must be true or false, got 'no'"):
        Conv2D("conv", 4, 3, bias="no")


def test_output_shape_and_fan_in(backend):
    layer = build(Conv2D("conv", 20, 5), (1, 28, 28), backend)
    assert layer.output_sample_shape((1, 28, 28)) == (20, 24, 24)
    assert np.abs(layer.weight.numpy()).max() <= np.sqrt(6 / 25)


def test_kernel_larger_than_input_names_the_layer():
    with pytest.raises(ShapeError, match=r"conv3.*kernel 5.*larger than its padded input 4×4"):
        Conv2D("conv3", 8, 5).output_sample_shape((16, 4, 4))


def test_after_a_dense_layer_it_says_there_is_no_spatial_size():
    with pytest.raises(ShapeError, match="Dense layer before it leaves no spatial size"):
        Conv2D("conv", 8, 3).output_sample_shape((500, 1, 1))


@pytest.mark.parametrize("key, value", [("out_channels", 0), ("kernel_size", -1), ("stride", 0), ("padding", -1),
                                        ("dilation", 0)])
def test_invalid_arguments_name_the_key(key, value):
    arguments = {"out_channels": 4, "kernel_size": 3, key: value}
    with pytest.raises(InvalidArgumentError, match=key):
        Conv2D("conv", **arguments)


def convolution_calls(layer, dy: Tensor) -> None:
    """What Conv2D.backward runs besides the bias gradient."""
    b = layer.backend
    b.convolution_backward_filter(layer.plan, 1.0, layer.input, dy, 0.0, layer.grad_weight)
    b.convolution_backward_data(layer.plan, 1.0, layer.weight, dy, 0.0, layer.grad_input)


def counted(function) -> tuple[collections.Counter, collections.Counter]:
    """(library calls, kernel launches) made by ``function()``."""
    from cudnnnet.backends.cuda import bindings, kernel

    bindings.reset_calls()
    kernel.reset_launches()
    function()
    return collections.Counter(bindings.calls), collections.Counter(kernel.launches)


@pytest.mark.gpu
@pytest.mark.parametrize("engine, bias_calls, bias_launches", [
    ("fast", {"cuLaunchKernel": 1}, {"channel_sum": 1}),
    ("slides", {"cudnnConvolutionBackwardBias": 2}, {}),  # two passes at this batch (backward_bias.py)
])
def test_cuda_bias_gradient_adds_only_its_own_calls(cuda, host, engine, bias_calls, bias_launches):
    """conv1 of configs/mnist_cnn.yaml at batch 256: db agrees with the host, and the backward pass
    makes its two convolution calls and the bias gradient's, and nothing else: one channel_sum launch
    in the fast engine, two cudnnConvolutionBackwardBias calls in the slides engine."""
    with cuda.using_engine(engine):
        bias_gradient_calls(cuda, host, bias_calls, bias_launches)


def bias_gradient_calls(cuda, host, bias_calls: dict, bias_launches: dict) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((256, 1, 28, 28)).astype(np.float32)
    dy = (rng.standard_normal((256, 20, 24, 24)) + 0.5).astype(np.float32)  # no channel sums to nearly 0
    layers = {}
    for backend in (host, cuda):
        layer = layers[backend.name] = build(Conv2D("conv1", 20, 5), (1, 28, 28), backend)
        layer.gradient_stop = False
        layer.forward(Tensor.from_numpy(x, backend))
        layer.backward(Tensor.from_numpy(dy, backend))
    error = relative_error(layers["cuda"].grad_bias.numpy(), layers["host"].grad_bias.numpy())
    assert error < 1e-5, f"grad_bias: relative error {error:.3g} against the host"
    layer, dy_cuda = layers["cuda"], Tensor.from_numpy(dy, cuda)
    calls, launches = counted(lambda: layer.backward(dy_cuda))
    convolution_only, convolution_launches = counted(lambda: convolution_calls(layer, dy_cuda))
    extra, missing = launches - convolution_launches, convolution_launches - launches
    assert extra == collections.Counter(bias_launches) and not missing, \
        f"backward launched {dict(launches)}, its convolutions {dict(convolution_launches)}"
    assert calls - convolution_only == collections.Counter(bias_calls) and not convolution_only - calls, \
        f"backward called {dict(calls)}, its convolutions {dict(convolution_only)}: the bias must add only its own calls"


@pytest.mark.gpu
def test_cuda_a_layer_planned_in_bf16_computes_in_the_precision_in_force_later(cuda):
    """A convolution planned under bf16 (a model trained in bf16) runs in fp32 once fp32 is in force
    (evaluating it in fp32): its plan is made anew, and y matches the direct convolution within fp32's error."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 3, 9, 9)).astype(np.float32)
    layer = build(Conv2D("conv", 16, 3), (3, 9, 9), cuda)
    with cuda.using(math="bf16"):
        layer.forward(Tensor.from_numpy(x, cuda))
        assert layer.plan.precision.name == "bf16"
    with cuda.using(math="fp32"):
        y = layer.forward(Tensor.from_numpy(x, cuda)).numpy()
        assert layer.plan.precision.name == "fp32"
    expected = direct_convolution(x, layer.weight.numpy(), layer.bias.numpy(), 1, 0, 1)
    assert relative_error(y, expected) < 1e-5  # bf16 operands would leave ~1e-3
