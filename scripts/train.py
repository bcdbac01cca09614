#!/usr/bin/env python3
"""Train a network from a YAML config: see ``cudnnnet-train --help``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cudnnnet.cli.train import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
