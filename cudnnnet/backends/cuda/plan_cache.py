"""Convolution plans kept on disk, so that a new process skips the candidate listing
(cudnnGet*Algorithm_v7 or cudnnFind*: milliseconds a call) and the timing of candidates.

One JSON file per plan in ``cache.plan_dir()``, named by the SHA-256 of its key (``cache.keyed_path``):

    key:  the GPU's name and compute capability, the cuDNN and cuBLAS versions, the convolution,
          the x and y shapes, the math mode, the algorithm search, the workspace limit, the rules
          for eligible algorithms and this file format
    file: per direction, the algorithm chosen, its workspace in bytes and whether it is
          deterministic, for the GEMM engine the samples summed inside one GEMM, and whether backward
          data runs as a forward convolution

GEMM plans share the folder; their key and file are matmul.py's. The cache never fails a plan
(``cache.py``): a file that cannot be read, does not parse or holds another key is ignored (the plan
is searched again and the file rewritten). ``CUDNNNET_NO_CACHE=1`` turns it off. Whoever reads an
entry must check it against the library (``convolution.plan_with``): an algorithm the library no
longer accepts, or whose workspace changed, sends the plan back to the search.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from ...io import cache
from ..descriptors import ConvolutionDescriptor
from .convolution import BF16_ALGORITHMS, DIRECTION_NAMES, EXACT_ALGORITHMS, Algorithm

log = logging.getLogger(__name__)

NO_CACHE_ENV = cache.NO_CACHE_ENV

PLAN_FORMAT = 5  # raise when what a file holds, or how a plan is chosen, changes


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
            "bf16_algorithms": {name: list(algos) for name, algos in BF16_ALGORITHMS.items()},
        }


def plan_path(key: PlanKey) -> Path | None:
    """The cache file of ``key``, or None when the disk cache is turned off."""
    return cache.keyed_path(cache.plan_dir, key.as_json())


def read_plan(key: PlanKey) -> dict[str, Algorithm] | None:
    """The algorithms stored for ``key`` by direction name, or None (no entry, cache off, damaged entry)."""
    return cache.read_keyed(cache.plan_dir, key.as_json(), _algorithms, "plan", log)


def write_plan(key: PlanKey, algorithms: dict[str, Algorithm]) -> None:
    """Store ``algorithms`` (by direction name) for ``key``, atomically; a failure is only logged."""
    stored = {name: dataclasses.asdict(algorithms[name]) for name in DIRECTION_NAMES}
    cache.write_keyed(cache.plan_dir, key.as_json(), {"algorithms": stored}, "convolution plan", log)


def _algorithms(entry: dict) -> dict[str, Algorithm] | None:
    """The entry's algorithms when it holds a well-formed one per direction."""
    stored = entry.get("algorithms")
    if not isinstance(stored, dict):
        return None
    algorithms = {name: _algorithm(stored.get(name)) for name in DIRECTION_NAMES}
    return None if None in algorithms.values() else algorithms


def _algorithm(value) -> Algorithm | None:
    """An Algorithm from its JSON object, or None when a field is missing or of the wrong type."""
    fields = {"algo", "workspace_bytes", "deterministic", "samples_per_gemm", "by_forward"}
    if not isinstance(value, dict) or set(value) != fields:
        return None
    algo, nbytes, deterministic = value["algo"], value["workspace_bytes"], value["deterministic"]
    samples, by_forward = value["samples_per_gemm"], value["by_forward"]
    if (type(algo) is not int or type(nbytes) is not int or nbytes < 0 or type(deterministic) is not bool
            or type(samples) is not int or samples < 1 or type(by_forward) is not bool):
        return None
    return Algorithm(algo, nbytes, deterministic, samples, by_forward)
