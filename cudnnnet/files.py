"""Writing a file atomically: a crash, a full disk or an exception leaves the previous file in place.

Used by checkpoints, the output folder's files and the disk caches (``cache.py``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator

log = logging.getLogger(__name__)


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
    nothing takes for a checkpoint.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
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
