"""Names a package exports but imports on first use (PEP 562), so that importing the package, or a
light module inside it, does not import NumPy and the rest: a command-line tool can then start
CUDA (``backends.cuda.startup``) before its heavy imports."""

from __future__ import annotations

import importlib


def lazy_exports(package: str, exports: dict[str, str]):
    """(``__getattr__``, ``__dir__``) for ``package``, whose name ``name`` is ``exports[name]``'s
    attribute of the same name (a module relative to the package), imported on first access."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name], package), name)
        namespace[name] = value  # later lookups find it without coming here
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
