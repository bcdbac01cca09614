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

The scratch grows (outside a capture) to the largest launch seen; a buffer it outgrows is kept, not
freed, so that a CUDA graph captured with it stays valid.
"""

from __future__ import annotations

from ...errors import DeviceError, ShapeError
from ..base import BatchNormMode
from .buffer import DeviceBuffer
from .gemm_convolution import INDEX_LIMIT
from .kernel import MAX_BLOCKS

FLOAT64_BYTES = 8
TARGET_BLOCKS = MAX_BLOCKS  # about one wave of 256-thread blocks on a large GPU


def geometry(mode, shape) -> tuple[int, int, int]:
    """(samples N, channels, positions P) of x (N, C, H, W): spatial mode (C, H·W), per-activation (C·H·W, 1)."""
    n, c, h, w = shape
    return (n, c, h * w) if mode == BatchNormMode.SPATIAL else (n, c * h * w, 1)


def split(samples: int, channels: int) -> tuple[int, int]:
    """(samples per group, groups): as many groups per channel as fill TARGET_BLOCKS blocks in all,
    at most one per sample; a function of the shape alone."""
    groups = max(1, min(samples, TARGET_BLOCKS // channels))
    per_group = -(-samples // groups)
    return per_group, -(-samples // per_group)


class BatchNormKernels:
    """The four kernels of kernels/batch_norm.cu with their scratch of float64 partials."""

    def __init__(self, context):
        self.context = context
        self.scratch: DeviceBuffer | None = None
        self.outgrown: list[DeviceBuffer] = []  # kept: a captured graph may still read them

    def _partials(self, count: int) -> int:
        nbytes = 2 * FLOAT64_BYTES * count
        if self.scratch is None or self.scratch.nbytes < nbytes:
            if self.context.is_capturing():
                raise DeviceError("batch normalisation needed a larger scratch during a CUDA graph capture; run one "
                                  "step at this batch size before capturing")
            if self.scratch is not None:
                self.outgrown.append(self.scratch)
            self.scratch = DeviceBuffer.allocate(nbytes)
        return self.scratch.ptr

    def _launch_shape(self, call: str, mode, x) -> tuple[int, tuple]:
        if x.size >= INDEX_LIMIT:
            raise ShapeError(f"{call}: x {x.shape} holds {x.size} values; the fast engine's kernels index fewer "
                             "than 2^31")
        samples, channels, positions = geometry(mode, x.shape)
        per_group, groups = split(samples, channels)
        return channels * groups, (channels, positions, samples, per_group, groups)

    def forward(self, mode, x, y, scale, bias, factor: float, running_mean, running_var, eps: float, save_mean,
                save_inv_std, relu: bool) -> None:
        blocks, shape = self._launch_shape("batch_norm_forward_training", mode, x)
        partials, stream = self._partials(blocks), self.context.stream.handle
        # partials[c, g] = (Σ x, Σ x²) over group g of channel c
        self.context.kernel("batch_norm_sums").launch(blocks, stream, partials, x.data.ptr, *shape)
        # y = f(scale·(x - μ)/√(σ² + eps) + bias); save_mean, save_inv_std, running averages
        self.context.kernel("batch_norm_forward_apply").launch(
            blocks, stream, y.data.ptr, x.data.ptr, partials, scale.data.ptr, bias.data.ptr, running_mean.data.ptr,
            running_var.data.ptr, save_mean.data.ptr, save_inv_std.data.ptr, float(factor), float(eps), int(relu),
            *shape)

    def backward(self, mode, x, dy, dx, scale, bias, dscale, dbias, save_mean, save_inv_std, relu: bool) -> None:
        blocks, shape = self._launch_shape("batch_norm_backward", mode, x)
        partials, stream = self._partials(blocks), self.context.stream.handle
        # partials[c, g] = (Σ dy', Σ dy'·(x - μ)) over group g of channel c, dy' = dy·f'(y)
        self.context.kernel("batch_norm_gradient_sums").launch(
            blocks, stream, partials, x.data.ptr, dy.data.ptr, scale.data.ptr, bias.data.ptr, save_mean.data.ptr,
            save_inv_std.data.ptr, int(relu), *shape)
        # dbias = Σ dy';  dscale = Σ dy'·x̂;  dx = scale/(m·√(σ² + eps))·(m·dy' - dbias - x̂·dscale)
        self.context.kernel("batch_norm_backward_apply").launch(
            blocks, stream, dx.data.ptr, x.data.ptr, dy.data.ptr, partials, scale.data.ptr, bias.data.ptr,
            dscale.data.ptr, dbias.data.ptr, save_mean.data.ptr, save_inv_std.data.ptr, int(relu), *shape)

    def close(self) -> None:
        for buffer in [*self.outgrown, *([self.scratch] if self.scratch is not None else [])]:
            buffer.free()
        self.outgrown, self.scratch = [], None
