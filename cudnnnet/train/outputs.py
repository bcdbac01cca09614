"""A training's output folder, whose files are replaced together, as one set.

    OUT/
      model.npz     -> current/model.npz      the names users read: fixed relative links
      metrics.json  -> current/metrics.json
      history.csv   -> current/history.csv
      curves.png    -> current/curves.png
      config.yaml   -> current/config.yaml
      best.npz      -> current/best.npz       where an epoch was evaluated (best_checkpoint.py)
      current       -> .set-<run>-<n>          the set published last (a relative link)
      .set-<run>-<n>/                          a complete set: every file written and fsynced

A set is written in full into a fresh hidden folder, then published by renaming a new ``current``
link over the old one (rename(2) is atomic): at every moment the names above show one complete
set, never files of two runs or of two epochs. A failure while a set is written (a full disk, a
crash, kill -9) leaves the published set as it was; the unfinished folder is removed then, or by
the next training in the folder. Older sets are removed once a newer one is published.

While a training runs it holds an exclusive ``flock`` on the folder itself, so a second training
into the same folder is refused; the lock goes with the process, however it ends.

A new training into a folder that already holds a published set is refused before it starts
(``refuse_replacing``) unless it resumes that set or is told to overwrite it; an overwriting run
leaves the old set published, and readable, until it publishes its own first set. The same question
is asked again under the lock (``admit``): when the lock is taken and at every publish, a set that
another training published after this one was admitted is refused rather than replaced.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import logging
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Iterator

from ..errors import CheckpointError, OutputExistsError, OutputInUseError, WriteError

log = logging.getLogger(__name__)

NAMES = ("model.npz", "metrics.json", "history.csv", "curves.png", "config.yaml", "best.npz")
CURRENT = "current"
SET_PREFIX = ".set-"
LINK_TEMP_PREFIX = ".link-"


class OutputFolder:
    """The output folder ``path`` of one training run; ``lock()`` before writing any set."""

    def __init__(self, path):
        self.path = Path(path)
        self.run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"
        self._sequence = itertools.count(1)
        self._lock_fd: int | None = None
        self._admitted: tuple | None = None  # what was published when ``admit`` let this run in

    # ---- what this run may replace -------------------------------------------------------------
    def admit(self, resume=None, overwrite: bool = False) -> None:
        """``refuse_replacing`` now, and remember what was published then: under the lock, a set
        published since (by another training) is refused too, unless ``overwrite``."""
        published = _published_identity(self.path)
        refuse_replacing(self.path, resume, overwrite)
        self._admitted = None if overwrite else published

    def _refuse_replacing_another(self) -> None:
        """OutputExistsError where the published outputs are neither what ``admit`` saw nor this run's own."""
        if self._admitted is None:
            return
        published = _published_identity(self.path)
        current = self.current_set()
        if not published or published == self._admitted or (
                current is not None and current.name.startswith(f"{SET_PREFIX}{self.run_id}-")):
            return
        listed = [name for name, *_ in published if name != CURRENT] or [CURRENT]
        raise OutputExistsError(f"--output {self.path}: another training published its outputs there "
                                f"({', '.join(listed)}) after this one started; they are left intact: pass "
                                f"--overwrite to replace them, or another --output")

    # ---- the lock ------------------------------------------------------------------------------
    def lock(self) -> None:
        """Create the folder if needed and take its lock; OutputInUseError where another training holds it.
        Then remove what an earlier training killed mid-write left behind."""
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise self._in_use_error() from None
        self._lock_fd = fd
        try:
            self._refuse_replacing_another()
        except OutputExistsError:
            self.unlock()
            raise
        self.remove_leftovers()

    def check_not_in_use(self) -> None:
        """OutputInUseError where another training holds the folder's lock (the lock is taken and
        released at once: a question, not a claim)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise self._in_use_error() from None
        finally:
            os.close(fd)

    def _in_use_error(self) -> OutputInUseError:
        return OutputInUseError(f"--output {self.path}: another training is writing into this folder; "
                                f"wait for it to finish or choose another --output")

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the last descriptor releases the flock
            self._lock_fd = None

    def __enter__(self) -> "OutputFolder":
        self.lock()
        return self

    def __exit__(self, *exc_info) -> None:
        self.unlock()

    # ---- sets ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def new_set(self) -> Iterator[Path]:
        """Yield a fresh hidden folder to write one set of outputs into; on leaving the block without
        an error the set is published (``publish``). On an error the folder is removed and the
        published set stays as it was; an OSError (a full disk) is raised as WriteError."""
        if self._lock_fd is None:
            raise RuntimeError("OutputFolder.new_set before lock()")
        staging = self.path / f"{SET_PREFIX}{self.run_id}-{next(self._sequence):04d}"
        try:
            staging.mkdir()
            yield staging
            _fsync_directory(staging)
            self._refuse_replacing_another()  # under the lock, at the moment of publishing
        except BaseException as error:
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(error, (OSError, WriteError)):
                raise self._write_error(error, "the outputs published there before are intact") from error
            raise
        try:
            self.publish(staging)
        except OSError as error:
            if self.current_set() != staging.resolve():  # not published: the previous set still is
                shutil.rmtree(staging, ignore_errors=True)
                raise self._write_error(error, "the outputs published there before are intact") from error
            raise self._write_error(error, f"the new outputs are complete in {self.path / CURRENT}") from error

    def _write_error(self, error: BaseException, outcome: str) -> WriteError:
        return WriteError(f"cannot write the outputs into {self.path} ({_reason(error)}); {outcome}")

    def publish(self, staging: Path) -> None:
        """Point ``current`` at ``staging`` (one atomic rename), link the names to it, remove older sets."""
        self._replace_link(CURRENT, staging.name)
        for name in NAMES:
            link, target = self.path / name, f"{CURRENT}/{name}"
            if not (staging / name).exists():  # the new set has none: the previous one's would mix two sets
                if link.is_symlink() or link.is_file():
                    link.unlink()
            elif not (link.is_symlink() and os.readlink(link) == target):
                self._replace_link(name, target)
        _fsync_directory(self.path)
        self.remove_leftovers()
        log.debug("published %s", staging)

    def _replace_link(self, name: str, target: str) -> None:
        temporary = self.path / f"{LINK_TEMP_PREFIX}{name}-{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        os.symlink(target, temporary)
        os.replace(temporary, self.path / name)

    def current_set(self) -> Path | None:
        """The published set's folder, or None before the first set."""
        link = self.path / CURRENT
        return link.resolve() if link.is_symlink() and link.resolve().is_dir() else None

    def remove_leftovers(self) -> None:
        """Remove every set but the published one, and stray temporary links (what kill -9 leaves)."""
        current = self.current_set()
        for entry in self.path.iterdir():
            if entry.name.startswith(SET_PREFIX) and entry.is_dir() and not entry.is_symlink():
                if current is None or entry.resolve() != current:
                    shutil.rmtree(entry, ignore_errors=True)
            elif entry.name.startswith(LINK_TEMP_PREFIX) and entry.is_symlink():
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()


def published_outputs(path) -> list[str]:
    """The outputs of a published set that the folder ``path`` holds (``current`` and the names of
    NAMES that lead to a file); empty for a missing or empty folder, or one holding only what a
    training killed mid-write left behind (hidden, and removed by the next training)."""
    path = Path(path)
    if not path.is_dir():
        return []
    held = [name for name in NAMES if (path / name).is_file()]
    return held + [CURRENT] if OutputFolder(path).current_set() is not None else held


def refuse_replacing(path, resume=None, overwrite: bool = False) -> None:
    """OutputExistsError where the folder ``path`` holds the published outputs of a training that a
    new run would replace: unless ``overwrite``, or ``resume`` is that training's checkpoint (the
    folder itself, its model.npz, or the file that model.npz leads to). A folder another training
    is writing into is named as such (OutputInUseError), as taking its lock would."""
    held = published_outputs(path)
    if overwrite or not held or (resume is not None and _is_published_checkpoint(path, resume)):
        return
    OutputFolder(path).check_not_in_use()
    listed = [name for name in held if name != CURRENT] or held
    raise OutputExistsError(f"--output {path} already holds the outputs of a training ({', '.join(listed)}): pass "
                            f"--resume {path} to continue it, --overwrite to replace it, or another --output")


def _published_identity(path: Path) -> tuple:
    """What the folder ``path`` publishes now, as (name, device, inode) of each output and of ``current``'s
    set: every publish changes it. Empty where nothing is published."""
    identity = []
    for name in published_outputs(path):
        with contextlib.suppress(OSError):
            status = (path / name).stat()
            identity.append((name, status.st_dev, status.st_ino))
    return tuple(identity)


def _is_published_checkpoint(folder, resume) -> bool:
    """Whether ``resume`` (a folder or a checkpoint file) names the checkpoint ``folder`` published."""
    resume, folder = Path(resume), Path(folder)
    try:
        return resume.samefile(folder if resume.is_dir() else folder / "model.npz")
    except OSError:
        return False


def checkpoint_to_resume(path, option: str = "--resume") -> Path:
    """``path`` itself for a checkpoint file; for an output folder, the checkpoint of its published set
    (``option`` names the command-line option in the error)."""
    path = Path(path)
    if not path.is_dir():
        return path
    model = path / "model.npz"
    if not model.is_file():
        raise CheckpointError(f"{option} {path}: this folder holds no model.npz; give an output folder that a "
                              f"training wrote into, or a checkpoint file")
    return model


def is_output_folder(path) -> bool:
    """Whether ``path`` is a folder holding a published model.npz (an output folder of cudnnnet-train)."""
    return Path(path).is_dir() and (Path(path) / "model.npz").is_file()


def _fsync_directory(directory: Path) -> None:
    """Make the entries just written or renamed in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as error:
        if error.errno not in (errno.EINVAL, errno.ENOTSUP):  # file systems that cannot fsync a directory
            raise
    finally:
        os.close(fd)


def _reason(error: BaseException) -> str:
    """What went wrong in a failed write, without the temporary file's name: "No space left on device"."""
    cause = error.__cause__ if isinstance(error, WriteError) and isinstance(error.__cause__, OSError) else error
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror
    return " ".join(str(cause).split()) or type(cause).__name__
