"""What a training needs before its first step, for the Trainer and the command line alike: the
input shape, the network built from a config, and the data (its splits, classes and validation share).
The checks of the model against the config and the data are training_checks.py."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np

from ..config.schema import COMPUTED, Config
from ..data.image_folder import class_names as folder_classes
from ..data.pixels import PixelImages, as_channels, channel_statistics
from ..data.sources import class_names, load_source
from ..data.validation import check_labels as check_validation_labels, hold_out
from ..errors import DataError
from ..io.files import atomic_write
from ..network import Network

log = logging.getLogger(__name__)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    with atomic_write(path) as file:
        file.write(text.encode("utf-8"))


KNOWN_SHAPES = {"mnist": (1, 28, 28), "fashion-mnist": (1, 28, 28), "kmnist": (1, 28, 28), "cifar10": (3, 32, 32)}


def input_shape(config) -> tuple[int, int, int] | None:
    """The (C, H, W) of one input sample of ``config`` (a Config or a ModelDescription); None where
    only the data can say (an npz, idx or image-folder set whose shape was not yet read)."""
    data = config.data
    shape = data.shape or KNOWN_SHAPES.get(data.dataset)
    if shape is None and data.dataset == "image-folder" and data.image_size and data.channels != "auto":
        shape = (data.channels, *data.image_size)
    if shape is None:
        return None
    return (shape[0], shape[1] + 2 * data.pad, shape[2] + 2 * data.pad)


def smallest_input_shape(config) -> tuple[int, int, int] | None:
    """``input_shape``, or where only the images' channels are unknown (an image folder with an image_size
    and channels auto) its one-channel shape, which every tensor of the model is at least as large for."""
    data = config.data
    if data.dataset == "image-folder" and data.image_size and data.channels == "auto" and not data.shape:
        return (1, data.image_size[0] + 2 * data.pad, data.image_size[1] + 2 * data.pad)
    return input_shape(config)


def model_mapping(config) -> list[dict]:
    """``config``'s layers (a Config or a ModelDescription) as Network.from_spec takes them."""
    return [{"type": spec.type, "name": spec.name, **spec.params} for spec in config.model]


def build_network(config: Config, backend) -> Network:
    return Network.from_spec(model_mapping(config), input_shape(config), backend, seed=config.train.seed)


def load_split(config: Config, split: str, download: bool = True):
    """(images float32 (N, C, H, W), labels int64 (N,)) of ``split`` as ``config`` prepares them."""
    images, labels = load_split_pixels(config, split, download)
    return images.floats, labels


def load_split_pixels(config: Config, split: str, download: bool = True):
    """(PixelImages, labels int64 (N,)): ``load_split`` with the float conversion left to whoever
    needs the floats (a resident set is converted on the device). A ``computed`` normalisation is
    the training split's per-channel mean and std."""
    loaded = load_source(config.data, split, download)
    normalize = config.data.normalize
    if normalize == COMPUTED:
        train = loaded if split == "train" else load_source(config.data, "train", download)
        normalize = channel_statistics(train.pixels)
    return PixelImages(loaded.pixels, normalize, config.data.pad), loaded.labels


def data_classes(config: Config, train_labels: np.ndarray) -> tuple[str, ...]:
    """The class names: the config's or the named data set's, an image folder's sub-folders, else
    "0" .. "K-1" for the training labels 0..K-1."""
    named = class_names(config)
    if named:
        return tuple(named)
    if config.data.dataset == "image-folder":
        root = Path(config.data.dir)
        return folder_classes(root / "train" if (root / "train").is_dir() and (root / "test").is_dir() else root)
    return tuple(str(index) for index in range(int(train_labels.max()) + 1))


def _check_labels_name_classes(labels: np.ndarray, split: str, classes: tuple[str, ...], config: Config) -> None:
    """DataError naming the first label of ``split`` that is no class's: at least len(classes)."""
    outside = np.flatnonzero(labels >= len(classes))
    if outside.size:
        index = int(outside[0])
        named = "data.classes names" if config.data.classes else "the training split's labels make"
        raise DataError(f"the {split} split has label {int(labels[index])} at index {index}; {named} {len(classes)} "
                        f"classes (labels 0..{len(classes) - 1})")


def load_data(config: Config, download: bool = True):
    """(config with data.classes, data.shape and a computed normalisation filled in,
    (train PixelImages, labels), (test PixelImages, labels), (validation PixelImages, labels) or None);
    each split read by ``load_split_pixels``, the validation set held out of the training split or read
    (``validation.hold_out``) before a normalisation is computed from it."""
    data = config.data
    as_read = config if data.normalize != COMPUTED else dataclasses.replace(
        config, data=dataclasses.replace(data, normalize=None))
    train, train_labels = load_split_pixels(as_read, "train", download)
    train_pixels, train_labels, held_pixels, held_labels = hold_out(data, train.pixels, train_labels)
    train = PixelImages(train_pixels, train.normalize, train.pad)
    as_trained = dataclasses.replace(as_read, data=dataclasses.replace(
        as_read.data, shape=tuple(as_channels(train.pixels).shape[1:])))  # a test/ folder's channels: auto, as trained
    test, test_labels = load_split_pixels(as_trained, "test", download)
    classes = data_classes(config, train_labels)
    for split, labels in (("training", train_labels), ("test", test_labels)):
        _check_labels_name_classes(labels, split, classes, config)
    if held_labels is not None:
        check_validation_labels(held_labels, classes)
    if as_channels(test.pixels).shape[1:] != as_channels(train.pixels).shape[1:]:
        raise DataError(f"the test images are {as_channels(test.pixels).shape[1:]} (C, H, W), the training images "
                        f"{as_channels(train.pixels).shape[1:]}; both need one shape (image folders: set "
                        f"data.image_size)")
    normalize = data.normalize
    if normalize == COMPUTED:
        normalize = channel_statistics(train.pixels)
        log.info("per-channel mean %s, std %s from the training set", normalize[0], normalize[1])
        train, test = PixelImages(train.pixels, normalize, data.pad), PixelImages(test.pixels, normalize, data.pad)
    resolved = dataclasses.replace(data, classes=classes, shape=tuple(as_channels(train.pixels).shape[1:]),
                                   normalize=normalize)
    validation = None if held_labels is None else (PixelImages(held_pixels, normalize, data.pad), held_labels)
    return dataclasses.replace(config, data=resolved), (train, train_labels), (test, test_labels), validation


def local_splits(config: Config):
    """``load_data`` where both splits are on disk and read without error, else None (the caller
    then loads them, downloading or raising as load_data does)."""
    try:
        return load_data(config, download=False)
    except DataError:
        return None
