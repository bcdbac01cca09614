"""cudnnnet: neural networks on NVIDIA GPUs through cuBLAS and cuDNN, with a NumPy host backend.

    from cudnnnet import Network, Tensor
    from cudnnnet.layers import Dense, Activation, Softmax
"""

import logging

from .backends import cuda_available, get_backend
from .errors import CudnnnetError
from .network import Network
from .predict import predict  # the function replaces the submodule of the same name as the package's attribute
from .tensor import Tensor

logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__ = "0.1.0"

__all__ = ["CudnnnetError", "Network", "Tensor", "cuda_available", "get_backend", "predict", "__version__"]
