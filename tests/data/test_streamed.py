"""StreamedData: batches staged from host memory equal the host reference, on every backend."""

import logging
import tracemalloc
from types import SimpleNamespace

import numpy as np
import pytest

from cudnnnet.backends import get_backend
from cudnnnet.config.schema import load_config, parse_config
from cudnnnet.data.streamed import StreamedData, choose_placement
from cudnnnet.errors import DataError, InvalidArgumentError, UsageError
from cudnnnet.tensor import Tensor
from cudnnnet.train import trainer as training
from cudnnnet.train.trainer import ResidentData, ResidentTestSet, Trainer
from run_helpers import REPO_ROOT

COUNT, BATCH, CLASSES = 23, 5, 4  # 5 batches an epoch, the last one of 3
SAMPLE = (2, 3, 2)  # (C, H, W)
STEPS = 5


def sample_set(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((COUNT,) + SAMPLE).astype(np.float32)  # (N, C, H, W)
    labels = rng.integers(0, CLASSES, size=COUNT)  # (N,)
    return images, labels


def reference(images, labels, order, index) -> tuple[np.ndarray, np.ndarray]:
    """Batch ``index`` of ``order`` computed directly: its images and one-hot targets."""
    samples = order[index * BATCH:(index + 1) * BATCH]
    return images[samples], np.eye(CLASSES, dtype=np.float32)[labels[samples]]


def run_selects(data, backend, plan) -> list:
    """select() each (order, index) of ``plan`` in turn (start_epoch where the order changes), keeping a copy of
    every batch made on the backend's stream: one synchronisation at the end, none between the steps."""
    kept, order = [], None
    for next_order, index in plan:
        if next_order is not order:
            order = next_order
            data.start_epoch(order)
        x, target = data.select(index)
        data.gather(x, target)
        kept.append((order, index, Tensor(x.shape, backend).copy_(x), Tensor(target.shape, backend).copy_(target)))
    return [(order, index, x.numpy().reshape((x.n,) + SAMPLE), target.numpy().reshape(target.n, CLASSES))
            for order, index, x, target in kept]


def check_batches(images, labels, batches) -> None:
    for order, index, x, target in batches:
        expected_x, expected_target = reference(images, labels, order, index)
        assert np.array_equal(x, expected_x), f"images of batch {index}"
        assert np.array_equal(target, expected_target), f"targets of batch {index}"


def two_orders() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    return rng.permutation(COUNT), rng.permutation(COUNT)


def test_batches_in_sequence_equal_the_host_reference_over_two_epochs(backend):
    images, labels = sample_set()
    data = StreamedData(backend, images, labels, BATCH, CLASSES)
    first, second = two_orders()
    plan = [(first, index) for index in range(STEPS)] + [(second, index) for index in range(STEPS)]
    batches = run_selects(data, backend, plan)
    check_batches(images, labels, batches)
    assert [x.shape[0] for _, _, x, _ in batches] == [5, 5, 5, 5, 3] * 2


def test_batches_out_of_sequence_equal_the_host_reference(backend):
    """Jumps (a resumed run starts mid-epoch), repeats and going back, across a change of order."""
    images, labels = sample_set(1)
    data = StreamedData(backend, images, labels, BATCH, CLASSES)
    first, second = two_orders()
    plan = [(first, index) for index in (3, 4, 0, 0, 2, 1, 4, 3)] + [(second, index) for index in (4, 1, 2, 0, 3)]
    check_batches(images, labels, run_selects(data, backend, plan))


def test_each_batch_size_has_fixed_tensors(backend):
    images, labels = sample_set()
    data = StreamedData(backend, images, labels, BATCH, CLASSES)
    data.start_epoch(np.arange(COUNT))
    x, target = data.select(0)
    assert data.select(1) == (x, target)
    short_x, short_target = data.select(STEPS - 1)
    assert short_x.shape == (3,) + SAMPLE and short_target.shape == (3, CLASSES, 1, 1)
    data.start_epoch(np.arange(COUNT)[::-1])
    assert data.select(2) == (x, target) and data.select(STEPS - 1) == (short_x, short_target)
    assert (data.count, data.batch_size, data.classes) == (COUNT, BATCH, CLASSES)


def test_the_interface_of_resident_data(host):
    images, labels = sample_set()
    streamed = StreamedData(host, images, labels, BATCH, CLASSES)
    resident = ResidentData(host, images, labels, BATCH, CLASSES)
    order = np.random.default_rng(3).permutation(COUNT)
    for data in (streamed, resident):
        data.start_epoch(order)
    for index in (0, 4, 2):
        x, target = streamed.select(index)
        streamed.gather(x, target)
        y, expected = resident.select(index)
        resident.gather(y, expected)
        assert np.array_equal(x.numpy(), y.numpy()) and np.array_equal(target.numpy(), expected.numpy())


def test_selecting_on_the_host_allocates_no_batch_sized_buffer(host):
    images = np.random.default_rng(0).standard_normal((2000, 1, 28, 28)).astype(np.float32)
    labels = np.arange(2000) % 10
    data = StreamedData(host, images, labels, 100, 10)
    data.start_epoch(np.random.default_rng(1).permutation(2000))
    data.select(0)
    tracemalloc.start()
    for index in range(1, 19):
        data.select(index)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 100 * 28 * 28 * 4 // 4, f"{peak} bytes allocated while selecting"


@pytest.mark.parametrize("images, labels, problem", [
    (np.zeros((4, 28, 28), np.float32), np.zeros(4, int), r"images must be shaped \(N, C, H, W\)"),
    (np.zeros((4, 1, 2, 2), np.float32), np.zeros(5, int), "labels shaped"),
    (np.zeros((4, 1, 2, 2), np.float32), np.array([0, 1, 4, 2]), "label 4 at index 2 is outside 0..3"),
])
def test_a_bad_set_is_a_data_error(host, images, labels, problem):
    with pytest.raises(DataError, match=problem):
        StreamedData(host, images, labels, 2, CLASSES)


def test_a_bad_order_or_index_is_refused(host):
    data = StreamedData(host, *sample_set(), BATCH, CLASSES)
    with pytest.raises(UsageError, match="before start_epoch"):
        data.select(0)
    with pytest.raises(DataError, match=f"must be {COUNT} integer sample ids"):
        data.start_epoch(np.arange(COUNT + 1))
    with pytest.raises(DataError, match=f"must be {COUNT} integer sample ids"):
        data.start_epoch(np.arange(COUNT, dtype=np.float32))
    with pytest.raises(DataError, match=f"valid are 0..{COUNT - 1}"):
        data.start_epoch(np.arange(COUNT) + 1)
    data.start_epoch(np.arange(COUNT))
    for index in (-1, STEPS, True):
        with pytest.raises(InvalidArgumentError, match=f"outside the epoch's 0..{STEPS - 1}"):
            data.select(index)


# ---- placement -------------------------------------------------------------------------------
def device_with_free_bytes(free: int):
    return SimpleNamespace(name="fake", memory_info=lambda: (free, 8 * free))


def test_auto_placement_keeps_the_set_on_the_device_when_it_takes_half_the_free_memory_or_less(caplog):
    images, labels = np.zeros((100, 1, 10, 10), np.float32), np.zeros(100, int)
    needed = 4 * (100 * 100 + 2 * 100)  # images, labels and the order as float32
    with caplog.at_level(logging.INFO, logger="cudnnnet.data.streamed"):
        assert choose_placement("auto", device_with_free_bytes(2 * needed), images, labels) == "device"
        assert choose_placement("auto", device_with_free_bytes(2 * needed - 1), images, labels) == "host"
    assert "resident in device memory (ResidentData): data.placement auto" in caplog.records[0].getMessage()
    assert "streamed from host memory (StreamedData): data.placement auto" in caplog.records[1].getMessage()
    assert "do not fit in half of the" in caplog.records[1].getMessage()


@pytest.mark.parametrize("placement, why", [("auto", "data.placement auto on the host backend"),
                                             ("device", "data.placement is device")])
def test_a_set_resident_on_the_host_backend_is_said_to_be_in_host_memory(caplog, placement, why):
    images, labels = np.zeros((100, 1, 10, 10), np.float32), np.zeros(100, int)
    with caplog.at_level(logging.INFO, logger="cudnnnet.data.streamed"):
        assert choose_placement(placement, get_backend("host"), images, labels) == "device"
    assert [record.getMessage() for record in caplog.records] == [
        f"training data resident in host memory (ResidentData): {why}"]


def test_auto_placement_counts_what_goes_to_the_device_alongside_the_set():
    images, labels = np.zeros((100, 1, 10, 10), np.float32), np.zeros(100, int)
    needed, test_set = 4 * (100 * 100 + 2 * 100), 4 * 1000
    assert choose_placement("auto", device_with_free_bytes(2 * (needed + test_set)), images, labels, test_set) == "device"
    assert choose_placement("auto", device_with_free_bytes(2 * needed), images, labels, test_set) == "host"


def test_trainer_counts_its_resident_test_set_in_the_placement(monkeypatch, tmp_path, mnist_dir):
    asked = {}

    def recording_placement(placement, backend, images, labels, alongside_bytes=0):
        asked.update(images=images.size, alongside=alongside_bytes)
        return "host"

    monkeypatch.setattr(training, "choose_placement", recording_placement)
    trainer = mlp_trainer(mnist_dir, tmp_path, "host", "auto", steps=1)
    classes = trainer.loader.classes
    assert asked["alongside"] == ResidentTestSet.nbytes(trainer.test_images, classes)
    assert asked["images"] == trainer.train_images.size
    assert asked["alongside"] == trainer.test_images.nbytes + 4 * trainer.test_images.shape[0] * classes
    assert trainer.test_set is None  # streamed training data: the test set stays on the host too


def test_auto_placement_on_the_host_backend_is_resident_and_explicit_placements_are_kept(host):
    images, labels = np.zeros((10, 1, 2, 2), np.float32), np.zeros(10, int)
    assert choose_placement("auto", host, images, labels) == "device"
    tiny = device_with_free_bytes(1)
    assert choose_placement("device", tiny, images, labels) == "device"
    assert choose_placement("host", device_with_free_bytes(1 << 40), images, labels) == "host"
    with pytest.raises(InvalidArgumentError, match="valid are auto, device, host"):
        choose_placement("gpu", tiny, images, labels)


# ---- training --------------------------------------------------------------------------------
def mlp_trainer(mnist_dir, output, device, placement, steps, batch_size=64, graph=True):
    settings = load_config(REPO_ROOT / "configs" / "mnist_mlp.yaml").to_dict()
    settings["train"].update(steps=steps, batch_size=batch_size, graph=graph)
    settings["device"] = device
    settings["data"].update(dir=str(mnist_dir), placement=placement)
    return Trainer(parse_config(settings), output / f"{placement}-{graph}", progress=False)


def test_host_training_with_streamed_data_gives_the_weights_of_resident_data(mnist_dir, tmp_path):
    """30 steps of batch 2048 on the host backend: the short last batch (608) and the next epoch's order included."""
    finals = {}
    for placement, expected in (("host", StreamedData), ("device", ResidentData)):
        run = mlp_trainer(mnist_dir, tmp_path, "host", placement, steps=31, batch_size=2048)
        assert type(run.data) is expected
        run.run()
        finals[placement] = run.network.state_dict()
    for name, value in finals["device"].items():
        assert np.array_equal(finals["host"][name], value), name


# ---- CUDA: the copy stream, pinned memory, no device synchronisation ------------------------
@pytest.mark.gpu
def test_staging_goes_through_pinned_memory_and_a_copy_stream(cuda):
    from cudnnnet.backends.cuda import bindings

    bindings.reset_calls()
    images, labels = sample_set()
    data = StreamedData(cuda, images, labels, BATCH, CLASSES)
    assert bindings.calls["cudaMallocHost"] == 2 and bindings.calls["cudaStreamCreateWithFlags"] == 1
    data.start_epoch(np.arange(COUNT))
    for index in range(STEPS):
        data.select(index)
    assert bindings.calls["cudaStreamWaitEvent"] == 2 * STEPS  # copy stream on "consumed", compute on "copied"
    assert bindings.calls["cudaEventSynchronize"] <= STEPS - 2  # only pinned slots about to be refilled
    assert bindings.calls["cudaStreamSynchronize"] == bindings.calls["cudaDeviceSynchronize"] == 0
    staging = data.staging
    staging.close()
    assert staging.closed and bindings.calls["cudaFreeHost"] == 2


@pytest.mark.gpu
def test_batches_stay_right_while_the_compute_stream_is_busy(cuda):
    """Long GEMMs between the steps keep the compute stream behind the host: a slot overwritten before
    its batch was delivered would show up as a wrong batch."""
    from cudnnnet.backends.base import OP_N

    images, labels = sample_set(2)
    data = StreamedData(cuda, images, labels, BATCH, CLASSES)
    side = 2048
    a = Tensor.from_numpy(np.ones((side, side), np.float32), cuda)
    c = Tensor((side, side), cuda)
    first, second = two_orders()
    kept = []
    for order in (first, second):
        data.start_epoch(order)
        for index in range(STEPS):
            x, target = data.select(index)
            for _ in range(4):
                cuda.sgemm(OP_N, OP_N, side, side, side, 1.0, a, side, a, side, 0.0, c, side)
            kept.append((order, index, Tensor(x.shape, cuda).copy_(x), Tensor(target.shape, cuda).copy_(target)))
    batches = [(order, index, x.numpy().reshape((x.n,) + SAMPLE), target.numpy().reshape(target.n, CLASSES))
               for order, index, x, target in kept]
    check_batches(images, labels, batches)


@pytest.mark.gpu
def test_no_device_synchronisation_happens_per_training_step(cuda, mnist_dir, tmp_path):
    from cudnnnet.backends.cuda import bindings

    run = mlp_trainer(mnist_dir, tmp_path, "cuda", "host", steps=100)
    run.data.start_epoch(run.loader.permutation(0))
    for index in range(3):  # eager, captured, replayed
        run.train_batch(index)
    bindings.reset_calls()
    for index in range(3, 53):
        run.train_batch(index)
    assert bindings.calls["cudaStreamSynchronize"] == bindings.calls["cudaDeviceSynchronize"] == 0
    assert bindings.calls["cudaEventSynchronize"] <= 50  # at most one pinned slot waited for per step
    assert bindings.calls["cudaGraphLaunch"] == 50


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [True, False], ids=["graph", "eager"])
@pytest.mark.parametrize("batch_size, steps", [(64, 30), (2048, 31)], ids=["batch64", "batch2048-short-last"])
def test_cuda_training_with_streamed_data_gives_the_weights_of_resident_data(cuda, mnist_dir, tmp_path, graph,
                                                                            batch_size, steps):
    """mnist_mlp on the real MNIST: the same steps with the set streamed from host memory and resident
    on the device end with the same weights (batch 2048 runs into the short last batch and the next epoch)."""
    finals = {}
    for placement, expected in (("host", StreamedData), ("device", ResidentData)):
        run = mlp_trainer(mnist_dir, tmp_path, "cuda", placement, steps=steps, batch_size=batch_size, graph=graph)
        assert type(run.data) is expected
        run.run()
        assert (run.graph is not None) == graph
        finals[placement] = run.network.state_dict()
    for name, value in finals["device"].items():
        assert np.allclose(finals["host"][name], value, rtol=1e-6, atol=1e-6), name
