"""The bfloat16 operands of ``math: bf16``: weights, their gradients and optimiser state stay float32,
and so do the activations of any network whose layers do not all store 16 bits (every layer type of
the package does, so every shipped network's activations are bfloat16 tensors, read by the GEMMs and
convolutions as they are: ``HalfOperands.operands``, and written by cuDNN as they are); a GEMM or a
convolution reads
bfloat16 copies of its float32 inputs, made by kernels/bf16.cu, and accumulates in FP32:

    GEMM         A₁₆ = bf16(A), B₁₆ = bf16(B)          to_bf16
                 C = alpha·op(A₁₆)·op(B₁₆) + beta·C    cublasGemmEx or cublasLtMatmul (A, B CUDA_R_16BF;
                                                       C CUDA_R_32F; CUBLAS_COMPUTE_32F)
    convolution  a₁₆ = bf16(a), b₁₆ = bf16(b)          to_bf16
                 out₁₆ = a₁₆ ⋆ b₁₆                     cudnnConvolution* (BFLOAT16_CONFIG: bfloat16
                                                       tensors, FLOAT compute, TENSOR_OP_MATH)
                 out = alpha·float(out₁₆) + beta·out   bf16_to_float

cuDNN's BFLOAT16_CONFIG writes a bfloat16 output, so a convolution's result is rounded to bfloat16
once more; a GEMM's is not. The fast engine's explicit-GEMM convolution (gemm_convolution.py: im2col
into bfloat16, GEMMs with FP32 results) rounds its result once to bfloat16 too, so a convolution is
the same arithmetic whichever algorithm its plan took. The host backend rounds the same operands
(and convolution outputs) the same way.

Three concerns, a class each:

- ``convert_to_bf16``: the conversion launch.
- ``Bf16Copies``: inside a pass (a network's forward and backward, ``start`` … ``stop``), each
  operand is converted once and its copy read by every call of the pass that takes it: the input x
  of a layer by its forward product and its weight gradient, a weight by the forward product and
  the input gradient, dy by both gradients. A producer may write the copy in the kernel that
  writes the float32 values (``target``). Rounding is a function of the value, so a reused copy is
  what converting again would give: the arithmetic is unchanged. Each copy is an allocation of its
  own (256-byte aligned, as the scratch slots are): a weight's copy cut from a copy of the packed
  parameters would sit at 128-byte offsets, for which cuBLAS may pick other kernels, summing in
  another order than a direct call's (docs/benchmarks.md), so weights are converted as any
  operand is, on first use in the pass.
- ``Bf16Scratch``: outside a pass (a direct backend call), the copies of one call's operands, and
  every convolution's bfloat16 result, in slots of one grow-only buffer.

``math: fp16`` runs the same calls on IEEE half copies (kernels/fp16.cu; CUDA_R_16F, cuDNN's
PSEUDO_HALF_CONFIG: half tensors, FLOAT compute): a ``HalfFormat`` names the types and conversion
kernels of each 16-bit format; the conversions and copies take one (bfloat16 unless given).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from ...errors import DeviceError
from ...precision import BFLOAT16, FLOAT16, DType, Precision
from .bindings import cublas, cudnn
from .buffer import FLOAT32_BYTES, DeviceBuffer
from .kernel import BLOCK_SIZE

BF16_BYTES = 2
SLOT_ALIGNMENT = 256  # bytes; cuBLAS and cuDNN read 16-bit operands fastest from aligned addresses
MAX_BLOCKS = 65535  # conversion launches: one value per thread up to 16.7 M values, then grid-stride


@dataclass(frozen=True)
class HalfFormat:
    """A 16-bit operand format: its cudaDataType_t (cublasGemmEx), its cudnnDataType_t (x, w and y
    of a convolution) and the kernels converting float32 to it (one and four values a thread) and back."""

    dtype: DType  # the Precision.operand_dtype it holds
    cublas_type: int
    cudnn_type: int
    to_half: str
    to_half_x4: str
    to_float: str
    kernel_code: int  # the ``format`` argument of kernels/convolution.cu's 16-bit kernels


BF16 = HalfFormat(BFLOAT16, cublas.R_16BF, cudnn.DATA_BFLOAT16, "to_bf16", "to_bf16_x4", "bf16_to_float", 1)
FP16 = HalfFormat(FLOAT16, cublas.R_16F, cudnn.DATA_HALF, "to_fp16", "to_fp16_x4", "fp16_to_float", 2)
HALF_FORMATS = {fmt.dtype: fmt for fmt in (BF16, FP16)}  # Precision.operand_dtype -> its 16-bit format


def half_format(precision: Precision) -> HalfFormat | None:
    """The 16-bit format of ``precision``'s GEMM and convolution operands; None where they are float32."""
    return HALF_FORMATS.get(precision.operand_dtype)


def _aligned_bytes(count: int) -> int:
    return -(-BF16_BYTES * count // SLOT_ALIGNMENT) * SLOT_ALIGNMENT


def _blocks(count: int) -> int:
    return max(1, min(MAX_BLOCKS, -(-count // BLOCK_SIZE)))


def convert_to_bf16(context, target: int, source: int, count: int, fmt: HalfFormat = BF16) -> None:
    """target[:count] = bf16(source[:count]) (``fmt``'s 16 bits), rounded to nearest even: four values
    a thread from a 16-byte aligned source into an 8-byte aligned target, the rest one a thread."""
    stream = context.stream.handle
    vectors = count // 4 if source % 16 == 0 and target % 8 == 0 else 0
    if vectors:
        context.kernel(fmt.to_half_x4).launch(_blocks(vectors), stream, target, source, vectors)
    rest = count - 4 * vectors
    if rest:
        context.kernel(fmt.to_half).launch(_blocks(rest), stream, target + BF16_BYTES * 4 * vectors,
                                           source + FLOAT32_BYTES * 4 * vectors, rest)


@dataclass
class _Copy:
    """The bfloat16 copy of one float32 buffer; ``fresh`` while it holds the buffer's current values."""

    buffer: DeviceBuffer
    fresh: bool = False


class Bf16Copies:
    """The bfloat16 copy of each float32 operand of a pass, made once and reused.

    Copies are kept by source buffer (weakly: a copy goes with its buffer) and their memory stays from
    one pass to the next, so a captured graph reads and writes fixed addresses. Within a pass, an
    operand's float32 values must not change after it was converted: a network writes a layer's
    input before the layer's forward and leaves it until the next pass, writes dy before the layer's
    backward, and updates its weights between passes.
    """

    def __init__(self, context):
        self.context = context
        self.active = False
        self.format = BF16  # the pass's 16-bit format
        self._copies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # DeviceBuffer -> _Copy

    def start(self, fmt: HalfFormat = BF16) -> None:
        """Begin a pass in ``fmt``: forget every copy's values; each is made again where first read."""
        self.stop()
        self.format = fmt
        self.active = True

    def stop(self) -> None:
        """End the pass: no copy is read again before it is made again."""
        self.active = False
        for copy in self._copies.values():
            copy.fresh = False

    def pointer(self, source: DeviceBuffer) -> int | None:
        """The bfloat16 copy of ``source``, converted now if it has none fresh; None outside a pass."""
        if not self.active:
            return None
        copy = self._copies.get(source)
        if copy is None or not copy.fresh:
            copy = self._convert(source)
        return copy.buffer.ptr

    def target(self, source: DeviceBuffer) -> int | None:
        """Where a kernel writing all of ``source`` also writes its bfloat16 copy: the copy's address
        when ``source`` has one (it was an operand in an earlier pass) and the pass is in bfloat16,
        now fresh; else None."""
        copy = self._copies.get(source) if self.active and self.format is BF16 else None
        if copy is None:
            return None
        copy.fresh = True
        return copy.buffer.ptr

    def _convert(self, source: DeviceBuffer) -> _Copy:
        copy = self._copies.get(source)
        if copy is None:
            if self.context.is_capturing():
                raise DeviceError(f"a bfloat16 copy of {source.size} values was first needed during a CUDA graph "
                                  "capture; run one step at this batch size before capturing")
            copy = self._copies[source] = _Copy(DeviceBuffer.allocate(max(SLOT_ALIGNMENT, _aligned_bytes(source.size))))
        convert_to_bf16(self.context, copy.buffer.ptr, source.ptr, source.size, self.format)
        copy.fresh = True
        return copy

    def close(self) -> None:
        self.active = False
        for copy in self._copies.values():
            copy.buffer.free()
        self._copies.clear()


class Bf16Scratch:
    """bfloat16 copies of one call's operands, and convolution results, in slots of a grow-only
    device buffer; calls run one after another on the context's stream, so they share it."""

    def __init__(self, context):
        self.context = context
        self._buffer: DeviceBuffer | None = None
        self._outgrown: list[DeviceBuffer] = []  # a captured graph may still read them

    def slots(self, *counts: int) -> list[int]:
        """Device pointers of consecutive slots of ``counts`` bfloat16 values each. The buffer grows
        before a capture only: a step run once before capturing has made it large enough."""
        needed = sum(_aligned_bytes(count) for count in counts)
        if self._buffer is None or self._buffer.nbytes < needed:
            if self.context.is_capturing():
                raise DeviceError(f"the bfloat16 scratch must grow to {needed} bytes during a CUDA graph capture; "
                                  "run one step at this batch size before capturing")
            if self._buffer is not None:
                self._outgrown.append(self._buffer)
            self._buffer = DeviceBuffer.allocate(needed)
        pointers, offset = [], self._buffer.ptr
        for count in counts:
            pointers.append(offset)
            offset += _aligned_bytes(count)
        return pointers

    def operands(self, *pairs: tuple[int, int], output: int = 0, fmt: HalfFormat = BF16) -> list[int]:
        """The bfloat16 (``fmt``) copies of each (float32 pointer, count) of ``pairs``, then, where
        ``output`` is non-zero, a slot of that many values for a 16-bit result: their device pointers."""
        counts = [count for _, count in pairs] + ([output] if output else [])
        pointers = self.slots(*counts) if counts else []
        for target, (source, count) in zip(pointers, pairs):
            convert_to_bf16(self.context, target, source, count, fmt)
        return pointers

    def to_float(self, out: int, source: int, alpha: float, beta: float, count: int, fmt: HalfFormat = BF16) -> None:
        """out[:count] = alpha·float(source[:count]) + beta·out[:count] (out not read where beta is 0)."""
        if count:
            self.context.kernel(fmt.to_float).launch(_blocks(count), self.context.stream.handle, out, source,
                                                     float(alpha), float(beta), count)

    def close(self) -> None:
        for buffer in (self._buffer, *self._outgrown):
            if buffer is not None:
                buffer.free()
        self._buffer = None
        self._outgrown.clear()


class HalfOperands:
    """The 16-bit operands of math "bf16" and "fp16" on one context: inside a pass the pass's copies
    (``copies``), outside it one call's scratch slots (``scratch``), which also hold convolution results."""

    def __init__(self, context):
        self.copies = Bf16Copies(context)
        self.scratch = Bf16Scratch(context)

    def operands(self, *operands, output: int = 0, fmt: HalfFormat = BF16) -> list[int]:
        """The 16-bit addresses of each (tensor, values read) of ``operands``: a tensor of ``fmt``'s type
        itself (a 16-bit MLP's activation), else the pass's copy inside a pass in ``fmt``, else a scratch
        slot converted now to ``fmt``; then, where ``output`` is non-zero, a scratch slot for that many
        16-bit results."""
        in_pass = self.copies.format == fmt
        pointers = [tensor.data.ptr if tensor.dtype is fmt.dtype else self.copies.pointer(tensor.data) if in_pass
                    else None for tensor, _ in operands]
        missing = [(tensor.data.ptr, count) for (tensor, count), pointer in zip(operands, pointers) if pointer is None]
        slots = iter(self.scratch.operands(*missing, output=output, fmt=fmt))
        pointers = [next(slots) if pointer is None else pointer for pointer in pointers]
        return pointers + ([next(slots)] if output else [])

    def to_float(self, out: int, source: int, alpha: float, beta: float, count: int, fmt: HalfFormat = BF16) -> None:
        """out[:count] = alpha·float(source[:count]) + beta·out[:count] (``Bf16Scratch.to_float``)."""
        self.scratch.to_float(out, source, alpha, beta, count, fmt=fmt)

    def close(self) -> None:
        self.copies.close()
        self.scratch.close()


def through_float32(context, inputs, output, run) -> None:
    """``run(*inputs32, output32)`` (a cuDNN call on float32 pointers: dropout, pooling's backward
    where windows overlap) on float32 copies of the 16-bit tensors ``inputs`` in the workspace, each at
    its own size and SLOT_ALIGNMENT-aligned, one after another, then output = h(output32) in output's
    16 bits: each copy exact, output rounded once."""
    fmt = HALF_FORMATS[output.dtype]
    sizes = [tensor.size for tensor in inputs] + [output.size]
    slots = [-(-FLOAT32_BYTES * size // SLOT_ALIGNMENT) * SLOT_ALIGNMENT for size in sizes]
    first = context.workspace(sum(slots))  # inputs32 …, output32
    pointers = [first + sum(slots[:index]) for index in range(len(slots))]
    for tensor, pointer in zip(inputs, pointers):
        # copy = float(tensor₁₆)
        context.half.to_float(pointer, tensor.data.ptr, 1.0, 0.0, tensor.size, fmt)
    run(*pointers)
    # output₁₆ = h(output32)
    convert_to_bf16(context, output.data.ptr, pointers[-1], output.size, fmt)
