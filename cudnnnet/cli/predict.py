"""cudnnnet-predict: the class of each image file (the digit, for MNIST), with a trained checkpoint.

    python scripts/predict.py --weights runs/mnist_cnn/model.npz 5.jpg digits/ [--json] [--top-k 3]
    python scripts/predict.py --weights pretrained/ --config configs/mnist_mlp.yaml 5.jpg

``--weights`` takes a ``.npz`` checkpoint (it describes its own network) or a directory of the C++
original's ``.bin`` files, which carry no architecture: ``--config`` then names the YAML config
that built them (its model and its input normalisation; a ``train`` section is not needed).

Exit code 0 when every image was predicted, 2 when any could not be read (each named on stderr).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from ..backends import DEVICES, get_backend
from ..config.schema import load_model_description
from ..config.shipped import shipped_config_names
from ..data.images import IMAGE_SUFFIXES, folder_images
from ..errors import UsageError
from ..inference import predict
from ..interop import safetensors_file
from ..network import Network
from ..train.outputs import is_output_folder
from ..train.trainer import input_shape, model_mapping
from ..util.printable import one_line
from .common import EXIT_USAGE, ArgumentParser, add_common_arguments, add_engine_argument, path_argument, run
from .train import positive_int

log = logging.getLogger("cudnnnet.predict")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="cudnnnet-predict", description="Classify image files (digits, for an MNIST network).")
    parser.add_argument("--weights", required=True, type=path_argument, metavar="CHECKPOINT",
                        help="a model.npz written by cudnnnet-train, the output folder holding it, a .safetensors "
                             "file (cudnnnet-export's; or a PyTorch state_dict's, with --config), or a directory of "
                             "the original's .bin files")
    parser.add_argument("--config", type=path_argument, metavar="CONFIG",
                        help="with a .bin directory or a PyTorch .safetensors file: a YAML config describing its network (model and data; a "
                             f"file, or a shipped config by name: {', '.join(shipped_config_names())})")
    parser.add_argument("images", nargs="+", type=path_argument, metavar="IMAGE",
                        help="image files (PNG, JPEG, BMP, ...) or folders")
    parser.add_argument("--device", choices=DEVICES, default="auto", help="where to run (default auto)")
    parser.add_argument("--json", action="store_true", help="print a JSON list of {image, digit, label, probabilities}")
    parser.add_argument("--top-k", type=positive_int, default=1, metavar="K",
                        help="print the K most probable classes of each image (default 1)")
    add_engine_argument(parser)
    add_common_arguments(parser, progress_bar=False)
    return parser


def load_network(weights: str, config_path: str | None, device: str) -> tuple[Network, tuple[float, float] | None]:
    """The network of ``weights`` and the input normalisation (mean, std) to predict with.

    The normalisation is None for a checkpoint, whose own config says it (see ``predict``). A
    ``.safetensors`` file without a cudnnnet model description (a PyTorch state_dict's) is read into
    the network ``config_path`` describes, as a directory of the original's ``.bin`` files is.
    """
    weights = Path(weights)
    if is_output_folder(weights) or (weights / "model.npz").is_symlink():  # a link to a set that is gone: named
        weights = weights / "model.npz"
    if safetensors_file.is_safetensors(weights) and config_path is not None and weights.is_file() \
            and not safetensors_file.load_safetensors_metadata(weights):
        network, description = network_of_config(config_path, device)
        network.load_weights(weights)
        return network, description.data.normalize
    if not weights.is_dir():
        if config_path is not None:
            log.warning("--config %s is not used: the checkpoint %s describes its own network", config_path, weights)
        return Network.load(weights, backend=device), None
    if config_path is None:
        raise UsageError(f"{weights} is a directory, read as the original's .bin files, which do not say the "
                         f"network's architecture: add --config CONFIG (the YAML config they were trained with)")
    network, description = network_of_config(config_path, device)
    network.load_original(weights)
    return network, description.data.normalize


def network_of_config(config_path: str, device: str):
    """(the network a config's model describes, built with its initial weights; the config's description)."""
    description = load_model_description(config_path)
    if input_shape(description) is None:
        raise UsageError(f"--config {config_path}: its data ({description.data.dataset}) does not say the input shape; "
                         f"add data.shape [channels, height, width] to it")
    return Network.from_spec(model_mapping(description), input_shape(description), get_backend(device)), description


def print_results(results, as_json: bool, top_k: int = 1) -> None:
    """Each error on its own line of stderr, then the predictions: one line per image, or a JSON list
    (which escapes what a file name holds as JSON does)."""
    for result in results:
        if result.error is not None:
            print(f"cudnnnet-predict: error: {one_line(result.error)}", file=sys.stderr)
    if as_json:
        print(json.dumps([dict(result.to_dict(), **({"top": [{"label": label, "probability": probability}
                                                            for label, probability in result.top(top_k)]}
                                                   if top_k > 1 and result.error is None else {}))
                          for result in results], indent=2))
        return
    for result in results:
        if result.error is None and top_k == 1:
            print(f"{one_line(result.image)}: {result.label} (probability {result.probability:.4f})")
        elif result.error is None:
            print(f"{one_line(result.image)}: "
                  + ", ".join(f"{label} {probability:.4f}" for label, probability in result.top(top_k)))


def check_some_image(paths) -> None:
    """At least one path is a file or a folder holding image files; else one line naming them."""
    if all(path.is_dir() and not folder_images(path) for path in map(Path, paths)):
        raise UsageError(f"no image files in {', '.join(map(str, paths))}: a folder is read for its files ending in "
                         f"{', '.join(sorted(IMAGE_SUFFIXES))}")


def main_with_args(args) -> int:
    network, normalize = load_network(args.weights, args.config, args.device)
    check_some_image(args.images)
    network.set_engine(args.engine)
    results = predict(network, args.images, normalize=normalize)
    print_results(results, args.json, args.top_k)
    return EXIT_USAGE if any(result.error is not None for result in results) else 0


def main(argv=None) -> int:
    return run(main_with_args, build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
