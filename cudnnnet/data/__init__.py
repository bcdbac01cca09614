"""Data: the MNIST IDX reader and download (``mnist``) and mini-batching (``loader``)."""

from .loader import BatchLoader
from .mnist import MNIST_MEAN, MNIST_STD, download_mnist, load_mnist, one_hot

__all__ = ["BatchLoader", "MNIST_MEAN", "MNIST_STD", "download_mnist", "load_mnist", "one_hot"]
