"""The float32 images a network reads, made from uint8 pixels: (pixel / 255 − mean) / std,
zero-padded before normalising, with one (mean, std) for every channel or one per channel.

Below both the backends (the host's ``upload_pixels`` runs it; a GPU runs the same recipe as a
kernel) and the data sets (``data.pixels.PixelImages``), so that neither imports the other.
"""

from __future__ import annotations

import numpy as np

from .errors import DataError


def as_channels(pixels: np.ndarray) -> np.ndarray:
    """uint8 pixels as (N, C, H, W): grey (N, H, W) gains a channel axis (a view)."""
    return pixels[:, None] if pixels.ndim == 3 else pixels


def channel_values(value, channels: int) -> np.ndarray:
    """float32 (C, 1, 1): a mean or std given once or per channel, shaped to broadcast over (N, C, H, W)."""
    values = np.atleast_1d(np.asarray(value, dtype=np.float32))
    if values.size not in (1, channels):
        raise DataError(f"normalize gives {values.size} values for images of {channels} channels; give one or {channels}")
    return np.broadcast_to(values, (channels,)).reshape(channels, 1, 1)


def to_float_images(images: np.ndarray, normalize=None, pad: int = 0) -> np.ndarray:
    """uint8 (N, H, W) or (N, C, H, W) → float32 (N, C, H+2·pad, W+2·pad): /255, zero-padded, then
    normalised (one mean and std, or one per channel)."""
    images = as_channels(images)
    count, channels, height, width = images.shape
    out = np.zeros((count, channels, height + 2 * pad, width + 2 * pad), dtype=np.float32)
    interior = out[:, :, pad:pad + height, pad:pad + width]
    np.divide(images, np.float32(255.0), out=interior)
    if normalize is not None:
        out -= channel_values(normalize[0], channels)
        out /= channel_values(normalize[1], channels)
    return out
