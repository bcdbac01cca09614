"""Convolution and GEMM plans kept on disk, so that a new process skips the candidate listing
(cudnnGet*Algorithm_v7 or cudnnFind*, cublasLtMatmulAlgoGetHeuristic: milliseconds a call) and the
timing of candidates.

One JSON file per plan in ``plan_cache_dir()``, named by the SHA-256 of its key: everything that
decides the choice, and this file format.

    convolution  key: the GPU's name and compute capability, the cuDNN and cuBLAS versions, the
                      convolution, the x and y shapes, the math mode, the algorithm search, the
                      workspace limit and the rules for eligible algorithms
                 file: per direction, the algorithm chosen, its workspace in bytes and whether it
                      is deterministic
    GEMM         key: the GPU's name and compute capability, the cuBLAS and cuBLASLt versions, the
                      GemmProblem (transposes, sizes, leading dimensions, batch and strides, math,
                      alignment), the search, the cuBLAS workspace and the rules of the choice
                      (matmul.CANDIDATES, MARGIN, TRANSPOSE_LIMIT_BYTES)
                 file: the candidate that won ("sgemm", "lt" with cuBLASLt's 64 algorithm bytes in
                      hex, or "transposed") and its microseconds per call

The cache never fails a plan: a file that cannot be read, does not parse or holds another key is
ignored (the plan is searched again and the file rewritten); a cache directory that cannot be
written is left alone. ``CUDNNNET_NO_CACHE=1`` turns it off. Whoever reads an entry must check it
against the library (``convolution.plan_with``, ``matmul.GemmEngine`` with cublasLtMatmulAlgoCheck):
an algorithm the library no longer accepts, or whose workspace changed, sends the plan back to the
search.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import json
import logging
import math
from pathlib import Path
from typing import Callable, TypeVar

from ... import cache
from ..base import ConvolutionDescriptor
from . import matmul
from .bindings.cublaslt import MatmulAlgo
from .convolution import DIRECTION_NAMES, EXACT_ALGORITHMS, Algorithm
from .matmul import GemmPlan, GemmProblem

log = logging.getLogger(__name__)

NO_CACHE_ENV = cache.NO_CACHE_ENV

PLAN_FORMAT = 1  # raise when what a file holds, or how a plan is chosen, changes
GEMM_PLAN_FORMAT = 1  # the same for GEMM plans
GEMM_FIELDS = {"sgemm": {"candidate", "microseconds"}, "transposed": {"candidate", "microseconds"},
               "lt": {"candidate", "microseconds", "algo"}}  # what a GEMM file's choice holds, by candidate
ALGO_BYTES = ctypes.sizeof(MatmulAlgo)  # cublasLtMatmulAlgo_t: 64 opaque bytes
Parsed = TypeVar("Parsed")


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


@dataclasses.dataclass(frozen=True)
class GemmKey:
    """Everything that decides which candidate a GEMM plan takes."""

    device_name: str
    compute_capability: tuple[int, int]
    cublas_version: int
    cublaslt_version: int
    problem: GemmProblem
    search: str
    workspace_bytes: int  # the cuBLAS workspace, which cuBLASLt's algorithms share

    @classmethod
    def of(cls, context, problem: GemmProblem, search: str) -> GemmKey:
        """The key of ``problem``, planned by ``search`` on ``context``'s GPU and libraries."""
        return cls(context.device_name, context.compute_capability, context.cublas_version, context.cublaslt_version,
                   problem, search, context.cublas_workspace[1])

    def as_json(self) -> dict:
        """The key as JSON values (lists for tuples), with the format and the rules of the choice."""
        return {
            "format": GEMM_PLAN_FORMAT,
            "plan": "gemm",
            "device_name": self.device_name,
            "compute_capability": list(self.compute_capability),
            "cublas_version": self.cublas_version,
            "cublaslt_version": self.cublaslt_version,
            "problem": {**dataclasses.asdict(self.problem), "alignment": list(self.problem.alignment)},
            "search": self.search,
            "workspace_bytes": self.workspace_bytes,
            "candidates": matmul.CANDIDATES,
            "margin": matmul.MARGIN,
            "transpose_limit_bytes": matmul.TRANSPOSE_LIMIT_BYTES,
        }


@dataclasses.dataclass(frozen=True)
class GemmChoice:
    """The candidate a GEMM plan took and its GPU time per call: "sgemm" (cublasSgemm or its strided
    batch), "lt" (cublasLtMatmul with ``algo``, the algorithm's ALGO_BYTES opaque bytes) or
    "transposed" (cublasSgeam to the TN layout, then cublasSgemm)."""

    candidate: str
    microseconds: float
    algo: bytes | None = None

    @classmethod
    def of(cls, plan: GemmPlan) -> GemmChoice:
        """What ``plan`` (a timed one) runs, and its time."""
        if plan.transposed:
            return cls("transposed", plan.microseconds)
        if plan.algorithm is None:
            return cls("sgemm", plan.microseconds)
        return cls("lt", plan.microseconds, bytes(plan.algorithm))

    def as_json(self) -> dict:
        stored = {"candidate": self.candidate, "microseconds": self.microseconds}
        return stored if self.algo is None else {**stored, "algo": self.algo.hex()}


def plan_cache_dir() -> Path:
    """$XDG_CACHE_HOME/cudnnnet/plans, else ~/.cache/cudnnnet/plans."""
    return cache.cache_root() / "plans"


def plan_path(key: PlanKey | GemmKey) -> Path | None:
    """The cache file of ``key``, or None when the disk cache is turned off."""
    if cache.cache_off():
        return None
    digest = hashlib.sha256(_canonical(key.as_json()).encode()).hexdigest()
    return cache.entry_path(plan_cache_dir, f"{digest}.json")


def read_plan(key: PlanKey) -> dict[str, Algorithm] | None:
    """The algorithms stored for ``key`` by direction name, or None (no entry, cache off, damaged entry)."""
    return _read(key, _algorithms)


def write_plan(key: PlanKey, algorithms: dict[str, Algorithm]) -> None:
    """Store ``algorithms`` (by direction name) for ``key``, atomically; a failure is only logged."""
    stored = {name: dataclasses.asdict(algorithms[name]) for name in DIRECTION_NAMES}
    _write(key, {"algorithms": stored}, "convolution")


def read_gemm_plan(key: GemmKey) -> GemmChoice | None:
    """The choice stored for ``key``, or None (no entry, cache off, damaged entry)."""
    return _read(key, _gemm_choice)


def write_gemm_plan(key: GemmKey, choice: GemmChoice) -> None:
    """Store ``choice`` for ``key``, atomically; a failure is only logged."""
    _write(key, {"choice": choice.as_json()}, "GEMM")


def _read(key: PlanKey | GemmKey, parse: Callable[[dict], Parsed | None]) -> Parsed | None:
    """What ``parse`` makes of the entry stored for ``key``; None where there is no entry, the cache
    is off, or the file cannot be read, does not parse, holds another key or ``parse`` refuses it."""
    path = plan_path(key)
    entry = cache.read_entry(lambda: json.loads(path.read_bytes()), path, "plan", log) if path else None
    if entry is None:
        return None
    parsed = parse(entry) if isinstance(entry, dict) and entry.get("key") == key.as_json() else None
    if parsed is None:
        log.debug("ignoring the cached plan %s: it holds another key or no valid plan", path)
    return parsed


def _write(key: PlanKey | GemmKey, content: dict, what: str) -> None:
    """Write {"key": key, **content} to the file of ``key``, atomically; a failure is only logged."""
    path = plan_path(key)
    if path is not None:
        stored = _canonical({"key": key.as_json(), **content}).encode()
        cache.store_entry({path: lambda file: file.write(stored)}, f"the {what} plan", log)


def _canonical(value: dict) -> str:
    """``value`` as compact JSON with sorted keys; numpy integers (sizes a caller passed as such) as ints."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=int)


def _algorithms(entry: dict) -> dict[str, Algorithm] | None:
    """The entry's algorithms when it holds a well-formed one per direction."""
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


def _gemm_choice(entry: dict) -> GemmChoice | None:
    """The entry's choice when it holds the fields of a known candidate, a finite time that is not
    negative and, for "lt", ALGO_BYTES bytes of hex."""
    stored = entry.get("choice")
    if not isinstance(stored, dict) or not isinstance(stored.get("candidate"), str):
        return None
    candidate, microseconds = stored["candidate"], stored.get("microseconds")
    if set(stored) != GEMM_FIELDS.get(candidate) or not _is_microseconds(microseconds):
        return None
    algo = _algo_bytes(stored["algo"]) if candidate == "lt" else None
    if candidate == "lt" and algo is None:
        return None
    return GemmChoice(candidate, float(microseconds), algo)


def _is_microseconds(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and value >= 0


def _algo_bytes(text) -> bytes | None:
    """cuBLASLt's algorithm from its hex, or None when ``text`` is not ALGO_BYTES bytes of hex."""
    if not isinstance(text, str):
        return None
    try:
        algo = bytes.fromhex(text)
    except ValueError:
        return None
    return algo if len(algo) == ALGO_BYTES else None
