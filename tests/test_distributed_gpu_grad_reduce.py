"""train.grad_reduce on two GPUs: the gradient buckets averaged in bfloat16 (inside the captured step)
reach weights close to, and not the same as, the float32 reduction's; the float32 average through the
peers' mapped memory (the default for a small network on one host) reaches NCCL's weights."""

import os

import numpy as np
import pytest

from cudnnnet.backends.cuda.peer_reduce import PEER_REDUCE_ENV
from cudnnnet.train.distributed import replicas as distributed
from cudnnnet.config.schema import parse_config
from cudnnnet.train.trainer import Trainer
from rank_processes import run_ranks
from test_distributed_gpu import _config, _weights, gpu_count

pytestmark = pytest.mark.gpu

BATCH, STEPS = 64, 6  # the steps after the first two replay the captured graph


def _rank_weights(rank, port, mnist_dir, output, grad_reduce, peers):
    os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    os.environ[PEER_REDUCE_ENV] = peers
    raw = _config("mnist_cnn", mnist_dir, steps=STEPS, batch_size=BATCH, engine="fast").to_dict()
    raw["train"]["grad_reduce"] = grad_reduce
    config = parse_config(raw)
    group = distributed.join(distributed.Launch(rank, 2, 0, "127.0.0.1", port, "torchrun"), config)
    trainer = Trainer(config, output, progress=False, image_limit=2 * BATCH * STEPS, group=group)
    used_peers = trainer.replicas.peers is not None
    trainer.run()
    return _weights(trainer), used_peers


def _two_gpu_weights(mnist_dir, output, grad_reduce, peers="1"):
    """Rank 0's weights (equal to rank 1's) and whether the ranks averaged through their peers' memory."""
    from cudnnnet.train.distributed.launcher import free_port

    results = run_ranks(_rank_weights, 2, (free_port(), mnist_dir, output, grad_reduce, peers))
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
    assert used_peers and not used_peers_nccl
    for name, value in nccl.items():
        np.testing.assert_allclose(peers[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
