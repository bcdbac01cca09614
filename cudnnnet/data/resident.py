"""Data sets held by the backend (device memory on CUDA): the training set, gathered into batches
there, and the test set, evaluated through views of it; and ``BatchFeed``, which copies host batches
into tensors kept per batch size. ``streamed.py``'s StreamedData is the host-memory alternative."""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from .mnist import one_hot
from .pixels import PixelImages
from .streamed import FLOAT32_BYTES


class BatchFeed:
    """Host batches copied into device tensors kept per batch size (no allocation per step)."""

    def __init__(self, backend, sample_shape, classes: int):
        self.backend, self.sample_shape, self.classes = backend, tuple(sample_shape), classes
        self._tensors: dict[int, tuple[Tensor, Tensor]] = {}

    def __call__(self, images: np.ndarray, onehot: np.ndarray) -> tuple[Tensor, Tensor]:
        size = images.shape[0]
        if size not in self._tensors:
            self._tensors[size] = (Tensor((size,) + self.sample_shape, self.backend),
                                   Tensor((size, self.classes), self.backend))
        x, target = self._tensors[size]
        return x.write_(images), target.write_(onehot)


def resident_images(images, backend) -> Tensor:
    """float32 images (N, C, H, W) held by ``backend``: an array copied as it is, or PixelImages made
    there from their bytes (on a GPU, a quarter of the float32 copy and a kernel)."""
    return images.to_tensor(backend) if isinstance(images, PixelImages) else Tensor.from_numpy(images, backend)


class ResidentData:
    """The training set held by the backend (device memory on CUDA), its batches gathered there.

    Each epoch's order is uploaded once; a batch is then selected by writing its start into a
    one-element ``cursor`` on the device, so that the gather inside a captured CUDA graph reads
    the batch of the step being replayed. No host copy or synchronisation happens per step.

    With ``augment`` (a config's data.augment), the gather also crops and flips each sample
    (``augmentation.py``), drawn by (``seed``, global step, sample): the step is a ``counter`` on
    the device that the gather advances, so that every replay draws the next step's crops. The
    host writes it only where it is not already at the step selected (the first batch of a run, an
    epoch or a resumed run): every ``select`` is followed by one ``gather``, eager or replayed.
    """

    def __init__(self, backend, images, labels: np.ndarray, batch_size: int, classes: int, augment=None,
                 seed: int = 0):
        self.backend, self.batch_size, self.classes = backend, batch_size, classes
        self.count = images.shape[0]
        self.images = resident_images(images, backend)  # (N, C, H, W)
        self.labels = Tensor.from_numpy(labels.astype(np.float32), backend)  # (N,) class ids
        self.order = Tensor((self.count,), backend)  # (N,) the epoch's sample ids, in order
        self.cursor = Tensor((1,), backend)  # where in ``order`` the batch starts
        self.epoch_count = self.count  # ids in the current epoch's order
        self._batches: dict[int, tuple[Tensor, Tensor]] = {}  # batch size -> (x, one-hot target)
        self.augment = augment if augment is not None and augment.active else None
        self.seed = seed
        self.counter = Tensor.zeros((2,), backend)  # uint32 bits: [global step of the next gather, 0]
        self.first_step = 0  # the global step of the epoch's batch 0
        self._counter_holds: int | None = None  # the step counter[0] holds when the next gather runs

    def start_epoch(self, order: np.ndarray, first_step: int = 0) -> None:
        """Take the epoch's order: every sample id, or a rank's shard of them (fewer); batch i of the
        epoch trains at global step ``first_step + i``."""
        self.epoch_count = len(order)
        self.order.view((self.epoch_count,)).write_(order.astype(np.float32))
        self.first_step = first_step

    def select(self, index: int) -> tuple[Tensor, Tensor]:
        """Point the cursor at batch ``index`` (outside any graph); returns that batch's tensors."""
        size = min(self.batch_size, self.epoch_count - index * self.batch_size)
        if size not in self._batches:
            self._batches[size] = (Tensor((size,) + self.images.shape[1:], self.backend),
                                   Tensor((size, self.classes), self.backend))
        self.cursor.fill_(index * self.batch_size)
        if self.augment is not None:
            step = self.first_step + index
            if self._counter_holds != step:
                self.counter.write_(np.array([step, 0], np.uint32).view(np.float32))
            self._counter_holds = step + 1  # the gather that follows advances it
        return self._batches[size]

    def gather(self, x: Tensor, target: Tensor) -> None:
        """x[b] = images[order[cursor + b]] (cropped and flipped with ``augment``), target[b] = one_hot(...)
        — on the device, graph-safe."""
        if self.augment is None:
            self.backend.gather_batch(self.images, self.labels, self.order, self.cursor, x, target)
            return
        self.backend.gather_augmented_batch(self.images, self.labels, self.order, self.cursor, self.counter, x, target,
                                            self.augment.crop_padding, self.augment.flip, self.seed)


class ResidentTestSet:
    """A test set held by the backend once (device memory on CUDA), evaluated in batches that are
    views of it: an evaluation copies nothing from the host."""

    def __init__(self, backend, images, labels: np.ndarray, classes: int):
        self.count, self.classes = images.shape[0], classes
        self.images = resident_images(images, backend)  # (N, C, H, W)
        self.targets = Tensor.from_numpy(one_hot(labels, classes), backend)  # (N, classes)

    @staticmethod
    def nbytes(images, classes: int) -> int:
        """The device memory a ResidentTestSet of ``images`` takes: the images and one-hot targets as float32."""
        return FLOAT32_BYTES * (images.size + images.shape[0] * classes)

    def batches(self, batch_size: int):
        """(x, one-hot target) views of ``batch_size`` samples at a time (the last may be shorter)."""
        sample_shape, sample_size = self.images.shape[1:], self.images.sample_size
        for start in range(0, self.count, batch_size):
            size = min(batch_size, self.count - start)
            yield (self.images.view((size,) + sample_shape, start * sample_size),
                   self.targets.view((size, self.classes), start * self.classes))
