"""The disk cache of GEMM plans: the files on the host, and GemmEngine's use of them with cuBLAS,
cuBLASLt and the timer faked (the fakes count their calls), so that these tests need no GPU. Two
tests at the end, marked ``gpu``, run the real thing."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from cudnnnet.io import cache
from cudnnnet.backends.base import OP_N, OP_T
from cudnnnet.backends.cuda import matmul
from cudnnnet.backends.cuda.bindings import cublas, cublaslt
from cudnnnet.backends.cuda.matmul import GemmChoice, GemmEngine, GemmKey, GemmProblem
from cudnnnet.errors import CublasError, OutOfMemoryError
from cudnnnet.precision import BF16, TF32
from hostile_files import plant, within

PROBLEM = GemmProblem(OP_N, OP_N, 500, 256, 10, 500, 10, 500)  # the MLP's last dx: C = dy·W (NN)
WORKSPACE_BYTES = 32 << 20
KEY = GemmKey("NVIDIA H100 80GB HBM3", (9, 0), 130100, 130100, PROBLEM, "exhaustive", WORKSPACE_BYTES)
ALGO = bytes(range(64))
CHOICES = {"sgemm": GemmChoice("sgemm", 6.3), "lt": GemmChoice("lt", 2.9, ALGO),
           "transposed": GemmChoice("transposed", 4.5)}


@pytest.fixture(autouse=True)
def cache_on(tmp_path, monkeypatch):
    """An empty cache in tmp_path, the disk cache on."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.delenv(cache.NO_CACHE_ENV, raising=False)


@pytest.fixture
def cache_dir(tmp_path) -> Path:
    return tmp_path / "xdg-cache" / "cudnnnet" / "plans"


# ---- the cache file ------------------------------------------------------------------------------


@pytest.mark.parametrize("candidate", CHOICES)
def test_a_choice_round_trips_through_one_file_named_by_its_key(cache_dir, candidate):
    choice = CHOICES[candidate]
    assert matmul.read_gemm_plan(KEY) is None
    matmul.write_gemm_plan(KEY, choice)
    (path,) = cache_dir.iterdir()
    assert path == matmul.gemm_plan_path(KEY) and path.suffix == ".json" and len(path.stem) == 64
    assert matmul.read_gemm_plan(KEY) == choice
    entry = json.loads(path.read_text())
    assert entry["key"]["problem"]["alignment"] == [256, 256, 256] and entry["key"]["search"] == "exhaustive"
    assert entry["key"]["problem"]["math"] == "fp32" and "precision" not in entry["key"]["problem"]
    assert entry["choice"]["candidate"] == candidate and entry["choice"]["microseconds"] == choice.microseconds
    assert entry["choice"].get("algo") == (ALGO.hex() if candidate == "lt" else None)


def test_the_key_of_a_problem_is_taken_from_the_context():
    assert GemmKey.of(fake_context(), PROBLEM, "exhaustive") == KEY


KEY_CHANGES = {
    "device_name": "NVIDIA H200",
    "compute_capability": (8, 0),
    "cublas_version": 120900,
    "cublaslt_version": 120900,
    "search": "heuristic",
    "workspace_bytes": 4 << 20,
}
PROBLEM_CHANGES = {
    "transa": OP_T,
    "transb": OP_T,
    "m": 501,
    "n": 255,
    "k": 11,
    "lda": 512,
    "ldb": 16,
    "ldc": 512,
    "batch": 2,
    "stride_a": 5000,
    "stride_b": 2560,
    "stride_c": 128000,
    "precision": TF32,
    "alignment": (4, 256, 256),
    "c_half": True,  # a 16-bit MLP's activation as C
    "epilogue": cublaslt.EPILOGUE_RELU_BIAS,  # a 16-bit Dense's bias and ReLU in the GEMM
}


def other_keys() -> dict:
    keys = {field: dataclasses.replace(KEY, **{field: value}) for field, value in KEY_CHANGES.items()}
    for field, value in PROBLEM_CHANGES.items():
        keys[f"problem.{field}"] = dataclasses.replace(KEY, problem=dataclasses.replace(PROBLEM, **{field: value}))
    return keys


def test_every_field_of_the_key_and_of_the_problem_is_changed_below():
    assert set(KEY_CHANGES) | {"problem"} == {field.name for field in dataclasses.fields(GemmKey)}
    assert set(PROBLEM_CHANGES) == {field.name for field in dataclasses.fields(GemmProblem)}


@pytest.mark.parametrize("field", other_keys())
def test_everything_that_decides_the_choice_gives_another_file(cache_dir, field):
    other = other_keys()[field]
    matmul.write_gemm_plan(KEY, CHOICES["lt"])
    assert matmul.gemm_plan_path(other) != matmul.gemm_plan_path(KEY)
    assert matmul.read_gemm_plan(other) is None
    matmul.write_gemm_plan(other, CHOICES["sgemm"])
    assert len(list(cache_dir.iterdir())) == 2


@pytest.mark.parametrize("rule, value", [("CANDIDATES", 8), ("MARGIN", 0.95), ("TRANSPOSE_LIMIT_BYTES", 1 << 29)])
def test_the_rules_of_the_choice_are_part_of_the_key(monkeypatch, rule, value):
    before = matmul.gemm_plan_path(KEY)
    monkeypatch.setattr(matmul, rule, value)
    assert matmul.gemm_plan_path(KEY) != before


def test_the_format_is_part_of_the_key(monkeypatch):
    before = matmul.gemm_plan_path(KEY)
    monkeypatch.setattr(matmul, "GEMM_PLAN_FORMAT", matmul.GEMM_PLAN_FORMAT + 1)
    assert matmul.gemm_plan_path(KEY) != before


def test_sizes_given_as_numpy_integers_have_the_file_of_python_integers():
    sizes = {field: np.int64(getattr(PROBLEM, field)) for field in ("m", "n", "k", "lda", "ldb", "ldc")}
    key = dataclasses.replace(KEY, problem=dataclasses.replace(PROBLEM, **sizes))
    assert matmul.gemm_plan_path(key) == matmul.gemm_plan_path(KEY)
    matmul.write_gemm_plan(key, CHOICES["lt"])
    assert matmul.read_gemm_plan(key) == matmul.read_gemm_plan(KEY) == CHOICES["lt"]


def test_the_cache_file_name_is_the_sha256_of_the_key():
    text = json.dumps(KEY.as_json(), sort_keys=True, separators=(",", ":"))
    assert matmul.gemm_plan_path(KEY).stem == hashlib.sha256(text.encode()).hexdigest()


def entry_with(change, choice: GemmChoice = CHOICES["lt"]) -> bytes:
    entry = {"key": KEY.as_json(), "choice": choice.as_json()}
    change(entry)
    return json.dumps(entry).encode()


DAMAGED = {
    "empty": b"",
    "not json": b"\x00\x01 not json",
    "truncated": entry_with(lambda entry: None)[:-20],
    "a list": b"[1, 2, 3]",
    "another key": entry_with(lambda entry: entry["key"]["problem"].update(m=501)),
    "a convolution's entry": entry_with(lambda entry: entry.update(choice=None, algorithms={})),
    "no choice": entry_with(lambda entry: entry.pop("choice")),
    "an unknown candidate": entry_with(lambda entry: entry["choice"].update(candidate="cublasGemmEx")),
    "the candidate as a list": entry_with(lambda entry: entry["choice"].update(candidate=["lt"])),
    "no time": entry_with(lambda entry: entry["choice"].pop("microseconds")),
    "time as text": entry_with(lambda entry: entry["choice"].update(microseconds="2.9")),
    "time as a bool": entry_with(lambda entry: entry["choice"].update(microseconds=True)),
    "a negative time": entry_with(lambda entry: entry["choice"].update(microseconds=-1.0)),
    "an infinite time": entry_with(lambda entry: entry["choice"].update(microseconds=float("inf"))),
    "a NaN time": entry_with(lambda entry: entry["choice"].update(microseconds=float("nan"))),
    "lt without algo": entry_with(lambda entry: entry["choice"].pop("algo")),
    "algo too short": entry_with(lambda entry: entry["choice"].update(algo=ALGO[:63].hex())),
    "algo too long": entry_with(lambda entry: entry["choice"].update(algo=(ALGO + b"\0").hex())),
    "algo not hex": entry_with(lambda entry: entry["choice"].update(algo="zz" * 64)),
    "algo of an odd length": entry_with(lambda entry: entry["choice"].update(algo=ALGO.hex()[:127])),
    "algo as a list": entry_with(lambda entry: entry["choice"].update(algo=list(ALGO))),
    "sgemm with algo": entry_with(lambda entry: entry["choice"].update(algo=ALGO.hex()), CHOICES["sgemm"]),
    "an extra field": entry_with(lambda entry: entry["choice"].update(workspace_bytes=0)),
}


@pytest.mark.parametrize("content", DAMAGED.values(), ids=DAMAGED.keys())
def test_a_damaged_entry_is_ignored_and_rewritten(content, caplog):
    path = matmul.gemm_plan_path(KEY)
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    caplog.set_level(logging.DEBUG, logger=matmul.__name__)
    assert matmul.read_gemm_plan(KEY) is None
    assert "ignoring the" in caplog.text
    matmul.write_gemm_plan(KEY, CHOICES["lt"])
    assert matmul.read_gemm_plan(KEY) == CHOICES["lt"]


def test_a_whole_number_of_microseconds_is_read_as_a_float():
    path = matmul.gemm_plan_path(KEY)
    path.parent.mkdir(parents=True)
    path.write_bytes(entry_with(lambda entry: entry["choice"].update(microseconds=3)))
    assert matmul.read_gemm_plan(KEY) == GemmChoice("lt", 3.0, ALGO)


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_device_planted_as_the_entry_is_ignored_promptly_and_replaced(kind, caplog):
    path = matmul.gemm_plan_path(KEY)
    plant(path, kind)
    caplog.set_level(logging.DEBUG, logger=matmul.__name__)
    with within(5):
        assert matmul.read_gemm_plan(KEY) is None
    assert "not a regular file" in caplog.text
    matmul.write_gemm_plan(KEY, CHOICES["lt"])
    assert path.is_file() and not path.is_symlink() and matmul.read_gemm_plan(KEY) == CHOICES["lt"]


def test_an_unreadable_entry_and_an_unwritable_cache_only_log(caplog):
    path = matmul.gemm_plan_path(KEY)
    path.mkdir(parents=True)  # a directory where the file should be: it can be neither read nor replaced
    caplog.set_level(logging.DEBUG, logger=matmul.__name__)
    assert matmul.read_gemm_plan(KEY) is None
    matmul.write_gemm_plan(KEY, CHOICES["sgemm"])
    assert path.is_dir()
    assert "ignoring the unreadable cached plan" in caplog.text and "not caching the GEMM plan" in caplog.text
    assert all(record.levelno == logging.DEBUG for record in caplog.records)


def test_a_cache_directory_that_cannot_be_created_is_skipped(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file"))
    matmul.write_gemm_plan(KEY, CHOICES["sgemm"])
    assert matmul.read_gemm_plan(KEY) is None


def test_the_no_cache_variable_writes_and_reads_nothing(cache_dir, monkeypatch):
    matmul.write_gemm_plan(KEY, CHOICES["lt"])
    monkeypatch.setenv(cache.NO_CACHE_ENV, "1")
    monkeypatch.setattr(cache, "plan_dir", lambda: pytest.fail("the cache directory was looked up"))
    assert matmul.read_gemm_plan(KEY) is None  # the file is there, and not read
    matmul.write_gemm_plan(dataclasses.replace(KEY, search="heuristic"), CHOICES["sgemm"])
    assert len(list(cache_dir.iterdir())) == 1


# ---- the engine's use of it, with cuBLAS, cuBLASLt and the timer faked ----------------------------


class FakeBuffer:
    def __init__(self, nbytes: int):
        self.nbytes, self.ptr = nbytes, 0x7000_0000

    def free(self) -> None:
        pass


class FakeGpu:
    """cuBLAS and cuBLASLt as GemmEngine calls them. The heuristic offers the algorithms numbered in
    ``offered`` (the number in the first 8 bytes); cublasLtMatmul refuses those in ``refused`` with a
    status error, as it refuses an algorithm that does not apply. Every GEMM run is recorded in
    ``ran``; the timer times a candidate by running it once and looking ``times`` up by what ran
    ("sgemm", ("lt", number) or "transposed"; None: the candidate failed)."""

    def __init__(self, monkeypatch):
        self.offered, self.refused = [1, 2], set()
        self.times = {"sgemm": 6.3, ("lt", 1): 4.0, ("lt", 2): 2.9, "transposed": 5.0}
        self.heuristics = self.timed = self.timers = 0
        self.ran: list = []
        self.biases: list = []  # the bias addresses set on a descriptor, in order
        self.out_of_memory = False
        for name in ("matmul_desc_set_int32", "matmul_desc_set_uint32", "matrix_layout_set_batch",
                     "matrix_layout_destroy", "matmul_desc_destroy", "preference_set_uint32", "preference_destroy"):
            monkeypatch.setattr(cublaslt, name, lambda *args: None)
        monkeypatch.setattr(cublaslt, "matmul_desc_set_pointer", lambda desc, attribute, pointer:
                            self.biases.append(pointer))
        for name in ("matmul_desc_create", "matrix_layout_create", "preference_create"):
            monkeypatch.setattr(cublaslt, name, lambda *args: 0x100)
        monkeypatch.setattr(cublaslt, "algo_get_heuristic", self.algo_get_heuristic)
        monkeypatch.setattr(cublaslt, "matmul", self.matmul)
        monkeypatch.setattr(cublas, "sgemm", lambda *args: self.ran.append("sgemm"))
        monkeypatch.setattr(cublas, "sgemm_strided_batched", lambda *args: self.ran.append("sgemm"))
        monkeypatch.setattr(cublas, "sgeam", lambda *args: self.ran.append("sgeam"))
        monkeypatch.setattr(matmul, "GemmTimer", self.timer)
        monkeypatch.setattr(matmul, "DeviceBuffer", SimpleNamespace(allocate=self.allocate))

    def algo_get_heuristic(self, handle, desc, a, b, c, d, preference, requested):
        self.heuristics += 1
        return [self.result(number) for number in self.offered[:requested]]

    def matmul(self, *args) -> None:
        number = args[12].data[0]
        if number in self.refused:
            raise CublasError("cublasLtMatmul", 15, "CUBLAS_STATUS_NOT_SUPPORTED")
        self.ran.append(("lt", number))

    def result(self, number: int) -> cublaslt.HeuristicResult:
        result = cublaslt.HeuristicResult()
        result.algo.data[0], result.workspace_size = number, 1024
        return result

    def allocate(self, nbytes: int) -> FakeBuffer:
        if self.out_of_memory:
            raise OutOfMemoryError("cudaMalloc failed: out of memory")
        return FakeBuffer(nbytes)

    def timer(self, context):
        self.timers += 1
        return SimpleNamespace(microseconds=self.time)

    def time(self, call) -> float | None:
        """As GemmTimer.microseconds: None for a candidate that fails."""
        self.timed += 1
        self.ran.clear()
        try:
            call()
        except CublasError:
            return None
        return self.times.get("transposed" if "sgeam" in self.ran else self.ran[-1])


@pytest.fixture
def gpu(monkeypatch) -> FakeGpu:
    return FakeGpu(monkeypatch)


def fake_context(capturing: bool = False) -> SimpleNamespace:
    """What GemmEngine and GemmKey read of a CudaContext, for KEY's GPU and libraries."""
    return SimpleNamespace(device_name=KEY.device_name, compute_capability=KEY.compute_capability,
                           cublas_version=KEY.cublas_version, cublaslt_version=KEY.cublaslt_version,
                           cublas_workspace=(0x5000_0000, WORKSPACE_BYTES), cublas_lt=SimpleNamespace(handle=0x10),
                           cublas=SimpleNamespace(handle=0x20), stream=SimpleNamespace(address=0),
                           is_capturing=lambda: capturing, finish_warm_up=lambda: None)


def planned(problem: GemmProblem = PROBLEM, search: str = "exhaustive", capturing: bool = False):
    """A new engine (a new "process") after one call of ``problem``: the engine and its plan."""
    engine = GemmEngine(fake_context(capturing), lambda value: value)
    engine.run(problem, search, 1.0, 0x1000, 0x2000, 0.0, 0x3000)
    return engine, engine.plans[problem, search]


def what_runs(plan) -> tuple:
    algorithm = bytes(plan.algorithm) if plan.algorithm is not None else None
    return plan.transposed, algorithm, plan.microseconds


WINNING_TIMES = {"sgemm": {"sgemm": 2.0}, "lt": {}, "transposed": {"transposed": 1.5}}
RUNS = {"sgemm": ["sgemm"], "lt": [("lt", 2)], "transposed": ["sgeam", "sgemm"]}  # PROBLEM is NN: A is copied


@pytest.mark.parametrize("winner", WINNING_TIMES)
def test_a_new_engine_takes_the_plan_from_disk_without_searching(gpu, cache_dir, winner):
    gpu.times.update(WINNING_TIMES[winner])
    _, searched = planned()
    assert gpu.heuristics == 1 and gpu.timed == 4 and gpu.timers == 1  # cublasSgemm, 2 algorithms, transposed
    assert matmul.read_gemm_plan(KEY) == GemmChoice.of(searched) and GemmChoice.of(searched).candidate == winner
    assert len(list(cache_dir.iterdir())) == 1
    gpu.ran.clear()
    engine, cached = planned()
    assert gpu.heuristics == 1 and gpu.timed == 4 and gpu.timers == 1  # nothing asked, nothing timed
    assert what_runs(cached) == what_runs(searched)
    assert gpu.ran == RUNS[winner]  # the call ran the stored plan
    if winner == "transposed":
        assert engine._scratch.nbytes >= 4 * PROBLEM.transposed_values


def test_a_stored_algorithm_cublaslt_no_longer_runs_is_searched_again_and_rewritten(gpu, caplog):
    _, searched = planned()
    assert searched.algorithm.data[0] == 2
    gpu.refused.add(2)
    gpu.offered = [1]
    gpu.ran.clear()
    caplog.set_level(logging.DEBUG, logger=matmul.__name__)
    engine, again = planned()
    assert gpu.heuristics == 2
    assert "fails here" in caplog.text
    assert again.algorithm.data[0] == 1 and not again.unproven
    assert gpu.ran[-1] == ("lt", 1)  # the call ran the new plan
    engine.run(PROBLEM, "exhaustive", 1.0, 0x1000, 0x2000, 0.0, 0x3000)
    assert gpu.heuristics == 2 and gpu.ran[-1] == ("lt", 1)
    assert matmul.read_gemm_plan(KEY) == GemmChoice("lt", 4.0, bytes(again.algorithm))  # rewritten


TRANSPOSED_ELSEWHERE = {
    "a batch": dataclasses.replace(PROBLEM, batch=2, stride_a=5000, stride_b=2560, stride_c=128000),
    "already TN": GemmProblem(OP_T, OP_N, 500, 256, 10, 10, 10, 500),
    "over the limit": GemmProblem(OP_N, OP_N, 20000, 256, 20000, 20000, 20000, 20000),
    "no room for the scratch": PROBLEM,
}


@pytest.mark.parametrize("case", TRANSPOSED_ELSEWHERE)
def test_a_stored_transposing_plan_that_does_not_apply_is_searched_again(gpu, case):
    problem = TRANSPOSED_ELSEWHERE[case]
    key = dataclasses.replace(KEY, problem=problem)
    matmul.write_gemm_plan(key, CHOICES["transposed"])
    gpu.times = {"sgemm": 3.0}
    gpu.out_of_memory = case == "no room for the scratch"
    engine, plan = planned(problem)
    assert gpu.heuristics == 1
    assert not plan.transposed and engine._scratch is None
    assert matmul.read_gemm_plan(key) == GemmChoice("sgemm", 3.0)  # rewritten


@pytest.mark.parametrize("case", ["heuristic search", "capture", "k = 0"])
def test_a_plan_that_is_not_timed_touches_no_file(gpu, monkeypatch, case):
    monkeypatch.setattr(cache, "keyed_path", lambda folder, key: pytest.fail("the disk cache was looked up"))
    problem = dataclasses.replace(PROBLEM, k=0) if case == "k = 0" else PROBLEM
    _, plan = planned(problem, "heuristic" if case == "heuristic search" else "exhaustive", case == "capture")
    assert what_runs(plan) == (False, None, None)  # cublasSgemm, untimed
    assert gpu.heuristics == gpu.timed == 0


def test_a_plan_cublaslt_offers_nothing_for_is_not_stored(gpu, cache_dir):
    gpu.offered = []
    _, plan = planned()
    assert what_runs(plan) == (False, None, None) and gpu.timed == 0
    assert not cache_dir.exists()


EPILOGUE = dataclasses.replace(PROBLEM, precision=BF16, c_half=True, epilogue=cublaslt.EPILOGUE_RELU_BIAS)
BIAS = 0x4000


def planned_epilogue(search: str = "exhaustive", capturing: bool = False):
    """A new engine after one call of EPILOGUE with its bias at BIAS: the engine, what run returned, the plan."""
    engine = GemmEngine(fake_context(capturing), lambda value: value)
    ran = engine.run(EPILOGUE, search, 1.0, 0x1000, 0x2000, 0.0, 0x3000, BIAS)
    return engine, ran, engine.plans[EPILOGUE, search]


def test_an_epilogue_is_timed_among_cublaslts_algorithms_alone_and_stored(gpu, cache_dir):
    _, ran, plan = planned_epilogue()
    assert ran and gpu.heuristics == 1 and gpu.timed == 2  # the two algorithms; cublasSgemm has no epilogue
    assert "sgemm" not in gpu.ran and gpu.ran[-1] == ("lt", 2) and plan.microseconds == 2.9
    assert gpu.biases == [BIAS]  # set before the heuristic, which reads its alignment
    assert matmul.read_gemm_plan(dataclasses.replace(KEY, problem=EPILOGUE)) == GemmChoice("lt", 2.9, bytes(plan.algorithm))
    gpu.ran.clear()
    engine, ran, cached = planned_epilogue()
    assert ran and gpu.heuristics == 1 and gpu.ran == [("lt", 2)]  # from disk
    engine.run(EPILOGUE, "exhaustive", 1.0, 0x1000, 0x2000, 0.0, 0x3000, BIAS + 512)
    assert gpu.biases[-1] == BIAS + 512 and gpu.ran[-1] == ("lt", 2)  # each call's own bias


@pytest.mark.parametrize("case", ["heuristic search", "capture"])
def test_an_untimed_epilogue_takes_the_heuristics_first_algorithm(gpu, case):
    _, ran, plan = planned_epilogue("heuristic" if case == "heuristic search" else "exhaustive", case == "capture")
    assert ran and gpu.heuristics == 1 and gpu.timed == 0
    assert plan.algorithm.data[0] == 1 and gpu.ran == [("lt", 1)] and gpu.biases == [BIAS]


@pytest.mark.parametrize("case", ["offered", "refused"])
def test_an_epilogue_without_an_algorithm_runs_nothing_and_says_so(gpu, cache_dir, case):
    if case == "offered":
        gpu.offered = []
    else:
        gpu.refused.update({1, 2})
    engine, ran, plan = planned_epilogue()
    assert not ran and plan.algorithm is None and gpu.ran == []
    assert not cache_dir.exists()
    assert not engine.run(EPILOGUE, "exhaustive", 1.0, 0x1000, 0x2000, 0.0, 0x3000, BIAS) and gpu.ran == []


def test_a_stored_choice_other_than_cublaslt_is_searched_again_for_an_epilogue(gpu):
    key = dataclasses.replace(KEY, problem=EPILOGUE)
    matmul.write_gemm_plan(key, CHOICES["sgemm"])
    _, ran, plan = planned_epilogue()
    assert ran and gpu.heuristics == 1 and plan.algorithm.data[0] == 2
    assert matmul.read_gemm_plan(key).candidate == "lt"


def test_the_no_cache_variable_searches_every_time(gpu, cache_dir, monkeypatch):
    monkeypatch.setenv(cache.NO_CACHE_ENV, "1")
    planned()
    planned()
    assert gpu.heuristics == 2
    assert not cache_dir.exists()


# ---- on the GPU ------------------------------------------------------------------------------------


def gemm_on_gpu(cuda):
    """The MLP's last dx (NN, 500 × 256 with k = 10) on ``cuda``: the problem, the operands and
    C = A·B by NumPy, column-major as cuBLAS stores it."""
    from cudnnnet.backends.cuda.matmul import alignment
    from cudnnnet.tensor import Tensor

    m, n, k = 500, 256, 10
    rng = np.random.default_rng(11)
    a, b = rng.standard_normal(m * k).astype(np.float32), rng.standard_normal(k * n).astype(np.float32)
    expected = a.reshape(k, m).T.astype(np.float64) @ b.reshape(n, k).T.astype(np.float64)  # (m × n)
    A, B, C = Tensor.from_numpy(a, cuda), Tensor.from_numpy(b, cuda), Tensor.zeros((m * n,), cuda)
    problem = GemmProblem(OP_N, OP_N, m, n, k, m, k, m, precision=cuda.precision,
                          alignment=alignment(A.data.ptr, B.data.ptr, C.data.ptr))
    return problem, (A, B, C), expected.T.ravel()


def run_engine(cuda, problem, operands):
    """A fresh GemmEngine on ``cuda``'s context runs C = A·B once: its plan and C."""
    A, B, C = operands
    C.write_(np.zeros(problem.m * problem.n, np.float32))
    engine = GemmEngine(cuda.context, cuda.context.scalar)
    try:
        engine.run(problem, "exhaustive", 1.0, A.data.ptr, B.data.ptr, 0.0, C.data.ptr)
        plan = engine.plans[problem, "exhaustive"]
        return what_runs(plan), C.numpy().reshape(-1)
    finally:
        engine.close()


def assert_close(got: np.ndarray, expected: np.ndarray, math: str) -> None:
    tolerance = 1e-5 if math == "fp32" else 1e-3
    assert np.linalg.norm(got - expected) <= tolerance * np.linalg.norm(expected)


@pytest.mark.gpu
def test_a_second_engine_on_the_gpu_takes_the_plan_from_disk(cuda, cache_dir):
    from cudnnnet.backends.cuda import bindings

    problem, operands, expected = gemm_on_gpu(cuda)
    bindings.reset_calls()
    searched, from_search = run_engine(cuda, problem, operands)
    assert bindings.calls["cublasLtMatmulAlgoGetHeuristic"] == 1 and bindings.calls["cudaEventElapsedTime"] > 0
    (entry,) = cache_dir.iterdir()
    assert json.loads(entry.read_text())["key"]["problem"]["m"] == problem.m
    bindings.reset_calls()
    cached, from_disk = run_engine(cuda, problem, operands)
    assert bindings.calls["cublasLtMatmulAlgoGetHeuristic"] == 0 and bindings.calls["cudaEventElapsedTime"] == 0
    assert cached == searched  # the same candidate, with the time measured by the search
    assert_close(from_search, expected, cuda.math)
    assert_close(from_disk, expected, cuda.math)


@pytest.mark.gpu
def test_a_stored_cublaslt_algorithm_runs_on_the_gpu_without_a_search(cuda, cache_dir):
    """Whatever won above, a stored cuBLASLt algorithm (the heuristic's first) is taken without a
    search and computes C."""
    from cudnnnet.backends.cuda import bindings
    from cudnnnet.backends.cuda.matmul import LtMatmul

    problem, operands, expected = gemm_on_gpu(cuda)
    lt = LtMatmul(problem)
    try:
        algorithms = lt.algorithms(cuda.context.cublas_lt.handle, cuda.context.cublas_workspace[1], problem)
    finally:
        lt.close()
    assert algorithms, "cuBLASLt offered no algorithm"
    algo = bytes(algorithms[0].algo)
    matmul.write_gemm_plan(GemmKey.of(cuda.context, problem, "exhaustive"), GemmChoice("lt", 1.0, algo))
    bindings.reset_calls()
    cached, from_disk = run_engine(cuda, problem, operands)
    assert bindings.calls["cublasLtMatmulAlgoGetHeuristic"] == 0
    assert cached == (False, algo, 1.0) and bindings.calls["cublasLtMatmul"] == 1
    assert_close(from_disk, expected, cuda.math)


@pytest.mark.parametrize("c_half, masked", [(True, True), (False, False)])
def test_the_heuristic_of_a_16_bit_c_is_asked_for_no_split_k_summed_in_16_bits(monkeypatch, c_half, masked):
    """cuBLASLt may sum a split K in C's type (CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE); for a 16-bit C
    that rounds every partial sum, which the host's oracle does not: only INPLACE and COMPUTE_TYPE."""
    attributes = {}
    monkeypatch.setattr(cublaslt, "preference_create", lambda *args: 0x100)
    monkeypatch.setattr(cublaslt, "preference_destroy", lambda *args: None)
    monkeypatch.setattr(cublaslt, "preference_set_uint32", lambda pref, attribute, value: attributes.update({attribute: value}))
    monkeypatch.setattr(cublaslt, "algo_get_heuristic", lambda *args: [])
    problem = matmul.GemmProblem(OP_T, OP_N, 8, 8, 4096, 4096, 4096, 8, precision=BF16, c_half=c_half)
    lt = SimpleNamespace(desc=0x1, layouts=[0x2, 0x3, 0x4])
    matmul.LtMatmul.algorithms(lt, 0x5, 1 << 20, problem)
    assert attributes.get(cublaslt.PREF_REDUCTION_SCHEME_MASK) == (0x3 if masked else None)
