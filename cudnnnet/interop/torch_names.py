"""A PyTorch ``state_dict``'s names and layouts as a cudnnnet network's.

Names: a PyTorch module named as the cudnnnet layer holds the same parameters under the same names
(``fc1.weight``, ``fc1.bias``, ``conv1.weight``, ``bn1.running_mean``); a ``module.`` prefix
(DataParallel, DistributedDataParallel) is dropped, and ``*.num_batches_tracked`` (BatchNorm's step
counter, which inference does not read) is left out.

Layouts: the values are in the same row-major order and only the axes of size 1 differ, so a
tensor is reshaped and never transposed:

    PyTorch                                   cudnnnet
    Linear.weight        (out, in)            Dense.weight   (out, in, 1, 1)
    Linear.bias          (out,)               Dense.bias     (out, 1, 1, 1)
    Conv2d.weight        (out, in, k, k)      Conv2D.weight  (out, in, k, k)   as is
    Conv2d.bias          (out,)               Conv2D.bias    (out, 1, 1, 1)
    BatchNorm2d.*        (C,)                 BatchNorm.*    (1, C, 1, 1)      spatial
    BatchNorm1d.*        (F,)                 BatchNorm.*    (1, F, 1, 1)      per activation, after a Dense

A Linear after ``nn.Flatten`` reads (C, H, W) in the order a Dense does, so its weight needs no
permutation either.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

WRAPPER_PREFIX = "module."
IGNORED_SUFFIX = ".num_batches_tracked"


def is_ignored(name: str) -> bool:
    """Whether a state_dict entry is left out (BatchNorm's step counter)."""
    return name.endswith(IGNORED_SUFFIX)


def to_network_layout(arrays: Mapping[str, np.ndarray], expected: Mapping[str, tuple]) -> dict[str, np.ndarray]:
    """``arrays`` renamed and reshaped as the network whose {name: shape} is ``expected`` holds them.

    A name or shape that has no counterpart is kept as it is, for the network's own check to name it.
    """
    found = {}
    for name, array in arrays.items():
        name = name[len(WRAPPER_PREFIX):] if name.startswith(WRAPPER_PREFIX) else name
        if is_ignored(name):
            continue
        shape = tuple(expected.get(name, array.shape))
        if array.shape != shape and tuple(array.shape) in _torch_shapes(shape):
            array = array.reshape(shape)
        found[name] = array
    return found


def _torch_shapes(shape: tuple) -> set[tuple]:
    """The shapes PyTorch gives a tensor that cudnnnet shapes ``shape``: without a leading axis of size 1
    (BatchNorm's (1, C, 1, 1)) or not, and without any number of trailing axes of size 1."""
    starts = (shape, shape[1:]) if shape[:1] == (1,) else (shape,)
    found = set()
    for start in starts:
        while True:
            found.add(start)
            if not start or start[-1] != 1:
                break
            start = start[:-1]
    return found
