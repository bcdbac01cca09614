import numpy as np
import pytest

from cudnnnet import Tensor
from cudnnnet.errors import InvalidArgumentError, ShapeError
from cudnnnet.layers import Pooling
from layer_checks import build, check_layer_gradients, kink_free, relative_error

GEOMETRIES = [  # (window, padding, stride)
    (2, 0, 2),
    (3, 1, 2),
    (3, 0, 1),  # overlapping windows
    (2, 1, 1),
]


def direct_pooling(x, mode, window, padding, stride):
    n, c, h, w = x.shape
    fill = -np.inf if mode == "max" else 0.0
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (padding, padding), (padding, padding)),
                    constant_values=fill)
    out_h, out_w = (h + 2 * padding - window) // stride + 1, (w + 2 * padding - window) // stride + 1
    y = np.zeros((n, c, out_h, out_w))
    for i in range(out_h):
        for j in range(out_w):
            cell = padded[:, :, i * stride:i * stride + window, j * stride:j * stride + window]
            y[:, :, i, j] = cell.max(axis=(2, 3)) if mode == "max" else cell.sum(axis=(2, 3)) / window ** 2
    return y


@pytest.mark.parametrize("mode", ["max", "average"])
@pytest.mark.parametrize("window, padding, stride", GEOMETRIES)
def test_forward_matches_direct_pooling(backend, mode, window, padding, stride):
    x = np.random.default_rng(0).standard_normal((5, 3, 7, 8)).astype(np.float32)
    layer = build(Pooling("pool", window, padding, stride, mode), (3, 7, 8), backend)
    output = layer.forward(Tensor.from_numpy(x, backend)).numpy()
    assert relative_error(output, direct_pooling(x, mode, window, padding, stride)) < 1e-6


@pytest.mark.parametrize("mode", ["max", "average"])
@pytest.mark.parametrize("window, padding, stride", GEOMETRIES)
def test_gradient_matches_finite_differences(backend, mode, window, padding, stride):
    x = kink_free(np.random.default_rng(1), (2, 2, 5, 6))  # distinct values: no ties within eps
    layer = build(Pooling("pool", window, padding, stride, mode), (2, 5, 6), backend)
    check_layer_gradients(layer, x, eps=1e-2)


def test_stride_defaults_to_the_window():
    assert Pooling("pool", 2).output_sample_shape((20, 24, 24)) == (20, 12, 12)


def test_window_larger_than_input_names_the_layer():
    with pytest.raises(ShapeError, match=r"pool2.*window 3.*2×2"):
        Pooling("pool2", 3).output_sample_shape((4, 2, 2))


def test_invalid_arguments_are_refused():
    with pytest.raises(InvalidArgumentError, match="unknown pooling mode 'min'"):
        Pooling("pool", 2, mode="min")
    with pytest.raises(InvalidArgumentError, match="padding 2 must be smaller than kernel_size 2"):
        Pooling("pool", 2, padding=2)
