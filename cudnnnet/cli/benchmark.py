"""cudnnnet-benchmark: how fast cudnnnet trains, against targets and, if asked, against PyTorch.

    python scripts/benchmark.py [--device auto|cuda|host] [--json FILE] [--compare torch] [--repeat N]
                                [--epochs N] [--only mlp,cnn,micro,original] [--micro-size N]
                                [--limit-images N] [--original-runs N] [--data-dir DIR]
                                [--engines slides,fast]

Every workload runs once per engine (``--engines``, both by default: cudnnnet.engine), each in a
column of its own.

Workloads (``--only`` picks some; all by default):

mlp, cnn
    configs/mnist_mlp.yaml's and configs/mnist_cnn.yaml's model and optimiser (SGD, momentum 0.9),
    FP32, batch 256, on the full MNIST training set (``--limit-images N``: its first N images, for
    smoke tests). One ``Trainer`` per mode, ``train.graph`` true ("graph": each step replays a CUDA
    graph) and false ("eager"); on the host, eager only. ``Trainer.train_epoch`` runs one warm-up
    epoch, then ``--epochs`` timed ones (it synchronises and returns the seconds); reported: the
    median epoch in ms, images per second at that median, and the peak device memory in MiB. The
    memory is cudaMemGetInfo-based: used = total − free before the trainer is built, then sampled
    after the warm-up epoch and after the timed ones; the peak is the largest sample minus that
    baseline. It counts everything the process (and any other process on the GPU) allocated
    meanwhile, cuDNN workspaces and graph memory included, at the driver's granularity. None on
    the host.
micro
    The "Deep Learning from Scratch to GPU" part 10 micro-benchmark: 10 000 samples of 10 000
    features, Dense 5 000 tanh → Dense 1 000 sigmoid → Dense 10 sigmoid, quadratic cost (an MSE
    layer), random data drawn on the host with a fixed seed and uploaded once. One step is
    forward, backward and ``network.update(0.05)``, synchronised; reported: the median of
    ``--repeat`` steps after two warm-up steps, in ms, in FP32 and in TF32 (``backend.set_math``;
    CUDA only). ``--micro-size N`` shrinks it to N samples of N features with hidden layers of
    N/2 and N/10 (the host default is 1 000, as 10 000 takes many seconds a step there).
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

``--compare torch`` runs mlp, cnn and micro with PyTorch in the same process, where PyTorch
imports and sees a GPU (otherwise it says why and skips): the same architectures and optimiser,
MNIST as one CUDA tensor indexed by a device permutation, eager and with each step captured in a
CUDA graph (static index tensors; a second graph for the epoch's last, shorter batch); FP32 (TF32
off for matmuls and cuDNN) and, for the micro, TF32.

Output: log lines on stderr, then the table on stdout (workload | unit | slides | fast | torch
eager | torch graph | torch/slides | torch/fast | slides target | fast target | status), the device
at the top. A ratio is torch's time over ours in the same mode (> 1: cudnnnet is faster). Targets
are an H100's, judged PASS/MISS (slides / fast) only on the GPU for the full-size workloads: the
fast engine against ``TARGETS``, the slides engine's graph epochs against PyTorch's captured graph
measured in the same run (``SLIDES_TARGETS`` where PyTorch was not run). ``--json FILE`` writes
every figure::

    device, backend, date, versions {cudnnnet, python, numpy, [cuda_runtime, cuda_driver, cudnn,
    cublas], [torch, torch_cudnn]}, settings {...}, targets {name: limit},
    results {slides|fast: {mlp|cnn: {config, images, batch_size, graph|eager: {epoch_ms,
    epoch_ms_all, images_per_second, peak_memory_mib} or null}, micro: {size, layers, repeat,
    fp32|tf32: {step_ms, step_ms_all} or null}, original: {mlp|cnn: {config, seconds,
    seconds_all, test_accuracy}}}}, uncompiled_packages [name], torch (null unless compared)
    {version, mlp|cnn: {eager|graph: {epoch_ms, epoch_ms_all, images_per_second}},
    micro: {fp32|tf32: {eager|graph: {step_ms, step_ms_all}}}}, table [{workload, unit, slides,
    fast, torch_eager, torch_graph, ratio_slides, ratio_fast, target_slides, target_fast,
    status_slides, status_fast}]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import gc
import importlib.util
import json
import logging
import os
import platform
import site
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from math import prod
from pathlib import Path

import numpy as np

from .. import __version__, training
from ..backends import get_backend, no_gpu_reason
from ..config import Config, load_config, parse_config
from ..engine import ENGINES
from ..errors import CudnnnetError, DeviceUnavailableError
from ..layers import LAYER_TYPES, MSE, Activation, Dense
from ..network import Network
from ..shipped_configs import CONFIG_DIR
from ..tensor import Tensor
from ..training import Trainer
from .common import ArgumentParser, add_common_arguments, run
from .train import positive_int

log = logging.getLogger("cudnnnet.benchmark")

TRAINER = ("-m", "cudnnnet.cli.launch")  # cudnnnet-train as a module: the same in a checkout and an install
PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # the folder holding this cudnnnet package

WORKLOADS = ("mlp", "cnn", "micro", "original")
TRAINING_CONFIGS = {"mlp": "mnist_mlp.yaml", "cnn": "mnist_cnn.yaml"}
ORIGINAL_CONFIGS = {"mlp": "original_mlp.yaml", "cnn": "original_cnn.yaml"}
BATCH_SIZE = 256
MICRO_SIZE = 10_000  # the series' 10 000 × 10 000 input
HOST_MICRO_SIZE = 1_000
MICRO_LEARNING_RATE = 0.05
MICRO_WARMUP = 2
MICRO_SEED = 0
MATHS = ("fp32", "tf32")
MIB = 1 << 20
DEFAULTS = {  # device: (timed epochs, micro repeats)
    "cuda": (10, 20),
    "host": (1, 3),
}

# Targets on an NVIDIA H100, judged beside the measurements (ms for epochs and steps, s for processes).
TARGETS = {
    "mlp_epoch_ms": 15.0,
    "cnn_epoch_ms": 90.0,
    "micro_fp32_ms": 46.0,
    "micro_tf32_ms": 9.1,
    "original_mlp_s": 1.0,
    "original_cnn_s": 2.0,
}
# The slides engine's graph epochs: PyTorch's captured graph on an H100 (used where --compare torch was not run).
SLIDES_TARGETS = {
    "mlp_epoch_ms": 31.5,
    "cnn_epoch_ms": 133.0,
}
TARGET_DEVICE = "H100"
HOST_DURATION = ("all workloads take about 13 minutes on a 2-core CPU, 10 of them in the original workload's "
                 "six training processes (--only mlp,cnn,micro skips those)")
# Third-party packages every training process imports: where their bytecode is not cached and cannot
# be written (PYTHONDONTWRITEBYTECODE), each process compiles their source again (~0.3 s on one H100 host).
PROCESS_IMPORTS = ("numpy", "yaml", "cuda.bindings", "cuda.pathfinder")


class BenchmarkError(CudnnnetError):
    """A workload could not be measured (a subprocess failed, a layer has no PyTorch equivalent)."""


# ---- command line -----------------------------------------------------------------------------


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


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="cudnnnet-benchmark", description="Time cudnnnet's training workloads.",
                            epilog=f"On the host (no GPU), {HOST_DURATION}. A line is logged as each workload "
                                   "finishes.")
    parser.add_argument("--device", choices=("auto", "cuda", "host"), default="auto",
                        help="where to run (default auto: the GPU where the driver sees one, else the host)")
    parser.add_argument("--only", type=workload_list, default=WORKLOADS, metavar="LIST",
                        help=f"comma-separated workloads among {','.join(WORKLOADS)} (default all)")
    parser.add_argument("--json", metavar="FILE", help="also write every figure to FILE as JSON")
    parser.add_argument("--compare", choices=("torch",), help="also run the workloads with PyTorch")
    parser.add_argument("--epochs", type=positive_int,
                        help="timed epochs after the warm-up one (default 10 on cuda, 1 on the host)")
    parser.add_argument("--repeat", type=positive_int,
                        help="timed micro-benchmark steps after the warm-up (default 20 on cuda, 3 on the host)")
    parser.add_argument("--micro-size", type=positive_int,
                        help=f"micro-benchmark samples and features (default {MICRO_SIZE}, {HOST_MICRO_SIZE} "
                             f"on the host); hidden layers scale with it")
    parser.add_argument("--limit-images", type=positive_int, metavar="N",
                        help="train mlp and cnn on the first N MNIST images only (smoke tests)")
    parser.add_argument("--original-runs", type=positive_int, default=3,
                        help="runs of each original workload (default 3; the median is reported)")
    parser.add_argument("--data-dir", help="MNIST directory (default: $CUDNNNET_DATA, else the user cache)")
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
                 f"no GPU ({reason}); running on the host, where {HOST_DURATION}")
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
            "compare": args.compare, "engines": list(args.engines)}


# ---- measuring --------------------------------------------------------------------------------


def median_ms(seconds: list[float]) -> float:
    return 1000.0 * statistics.median(seconds)


def timed_calls(call, repeat: int, synchronize, warmup: int) -> list[float]:
    """Seconds of each of ``repeat`` calls after ``warmup`` untimed ones, each synchronised."""
    for _ in range(warmup):
        call()
    synchronize()
    seconds = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        synchronize()
        seconds.append(time.perf_counter() - started)
    return seconds


def epoch_summary(seconds: list[float], images: int) -> dict:
    return {"epoch_ms": median_ms(seconds), "epoch_ms_all": [1000.0 * s for s in seconds],
            "images_per_second": images / statistics.median(seconds)}


def step_summary(seconds: list[float]) -> dict:
    return {"step_ms": median_ms(seconds), "step_ms_all": [1000.0 * s for s in seconds]}


class DeviceMemory:
    """Peak device memory in use above a baseline: used = total − free (cudaMemGetInfo)."""

    def __init__(self, backend):
        self.backend = backend
        self.memory_info = getattr(backend, "memory_info", None)
        self.baseline = self.peak = self._used()

    def _used(self) -> int | None:
        if self.memory_info is None:
            return None
        self.backend.synchronize()
        free, total = self.memory_info()
        return total - free

    def sample(self) -> None:
        used = self._used()
        if used is not None:
            self.peak = max(self.peak, used)

    @property
    def peak_mib(self) -> float | None:
        return None if self.baseline is None else (self.peak - self.baseline) / MIB


# ---- mlp and cnn: the Trainer -----------------------------------------------------------------


def workload_config(name: str, device: str, data_dir, epochs: int, graph: bool, engine: str = "slides") -> Config:
    """The config file's model and optimiser at batch 256, FP32, with ``epochs`` planned epochs."""
    config = load_config(CONFIG_DIR / TRAINING_CONFIGS[name]).with_overrides(
        epochs=epochs, batch_size=BATCH_SIZE, device=device, data_dir=data_dir, engine=engine)
    raw = config.to_dict()
    raw["train"]["graph"] = graph
    raw["math"] = "fp32"
    return parse_config(raw, source=config.source)


@contextlib.contextmanager
def limited_training_set(limit: int | None):
    """Within the block, the trainer loads only the first ``limit`` images of each split."""
    if limit is None:
        yield
        return
    load_split_pixels = training.load_split_pixels

    def first_images(config, split, download=True):
        images, labels = load_split_pixels(config, split, download)
        return images.head(limit), labels[:limit]

    training.load_split_pixels = first_images
    try:
        yield
    finally:
        training.load_split_pixels = load_split_pixels


def training_images(config: Config, limit: int | None) -> int:
    count = len(training.load_split_pixels(config, "train")[1])
    return count if limit is None else min(count, limit)


def train_epoch(trainer: Trainer) -> float:
    """Seconds of one whole epoch (``Trainer.train_epoch``, synchronised), then on to the next epoch
    as the trainer does after evaluating one."""
    seconds = trainer.train_epoch()
    trainer.position.epoch += 1
    trainer.position.batch = 0
    return seconds


def benchmark_training(name: str, settings: dict, graph: bool, images: int, engine: str = "slides") -> dict:
    """Median epoch of ``name`` (mlp or cnn) after a warm-up epoch, with the peak device memory."""
    epochs = settings["epochs"]
    log.info("%s %s %s: a warm-up epoch, then %d timed", name, engine, "graph" if graph else "eager", epochs)
    config = workload_config(name, settings["device"], settings["data_dir"], epochs + 1, graph, engine)
    backend = get_backend(config.device)
    gc.collect()
    memory = DeviceMemory(backend)
    with tempfile.TemporaryDirectory(prefix="cudnnnet-benchmark-") as output:
        with limited_training_set(settings["limit_images"]):
            trainer = Trainer(config, output, progress=False)
        train_epoch(trainer)
        memory.sample()
        seconds = [train_epoch(trainer) for _ in range(epochs)]
        memory.sample()
        del trainer
    gc.collect()
    summary = {**epoch_summary(seconds, images), "peak_memory_mib": memory.peak_mib}
    log.info("%s %s %s: %.2f ms an epoch, %.0f images/s", name, engine, "graph" if graph else "eager",
             summary["epoch_ms"], summary["images_per_second"])
    return summary


def training_section(name: str, settings: dict, backend, engine: str = "slides") -> dict:
    modes = ("graph", "eager") if backend.supports_graphs else ("eager",)
    if not backend.supports_graphs:
        log.info("%s: the %s backend has no CUDA graphs; timing eager steps only", name, backend.name)
    config = workload_config(name, settings["device"], settings["data_dir"], 1, False)
    images = training_images(config, settings["limit_images"])
    section = {"config": f"configs/{TRAINING_CONFIGS[name]}", "images": images, "batch_size": BATCH_SIZE,
               "graph": None, "eager": None}
    for mode in modes:
        section[mode] = benchmark_training(name, settings, mode == "graph", images, engine)
    return section


# ---- micro: the "Deep Learning from Scratch to GPU" step -------------------------------------


def micro_layer_sizes(size: int) -> tuple[int, int, int, int]:
    """(features, hidden 1, hidden 2, outputs): 10 000 → 5 000 → 1 000 → 10 at the series' size."""
    return (size, max(1, round(size * 5_000 / MICRO_SIZE)), max(1, round(size * 1_000 / MICRO_SIZE)), 10)


def micro_data(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs (size samples × size features) and targets (size × 10) in [0, 1), from a fixed seed."""
    rng = np.random.default_rng(MICRO_SEED)
    return rng.random((size, size), dtype=np.float32), rng.random((size, 10), dtype=np.float32)


def build_micro_network(size: int, backend) -> Network:
    features, hidden1, hidden2, outputs = micro_layer_sizes(size)
    layers = [Dense("fc1", hidden1), Activation("tanh1", "tanh"), Dense("fc2", hidden2),
              Activation("sigmoid2", "sigmoid"), Dense("fc3", outputs), Activation("sigmoid3", "sigmoid"),
              MSE("quadratic")]
    return Network(layers, backend=backend, seed=MICRO_SEED, input_shape=(features, 1, 1))


def micro_maths(backend) -> tuple[str, ...]:
    if hasattr(backend, "set_math"):
        return MATHS
    log.info("micro: the %s backend has no TF32 mode; timing FP32 only", backend.name)
    return ("fp32",)


def benchmark_micro(backend, size: int, repeat: int, engine: str = "slides") -> dict:
    """Median ms of one forward + backward + update step, in each math mode the backend has."""
    backend.set_engine(engine)
    network = build_micro_network(size, backend)
    inputs, targets = micro_data(size)
    x = Tensor.from_numpy(inputs.reshape(size, size, 1, 1), backend)  # (N, features, 1, 1)
    target = Tensor.from_numpy(targets, backend)  # (N, 10)

    def step():
        network.forward(x)
        network.backward(target)
        network.update(MICRO_LEARNING_RATE)

    section = {"size": size, "layers": list(micro_layer_sizes(size)), "repeat": repeat, "fp32": None, "tf32": None}
    for math in micro_maths(backend):
        with math_mode(backend, math):
            seconds = timed_calls(step, repeat, backend.synchronize, MICRO_WARMUP)
        section[math] = step_summary(seconds)
        log.info("micro %s %s: %.2f ms a step (%d × %d)", engine, math, section[math]["step_ms"], size, size)
    return section


@contextlib.contextmanager
def math_mode(backend, math: str):
    if not hasattr(backend, "set_math"):
        yield
        return
    backend.set_math(math)
    try:
        yield
    finally:
        backend.set_math("fp32")


# ---- original: scripts/train.py as a whole -----------------------------------------------------


def original_command(name: str, settings: dict, output: str, engine: str | None = None) -> list[str]:
    command = [sys.executable, *TRAINER, "--config", str(CONFIG_DIR / ORIGINAL_CONFIGS[name]),
               "--device", settings["device"], "--quiet", "--output", output]
    if settings["data_dir"] is not None:
        command += ["--data-dir", str(settings["data_dir"])]
    if engine is not None:
        command += ["--engine", engine]
    return command


def trainer_environment(package_parent: Path = PACKAGE_PARENT) -> dict | None:
    """The environment of the trainer's process, so that it imports this very cudnnnet: unchanged
    (None) where the package is installed in a site-packages folder; otherwise (a checkout run
    through scripts/, which puts the checkout on sys.path) with ``package_parent`` first on PYTHONPATH."""
    paths = sysconfig.get_paths()
    site_folders = {Path(folder).resolve() for folder in (*site.getsitepackages(), paths["purelib"], paths["platlib"])}
    if package_parent.resolve() in site_folders:
        return None
    inherited = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(package_parent), inherited)))}


def run_original_once(name: str, settings: dict, engine: str | None = None) -> tuple[float, float]:
    """(wall-clock seconds, test accuracy) of one run of the original workload ``name``."""
    with tempfile.TemporaryDirectory(prefix="cudnnnet-original-") as output:
        command = original_command(name, settings, output, engine)
        environment = trainer_environment()
        started = time.perf_counter()
        finished = subprocess.run(command, capture_output=True, text=True, env=environment)
        seconds = time.perf_counter() - started
        if finished.returncode != 0:
            last = (finished.stderr.strip().splitlines() or ["no output"])[-1]
            reason = last.split(": error: ", 1)[-1]  # the trainer's own message, without its program name
            raise BenchmarkError(f"original {name}: the training process ({ORIGINAL_CONFIGS[name]}, --device "
                                 f"{settings['device']}) failed with exit code {finished.returncode}: {reason}")
        metrics = json.loads((Path(output) / "metrics.json").read_text(encoding="utf-8"))
    return seconds, metrics["test_accuracy"]


def uncompiled_packages(names=PROCESS_IMPORTS, dont_write: bool | None = None) -> list[str]:
    """The packages among ``names`` that a new process must compile from source every time: their
    ``__init__.py`` has no cached bytecode and writing it is turned off (``sys.dont_write_bytecode``,
    which PYTHONDONTWRITEBYTECODE sets and subprocesses inherit). Packages not installed are left out."""
    if not (sys.flags.dont_write_bytecode if dont_write is None else dont_write):
        return []
    uncompiled = []
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        origin = spec.origin if spec is not None else None
        if origin and origin.endswith(".py") and not Path(importlib.util.cache_from_source(origin)).exists():
            uncompiled.append(name)
    return uncompiled


def benchmark_original(name: str, settings: dict, engine: str | None = None) -> dict:
    runs = []
    for run_number in range(1, settings["original_runs"] + 1):
        log.info("original %s: run %d of %d, a whole training process on %s%s", name, run_number,
                 settings["original_runs"], settings["device"], f" ({engine} engine)" if engine else "")
        runs.append(run_original_once(name, settings, engine))
        log.info("original %s: run %d took %.2f s (test accuracy %.4f)", name, run_number, *runs[-1])
    seconds = [run[0] for run in runs]
    summary = {"config": f"configs/{ORIGINAL_CONFIGS[name]}", "seconds": statistics.median(seconds),
               "seconds_all": seconds, "test_accuracy": runs[-1][1]}
    log.info("original %s %s: %.2f s for the whole process, test accuracy %.4f", name, engine or "", summary["seconds"],
             summary["test_accuracy"])
    return summary


# ---- PyTorch, for comparison -------------------------------------------------------------------


def compare_torch(settings: dict) -> dict | None:
    """The mlp, cnn and micro workloads with PyTorch on the GPU; None (with a warning) where it cannot run."""
    if settings["device"] != "cuda":
        log.warning("--compare torch: only with --device cuda; no comparison")
        return None
    try:
        import torch
    except ImportError as error:
        log.warning("--compare torch: PyTorch cannot be imported (%s); no comparison", error)
        return None
    if not torch.cuda.is_available():
        log.warning("--compare torch: PyTorch %s sees no CUDA GPU; no comparison", torch.__version__)
        return None
    results = {"version": torch.__version__, "cudnn": torch.backends.cudnn.version()}
    for name in ("mlp", "cnn", "micro"):
        if name in settings["workloads"]:
            results[name] = _torch_workload(torch, name, settings)
    return results


def _torch_workload(torch, name: str, settings: dict) -> dict | None:
    try:
        if name == "micro":
            return torch_micro(torch, settings["micro_size"], settings["repeat"], MATHS, "cuda")
        config = workload_config(name, settings["device"], settings["data_dir"], 1, False)
        return torch_training(torch, name, config, settings["epochs"], settings["limit_images"], "cuda")
    except (RuntimeError, BenchmarkError) as error:
        log.error("--compare torch: %s failed with PyTorch: %s", name, " ".join(str(error).split()))
        return None


def set_torch_math(torch, math: str) -> None:
    allow = math == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow


def torch_synchronizer(torch, device: str):
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def torch_layer(nn, spec, shape: tuple[int, int, int]):
    """The PyTorch module computing the same as the layer ``spec`` on samples of ``shape``."""
    params = spec.params
    if spec.type == "dense":
        return nn.Sequential(nn.Flatten(), nn.Linear(prod(shape), params["out_size"]))
    if spec.type == "conv2d":
        return nn.Conv2d(shape[0], params["out_channels"], params["kernel_size"], params["stride"],
                         params["padding"], params["dilation"])
    if spec.type == "pooling":
        pool = nn.MaxPool2d if params["mode"] == "max" else nn.AvgPool2d
        return pool(params["kernel_size"], params["stride"], params["padding"])
    if spec.type == "activation":
        return torch_activation(nn, params["mode"], params["coef"])
    raise BenchmarkError(f"layer {spec.name!r}: no PyTorch equivalent of a {spec.type} layer before the loss")


def torch_activation(nn, mode: str, coef: float):
    if mode == "clipped_relu":
        return nn.Hardtanh(0.0, coef)
    if mode == "elu":
        return nn.ELU(coef)
    return {"relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh}[mode]()


def torch_model(torch, config: Config):
    """(model, loss(outputs, labels)) for a config's model, its last layer the loss."""
    shape, modules = training.input_shape(config), []
    for spec in config.model[:-1]:
        modules.append(torch_layer(torch.nn, spec, shape))
        shape = LAYER_TYPES[spec.type](spec.name, **spec.params).output_sample_shape(shape)
    functional = torch.nn.functional
    if config.model[-1].type == "softmax":
        return torch.nn.Sequential(*modules), functional.cross_entropy

    def quadratic(outputs, labels):
        onehot = functional.one_hot(labels, outputs.shape[1]).to(outputs.dtype)
        return 0.5 * (outputs - onehot).pow(2).sum() / outputs.shape[0]

    return torch.nn.Sequential(*modules), quadratic


def torch_optimizer(torch, model, config: Config):
    opt = config.train.optimizer
    return torch.optim.SGD(model.parameters(), lr=opt.lr, momentum=opt.momentum, weight_decay=opt.weight_decay)


def torch_capture(torch, step):
    """``step`` recorded as a CUDA graph, after three warm-up calls on a side stream (PyTorch's recipe).

    ``step`` sets the gradients to None before its backward pass, so the captured backward writes
    them into the graph's own memory instead of accumulating into tensors from outside it.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


class TorchTraining:
    """SGD steps on a data set held on the device, batches picked by a device permutation."""

    def __init__(self, torch, config: Config, images: np.ndarray, labels: np.ndarray, device: str):
        self.torch, self.device, self.count = torch, device, len(labels)
        self.model, self.loss = torch_model(torch, config)
        self.model.to(device)
        self.optimizer = torch_optimizer(torch, self.model, config)
        self.images = torch.from_numpy(images).to(device)  # (N, 1, H, W)
        self.labels = torch.from_numpy(labels).to(device)  # (N,)
        self.graphs: dict[int, tuple] = {}

    def step(self, index) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        outputs = self.model(self.images.index_select(0, index))
        self.loss(outputs, self.labels.index_select(0, index)).backward()
        self.optimizer.step()

    def batches(self):
        order = self.torch.randperm(self.count, device=self.device)
        return [order[start:start + BATCH_SIZE] for start in range(0, self.count, BATCH_SIZE)]

    def eager_epoch(self) -> None:
        for index in self.batches():
            self.step(index)

    def capture(self) -> None:
        """One graph per batch size of an epoch (the full batch and the last, shorter one)."""
        for size in sorted({len(index) for index in self.batches()}):
            static_index = self.torch.arange(size, device=self.device)
            self.graphs[size] = (torch_capture(self.torch, functools.partial(self.step, static_index)), static_index)

    def graph_epoch(self) -> None:
        for index in self.batches():
            graph, static_index = self.graphs[len(index)]
            static_index.copy_(index)
            graph.replay()


def torch_training(torch, name: str, config: Config, epochs: int, limit: int | None, device: str) -> dict:
    """Median epoch ms of ``config``'s workload with PyTorch, eager and (on CUDA) CUDA graphs."""
    set_torch_math(torch, "fp32")
    images, labels = training.load_split(config, "train")
    images, labels = images[:limit], labels[:limit]
    run = TorchTraining(torch, config, np.ascontiguousarray(images), np.ascontiguousarray(labels), device)
    synchronize = torch_synchronizer(torch, device)
    results = {"eager": epoch_summary(timed_calls(run.eager_epoch, epochs, synchronize, 1), run.count)}
    if device == "cuda":
        run.capture()
        results["graph"] = epoch_summary(timed_calls(run.graph_epoch, epochs, synchronize, 1), run.count)
    for mode, summary in results.items():
        log.info("torch %s %s: %.2f ms an epoch", name, mode, summary["epoch_ms"])
    return results


def torch_micro(torch, size: int, repeat: int, maths, device: str) -> dict:
    """Median ms of the micro-benchmark step with PyTorch, eager and (on CUDA) as a CUDA graph."""
    features, hidden1, hidden2, outputs = micro_layer_sizes(size)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(features, hidden1), nn.Tanh(), nn.Linear(hidden1, hidden2), nn.Sigmoid(),
                          nn.Linear(hidden2, outputs), nn.Sigmoid()).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=MICRO_LEARNING_RATE)
    inputs, targets = (torch.from_numpy(array).to(device) for array in micro_data(size))

    def step():
        optimizer.zero_grad(set_to_none=True)
        (0.5 * (model(inputs) - targets).pow(2).sum() / size).backward()
        optimizer.step()

    synchronize = torch_synchronizer(torch, device)
    results = {}
    for math in maths:
        set_torch_math(torch, math)
        calls = {"eager": step}
        if device == "cuda":
            calls["graph"] = torch_capture(torch, step).replay
        results[math] = {mode: step_summary(timed_calls(call, repeat, synchronize, MICRO_WARMUP))
                         for mode, call in calls.items()}
    set_torch_math(torch, "fp32")
    return results


# ---- the report --------------------------------------------------------------------------------


def versions(backend) -> dict:
    found = {"cudnnnet": __version__, "python": platform.python_version(), "numpy": np.__version__}
    context = getattr(backend, "context", None)
    if context is None:
        return found
    try:
        from ..backends.cuda.bindings import cublas, runtime

        found.update(cuda_runtime=runtime.runtime_get_version(), cuda_driver=runtime.driver_get_version(),
                     cudnn=context.cudnn_version, cublas=cublas.get_version(context.cublas.handle))
    except (ImportError, AttributeError, CudnnnetError) as error:
        log.info("library versions not available: %s", error)
    return found


def _get(mapping, *keys):
    for key in keys:
        if not isinstance(mapping, dict) or mapping.get(key) is None:
            return None
        mapping = mapping[key]
    return mapping


def _row(workload: str, unit: str, ours: dict, torch_eager=None, torch_graph=None, ratio_of=None,
         targets: dict | None = None) -> dict:
    """One table row: ``ours`` and ``targets`` by engine name."""
    row = {"workload": workload, "unit": unit}
    row.update({engine: ours.get(engine) for engine in ENGINES})
    row.update(torch_eager=torch_eager, torch_graph=torch_graph)
    for engine in ENGINES:
        value = ours.get(engine)
        row[f"ratio_{engine}"] = ratio_of / value if ratio_of is not None and value else None
    for engine in ENGINES:
        row[f"target_{engine}"] = (targets or {}).get(engine)
        row[f"status_{engine}"] = None
    return row


def _in_column(mode: str, value) -> tuple:
    """(torch eager, torch graph) cells holding ``value`` in ``mode``'s column."""
    return (None, value) if mode == "graph" else (value, None)


def _by_engine(sections: dict, *keys) -> dict:
    """{engine: the value at ``keys`` in that engine's results} for the engines that have one."""
    found = {engine: _get(section, *keys) for engine, section in sections.items()}
    return {engine: value for engine, value in found.items() if value is not None}


def training_rows(name: str, sections: dict, torch_results) -> list[dict]:
    """Rows of ``name`` (mlp or cnn) from ``sections`` ({engine: its section})."""
    rows = []
    has_graph = any(section["graph"] is not None for section in sections.values())
    target_mode = "graph" if has_graph else "eager"
    for mode in ("graph", "eager"):
        epochs = _by_engine(sections, mode, "epoch_ms")
        if not epochs:
            continue
        theirs = _get(torch_results, name, mode, "epoch_ms")
        targets = {}
        if mode == target_mode:
            targets = {"fast": TARGETS[f"{name}_epoch_ms"],
                       "slides": _get(torch_results, name, "graph", "epoch_ms") or SLIDES_TARGETS[f"{name}_epoch_ms"]}
        rows.append(_row(f"{name} epoch, {mode}", "ms", epochs, *_in_column(mode, theirs), theirs, targets))
        rate = _get(torch_results, name, mode, "images_per_second")
        rows.append(_row(f"{name} throughput, {mode}", "img/s", _by_engine(sections, mode, "images_per_second"),
                         *_in_column(mode, rate)))
        memory = _by_engine(sections, mode, "peak_memory_mib")
        if memory:
            rows.append(_row(f"{name} peak memory, {mode}", "MiB", memory))
    return rows


def micro_rows(sections: dict, torch_results) -> list[dict]:
    rows = []
    size = next(iter(sections.values()))["size"]
    for math in MATHS:
        steps = _by_engine(sections, math, "step_ms")
        if not steps:
            continue
        eager = _get(torch_results, "micro", math, "eager", "step_ms")
        graph = _get(torch_results, "micro", math, "graph", "step_ms")
        rows.append(_row(f"micro {math} step ({size})", "ms", steps, eager, graph, eager,
                         {"fast": TARGETS[f"micro_{math}_ms"]}))
    return rows


def original_rows(sections: dict) -> list[dict]:
    rows = []
    names = next(iter(sections.values()))
    for name in names:
        rows.append(_row(f"original {name}, whole process", "s", _by_engine(sections, name, "seconds"),
                         targets={"fast": TARGETS[f"original_{name}_s"]}))
        accuracy = {engine: 100.0 * value for engine, value in _by_engine(sections, name, "test_accuracy").items()}
        rows.append(_row(f"original {name}, test accuracy", "%", accuracy))
    return rows


def judge(rows: list[dict], applicable: bool) -> None:
    """Mark each engine's cell that has a target PASS or MISS, or n/a where the run is not the target's workload."""
    for row in rows:
        for engine in ENGINES:
            target, value = row[f"target_{engine}"], row[engine]
            if target is not None and value is not None:
                row[f"status_{engine}"] = ("PASS" if value <= target else "MISS") if applicable else "n/a"


def table_rows(results: dict, torch_results, settings: dict) -> list[dict]:
    """The table from ``results`` ({engine: {workload: section}})."""
    on_gpu = settings["device"] == "cuda"
    rows = []

    def sections(name: str) -> dict:
        return {engine: found[name] for engine, found in results.items() if name in found}

    for name in ("mlp", "cnn"):
        if sections(name):
            section_rows = training_rows(name, sections(name), torch_results)
            judge(section_rows, on_gpu and settings["limit_images"] is None)
            rows += section_rows
    if sections("micro"):
        section_rows = micro_rows(sections("micro"), torch_results)
        judge(section_rows, on_gpu and settings["micro_size"] == MICRO_SIZE)
        rows += section_rows
    if sections("original"):
        section_rows = original_rows(sections("original"))
        judge(section_rows, on_gpu)
        rows += section_rows
    return rows


def _cell(value, unit: str | None = None) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if unit == "img/s":
        return f"{value:,.0f}"
    if unit == "ratio":
        return f"{value:.2f}x"
    return f"{value:,.2f}" if abs(value) < 1000 else f"{value:,.0f}"


COLUMNS = ("workload", "unit", *ENGINES, "torch eager", "torch graph", *(f"torch/{engine}" for engine in ENGINES),
           *(f"{engine} target" for engine in ENGINES), f"status ({'/'.join(ENGINES)})")


def _target_cell(target) -> str:
    return "-" if target is None else f"<= {target:g}"


def _status_cell(row: dict) -> str:
    statuses = [row[f"status_{engine}"] for engine in ENGINES]
    return "-" if not any(statuses) else "/".join(status or "-" for status in statuses)


def format_table(rows: list[dict], header: str) -> str:
    cells = [COLUMNS] + [
        (row["workload"], row["unit"], *(_cell(row[engine], row["unit"]) for engine in ENGINES),
         _cell(row["torch_eager"], row["unit"]), _cell(row["torch_graph"], row["unit"]),
         *(_cell(row[f"ratio_{engine}"], "ratio") for engine in ENGINES),
         *(_target_cell(row[f"target_{engine}"]) for engine in ENGINES), _status_cell(row))
        for row in rows
    ]
    widths = [max(len(line[column]) for line in cells) for column in range(len(COLUMNS))]
    lines = ["  ".join(text.ljust(width) if column < 2 else text.rjust(width)
                       for column, (text, width) in enumerate(zip(line, widths))) for line in cells]
    return "\n".join([header, lines[0], "-" * len(lines[0])] + lines[1:])


def table_header(report: dict) -> str:
    versions_text = ", ".join(f"{key} {value}" for key, value in report["versions"].items())
    device = report["device"] if report["backend"] in report["device"] else f"{report['device']} ({report['backend']})"
    lines = [f"device: {device}; {versions_text}",
             "slides, fast: cudnnnet's engines (cudnnnet.engine); torch/ENGINE: PyTorch's time over that "
             "engine's in the same mode (> 1: cudnnnet is faster); "
             f"targets are for an {TARGET_DEVICE}, the slides engine's graph epochs PyTorch's captured graph"]
    if report["backend"] == "cuda" and TARGET_DEVICE not in report["device"]:
        lines.append(f"note: this GPU is not an {TARGET_DEVICE}, so PASS/MISS compares it with another GPU's targets")
    uncompiled = report.get("uncompiled_packages")
    if uncompiled:
        lines.append(f"note: {', '.join(uncompiled)} have no cached bytecode and PYTHONDONTWRITEBYTECODE is set, "
                     "so each whole-process run compiled their source; python -m compileall on them (as pip "
                     "install does) removes that time")
    return "\n".join(lines)


# ---- the run -----------------------------------------------------------------------------------


def measure_original(settings: dict) -> dict:
    """The original workloads of each engine ({engine: {name: summary}}), run before this process
    touches the GPU (its subprocesses have it alone)."""
    if settings["device"] == "host":
        log.info("original on the host: each run trains 1600 steps of batch 256 with NumPy (minutes for the cnn)")
    return {engine: {name: benchmark_original(name, settings, engine) for name in ORIGINAL_CONFIGS}
            for engine in settings["engines"]}


def measure(settings: dict, backend) -> dict:
    """The in-process workloads asked for, in order: mlp, cnn, micro, for each engine: {engine: {name: section}}."""
    results = {}
    for engine in settings["engines"]:
        found = results[engine] = {}
        for name in ("mlp", "cnn"):
            if name in settings["workloads"]:
                found[name] = training_section(name, settings, backend, engine)
        if "micro" in settings["workloads"]:
            found["micro"] = benchmark_micro(backend, settings["micro_size"], settings["repeat"], engine)
    return results


def build_report(settings: dict) -> dict:
    log.info("benchmarking %s on %s", ", ".join(settings["workloads"]), settings["device"])
    original = measure_original(settings) if "original" in settings["workloads"] else None
    backend = get_backend(settings["device"])
    log.info("device: %s", backend.device_name)
    results = measure(settings, backend)
    for engine, found in (original or {}).items():
        results[engine]["original"] = found
    torch_results = compare_torch(settings) if settings["compare"] == "torch" else None
    found = versions(backend)
    if torch_results is not None:
        found.update(torch=torch_results["version"], torch_cudnn=torch_results["cudnn"])
    report = {"device": backend.device_name, "backend": backend.name,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "versions": found, "settings": settings, "targets": dict(TARGETS), "results": results,
              "torch": torch_results, "uncompiled_packages": uncompiled_packages() if original is not None else []}
    report["table"] = table_rows(results, torch_results, settings)
    return report


def main_with_args(args) -> int:
    report = build_report(resolve_settings(args))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        log.info("wrote %s", args.json)
    print(format_table(report["table"], table_header(report)))
    return 0


def main(argv=None) -> int:
    return run(main_with_args, build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
