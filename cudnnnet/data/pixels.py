"""Images as stored (uint8 pixels) and the float32 images a network reads from them.

Pixels are bytes, (N, H, W) for grey images or (N, C, H, W); the network reads float32
(pixel / 255 − mean) / std, zero-padded before normalising, with one (mean, std) for every channel
or one per channel. ``to_float_images`` (``float_images.py``) does that on the host. ``PixelImages`` keeps the bytes and
the recipe together, so that a data set resident on a GPU is copied there as bytes (a quarter of
the float32 size) and expanded there by a kernel (``PixelImages.to_tensor``), while host code that
needs the floats converts once (``PixelImages.floats``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..errors import DataError
from ..float_images import as_channels, to_float_images  # noqa: F401 (to_float_images re-exported)


@dataclass(frozen=True)
class Split:
    """One split of a data set as its loaders return it: the stored pixels, the labels and the class names."""
    pixels: np.ndarray  # uint8 (N, H, W) or (N, C, H, W)
    labels: np.ndarray  # int64 (N,)
    classes: tuple[str, ...]


# data.resize: how an image of another shape is fitted to a network's input (images.fitted): crop
# resizes it so its shorter side covers the input and takes the centre (the aspect ratio kept);
# stretch resizes it to the input (the aspect ratio changed).
RESIZE_MODES = ("crop", "stretch")
# data.channels of an image folder, and what images.photo_array makes of an image: 1 grey, 3 RGB, or auto
# (grey for an image of a grey mode, RGB for any other; a folder is RGB as soon as one image is)
PHOTO_CHANNELS = (1, 3, "auto")
# the most pixels an image file may declare (predict and image-folder training refuse one above it from its
# header) and an image folder's data.image_size may ask for
MAX_IMAGE_PIXELS = 50_000_000
# the suffixes (lower case) of the files read as images from a folder, by image-folder training and by predict
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".gif", ".tif", ".tiff", ".ppm", ".pgm", ".pbm", ".pnm",
                  ".pfm")


def check_recipe(normalize, pad) -> None:
    """DataError unless ``pad`` is an integer >= 0 and ``normalize`` is None or a finite (mean, std > 0),
    each a number or a sequence of one number per channel."""
    if isinstance(pad, bool) or not isinstance(pad, (int, np.integer)) or pad < 0:
        raise DataError(f"pad must be an integer >= 0, got {pad!r}")
    if normalize is None:
        return
    try:
        mean, std = (np.atleast_1d(np.asarray(value, dtype=np.float64)) for value in normalize)
    except (TypeError, ValueError) as error:
        raise DataError(f"normalize must be None or (mean, std), got {normalize!r}") from error
    if mean.ndim != 1 or mean.shape != std.shape:
        raise DataError(f"normalize needs a mean and a std of one value, or one per channel each, got {normalize!r}")
    if not (np.isfinite(mean).all() and np.isfinite(std).all() and (std > 0).all()):
        raise DataError(f"normalize needs a finite mean and a std > 0, got {normalize!r}")


def channel_statistics(pixels: np.ndarray, chunk_bytes: int = 1 << 24) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean per channel, std per channel) of pixels / 255 over a whole uint8 set, from exact integer
    sums of the bytes and of their squares, taken ``chunk_bytes`` of pixels at a time (whole images, or rows
    of one image larger than that), so that their 32-bit copy stays small whatever the images' size."""
    images = as_channels(pixels)
    count, channels, height, width = images.shape
    per_chunk = max(1, chunk_bytes // max(channels * height * width, 1))
    rows = height if channels * height * width <= chunk_bytes else max(1, chunk_bytes // max(channels * width, 1))
    total, squares = np.zeros(channels, dtype=np.uint64), np.zeros(channels, dtype=np.uint64)
    for start in range(0, count, per_chunk):
        for top in range(0, height, rows):
            block = images[start:start + per_chunk, :, top:top + rows].astype(np.uint32)
            total += block.sum(axis=(0, 2, 3), dtype=np.uint64)
            block *= block
            squares += block.sum(axis=(0, 2, 3), dtype=np.uint64)
            del block  # before the next block is made
    samples = max(count * height * width, 1)
    mean = total.astype(np.float64) / samples
    std = np.sqrt(np.maximum(squares.astype(np.float64) / samples - mean ** 2, 0.0)) / 255.0
    mean /= 255.0
    return (tuple(round(float(value), 6) for value in mean),
            tuple(round(float(value), 6) if value > 0 else 1.0 for value in std))  # a constant channel: unscaled


@dataclass(frozen=True, eq=False)
class PixelImages:
    """uint8 ``pixels`` (N, H, W) or (N, C, H, W) read as the float32 images (N, C, H+2·pad, W+2·pad)
    that ``to_float_images(pixels, normalize, pad)`` makes; ``shape`` and ``size`` are the float images'."""

    pixels: np.ndarray  # uint8 (N, H, W) or (N, C, H, W)
    normalize: tuple | None = None  # (mean, std), each one value or one per channel, applied after /255 and the padding
    pad: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.pixels, np.ndarray) or self.pixels.dtype != np.uint8 or self.pixels.ndim not in (3, 4):
            raise DataError(f"PixelImages needs uint8 pixels shaped (N, H, W) or (N, C, H, W), got "
                            f"{getattr(self.pixels, 'dtype', type(self.pixels).__name__)} "
                            f"{getattr(self.pixels, 'shape', '')}")
        check_recipe(self.normalize, self.pad)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        count, channels, height, width = as_channels(self.pixels).shape
        return count, channels, height + 2 * self.pad, width + 2 * self.pad

    @property
    def size(self) -> int:
        count, channels, height, width = self.shape
        return count * channels * height * width

    @property
    def mean_std(self) -> tuple[float, float] | None:
        """(mean, std) shared by every channel; (0, 1) when there is none (an exact identity in float32);
        None when the channels differ."""
        if self.normalize is None:
            return (0.0, 1.0)
        mean, std = (np.unique(np.atleast_1d(np.asarray(value, dtype=np.float64))) for value in self.normalize)
        return (float(mean[0]), float(std[0])) if mean.size == 1 and std.size == 1 else None

    @functools.cached_property
    def floats(self) -> np.ndarray:
        """The float32 images on the host, converted on first use and kept."""
        return to_float_images(self.pixels, self.normalize, self.pad)

    def to_tensor(self, backend):
        """The float32 images as a Tensor on ``backend``, made there from the pixels (upload_pixels, each
        channel a plane of its own) where every channel shares one (mean, std); else the floats made here."""
        from ..tensor import Tensor

        if self.mean_std is None:
            return Tensor(self.shape, backend, backend.upload(self.floats))
        count, channels, height, width = as_channels(self.pixels).shape
        planes = self.pixels.reshape(count * channels, height, width)
        return Tensor(self.shape, backend, backend.upload_pixels(planes, self.pad, *self.mean_std))

    def head(self, count: int) -> "PixelImages":
        """The first ``count`` images, with the same recipe."""
        return PixelImages(self.pixels[:count], self.normalize, self.pad)
