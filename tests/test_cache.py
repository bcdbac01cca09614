"""The disk caches' common helpers (cudnnnet/io/cache.py): an entry is read only from a regular file, so a
FIFO, a device or a folder planted where an entry belongs is ignored promptly, like a damaged entry,
and the rewritten entry replaces it."""

import logging
import os

import numpy as np
import pytest

from cudnnnet.io import cache
from hostile_files import plant, within

KEY = {"problem": [1, 2, 3]}
log = logging.getLogger("test_cache")


@pytest.fixture(autouse=True)
def cache_on(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.delenv(cache.NO_CACHE_ENV, raising=False)


def folder():
    return cache.cache_root() / "test"


def parse(entry: dict):
    return entry.get("value")


@pytest.mark.parametrize("kind, named", [("fifo", "a FIFO"), ("device", "a character device"), ("folder", "a folder")])
def test_a_planted_keyed_entry_is_ignored_promptly_and_replaced_by_a_file(kind, named, caplog):
    path = cache.keyed_path(folder, KEY)
    plant(path, kind)
    caplog.set_level(logging.DEBUG, logger=log.name)
    with within(5):
        assert cache.read_keyed(folder, KEY, parse, "plan", log) is None
    assert f"ignoring the unreadable cached plan {path}: not a regular file ({named})" in caplog.text
    if kind != "folder":  # a folder cannot be renamed over; the entry is then only never read
        cache.write_keyed(folder, KEY, {"value": 7}, "plan", log)
        assert path.is_file() and not path.is_symlink()
        assert cache.read_keyed(folder, KEY, parse, "plan", log) == 7


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_only_regular_files_are_read_or_mapped(tmp_path, kind):
    path = tmp_path / "entry.npy"
    plant(path, kind)
    with within(5):
        for read in (cache.read_bytes, cache.map_array):
            with pytest.raises(cache.NotRegularFile, match="not a regular file"):
                read(path)


def test_a_regular_file_above_the_limit_is_refused_unread(tmp_path):
    path = tmp_path / "entry.json"
    path.write_bytes(b"x" * 101)
    assert cache.read_bytes(path, limit=101) == b"x" * 101
    with pytest.raises(cache.NotRegularFile, match="larger than 100 bytes"):
        cache.read_bytes(path, limit=100)


@pytest.mark.parametrize("array", [np.arange(12, dtype=np.uint8).reshape(3, 4), np.asfortranarray(np.ones((2, 5))),
                                   np.zeros((0, 3), np.int64)])
def test_a_mapped_array_is_the_saved_one(tmp_path, array):
    np.save(tmp_path / "a.npy", array)
    mapped = cache.map_array(tmp_path / "a.npy")
    assert mapped.dtype == array.dtype and np.array_equal(mapped, array)


def test_a_mapped_array_of_objects_or_of_a_declared_size_the_file_lacks_is_refused(tmp_path):
    np.save(tmp_path / "objects.npy", np.array([{}, []], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="Python objects"):
        cache.map_array(tmp_path / "objects.npy")
    np.save(tmp_path / "short.npy", np.zeros(1000, np.uint8))
    (tmp_path / "short.npy").write_bytes((tmp_path / "short.npy").read_bytes()[:200])
    with pytest.raises(ValueError):
        cache.map_array(tmp_path / "short.npy")


def test_a_temporary_file_of_a_writer_that_died_is_removed_when_the_entry_is_written(tmp_path):
    """A process killed while it wrote an entry (out of memory, say, after decoding a folder) left its hidden
    temporary file, as large as the entry, in the cache for ever. A writer still at work keeps its own; a
    FIFO or a folder of such a name is neither waited on nor removed."""
    import fcntl
    import subprocess
    import sys

    entry = tmp_path / "entry.npy"
    killed = subprocess.run([sys.executable, "-c", (
        "import os, signal, sys\n"
        "from cudnnnet.io import files\n"
        "with files.atomic_write(sys.argv[1]) as file:\n"
        "    file.write(bytes(1000))\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"), str(entry)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert killed.returncode == -9
    (abandoned,) = tmp_path.glob(".entry.npy.*.tmp")
    writing = tmp_path / ".entry.npy.writing.tmp"
    with open(writing, "wb") as live:
        fcntl.flock(live, fcntl.LOCK_EX | fcntl.LOCK_NB)
        plant(tmp_path / ".entry.npy.fifo.tmp", "fifo")
        plant(tmp_path / ".entry.npy.folder.tmp", "folder")
        with within(5):
            cache.store_entry({entry: lambda file: file.write(b"entry")}, "an entry", log)
    assert entry.read_bytes() == b"entry" and not abandoned.exists()
    assert sorted(path.name for path in tmp_path.glob(".entry.npy.*.tmp")) == [
        ".entry.npy.fifo.tmp", ".entry.npy.folder.tmp", ".entry.npy.writing.tmp"]
