"""Each public verb checks its arguments once, in base.Backend, and then calls the backend's
implementation (``_verb``): no backend overrides a checked verb, and a bad argument is refused with
the call's message before any implementation runs. Runs without a GPU (CudaBackend is only inspected)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from cudnnnet.backends.base import OP_N, Backend
from cudnnnet.backends.descriptors import (ActivationDescriptor, ActivationMode, BatchNormMode, ConvolutionDescriptor,
                                           PoolingDescriptor, PoolingMode)
from cudnnnet.backends.cuda.backend import CudaBackend
from cudnnnet.backends.host import HostBackend
from cudnnnet.errors import ShapeError, UsageError
from cudnnnet.tensor import Tensor

CHECKED_VERBS = (
    "sgemm", "sgemv", "saxpy", "sscal", "scopy", "activation_forward", "activation_backward", "softmax_forward",
    "add_tensor", "convolution_forward", "convolution_backward_data", "convolution_backward_filter",
    "convolution_backward_bias", "pooling_forward", "pooling_backward", "cross_entropy_loss", "squared_error_loss",
    "accuracy_count", "record_nonfinite", "gather_batch", "gather_augmented_batch", "sgd_update",
    "bias_activation_forward", "activation_bias_backward", "cross_entropy_backward", "softmax_cross_entropy_backward",
    "softmax_cross_entropy_metrics", "sgd_update_many", "adam_update_many", "find_nonfinite_gradients",
    "update_loss_scale", "dropout_forward", "dropout_backward", "batch_norm_forward_training",
    "batch_norm_forward_inference", "batch_norm_backward",
)


@pytest.mark.parametrize("verb", CHECKED_VERBS)
@pytest.mark.parametrize("backend_class", [HostBackend, CudaBackend])
def test_a_checked_verb_is_the_base_s_and_the_backend_implements_its_private_half(backend_class, verb):
    assert getattr(backend_class, verb) is getattr(Backend, verb)
    assert getattr(Backend, f"_{verb}").__isabstractmethod__
    implementation = getattr(backend_class, f"_{verb}")
    assert not getattr(implementation, "__isabstractmethod__", False)
    assert list(inspect.signature(implementation).parameters) == list(inspect.signature(getattr(Backend, verb)).parameters)


def T(shape) -> Tensor:
    return Tensor.zeros(shape, "host")


DESC = ConvolutionDescriptor(2, 1, 3)
POOL = PoolingDescriptor(PoolingMode.MAX, 2, stride=2)
RELU = ActivationDescriptor(ActivationMode.RELU)
X = T((2, 4, 3, 3))  # a batch normalisation's input: SPATIAL parameters (1, 4, 1, 1)


def CHANNELS(count: int) -> list[Tensor]:
    """``count`` per-channel parameters of X in mode SPATIAL."""
    return [T((1, 4, 1, 1)) for _ in range(count)]

# (verb, arguments (made on the host backend), error type, the message's start)
BAD_CALLS = [
    ("sgemm", lambda b: (OP_N, OP_N, 4, 3, 3, 1.0, T((12,)), 3, T((12,)), 3, 0.0, T((12,)), 4), ShapeError,
     "sgemm: leading dimension of A must be >= max(1, 4), got 3"),
    ("sgemm", lambda b: (2, OP_N, 2, 2, 2, 1.0, T((4,)), 2, T((4,)), 2, 0.0, T((4,)), 2), UsageError,
     "invalid transpose flag for A: 2"),
    ("saxpy", lambda b: (3, 1.0, T((3,)), 0, T((3,)), 1), UsageError, "saxpy: increment of x must be non-zero"),
    ("scopy", lambda b: (3, T((3,)), 1, T((2,)), 1), ShapeError, "scopy: y (n=3, inc=1) needs 3 values"),
    ("activation_forward", lambda b: (RELU, 1.0, T((2, 3, 1, 1)), 0.0, T((2, 4, 1, 1))), ShapeError,
     "activation_forward: tensors must have the same shape"),
    ("convolution_forward", lambda b: (object(), 1.0, T((1, 1, 5, 5)), T(DESC.filter_shape), 0.0, T((1, 2, 3, 3))),
     UsageError, "convolution_forward: expected a plan from HostBackend.convolution_plan, got object"),
    ("convolution_backward_data",
     lambda b: (b.convolution_plan(DESC, (1, 1, 5, 5), (1, 2, 3, 3)), 1.0, T(DESC.filter_shape), T((1, 2, 3, 3)), 0.0,
                T((1, 1, 5, 4))), ShapeError, "convolution_backward_data: the input must have shape (1, 1, 5, 5)"),
    ("pooling_backward", lambda b: (POOL, 1.0, T((1, 1, 1, 1)), T((1, 1, 2, 2)), T((1, 1, 4, 4)), 0.0, T((1, 1, 4, 4))),
     ShapeError, "pooling_backward: y must have shape (1, 1, 2, 2)"),
    ("gather_batch", lambda b: (T((4, 1, 2, 2)), T((3,)), T((4,)), T((1,)), T((2, 1, 2, 2)), T((2, 3, 1, 1))),
     ShapeError, "gather_batch: images (4, 1, 2, 2), labels (3, 1, 1, 1)"),
    ("softmax_cross_entropy_metrics", lambda b: (T((2, 3, 1, 1)), T((2, 4, 1, 1)), T((1,)), T((1,)), 0.5), ShapeError,
     "softmax_cross_entropy_metrics: tensors must have the same shape, got (2, 3, 1, 1) and (2, 4, 1, 1)"),
    ("sgd_update_many", lambda b: ([(T((3,)), T((3,)), None)], 0.1, 0.9, 0.0), UsageError,
     "sgd_update_many: momentum is non-zero but a parameter has no velocity tensor"),
    ("adam_update_many", lambda b: ([], 0.1, T((3,)), 0.9, 0.999, 1e-8, 0.0, False), ShapeError,
     "adam_update_many: counter must hold 2 values (steps, 0), got shape (3, 1, 1, 1)"),
    ("dropout_backward", lambda b: (b.dropout_state(0.5, 0), b.dropout_reserve(None, (2, 3, 1, 1)), T((2, 4, 1, 1)),
                                    T((2, 4, 1, 1))), ShapeError,
     "dropout_backward: dy (the reserve's shape) must have shape (2, 3, 1, 1)"),
    ("batch_norm_forward_training", lambda b: (BatchNormMode.SPATIAL, X, T((2, 4, 3, 2)), *CHANNELS(4), 0.1, *CHANNELS(2),
                                               1e-5, *CHANNELS(2)), ShapeError,
     "batch_norm_forward_training: tensors must have the same shape, got (2, 4, 3, 3) and (2, 4, 3, 2)"),
    ("batch_norm_forward_training", lambda b: (BatchNormMode.SPATIAL, X, T(X.shape), *CHANNELS(2), 0.1, CHANNELS(1)[0],
                                               T((1, 3, 1, 1)), 1e-5, *CHANNELS(2)), ShapeError,
     "batch_norm_forward_training: a parameter of shape (1, 3, 1, 1) does not fit x (2, 4, 3, 3) in mode SPATIAL; "
     "expected (1, 4, 1, 1)"),
    ("batch_norm_forward_inference", lambda b: (7, X, T(X.shape), *CHANNELS(4), 1e-5), UsageError,
     "batch_norm_forward_inference: unknown mode 7; valid are PER_ACTIVATION (0) and SPATIAL (1)"),
    ("batch_norm_forward_inference", lambda b: (BatchNormMode.PER_ACTIVATION, X, T(X.shape), *CHANNELS(4), 1e-5),
     ShapeError, "batch_norm_forward_inference: a parameter of shape (1, 4, 1, 1) does not fit x (2, 4, 3, 3) in mode "
                 "PER_ACTIVATION; expected (1, 4, 3, 3)"),
    ("batch_norm_backward", lambda b: (BatchNormMode.SPATIAL, X, T(X.shape), T((2, 4, 1, 1)), *CHANNELS(3), 1e-5,
                                       *CHANNELS(2)), ShapeError,
     "batch_norm_backward: tensors must have the same shape, got (2, 4, 3, 3) and (2, 4, 1, 1)"),
    ("batch_norm_backward", lambda b: (BatchNormMode.SPATIAL, X, T(X.shape), T(X.shape), *CHANNELS(3), 1e-5,
                                       *CHANNELS(2), None, True), UsageError,
     "batch_norm_backward: relu needs the bias (the forward's ReLU is recomputed from x)"),
    ("batch_norm_backward", lambda b: (BatchNormMode.SPATIAL, X, T(X.shape), T(X.shape), *CHANNELS(3), 1e-5,
                                       *CHANNELS(2), T((1, 5, 1, 1)), True), ShapeError,
     "batch_norm_backward: a parameter of shape (1, 5, 1, 1) does not fit x (2, 4, 3, 3) in mode SPATIAL"),
]


@pytest.mark.parametrize("verb, arguments, error, message", BAD_CALLS, ids=[call[0] for call in BAD_CALLS])
def test_a_bad_argument_is_refused_with_the_call_s_message_before_the_implementation_runs(monkeypatch, verb, arguments,
                                                                                       error, message):
    host = HostBackend()
    monkeypatch.setattr(host, f"_{verb}", lambda *args: pytest.fail(f"_{verb} ran on arguments its verb refuses"))
    with pytest.raises(error) as caught:
        getattr(host, verb)(*arguments(host))
    assert str(caught.value).startswith(message), str(caught.value)


def test_good_arguments_reach_the_implementation_once(monkeypatch):
    host, calls = HostBackend(), []
    monkeypatch.setattr(host, "_saxpy", lambda *args: calls.append(args))
    x, y = Tensor.from_numpy(np.ones(3, np.float32), host), T((3,))
    host.saxpy(3, 2.0, x, 1, y, 1)
    assert calls == [(3, 2.0, x, 1, y, 1)]
