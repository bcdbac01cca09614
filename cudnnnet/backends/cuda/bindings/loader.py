"""Finding cuda-python and the NVIDIA libraries. Whatever is missing becomes one
DeviceUnavailableError line that names the pip package to install."""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import os

from ....errors import DeviceUnavailableError

log = logging.getLogger(__name__)

# library: (wheel for CUDA 13, wheel for CUDA 12), as the extras in pyproject.toml pin them
WHEELS = {
    "cuda-bindings": ("cuda-bindings>=13,<14", "cuda-bindings>=12.8,<13"),
    "cublas": ("nvidia-cublas>=13,<14", "nvidia-cublas-cu12<13"),
    "cublasLt": ("nvidia-cublas>=13,<14", "nvidia-cublas-cu12<13"),
    "cudnn": ("nvidia-cudnn-cu13>=9,<10", "nvidia-cudnn-cu12>=9,<10"),
    "nvrtc": ("nvidia-cuda-nvrtc>=13,<14", "nvidia-cuda-nvrtc-cu12<13"),
    "nccl": ("nvidia-nccl-cu13>=2.27,<3", "nvidia-nccl-cu12>=2.19,<3"),
}
CUDNN_IN_WHEEL = os.path.join("lib", "libcudnn.so.9")  # under nvidia/cudnn in both cuDNN 9 wheels
# library: (package, file inside it) where a cuda.pathfinder that does not know the name can still find it
IN_WHEEL = {"cudnn": ("nvidia.cudnn", CUDNN_IN_WHEEL), "nccl": ("nvidia.nccl", os.path.join("lib", "libnccl.so.2"))}


def install_hint(library: str | None = None, cuda_major: int | None = None) -> str:
    """What to install: the project's CUDA extra for the CUDA major version in use (13 if unknown),
    from the repository checkout (the package is not on PyPI), or ``library``'s wheel alone."""
    if cuda_major == 12:
        extra = 'pip install -e ".[cuda12]" from the repository checkout'
    else:
        extra = 'pip install -e ".[cuda13]" from the repository checkout (".[cuda12]" for a CUDA 12 driver)'
    if library is None:
        return extra
    wheel13, wheel12 = WHEELS[library]
    return f'{extra}, or pip install "{wheel12 if cuda_major == 12 else wheel13}"'


@functools.cache
def cuda_python():
    """(runtime, driver, nvrtc): cuda.bindings (cuda-python >= 12.6) or the cuda-python 12 names."""
    try:
        from cuda.bindings import driver, nvrtc, runtime
    except ImportError:
        try:
            from cuda import cuda as driver
            from cuda import cudart as runtime
            from cuda import nvrtc
        except ImportError as error:
            raise DeviceUnavailableError(
                f"the CUDA backend needs cuda-python, which is not installed ({error}); {install_hint('cuda-bindings')}"
            ) from None
    return runtime, driver, nvrtc


def load_library(name: str, cuda_major: int | None) -> ctypes.CDLL:
    """The NVIDIA library ``name`` ("cublas", "cublasLt", "cudnn" or "nccl"), found by cuda.pathfinder."""
    try:
        import cuda.pathfinder as pathfinder
    except ImportError:
        raise DeviceUnavailableError(
            f"the CUDA backend needs cuda-pathfinder to find {name}; pip install cuda-pathfinder "
            f"or {install_hint(name, cuda_major)}"
        ) from None
    try:
        loaded = pathfinder.load_nvidia_dynamic_lib(name)
    except Exception as error:  # unknown name (older pathfinder) or not found
        if name in IN_WHEEL:
            return _from_wheel(name, cuda_major, error)
        raise DeviceUnavailableError(f"lib{name} was not found ({_first_line(error)}); {install_hint(name, cuda_major)}") from None
    log.info("loaded %s from %s", name, loaded.abs_path)
    return _open(loaded.abs_path or f"lib{name}", name, cuda_major, None if loaded.abs_path else loaded._handle_uint)


def _open(path: str, name: str, cuda_major: int | None, handle: int | None = None) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(path, handle=handle)
    except OSError as error:  # found, but it or one of its dependencies cannot be loaded
        raise DeviceUnavailableError(f"{path} cannot be loaded ({error}); {install_hint(name, cuda_major)}") from None


def _from_wheel(name: str, cuda_major: int | None, pathfinder_error: Exception) -> ctypes.CDLL:
    """``name``'s library inside its installed wheel's package (nvidia.cudnn: nvidia-cudnn-cu12 or
    -cu13; nvidia.nccl: nvidia-nccl-cu12 or -cu13)."""
    package, relative = IN_WHEEL[name]
    try:
        spec = importlib.util.find_spec(package)
    except ImportError:
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, relative)
        if os.path.exists(path):
            log.info("loaded %s from %s", name, path)
            return _open(path, name, cuda_major)
    raise DeviceUnavailableError(
        f"{os.path.basename(relative)} was not found ({_first_line(pathfinder_error)}); {install_hint(name, cuda_major)}"
    )


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
