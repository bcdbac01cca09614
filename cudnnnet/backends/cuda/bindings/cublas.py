"""cuBLAS through ctypes, one thin function per C function (the ``_v2`` symbols).

Handles are ``void*`` (int), scalars ``alpha``/``beta`` are pointers: host pointers in
CUBLAS_POINTER_MODE_HOST (``ctypes.byref(c_float)``), device pointers (int) in
CUBLAS_POINTER_MODE_DEVICE.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_int, c_longlong, c_size_t, c_void_p

from ....errors import CublasError, DeviceUnavailableError, OutOfMemoryError
from . import calls

POINTER_MODE_HOST = 0  # CUBLAS_POINTER_MODE_HOST
POINTER_MODE_DEVICE = 1  # CUBLAS_POINTER_MODE_DEVICE
DEFAULT_MATH = 0  # CUBLAS_DEFAULT_MATH
TF32_TENSOR_OP_MATH = 3  # CUBLAS_TF32_TENSOR_OP_MATH
DISALLOW_REDUCED_PRECISION_REDUCTION = 16  # CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION: split-K sums in FP32
R_32F, R_16F, R_16BF = 0, 2, 14  # cudaDataType_t: CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF
COMPUTE_32F = 68  # cublasComputeType_t CUBLAS_COMPUTE_32F: FP32 accumulation
GEMM_DEFAULT = -1  # cublasGemmAlgo_t CUBLAS_GEMM_DEFAULT (tensor cores for 16-bit inputs)

STATUS_NAMES = {
    0: "CUBLAS_STATUS_SUCCESS",
    1: "CUBLAS_STATUS_NOT_INITIALIZED",
    3: "CUBLAS_STATUS_ALLOC_FAILED",
    7: "CUBLAS_STATUS_INVALID_VALUE",
    8: "CUBLAS_STATUS_ARCH_MISMATCH",
    11: "CUBLAS_STATUS_MAPPING_ERROR",
    13: "CUBLAS_STATUS_EXECUTION_FAILED",
    14: "CUBLAS_STATUS_INTERNAL_ERROR",
    15: "CUBLAS_STATUS_NOT_SUPPORTED",
    16: "CUBLAS_STATUS_LICENSE_ERROR",
}
ALLOC_FAILED = 3

_P = c_void_p
# C name: argument types (every one returns cublasStatus_t)
SIGNATURES = {
    "cublasCreate_v2": (POINTER(c_void_p),),
    "cublasDestroy_v2": (_P,),
    "cublasGetVersion_v2": (_P, POINTER(c_int)),
    "cublasSetStream_v2": (_P, _P),
    "cublasSetPointerMode_v2": (_P, c_int),
    "cublasSetMathMode": (_P, c_int),
    "cublasSetWorkspace_v2": (_P, _P, c_size_t),
    "cublasSgemm_v2": (_P, c_int, c_int, c_int, c_int, c_int, _P, _P, c_int, _P, c_int, _P, _P, c_int),
    "cublasSgemmStridedBatched": (_P, c_int, c_int, c_int, c_int, c_int, _P, _P, c_int, c_longlong, _P, c_int,
                                  c_longlong, _P, _P, c_int, c_longlong, c_int),
    "cublasGemmEx": (_P, c_int, c_int, c_int, c_int, c_int, _P, _P, c_int, c_int, _P, c_int, c_int, _P, _P, c_int,
                     c_int, c_int, c_int),
    "cublasGemmStridedBatchedEx": (_P, c_int, c_int, c_int, c_int, c_int, _P, _P, c_int, c_int, c_longlong, _P, c_int,
                                   c_int, c_longlong, _P, _P, c_int, c_int, c_longlong, c_int, c_int, c_int),
    "cublasSgemv_v2": (_P, c_int, c_int, c_int, _P, _P, c_int, _P, c_int, _P, _P, c_int),
    "cublasSgeam": (_P, c_int, c_int, c_int, c_int, _P, _P, c_int, _P, _P, c_int, _P, c_int),
    "cublasSaxpy_v2": (_P, c_int, _P, _P, c_int, _P, c_int),
    "cublasSscal_v2": (_P, c_int, _P, _P, c_int),
    "cublasScopy_v2": (_P, c_int, _P, c_int, _P, c_int),
}

_functions: dict[str, ctypes._CFuncPtr] = {}
_status_name = None  # cublasGetStatusName, where the library has it


def load(library: ctypes.CDLL) -> None:
    """Resolve every symbol once and fix its argtypes/restype."""
    global _status_name
    missing = [name for name in SIGNATURES if not hasattr(library, name)]
    if missing:
        raise DeviceUnavailableError(f"{library._name} lacks {', '.join(missing)}; it is not a cuBLAS this backend can use")
    for name, argtypes in SIGNATURES.items():
        function = getattr(library, name)
        function.argtypes, function.restype = argtypes, c_int
        _functions[name] = function
    if hasattr(library, "cublasGetStatusName"):
        _status_name = library.cublasGetStatusName
        _status_name.argtypes, _status_name.restype = (c_int,), c_char_p


def status_name(status: int) -> str:
    if _status_name is not None:
        calls["cublasGetStatusName"] += 1
        return _status_name(status).decode()
    return STATUS_NAMES.get(status, f"CUBLAS_STATUS_{status}")


def _call(function: str, *args) -> None:
    calls[function] += 1
    status = _functions[function](*args)
    if status != 0:
        if status == ALLOC_FAILED:
            raise OutOfMemoryError(f"{function} failed with CUBLAS_STATUS_ALLOC_FAILED: the GPU is out of memory; try a smaller batch size",
                                   function, "CUBLAS_STATUS_ALLOC_FAILED")
        raise CublasError(function, status, status_name(status))


# ---- handle ----------------------------------------------------------------------------------
def create() -> int:
    handle = c_void_p()
    _call("cublasCreate_v2", ctypes.byref(handle))
    return handle.value


def destroy(handle: int) -> None:
    _call("cublasDestroy_v2", handle)


def get_version(handle: int) -> int:
    version = c_int()
    _call("cublasGetVersion_v2", handle, ctypes.byref(version))
    return version.value


def set_stream(handle: int, stream: int) -> None:
    _call("cublasSetStream_v2", handle, stream)


def set_pointer_mode(handle: int, mode: int) -> None:
    _call("cublasSetPointerMode_v2", handle, mode)


def set_math_mode(handle: int, mode: int) -> None:
    _call("cublasSetMathMode", handle, mode)


def set_workspace(handle: int, workspace: int, nbytes: int) -> None:
    _call("cublasSetWorkspace_v2", handle, workspace, nbytes)


# ---- BLAS ------------------------------------------------------------------------------------
def sgemm(handle, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) -> None:
    """C(m×n) = alpha·op(A)(m×k)·op(B)(k×n) + beta·C."""
    _call("cublasSgemm_v2", handle, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)


def gemm_ex(handle, transa, transb, m, n, k, alpha, a, a_type, lda, b, b_type, ldb, beta, c, c_type, ldc,
            compute_type, algo) -> None:
    """C(m×n) = alpha·op(A)(m×k)·op(B)(k×n) + beta·C with A, B and C of the given cudaDataType_t."""
    _call("cublasGemmEx", handle, transa, transb, m, n, k, alpha, a, a_type, lda, b, b_type, ldb, beta, c, c_type, ldc,
          compute_type, algo)


def gemm_strided_batched_ex(handle, transa, transb, m, n, k, alpha, a, a_type, lda, stride_a, b, b_type, ldb, stride_b,
                            beta, c, c_type, ldc, stride_c, batch, compute_type, algo) -> None:
    """Cᵢ = alpha·op(Aᵢ)·op(Bᵢ) + beta·Cᵢ for i < batch, A, B and C of the given cudaDataType_t, Xᵢ at
    X + i·stride_x elements (a stride of 0 shares one matrix)."""
    _call("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, a, a_type, lda, stride_a, b, b_type,
          ldb, stride_b, beta, c, c_type, ldc, stride_c, batch, compute_type, algo)


def sgemm_strided_batched(handle, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                          stride_c, batch) -> None:
    """Cᵢ = alpha·op(Aᵢ)·op(Bᵢ) + beta·Cᵢ for i < batch, Xᵢ at X + i·stride_x (a stride of 0 shares one matrix)."""
    _call("cublasSgemmStridedBatched", handle, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b,
          beta, c, ldc, stride_c, batch)


def sgeam(handle, transa, transb, m, n, alpha, a, lda, beta, b, ldb, c, ldc) -> None:
    """C(m×n) = alpha·op(A) + beta·op(B); with beta = 0 and op(A) = Aᵀ, a transposed copy of A."""
    _call("cublasSgeam", handle, transa, transb, m, n, alpha, a, lda, beta, b, ldb, c, ldc)


def sgemv(handle, trans, m, n, alpha, a, lda, x, incx, beta, y, incy) -> None:
    """y = alpha·op(A)·x + beta·y, A m×n."""
    _call("cublasSgemv_v2", handle, trans, m, n, alpha, a, lda, x, incx, beta, y, incy)


def saxpy(handle, n, alpha, x, incx, y, incy) -> None:
    """y = alpha·x + y."""
    _call("cublasSaxpy_v2", handle, n, alpha, x, incx, y, incy)


def sscal(handle, n, alpha, x, incx) -> None:
    """x = alpha·x."""
    _call("cublasSscal_v2", handle, n, alpha, x, incx)


def scopy(handle, n, x, incx, y, incy) -> None:
    """y = x."""
    _call("cublasScopy_v2", handle, n, x, incx, y, incy)
