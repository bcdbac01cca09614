"""Batch normalisation on the host, in float64 from the definition (cuDNN's semantics): the host
backend's ``batch_norm_*`` verbs compute here."""

from __future__ import annotations

import numpy as np

from ...tensor import Tensor
from ..arguments import batch_norm_parameter_shape
from ..descriptors import BatchNormMode


def _nd(tensor: Tensor) -> np.ndarray:
    """The tensor's values as an (n, c, h, w) view of its flat storage (no copy)."""
    return tensor.data[: tensor.size].reshape(tensor.shape)


def forward_training(mode, x, y, scale, bias, factor: float, running_mean, running_var, eps: float, save_mean,
                     save_inv_std, relu: bool, communicator=None) -> None:
    """Batch statistics in float64 (over every rank's batch with a ``communicator``), cuDNN's running
    averages (unbiased variance); y = max(y, 0) where ``relu``."""
    axes, shape = batch_norm_axes(mode, x)
    values = _nd(x).astype(np.float64)
    mean, variance, count = _statistics(values, axes, shape, communicator)
    inv_std = 1.0 / np.sqrt(variance + eps)
    _nd(y)[...] = _nd(scale).reshape(shape) * (values - mean) * inv_std + _nd(bias).reshape(shape)
    if relu:
        np.maximum(_nd(y), 0, out=_nd(y))
    unbiased = variance * count / max(count - 1, 1)
    _nd(running_mean)[...] = ((1 - factor) * _nd(running_mean).reshape(shape) + factor * mean).reshape(running_mean.shape)
    _nd(running_var)[...] = ((1 - factor) * _nd(running_var).reshape(shape) + factor * unbiased).reshape(running_var.shape)
    _nd(save_mean)[...] = mean.reshape(save_mean.shape)
    _nd(save_inv_std)[...] = inv_std.reshape(save_inv_std.shape)


def _statistics(values: np.ndarray, axes, shape, communicator) -> tuple[np.ndarray, np.ndarray, float]:
    """(μ, σ², m): of this batch (two passes), or from (Σ x, Σ x², m) summed over the ranks."""
    count = values.size // int(np.prod(shape))
    if communicator is None:
        mean = values.mean(axis=axes, keepdims=True)
        return mean, ((values - mean) ** 2).mean(axis=axes, keepdims=True), count
    total, squares, count = _summed_over_ranks(values.sum(axis=axes), (values * values).sum(axis=axes), count,
                                               communicator)
    mean = (total / count).reshape(shape)
    return mean, np.maximum(squares.reshape(shape) / count - mean * mean, 0.0), count


def _summed_over_ranks(a: np.ndarray, b: np.ndarray, count: int, communicator) -> tuple[np.ndarray, np.ndarray, float]:
    """(Σ_ranks a, Σ_ranks b, Σ_ranks count) through one all-reduce of the totals [(a, b) per channel, count]."""
    totals = np.empty(2 * a.size + 1)
    totals[0:-1:2], totals[1:-1:2], totals[-1] = a.ravel(), b.ravel(), count
    communicator.all_reduce_sum_float64(totals, totals.size)
    return totals[0:-1:2], totals[1:-1:2], float(totals[-1])


def forward_inference(mode, x, y, scale, bias, mean, var, eps: float) -> None:
    """y = scale·(x - mean)/√(var + eps) + bias."""
    _, shape = batch_norm_axes(mode, x)
    inv_std = 1.0 / np.sqrt(_nd(var).reshape(shape).astype(np.float64) + eps)
    _nd(y)[...] = _nd(scale).reshape(shape) * (_nd(x) - _nd(mean).reshape(shape)) * inv_std + _nd(bias).reshape(shape)


def backward(mode, x, dy, dx, scale, dscale, dbias, save_mean, save_inv_std, bias, relu: bool,
             communicator=None) -> None:
    """dbias = Σ dy;  dscale = Σ dy·x̂;  dx = scale·inv_std/m·(m·dy - dbias - x̂·dscale); with ``relu``
    dy·[scale·x̂ + bias > 0] in place of dy (the gradient through the forward's ReLU). With a
    ``communicator`` dx takes the sums and m of every rank; dscale and dbias stay this rank's."""
    axes, shape = batch_norm_axes(mode, x)
    inv_std = _nd(save_inv_std).reshape(shape).astype(np.float64)
    centred = _nd(x) - _nd(save_mean).reshape(shape)  # x - μ
    normalized = centred * inv_std  # x̂
    grad = _nd(dy).astype(np.float64)
    if relu:
        grad = np.where(_nd(scale).reshape(shape) * normalized + _nd(bias).reshape(shape) > 0, grad, 0.0)
    count = grad.size // int(np.prod(shape))
    bias_grad = grad.sum(axis=axes, keepdims=True)
    scale_grad = (grad * normalized).sum(axis=axes, keepdims=True)
    _nd(dscale)[...] = scale_grad.reshape(dscale.shape)
    _nd(dbias)[...] = bias_grad.reshape(dbias.shape)
    if communicator is not None:
        bias_grad, products, count = _summed_over_ranks(bias_grad, (grad * centred).sum(axis=axes), count,
                                                        communicator)
        bias_grad, scale_grad = bias_grad.reshape(shape), products.reshape(shape) * inv_std
    _nd(dx)[...] = _nd(scale).reshape(shape) * inv_std / count * (count * grad - bias_grad - normalized * scale_grad)


def batch_norm_axes(mode, x: Tensor) -> tuple[tuple[int, ...], tuple[int, int, int, int]]:
    """(the axes statistics run over, the parameters' shape) for ``mode``, which the verb has checked."""
    axes = (0, 2, 3) if mode == BatchNormMode.SPATIAL else (0,)
    return axes, batch_norm_parameter_shape("batch normalisation", mode, x)
