"""The micro workload on N GPUs (``cudnnnet-benchmark --gpus N``): the series' step (samples × features
10 000 × 10 000 → 5 000 → 1 000 → 10, tanh and sigmoids, MSE, SGD) with the one batch split among
the ranks (strong scaling, as PyTorch DDP's figure of the series: N GPUs share the 10 000 samples),
each rank's gradients averaged during the backward pass, inside the captured step, as the Trainer's
step does (on 2 GPUs of one host copied to the peer as they are written, the first layer's weight
gradient in blocks: ``backends/cuda/peer_reduce.py``; else by NCCL in buckets). One GPU runs the
same step on all the samples without the all-reduce. Figures are per step (ms), the step replayed as
a CUDA graph.
"""

from __future__ import annotations

import logging

import numpy as np

from ..backends import get_backend
from ..config.schema import Config, parse_config
from ..optim.optimizers import SGD
from ..tensor import Tensor
from ..train.distributed import replicas as distributed
from .measuring import step_summary, timed_calls
from .settings import MICRO_LEARNING_RATE, SCALING_MICRO_WARMUP
from .workloads import build_micro_network, micro_data, micro_layer_sizes

log = logging.getLogger(__name__)


def micro_config(size: int, world_size: int = 1) -> Config:
    """The micro step as a config: what every rank's rendezvous compares, and the SGD the step runs
    (its batch: a rank's part of the ``size`` samples)."""
    _, hidden1, hidden2, outputs = micro_layer_sizes(size)
    model = [{"type": "dense", "name": "fc1", "out_size": hidden1}, {"type": "activation", "name": "tanh1", "mode": "tanh"},
             {"type": "dense", "name": "fc2", "out_size": hidden2},
             {"type": "activation", "name": "sigmoid2", "mode": "sigmoid"},
             {"type": "dense", "name": "fc3", "out_size": outputs},
             {"type": "activation", "name": "sigmoid3", "mode": "sigmoid"}, {"type": "mse", "name": "quadratic"}]
    return parse_config({"model": model, "data": {}, "device": "cuda", "train": {
        "batch_size": len(micro_part(size, 0, world_size)),
        "optimizer": {"name": "sgd", "lr": MICRO_LEARNING_RATE}, "lr_scaling": "none"}})


def micro_part(size: int, rank: int, world_size: int) -> np.ndarray:
    """The samples of rank ``rank``: a contiguous part of the ``size``, as even as they divide."""
    return np.array_split(np.arange(size), world_size)[rank]


def micro_steps(engine: str, settings: dict, launch) -> dict:
    """{step_ms, step_ms_all} of the micro step in ``engine`` on this rank (``launch`` None: one GPU alone)."""
    backend = get_backend("cuda")
    size = settings["micro_size"]
    network = build_micro_network(size, backend).set_engine(engine).set_math(settings["math"])
    optimizer = SGD(network, MICRO_LEARNING_RATE)
    replicas = None
    if launch is not None:
        config = micro_config(size, launch.world_size)
        replicas = distributed.Replicas(distributed.join(launch, config), network, optimizer, config.train, 1)
        replicas.broadcast_weights()
    inputs, targets = micro_data(size)
    part = micro_part(size, *((0, 1) if launch is None else (launch.rank, launch.world_size)))
    x = Tensor.from_numpy(inputs[part].reshape(len(part), size, 1, 1), backend)  # (N/R, features, 1, 1)
    target = Tensor.from_numpy(targets[part].reshape(len(part), 10, 1, 1), backend)  # (N/R, 10, 1, 1)
    loss, count = Tensor.zeros((1,), backend), Tensor.zeros((1,), backend)

    def step():
        network.forward_backward(x, target, loss, count,
                                 after_backward=None if replicas is None else replicas.layer_done)
        stepped = replicas is not None and replicas.average_gradients()  # True: its average stepped
        if not stepped:
            optimizer.step()

    graph = None
    try:
        step()  # allocates, plans and compiles what a capture cannot
        with backend.capture() as graph:
            step()
        seconds = timed_calls(graph.launch, settings["repeat"], backend.synchronize, SCALING_MICRO_WARMUP)
    except BaseException as error:
        # said before the teardown, whose watchdog may end the process before the error reaches its caller
        log.error("micro %s on this rank failed: %s: %s", engine, type(error).__name__, error)
        raise
    finally:
        if replicas is not None:
            replicas.finish(graphs=[graph], exit_code=1)
    summary = step_summary(seconds)
    log.info("micro %s on %d GPU%s: %.2f ms a step (%d of %d samples here)", engine,
             1 if launch is None else launch.world_size, "" if launch is None else "s", summary["step_ms"],
             len(part), size)
    return summary
