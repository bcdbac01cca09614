"""cudnnnet-train: train a network from a YAML config.

    python scripts/train.py --config configs/mnist_mlp.yaml --device host --epochs 1 --output /tmp/run
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from ..backends import DEVICES
from ..config import load_config
from ..training import Interrupted, Trainer
from .common import add_common_arguments, run

log = logging.getLogger("cudnnnet.train")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cudnnnet-train", description="Train a network from a YAML config.")
    parser.add_argument("--config", required=True, help="YAML config (see configs/)")
    parser.add_argument("--device", choices=DEVICES, help="override the config's device (auto uses a GPU when usable)")
    parser.add_argument("--data-dir", help="MNIST directory (default: $CUDNNNET_DATA, else the user cache, downloading)")
    parser.add_argument("--epochs", type=positive_int, help="override train.epochs")
    parser.add_argument("--steps", type=positive_int, help="stop after this many steps (overrides --epochs)")
    parser.add_argument("--batch-size", type=positive_int, help="override train.batch_size")
    parser.add_argument("--seed", type=non_negative_int, help="override train.seed")
    parser.add_argument("--output", default=None, help="output directory (default runs/<config name>)")
    parser.add_argument("--resume", metavar="CHECKPOINT", help="continue from a model.npz or interrupted.npz")
    parser.add_argument("--export-original", metavar="DIR",
                        help="after training, also write the weights as the C++ original's .bin files into DIR")
    parser.add_argument("--no-graph", action="store_true", help="on the GPU, run each step eagerly, not as a CUDA graph")
    add_common_arguments(parser)
    return parser


def main_with_args(args) -> int:
    config = load_config(args.config).with_overrides(
        epochs=args.epochs, steps=args.steps, batch_size=args.batch_size, seed=args.seed, device=args.device,
        data_dir=args.data_dir,
    )
    output = args.output or f"runs/{Path(args.config).stem}"
    trainer = Trainer(config, output, resume=args.resume, progress=not args.quiet and sys.stderr.isatty())
    try:
        metrics = trainer.run()
    except Interrupted as interrupted:
        print(f"cudnnnet-train: {interrupted}", file=sys.stderr)
        return 128 + interrupted.signum
    if args.export_original:
        trainer.network.save_original(args.export_original)
    log.info("test accuracy %.4f, test loss %.4f, %.1f s, %.0f images/s on %s; outputs in %s",
             metrics["test_accuracy"], metrics["test_loss"], metrics["train_seconds"],
             metrics["images_per_second"], metrics["device"], output)
    print(json.dumps({key: metrics[key] for key in ("device", "epochs", "steps", "test_accuracy", "test_loss",
                                                      "train_seconds", "images_per_second")}))
    return 0


def main(argv=None) -> int:
    return run(main_with_args, build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
