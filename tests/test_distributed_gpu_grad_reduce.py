"""train.grad_reduce on two GPUs: the gradient buckets averaged in bfloat16 (inside the captured step)
reach weights close to, and not the same as, the float32 reduction's; the float32 average through the
peers' mapped memory (the default for a small network on one host) reaches NCCL's weights, and so do
the copies during the backward pass (the default for large gradients), a weight gradient in blocks."""

import os

import numpy as np
import pytest

from cudnnnet.backends.cuda import peer_reduce
from cudnnnet.backends.cuda.peer_reduce import PEER_REDUCE_ENV
from cudnnnet.train.distributed import replicas as distributed
from cudnnnet.config.schema import parse_config
from cudnnnet.train.trainer import Trainer
from rank_processes import run_ranks
from test_distributed_gpu import _config, _weights, gpu_count

pytestmark = pytest.mark.gpu

BATCH, STEPS = 64, 6  # the steps after the first two replay the captured graph


def _rank_weights(rank, port, mnist_dir, output, grad_reduce, peers, name="mnist_cnn", copy_min_bytes=None):
    os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    os.environ[PEER_REDUCE_ENV] = peers
    if copy_min_bytes is not None:  # this rank's process only: copies for a small network, its fc1 in 8 blocks
        peer_reduce.COPY_MIN_BYTES, distributed.BLOCK_VALUES = copy_min_bytes, 1 << 16
        distributed.BLOCK_TOLERANCE = float("inf")
    raw = _config(name, mnist_dir, steps=STEPS, batch_size=BATCH, engine="fast").to_dict()
    raw["train"]["grad_reduce"] = grad_reduce
    config = parse_config(raw)
    group = distributed.join(distributed.Launch(rank, 2, 0, "127.0.0.1", port, "torchrun"), config)
    trainer = Trainer(config, output, progress=False, image_limit=2 * BATCH * STEPS, group=group)
    peers_used = trainer.replicas.peers
    used = None if peers_used is None else (peers_used.mode, max(
        getattr(layer, "grad_weight_blocks", 1) for layer in trainer.network.layers), trainer.replicas.steps_in_average)
    trainer.run()
    return _weights(trainer), used


def _two_gpu_weights(mnist_dir, output, grad_reduce, peers="1", *more):
    """Rank 0's weights (equal to rank 1's) and how the ranks averaged through their peers' memory:
    None (NCCL), else (the mode, the most blocks a Dense layer's weight gradient took); ``more``: the
    config's name and peer_reduce.COPY_MIN_BYTES in the ranks."""
    from cudnnnet.train.distributed.launcher import free_port

    results = run_ranks(_rank_weights, 2, (free_port(), mnist_dir, output, grad_reduce, peers, *more))
    (weights, used_peers), (weights_1, _) = results[0], results[1]
    for name, value in weights.items():
        np.testing.assert_array_equal(weights_1[name], value, err_msg=name)  # every rank updates alike
    return weights, used_peers


def test_bf16_reduction_trains_close_to_fp32_reduction(mnist_dir, tmp_path):
    if gpu_count() < 2:
        pytest.skip("needs 2 GPUs of one host")
    fp32, _ = _two_gpu_weights(mnist_dir, tmp_path / "fp32", "fp32")
    bf16, used_peers = _two_gpu_weights(mnist_dir, tmp_path / "bf16", "bf16")
    assert not used_peers  # bfloat16 averaging is NCCL's
    differences = []
    for name, value in fp32.items():
        np.testing.assert_allclose(bf16[name], value, rtol=1e-2, atol=1e-3, err_msg=name)
        differences.append(float(np.abs(bf16[name] - value).max()))
    assert max(differences) > 0  # the gradients were rounded to bfloat16 on the way


def test_the_peer_average_reaches_the_weights_of_nccl_s_all_reduce(mnist_dir, tmp_path):
    if gpu_count() < 2:
        pytest.skip("needs 2 GPUs of one host")
    nccl, used_peers_nccl = _two_gpu_weights(mnist_dir, tmp_path / "nccl", "fp32", peers="0")
    peers, used_peers = _two_gpu_weights(mnist_dir, tmp_path / "peers", "fp32")
    assert used_peers == (peer_reduce.PUSH, 1, False) and used_peers_nccl is None
    for name, value in nccl.items():
        np.testing.assert_allclose(peers[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_the_copies_during_the_backward_pass_reach_the_weights_of_nccl_s_all_reduce(mnist_dir, tmp_path):
    """mnist_mlp (fc1: 500 × 784 weights) with the copies' threshold at 0 bytes: each bucket, and each of
    the 8 blocks of fc1's weight gradient, copied to the peer as the backward pass writes it, inside the
    captured step, each averaged as it arrives with the SGD step (momentum, weight decay) applied there;
    the weights stay those of NCCL's all-reduce and the optimiser's own step."""
    if gpu_count() < 2:
        pytest.skip("needs 2 GPUs of one host")
    nccl, used_nccl = _two_gpu_weights(mnist_dir, tmp_path / "nccl", "fp32", "0", "mnist_mlp")
    copies, used_copies = _two_gpu_weights(mnist_dir, tmp_path / "copies", "fp32", "1", "mnist_mlp", 0)
    assert used_nccl is None and used_copies == (peer_reduce.COPY, 8, True)
    for name, value in nccl.items():
        np.testing.assert_allclose(copies[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
