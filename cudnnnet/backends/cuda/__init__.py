"""The CUDA backend: cuda-python (runtime, driver, NVRTC), cuBLAS and cuDNN through ctypes.

Three tiers, as CuPy has them: ``bindings`` (one checked function per C function), the objects
that own handles, descriptors and memory (``handles``, ``buffer``, ``descriptors``, ``context``,
``kernel``, ``convolution``), and ``CudaBackend``, the call surface of ``base.Backend``.
Importing this package needs nothing beyond NumPy; creating a CudaBackend raises
DeviceUnavailableError, naming what to install, where cuda-python, a library or the GPU is missing.
The three names below are imported on first use, so that ``startup`` can be imported alone, with
no NumPy.
"""

from ...util.lazy import lazy_exports

__all__ = ["CudaBackend", "CudaContext", "DeviceBuffer"]

__getattr__, __dir__ = lazy_exports(__name__, {"CudaBackend": ".backend", "CudaContext": ".context",
                                               "DeviceBuffer": ".buffer"})
