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
