"""cudnnnet-train's entry point: CUDA's start-up begins before the tool's imports.

Importing the trainer (NumPy, PyYAML, the package) takes ~0.1–0.2 s, and starting the CUDA driver
~0.2–0.3 s more. Where the command will run on the GPU, ``train`` starts the driver on a thread
first (``backends.warm_up``, which imports no NumPy and no cuda-python), then imports and runs
``cli.train.main``: the two overlap. The device is read from the command line, else from the
config's ``device`` (default auto), as ``cli.train`` will read it; where it cannot be told (no
config, an unreadable one, ``--help``) nothing starts early and ``cli.train`` reports whatever is
wrong, as it would have. The config is read once: its bytes are handed on to ``cli.train``, so a
config from a pipe (``--config <(...)``, /dev/stdin) is not consumed here and found empty there.
``python -m cudnnnet.cli.launch`` runs it as cudnnnet-train does.
"""

from __future__ import annotations

import sys

from ..backends import warm_up
from ..config.reader import MAX_CONFIG_BYTES
from ..config.shipped import resolve_config
from ..errors import ConfigError, DistributedError
from ..train.distributed import replicas as distributed

DEVICE_OPTION, CONFIG_OPTION, GPUS_OPTION = "--device", "--config", "--gpus"
SHORTEST_PREFIX = 5  # argparse takes an unambiguous prefix: "--dev" (not "--de": --debug), "--con"


def train(argv: list[str] | None = None) -> int:
    """cudnnnet-train (scripts/train.py): ``cli.train.main`` with a head start on the GPU."""
    arguments = sys.argv[1:] if argv is None else argv
    config_text = config_read(arguments)
    if _option(arguments, GPUS_OPTION) is None:  # with --gpus, the ranks start CUDA, each on its GPU
        _pin_rank_device()
        warm_up(device_asked_for(arguments, config_text))
    from .train import main

    return main(argv, config_text=config_text)


def _pin_rank_device() -> None:
    """Under a launcher (torchrun, srun, mpirun, --gpus), this rank's GPU becomes the only one visible,
    before the driver starts; a malformed environment is left for ``cli.train`` to report."""
    try:
        launch = distributed.from_environment()
        if launch is not None:
            distributed.pin_device(launch)
    except DistributedError:
        pass


def config_read(argv: list[str]) -> dict[str, bytes]:
    """{the --config path: its bytes}, read once here; empty where there is none or it cannot be read
    (``cli.train`` then reads it and reports the problem)."""
    if "-h" in argv or "--help" in argv:
        return {}
    path = _option(argv, CONFIG_OPTION)
    if path is None:
        return {}
    try:
        with open(resolve_config(path), "rb") as file:
            return {path: file.read(MAX_CONFIG_BYTES + 1)}
    except (ConfigError, OSError):
        return {}


def device_asked_for(argv: list[str], config_text: dict[str, bytes] | None = None) -> str | None:
    """The device a cudnnnet-train command line runs on: its --device, else its config's ``device``
    (auto where the config has none); None where it cannot be told without the full parse.
    ``config_text``: the config's bytes as ``config_read`` gives them (read here when not given)."""
    if "-h" in argv or "--help" in argv:
        return None
    device = _option(argv, DEVICE_OPTION)
    if device is not None:
        return device
    config = _option(argv, CONFIG_OPTION)
    if config is None:
        return None
    data = (config_read(argv) if config_text is None else config_text).get(config)
    return None if data is None else _config_device(data)


def _option(argv: list[str], option: str) -> str | None:
    """The value of the last ``option`` in ``argv`` ("--opt value", "--opt=value", or a prefix of
    --opt that argparse would take), or None."""
    value = None
    for index, argument in enumerate(argv):
        name, equals, inline = argument.partition("=")
        if len(name) < SHORTEST_PREFIX or not option.startswith(name):
            continue
        if equals:
            value = inline
        elif index + 1 < len(argv):
            value = argv[index + 1]
    return value


def _config_device(data: bytes) -> str | None:
    from ..config.reader import read_yaml

    try:
        settings = read_yaml("--config", data)
    except ConfigError:
        return None
    if not isinstance(settings, dict):
        return None
    device = settings.get("device", "auto")
    return device if isinstance(device, str) else None


if __name__ == "__main__":
    sys.exit(train())
