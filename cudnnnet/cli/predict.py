"""cudnnnet-predict: the digit in each image file, with a trained checkpoint.

    python scripts/predict.py --weights runs/mnist_cnn/model.npz 5.jpg digits/ [--json]

Exit code 0 when every image was predicted, 2 when any could not be read (each named on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys

from ..backends import DEVICES
from ..network import Network
from ..predict import predict
from .common import EXIT_USAGE, add_common_arguments, run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cudnnnet-predict", description="Recognise the digit in image files.")
    parser.add_argument("--weights", required=True, metavar="CHECKPOINT", help="a model.npz written by cudnnnet-train")
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files (PNG, JPEG, BMP, ...) or folders")
    parser.add_argument("--device", choices=DEVICES, default="auto", help="where to run (default auto)")
    parser.add_argument("--json", action="store_true", help="print a JSON list of {image, digit, probabilities}")
    add_common_arguments(parser)
    return parser


def main_with_args(args) -> int:
    network = Network.load(args.weights, backend=args.device)
    results = predict(network, args.images)
    for result in results:
        if result.error is not None:
            print(f"cudnnnet-predict: error: {result.error}", file=sys.stderr)
    if args.json:
        print(json.dumps([result.to_dict() for result in results], indent=2))
    else:
        for result in results:
            if result.error is None:
                print(f"{result.image}: {result.digit} (probability {result.probability:.4f})")
    if not results:
        print("cudnnnet-predict: error: no image files found in the paths given", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_USAGE if any(result.error is not None for result in results) else 0


def main(argv=None) -> int:
    return run(main_with_args, build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
