"""The disk caches' common ground: where they live, the switch that turns them off, and the rule
that a cache never fails its caller.

    $XDG_CACHE_HOME/cudnnnet/ (else ~/.cache/cudnnnet/)
      kernels/   compiled NVRTC cubins            backends/cuda/kernel.py
      plans/     convolution and GEMM plans        backends/cuda/plan_cache.py, backends/cuda/matmul.py
      parsed/    parsed MNIST files                data/mnist.py
      mnist/     MNIST as downloaded: data, not a cache; the switch leaves it alone

``CUDNNNET_NO_CACHE=1`` turns every cache off. An entry that is missing, cannot be read or does not
parse is ignored (the caller computes the value again and stores it); a folder that cannot be
written is left alone. Both are logged at debug level through the caller's logger, nothing more.
Entries are read only from regular files (``read_bytes``, ``map_array``): a FIFO, a device or a
folder planted where an entry belongs is ignored like a damaged entry, without blocking on it or
reading it without end, and replaced by the rewritten entry (``atomic_write`` renames over it). The
hidden temporary file a writer killed mid-entry left (``files.remove_abandoned``: one no process holds
locked) is removed when that entry is written next.

A keyed entry (``keyed_path``, ``read_keyed``, ``write_keyed``: the plans) is one JSON file named by
the SHA-256 of its key, everything that decides the value; the file holds the key too, and an entry
holding another key is ignored like a damaged one.

A cached array (parsed or decoded data) is stored with the SHA-256 of its contents
(``array_digest``), recorded when it is written and compared when it is read back
(``digest_matches``): a flipped bit that leaves every value in range is caught, logged as a warning,
and the entry is made again from its source.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from pathlib import Path
from typing import BinaryIO, Callable, Mapping, TypeVar

from .files import atomic_write, remove_abandoned

NO_CACHE_ENV = "CUDNNNET_NO_CACHE"
READ_ERRORS = (OSError, ValueError, EOFError, RecursionError)  # a damaged entry: unreadable, truncated, not parsing
MAX_ENTRY_BYTES = 64 << 20  # a plan's JSON, a sidecar or a cubin: a larger file is no entry this package wrote
_FILE_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
Read = TypeVar("Read")
Parsed = TypeVar("Parsed")


def cache_off() -> bool:
    """Whether $CUDNNNET_NO_CACHE turns the disk caches off (any value but "" and "0")."""
    return os.environ.get(NO_CACHE_ENV, "") not in ("", "0")


def cache_root() -> Path:
    """$XDG_CACHE_HOME/cudnnnet, else ~/.cache/cudnnnet; RuntimeError when there is no home directory.
    A relative $XDG_CACHE_HOME is ignored, as the XDG base directory specification asks (it would name
    another folder in each working directory)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else _home() / ".cache") / "cudnnnet"


def _home() -> Path:
    """The home directory as ``os.path.expanduser`` finds it ($HOME, else the password database);
    RuntimeError where it finds none. (``Path.home()`` on Python 3.10 reads the database itself.)"""
    home = os.path.expanduser("~")
    if home.startswith("~"):
        raise RuntimeError("no home directory: $HOME is not set and the user has no entry in the password database")
    return Path(home)


def plan_dir() -> Path:
    """$XDG_CACHE_HOME/cudnnnet/plans, else ~/.cache/cudnnnet/plans: convolution and GEMM plans."""
    return cache_root() / "plans"


def entry_path(folder: Callable[[], Path], name: str) -> Path | None:
    """``folder() / name``, or None when the caches are off or there is no cache folder (no
    $XDG_CACHE_HOME and no home directory). ``folder`` is only called when the caches are on."""
    if cache_off():
        return None
    try:
        return folder() / name
    except RuntimeError:
        return None


def read_entry(read: Callable[[], Read], path: Path, what: str, log: logging.Logger) -> Read | None:
    """``read()`` (which reads the entry at ``path``), or None where there is no entry or it is damaged."""
    try:
        return read()
    except FileNotFoundError:
        return None
    except READ_ERRORS as error:
        log.debug("ignoring the unreadable cached %s %s: %s", what, path, getattr(error, "strerror", None) or error)
        return None


class NotRegularFile(OSError):
    """A cache entry's path holds something other than a regular file, or a file too large to be one."""


def open_regular(path: Path) -> BinaryIO:
    """``path`` (symbolic links followed) opened for reading when it is a regular file; NotRegularFile
    for a FIFO, a device, a socket or a folder. Checked before the open, so that no device is opened, and
    on the opened descriptor, which ``O_NONBLOCK`` keeps a FIFO swapped in meanwhile from blocking."""
    _check_regular(os.stat(path).st_mode, path)
    handle = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        _check_regular(os.fstat(handle).st_mode, path)
        os.set_blocking(handle, True)
        return os.fdopen(handle, "rb")
    except BaseException:
        os.close(handle)
        raise


def _check_regular(mode: int, path: Path) -> None:
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a file")
        raise NotRegularFile(0, f"not a regular file ({kind})", str(path))


def read_bytes(path: Path, limit: int = MAX_ENTRY_BYTES) -> bytes:
    """The contents of the regular file ``path``; NotRegularFile for anything else or a file above ``limit`` bytes."""
    with open_regular(path) as file:
        content = file.read(limit + 1)
    if len(content) > limit:
        raise NotRegularFile(0, f"larger than {limit} bytes, more than a cache entry holds", str(path))
    return content


def map_array(path: Path):
    """The ``.npy`` array in the regular file ``path``, memory-mapped read-only (nothing read but its
    header); ValueError for an array of Python objects or a header this reader does not know."""
    import numpy as np

    with open_regular(path) as file:
        version = np.lib.format.read_magic(file)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"an .npy file of format version {version}, not 1.0 or 2.0")
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read_header(file)
        if dtype.hasobject:
            raise ValueError("an array of Python objects, which is never cached")
        if 0 in shape:
            return np.zeros(shape, dtype)
        return np.memmap(file, dtype=dtype, mode="r", offset=file.tell(), shape=shape,
                         order="F" if fortran_order else "C")


def store_entry(files: Mapping[Path, Callable[[BinaryIO], None]], what: str, log: logging.Logger) -> None:
    """Write each of ``files`` atomically, in order, through its writer; a failure is only logged. The
    temporary files of an earlier writer that died while writing them are removed first."""
    try:
        for path, write in files.items():
            remove_abandoned(path)
            with atomic_write(path) as file:
                write(file)
    except OSError as error:
        folder = next(iter(files)).parent
        log.debug("not caching %s in %s: %s", what, folder, error.strerror or error)


def canonical(value: dict) -> str:
    """``value`` as compact JSON with sorted keys; numpy integers (sizes a caller passed as such) as ints."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=int)


def keyed_path(folder: Callable[[], Path], key: dict) -> Path | None:
    """The file of the entry keyed by ``key`` (JSON values) in ``folder()``, or None when the caches are off."""
    if cache_off():
        return None
    return entry_path(folder, f"{hashlib.sha256(canonical(key).encode()).hexdigest()}.json")


def read_keyed(folder: Callable[[], Path], key: dict, parse: Callable[[dict], Parsed | None], what: str,
               log: logging.Logger) -> Parsed | None:
    """What ``parse`` makes of the entry stored for ``key``; None where there is no entry, the caches
    are off, or the file cannot be read, does not parse, holds another key or ``parse`` refuses it."""
    path = keyed_path(folder, key)
    if path is None:
        return None
    read = read_entry(lambda: (json.loads(read_bytes(path)),), path, what, log)
    if read is None:
        return None
    (entry,) = read
    parsed = parse(entry) if isinstance(entry, dict) and entry.get("key") == key else None
    if parsed is None:
        log.debug("ignoring the cached %s %s: it holds another key or no valid %s", what, path, what)
    return parsed


def write_keyed(folder: Callable[[], Path], key: dict, content: dict, what: str, log: logging.Logger) -> None:
    """Write {"key": key, **content} to the file of ``key``, atomically; a failure is only logged."""
    path = keyed_path(folder, key)
    if path is not None:
        stored = canonical({"key": key, **content}).encode()
        store_entry({path: lambda file: file.write(stored)}, f"the {what}", log)


def array_digest(array) -> str:
    """SHA-256 of a NumPy array's dtype, shape and values (C order): what a cached array is checked
    against when it is read back."""
    import numpy as np

    digest = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    digest.update(np.ascontiguousarray(array).data)
    return digest.hexdigest()


def digest_matches(array, recorded: str, path: Path, log: logging.Logger) -> bool:
    """Whether ``array``, read back from the cache file ``path``, has the digest ``recorded`` when it
    was written; a mismatch (the file damaged on disk) is logged as a warning."""
    if array_digest(array) == recorded:
        return True
    log.warning("ignoring the cache file %s: its contents do not match the checksum recorded when it was "
                "written (damaged on disk); reading the source again", path)
    return False
