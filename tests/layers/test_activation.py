import re

import numpy as np
import pytest

from cudnnnet import Tensor
from cudnnnet.errors import InvalidArgumentError
from cudnnnet.layers import Activation
from layer_checks import build, check_layer_gradients, kink_free, relative_error

REFERENCES = {
    "relu": lambda x, coef: np.maximum(x, 0),
    "sigmoid": lambda x, coef: 1 / (1 + np.exp(-x)),
    "tanh": lambda x, coef: np.tanh(x),
    "clipped_relu": lambda x, coef: np.clip(x, 0, coef),
    "elu": lambda x, coef: np.where(x > 0, x, coef * (np.exp(x) - 1)),
}
MODES = [("relu", 0.0), ("sigmoid", 0.0), ("tanh", 0.0), ("clipped_relu", 0.6), ("elu", 0.7)]


@pytest.mark.parametrize("mode, coef", MODES)
def test_forward_matches_the_formula(backend, mode, coef):
    x = np.random.default_rng(0).standard_normal((7, 3, 4, 5)).astype(np.float32)
    layer = build(Activation("act", mode, coef), (3, 4, 5), backend)
    output = layer.forward(Tensor.from_numpy(x, backend)).numpy()
    assert relative_error(output, REFERENCES[mode](x.astype(np.float64), coef)) < 1e-5


@pytest.mark.parametrize("mode, coef", MODES)
def test_gradient_matches_finite_differences(backend, mode, coef):
    x = kink_free(np.random.default_rng(1), (2, 3, 2, 3), spacing=0.07)  # no value within eps of 0 or coef
    x[np.abs(x - coef) < 0.03] += 0.05
    layer = build(Activation("act", mode, coef), (3, 2, 3), backend)
    check_layer_gradients(layer, x, eps=1e-2)


def test_unknown_mode_lists_the_valid_ones():
    with pytest.raises(InvalidArgumentError, match="unknown activation mode 'swish'.*relu"):
        Activation("act", "swish")


def test_clipped_relu_needs_a_positive_threshold():
    with pytest.raises(InvalidArgumentError, match="coef > 0"):
        Activation("act", "clipped_relu", 0)


@pytest.mark.parametrize("mode, coef", [("clipped_relu", 1.0e39), ("elu", -1.0e39), ("clipped_relu", float("nan")),
                                        ("elu", float("inf")), ("elu", "1.0")])
def test_a_coef_float32_cannot_hold_is_refused(mode, coef):
    """float32 makes 1e39 inf: a clipped ReLU that clips nothing, an ELU of infinite outputs."""
    with pytest.raises(InvalidArgumentError, match=rf"layer 'act': coef must be a finite number in \[-3\.40282e\+38, "
                                                   rf"3\.40282e\+38\] \(float32's range\), got {re.escape(repr(coef))}"):
        Activation("act", mode, coef)
