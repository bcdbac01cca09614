"""NCCL through ctypes, one thin function per C function, every ncclResult_t checked.

Communicators are ``ncclComm_t`` (``void*``, int here), buffers are device pointers (int), streams
the ``cudaStream_t`` handles (int) the backend queues on. ``ncclUniqueId`` is 128 opaque bytes
that rank 0 makes and every rank passes to ``comm_init_rank``. ctypes rather than nccl4py: the
other libraries are bound this way (one loader, one error style, the call counters), and the
dozen calls needed take only pointers and integers.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, Structure, c_char, c_char_p, c_int, c_size_t, c_void_p

from ....errors import DeviceUnavailableError, NcclError
from . import calls

UNIQUE_ID_BYTES = 128  # NCCL_UNIQUE_ID_BYTES
UINT8, FLOAT32, FLOAT64, BFLOAT16 = 1, 7, 8, 9  # ncclUint8, ncclFloat32, ncclFloat64, ncclBfloat16 (NCCL >= 2.10)
SUM, AVG, MAX = 0, 4, 2  # ncclSum, ncclAvg (NCCL >= 2.10), ncclMax
SUCCESS, IN_PROGRESS = 0, 7  # ncclSuccess, ncclInProgress

RESULT_NAMES = {
    0: "ncclSuccess",
    1: "ncclUnhandledCudaError",
    2: "ncclSystemError",
    3: "ncclInternalError",
    4: "ncclInvalidArgument",
    5: "ncclInvalidUsage",
    6: "ncclRemoteError",
    7: "ncclInProgress",
}


class UniqueId(Structure):
    """ncclUniqueId: ``char internal[128]``, passed by value."""

    _fields_ = [("internal", c_char * UNIQUE_ID_BYTES)]


_P = c_void_p
# C name: argument types (every one returns ncclResult_t)
SIGNATURES = {
    "ncclGetVersion": (POINTER(c_int),),
    "ncclGetUniqueId": (POINTER(UniqueId),),
    "ncclCommInitRank": (POINTER(c_void_p), c_int, UniqueId, c_int),
    "ncclCommFinalize": (_P,),
    "ncclCommDestroy": (_P,),
    "ncclCommAbort": (_P,),
    "ncclCommGetAsyncError": (_P, POINTER(c_int)),
    "ncclAllReduce": (_P, _P, c_size_t, c_int, c_int, _P, _P),
    "ncclBroadcast": (_P, _P, c_size_t, c_int, c_int, _P, _P),
    "ncclAllGather": (_P, _P, c_size_t, c_int, _P, _P),
    "ncclGroupStart": (),
    "ncclGroupEnd": (),
}

_functions: dict[str, ctypes._CFuncPtr] = {}
_error_string = None  # ncclGetErrorString
_last_error = None  # ncclGetLastError (NCCL >= 2.13), where the library has it


def load(library: ctypes.CDLL) -> None:
    """Resolve every symbol once and fix its argtypes/restype."""
    global _error_string, _last_error
    missing = [name for name in (*SIGNATURES, "ncclGetErrorString") if not hasattr(library, name)]
    if missing:
        raise DeviceUnavailableError(f"{library._name} lacks {', '.join(missing)}; it is not an NCCL this backend can use")
    for name, argtypes in SIGNATURES.items():
        function = getattr(library, name)
        function.argtypes, function.restype = argtypes, c_int
        _functions[name] = function
    _error_string = library.ncclGetErrorString
    _error_string.argtypes, _error_string.restype = (c_int,), c_char_p
    if hasattr(library, "ncclGetLastError"):
        _last_error = library.ncclGetLastError
        _last_error.argtypes, _last_error.restype = (c_void_p,), c_char_p


def _call(function: str, *args, comm: int | None = None) -> None:
    calls[function] += 1
    status = _functions[function](*args)
    if status != SUCCESS:
        raise NcclError(function, status, RESULT_NAMES.get(status, f"ncclResult_{status}"), _detail(status, comm))


def _detail(status: int, comm: int | None) -> str:
    """NCCL's own words for the failure: its last error message, else the status's description."""
    if _last_error is not None:
        message = _last_error(comm)
        if message:
            return message.decode(errors="replace")
    return _error_string(status).decode(errors="replace") if _error_string is not None else ""


# ---- library -----------------------------------------------------------------------------------
def get_version() -> int:
    """NCCL_VERSION_CODE: major·10000 + minor·100 + patch (e.g. 22703 for 2.27.3)."""
    version = c_int()
    _call("ncclGetVersion", ctypes.byref(version))
    return version.value


def get_unique_id() -> bytes:
    """A new ncclUniqueId (rank 0 makes it; it names rank 0's bootstrap address)."""
    unique = UniqueId()
    _call("ncclGetUniqueId", ctypes.byref(unique))
    return ctypes.string_at(ctypes.addressof(unique), UNIQUE_ID_BYTES)


# ---- communicator --------------------------------------------------------------------------------
def comm_init_rank(world_size: int, unique_id: bytes, rank: int) -> int:
    """A communicator of ``world_size`` ranks on the current CUDA device; blocks until every rank joined."""
    if len(unique_id) != UNIQUE_ID_BYTES:
        raise ValueError(f"an NCCL unique id has {UNIQUE_ID_BYTES} bytes, got {len(unique_id)}")
    unique = UniqueId.from_buffer_copy(unique_id)
    comm = c_void_p()
    _call("ncclCommInitRank", ctypes.byref(comm), world_size, unique, rank)
    return comm.value


def comm_finalize(comm: int) -> None:
    """Complete every operation queued on ``comm`` and free its network resources (blocking
    communicators: returns when done); ``comm_destroy`` frees the rest."""
    _call("ncclCommFinalize", comm, comm=comm)


def comm_destroy(comm: int) -> None:
    """Free ``comm``'s local resources. NCCL (2.26 and later) waits here until every CUDA graph that
    captured one of its collectives is destroyed: release those graphs first."""
    _call("ncclCommDestroy", comm, comm=comm)


def comm_abort(comm: int) -> None:
    """Stop every operation of ``comm`` (kernels waiting for a lost peer return) and free it."""
    _call("ncclCommAbort", comm, comm=comm)


def comm_get_async_error(comm: int) -> int:
    """The communicator's asynchronous state: ncclSuccess, ncclInProgress or the error it met."""
    state = c_int()
    _call("ncclCommGetAsyncError", comm, ctypes.byref(state), comm=comm)
    return state.value


def result_name(status: int) -> str:
    return RESULT_NAMES.get(status, f"ncclResult_{status}")


# ---- collectives (queued on ``stream``; graph-capturable) ----------------------------------------
def all_reduce(send: int, recv: int, count: int, datatype: int, op: int, comm: int, stream: int) -> None:
    _call("ncclAllReduce", send, recv, count, datatype, op, comm, stream, comm=comm)


def broadcast(send: int, recv: int, count: int, datatype: int, root: int, comm: int, stream: int) -> None:
    _call("ncclBroadcast", send, recv, count, datatype, root, comm, stream, comm=comm)


def all_gather(send: int, recv: int, count: int, datatype: int, comm: int, stream: int) -> None:
    """recv holds every rank's ``count`` values of send, in rank order."""
    _call("ncclAllGather", send, recv, count, datatype, comm, stream, comm=comm)


def group_start() -> None:
    _call("ncclGroupStart")


def group_end() -> None:
    _call("ncclGroupEnd")
