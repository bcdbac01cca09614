"""Which engine and precision a backend's calls run in: ``Backend.using`` blocks put ``Settings`` in
force for the calls made inside them, in this thread or task (contextvars), as Chainer's
``using_config`` scopes its configuration; outside any block, the backend's defaults apply."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any

from ..engine import Engine
from ..precision import Precision


@dataclass(frozen=True)
class Settings:
    """The policies ``using`` blocks put in force on one backend: which calls run (cudnnnet.engine), in
    which arithmetic (cudnnnet.precision); None where no block sets it (the backend's default applies)."""

    engine: Engine | None = None
    precision: Precision | None = None


# id(backend) -> the Settings of the innermost ``Backend.using`` block around this thread's (or task's)
# calls on it. A block puts a new mapping in force and puts back the one it found when it ends, so
# one network's settings never reach another's calls, and nothing is saved and restored by hand.
IN_FORCE: contextvars.ContextVar = contextvars.ContextVar("cudnnnet_backend_settings", default={})
UNSET = Settings()


class Using:
    """The block ``Backend.using`` returns: ``settings`` in force on ``backend`` for its body (a class,
    not a generator: a network enters one around each of its calls)."""

    __slots__ = ("backend", "settings", "token")

    def __init__(self, backend: Any, settings: Settings):
        self.backend, self.settings, self.token = backend, settings, None

    def __enter__(self) -> Any:
        backend = self.backend
        before = backend.precision
        self.token = IN_FORCE.set({**IN_FORCE.get(), id(backend): self.settings})
        if backend.precision is not before:
            backend._use_precision(backend.precision)
        return backend

    def __exit__(self, *exception) -> bool:
        backend = self.backend
        inside = backend.precision
        IN_FORCE.reset(self.token)
        if backend.precision is not inside:
            backend._use_precision(backend.precision)
        return False
