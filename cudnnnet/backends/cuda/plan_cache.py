"""Convolution plans kept on disk, so that a new process skips cuDNN's candidate listing
(cudnnGet*Algorithm_v7, ~13 ms a call on an H100) and the timing of candidates.

One JSON file per plan in ``plan_cache_dir()``, named by the SHA-256 of its key: everything that
decides the choice (the GPU's name and compute capability, the cuDNN and cuBLAS versions, the
convolution, the x and y shapes, the math mode, the algorithm search, the workspace limit, the
rules for eligible algorithms and this file format). The file holds the key and, per direction,
the algorithm chosen, its workspace in bytes and whether it is deterministic.

The cache never fails a plan: a file that cannot be read, does not parse or holds another key is
ignored (the plan is searched again and the file rewritten); a cache directory that cannot be
written is left alone. ``CUDNNNET_NO_CACHE=1`` turns it off. Whoever reads an entry must check it
against the library (``convolution.plan_with``): an algorithm cuDNN no longer accepts, or whose
workspace changed, sends the plan back to the search.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path

from ...checkpoint import atomic_write
from ..base import ConvolutionDescriptor
from .convolution import DIRECTION_NAMES, EXACT_ALGORITHMS, Algorithm
from .kernel import NO_CACHE_ENV

log = logging.getLogger(__name__)

PLAN_FORMAT = 1  # raise when what a file holds, or how a plan is chosen, changes


@dataclasses.dataclass(frozen=True)
class PlanKey:
    """Everything that decides which algorithms a convolution plan takes."""

    device_name: str
    compute_capability: tuple[int, int]
    cudnn_version: int
    cublas_version: int
    desc: ConvolutionDescriptor
    x_shape: tuple[int, int, int, int]
    y_shape: tuple[int, int, int, int]
    math: str
    search: str
    workspace_limit: int

    def as_json(self) -> dict:
        """The key as JSON values (lists for tuples), with the format and the eligibility rules."""
        return {
            "format": PLAN_FORMAT,
            "device_name": self.device_name,
            "compute_capability": list(self.compute_capability),
            "cudnn_version": self.cudnn_version,
            "cublas_version": self.cublas_version,
            "convolution": dataclasses.asdict(self.desc),
            "x_shape": list(self.x_shape),
            "y_shape": list(self.y_shape),
            "math": self.math,
            "search": self.search,
            "workspace_limit": self.workspace_limit,
            "exact_algorithms": {name: list(algos) for name, algos in EXACT_ALGORITHMS.items()},
        }


def plan_cache_dir() -> Path:
    """$XDG_CACHE_HOME/cudnnnet/plans, else ~/.cache/cudnnnet/plans."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cudnnnet" / "plans"


def plan_path(key: PlanKey) -> Path | None:
    """The cache file of ``key``, or None when the disk cache is turned off."""
    if os.environ.get(NO_CACHE_ENV, "") not in ("", "0"):
        return None
    digest = hashlib.sha256(_canonical(key.as_json()).encode()).hexdigest()
    try:
        return plan_cache_dir() / f"{digest}.json"
    except RuntimeError:  # no $XDG_CACHE_HOME and no home directory
        return None


def read_plan(key: PlanKey) -> dict[str, Algorithm] | None:
    """The algorithms stored for ``key`` by direction name, or None (no entry, cache off, damaged entry)."""
    path = plan_path(key)
    if path is None:
        return None
    try:
        entry = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        log.debug("ignoring the unreadable cached plan %s: %s", path, error)
        return None
    algorithms = _algorithms(entry, key)
    if algorithms is None:
        log.debug("ignoring the cached plan %s: it holds another key or no valid algorithms", path)
    return algorithms


def write_plan(key: PlanKey, algorithms: dict[str, Algorithm]) -> None:
    """Store ``algorithms`` (by direction name) for ``key``, atomically; a failure is only logged."""
    path = plan_path(key)
    if path is None:
        return
    entry = {"key": key.as_json(),
             "algorithms": {name: dataclasses.asdict(algorithms[name]) for name in DIRECTION_NAMES}}
    try:
        with atomic_write(path) as file:
            file.write(_canonical(entry).encode())
    except OSError as error:
        log.debug("not caching the convolution plan in %s: %s", path.parent, error.strerror or error)


def _canonical(value: dict) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _algorithms(entry, key: PlanKey) -> dict[str, Algorithm] | None:
    """The entry's algorithms when it is a dict for ``key`` with a well-formed one per direction."""
    if not isinstance(entry, dict) or entry.get("key") != key.as_json():
        return None
    stored = entry.get("algorithms")
    if not isinstance(stored, dict):
        return None
    algorithms = {name: _algorithm(stored.get(name)) for name in DIRECTION_NAMES}
    return None if None in algorithms.values() else algorithms


def _algorithm(value) -> Algorithm | None:
    """An Algorithm from its JSON object, or None when a field is missing or of the wrong type."""
    if not isinstance(value, dict) or set(value) != {"algo", "workspace_bytes", "deterministic"}:
        return None
    algo, nbytes, deterministic = value["algo"], value["workspace_bytes"], value["deterministic"]
    if type(algo) is not int or type(nbytes) is not int or nbytes < 0 or type(deterministic) is not bool:
        return None
    return Algorithm(algo, nbytes, deterministic)
