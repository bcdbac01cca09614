"""The NumPy host backend: the same call surface as the CUDA backend, and its oracle."""

from .backend import ConvolutionPlan, HostBackend

__all__ = ["ConvolutionPlan", "HostBackend"]
