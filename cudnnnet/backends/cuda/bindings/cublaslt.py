"""cuBLASLt through ctypes: the matmul API whose algorithms can be listed, timed and chosen.

Handles and descriptors are ``void*`` (int). An algorithm (``cublasLtMatmulAlgo_t``) is 64 opaque
bytes that the heuristic fills in and ``cublasLtMatmul`` reads; it stays valid for the library
version and device that produced it. Scalars ``alpha``/``beta`` are host pointers
(CUBLASLT_POINTER_MODE_HOST, the default). Statuses are cuBLAS statuses (``cublas.status_name``).
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, Structure, c_float, c_int, c_int32, c_int64, c_size_t, c_uint32, c_uint64, c_void_p

from ....errors import CublasError, DeviceUnavailableError, OutOfMemoryError
from . import calls, cublas

CUDA_R_32F = 0  # cudaDataType_t
COMPUTE_32F = 68  # cublasComputeType_t: exact FP32 (FFMA)
COMPUTE_32F_FAST_TF32 = 77  # FP32 in and out, TF32 tensor cores inside

# cublasLtMatmulDescAttributes_t
DESC_TRANSA = 3
DESC_TRANSB = 4
DESC_EPILOGUE = 7  # cublasLtEpilogue_t (uint32)
DESC_BIAS_POINTER = 8  # the epilogue's bias vector, one value per row of D (a device pointer)
DESC_BIAS_DATA_TYPE = 26  # cudaDataType_t of the bias (int32); a 16-bit D takes a bias of its own type only
# cublasLtEpilogue_t
EPILOGUE_BIAS = 4  # D = alpha·op(A)·op(B) + beta·C + bias·1ᵀ
EPILOGUE_RELU_BIAS = 6  # D = max(0, alpha·op(A)·op(B) + beta·C + bias·1ᵀ)
# cublasLtMatrixLayoutAttribute_t
LAYOUT_BATCH_COUNT = 5
LAYOUT_STRIDED_BATCH_OFFSET = 6
# cublasLtMatmulPreferenceAttributes_t
PREF_MAX_WORKSPACE_BYTES = 1
PREF_REDUCTION_SCHEME_MASK = 3
REDUCTION_SCHEMES_IN_COMPUTE_TYPE = 0x3  # INPLACE | COMPUTE_TYPE: never a split-K sum in a 16-bit output type
PREF_MIN_ALIGNMENT = (5, 6, 7, 8)  # of A, B, C and D, in bytes


class MatmulAlgo(Structure):
    """cublasLtMatmulAlgo_t: opaque, trivially copyable."""

    _fields_ = [("data", c_uint64 * 8)]


class HeuristicResult(Structure):
    """cublasLtMatmulHeuristicResult_t."""

    _fields_ = [("algo", MatmulAlgo), ("workspace_size", c_size_t), ("state", c_int), ("waves_count", c_float),
                ("reserved", c_int * 4)]


_P = c_void_p
# C name: argument types (every one returns cublasStatus_t)
SIGNATURES = {
    "cublasLtCreate": (POINTER(c_void_p),),
    "cublasLtDestroy": (_P,),
    "cublasLtMatmulDescCreate": (POINTER(c_void_p), c_int, c_int),
    "cublasLtMatmulDescDestroy": (_P,),
    "cublasLtMatmulDescSetAttribute": (_P, c_int, _P, c_size_t),
    "cublasLtMatrixLayoutCreate": (POINTER(c_void_p), c_int, c_uint64, c_uint64, c_int64),
    "cublasLtMatrixLayoutDestroy": (_P,),
    "cublasLtMatrixLayoutSetAttribute": (_P, c_int, _P, c_size_t),
    "cublasLtMatmulPreferenceCreate": (POINTER(c_void_p),),
    "cublasLtMatmulPreferenceDestroy": (_P,),
    "cublasLtMatmulPreferenceSetAttribute": (_P, c_int, _P, c_size_t),
    "cublasLtMatmulAlgoGetHeuristic": (_P, _P, _P, _P, _P, _P, _P, c_int, POINTER(HeuristicResult), POINTER(c_int)),
    "cublasLtMatmul": (_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, POINTER(MatmulAlgo), _P, c_size_t, _P),
}

_functions: dict[str, ctypes._CFuncPtr] = {}
_version = None  # cublasLtGetVersion


def load(library: ctypes.CDLL) -> None:
    """Resolve every symbol once and fix its argtypes/restype."""
    global _version
    missing = [name for name in (*SIGNATURES, "cublasLtGetVersion") if not hasattr(library, name)]
    if missing:
        raise DeviceUnavailableError(f"{library._name} lacks {', '.join(missing)}; it is not a cuBLASLt this backend can use")
    for name, argtypes in SIGNATURES.items():
        function = getattr(library, name)
        function.argtypes, function.restype = argtypes, c_int
        _functions[name] = function
    _version = library.cublasLtGetVersion
    _version.argtypes, _version.restype = (), c_size_t


def _call(function: str, *args) -> None:
    calls[function] += 1
    status = _functions[function](*args)
    if status != 0:
        if status == cublas.ALLOC_FAILED:
            raise OutOfMemoryError(f"{function} failed with CUBLAS_STATUS_ALLOC_FAILED: the GPU is out of memory; try a smaller batch size",
                                   function, "CUBLAS_STATUS_ALLOC_FAILED")
        raise CublasError(function, status, cublas.status_name(status))


def get_version() -> int:
    calls["cublasLtGetVersion"] += 1
    return int(_version())


# ---- handle and descriptors ------------------------------------------------------------------
def create() -> int:
    handle = c_void_p()
    _call("cublasLtCreate", ctypes.byref(handle))
    return handle.value


def destroy(handle: int) -> None:
    _call("cublasLtDestroy", handle)


def matmul_desc_create(compute_type: int, scale_type: int = CUDA_R_32F) -> int:
    desc = c_void_p()
    _call("cublasLtMatmulDescCreate", ctypes.byref(desc), compute_type, scale_type)
    return desc.value


def matmul_desc_destroy(desc: int) -> None:
    _call("cublasLtMatmulDescDestroy", desc)


def matmul_desc_set_int32(desc: int, attribute: int, value: int) -> None:
    buffer = c_int32(value)
    _call("cublasLtMatmulDescSetAttribute", desc, attribute, ctypes.byref(buffer), ctypes.sizeof(buffer))


def matmul_desc_set_uint32(desc: int, attribute: int, value: int) -> None:
    buffer = c_uint32(value)
    _call("cublasLtMatmulDescSetAttribute", desc, attribute, ctypes.byref(buffer), ctypes.sizeof(buffer))


def matmul_desc_set_pointer(desc: int, attribute: int, pointer: int) -> None:
    """A device-pointer attribute (the bias vector's address)."""
    buffer = c_void_p(pointer)
    _call("cublasLtMatmulDescSetAttribute", desc, attribute, ctypes.byref(buffer), ctypes.sizeof(buffer))


def matrix_layout_create(rows: int, cols: int, ld: int, data_type: int = CUDA_R_32F) -> int:
    """A column-major rows × cols matrix with leading dimension ``ld``."""
    layout = c_void_p()
    _call("cublasLtMatrixLayoutCreate", ctypes.byref(layout), data_type, rows, cols, ld)
    return layout.value


def matrix_layout_destroy(layout: int) -> None:
    _call("cublasLtMatrixLayoutDestroy", layout)


def matrix_layout_set_batch(layout: int, count: int, stride: int) -> None:
    """``count`` matrices, the i-th at ``i·stride`` elements (a stride of 0 shares one matrix)."""
    count_buffer, stride_buffer = c_int32(count), c_int64(stride)
    _call("cublasLtMatrixLayoutSetAttribute", layout, LAYOUT_BATCH_COUNT, ctypes.byref(count_buffer),
          ctypes.sizeof(count_buffer))
    _call("cublasLtMatrixLayoutSetAttribute", layout, LAYOUT_STRIDED_BATCH_OFFSET, ctypes.byref(stride_buffer),
          ctypes.sizeof(stride_buffer))


def preference_create(max_workspace_bytes: int) -> int:
    preference = c_void_p()
    _call("cublasLtMatmulPreferenceCreate", ctypes.byref(preference))
    buffer = c_uint64(max_workspace_bytes)
    _call("cublasLtMatmulPreferenceSetAttribute", preference.value, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(buffer),
          ctypes.sizeof(buffer))
    return preference.value


def preference_set_uint32(preference: int, attribute: int, value: int) -> None:
    buffer = c_uint32(value)
    _call("cublasLtMatmulPreferenceSetAttribute", preference, attribute, ctypes.byref(buffer), ctypes.sizeof(buffer))


def preference_destroy(preference: int) -> None:
    _call("cublasLtMatmulPreferenceDestroy", preference)


# ---- algorithms and the matmul ---------------------------------------------------------------
def algo_get_heuristic(handle, desc, a_layout, b_layout, c_layout, d_layout, preference,
                       requested: int) -> list[HeuristicResult]:
    """Up to ``requested`` algorithms for this matmul, in cuBLASLt's estimated order, fastest
    first; only those whose state is CUBLAS_STATUS_SUCCESS."""
    results = (HeuristicResult * requested)()
    returned = c_int()
    _call("cublasLtMatmulAlgoGetHeuristic", handle, desc, a_layout, b_layout, c_layout, d_layout, preference,
          requested, results, ctypes.byref(returned))
    return [results[i] for i in range(returned.value) if results[i].state == 0]


def matmul(handle, desc, alpha, a, a_layout, b, b_layout, beta, c, c_layout, d, d_layout, algo: MatmulAlgo,
           workspace: int, workspace_bytes: int, stream: int) -> None:
    """D = alpha·op(A)·op(B) + beta·C with the chosen algorithm (C and D may be the same matrix)."""
    _call("cublasLtMatmul", handle, desc, alpha, a, a_layout, b, b_layout, beta, c, c_layout, d, d_layout,
          ctypes.byref(algo), workspace, workspace_bytes, stream)
