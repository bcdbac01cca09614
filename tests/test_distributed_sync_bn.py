"""Synchronised BatchNorm on the host, the oracle: two ranks emulated in one process (two threads, a
communicator whose all-reduce sums over both), so that a step of batch B on each equals one step of
2B on one rank; the GPU tests are in test_distributed_gpu_sync_bn.py."""

import threading

import numpy as np
import pytest

from cudnnnet import Network
from cudnnnet.backends.host import HostBackend
from cudnnnet.config.schema import load_config, parse_config
from cudnnnet.train.distributed.replicas import synchronised_batch_norms
from cudnnnet.errors import ConfigError, InvalidArgumentError
from cudnnnet.config.shipped import resolve_config

BATCH = 4  # per rank
INPUT_SHAPE = (1, 28, 28)


class ThreadRanks:
    """``world_size`` ranks in threads of one process; ``communicator(rank)`` sums over all of them."""

    def __init__(self, world_size: int):
        self.barrier = threading.Barrier(world_size, timeout=60)
        self.contributions = [None] * world_size
        self.calls = 0

    def communicator(self, rank: int) -> "RankCommunicator":
        return RankCommunicator(self, rank)


class RankCommunicator:
    def __init__(self, ranks: ThreadRanks, rank: int):
        self.ranks, self.rank = ranks, rank

    def all_reduce_sum_float64(self, values: np.ndarray, count: int) -> None:
        ranks = self.ranks
        ranks.contributions[self.rank] = values[:count].copy()
        ranks.barrier.wait()
        total = sum(ranks.contributions)  # the same order on every rank
        ranks.barrier.wait()
        values[:count] = total
        if self.rank == 0:
            ranks.calls += 1


def with_model(model: list[dict]):
    """mnist_bn_cnn's config with ``model`` in place of its own."""
    return parse_config({**load_config(resolve_config("mnist_bn_cnn")).to_dict(), "model": model})


def bn_cnn_model(sync: bool) -> list[dict]:
    """mnist_bn_cnn's layers without its dropout (each rank would draw its own masks)."""
    model = [spec.to_dict() for spec in load_config(resolve_config("mnist_bn_cnn")).model if spec.type != "dropout"]
    return [{**entry, "sync": True} if entry["type"] == "batchnorm" and sync else entry for entry in model]


def network(sync: bool, engine: str = "fast") -> Network:
    backend = HostBackend()
    backend.set_engine(engine)
    return Network.from_spec(bn_cnn_model(sync), INPUT_SHAPE, backend=backend, seed=3)


def batch(size: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((size,) + INPUT_SHAPE).astype(np.float32)
    targets = np.eye(10, dtype=np.float32)[rng.integers(0, 10, size)].reshape(size, 10, 1, 1)
    return images, targets


def gradients_and_buffers(net: Network) -> dict[str, np.ndarray]:
    return {**{name: grad.numpy().copy() for name, grad in net.gradients().items()},
            **{name: buffer.numpy().copy() for name, buffer in net.buffers().items()}}


def two_rank_step(sync: bool) -> dict[str, np.ndarray]:
    """Forward and backward of batch BATCH on each of two ranks, the gradients averaged (as the
    gradient all-reduce does); rank 0's running statistics."""
    images, targets = batch(2 * BATCH)
    ranks, replicas = ThreadRanks(2), [network(sync) for _ in range(2)]
    if sync:
        for rank, replica in enumerate(replicas):
            for layer in synchronised_batch_norms(replica):
                layer.communicator = ranks.communicator(rank)
    failures = []

    def step(rank):
        try:
            part = slice(rank * BATCH, (rank + 1) * BATCH)
            replicas[rank].forward(images[part])
            replicas[rank].backward(targets[part])
        except Exception as error:  # reported by the main thread
            failures.append(error)
            ranks.barrier.abort()

    threads = [threading.Thread(target=step, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    if sync:
        assert ranks.calls == 2 * 5  # forward and backward of each of the five BatchNorm layers
    values = [gradients_and_buffers(replica) for replica in replicas]
    grads = replicas[0].gradients()
    return {name: (values[0][name] + values[1][name]) / 2 if name in grads else values[0][name] for name in values[0]}


def one_rank_step() -> dict[str, np.ndarray]:
    images, targets = batch(2 * BATCH)
    single = network(sync=False)
    single.forward(images)
    single.backward(targets)
    return gradients_and_buffers(single)


def largest_difference(a: dict, b: dict) -> float:
    return max(float(np.abs(a[name] - b[name]).max()) for name in a)


def test_two_ranks_of_batch_b_step_as_one_rank_of_2b():
    """Every gradient (averaged over the ranks) and every running statistic within 1e-5 of one rank's
    on the whole batch; without sync they are not (each rank normalises its own half)."""
    expected = one_rank_step()
    synchronised = two_rank_step(sync=True)
    for name, value in expected.items():
        np.testing.assert_allclose(synchronised[name], value, rtol=1e-5, atol=1e-5, err_msg=name)
    assert largest_difference(two_rank_step(sync=False), expected) > 1e-3


def test_sync_without_a_communicator_is_plain_batch_norm():
    images, targets = batch(BATCH)
    results = []
    for sync in (True, False):
        net = network(sync)
        net.forward(images)
        net.backward(targets)
        results.append(gradients_and_buffers(net))
    for name, value in results[1].items():
        np.testing.assert_array_equal(results[0][name], value, err_msg=name)


def test_the_slides_engine_refuses_sync_in_one_line_naming_the_choices():
    with pytest.raises(ConfigError) as refused:
        synchronised_batch_norms(network(sync=True, engine="slides"))
    message = str(refused.value)
    assert "'bn1'" in message and "engine: fast" in message and "sync: false" in message and "\n" not in message
    assert synchronised_batch_norms(network(sync=False, engine="slides")) == []


def test_the_engine_that_counts_is_the_network_s_own():
    """The Trainer sets the config's engine on the network, not on the backend (whose default stays slides)."""
    backend = HostBackend()
    fast = Network.from_spec(bn_cnn_model(sync=True), INPUT_SHAPE, backend=backend, seed=3).set_engine("fast")
    assert [layer.name for layer in synchronised_batch_norms(fast)] == ["bn1", "bn2", "bn3", "bn4", "bn5"]
    backend.set_engine("fast")
    with pytest.raises(ConfigError, match="'bn1'"):
        synchronised_batch_norms(fast.set_engine("slides"))


def test_sync_is_a_config_key_kept_in_the_checkpoint_and_the_model_still_exports(tmp_path):
    config = with_model(bn_cnn_model(sync=True))
    assert all(spec.params.get("sync") is True for spec in config.model if spec.type == "batchnorm")
    net = network(sync=True)
    loaded = Network.load(net.save(tmp_path / "model.npz"))
    assert [layer.sync for layer in loaded.layers if hasattr(layer, "sync")] == [True] * 5
    pytest.importorskip("onnx")
    assert net.export_onnx(tmp_path / "model.onnx").stat().st_size > 0


@pytest.mark.parametrize("value", ["yes", 1, 0])
def test_sync_must_be_true_or_false(value):
    model = [{"type": "batchnorm", "name": "bn", "sync": value}, {"type": "softmax", "name": "out"}]
    with pytest.raises(ConfigError, match=r"sync.*expected true or false"):
        with_model(model)
    from cudnnnet.layers import BatchNorm

    with pytest.raises(InvalidArgumentError, match="sync must be true or false"):
        BatchNorm("bn", sync=value)
