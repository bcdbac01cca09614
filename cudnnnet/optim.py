"""SGD with optional momentum and weight decay, following a learning-rate schedule.

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
"""

from __future__ import annotations

import numpy as np

from .config import ScheduleConfig
from .errors import CheckpointError, InvalidArgumentError
from .tensor import Tensor

PACK_ALIGNMENT = 64  # floats (256 bytes): each packed tensor starts as aligned as an allocation of its own


def pack(tensors, backend) -> Tensor:
    """One zero-filled buffer holding ``tensors`` in turn, each at a PACK_ALIGNMENT boundary: every
    tensor's values are copied in and its storage becomes its view of the buffer (the same Tensor
    objects, so whoever holds them sees it). The padding stays zero under SGD: the gradients, values
    and velocities of a padding cell are all 0."""
    offsets, total = [], 0
    for tensor in tensors:
        offsets.append(total)
        total += -(-tensor.size // PACK_ALIGNMENT) * PACK_ALIGNMENT
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
        if not lr > 0:
            raise InvalidArgumentError(f"learning rate must be > 0, got {lr!r}")
        if not 0 <= momentum < 1:
            raise InvalidArgumentError(f"momentum must be in [0, 1), got {momentum!r}")
        if not weight_decay >= 0:
            raise InvalidArgumentError(f"weight decay must be >= 0, got {weight_decay!r}")
        self.network = network
        self.lr0, self.momentum, self.weight_decay = float(lr), float(momentum), float(weight_decay)
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

    def current_lr(self, epoch: int) -> float:
        return self.schedule.learning_rate(self.lr0, self.step_count, epoch, self.total_steps)

    def set_lr(self, epoch: int) -> float:
        """Write the scheduled rate for the next step into the device scalar (only when it changed:
        a constant or per-epoch rate costs no copy per step); returns it."""
        value = self.current_lr(epoch)
        if value != self._lr_written:
            self.lr.fill_(value)
            self._lr_written = value
        return value

    def step(self) -> None:
        """Apply one update to every parameter with the rate in ``self.lr`` (one backend call)."""
        # v = momentum·v + (dW + wd·W);  W = W - lr·v   for every parameter at once
        self.network.backend.sgd_update_many(self.groups, self.lr, self.momentum, self.weight_decay)
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
        """Restore velocities and the step count (a checkpoint of the same network and momentum)."""
        step = arrays.get(f"{prefix}step")
        if step is None or step.size != 1:
            raise CheckpointError("the checkpoint holds no optimiser state (it cannot be resumed from)")
        for name, value in self.velocity.items():
            saved = arrays.get(f"{prefix}velocity.{name}")
            if saved is None or saved.size != value.size:
                raise CheckpointError(f"the checkpoint's optimiser state has no velocity of shape {value.shape} for {name}")
        for name, value in self.velocity.items():
            value.copy_(Tensor.from_numpy(arrays[f"{prefix}velocity.{name}"].reshape(value.shape)))
        self.step_count = int(step.reshape(-1)[0])
