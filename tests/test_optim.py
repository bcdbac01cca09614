import numpy as np
import pytest

from cudnnnet import Network, Tensor
from cudnnnet.io import checkpoint
from cudnnnet.config.schema import OptimizerConfig, ScheduleConfig
from cudnnnet.errors import CheckpointError, InvalidArgumentError
from cudnnnet.layers import Dense, Softmax
from cudnnnet.network import OPTIMIZER_PREFIX
from cudnnnet.optim.optimizers import SGD, Adam, make_optimizer


def network_with_gradients(backend):
    network = Network(backend=backend, layers=[Dense("fc", 4), Softmax("softmax")]).build((3, 1, 1))
    rng = np.random.default_rng(0)
    network.forward(Tensor.from_numpy(rng.standard_normal((5, 3)), backend))
    network.backward(Tensor.from_numpy(np.eye(4, dtype=np.float32)[[0, 1, 2, 3, 0]], backend))
    return network


def test_momentum_and_weight_decay_follow_pytorchs_formulation(backend):
    network = network_with_gradients(backend)
    optimizer = SGD(network, lr=0.1, momentum=0.9, weight_decay=0.01)
    weights = {name: value.numpy().astype(np.float64) for name, value in network.parameters().items()}
    grads = {name: grad.numpy().astype(np.float64) for name, grad in network.gradients().items()}
    velocity = {name: np.zeros_like(value) for name, value in weights.items()}
    for _ in range(3):
        optimizer.set_lr(epoch=0)
        optimizer.step()
        for name in weights:
            velocity[name] = 0.9 * velocity[name] + grads[name] + 0.01 * weights[name]
            weights[name] = weights[name] - 0.1 * velocity[name]
        grads = {name: grad.numpy().astype(np.float64) for name, grad in network.gradients().items()}
    for name, value in network.parameters().items():
        assert np.allclose(value.numpy(), weights[name], rtol=1e-5, atol=1e-6), name


def test_sgd_hands_its_packed_step_to_a_kernel_that_applies_it_unless_loss_scaling_may_skip_it(backend):
    network = network_with_gradients(backend)
    optimizer = SGD(network, lr=0.1, momentum=0.9, weight_decay=0.01)
    values, velocity, lr, momentum, weight_decay = optimizer.packed_step()
    assert values is optimizer.groups[0][0] and velocity is optimizer.groups[0][2] and lr is optimizer.lr
    assert values.size == optimizer.flat_gradients().size and (momentum, weight_decay) == (0.9, 0.01)
    assert SGD(network, lr=0.1).packed_step()[1] is None  # no momentum: no velocities
    optimizer.count_step()
    assert optimizer.step_count == 1
    optimizer.loss_scale = Tensor.zeros((4,), backend)
    assert optimizer.packed_step() is None


def test_schedules():
    assert ScheduleConfig("constant").learning_rate(0.1, 500, 3) == 0.1
    assert ScheduleConfig("inverse", decay=0.01).learning_rate(0.1, 100, 0) == pytest.approx(0.05)
    assert ScheduleConfig("step", step_size=2, gamma=0.5).learning_rate(0.1, 0, 5) == pytest.approx(0.025)
    cosine = ScheduleConfig("cosine")
    assert [cosine.learning_rate(0.1, step, 0, total_steps=100) for step in (0, 50, 100)] == pytest.approx([0.1, 0.05, 0])


def test_cosine_anneals_over_the_runs_planned_steps(host):
    optimizer = SGD(network_with_gradients(host), lr=0.1, schedule=ScheduleConfig("cosine"))
    optimizer.total_steps = 10
    rates = []
    for _ in range(10):
        rates.append(optimizer.set_lr(epoch=0))
        optimizer.step()
    assert rates[0] == pytest.approx(0.1) and rates[5] == pytest.approx(0.05)
    assert all(later < earlier for earlier, later in zip(rates, rates[1:]))
    assert optimizer.lr.item() == pytest.approx(rates[-1])


def test_the_rate_is_written_to_the_device_only_when_it_changes(backend, monkeypatch):
    """A constant or per-epoch rate costs no copy per step; a new epoch's rate is written once."""
    optimizer = SGD(network_with_gradients(backend), lr=0.1, schedule=ScheduleConfig("step", step_size=1, gamma=0.5))
    writes = []
    fill = Tensor.fill_
    monkeypatch.setattr(Tensor, "fill_", lambda tensor, value: writes.append(value) or fill(tensor, value))
    for epoch in (0, 0, 0, 1, 1, 2):
        optimizer.set_lr(epoch)
        optimizer.step()
    assert writes == pytest.approx([0.05, 0.025])
    assert optimizer.lr.item() == pytest.approx(0.025)


def test_inverse_schedule_does_not_compound_like_the_original():
    """The original multiplied lr by 1/(1 + decay·step) at every step: after 1600 steps lr was ~0."""
    schedule = ScheduleConfig("inverse", decay=5e-5)
    compounded = 0.02
    for step in range(1600):
        compounded *= 1 / (1 + 5e-5 * step)
    assert compounded < 1e-20
    assert schedule.learning_rate(0.02, 1600, 0) == pytest.approx(0.02 / 1.08)


@pytest.mark.parametrize("arguments, message", [({"lr": 0}, "learning rate"), ({"lr": 0.1, "momentum": 1.0}, "momentum"),
                                                ({"lr": 0.1, "weight_decay": -1}, "weight decay"),
                                                ({"lr": float("inf")}, r"learning rate must be a finite number in \(0, 3\.40282e\+38\]"),
                                                ({"lr": 1e39}, "learning rate"), ({"lr": 0.1, "weight_decay": 1e39}, "weight decay"),
                                                ({"lr": "0.1"}, r"learning rate .*got '0\.1'"),
                                                ({"lr": None}, "learning rate"), ({"lr": True}, "learning rate"),
                                                ({"lr": 10**400}, "learning rate"),
                                                ({"lr": 0.1, "momentum": "0.9"}, "momentum"),
                                                ({"lr": 0.1, "weight_decay": float("inf")}, "weight decay")])
def test_invalid_hyper_parameters_are_refused(host, arguments, message):
    with pytest.raises(InvalidArgumentError, match=message):
        SGD(network_with_gradients(host), **arguments)


# ---- Adam and AdamW -------------------------------------------------------------------------------
def reference_adam(weights, grads, state, lr, betas, eps, weight_decay, decoupled):
    """One step of PyTorch's Adam / AdamW in float64, written out here as the oracle."""
    beta1, beta2 = betas
    state["t"] += 1
    t = state["t"]
    for name in weights:
        w, g = weights[name], grads[name]
        if decoupled:
            w = w - lr * weight_decay * w
        else:
            g = g + weight_decay * w
        state["m"][name] = beta1 * state["m"][name] + (1 - beta1) * g
        state["v"][name] = beta2 * state["v"][name] + (1 - beta2) * g * g
        m_hat = state["m"][name] / (1 - beta1 ** t)
        v_hat = state["v"][name] / (1 - beta2 ** t)
        weights[name] = w - lr * m_hat / (np.sqrt(v_hat) + eps)


def new_gradients(network, step):
    """Fresh gradients (a forward and backward on other inputs) so that every step differs."""
    rng = np.random.default_rng(100 + step)
    backend = network.backend
    network.forward(Tensor.from_numpy(rng.standard_normal((5, 3)), backend))
    network.backward(Tensor.from_numpy(np.eye(4, dtype=np.float32)[rng.integers(0, 4, 5)], backend))


@pytest.mark.parametrize("decoupled, weight_decay", [(False, 0.0), (False, 0.05), (True, 0.05)])
def test_adam_matches_a_numpy_reference(backend, decoupled, weight_decay):
    network = network_with_gradients(backend)
    betas, lr, eps = (0.8, 0.95), 0.01, 1e-6
    optimizer = Adam(network, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, decoupled=decoupled)
    weights = {name: value.numpy().astype(np.float64) for name, value in network.parameters().items()}
    state = {"t": 0, "m": {name: 0.0 for name in weights}, "v": {name: 0.0 for name in weights}}
    for step in range(6):
        grads = {name: grad.numpy().astype(np.float64) for name, grad in network.gradients().items()}
        optimizer.set_lr(epoch=0)
        optimizer.step()
        reference_adam(weights, grads, state, lr, betas, eps, weight_decay, decoupled)
        for name, value in network.parameters().items():
            assert np.allclose(value.numpy(), weights[name], rtol=1e-4, atol=1e-6), (step, name)
        new_gradients(network, step)
    assert optimizer.counter.numpy().reshape(-1).tolist() == [6.0, 0.0]


def test_adam_bias_correction_makes_the_first_step_lr_times_the_sign(backend):
    """At t = 1, m̂ = g and v̂ = g², so every weight moves by lr·g/(|g| + eps): ±lr where g ≠ 0."""
    network = network_with_gradients(backend)
    before = {name: value.numpy() for name, value in network.parameters().items()}
    grads = {name: grad.numpy() for name, grad in network.gradients().items()}
    Adam(network, lr=0.01, eps=1e-12).step()
    for name, value in network.parameters().items():
        moved = before[name] - value.numpy()
        assert np.allclose(moved, 0.01 * np.sign(grads[name]), atol=1e-6), name


@pytest.mark.gpu
@pytest.mark.parametrize("decoupled", [False, True])
def test_adam_on_cuda_matches_the_host(cuda, host, decoupled):
    """The same network, gradients and steps: the fused kernel gives the host's weights and counter."""
    networks = [network_with_gradients(backend) for backend in (host, cuda)]
    optimizers = [Adam(network, lr=0.02, weight_decay=0.1, decoupled=decoupled,
                       schedule=ScheduleConfig("constant", warmup_steps=3)) for network in networks]
    for step in range(5):
        for network, optimizer in zip(networks, optimizers):
            optimizer.set_lr(epoch=0)
            optimizer.step()
            new_gradients(network, step)
    from cudnnnet.backends.cuda import kernel

    kernel.reset_launches()
    optimizers[1].step()
    optimizers[0].step()
    assert kernel.launches["adam_update_many"] == 1  # one launch for every parameter
    host_weights, cuda_weights = (network.parameters() for network in networks)
    for name, value in host_weights.items():
        assert np.allclose(cuda_weights[name].numpy(), value.numpy(), rtol=1e-5, atol=1e-7), name
    assert optimizers[1].counter.numpy().reshape(-1).tolist() == [6.0, 0.0]


@pytest.mark.gpu
def test_adam_replayed_in_a_captured_graph_follows_the_bias_correction_and_schedule(cuda, host):
    """A graph of one Adam step replayed five times gives the weights of five eager steps: the step
    count (bias correction) and the warm-up rate are read from device memory at every replay. New
    gradients are written into the same buffers before each step, so that the bias correction matters."""
    networks = [network_with_gradients(backend) for backend in (host, cuda)]
    optimizers = [Adam(network, lr=0.05, schedule=ScheduleConfig("constant", warmup_steps=4)) for network in networks]
    optimizers[1].step()  # uploads the pointer table before the capture
    optimizers[0].step()
    with cuda.capture() as graph:
        optimizers[1].network.backend.adam_update_many(optimizers[1].groups, optimizers[1].lr, optimizers[1].counter,
                                                       0.9, 0.999, 1e-8, 0.0, False)
    rng = np.random.default_rng(9)
    for _ in range(5):
        grads = {p.name: rng.standard_normal(p.grad.shape) * rng.uniform(0.1, 10) for p in networks[0].parameter_list()}
        for index, optimizer in enumerate(optimizers):
            for parameter in networks[index].parameter_list():
                parameter.grad.write_(grads[parameter.name])
            optimizer.set_lr(epoch=0)
            if index == 0:
                optimizer.step()
            else:
                graph.launch()
                optimizer.step_count += 1
    for name, value in networks[0].parameters().items():
        assert np.allclose(networks[1].parameters()[name].numpy(), value.numpy(), rtol=1e-5, atol=1e-7), name
    assert optimizers[1].counter.numpy().reshape(-1).tolist() == [6.0, 0.0]


def test_adam_state_round_trips_through_a_checkpoint(backend, tmp_path):
    """Saving after 3 steps and resuming into a fresh network and optimiser, then 3 more steps,
    gives the weights of 6 uninterrupted steps."""
    def run(steps, network, optimizer, first=0):
        for step in range(first, first + steps):
            optimizer.set_lr(epoch=0)
            optimizer.step()
            new_gradients(network, step)

    straight = network_with_gradients(backend)
    run(6, straight, Adam(straight, lr=0.01, weight_decay=0.01, decoupled=True))

    first = network_with_gradients(backend)
    optimizer = Adam(first, lr=0.01, weight_decay=0.01, decoupled=True)
    run(3, first, optimizer)
    first.save(tmp_path / "model.npz", extra_arrays=optimizer.state_arrays(OPTIMIZER_PREFIX))

    arrays, _ = checkpoint.load_npz(tmp_path / "model.npz")
    resumed = network_with_gradients(backend)
    resumed.load_weights(tmp_path / "model.npz")
    resumed_optimizer = Adam(resumed, lr=0.01, weight_decay=0.01, decoupled=True)
    resumed_optimizer.load_state_arrays(arrays, OPTIMIZER_PREFIX)
    assert resumed_optimizer.step_count == 3
    new_gradients(resumed, 2)  # the gradients the first run had when it was saved
    run(3, resumed, resumed_optimizer, first=3)
    for name, value in straight.parameters().items():
        assert np.allclose(resumed.parameters()[name].numpy(), value.numpy(), rtol=1e-6, atol=1e-8), name


def test_adam_refuses_an_sgd_checkpoints_state(host):
    sgd_state = SGD(network_with_gradients(host), lr=0.1, momentum=0.9).state_arrays(OPTIMIZER_PREFIX)
    with pytest.raises(CheckpointError, match="Adam moment"):
        Adam(network_with_gradients(host), lr=0.1).load_state_arrays(sgd_state, OPTIMIZER_PREFIX)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sgd_refuses_an_adam_checkpoints_state(host, momentum):
    """Without momentum the Adam moments were dropped silently and the run went on as SGD from step N."""
    adam_state = Adam(network_with_gradients(host), lr=0.1).state_arrays(OPTIMIZER_PREFIX)
    with pytest.raises(CheckpointError, match=r"optimiser state is Adam's moments \(it was trained with adam or adamw\)"):
        SGD(network_with_gradients(host), lr=0.1, momentum=momentum).load_state_arrays(adam_state, OPTIMIZER_PREFIX)


def test_sgd_with_momentum_names_a_checkpoint_without_velocities(host):
    state = SGD(network_with_gradients(host), lr=0.1).state_arrays(OPTIMIZER_PREFIX)
    with pytest.raises(CheckpointError, match=r"no velocity of shape \(4, 3, 1, 1\) for fc\.weight \(was it trained "
                                              r"without momentum\?\)"):
        SGD(network_with_gradients(host), lr=0.1, momentum=0.9).load_state_arrays(state, OPTIMIZER_PREFIX)


@pytest.mark.parametrize("moment, value, message", [
    ("v", -1e-6, r"Adam's moment v of fc\.weight holds 1 negative values, and a mean of squares is >= 0"),
    ("m", np.nan, r"Adam's moment m of fc\.weight holds NaN or infinite values"),
    ("v", np.inf, r"Adam's moment v of fc\.weight holds NaN or infinite values")])
def test_adam_refuses_moments_it_cannot_step_from_and_keeps_its_own(host, moment, value, message):
    """A negative v was loaded, and the resumed run stopped with 'the loss became nan ... try a lower learning rate'."""
    network = network_with_gradients(host)
    saved = Adam(network, lr=0.1)
    saved.step()
    state = saved.state_arrays(OPTIMIZER_PREFIX)
    state[f"{OPTIMIZER_PREFIX}{moment}.fc.weight"].reshape(-1)[5] = value
    resumed = Adam(network_with_gradients(host), lr=0.1)
    with pytest.raises(CheckpointError, match=message):
        resumed.load_state_arrays(state, OPTIMIZER_PREFIX)
    assert all(not m.numpy().any() and not v.numpy().any() for m, v in resumed.moments.values())
    assert resumed.step_count == 0


@pytest.mark.parametrize("arguments, message", [({"lr": -1}, "learning rate"), ({"lr": 0.1, "betas": (0.9, 1.0)}, "betas"),
                                                ({"lr": 0.1, "eps": 0}, "eps"),
                                                ({"lr": 0.1, "weight_decay": -0.1}, "weight decay"),
                                                ({"lr": float("inf")}, "learning rate"),
                                                ({"lr": 0.1, "eps": float("inf")}, r"eps must be a finite number in \[1\.17549e-38, "
                                                                                   r"3\.40282e\+38\] \(float32's normal numbers\)"),
                                                ({"lr": 0.1, "eps": 1e-50}, r"eps must be a finite number in \[1\.17549e-38"),
                                                ({"lr": 0.1, "eps": 1e39}, "eps"),
                                                ({"lr": 0.1, "eps": "1e-8"}, "eps"),
                                                ({"lr": 0.1, "betas": 0.9}, r"betas must be two numbers"),
                                                ({"lr": 0.1, "betas": "ab"}, r"betas must be two numbers"),
                                                ({"lr": 0.1, "betas": (0.9, "a")}, r"betas\[1\] must be a finite number"),
                                                ({"lr": 0.1, "betas": (True, 0.9)}, r"betas\[0\]"),
                                                ({"lr": 0.1, "weight_decay": float("nan")}, "weight decay")])
def test_invalid_adam_hyper_parameters_are_refused(host, arguments, message):
    with pytest.raises(InvalidArgumentError, match=message):
        Adam(network_with_gradients(host), **arguments)


def test_make_optimizer_builds_what_the_config_names(host):
    network = network_with_gradients(host)
    assert isinstance(make_optimizer(network, OptimizerConfig(0.1, "sgd", momentum=0.9)), SGD)
    adamw = make_optimizer(network, OptimizerConfig(0.1, "adamw", weight_decay=0.02, betas=(0.5, 0.6), eps=1e-5))
    assert isinstance(adamw, Adam) and adamw.decoupled and (adamw.beta1, adamw.beta2, adamw.eps) == (0.5, 0.6, 1e-5)
    assert not make_optimizer(network, OptimizerConfig(0.1, "adam")).decoupled


# ---- warm-up ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", [ScheduleConfig("constant", warmup_steps=4),
                                      ScheduleConfig("inverse", decay=0.01, warmup_steps=4),
                                      ScheduleConfig("step", step_size=1, gamma=0.5, warmup_steps=4),
                                      ScheduleConfig("cosine", warmup_steps=4)])
def test_warmup_ramps_every_schedule_linearly(schedule):
    plain = ScheduleConfig(schedule.name, schedule.decay, schedule.step_size, schedule.gamma)
    for step in range(8):
        expected = plain.learning_rate(0.1, step, 0, 100) * min(1.0, (step + 1) / 4)
        assert schedule.learning_rate(0.1, step, 0, 100) == pytest.approx(expected)
    assert schedule.learning_rate(0.1, 0, 0, 100) == pytest.approx(plain.learning_rate(0.1, 0, 0, 100) / 4)


def test_warmup_rate_reaches_the_device_at_every_step(backend):
    optimizer = Adam(network_with_gradients(backend), lr=0.08, schedule=ScheduleConfig("constant", warmup_steps=4))
    seen = []
    for _ in range(6):
        optimizer.set_lr(epoch=0)
        seen.append(optimizer.lr.item())
        optimizer.step()
    assert seen == pytest.approx([0.02, 0.04, 0.06, 0.08, 0.08, 0.08])
