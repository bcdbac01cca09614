import numpy as np
import pytest

from cudnnnet import Network, Tensor
from cudnnnet.config.schema import parse_config
from cudnnnet.errors import ConfigError, InvalidArgumentError, ShapeError
from cudnnnet.layers import Dense, Dropout, Softmax
from cudnnnet.train.trainer import evaluate
from layer_checks import build

SHAPE = (64, 8, 12, 12)  # 73 728 values: the kept fraction is within ±0.01 of 1 - rate by a wide margin


def positive_input(seed: int = 0) -> np.ndarray:
    """Values in [0.5, 1.5): none is 0, so y/x shows the mask."""
    return (np.random.default_rng(seed).random(SHAPE) + 0.5).astype(np.float32)


def forward_backward(layer, x, dy):
    """(y, dx) as host arrays."""
    backend = layer.backend
    y = layer.forward(Tensor.from_numpy(x, backend)).numpy()
    dx = layer.backward(Tensor.from_numpy(dy, backend)).numpy()
    return y, dx


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.8])
def test_keeps_about_one_minus_rate_scales_by_its_inverse_and_backward_uses_the_same_mask(backend, rate):
    layer = build(Dropout("drop", rate), SHAPE[1:], backend)
    x, dy = positive_input(0), positive_input(1)
    y, dx = forward_backward(layer, x, dy)
    kept = y != 0
    assert abs(kept.mean() - (1 - rate)) < 0.01
    assert np.allclose(y[kept], x[kept] / (1 - rate), rtol=1e-6)
    assert np.array_equal(dx != 0, kept)  # the forward's mask, not a new one
    assert np.allclose(dx[kept], dy[kept] / (1 - rate), rtol=1e-6)


def test_each_forward_draws_a_new_mask_and_the_same_seed_gives_the_same_masks(backend):
    x = positive_input()
    masks = []
    for _ in range(2):  # two layers built alike: the same stream of masks
        layer = build(Dropout("drop", 0.5), SHAPE[1:], backend, seed=7)
        masks.append([layer.forward(Tensor.from_numpy(x, backend)).numpy() != 0 for _ in range(2)])
    assert np.array_equal(masks[0][0], masks[1][0]) and np.array_equal(masks[0][1], masks[1][1])
    assert not np.array_equal(masks[0][0], masks[0][1])
    other = build(Dropout("drop", 0.5), SHAPE[1:], backend, seed=8)
    assert not np.array_equal(other.forward(Tensor.from_numpy(x, backend)).numpy() != 0, masks[0][0])


def test_skipping_masks_leaves_the_generator_where_those_forwards_would(backend):
    """Three forwards (two of 64 samples, one of 5) against skip_masks over the same runs: the fourth
    mask is the same; skipping other sizes, or none at all, gives another one."""
    x = positive_input()

    def fourth_mask(skip=None):
        layer = build(Dropout("drop", 0.5), SHAPE[1:], backend, seed=7)
        if skip is None:
            for batch in (x, x, x[:5]):
                layer.forward(Tensor.from_numpy(batch, backend))
        else:
            layer.skip_masks(skip)
        return layer.forward(Tensor.from_numpy(x, backend)).numpy() != 0

    ran = fourth_mask()
    assert np.array_equal(fourth_mask([(64, 2), (5, 1)]), ran)
    assert not np.array_equal(fourth_mask([(64, 1)]), ran)
    assert not np.array_equal(fourth_mask([]), ran)


def test_evaluation_mode_is_the_identity(backend):
    layer = build(Dropout("drop", 0.5), SHAPE[1:], backend)
    layer.training = False
    x, dy = positive_input(0), positive_input(1)
    y, dx = forward_backward(layer, x, dy)
    assert np.array_equal(y, x) and np.array_equal(dx, dy)


def test_backward_follows_the_mode_of_the_forward_it_differentiates(backend):
    """The mode switched between forward and backward: the backward of a masked forward ignored the mask
    (dx = dy), that of an identity forward failed on the missing gradient buffer."""
    layer = build(Dropout("drop", 0.5), SHAPE[1:], backend)
    x, dy = positive_input(0), positive_input(1)
    y = layer.forward(Tensor.from_numpy(x, backend)).numpy()
    layer.training = False
    dx = layer.backward(Tensor.from_numpy(dy, backend)).numpy()
    assert np.array_equal(dx != 0, y != 0)
    y = layer.forward(Tensor.from_numpy(x, backend)).numpy()
    layer.training = True
    dx = layer.backward(Tensor.from_numpy(dy, backend)).numpy()
    assert np.array_equal(y, x) and np.array_equal(dx, dy)


def test_a_network_trains_with_dropout_and_evaluates_and_predicts_without_it(backend):
    network = Network(backend=backend, seed=3, layers=[Dense("fc", 16), Dropout("drop", 0.5), Dense("out", 10),
                                                       Softmax("softmax")]).build((5, 1, 1))
    x = np.random.default_rng(0).standard_normal((32, 5)).astype(np.float32)
    trained = [network.forward(x).numpy() for _ in range(2)]
    assert not np.allclose(trained[0], trained[1])  # training mode: a new mask each pass
    predicted = [network.predict(x).numpy() for _ in range(2)]
    assert np.array_equal(predicted[0], predicted[1]) and network.training  # predict: eval mode, then back
    network.eval()
    assert np.array_equal(network.forward(x).numpy(), predicted[0])
    network.train()
    labels = np.arange(32) % 10
    first, second = (evaluate(network, x.reshape(32, 5, 1, 1), labels, batch_size=8) for _ in range(2))
    assert (first.loss, first.accuracy) == (second.loss, second.accuracy) and network.training


@pytest.mark.gpu
def test_a_replayed_graph_draws_a_new_mask_at_every_replay(cuda):
    """cudnnDropoutForward advances its states buffer in place: each replay of the captured forward
    and backward has a mask of its own, and its backward uses that replay's mask."""
    layer = build(Dropout("drop", 0.5), SHAPE[1:], cuda)
    x, dy = Tensor.from_numpy(positive_input(0), cuda), Tensor.from_numpy(positive_input(1), cuda)
    layer.forward(x)
    layer.backward(dy)  # the reserve and the cuDNN handle exist before the capture
    with cuda.capture() as graph:
        layer.forward(x)
        layer.backward(dy)
    masks = []
    for _ in range(3):
        graph.launch()
        y, dx = layer.output.numpy(), layer.grad_input.numpy()
        assert np.array_equal(dx != 0, y != 0)
        assert abs((y != 0).mean() - 0.5) < 0.01
        masks.append(y != 0)
    assert not np.array_equal(masks[0], masks[1]) and not np.array_equal(masks[1], masks[2])


def test_a_moved_layer_keeps_its_rate_and_seed(host):
    layer = build(Dropout("drop", 0.25), SHAPE[1:], host, seed=5)
    seed = layer.seed
    layer.to(host)
    assert layer.seed == seed and layer.state.rate == 0.25


@pytest.mark.parametrize("rate", [-0.1, 1.0, "0.5", True])
def test_invalid_rates_are_refused(rate):
    with pytest.raises(InvalidArgumentError, match="rate must be a number in \\[0, 1\\)"):
        Dropout("drop", rate)


def test_input_shape_is_checked(backend):
    layer = build(Dropout("drop", 0.5), (3, 4, 4), backend)
    with pytest.raises(ShapeError, match="'drop' expects input of shape"):
        layer.forward(Tensor.zeros((2, 3, 4, 5), backend))


def test_config_reads_dropout_with_its_default_rate():
    model = [{"type": "dense", "out_size": 8}, {"type": "dropout"}, {"type": "dropout", "rate": 0.2}, {"type": "softmax"}]
    config = parse_config({"model": model, "train": {"optimizer": {"lr": 0.1}}})
    assert [layer.params for layer in config.model[1:3]] == [{"rate": 0.5}, {"rate": 0.2}]
    model[1]["rate"] = 1
    with pytest.raises(ConfigError, match=r"model\[1\].rate: expected a number in \[0, 1\), got 1"):
        parse_config({"model": model, "train": {"optimizer": {"lr": 0.1}}})


@pytest.mark.gpu
def test_cuda_runs_cudnns_dropout_calls(cuda):
    from cudnnnet.backends.cuda import bindings

    layer = build(Dropout("drop", 0.3), SHAPE[1:], cuda)
    x = Tensor.from_numpy(positive_input(), cuda)
    bindings.reset_calls()
    layer.forward(x)
    layer.backward(x)
    assert bindings.calls["cudnnDropoutForward"] == 1 and bindings.calls["cudnnDropoutBackward"] == 1
