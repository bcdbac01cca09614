#!/usr/bin/env python3
"""Train a network from a YAML config: see ``cudnnnet-train --help``."""

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("cudnnnet") is None:  # not installed: run the package of this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cudnnnet.cli.launch import train  # noqa: E402  (starts CUDA early, then imports the trainer)

if __name__ == "__main__":
    sys.exit(train())
