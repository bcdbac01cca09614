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

Weights, their gradients, optimiser state and the loss stay float32 in every mode (llm.c's recipe).
Under bf16 and fp16 a network whose every layer can store 16 bits (Dense, Activation, Conv2D, Pooling,
GlobalAveragePooling, Dropout, BatchNorm and the loss layers: ``layers.base.activation_dtype``; every
layer type today) keeps its activations and their gradients in
``Precision.activation_dtype`` (bfloat16, or float16); any other network keeps them float32, and only
the 16-bit copies a GEMM or convolution reads are rounded.

A tensor's values are of one ``DType`` (defined here too, as ``DTYPES``): float32 (the default),
bfloat16 or float16, 2 bytes a value for the 16-bit ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UsageError


@dataclass(frozen=True)
class DType:
    """The type of a tensor's values and the facts its storage and exchange formats act on."""

    name: str
    itemsize: int  # bytes a value
    storage: str  # the NumPy dtype of the host's storage: bfloat16 as its uint16 bit patterns (NumPy has none)
    dlpack_code: int  # DLDataTypeCode: kDLFloat (2) or kDLBfloat (4); DLPack's bits are 8·itemsize

    def __str__(self) -> str:
        return self.name

    def __reduce__(self):
        """A copy or pickle of a dtype of the vocabulary is that dtype itself (callers compare with ``is``)."""
        if DTYPES.get(self.name) == self:
            return (get_dtype, (self.name,))
        return (DType, (self.name, self.itemsize, self.storage, self.dlpack_code))

    def __repr__(self) -> str:
        return f"DType({self.name!r})"

    @property
    def half(self) -> bool:
        """Whether the values are 16-bit."""
        return self.itemsize == 2


FLOAT32 = DType("float32", itemsize=4, storage="float32", dlpack_code=2)
BFLOAT16 = DType("bfloat16", itemsize=2, storage="uint16", dlpack_code=4)
FLOAT16 = DType("float16", itemsize=2, storage="float16", dlpack_code=2)
DTYPES = {dtype.name: dtype for dtype in (FLOAT32, BFLOAT16, FLOAT16)}
DTYPE_NAMES = tuple(DTYPES)
DTYPES_BY_STORAGE = {dtype.storage: dtype for dtype in DTYPES.values()}  # the host's NumPy dtype name -> DType


def get_dtype(dtype: "str | DType") -> DType:
    """The dtype called ``dtype`` (float32, bfloat16 or float16), or ``dtype`` itself if a DType."""
    if isinstance(dtype, DType):
        return dtype
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise UsageError(f"invalid tensor dtype {dtype!r}; valid are {', '.join(DTYPE_NAMES)}")
    return DTYPES[dtype]


@dataclass(frozen=True)
class Precision:
    """One math mode and the facts its callers act on."""

    name: str
    operand_dtype: DType | None  # BFLOAT16 / FLOAT16: the 16-bit type GEMM and convolution operands are rounded to
    tensor_cores: bool  # FP32 operands on tensor cores (TF32): the GPU rounds inside the multiply, the host cannot
    loss_scaling: bool  # the loss is scaled on the device (loss_scaling.py): the operand type's range is too small

    def __str__(self) -> str:
        return self.name

    def __reduce__(self):
        """A copy or pickle of a precision of the vocabulary is that precision itself (callers compare with ``is``)."""
        if PRECISIONS.get(self.name) == self:
            return (get_precision, (self.name,))
        return (Precision, (self.name, self.operand_dtype, self.tensor_cores, self.loss_scaling))

    @property
    def half(self) -> bool:
        """Whether GEMM and convolution operands are 16-bit copies of the float32 tensors."""
        return self.operand_dtype is not None

    @property
    def activation_dtype(self) -> DType:
        """The type a network that can store 16 bits keeps its activations and their gradients in: the
        operand type under bf16 and fp16, else float32."""
        return self.operand_dtype or FLOAT32


FP32 = Precision("fp32", operand_dtype=None, tensor_cores=False, loss_scaling=False)
TF32 = Precision("tf32", operand_dtype=None, tensor_cores=True, loss_scaling=False)
BF16 = Precision("bf16", operand_dtype=BFLOAT16, tensor_cores=False, loss_scaling=False)
FP16 = Precision("fp16", operand_dtype=FLOAT16, tensor_cores=False, loss_scaling=True)
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
