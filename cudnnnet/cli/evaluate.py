"""cudnnnet-evaluate: test accuracy, loss and confusion matrix of a checkpoint on the MNIST test set."""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from ..backends import DEVICES
from ..data.mnist import IMAGE_SIDE, load_mnist
from ..errors import CheckpointError
from ..network import Network
from ..inference import training_normalize
from ..training import evaluate
from .common import ArgumentParser, add_common_arguments, add_engine_argument, run
from .train import positive_int


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="cudnnnet-evaluate", description="Evaluate a checkpoint on MNIST's test set.")
    parser.add_argument("--weights", required=True, metavar="CHECKPOINT", help="a model.npz written by cudnnnet-train")
    parser.add_argument("--data-dir", help="MNIST directory (default: $CUDNNNET_DATA, else the user cache)")
    parser.add_argument("--device", choices=DEVICES, default="auto", help="where to run (default auto)")
    parser.add_argument("--batch-size", type=positive_int, default=1000, help="evaluation batch size")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    add_engine_argument(parser)
    add_common_arguments(parser, progress_bar=False)
    return parser


def confusion_matrix(labels: np.ndarray, predictions: np.ndarray, classes: int = 10) -> np.ndarray:
    """matrix[true, predicted] = count."""
    matrix = np.zeros((classes, classes), dtype=np.int64)
    np.add.at(matrix, (labels, predictions), 1)
    return matrix


def format_matrix(matrix: np.ndarray) -> str:
    header = "true\\pred " + " ".join(f"{p:>5}" for p in range(matrix.shape[1]))
    rows = [f"{t:>9} " + " ".join(f"{count:>5}" for count in row) for t, row in enumerate(matrix)]
    return "\n".join([header] + rows)


def mnist_pad(network: Network, weights: str) -> int:
    """The padding that makes MNIST's 28×28 digits the network's input, (1, 28 + 2·pad, 28 + 2·pad)."""
    channels, height, width = network.input_shape
    pad = (height - IMAGE_SIDE) // 2
    if channels != 1 or height != width or pad < 0 or height != IMAGE_SIDE + 2 * pad:
        raise CheckpointError(f"{weights}: the network takes inputs of shape {network.input_shape}; MNIST's test "
                              f"images are (1, 28 + 2·pad, 28 + 2·pad)")
    return pad


def main_with_args(args) -> int:
    network = Network.load(args.weights, backend=args.device)
    network.backend.set_engine(args.engine)
    pad = mnist_pad(network, args.weights)
    images, labels = load_mnist(args.data_dir, "test", normalize=training_normalize(network), pad=pad)
    network.check_batch(min(args.batch_size, len(labels)))
    result = evaluate(network, images, labels, args.batch_size, keep_predictions=True)
    matrix = confusion_matrix(labels, result.predictions)
    if args.json:
        print(json.dumps({"test_accuracy": result.accuracy, "test_loss": result.loss,
                          "confusion_matrix": matrix.tolist(), "device": network.backend.device_name}))
    else:
        print(f"test accuracy {result.accuracy:.4f}  test loss {result.loss:.4f}  "
              f"({len(labels)} images, {network.backend.device_name})")
        print(format_matrix(matrix))
    return 0


def main(argv=None) -> int:
    return run(main_with_args, build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
