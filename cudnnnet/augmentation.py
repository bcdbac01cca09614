"""Training-batch augmentation for natural images: a random crop of the zero-padded image and a
horizontal flip, drawn per sample from a counter-based hash of (seed, step, sample in the batch).

The draw and the crop are written twice, once here in NumPy (the host backend and host-streamed
batches use it; it is the oracle) and once in ``backends/cuda/kernels/data.cu``
(``gather_augmented_batch``); both give the same bits. For sample ``b`` of the batch of global
step ``step`` with crop padding ``P``:

    h     = mix(mix(mix(seed) + step) + b)                 uint64, wrapping; mix = splitmix64's finaliser
    dy    = ((h & 0xFFFFFF) · (2P + 1)) >> 24  −  P          uniform in [−P, P]
    dx    = (((h >> 24) & 0xFFFFFF) · (2P + 1)) >> 24  −  P
    flip  = (h >> 48) & 1                                  (0 where flips are off)

    out[b, c, y, x] = in[c, y + dy, xs + dx],  xs = W − 1 − x if flip else x,
                      0 where (y + dy, xs + dx) lies outside the image

The padding is zero in the normalised space (after ``(p/255 − mean)/std``), as the random crop of
a normalised tensor pads it. Below both the backends and the data sets, as ``float_images.py`` is.
"""

from __future__ import annotations

import numpy as np

U64 = np.uint64
GOLDEN = U64(0x9E3779B97F4A7C15)
MIX1 = U64(0xBF58476D1CE4E5B9)
MIX2 = U64(0x94D049BB133111EB)
FIELD_BITS = U64(24)  # each offset is drawn from 24 bits of the hash
FIELD_MASK = U64((1 << 24) - 1)
FLIP_BIT = U64(48)
MAX_CROP_PADDING = 65_535  # (2^24 − 1)·(2P + 1) stays below 2^64 far beyond this; it bounds the indices


def mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's step on uint64 values: add the golden gamma, then its finaliser (wrapping)."""
    z = np.asarray(z, dtype=U64) + GOLDEN
    z = (z ^ (z >> U64(30))) * MIX1
    z = (z ^ (z >> U64(27))) * MIX2
    return z ^ (z >> U64(31))


def sample_hashes(seed: int, step: int, batch: int) -> np.ndarray:
    """uint64 (batch,): h = mix(mix(mix(seed) + step) + b) for b = 0 .. batch − 1."""
    key = mix(np.array([seed], dtype=U64)) + U64(step)
    return mix(mix(key) + np.arange(batch, dtype=U64))


def draws(seed: int, step: int, batch: int, padding: int, flip: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dy int64 (batch,), dx int64 (batch,), flipped bool (batch,)) of the batch of global ``step``."""
    hashes = sample_hashes(seed, step, batch)
    span = U64(2 * padding + 1)
    dy = ((hashes & FIELD_MASK) * span >> FIELD_BITS).astype(np.int64) - padding
    dx = (((hashes >> FIELD_BITS) & FIELD_MASK) * span >> FIELD_BITS).astype(np.int64) - padding
    flipped = ((hashes >> FLIP_BIT) & U64(1)).astype(bool) & bool(flip)
    return dy, dx, flipped


def shift_and_flip(images: np.ndarray, dy: np.ndarray, dx: np.ndarray, flipped: np.ndarray) -> np.ndarray:
    """float32 (B, C, H, W): out[b, c, y, x] = images[b, c, y + dy[b], xs + dx[b]] (xs = W − 1 − x where
    flipped[b], else x), +0.0 outside the image."""
    count, channels, height, width = images.shape
    rows = np.arange(height)[None, :] + dy[:, None]  # (B, H)
    columns = np.where(flipped[:, None], width - 1 - np.arange(width)[None, :], np.arange(width)[None, :]) + dx[:, None]
    inside = ((rows >= 0) & (rows < height))[:, None, :, None] & ((columns >= 0) & (columns < width))[:, None, None, :]
    picked = images[np.arange(count)[:, None, None, None], np.arange(channels)[None, :, None, None],
                    np.clip(rows, 0, height - 1)[:, None, :, None], np.clip(columns, 0, width - 1)[:, None, None, :]]
    return np.where(inside, picked, np.float32(0.0)).astype(np.float32, copy=False)


def augment(images: np.ndarray, seed: int, step: int, padding: int, flip: bool) -> np.ndarray:
    """The batch ``images`` (B, C, H, W) of global ``step``, cropped and flipped as described above."""
    return shift_and_flip(images, *draws(seed, step, images.shape[0], padding, flip))
