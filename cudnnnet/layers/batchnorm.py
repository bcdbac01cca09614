"""Batch normalisation on cuDNN, per channel after a Conv2D (spatial) or per value after a Dense
(per activation), with a learnt scale γ (``weight``) and shift β (``bias``).

    training   μ, σ² = mean and variance of x over the batch (and H, W when spatial)
               y = γ·(x - μ)/√(σ² + eps) + β                   cudnnBatchNormalizationForwardTraining
               running_mean ← (1 - momentum)·running_mean + momentum·μ
               running_var  ← (1 - momentum)·running_var  + momentum·σ²·m/(m - 1)
    evaluation y = γ·(x - running_mean)/√(running_var + eps) + β  cudnnBatchNormalizationForwardInference
    backward   x̂ = (x - μ)/√(σ² + eps);  dβ = Σ dy;  dγ = Σ dy·x̂
               dx = γ/(m·√(σ² + eps))·(m·dy - dβ - x̂·dγ)         cudnnBatchNormalizationBackward

m is the number of values each statistic is taken over. Synchronised (``sync=True``, in the fast
engine) and given a communicator by data-parallel training, μ, σ² and m are those of every rank's
batch together, and dx takes every rank's Σ dy and Σ dy·x̂ (the backend sums them over the ranks
inside the step); without several ranks it is plain batch normalisation. The running mean and variance are
buffers, not parameters: saved in checkpoints beside the weights, never touched by the optimiser.

In the fast engine training runs our kernels (backends/cuda/batch_norm.py) in place of cuDNN's
calls, and a ReLU layer right after (``activation``, set by Network) is applied in them: y = max(y, 0)
in the forward pass, dy·[y > 0] in the backward pass; in evaluation it runs on y in place.

Under math bf16 or fp16 in a network that stores 16 bits (layers.base.activation_dtype), x, y, dy and dx
are 16-bit tensors; γ, β, their gradients, the running statistics and the saved μ and 1/√(σ² + eps) stay
float32, every sum float32 or float64, y and dx rounded once. The fast engine's kernels read and write
16 bits (their ``*16`` twins); cuDNN's calls in the slides engine, and in evaluation, take 16-bit x, y,
dy and dx descriptors (CUDNN_DATA_BFLOAT16 / CUDNN_DATA_HALF) with float32 parameter descriptors, and
compute in float32 inside, y and dx rounded once.
Synchronised statistics are summed over the ranks as in float32.
"""

from __future__ import annotations

import numbers

from ..backends.descriptors import BATCH_NORM_MODES, BatchNormMode
from ..errors import CheckpointError, InvalidArgumentError
from ..tensor import FLOAT32_MAX, Tensor, finite_real, float32_rounded
from .base import Layer, Parameter

MODES = ("auto", "spatial", "per_activation")  # auto: spatial on planes (h·w > 1), per activation on vectors
MIN_EPS = 1e-5  # CUDNN_BN_MIN_EPSILON


class BatchNorm(Layer):
    stores_16_bits = True  # x, y, dy and dx may be 16-bit: statistics and sums in float32/float64, y and dx rounded once

    def __init__(self, name: str, mode: str = "auto", momentum: float = 0.1, eps: float = 1e-5, sync: bool = False):
        super().__init__(name)
        if not isinstance(sync, bool):
            raise InvalidArgumentError(f"layer {name!r}: sync must be true or false, got {sync!r}")
        if mode not in MODES:
            raise InvalidArgumentError(f"layer {name!r}: unknown batch normalisation mode {mode!r}; "
                                       f"valid modes are {', '.join(MODES)}")
        if isinstance(momentum, bool) or not isinstance(momentum, numbers.Real) or not 0 < momentum <= 1:
            raise InvalidArgumentError(f"layer {name!r}: momentum must be a number in (0, 1], got {momentum!r}")
        if float32_rounded(momentum) == 0:
            raise InvalidArgumentError(f"layer {name!r}: momentum must be a number in (0, 1], got {momentum!r}, which "
                                       f"float32 (the device's arithmetic) rounds to 0")
        eps = finite_real(eps, f"layer {name!r}: eps", f"in [{MIN_EPS:g}, {FLOAT32_MAX:g}] (cuDNN's minimum, float32's "
                          f"largest number)", lambda value: MIN_EPS <= value <= FLOAT32_MAX)
        self.mode, self.momentum, self.eps, self.sync = mode, float(momentum), eps, sync
        self.communicator = None  # the ranks' communicator, set by data-parallel training where ``sync``
        self.batch_norm_mode = None  # BatchNormMode, resolved from ``mode`` and the input at build
        self.weight = self.bias = self.grad_weight = self.grad_bias = None  # γ, β and their gradients
        self.running_mean = self.running_var = None
        self.save_mean = self.save_inv_std = None  # the last training batch's μ and 1/√(σ² + eps)
        self.activation = None  # the ActivationDescriptor of a following ReLU (applied here in the fast engine)

    def config(self):
        return {"mode": self.mode, "momentum": self.momentum, "eps": self.eps, **({"sync": True} if self.sync else {})}

    def _mode_for(self, input_shape) -> BatchNormMode:
        """spatial on planes (after Conv2D), per activation on vectors (after Dense), unless set."""
        _, h, w = input_shape
        mode = self.mode if self.mode != "auto" else ("spatial" if h * w > 1 else "per_activation")
        return BatchNormMode(BATCH_NORM_MODES[mode])

    def parameter_shapes(self, input_shape):
        c, h, w = input_shape
        shape = (1, c, 1, 1) if self._mode_for(input_shape) == BatchNormMode.SPATIAL else (1, c, h, w)
        return {"weight": shape, "bias": shape}

    def init_parameters(self, rng):
        self.batch_norm_mode = self._mode_for(self.input_sample_shape)
        shape = self.parameter_shapes(self.input_sample_shape)["weight"]  # (1, C, 1, 1) or (1, C, H, W)
        b = self.backend
        self.weight = Tensor(shape, b).fill_(1.0)  # γ
        self.bias = Tensor.zeros(shape, b)  # β
        self.grad_weight, self.grad_bias = Tensor.zeros(shape, b), Tensor.zeros(shape, b)
        self.running_mean, self.running_var = Tensor.zeros(shape, b), Tensor(shape, b).fill_(1.0)
        self.save_mean, self.save_inv_std = Tensor.zeros(shape, b), Tensor.zeros(shape, b)

    def _parameter_attributes(self):
        return ("weight", "bias", "grad_weight", "grad_bias", "running_mean", "running_var", "save_mean",
                "save_inv_std")

    def parameters(self):
        return [
            Parameter(f"{self.name}.weight", self.weight, self.grad_weight),
            Parameter(f"{self.name}.bias", self.bias, self.grad_bias),
        ]

    def buffers(self) -> dict[str, Tensor]:
        return {f"{self.name}.running_mean": self.running_mean, f"{self.name}.running_var": self.running_var}

    def values_per_statistic(self, batch: int) -> int:
        """m, the values each batch statistic is taken over in training on a batch of ``batch``: with m = 1
        every x̂ is 0 (y = β, no gradient reaches the layers before) and the unbiased variance's m/(m - 1)
        is undefined."""
        _, h, w = self.input_sample_shape
        return batch * (h * w if self.batch_norm_mode == BatchNormMode.SPATIAL else 1)

    def check_state(self, values: dict) -> None:
        """A running variance is >= 0: a negative one makes √(running_var + eps) NaN in evaluation."""
        name = f"{self.name}.running_var"
        negative = int((values[name] < 0).sum())
        if negative:
            raise CheckpointError(f"{name} holds {negative} negative values (of {values[name].size}); a variance "
                                  f"is >= 0")

    @property
    def applies_relu(self) -> bool:
        """Whether this layer applies the ReLU after it (the fast engine's kernels)."""
        return self.activation is not None and self.backend.engine.batch_norm_kernel

    forward_training = None  # whether the last forward normalised with batch statistics (None: no forward yet)

    def forward(self, input: Tensor) -> Tensor:
        self.prepare(input)
        if self.training and self.values_per_statistic(input.n) < 2:
            raise InvalidArgumentError(f"layer {self.name!r}: a training forward of {input.n} sample takes each batch "
                                       f"statistic over one value (y would be β alone); train on batches of 2 or "
                                       f"more, or call network.eval() to evaluate")
        b, mode, relu = self.backend, self.batch_norm_mode, self.applies_relu
        self.forward_training = self.training
        if not self.training:
            # y = γ·(x - running_mean)/√(running_var + eps) + β
            b.batch_norm_forward_inference(mode, input, self.output, self.weight, self.bias, self.running_mean,
                                           self.running_var, self.eps)
            if relu:
                # y = max(y, 0)  (the next layer's f, in place)
                b.activation_forward(self.activation, 1.0, self.output, 0.0, self.output)
            return self.output
        # y = f(γ·(x - μ)/√(σ² + eps) + β), f the next ReLU or the identity;
        # running statistics ← (1 - momentum)·running + momentum·batch
        b.batch_norm_forward_training(mode, input, self.output, self.weight, self.bias, self.momentum,
                                      self.running_mean, self.running_var, self.eps, self.save_mean,
                                      self.save_inv_std, relu=relu, **self._synchronised())
        return self.output

    def backward(self, grad_output: Tensor) -> Tensor:
        if not self.forward_training:
            raise InvalidArgumentError(f"layer {self.name!r}: backward after a forward in evaluation mode; batch "
                                       f"normalisation's gradient needs the batch statistics of a training forward: "
                                       f"call network.train() before the forward of a training step")
        # dy' = dy·f'(y);  dβ = Σ dy';  dγ = Σ dy'·x̂;  dx = γ/(m·√(σ² + eps))·(m·dy' - dβ - x̂·dγ)
        relu = self.applies_relu
        self.backend.batch_norm_backward(self.batch_norm_mode, self.input, grad_output, self.grad_input, self.weight,
                                         self.grad_weight, self.grad_bias, self.eps, self.save_mean,
                                         self.save_inv_std, **({"bias": self.bias, "relu": True} if relu else {}),
                                         **self._synchronised())
        return self.grad_input

    def _synchronised(self) -> dict:
        """The verbs' ``communicator`` argument where the statistics are summed over several ranks."""
        return {} if self.communicator is None else {"communicator": self.communicator}

