"""cudnnnet-evaluate: test accuracy, loss and confusion matrix of a checkpoint on the test set of the data
it was trained on (MNIST's, or the data set its config names), the matrix labelled with its class names."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

import numpy as np

from ..backends import DEVICES
from ..data.mnist import IMAGE_SIDE, load_mnist
from ..data.pixels import to_float_images
from ..data.sources import load_source
from ..errors import CheckpointError, DataError
from ..inference import network_classes, training_normalize
from ..network import Network
from ..train.outputs import checkpoint_to_resume
from ..train.trainer import evaluate
from ..util.printable import one_line
from .common import ArgumentParser, add_common_arguments, add_engine_argument, path_argument, run
from .train import positive_int


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="cudnnnet-evaluate", description="Evaluate a checkpoint on the test set of its data (MNIST's by default).")
    parser.add_argument("--weights", required=True, type=path_argument, metavar="CHECKPOINT",
                        help="a model.npz written by cudnnnet-train, or the output folder holding it")
    parser.add_argument("--data-dir", type=path_argument,
                        help="the data directory (default: the checkpoint config's data.dir, else $CUDNNNET_DATA or the user cache)")
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


def format_matrix(matrix: np.ndarray, classes=None) -> str:
    """The matrix as text, rows the true class, columns the predicted one, each labelled with its name
    (cut to 12 characters, then escaped as every line the tools write is, so the widths are the printed ones)."""
    names = [one_line(str(name)[:12]) for name in (classes or range(matrix.shape[1]))]
    width = max(5, *(len(name) for name in names))
    label = max(9, *(len(name) for name in names))
    header = "true\\pred".ljust(label) + " " + " ".join(f"{name:>{width}}" for name in names)
    rows = [f"{name:>{label}} " + " ".join(f"{count:>{width}}" for count in row) for name, row in zip(names, matrix)]
    return "\n".join([header] + rows)


def mnist_pad(network: Network, weights: str) -> int:
    """The padding that makes MNIST's 28×28 digits the network's input, (1, 28 + 2·pad, 28 + 2·pad)."""
    channels, height, width = network.input_shape
    pad = (height - IMAGE_SIDE) // 2
    if channels != 1 or height != width or pad < 0 or height != IMAGE_SIDE + 2 * pad:
        raise CheckpointError(f"{weights}: the network takes inputs of shape {network.input_shape}; MNIST's test "
                              f"images are (1, 28 + 2·pad, 28 + 2·pad)")
    return pad


def check_recorded_data_dir(config, weights: str) -> None:
    """The data.dir a checkpoint was trained with, read where --data-dir is not given, is still a folder;
    DataError saying how to name another one otherwise."""
    recorded = config.data.dir
    if recorded is not None and not Path(recorded).is_dir():
        raise DataError(f"{weights}: the data directory it was trained with, {recorded} (its data.dir), does not "
                        f"exist or is not a directory; pass --data-dir DIR, the folder holding its "
                        f"{config.data.dataset} test data")


def test_images(network: Network, args) -> tuple[np.ndarray, np.ndarray]:
    """(float32 (N, C, H, W), int64 (N,)): the test split of the checkpoint's data, prepared as in training."""
    config = network.training_config
    if config is not None and args.data_dir is None:
        check_recorded_data_dir(config, args.weights)
    if config is None or config.data.dataset == "mnist":
        pad = mnist_pad(network, args.weights)
        data_dir = args.data_dir if args.data_dir is not None or config is None else config.data.dir
        return load_mnist(data_dir, "test", normalize=training_normalize(network), pad=pad)
    data = config.data if args.data_dir is None else dataclasses.replace(config.data, dir=args.data_dir)
    loaded = load_source(data, "test")
    images = to_float_images(loaded.pixels, data.normalize, data.pad)
    if images.shape[1:] != tuple(network.input_shape):
        raise CheckpointError(f"{args.weights}: the network takes inputs of shape {network.input_shape}; the test "
                              f"images of {data.dataset} are {images.shape[1:]}")
    return images, loaded.labels


def main_with_args(args) -> int:
    network = Network.load(checkpoint_to_resume(args.weights, "--weights"), backend=args.device)
    network.set_engine(args.engine)
    images, labels = test_images(network, args)
    classes = network_classes(network)
    if labels.size and int(labels.max()) >= len(classes):
        raise DataError(f"the test set has label {int(labels.max())}; {args.weights} knows {len(classes)} classes")
    network.check_batch(min(args.batch_size, len(labels)))
    result = evaluate(network, images, labels, args.batch_size, keep_predictions=True)
    if not math.isfinite(result.loss):
        raise CheckpointError(f"{args.weights}: the network's scores are not finite (NaN or infinite) for some test "
                              f"images, its test loss is {result.loss}: its weights overflow float32")
    matrix = confusion_matrix(labels, result.predictions, len(classes))
    if args.json:
        print(json.dumps({"test_accuracy": result.accuracy, "test_loss": result.loss, "classes": list(classes),
                          "confusion_matrix": matrix.tolist(), "device": network.backend.device_name}))
    else:
        print(f"test accuracy {result.accuracy:.4f}  test loss {result.loss:.4f}  "
              f"({len(labels)} images, {network.backend.device_name})")
        print(format_matrix(matrix, classes))
    return 0


def main(argv=None) -> int:
    return run(main_with_args, build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
