"""The float32 images a network reads, made from uint8 pixels: (pixel / 255 − mean) / std,
zero-padded before normalising.

Below both the backends (the host's ``upload_pixels`` runs it; a GPU runs the same recipe as a
kernel) and the data sets (``data.pixels.PixelImages``), so that neither imports the other.
"""

from __future__ import annotations

import numpy as np


def to_float_images(images: np.ndarray, normalize=None, pad: int = 0) -> np.ndarray:
    """uint8 (N, H, W) → float32 (N, 1, H+2·pad, W+2·pad): /255, zero-padded, then normalised."""
    count, height, width = images.shape
    out = np.zeros((count, 1, height + 2 * pad, width + 2 * pad), dtype=np.float32)
    interior = out[:, 0, pad:pad + height, pad:pad + width]
    np.divide(images, np.float32(255.0), out=interior)
    if normalize is not None:
        mean, std = (np.float32(value) for value in normalize)
        out -= mean
        out /= std
    return out
