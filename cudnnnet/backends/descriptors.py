"""The modes and descriptors of the call surface (base.py): cuDNN's activation, pooling and batch
normalisation modes with the names a config gives them, and the activation, convolution and pooling
descriptors as frozen dataclasses (hashable: the CUDA backend caches its cuDNN descriptors by them)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

class ActivationMode(enum.IntEnum):
    """cudnnActivationMode_t values."""

    SIGMOID = 0
    RELU = 1
    TANH = 2
    CLIPPED_RELU = 3
    ELU = 4


ACTIVATION_MODES = {
    "sigmoid": ActivationMode.SIGMOID,
    "relu": ActivationMode.RELU,
    "tanh": ActivationMode.TANH,
    "clipped_relu": ActivationMode.CLIPPED_RELU,
    "elu": ActivationMode.ELU,
}


def in_gemm_epilogue(desc: "ActivationDescriptor | None") -> bool:
    """Whether cuBLASLt's epilogue can apply the activation ``desc`` after a GEMM's bias: none, or a ReLU."""
    return desc is None or desc.mode == ActivationMode.RELU


class PoolingMode(enum.IntEnum):
    """cudnnPoolingMode_t values. ``AVERAGE`` counts padding, as cuDNN's and PyTorch's default."""

    MAX = 0
    AVERAGE = 1  # CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING


POOLING_MODES = {"max": PoolingMode.MAX, "average": PoolingMode.AVERAGE}


class BatchNormMode(enum.IntEnum):
    """cudnnBatchNormMode_t values: statistics per value of a sample, or per channel."""

    PER_ACTIVATION = 0  # over N: parameters (1, C, H, W)
    SPATIAL = 1  # over N, H, W: parameters (1, C, 1, 1)


BATCH_NORM_MODES = {"per_activation": BatchNormMode.PER_ACTIVATION, "spatial": BatchNormMode.SPATIAL}


@dataclass(frozen=True)
class ActivationDescriptor:
    """cudnnActivationDescriptor_t: the mode and ``coef`` (clipping threshold, or ELU's alpha)."""

    mode: ActivationMode
    coef: float = 0.0


@dataclass(frozen=True)
class ConvolutionDescriptor:
    """cudnnConvolutionDescriptor_t (2-D cross-correlation) with the filter shape beside it."""

    out_channels: int
    in_channels: int
    kernel_size: int
    stride: int = 1
    padding: int = 0
    dilation: int = 1

    @property
    def filter_shape(self) -> tuple[int, int, int, int]:
        """(K, C, R, S) = (out_channels, in_channels, kernel, kernel)."""
        return (self.out_channels, self.in_channels, self.kernel_size, self.kernel_size)

    def output_shape(self, input_shape: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        """cudnnGetConvolution2dForwardOutputDim: 1 + (H + 2p - ((k-1)d + 1)) // s."""
        n, _, h, w = input_shape
        span = (self.kernel_size - 1) * self.dilation + 1
        out_h = (h + 2 * self.padding - span) // self.stride + 1
        out_w = (w + 2 * self.padding - span) // self.stride + 1
        return (n, self.out_channels, out_h, out_w)


@dataclass(frozen=True)
class PoolingDescriptor:
    """cudnnPoolingDescriptor_t for square 2-D windows."""

    mode: PoolingMode
    window: int
    padding: int = 0
    stride: int = 1

    def output_shape(self, input_shape: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        """cudnnGetPooling2dForwardOutputDim: 1 + (H + 2p - window) // s."""
        n, c, h, w = input_shape
        out_h = (h + 2 * self.padding - self.window) // self.stride + 1
        out_w = (w + 2 * self.padding - self.window) // self.stride + 1
        return (n, c, out_h, out_w)
