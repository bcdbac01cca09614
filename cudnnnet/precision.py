"""The precision: in which arithmetic the GEMMs and convolutions run — the policy beside the engine.

One object per mode, its vocabulary defined here and nowhere else (Flax's ``dtype`` / ``precision``
fields are the model): the config's ``math`` key, the command lines' ``--math``, the benchmark and
the backends read ``PRECISIONS``. A backend holds the one in force (``backend.precision``; its
name is ``backend.math``), set as its default with ``backend.set_math`` or for a block with
``backend.using(math=...)``; a Network carries its own (``Network(math=...)``).

    fp32  exact FP32 arithmetic (the default; the host computes it bit for bit as the GPU's order allows)
    tf32  FP32 operands through tensor cores on the GPU (~1e-3 relative error); the host computes FP32
    bf16  GEMM and convolution operands rounded to bfloat16, FP32 accumulation, weights and loss
    fp16  the same on IEEE half operands, with dynamic loss scaling (loss_scaling.py) for half's range

Activations, weights, optimiser state and the loss stay float32 in every mode (llm.c's recipe):
only the 16-bit copies a GEMM or convolution reads are rounded.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UsageError


@dataclass(frozen=True)
class Precision:
    """One math mode and the facts its callers act on."""

    name: str
    operand_dtype: str | None  # "bfloat16" / "float16": the 16-bit type GEMM and convolution operands are rounded to
    tensor_cores: bool  # FP32 operands on tensor cores (TF32): the GPU rounds inside the multiply, the host cannot
    loss_scaling: bool  # the loss is scaled on the device (loss_scaling.py): the operand type's range is too small

    def __str__(self) -> str:
        return self.name

    @property
    def half(self) -> bool:
        """Whether GEMM and convolution operands are 16-bit copies of the float32 tensors."""
        return self.operand_dtype is not None


FP32 = Precision("fp32", operand_dtype=None, tensor_cores=False, loss_scaling=False)
TF32 = Precision("tf32", operand_dtype=None, tensor_cores=True, loss_scaling=False)
BF16 = Precision("bf16", operand_dtype="bfloat16", tensor_cores=False, loss_scaling=False)
FP16 = Precision("fp16", operand_dtype="float16", tensor_cores=False, loss_scaling=True)
PRECISIONS = {precision.name: precision for precision in (FP32, TF32, BF16, FP16)}
PRECISION_NAMES = tuple(PRECISIONS)  # the config's ``math`` values and ``--math``'s choices
HALF_PRECISIONS = tuple(name for name, precision in PRECISIONS.items() if precision.half)
DEFAULT_PRECISION = FP32.name


def get_precision(precision: "str | Precision") -> Precision:
    """The precision called ``precision`` (fp32, tf32, bf16 or fp16), or ``precision`` itself if a Precision."""
    if isinstance(precision, Precision):
        return precision
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise UsageError(f"invalid math mode {precision!r}; valid are {', '.join(PRECISION_NAMES)}")
    return PRECISIONS[precision]
