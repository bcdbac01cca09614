"""SGD (optional momentum and weight decay), Adam and AdamW, following a learning-rate schedule.

The learning rate lives in a one-element tensor on the network's backend, so that a captured CUDA
graph of the training step reads the current rate at every replay. Schedules are
``config.ScheduleConfig``: constant; inverse lr0/(1 + decay·step) (the original's intent, without
its compounding); step lr0·gamma^(epoch // step_size).

``step()`` updates every parameter with one ``sgd_update_many`` call. When the optimiser is made or
moved (``to``), the network's parameters, their gradients and the velocities are packed (``pack``):
each tensor keeps its values and its identity, its storage becomes a view into one buffer of its
kind, so the update covers all of them at once: on CUDA the slides' cublasSaxpy (with cublasSscal
and cublasSaxpy for momentum and weight decay, the rate read from device memory) once over the
buffer, or one launch in the fast engine. ``Backend.sgd_update`` stays the per-parameter call.
``Adam`` (and AdamW, its decoupled weight decay) updates every parameter with one
``adam_update_many`` call; its step count lives on the device beside the rate and is advanced by
that call, so a captured graph applies the bias correction of the step it replays.
``make_optimizer`` builds the one a config names.

Under dynamic loss scaling (``math: fp16``, loss_scaling.py) ``loss_scale`` is the scaler's device
state: each step's call then takes grad/S and is skipped on the device where the gradients
overflowed. ``flat_gradients()`` is every gradient as one packed buffer (the overflow check's and
the all-reduce's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import CheckpointError, InvalidArgumentError, ShapeError
from ..limits import MAX_INTEGER
from ..tensor import FLOAT32_MAX, FLOAT32_TINY, Tensor, finite_real, float32_values
from .schedules import ScheduleConfig

ADAM_STEPS = "adam_steps"  # checkpoint array, after the prefix: the steps Adam took (its bias correction's t)
PACK_ALIGNMENT = 64  # floats (256 bytes): each packed tensor starts as aligned as an allocation of its own

OPTIMIZERS = ("sgd", "adam", "adamw")  # train.optimizer.name


@dataclass(frozen=True)
class OptimizerConfig:
    """sgd: lr, momentum, weight_decay (L2, added to the gradient); adam: lr, betas, eps,
    weight_decay (L2, as sgd); adamw: the same with the weight decay decoupled from the gradient."""

    lr: float
    name: str = "sgd"
    momentum: float = 0.0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)  # Adam's β1, β2
    eps: float = 1e-8

    def to_dict(self) -> dict:
        if self.name == "sgd":
            return {"name": self.name, "lr": self.lr, "momentum": self.momentum, "weight_decay": self.weight_decay}
        return {"name": self.name, "lr": self.lr, "betas": list(self.betas), "eps": self.eps,
                "weight_decay": self.weight_decay}


def packed_offsets(sizes) -> tuple[list[int], int]:
    """(each tensor's offset, the total) of tensors of ``sizes`` packed in turn by ``pack``."""
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += -(-size // PACK_ALIGNMENT) * PACK_ALIGNMENT
    return offsets, total


def pack(tensors, backend) -> Tensor:
    """One zero-filled buffer holding ``tensors`` in turn, each at a PACK_ALIGNMENT boundary: every
    tensor's values are copied in and its storage becomes its view of the buffer (the same Tensor
    objects, so whoever holds them sees it). The padding stays zero under SGD: the gradients, values
    and velocities of a padding cell are all 0."""
    offsets, total = packed_offsets(tensor.size for tensor in tensors)
    packed = Tensor.zeros((total,), backend)
    for tensor, offset in zip(tensors, offsets):
        view = packed.view(tensor.shape, offset)
        view.copy_(tensor)
        tensor.data = view.data
    return packed


class SGD:
    """v = momentum·v + (dW + weight_decay·W);  W = W - lr·v   (PyTorch's formulation)."""

    def __init__(self, network, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 schedule: ScheduleConfig | None = None):
        lr, weight_decay = _learning_rate_and_decay(lr, weight_decay)
        momentum = finite_real(momentum, "momentum", "in [0, 1)", lambda value: 0 <= value < 1, float32=True)
        self.network = network
        self.lr0, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.schedule = schedule or ScheduleConfig()
        self.step_count = 0
        self.total_steps = None  # the run's planned length, for schedules that anneal over it
        if network.input_shape is None:
            raise InvalidArgumentError("build the network (its parameters) before making its optimiser")
        self.lr = Tensor((1,), network.backend).fill_(self.lr0)  # the current rate, on the device
        self._lr_written = self.lr0  # the value last written into self.lr
        self.velocity = self._zero_velocity()
        self.groups = self._parameter_groups()

    def _zero_velocity(self) -> dict[str, Tensor]:
        if self.momentum == 0:
            return {}
        return {p.name: Tensor.zeros(p.value.shape, self.network.backend) for p in self.network.parameter_list()}

    def _parameter_groups(self) -> tuple[tuple[Tensor, Tensor, Tensor | None], ...]:
        """((values, grads, velocities or None),): every parameter, gradient and velocity packed into
        one buffer each (``pack``), as sgd_update_many takes them; () without parameters."""
        parameters = self.network.parameter_list()
        if not parameters:
            return ()
        backend = self.network.backend
        values = pack([p.value for p in parameters], backend)
        grads = pack([p.grad for p in parameters], backend)
        velocity = pack([self.velocity[p.name] for p in parameters], backend) if self.velocity else None
        return ((values, grads, velocity),)

    lr_factor = None  # step -> factor on the scheduled rate (the rule for the global batch of several GPUs)
    loss_scale = None  # the loss scaler's device state (loss_scaling.py) under math fp16, else None

    def flat_gradients(self) -> Tensor | None:
        """Every gradient in one buffer (packed when the optimiser was made); None without parameters."""
        return self.groups[0][1] if self.groups else None

    def current_lr(self, epoch: int) -> float:
        return self.rate_at(self.step_count, epoch)

    def rate_at(self, step: int, epoch: int) -> float:
        """The learning rate of global ``step`` (from 0) during ``epoch``: the schedule's, times the rule of
        several GPUs."""
        rate = self.schedule.learning_rate(self.lr0, step, epoch, self.total_steps)
        return rate if self.lr_factor is None else rate * self.lr_factor(step)

    def set_lr(self, epoch: int) -> float:
        """Write the scheduled rate for the next step into the device scalar (only when it changed:
        a constant or per-epoch rate costs no copy per step); returns it."""
        value = self.current_lr(epoch)
        if value != self._lr_written:
            self.lr.fill_(value)
            self._lr_written = value
        return value

    def step(self) -> None:
        """Apply one update to every parameter with the rate in ``self.lr`` (one backend call, in the
        network's engine)."""
        with self.network.settings():
            # v = momentum·v + (dW + wd·W);  W = W - lr·v   for every parameter at once (dW/S, or no step, under loss scaling)
            self.network.backend.sgd_update_many(self.groups, self.lr, self.momentum, self.weight_decay,
                                                 **_scaling(self.loss_scale))
        self.step_count += 1

    def packed_step(self) -> tuple | None:
        """(values, velocities or None, lr, momentum, weight_decay): this step for a kernel that applies it
        where it computes the gradients (the peers' average on several GPUs), every parameter packed as
        ``flat_gradients()``; None under loss scaling (whose step may be skipped) or without parameters."""
        if self.loss_scale is not None or not self.groups:
            return None
        values, _, velocity = self.groups[0]
        return values, velocity, self.lr, self.momentum, self.weight_decay

    def count_step(self) -> None:
        """Count a step that another kernel applied (``packed_step``), as ``step`` counts its own."""
        self.step_count += 1

    def to(self, backend) -> None:
        """Move the rate and velocities to ``backend``, after the network (``Network.to``)."""
        self.lr = self.lr.to(backend)
        self.velocity = {name: value.to(backend) for name, value in self.velocity.items()}
        self.groups = self._parameter_groups()

    # ---- state for checkpoints -----------------------------------------------------------------
    def state_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        arrays = {f"{prefix}velocity.{name}": value.numpy() for name, value in self.velocity.items()}
        arrays[f"{prefix}step"] = np.array([self.step_count], dtype=np.float32)
        return arrays

    def load_state_arrays(self, arrays: dict, prefix: str) -> None:
        """Restore velocities and the step count (a checkpoint of the same network and momentum); the
        state of an Adam is refused, as Adam refuses SGD's."""
        step = _step_count(arrays, prefix)
        if any(f"{prefix}m.{p.name}" in arrays for p in self.network.parameter_list()):
            raise CheckpointError("the checkpoint's optimiser state is Adam's moments (it was trained with adam or "
                                  "adamw), which SGD cannot continue; resume with the optimiser it was trained with")
        for name, value in self.velocity.items():
            saved = arrays.get(f"{prefix}velocity.{name}")
            if saved is None or saved.size != value.size:
                raise CheckpointError(f"the checkpoint's optimiser state has no velocity of shape {value.shape} for "
                                      f"{name} (was it trained without momentum?)")
        for name, value in self.velocity.items():
            value.copy_(Tensor.from_numpy(arrays[f"{prefix}velocity.{name}"].reshape(value.shape)))
        self.step_count = step


class Adam:
    """Adam (``decoupled`` False: weight decay added to the gradient, PyTorch's Adam) or AdamW
    (``decoupled`` True: W = W - lr·wd·W before the step, PyTorch's AdamW), bias-corrected:

        m = β1·m + (1 - β1)·g;  v = β2·v + (1 - β2)·g²;  W = W - lr·m̂/(√v̂ + eps),
        m̂ = m/(1 - β1ᵗ), v̂ = v/(1 - β2ᵗ)
    """

    def __init__(self, network, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 decoupled: bool = False, schedule: ScheduleConfig | None = None):
        lr, weight_decay = _learning_rate_and_decay(lr, weight_decay)
        if isinstance(betas, (str, bytes)) or not hasattr(betas, "__len__") or len(betas) != 2:
            raise InvalidArgumentError(f"betas must be two numbers in [0, 1), got {betas!r}")
        betas = tuple(finite_real(beta, f"betas[{index}]", "in [0, 1)", lambda value: 0 <= value < 1, float32=True)
                      for index, beta in enumerate(betas))
        eps = finite_real(eps, "eps", f"in [{FLOAT32_TINY:g}, {FLOAT32_MAX:g}] (float32's normal numbers)",
                    lambda value: FLOAT32_TINY <= value <= FLOAT32_MAX)
        if network.input_shape is None:
            raise InvalidArgumentError("build the network (its parameters) before making its optimiser")
        if not network.parameter_list():
            raise InvalidArgumentError("the network has no parameters for Adam to update")
        self.network = network
        self.lr0, self.eps, self.weight_decay = lr, eps, weight_decay
        self.beta1, self.beta2 = betas
        self.decoupled = bool(decoupled)
        self.schedule = schedule or ScheduleConfig()
        self.step_count = 0  # steps taken, as the host counts them (the schedule's position)
        self.total_steps = None
        backend = network.backend
        self.lr = Tensor((1,), backend).fill_(self.lr0)  # the current rate, on the device
        self._lr_written = self.lr0
        self.counter = Tensor.zeros((2,), backend)  # [steps taken, 0]: advanced on the device by each step
        self.moments = {p.name: (Tensor.zeros(p.value.shape, backend), Tensor.zeros(p.value.shape, backend))
                        for p in network.parameter_list()}  # name -> (m, v)
        self.groups = self._parameter_groups()
        self._flat_gradients: Tensor | None = None  # packed on the first flat_gradients()

    def _parameter_groups(self) -> tuple[tuple[Tensor, Tensor, Tensor, Tensor], ...]:
        """(value, grad, m, v) of every parameter, as adam_update_many takes them."""
        return tuple((p.value, p.grad, *self.moments[p.name]) for p in self.network.parameter_list())

    lr_factor = None
    loss_scale = None
    current_lr = SGD.current_lr  # the schedule and the device rate behave as SGD's
    rate_at = SGD.rate_at
    set_lr = SGD.set_lr

    def flat_gradients(self) -> Tensor:
        """Every gradient in one buffer: packed (``pack``) on the first call, before any step; each
        gradient tensor keeps its identity, so the groups see it."""
        if self._flat_gradients is None:
            self._flat_gradients = pack([p.grad for p in self.network.parameter_list()], self.network.backend)
        return self._flat_gradients

    def step(self) -> None:
        """One bias-corrected step on every parameter (one fused call, in the network's engine); the device
        counter advances."""
        with self.network.settings():
            # m = β1·m + (1-β1)·g;  v = β2·v + (1-β2)·g²;  W = W - lr·m̂/(√v̂ + eps)   for every parameter at once
            self.network.backend.adam_update_many(self.groups, self.lr, self.counter, self.beta1, self.beta2,
                                                  self.eps, self.weight_decay, self.decoupled,
                                                  **_scaling(self.loss_scale))
        self.step_count += 1

    def to(self, backend) -> None:
        """Move the rate, the step counter and the moments to ``backend``, after the network."""
        self.lr = self.lr.to(backend)
        self.counter = self.counter.to(backend)
        self.moments = {name: (m.to(backend), v.to(backend)) for name, (m, v) in self.moments.items()}
        self.groups = self._parameter_groups()
        self._flat_gradients = None

    # ---- state for checkpoints -----------------------------------------------------------------
    def state_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        arrays = {}
        for name, (m, v) in self.moments.items():
            arrays[f"{prefix}m.{name}"] = m.numpy()
            arrays[f"{prefix}v.{name}"] = v.numpy()
        arrays[f"{prefix}step"] = np.array([self.step_count], dtype=np.float32)
        arrays[f"{prefix}{ADAM_STEPS}"] = self.counter.numpy().reshape(-1)[:1].copy()
        return arrays

    def load_state_arrays(self, arrays: dict, prefix: str) -> None:
        """Restore both moments of every parameter and the step count (the device's too), all or nothing."""
        step = _step_count(arrays, prefix)
        taken = arrays.get(f"{prefix}{ADAM_STEPS}")  # fewer than step_count where loss scaling skipped steps
        taken = step if taken is None or taken.size != 1 else _saved_count(taken, "Adam's step count")
        values = {}  # (name, moment) -> its saved values, every one checked before any is copied
        for name, (m, _) in self.moments.items():
            for moment in ("m", "v"):
                saved = arrays.get(f"{prefix}{moment}.{name}")
                if saved is None or saved.size != m.size:
                    raise CheckpointError(f"the checkpoint's optimiser state has no Adam moment {moment} of shape "
                                          f"{m.shape} for {name} (was it saved with another optimiser?)")
                values[name, moment] = _moment_values(saved, f"Adam's moment {moment} of {name}", moment == "v")
        for name, (m, v) in self.moments.items():
            m.copy_(Tensor.from_numpy(values[name, "m"].reshape(m.shape)))
            v.copy_(Tensor.from_numpy(values[name, "v"].reshape(v.shape)))
        self.step_count = step
        self.counter.write_(np.array([taken, 0], dtype=np.float32))


def _learning_rate_and_decay(lr, weight_decay) -> tuple[float, float]:
    """Every optimiser's rate (> 0) and weight decay (>= 0), checked by ``_real``."""
    return (finite_real(lr, "learning rate", f"in (0, {FLOAT32_MAX:g}] (float32's range)",
                  lambda value: 0 < value <= FLOAT32_MAX, float32=True),
            finite_real(weight_decay, "weight decay", f"in [0, {FLOAT32_MAX:g}] (float32's range)",
                  lambda value: 0 <= value <= FLOAT32_MAX))


def _moment_values(saved, what: str, squares: bool) -> np.ndarray:
    """A saved moment as float32, finite, and >= 0 where it is a mean of squares (Adam's v: the
    update's √v̂ would be NaN), else CheckpointError naming ``what``."""
    try:
        values = float32_values(saved, what)
    except ShapeError as error:
        raise CheckpointError(str(error)) from None
    if not np.isfinite(values).all():
        raise CheckpointError(f"{what} holds NaN or infinite values (it cannot be resumed from)")
    if squares and (values < 0).any():
        raise CheckpointError(f"{what} holds {int((values < 0).sum())} negative values, and a mean of squares is >= 0 "
                              "(it cannot be resumed from)")
    return values


def _step_count(arrays: dict, prefix: str) -> int:
    """The steps a checkpoint's optimiser took (refused where there is no optimiser state)."""
    step = arrays.get(f"{prefix}step")
    if step is None or step.size != 1:
        raise CheckpointError("the checkpoint holds no optimiser state (it cannot be resumed from)")
    return _saved_count(step, "the optimiser's step count")


def _saved_count(array: np.ndarray, what: str) -> int:
    """A count saved as one float32: a whole number, within what the schedules and counters take."""
    value = float(array.reshape(-1)[0])
    if not (0 <= value <= MAX_INTEGER and value.is_integer()):
        raise CheckpointError(f"{what} is {value:g}; expected a whole number in [0, {MAX_INTEGER}] "
                              "(it cannot be resumed from)")
    return int(value)


def _scaling(loss_scale) -> dict:
    """The update call's ``loss_scale`` argument where there is a loss scale (none: the call as without it)."""
    return {} if loss_scale is None else {"loss_scale": loss_scale}


def make_optimizer(network, config: OptimizerConfig, schedule: ScheduleConfig | None = None):
    """The optimiser ``config`` names (sgd, adam or adamw) for ``network``."""
    if config.name == "sgd":
        return SGD(network, config.lr, config.momentum, config.weight_decay, schedule)
    if config.name in ("adam", "adamw"):
        return Adam(network, config.lr, config.betas, config.eps, config.weight_decay,
                    decoupled=config.name == "adamw", schedule=schedule)
    raise InvalidArgumentError(f"unknown optimizer {config.name!r}; valid are sgd, adam, adamw")
