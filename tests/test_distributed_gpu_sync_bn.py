"""Synchronised BatchNorm on the GPU, in the fast engine: the kernels' path on one GPU against the host
oracle (the other rank's sums replayed from a host run of two ranks), and two GPUs through NCCL,
whose steps of batch B each equal steps of 2B on one GPU."""

import os

import numpy as np
import pytest

from cudnnnet import Network
from cudnnnet.train.distributed import replicas as distributed
from cudnnnet.config.schema import parse_config
from cudnnnet.train.trainer import Trainer
from rank_processes import run_ranks
from test_distributed_gpu import _config, _weights, gpu_count
from test_distributed_sync_bn import BATCH, INPUT_SHAPE, ThreadRanks, batch, bn_cnn_model, gradients_and_buffers, network

pytestmark = pytest.mark.gpu


@pytest.fixture
def cuda_backend():
    from cudnnnet.backends import cuda_available, get_backend

    if not cuda_available():
        pytest.skip("no usable GPU or CUDA libraries")
    backend = get_backend("cuda")
    with backend.using_engine("fast"):
        yield backend


class Recording:
    """Rank 1 of two host ranks: keeps what it contributes to each all-reduce."""

    def __init__(self, communicator):
        self.communicator, self.sent = communicator, []

    def all_reduce_sum_float64(self, values, count):
        self.sent.append(values[:count].copy())
        self.communicator.all_reduce_sum_float64(values, count)


class Replaying:
    """Rank 0 alone on the GPU: each all-reduce adds what rank 1 contributed to the same call on the host."""

    def __init__(self, backend, sent):
        self.backend, self.sent = backend, list(sent)

    def all_reduce_sum_float64(self, pointer, count):
        from cudnnnet.backends.cuda.bindings import runtime

        values = np.empty(count)
        stream = self.backend.context.stream.handle
        runtime.memcpy_async(values.ctypes.data, pointer, values.nbytes, runtime.MEMCPY_DEVICE_TO_HOST, stream)
        self.backend.synchronize()
        values += self.sent.pop(0)
        runtime.memcpy_async(pointer, values.ctypes.data, values.nbytes, runtime.MEMCPY_HOST_TO_DEVICE, stream)
        self.backend.synchronize()


def _host_rank_0_and_rank_1_s_sums():
    """Rank 0's gradients and statistics of a host step of two ranks, and what rank 1 sent to each all-reduce."""
    import threading

    images, targets = batch(2 * BATCH)
    ranks, replicas = ThreadRanks(2), [network(sync=True) for _ in range(2)]
    recording = Recording(ranks.communicator(1))
    for rank, replica in enumerate(replicas):
        for layer in distributed.synchronised_batch_norms(replica):
            layer.communicator = recording if rank == 1 else ranks.communicator(0)

    def step(rank):
        part = slice(rank * BATCH, (rank + 1) * BATCH)
        replicas[rank].forward(images[part])
        replicas[rank].backward(targets[part])

    threads = [threading.Thread(target=step, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return gradients_and_buffers(replicas[0]), recording.sent


def test_the_kernels_sum_the_statistics_as_the_host_does(cuda_backend):
    """dscale and dbias stay the rank's own, dx and the statistics take both ranks' sums and m."""
    expected, sent = _host_rank_0_and_rank_1_s_sums()
    assert len(sent) == 10
    net = Network.from_spec(bn_cnn_model(sync=True), INPUT_SHAPE, backend=cuda_backend, seed=3)
    rank_1 = Replaying(cuda_backend, sent)  # one for all layers: it replays rank 1's calls in their order
    for layer in distributed.synchronised_batch_norms(net):
        layer.communicator = rank_1
    images, targets = batch(2 * BATCH)
    net.forward(images[:BATCH])
    net.backward(targets[:BATCH])
    for name, value in gradients_and_buffers(net).items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-4, atol=1e-5, err_msg=name)


# ---- two GPUs -----------------------------------------------------------------------------------------------------
STEPS = 3  # the later steps replay the captured CUDA graph, which holds the statistics' all-reduces


def _sync_bn_config(mnist_dir, batch_size):
    """mnist_bn_cnn with synchronised BatchNorm and without dropout, plain SGD at a constant rate."""
    raw = _config("mnist_bn_cnn", mnist_dir, steps=STEPS, batch_size=batch_size, engine="fast", graph=True).to_dict()
    raw["model"] = bn_cnn_model(sync=True)
    raw["train"].update(optimizer={"name": "sgd", "lr": 0.05}, schedule={"name": "constant"}, lr_scaling="none")
    return parse_config(raw)


def _rank_state(rank, port, mnist_dir, output):
    os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    config = _sync_bn_config(mnist_dir, BATCH)
    group = distributed.join(distributed.Launch(rank, 2, 0, "127.0.0.1", port, "torchrun"), config)
    trainer = Trainer(config, output, progress=False, image_limit=2 * BATCH, group=group)
    trainer.run()
    buffers = {name: value.numpy().copy() for name, value in trainer.network.buffers().items()}
    return {**_weights(trainer), **buffers}


def test_steps_of_b_on_two_gpus_equal_steps_of_2b_on_one(mnist_dir, tmp_path):
    if gpu_count() < 2:
        pytest.skip("needs 2 GPUs of one host")
    from cudnnnet.train.distributed.launcher import free_port

    states = run_ranks(_rank_state, 2, (free_port(), mnist_dir, tmp_path / "two"))
    single = Trainer(_sync_bn_config(mnist_dir, 2 * BATCH), tmp_path / "one", progress=False, image_limit=2 * BATCH)
    single.run()
    expected = {**_weights(single), **{name: value.numpy() for name, value in single.network.buffers().items()}}
    for name, value in expected.items():
        np.testing.assert_allclose(states[0][name], value, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(states[1][name], value, atol=1e-5, err_msg=name)
