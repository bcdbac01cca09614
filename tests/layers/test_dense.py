import numpy as np
import pytest

from cudnnnet import Tensor
from cudnnnet.errors import InvalidArgumentError, ShapeError
from cudnnnet.layers import Dense
from cudnnnet.layers.dense import column_blocks
from layer_checks import build, check_layer_gradients, relative_error


def test_forward_is_w_transposed_x_plus_b(backend):
    rng = np.random.default_rng(0)
    layer = build(Dense("fc", 5), (3, 2, 2), backend)  # a (3, 2, 2) sample is flattened to 12 inputs
    bias = rng.standard_normal(5).astype(np.float32)
    layer.bias.write_(bias)
    x = rng.standard_normal((7, 3, 2, 2)).astype(np.float32)
    output = layer.forward(Tensor.from_numpy(x, backend)).numpy()
    weight = layer.weight.numpy().reshape(5, 12)  # (out, in): the original's (in × out) column-major W
    expected = x.reshape(7, 12) @ weight.T + bias
    assert output.shape == (7, 5, 1, 1)
    assert relative_error(output.reshape(7, 5), expected) < 1e-5


def test_gradients_match_finite_differences(backend):
    rng = np.random.default_rng(1)
    layer = build(Dense("fc", 4), (3, 2, 1), backend)
    layer.bias.write_(rng.standard_normal(4))
    layer.gradient_stop = False
    check_layer_gradients(layer, rng.standard_normal((5, 3, 2, 1)).astype(np.float32))


def test_gradient_stop_skips_grad_input_but_not_parameters(backend):
    rng = np.random.default_rng(2)
    layer = build(Dense("fc", 3), (4, 1, 1), backend)
    layer.gradient_stop = True
    layer.forward(Tensor.from_numpy(rng.standard_normal((2, 4)), backend))
    layer.grad_input.fill_(7.0)
    dy = rng.standard_normal((2, 3)).astype(np.float32)
    layer.backward(Tensor.from_numpy(dy, backend))
    assert np.all(layer.grad_input.numpy() == 7.0)
    assert np.allclose(layer.grad_bias.numpy().reshape(-1), dy.sum(axis=0), atol=1e-6)


def test_he_uniform_initialisation_is_bounded_and_seeded(backend):
    first = build(Dense("fc", 300), (200, 1, 1), backend, seed=5).weight.numpy()
    again = build(Dense("fc", 300), (200, 1, 1), backend, seed=5).weight.numpy()
    other = build(Dense("fc", 300), (200, 1, 1), backend, seed=6).weight.numpy()
    bound = np.sqrt(6 / 200)
    assert np.abs(first).max() <= bound
    assert abs(first.std() - bound / np.sqrt(3)) < 0.01 * bound
    assert np.array_equal(first, again) and not np.array_equal(first, other)


def test_wrong_input_shape_names_the_layer_and_both_shapes(backend):
    layer = build(Dense("fc1", 3), (4, 1, 1), backend)
    with pytest.raises(ShapeError, match=r"fc1.*\(N, 4, 1, 1\).*\(2, 5, 1, 1\)"):
        layer.forward(Tensor.zeros((2, 5), backend))


@pytest.mark.parametrize("size", [0, -3, 2.5, True, "10"])
def test_invalid_out_size_is_refused(size):
    with pytest.raises(InvalidArgumentError, match="out_size"):
        Dense("fc", size)


@pytest.mark.parametrize("columns, blocks, expected", [
    (150, 3, [(0, 64), (64, 64), (128, 22)]), (150, 1, [(0, 150)]), (64, 4, [(0, 64)]),
    (200, 2, [(0, 128), (128, 72)])])
def test_column_blocks_cover_the_columns_once_in_aligned_blocks(columns, blocks, expected):
    assert column_blocks(columns, blocks) == expected


def test_the_weight_gradient_in_column_blocks_is_the_whole_gradient(backend):
    """dW computed one block of output columns at a time (several GPUs average each block meanwhile)
    equals the one GEMM's, and each block is handed over once, in order, as a view of dW."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((9, 20, 1, 1)).astype(np.float32)
    dy = rng.standard_normal((9, 150, 1, 1)).astype(np.float32)
    whole, blocked = (build(Dense("fc", 150), (20, 1, 1), backend, seed=4) for _ in range(2))
    handed = []
    blocked.grad_weight_blocks, blocked.grad_weight_ready = 3, lambda block: handed.append(block.numpy().copy())
    for layer in (whole, blocked):
        layer.forward(Tensor.from_numpy(x, backend))
        layer.backward(Tensor.from_numpy(dy, backend))
    expected = whole.grad_weight.numpy()
    np.testing.assert_allclose(blocked.grad_weight.numpy(), expected, rtol=1e-6, atol=1e-6)
    assert relative_error(expected.reshape(150, 20), dy.reshape(9, 150).T @ x.reshape(9, 20)) < 1e-5
    assert [block.size for block in handed] == [64 * 20, 64 * 20, 22 * 20]
    np.testing.assert_array_equal(np.concatenate([block.reshape(-1) for block in handed]),
                                  blocked.grad_weight.numpy().reshape(-1))
