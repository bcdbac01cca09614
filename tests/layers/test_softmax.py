import numpy as np
import pytest

from cudnnnet import Tensor
from cudnnnet.errors import ShapeError
from cudnnnet.layers import Softmax
from layer_checks import build, check_loss_gradient, relative_error


def one_hot(labels, classes=10):
    return np.eye(classes, dtype=np.float32)[labels]


def test_forward_is_softmax_and_loss_is_cross_entropy(backend):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((7, 10)) * 3).astype(np.float32)
    labels = rng.integers(0, 10, 7)
    layer = build(Softmax("softmax"), (10, 1, 1), backend)
    output = layer.forward(Tensor.from_numpy(x, backend)).numpy().reshape(7, 10)
    shifted = np.exp(x - x.max(axis=1, keepdims=True))
    expected = shifted / shifted.sum(axis=1, keepdims=True)
    assert relative_error(output, expected) < 1e-5
    loss = layer.loss(Tensor.from_numpy(one_hot(labels), backend), Tensor.zeros((1,), backend)).item()
    assert loss == pytest.approx(-np.mean(np.log(expected[np.arange(7), labels])), rel=1e-5)


def test_gradient_is_prediction_minus_target_over_n_and_matches_finite_differences(backend):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    target = one_hot(rng.integers(0, 4, 5), 4)
    layer = build(Softmax("softmax"), (4, 1, 1), backend)
    output = layer.forward(Tensor.from_numpy(x, backend)).numpy().reshape(5, 4)
    grad = layer.backward(Tensor.from_numpy(target, backend)).numpy().reshape(5, 4)
    assert relative_error(grad, (output - target) / 5) < 1e-5
    check_loss_gradient(layer, x, target, eps=1e-2)


def test_loss_of_a_zero_probability_is_clipped_not_infinite(backend):
    layer = build(Softmax("softmax"), (3, 1, 1), backend)
    layer.forward(Tensor.from_numpy(np.array([[100.0, -100.0, -100.0]]), backend))
    loss = layer.loss(Tensor.from_numpy(np.array([[0.0, 1.0, 0.0]]), backend), Tensor.zeros((1,), backend)).item()
    assert np.isfinite(loss) and loss == pytest.approx(-np.log(1e-7), rel=1e-4)


def test_accuracy_counts_argmax_matches(backend):
    layer = build(Softmax("softmax"), (3, 1, 1), backend)
    layer.forward(Tensor.from_numpy(np.array([[3.0, 1, 0], [0, 0, 5], [1, 2, 0]]), backend))
    count = layer.correct(Tensor.from_numpy(one_hot([0, 1, 1], 3), backend), Tensor.zeros((1,), backend)).item()
    assert count == 2


def test_target_of_the_wrong_shape_is_refused(backend):
    layer = build(Softmax("softmax"), (10, 1, 1), backend)
    layer.forward(Tensor.zeros((4, 10), backend))
    with pytest.raises(ShapeError, match=r"softmax.*\(4, 9, 1, 1\).*\(4, 10, 1, 1\)"):
        layer.backward(Tensor.zeros((4, 9), backend))
