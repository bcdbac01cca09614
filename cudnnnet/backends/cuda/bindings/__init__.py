"""Tier 1: raw bindings, one thin Python function per C function, every status checked.

``runtime`` (CUDA runtime and driver) and ``nvrtc`` call cuda-python; ``cublas`` and ``cudnn`` call
the NVIDIA libraries through ctypes. Each binding counts its calls in ``calls``, keyed by the C
function's name, so a test can prove that cuBLAS and cuDNN really ran.
"""

from __future__ import annotations

import collections

calls: collections.Counter = collections.Counter()


def reset_calls() -> None:
    """Forget every call counted so far."""
    calls.clear()
