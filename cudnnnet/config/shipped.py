"""The configs shipped with the package (``cudnnnet/configs/*.yaml``), named by their file stem.

``--config mnist_mlp`` (or ``mnist_mlp.yaml``) names a shipped config wherever the package is
installed; a path to a file still wins where one exists. In a repository checkout, the top-level
``configs/`` is a link to the same folder, so ``configs/mnist_mlp.yaml`` reads the same file.
Imports only the standard library, so the training launcher can read a config's device before
the package's heavy imports.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ConfigError
from ..util.suggest import did_you_mean

CONFIG_DIR = Path(__file__).parent.parent / "configs"
SUFFIXES = (".yaml", ".yml")


def shipped_config_names() -> list[str]:
    """The names ``--config`` accepts for the shipped configs, sorted."""
    return sorted(path.stem for path in CONFIG_DIR.glob("*.yaml"))


def valid_configs() -> str:
    """What ``--config`` accepts, for error messages."""
    return f"give a YAML file or the name of a shipped config: {', '.join(shipped_config_names())}"


def resolve_config(name: str | os.PathLike) -> Path:
    """The file ``--config NAME`` reads: ``name`` itself where it names folders or is a file here (or a
    pipe), else the shipped config of that name ("mnist_mlp" or "mnist_mlp.yaml"); ConfigError where
    there is none. A folder of that name here (``--output mnist_mlp`` makes one) does not hide the
    shipped config."""
    path = Path(name)
    if len(path.parts) != 1 or (path.exists() and not path.is_dir()):
        return path
    stem = path.stem if path.suffix in SUFFIXES else path.name
    shipped = CONFIG_DIR / f"{stem}.yaml"
    if shipped.is_file():
        return shipped
    if path.exists():
        return path  # a folder: reading it names the problem
    raise ConfigError(f"config {os.fspath(name)!r} is neither a file nor a shipped config; {valid_configs()}"
                      f"{did_you_mean(stem, shipped_config_names())}")
