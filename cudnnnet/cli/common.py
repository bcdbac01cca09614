"""What the command-line tools share: logging flags and turning errors into one line and an exit code.

Exit codes: 0 success; 2 bad usage, config, data, checkpoint or image; 1 a runtime failure;
128 + signal number when training was interrupted (130 for Ctrl-C, 143 for SIGTERM).
"""

from __future__ import annotations

import argparse
import logging
import sys

from ..errors import CudnnnetError, UsageError

log = logging.getLogger("cudnnnet")

EXIT_USAGE = 2
EXIT_FAILURE = 1


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="logging level (default INFO)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar, only warnings and errors")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")


def configure_logging(args) -> None:
    level = logging.WARNING if args.quiet else getattr(logging, args.log_level)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr, force=True)


def run(main, parser: argparse.ArgumentParser, argv=None) -> int:
    """Parse ``argv``, run ``main(args)`` and turn an exception into one stderr line and an exit code."""
    args = parser.parse_args(argv)
    configure_logging(args)
    try:
        return main(args) or 0
    except UsageError as error:
        return _fail(args, error, EXIT_USAGE, parser.prog)
    except CudnnnetError as error:
        return _fail(args, error, EXIT_FAILURE, parser.prog)
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return 130
    except MemoryError as error:
        return _fail(args, f"out of host memory ({error or 'MemoryError'})", EXIT_FAILURE, parser.prog)
    except OSError as error:
        return _fail(args, f"{error.strerror or error}: {error.filename or ''}".rstrip(": "), EXIT_FAILURE, parser.prog)


def _fail(args, error, code: int, prog: str) -> int:
    if args.debug:
        raise error if isinstance(error, BaseException) else RuntimeError(error)
    message = str(error).replace("\n", " ")
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code
