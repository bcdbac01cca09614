"""What the command-line tools share: logging flags and turning errors into one line and an exit code.

Exit codes: 0 success; 2 bad usage, config, data, checkpoint or image; 1 a runtime failure;
128 + signal number when training was interrupted (130 for Ctrl-C, 143 for SIGTERM); 141
(128 + SIGPIPE), quietly, when the reader of the output went away (``| head``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import traceback

import numpy as np

from .. import __version__
from ..engine import DEFAULT_ENGINE, ENGINES
from ..errors import CudnnnetError, DeviceUnavailableError, UsageError
from ..util.printable import one_line

log = logging.getLogger("cudnnnet")

EXIT_USAGE = 2
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a Unix tool whose reader went away
DEVICE_HINT = "use --device host (or auto) to run on the CPU"


def add_common_arguments(parser: argparse.ArgumentParser, progress_bar: bool = True) -> None:
    """--log-level, --quiet, --debug and --version; ``progress_bar``: whether the tool shows one (--quiet's
    help says so)."""
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="logging level (default INFO)")
    quiet = "no progress bar, only warnings and errors" if progress_bar else "log only warnings and errors"
    parser.add_argument("--quiet", action="store_true", help=quiet)
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")


def add_engine_argument(parser: argparse.ArgumentParser, default: str | None = DEFAULT_ENGINE,
                        default_text: str = f"default {DEFAULT_ENGINE}") -> None:
    """--engine slides|fast: which calls run the layers on the GPU (cudnnnet.engine)."""
    parser.add_argument("--engine", choices=tuple(ENGINES), default=default,
                        help="slides: the C++ design's cuBLAS/cuDNN calls; fast: our fused kernels and tuned "
                             f"GEMMs ({default_text})")


def path_argument(text: str) -> str:
    """A file or folder named on the command line: not empty (an unset shell variable's ``""`` would
    be read as the current folder), and without a NUL byte (no file system holds one; a program calling
    a tool's ``main`` could pass it)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    if "\0" in text:
        raise argparse.ArgumentTypeError(f"expected a path without NUL bytes, got {text!r}")
    return text


class StderrHandler(logging.StreamHandler):
    """A handler writing to whatever ``sys.stderr`` is when a record comes (not the one at set-up),
    so a tool's ``main`` can run inside another program that swaps its streams."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        """The stream is always the current sys.stderr."""


class OneLineFormatter(logging.Formatter):
    """A log record as one line, whatever the names in its message hold (``one_line``)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return one_line(super().formatMessage(record))


def configure_logging(args) -> None:
    level = logging.WARNING if args.quiet else getattr(logging, args.log_level)
    handler = StderrHandler()
    handler.setFormatter(OneLineFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one stderr line (no usage block), as every other error."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def run(main, parser: argparse.ArgumentParser, argv=None) -> int:
    """Parse ``argv``, run ``main(args)`` and turn an exception into one stderr line and an exit code.

    With ``--debug`` the traceback is printed first; the exit code stays the same.
    """
    args = parser.parse_args(argv)
    with _logging_configured(args), _unencodable_escaped():
        return _run_main(main, parser, args)


@contextlib.contextmanager
def _unencodable_escaped():
    """For the run, a character the terminal's encoding cannot show (a ``猫.png`` on an ASCII terminal) is
    written as its backslash escape (``\\u732b``) rather than ending the tool with a UnicodeEncodeError;
    the streams' own handling comes back afterwards."""
    streams = [(stream, stream.errors) for stream in (sys.stdout, sys.stderr)
               if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure")]
    for stream, _ in streams:
        stream.reconfigure(errors="backslashreplace")
    try:
        yield
    finally:
        for stream, errors in streams:
            with contextlib.suppress(OSError, ValueError):  # a stream closed meanwhile keeps its handler
                stream.reconfigure(errors=errors)


@contextlib.contextmanager
def _logging_configured(args):
    """The tool's logging set-up for the duration of its run; the caller's comes back afterwards."""
    root = logging.getLogger()
    level, handlers = root.level, root.handlers[:]
    configure_logging(args)
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _run_main(main, parser: argparse.ArgumentParser, args) -> int:
    try:
        with np.errstate(all="ignore"):  # on the host as on the GPU: a NaN loss is reported once, as an error
            return main(args) or 0
    except DeviceUnavailableError as error:
        return _fail(args, parser.prog, error, EXIT_USAGE, f"{error}; {DEVICE_HINT}")
    except UsageError as error:
        return _fail(args, parser.prog, error, EXIT_USAGE)
    except CudnnnetError as error:
        return _fail(args, parser.prog, error, EXIT_FAILURE)
    except BrokenPipeError:
        return _reader_gone()
    except KeyboardInterrupt as error:
        return _fail(args, parser.prog, error, EXIT_INTERRUPTED, "interrupted")
    except MemoryError as error:
        return _fail(args, parser.prog, error, EXIT_FAILURE, f"out of host memory ({error})" if str(error) else
                     "out of host memory")
    except OSError as error:
        return _fail(args, parser.prog, error, EXIT_FAILURE, _os_error_text(error))


def _reader_gone() -> int:
    """Stop quietly, as Unix tools do when the reader of their output exits (``| head``): no message,
    and stdout pointed at /dev/null so the interpreter's final flush cannot fail again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return EXIT_BROKEN_PIPE


def _os_error_text(error: OSError) -> str:
    names = [str(name) for name in (error.filename, error.filename2) if name is not None]
    return ": ".join([error.strerror or str(error)] + names)


def _fail(args, prog: str, error: BaseException, code: int, message: str | None = None) -> int:
    if args.debug:
        traceback.print_exception(error, file=sys.stderr)
    text = one_line(" ".join((message or str(error) or type(error).__name__).split()))
    print(f"{prog}: error: {text}", file=sys.stderr)
    return code
