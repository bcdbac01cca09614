"""Builders of small hostile files the tests share (not fixtures): streams that inflate to far more
than they take on disk, zip archives whose entries declare what their writer chose, and FIFOs or
devices planted where a file belongs (with ``within``, which fails a read that blocks instead of
hanging the tests)."""

import contextlib
import gzip
import io
import os
import signal
import struct
import zipfile
import zlib

import numpy as np

MIB = 1 << 20


def plant(path, kind: str) -> None:
    """Put a FIFO (``"fifo"``: no writer, so a blocking open waits for ever), a link to the device
    /dev/null (``"device"``) or an empty folder (``"folder"``) where ``path`` is. (Not /dev/zero: a
    reader that regressed would fill the memory of the machine before any deadline could stop it.)"""
    if path.is_dir() and not path.is_symlink():
        path.rmdir()
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    {"fifo": os.mkfifo, "device": lambda where: os.symlink(os.devnull, where), "folder": os.mkdir}[kind](path)


class Blocked(BaseException):
    """Raised by ``within``: a BaseException, so that no handler of the code under test (a cache
    ignoring an unreadable entry catches OSError, TimeoutError's base) swallows it."""


@contextlib.contextmanager
def within(seconds: float):
    """Raise Blocked in the body once it has run ``seconds`` (SIGALRM, so the main thread only):
    a read blocked on a FIFO fails the test instead of hanging the run."""
    def expire(signum, frame):
        raise Blocked(f"still running after {seconds} s: blocked on a file that is not a regular one?")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def gzip_bomb(header: bytes, megabytes: int) -> bytes:
    """``header`` then ``megabytes`` MiB of zeros as one gzip file of about ``megabytes`` KiB
    (one gzip member per MiB; readers take a multi-member file as one stream)."""
    return gzip.compress(header) + gzip.compress(bytes(MIB)) * megabytes


def idx_header(dims: tuple[int, ...]) -> bytes:
    """The header of an IDX ubyte file of ``dims``."""
    return bytes([0, 0, 8, len(dims)]) + b"".join(int(size).to_bytes(4, "big") for size in dims)


def npy_header(shape: tuple[int, ...], dtype="<f4") -> bytes:
    """A .npy (version 1.0) header declaring ``shape`` and ``dtype``."""
    header = {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": tuple(shape)}
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, header)
    return buffer.getvalue()


class Entry:
    """A zip entry: ``head`` (stored as is) then ``zero_megabytes`` MiB of zeros, deflated."""

    def __init__(self, head: bytes, zero_megabytes: int = 0):
        self.head, self.zero_megabytes = head, zero_megabytes

    def deflated(self) -> tuple[bytes, int, int]:
        """(raw deflate data, uncompressed size, CRC-32), built without inflating the zeros in memory."""
        compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
        data = compressor.compress(self.head) + compressor.flush(zlib.Z_FULL_FLUSH)
        zeros = compressor.compress(bytes(MIB)) + compressor.flush(zlib.Z_FULL_FLUSH)
        crc = zlib.crc32(self.head)
        for _ in range(self.zero_megabytes):
            crc = zlib.crc32(bytes(MIB), crc)
        data += zeros * self.zero_megabytes + compressor.flush()
        return data, len(self.head) + self.zero_megabytes * MIB, crc


def write_zip(path, entries: dict[str, Entry]) -> None:
    """A zip archive of deflated ``entries`` whose headers declare their true sizes (ZIP64 where needed)."""
    local, central = bytearray(), bytearray()
    for name, entry in entries.items():
        data, size, crc = entry.deflated()
        encoded = name.encode()
        extra = struct.pack("<HHQQ", 1, 16, size, len(data))
        offset = len(local)
        local += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 45, 0, 8, 0, 0x21, crc, 0xFFFFFFFF, 0xFFFFFFFF,
                             len(encoded), len(extra)) + encoded + extra + data
        central_extra = struct.pack("<HHQQQ", 1, 24, size, len(data), offset)
        central += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 45, 45, 0, 8, 0, 0x21, crc, 0xFFFFFFFF,
                               0xFFFFFFFF, len(encoded), len(central_extra), 0, 0, 0, 0, 0xFFFFFFFF) + encoded + central_extra
    count = len(entries)
    zip64_end = struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, len(central), len(local))
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, len(local) + len(central), 1)
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, count, count, len(central), len(local), 0)
    with open(path, "wb") as file:
        file.write(bytes(local) + bytes(central) + zip64_end + locator + end)
    with zipfile.ZipFile(path) as archive:  # the archive is well formed: its directory reads
        assert [info.filename for info in archive.infolist()] == list(entries)


def pyyaml_copies_merged_keys() -> bool:
    """Whether this PyYAML copies a key every time a merge (``<<``) brings it in (before 6.0.4), so that
    mappings merging the previous one twice double at each line; later versions keep each key once."""
    import yaml

    loader = yaml.SafeLoader("a: &a {k: 1}\nb: {<<: [*a, *a]}\n")
    try:
        merging = loader.get_single_node().value[1][1]
        loader.flatten_mapping(merging)
        return len(merging.value) == 2
    finally:
        loader.dispose()
