"""cudnnnet-benchmark: how fast cudnnnet trains, against targets and, if asked, against PyTorch.

    python scripts/benchmark.py [--device auto|cuda|host] [--json FILE] [--compare torch] [--repeat N]
                                [--epochs N] [--only mlp,cnn,bn_cnn,cifar10,micro,original] [--micro-size N]
                                [--limit-images N] [--original-runs N] [--data-dir DIR]
                                [--engines slides,fast] [--math fp32|tf32|bf16|fp16] [--gpus N]
                                [--steady-seconds SECONDS] [--steady-replays N]

Every workload runs once per engine (``--engines``, both by default: cudnnnet.engine), each in a
column of its own.

Workloads (``--only`` picks some; all but bn_cnn and cifar10 by default):

mlp, cnn, bn_cnn
    configs/mnist_mlp.yaml's and configs/mnist_cnn.yaml's model and optimiser (SGD, momentum 0.9),
    and configs/mnist_bn_cnn.yaml's (BatchNorm, dropout, AdamW; PyTorch's AdamW without the schedule),
    in ``--math`` (FP32 by default; PyTorch under autocast for bf16 and fp16, whose epoch targets
    are PyTorch's captured epoch over 1.5; fp16 with our dynamic loss scaling, PyTorch's without),
    batch 256, on the full MNIST training set (``--limit-images N``: its first N images, for
    smoke tests). One ``Trainer`` per mode, ``train.graph`` true ("graph": each step replays a CUDA
    graph) and false ("eager"); on the host, eager only. ``Trainer.train_epoch`` runs one warm-up
    epoch, then ``--epochs`` timed ones (it synchronises and returns the seconds); reported: the
    median epoch in ms, images per second at that median, and the peak device memory in MiB. The
    memory is cudaMemGetInfo-based: used = total − free before the trainer is built, then sampled
    after the warm-up epoch and after the timed ones; the peak is the largest sample minus that
    baseline. It counts everything the process (and any other process on the GPU) allocated
    meanwhile, cuDNN workspaces and graph memory included, at the driver's granularity. None on
    the host.
cifar10
    configs/cifar10_cnn.yaml's VGG-style net (three blocks of two 3×3 conv–BN–ReLU and a max
    pooling, the convolutions without bias; Dense 256, BN, ReLU, dropout 0.5, Dense 10) and
    optimiser (SGD, momentum 0.9, weight decay, its schedule) at the config's batch (128), on 50 000
    generated 3×32×32 images (uniform pixels and labels from a fixed seed, written as CIFAR-10's
    binary records into a temporary folder and read as the config's data set: normalised by their
    per-channel statistics, held on the device), with the config's ``data.augment`` where it has one.
    Timed as a captured graph only (eager on the host); ``--limit-images N`` generates N. Judged in
    both engines against PyTorch's captured graph of the same run: at least 1.3 times faster
    (``TORCH_SPEED_UPS``; no target without ``--compare torch``).
micro
    The "Deep Learning from Scratch to GPU" part 10 micro-benchmark: 10 000 samples of 10 000
    features, Dense 5 000 tanh → Dense 1 000 sigmoid → Dense 10 sigmoid, quadratic cost (an MSE
    layer), random data drawn on the host with a fixed seed and uploaded once. One step is
    ``network.train_step(x, target, 0.05)`` (forward, backward and plain SGD; the fast engine applies
    SGD to the Dense weights in their weight-gradient GEMMs), synchronised; reported: the median of
    ``--repeat`` steps after two warm-up steps (on CUDA, warm-up steps for a second at least: the
    GPU's clock settles to the row's load), in ms, in FP32, TF32 (CUDA only) and bf16
    (``Network.set_math``; PyTorch's column runs bf16 under autocast), eager and (CUDA only) captured
    once as a CUDA graph and replayed, as PyTorch's graph row is; the fast engine's target is judged on
    the graph row, and in bf16 it is also PyTorch's graph step. Each graph (ours and PyTorch's) is also
    reported at steady state, in a row "graph, steady state" below its graph row: right after the
    graph row's steps it is replayed untimed for ``--steady-seconds`` (3 s), then ``--steady-replays``
    (60) times timed; the median of the last half of those is reported (no target is judged there). ``--micro-size N`` shrinks it to N
    samples of N features with hidden layers of N/2 and N/10 (the host default is 1 000, as 10 000
    takes many seconds a step there).
original
    The C++ original's experiment as a whole command: ``python -m cudnnnet.cli.launch --config
    configs/original_{mlp,cnn}.yaml --device DEVICE --quiet --data-dir DIR --output TMP`` (what
    cudnnnet-train and scripts/train.py run) in a subprocess, timed by wall clock (``--original-runs`` runs, median), with the test accuracy
    from its metrics.json. Where NumPy, PyYAML or cuda-python have no cached bytecode and
    PYTHONDONTWRITEBYTECODE is set, every such process compiles their source first; the report
    names them (``uncompiled_packages``) and says so above the table.

``--device auto`` (the default) runs on the GPU where the NVIDIA driver counts one, else on the
host; it asks the driver alone (no CUDA context), so the original workload's processes still have
the GPU to themselves. ``--device cuda`` without a GPU is one error line before anything runs. Each
workload logs a line when it is done (each run of the original workload too); on the host the
whole run takes about 13 minutes on a 2-core CPU, most of it the original workload (HOST_DURATION).

``--compare torch`` runs mlp, cnn, bn_cnn, cifar10 and micro (those asked for) with PyTorch in the
same process, where PyTorch imports and sees a GPU (otherwise it says why and skips): the same
architectures (biases, BatchNorm, dropout) and optimiser, the data as one CUDA tensor indexed by a
device permutation, eager and with each whole step (gather, augmentation, forward, loss, backward,
optimiser step) captured in a CUDA graph (static index tensors; a second graph for the epoch's
last, shorter batch; the optimiser at the config's rate without its schedule); FP32 (TF32 off for
matmuls and cuDNN) and, for the micro, TF32. cifar10 runs
with cuDNN's autotuner (``cudnn.benchmark``), as a captured graph only, and augments as the config
does: per sample a shift dy, dx uniform in [-p, p] with zeros outside and a horizontal flip with
probability 1/2, drawn by the device's generator inside the graph. Under ``--math bf16`` (and for
the micro's bf16 rows) PyTorch also runs in pure bfloat16 as a captured graph, a column of its own
("torch bf16 graph", beside autocast's "torch graph"): the model, so its weights and SGD's state,
and the input in bfloat16 (``model.to(torch.bfloat16)``), the loss in FP32 from the bfloat16
outputs.

``--gpus N`` times mlp, cnn, bn_cnn, cifar10 and micro (those ``--only`` names) on one GPU, then on N
GPUs of this host (one process per GPU, as ``cudnnnet-train --gpus N``), each in both engines
(``--engines``), and prints workload | engine | 1 GPU | N GPUs | scaling | target | status
(benchmark/scaling.py): median epochs, and for micro the median step, its one batch of
``--micro-size`` samples split among the GPUs (benchmark/scaling_micro.py); with ``--compare torch``
PyTorch DistributedDataParallel trains them eagerly on the same GPUs (benchmark/torch_ddp.py), and
DDP/ours is its N-GPU epoch (step) over each engine's.

Output: log lines on stderr, then the table on stdout (workload | unit | slides | fast | torch
eager | torch graph | torch/slides | torch/fast | slides target | fast target | status; with
PyTorch's pure bfloat16 graph, also torch bf16 graph after torch graph and torch bf16/slides,
torch bf16/fast after torch/fast), the device at the top. A ratio is torch's time over ours in the
same mode (> 1: cudnnnet is faster). Targets
are an H100's, judged PASS/MISS (slides / fast) only on the GPU for the full-size workloads: the
fast engine against ``TARGETS``, the slides engine's graph epochs against PyTorch's captured graph
measured in the same run (``SLIDES_TARGETS`` where PyTorch was not run). ``--json FILE`` writes
every figure::

    device, backend, date, versions {cudnnnet, python, numpy, [cuda_runtime, cuda_driver, cudnn,
    cublas], [torch, torch_cudnn]}, settings {...}, targets {name: limit},
    results {slides|fast: {mlp|cnn|bn_cnn|cifar10: {config, images, batch_size, augment, graph|eager: {epoch_ms,
    epoch_ms_all, images_per_second, peak_memory_mib} or null}, micro: {size, layers, repeat,
    fp32|tf32|bf16: {eager|graph: {step_ms, step_ms_all} or null, graph_steady: {step_ms, step_ms_all,
    warmup_seconds, warmup_replays, median_of_last} or null} or null}, original: {mlp|cnn: {config,
    seconds, seconds_all, test_accuracy}}}}, uncompiled_packages [name], torch (null unless compared)
    {version, mlp|cnn|bn_cnn|cifar10: {eager|graph|[pure_bf16_graph]: {epoch_ms, epoch_ms_all,
    images_per_second, peak_memory_mib}}, micro: {fp32|tf32|bf16: {eager|graph: {step_ms, step_ms_all}, graph_steady,
    [pure_bf16_graph, pure_bf16_graph_steady]: {...}}}}, table [{workload, unit, slides, fast,
    torch_eager, torch_graph, torch_bf16_graph, ratio_slides, ratio_fast, ratio_bf16_slides,
    ratio_bf16_fast, target_slides, target_fast, status_slides, status_fast}]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from pathlib import Path

from ..backends import no_gpu_reason
from ..benchmark.report import build_report, format_table, table_header
from ..benchmark.scaling import format_scaling, measure_scaling
from ..benchmark.settings import (BATCH_SIZE, DEFAULT_WORKLOADS, DEFAULTS, HOST_DURATION, HOST_MICRO_SIZE, MATHS,
                                  MICRO_SIZE, SCALABLE, STEADY_REPLAYS, STEADY_SECONDS, WORKLOAD_MATHS, WORKLOADS)
from ..engine import ENGINES
from ..errors import DeviceUnavailableError, UsageError
from ..io.files import atomic_write
from ..precision import DEFAULT_PRECISION
from .common import ArgumentParser, add_common_arguments, path_argument, run
from .train import positive_int

log = logging.getLogger("cudnnnet.benchmark")


def workload_list(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown workload {', '.join(map(repr, unknown)) or repr(text)}; "
                                         f"valid: a comma-separated list of {', '.join(WORKLOADS)}")
    return tuple(name for name in WORKLOADS if name in names)


def engine_list(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in ENGINES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown engine {', '.join(map(repr, unknown)) or repr(text)}; "
                                         f"valid: a comma-separated list of {', '.join(ENGINES)}")
    return tuple(name for name in ENGINES if name in names)


def seconds_argument(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="cudnnnet-benchmark", description="Time cudnnnet's training workloads.",
                            epilog=f"On the host (no GPU), {HOST_DURATION}. A line is logged as each workload "
                                   "finishes.")
    parser.add_argument("--device", choices=("auto", "cuda", "host"), default="auto",
                        help="where to run (default auto: the GPU where the driver sees one, else the host)")
    parser.add_argument("--only", type=workload_list, default=DEFAULT_WORKLOADS, metavar="LIST",
                        help=f"comma-separated workloads among {','.join(WORKLOADS)} (default "
                             f"{','.join(DEFAULT_WORKLOADS)})")
    parser.add_argument("--json", type=path_argument, metavar="FILE", help="also write every figure to FILE as JSON")
    parser.add_argument("--compare", choices=("torch",), help="also run the workloads with PyTorch")
    parser.add_argument("--epochs", type=positive_int,
                        help="timed epochs after the warm-up one (default 10 on cuda, 1 on the host)")
    parser.add_argument("--repeat", type=positive_int,
                        help="timed micro-benchmark steps after the warm-up (default 20 on cuda, 3 on the host)")
    parser.add_argument("--micro-size", type=positive_int,
                        help=f"micro-benchmark samples and features (default {MICRO_SIZE}, {HOST_MICRO_SIZE} "
                             f"on the host); hidden layers scale with it")
    parser.add_argument("--steady-seconds", type=seconds_argument, default=STEADY_SECONDS, metavar="SECONDS",
                        help="each micro graph row is also reported at steady state: replayed untimed this long "
                             f"after its timed steps (default {STEADY_SECONDS:g}), then --steady-replays timed")
    parser.add_argument("--steady-replays", type=positive_int, default=STEADY_REPLAYS, metavar="N",
                        help=f"timed replays of the micro steady state, the median of the last half reported "
                             f"(default {STEADY_REPLAYS})")
    parser.add_argument("--limit-images", type=positive_int, metavar="N",
                        help="train the training workloads on their first N images only, cifar10 on N "
                             "generated ones (smoke tests)")
    parser.add_argument("--original-runs", type=positive_int, default=3,
                        help="runs of each original workload (default 3; the median is reported)")
    parser.add_argument("--data-dir", type=path_argument,
                        help="MNIST directory (default: $CUDNNNET_DATA, else the user cache)")
    parser.add_argument("--math", choices=WORKLOAD_MATHS, default=DEFAULT_PRECISION,
                        help="precision of the mlp and cnn workloads (fp16 with dynamic loss scaling; PyTorch's: "
                             "autocast to bf16 or fp16, and in bf16 pure bfloat16 as well); the micro-benchmark runs "
                             "fp32, tf32 and bf16 (default fp32)")
    parser.add_argument("--gpus", type=positive_int, metavar="N",
                        help=f"time {','.join(SCALABLE)} (those --only names) on N GPUs of this host, one "
                             "process per GPU, beside one GPU, and report the scaling")
    parser.add_argument("--engines", "--engine", type=engine_list, default=tuple(ENGINES), metavar="LIST",
                        help=f"comma-separated engines among {','.join(ENGINES)}, one column each (default all)")
    add_common_arguments(parser)
    return parser


def resolve_device(device: str) -> str:
    """cuda or host for ``--device``: auto is cuda where the NVIDIA driver counts a GPU, else the host.
    Only the driver is asked (no CUDA context, no library), so the original workload's processes
    still have the GPU alone; cuda without a GPU is a DeviceUnavailableError before anything runs."""
    if device == "host":
        return device
    reason = no_gpu_reason()
    if device == "cuda" and reason is not None:
        raise DeviceUnavailableError(f"--device cuda: no GPU ({reason})")
    if device == "auto":
        device = "host" if reason is not None else "cuda"
        log.info("--device auto: %s", "the driver counts a GPU; running on cuda" if reason is None else
                 f"no GPU found; running on the host, where {HOST_DURATION}")
        if reason is not None:
            log.debug("--device auto: no GPU: %s", reason)
    return device


def resolve_settings(args) -> dict:
    """The settings of this run, with the device resolved and each device's defaults filled in."""
    device = resolve_device(args.device)
    epochs, repeat = DEFAULTS[device]
    micro_size = args.micro_size
    if micro_size is None:
        micro_size = MICRO_SIZE if device == "cuda" else HOST_MICRO_SIZE
        if device == "host" and "micro" in args.only:
            log.info("micro-benchmark on the host at %d × %d instead of %d × %d (use --micro-size to change)",
                     micro_size, micro_size, MICRO_SIZE, MICRO_SIZE)
    repeat = args.repeat or repeat
    if device == "cuda" and repeat < 10 and "micro" in args.only:
        log.warning("--repeat %d: fewer than 10 timed micro-benchmark steps", repeat)
    return {"device": device, "workloads": list(args.only), "batch_size": BATCH_SIZE,
            "epochs": args.epochs or epochs, "repeat": repeat, "micro_size": micro_size,
            "limit_images": args.limit_images, "original_runs": args.original_runs, "data_dir": args.data_dir,
            "compare": args.compare, "engines": list(args.engines), "math": args.math,
            "steady_seconds": args.steady_seconds, "steady_replays": args.steady_replays}


def check_json_path(path: Path) -> None:
    """``--json FILE`` can be written, checked before a workload runs for minutes."""
    if path.is_dir():
        raise UsageError(f"--json {path} is a folder; give a file name")
    folder = path.absolute().parent
    if not folder.exists():
        raise UsageError(f"--json {path}: the folder {folder} does not exist; create it first")
    if not folder.is_dir():
        raise UsageError(f"--json {path}: {folder} is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"--json {path}: cannot write in {folder} (permission denied)")


def main_with_args(args) -> int:
    if args.json:
        check_json_path(Path(args.json))
    if args.gpus is not None:
        return _scaling(args)
    report = build_report(resolve_settings(args))
    if args.json:
        with atomic_write(args.json) as file:
            file.write((json.dumps(report, indent=2) + "\n").encode("utf-8"))
        log.info("wrote %s", args.json)
    print(format_table(report["table"], table_header(report)))
    return 0


def _scaling(args) -> int:
    """--gpus N: the SCALABLE workloads on one GPU and on N, the scaling and its targets."""
    if args.device == "host":
        raise UsageError("--gpus N measures GPUs; leave --device host out")
    names = [name for name in args.only if name in SCALABLE]
    if not names:
        raise UsageError(f"--gpus N times {', '.join(SCALABLE)}; --only names none of them")
    if "micro" in names and args.math not in MATHS:
        raise UsageError(f"--gpus N times micro in {', '.join(MATHS[:-1])} or {MATHS[-1]}; --math {args.math} "
                         f"applies to the other workloads only (leave micro out of --only)")
    settings = {**resolve_settings(argparse.Namespace(**{**vars(args), "device": "cuda"})), "workloads": names}
    report = measure_scaling(settings, args.gpus)
    if args.json:
        with atomic_write(args.json) as file:
            file.write((json.dumps(report, indent=2) + "\n").encode("utf-8"))
    print(format_scaling(report))
    return 0


def main(argv=None) -> int:
    return run(main_with_args, build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
