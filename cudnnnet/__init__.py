"""cudnnnet: neural networks on NVIDIA GPUs through cuBLAS and cuDNN, with a NumPy host backend.

    from cudnnnet import Network, Tensor
    from cudnnnet.layers import Dense, Activation, Softmax
"""

import logging

from .backends import cuda_available, get_backend
from .errors import CudnnnetError
from .network import Network
from .tensor import Tensor

logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__ = "0.1.0"


def predict(network, images, **kwargs):
    """Digits and probabilities for image files or arrays: see :func:`cudnnnet.predict.predict`."""
    from .predict import predict as _predict

    return _predict(network, images, **kwargs)


__all__ = ["CudnnnetError", "Network", "Tensor", "cuda_available", "get_backend", "predict", "__version__"]
