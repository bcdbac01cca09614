#!/usr/bin/env python3
"""see ``cudnnnet-evaluate --help``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cudnnnet.cli.evaluate import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
