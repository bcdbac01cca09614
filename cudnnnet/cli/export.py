"""cudnnnet-export: a trained model in a format other tools read.

    cudnnnet-export --weights runs/mnist_cnn --format onnx --output mnist_cnn.onnx
    cudnnnet-export --weights runs/mnist_cnn/model.npz --format safetensors --output mnist_cnn.safetensors
    cudnnnet-export --weights pretrained/ --config original_cnn --format onnx --output original_cnn.onnx

``--weights`` takes what cudnnnet-predict takes: an output folder, a ``model.npz`` or ``.safetensors``
checkpoint, or (with ``--config``) a directory of the original's ``.bin`` files or a PyTorch
state_dict's ``.safetensors``. ONNX needs the ``onnx`` extra (``pip install 'cudnnnet[onnx]'``);
safetensors needs nothing more. The output is written atomically.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ..config.shipped import shipped_config_names
from ..errors import UsageError
from ..inference import network_classes
from ..interop.onnx_export import Preprocessing, export_onnx, preprocessing_of, require_onnx
from ..interop.safetensors_file import SUFFIX
from ..train.trainer import class_names
from .common import ArgumentParser, add_common_arguments, path_argument, run
from .predict import load_network

log = logging.getLogger("cudnnnet.export")

FORMATS = {"onnx": ".onnx", "safetensors": SUFFIX}


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="cudnnnet-export", description="Write a trained model as ONNX or safetensors.")
    parser.add_argument("--weights", required=True, type=path_argument, metavar="RUN_OR_CHECKPOINT",
                        help="an output folder of cudnnnet-train, a model.npz or .safetensors checkpoint, or with "
                             "--config a directory of the original's .bin files or a PyTorch .safetensors file")
    parser.add_argument("--config", type=path_argument, metavar="CONFIG",
                        help="with weights that do not describe their network: a YAML config (a file, or a shipped "
                             f"config by name: {', '.join(shipped_config_names())})")
    parser.add_argument("--format", required=True, choices=tuple(FORMATS), help="onnx or safetensors")
    parser.add_argument("--output", required=True, type=path_argument, metavar="FILE",
                        help="the file to write (.onnx for onnx, .safetensors for safetensors)")
    add_common_arguments(parser, progress_bar=False)
    return parser


def check_output(output: Path, fmt: str) -> None:
    """The output names a file of the format's suffix, not a folder."""
    if output.suffix != FORMATS[fmt]:
        raise UsageError(f"--output {output}: a {fmt} file ends in {FORMATS[fmt]}")
    if output.is_dir():
        raise UsageError(f"--output {output}: is a folder; give the file to write")


def preprocessing(network, normalize, config_path) -> Preprocessing:
    """The network's own preprocessing, or with --config the config's (its normalisation, padding, classes)."""
    if config_path is None or network.training_config is not None:
        return preprocessing_of(network)
    from ..config.schema import load_model_description

    description = load_model_description(config_path)
    named = class_names(description)
    classes = network_classes(network)
    return Preprocessing(normalize, description.data.pad, tuple(named) if named and len(named) == len(classes)
                         else classes)


def main_with_args(args) -> int:
    output = Path(args.output)
    check_output(output, args.format)
    if args.format == "onnx":
        require_onnx()  # before the checkpoint is read
    network, normalize = load_network(args.weights, args.config, "host")
    if args.format == "onnx":
        export_onnx(network, output, preprocessing(network, normalize, args.config))
    else:
        config = (network.checkpoint_metadata or {}).get("config")
        network.save(output, **({} if config is None else {"config": config}))
    log.info("wrote %s", output)
    return 0


def main(argv=None) -> int:
    return run(main_with_args, build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
