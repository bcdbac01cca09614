import numpy as np
import pytest

from cudnnnet import Network, Tensor
from cudnnnet.config.schema import parse_config
from cudnnnet.errors import ShapeError
from cudnnnet.layers import Conv2D, GlobalAveragePooling, Softmax
from layer_checks import build, check_layer_gradients, relative_error


def test_forward_is_each_planes_mean(backend):
    x = np.random.default_rng(0).standard_normal((4, 3, 7, 7)).astype(np.float32)
    layer = build(GlobalAveragePooling("gap"), (3, 7, 7), backend)
    y = layer.forward(Tensor.from_numpy(x, backend)).numpy()
    assert y.shape == (4, 3, 1, 1)
    assert relative_error(y, x.astype(np.float64).mean(axis=(2, 3), keepdims=True)) < 1e-6


def test_backward_spreads_dy_evenly_and_matches_finite_differences(backend):
    layer = build(GlobalAveragePooling("gap"), (2, 5, 5), backend)
    x = np.random.default_rng(1).standard_normal((3, 2, 5, 5)).astype(np.float32)
    layer.forward(Tensor.from_numpy(x, backend))
    dy = np.random.default_rng(2).standard_normal((3, 2, 1, 1)).astype(np.float32)
    dx = layer.backward(Tensor.from_numpy(dy, backend)).numpy()
    assert relative_error(dx, np.broadcast_to(dy / 25, x.shape)) < 1e-6
    check_layer_gradients(layer, x)


@pytest.mark.gpu
def test_cuda_matches_the_host(cuda, host):
    x = np.random.default_rng(3).standard_normal((8, 16, 6, 6)).astype(np.float32)
    dy = np.random.default_rng(4).standard_normal((8, 16, 1, 1)).astype(np.float32)
    results = []
    for backend in (host, cuda):
        layer = build(GlobalAveragePooling("gap"), (16, 6, 6), backend)
        results.append((layer.forward(Tensor.from_numpy(x, backend)).numpy(),
                        layer.backward(Tensor.from_numpy(dy, backend)).numpy()))
    assert relative_error(results[1][0], results[0][0]) < 1e-6
    assert relative_error(results[1][1], results[0][1]) < 1e-6


def test_a_network_ends_in_global_average_pooling_of_class_maps(host):
    """conv (10 channels) → GAP → softmax: a classifier with no Dense layer."""
    network = Network(backend=host, layers=[Conv2D("conv", 10, 3), GlobalAveragePooling("gap"), Softmax("softmax")])
    network.build((1, 8, 8))
    assert network.output_shapes((1, 8, 8))[1] == (10, 1, 1)
    output = network.forward(np.zeros((2, 1, 8, 8), np.float32)).numpy()
    assert np.allclose(output.sum(axis=1), 1.0)


def test_non_square_planes_are_refused(host):
    with pytest.raises(ShapeError, match="'gap': global average pooling needs a square plane"):
        build(GlobalAveragePooling("gap"), (3, 4, 5), host)


def test_config_reads_global_average_pooling():
    model = [{"type": "conv2d", "out_channels": 10, "kernel_size": 3}, {"type": "global_average_pooling"},
             {"type": "softmax"}]
    config = parse_config({"model": model, "train": {"optimizer": {"lr": 0.1}}})
    assert config.model[1].type == "global_average_pooling" and config.model[1].params == {}
