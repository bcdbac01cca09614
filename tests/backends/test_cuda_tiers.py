"""The CUDA backend's middle tier (convolution.py, gemm_convolution.py, backward_bias.py, pooling.py and
the other modules beside backend.py) reaches the GPU through the context's public surface (stream,
handles, scalars, 16-bit operands) and the backend's public members, never CudaBackend's privates."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cudnnnet.backends.cuda as cuda_package

CUDA_DIR = Path(cuda_package.__file__).parent
MIDDLE_TIER = sorted(path for path in CUDA_DIR.glob("*.py") if path.name not in ("backend.py", "__init__.py"))
BACKEND_NAMES = {"backend", "b"}  # what the middle tier calls the CudaBackend it is given


def private_reads(source: str) -> list[str]:
    """``backend._x`` and ``self.backend._x`` in ``source``, as 'line: expression'."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        owner = node.value
        named = isinstance(owner, ast.Name) and owner.id in BACKEND_NAMES
        held = isinstance(owner, ast.Attribute) and owner.attr == "backend"
        if named or held:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", MIDDLE_TIER, ids=[path.name for path in MIDDLE_TIER])
def test_the_middle_tier_reads_no_private_of_the_backend(path):
    assert private_reads(path.read_text()) == []


def test_the_check_finds_a_private_read():
    assert private_reads("def f(backend):\n    return backend._stream\n") == ["2: backend._stream"]
    assert private_reads("def f(self):\n    return self.backend._cudnn, self.backend.context.stream\n") == [
        "2: self.backend._cudnn"]


def test_the_backend_names_the_cudnn_handle_and_descriptors_through_its_context_only():
    """CudaBackend keeps no private aliases of ``context.cudnn`` and ``context.descriptors``: it and the
    tests use the context's public surface, one spelling each."""
    source = (CUDA_DIR / "backend.py").read_text()
    aliases = {node.attr for node in ast.walk(ast.parse(source))
               if isinstance(node, ast.Attribute) and node.attr in ("_cudnn", "_descriptors")}
    assert aliases == set()


# ---- releases held back during a capture ------------------------------------------------------------
def test_a_release_asked_for_inside_releases_held_back_is_made_at_the_outermost_block_s_end():
    from cudnnnet.backends.cuda.handles import Owned, releases_held_back

    released = []
    with releases_held_back():
        owned = Owned(7, released.append)
        del owned  # its last reference: the finalizer asks for the release now
        with releases_held_back():
            Owned(8, released.append).close()
        assert released == []
    assert released == [7, 8]
    Owned(9, released.append).close()
    assert released == [7, 8, 9]


def test_a_release_held_back_that_fails_leaves_the_others_to_run():
    from cudnnnet.backends.cuda.handles import Owned, releases_held_back

    released = []

    def broken(handle):
        raise RuntimeError("library unloaded")

    with releases_held_back():
        Owned(1, broken).close()
        Owned(2, released.append).close()
    assert released == [2]
