import numpy as np
import pytest

from cudnnnet import Network, Tensor
from cudnnnet.config import ScheduleConfig
from cudnnnet.errors import InvalidArgumentError
from cudnnnet.layers import Dense, Softmax
from cudnnnet.optim import SGD


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
                                                ({"lr": 0.1, "weight_decay": -1}, "weight decay")])
def test_invalid_hyper_parameters_are_refused(host, arguments, message):
    with pytest.raises(InvalidArgumentError, match=message):
        SGD(network_with_gradients(host), **arguments)
