"""Dynamic loss scaling of math fp16 (cudnnnet/optim/loss_scaling.py, kernels/loss_scale.cu) on both
backends: the device calls, a forced overflow that skips the step with weights and optimiser state
bit-unchanged, growth after N clean steps, scaling that changes nothing where nothing overflows
(FP32), a captured CUDA graph replayed over an overflow, and the Trainer's metrics and checkpoints.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from cudnnnet import Network, Tensor
from cudnnnet.io.checkpoint import load_npz
from cudnnnet.config.schema import load_config, parse_config
from cudnnnet.errors import CheckpointError, InvalidArgumentError, ShapeError
from cudnnnet.layers import Activation, Dense, Softmax
from cudnnnet.optim.loss_scaling import (CLEAN, FOUND, MIN_LOSS_SCALE, SCALE, SKIP, SKIPPED, UNSCALE, LossScaler,
                                         LossScaleStatus)
from cudnnnet.config.schema import MAX_LOSS_SCALE
from cudnnnet.optim.optimizers import SGD, Adam
from cudnnnet.train.trainer import Trainer
from run_helpers import REPO_ROOT, math_mode

BATCH, CLASSES, SHAPE = 16, 10, (1, 6, 6)
HUGE = 2.0 ** 60  # S·dJ/dŷ far past the largest half: the first backward GEMM overflows
OPTIMIZERS = {
    "sgd": lambda network: SGD(network, 0.05, momentum=0.9, weight_decay=1e-3),
    "sgd_plain": lambda network: SGD(network, 0.05, weight_decay=1e-3),
    "adam": lambda network: Adam(network, 1e-3, weight_decay=1e-3),
}


class Case:
    """A small MLP, its optimiser and a loss scaler, one fixed batch: ``step`` is the trainer's step."""

    def __init__(self, backend, optimizer: str, initial: float, growth_interval: int = 2000):
        rng = np.random.default_rng(5)
        self.backend = backend
        self.network = Network([Dense("fc1", 32), Activation("relu1", "relu"), Dense("fc2", CLASSES), Softmax("out")],
                               backend=backend, seed=3, input_shape=SHAPE)
        self.optimizer = OPTIMIZERS[optimizer](self.network)
        self.scaler = LossScaler(backend, self.optimizer.flat_gradients(), initial, growth_interval)
        self.optimizer.loss_scale = self.scaler.state
        self.x = Tensor.from_numpy(rng.standard_normal((BATCH, *SHAPE)).astype(np.float32), backend)
        onehot = np.eye(CLASSES, dtype=np.float32)[rng.integers(0, CLASSES, BATCH)]
        self.target = Tensor.from_numpy(onehot.reshape(BATCH, CLASSES, 1, 1), backend)
        self.loss, self.count = Tensor.zeros((1,), backend), Tensor.zeros((1,), backend)

    def step(self, scaled: bool = True) -> None:
        self.network.forward_backward(self.x, self.target, self.loss, self.count,
                                      loss_scale=self.scaler.scale if scaled else None)
        if scaled:
            self.scaler.check()
        self.optimizer.step()

    def snapshot(self) -> dict[str, np.ndarray]:
        """Weights and optimiser state (Adam's device step count among it; not the schedule's host count)."""
        state = {name: value for name, value in self.optimizer.state_arrays("").items() if name != "step"}
        return {**self.network.state_dict(), **state}

    def state(self) -> np.ndarray:
        return self.scaler.state.numpy().reshape(-1)


# ---- the device calls ----------------------------------------------------------------------------
def test_find_nonfinite_gradients_flags_and_zeroes_inf_and_nan(backend):
    values = np.arange(1000, dtype=np.float32) - 500
    grads, state = Tensor.from_numpy(values, backend), Tensor.zeros((6,), backend)
    backend.find_nonfinite_gradients(grads, state)
    assert state.numpy().reshape(-1)[FOUND] == 0
    np.testing.assert_array_equal(grads.numpy().reshape(-1), values)
    values[[3, 700, 999]] = [np.inf, -np.inf, np.nan]
    grads = Tensor.from_numpy(values, backend)
    backend.find_nonfinite_gradients(grads, state)
    assert state.numpy().reshape(-1)[FOUND] == 1
    expected = values.copy()
    expected[[3, 700, 999]] = 0
    np.testing.assert_array_equal(grads.numpy().reshape(-1), expected)


def test_update_loss_scale_halves_on_overflow_doubles_after_the_interval_and_stays_in_range(backend):
    state = Tensor.zeros((6,), backend)

    def update(scale, found, clean, skipped, interval=4):
        state.write_(np.array([scale, found, 0, 0, clean, skipped], np.float32))
        backend.update_loss_scale(state, interval, MIN_LOSS_SCALE, MAX_LOSS_SCALE)
        return state.numpy().reshape(-1).tolist()

    #               [S, found, skip, 1/S, clean, skipped] after the update
    assert update(1024, 1, 3, 7) == [512, 0, 1, 1 / 1024, 0, 8]
    assert update(1024, 0, 2, 7) == [1024, 0, 0, 1 / 1024, 3, 7]
    assert update(1024, 0, 3, 7) == [2048, 0, 0, 1 / 1024, 0, 7]
    assert update(MIN_LOSS_SCALE, 1, 0, 0)[SCALE] == MIN_LOSS_SCALE
    assert update(MAX_LOSS_SCALE, 0, 3, 0)[SCALE] == MAX_LOSS_SCALE


def test_a_loss_scale_state_of_another_size_is_refused(backend):
    with pytest.raises(ShapeError, match="6 values"):
        backend.find_nonfinite_gradients(Tensor.zeros((4,), backend), Tensor.zeros((5,), backend))


def test_the_scaler_refuses_an_initial_scale_or_interval_out_of_range(host):
    for initial, interval in ((0.0, 10), (1e-40, 10), (2.0 ** -127, 10), (2.0 ** 65, 10), (1024.0, 0), (1024.0, 2.5)):
        with pytest.raises(InvalidArgumentError):
            LossScaler(host, None, initial, interval)
    assert LossScaler(host, None, 2.0 ** -126, 1).read().scale == 2.0 ** -126


@pytest.mark.parametrize("scale", [1e-40, 0.0, 2.0 ** 65])
def test_a_checkpoint_s_scale_that_float32_cannot_invert_is_refused(host, scale):
    """A scale below 2^-126 was loaded (1e-40, whose float32 1/S is inf): the first step's update made the weights
    NaN and the run stopped with 'the loss became nan ... try a lower learning rate'."""
    scaler = LossScaler(host, None, 1024.0, 10)
    with pytest.raises(CheckpointError, match=r"the scale must be in \[2\^-126, 2\^64\]"):
        scaler.load_state_arrays({"loss_scale": np.array([scale, 0, 0], np.float32)}, "")
    assert scaler.read().scale == 1024.0


# ---- steps ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_an_overflow_skips_the_step_on_the_device_and_halves_the_scale(backend, engine, optimizer):
    """A huge scale makes the half operands of the backward GEMMs infinite: the step changes no weight,
    no velocity, no Adam moment nor its step count (bit for bit); S halves, one step more is skipped."""
    with math_mode(backend, "fp16"):
        case = Case(backend, optimizer, initial=1024.0)
        case.step()
        case.step()
        before = case.snapshot()
        case.scaler.reset(HUGE, clean_steps=5, skipped_steps=2)
        case.step()
        after = case.snapshot()
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)
    state = case.state()
    assert case.scaler.read() == LossScaleStatus(HUGE / 2, 3)
    assert (state[SKIP], state[UNSCALE], state[CLEAN], state[FOUND]) == (1, 1 / HUGE, 0, 0)
    assert np.isfinite(case.optimizer.flat_gradients().numpy()).all()  # the check set inf and NaN to 0


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_the_scale_doubles_after_growth_interval_clean_steps(backend, optimizer):
    with math_mode(backend, "fp16"):
        case = Case(backend, optimizer, initial=256.0, growth_interval=3)
        start = case.network.state_dict()["fc1.weight"]
        for _ in range(3):
            case.step()
        assert case.scaler.read() == LossScaleStatus(512.0, 0) and case.state()[CLEAN] == 0
        case.step()
        case.step()
        assert case.scaler.read() == LossScaleStatus(512.0, 0) and case.state()[CLEAN] == 2
        case.step()
        assert case.scaler.read() == LossScaleStatus(1024.0, 0)
    assert not np.array_equal(case.network.state_dict()["fc1.weight"], start)  # no step was skipped


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_scaling_by_a_power_of_two_changes_nothing_where_nothing_overflows(backend, engine, optimizer):
    """In FP32 S·g is exact and the optimiser's g/S too, taken before the weight decay and the update:
    three scaled steps give the unscaled steps' weights and optimiser state bit for bit."""
    with math_mode(backend, "fp32"):
        scaled, plain = Case(backend, optimizer, initial=2.0 ** 20), Case(backend, optimizer, initial=1.0)
        plain.optimizer.loss_scale = None
        for _ in range(3):
            scaled.step()
            plain.step(scaled=False)
        with_scaling, without = scaled.snapshot(), plain.snapshot()
    for name, value in without.items():
        np.testing.assert_array_equal(with_scaling[name], value, err_msg=name)
    assert scaled.scaler.read() == LossScaleStatus(2.0 ** 20, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_captured_step_replays_over_an_overflow_without_the_host(cuda, engine, optimizer):
    """The overflow check, the skip and the scale's update are in the graph: a replay at a huge scale
    changes nothing and halves it; later replays halve it on until the steps go through."""
    with math_mode(cuda, "fp16"):
        case = Case(cuda, optimizer, initial=1024.0)
        case.step()  # allocates, plans and uploads the optimiser's tables before the capture
        with cuda.capture() as graph:
            case.step()
        graph.launch()
        before = case.snapshot()
        case.scaler.reset(HUGE, clean_steps=0, skipped_steps=0)
        graph.launch()
        after = case.snapshot()
        for name, value in before.items():
            np.testing.assert_array_equal(after[name], value, err_msg=name)
        assert case.scaler.read() == LossScaleStatus(HUGE / 2, 1)
        for _ in range(64):
            graph.launch()
        status = case.scaler.read()
    assert 1 < status.skipped_steps < 65 and status.scale == HUGE / 2.0 ** status.skipped_steps
    assert not np.array_equal(case.snapshot()["fc1.weight"], before["fc1.weight"])


# ---- the trainer ---------------------------------------------------------------------------------
def fp16_config(mnist_dir, device: str, optimizer: dict, steps: int, initial: float):
    settings = load_config(REPO_ROOT / "configs" / "mnist_mlp.yaml").with_overrides(
        steps=steps, batch_size=64, device=device, data_dir=mnist_dir).to_dict()
    settings["math"] = "fp16"
    settings["train"].update(optimizer=optimizer, log_every=5, checkpoint_every="never",
                             loss_scale={"initial": initial, "growth_interval": 4})
    return parse_config(settings)


@pytest.mark.parametrize("optimizer", [{"name": "sgd", "lr": 0.05, "momentum": 0.9},
                                       {"name": "adamw", "lr": 0.001}], ids=["sgd", "adamw"])
def test_the_trainer_reports_and_checkpoints_the_scale_and_resume_continues_it(mnist_dir, tmp_path, backend,
                                                                                 optimizer):
    """Starting at 2^24 the first steps overflow: the metrics name the scale and the skipped steps,
    model.npz keeps them (and Adam's own step count, behind by the skipped steps), and a resumed
    run starts from them."""
    device = backend.name
    first = Trainer(fp16_config(mnist_dir, device, optimizer, 10, 2.0 ** 24), tmp_path / "first", progress=False,
                    image_limit=640)
    metrics = first.run()
    written = json.loads((tmp_path / "first" / "metrics.json").read_text())
    status = first.loss_scaler.read()
    assert written["loss_scale"] == metrics["loss_scale"] == status.scale < 2.0 ** 24
    assert written["skipped_steps"] == status.skipped_steps >= 1 and written["math"] == "fp16"
    arrays, _ = load_npz(tmp_path / "first" / "model.npz")
    saved_scale, saved_clean, saved_skipped = arrays["optimizer.loss_scale"]
    assert (saved_scale, saved_skipped) == (status.scale, status.skipped_steps)
    if optimizer["name"] == "adamw":
        assert arrays["optimizer.adam_steps"][0] == 10 - status.skipped_steps
    resumed = Trainer(fp16_config(mnist_dir, device, optimizer, 20, 2.0 ** 24), tmp_path / "second",
                      resume=tmp_path / "first", progress=False, image_limit=640)
    state = resumed.loss_scaler.state.numpy().reshape(-1)
    assert (state[SCALE], state[CLEAN], state[SKIPPED]) == (saved_scale, saved_clean, saved_skipped)
    if optimizer["name"] == "adamw":
        assert resumed.optimizer.counter.numpy().reshape(-1)[0] == 10 - status.skipped_steps
    resumed.run()
    assert resumed.loss_scaler.read().skipped_steps >= status.skipped_steps


def test_other_maths_train_without_a_loss_scaler(mnist_dir, tmp_path):
    config = load_config(REPO_ROOT / "configs" / "mnist_mlp.yaml").with_overrides(
        steps=2, device="host", data_dir=mnist_dir)
    trainer = Trainer(config, tmp_path, progress=False, image_limit=128)
    metrics = trainer.run()
    assert trainer.loss_scaler is None and trainer.optimizer.loss_scale is None
    assert "loss_scale" not in metrics and "skipped_steps" not in metrics
    assert "optimizer.loss_scale" not in load_npz(tmp_path / "model.npz")[0]
