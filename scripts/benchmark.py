#!/usr/bin/env python3
"""Time cudnnnet's training workloads (and PyTorch's, with --compare torch): see ``cudnnnet-benchmark --help``."""

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("cudnnnet") is None:  # not installed: run the package of this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cudnnnet.cli.benchmark import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
