"""cuDNN descriptors as Python objects, cached so that the hot path creates none.

Tensor and filter descriptors are cached by shape and data type (float32, or bfloat16 for the
convolutions of ``math: bf16``); activation, pooling and convolution
descriptors by the call surface's frozen dataclasses (and, for convolutions, the math type).
"""

from __future__ import annotations

from collections import OrderedDict

from ..descriptors import ActivationDescriptor, ConvolutionDescriptor, PoolingDescriptor
from .bindings import cudnn
from .handles import Owned


class TensorDescriptor(Owned):
    """cudnnTensorDescriptor_t: NCHW values of ``data_type`` (float32 unless asked), ``shape`` (n, c, h, w)."""

    __slots__ = ()

    def __init__(self, shape: tuple[int, int, int, int], data_type: int = cudnn.DATA_FLOAT):
        super().__init__(cudnn.create_tensor_descriptor(), cudnn.destroy_tensor_descriptor)
        cudnn.set_tensor_4d_descriptor(self.handle, cudnn.TENSOR_NCHW, data_type, *shape)


class FilterDescriptor(Owned):
    """cudnnFilterDescriptor_t: NCHW filters of ``data_type`` (float32 unless asked), ``shape`` (k, c, r, s)."""

    __slots__ = ()

    def __init__(self, shape: tuple[int, int, int, int], data_type: int = cudnn.DATA_FLOAT):
        super().__init__(cudnn.create_filter_descriptor(), cudnn.destroy_filter_descriptor)
        cudnn.set_filter_4d_descriptor(self.handle, data_type, cudnn.TENSOR_NCHW, *shape)


class ConvolutionDescriptorHandle(Owned):
    """cudnnConvolutionDescriptor_t: 2-D cross-correlation, float32 compute, ``math_type`` set."""

    __slots__ = ()

    def __init__(self, desc: ConvolutionDescriptor, math_type: int):
        super().__init__(cudnn.create_convolution_descriptor(), cudnn.destroy_convolution_descriptor)
        p, s, d = desc.padding, desc.stride, desc.dilation
        cudnn.set_convolution_2d_descriptor(self.handle, p, p, s, s, d, d, cudnn.CROSS_CORRELATION, cudnn.DATA_FLOAT)
        cudnn.set_convolution_math_type(self.handle, math_type)


class PoolingDescriptorHandle(Owned):
    """cudnnPoolingDescriptor_t for a square window (NaN propagates, as in NumPy)."""

    __slots__ = ()

    def __init__(self, desc: PoolingDescriptor):
        super().__init__(cudnn.create_pooling_descriptor(), cudnn.destroy_pooling_descriptor)
        w, p, s = desc.window, desc.padding, desc.stride
        cudnn.set_pooling_2d_descriptor(self.handle, int(desc.mode), cudnn.PROPAGATE_NAN, w, w, p, p, s, s)


class ActivationDescriptorHandle(Owned):
    """cudnnActivationDescriptor_t: mode and coef (NaN propagates, as in NumPy)."""

    __slots__ = ()

    def __init__(self, desc: ActivationDescriptor):
        super().__init__(cudnn.create_activation_descriptor(), cudnn.destroy_activation_descriptor)
        cudnn.set_activation_descriptor(self.handle, int(desc.mode), cudnn.PROPAGATE_NAN, float(desc.coef))


class DescriptorCache:
    """Least-recently-used cache of descriptors. An evicted descriptor still held by a plan lives on
    until the plan goes; the cache only bounds how many idle ones are kept."""

    def __init__(self, capacity: int = 512):
        self.capacity = capacity
        self._entries: OrderedDict = OrderedDict()

    def tensor(self, shape: tuple[int, int, int, int], data_type: int = cudnn.DATA_FLOAT) -> TensorDescriptor:
        return self._get(TensorDescriptor, shape, data_type)

    def filter(self, shape: tuple[int, int, int, int], data_type: int = cudnn.DATA_FLOAT) -> FilterDescriptor:
        return self._get(FilterDescriptor, shape, data_type)

    def convolution(self, desc: ConvolutionDescriptor, math_type: int) -> ConvolutionDescriptorHandle:
        return self._get(ConvolutionDescriptorHandle, desc, math_type)

    def pooling(self, desc: PoolingDescriptor) -> PoolingDescriptorHandle:
        return self._get(PoolingDescriptorHandle, desc)

    def activation(self, desc: ActivationDescriptor) -> ActivationDescriptorHandle:
        return self._get(ActivationDescriptorHandle, desc)

    def _get(self, kind, *key):
        entry_key = (kind, key)
        descriptor = self._entries.get(entry_key)
        if descriptor is None:
            descriptor = self._entries[entry_key] = kind(*key)
            if len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(entry_key)
        return descriptor

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        for descriptor in self._entries.values():
            descriptor.close()
        self._entries.clear()
