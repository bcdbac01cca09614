#!/usr/bin/env python3
"""Time cudnnnet's training workloads (and PyTorch's, with --compare torch): see ``cudnnnet-benchmark --help``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cudnnnet.cli.benchmark import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
