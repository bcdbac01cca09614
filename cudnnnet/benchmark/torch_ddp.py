"""PyTorch DistributedDataParallel on the same GPUs, for ``cudnnnet-benchmark --gpus N --compare torch``.

One process per GPU (started as cudnnnet's ranks are), ``torch.distributed`` over NCCL at the
launcher's MASTER_ADDR:MASTER_PORT; each rank trains its own contiguous part of a seeded permutation
of the training set at the workload's batch per GPU, eagerly (DDP's usual mode: its gradient buckets
are all-reduced during the backward pass), the model and optimiser of ``torch_reference``. Rank 0's
median epoch is reported; for the micro workload, its median step (the one batch split among the
ranks, as ``scaling_micro`` splits it).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import numpy as np

from ..train import trainer as training
from .measuring import epoch_summary, step_summary, timed_calls
from .scaling_micro import micro_part
from .settings import MICRO_LEARNING_RATE, SCALING_MICRO_WARMUP
from .torch_reference import TorchTraining, set_torch_math, torch_micro_model
from .workloads import data_dir, generated_data, micro_data, workload_config

log = logging.getLogger(__name__)
MODULE = "cudnnnet.benchmark.torch_ddp"


def run_rank(settings: dict, result: Path) -> None:
    """Every workload of ``settings`` with DDP on this rank; rank 0 writes {workload: epoch summary}."""
    import torch
    import torch.distributed as dist

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(0)  # the launcher left this rank's GPU the only one visible
    dist.init_process_group("nccl", init_method="env://", rank=rank, world_size=world_size)
    try:
        figures = {}
        with generated_data(settings) as settings:
            for name in settings["workloads"]:
                measure = _micro_steps if name == "micro" else _epochs
                figures[name] = measure(torch, name, settings, rank, world_size)
        if rank == 0:
            result.write_text(json.dumps(figures))
    finally:
        dist.destroy_process_group()


def _epochs(torch, name: str, settings: dict, rank: int, world_size: int) -> dict:
    from torch.nn.parallel import DistributedDataParallel

    config = workload_config(name, "cuda", data_dir(name, settings), 1, False, math=settings["math"])
    set_torch_math(torch, config.math)
    images, labels = training.load_split(config, "train")
    limit = settings["limit_images"]
    images, labels = images[:limit], labels[:limit]
    part = np.random.default_rng(config.train.seed).permutation(len(labels))
    part = np.array_split(part, world_size)[rank]
    run = TorchTraining(torch, config, np.ascontiguousarray(images[part]), np.ascontiguousarray(labels[part]), "cuda")
    run.model = DistributedDataParallel(run.model, device_ids=[0])
    seconds = timed_calls(run.eager_epoch, settings["epochs"], torch.cuda.synchronize, 1)
    summary = epoch_summary(seconds, len(labels))
    log.info("torch DDP %s on %d GPU%s: %.2f ms an epoch", name, world_size, "s" if world_size > 1 else "",
             summary["epoch_ms"])
    return summary


def _micro_steps(torch, name: str, settings: dict, rank: int, world_size: int) -> dict:
    """The micro step with DDP: this rank's part of the one batch (``scaling_micro.micro_part``), eager."""
    from torch.nn.parallel import DistributedDataParallel

    size = settings["micro_size"]
    set_torch_math(torch, settings["math"])
    model = DistributedDataParallel(torch_micro_model(torch, size, "cuda"), device_ids=[0])
    optimizer = torch.optim.SGD(model.parameters(), lr=MICRO_LEARNING_RATE)
    part = micro_part(size, rank, world_size)
    inputs, targets = (torch.from_numpy(np.ascontiguousarray(array[part])).to("cuda") for array in micro_data(size))
    bf16 = settings["math"] == "bf16"

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            outputs = model(inputs)
        # J = ½·Σ (ŷ - y)² / (this rank's samples): DDP's average over the ranks is the whole batch's
        (0.5 * (outputs.float() - targets).pow(2).sum() / len(part)).backward()
        optimizer.step()

    seconds = timed_calls(step, settings["repeat"], torch.cuda.synchronize, SCALING_MICRO_WARMUP)
    set_torch_math(torch, "fp32")
    summary = step_summary(seconds)
    log.info("torch DDP micro on %d GPU%s: %.2f ms a step", world_size, "s" if world_size > 1 else "",
             summary["step_ms"])
    return summary


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    run_rank(json.loads(sys.argv[1]), Path(sys.argv[2]))
