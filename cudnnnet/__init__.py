"""cudnnnet: neural networks on NVIDIA GPUs through cuBLAS and cuDNN, with a NumPy host backend.

    from cudnnnet import Network, Tensor
    from cudnnnet.layers import Dense, Activation, Softmax

``Network``, ``Tensor`` and ``predict`` are imported on first use (``lazy``): ``import cudnnnet``
alone imports no NumPy.
"""

import logging

from .backends import cuda_available, get_backend
from .errors import CudnnnetError
from .util.lazy import lazy_exports

logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__ = "0.1.0"

__all__ = ["CudnnnetError", "Network", "Tensor", "cuda_available", "get_backend", "predict", "__version__"]

__getattr__, __dir__ = lazy_exports(__name__, {"Network": ".network", "Tensor": ".tensor", "predict": ".inference"})
