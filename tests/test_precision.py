"""The precision policy (cudnnnet.precision): its vocabulary, defined once and read by the config,
the command lines, the benchmark and the backends; its facts, which callers act on. And both
policies scoped: a Network owns its engine and precision, in force on its backend during its own
calls only, so two networks train interleaved as each trains alone (host; ``gpu``: the device)."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from cudnnnet.backends.cuda import backend as cuda_backend
from cudnnnet.backends.cuda import convolution, low_precision, matmul
from cudnnnet.backends.host import backend as host_backend
from cudnnnet.benchmark import settings as benchmark_settings
from cudnnnet.cli import benchmark as benchmark_cli
from cudnnnet.config.schema import load_config, parse_config
from cudnnnet.engine import FAST, SLIDES
from cudnnnet.layers import Activation, Dense, Softmax
from cudnnnet.network import Network
from cudnnnet.optim.optimizers import SGD
from cudnnnet.errors import ConfigError, UsageError
from cudnnnet.precision import (BF16, BFLOAT16, DEFAULT_PRECISION, FLOAT16, FP16, FP32, HALF_PRECISIONS,
                                PRECISION_NAMES, PRECISIONS, TF32, Precision, get_precision)
from run_helpers import REPO_ROOT


def test_the_vocabulary_and_its_facts():
    assert PRECISION_NAMES == ("fp32", "tf32", "bf16", "fp16") and DEFAULT_PRECISION == "fp32"
    assert [precision.operand_dtype for precision in (FP32, TF32, BF16, FP16)] == [None, None, BFLOAT16, FLOAT16]
    assert HALF_PRECISIONS == ("bf16", "fp16") and BF16.half and not TF32.half
    assert [name for name, precision in PRECISIONS.items() if precision.loss_scaling] == ["fp16"]
    assert [name for name, precision in PRECISIONS.items() if precision.tensor_cores] == ["tf32"]
    assert str(BF16) == "bf16" and get_precision("fp16") is FP16 and get_precision(TF32) is TF32


@pytest.mark.parametrize("bad", ["fp8", "FP32", None, ["bf16"]])
def test_an_unknown_precision_is_a_usage_error_naming_the_valid_ones(bad):
    with pytest.raises(UsageError, match=rf"invalid math mode {repr(bad).replace('[', '.')}.*; "
                                         r"valid are fp32, tf32, bf16, fp16"):
        get_precision(bad)


def test_a_precision_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        BF16.loss_scaling = True  # type: ignore[misc]
    assert isinstance(FP32, Precision)


def test_the_config_reads_the_vocabulary():
    raw = load_config(REPO_ROOT / "configs" / "mnist_mlp.yaml").to_dict()
    assert parse_config({**raw, "math": "fp16"}).math == "fp16"
    with pytest.raises(ConfigError, match=r"math: expected one of fp32, tf32, bf16, fp16, got 'fp8'"):
        parse_config({**raw, "math": "fp8"})


def test_the_benchmark_and_the_command_line_read_the_vocabulary():
    assert benchmark_settings.WORKLOAD_MATHS == PRECISION_NAMES
    assert benchmark_settings.HALF_MATHS == HALF_PRECISIONS
    assert benchmark_settings.MATHS == ("fp32", "tf32", "bf16")  # the micro-benchmark: no loss scaling
    math = next(action for action in benchmark_cli.build_parser()._actions if action.dest == "math")
    assert tuple(math.choices) == PRECISION_NAMES and math.default == DEFAULT_PRECISION


def test_the_backends_tables_cover_the_vocabulary_and_nothing_else():
    """Each backend's translation of a mode into its library's constants names modes of the vocabulary."""
    assert tuple(cuda_backend.MATH_MODES) == tuple(PRECISIONS.values())
    assert cuda_backend.CudaBackend.maths == PRECISION_NAMES
    assert host_backend.MATHS == ("fp32", "bf16", "fp16")
    operand_types = {PRECISIONS[name].operand_dtype for name in HALF_PRECISIONS}
    assert set(low_precision.HALF_FORMATS) == operand_types == set(convolution.DATA_TYPES) == set(matmul.OPERAND_TYPES)


def test_the_cuda_translations_are_read_from_the_precision_s_facts():
    """Each precision's library constants follow from its typed facts, not from its name."""
    assert [low_precision.half_format(precision) for precision in (FP32, TF32, BF16, FP16)] == \
        [None, None, low_precision.BF16, low_precision.FP16]
    assert [convolution.data_type(precision) for precision in (FP32, TF32, BF16, FP16)] == \
        [convolution.cudnn.DATA_FLOAT, convolution.cudnn.DATA_FLOAT, convolution.cudnn.DATA_BFLOAT16,
         convolution.cudnn.DATA_HALF]
    assert [matmul.compute_type(precision) for precision in (FP32, TF32, BF16, FP16)] == \
        [matmul.cublaslt.COMPUTE_32F, matmul.cublaslt.COMPUTE_32F_FAST_TF32, matmul.cublaslt.COMPUTE_32F,
         matmul.cublaslt.COMPUTE_32F]
    assert [matmul.operand_type_of(precision) for precision in (FP32, TF32, BF16, FP16)] == \
        [matmul.cublas.R_32F, matmul.cublas.R_32F, matmul.cublas.R_16BF, matmul.cublas.R_16F]
    half_tf32 = dataclasses.replace(TF32, name="tf32-half", operand_dtype=BFLOAT16)  # facts, not the name, decide
    assert low_precision.half_format(half_tf32) is low_precision.BF16
    assert matmul.compute_type(half_tf32) == matmul.cublaslt.COMPUTE_32F_FAST_TF32


# ---- scoped, not global ---------------------------------------------------------------------------
def test_using_puts_settings_in_force_for_its_block_and_its_thread_only(host):
    seen_elsewhere = []
    with host.using(engine="fast", math="bf16") as backend:
        assert backend is host and (host.engine, host.precision, host.math) == (FAST, BF16, "bf16")
        with host.using(math="fp16"):
            assert (host.engine, host.precision) == (FAST, FP16)
        assert (host.engine, host.precision) == (FAST, BF16)
        other = threading.Thread(target=lambda: seen_elsewhere.append((host.engine, host.precision)))
        other.start()
        other.join()
    assert seen_elsewhere == [(SLIDES, FP32)]
    assert (host.engine, host.precision) == (SLIDES, FP32)
    with pytest.raises(UsageError, match="invalid math mode 'fp8'"):
        with host.using(math="fp8"):
            pass
    assert host.precision is FP32


def test_the_backend_s_defaults_apply_outside_any_block(host):
    host.set_math("bf16")
    host.set_engine("fast")
    assert (host.engine, host.math) == (FAST, "bf16")
    with host.using(engine="slides", math="fp32"):
        assert (host.engine, host.math) == (SLIDES, "fp32")
    assert (host.engine, host.math) == (FAST, "bf16")


def test_a_network_refuses_an_unknown_engine_or_math():
    with pytest.raises(UsageError, match="invalid math mode 'fp8'; valid are fp32, tf32, bf16, fp16"):
        Network(math="fp8")
    with pytest.raises(UsageError, match="unknown engine 'turbo'"):
        Network(engine="turbo")


BATCH, FEATURES, CLASSES, STEPS = 6, 12, 4, 5


def small_mlp(backend, engine, math) -> Network:
    layers = [Dense("fc1", 16), Activation("relu1", "relu"), Dense("fc2", CLASSES), Softmax("softmax")]
    return Network(layers, backend=backend, seed=3, input_shape=(FEATURES, 1, 1), engine=engine, math=math)


def batches():
    rng = np.random.default_rng(7)
    for _ in range(STEPS):
        x = rng.standard_normal((BATCH, FEATURES, 1, 1)).astype(np.float32)
        yield x, np.eye(CLASSES, dtype=np.float32)[rng.integers(0, CLASSES, BATCH)]


class Training:
    """A network trained step by step: even steps by ``train_step``, odd ones by forward, backward and
    an SGD optimiser with momentum, so that every entry point runs in the network's settings."""

    def __init__(self, backend, engine, math):
        self.network = small_mlp(backend, engine, math)
        self.optimizer = SGD(self.network, 0.1, momentum=0.9)
        self.steps = 0

    def step(self, x, target) -> None:
        if self.steps % 2 == 0:
            self.network.train_step(x, target, 0.1)
        else:
            self.network.forward(x)
            self.network.backward(target)
            self.optimizer.step()
        self.steps += 1

    def weights(self) -> dict:
        return self.network.state_dict()


def assert_same_weights(backend, found: dict, expected: dict) -> None:
    for name, value in expected.items():
        if backend.name == "host":  # NumPy computes alike every time
            np.testing.assert_array_equal(found[name], value, err_msg=name)
        else:
            np.testing.assert_allclose(found[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


def test_two_networks_train_interleaved_each_as_it_trains_alone(backend):
    """slides/fp32 beside fast/bf16 in one process, one step each in turn: each ends with the weights
    it reaches alone, and the backend's own defaults are untouched."""
    settings = {"exact": ("slides", "fp32"), "fast": ("fast", "bf16")}
    alone = {}
    for key, (engine, math) in settings.items():
        training = Training(backend, engine, math)
        for x, target in batches():
            training.step(x, target)
        alone[key] = training.weights()
    together = {key: Training(backend, engine, math) for key, (engine, math) in settings.items()}
    for x, target in batches():
        for training in together.values():
            training.step(x, target)
    for key in settings:
        assert_same_weights(backend, together[key].weights(), alone[key])
    difference = max(float(np.max(np.abs(alone["exact"][name] - alone["fast"][name]))) for name in alone["exact"])
    assert difference > 1e-4  # the settings took effect: bf16 operands move the weights well past the tolerance
    assert (backend.engine, backend.math) == (SLIDES, "fp32")


def test_a_network_s_settings_override_an_enclosing_block_and_none_follows_it(host):
    inside = []
    network = small_mlp(host, "fast", "bf16")
    following = small_mlp(host, None, None)
    network.layers[0].forward = _recording(network.layers[0].forward, host, inside)
    following.layers[0].forward = _recording(following.layers[0].forward, host, inside)
    x, _ = next(batches())
    with host.using(engine="slides", math="fp16"):
        network.forward(x)
        following.forward(x)
    assert inside == [("fast", "bf16"), ("slides", "fp16")]


def _recording(forward, backend, seen: list):
    def recorded(x):
        seen.append((backend.engine.name, backend.math))
        return forward(x)
    return recorded


def test_copies_and_pickles_of_the_vocabulary_are_its_own_objects():
    """Callers compare dtypes and precisions with ``is``: a copy, a deep copy or a pickle round trip of
    one of the vocabulary gives back that object; one with other facts stays its own."""
    import copy
    import pickle

    from cudnnnet.precision import DTYPES

    for value in (*DTYPES.values(), *PRECISIONS.values()):
        assert copy.copy(value) is value and copy.deepcopy(value) is value
        assert pickle.loads(pickle.dumps(value)) is value
    other = dataclasses.replace(TF32, name="tf32-half", operand_dtype=BFLOAT16)
    restored = pickle.loads(pickle.dumps(other))
    assert restored == other and restored is not other and restored.operand_dtype is BFLOAT16
