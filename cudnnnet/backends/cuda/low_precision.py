"""The bfloat16 operands of ``math: bf16``: every tensor stays float32 (activations, weights,
gradients, optimiser state); a GEMM or a convolution reads bfloat16 copies of its inputs, made
just before the library call by kernels/bf16.cu, and accumulates in FP32:

    GEMM         A₁₆ = bf16(A), B₁₆ = bf16(B)          to_bf16
                 C = alpha·op(A₁₆)·op(B₁₆) + beta·C    cublasGemmEx (A, B CUDA_R_16BF; C CUDA_R_32F;
                                                       CUBLAS_COMPUTE_32F)
    convolution  a₁₆ = bf16(a), b₁₆ = bf16(b)          to_bf16
                 out₁₆ = a₁₆ ⋆ b₁₆                     cudnnConvolution* (BFLOAT16_CONFIG: bfloat16
                                                       tensors, FLOAT compute, TENSOR_OP_MATH)
                 out = alpha·float(out₁₆) + beta·out   bf16_to_float

cuDNN's BFLOAT16_CONFIG writes a bfloat16 output, so a convolution's result is rounded to bfloat16
once more; a GEMM's is not. The copies live in one grow-only scratch buffer of this class, cut into
256-byte aligned slots; calls run one after another on the context's stream, so they share it.
The host backend rounds the same operands (and convolution outputs) the same way.

``math: fp16`` runs the same calls on IEEE half copies (kernels/fp16.cu; CUDA_R_16F, cuDNN's
PSEUDO_HALF_CONFIG: half tensors, FLOAT compute): a ``HalfFormat`` names the types and conversion
kernels of each 16-bit format, and the scratch's methods take one (bfloat16 unless given).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import DeviceError
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

    name: str  # the math mode that uses it
    cublas_type: int
    cudnn_type: int
    to_half: str
    to_half_x4: str
    to_float: str


BF16 = HalfFormat("bf16", cublas.R_16BF, cudnn.DATA_BFLOAT16, "to_bf16", "to_bf16_x4", "bf16_to_float")
FP16 = HalfFormat("fp16", cublas.R_16F, cudnn.DATA_HALF, "to_fp16", "to_fp16_x4", "fp16_to_float")
HALF_FORMATS = {fmt.name: fmt for fmt in (BF16, FP16)}  # math mode -> its 16-bit format


def _aligned_bytes(count: int) -> int:
    return -(-BF16_BYTES * count // SLOT_ALIGNMENT) * SLOT_ALIGNMENT


def _blocks(count: int) -> int:
    return max(1, min(MAX_BLOCKS, -(-count // BLOCK_SIZE)))


class Bf16Scratch:
    """bfloat16 copies of one call's operands, in slots of a grow-only device buffer."""

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

    def to_bf16(self, target: int, source: int, count: int, fmt: HalfFormat = BF16) -> None:
        """target[:count] = bf16(source[:count]) (``fmt``'s 16 bits), rounded to nearest even: four values
        a thread from a 16-byte aligned source (``target`` is a slot, 256-byte aligned), the rest one a thread."""
        stream = self.context.stream.handle
        vectors = count // 4 if source % 16 == 0 else 0
        if vectors:
            self.context.kernel(fmt.to_half_x4).launch(_blocks(vectors), stream, target, source, vectors)
        rest = count - 4 * vectors
        if rest:
            self.context.kernel(fmt.to_half).launch(_blocks(rest), stream, target + BF16_BYTES * 4 * vectors,
                                                    source + FLOAT32_BYTES * 4 * vectors, rest)

    def operands(self, *pairs: tuple[int, int], output: int = 0, fmt: HalfFormat = BF16) -> list[int]:
        """The bfloat16 (``fmt``) copies of each (float32 pointer, count) of ``pairs``, then, where
        ``output`` is non-zero, a slot of that many values for a 16-bit result: their device pointers."""
        counts = [count for _, count in pairs] + ([output] if output else [])
        pointers = self.slots(*counts)
        for target, (source, count) in zip(pointers, pairs):
            self.to_bf16(target, source, count, fmt)
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
