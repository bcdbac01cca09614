"""Layer: what every layer shares. Shapes are inferred from the input on first forward.

A layer owns its output and grad_input buffers, of its input's dtype, and allocates them once per
(batch shape, dtype), so a training step allocates nothing after its first run (which CUDA graphs
need). Which dtype a network's activations take is decided once, by ``activation_dtype``.
"""

from __future__ import annotations

import inspect
import math
from typing import NamedTuple

import numpy as np

from ..errors import InvalidArgumentError, ShapeError
from ..precision import FLOAT32, DType, Precision
from ..tensor import Tensor

SampleShape = tuple[int, int, int]  # (c, h, w) of one sample


class Parameter(NamedTuple):
    """A trainable tensor, its gradient, and its qualified name (``layer.weight``)."""

    name: str
    value: Tensor
    grad: Tensor


def positive_int(layer: str, key: str, value, minimum: int = 1) -> int:
    """``value`` as an int ≥ minimum, else an error naming the layer and the key."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InvalidArgumentError(f"layer {layer!r}: {key} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def he_uniform(rng: np.random.Generator, shape, fan_in: int) -> np.ndarray:
    """U(-√(6/fan_in), √(6/fan_in)): He initialisation, as the original's Dense/Conv2D init."""
    bound = math.sqrt(6.0 / fan_in)
    return rng.uniform(-bound, bound, size=shape).astype(np.float32)


def activation_dtype(layers, precision: Precision) -> DType:
    """The dtype of a network's activations and their gradients: ``precision.activation_dtype`` (16 bits
    under bf16 and fp16) where every layer stores 16 bits, else float32 (any other layer computes in
    float32 and reads 16-bit copies only where it multiplies)."""
    if all(layer.stores_16_bits for layer in layers):
        return precision.activation_dtype
    return FLOAT32


class Layer:
    """Base class. Subclasses implement ``output_sample_shape``, ``forward`` and ``backward``."""

    is_loss = False
    stores_16_bits = False  # whether its forward and backward take 16-bit inputs and gradients (activation_dtype)
    training = True  # False in evaluation (Network.eval): Dropout is the identity, BatchNorm uses its running statistics

    def __init__(self, name: str):
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"a layer name must be a non-empty string, got {name!r}")
        self.name = name
        self.backend = None
        self.input_sample_shape: SampleShape | None = None
        self.gradient_stop = False  # the first layer needs no grad_input
        self.input: Tensor | None = None  # (N, C, H, W)
        self.output: Tensor | None = None  # (N, C', H', W')
        self.grad_input: Tensor | None = None  # (N, C, H, W)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    @classmethod
    def config_keys(cls) -> tuple[str, ...]:
        """The keys a config entry of this layer type takes besides ``type`` and ``name``: the
        constructor's parameters after ``name``, in their order."""
        parameters = list(inspect.signature(cls.__init__).parameters)
        return tuple(parameters[parameters.index("name") + 1:])

    # ---- shapes and parameters ------------------------------------------------------------
    def config(self) -> dict:
        """The constructor arguments besides the name (what a checkpoint stores to rebuild the layer)."""
        return {}

    def output_sample_shape(self, input_shape: SampleShape) -> SampleShape:
        """The (c, h, w) this layer produces from ``input_shape``; raise ShapeError if it cannot."""
        return input_shape

    def build(self, input_shape: SampleShape, backend, rng: np.random.Generator) -> SampleShape:
        """Fix the input shape, create parameters on ``backend``; returns the output shape."""
        output_shape = self.output_sample_shape(tuple(input_shape))
        self.input_sample_shape = tuple(input_shape)
        self.backend = backend
        self.init_parameters(rng)
        return output_shape

    def init_parameters(self, rng: np.random.Generator) -> None:
        """Create this layer's parameters (none by default)."""

    def parameter_shapes(self, input_shape: SampleShape) -> dict[str, tuple[int, int, int, int]]:
        """{"weight": shape, ...}: the parameters ``build`` would create for ``input_shape``, none made."""
        return {}

    def parameters(self) -> list[Parameter]:
        return []

    def buffers(self) -> dict[str, Tensor]:
        """Non-trainable state saved with the weights (BatchNorm's running statistics), by qualified name."""
        return {}

    def check_state(self, values: dict) -> None:
        """Refuse (CheckpointError) values about to be loaded into this layer's parameters and buffers
        (``values``: qualified name -> finite float32 array) that it cannot compute with; any by default."""

    def to(self, backend) -> None:
        """Move parameters to ``backend``; activations are re-allocated on the next forward."""
        self.backend = backend
        for attribute in self._parameter_attributes():
            setattr(self, attribute, getattr(self, attribute).to(backend))
        self.input = self.output = self.grad_input = None
        self._batch_key = self._buffers = None

    def _parameter_attributes(self) -> tuple[str, ...]:
        return ()

    # ---- buffers ---------------------------------------------------------------------------
    _batch_key = None  # (shape, dtype) of the input whose buffers are in use
    _buffers = None  # (batch shape, dtype) -> {attribute: buffer}; kept so pointers stay fixed per key

    def check_input(self, input: Tensor) -> None:
        """Raise a ShapeError naming this layer and both shapes if ``input`` does not fit."""
        if input.shape[1:] != self.input_sample_shape:
            raise ShapeError(
                f"layer {self.name!r} expects input of shape (N, {', '.join(map(str, self.input_sample_shape))}), "
                f"got {input.shape}"
            )

    def prepare(self, input: Tensor) -> None:
        """Check ``input`` and switch to the buffers of its batch shape and dtype, allocating them the
        first time.

        Buffers of every (batch shape, dtype) seen are kept, so alternating between the training batch,
        the epoch's last short batch and the evaluation batch, or between a 16-bit and a float32 pass,
        allocates nothing after the first (and a captured CUDA graph's pointers stay valid).
        """
        self.check_input(input)
        self.input = input
        key = (input.shape, input.dtype)
        if key == self._batch_key:
            return
        if self._buffers is None:
            self._buffers = {}
        if key not in self._buffers:
            self._buffers[key] = self._allocate_buffers(input)
        self._batch_key = key
        for attribute, buffer in self._buffers[key].items():
            setattr(self, attribute, buffer)

    @property
    def _batch_buffers(self) -> dict:
        """The buffers of the input in use (``prepare``)."""
        return self._buffers[self._batch_key]

    def _allocate_buffers(self, input: Tensor) -> dict:
        """output and grad_input of the input's dtype (both activations), then ``allocate``'s."""
        out_shape = (input.n,) + self.output_sample_shape(self.input_sample_shape)
        buffers = {"output": Tensor(out_shape, self.backend, dtype=input.dtype),
                   "grad_input": Tensor(input.shape, self.backend, dtype=input.dtype)}
        buffers.update(self.allocate(input.shape, out_shape))
        return buffers

    def allocate(self, input_shape, output_shape) -> dict:
        """Further per-batch-shape buffers, as {attribute: value} (none by default)."""
        return {}

    # ---- computation -----------------------------------------------------------------------
    def forward(self, input: Tensor) -> Tensor:
        raise NotImplementedError

    def backward(self, grad_output: Tensor) -> Tensor:
        raise NotImplementedError


class WeightBiasLayer(Layer):
    """A layer with a ``weight`` and a ``bias`` and their gradients (Dense, Conv2D); a layer made
    without a bias (``has_bias`` False) has neither the bias nor its gradient."""

    has_bias = True

    def __init__(self, name: str):
        super().__init__(name)
        self.weight = self.bias = self.grad_weight = self.grad_bias = None
        self.activation = None  # the ActivationDescriptor of a following Activation (applied here in the fast engine)

    def zero_gradients(self) -> None:
        """grad_weight, grad_bias: zeros shaped like the weight and the bias (create them after those)."""
        self.grad_weight = Tensor.zeros(self.weight.shape, self.backend)
        if self.has_bias:
            self.grad_bias = Tensor.zeros(self.bias.shape, self.backend)

    def _parameter_attributes(self):
        return ("weight", "bias", "grad_weight", "grad_bias") if self.has_bias else ("weight", "grad_weight")

    def parameters(self):
        found = [Parameter(f"{self.name}.weight", self.weight, self.grad_weight)]
        if self.has_bias:
            found.append(Parameter(f"{self.name}.bias", self.bias, self.grad_bias))
        return found
