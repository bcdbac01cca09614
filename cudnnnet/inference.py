"""Recognise digits in image files (or arrays) with a trained network.

    network = Network.load("runs/mnist_cnn/model.npz", backend="auto")  # the GPU where usable, else the host
    for result in cudnnnet.predict(network, ["5.jpg", "digits/"]):
        print(result.image, result.digit, result.probability)

Images are preprocessed like MNIST (see ``cudnnnet.data.images``) at the network's input size and
normalised as the network was trained (read from the checkpoint's config).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import numpy as np

from .errors import ImageError, InvalidArgumentError
from .tensor import Tensor

log = logging.getLogger(__name__)


@dataclass
class Prediction:
    image: str
    digit: int | None = None
    probabilities: list[float] = field(default_factory=list)
    error: str | None = None  # why this image could not be predicted

    @property
    def probability(self) -> float | None:
        return None if self.digit is None else self.probabilities[self.digit]

    def to_dict(self) -> dict:
        result = {"image": self.image, "digit": self.digit, "probabilities": self.probabilities}
        if self.error is not None:
            result["error"] = self.error
        return result


def training_normalize(network) -> tuple[float, float] | None:
    """The (mean, std) a network was trained with, from its checkpoint's config (validated when
    ``Network.load`` read it); None (pixels in [0, 1]) without one."""
    return None if network.training_config is None else network.training_config.data.normalize


def _inputs(images, size: int, normalize) -> list[tuple[str, np.ndarray | None, str | None]]:
    """(name, preprocessed (1, size, size) array or None, error or None) for every image given."""
    from .data.images import list_images, load_image, preprocess  # Pillow: imported when predicting, not with cudnnnet

    if isinstance(images, (str, os.PathLike, np.ndarray)):
        images = [images]
    prepared = []
    for item in images:
        if isinstance(item, np.ndarray):
            prepared.append(_prepare(f"<array {len(prepared)}>", lambda: preprocess(item, size, normalize)))
            continue
        for path in list_images(item):
            prepared.append(_prepare(str(path), lambda path=path: load_image(path, size, normalize)))
    return prepared


def _prepare(name: str, load):
    try:
        return name, load(), None
    except ImageError as error:
        log.debug("%s: %s", name, error)
        return name, None, str(error)


def predict(network, images, normalize=None, batch_size: int = 256) -> list[Prediction]:
    """A Prediction per image: files, folders (every image inside) or arrays, in the order given.

    An image that cannot be read gets a Prediction whose ``error`` says why; the others are still
    predicted. ``normalize`` defaults to the network's training normalisation.
    """
    if network.input_shape is None:
        raise InvalidArgumentError("predict needs a built network (Network.load a checkpoint, or train one)")
    channels, height, width = network.input_shape
    if channels != 1 or height != width:
        raise InvalidArgumentError(f"predict reads grey square digits; this network takes {network.input_shape}")
    normalize = training_normalize(network) if normalize is None else normalize
    prepared = _inputs(images, height, normalize)
    results = [Prediction(name, error=error) for name, _, error in prepared]
    ready = [(index, array) for index, (_, array, _) in enumerate(prepared) if array is not None]
    if ready:
        network.check_batch(min(batch_size, len(ready)))
    for start in range(0, len(ready), batch_size):
        chunk = ready[start:start + batch_size]
        batch = np.stack([array for _, array in chunk])  # (B, 1, H, W)
        probabilities = network.predict(Tensor.from_numpy(batch, network.backend)).numpy().reshape(len(chunk), -1)
        for (index, _), row in zip(chunk, probabilities):
            results[index].digit = int(np.argmax(row))
            results[index].probabilities = [round(float(p), 6) for p in row]
    return results


__all__ = ["Prediction", "predict", "training_normalize"]
