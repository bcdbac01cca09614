"""Tier 2: library objects as Python objects that free themselves.

Each object keeps its C handle in ``handle`` and destroys it through ``weakref.finalize`` when it is
collected or closed. Finalizers never run at interpreter exit (the driver reclaims everything
then, and the libraries may already be unloading) and never raise.
"""

from __future__ import annotations

import contextlib
import logging
import weakref

from ...errors import CudaError, UsageError
from .bindings import cublas, cublaslt, cudnn, runtime

log = logging.getLogger(__name__)


def release_when_collected(owner, release, *args) -> weakref.finalize:
    """Call ``release(*args)`` once, when ``owner`` is collected or the finalizer is called."""
    finalizer = weakref.finalize(owner, _release_quietly, release, *args)
    finalizer.atexit = False
    return finalizer


_held_back: list | None = None  # the releases asked for inside ``releases_held_back``, made at its end


@contextlib.contextmanager
def releases_held_back():
    """Make every release asked for in this block (a buffer's cudaFree, a handle's destroy) at its end
    instead: a CUDA graph capture is invalidated by such a call, yet an object's last reference may
    go inside one (a layer's ``input`` replaced, and with it the last evaluation batch's view, whose
    bfloat16 copy then goes too). Nested blocks release at the outermost one's end."""
    global _held_back
    if _held_back is not None:
        yield
        return
    _held_back = []
    try:
        yield
    finally:
        held, _held_back = _held_back, None
        for release, args in held:
            _release_quietly(release, *args)


def _release_quietly(release, *args) -> None:
    if _held_back is not None:
        _held_back.append((release, args))
        return
    try:
        release(*args)
    except Exception as error:  # a library unloading at shutdown, or a context already torn down
        if log is not None:
            log.debug("%s%r failed while releasing: %s", getattr(release, "__name__", release), args, error)


class Owned:
    """A C handle destroyed by ``destroy(handle)`` when this object is collected or closed."""

    __slots__ = ("handle", "_finalizer", "__weakref__")

    def __init__(self, handle, destroy):
        self.handle = handle
        self._finalizer = release_when_collected(self, destroy, handle)

    def close(self) -> None:
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int(self.handle or 0):#x})"


class Stream(Owned):
    """A non-blocking CUDA stream (cudaStreamCreateWithFlags). ``address`` is its raw handle."""

    __slots__ = ("address",)

    def __init__(self):
        super().__init__(runtime.stream_create_with_flags(runtime.STREAM_NON_BLOCKING), runtime.stream_destroy)
        self.address = int(self.handle)

    def synchronize(self) -> None:
        runtime.stream_synchronize(self.handle)

    def is_capturing(self) -> bool:
        return runtime.stream_is_capturing(self.handle)


class Event(Owned):
    """A CUDA event; ``timing=False`` makes a cheaper one for ordering streams only."""

    __slots__ = ()

    def __init__(self, timing: bool = True):
        flags = 0 if timing else runtime.EVENT_DISABLE_TIMING
        super().__init__(runtime.event_create_with_flags(flags), runtime.event_destroy)

    def record(self, stream: Stream) -> "Event":
        runtime.event_record(self.handle, stream.handle)
        return self

    def synchronize(self) -> None:
        runtime.event_synchronize(self.handle)

    def elapsed_ms(self, end: "Event") -> float:
        """Milliseconds from this event to ``end`` (both recorded and complete)."""
        return runtime.event_elapsed_time(self.handle, end.handle)


class CublasHandle(Owned):
    """cublasHandle_t bound to ``stream``."""

    __slots__ = ()

    def __init__(self, stream: Stream):
        super().__init__(cublas.create(), cublas.destroy)
        cublas.set_stream(self.handle, stream.address)


class CublasLtHandle(Owned):
    """cublasLtHandle_t (cuBLASLt takes its stream per call, not per handle)."""

    __slots__ = ()

    def __init__(self):
        super().__init__(cublaslt.create(), cublaslt.destroy)


class CudnnHandle(Owned):
    """cudnnHandle_t bound to ``stream``."""

    __slots__ = ()

    def __init__(self, stream: Stream):
        super().__init__(cudnn.create(), cudnn.destroy)
        cudnn.set_stream(self.handle, stream.address)


class CudaGraph:
    """Work captured from a stream (cudaStreamBeginCapture ... cudaStreamEndCapture), instantiated
    once; ``launch()`` replays it on that stream. Scalars read from device memory (a learning rate
    in a one-element tensor) are read again at every replay."""

    __slots__ = ("stream", "_graph", "_exec")

    def __init__(self, stream: Stream):
        self.stream = stream
        self._graph: Owned | None = None  # cudaGraph_t
        self._exec: Owned | None = None  # cudaGraphExec_t

    def begin(self) -> None:
        runtime.stream_begin_capture(self.stream.handle, runtime.CAPTURE_MODE_GLOBAL)

    def end(self) -> None:
        """Stop capturing and instantiate what was captured."""
        self._graph = Owned(runtime.stream_end_capture(self.stream.handle), runtime.graph_destroy)
        self._exec = Owned(runtime.graph_instantiate(self._graph.handle), runtime.graph_exec_destroy)

    def abandon(self) -> None:
        """Stop capturing after a failure; keep nothing."""
        try:
            runtime.graph_destroy(runtime.stream_end_capture(self.stream.handle))
        except CudaError as error:  # an invalidated capture has no graph to destroy
            log.debug("abandoned capture: %s", error)

    def release(self) -> None:
        """Destroy the executable graph and the graph now rather than when collected: an NCCL
        communicator whose collectives were captured here can be destroyed only after."""
        for owned in (self._exec, self._graph):
            if owned is not None:
                owned.close()
        self._exec = self._graph = None

    def launch(self) -> None:
        if self._exec is None:
            raise UsageError("this CUDA graph has not been captured (use it after its capture block ends)")
        runtime.graph_launch(self._exec.handle, self.stream.handle)
