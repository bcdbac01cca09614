"""Batch normalisation in training by our kernels (kernels/batch_norm.cu), the fast engine's
replacement for cudnnBatchNormalizationForwardTraining / Backward (which the slides engine calls),
with a following ReLU applied in the same passes:

    forward    y  = f(scale·(x - μ)/√(σ² + eps) + bias)        f = ReLU (relu) or the identity
    backward   dy' = dy·f'(y);  dbias = Σ dy';  dscale = Σ dy'·x̂
               dx = scale/(m·√(σ² + eps))·(m·dy' - dbias - x̂·dscale)

cuDNN's NCHW kernels give each channel few blocks, so at 32 channels of 32×32 most of the GPU idles;
here every channel's samples are cut into groups (``split``) so that channels·groups blocks fill it.
Each direction is two launches: per-group sums in float64 into a scratch of partials, then the
elementwise pass, whose blocks add their channel's partials in a fixed order (deterministic).

With a communicator (synchronised batch normalisation over several ranks) the partials of each
direction are added into per-channel totals, which ``communicator.all_reduce_sum_float64`` sums over
the ranks on the backend's stream (inside a captured step too) before the elementwise pass reads them:
μ and σ² are those of every rank's batch together, dx takes every rank's Σ dy' and Σ dy'·x̂, while
dscale and dbias stay this rank's (the gradient all-reduce averages them as every other gradient).

A 16-bit network's x, y, dy and dx (bfloat16 or float16) take the kernels' 16-bit twins (``*16``):
each value read exactly, y and dx rounded once; the statistics, sums and parameters as in float32.

The scratch grows (outside a capture) to the largest launch seen; a buffer it outgrows is kept, not
freed, so that a CUDA graph captured with it stays valid.
"""

from __future__ import annotations

from ...errors import DeviceError, ShapeError
from ..descriptors import BatchNormMode
from .buffer import DeviceBuffer
from .gemm_convolution import INDEX_LIMIT
from .kernel import BLOCK_SIZE, MAX_BLOCKS
from .low_precision import HALF_FORMATS

FLOAT64_BYTES = 8
TARGET_BLOCKS = MAX_BLOCKS  # about one wave of 256-thread blocks on a large GPU


def geometry(mode, shape) -> tuple[int, int, int]:
    """(samples N, channels, positions P) of x (N, C, H, W): spatial mode (C, H·W), per-activation (C·H·W, 1)."""
    n, c, h, w = shape
    return (n, c, h * w) if mode == BatchNormMode.SPATIAL else (n, c * h * w, 1)


def _twin(x) -> tuple[str, tuple[int, ...]]:
    """The kernel names' suffix and the trailing format argument for x's dtype: the 16-bit twins for a 16-bit x."""
    return ("16", (HALF_FORMATS[x.dtype].kernel_code,)) if x.dtype.half else ("", ())


def split(samples: int, channels: int) -> tuple[int, int]:
    """(samples per group, groups): as many groups per channel as fill TARGET_BLOCKS blocks in all,
    at most one per sample; a function of the shape alone."""
    groups = max(1, min(samples, TARGET_BLOCKS // channels))
    per_group = -(-samples // groups)
    return per_group, -(-samples // per_group)


class BatchNormKernels:
    """The kernels of kernels/batch_norm.cu with their scratch: float64 partials, and the totals that
    several ranks sum."""

    def __init__(self, context):
        self.context = context
        self.scratch: DeviceBuffer | None = None
        self.totals: DeviceBuffer | None = None
        self.outgrown: list[DeviceBuffer] = []  # kept: a captured graph may still read them

    def _grown(self, buffer: DeviceBuffer | None, nbytes: int) -> DeviceBuffer:
        """``buffer``, or a larger one in its place (the old one kept in ``outgrown``)."""
        if buffer is not None and buffer.nbytes >= nbytes:
            return buffer
        if self.context.is_capturing():
            raise DeviceError("batch normalisation needed a larger scratch during a CUDA graph capture; run one "
                              "step at this batch size before capturing")
        if buffer is not None:
            self.outgrown.append(buffer)
        return DeviceBuffer.allocate(nbytes)

    def _partials(self, count: int) -> int:
        self.scratch = self._grown(self.scratch, 2 * FLOAT64_BYTES * count)
        return self.scratch.ptr

    def _summed_over_ranks(self, partials: int, shape: tuple, communicator, gradients=()) -> tuple[int, int, int]:
        """(sums, groups per channel in them, address of m): the partials as they are without a
        communicator; else each channel's totals and m, summed over the ranks (``gradients``: dscale,
        dbias, save_inv_std, to write this rank's dscale and dbias from its own totals first)."""
        channels, positions, samples, _, groups = shape
        if communicator is None:
            return partials, groups, 0
        values = 2 * channels + 1
        self.totals = self._grown(self.totals, FLOAT64_BYTES * values)
        totals, stream = self.totals.ptr, self.context.stream.handle
        dscale, dbias, inv_std = (tensor.data.ptr for tensor in gradients) if gradients else (0, 0, 0)
        # totals[c] = (Σ a, Σ b) over channel c's partials; totals[2C] = m of this rank
        self.context.kernel("batch_norm_totals").launch(
            -(-channels // BLOCK_SIZE), stream, totals, partials, channels, groups, samples * positions, dscale, dbias,
            inv_std)
        # totals = Σ_ranks totals
        communicator.all_reduce_sum_float64(totals, values)
        return totals, 1, totals + FLOAT64_BYTES * 2 * channels

    def _launch_shape(self, call: str, mode, x) -> tuple[int, tuple]:
        if x.size >= INDEX_LIMIT:
            raise ShapeError(f"{call}: x {x.shape} holds {x.size} values; the fast engine's kernels index fewer "
                             "than 2^31")
        samples, channels, positions = geometry(mode, x.shape)
        per_group, groups = split(samples, channels)
        return channels * groups, (channels, positions, samples, per_group, groups)

    def forward(self, mode, x, y, scale, bias, factor: float, running_mean, running_var, eps: float, save_mean,
                save_inv_std, relu: bool, communicator=None) -> None:
        blocks, shape = self._launch_shape("batch_norm_forward_training", mode, x)
        partials, stream = self._partials(blocks), self.context.stream.handle
        suffix, half = _twin(x)
        # partials[c, g] = (Σ x, Σ x²) over group g of channel c
        self.context.kernel("batch_norm_sums" + suffix).launch(blocks, stream, partials, x.data.ptr, *shape, *half)
        sums, sum_groups, count = self._summed_over_ranks(partials, shape, communicator)
        # y = f(scale·(x - μ)/√(σ² + eps) + bias); save_mean, save_inv_std, running averages
        self.context.kernel("batch_norm_forward_apply" + suffix).launch(
            blocks, stream, y.data.ptr, x.data.ptr, sums, sum_groups, count, scale.data.ptr, bias.data.ptr,
            running_mean.data.ptr, running_var.data.ptr, save_mean.data.ptr, save_inv_std.data.ptr, float(factor),
            float(eps), int(relu), *shape, *half)

    def backward(self, mode, x, dy, dx, scale, bias, dscale, dbias, save_mean, save_inv_std, relu: bool,
                 communicator=None) -> None:
        blocks, shape = self._launch_shape("batch_norm_backward", mode, x)
        partials, stream = self._partials(blocks), self.context.stream.handle
        suffix, half = _twin(x)
        # partials[c, g] = (Σ dy', Σ dy'·(x - μ)) over group g of channel c, dy' = dy·f'(y)
        self.context.kernel("batch_norm_gradient_sums" + suffix).launch(
            blocks, stream, partials, x.data.ptr, dy.data.ptr, scale.data.ptr, bias.data.ptr, save_mean.data.ptr,
            save_inv_std.data.ptr, int(relu), *shape, *half)
        sums, sum_groups, count = self._summed_over_ranks(partials, shape, communicator,
                                                          (dscale, dbias, save_inv_std))
        written_here = communicator is None  # else batch_norm_totals wrote this rank's dscale and dbias
        # dbias = Σ dy';  dscale = Σ dy'·x̂;  dx = scale/(m·√(σ² + eps))·(m·dy' - dbias - x̂·dscale)
        self.context.kernel("batch_norm_backward_apply" + suffix).launch(
            blocks, stream, dx.data.ptr, x.data.ptr, dy.data.ptr, sums, sum_groups, count, scale.data.ptr,
            bias.data.ptr, dscale.data.ptr if written_here else 0, dbias.data.ptr if written_here else 0,
            save_mean.data.ptr, save_inv_std.data.ptr, int(relu), *shape, *half)

    def close(self) -> None:
        for buffer in [*self.outgrown, *(b for b in (self.scratch, self.totals) if b is not None)]:
            buffer.free()
        self.outgrown, self.scratch, self.totals = [], None, None
