"""BatchLoader: mini-batches that cover the whole set once per epoch.

The original C++ loader indexed ``(step * batch) % num_steps`` and so trained on ~490 images. Here
epoch ``e`` visits every sample exactly once, in the order ``permutation(e)``, which depends only
on ``seed`` and ``e``: resuming at epoch ``e`` replays the same order.
"""

from __future__ import annotations

import logging
from typing import Iterator

import numpy as np

from ..errors import DataError
from .mnist import NUM_CLASSES, check_labels, one_hot
from .pixels import PixelImages

logger = logging.getLogger(__name__)

Batch = tuple[np.ndarray, np.ndarray, np.ndarray]


def _positive_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise DataError(f"{what} must be an integer > 0, got {value!r}")
    return int(value)


class BatchLoader:
    """Iterate (images (B, C, H, W) float32, one-hot (B, classes) float32, labels (B,) int64).

    Each ``for`` loop over the loader is one epoch (``epoch`` counts them and may be set to
    resume); ``epoch_batches(e)`` yields epoch ``e`` without touching the counter. Each batch is
    one fancy-indexed copy of its rows, never a copy of the whole set.
    """

    def __init__(self, images, labels, batch_size: int, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, classes: int = NUM_CLASSES):
        # (N, C, H, W) float32, or PixelImages converted by the first batch that needs them
        self._images = images if isinstance(images, PixelImages) else np.asarray(images, dtype=np.float32)
        self.labels = np.asarray(labels)  # (N,)
        self.batch_size = _positive_int(batch_size, "batch_size")
        self.classes = _positive_int(classes, "classes")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise DataError(f"seed must be an integer >= 0, got {seed!r}")
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self._check_arrays()
        check_labels(self.labels, self.classes)
        self._one_hot_rows = one_hot(np.arange(self.classes), self.classes)  # (classes, classes)

    def _check_arrays(self) -> None:
        shape = self._images.shape
        if len(shape) != 4:
            raise DataError(f"images must be shaped (N, C, H, W), got shape {shape}")
        if self.labels.shape != (shape[0],):
            raise DataError(f"labels shaped {self.labels.shape} do not match {shape[0]} images")
        if shape[0] == 0:
            raise DataError("the data set is empty")
        if self.drop_last and shape[0] < self.batch_size:
            raise DataError(f"drop_last with batch_size {self.batch_size} > {shape[0]} samples "
                            f"would yield no batches")

    @property
    def images(self) -> np.ndarray:
        """The float32 images (N, C, H, W)."""
        return self._images.floats if isinstance(self._images, PixelImages) else self._images

    @property
    def num_samples(self) -> int:
        return self._images.shape[0]

    @property
    def steps_per_epoch(self) -> int:
        full, rest = divmod(self.num_samples, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def __len__(self) -> int:
        return self.steps_per_epoch

    def permutation(self, epoch: int) -> np.ndarray:
        """The order of the samples in ``epoch``: a function of (seed, epoch) only."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise DataError(f"epoch must be an integer >= 0, got {epoch!r}")
        if not self.shuffle:
            return np.arange(self.num_samples)
        return np.random.default_rng((self.seed, int(epoch))).permutation(self.num_samples)

    def epoch_batches(self, epoch: int) -> Iterator[Batch]:
        """The batches of ``epoch``, in its order."""
        order = self.permutation(epoch)
        for step in range(self.steps_per_epoch):
            indices = order[step * self.batch_size:(step + 1) * self.batch_size]
            labels = self.labels[indices].astype(np.int64, copy=False)
            yield self.images[indices], self._one_hot_rows[labels], labels

    def __iter__(self) -> Iterator[Batch]:
        epoch = self.epoch
        self.epoch += 1
        logger.debug("epoch %d: %d batches of up to %d", epoch, self.steps_per_epoch, self.batch_size)
        return self.epoch_batches(epoch)
