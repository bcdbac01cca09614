"""cuDNN dropout: a layer's descriptor with its random-number states, and a reserve per input shape.

cudnnSetDropoutDescriptor fills the states buffer from the seed once; every cudnnDropoutForward
draws its mask from those states and advances them in place, so a CUDA graph that captured the
call draws a new mask at every replay. The mask is kept in the reserve space for the backward pass.

A 16-bit network's x and y (dy and dx) go through float32 copies in the cuDNN workspace
(low_precision.through_float32): cuDNN's dropout calls are documented for float, double and half
tensors, not bfloat16, and this way both formats draw the float32 path's masks;
y = h(float(x)·mask/(1 - rate)) is rounded once, as the host computes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import DeviceError
from .bindings import cudnn
from .buffer import DeviceBuffer
from .handles import Owned


class DropoutDescriptorHandle(Owned):
    """cudnnDropoutDescriptor_t."""

    __slots__ = ()

    def __init__(self):
        super().__init__(cudnn.create_dropout_descriptor(), cudnn.destroy_dropout_descriptor)


class DropoutState:
    """One dropout layer's descriptor, set to ``rate`` with states initialised from ``seed``."""

    def __init__(self, context, rate: float, seed: int):
        if context.is_capturing():
            raise DeviceError("a dropout state would be initialised during a CUDA graph capture; "
                              "build the network (run one step) before capturing")
        handle = context.cudnn.handle
        self.rate = float(rate)
        self.descriptor = DropoutDescriptorHandle()
        self.states_bytes = cudnn.dropout_get_states_size(handle)
        self.states = DeviceBuffer.allocate(self.states_bytes)  # the generator's states, advanced by every forward
        cudnn.set_dropout_descriptor(self.descriptor.handle, handle, self.rate, self.states.ptr, self.states_bytes,
                                     int(seed))


@dataclass(frozen=True)
class DropoutReserve:
    """The reserve space of cudnnDropoutForward for inputs of ``shape``: the mask, for the backward pass."""

    shape: tuple[int, int, int, int]
    buffer: DeviceBuffer
    nbytes: int

