"""Writing a file atomically: a crash, a full disk or an exception leaves the previous file in place.

Used by checkpoints, the output folder's files and the disk caches (``cache.py``).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator

try:
    import fcntl
except ImportError:  # not POSIX: files are written without a lock, and abandoned ones stay
    fcntl = None

log = logging.getLogger(__name__)
_TEMPORARY = ".tmp"  # the suffix of atomic_write's temporary files


def new_file_mode() -> int:
    """The permissions ``open`` gives a new file: 0o666 less the umask (``mkstemp`` alone gives 0o600)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Yield a temporary file beside ``path``; on success fsync it and replace ``path`` with it.

    On any failure the temporary file is removed and an existing ``path`` is left untouched. The
    temporary file is named ``.NAME.*.tmp``, so a crash can leave only a hidden ``.tmp`` file that
    nothing takes for a checkpoint; it is locked while it is written, so that ``remove_abandoned`` tells
    one left by a process that died from one being written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=_TEMPORARY)
    try:
        _lock_while_open(handle)
        os.fchmod(handle, new_file_mode())
        with os.fdopen(handle, "wb") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
    _fsync_directory(path.parent)


def _lock_while_open(handle: int) -> None:
    """An exclusive lock on the open file ``handle``, released when it is closed or its process dies;
    none where the file system or the platform has no locks."""
    if fcntl is not None:
        with contextlib.suppress(OSError):
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)


def remove_abandoned(path: str | os.PathLike) -> None:
    """Remove the temporary files ``atomic_write`` left beside ``path`` in a process that died while writing
    it (killed, out of memory, a power cut): those that no process holds locked. Only regular files are
    touched, and nothing is waited for."""
    path = Path(path)
    if fcntl is None:
        return
    for temporary in path.parent.glob(f".{glob.escape(path.name)}.*{_TEMPORARY}"):
        try:
            handle = os.open(temporary, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            if stat.S_ISREG(os.fstat(handle).st_mode):
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # OSError while its writer holds it
                os.unlink(temporary)
                log.debug("removed %s, left by a process that died while writing it", temporary)
        except OSError:
            pass
        finally:
            os.close(handle)


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable (POSIX); platforms that cannot open a directory skip this."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        log.debug("cannot open %s to fsync it", directory, exc_info=True)
        return
    try:
        os.fsync(fd)
    except OSError:
        log.debug("cannot fsync %s", directory, exc_info=True)
    finally:
        os.close(fd)
