import warnings

import numpy as np
import pytest

from cudnnnet import Network, Tensor
from cudnnnet import network as network_module
from cudnnnet.io.checkpoint import save_npz
from cudnnnet.data.mnist import MNIST_MEAN, MNIST_STD
from cudnnnet.errors import CheckpointError, InvalidArgumentError, ShapeError
from cudnnnet.inference import training_normalize
from cudnnnet.network import ModelSizeError, check_model_size
from cudnnnet.layers import MSE, Activation, BatchNorm, Conv2D, Dense, Dropout, Pooling, Softmax
from cudnnnet.limits import MAX_LAYERS


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


class NameReadsCounted(Activation):
    """An Activation that counts how often any such layer's name is read."""

    reads = 0

    @property
    def name(self):
        NameReadsCounted.reads += 1
        return self.__dict__["_name"]

    @name.setter
    def name(self, value):
        self.__dict__["_name"] = value


def test_adding_a_layer_reads_no_name_of_the_layers_before_it():
    """The duplicate-name check compared the new layer's name with every earlier one's: building a
    model of n layers took n²/2 comparisons (8 000 layers, 6.6 s; 100 000, beyond 90 s)."""
    network = Network()
    for index in range(500):
        network.add_layer(NameReadsCounted(f"a{index}", "relu"))
    NameReadsCounted.reads = 0
    network.add_layer(NameReadsCounted("last", "relu"))
    assert NameReadsCounted.reads <= 2
    with pytest.raises(InvalidArgumentError, match="a layer named 'a7' is already in the network"):
        network.add_layer(Activation("a7", "relu"))


def test_a_network_holds_at_most_max_layers_layers():
    """The config's model list says it in the same words (tests/test_config.py)."""
    network = Network()
    for index in range(MAX_LAYERS):
        network.add_layer(Activation(f"a{index}", "relu"))
    with pytest.raises(InvalidArgumentError, match=r"^cannot add layer 'one_more': a model holds at most 10000 layers, "
                                                   r"got 10001$"):
        network.add_layer(Activation("one_more", "relu"))
    assert len(network.layers) == MAX_LAYERS == 10_000


def test_loading_a_checkpoint_lists_the_networks_arrays_once_not_once_per_array(tmp_path, monkeypatch):
    """Each name of a checkpoint was looked up in a list of every parameter made again for it: loading a
    model of n layers took time in n² (900 layers, 16 s)."""
    network = Network(input_shape=None)
    for index in range(40):
        network.add_layer(Dense(f"fc{index}", 4)).add_layer(BatchNorm(f"bn{index}"))
    network.add_layer(Softmax("softmax")).build((1, 2, 2))
    path = network.save(tmp_path / "model.npz")
    listed = []
    parameters = Network.parameters
    monkeypatch.setattr(Network, "parameters", lambda self: listed.append(1) or parameters(self))
    network.load_weights(path)
    assert len(listed) <= 3


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_layers_added_after_eval_or_train_take_the_networks_mode(backend, mode):
    """Layers added after eval() trained: the network said evaluation while its Dropout drew masks."""
    network = Network(backend=backend, seed=3)
    getattr(network, mode)()
    for layer in (Dense("fc", 6), BatchNorm("bn"), Dropout("drop", 0.5), Softmax("softmax")):
        network.add_layer(layer)
    assert [layer.training for layer in network.layers] == [network.training] * 4 == [mode == "train"] * 4
    x = np.random.default_rng(0).standard_normal((5, 1, 3, 3)).astype(np.float32)
    if mode == "eval":
        assert np.array_equal(network.forward(x).numpy(), network.forward(x).numpy())
        assert not network.buffers()["bn.running_mean"].numpy().any()


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


UNREADABLE_INPUTS = {
    "objects": (np.array([[object()]] * 8, dtype=object), ShapeError, r"forward needs a real numeric array, got dtype "
                                                                      r"object"),
    "None": (None, ShapeError, r"forward needs a real numeric array, got dtype object"),
    "text": (np.array(["0.5"] * 800).reshape(8, 1, 10, 10), ShapeError, r"got dtype <U3"),
    "complex numbers": (np.ones((8, 1, 10, 10), np.complex64), ShapeError, r"got dtype complex64"),
    "ragged lists": ([[0.5] * 100, [0.5] * 99], ShapeError, r"forward needs a real numeric array; NumPy cannot make "
                                                            r"one of this list \(setting an array element"),
    "a NaN": (np.where(np.arange(800).reshape(8, 1, 10, 10) == 5, np.nan, 0.5), InvalidArgumentError,
              r"forward: the input holds 1 NaN or infinite values \(of 800\); it must be finite"),
    "infinities": (np.full((8, 1, 10, 10), -np.inf), InvalidArgumentError, r"holds 800 NaN or infinite values"),
    "float64 past float32": (np.full((8, 1, 10, 10), 1e300), InvalidArgumentError, r"holds 800 NaN or infinite"),
}


@pytest.mark.parametrize("call", ["forward", "predict", "train_step"])
@pytest.mark.parametrize("x, error, pattern", UNREADABLE_INPUTS.values(), ids=UNREADABLE_INPUTS.keys())
def test_an_input_that_is_not_finite_real_numbers_is_a_typed_error_naming_it(backend, call, x, error, pattern):
    """Not a NumPy TypeError or ValueError from deep inside, nor NaN scores after a RuntimeWarning."""
    network = small_cnn(backend)
    _, target = batch()
    arguments = (x, target, 0.1) if call == "train_step" else (x,)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(error, match=pattern):
            getattr(network, call)(*arguments)


@pytest.mark.parametrize("as_given", [lambda x: x.astype(np.float64), lambda x: x.astype(np.int16),
                                      lambda x: x > 0, lambda x: np.asfortranarray(x),
                                      lambda x: np.repeat(x, 2, axis=3)[..., ::2], lambda x: x.tolist()],
                         ids=["float64", "int16", "bool", "Fortran order", "strided", "nested lists"])
def test_any_real_numeric_array_is_read_as_its_float32_values(backend, as_given):
    x, _ = batch()
    given = as_given(x)
    expected = small_cnn(backend).forward(Tensor.from_numpy(np.asarray(given, dtype=np.float32), backend)).numpy()
    assert np.array_equal(small_cnn(backend).forward(given).numpy(), expected)
    assert np.array_equal(Tensor.from_numpy(given, backend).numpy().reshape(8, 1, 10, 10),
                          np.asarray(given, dtype=np.float32))


@pytest.mark.parametrize("target, error, pattern", [
    (np.full((8, 10), np.nan, np.float32), InvalidArgumentError, r"the target holds 80 NaN or infinite values"),
    (np.array([None] * 80).reshape(8, 10), ShapeError, r"the target needs a real numeric array, got dtype object"),
], ids=["NaN", "objects"])
@pytest.mark.parametrize("call", ["backward", "loss", "accuracy"])
def test_a_target_that_is_not_finite_real_numbers_is_a_typed_error(host, call, target, error, pattern):
    network = small_cnn(host)
    network.forward(batch()[0])
    with pytest.raises(error, match=pattern):
        getattr(network, call)(target)


@pytest.mark.parametrize("call", ["backward", "loss", "accuracy"])
def test_a_target_before_any_forward_asks_for_the_forward(host, call):
    with pytest.raises(InvalidArgumentError, match=r"layer 'softmax': no output to compare the target with; call "
                                                   r"forward first"):
        getattr(small_cnn(host), call)(batch()[1])


def test_a_batch_too_large_for_the_machine_is_refused_before_the_layers_allocate_it(host, monkeypatch):
    """The check of ``build`` is made again for each new batch size: an array of 20 000 samples must not
    be pushed through layers whose outputs could not fit (the process would be killed, not warned)."""
    network = small_cnn(host)
    monkeypatch.setattr(network_module, "physical_memory", lambda: 8 << 20)
    assert network.forward(batch(16)[0]).shape == (16, 10, 1, 1)
    monkeypatch.setattr(network.layers[0], "forward", lambda x: pytest.fail("the first layer ran"))
    with pytest.raises(ModelSizeError, match=r"the outputs of a batch of 20000, more than this machine's 0\.0 GiB"):
        network.forward(np.zeros((20_000, 1, 10, 10), np.float32))


@pytest.mark.parametrize("value, error, pattern", [
    (np.nan, CheckpointError, r"conv1\.weight holds NaN or infinite values"),
    (None, ShapeError, r"load_state_dict: conv1\.weight needs a real numeric array, got dtype object"),
], ids=["NaN", "objects"])
def test_load_state_dict_refuses_values_a_checkpoint_may_not_hold_and_changes_nothing(host, value, error, pattern):
    network = small_cnn(host)
    before = network.state_dict()
    arrays = {name: np.full(array.shape, value, dtype=object if value is None else np.float32)
              for name, array in before.items()}
    with pytest.raises(error, match=pattern):
        network.load_state_dict(arrays)
    assert all(np.array_equal(array, before[name]) for name, array in network.state_dict().items())


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
    from cudnnnet.config.schema import load_config
    from cudnnnet.train.trainer import build_network

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
