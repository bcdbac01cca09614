import itertools

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

KERNEL_GEOMETRIES = [  # (window, padding, stride): max pooling here takes kernels/pooling.cu on CUDA
    (2, 0, 2),  # the CNN's; on 9×11 the last row and column lie in no window
    (3, 0, 3),
    (2, 0, 3),  # gaps between windows
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


def direct_max_pooling_gradient(x, dy, window, stride):
    """dx of max pooling without padding, one window at a time: each dy to its window's first cell
    (row-major, as np.argmax finds it) equal to the window's maximum."""
    n, c, _, _ = x.shape
    dx = np.zeros(x.shape, np.float32)
    samples, channels = np.meshgrid(np.arange(n), np.arange(c), indexing="ij")
    for i, j in itertools.product(range(dy.shape[2]), range(dy.shape[3])):
        cells = x[:, :, i * stride:i * stride + window, j * stride:j * stride + window].reshape(n, c, -1)
        r, s = np.divmod(cells.argmax(axis=2), window)
        np.add.at(dx, (samples, channels, i * stride + r, j * stride + s), dy[:, :, i, j])
    return dx


def _kernel_launches(backend):
    """The CUDA backend's counter of kernel launches, reset; None on the host."""
    if backend.name != "cuda":
        return None
    from cudnnnet.backends.cuda import kernel

    kernel.reset_launches()
    return kernel.launches


@pytest.mark.parametrize("window, padding, stride", KERNEL_GEOMETRIES)
def test_max_pooling_gradient_goes_to_the_first_maximum_of_each_window(backend, window, padding, stride, engine):
    """ReLU-like input (windows of zeros, tied maxima): dy goes to each window's first maximum, every
    other cell and the cells of no window get 0. On CUDA this is our kernel in the fast engine,
    cudnnPoolingBackward in the slides engine."""
    rng = np.random.default_rng(7)
    x = np.maximum(rng.integers(-2, 3, (3, 2, 9, 11)), 0).astype(np.float32)
    layer = build(Pooling("pool", window, padding, stride, "max"), (2, 9, 11), backend)
    layer.gradient_stop = False
    layer.forward(Tensor.from_numpy(x, backend))
    dy = rng.standard_normal(layer.output.shape).astype(np.float32)
    launches = _kernel_launches(backend)
    grad = layer.backward(Tensor.from_numpy(dy, backend)).numpy()
    expected = direct_max_pooling_gradient(x, dy, window, stride)
    wrong = np.argwhere(grad != expected)
    assert not len(wrong), (f"{len(wrong)} of {grad.size} dx values differ, the first at {tuple(wrong[0])}: "
                            f"{grad[tuple(wrong[0])]} != {expected[tuple(wrong[0])]}")
    if launches is not None:
        expected_launches = {"max_pooling_backward": 1} if engine == "fast" else {}
        assert dict(launches) == expected_launches, f"{engine} engine: launches {dict(launches)}"


def test_cuda_backward_takes_our_kernel_only_for_max_windows_that_do_not_overlap():
    """backends/cuda/pooling.supports, which CudaBackend.pooling_backward asks (pure Python: no GPU needed)."""
    from cudnnnet.backends.cuda import pooling

    cnn_input = (256, 20, 24, 24)

    def takes(layer):
        return pooling.supports(layer.descriptor, cnn_input)

    assert takes(Pooling("pool", 2)) and takes(Pooling("pool", 3)) and takes(Pooling("pool", 2, stride=3))
    assert not takes(Pooling("pool", 3, stride=2)), "overlapping windows are cuDNN's"
    assert not takes(Pooling("pool", 2, padding=1)), "padding is cuDNN's"
    assert not takes(Pooling("pool", 2, mode="average")), "average pooling is cuDNN's"
    assert not pooling.supports(Pooling("pool", 2).descriptor, (2**16, 2**8, 2**4, 2**3)), "2^31 values: 32-bit indices"


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
