"""A config section under validation: ``_Section`` reads one mapping of a config file, each key
checked for its type and range, and every problem a one-line ``ConfigError`` naming the file, the
key path and what would be valid (config.py parses every section through it)."""

from __future__ import annotations

import numbers
import re
import reprlib
from math import isfinite
from typing import Any, NoReturn

from ..errors import ConfigError
from ..limits import MAX_INTEGER
from ..tensor import FLOAT32_MAX, float32_rounded
from ..util.suggest import did_you_mean

_REQUIRED = object()
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxstring = 40
_SHORT_REPR.maxother = 40
_SHORT_REPR.maxlevel = 2
_SHORT_REPR.maxlist = _SHORT_REPR.maxdict = _SHORT_REPR.maxtuple = _SHORT_REPR.maxset = 4


def _without_none(mapping: dict) -> dict:
    return {key: value for key, value in mapping.items() if value is not None}


# ---- reading one mapping with key paths for messages ---------------------------------------


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, numbers.Integral):
        return "integer"
    if isinstance(value, numbers.Real):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "mapping"
    if isinstance(value, (list, tuple)):
        return "list"
    return type(value).__name__


def _describe(value: Any) -> str:
    return f"{_SHORT_REPR.repr(value)} ({_type_name(value)})"


def _range_text(kind: str, low, high, low_open: bool, high_open: bool) -> str:
    low, high = _bound_text(low), _bound_text(high)
    if low is not None and high is not None:
        return f"{kind} in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if low is not None:
        return f"{kind} {'>' if low_open else '>='} {low}"
    if high is not None:
        return f"{kind} {'<' if high_open else '<='} {high}"
    return kind


def _bound_text(bound) -> str | None:
    """An integer bound in full (2^24 is 16777216, not 1.67772e+07), a float one in short."""
    if bound is None:
        return None
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


def _in_range(number, low, high, low_open: bool, high_open: bool) -> bool:
    above = low is None or (number > low if low_open else number >= low)
    below = high is None or (number < high if high_open else number <= high)
    return above and below


class _Section:
    """One mapping of the config being read: its key path and the source, for error messages."""

    def __init__(self, value: Any, path: str, source: str):
        self.path, self.source = path, source
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {path}: expected a mapping, got {_describe(value)}")
        self.value = value

    def key_path(self, key: str) -> str:
        """``path.key``; a key that is not a plain word is quoted (so a message stays one line)."""
        shown = key if isinstance(key, str) and re.fullmatch(r"[\w-]+", key) else repr(key)
        return f"{self.path}.{shown}" if self.path else shown

    def fail(self, key: str, problem: str) -> NoReturn:
        raise ConfigError(f"{self.source}: {self.key_path(key)}: {problem}")

    def only(self, allowed: tuple[str, ...], context: str = "") -> None:
        """Refuse keys outside ``allowed``."""
        for key in self.value:
            if key not in allowed:
                where = f" for {context}" if context else ""
                valid = ", ".join(allowed) if allowed else "none"
                self.fail(str(key), f"unknown key {key!r}{where}; valid keys: {valid}{did_you_mean(key, allowed)}")

    def has(self, key: str) -> bool:
        """Whether ``key`` is given; a null value counts as absent."""
        return self.value.get(key) is not None

    def get(self, key: str, default: Any, expected: str) -> Any:
        """The value at ``key``; ``default`` when absent or null, an error when that is _REQUIRED."""
        if self.has(key):
            return self.value[key]
        if default is _REQUIRED:
            self.fail(key, f"missing required key; expected {expected}")
        return default

    def integer(self, key: str, default: Any = _REQUIRED, low: int | None = None, high: int | None = None,
                low_open: bool = False) -> int:
        expected = _range_text("an integer", low, high, low_open, False)
        if not self.has(key):
            return self.get(key, default, expected)
        value = self.value[key]
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            self.fail(key, f"expected {expected}, got {_describe(value)}")
        if not _in_range(value, low, high, low_open, False):
            self.fail(key, f"expected {expected}, got {value}")
        if value > MAX_INTEGER:
            self.fail(key, f"expected {expected} and at most {MAX_INTEGER} (2^31 - 1), got {_SHORT_REPR.repr(value)}")
        return int(value)

    def number(self, key: str, default: Any = _REQUIRED, low: float | None = None, high: float | None = None,
               low_open: bool = False, high_open: bool = False, float32: bool = False) -> float:
        """A number in the range given; ``float32``: the device keeps it in float32, and float32's
        rounding of it must be in the range too (1 − 1e-12 is 1 there, 1e-50 is 0)."""
        expected = _range_text("a number", low, high, low_open, high_open)
        if not self.has(key):
            return self.get(key, default, expected)
        value = self.value[key]
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            self.fail(key, f"expected {expected}, got {_describe(value)}{_float_text_hint(value)}")
        try:
            number = float(value)
        except OverflowError:
            number = float("inf")
        if not isfinite(number):
            self.fail(key, f"expected {expected}, got {_SHORT_REPR.repr(value)} (not finite)")
        if not _in_range(number, low, high, low_open, high_open):
            self.fail(key, f"expected {expected}, got {_SHORT_REPR.repr(value)}")
        if float32 and not _in_range(float32_rounded(number), low, high, low_open, high_open):
            self.fail(key, f"expected {expected}, got {_SHORT_REPR.repr(value)}, which float32 (the device's "
                           f"arithmetic) rounds to {float32_rounded(number)!r}")
        return number

    def choice(self, key: str, choices: tuple[str, ...], default: Any = _REQUIRED) -> str:
        expected = "one of " + ", ".join(choices)
        value = self.get(key, default, expected)
        if not isinstance(value, str) or value not in choices:
            self.fail(key, f"expected {expected}, got {_describe(value)}{did_you_mean(value, choices)}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.get(key, default, "true or false")
        if not isinstance(value, bool):
            self.fail(key, f"expected true or false, got {_describe(value)}")
        return value

    def section(self, key: str, required: bool = False) -> "_Section":
        value = self.get(key, _REQUIRED if required else {}, "a mapping")
        return _Section(value, self.key_path(key), self.source)


def _float_text_hint(value: Any) -> str:
    if not isinstance(value, str):
        return ""
    try:
        float(value)
    except ValueError:
        return ""
    return "; YAML 1.1 reads a number like 1e-3 as text, write 1.0e-3 or 0.001"


def _float32(section: _Section, key: str, value: float, smallest: float = 0.0) -> float:
    """A setting's ``value`` at ``key`` where float32 holds it (at most FLOAT32_MAX in magnitude; at least
    ``smallest`` where it is > 0), else ConfigError: an optimiser's, a layer's, the normalisation's."""
    if abs(value) > FLOAT32_MAX:
        bound = f"at most {FLOAT32_MAX:g}" if value > 0 else f"at least {-FLOAT32_MAX:g}"
        section.fail(key, f"expected {bound} (float32's largest magnitude), got {value:g}")
    if value < smallest:
        section.fail(key, f"expected at least {smallest:g} (float32's smallest normal number; a smaller one is 0 or "
                          f"a denormal on the device), got {value:g}")
    return value
