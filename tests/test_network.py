import numpy as np
import pytest

from cudnnnet import Network, Tensor
from cudnnnet.errors import CheckpointError, InvalidArgumentError, ShapeError
from cudnnnet.layers import Activation, Conv2D, Dense, Pooling, Softmax


def small_cnn(backend, seed=0):
    network = Network(backend=backend, seed=seed)
    for layer in (Conv2D("conv1", 4, 3), Activation("relu1", "relu"), Pooling("pool1", 2), Dense("fc1", 16),
                  Activation("relu2", "tanh"), Dense("fc2", 10), Softmax("softmax")):
        network.add_layer(layer)
    return network.build((1, 10, 10))


def batch(size=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((size, 1, 10, 10)).astype(np.float32)
    target = np.eye(10, dtype=np.float32)[rng.integers(0, 10, size)]
    return x, target


def test_forward_gives_probabilities_and_update_lowers_the_loss(backend):
    network = small_cnn(backend)
    x, target = batch()
    target_tensor = Tensor.from_numpy(target, backend)
    output = network.forward(Tensor.from_numpy(x, backend)).numpy().reshape(8, 10)
    assert np.allclose(output.sum(axis=1), 1, atol=1e-5)
    first = network.loss(target_tensor)
    for _ in range(20):
        network.forward(Tensor.from_numpy(x, backend))
        network.backward(target_tensor)
        network.update(0.1)
    network.forward(Tensor.from_numpy(x, backend))
    assert network.loss(target_tensor) < 0.5 * first
    assert network.accuracy(target_tensor) == 1.0


def test_update_is_w_minus_lr_times_gradient(backend):
    network = small_cnn(backend)
    x, target = batch()
    network.forward(Tensor.from_numpy(x, backend))
    network.backward(Tensor.from_numpy(target, backend))
    before = network.state_dict()
    gradients = {name: grad.numpy() for name, grad in network.gradients().items()}
    network.update(0.5)
    for name, value in network.state_dict().items():
        assert np.allclose(value, before[name] - 0.5 * gradients[name], atol=1e-6), name


def test_same_seed_same_weights_on_every_backend(backend, host):
    assert all(np.array_equal(value, small_cnn(host).state_dict()[name])
               for name, value in small_cnn(backend).state_dict().items())


def test_structure_errors_are_clear():
    network = Network()
    network.add_layer(Dense("fc", 10))
    with pytest.raises(InvalidArgumentError, match="already in the network"):
        network.add_layer(Dense("fc", 3))
    with pytest.raises(InvalidArgumentError, match="no loss layer"):
        network.build((1, 28, 28))
    network.add_layer(Softmax("softmax"))
    with pytest.raises(InvalidArgumentError, match="after the loss layer"):
        network.add_layer(Dense("fc2", 3))


def test_a_shape_that_does_not_fit_is_found_before_anything_is_allocated():
    network = Network(layers=[Dense("fc1", 20), Conv2D("conv", 4, 3), Softmax("softmax")])
    with pytest.raises(ShapeError, match="conv.*no spatial size"):
        network.build((1, 28, 28))


def test_save_and_load_rebuilds_the_network_for_inference(backend, tmp_path):
    network = small_cnn(backend, seed=4)
    x, _ = batch()
    expected = network.predict(Tensor.from_numpy(x, backend)).numpy()
    network.save(tmp_path / "model.npz")
    loaded = Network.load(tmp_path / "model.npz", backend=backend)
    assert [layer.name for layer in loaded.layers] == [layer.name for layer in network.layers]
    assert np.array_equal(loaded.predict(Tensor.from_numpy(x, backend)).numpy(), expected)


def test_loading_a_different_architecture_names_the_difference_and_changes_nothing(backend, tmp_path):
    small_cnn(backend, seed=1).save(tmp_path / "model.npz")
    other = Network(backend=backend, layers=[Dense("fc1", 16), Dense("fc2", 10), Softmax("softmax")]).build((1, 10, 10))
    before = other.state_dict()
    with pytest.raises(CheckpointError, match="model.npz"):
        other.load_weights(tmp_path / "model.npz")
    assert all(np.array_equal(value, before[name]) for name, value in other.state_dict().items())


def test_loading_wrong_shapes_changes_nothing(backend, tmp_path):
    network = small_cnn(backend, seed=1)
    arrays = network.state_dict()
    arrays["fc2.weight"] = np.zeros((10, 17, 1, 1), np.float32)
    before = network.state_dict()
    with pytest.raises(CheckpointError, match=r"fc2.weight.*\(10, 17, 1, 1\).*\(10, 16, 1, 1\)"):
        network.load_state_dict(arrays)
    assert all(np.array_equal(value, before[name]) for name, value in network.state_dict().items())


@pytest.mark.gpu
def test_weights_trained_on_one_backend_predict_identically_on_the_other(cuda, host, tmp_path):
    x, target = batch(32)
    for source, destination in ((cuda, host), (host, cuda)):
        network = small_cnn(source, seed=2)
        for _ in range(5):
            network.forward(Tensor.from_numpy(x, source))
            network.backward(Tensor.from_numpy(target, source))
            network.update(0.05)
        network.save(tmp_path / f"{source.name}.npz")
        expected = network.predict(Tensor.from_numpy(x, source)).numpy()
        loaded = Network.load(tmp_path / f"{source.name}.npz", backend=destination)
        moved = loaded.predict(Tensor.from_numpy(x, destination)).numpy()
        assert np.array_equal(moved.argmax(axis=1), expected.argmax(axis=1))
        assert np.allclose(moved, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("as_given", [lambda t: t, lambda t: t.reshape(8, 10, 1, 1), lambda t: t.tolist()],
                         ids=["array (N, classes)", "array (N, classes, 1, 1)", "nested lists"])
def test_backward_loss_and_accuracy_take_the_target_as_forward_takes_its_input(backend, as_given):
    """An array-like target gives the same gradients as the same target made into a Tensor."""
    x, target = batch()
    from_tensor, from_array = small_cnn(backend), small_cnn(backend)
    from_tensor.forward(Tensor.from_numpy(x, backend))
    from_tensor.backward(Tensor.from_numpy(target.reshape(8, 10, 1, 1), backend))
    from_array.forward(x)
    from_array.backward(as_given(target))
    expected = {name: grad.numpy() for name, grad in from_tensor.gradients().items()}
    assert all(np.array_equal(grad.numpy(), expected[name]) for name, grad in from_array.gradients().items())
    assert from_array.loss(as_given(target)) == pytest.approx(from_tensor.loss(Tensor.from_numpy(
        target.reshape(8, 10, 1, 1), backend)))
    assert 0 <= from_array.accuracy(as_given(target)) <= 1


def test_a_target_of_another_shape_names_both_shapes(host):
    network = small_cnn(host)
    x, target = batch()
    network.forward(x)
    with pytest.raises(ShapeError, match=r"target has shape \(8, 9\), the output has shape \(8, 10, 1, 1\)"):
        network.backward(target[:, :9])


def test_load_with_backend_auto_runs_where_it_can(tmp_path, monkeypatch):
    """Network.load(path, backend="auto"): the GPU where usable, else the host (logged), never an error."""
    from cudnnnet.backends import cuda_available

    small_cnn("host").save(tmp_path / "model.npz")
    network = Network.load(tmp_path / "model.npz", backend="auto")
    assert network.backend.name == ("cuda" if cuda_available() else "host")
    x, _ = batch()
    assert np.allclose(network.forward(x).numpy().reshape(8, 10).sum(axis=1), 1, atol=1e-5)
