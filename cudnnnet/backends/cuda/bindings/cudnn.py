"""cuDNN (legacy API, cuDNN 8 and 9) through ctypes, one thin function per C function.

Handles and descriptors are ``void*`` (int); ``alpha``/``beta`` are host pointers to float
(``ctypes.byref(c_float)``); tensors are device pointers (int).
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_double, c_float, c_int, c_size_t, c_ulonglong, c_void_p

from ....errors import CudnnError, DeviceUnavailableError, OutOfMemoryError
from . import calls

DATA_FLOAT, DATA_HALF, DATA_BFLOAT16 = 0, 2, 9  # cudnnDataType_t
TENSOR_NCHW = 0  # CUDNN_TENSOR_NCHW
CROSS_CORRELATION = 1  # CUDNN_CROSS_CORRELATION
NOT_PROPAGATE_NAN, PROPAGATE_NAN = 0, 1  # cudnnNanPropagation_t
SOFTMAX_ACCURATE = 1  # CUDNN_SOFTMAX_ACCURATE
SOFTMAX_MODE_CHANNEL = 1  # CUDNN_SOFTMAX_MODE_CHANNEL
DEFAULT_MATH, TENSOR_OP_MATH, TENSOR_OP_MATH_ALLOW_CONVERSION, FMA_MATH = 0, 1, 2, 3  # cudnnMathType_t
NON_DETERMINISTIC, DETERMINISTIC = 0, 1  # cudnnDeterminism_t
STATUS_SUCCESS = 0
STATUS_NOT_SUPPORTED = 3000  # cuDNN 9 (9 in cuDNN 8)
# CUDNN_STATUS_ALLOC_FAILED (cuDNN 8), ..._INTERNAL_ERROR_{HOST,DEVICE}_ALLOCATION_FAILED (cuDNN 9)
ALLOCATION_FAILED = {
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
    "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
}


class AlgoPerf(ctypes.Structure):
    """cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t (the three share this layout)."""

    _fields_ = [
        ("algo", c_int),
        ("status", c_int),
        ("time", c_float),
        ("memory", c_size_t),
        ("determinism", c_int),
        ("mathType", c_int),
        ("reserved", c_int * 3),
    ]


_P = c_void_p
_OUT = POINTER(c_void_p)
_INT = POINTER(c_int)
_SIZE = POINTER(c_size_t)
# C name: argument types (every one returns cudnnStatus_t)
SIGNATURES = {
    "cudnnCreate": (_OUT,),
    "cudnnDestroy": (_P,),
    "cudnnSetStream": (_P, _P),
    "cudnnCreateTensorDescriptor": (_OUT,),
    "cudnnSetTensor4dDescriptor": (_P, c_int, c_int, c_int, c_int, c_int, c_int),
    "cudnnDestroyTensorDescriptor": (_P,),
    "cudnnCreateFilterDescriptor": (_OUT,),
    "cudnnSetFilter4dDescriptor": (_P, c_int, c_int, c_int, c_int, c_int, c_int),
    "cudnnDestroyFilterDescriptor": (_P,),
    "cudnnCreateConvolutionDescriptor": (_OUT,),
    "cudnnSetConvolution2dDescriptor": (_P, c_int, c_int, c_int, c_int, c_int, c_int, c_int, c_int),
    "cudnnSetConvolutionMathType": (_P, c_int),
    "cudnnDestroyConvolutionDescriptor": (_P,),
    "cudnnCreatePoolingDescriptor": (_OUT,),
    "cudnnSetPooling2dDescriptor": (_P, c_int, c_int, c_int, c_int, c_int, c_int, c_int, c_int),
    "cudnnDestroyPoolingDescriptor": (_P,),
    "cudnnCreateActivationDescriptor": (_OUT,),
    "cudnnSetActivationDescriptor": (_P, c_int, c_int, c_double),
    "cudnnDestroyActivationDescriptor": (_P,),
    "cudnnActivationForward": (_P, _P, _P, _P, _P, _P, _P, _P),
    "cudnnActivationBackward": (_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P),
    "cudnnSoftmaxForward": (_P, c_int, c_int, _P, _P, _P, _P, _P, _P),
    "cudnnAddTensor": (_P, _P, _P, _P, _P, _P, _P),
    "cudnnConvolutionForward": (_P, _P, _P, _P, _P, _P, _P, c_int, _P, c_size_t, _P, _P, _P),
    "cudnnConvolutionBackwardData": (_P, _P, _P, _P, _P, _P, _P, c_int, _P, c_size_t, _P, _P, _P),
    "cudnnConvolutionBackwardFilter": (_P, _P, _P, _P, _P, _P, _P, c_int, _P, c_size_t, _P, _P, _P),
    "cudnnConvolutionBackwardBias": (_P, _P, _P, _P, _P, _P, _P),
    "cudnnGetConvolutionForwardAlgorithmMaxCount": (_P, _INT),
    "cudnnGetConvolutionBackwardDataAlgorithmMaxCount": (_P, _INT),
    "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount": (_P, _INT),
    "cudnnGetConvolutionForwardAlgorithm_v7": (_P, _P, _P, _P, _P, c_int, _INT, _P),
    "cudnnGetConvolutionBackwardDataAlgorithm_v7": (_P, _P, _P, _P, _P, c_int, _INT, _P),
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7": (_P, _P, _P, _P, _P, c_int, _INT, _P),
    "cudnnFindConvolutionForwardAlgorithm": (_P, _P, _P, _P, _P, c_int, _INT, _P),
    "cudnnFindConvolutionBackwardDataAlgorithm": (_P, _P, _P, _P, _P, c_int, _INT, _P),
    "cudnnFindConvolutionBackwardFilterAlgorithm": (_P, _P, _P, _P, _P, c_int, _INT, _P),
    "cudnnGetConvolutionForwardWorkspaceSize": (_P, _P, _P, _P, _P, c_int, _SIZE),
    "cudnnGetConvolutionBackwardDataWorkspaceSize": (_P, _P, _P, _P, _P, c_int, _SIZE),
    "cudnnGetConvolutionBackwardFilterWorkspaceSize": (_P, _P, _P, _P, _P, c_int, _SIZE),
    "cudnnPoolingForward": (_P, _P, _P, _P, _P, _P, _P, _P),
    "cudnnPoolingBackward": (_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P),
    # dropout and batch normalisation (issue 18)
    "cudnnCreateDropoutDescriptor": (_OUT,),
    "cudnnDestroyDropoutDescriptor": (_P,),
    "cudnnDropoutGetStatesSize": (_P, _SIZE),
    "cudnnDropoutGetReserveSpaceSize": (_P, _SIZE),
    "cudnnSetDropoutDescriptor": (_P, _P, c_float, _P, c_size_t, c_ulonglong),
    "cudnnDropoutForward": (_P, _P, _P, _P, _P, _P, _P, c_size_t),
    "cudnnDropoutBackward": (_P, _P, _P, _P, _P, _P, _P, c_size_t),
    "cudnnBatchNormalizationForwardTraining": (_P, c_int, _P, _P, _P, _P, _P, _P, _P, _P, _P, c_double, _P, _P,
                                               c_double, _P, _P),
    "cudnnBatchNormalizationForwardInference": (_P, c_int, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, c_double),
    "cudnnBatchNormalizationBackward": (_P, c_int, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, c_double,
                                        _P, _P),
}

_functions: dict[str, ctypes._CFuncPtr] = {}
_get_version = None  # cudnnGetVersion (returns size_t, no status)
_get_error_string = None  # cudnnGetErrorString (returns const char*)


def load(library: ctypes.CDLL) -> None:
    """Resolve every symbol once and fix its argtypes/restype."""
    global _get_version, _get_error_string
    missing = [name for name in SIGNATURES if not hasattr(library, name)]
    if missing:
        raise DeviceUnavailableError(f"{library._name} lacks {', '.join(missing)}; it is not a cuDNN this backend can use")
    for name, argtypes in SIGNATURES.items():
        function = getattr(library, name)
        function.argtypes, function.restype = argtypes, c_int
        _functions[name] = function
    _get_version = _symbol(library, "cudnnGetVersion")
    _get_version.argtypes, _get_version.restype = (), c_size_t
    _get_error_string = _symbol(library, "cudnnGetErrorString")
    _get_error_string.argtypes, _get_error_string.restype = (c_int,), c_char_p


def _symbol(library: ctypes.CDLL, name: str):
    try:
        return getattr(library, name)
    except AttributeError:
        raise DeviceUnavailableError(f"{library._name} lacks {name}; it is not a cuDNN this backend can use") from None


def _call(function: str, *args) -> None:
    calls[function] += 1
    status = _functions[function](*args)
    if status != STATUS_SUCCESS:
        name = get_error_string(status)
        if name in ALLOCATION_FAILED:
            raise OutOfMemoryError(f"{function} failed with {name}: the GPU is out of memory; try a smaller batch size",
                                   function, name)
        raise CudnnError(function, status, name)


def _new_handle(function: str) -> int:
    handle = c_void_p()
    _call(function, ctypes.byref(handle))
    return handle.value


def _out_int(function: str, *args) -> int:
    value = c_int()
    _call(function, *args, ctypes.byref(value))
    return value.value


def _out_size(function: str, *args) -> int:
    value = c_size_t()
    _call(function, *args, ctypes.byref(value))
    return value.value


# ---- library ---------------------------------------------------------------------------------
def get_version() -> int:
    """cudnnGetVersion: 10000·major + 100·minor + patch (cuDNN 9)."""
    calls["cudnnGetVersion"] += 1
    return int(_get_version())


def get_error_string(status: int) -> str:
    calls["cudnnGetErrorString"] += 1
    return _get_error_string(status).decode()


def create() -> int:
    return _new_handle("cudnnCreate")


def destroy(handle: int) -> None:
    _call("cudnnDestroy", handle)


def set_stream(handle: int, stream: int) -> None:
    _call("cudnnSetStream", handle, stream)


# ---- descriptors -----------------------------------------------------------------------------
def create_tensor_descriptor() -> int:
    return _new_handle("cudnnCreateTensorDescriptor")


def set_tensor_4d_descriptor(desc, layout, data_type, n, c, h, w) -> None:
    _call("cudnnSetTensor4dDescriptor", desc, layout, data_type, n, c, h, w)


def destroy_tensor_descriptor(desc) -> None:
    _call("cudnnDestroyTensorDescriptor", desc)


def create_filter_descriptor() -> int:
    return _new_handle("cudnnCreateFilterDescriptor")


def set_filter_4d_descriptor(desc, data_type, layout, k, c, r, s) -> None:
    _call("cudnnSetFilter4dDescriptor", desc, data_type, layout, k, c, r, s)


def destroy_filter_descriptor(desc) -> None:
    _call("cudnnDestroyFilterDescriptor", desc)


def create_convolution_descriptor() -> int:
    return _new_handle("cudnnCreateConvolutionDescriptor")


def set_convolution_2d_descriptor(desc, pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w, mode, compute_type) -> None:
    _call("cudnnSetConvolution2dDescriptor", desc, pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w, mode, compute_type)


def set_convolution_math_type(desc, math_type: int) -> None:
    _call("cudnnSetConvolutionMathType", desc, math_type)


def destroy_convolution_descriptor(desc) -> None:
    _call("cudnnDestroyConvolutionDescriptor", desc)


def create_pooling_descriptor() -> int:
    return _new_handle("cudnnCreatePoolingDescriptor")


def set_pooling_2d_descriptor(desc, mode, nan_option, window_h, window_w, pad_h, pad_w, stride_h, stride_w) -> None:
    _call("cudnnSetPooling2dDescriptor", desc, mode, nan_option, window_h, window_w, pad_h, pad_w, stride_h, stride_w)


def destroy_pooling_descriptor(desc) -> None:
    _call("cudnnDestroyPoolingDescriptor", desc)


def create_activation_descriptor() -> int:
    return _new_handle("cudnnCreateActivationDescriptor")


def set_activation_descriptor(desc, mode, nan_option, coef: float) -> None:
    _call("cudnnSetActivationDescriptor", desc, mode, nan_option, coef)


def destroy_activation_descriptor(desc) -> None:
    _call("cudnnDestroyActivationDescriptor", desc)


# ---- pointwise, softmax, pooling -------------------------------------------------------------
def activation_forward(handle, act, alpha, x_desc, x, beta, y_desc, y) -> None:
    """y = alpha·f(x) + beta·y."""
    _call("cudnnActivationForward", handle, act, alpha, x_desc, x, beta, y_desc, y)


def activation_backward(handle, act, alpha, y_desc, y, dy_desc, dy, x_desc, x, beta, dx_desc, dx) -> None:
    """dx = alpha·f'(x)·dy + beta·dx."""
    _call("cudnnActivationBackward", handle, act, alpha, y_desc, y, dy_desc, dy, x_desc, x, beta, dx_desc, dx)


def softmax_forward(handle, algorithm, mode, alpha, x_desc, x, beta, y_desc, y) -> None:
    """y = alpha·softmax(x) + beta·y."""
    _call("cudnnSoftmaxForward", handle, algorithm, mode, alpha, x_desc, x, beta, y_desc, y)


def add_tensor(handle, alpha, a_desc, a, beta, c_desc, c) -> None:
    """C = alpha·A + beta·C, A broadcast."""
    _call("cudnnAddTensor", handle, alpha, a_desc, a, beta, c_desc, c)


def pooling_forward(handle, pool, alpha, x_desc, x, beta, y_desc, y) -> None:
    _call("cudnnPoolingForward", handle, pool, alpha, x_desc, x, beta, y_desc, y)


def pooling_backward(handle, pool, alpha, y_desc, y, dy_desc, dy, x_desc, x, beta, dx_desc, dx) -> None:
    _call("cudnnPoolingBackward", handle, pool, alpha, y_desc, y, dy_desc, dy, x_desc, x, beta, dx_desc, dx)


# ---- convolution -----------------------------------------------------------------------------
def convolution_forward(handle, alpha, x_desc, x, w_desc, w, conv, algo, workspace, workspace_bytes, beta, y_desc, y) -> None:
    """y = alpha·(x ⋆ w) + beta·y."""
    _call("cudnnConvolutionForward", handle, alpha, x_desc, x, w_desc, w, conv, algo, workspace, workspace_bytes, beta, y_desc, y)


def convolution_backward_data(handle, alpha, w_desc, w, dy_desc, dy, conv, algo, workspace, workspace_bytes, beta, dx_desc, dx) -> None:
    """dx = alpha·(dy ⋆ᵀ w) + beta·dx."""
    _call("cudnnConvolutionBackwardData", handle, alpha, w_desc, w, dy_desc, dy, conv, algo, workspace, workspace_bytes, beta, dx_desc, dx)


def convolution_backward_filter(handle, alpha, x_desc, x, dy_desc, dy, conv, algo, workspace, workspace_bytes, beta, dw_desc, dw) -> None:
    """dw = alpha·Σₙ xₙ ⋆ dyₙ + beta·dw."""
    _call("cudnnConvolutionBackwardFilter", handle, alpha, x_desc, x, dy_desc, dy, conv, algo, workspace, workspace_bytes, beta, dw_desc, dw)


def convolution_backward_bias(handle, alpha, dy_desc, dy, beta, db_desc, db) -> None:
    """db = alpha·Σ_{n,h,w} dy + beta·db."""
    _call("cudnnConvolutionBackwardBias", handle, alpha, dy_desc, dy, beta, db_desc, db)


def get_convolution_forward_algorithm_max_count(handle) -> int:
    return _out_int("cudnnGetConvolutionForwardAlgorithmMaxCount", handle)


def get_convolution_backward_data_algorithm_max_count(handle) -> int:
    return _out_int("cudnnGetConvolutionBackwardDataAlgorithmMaxCount", handle)


def get_convolution_backward_filter_algorithm_max_count(handle) -> int:
    return _out_int("cudnnGetConvolutionBackwardFilterAlgorithmMaxCount", handle)


def get_convolution_forward_algorithm_v7(handle, x_desc, w_desc, conv, y_desc, requested, results) -> int:
    """Heuristic ranking of forward algorithms into ``results`` (AlgoPerf[requested]); returns the count."""
    return _out_int_before_results("cudnnGetConvolutionForwardAlgorithm_v7", handle, x_desc, w_desc, conv, y_desc, requested, results)


def get_convolution_backward_data_algorithm_v7(handle, w_desc, dy_desc, conv, dx_desc, requested, results) -> int:
    return _out_int_before_results("cudnnGetConvolutionBackwardDataAlgorithm_v7", handle, w_desc, dy_desc, conv, dx_desc, requested, results)


def get_convolution_backward_filter_algorithm_v7(handle, x_desc, dy_desc, conv, dw_desc, requested, results) -> int:
    return _out_int_before_results("cudnnGetConvolutionBackwardFilterAlgorithm_v7", handle, x_desc, dy_desc, conv, dw_desc, requested, results)


def find_convolution_forward_algorithm(handle, x_desc, w_desc, conv, y_desc, requested, results) -> int:
    """Benchmark forward algorithms (cuDNN allocates its own scratch memory); returns the count."""
    return _out_int_before_results("cudnnFindConvolutionForwardAlgorithm", handle, x_desc, w_desc, conv, y_desc, requested, results)


def find_convolution_backward_data_algorithm(handle, w_desc, dy_desc, conv, dx_desc, requested, results) -> int:
    return _out_int_before_results("cudnnFindConvolutionBackwardDataAlgorithm", handle, w_desc, dy_desc, conv, dx_desc, requested, results)


def find_convolution_backward_filter_algorithm(handle, x_desc, dy_desc, conv, dw_desc, requested, results) -> int:
    return _out_int_before_results("cudnnFindConvolutionBackwardFilterAlgorithm", handle, x_desc, dy_desc, conv, dw_desc, requested, results)


def _out_int_before_results(function: str, *args) -> int:
    """Calls of the form f(..., requested, int* returned, perf* results): returns ``returned``."""
    *leading, results = args
    returned = c_int()
    _call(function, *leading, ctypes.byref(returned), results)
    return returned.value


def get_convolution_forward_workspace_size(handle, x_desc, w_desc, conv, y_desc, algo) -> int:
    return _out_size("cudnnGetConvolutionForwardWorkspaceSize", handle, x_desc, w_desc, conv, y_desc, algo)


def get_convolution_backward_data_workspace_size(handle, w_desc, dy_desc, conv, dx_desc, algo) -> int:
    return _out_size("cudnnGetConvolutionBackwardDataWorkspaceSize", handle, w_desc, dy_desc, conv, dx_desc, algo)


def get_convolution_backward_filter_workspace_size(handle, x_desc, dy_desc, conv, dw_desc, algo) -> int:
    return _out_size("cudnnGetConvolutionBackwardFilterWorkspaceSize", handle, x_desc, dy_desc, conv, dw_desc, algo)


# ---- dropout (issue 18) ----------------------------------------------------------------------
def create_dropout_descriptor() -> int:
    return _new_handle("cudnnCreateDropoutDescriptor")


def destroy_dropout_descriptor(desc) -> None:
    _call("cudnnDestroyDropoutDescriptor", desc)


def dropout_get_states_size(handle) -> int:
    """Bytes of the random-number states cudnnSetDropoutDescriptor initialises."""
    return _out_size("cudnnDropoutGetStatesSize", handle)


def dropout_get_reserve_space_size(x_desc) -> int:
    """Bytes the forward pass keeps its mask in, for the backward pass, for inputs of ``x_desc``."""
    return _out_size("cudnnDropoutGetReserveSpaceSize", x_desc)


def set_dropout_descriptor(desc, handle, dropout: float, states, states_bytes: int, seed: int) -> None:
    """Set the rate and initialise ``states`` from ``seed`` (a kernel on the handle's stream)."""
    _call("cudnnSetDropoutDescriptor", desc, handle, dropout, states, states_bytes, seed)


def dropout_forward(handle, desc, x_desc, x, y_desc, y, reserve, reserve_bytes) -> None:
    """y = x·mask/(1 - dropout), the mask drawn from the states and kept in ``reserve``."""
    _call("cudnnDropoutForward", handle, desc, x_desc, x, y_desc, y, reserve, reserve_bytes)


def dropout_backward(handle, desc, dy_desc, dy, dx_desc, dx, reserve, reserve_bytes) -> None:
    """dx = dy·mask/(1 - dropout), the mask in ``reserve``."""
    _call("cudnnDropoutBackward", handle, desc, dy_desc, dy, dx_desc, dx, reserve, reserve_bytes)


# ---- batch normalisation (issue 18) ----------------------------------------------------------
def batch_normalization_forward_training(handle, mode, alpha, beta, x_desc, x, y_desc, y, param_desc, scale, bias,
                                         factor, running_mean, running_var, eps, save_mean, save_inv_var) -> None:
    """y = scale·(x - μ)/√(σ² + eps) + bias with the batch's μ, σ²; running averages updated."""
    _call("cudnnBatchNormalizationForwardTraining", handle, mode, alpha, beta, x_desc, x, y_desc, y, param_desc, scale,
          bias, factor, running_mean, running_var, eps, save_mean, save_inv_var)


def batch_normalization_forward_inference(handle, mode, alpha, beta, x_desc, x, y_desc, y, param_desc, scale, bias,
                                          mean, var, eps) -> None:
    """y = scale·(x - mean)/√(var + eps) + bias."""
    _call("cudnnBatchNormalizationForwardInference", handle, mode, alpha, beta, x_desc, x, y_desc, y, param_desc,
          scale, bias, mean, var, eps)


def batch_normalization_backward(handle, mode, alpha_data, beta_data, alpha_param, beta_param, x_desc, x, dy_desc, dy,
                                 dx_desc, dx, param_desc, scale, dscale, dbias, eps, save_mean, save_inv_var) -> None:
    """dx, dscale, dbias from the saved batch statistics."""
    _call("cudnnBatchNormalizationBackward", handle, mode, alpha_data, beta_data, alpha_param, beta_param, x_desc, x,
          dy_desc, dy, dx_desc, dx, param_desc, scale, dscale, dbias, eps, save_mean, save_inv_var)
