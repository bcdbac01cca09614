"""The engine setting (cudnnnet.engine): the policy, its plumbing, and what each engine runs.

On the host (CI): the policy object, the config key and the --engine flags, and for each of the
three configs the backend verbs each layer calls in one training step and one evaluation batch,
in both engines. On a GPU (marked ``gpu``): the exact multiset of cuBLAS/cuDNN calls per layer in
the slides engine with no kernel of ours besides ``SLIDES_KERNELS``, and GPU == host within 1e-5
after a training step in both engines.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc

import numpy as np
import pytest

from cudnnnet.backends import get_backend
from cudnnnet.backends.cuda import backward_bias
from cudnnnet.cli import evaluate as evaluate_cli
from cudnnnet.cli import predict as predict_cli
from cudnnnet.cli import train as train_cli
from cudnnnet.config.schema import load_config, parse_config
from cudnnnet.engine import DEFAULT_ENGINE, ENGINES, FAST, SLIDES, SLIDES_KERNELS, Engine, get_engine
from cudnnnet.errors import ConfigError, UsageError
from cudnnnet.layers import Activation, Conv2D, Dense, Pooling, Softmax
from cudnnnet.optim.optimizers import SGD
from cudnnnet.train.trainer import Accumulator, ResidentData, ResidentTestSet, build_network
from run_helpers import REPO_ROOT

CONFIGS = ["mnist_mlp", "mnist_cnn", "lenet5"]
CLASSES = 10


def config_of(name: str):
    return load_config(REPO_ROOT / "configs" / f"{name}.yaml")


# ---- the policy -------------------------------------------------------------------------------
def test_engines_are_slides_by_default_and_fast():
    assert DEFAULT_ENGINE == "slides" and set(ENGINES) == {"slides", "fast"}
    assert get_engine("slides") is SLIDES and get_engine("fast") is FAST and get_engine(FAST) is FAST


def test_slides_engine_takes_every_library_path_and_fast_every_fusion():
    choices = [field.name for field in dataclasses.fields(Engine)
               if field.type in ("bool", bool)]
    assert choices and not any(getattr(SLIDES, name) for name in choices)
    assert all(getattr(FAST, name) for name in choices)
    assert SLIDES.convolution_search == "find" and FAST.convolution_search == "exhaustive"


def test_slides_kernels_are_the_loss_and_what_no_library_does():
    assert SLIDES.kernels == SLIDES_KERNELS == {"cross_entropy_loss", "squared_error_loss", "accuracy_count",
                                                "gather_batch", "gather_augmented_batch", "pixels_to_images",
                                                "adam_update_many",
                                                "record_nonfinite", "to_bf16", "to_bf16_x4",
                                                "bf16_to_float", "to_fp16", "to_fp16_x4", "fp16_to_float",
                                                "find_nonfinite_gradients", "update_loss_scale",
                                                "sgd_scaled_coefficients", "channel_sum16"}
    assert SLIDES.allows_kernel("gather_batch") and SLIDES.allows_kernel("gather_augmented_batch")
    assert not SLIDES.allows_kernel("bias_activation_forward")
    assert FAST.allows_kernel("sgd_update_many")


def test_unknown_engine_or_search_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown engine 'turbo'; valid engines are slides, fast"):
        get_engine("turbo")
    with pytest.raises(UsageError, match="invalid convolution_search 'guess'"):
        dataclasses.replace(FAST, convolution_search="guess")


def test_a_backend_holds_the_engine_and_using_engine_restores_it(host):
    before = host.engine
    with host.using_engine("fast") as backend:
        assert backend is host and host.engine is FAST
        with host.using_engine("slides"):
            assert host.engine is SLIDES
        assert host.engine is FAST
    assert host.engine is before
    with pytest.raises(UsageError, match="unknown engine"):
        host.set_engine("turbo")
    assert host.engine is before


# ---- config and command lines -------------------------------------------------------------------
def test_config_engine_defaults_to_slides_and_round_trips():
    config = config_of("mnist_mlp")
    assert config.engine == "slides"
    fast = config.with_overrides(engine="fast")
    assert fast.engine == "fast" and parse_config(fast.to_dict()).engine == "fast"
    assert config.with_overrides(epochs=2).engine == "slides"


def test_config_refuses_an_unknown_engine():
    raw = config_of("mnist_mlp").to_dict()
    raw["engine"] = "turbo"
    with pytest.raises(ConfigError, match=r"engine: expected one of slides, fast, got 'turbo'"):
        parse_config(raw)


def test_every_tool_takes_engine():
    train = train_cli.build_parser().parse_args(["--config", "c.yaml"])
    assert train.engine is None  # the config's engine, itself slides by default
    assert train_cli.build_parser().parse_args(["--config", "c.yaml", "--engine", "fast"]).engine == "fast"
    for parser in (evaluate_cli.build_parser(), predict_cli.build_parser()):
        required = ["--weights", "model.npz"] + (["digit.png"] if parser.prog == "cudnnnet-predict" else [])
        assert parser.parse_args(required).engine == "slides"
        assert parser.parse_args(required + ["--engine", "fast"]).engine == "fast"


def test_a_bad_engine_flag_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit:
        train_cli.main(["--config", "configs/mnist_mlp.yaml", "--engine", "turbo"])
    assert exit.value.code == 2 and "invalid choice: 'turbo'" in capsys.readouterr().err


def test_train_command_line_engine_reaches_the_config(tmp_path, mnist_dir):
    args = train_cli.build_parser().parse_args(["--config", str(REPO_ROOT / "configs" / "mnist_mlp.yaml"),
                                                "--device", "host", "--engine", "fast", "--steps", "1",
                                                "--data-dir", str(mnist_dir), "--output", str(tmp_path / "run")])
    trainer, _ = train_cli.prepare(args)
    assert trainer.config.engine == "fast" and trainer.network.engine is FAST
    with trainer.network.settings():
        assert trainer.backend.engine is FAST
    assert trainer.backend.engine is SLIDES  # the network's own setting, not the backend's
    assert trainer.metrics()["engine"] == "fast"


# ---- what each layer runs: one training step and one evaluation batch ----------------------------
class CallLog:
    """Calls made inside each layer's methods, by (layer, phase, method), as ``snapshot`` counts them."""

    def __init__(self, snapshot, monkeypatch):
        self.snapshot, self.monkeypatch = snapshot, monkeypatch
        self.phase = "train"
        self.calls: dict[tuple, collections.Counter] = collections.defaultdict(collections.Counter)

    def wrap(self, owner, method: str, name: str) -> None:
        original = getattr(owner, method)

        def recorded(*args, **kwargs):
            before = self.snapshot()
            try:
                return original(*args, **kwargs)
            finally:
                self.calls[(name, self.phase, method)] += self.snapshot() - before

        self.monkeypatch.setattr(owner, method, recorded)

    def attach(self, network, optimizer, data) -> None:
        for layer in network.layers[:-1]:
            self.wrap(layer, "forward", layer.name)
            self.wrap(layer, "backward", layer.name)
        loss = network.loss_layer
        self.wrap(loss, "forward_backward_with_metrics", loss.name)
        self.wrap(loss, "forward_metrics", loss.name)
        self.wrap(optimizer, "step", "sgd")
        self.wrap(data, "gather", "data")

    def table(self) -> dict:
        return {key: dict(counter) for key, counter in self.calls.items() if counter}


def step_and_evaluation(config, backend, engine: str, log: CallLog | None = None, seed: int = 0):
    """One training step and one evaluation batch of ``config``'s network on ``backend`` with
    ``engine``, after one untimed warm-up of each (plans, descriptors, kernels, SGD scalars made
    there); ``log`` records the second pair. Returns the network and the metrics accumulator."""
    rng = np.random.default_rng(seed)
    batch = config.train.batch_size
    with backend.using_engine(engine):
        network = build_network(config, backend)
        sample_shape = network.input_shape
        images = rng.standard_normal((2 * batch,) + sample_shape).astype(np.float32)
        labels = rng.integers(0, CLASSES, 2 * batch)
        opt = config.train.optimizer
        optimizer = SGD(network, opt.lr, opt.momentum, opt.weight_decay)
        data = ResidentData(backend, images, labels, batch, CLASSES)
        data.start_epoch(np.arange(2 * batch))
        x_test, target_test = next(ResidentTestSet(backend, images[:batch], labels[:batch], CLASSES).batches(batch))
        totals = Accumulator(backend)

        def step_then_evaluate(index: int) -> None:
            x, target = data.select(index)
            if log is not None:
                log.phase = "train"
            data.gather(x, target)
            network.forward_backward(x, target, totals.loss_sum, totals.correct)
            optimizer.step()
            if log is not None:
                log.phase = "evaluate"
            network.forward_metrics(x_test, target_test, totals.loss_sum, totals.correct, 1.0 / batch)

        step_then_evaluate(0)
        backend.synchronize()
        if log is not None:
            log.attach(network, optimizer, data)
        with collector_paused():
            step_then_evaluate(1)
            backend.synchronize()
    return network, totals


@contextlib.contextmanager
def collector_paused():
    """No garbage collection while calls are recorded: an earlier test's network, freed by the
    collector inside a layer's method, would add its cudaFree / cudaStreamDestroy to that layer."""
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def expected_layer_calls(network, engine: str, verbs: dict) -> dict:
    """{(layer, phase, method): {call: count}} from ``verbs[engine]``, a function of (layer, phase, method)."""
    expected = {}
    for layer in network.layers:
        methods = [("train", "forward_backward_with_metrics"), ("evaluate", "forward_metrics")] if layer.is_loss \
            else [("train", "forward"), ("train", "backward"), ("evaluate", "forward")]
        for phase, method in methods:
            calls = {name: count for name, count in verbs[engine](layer, phase, method).items() if count}
            if calls:
                expected[(layer.name, phase, method)] = calls
    return expected


# backend verbs (host): what a layer asks of its backend in each engine
def slides_verbs(layer, phase, method) -> dict:
    first = layer.gradient_stop
    if isinstance(layer, Dense):
        return {"sgemm": 2} if method == "forward" else {"sgemv": 1, "sgemm": 1 if first else 2}
    if isinstance(layer, Conv2D):
        return {"convolution_forward": 1, "add_tensor": 1} if method == "forward" else \
            {"convolution_backward_bias": 1, "convolution_backward_filter": 1, "convolution_backward_data": int(not first)}
    if isinstance(layer, Activation):
        return {"activation_forward": 1} if method == "forward" else {"activation_backward": int(not first)}
    if isinstance(layer, Pooling):
        return {"pooling_forward": 1} if method == "forward" else {"pooling_backward": int(not first)}
    if phase == "train":  # Softmax: the slides' forward and backward, the loss and hits by our kernels
        return {"softmax_forward": 1, "copy": 1, "saxpy": 1, "sscal": 1, "cross_entropy_loss": 1, "accuracy_count": 1}
    return {"softmax_forward": 1, "cross_entropy_loss": 1, "saxpy": 1, "accuracy_count": 1}


def fast_verbs(layer, phase, method) -> dict:
    first = layer.gradient_stop
    if isinstance(layer, Dense):  # db summed by the Activation after it, where there is one
        return {"sgemm": 1, "bias_activation_forward": 1} if method == "forward" else \
            {"sgemv": int(layer.next_activation is None), "sgemm": 1 if first else 2}
    if isinstance(layer, Conv2D):
        return {"convolution_forward": 1, "bias_activation_forward": 1} if method == "forward" else \
            {"convolution_backward_bias": 1, "convolution_backward_filter": 1, "convolution_backward_data": int(not first)}
    if isinstance(layer, Activation):  # f ran in the bias kernel before it; f' from y, with the Dense's db
        backward = "activation_bias_backward" if layer.dense_before is not None else "activation_backward"
        return {} if method == "forward" else {backward: int(not first)}
    if isinstance(layer, Pooling):
        return {"pooling_forward": 1} if method == "forward" else {"pooling_backward": int(not first)}
    return {"softmax_cross_entropy_backward": 1} if phase == "train" else {"softmax_cross_entropy_metrics": 1}


HOST_VERBS = {"slides": slides_verbs, "fast": fast_verbs}
VERB_NAMES = ("sgemm", "sgemv", "saxpy", "sscal", "scopy", "copy", "fill", "activation_forward", "activation_backward",
              "softmax_forward", "add_tensor", "convolution_forward", "convolution_backward_data",
              "convolution_backward_filter", "convolution_backward_bias", "pooling_forward", "pooling_backward",
              "cross_entropy_loss", "squared_error_loss", "accuracy_count", "gather_batch", "sgd_update",
              "bias_activation_forward", "cross_entropy_backward", "softmax_cross_entropy_backward",
              "softmax_cross_entropy_metrics", "sgd_update_many", "activation_bias_backward")


def count_verbs(backend, monkeypatch) -> collections.Counter:
    """Count the outermost backend verbs called (a fused host call may make others inside it)."""
    counts, depth = collections.Counter(), [0]
    for verb in VERB_NAMES:
        original = getattr(backend, verb)

        def counted(*args, _verb=verb, _original=original, **kwargs):
            if depth[0] == 0:
                counts[_verb] += 1
            depth[0] += 1
            try:
                return _original(*args, **kwargs)
            finally:
                depth[0] -= 1

        monkeypatch.setattr(backend, verb, counted)
    return counts


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", CONFIGS)
def test_each_layer_calls_its_engines_verbs(name, engine, monkeypatch):
    host = get_backend("host")
    counts = count_verbs(host, monkeypatch)
    log = CallLog(lambda: collections.Counter(counts), monkeypatch)
    network, _ = step_and_evaluation(config_of(name), host, engine, log)
    table = log.table()
    assert table.pop(("sgd", "train", "step")) == {"sgd_update_many": 1}
    assert table.pop(("data", "train", "gather")) == {"gather_batch": 1}
    assert table == expected_layer_calls(network, engine, HOST_VERBS)


def test_a_host_step_gives_the_same_weights_in_both_engines():
    config = config_of("mnist_cnn").with_overrides(batch_size=16)
    host = get_backend("host")
    slides, _ = step_and_evaluation(config, host, "slides")
    fast, _ = step_and_evaluation(config, host, "fast")
    for name, value in slides.state_dict().items():
        np.testing.assert_allclose(fast.state_dict()[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


# ---- CUDA: the library calls of the slides engine, and GPU == host ---------------------------------
def cuda_library_calls(layer, phase, method) -> dict:
    """The cuBLAS / cuDNN / runtime calls and our kernels (``kernel:NAME``) of one layer in the slides engine."""
    first = layer.gradient_stop
    if isinstance(layer, Dense):
        return {"cublasSgemm_v2": 2} if method == "forward" else {"cublasSgemv_v2": 1, "cublasSgemm_v2": 1 if first else 2}
    if isinstance(layer, Conv2D):  # the bias gradient in one cudnnConvolutionBackwardBias or two (backward_bias.py)
        return {"cudnnConvolutionForward": 1, "cudnnAddTensor": 1} if method == "forward" else \
            {"cudnnConvolutionBackwardBias": backward_bias.passes(layer.output.shape),
             "cudnnConvolutionBackwardFilter": 1, "cudnnConvolutionBackwardData": int(not first)}
    if isinstance(layer, Activation):
        return {"cudnnActivationForward": 1} if method == "forward" else {"cudnnActivationBackward": int(not first)}
    if isinstance(layer, Pooling):
        return {"cudnnPoolingForward": 1} if method == "forward" else {"cudnnPoolingBackward": int(not first)}
    assert isinstance(layer, Softmax)
    if phase == "train":  # ŷ, then dx = (ŷ − y)/N by copy + saxpy + sscal, then J and the hits by our kernels
        return {"cudnnSoftmaxForward": 1, "cudaMemcpyAsync": 1, "cublasSaxpy_v2": 1, "cublasSscal_v2": 1,
                "kernel:cross_entropy_loss": 1, "kernel:accuracy_count": 1}
    # ŷ; J_batch zeroed then reduced; J += N·scale·J_batch; hits
    return {"cudnnSoftmaxForward": 1, "cudaMemsetAsync": 1, "kernel:cross_entropy_loss": 1, "cublasSaxpy_v2": 1,
            "kernel:accuracy_count": 1}


def cuda_sgd_calls(momentum: float, weight_decay: float) -> dict:
    """−lr from the device rate (scopy, sscal); over the packed parameters v = m·v + g + wd·W (sscal,
    saxpy, saxpy); then, in device pointer mode, W += (−lr)·v."""
    assert momentum and weight_decay  # the three configs' optimiser
    return {"cublasScopy_v2": 1, "cublasSscal_v2": 2, "cublasSaxpy_v2": 3, "cublasSetPointerMode_v2": 2}


def library_snapshot() -> collections.Counter:
    from cudnnnet.backends.cuda import bindings
    from cudnnnet.backends.cuda.kernel import launches

    found = collections.Counter({name: count for name, count in bindings.calls.items() if name != "cuLaunchKernel"})
    found.update({f"kernel:{name}": count for name, count in launches.items()})
    return found


def slides_call_table(name: str, cuda, monkeypatch) -> tuple[dict, dict]:
    """(the calls of each layer, SGD and the gather in one slides step and evaluation; what they must be)."""
    config = config_of(name)
    log = CallLog(library_snapshot, monkeypatch)
    network, _ = step_and_evaluation(config, cuda, "slides", log)
    opt = config.train.optimizer
    expected = expected_layer_calls(network, "slides", {"slides": cuda_library_calls})
    expected[("sgd", "train", "step")] = cuda_sgd_calls(opt.momentum, opt.weight_decay)
    expected[("data", "train", "gather")] = {"kernel:gather_batch": 1}
    return log.table(), expected


def format_table(table: dict) -> str:
    return "\n".join(f"  {layer:<8} {phase:<8} {method:<30} {dict(sorted(calls.items()))}"
                     for (layer, phase, method), calls in table.items())


@pytest.mark.gpu
@pytest.mark.parametrize("name", CONFIGS)
def test_slides_engine_runs_the_slides_library_calls(name, cuda, monkeypatch):
    actual, expected = slides_call_table(name, cuda, monkeypatch)
    ours = {call.removeprefix("kernel:") for calls in actual.values() for call in calls if call.startswith("kernel:")}
    assert ours <= SLIDES_KERNELS, f"kernels of ours outside SLIDES_KERNELS: {sorted(ours - SLIDES_KERNELS)}"
    assert actual == expected, f"{name} in the slides engine:\n{format_table(actual)}\nexpected:\n{format_table(expected)}"


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    actual, expected = actual.astype(np.float64), expected.astype(np.float64)
    norm = np.linalg.norm(expected)
    difference = np.linalg.norm(actual - expected)
    return difference / norm if norm else difference


@pytest.mark.gpu
@pytest.mark.parametrize("name", CONFIGS)
def test_gpu_equals_host_after_a_step_in_each_engine(name, engine, cuda, host):
    """One training step and one evaluation batch from the same weights and data: every weight, the
    summed loss and the hits agree within 1e-5 (``engine`` runs the test body in both engines)."""
    config = config_of(name)
    on_host, host_totals = step_and_evaluation(config, host, engine)
    on_cuda, cuda_totals = step_and_evaluation(config, cuda, engine)
    for parameter, value in on_host.state_dict().items():
        error = relative_error(on_cuda.state_dict()[parameter], value)
        assert error <= 1e-5, f"{parameter}: relative error {error:.3g}"
    (host_loss, host_hits), (cuda_loss, cuda_hits) = host_totals.read(), cuda_totals.read()
    assert cuda_loss == pytest.approx(host_loss, rel=1e-5)
    assert abs(cuda_hits - host_hits) <= 1  # a near-tie of two logits may round to either side
