"""Shared checks for the layer tests: finite differences and cross-backend agreement."""

from __future__ import annotations

import numpy as np

from cudnnnet import Tensor
from cudnnnet.layers import Layer


def build(layer: Layer, sample_shape, backend, seed: int = 0) -> Layer:
    layer.build(tuple(sample_shape), backend, np.random.default_rng(seed))
    return layer


def relative_error(actual, expected) -> float:
    """‖actual - expected‖ / ‖expected‖ (absolute when the reference is zero)."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.size == expected.size, f"{actual.shape} and {expected.shape} differ in size"
    actual = actual.reshape(expected.shape)
    scale = np.linalg.norm(expected)
    return float(np.linalg.norm(actual - expected) / (scale if scale > 0 else 1.0))


def objective(layer: Layer, x: np.ndarray, weights: np.ndarray) -> float:
    """J = Σ f(x) ⊙ R: a scalar whose gradient with respect to f(x) is R."""
    output = layer.forward(Tensor.from_numpy(x, layer.backend)).numpy()
    return float(np.sum(output.astype(np.float64) * weights))


def numeric_gradient(function, values: np.ndarray, eps: float) -> np.ndarray:
    """Central differences of ``function()`` over every element of ``values`` (perturbed in place)."""
    grad = np.zeros(values.shape, np.float64)
    flat, grad_flat = values.reshape(-1), grad.reshape(-1)
    for index in range(flat.size):
        saved = flat[index]
        flat[index] = saved + eps
        plus = function()
        flat[index] = saved - eps
        minus = function()
        flat[index] = saved
        grad_flat[index] = (plus - minus) / (2 * eps)
    return grad


def check_layer_gradients(layer: Layer, x: np.ndarray, eps: float = 1e-2, tolerance: float = 2e-2, seed: int = 1):
    """Compare dx and every parameter gradient of ``layer`` with central differences of J = Σ f(x)·R."""
    rng = np.random.default_rng(seed)
    backend = layer.backend
    output = layer.forward(Tensor.from_numpy(x, backend))
    weights = rng.standard_normal(output.shape)
    layer.backward(Tensor.from_numpy(weights, backend))
    analytic_input = layer.grad_input.numpy()
    analytic_params = {p.name: p.grad.numpy() for p in layer.parameters()}
    x_work = x.astype(np.float32).copy()
    numeric_input = numeric_gradient(lambda: objective(layer, x_work, weights), x_work, eps)
    assert relative_error(analytic_input, numeric_input) < tolerance, "grad_input differs from finite differences"
    for parameter in layer.parameters():
        values = parameter.value.numpy()

        def perturbed(parameter=parameter, values=values):
            parameter.value.write_(values)
            return objective(layer, x, weights)

        numeric = numeric_gradient(perturbed, values, eps)
        parameter.value.write_(values)
        error = relative_error(analytic_params[parameter.name], numeric)
        assert error < tolerance, f"{parameter.name}: relative error {error:.2e} against finite differences"


def check_loss_gradient(layer: Layer, x: np.ndarray, target: np.ndarray, eps: float = 1e-2, tolerance: float = 2e-2):
    """Compare the loss layer's dx with central differences of its loss value."""
    backend = layer.backend
    target_tensor = Tensor.from_numpy(target, backend)
    loss_out = Tensor.zeros((1,), backend)
    layer.forward(Tensor.from_numpy(x, backend))
    analytic = layer.backward(target_tensor).numpy()
    x_work = x.astype(np.float32).copy()

    def loss():
        layer.forward(Tensor.from_numpy(x_work, backend))
        return layer.loss(target_tensor, loss_out).item()

    numeric = numeric_gradient(loss, x_work, eps)
    assert relative_error(analytic, numeric) < tolerance


def kink_free(rng: np.random.Generator, shape, spacing: float = 0.05) -> np.ndarray:
    """Distinct values at least ``spacing`` apart and away from 0: no max tie or ReLU kink within eps."""
    size = int(np.prod(shape))
    values = (np.arange(size) - size / 2 + 0.5) * spacing
    return rng.permutation(values).reshape(shape).astype(np.float32)
