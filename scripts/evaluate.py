#!/usr/bin/env python3
"""see ``cudnnnet-evaluate --help``."""

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("cudnnnet") is None:  # not installed: run the package of this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cudnnnet.cli.evaluate import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
