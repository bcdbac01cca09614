"""Fused calls against the unfused library path they replace (issue #5).

``cross_entropy_backward`` must equal the Softmax layer's backward (copy + saxpy + sscal) with
``cross_entropy_loss`` and ``accuracy_count`` accumulated, and ``softmax_cross_entropy_backward``
the Softmax layer's forward (cudnnSoftmaxForward) followed by it, and ``softmax_cross_entropy_metrics``
that forward with ``cross_entropy_loss`` (scaled) and ``accuracy_count``; ``sgd_update_many`` must equal
``sgd_update`` on each parameter; ``bias_activation_forward`` must equal ``add_tensor`` then
``activation_forward``, and a network with its activations fused the same network unfused. On the host the results are checked exactly; on CUDA (marked
``gpu``, skipped without a GPU) the fused kernels are checked against the CUDA unfused path and
against the host, within 1e-5 relative error, and proven to take one launch and to replay
inside a CUDA graph. These are the fast engine's calls: every test here runs with it, except where
one names the slides engine as the reference.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cudnnnet import Network
from cudnnnet.errors import DeviceError, InvalidArgumentError, ShapeError, UsageError
from cudnnnet.backends.descriptors import ACTIVATION_MODES, ActivationDescriptor, ActivationMode
from cudnnnet.engine import FAST
from cudnnnet.layers import MSE, Activation, Conv2D, Dense, Pooling, Softmax
from cudnnnet.optim.optimizers import SGD
from cudnnnet.tensor import Tensor
from run_helpers import every_backend_using

FP32_TOLERANCE = 1e-5
LOSS_BATCHES = (1, 7, 255, 256, 1000, 4097)
CLASSES = 10
START_LOSS, START_COUNT = 0.75, 3.0  # loss and count are accumulated into, never overwritten

PARAMETER_LISTS = {  # sample shapes of the parameters; odd sizes straddle block boundaries
    "one": [(1,)],
    "mlp": [(10, 784, 1, 1), (10,), (7, 10, 1, 1), (7,)],
    "odd": [(1,), (7,), (13, 5), (255,), (3, 1, 5, 5), (257,), (4097,), (2,)],
    "many": [(size,) for size in np.random.default_rng(5).integers(1, 3000, 40)],
}
HYPER = [(0.0, 0.0), (0.9, 0.0), (0.0, 0.01), (0.9, 0.01)]  # (momentum, weight_decay)


@pytest.fixture(autouse=True)
def fast_engine():
    with every_backend_using("fast"):
        yield


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    norm = np.linalg.norm(expected)
    difference = np.linalg.norm(actual - expected)
    return difference / norm if norm else difference


def assert_close(actual: list, expected: list, tolerance: float = FP32_TOLERANCE) -> None:
    errors = [relative_error(a, e) for a, e in zip(actual, expected, strict=True)]
    assert max(errors) <= tolerance, f"relative errors {[f'{e:.3g}' for e in errors]} > {tolerance:g}"


# ---- inputs ------------------------------------------------------------------------------------
def softmax_inputs(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(logits, one-hot targets) of n samples; a few rows of equal logits test the ties."""
    rng = np.random.default_rng([seed, n])
    logits = rng.standard_normal((n, CLASSES)).astype(np.float32) * 3
    logits[:: 5] = 0.0  # softmax gives equal probabilities: argmax is the first class
    target = np.zeros((n, CLASSES), np.float32)
    target[np.arange(n), rng.integers(0, CLASSES, n)] = 1.0
    target[:: 10, :] = 0.0
    target[:: 10, 0] = 1.0  # some of the tied rows are hits
    return logits, target


def loss_layer(backend, layer_type, logits: np.ndarray):
    """A built loss layer after a forward pass over ``logits``."""
    layer = layer_type("out")
    layer.build((CLASSES, 1, 1), backend, np.random.default_rng(0))
    layer.forward(Tensor.from_numpy(logits, backend))
    return layer


def metrics(backend) -> tuple[Tensor, Tensor]:
    return Tensor.from_numpy([START_LOSS], backend), Tensor.from_numpy([START_COUNT], backend)


def unfused_step(layer, target: Tensor) -> list[np.ndarray]:
    """backward (copy + saxpy + sscal), loss and correct, accumulated: [grad, loss, count]."""
    loss, count = metrics(layer.backend)
    grad = layer.backward(target).numpy()
    layer.loss(target, loss, accumulate=True)
    layer.correct(target, count, accumulate=True)
    return [grad, loss.numpy(), count.numpy()]


def fused_step(layer, target: Tensor) -> list[np.ndarray]:
    loss, count = metrics(layer.backend)
    grad = layer.backward_with_metrics(target, loss, count)
    return [grad.numpy(), loss.numpy(), count.numpy()]


def both_steps(backend, layer_type, n: int) -> tuple[list, list]:
    logits, target = softmax_inputs(n)
    layer = loss_layer(backend, layer_type, logits)
    target = Tensor.from_numpy(target, backend)
    return unfused_step(layer, target), fused_step(layer, target)


def softmax_steps(backend, n: int, seed: int = 0) -> tuple[list, list]:
    """[probabilities, grad, loss, count] of the Softmax layer's forward then backward_with_metrics
    (cudnnSoftmaxForward + cross_entropy_backward on CUDA), and of its one fused call."""
    logits, target = softmax_inputs(n, seed)
    logits, target = Tensor.from_numpy(logits, backend), Tensor.from_numpy(target, backend)
    results = []
    for fused in (False, True):
        layer = Softmax("out")
        layer.build((CLASSES, 1, 1), backend, np.random.default_rng(0))
        loss, count = metrics(backend)
        if fused:
            grad = layer.forward_backward_with_metrics(logits, target, loss, count)
        else:
            layer.forward(logits)
            grad = layer.backward_with_metrics(target, loss, count)
        results.append([layer.output.numpy(), grad.numpy(), loss.numpy(), count.numpy()])
    return results[0], results[1]


def parameters(backend, shapes, seed: int = 1) -> list[tuple[Tensor, Tensor, Tensor]]:
    """(param, grad, velocity) per shape, the same values on every backend for the same seed."""
    rng = np.random.default_rng(seed)
    return [tuple(Tensor.from_numpy(rng.standard_normal(shape).astype(np.float32), backend) for _ in range(3))
            for shape in shapes]


def groups_of(tensors, momentum: float):
    return [(p, g, v if momentum else None) for p, g, v in tensors]


def values(tensors) -> list[np.ndarray]:
    return [t.numpy() for group in tensors for t in group]


def unfused_sgd(backend, tensors, lr, momentum, weight_decay, steps=3) -> None:
    for _ in range(steps):
        for param, grad, velocity in groups_of(tensors, momentum):
            backend.sgd_update(param, grad, velocity, lr, momentum, weight_decay)


def fused_sgd(backend, tensors, lr, momentum, weight_decay, steps=3) -> None:
    groups = groups_of(tensors, momentum)
    for _ in range(steps):
        backend.sgd_update_many(groups, lr, momentum, weight_decay)


# ---- host: the fused calls are the unfused calls -------------------------------------------------
@pytest.mark.parametrize("n", LOSS_BATCHES)
def test_host_cross_entropy_backward_equals_the_unfused_calls(host, n):
    unfused, fused = both_steps(host, Softmax, n)
    np.testing.assert_array_equal(fused[0], unfused[0])  # the same float32 operations
    np.testing.assert_allclose(fused[1], unfused[1], rtol=1e-6)
    np.testing.assert_array_equal(fused[2], unfused[2])


def test_host_cross_entropy_backward_formula(host):
    n = 255
    logits, target = softmax_inputs(n)
    layer = loss_layer(host, Softmax, logits)
    predict = layer.output.numpy().reshape(n, CLASSES).astype(np.float64)
    grad, loss, count = fused_step(layer, Tensor.from_numpy(target, host))
    np.testing.assert_allclose(grad.reshape(n, CLASSES), (predict - target) / n, rtol=1e-6, atol=1e-9)
    expected_loss = START_LOSS - np.sum(target * np.log(np.maximum(predict, 1e-7))) / n
    assert loss[0, 0, 0, 0] == pytest.approx(expected_loss, rel=1e-6)
    hits = np.count_nonzero(predict.argmax(axis=1) == target.argmax(axis=1))  # NumPy: first maximum wins
    assert count[0, 0, 0, 0] == START_COUNT + hits
    assert 0 < hits < n


@pytest.mark.parametrize("n", LOSS_BATCHES)
def test_host_softmax_forward_backward_equals_forward_then_backward(host, n):
    unfused, fused = softmax_steps(host, n)
    for got, want in zip(fused, unfused, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("loss_type", (Softmax, MSE))
def test_host_network_forward_backward_equals_forward_then_backward(host, loss_type):
    images = np.random.default_rng(3).standard_normal((33, 1, 6, 6)).astype(np.float32)
    target = Tensor.from_numpy(softmax_inputs(33)[1], host)
    gradients = []
    for fused in (False, True):
        network = Network([Dense("fc1", 12), Activation("relu1", "relu"), Dense("fc2", CLASSES), loss_type("out")],
                          backend=host, seed=4, input_shape=(1, 6, 6))
        loss, count = metrics(host)
        if fused:
            network.forward_backward(images, target, loss, count)
        else:
            network.forward(images)
            network.backward(target, loss, count)
        gradients.append([grad.numpy() for grad in network.gradients().values()] + [loss.numpy(), count.numpy()])
    for got, want in zip(gradients[1], gradients[0], strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("n", (1, 7, 256))
def test_host_mse_backward_with_metrics_is_backward_loss_and_correct(host, n):
    unfused, fused = both_steps(host, MSE, n)
    for got, want in zip(fused, unfused):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("momentum, weight_decay", HYPER)
@pytest.mark.parametrize("name", sorted(PARAMETER_LISTS))
@pytest.mark.parametrize("lr_on_device", [False, True])
def test_host_sgd_update_many_equals_sgd_update(host, name, momentum, weight_decay, lr_on_device):
    shapes = PARAMETER_LISTS[name]
    lr = Tensor.from_numpy([0.05], host) if lr_on_device else 0.05
    expected, actual = parameters(host, shapes), parameters(host, shapes)
    unfused_sgd(host, expected, lr, momentum, weight_decay)
    fused_sgd(host, actual, lr, momentum, weight_decay)
    for got, want in zip(values(actual), values(expected)):
        np.testing.assert_array_equal(got, want)


def test_sgd_update_many_needs_velocity_with_momentum(host):
    (param, grad, _), = parameters(host, [(3,)])
    with pytest.raises(UsageError, match="velocity"):
        host.sgd_update_many([(param, grad, None)], 0.1, 0.9, 0.0)


# ---- evaluation: loss and hits straight from the logits ------------------------------------------
METRIC_SHAPES = [(1, CLASSES), (37, CLASSES), (256, CLASSES), (1000, CLASSES), (37, 3, 4, 5)]


def metric_inputs(shape, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(logits, one-hot targets) of ``shape`` (one sample per row of c·h·w classes); ties as in softmax_inputs."""
    n, classes = shape[0], int(np.prod(shape[1:]))
    rng = np.random.default_rng([seed, *shape])
    logits = rng.standard_normal((n, classes)).astype(np.float32) * 3
    logits[:: 5] = 0.0
    target = np.eye(classes, dtype=np.float32)[rng.integers(0, classes, n)]
    target[:: 10] = np.eye(classes, dtype=np.float32)[0]
    return logits.reshape(shape), target.reshape(shape)


def set_scale(n: int) -> float:
    """A loss scale as for a batch of n among 3n + 1 samples: not 1/n, so that a test sees it used."""
    return 1.0 / (3 * n + 1)


def evaluation_metrics(backend, logits: np.ndarray, target: np.ndarray, fused: bool, calls: int = 1) -> list:
    """[loss, count] from START_LOSS, START_COUNT after ``calls`` evaluations of the batch: one
    softmax_cross_entropy_metrics each, or softmax_forward + cross_entropy_loss·N·scale (saxpy) + accuracy_count."""
    x, y = Tensor.from_numpy(logits, backend), Tensor.from_numpy(target, backend)
    loss, count = metrics(backend)
    scale = set_scale(x.n)
    for _ in range(calls):
        if fused:
            backend.softmax_cross_entropy_metrics(x, y, loss, count, scale)
            continue
        predict, batch_mean = Tensor(x.shape, backend), Tensor((1,), backend)
        backend.softmax_forward(1.0, x, 0.0, predict)
        backend.cross_entropy_loss(predict, y, batch_mean)
        backend.saxpy(1, x.n * scale, batch_mean, 1, loss, 1)
        backend.accuracy_count(predict, y, count, accumulate=True)
    np.testing.assert_array_equal(x.numpy(), logits.reshape(x.shape))  # the inputs are only read
    np.testing.assert_array_equal(y.numpy(), target.reshape(y.shape))
    return [loss.item(), count.item()]


@pytest.mark.parametrize("calls", (1, 3))
@pytest.mark.parametrize("shape", METRIC_SHAPES, ids=str)
def test_softmax_cross_entropy_metrics_equals_softmax_loss_and_count(backend, shape, calls):
    logits, target = metric_inputs(shape)
    unfused = evaluation_metrics(backend, logits, target, fused=False, calls=calls)
    fused = evaluation_metrics(backend, logits, target, fused=True, calls=calls)
    assert fused[0] == pytest.approx(unfused[0], rel=1e-6 if backend.name == "host" else FP32_TOLERANCE)
    assert fused[1] == unfused[1]  # the count is exact, ties included
    hits = unfused[1] - START_COUNT
    assert unfused[0] > START_LOSS and 0 < hits <= calls * shape[0]


@pytest.mark.parametrize("shape", METRIC_SHAPES, ids=str)
def test_host_softmax_cross_entropy_metrics_formula(host, shape):
    logits, target = metric_inputs(shape)
    n = shape[0]
    rows, onehot = logits.reshape(n, -1).astype(np.float64), target.reshape(n, -1)
    predict = np.exp(rows - rows.max(axis=1, keepdims=True))
    predict /= predict.sum(axis=1, keepdims=True)
    loss, count = evaluation_metrics(host, logits, target, fused=True, calls=2)
    expected_loss = START_LOSS - 2 * set_scale(n) * np.sum(onehot * np.log(np.maximum(predict, 1e-7)))
    assert loss == pytest.approx(expected_loss, rel=1e-6)
    assert count == START_COUNT + 2 * np.count_nonzero(predict.argmax(axis=1) == onehot.argmax(axis=1))


def test_softmax_cross_entropy_metrics_of_a_nan_logit_is_a_nan_loss(backend):
    logits, target = metric_inputs((7, CLASSES))
    logits[3, 2] = np.nan
    loss, count = evaluation_metrics(backend, logits, target, fused=True)
    assert np.isnan(loss) and np.isfinite(count)


def test_softmax_cross_entropy_metrics_checks_shapes(backend):
    logits, loss_count = Tensor.zeros((4, CLASSES), backend), metrics(backend)
    with pytest.raises(ShapeError, match="softmax_cross_entropy_metrics"):
        backend.softmax_cross_entropy_metrics(logits, Tensor.zeros((4, CLASSES + 1), backend), *loss_count, 0.25)


def layer_metrics(backend, layer_type, n: int, fused: bool) -> list[float]:
    """[loss, count] from START_LOSS, START_COUNT after one evaluation batch at a loss layer: its
    forward_metrics, or forward then loss·N·scale and correct read back one by one."""
    logits, target = softmax_inputs(n)
    x, y = Tensor.from_numpy(logits, backend), Tensor.from_numpy(target, backend)
    layer = layer_type("out")
    layer.build((CLASSES, 1, 1), backend, np.random.default_rng(0))
    loss, count = metrics(backend)
    if fused:
        layer.forward_metrics(x, y, loss, count, set_scale(n))
        return [loss.item(), count.item()]
    layer.forward(x)
    batch_mean = layer.loss(y, Tensor((1,), backend)).item()
    return [START_LOSS + set_scale(n) * n * batch_mean, layer.correct(y, count, accumulate=True).item()]


def network_metrics(backend, loss_type, fused: bool) -> list[float]:
    """[loss, count] of a small network's forward_metrics, or of forward, loss and correct."""
    images = np.random.default_rng(3).standard_normal((33, 1, 6, 6)).astype(np.float32)
    target = Tensor.from_numpy(softmax_inputs(33)[1], backend)
    network = Network([Dense("fc1", 12), Activation("relu1", "relu"), Dense("fc2", CLASSES), loss_type("out")],
                      backend=backend, seed=4, input_shape=(1, 6, 6))
    loss, count = metrics(backend)
    if fused:
        network.forward_metrics(images, target, loss, count, set_scale(33))
        return [loss.item(), count.item()]
    network.forward(images)
    hits = network.loss_layer.correct(target, Tensor((1,), backend)).item()
    return [START_LOSS + set_scale(33) * 33 * network.loss(target), START_COUNT + hits]


@pytest.mark.parametrize("n", (1, 37, 256))
@pytest.mark.parametrize("loss_type", (Softmax, MSE))
def test_forward_metrics_equals_forward_loss_and_correct(backend, loss_type, n):
    unfused, fused = (layer_metrics(backend, loss_type, n, fused) for fused in (False, True))
    assert fused[0] == pytest.approx(unfused[0], rel=1e-6 if backend.name == "host" else FP32_TOLERANCE)
    assert fused[1] == unfused[1] and fused[0] > START_LOSS


@pytest.mark.parametrize("loss_type", (Softmax, MSE))
def test_network_forward_metrics_equals_forward_loss_and_correct(backend, loss_type):
    unfused, fused = (network_metrics(backend, loss_type, fused) for fused in (False, True))
    assert fused[0] == pytest.approx(unfused[0], rel=1e-6 if backend.name == "host" else FP32_TOLERANCE)
    assert fused[1] == unfused[1] and fused[0] > START_LOSS


def test_forward_metrics_checks_the_target(backend):
    layer = Softmax("out")
    layer.build((CLASSES, 1, 1), backend, np.random.default_rng(0))
    logits, target = Tensor.zeros((4, CLASSES), backend), Tensor.zeros((5, CLASSES), backend)
    with pytest.raises(ShapeError, match="'out': target has shape"):
        layer.forward_metrics(logits, target, *metrics(backend), 0.25)


# ---- the optimiser's step is one sgd_update_many call --------------------------------------------
def small_network(backend):
    network = Network(backend=backend, layers=[Dense("fc1", 9), Dense("fc2", 4), Softmax("out")]).build((5, 1, 1))
    rng = np.random.default_rng(3)
    network.forward(Tensor.from_numpy(rng.standard_normal((6, 5)).astype(np.float32), backend))
    network.backward(Tensor.from_numpy(np.eye(4, dtype=np.float32)[[0, 1, 2, 3, 0, 1]], backend))
    return network


def test_sgd_step_is_one_fused_call_over_every_parameter(host, monkeypatch):
    network = small_network(host)
    optimizer = SGD(network, lr=0.1, momentum=0.9, weight_decay=0.01)
    calls = []
    monkeypatch.setattr(host, "sgd_update_many", lambda *arguments: calls.append(arguments))
    optimizer.step()
    (groups, lr, momentum, weight_decay), = calls
    assert lr is optimizer.lr and (momentum, weight_decay) == (0.9, 0.01)
    ((values, grads, velocity),) = groups  # every parameter packed into one buffer of each kind
    for p in network.parameter_list():
        for tensor, packed in ((p.value, values), (p.grad, grads), (optimizer.velocity[p.name], velocity)):
            start = (tensor.data.ctypes.data - packed.data.ctypes.data) // 4
            assert start % 64 == 0 and np.shares_memory(tensor.data, packed.data), p.name
            np.testing.assert_array_equal(packed.data[start:start + tensor.size], tensor.data[:tensor.size])


def test_packing_keeps_every_value_and_zero_padding(host):
    network = small_network(host)
    before = {p.name: (p.value.numpy().copy(), p.grad.numpy().copy()) for p in network.parameter_list()}
    optimizer = SGD(network, lr=0.1)
    ((values, grads, velocity),) = optimizer.groups
    assert velocity is None and values.size == grads.size == sum(-(-p.value.size // 64) * 64
                                                                  for p in network.parameter_list())
    for p in network.parameter_list():
        np.testing.assert_array_equal(p.value.numpy(), before[p.name][0])
        np.testing.assert_array_equal(p.grad.numpy(), before[p.name][1])
    optimizer.step()
    owned = np.zeros(values.size, bool)
    for p in network.parameter_list():
        start = (p.value.data.ctypes.data - values.data.ctypes.data) // 4
        owned[start:start + p.value.size] = True
    assert not values.numpy()[~owned].any() and not grads.numpy()[~owned].any()


def test_sgd_step_equals_per_parameter_updates(host):
    fused, unfused = small_network(host), small_network(host)
    optimizer = SGD(fused, lr=0.1, momentum=0.9, weight_decay=0.01)
    velocity = {p.name: Tensor.zeros(p.value.shape, host) for p in unfused.parameter_list()}
    for _ in range(3):
        optimizer.step()
        for p in unfused.parameter_list():
            host.sgd_update(p.value, p.grad, velocity[p.name], optimizer.lr, 0.9, 0.01)
    for name, value in fused.parameters().items():
        np.testing.assert_array_equal(value.numpy(), unfused.parameters()[name].numpy())


def test_sgd_needs_a_built_network(host):
    with pytest.raises(InvalidArgumentError, match="build the network"):
        SGD(Network(backend=host, layers=[Dense("fc", 4), Softmax("out")]), lr=0.1)


# ---- bias + activation --------------------------------------------------------------------------
ACTIVATION_CASES = [None] + [ActivationDescriptor(ActivationMode(mode), coef)
                             for mode, coef in zip(ACTIVATION_MODES.values(), (0.0, 0.0, 0.0, 0.7, 1.3))]
BIAS_SHAPES = [(1, 1, 1, 1), (7, 10, 1, 1), (256, 500, 1, 1), (33, 1000, 1, 1), (5, 20, 24, 24), (3, 7, 5, 3)]


def bias_inputs(shape, seed: int = 2) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, *shape])
    return rng.standard_normal(shape).astype(np.float32), rng.standard_normal((1, shape[1], 1, 1)).astype(np.float32)


def bias_then_activation(backend, desc, y: np.ndarray, bias: np.ndarray, fused: bool) -> np.ndarray:
    out, b = Tensor.from_numpy(y, backend), Tensor.from_numpy(bias, backend)
    if fused:
        backend.bias_activation_forward(desc, b, out)
    else:
        backend.add_tensor(1.0, b, 1.0, out)
        if desc is not None:
            backend.activation_forward(desc, 1.0, out, 0.0, out)
    return out.numpy()


def mnist_like_network(backend) -> Network:
    layers = [Conv2D("conv1", 4, 3), Activation("relu1", "relu"), Pooling("pool1", 2),
              Conv2D("conv2", 6, 3, padding=1), Activation("tanh2", "tanh"), Dense("fc1", 12),
              Activation("sig3", "sigmoid"), Dense("fc2", 9), Activation("elu4", "elu"), Dense("fc3", CLASSES),
              Softmax("out")]
    return Network(layers, backend=backend, seed=3, input_shape=(2, 12, 12))


def train_steps(network: Network, engine: str, steps: int = 3) -> dict:
    """``steps`` training steps with ``engine`` on the network's backend (restored afterwards)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 2, 12, 12)).astype(np.float32)
    target = np.eye(CLASSES, dtype=np.float32)[rng.integers(0, CLASSES, 5)]
    with network.backend.using_engine(engine):
        for _ in range(steps):
            network.forward(x)
            network.backward(Tensor.from_numpy(target, network.backend))
            network.update(0.1)
    return network.state_dict()


@pytest.mark.parametrize("shape", BIAS_SHAPES)
@pytest.mark.parametrize("desc", ACTIVATION_CASES, ids=lambda d: "none" if d is None else d.mode.name.lower())
def test_host_bias_activation_equals_add_tensor_then_activation(host, desc, shape):
    y, bias = bias_inputs(shape)
    np.testing.assert_allclose(bias_then_activation(host, desc, y, bias, True),
                               bias_then_activation(host, desc, y, bias, False), rtol=1e-6, atol=1e-7)


def test_bias_activation_rejects_a_bias_of_another_size(host):
    with pytest.raises(ShapeError, match="one value per channel"):
        host.bias_activation_forward(None, Tensor.zeros((1, 3, 1, 1), host), Tensor.zeros((2, 4, 1, 1), host))


def test_network_fuses_each_activation_after_a_dense_or_conv_in_the_fast_engine(host):
    network = mnist_like_network(host)
    fused = {layer.name for layer in network.layers if getattr(layer, "fused", False)}
    assert fused == {"relu1", "tanh2", "sig3", "elu4"}
    assert network.layers[0].activation == network.layers[1].descriptor
    with host.using_engine("slides"):
        assert not any(getattr(layer, "fused", False) for layer in network.layers)


def test_host_fused_network_trains_as_the_unfused_one(host):
    fused, unfused = train_steps(mnist_like_network(host), "fast"), train_steps(mnist_like_network(host), "slides")
    for name, value in unfused.items():
        np.testing.assert_allclose(fused[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


# ---- activation backward + the Dense bias gradient -----------------------------------------------
DENSE_SHAPES = [(1, 1, 1, 1), (7, 10, 1, 1), (7, 12, 1, 1), (256, 500, 1, 1), (1000, 37, 1, 1), (333, 300, 1, 1)]
ACTIVATIONS = ACTIVATION_CASES[1:]


def activation_gradient_inputs(backend, desc, shape) -> tuple[np.ndarray, np.ndarray]:
    """(y = f(x), dy) of ``shape``: y as the forward pass leaves it."""
    x, _ = bias_inputs(shape, seed=6)
    y = Tensor.from_numpy(x, backend)
    backend.activation_forward(desc, 1.0, y, 0.0, y)
    return y.numpy(), np.random.default_rng([7, *shape]).standard_normal(shape).astype(np.float32)


def activation_then_bias_gradient(backend, desc, y: np.ndarray, dy: np.ndarray, fused: bool) -> list[np.ndarray]:
    """[dx, db]: activation_bias_backward, or activation_backward (f' from y) then the Dense's sgemv."""
    n, c = y.shape[:2]
    Y, DY = Tensor.from_numpy(y, backend), Tensor.from_numpy(dy, backend)
    DX, DB = Tensor.from_numpy(np.full(y.shape, np.nan, np.float32), backend), Tensor.zeros((c,), backend)
    if fused:
        backend.activation_bias_backward(desc, Y, DY, DX, DB)
    else:
        backend.activation_backward(desc, 1.0, Y, DY, Y, 0.0, DX)
        backend.sgemv(0, c, n, 1.0, DX, c, Tensor((n,), backend).fill_(1.0), 1, 0.0, DB, 1)
    return [DX.numpy(), DB.numpy()]


@pytest.mark.parametrize("shape", DENSE_SHAPES)
@pytest.mark.parametrize("desc", ACTIVATIONS, ids=lambda d: d.mode.name.lower())
def test_activation_bias_backward_equals_activation_backward_then_sgemv(backend, desc, shape):
    """dx the same bits (the same formula), db within float32 rounding (another order of the sum)."""
    y, dy = activation_gradient_inputs(backend, desc, shape)
    fused = activation_then_bias_gradient(backend, desc, y, dy, True)
    unfused = activation_then_bias_gradient(backend, desc, y, dy, False)
    np.testing.assert_array_equal(fused[0], unfused[0])
    assert_close(fused[1:], unfused[1:])


def test_activation_bias_backward_checks_shapes(backend):
    desc, y = ACTIVATIONS[0], Tensor.zeros((4, 6, 1, 1), backend)
    with pytest.raises(ShapeError, match="one value per channel"):
        backend.activation_bias_backward(desc, y, y, y, Tensor.zeros((5,), backend))
    with pytest.raises(ShapeError, match="Dense layer's output"):
        image = Tensor.zeros((4, 6, 2, 2), backend)
        backend.activation_bias_backward(desc, image, image, image, Tensor.zeros((6,), backend))
    with pytest.raises(ShapeError, match="same shape"):
        backend.activation_bias_backward(desc, y, Tensor.zeros((4, 7, 1, 1), backend), y, Tensor.zeros((6,), backend))


def test_network_sums_each_dense_bias_gradient_in_the_activation_after_it(host, monkeypatch):
    """In the fast engine the Activations after fc1 and fc2 sum their bias gradients (no sgemv there);
    fc3, before the Softmax, the slides engine and a fast engine without ``activation_sums_bias``
    keep the sgemv."""
    network = mnist_like_network(host)
    assert [layer.name for layer in network.layers if getattr(layer, "dense_before", None)] == ["sig3", "elu4"]
    for engine, sgemvs in (("fast", 1), ("slides", 3), (dataclasses.replace(FAST, activation_sums_bias=False), 3)):
        calls = []
        monkeypatch.setattr(host, "sgemv", lambda *args, _sgemv=type(host).sgemv: calls.append(_sgemv(host, *args)))
        train_steps(network, engine, steps=1)
        monkeypatch.undo()
        assert len(calls) == sgemvs, engine


# ---- CUDA: fused kernels == the CUDA unfused path == the host -------------------------------------
@pytest.fixture
def counters():
    """The library-call and kernel-launch counters, reset."""
    from cudnnnet.backends.cuda import bindings, kernel

    bindings.reset_calls()
    kernel.reset_launches()
    return bindings.calls, kernel.launches


@pytest.mark.gpu
@pytest.mark.parametrize("n", LOSS_BATCHES)
def test_cuda_cross_entropy_backward(host, cuda, n):
    cuda_unfused, cuda_fused = both_steps(cuda, Softmax, n)
    host_unfused, _ = both_steps(host, Softmax, n)
    assert_close(cuda_fused, cuda_unfused)
    assert_close(cuda_fused, host_unfused)
    assert cuda_fused[2][0, 0, 0, 0] == host_unfused[2][0, 0, 0, 0]  # the count is exact


@pytest.mark.gpu
def test_cuda_cross_entropy_backward_count_is_exact_with_ties(cuda):
    n = 4097
    predict = np.full((n, CLASSES), 0.1, np.float32)  # every row tied: the first class wins
    target = np.zeros((n, CLASSES), np.float32)
    target[np.arange(n), np.arange(n) % CLASSES] = 1.0
    loss, count = metrics(cuda)
    grad = Tensor((n, CLASSES), cuda)
    cuda.cross_entropy_backward(Tensor.from_numpy(predict, cuda), Tensor.from_numpy(target, cuda), grad, loss, count)
    assert count.item() == START_COUNT + np.count_nonzero(np.arange(n) % CLASSES == 0)


@pytest.mark.gpu
@pytest.mark.parametrize("n", LOSS_BATCHES)
def test_cuda_softmax_forward_backward(host, cuda, n):
    cuda_unfused, cuda_fused = softmax_steps(cuda, n)
    host_unfused, _ = softmax_steps(host, n)
    assert_close(cuda_fused, cuda_unfused)
    assert_close(cuda_fused, host_unfused)
    assert cuda_fused[3][0, 0, 0, 0] == host_unfused[3][0, 0, 0, 0]  # the count is exact, ties included


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_a_nan_logit_gives_a_nan_loss(backend, fused):
    """As NumPy's maximum, the kernels' max(ŷ, 1e-7) keeps a NaN, so that training stops on it."""
    logits, target = softmax_inputs(7)
    logits[3, 2] = np.nan
    logits, target = Tensor.from_numpy(logits, backend), Tensor.from_numpy(target, backend)
    layer = Softmax("out")
    layer.build((CLASSES, 1, 1), backend, np.random.default_rng(0))
    loss, count = metrics(backend)
    if fused:
        layer.forward_backward_with_metrics(logits, target, loss, count)
    else:
        layer.forward(logits)
        layer.backward_with_metrics(target, loss, count)
    probabilities = layer.output.numpy().reshape(7, CLASSES)
    assert np.isnan(probabilities[3]).all() and np.isfinite(np.delete(probabilities, 3, axis=0)).all()
    assert np.isnan(loss.item())
    assert np.isnan(layer.loss(target, Tensor((1,), backend)).item())


@pytest.mark.gpu
@pytest.mark.parametrize("n", (7, 1000))
def test_cuda_mse_backward_with_metrics(host, cuda, n):
    cuda_unfused, cuda_fused = both_steps(cuda, MSE, n)
    host_unfused, _ = both_steps(host, MSE, n)
    assert_close(cuda_fused, cuda_unfused)
    assert_close(cuda_fused, host_unfused)


@pytest.mark.gpu
@pytest.mark.parametrize("momentum, weight_decay", HYPER)
@pytest.mark.parametrize("name", sorted(PARAMETER_LISTS))
def test_cuda_sgd_update_many(host, cuda, name, momentum, weight_decay):
    shapes = PARAMETER_LISTS[name]
    lr_cuda, lr_host = Tensor.from_numpy([0.05], cuda), Tensor.from_numpy([0.05], host)
    fused, per_tensor, library = (parameters(cuda, shapes) for _ in range(3))
    expected = parameters(host, shapes)
    fused_sgd(cuda, fused, lr_cuda, momentum, weight_decay)
    unfused_sgd(cuda, per_tensor, lr_cuda, momentum, weight_decay)  # kernels/sgd.cu, one launch per tensor
    unfused_sgd(cuda, library, 0.05, momentum, weight_decay)  # cuBLAS sscal/saxpy
    unfused_sgd(host, expected, lr_host, momentum, weight_decay)
    assert_close(values(fused), values(per_tensor))
    assert_close(values(fused), values(library))
    assert_close(values(fused), values(expected))


@pytest.mark.gpu
def test_cuda_sgd_update_many_with_a_float_rate(cuda):
    shapes = PARAMETER_LISTS["odd"]
    on_device, as_float = parameters(cuda, shapes), parameters(cuda, shapes)
    fused_sgd(cuda, on_device, Tensor.from_numpy([0.05], cuda), 0.9, 0.01)
    fused_sgd(cuda, as_float, 0.05, 0.9, 0.01)
    for got, want in zip(values(as_float), values(on_device)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
def test_cuda_sgd_update_many_needs_velocity_with_momentum(cuda):
    (param, grad, _), = parameters(cuda, [(3,)])
    with pytest.raises(UsageError, match="velocity"):
        cuda.sgd_update_many([(param, grad, None)], 0.1, 0.9, 0.0)


# ---- CUDA: one launch, nothing else ----------------------------------------------------------------
@pytest.mark.gpu
def test_cuda_cross_entropy_backward_is_one_launch(cuda, counters):
    calls, launches = counters
    logits, target = softmax_inputs(1000)
    layer = loss_layer(cuda, Softmax, logits)
    target, (loss, count) = Tensor.from_numpy(target, cuda), metrics(cuda)
    layer.backward_with_metrics(target, loss, count)  # compiles and loads the kernel
    calls.clear()
    launches.clear()
    layer.backward_with_metrics(target, loss, count)
    assert dict(launches) == {"cross_entropy_backward": 1}
    assert dict(calls) == {"cuLaunchKernel": 1}  # no cuBLAS, no memset, no copy


@pytest.mark.gpu
def test_cuda_softmax_forward_backward_is_one_launch(cuda, counters):
    calls, launches = counters
    logits, target = softmax_inputs(256)
    layer = Softmax("out")
    layer.build((CLASSES, 1, 1), cuda, np.random.default_rng(0))
    logits, target, (loss, count) = Tensor.from_numpy(logits, cuda), Tensor.from_numpy(target, cuda), metrics(cuda)
    layer.forward_backward_with_metrics(logits, target, loss, count)  # allocates, compiles and loads the kernel
    calls.clear()
    launches.clear()
    layer.forward_backward_with_metrics(logits, target, loss, count)
    assert dict(launches) == {"softmax_cross_entropy_backward": 1}
    assert dict(calls) == {"cuLaunchKernel": 1}  # no cuDNN softmax, no cuBLAS, no memset, no copy


@pytest.mark.gpu
def test_cuda_softmax_cross_entropy_metrics_is_one_launch(cuda, counters):
    calls, launches = counters
    logits, target = metric_inputs((256, CLASSES))
    logits, target, (loss, count) = Tensor.from_numpy(logits, cuda), Tensor.from_numpy(target, cuda), metrics(cuda)
    cuda.softmax_cross_entropy_metrics(logits, target, loss, count, 0.5)  # compiles and loads the kernel
    calls.clear()
    launches.clear()
    cuda.softmax_cross_entropy_metrics(logits, target, loss, count, 0.5)
    assert dict(launches) == {"softmax_cross_entropy_backward": 1}
    assert dict(calls) == {"cuLaunchKernel": 1}  # no cudnnSoftmaxForward, no cuBLAS, no memset, no copy


@pytest.mark.gpu
@pytest.mark.parametrize("shape", METRIC_SHAPES, ids=str)
def test_cuda_softmax_cross_entropy_metrics_equals_the_host(host, cuda, shape):
    logits, target = metric_inputs(shape)
    on_cuda = evaluation_metrics(cuda, logits, target, fused=True, calls=2)
    on_host = evaluation_metrics(host, logits, target, fused=True, calls=2)
    assert on_cuda[0] == pytest.approx(on_host[0], rel=FP32_TOLERANCE)
    assert on_cuda[1] == on_host[1]


@pytest.mark.gpu
def test_cuda_softmax_forward_metrics_is_one_launch(cuda, counters):
    calls, launches = counters
    logits, target = softmax_inputs(256)
    layer = Softmax("out")
    layer.build((CLASSES, 1, 1), cuda, np.random.default_rng(0))
    logits, target, (loss, count) = Tensor.from_numpy(logits, cuda), Tensor.from_numpy(target, cuda), metrics(cuda)
    layer.forward_metrics(logits, target, loss, count, 0.5)  # allocates, compiles and loads the kernel
    calls.clear()
    launches.clear()
    layer.forward_metrics(logits, target, loss, count, 0.5)
    assert dict(launches) == {"softmax_cross_entropy_backward": 1}
    assert dict(calls) == {"cuLaunchKernel": 1}  # no cudnnSoftmaxForward, no synchronisation


@pytest.mark.gpu
def test_cuda_mse_forward_metrics_reads_nothing_back(cuda, counters):
    calls, launches = counters
    logits, target = softmax_inputs(256)
    layer = MSE("out")
    layer.build((CLASSES, 1, 1), cuda, np.random.default_rng(0))
    logits, target, (loss, count) = Tensor.from_numpy(logits, cuda), Tensor.from_numpy(target, cuda), metrics(cuda)
    layer.forward_metrics(logits, target, loss, count, 0.5)  # allocates, compiles and loads the kernels
    calls.clear()
    launches.clear()
    layer.forward_metrics(logits, target, loss, count, 0.5)
    assert dict(launches) == {"squared_error_loss": 1, "accuracy_count": 1}
    assert calls["cublasSaxpy_v2"] == 1 and calls["cudaStreamSynchronize"] == 0


@pytest.mark.gpu
def test_cuda_sgd_step_is_one_launch_after_the_first(cuda, counters):
    calls, launches = counters
    optimizer = SGD(small_network(cuda), lr=0.1, momentum=0.9, weight_decay=0.01)
    launches.clear()
    optimizer.step()  # compiles the kernel if needed, uploads the table of the 4 parameters
    assert dict(launches) == {"sgd_update_many": 1}
    calls.clear()
    launches.clear()
    optimizer.step()
    optimizer.step()
    assert dict(launches) == {"sgd_update_many": 2}
    assert dict(calls) == {"cuLaunchKernel": 2}  # no upload, no allocation, no capture query


# ---- CUDA graphs ----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("momentum, weight_decay", [(0.0, 0.0), (0.9, 0.01)])
def test_cuda_sgd_update_many_replays_with_the_rate_in_device_memory(host, cuda, momentum, weight_decay):
    shapes = PARAMETER_LISTS["odd"]
    replayed, eager, expected = parameters(cuda, shapes), parameters(cuda, shapes), parameters(host, shapes)
    lr_replayed, lr_eager, lr_host = (Tensor.from_numpy([0.1], b) for b in (cuda, cuda, host))
    for backend, tensors, lr in ((cuda, replayed, lr_replayed), (cuda, eager, lr_eager), (host, expected, lr_host)):
        fused_sgd(backend, tensors, lr, momentum, weight_decay, steps=1)  # the first call: outside the capture
    groups = groups_of(replayed, momentum)
    with cuda.capture() as graph:
        cuda.sgd_update_many(groups, lr_replayed, momentum, weight_decay)
    for rate in (0.05, 0.2):
        lr_replayed.fill_(rate)  # in place: the graph reads the same address
        graph.launch()
        for backend, tensors, lr in ((cuda, eager, lr_eager), (host, expected, lr_host)):
            lr.fill_(rate)
            fused_sgd(backend, tensors, lr, momentum, weight_decay, steps=1)
    for got, want in zip(values(replayed), values(eager)):
        np.testing.assert_array_equal(got, want)
    assert_close(values(replayed), values(expected))


@pytest.mark.gpu
def test_cuda_sgd_update_many_refuses_its_first_call_inside_a_capture(cuda):
    groups = groups_of(parameters(cuda, [(11,), (5, 3)], seed=99), 0.0)
    lr = Tensor.from_numpy([0.1], cuda)
    with pytest.raises(DeviceError, match="capture"):
        with cuda.capture():
            cuda.sgd_update_many(groups, lr, 0.0, 0.0)
    assert not cuda.context.is_capturing()
    cuda.sgd_update_many(groups, lr, 0.0, 0.0)  # outside: the table is built
    with cuda.capture() as graph:
        cuda.sgd_update_many(groups, lr, 0.0, 0.0)
    graph.launch()
    cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", BIAS_SHAPES)
@pytest.mark.parametrize("desc", ACTIVATION_CASES, ids=lambda d: "none" if d is None else d.mode.name.lower())
def test_cuda_bias_activation(host, cuda, desc, shape):
    y, bias = bias_inputs(shape)
    fused = bias_then_activation(cuda, desc, y, bias, True)
    assert_close([fused], [bias_then_activation(cuda, desc, y, bias, False)])
    assert_close([fused], [bias_then_activation(host, desc, y, bias, False)])


@pytest.mark.gpu
def test_cuda_bias_activation_is_one_launch(cuda, counters):
    calls, launches = counters
    y, bias = bias_inputs((8, 20, 6, 6))
    out, b = Tensor.from_numpy(y, cuda), Tensor.from_numpy(bias, cuda)
    calls.clear()
    launches.clear()
    cuda.bias_activation_forward(ACTIVATION_CASES[2], b, out)
    assert launches == {"bias_activation_forward": 1}
    assert calls["cuLaunchKernel"] == 1 and sum(calls.values()) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("offset, kernel", [(0, "bias_activation_forward_dense4"), (1, "bias_activation_forward")])
def test_cuda_bias_activation_of_a_dense_layer_reads_float4s_where_aligned(host, cuda, counters, offset, kernel):
    """y (N, C) with C a multiple of 4 takes the float4 kernel when y is 16-byte aligned, else the rows kernel."""
    calls, launches = counters
    y, bias = bias_inputs((6, 12, 1, 1))
    storage = Tensor.from_numpy(np.concatenate([np.zeros(offset, np.float32), y.reshape(-1)]), cuda)
    out, b = storage.view(y.shape, offset), Tensor.from_numpy(bias, cuda)
    launches.clear()
    cuda.bias_activation_forward(ACTIVATION_CASES[2], b, out)
    assert launches == {kernel: 1}
    assert_close([out.numpy()], [bias_then_activation(host, ACTIVATION_CASES[2], y, bias, False)])


@pytest.mark.gpu
def test_cuda_fused_network_trains_as_the_unfused_one_and_the_host(host, cuda):
    fused = train_steps(mnist_like_network(cuda), "fast")
    for reference in (train_steps(mnist_like_network(cuda), "slides"), train_steps(mnist_like_network(host), "fast")):
        assert_close([fused[name] for name in reference], list(reference.values()), tolerance=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", DENSE_SHAPES)
@pytest.mark.parametrize("desc", ACTIVATIONS, ids=lambda d: d.mode.name.lower())
def test_cuda_activation_bias_backward_equals_the_host(host, cuda, desc, shape):
    y, dy = activation_gradient_inputs(host, desc, shape)
    ours, theirs = (activation_then_bias_gradient(backend, desc, y, dy, True) for backend in (cuda, host))
    np.testing.assert_array_equal(ours[0], theirs[0])
    assert_close(ours[1:], theirs[1:])


@pytest.mark.gpu
@pytest.mark.parametrize("shape, launched", [((3, 10, 1, 1), {"activation_bias_backward": 1}),
                                             ((1000, 37, 1, 1), {"activation_bias_backward": 1,
                                                                 "activation_bias_sums": 1}),
                                             ((3, 12, 1, 1), {"activation_bias_backward_x4": 1}),
                                             ((1000, 40, 1, 1), {"activation_bias_backward_x4": 1,
                                                                 "activation_bias_sums": 1})])
def test_cuda_activation_bias_backward_replays_its_bits_in_a_graph(cuda, counters, shape, launched):
    """One launch where one slab of samples covers the batch, else one more adding the slabs (four
    channels a thread where C is a multiple of 4); the same bits eager and replayed from a CUDA graph."""
    _, launches = counters
    desc = ACTIVATIONS[2]
    y, dy = (Tensor.from_numpy(array, cuda) for array in activation_gradient_inputs(cuda, desc, shape))
    dx, db = Tensor.zeros(shape, cuda), Tensor.zeros((shape[1],), cuda)
    launches.clear()
    cuda.activation_bias_backward(desc, y, dy, dx, db)
    assert dict(launches) == launched
    eager = db.numpy()
    db.fill_(0.0)
    with cuda.capture() as graph:
        cuda.activation_bias_backward(desc, y, dy, dx, db)
    graph.launch()
    np.testing.assert_array_equal(db.numpy(), eager)
