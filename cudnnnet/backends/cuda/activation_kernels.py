"""The fast engine's activation kernels (kernels/activation.cu, kernels/bias_activation.cu): the
activation's backward pass, the bias and activation after a GEMM or convolution in one launch, and the
activation's backward pass with the Dense layer's bias gradient. Under math "bf16" each also writes the
bfloat16 copy of its output where the backend passes that copy's address (``*16``, None otherwise).
A 16-bit multilayer perceptron's activations (16-bit y, dy, dx) take the ``*16`` kernels: computed in
float from the stored values, each store rounded once; eight values a thread (16-byte loads and stores)
where a Dense layer's C, or a convolution's H·W, is a multiple of 8 and the operands 16-byte aligned,
else one."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import DeviceError
from ..descriptors import ActivationDescriptor
from .buffer import FLOAT32_BYTES, DeviceBuffer
from .kernel import BLOCK_SIZE, MAX_BLOCKS, MAX_ELEMENTWISE_BLOCKS, blocks_for
from .low_precision import BF16_BYTES, HALF_FORMATS

ACTIVATION_PARTIALS = 1 << 20  # floats of activation_bias_backward's slab sums (4 MiB)
MIN_SLAB_ROWS = 4  # samples a block of activation_bias_backward sums at least (ROWS_AHEAD in activation.cu)
SUM_CHANNELS = 32  # channels a block of activation_bias_sums adds (a warp's run of a row)


@dataclass(frozen=True)
class Slabs:
    """How activation_bias_backward cuts the samples: ``slabs`` slabs of ``slab_rows`` samples, each
    summed by ``column_blocks`` blocks of BLOCK_SIZE columns (a channel, or four in the x4 kernel)."""

    slabs: int
    slab_rows: int
    column_blocks: int

    @property
    def blocks(self) -> int:
        return self.slabs * self.column_blocks


def activation_slabs(samples: int, channels: int, width: int = 1) -> Slabs:
    """About MAX_BLOCKS blocks in all, slabs of at least MIN_SLAB_ROWS samples, their partial sums
    within ACTIVATION_PARTIALS, for a kernel taking ``width`` channels a thread: a function of the
    shape alone, so that every launch adds alike."""
    column_blocks = -(-(channels // width) // BLOCK_SIZE)
    slabs = max(1, min(-(-samples // MIN_SLAB_ROWS), MAX_BLOCKS // column_blocks, ACTIVATION_PARTIALS // channels))
    slab_rows = -(-samples // slabs)
    return Slabs(-(-samples // slab_rows), slab_rows, column_blocks)


class ActivationKernels:
    """The launches, on the context's stream, and activation_bias_backward's scratch of slab sums."""

    def __init__(self, context):
        self.context = context
        self._partial_sums: DeviceBuffer | None = None  # activation_bias_backward's slab sums

    def close(self) -> None:
        if self._partial_sums is not None:
            self._partial_sums.free()
            self._partial_sums = None

    def backward(self, desc: ActivationDescriptor, alpha: float, y, dy, x, beta: float, dx, dx16: int | None) -> None:
        """dx = alpha·f'·dy + beta·dx (and dx₁₆ = bf16(dx)): four values a thread where every float32
        operand is 16-byte aligned, the rest one a thread."""
        stream = self.context.stream.handle
        count, mode, coef = x.size, int(desc.mode), float(desc.coef)
        pointers = (dx.data.ptr, x.data.ptr, y.data.ptr, dy.data.ptr)
        if dx.dtype.half:
            # dx₁₆ = alpha·f'·dy + beta·dx     from 16-bit x, y, dy (and dx)
            self.context.kernel("activation_backward16").launch(blocks_for(count), stream, *pointers, mode, coef,
                                                                alpha, beta, count, _format(dx))
            return
        vectors = count // 4 if all(pointer % 16 == 0 for pointer in pointers) else 0
        if vectors:
            # dx = alpha·f'·dy + beta·dx      float4s
            blocks = min(-(-vectors // BLOCK_SIZE), MAX_ELEMENTWISE_BLOCKS)
            self.context.kernel("activation_backward_x4").launch(blocks, stream, *pointers, mode, coef, alpha,
                                                                 beta, vectors, dx16)
        rest = count - 4 * vectors
        if rest:
            # dx = alpha·f'·dy + beta·dx      the values after the float4s
            offset = 4 * FLOAT32_BYTES * vectors
            self.context.kernel("activation_backward").launch(
                blocks_for(rest), stream, *(pointer + offset for pointer in pointers), mode, coef, alpha, beta,
                rest, None if dx16 is None else dx16 + 4 * BF16_BYTES * vectors)

    def bias_forward(self, desc: ActivationDescriptor | None, bias, y, y16: int | None) -> None:
        """kernels/bias_activation.cu: y = f(y + bias) in one launch, y read and written once."""
        stream = self.context.stream.handle
        mode, coef = (-1, 0.0) if desc is None else (int(desc.mode), float(desc.coef))
        if y.dtype.half and y.h * y.w == 1 and y.c % 8 == 0 and (y.data.ptr | bias.data.ptr) % 16 == 0:
            # y₁₆ = f(y₁₆ + bias)      a Dense layer's y (N, C), eight values a thread (16-byte loads)
            count8 = y.size // 8
            blocks = min(-(-count8 // BLOCK_SIZE), MAX_ELEMENTWISE_BLOCKS)
            self.context.kernel("bias_activation_forward16_dense8").launch(blocks, stream, y.data.ptr, bias.data.ptr,
                                                                           count8, y.c // 8, mode, coef, _format(y))
            return
        if y.dtype.half and y.h * y.w % 8 == 0 and y.data.ptr % 16 == 0:
            # y₁₆ = f(y₁₆ + bias)      a convolution's y (N, C, H, W), eight values of one channel a thread
            count8 = y.size // 8
            blocks = min(-(-count8 // BLOCK_SIZE), MAX_ELEMENTWISE_BLOCKS)
            self.context.kernel("bias_activation_forward16_spatial8").launch(
                blocks, stream, y.data.ptr, bias.data.ptr, count8, y.c, y.h * y.w // 8, mode, coef, _format(y))
            return
        if y.dtype.half:
            # y₁₆ = f(y₁₆ + bias)
            self.context.kernel("bias_activation_forward16").launch(blocks_for(y.size), stream, y.data.ptr,
                                                                    bias.data.ptr, y.size, y.c, y.h * y.w, mode, coef,
                                                                    _format(y))
            return
        if y.h * y.w == 1 and y.c % 4 == 0 and (y.data.ptr | bias.data.ptr) % 16 == 0:
            # Dense layers' y as float4s: y (N, C) with C a multiple of 4, 16-byte aligned
            count4 = y.size // 4
            blocks = min(-(-count4 // BLOCK_SIZE), MAX_ELEMENTWISE_BLOCKS)
            self.context.kernel("bias_activation_forward_dense4").launch(blocks, stream, y.data.ptr, bias.data.ptr,
                                                                         count4, y.c // 4, mode, coef, y16)
            return
        self.context.kernel("bias_activation_forward").launch(blocks_for(y.size), stream, y.data.ptr, bias.data.ptr,
                                                              y.size, y.c, y.h * y.w, mode, coef, y16)

    def bias_backward(self, desc: ActivationDescriptor, y, dy, dx, db, dx16: int | None) -> None:
        """kernels/activation.cu: dx = f'(y)·dy and each slab of samples' partial sums of dx in one pass
        (with one slab, db itself), then one launch adding the slabs in order. Four channels a thread
        where C is a multiple of 4 and every operand is 16-byte aligned, eight for 16-bit ones where C is a
        multiple of 8 (``_summed_width``), else one."""
        stream = self.context.stream.handle
        samples, channels = y.n, y.c
        aligned = all(t.data.ptr % 16 == 0 for t in (y, dy, dx, db))
        width = _summed_width(channels, aligned, dx.dtype.half)
        cut = activation_slabs(samples, channels, width)
        partial = db.data.ptr if cut.slabs == 1 else self._partials().ptr
        pointers = (dx.data.ptr, y.data.ptr, dy.data.ptr)
        if width == 8:
            # dx₁₆ = f'(y₁₆)·dy₁₆,  partial[s] = Σ_{n in slab s} dx[n]      eight channels a thread
            self.context.kernel("activation_bias_backward16_x8").launch(cut.blocks, stream, *pointers, int(desc.mode),
                                                                        float(desc.coef), samples, channels // 8,
                                                                        cut.slab_rows, partial, _format(dx))
        elif dx.dtype.half:
            # dx₁₆ = f'(y₁₆)·dy₁₆,  partial[s] = Σ_{n in slab s} dx[n] (before rounding)
            self.context.kernel("activation_bias_backward16").launch(cut.blocks, stream, *pointers, int(desc.mode),
                                                                     float(desc.coef), samples, channels,
                                                                     cut.slab_rows, partial, _format(dx))
        else:
            kernel = "activation_bias_backward_x4" if width == 4 else "activation_bias_backward"
            # dx = f'(y)·dy,  partial[s] = Σ_{n in slab s} dx[n]      blocks (channels / (width·BLOCK_SIZE), slabs)
            self.context.kernel(kernel).launch(cut.blocks, stream, *pointers, int(desc.mode), float(desc.coef),
                                               samples, channels // width, cut.slab_rows, partial, dx16)
        if cut.slabs > 1:
            # db = Σ_s partial[s]
            self.context.kernel("activation_bias_sums").launch(-(-channels // SUM_CHANNELS), stream,
                                                               db.data.ptr, partial, cut.slabs, channels)

    def _partials(self) -> DeviceBuffer:
        """ACTIVATION_PARTIALS floats for activation_bias_backward's slab sums, allocated on first use
        (never in a capture) and shared by every launch on the one stream."""
        if self._partial_sums is None:
            if self.context.is_capturing():
                raise DeviceError("activation_bias_backward was first called during a CUDA graph capture; its "
                                  "scratch is allocated on that call: run one step before capturing")
            self._partial_sums = DeviceBuffer.allocate(FLOAT32_BYTES * ACTIVATION_PARTIALS)
        return self._partial_sums


def _format(tensor) -> int:
    """The ``format`` argument of the 16-bit kernels for ``tensor``'s dtype (1 bfloat16, 2 IEEE half)."""
    return HALF_FORMATS[tensor.dtype].kernel_code


def _summed_width(channels: int, aligned: bool, half: bool) -> int:
    """The channels a thread of activation_bias_backward takes: 8 (16-bit, 16-byte loads) or 4 (float4s)
    where C is a multiple of that and every operand 16-byte aligned, else 1. Each channel is summed in
    sample order whatever the width, so db has the same bits."""
    width = 8 if half else 4
    return width if aligned and channels % width == 0 else 1
