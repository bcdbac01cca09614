import numpy as np
import pytest

from cudnnnet import Tensor
from cudnnnet.layers import MSE
from layer_checks import build, check_loss_gradient, relative_error


def test_forward_is_identity_and_loss_is_half_squared_error_per_sample(backend):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((7, 3)).astype(np.float32)
    target = rng.standard_normal((7, 3)).astype(np.float32)
    layer = build(MSE("mse"), (3, 1, 1), backend)
    assert relative_error(layer.forward(Tensor.from_numpy(x, backend)).numpy().reshape(7, 3), x) < 1e-7
    loss = layer.loss(Tensor.from_numpy(target, backend), Tensor.zeros((1,), backend)).item()
    assert loss == pytest.approx(0.5 * np.sum((x - target) ** 2) / 7, rel=1e-5)


def test_gradient_matches_finite_differences(backend):
    rng = np.random.default_rng(1)
    layer = build(MSE("mse"), (4, 1, 1), backend)
    check_loss_gradient(layer, rng.standard_normal((5, 4)).astype(np.float32),
                        rng.standard_normal((5, 4)).astype(np.float32))
