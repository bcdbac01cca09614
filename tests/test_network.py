import numpy as np
import pytest

from cudnnnet import Network, Tensor
from cudnnnet import network as network_module
from cudnnnet.checkpoint import save_npz
from cudnnnet.data.mnist import MNIST_MEAN, MNIST_STD
from cudnnnet.errors import CheckpointError, InvalidArgumentError, ShapeError
from cudnnnet.inference import training_normalize
from cudnnnet.network import ModelSizeError, check_model_size
from cudnnnet.layers import MSE, Activation, Conv2D, Dense, Pooling, Softmax


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


def test_a_convolution_without_bias_saves_loads_and_leaves_its_activation_its_own(backend, tmp_path):
    network = Network(backend=backend, seed=2, layers=[
        Conv2D("conv1", 4, 3, bias=False), Activation("relu1", "relu"), Dense("fc1", 10), Softmax("softmax")])
    network.build((1, 10, 10))
    assert "conv1.bias" not in network.state_dict() and not network.layers[1].after_bias  # f cannot join a bias
    x, target = batch()
    network.forward(Tensor.from_numpy(x, backend))
    network.backward(target)
    network.update(0.1)
    expected = network.predict(Tensor.from_numpy(x, backend)).numpy()
    network.save(tmp_path / "model.npz")
    loaded = Network.load(tmp_path / "model.npz", backend=backend)
    assert loaded.layers[0].config()["bias"] is False
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


# ---- sizes checked before anything is allocated ----------------------------------------------


@pytest.mark.parametrize("config", ["mnist_cnn", "mnist_bn_cnn", "cifar10_cnn"])
def test_parameter_shapes_are_the_shapes_build_creates(config):
    from cudnnnet.config import load_config
    from cudnnnet.training import build_network

    network = build_network(load_config(config), "host")
    shape = network.input_shape
    for layer in network.layers:
        declared = {f"{layer.name}.{name}": shape for name, shape in layer.parameter_shapes(shape).items()}
        assert declared == {parameter.name: parameter.value.shape for parameter in layer.parameters()}
        shape = layer.output_sample_shape(shape)


@pytest.mark.parametrize("layers, input_shape, batch_size, pattern", [
    ([Dense("fc1", 2**22), Softmax("softmax")], (1, 28, 28),
     1, r"layer 'fc1': its weight of shape \(4194304, 784, 1, 1\) would hold 3288334336 values, more than the 2147483647"),
    ([Conv2D("conv1", 2**16, 3), Dense("fc", 10), Softmax("softmax")], (1, 28, 28),
     64, r"layer 'conv1': its output for a batch of 64 of shape \(64, 65536, 26, 26\) would hold"),
    ([Dense("fc", 10), Softmax("softmax")], (1, 50_000, 50_000), 1, r"the input for a batch of 1 of shape"),
])
def test_a_model_too_large_for_one_tensor_is_refused_before_anything_is_allocated(layers, input_shape, batch_size,
                                                                                  pattern, monkeypatch):
    monkeypatch.setattr(Tensor, "__init__", lambda *args: pytest.fail("a tensor was made"))
    with pytest.raises(ShapeError, match=pattern):
        check_model_size(layers, input_shape, batch_size)


def test_a_model_larger_than_the_machine_is_refused_naming_both_sizes(monkeypatch):
    monkeypatch.setattr(network_module, "physical_memory", lambda: 2**20)
    with pytest.raises(ModelSizeError, match=r"the model needs 0\.0 GiB .* a batch of 1, more than this machine's 0\.0 GiB"):
        Network(layers=[Dense("fc", 1000), Softmax("softmax")]).build((1, 28, 28))


@pytest.mark.parametrize("edit, pattern", [
    (lambda meta: meta.update(input_shape=[1, 100_000, 100_000]), r"invalid input_shape \[1, 100000, 100000\]"),
    (lambda meta: meta["model"][0].update(out_size=2**31 - 1),
     r"its model description cannot be built: layer 'fc1': its weight .* more than the 2147483647"),
    (lambda meta: meta["model"][0].update(out_size=10**30), r"its model description cannot be built: .*fc1"),
    (lambda meta: meta["model"][0].update(out_size=1e20), r"its model description cannot be built: layer 'fc1': out_size"),
])
def test_metadata_declaring_enormous_shapes_is_refused_before_anything_is_allocated(tmp_path, edit, pattern):
    path = _checkpoint_with_metadata(tmp_path, edit)
    with pytest.raises(CheckpointError, match=pattern):
        Network.load(path)


@pytest.mark.parametrize("normalize, pattern", [
    ({"mean": 0.1, "std": 0}, r"data\.normalize\.std: expected a number > 0, got 0"),
    ({"mean": 0.1, "std": "wide"}, r"data\.normalize\.std: expected a number > 0, got 'wide' \(string\)"),
    ({"mean": 0.1}, r"data\.normalize\.std: missing required key"),
    ({"mean": float("nan"), "std": 1.0}, r"data\.normalize\.mean: expected a number, got nan \(not finite\)"),
    ([0.1, 0.3], r"data\.normalize: expected false, true .* or a mapping with mean and std"),
], ids=["std 0", "std a string", "std missing", "mean NaN", "a list"])
def test_malformed_normalisation_in_a_checkpoint_is_refused_naming_the_key(tmp_path, normalize, pattern):
    config = {"model": [{"type": "dense", "out_size": 10}, {"type": "softmax"}], "train": {"optimizer": {"lr": 0.1}},
              "data": {"normalize": normalize}}
    path = _checkpoint_with_metadata(tmp_path, lambda meta: meta.update(config=config))
    with pytest.raises(CheckpointError, match=r"model\.npz: the training config in its metadata: " + pattern):
        Network.load(path)


def test_the_normalisation_comes_from_the_checkpoints_validated_config(tmp_path):
    config = {"model": [{"type": "dense", "out_size": 10}, {"type": "softmax"}], "train": {"optimizer": {"lr": 0.1}},
              "data": {"normalize": True}}
    loaded = Network.load(_checkpoint_with_metadata(tmp_path, lambda meta: meta.update(config=config)))
    assert training_normalize(loaded) == (MNIST_MEAN, MNIST_STD)
    assert training_normalize(Network.load(_checkpoint_with_metadata(tmp_path, lambda meta: None))) is None


def _checkpoint_with_metadata(tmp_path, edit):
    """A small MLP's checkpoint with its metadata changed by ``edit(metadata)``."""
    network = Network(layers=[Dense("fc1", 10), Softmax("softmax")]).build((1, 28, 28))
    metadata = network.metadata()
    edit(metadata)
    path = tmp_path / "model.npz"
    save_npz(path, network.state_dict(), metadata)
    return path


def small_mlp(backend, loss_layer, seed=0):
    network = Network(backend=backend, seed=seed, layers=[
        Dense("fc1", 24), Activation("tanh1", "tanh"), Dense("fc2", 16), Activation("sigmoid2", "sigmoid"),
        Dense("fc3", 10), loss_layer])
    return network.build((1, 10, 10))


TRAIN_STEP_NETWORKS = {"cnn": small_cnn, "mlp softmax": lambda b: small_mlp(b, Softmax("softmax")),
                       "mlp mse": lambda b: small_mlp(b, MSE("quadratic"))}


@pytest.mark.parametrize("math", ["fp32", "bf16"])
@pytest.mark.parametrize("name", TRAIN_STEP_NETWORKS)
def test_train_step_is_forward_backward_update(backend, engine, math, name):
    """Three steps of train_step give the weights of forward, backward, update: in the fast engine
    the Dense weights are updated by their weight-gradient GEMMs (W = W − lr·x·dyᵀ), after dx has
    read the weights of the forward; within float32 rounding of the other order of operations."""
    make = TRAIN_STEP_NETWORKS[name]
    stepped, reference = make(backend), make(backend)
    previous = backend.math
    backend.set_math(math)
    try:
        for seed in range(3):
            x, target = batch(seed=seed)
            stepped.train_step(Tensor.from_numpy(x, backend), Tensor.from_numpy(target, backend), 0.5)
            reference.forward(Tensor.from_numpy(x, backend))
            reference.backward(Tensor.from_numpy(target, backend))
            reference.update(0.5)
    finally:
        backend.set_math(previous)
    expected = reference.state_dict()
    for parameter, value in stepped.state_dict().items():
        np.testing.assert_allclose(value, expected[parameter], rtol=1e-5, atol=2e-6, err_msg=parameter)


def test_the_fast_engine_applies_sgd_to_dense_weights_in_their_weight_gradient_gemm(host, monkeypatch):
    """fast: one GEMM (alpha −lr, beta 1) into each Dense weight, no sgd_update of it and its
    grad_weight untouched; slides: every parameter through sgd_update, every grad_weight written."""
    network = small_cnn(host)
    dense_weights = {f"{layer.name}.weight" for layer in network.layers if isinstance(layer, Dense)}
    x, target = batch()
    for engine_name, updated_in_gemm in (("fast", dense_weights), ("slides", set())):
        for layer in network.layers:
            if isinstance(layer, Dense):
                layer.grad_weight.fill_(7.0)
        weights = {id(value): name for name, value in network.parameters().items()}
        into_weights, updated = [], []
        monkeypatch.setattr(host, "sgemm", lambda *args, _sgemm=type(host).sgemm: (
            into_weights.append((weights.get(id(args[11])), args[5], args[10])) if id(args[11]) in weights else None,
            _sgemm(host, *args))[1])
        monkeypatch.setattr(host, "sgd_update", lambda param, *args, _update=type(host).sgd_update: (
            updated.append(weights[id(param)]), _update(host, param, *args))[1])
        with host.using_engine(engine_name):
            network.train_step(Tensor.from_numpy(x, host), Tensor.from_numpy(target, host), 0.25)
        monkeypatch.undo()
        assert sorted(into_weights) == sorted((name, -0.25, 1.0) for name in updated_in_gemm), engine_name
        assert set(updated) == set(network.parameters()) - updated_in_gemm, engine_name
        untouched = {layer.name for layer in network.layers
                     if isinstance(layer, Dense) and np.all(layer.grad_weight.numpy() == 7.0)}
        assert untouched == {name.split(".")[0] for name in updated_in_gemm}, engine_name


@pytest.mark.parametrize("rate", [float("nan"), float("inf"), "fast", None])
def test_train_step_refuses_a_learning_rate_that_is_not_a_finite_number(host, rate):
    network = small_cnn(host)
    x, target = batch()
    before = network.state_dict()
    with pytest.raises(InvalidArgumentError, match="invalid learning rate.*finite number"):
        network.train_step(x, target, rate)
    assert all(np.array_equal(value, before[name]) for name, value in network.state_dict().items())
