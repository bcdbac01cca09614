"""``cudnnnet-benchmark --gpus N``: the training workloads on N GPUs of this host beside one GPU.

Each measurement runs in processes of its own, as ``cudnnnet-train`` would: one plain process for
one GPU, then N ranks started as ``cudnnnet-train --gpus N`` starts them (``launcher.spawn_ranks``).
A rank trains its shard of every epoch at the workload's batch per GPU, the gradients averaged by
NCCL inside the captured step; rank 0's epoch time (synchronised: the all-reduce holds the ranks
together) is reported, after one warm-up epoch. Scaling is one GPU's median epoch over N GPUs'.
The micro workload is timed by the step instead (``scaling_micro``): its one batch split among the ranks.
With ``--compare torch``, PyTorch DDP trains the same workloads on the same GPUs (``torch_ddp``).
"""

from __future__ import annotations

import functools
import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import DistributedError
from ..train.distributed import replicas as distributed
from .measuring import epoch_summary
from .scaling_micro import micro_steps
from .settings import SCALABLE, SCALING_TARGETS
from .workloads import data_dir, generated_data, train_epoch, training_images, workload_config

log = logging.getLogger(__name__)
MODULE = "cudnnnet.benchmark.scaling"
TORCH_MODULE = "cudnnnet.benchmark.torch_ddp"


def measure_scaling(settings: dict, gpus: int) -> dict:
    """{gpus, epochs, workloads: {name: {engine: {one_gpu, several_gpus, scaling, target}}}} for the
    SCALABLE workloads of ``settings`` in each of its engines, and with ``settings["compare"]``
    PyTorch DDP's under the engine name ``torch_ddp`` (eager; its target: none)."""
    names = [name for name in settings["workloads"] if name in SCALABLE]
    ranked = {**settings, "workloads": names}
    one, several = {}, {}
    for name in names:  # each workload in processes of its own, as a user runs one training a process
        alone = {**ranked, "workloads": [name]}
        one.update(_measure(1, alone))
        several.update(_measure(gpus, alone))
    if settings.get("compare") == "torch":
        for figures, count in ((one, 1), (several, gpus)):
            for name, summary in _measure(count, ranked, TORCH_MODULE, plain=False).items():
                figures[name]["torch_ddp"] = summary
    workloads = {}
    for name in names:
        for engine, single in one[name].items():
            many = several[name][engine]
            workloads.setdefault(name, {})[engine] = {
                "one_gpu": single, "several_gpus": many, "scaling": milliseconds(single) / milliseconds(many),
                "target": None if engine == "torch_ddp" else SCALING_TARGETS.get(name, {}).get(gpus)}
    return {"gpus": gpus, "epochs": settings["epochs"], "workloads": workloads}


def milliseconds(summary: dict) -> float:
    """A measurement's median: an epoch's, or the micro workload's step."""
    return summary["epoch_ms"] if "epoch_ms" in summary else summary["step_ms"]


def _measure(count: int, settings: dict, module: str = MODULE, plain: bool = True) -> dict:
    """{workload: {engine: epoch summary}} (``module``'s figures) from ``count`` processes, rank 0's;
    ``plain``: one GPU as one process without a launcher's variables."""
    from ..train.distributed.launcher import spawn_ranks

    with tempfile.TemporaryDirectory(prefix="cudnnnet-scaling-") as folder:
        result = Path(folder) / "result.json"
        arguments = [json.dumps(settings), str(result)]
        log.info("%s on %d GPU%s (%s)", ", ".join(settings["workloads"]), count, "s" if count > 1 else "", module)
        if count == 1 and plain:
            code = subprocess.run([sys.executable, "-m", module, *arguments]).returncode
        else:
            code = spawn_ranks(count, arguments, module=module)
        if code != 0 or not result.exists():
            raise DistributedError(f"the benchmark's {count}-GPU processes failed (exit {code}); see their output above")
        return json.loads(result.read_text())


def run_rank(settings: dict, result: Path) -> None:
    """One process of a measurement: every workload and engine of ``settings``; rank 0 writes ``result``."""
    launch = distributed.from_environment()
    if launch is not None:
        distributed.pin_device(launch)
    figures = {}
    with generated_data(settings) as settings:
        for name in settings["workloads"]:
            for engine in settings["engines"]:
                measure = micro_steps if name == "micro" else functools.partial(_epochs, name)
                figures.setdefault(name, {})[engine] = measure(engine, settings, launch)
    if launch is None or launch.rank == 0:
        result.write_text(json.dumps(figures))


def _epochs(name: str, engine: str, settings: dict, launch) -> dict:
    """A warm-up epoch, then the timed ones, of workload ``name`` in ``engine`` on this rank."""
    from ..train.trainer import Trainer

    epochs = settings["epochs"]
    config = workload_config(name, "cuda", data_dir(name, settings), epochs + 1, True, engine, settings["math"])
    group = None if launch is None else distributed.join(launch, config)
    with tempfile.TemporaryDirectory(prefix="cudnnnet-scaling-run-") as output:
        trainer = Trainer(config, Path(output) / "run", progress=False, image_limit=settings["limit_images"],
                          group=group)
        train_epoch(trainer)
        seconds = [train_epoch(trainer) for _ in range(epochs)]
        trainer.finish_replicas(exit_code=1)
    summary = epoch_summary(seconds, training_images(config, settings["limit_images"]))
    log.info("%s %s on %d GPU%s: %.2f ms an epoch", name, engine, 1 if launch is None else launch.world_size,
             "" if launch is None else "s", summary["epoch_ms"])
    return summary


def format_scaling(report: dict) -> str:
    """The table: workload, engine, one GPU's and N GPUs' median epoch (micro: step), the scaling and its target,
    and where PyTorch DDP ran, its N-GPU epoch over each engine's (> 1: cudnnnet is faster)."""
    gpus = report["gpus"]
    header = ("workload", "engine", "1 GPU (ms)", f"{gpus} GPUs (ms)", "scaling", "target", "status", "DDP/ours")
    rows = [header]
    for name, engines in report["workloads"].items():
        ddp = engines.get("torch_ddp")
        for engine, row in engines.items():
            target = row["target"]
            status = "" if target is None else ("PASS" if row["scaling"] >= target else "MISS")
            versus = "" if ddp is None or engine == "torch_ddp" else \
                f"{milliseconds(ddp['several_gpus']) / milliseconds(row['several_gpus']):.2f}x"
            rows.append((name, engine, f"{milliseconds(row['one_gpu']):.2f}", f"{milliseconds(row['several_gpus']):.2f}",
                         f"{row['scaling']:.2f}x", "" if target is None else f">= {target:g}x", status, versus))
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = ["  ".join(cell.ljust(width) if column < 2 else cell.rjust(width)
                       for column, (cell, width) in enumerate(zip(row, widths))) for row in rows]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    run_rank(json.loads(sys.argv[1]), Path(sys.argv[2]))
