"""A convolution's bias gradient in one launch of our kernel (kernels/channel_sum.cu), the fast
engine's replacement for cudnnConvolutionBackwardBias (which the slides engine calls):

    db = alpha·Σₙ Σ_{h,w} dy + beta·db        dy (N, C, H, W), db (1, C, 1, 1)

cuDNN's reduction leaves most of the GPU idle at the CNN's shapes. Here a grid of (channel,
chunk) blocks fills the GPU for both of the CNN's shapes (conv1 dy (256, 20, 24, 24): 20 × 51 blocks; conv2 dy
(256, 50, 8, 8): 50 × 16 blocks), and the last block to finish adds the chunks' partial sums, in a
fixed order: the result has the same bits on every launch, eager or replayed in a CUDA graph.

The partial sums and the block counter live in one scratch buffer of fixed size, allocated with
the backend (never during a capture) and shared by every launch on the backend's one stream: a
launch needs at most MAX_PARTIALS partials (``split`` keeps channels·chunks within it, or uses
one chunk per channel, which needs none).

A 16-bit CNN's dy (bfloat16 or float16) takes the kernel's 16-bit twin (channel_sum16), in both engines:
cudnnConvolutionBackwardBias takes one data type for dy and db, and db stays float32.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import ShapeError, UsageError
from ...tensor import Tensor
from .bindings import runtime
from .buffer import FLOAT32_BYTES, DeviceBuffer
from .gemm_convolution import INDEX_LIMIT
from .kernel import BLOCK_SIZE, MAX_BLOCKS
from .low_precision import HALF_FORMATS

KERNEL = "channel_sum"
UNROLL = 4  # values a thread loads before adding them (kernels/channel_sum.cu: UNROLL)
MAX_PARTIALS = MAX_BLOCKS  # about one wave of blocks on a large GPU (132 SMs × 8 blocks of 256 threads)
MIN_CHUNK = UNROLL * BLOCK_SIZE  # a block sums at least one full pass of its threads' loads
CHUNK_ALIGNMENT = 32  # chunk lengths are whole warps' worth of values


@dataclass(frozen=True)
class Split:
    """How each channel's N·P values are cut among blocks: ``chunks`` blocks of ``chunk_length``."""

    chunks: int
    chunk_length: int


def split(channels: int, per_channel: int) -> Split:
    """As many chunks per channel as fill MAX_PARTIALS blocks in all, of about MIN_CHUNK values or
    more, in whole warps (one chunk where a channel holds at most MIN_CHUNK values, or where there
    are more than MAX_PARTIALS / 2 channels); a function of the shape alone, so that every launch
    for a shape adds in the same order."""
    chunks = max(1, min(MAX_PARTIALS // channels, -(-per_channel // MIN_CHUNK)))
    length = -(-per_channel // chunks)
    length = -(-length // CHUNK_ALIGNMENT) * CHUNK_ALIGNMENT
    return Split(-(-per_channel // length), length)


def fits_indices(dy_shape) -> bool:
    """Whether the kernel's 32-bit offsets reach every value of dy: N·C·P plus the C·(UNROLL·BLOCK_SIZE + P)
    a thread may step past its last value."""
    n, c, h, w = dy_shape
    return n * c * h * w + c * (UNROLL * BLOCK_SIZE + h * w) < INDEX_LIMIT


class ChannelSum:
    """kernels/channel_sum.cu with its scratch: MAX_PARTIALS floats of partial sums, then the block
    counter (an unsigned int, 0 between launches)."""

    def __init__(self, context):
        self.context = context
        self.scratch = DeviceBuffer.allocate(FLOAT32_BYTES * (MAX_PARTIALS + 1))
        runtime.memset_async(self.scratch.ptr, 0, self.scratch.nbytes, context.stream.handle)
        self.counter = self.scratch.ptr + FLOAT32_BYTES * MAX_PARTIALS

    def __call__(self, alpha, dy, beta, db) -> None:
        """db = alpha·Σ_{n,h,w} dy + beta·db in one launch; the caller has checked db's shape."""
        if not fits_indices(dy.shape):
            raise ShapeError(f"convolution_backward_bias: dy {dy.shape} holds {dy.size} values; the kernel "
                             f"indexes fewer than 2^31 (less {UNROLL * BLOCK_SIZE + dy.h * dy.w} per channel)")
        positions = dy.h * dy.w
        cut = split(dy.c, dy.n * positions)
        half = (HALF_FORMATS[dy.dtype].kernel_code,) if dy.dtype.half else ()
        # db = alpha·Σₙ Σₚ dy + beta·db      dy (N, C, P), blocks (C, chunks); a 16-bit dy read exactly
        self.context.kernel(KERNEL + "16" if half else KERNEL).launch(
            dy.c * cut.chunks, self.context.stream.handle, db.data.ptr, dy.data.ptr, self.scratch.ptr, self.counter,
            _host_float("alpha", alpha), _host_float("beta", beta), dy.c, positions, dy.n * positions,
            cut.chunk_length, cut.chunks, *half)

    def close(self) -> None:
        self.scratch.free()


def _host_float(name: str, value) -> float:
    if isinstance(value, Tensor):
        raise UsageError(f"convolution_backward_bias: {name} must be a float; only saxpy, sscal, sgd_update and "
                         "sgd_update_many take a one-element tensor as a scalar")
    return float(value)
