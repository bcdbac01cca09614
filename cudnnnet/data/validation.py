"""``data.validation``: the images each epoch is evaluated on, so that choosing a learning rate or an
epoch count does not tune on the test set.

    data:
      validation: 0.1              # a tenth of the training set held out (seeded by data.split_seed)
      validation: val.npz          # or an .npz of x and y (any data set)
      validation: ~/photos/val     # or, for image-folder, a folder of the training's class sub-folders

Off (absent or null) by default: each epoch is then evaluated on the test set, its rows labelled
``test_loss`` / ``test_accuracy`` as before. On, the rows hold ``validation_loss`` /
``validation_accuracy`` (history.csv, curves.png, the best checkpoint) and the test set is evaluated
once, at the end.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from ..errors import DataError

log = logging.getLogger(__name__)

SPLIT_STREAM = 31  # mixed into data.split_seed: the held-out images differ from an image folder's test split
TEST_FIELDS = ("test_loss", "test_accuracy")
VALIDATION_FIELDS = ("validation_loss", "validation_accuracy")


def parse_validation(data) -> float | str | None:
    """data.validation from a config section (``config_section._Section``): a fraction in (0, 1), a path, or None."""
    value = data.value.get("validation")
    if value is None or value is False:
        return None
    if isinstance(value, str) and value:
        return os.path.expanduser(value)
    if not _is_number(value):
        data.fail("validation", f"expected a fraction of the training set in (0, 1) or the path of an .npz file (for "
                                f"image-folder, also a folder of class sub-folders), got {value!r}")
    return data.number("validation", low=0.0, high=1.0, low_open=True, high_open=True)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def epoch_fields(validating: bool) -> tuple[str, str]:
    """The (loss, accuracy) keys of an epoch's evaluation in its history row."""
    return VALIDATION_FIELDS if validating else TEST_FIELDS


def hold_out(data, pixels: np.ndarray, labels: np.ndarray):
    """(training pixels, training labels, validation pixels or None, validation labels or None) of the
    training split ``pixels``/``labels`` as ``data`` (a DataConfig) says: a seeded share held out, or
    the set its path names (read here, checked against the training images' shape)."""
    validation = data.validation
    if validation is None:
        return pixels, labels, None, None
    if isinstance(validation, float):
        return _held_out_share(validation, data.split_seed, pixels, labels)
    held_pixels, held_labels = _read(Path(validation), data, pixels)
    if held_pixels.shape[1:] != pixels.shape[1:]:
        raise DataError(f"data.validation {validation}: its images are {held_pixels.shape[1:]}, the training images "
                        f"{pixels.shape[1:]}; both need one shape")
    return pixels, labels, held_pixels, held_labels


def _held_out_share(fraction: float, seed: int, pixels: np.ndarray, labels: np.ndarray):
    count = len(labels)
    held = int(round(fraction * count))
    if not 0 < held < count:
        raise DataError(f"data.validation {fraction:g} of {count} training images holds out {held}; it must leave at "
                        f"least one image on each side: choose another fraction")
    chosen = np.zeros(count, dtype=bool)
    chosen[np.random.default_rng([seed, SPLIT_STREAM]).permutation(count)[:held]] = True
    log.info("validation: %d of the %d training images held out (data.validation %g)", held, count, fraction)
    return pixels[~chosen], labels[~chosen], pixels[chosen], labels[chosen]


def _read(path: Path, data, pixels: np.ndarray):
    """(pixels, labels) of the validation set at ``path``: an image folder's class sub-folders, else an .npz."""
    if path.is_dir():
        if data.dataset != "image-folder":
            raise DataError(f"data.validation {path} is a folder; for {data.dataset} give a fraction or an .npz file "
                            f"of x and y")
        return _read_folder(path, data, pixels)
    if not path.is_file():
        raise DataError(f"data.validation {path}: no such file or folder; give a fraction in (0, 1), an .npz file or "
                        f"(image-folder) a folder")
    from .sources import read_npz

    return read_npz(path)


def _read_folder(path: Path, data, pixels: np.ndarray):
    """An image folder's validation images, decoded as its training images were (same classes and channels)."""
    import dataclasses

    from .image_folder import class_names, decoded_folder

    classes = class_names(Path(data.dir) / "train" if (Path(data.dir) / "train").is_dir() and
                          (Path(data.dir) / "test").is_dir() else Path(data.dir))
    unknown = sorted(set(class_names(path)) - set(classes))
    if unknown:
        raise DataError(f"data.validation {path}: class folder {unknown[0]!r} is no training class; the classes are "
                        f"{', '.join(classes)}")
    channels = pixels.shape[1] if pixels.ndim == 4 else 1
    return decoded_folder(path, classes, dataclasses.replace(data, channels=channels))


def check_labels(labels: np.ndarray, classes: tuple[str, ...]) -> None:
    """DataError naming the first validation label that is no class's."""
    outside = np.flatnonzero(labels >= len(classes))
    if outside.size:
        index = int(outside[0])
        raise DataError(f"the validation set has label {int(labels[index])} at index {index}; the training split "
                        f"makes {len(classes)} classes (labels 0..{len(classes) - 1})")
