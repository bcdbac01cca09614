"""The in-process workloads: mlp, cnn, bn_cnn and cifar10 (one Trainer per mode and engine) and
micro (the "Deep Learning from Scratch to GPU" step). cifar10 trains on generated images written
as CIFAR-10's binary records (``generated_data``), so it reads them as the config's data set."""

from __future__ import annotations

import contextlib
import gc
import logging
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..backends import get_backend
from ..config.schema import Config, load_config, parse_config
from ..config.shipped import CONFIG_DIR
from ..data.sources import CIFAR10_CLASSES, CIFAR10_FILES
from ..layers import MSE, Activation, Dense
from ..network import Network
from ..tensor import Tensor
from ..train import trainer as training
from ..train.trainer import Trainer
from .measuring import DeviceMemory, epoch_summary, steady_state, step_summary, timed_calls
from .settings import (BATCH_SIZE, CONFIG_BATCH, GENERATED_DATA, GENERATED_SEED, GRAPH_ONLY, MATHS, MICRO_LEARNING_RATE,
                       MICRO_SEED, MICRO_SIZE, MICRO_WARMUP, MICRO_WARMUP_SECONDS, STEADY_REPLAYS, STEADY_SECONDS,
                       TRAINING_CONFIGS)

log = logging.getLogger(__name__)


# ---- mlp and cnn: the Trainer -----------------------------------------------------------------


def workload_config(name: str, device: str, data_dir, epochs: int, graph: bool, engine: str = "slides",
                    math: str = "fp32") -> Config:
    """The config file's model, data settings and optimiser in ``math`` (FP32 unless asked), at batch
    256 (the config's own for CONFIG_BATCH workloads), with ``epochs`` planned epochs."""
    config = load_config(CONFIG_DIR / TRAINING_CONFIGS[name])
    batch_size = config.train.batch_size if name in CONFIG_BATCH else BATCH_SIZE
    config = config.with_overrides(epochs=epochs, batch_size=batch_size, device=device, data_dir=data_dir,
                                   engine=engine)
    raw = config.to_dict()
    raw["train"]["graph"] = graph
    raw["math"] = math
    return parse_config(raw, source=config.source)


def data_dir(name: str, settings: dict):
    """Where workload ``name`` reads its data: its generated folder (``generated_data``), else --data-dir."""
    return settings.get("generated_dirs", {}).get(name, settings["data_dir"])


def augmentation(config: Config) -> dict | None:
    """{crop_padding, flip} of the config's ``data.augment`` where it asks for any (a mapping or an
    object with those fields), else None: what the PyTorch reference then does too, so both sides
    train on the same kind of batch."""
    augment = getattr(config.data, "augment", None)
    if not augment:
        return None
    if isinstance(augment, Mapping):
        padding, flip = augment.get("crop_padding", 0), augment.get("flip", False)
    else:
        padding, flip = getattr(augment, "crop_padding", 0), getattr(augment, "flip", False)
    return {"crop_padding": int(padding), "flip": bool(flip)} if padding or flip else None


def write_cifar10_records(folder: Path, train: int, test: int, seed: int) -> Path:
    """CIFAR-10's binary files in ``folder`` holding ``train`` and ``test`` generated images (uniform
    pixels, labels 0..9, from ``seed``): data_batch_1..5.bin share the training images (at least one
    each), test_batch.bin holds the test images."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    files = CIFAR10_FILES["train"]
    parts = np.array_split(np.arange(max(train, len(files))), len(files))
    for name, part in [*zip(files, parts), (CIFAR10_FILES["test"][0], np.arange(max(test, 1)))]:
        labels = rng.integers(0, len(CIFAR10_CLASSES), (len(part), 1), dtype=np.uint8)
        pixels = rng.integers(0, 256, (len(part), 3 * 32 * 32), dtype=np.uint8)  # R, G, B planes of 32×32
        np.concatenate([labels, pixels], axis=1).tofile(folder / name)
    return folder


@contextlib.contextmanager
def generated_data(settings: dict):
    """``settings`` with ``generated_dirs`` {workload: folder} where a GENERATED_DATA workload is asked
    for: its images generated into a temporary folder (at most --limit-images of each split), removed
    afterwards."""
    names = [name for name in GENERATED_DATA if name in settings["workloads"]]
    if not names:
        yield settings
        return
    limit = settings["limit_images"]
    with tempfile.TemporaryDirectory(prefix="cudnnnet-benchmark-data-") as root:
        folders = {}
        for name in names:
            train, test = (count if limit is None else min(count, limit) for count in GENERATED_DATA[name])
            folders[name] = write_cifar10_records(Path(root) / name, train, test, GENERATED_SEED)
            log.info("%s: %d training and %d test images generated (seed %d)", name, train, test, GENERATED_SEED)
        yield {**settings, "generated_dirs": folders}


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
    config = workload_config(name, settings["device"], data_dir(name, settings), epochs + 1, graph, engine,
                             settings.get("math", "fp32"))
    backend = get_backend(config.device)
    gc.collect()
    memory = DeviceMemory(backend)
    with tempfile.TemporaryDirectory(prefix="cudnnnet-benchmark-") as output:
        trainer = Trainer(config, output, progress=False, image_limit=settings["limit_images"])
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
    elif name in GRAPH_ONLY:
        modes = ("graph",)
    config = workload_config(name, settings["device"], data_dir(name, settings), 1, False)
    images = training_images(config, settings["limit_images"])
    section = {"config": f"configs/{TRAINING_CONFIGS[name]}", "images": images, "batch_size": config.train.batch_size,
               "augment": augmentation(config), "graph": None, "eager": None}
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
    """The math modes of MATHS that the backend computes as such (the host has no TF32 mode)."""
    maths = tuple(math for math in MATHS if math in backend.maths)
    if len(maths) < len(MATHS):
        log.info("micro: the %s backend computes %s only; timing those", backend.name, ", ".join(maths))
    return maths


def benchmark_micro(backend, size: int, repeat: int, engine: str = "slides",
                    steady: tuple[float, int] = (STEADY_SECONDS, STEADY_REPLAYS)) -> dict:
    """Median ms of one forward + backward + update step in each math mode the backend has: eager
    (each call made from Python) and, where the backend has CUDA graphs, replayed as one captured
    graph (as PyTorch's step is timed too), that graph also at steady state (``steady``: seconds of
    untimed replays, timed replays; ``steady_state``). Under bf16 and fp16 the network stores 16-bit
    activations and is handed x in that dtype (``micro_input``)."""
    network = build_micro_network(size, backend).set_engine(engine)
    inputs, targets = micro_data(size)
    x = Tensor.from_numpy(inputs.reshape(size, size, 1, 1), backend)  # (N, features, 1, 1)
    target = Tensor.from_numpy(targets, backend)  # (N, 10)
    section = {"size": size, "layers": list(micro_layer_sizes(size)), "repeat": repeat,
               **{math: None for math in MATHS}}
    for math in micro_maths(backend):
        network.set_math(math)
        step = micro_step(network, micro_input(network, x), target)
        found = {"eager": step_summary(timed_calls(step, repeat, backend.synchronize, MICRO_WARMUP,
                                                   _warmup_seconds(backend))),
                 "graph": None, "graph_steady": None}
        if backend.supports_graphs:
            found["graph"], found["graph_steady"] = captured_steps(backend, step, repeat, steady)
        section[math] = found
        log.info("micro %s %s: %.2f ms a step eager%s (%d × %d)", engine, math, found["eager"]["step_ms"],
                 "" if found["graph"] is None else f", {found['graph']['step_ms']:.2f} ms as a graph, "
                 f"{found['graph_steady']['step_ms']:.2f} ms at steady state", size, size)
    return section


def micro_input(network: Network, x: Tensor) -> Tensor:
    """x in the dtype of the network's activations in its math: a 16-bit MLP is handed 16-bit inputs, as
    PyTorch's pure-bfloat16 column is (the float32 ones would be converted at every step)."""
    with network.settings():
        dtype = network.activation_dtype
    return x if x.dtype is dtype else x.to(dtype)


def micro_step(network: Network, x: Tensor, target: Tensor):
    """One forward + backward + SGD update of the micro network on ``x``."""
    def step():
        network.train_step(x, target, MICRO_LEARNING_RATE)
    return step


def captured_steps(backend, step, repeat: int, steady: tuple[float, int]) -> tuple[dict, dict]:
    """``step`` captured as a CUDA graph, then timed replaying it: (its step summary, its steady state).
    The eager steps before have allocated every buffer, timed every GEMM plan and made every bfloat16
    copy, which a capture cannot do."""
    with backend.capture() as graph:
        step()
    summary = step_summary(timed_calls(graph.launch, repeat, backend.synchronize, MICRO_WARMUP,
                                       _warmup_seconds(backend)))
    return summary, steady_state(graph.launch, backend.synchronize, *steady)


def _warmup_seconds(backend) -> float:
    """MICRO_WARMUP_SECONDS on a GPU (a backend with graphs); none on the host, whose clock does not drift so."""
    return MICRO_WARMUP_SECONDS if backend.supports_graphs else 0.0




def measure(settings: dict, backend) -> dict:
    """The in-process workloads asked for, in order: mlp, cnn, micro, for each engine: {engine: {name: section}}."""
    results = {}
    for engine in settings["engines"]:
        found = results[engine] = {}
        for name in TRAINING_CONFIGS:
            if name in settings["workloads"]:
                found[name] = training_section(name, settings, backend, engine)
        if "micro" in settings["workloads"]:
            found["micro"] = benchmark_micro(backend, settings["micro_size"], settings["repeat"], engine,
                                             (settings["steady_seconds"], settings["steady_replays"]))
    return results
