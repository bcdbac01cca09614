"""The disk cache of convolution plans and the reuse of a larger batch's plan, on the host: cuDNN's
workspace queries and the search are replaced by fakes that count their calls, so these tests need
no GPU (tests/backends/test_cuda_backend.py runs the real thing)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from cudnnnet.io import cache
from cudnnnet.backends.descriptors import ConvolutionDescriptor
from cudnnnet.backends.cuda import convolution, plan_cache
from cudnnnet.backends.cuda import convolution_planner as planner_module
from cudnnnet.backends.cuda.backend import CudaBackend
from cudnnnet.backends.cuda.convolution_planner import ConvolutionPlanner
from cudnnnet.backends.cuda.convolution import DIRECTION_NAMES, Algorithm
from cudnnnet.backends.cuda.gemm_convolution import GEMM_ALGORITHM, GemmShape, workspace_bytes
from cudnnnet.errors import CudnnError
from cudnnnet.precision import BF16, FP32, TF32
from hostile_files import plant, within

DESC = ConvolutionDescriptor(20, 1, 5)
X_SHAPE = (256, 1, 28, 28)
KEY = plan_cache.PlanKey("NVIDIA H100 80GB HBM3", (9, 0), 91900, 130100, DESC, X_SHAPE, DESC.output_shape(X_SHAPE),
                         "fp32", "exhaustive", 256 << 20)
ALGORITHMS = {"forward": Algorithm(1, 4096), "backward_data": Algorithm(GEMM_ALGORITHM, 1 << 20),
              "backward_filter": Algorithm(1, 8192, deterministic=True)}


@pytest.fixture(autouse=True)
def cache_on(tmp_path, monkeypatch):
    """An empty cache in tmp_path, the disk cache on."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.delenv(plan_cache.NO_CACHE_ENV, raising=False)


@pytest.fixture
def cache_dir(tmp_path) -> Path:
    return tmp_path / "xdg-cache" / "cudnnnet" / "plans"


# ---- the cache file ------------------------------------------------------------------------------


def test_a_plan_round_trips_through_one_file_named_by_its_key(cache_dir):
    assert plan_cache.read_plan(KEY) is None
    plan_cache.write_plan(KEY, ALGORITHMS)
    (path,) = cache_dir.iterdir()
    assert path == plan_cache.plan_path(KEY) and path.suffix == ".json" and len(path.stem) == 64
    assert plan_cache.read_plan(KEY) == ALGORITHMS
    entry = json.loads(path.read_text())
    assert entry["key"]["device_name"] == KEY.device_name and entry["key"]["x_shape"] == list(X_SHAPE)
    assert entry["algorithms"]["backward_data"] == {"algo": GEMM_ALGORITHM, "workspace_bytes": 1 << 20,
                                                    "deterministic": True, "samples_per_gemm": 1,
                                                    "by_forward": False}


KEY_CHANGES = {
    "device_name": "NVIDIA H200",
    "compute_capability": (8, 0),
    "cudnn_version": 91000,
    "cublas_version": 120900,
    "desc": ConvolutionDescriptor(20, 1, 5, padding=1),
    "x_shape": (96, 1, 28, 28),
    "y_shape": (256, 20, 25, 25),
    "math": "tf32",
    "search": "heuristic",
    "workspace_limit": 64 << 20,
}


@pytest.mark.parametrize("field", KEY_CHANGES)
def test_everything_that_decides_the_choice_gives_another_file(cache_dir, field):
    other = dataclasses.replace(KEY, **{field: KEY_CHANGES[field]})
    plan_cache.write_plan(KEY, ALGORITHMS)
    assert plan_cache.plan_path(other) != plan_cache.plan_path(KEY)
    assert plan_cache.read_plan(other) is None
    plan_cache.write_plan(other, ALGORITHMS)
    assert len(list(cache_dir.iterdir())) == 2


def test_the_eligibility_rules_are_part_of_the_key(monkeypatch):
    before = plan_cache.plan_path(KEY)
    monkeypatch.setitem(convolution.EXACT_ALGORITHMS, "forward", (0, 1))
    assert plan_cache.plan_path(KEY) != before
    exact = plan_cache.plan_path(KEY)
    monkeypatch.setitem(convolution.BF16_ALGORITHMS, "forward", (1,))
    assert plan_cache.plan_path(KEY) != exact


def entry_with(change) -> bytes:
    entry = {"key": KEY.as_json(), "algorithms": {name: dataclasses.asdict(ALGORITHMS[name]) for name in DIRECTION_NAMES}}
    change(entry)
    return json.dumps(entry).encode()


DAMAGED = {
    "empty": b"",
    "not json": b"\x00\x01 not json",
    "truncated": entry_with(lambda entry: None)[:-20],
    "a list": b"[1, 2, 3]",
    "nested too deeply": b"[" * 100_000 + b"]" * 100_000,
    "another key": entry_with(lambda entry: entry["key"].update(x_shape=[96, 1, 28, 28])),
    "a direction missing": entry_with(lambda entry: entry["algorithms"].pop("backward_filter")),
    "algo as text": entry_with(lambda entry: entry["algorithms"]["forward"].update(algo="1")),
    "algo as a bool": entry_with(lambda entry: entry["algorithms"]["forward"].update(algo=True)),
    "negative workspace": entry_with(lambda entry: entry["algorithms"]["forward"].update(workspace_bytes=-1)),
    "an extra field": entry_with(lambda entry: entry["algorithms"]["forward"].update(speed=1.0)),
}


@pytest.mark.parametrize("content", DAMAGED.values(), ids=DAMAGED.keys())
def test_a_damaged_entry_is_ignored_and_rewritten(content, caplog):
    path = plan_cache.plan_path(KEY)
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    caplog.set_level(logging.DEBUG, logger=plan_cache.__name__)
    assert plan_cache.read_plan(KEY) is None
    assert "ignoring the" in caplog.text
    plan_cache.write_plan(KEY, ALGORITHMS)
    assert plan_cache.read_plan(KEY) == ALGORITHMS


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_device_planted_as_the_entry_is_ignored_promptly_and_replaced(kind, caplog):
    path = plan_cache.plan_path(KEY)
    plant(path, kind)
    caplog.set_level(logging.DEBUG, logger=plan_cache.__name__)
    with within(5):
        assert plan_cache.read_plan(KEY) is None
    assert "not a regular file" in caplog.text
    plan_cache.write_plan(KEY, ALGORITHMS)
    assert path.is_file() and not path.is_symlink() and plan_cache.read_plan(KEY) == ALGORITHMS


def test_an_unreadable_entry_and_an_unwritable_cache_only_log(caplog):
    path = plan_cache.plan_path(KEY)
    path.mkdir(parents=True)  # a directory where the file should be: it can be neither read nor replaced
    caplog.set_level(logging.DEBUG, logger=plan_cache.__name__)
    assert plan_cache.read_plan(KEY) is None
    plan_cache.write_plan(KEY, ALGORITHMS)
    assert path.is_dir()
    assert "ignoring the unreadable cached plan" in caplog.text and "not caching the convolution plan" in caplog.text
    assert all(record.levelno == logging.DEBUG for record in caplog.records)


def test_a_cache_directory_that_cannot_be_created_is_skipped(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file"))
    plan_cache.write_plan(KEY, ALGORITHMS)
    assert plan_cache.read_plan(KEY) is None


def test_no_home_directory_means_no_cache(monkeypatch):
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(os.path, "expanduser", lambda path: path)  # what it returns where the user has no home
    assert plan_cache.plan_path(KEY) is None
    plan_cache.write_plan(KEY, ALGORITHMS)
    assert plan_cache.read_plan(KEY) is None


def test_a_relative_xdg_cache_home_is_ignored_for_the_home_cache(tmp_path, monkeypatch):
    """The XDG base directory specification: a relative path in $XDG_CACHE_HOME is invalid, ignored."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative-cache")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_root() == tmp_path / "home" / ".cache" / "cudnnnet"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "absolute-cache"))
    assert cache.cache_root() == tmp_path / "absolute-cache" / "cudnnnet"


def test_the_no_cache_variable_turns_the_disk_cache_off(cache_dir, monkeypatch):
    plan_cache.write_plan(KEY, ALGORITHMS)
    monkeypatch.setenv(plan_cache.NO_CACHE_ENV, "1")
    monkeypatch.setattr(cache, "plan_dir", lambda: pytest.fail("the cache directory was looked up"))
    assert plan_cache.read_plan(KEY) is None  # the file is there, and not read
    plan_cache.write_plan(dataclasses.replace(KEY, math="tf32"), ALGORITHMS)
    assert len(list(cache_dir.iterdir())) == 1


# ---- the backend's use of it, with cuDNN faked ---------------------------------------------------


class FakeCudnn:
    """cudnnGet*WorkspaceSize as ``convolution.plan_with`` calls it: 1000·algo + the batch size
    bytes, except for the (direction, algo) pairs in ``unsupported``; and a search (``make_plan``)
    that counts its calls and picks ``choice``."""

    def __init__(self, monkeypatch):
        self.queries, self.searches = Counter(), 0
        self.unsupported: set = set()
        self.workspace_offset = 0
        self.choice = {"forward": 1, "backward_data": GEMM_ALGORITHM, "backward_filter": 1}
        directions = tuple(dataclasses.replace(direction, workspace_size=self.workspace_size(direction.name))
                           for direction in convolution.DIRECTIONS)
        monkeypatch.setattr(convolution, "DIRECTIONS", directions)
        monkeypatch.setattr(planner_module, "make_plan", self.make_plan)

    def workspace_size(self, name: str):
        def query(handle, *operands_and_algo):
            *operands, algo = operands_and_algo
            self.queries[name] += 1
            if (name, algo) in self.unsupported:
                raise CudnnError(f"cudnnGet{name}WorkspaceSize", 3000, "CUDNN_STATUS_NOT_SUPPORTED")
            batch = next(handle[1][0] for handle in operands if handle[0] == "tensor")
            return 1000 * algo + batch + self.workspace_offset

        return query

    def make_plan(self, handle, descriptors, desc, x_shape, y_shape, math, math_type, limit, search,
                  gemm_candidate=True, measure=None, deterministic=True):
        self.searches += 1
        algorithms = {name: Algorithm(algo, 0) for name, algo in self.choice.items()}
        return convolution.plan_with(handle, descriptors, desc, x_shape, y_shape, math, math_type, limit, algorithms)


class FakeDescriptors:
    """DescriptorCache's calls; a handle says what it describes."""

    def tensor(self, shape, data_type=0):
        return SimpleNamespace(handle=("tensor", shape, data_type))

    def filter(self, shape, data_type=0):
        return SimpleNamespace(handle=("filter", shape, data_type))

    def convolution(self, desc, math_type):
        return SimpleNamespace(handle=("convolution", desc, math_type))


def fake_backend() -> CudaBackend:
    """A CudaBackend (a new "process") on a fake context: no GPU, no library."""
    backend = CudaBackend.__new__(CudaBackend)
    backend.context = SimpleNamespace(device_name=KEY.device_name, compute_capability=KEY.compute_capability,
                                      cudnn_version=KEY.cudnn_version, cublas_version=KEY.cublas_version,
                                      is_capturing=lambda: False, workspace=lambda nbytes: 0, ones=lambda count: 0,
                                      finish_warm_up=lambda: None,
                                      cudnn=SimpleNamespace(handle=0), descriptors=FakeDescriptors())
    backend.set_engine("fast")  # KEY's search: "exhaustive", the GEMM engine among the candidates
    backend._convolutions = ConvolutionPlanner(backend, KEY.workspace_limit)
    return backend


def plan_key(backend, x_shape, y_shape) -> plan_cache.PlanKey:
    return backend._convolutions.plan_key(DESC, x_shape, y_shape, backend.precision, backend.engine)


@pytest.fixture
def fake_cudnn(monkeypatch) -> FakeCudnn:
    return FakeCudnn(monkeypatch)


def plan(backend, batch):
    x_shape = (batch,) + X_SHAPE[1:]
    return backend.convolution_plan(DESC, x_shape, DESC.output_shape(x_shape))


def algorithms_of(plan) -> dict:
    return {name: getattr(plan, name) for name in DIRECTION_NAMES}


def test_a_new_backend_takes_the_plan_from_disk_without_searching(fake_cudnn, cache_dir):
    first = plan(fake_backend(), 256)
    assert fake_cudnn.searches == 1 and len(list(cache_dir.iterdir())) == 1
    second = plan(fake_backend(), 256)
    assert fake_cudnn.searches == 1
    assert algorithms_of(second) == algorithms_of(first)
    assert second.forward == Algorithm(1, 1256) and second.backward_data.algo == GEMM_ALGORITHM


@pytest.mark.parametrize("change", ["unsupported now", "another workspace"])
def test_a_cached_plan_cuDNN_no_longer_accepts_is_searched_again_and_rewritten(fake_cudnn, change):
    plan(fake_backend(), 256)
    if change == "unsupported now":
        fake_cudnn.unsupported.add(("forward", 1))
        fake_cudnn.choice["forward"] = 0
    else:
        fake_cudnn.workspace_offset = 8
    again = plan(fake_backend(), 256)
    assert fake_cudnn.searches == 2
    assert plan_cache.read_plan(plan_key(fake_backend(), again.x_shape, again.y_shape)) == algorithms_of(again)


@pytest.mark.parametrize("algo", [10 ** 6, 6, -2])
def test_a_cached_algorithm_that_is_not_eligible_is_searched_again(fake_cudnn, algo):
    backend = fake_backend()
    path = plan_cache.plan_path(plan_key(backend, X_SHAPE, DESC.output_shape(X_SHAPE)))
    searched = plan(backend, 256)
    entry = json.loads(path.read_text())
    entry["algorithms"]["forward"]["algo"] = algo  # unknown to cuDNN, or inexact (Winograd) in FP32
    path.write_text(json.dumps(entry))
    assert plan(fake_backend(), 256).forward == searched.forward
    assert fake_cudnn.searches == 2
    assert json.loads(path.read_text())["algorithms"]["forward"]["algo"] == 1  # rewritten


def test_a_smaller_batch_reuses_the_larger_plan_s_algorithms_with_its_own_workspaces(fake_cudnn):
    backend = fake_backend()
    large = plan(backend, 256)
    small = plan(backend, 96)
    assert fake_cudnn.searches == 1
    assert [getattr(small, name).algo for name in DIRECTION_NAMES] == [getattr(large, name).algo for name in DIRECTION_NAMES]
    assert small.forward.workspace_bytes == 1096 and small.backward_filter.workspace_bytes == 1096
    gemm = GemmShape.of(DESC, small.x_shape, small.y_shape)
    assert small.backward_data.workspace_bytes == workspace_bytes("backward_data", gemm) < large.backward_data.workspace_bytes
    plan(backend, 512)  # a larger batch is searched
    assert fake_cudnn.searches == 2


def test_a_smaller_batch_is_searched_where_the_larger_plan_cannot_run(fake_cudnn):
    backend = fake_backend()
    plan(backend, 256)
    fake_cudnn.unsupported.add(("backward_filter", 1))  # as if algorithm 1 could not run at batch 96
    fake_cudnn.choice["backward_filter"] = 0
    assert plan(backend, 96).backward_filter.algo == 0
    assert fake_cudnn.searches == 2


def test_a_larger_plan_with_a_non_deterministic_algorithm_is_not_reused(fake_cudnn):
    backend = fake_backend()
    large = plan(backend, 256)
    key = next(iter(backend._convolutions.plans))
    backend._convolutions.plans[key] = dataclasses.replace(large, backward_filter=Algorithm(0, 256, deterministic=False))
    plan(backend, 96)
    assert fake_cudnn.searches == 2


def test_plan_with_refuses_inexact_algorithms_in_fp32(fake_cudnn):
    algorithms = {name: Algorithm(GEMM_ALGORITHM, 0) for name in DIRECTION_NAMES}
    y_shape = DESC.output_shape(X_SHAPE)
    assert convolution.plan_with(0, FakeDescriptors(), DESC, X_SHAPE, y_shape, FP32, 3, 1 << 30, algorithms)
    algorithms["forward"] = Algorithm(6, 0)  # CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD
    assert convolution.plan_with(0, FakeDescriptors(), DESC, X_SHAPE, y_shape, FP32, 3, 1 << 30, algorithms) is None
    assert convolution.plan_with(0, FakeDescriptors(), DESC, X_SHAPE, y_shape, TF32, 2, 1 << 30, algorithms)
    assert convolution.plan_with(0, FakeDescriptors(), DESC, X_SHAPE, y_shape, TF32, 2, 6000, algorithms) is None


def test_plan_with_takes_only_deterministic_exact_algorithms_in_bf16(fake_cudnn):
    """bf16 (CUDNN_TENSOR_OP_MATH, 1): no Winograd, and no algorithm that adds into the bfloat16
    output atomically (backward-data 0, backward-filter 0 and 3); its descriptors are bfloat16."""
    y_shape = DESC.output_shape(X_SHAPE)
    algorithms = {name: Algorithm(1, 0) for name in DIRECTION_NAMES}
    plan = convolution.plan_with(0, FakeDescriptors(), DESC, X_SHAPE, y_shape, BF16, 1, 1 << 30, algorithms)
    assert plan and plan.x.handle == ("tensor", X_SHAPE, 9) and plan.w.handle[2] == 9  # CUDNN_DATA_BFLOAT16
    for name, algo in (("forward", 6), ("backward_data", 0), ("backward_filter", 0), ("backward_filter", 3)):
        refused = {**algorithms, name: Algorithm(algo, 0)}
        assert convolution.plan_with(0, FakeDescriptors(), DESC, X_SHAPE, y_shape, BF16, 1, 1 << 30, refused) is None
        assert convolution.plan_with(0, FakeDescriptors(), DESC, X_SHAPE, y_shape, TF32, 2, 1 << 30, refused)


def test_plan_with_asks_every_workspace_again(fake_cudnn):
    algorithms = {name: Algorithm(1, 123, deterministic=name != "forward") for name in DIRECTION_NAMES}
    result = convolution.plan_with(0, FakeDescriptors(), DESC, X_SHAPE, DESC.output_shape(X_SHAPE), FP32, 3,
                                   1 << 30, algorithms)
    assert [getattr(result, name) for name in DIRECTION_NAMES] == [
        Algorithm(1, 1256, deterministic=False), Algorithm(1, 1256), Algorithm(1, 1256)]
    assert fake_cudnn.queries == {name: 1 for name in DIRECTION_NAMES}


def test_the_cache_file_name_is_the_sha256_of_the_key():
    text = json.dumps(KEY.as_json(), sort_keys=True, separators=(",", ":"))
    assert plan_cache.plan_path(KEY).stem == hashlib.sha256(text.encode()).hexdigest()


def test_the_search_measures_its_contenders_again_and_keeps_their_fastest_times(monkeypatch):
    """A candidate caught slow in its first measurement (0.37 ms, then 0.19) wins over a steady
    0.25 ms one; a candidate over twice the fastest is not measured again."""
    from cudnnnet.backends.cuda import convolution as convolution_module

    candidates = [Algorithm(algo, 0) for algo in range(3)]
    measured = []

    def measure(candidate_plan, direction):
        algo = candidate_plan.forward.algo
        measured.append(algo)
        return {0: 0.37 if measured.count(0) == 1 else 0.19, 1: 0.25, 2: 0.9}[algo]

    monkeypatch.setattr(convolution_module, "replace",
                        lambda plan, **fields: SimpleNamespace(**{**vars(plan), **fields}))
    chosen = convolution_module._fastest(SimpleNamespace(forward=None, x_shape=X_SHAPE), {"forward": candidates},
                                         measure)
    assert chosen.forward.algo == 0
    rounds = convolution_module.CONTENDER_ROUNDS
    assert measured.count(0) == measured.count(1) == 1 + rounds and measured.count(2) == 1
