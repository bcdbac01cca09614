"""The optimisers of the CUDA backend: SGD as the slides' cuBLAS level-1 calls (with the device
scalars a one-element learning rate or a loss scale needs), SGD and Adam as our kernels
(kernels/sgd.cu, sgd_update_many.cu, adam_update_many.cu), and the device tables of parameter
pointers the one-launch kernels read (``ParameterTables``, one kind of table for both)."""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ...errors import DeviceError, UsageError
from ...tensor import Tensor
from .bindings import cublas, runtime
from .buffer import FLOAT32_BYTES, DeviceBuffer
from .kernel import BLOCK_SIZE, MAX_ELEMENTWISE_BLOCKS, blocks_for

log = logging.getLogger(__name__)

TABLE_CACHE_SIZE = 64  # parameter lists whose device table is kept (one per network in practice)


@dataclass(frozen=True)
class ParameterTable:
    """The device table of one parameter list: one row per parameter, its pointers (param, grad and
    velocity for SGD; param, grad, m and v for Adam), then its offset and size, as 64-bit words."""

    buffer: DeviceBuffer
    rows: np.ndarray  # the host copy it was uploaded from, (tensors, words) uint64
    tensors: int
    total: int  # Σ sizes: the kernel's index space


class ParameterTables:
    """The tables of ``call``'s kernel, by the pointers and sizes of their parameter lists (an LRU cache
    of TABLE_CACHE_SIZE), each uploaded on the first call with its list: never inside a capture."""

    def __init__(self, context, call: str):
        self.context, self.call = context, call
        self._tables: OrderedDict = OrderedDict()  # ((pointers..., size) per parameter) -> ParameterTable

    def table(self, key: tuple) -> ParameterTable | None:
        """The table of ``key``, one (pointers..., size) per parameter (None for an empty list)."""
        if not key:
            return None
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = self._upload(key)
            if len(self._tables) > TABLE_CACHE_SIZE:
                self._tables.popitem(last=False)
        self._tables.move_to_end(key)
        return table

    def _upload(self, key: tuple) -> ParameterTable:
        """Rows of (pointers..., offset, size), copied to a new device buffer."""
        if self.context.is_capturing():
            raise DeviceError(
                f"{self.call} was first called with this list of {len(key)} parameters during a CUDA graph "
                "capture; its device table is uploaded on that call: run one step before capturing"
            )
        rows, offset = [], 0
        for *pointers, size in key:
            rows.append((*pointers, offset, size))
            offset += size
        host_rows = np.array(rows, dtype=np.uint64)
        buffer = DeviceBuffer.allocate(host_rows.nbytes)
        runtime.memcpy_async(buffer.ptr, host_rows.ctypes.data, host_rows.nbytes, runtime.MEMCPY_HOST_TO_DEVICE,
                             self.context.stream.handle)
        log.debug("%s: table of %d parameters, %d values", self.call, len(rows), offset)
        return ParameterTable(buffer, host_rows, len(rows), offset)

    def clear(self) -> None:
        self._tables.clear()


class CudaOptimisers:
    """SGD and Adam on ``backend``'s context; the backend's verbs choose the path (its engine) and check
    the arguments."""

    def __init__(self, backend):
        self.backend = backend  # owns the device scalars' tensors
        self.context = backend.context
        self.sgd_tables = ParameterTables(self.context, "sgd_update_many")
        self.adam_tables = ParameterTables(self.context, "adam_update_many")
        self._update_scalars: Tensor | None = None  # (3,): −lr, 1 − lr·wd, 1.0: the cuBLAS SGD with a device rate
        self._scaled_sgd_scalars: Tensor | None = None  # (6,): the loss-scaled cuBLAS SGD's coefficients

    def close(self) -> None:
        self.sgd_tables.clear()
        self.adam_tables.clear()
        self._update_scalars = None
        self._scaled_sgd_scalars = None

    # ---- our kernels ---------------------------------------------------------------------------
    def sgd_kernel(self, param, grad, velocity, lr, momentum: float, weight_decay: float) -> None:
        """kernels/sgd.cu: four values a thread where every operand is 16-byte aligned, the rest one."""
        stream = self.context.stream.handle
        rate, value = (lr.data.ptr, 0.0) if isinstance(lr, Tensor) else (None, float(lr))
        operands = [param.data.ptr, grad.data.ptr, None if velocity is None else velocity.data.ptr]
        count = param.size
        vectors = count // 4 if all(pointer % 16 == 0 for pointer in operands if pointer is not None) else 0
        if vectors:
            # param = param - lr·(momentum·v + grad + wd·param)      float4s
            blocks = min(-(-vectors // BLOCK_SIZE), MAX_ELEMENTWISE_BLOCKS)
            self.context.kernel("sgd_update_x4").launch(blocks, stream, *operands, rate, value, momentum,
                                                        weight_decay, vectors)
        rest = count - 4 * vectors
        if rest:
            # the same for the values after the float4s
            offset = 4 * FLOAT32_BYTES * vectors
            self.context.kernel("sgd_update").launch(
                blocks_for(rest), stream, *(None if pointer is None else pointer + offset for pointer in operands),
                rate, value, momentum, weight_decay, rest)

    def sgd_many_kernel(self, groups, lr, momentum: float, weight_decay: float, loss_scale) -> None:
        """kernels/sgd_update_many.cu: one launch over every parameter of ``groups`` through their table."""
        table = self.sgd_tables.table(tuple(sgd_entry(param, grad, velocity, momentum)
                                            for param, grad, velocity in groups))
        if table is None:
            return
        if isinstance(lr, Tensor):
            check_device_scalar(self.backend, "sgd_update_many", lr)
            rate, value = lr.data.ptr, 0.0
        else:
            rate, value = None, float(lr)
        self.context.kernel("sgd_update_many").launch(blocks_for(table.total), self.context.stream.handle,
                                                      table.buffer.ptr, table.tensors, table.total, rate, value,
                                                      momentum, weight_decay,
                                                      None if loss_scale is None else loss_scale.data.ptr)

    def adam_many_kernel(self, groups, lr, counter, beta1: float, beta2: float, eps: float, weight_decay: float,
                         decoupled: bool, loss_scale) -> None:
        """kernels/adam_update_many.cu: one launch over every parameter of ``groups`` through their table."""
        table = self.adam_tables.table(tuple(adam_entry(*group) for group in groups))
        if table is None:
            return
        if isinstance(lr, Tensor):
            check_device_scalar(self.backend, "adam_update_many", lr)
            rate, value = lr.data.ptr, 0.0
        else:
            rate, value = None, float(lr)
        self.context.kernel("adam_update_many").launch(
            blocks_for(table.total), self.context.stream.handle, table.buffer.ptr, table.tensors, table.total, rate,
            value, counter.data.ptr, beta1, beta2, eps, weight_decay, int(bool(decoupled)),
            None if loss_scale is None else loss_scale.data.ptr)

    # ---- the slides' cuBLAS calls ----------------------------------------------------------------
    def sgd_cublas(self, groups, lr, momentum: float, weight_decay: float) -> None:
        """SGD on every (param, grad, velocity) of ``groups`` with cuBLAS level-1 calls only, as the
        slides' cublasSaxpy update. A one-element tensor ``lr`` is read in device pointer mode through
        scalars made from it by cublasScopy/cublasSscal/cublasSaxpy, so a replayed graph follows it."""
        h, scalar = self.context.cublas.handle, self.context.scalar
        neg_lr, decay, device = self._sgd_scalars(lr, momentum, weight_decay)
        if momentum:
            for param, grad, velocity in groups:
                n, p, g, v = param.size, param.data.ptr, grad.data.ptr, velocity.data.ptr
                cublas.sscal(h, n, scalar(momentum), v, 1)  # v = momentum·v
                cublas.saxpy(h, n, scalar(1.0), g, 1, v, 1)  # v += grad
                if weight_decay:
                    cublas.saxpy(h, n, scalar(weight_decay), p, 1, v, 1)  # v += wd·param
        with self.context.pointer_mode(device):
            for param, grad, velocity in groups:
                n, p = param.size, param.data.ptr
                if momentum:
                    cublas.saxpy(h, n, neg_lr, velocity.data.ptr, 1, p, 1)  # param -= lr·v
                    continue
                if weight_decay:
                    cublas.sscal(h, n, decay, p, 1)  # param = (1 - lr·wd)·param
                cublas.saxpy(h, n, neg_lr, grad.data.ptr, 1, p, 1)  # param -= lr·grad

    def sgd_cublas_scaled(self, groups, lr, momentum: float, weight_decay: float, loss_scale) -> None:
        """``sgd_cublas`` on gradients that carry a loss scale: the same cuBLAS calls, every
        coefficient a device scalar that kernels/loss_scale.cu's sgd_scaled_coefficients makes from the
        rate, 1/S and the skip flag, so that a skipped step scales by 1 and adds 0 (its non-finite
        gradients were set to 0 by find_nonfinite_gradients) and leaves weights and velocities as they were."""
        h, scalars = self.context.cublas.handle, self._scaled_sgd_scalar_buffer().data.ptr
        keep, unscale, decay, neg_lr, shrink, neg_lr_unscaled = (scalars + FLOAT32_BYTES * i for i in range(6))
        rate, value = (lr.data.ptr, 0.0) if isinstance(lr, Tensor) else (None, float(lr))
        self.context.kernel("sgd_scaled_coefficients").launch(1, self.context.stream.handle, scalars, rate, value,
                                                              loss_scale.data.ptr, momentum, weight_decay)
        with self.context.pointer_mode(device=True):
            for param, grad, velocity in groups:
                n, p, g = param.size, param.data.ptr, grad.data.ptr
                if momentum:
                    v = velocity.data.ptr
                    cublas.sscal(h, n, keep, v, 1)  # v = momentum·v
                    cublas.saxpy(h, n, unscale, g, 1, v, 1)  # v += grad/S
                    if weight_decay:
                        cublas.saxpy(h, n, decay, p, 1, v, 1)  # v += wd·param
                    cublas.saxpy(h, n, neg_lr, v, 1, p, 1)  # param -= lr·v
                    continue
                if weight_decay:
                    cublas.sscal(h, n, shrink, p, 1)  # param = (1 - lr·wd)·param
                cublas.saxpy(h, n, neg_lr_unscaled, g, 1, p, 1)  # param -= (lr/S)·grad

    def _sgd_scalars(self, lr, momentum: float, weight_decay: float):
        """(−lr, 1 − lr·wd, device): host pointers for a float ``lr``; for a tensor, pointers into
        ``_update_scalars`` computed from lr[0] on the device, read in device pointer mode."""
        scalar = self.context.scalar
        if not isinstance(lr, Tensor):
            lr = float(lr)
            return scalar(-lr), scalar(1.0 - lr * weight_decay), False
        h, scalars = self.context.cublas.handle, self._sgd_scalar_buffer().data.ptr
        neg_lr, decay, one = scalars, scalars + FLOAT32_BYTES, scalars + 2 * FLOAT32_BYTES
        # −lr = −1·lr
        cublas.scopy(h, 1, lr.data.ptr, 1, neg_lr, 1)
        cublas.sscal(h, 1, scalar(-1.0), neg_lr, 1)
        if weight_decay and not momentum:
            # 1 − lr·wd = 1 + (−wd)·lr
            cublas.scopy(h, 1, one, 1, decay, 1)
            cublas.saxpy(h, 1, scalar(-weight_decay), lr.data.ptr, 1, decay, 1)
        return neg_lr, decay, True

    def _sgd_scalar_buffer(self) -> Tensor:
        """(3,) device floats: −lr, 1 − lr·wd and the constant 1.0, allocated on first use (never in a capture)."""
        if self._update_scalars is None:
            if self.context.is_capturing():
                raise DeviceError("the cuBLAS SGD update was first called during a CUDA graph capture; its device "
                                  "scalars are allocated on that call: run one step before capturing")
            self._update_scalars = Tensor.zeros((3,), self.backend)
            self.backend.fill(self._update_scalars.view((1,), 2).data, 1.0, 1)
        return self._update_scalars

    def _scaled_sgd_scalar_buffer(self) -> Tensor:
        """(6,) device floats of sgd_scaled_coefficients, allocated on first use (never in a capture)."""
        if self._scaled_sgd_scalars is None:
            if self.context.is_capturing():
                raise DeviceError("the loss-scaled cuBLAS SGD update was first called during a CUDA graph capture; "
                                  "its device scalars are allocated on that call: run one step before capturing")
            self._scaled_sgd_scalars = Tensor.zeros((6,), self.backend)
        return self._scaled_sgd_scalars


def check_device_scalar(backend, call: str, value: Tensor) -> None:
    """A UsageError unless the one-element tensor ``value`` lives on ``backend``."""
    if value.backend is not backend:
        raise UsageError(f"{call}: a tensor scalar must be on the {backend.name} backend, got one on {value.backend.name}")


def sgd_entry(param, grad, velocity, momentum: float) -> tuple[int, int, int, int]:
    """(param, grad, velocity or 0, size) of one parameter for sgd_update_many's table."""
    return (param.data.ptr, grad.data.ptr, velocity.data.ptr if momentum else 0, param.size)


def adam_entry(param, grad, m, v) -> tuple[int, int, int, int, int]:
    """(param, grad, m, v, size) of one parameter for adam_update_many's table."""
    return (param.data.ptr, grad.data.ptr, m.data.ptr, v.data.ptr, param.size)
