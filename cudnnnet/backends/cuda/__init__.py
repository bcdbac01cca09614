"""The CUDA backend: cuda-python (runtime, driver, NVRTC), cuBLAS and cuDNN through ctypes.

Three tiers, as CuPy has them: ``bindings`` (one checked function per C function), the objects
that own handles, descriptors and memory (``handles``, ``buffer``, ``descriptors``, ``context``,
``kernel``, ``convolution``), and ``CudaBackend``, the call surface of ``base.Backend``.
Importing this package needs nothing beyond NumPy; creating a CudaBackend raises
DeviceUnavailableError, naming what to install, where cuda-python, a library or the GPU is missing.
"""

from .backend import CudaBackend
from .buffer import DeviceBuffer
from .context import CudaContext

__all__ = ["CudaBackend", "CudaContext", "DeviceBuffer"]
