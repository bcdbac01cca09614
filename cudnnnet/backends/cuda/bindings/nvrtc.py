"""NVRTC calls through cuda-python, one thin function per C function."""

from __future__ import annotations

from ....errors import DeviceUnavailableError, NvrtcError
from . import calls
from .loader import cuda_python, install_hint

_nvrtc = None  # cuda-python's nvrtc module, bound by load()


def load(cuda_major: int | None) -> None:
    """Import cuda-python's nvrtc and make sure libnvrtc itself can be loaded."""
    global _nvrtc
    _, _, _nvrtc = cuda_python()
    try:
        _nvrtc.nvrtcVersion()
    except Exception as error:  # cuda-python raises when it cannot find libnvrtc
        _nvrtc = None
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DeviceUnavailableError(f"NVRTC was not found ({message}); {install_hint('nvrtc', cuda_major)}") from None


def _check(function: str, result):
    calls[function] += 1
    status = result[0]
    if status != 0:
        raise NvrtcError(function, int(status), getattr(status, "name", str(status)))
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def _writable_bytes(size: int) -> bytes:
    """A fresh zeroed bytes object for cuda-python to write into (never a shared cached one)."""
    return bytes(size + 2)


def version() -> tuple[int, int]:
    return _check("nvrtcVersion", _nvrtc.nvrtcVersion())


def create_program(source: bytes, name: bytes):
    return _check("nvrtcCreateProgram", _nvrtc.nvrtcCreateProgram(source, name, 0, [], []))


def compile_program(program, options: list[bytes]) -> None:
    _check("nvrtcCompileProgram", _nvrtc.nvrtcCompileProgram(program, len(options), options))


def get_program_log_size(program) -> int:
    return _check("nvrtcGetProgramLogSize", _nvrtc.nvrtcGetProgramLogSize(program))


def get_program_log(program, size: int) -> bytes:
    log = _writable_bytes(size)
    _check("nvrtcGetProgramLog", _nvrtc.nvrtcGetProgramLog(program, log))
    return log[:size]


def get_cubin_size(program) -> int:
    return _check("nvrtcGetCUBINSize", _nvrtc.nvrtcGetCUBINSize(program))


def get_cubin(program, size: int) -> bytes:
    cubin = _writable_bytes(size)
    _check("nvrtcGetCUBIN", _nvrtc.nvrtcGetCUBIN(program, cubin))
    return cubin[:size]


def destroy_program(program) -> None:
    _check("nvrtcDestroyProgram", _nvrtc.nvrtcDestroyProgram(program))
