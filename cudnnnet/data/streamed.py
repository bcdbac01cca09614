"""StreamedData: a training set kept in host memory, each batch staged while the previous step computes.

The same interface as ``training.ResidentData`` (``start_epoch``, ``select``, ``gather``, ``count``,
``batch_size``, ``classes``), for data that does not fit on the device. ``select(index)`` delivers
batch ``index`` into fixed tensors ``x`` (B, C, H, W) and ``target`` (B, classes) and then prepares
batch ``index + 1`` in the other of two staging slots: on CUDA NumPy fills page-locked memory and a
second stream copies it to the device while the GPU computes (``backends/cuda/staging.py``); on any
other backend the slots are plain arrays written with ``Tensor.write_``. The batches are the same on
both: ``images[order[start:start + size]]`` and their one-hot labels, the images cropped and
flipped here on the host with ``augment`` (``augmentation.py``, the bits the device draws).

``choose_placement`` decides between the two (``data.placement`` in the config).
"""

from __future__ import annotations

import logging
import math

import numpy as np

from .. import augmentation
from ..errors import DataError, InvalidArgumentError, UsageError
from ..tensor import Tensor
from .mnist import check_labels

PLACEMENTS = ("auto", "device", "host")  # data.placement: where the training set lives (auto: the device where it fits)

log = logging.getLogger(__name__)

SLOTS = 2  # batches in flight: the one being delivered and the next one
FLOAT32_BYTES = 4
DEVICE_SHARE = 0.5  # "auto" keeps the set on the device when it takes at most this share of free memory


class HostStaging:
    """Staging slots as plain NumPy arrays, delivered with ``Tensor.write_`` (no streams): the host
    backend's path, and any backend's without a CUDA context."""

    def __init__(self, values: int, slots: int = SLOTS):
        self.values = int(values)
        self.slots = [np.empty(self.values, np.float32) for _ in range(slots)]  # (values,) each

    def host_values(self, slot: int) -> np.ndarray:
        return self.slots[slot]

    def send(self, slot: int, count: int) -> None:
        """Nothing to copy ahead: ``deliver`` writes straight from the slot."""

    def deliver(self, slot: int, parts) -> None:
        """Write the slot's values from ``offset`` into each ``(tensor, offset)`` of ``parts``."""
        values = self.slots[slot]
        for tensor, offset in parts:
            tensor.write_(values[offset:offset + tensor.size])


def make_staging(backend, values: int):
    """The staging of ``values`` float32 per slot for ``backend``: pinned memory and a copy stream where it
    has a CUDA context, plain arrays otherwise."""
    context = getattr(backend, "context", None)
    if context is None:
        return HostStaging(values)
    from ..backends.cuda.staging import CudaStaging

    return CudaStaging(context, values)


class StreamedData:
    """The training set in host memory; batch ``index`` of the epoch's order delivered by ``select``.

    A slot holds one batch of ``size`` samples packed as [images (size, C, H, W) | one-hot (size, classes)],
    so that it travels to the device in one copy.
    """

    def __init__(self, backend, images: np.ndarray, labels: np.ndarray, batch_size: int, classes: int, augment=None,
                 seed: int = 0):
        self.backend, self.batch_size, self.classes = backend, int(batch_size), int(classes)
        self.augment = augment if augment is not None and augment.active else None  # applied here, on the host
        self.seed = seed
        self.first_step = 0  # the global step of the epoch's batch 0
        self.images = np.ascontiguousarray(images, dtype=np.float32)  # (N, C, H, W), stays on the host
        self.labels = check_labels(np.asarray(labels), self.classes).astype(np.int64)  # (N,)
        _check_set(self.images, self.labels, self.batch_size)
        self.count = self.images.shape[0]
        self.sample_shape = self.images.shape[1:]  # (C, H, W)
        self.sample_size = math.prod(self.sample_shape)
        self.steps = math.ceil(self.count / self.batch_size)
        self._one_hot_rows = np.eye(self.classes, dtype=np.float32)  # (classes, classes)
        self.staging = make_staging(backend, self.batch_size * (self.sample_size + self.classes))
        self._order: np.ndarray | None = None  # (N,) the epoch's sample ids, in order
        self._ordered_labels: np.ndarray | None = None  # (N,) their labels, in the same order
        self._staged: list[int | None] = [None] * SLOTS  # the batch of this epoch each slot holds
        self._batches: dict[int, tuple[Tensor, Tensor]] = {}  # batch size -> (x, one-hot target)

    def start_epoch(self, order: np.ndarray, first_step: int = 0) -> None:
        """Take the epoch's order of sample ids; batches staged for the previous order are dropped.
        Batch i of the epoch trains at global step ``first_step + i`` (the augmentation draws by it)."""
        self.first_step = first_step
        order = np.asarray(order)
        if order.ndim != 1 or not 0 < order.size <= self.count or not np.issubdtype(order.dtype, np.integer):
            raise DataError(f"an epoch's order must be {self.count} integer sample ids (or fewer: a rank's shard), "
                            f"got dtype {order.dtype} shape {order.shape}")
        if order.min() < 0 or order.max() >= self.count:
            raise DataError(f"an epoch's order holds ids {int(order.min())}..{int(order.max())}; "
                            f"valid are 0..{self.count - 1}")
        self._order = order.astype(np.int64)
        self.steps = math.ceil(order.size / self.batch_size)
        self._ordered_labels = self.labels[self._order]
        self._staged = [None] * SLOTS

    def select(self, index: int) -> tuple[Tensor, Tensor]:
        """Deliver batch ``index`` into its tensors (outside any graph), then stage batch ``index + 1``."""
        size = self._size_of(index)
        x, target = self._tensors(size)
        slot = index % SLOTS
        if self._staged[slot] != index:
            self._stage(index)
        self.staging.deliver(slot, ((x, 0), (target, size * self.sample_size)))
        following = index + 1
        if following < self.steps and self._staged[following % SLOTS] != following:
            self._stage(following)
        return x, target

    def gather(self, x: Tensor, target: Tensor) -> None:
        """Nothing to do: ``select`` has already delivered the batch into ``x`` and ``target``, so a
        captured step that calls this reads them at their fixed addresses."""

    def _size_of(self, index: int) -> int:
        if self._order is None:
            raise UsageError("StreamedData.select was called before start_epoch gave the epoch's order")
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < self.steps:
            raise InvalidArgumentError(f"batch index {index!r} is outside the epoch's 0..{self.steps - 1}")
        return min(self.batch_size, self._order.size - int(index) * self.batch_size)

    def _tensors(self, size: int) -> tuple[Tensor, Tensor]:
        """The (x, target) tensors of batches of ``size``, made once (a captured graph reads their addresses)."""
        if size not in self._batches:
            self._batches[size] = (Tensor((size,) + self.sample_shape, self.backend),
                                   Tensor((size, self.classes), self.backend))
        return self._batches[size]

    def _stage(self, index: int) -> None:
        """Fill batch ``index``'s slot from the host arrays and send it on its way to the device."""
        slot, start = index % SLOTS, index * self.batch_size
        size = min(self.batch_size, self._order.size - start)
        image_values, target_values = size * self.sample_size, size * self.classes
        values = self.staging.host_values(slot)  # (slot values,) float32, free to overwrite
        images = values[:image_values].reshape((size,) + self.sample_shape)  # (size, C, H, W)
        target = values[image_values:image_values + target_values].reshape(size, self.classes)  # (size, classes)
        # mode="clip" (the ids were checked in start_epoch): "raise" would buffer ``out`` in a new array
        np.take(self.images, self._order[start:start + size], axis=0, out=images, mode="clip")
        np.take(self._one_hot_rows, self._ordered_labels[start:start + size], axis=0, out=target, mode="clip")
        if self.augment is not None:  # the bits ResidentData's gather_augmented_batch draws for this step
            images[...] = augmentation.augment(images, self.seed, self.first_step + index, self.augment.crop_padding,
                                               self.augment.flip)
        self.staging.send(slot, image_values + target_values)
        self._staged[slot] = index


def _check_set(images: np.ndarray, labels: np.ndarray, batch_size: int) -> None:
    if images.ndim != 4 or images.shape[0] == 0:
        raise DataError(f"images must be shaped (N, C, H, W) with N > 0, got shape {images.shape}")
    if labels.shape != (images.shape[0],):
        raise DataError(f"labels shaped {labels.shape} do not match {images.shape[0]} images")
    if batch_size <= 0:
        raise DataError(f"batch_size must be an integer > 0, got {batch_size!r}")


def choose_placement(placement: str, backend, images, labels: np.ndarray, alongside_bytes: int = 0) -> str:
    """Where the training set lives: "device" (ResidentData) or "host" (StreamedData), logged with why.

    "auto" is "device" where the set as ResidentData holds it (images, labels and the epoch's order
    as float32; ``images`` is an array or PixelImages, its ``size`` the float32 values), plus ``alongside_bytes`` that go to the device with it (the Trainer's resident test
    set), takes at most half of the device's free memory, and always on a backend that reports no
    device memory (the host backend).
    """
    if placement not in PLACEMENTS:
        raise InvalidArgumentError(f"invalid data placement {placement!r}; valid are {', '.join(PLACEMENTS)}")
    memory_info = getattr(backend, "memory_info", None)
    if placement != "auto":
        log.info("training data %s: data.placement is %s", _where(placement, memory_info), placement)
        return placement
    if memory_info is None:
        log.info("training data %s: data.placement auto on the %s backend", _where("device", memory_info),
                 backend.name)
        return "device"
    needed = FLOAT32_BYTES * (images.size + 2 * labels.size) + alongside_bytes
    free, _ = memory_info()
    chosen = "device" if needed <= DEVICE_SHARE * free else "host"
    log.info("training data %s: data.placement auto, %.1f MiB %s in half of the %.1f MiB free",
             _where(chosen, memory_info), needed / 2**20, "fit" if chosen == "device" else "do not fit", free / 2**20)
    return chosen


def _where(placement: str, memory_info) -> str:
    """Where ``placement`` puts the training set, in words; a backend without device memory (``memory_info``
    None: the host's NumPy) holds a resident set in host memory."""
    if placement == "host":
        return "streamed from host memory (StreamedData)"
    return f"resident in {'device' if memory_info is not None else 'host'} memory (ResidentData)"
