"""Data-parallel training through NCCL on real GPUs: one GPU (world size 1 through the NCCL path, and
``--gpus 1``) and two or more (skipped below that)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from cudnnnet.train.distributed import replicas as distributed
from cudnnnet.backends.cuda.bindings import calls
from cudnnnet.config.schema import load_config
from cudnnnet.train.outputs import checkpoint_to_resume
from cudnnnet.config.shipped import resolve_config
from cudnnnet.train.trainer import Trainer
from rank_processes import run_ranks
from run_helpers import REPO_ROOT

pytestmark = pytest.mark.gpu


def gpu_count() -> int:
    from cudnnnet.backends import no_gpu_reason

    if no_gpu_reason() is not None:
        return 0
    from cudnnnet.backends.cuda.bindings import driver_start

    return driver_start.device_count()


@pytest.fixture(scope="module")
def one_gpu():
    from cudnnnet.backends import cuda_available

    if not cuda_available():
        pytest.skip("no usable GPU or CUDA libraries")


def two_gpus():
    if gpu_count() < 2:
        pytest.skip("needs 2 GPUs of one host")


def _config(name, mnist_dir, **overrides):
    return load_config(resolve_config(name)).with_overrides(device="cuda", data_dir=mnist_dir, **overrides)


def _weights(trainer):
    return {p.name: p.value.numpy().copy() for p in trainer.network.parameter_list()}


# ---- one GPU -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("graph", [True, False])
@pytest.mark.parametrize("name, engine", [("mnist_cnn", "slides"), ("mnist_cnn", "fast"), ("mnist_bn_cnn", "fast")])
def test_one_rank_through_nccl_trains_the_same_weights(one_gpu, mnist_dir, tmp_path, name, engine, graph):
    """SGD (packed by the optimiser) and AdamW (packed here). Not the BN net in the slides engine:
    its cuDNN algorithms may be non-deterministic, and the biases of its convolutions, each followed
    by BatchNorm, get gradients that are rounding alone, so two slides runs of it differ at the 1e-4
    level with or without NCCL in the path."""
    config = _config(name, mnist_dir, steps=12, batch_size=50, graph=graph, engine=engine)
    alone = Trainer(config, tmp_path / "alone", progress=False, image_limit=500)
    alone.run()
    calls.clear()
    group = distributed.join(distributed.Launch(0, 1, 0, None, None, "torchrun"), config)
    ranked = Trainer(config, tmp_path / "ranked", progress=False, image_limit=500, group=group)
    metrics = ranked.run()
    assert calls["ncclCommInitRank"] == 1 and calls["ncclAllReduce"] >= 1 and calls["ncclBroadcast"] == 1
    if graph:  # every full step after the first replays the graph that holds the all-reduce
        assert calls["ncclAllReduce"] < config.train.steps
    assert metrics["gpus"] == 1
    for parameter, value in _weights(alone).items():
        np.testing.assert_allclose(_weights(ranked)[parameter], value, rtol=1e-5, atol=1e-6, err_msg=parameter)


def test_gpus_1_trains_end_to_end(one_gpu, mnist_dir, tmp_path):
    output = tmp_path / "run"
    finished = subprocess.run(
        [sys.executable, "-m", "cudnnnet.cli.launch", "--config", "mnist_mlp", "--gpus", "1", "--steps", "300",
         "--data-dir", str(mnist_dir), "--output", str(output), "--quiet"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert finished.returncode == 0, finished.stderr
    printed = json.loads(finished.stdout.strip().splitlines()[-1])
    written = json.loads((checkpoint_to_resume(output).parent / "metrics.json").read_text())
    assert written["gpus"] == 1 and written["steps"] == 300
    assert printed["test_accuracy"] == written["test_accuracy"] > 0.9


# ---- two GPUs -----------------------------------------------------------------------------------------------------
BATCH = 32


def _rank_weights(rank, port, mnist_dir, output):
    """One step of batch BATCH on GPU ``rank`` of two, over the first 2·BATCH images; rank 0 sends its weights."""
    os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    from cudnnnet.config.schema import parse_config

    raw = _config("mnist_cnn", mnist_dir, steps=1, batch_size=BATCH).to_dict()
    raw["train"]["lr_scaling"] = "none"
    config = parse_config(raw)
    group = distributed.join(distributed.Launch(rank, 2, 0, "127.0.0.1", port, "torchrun"), config)
    trainer = Trainer(config, output, progress=False, image_limit=2 * BATCH, group=group)
    trainer.run()
    return _weights(trainer)


def test_one_step_on_two_gpus_equals_one_step_of_the_double_batch_on_one(mnist_dir, tmp_path):
    two_gpus()
    from cudnnnet.train.distributed.launcher import free_port

    weights = run_ranks(_rank_weights, 2, (free_port(), mnist_dir, tmp_path / "two"))
    single = Trainer(_config("mnist_cnn", mnist_dir, steps=1, batch_size=2 * BATCH), tmp_path / "one",
                     progress=False, image_limit=2 * BATCH)
    single.run()
    for parameter, value in _weights(single).items():
        np.testing.assert_allclose(weights[0][parameter], value, atol=1e-5, err_msg=parameter)
        np.testing.assert_array_equal(weights[0][parameter], weights[1][parameter])


@pytest.mark.slow
@pytest.mark.parametrize("name, target", [("mnist_mlp", 0.982), ("mnist_cnn", 0.992), ("lenet5", 0.990)])
def test_the_configs_reach_their_targets_on_two_gpus(mnist_dir, tmp_path, name, target):
    two_gpus()
    output = tmp_path / name
    finished = subprocess.run(
        [sys.executable, "-m", "cudnnnet.cli.launch", "--config", name, "--gpus", "2", "--epochs", "10",
         "--data-dir", str(mnist_dir), "--output", str(output), "--quiet"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=3600,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert finished.returncode == 0, finished.stderr
    written = json.loads((checkpoint_to_resume(output).parent / "metrics.json").read_text())
    assert written["gpus"] == 2 and written["test_accuracy"] >= target
