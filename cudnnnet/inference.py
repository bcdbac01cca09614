"""Classify image files (or arrays) with a trained network.

    network = Network.load("runs/mnist_cnn/model.npz", backend="auto")  # the GPU where usable, else the host
    for result in cudnnnet.predict(network, ["5.jpg", "digits/"]):
        print(result.image, result.label, result.probability)

A network trained on MNIST (or one without a training config: the original's weights) reads
digits, preprocessed like MNIST (see ``cudnnnet.data.images``); any other is given the image fitted
to its input as it was trained (``data.resize``: crop, the shorter side resized to cover the input and
the centre taken; or stretch, for image folders trained so, checkpoints from before the key among
them), grey or RGB as it was trained. Both are
normalised and padded as the network was trained (read from the checkpoint's config), and the
classes are named from it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from .errors import ImageError, InvalidArgumentError
from .tensor import Tensor

log = logging.getLogger(__name__)


@dataclass
class Prediction:
    image: str
    digit: int | None = None  # the predicted class index (for digits, the digit)
    probabilities: list[float] = field(default_factory=list)
    error: str | None = None  # why this image could not be predicted
    classes: tuple[str, ...] = ()  # class names, index = class

    @property
    def probability(self) -> float | None:
        return None if self.digit is None else self.probabilities[self.digit]

    @property
    def label(self) -> str | None:
        """The predicted class's name."""
        return None if self.digit is None else self.classes[self.digit]

    def top(self, count: int) -> list[tuple[str, float]]:
        """The ``count`` most probable (class name, probability), most probable first."""
        order = np.argsort(-np.asarray(self.probabilities), kind="stable")[:count]
        return [(self.classes[index], self.probabilities[index]) for index in order]

    def to_dict(self) -> dict:
        result = {"image": self.image, "digit": self.digit, "label": self.label, "probabilities": self.probabilities}
        if self.error is not None:
            result["error"] = self.error
        return result


def training_normalize(network) -> tuple[float, float] | None:
    """The (mean, std) a network was trained with, from its checkpoint's config (validated when
    ``Network.load`` read it); None (pixels in [0, 1]) without one."""
    return None if network.training_config is None else network.training_config.data.normalize


def reads_digits(network) -> bool:
    """Whether ``network`` reads MNIST-like digits: trained on MNIST, or with no training config (the original's)."""
    return network.training_config is None or network.training_config.data.dataset == "mnist"


def network_classes(network) -> tuple[str, ...]:
    """The class names kept in the checkpoint's config; "0", "1", ... where it has none."""
    config = network.training_config
    if config is not None and config.data.classes:
        return tuple(config.data.classes)
    from .data.sources import class_names

    named = class_names(config) if config is not None else None
    count = int(np.prod(network.output_shapes(network.input_shape)[-1]))
    return tuple(named) if named and len(named) == count else tuple(str(index) for index in range(count))


def _inputs(images, network, normalize) -> Iterator[tuple[str, np.ndarray | None, str | None]]:
    """(name, preprocessed (C, H, W) array or None, error or None) for every image given, each read when
    it is reached: a folder of many images is never held whole."""
    from .data.images import list_images  # Pillow: imported when predicting, not with cudnnnet

    load = _digit_loader(network, normalize) if reads_digits(network) else _photo_loader(network, normalize)
    count = 0
    for item in _items(images):
        if not isinstance(item, (str, os.PathLike)):  # an in-memory image: an array or a PIL image
            kind = "array" if isinstance(item, np.ndarray) else "image"
            yield _prepare(f"<{kind} {count}>", lambda item=item: load(item))
            count += 1
            continue
        for path in list_images(item):
            yield _prepare(str(path), lambda path=path: load(path))
            count += 1


def _items(images) -> Iterator:
    """Each image, file or folder of ``images``: one of them, or an iterable of them; an array holding
    several images (``array_images``) gives each in turn."""
    from PIL import Image

    if isinstance(images, (str, os.PathLike, np.ndarray, Image.Image)):
        images = [images]
    for item in images:
        if isinstance(item, np.ndarray):
            yield from array_images(item)
        elif isinstance(item, (str, os.PathLike, Image.Image)):
            yield item
        else:
            raise InvalidArgumentError(f"predict takes image files, folders, NumPy arrays or PIL images (or a list of "
                                       f"them), got {type(item).__name__}")


IMAGE_CHANNELS = (1, 3, 4)  # grey, RGB, RGBA


def array_images(array: np.ndarray) -> list[np.ndarray]:
    """The images an array holds, each (H, W) or (H, W, C): itself where it is one image, (H, W) or
    (H, W, C); else one per leading index of (N, H, W), (N, C, H, W) or (N, H, W, C) (C 1, 3 or 4;
    channels first where both readings fit)."""
    if array.ndim == 2 or (array.ndim == 3 and array.shape[-1] in IMAGE_CHANNELS):
        return [array]
    if array.ndim == 3:
        return list(array)
    if array.ndim == 4 and array.shape[1] in IMAGE_CHANNELS:
        return list(array.transpose(0, 2, 3, 1))
    if array.ndim == 4 and array.shape[-1] in IMAGE_CHANNELS:
        return list(array)
    raise InvalidArgumentError(f"predict reads an array of shape {array.shape} as no image: give (H, W) or (H, W, C) "
                               f"for one image, (N, H, W), (N, C, H, W) or (N, H, W, C) for N (C is 1, 3 or 4)")


def _digit_loader(network, normalize):
    from .data.images import load_image, preprocess

    channels, height, width = network.input_shape
    if channels != 1 or height != width:
        raise InvalidArgumentError(f"predict reads grey square digits; this network takes {network.input_shape}")
    return lambda item: load_image(item, height, normalize) if isinstance(item, (str, os.PathLike)) else \
        preprocess(item, height, normalize)


def _photo_loader(network, normalize):
    """image -> float32 (C, H, W): fitted (``data.resize``), /255, padded and normalised as in training."""
    from .data.images import load_photo, photo_pixels
    from .data.pixels import to_float_images

    channels, height, width = network.input_shape
    if channels not in (1, 3):
        raise InvalidArgumentError(f"predict reads grey or RGB images; this network takes {network.input_shape}")
    pad, resize = network.training_config.data.pad, network.training_config.data.resize
    size = (channels, height - 2 * pad, width - 2 * pad)

    def load(item):
        pixels = (load_photo(item, *size, resize=resize) if isinstance(item, (str, os.PathLike))
                  else photo_pixels(item, *size, resize=resize))
        return to_float_images(pixels[None], normalize, pad)[0]
    return load


def _prepare(name: str, load):
    try:
        return name, load(), None
    except ImageError as error:
        log.debug("%s: %s", name, error)
        return name, None, str(error)


def predict(network, images, normalize=None, batch_size: int = 256) -> list[Prediction]:
    """A Prediction per image, in the order given: ``images`` is an image file, a folder (every image
    inside), a PIL image, a NumPy array of one image ((H, W) or (H, W, C)) or of N ((N, H, W),
    (N, C, H, W) or (N, H, W, C)), or a list of any of these.

    An image that cannot be read, or whose scores are not finite, gets a Prediction whose ``error``
    says why; the others are still predicted. ``normalize`` defaults to the network's training normalisation.
    """
    if network.input_shape is None:
        raise InvalidArgumentError("predict needs a built network (Network.load a checkpoint, or train one)")
    normalize = training_normalize(network) if normalize is None else normalize
    classes = network_classes(network)
    results, waiting, checked = [], [], False
    for name, array, error in _inputs(images, network, normalize):
        results.append(Prediction(name, error=error, classes=classes))
        if array is not None:
            waiting.append((results[-1], array))
        if len(waiting) == batch_size:
            checked = _predict_batch(network, waiting, checked)
            waiting = []
    if waiting:
        _predict_batch(network, waiting, checked)
    return results


def _predict_batch(network, waiting: list, checked: bool) -> bool:
    """Fill in each waiting Prediction from one batch of its arrays (an error where its scores are not
    finite); the first batch, the largest, is checked against the machine first. Returns that it was."""
    if not checked:
        network.check_batch(len(waiting))
    batch = np.stack([array for _, array in waiting])  # (B, C, H, W)
    probabilities = network.predict(Tensor.from_numpy(batch, network.backend)).numpy().reshape(len(waiting), -1)
    for (result, _), row in zip(waiting, probabilities):
        if not np.isfinite(row).all():  # weights or statistics that overflow float32 on this image
            result.error = (f"{result.image}: the network's scores for it are not finite (NaN or infinite): its "
                            f"weights overflow float32")
            continue
        result.digit = int(np.argmax(row))
        result.probabilities = [round(float(p), 6) for p in row]
    return True


__all__ = ["Prediction", "network_classes", "predict", "training_normalize"]
