"""Images as stored (uint8 pixels) and the float32 images a network reads from them.

MNIST's pixels are bytes; the network reads float32 (pixel / 255 − mean) / std, zero-padded
before normalising. ``to_float_images`` (``float_images.py``) does that on the host.
``PixelImages`` keeps the bytes and the recipe together, so that a data set resident on a GPU is
copied there as bytes (a quarter of the float32 size) and expanded there by a kernel
(``PixelImages.to_tensor``), while host code that needs the floats converts once
(``PixelImages.floats``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..errors import DataError
from ..float_images import to_float_images


def check_recipe(normalize, pad) -> None:
    """DataError unless ``pad`` is an integer >= 0 and ``normalize`` is None or a finite (mean, std > 0)."""
    if isinstance(pad, bool) or not isinstance(pad, (int, np.integer)) or pad < 0:
        raise DataError(f"pad must be an integer >= 0, got {pad!r}")
    if normalize is None:
        return
    try:
        mean, std = (float(value) for value in normalize)
    except (TypeError, ValueError) as error:
        raise DataError(f"normalize must be None or (mean, std), got {normalize!r}") from error
    if not (np.isfinite(mean) and np.isfinite(std) and std > 0):
        raise DataError(f"normalize needs a finite mean and a std > 0, got {normalize!r}")


@dataclass(frozen=True, eq=False)
class PixelImages:
    """uint8 ``pixels`` (N, H, W) read as the float32 images (N, 1, H+2·pad, W+2·pad) that
    ``to_float_images(pixels, normalize, pad)`` makes; ``shape`` and ``size`` are the float images'."""

    pixels: np.ndarray  # uint8 (N, H, W)
    normalize: tuple[float, float] | None = None  # (mean, std) applied after /255 and the padding
    pad: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.pixels, np.ndarray) or self.pixels.dtype != np.uint8 or self.pixels.ndim != 3:
            raise DataError(f"PixelImages needs uint8 pixels shaped (N, H, W), got "
                            f"{getattr(self.pixels, 'dtype', type(self.pixels).__name__)} "
                            f"{getattr(self.pixels, 'shape', '')}")
        check_recipe(self.normalize, self.pad)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        count, height, width = self.pixels.shape
        return count, 1, height + 2 * self.pad, width + 2 * self.pad

    @property
    def size(self) -> int:
        count, channels, height, width = self.shape
        return count * channels * height * width

    @property
    def mean_std(self) -> tuple[float, float]:
        """(mean, std) of the normalisation; (0, 1) when there is none (an exact identity in float32)."""
        return (0.0, 1.0) if self.normalize is None else (float(self.normalize[0]), float(self.normalize[1]))

    @functools.cached_property
    def floats(self) -> np.ndarray:
        """The float32 images on the host, converted on first use and kept."""
        return to_float_images(self.pixels, self.normalize, self.pad)

    def to_tensor(self, backend):
        """The float32 images as a Tensor on ``backend``, made there from the pixels (upload_pixels)."""
        from ..tensor import Tensor

        return Tensor(self.shape, backend, backend.upload_pixels(self.pixels, self.pad, *self.mean_std))

    def head(self, count: int) -> "PixelImages":
        """The first ``count`` images, with the same recipe."""
        return PixelImages(self.pixels[:count], self.normalize, self.pad)
