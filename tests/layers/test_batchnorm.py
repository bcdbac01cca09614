import numpy as np
import pytest

from cudnnnet import Network, Tensor
from cudnnnet.backends.descriptors import BatchNormMode
from cudnnnet.config.schema import parse_config
from cudnnnet.errors import CheckpointError, ConfigError, InvalidArgumentError
from cudnnnet.layers import BatchNorm, Conv2D, Dense, Softmax
from layer_checks import build, check_layer_gradients, relative_error

CASES = [  # (sample shape, mode, the mode it resolves to)
    ((3, 5, 4), "auto", BatchNormMode.SPATIAL),
    ((6, 1, 1), "auto", BatchNormMode.PER_ACTIVATION),
    ((2, 3, 3), "per_activation", BatchNormMode.PER_ACTIVATION),
]


def direct_batch_norm(x, gamma, beta, axes, eps):
    """y and the batch statistics, in float64 from the definition."""
    x = x.astype(np.float64)
    mean = x.mean(axis=axes, keepdims=True)
    variance = x.var(axis=axes, keepdims=True)
    return gamma * (x - mean) / np.sqrt(variance + eps) + beta, mean, variance


def random_layer(sample_shape, mode, backend, momentum=0.1):
    """A built BatchNorm whose γ and β are not 1 and 0."""
    layer = build(BatchNorm("bn", mode, momentum=momentum), sample_shape, backend)
    rng = np.random.default_rng(5)
    layer.weight.write_(rng.uniform(0.5, 1.5, layer.weight.shape))
    layer.bias.write_(rng.standard_normal(layer.bias.shape))
    return layer


@pytest.mark.parametrize("sample_shape, mode, resolved", CASES)
def test_training_forward_normalises_with_batch_statistics_and_updates_the_running_ones(backend, sample_shape, mode,
                                                                                        resolved):
    layer = random_layer(sample_shape, mode, backend, momentum=0.3)
    assert layer.batch_norm_mode == resolved
    axes = (0, 2, 3) if resolved == BatchNormMode.SPATIAL else (0,)
    x = (np.random.default_rng(0).standard_normal((8,) + sample_shape) * 2 + 1).astype(np.float32)
    y = layer.forward(Tensor.from_numpy(x, backend)).numpy()
    expected, mean, variance = direct_batch_norm(x, layer.weight.numpy(), layer.bias.numpy(), axes, 1e-5)
    assert relative_error(y, expected) < 1e-5
    m = x.size // mean.size
    assert np.allclose(layer.running_mean.numpy(), 0.3 * mean, rtol=1e-5, atol=1e-6)
    assert np.allclose(layer.running_var.numpy(), 0.7 + 0.3 * variance * m / (m - 1), rtol=1e-5)


@pytest.mark.parametrize("sample_shape, mode, resolved", CASES)
def test_evaluation_uses_the_running_statistics(backend, sample_shape, mode, resolved):
    layer = random_layer(sample_shape, mode, backend)
    rng = np.random.default_rng(1)
    layer.running_mean.write_(rng.standard_normal(layer.running_mean.shape))
    layer.running_var.write_(rng.uniform(0.5, 2.0, layer.running_var.shape))
    stats = layer.running_mean.numpy(), layer.running_var.numpy()
    layer.training = False
    x = rng.standard_normal((4,) + sample_shape).astype(np.float32)
    y = layer.forward(Tensor.from_numpy(x, backend)).numpy()
    expected = layer.weight.numpy() * (x - stats[0]) / np.sqrt(stats[1] + 1e-5) + layer.bias.numpy()
    assert relative_error(y, expected) < 1e-5
    assert np.array_equal(layer.running_mean.numpy(), stats[0])  # evaluation leaves them alone


@pytest.mark.parametrize("sample_shape, mode, resolved", CASES)
def test_gradient_matches_finite_differences(backend, sample_shape, mode, resolved):
    layer = random_layer(sample_shape, mode, backend)
    x = np.random.default_rng(2).standard_normal((6,) + sample_shape).astype(np.float32)
    check_layer_gradients(layer, x, eps=1e-2, tolerance=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["slides", "fast"])  # cuDNN's calls, our kernels
@pytest.mark.parametrize("sample_shape, mode, resolved", CASES + [((32, 16, 16), "auto", BatchNormMode.SPATIAL)])
def test_cuda_matches_the_host(cuda, host, sample_shape, mode, resolved, engine):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((16,) + sample_shape) * 3 + 2).astype(np.float32)
    dy = rng.standard_normal((16,) + sample_shape).astype(np.float32)
    results = []
    with cuda.using_engine(engine):
        for backend in (host, cuda):
            layer = random_layer(sample_shape, mode, backend)
            y = layer.forward(Tensor.from_numpy(x, backend)).numpy()
            dx = layer.backward(Tensor.from_numpy(dy, backend)).numpy()
            layer.training = False
            inference = layer.forward(Tensor.from_numpy(x, backend)).numpy()
            results.append((y, dx, layer.grad_weight.numpy(), layer.grad_bias.numpy(), layer.running_mean.numpy(),
                            layer.running_var.numpy(), layer.save_mean.numpy(), layer.save_inv_std.numpy(),
                            inference))
    names = ("y", "dx", "dγ", "dβ", "running mean", "running var", "saved mean", "saved 1/σ", "inference")
    for what, on_host, on_cuda in zip(names, *results):
        assert relative_error(on_cuda, on_host) < 1e-4, what


def batch_norm_relu_network(backend, sample_shape) -> Network:
    """BatchNorm → ReLU → Dense → Softmax, γ and β not 1 and 0, so that the ReLU cuts some values."""
    from cudnnnet.layers import Activation

    network = Network([BatchNorm("bn"), Activation("relu", "relu"), Dense("fc", 10), Softmax("softmax")],
                      backend=backend, seed=3, input_shape=sample_shape)
    rng = np.random.default_rng(5)
    network.layers[0].weight.write_(rng.uniform(0.5, 1.5, network.layers[0].weight.shape))
    network.layers[0].bias.write_(rng.standard_normal(network.layers[0].bias.shape))
    return network


def batch_norm_relu_step(network, backend, x, target) -> dict:
    """One forward and backward pass: the gradients, the output and the evaluation output by name."""
    network.forward(Tensor.from_numpy(x, backend))
    network.backward(target)
    found = {parameter.name: parameter.grad.numpy() for parameter in network.parameter_list()}
    found["training output"] = network.layers[-1].output.numpy()
    found["evaluation output"] = network.predict(Tensor.from_numpy(x, backend)).numpy()
    return found


@pytest.mark.parametrize("sample_shape", [(4, 5, 6), (12, 1, 1)])  # spatial, per activation
def test_relu_applied_by_the_fast_engines_batch_norm_is_the_relu_layers(backend, sample_shape):
    """The fast engine applies the ReLU (and its gradient) in the BatchNorm's passes; the slides engine
    runs the Activation layer's own calls: the same outputs and gradients either way."""
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((9,) + sample_shape) * 2 + 0.5).astype(np.float32)
    target = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 9)]
    found = {}
    for engine in ("slides", "fast"):
        with backend.using_engine(engine):
            network = batch_norm_relu_network(backend, sample_shape)
            assert network.layers[1].fused_into_batch_norm == (engine == "fast")
            found[engine] = batch_norm_relu_step(network, backend, x, target)
    assert 0 < (found["fast"]["fc.weight"] != 0).mean()
    for name, slides in found["slides"].items():
        assert relative_error(found["fast"][name], slides) < 1e-5, name


@pytest.mark.gpu
def test_cuda_fast_batch_norm_runs_our_kernels_alone_and_repeats_its_bits(cuda):
    from cudnnnet.backends.cuda import bindings, kernel

    rng = np.random.default_rng(6)
    x = (rng.standard_normal((64, 32, 8, 8)) + 1).astype(np.float32)
    target = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 64)]
    with cuda.using_engine("fast"):
        runs = []
        for _ in range(2):
            network = batch_norm_relu_network(cuda, (32, 8, 8))
            network.forward(Tensor.from_numpy(x, cuda))  # plans and compiles outside the counted pass
            bindings.reset_calls()
            kernel.reset_launches()
            runs.append(batch_norm_relu_step(network, cuda, x, target))
            calls, launches = dict(bindings.calls), dict(kernel.launches)
    assert "cudnnBatchNormalizationForwardTraining" not in calls and "cudnnBatchNormalizationBackward" not in calls
    assert calls.get("cudnnActivationForward") == 1 and "cudnnActivationBackward" not in calls  # evaluation's ReLU
    assert {name: launches.get(name) for name in ("batch_norm_sums", "batch_norm_forward_apply",
                                                  "batch_norm_gradient_sums", "batch_norm_backward_apply")} == {
        "batch_norm_sums": 1, "batch_norm_forward_apply": 1, "batch_norm_gradient_sums": 1,
        "batch_norm_backward_apply": 1}
    assert "activation_backward" not in launches and "activation_backward_x4" not in launches
    for name, first in runs[0].items():
        assert np.array_equal(runs[1][name], first), name


def test_running_statistics_are_saved_and_loaded_as_buffers_not_trained(backend, tmp_path):
    def network():
        return Network(backend=backend, seed=1, layers=[Conv2D("conv", 3, 3), BatchNorm("bn"), Dense("fc", 10),
                                                         BatchNorm("bn2"), Softmax("softmax")]).build((1, 6, 6))

    trained = network()
    x = np.random.default_rng(0).standard_normal((8, 1, 6, 6)).astype(np.float32)
    trained.forward(x)
    assert {p.name for p in trained.parameter_list()} >= {"bn.weight", "bn.bias"}
    assert not {"bn.running_mean", "bn.running_var"} & {p.name for p in trained.parameter_list()}
    trained.save(tmp_path / "model.npz")
    loaded = Network.load(tmp_path / "model.npz", backend=backend)
    for name, value in trained.buffers().items():
        assert np.array_equal(loaded.buffers()[name].numpy(), value.numpy()), name
    assert np.array_equal(loaded.predict(x).numpy(), trained.predict(x).numpy())
    with pytest.raises(CheckpointError, match="running_mean: the original format stores only"):
        trained.save_original(tmp_path / "original")


@pytest.mark.parametrize("mode, sample_shape", [("auto", (3, 1, 1)), ("spatial", (3, 1, 1))])
def test_a_training_forward_over_one_value_per_statistic_is_refused(backend, mode, sample_shape):
    """One sample through a BatchNorm per activation (or over 1×1 planes) output β alone in training and
    passed no gradient back, silently; in evaluation it is an ordinary forward."""
    layer = build(BatchNorm("bn", mode), sample_shape, backend)
    x = Tensor.from_numpy(np.arange(3, dtype=np.float32).reshape(1, *sample_shape), backend)
    with pytest.raises(InvalidArgumentError, match=r"layer 'bn': a training forward of 1 sample takes each batch "
                                                   r"statistic over one value .*or call network\.eval\(\) to evaluate"):
        layer.forward(x)
    assert np.array_equal(layer.running_var.numpy(), np.ones(layer.running_var.shape))
    layer.training = False
    assert np.isfinite(layer.forward(x).numpy()).all()
    spatial = build(BatchNorm("bn", "auto"), (2, 2, 2), backend)  # a plane of 4 values: one sample is enough
    spatial.forward(Tensor.from_numpy(np.arange(8, dtype=np.float32).reshape(1, 2, 2, 2), backend))


def test_a_training_step_after_an_evaluation_forward_is_refused(backend):
    """train_step after eval() normalised with the running statistics and then differentiated with the
    last training batch's statistics (zero gradients for a new network), silently."""
    network = Network(backend=backend, layers=[Dense("fc", 3), BatchNorm("bn"), Softmax("softmax")]).build((1, 2, 2))
    x, target = np.random.default_rng(0).standard_normal((4, 1, 2, 2)), np.eye(3)[[0, 1, 2, 0]]
    before = network.state_dict()
    network.eval()
    with pytest.raises(InvalidArgumentError, match=r"layer 'bn': backward after a forward in evaluation mode; .*call "
                                                   r"network\.train\(\) before the forward"):
        network.train_step(x, target, 0.1)
    assert all(np.array_equal(value, before[name]) for name, value in network.state_dict().items())
    network.forward(x)
    network.train()
    with pytest.raises(InvalidArgumentError, match="backward after a forward in evaluation mode"):
        network.backward(target)
    network.forward(x)
    network.backward(target)
    assert np.abs(network.gradients()["fc.weight"].numpy()).sum() > 0


def test_a_negative_running_variance_is_refused_before_anything_is_loaded(backend, tmp_path):
    """A checkpoint whose running variance is negative was loaded and predicted NaN (class 0, probability nan)."""
    network = Network(backend=backend, layers=[Dense("fc", 3), BatchNorm("bn"), Softmax("softmax")]).build((1, 2, 2))
    before = network.state_dict()
    state = {**before, "fc.weight": before["fc.weight"] + 1, "bn.running_var": np.array([[[[0.5]], [[-0.25]], [[0.0]]]])}
    with pytest.raises(CheckpointError, match=r"^bn\.running_var holds 1 negative values \(of 3\); a variance is >= 0$"):
        network.load_state_dict(state)
    assert all(np.array_equal(value, before[name]) for name, value in network.state_dict().items())
    network.save(tmp_path / "model.npz", extra_arrays={"bn.running_var": state["bn.running_var"].astype(np.float32)})
    with pytest.raises(CheckpointError, match=r"model\.npz: bn\.running_var holds 1 negative values"):
        Network.load(tmp_path / "model.npz", backend=backend)
    state["bn.running_var"] = np.zeros((1, 3, 1, 1))  # a constant input's variance: eps keeps it finite
    network.load_state_dict(state)
    assert np.isfinite(network.predict(np.ones((2, 1, 2, 2))).numpy()).all()


@pytest.mark.parametrize("arguments, message", [({"mode": "batch"}, "unknown batch normalisation mode"),
                                                ({"momentum": 0}, "momentum must be a number in \\(0, 1\\]"),
                                                ({"eps": 1e-6}, r"eps must be a finite number in \[1e-05, 3\.40282e\+38\] "
                                                                r"\(cuDNN's minimum, float32's largest number\), got 1e-06"),
                                                ({"eps": 1.0e39}, r"eps must be a finite number in \[1e-05, 3\.40282e\+38\]"),
                                                ({"eps": float("nan")}, r"eps must be a finite number .* got nan"),
                                                ({"eps": 10**400}, r"eps must be a finite number .* got 1000")])
def test_invalid_arguments_are_refused(arguments, message):
    with pytest.raises(InvalidArgumentError, match=message):
        BatchNorm("bn", **arguments)


def test_config_reads_batchnorm_with_defaults():
    model = [{"type": "conv2d", "out_channels": 4, "kernel_size": 3}, {"type": "batchnorm"},
             {"type": "batchnorm", "mode": "spatial", "momentum": 0.01, "eps": 1.0e-3}, {"type": "softmax"}]
    config = parse_config({"model": model, "train": {"optimizer": {"lr": 0.1}}})
    assert config.model[1].params == {"mode": "auto", "momentum": 0.1, "eps": 1e-5}
    assert config.model[2].params == {"mode": "spatial", "momentum": 0.01, "eps": 1e-3}
    model[1]["mode"] = "channel"
    with pytest.raises(ConfigError, match=r"model\[1\].mode: expected one of auto, spatial, per_activation"):
        parse_config({"model": model, "train": {"optimizer": {"lr": 0.1}}})


@pytest.mark.gpu
def test_cuda_runs_cudnns_batch_normalisation_calls(cuda):
    from cudnnnet.backends.cuda import bindings

    layer = random_layer((4, 3, 3), "auto", cuda)
    x = Tensor.from_numpy(np.random.default_rng(0).standard_normal((5, 4, 3, 3)), cuda)
    bindings.reset_calls()
    layer.forward(x)
    layer.backward(x)
    layer.training = False
    layer.forward(x)
    assert [bindings.calls[f"cudnnBatchNormalization{call}"] for call in ("ForwardTraining", "Backward",
                                                                          "ForwardInference")] == [1, 1, 1]
