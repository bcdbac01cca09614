"""How a device name ("host", "cuda", "auto", None) becomes a Backend, for the modules below the
backends (``tensor.py``): ``cudnnnet.backends``, imported with the package, registers its
``get_backend`` here, so the tensor never imports the backends that compute with it."""

from __future__ import annotations

from typing import Any, Callable

_lookup: "Callable[[Any], Any] | None" = None


def register(lookup: "Callable[[Any], Any]") -> None:
    """Make ``lookup`` (``cudnnnet.backends.get_backend``) the way names become backends."""
    global _lookup
    _lookup = lookup


def backend_named(name: "str | None"):
    """The Backend called ``name`` (``None``: the host), through the registered lookup."""
    if _lookup is None:
        raise RuntimeError("no backend lookup is registered: import cudnnnet before its modules")
    return _lookup(name)
