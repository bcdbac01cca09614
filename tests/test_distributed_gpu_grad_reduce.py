"""train.grad_reduce: bf16 on two GPUs: the gradient buckets averaged in bfloat16 (inside the captured
step) reach weights close to, and not the same as, the float32 reduction's."""

import os

import numpy as np
import pytest

from cudnnnet.train.distributed import replicas as distributed
from cudnnnet.config.schema import parse_config
from cudnnnet.train.trainer import Trainer
from rank_processes import run_ranks
from test_distributed_gpu import _config, _weights, gpu_count

pytestmark = pytest.mark.gpu

BATCH, STEPS = 64, 6  # the steps after the first two replay the captured graph


def _rank_weights(rank, port, mnist_dir, output, grad_reduce):
    os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    raw = _config("mnist_cnn", mnist_dir, steps=STEPS, batch_size=BATCH, engine="fast").to_dict()
    raw["train"]["grad_reduce"] = grad_reduce
    config = parse_config(raw)
    group = distributed.join(distributed.Launch(rank, 2, 0, "127.0.0.1", port, "torchrun"), config)
    trainer = Trainer(config, output, progress=False, image_limit=2 * BATCH * STEPS, group=group)
    trainer.run()
    return _weights(trainer)


def _two_gpu_weights(mnist_dir, output, grad_reduce):
    from cudnnnet.train.distributed.launcher import free_port

    weights = run_ranks(_rank_weights, 2, (free_port(), mnist_dir, output, grad_reduce))
    for name, value in weights[0].items():
        np.testing.assert_array_equal(weights[1][name], value, err_msg=name)  # every rank updates alike
    return weights[0]


def test_bf16_reduction_trains_close_to_fp32_reduction(mnist_dir, tmp_path):
    if gpu_count() < 2:
        pytest.skip("needs 2 GPUs of one host")
    fp32 = _two_gpu_weights(mnist_dir, tmp_path / "fp32", "fp32")
    bf16 = _two_gpu_weights(mnist_dir, tmp_path / "bf16", "bf16")
    differences = []
    for name, value in fp32.items():
        np.testing.assert_allclose(bf16[name], value, rtol=1e-2, atol=1e-3, err_msg=name)
        differences.append(float(np.abs(bf16[name] - value).max()))
    assert max(differences) > 0  # the gradients were rounded to bfloat16 on the way
