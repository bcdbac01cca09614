"""Text from files (names, paths, config strings) made safe to write to a terminal: every line the
command-line tools write passes through ``one_line``, so a name cannot move the cursor, clear the
screen or forge a line."""

from __future__ import annotations

import unicodedata


def one_line(text: str) -> str:
    """``text`` as one printable line whatever the file names in it hold: a line break or another control
    character escaped (``\\n``), and a byte of a name that is not UTF-8 written as ``\\xff`` (Python holds it
    as a lone surrogate, which a strict UTF-8 output cannot encode)."""
    return "".join(_escaped(char) for char in text)


def _escaped(char: str) -> str:
    if 0xDC80 <= ord(char) <= 0xDCFF:  # os.fsdecode's stand-in for an undecodable byte
        return f"\\x{ord(char) - 0xDC00:02x}"
    if unicodedata.category(char) in ("Cc", "Cs", "Zl", "Zp"):
        return char.encode("unicode_escape").decode("ascii")
    return char
