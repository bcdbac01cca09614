"""What a zip archive's end records declare about its central directory, read before ``zipfile`` parses it.

``zipfile.ZipFile`` reads the whole central directory and builds an object per entry as it opens an archive
(a second for 200 000 entries), so a reader that bounds the entries looks at the end records first. They are
found as ``zipfile`` finds them (Python 3.10–3.13): the End Of Central Directory record in the last 22 bytes,
else the last one in the final 64 KiB + 22 (an archive comment), and a ZIP64 record just before its locator,
just before that record, standing in for it.
"""

from __future__ import annotations

import os
import struct
from typing import BinaryIO, NamedTuple

# signature, this disk, the directory's disk, entries on this disk, entries, directory bytes, its offset, comment bytes
_END = struct.Struct("<4s4H2LH")
_END_SIGNATURE = b"PK\x05\x06"
_MAX_COMMENT = 0xFFFF
# signature, the ZIP64 record's disk, its offset, disks
_LOCATOR = struct.Struct("<4sLQL")
_LOCATOR_SIGNATURE = b"PK\x06\x07"
# signature, record bytes, versions made by and needed, this disk, the directory's disk, entries on this disk,
# entries, directory bytes, its offset
_END64 = struct.Struct("<4sQ2H2L4Q")
_END64_SIGNATURE = b"PK\x06\x06"
_ENTRY_SIGNATURE = b"PK\x01\x02"  # each entry of the central directory starts with it
_CHUNK_BYTES = 1 << 20


class Directory(NamedTuple):
    """The central directory as the end records declare it."""

    entries: int  # the entry count they declare
    size: int  # its bytes
    end: int  # the offset of the record after it (zipfile reads the ``size`` bytes before this one)


def declared_directory(file: BinaryIO) -> Directory | None:
    """The central directory ``file``'s end records declare, None where there is no end record (zipfile then
    refuses the file as not a zip archive)."""
    file.seek(0, os.SEEK_END)
    length = file.tell()
    tail_start = max(0, length - _END.size - _MAX_COMMENT)
    file.seek(tail_start)
    tail = file.read()
    position = len(tail) - _END.size
    if not (position >= 0 and tail[position:position + 4] == _END_SIGNATURE and tail[-2:] == b"\0\0"):
        position = tail.rfind(_END_SIGNATURE)
    if position < 0 or len(tail) - position < _END.size:
        return None
    fields = _END.unpack_from(tail, position)
    end = tail_start + position
    return _zip64_directory(file, end) or Directory(entries=fields[4], size=fields[5], end=end)


def _zip64_directory(file: BinaryIO, end: int) -> Directory | None:
    """The ZIP64 record's directory where a locator and a record lie just before the end record at ``end``."""
    record_start = end - _LOCATOR.size - _END64.size
    if record_start < 0:
        return None
    file.seek(record_start)
    data = file.read(_END64.size + _LOCATOR.size)
    if len(data) != _END64.size + _LOCATOR.size or data[_END64.size:_END64.size + 4] != _LOCATOR_SIGNATURE:
        return None
    fields = _END64.unpack_from(data)
    if fields[0] != _END64_SIGNATURE:
        return None
    return Directory(entries=fields[7], size=fields[8], end=record_start)


def entries_at_most(file: BinaryIO, directory: Directory) -> int:
    """How many entries zipfile can find in ``directory`` (the ``size`` bytes before ``end`` it reads): the
    entry signatures there, counted without parsing, so an end record cannot hide a directory of millions."""
    start = max(0, directory.end - directory.size)
    file.seek(start)
    remaining, count, carried = directory.end - start, 0, b""
    while remaining > 0:
        chunk = file.read(min(_CHUNK_BYTES, remaining))
        if not chunk:
            break
        remaining -= len(chunk)
        window = carried + chunk
        count += window.count(_ENTRY_SIGNATURE)
        carried = window[-(len(_ENTRY_SIGNATURE) - 1):]  # a signature split between chunks is counted once
    return count
