"""Did-you-mean hints for a misspelt key, layer type, choice or shipped config name (difflib).

Imports only the standard library: the training launcher reads a config before the package's heavy imports.
"""

from __future__ import annotations

import difflib
from typing import Iterable

CUTOFF = 0.6  # difflib's default similarity: "lr" finds nothing in ("momentum",), "optimiser" finds "optimizer"


def did_you_mean(word, choices: Iterable[str]) -> str:
    """"; did you mean 'x'?" for the choice closest to ``word`` (to end a message with), or "" where none
    is close (or ``word`` is not text)."""
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, [str(choice) for choice in choices], n=1, cutoff=CUTOFF)
    return f"; did you mean {close[0]!r}?" if close else ""
