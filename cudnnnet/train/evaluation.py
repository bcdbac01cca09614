"""Mean loss and accuracy of a network over a whole set: its batches copied from the host
(``evaluate``) or views of a set already on the device (``evaluate_batches``), the totals added up
on the device (``Accumulator``) and read once."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..data.loader import BatchLoader
from ..data.resident import BatchFeed
from ..network import Network
from ..tensor import Tensor


@dataclass
class Evaluation:
    loss: float
    accuracy: float
    predictions: np.ndarray | None = None  # (N,) argmax per sample, when asked for


class Accumulator:
    """Loss sum and correct count on the device, read only when a figure is needed."""

    def __init__(self, backend):
        self.values = Tensor.zeros((2,), backend)  # [Σ batch mean losses (training) or the set's mean loss, Σ correct]
        self.loss_sum = self.values.view((1,), 0)
        self.correct = self.values.view((1,), 1)

    def reset(self) -> None:
        self.values.fill_(0.0)

    def read(self) -> tuple[float, float]:
        loss_sum, correct = self.values.numpy().reshape(-1)
        return float(loss_sum), float(correct)


def evaluate(network: Network, images: np.ndarray, labels: np.ndarray, batch_size: int = 1000,
             keep_predictions: bool = False) -> Evaluation:
    """Mean loss and accuracy over a whole set (and, if asked, each sample's predicted class),
    its batches copied from the host; the labels are one-hot over the network's scores."""
    scores = int(np.prod(network.output_shapes(images.shape[1:])[-1]))
    loader = BatchLoader(images, labels, batch_size, shuffle=False, classes=scores)
    feed = BatchFeed(network.backend, images.shape[1:], loader.classes)
    batches = (feed(batch_images, onehot) for batch_images, onehot, _ in loader.epoch_batches(0))
    return evaluate_batches(network, batches, loader.num_samples, keep_predictions)


def evaluate_batches(network: Network, batches, count: int, keep_predictions: bool = False) -> Evaluation:
    """``evaluate`` over (x, one-hot target) tensor pairs covering ``count`` samples.

    The network runs in evaluation mode (``Network.evaluating``). Without predictions, each batch's
    loss and hits are added up on the device straight from the loss layer's input (one fused kernel
    per batch for Softmax on CUDA, no softmax output) and read once, at the end: one
    synchronisation for the whole set.
    """
    with network.evaluating():  # Dropout off, BatchNorm on its running statistics
        if keep_predictions:
            return _evaluate_with_predictions(network, batches, count)
        totals = Accumulator(network.backend)  # both zero
        for x, target in batches:
            # loss += (1/count)·Σₙ Jₙ over the batch;  correct += its hits
            network.forward_metrics(x, target, totals.loss_sum, totals.correct, 1.0 / count)
        loss, correct = totals.read()
    return Evaluation(loss, correct / count)


def _evaluate_with_predictions(network: Network, batches, count: int) -> Evaluation:
    """``evaluate_batches`` keeping each sample's predicted class: the loss layer's output is read
    back per batch (and its loss with it)."""
    totals = Accumulator(network.backend)
    predictions = []
    loss_sum = 0.0
    for x, target in batches:
        output = network.forward(x)
        network.loss_layer.loss(target, totals.loss_sum)
        loss_sum += totals.loss_sum.item() * x.n
        network.loss_layer.correct(target, totals.correct, accumulate=True)
        predictions.append(output.numpy().reshape(x.n, -1).argmax(axis=1))
    correct = totals.correct.item()
    return Evaluation(loss_sum / count, correct / count, np.concatenate(predictions))
