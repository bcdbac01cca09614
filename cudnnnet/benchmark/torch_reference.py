"""PyTorch, for comparison: the same workloads in the same process, eager and captured in a CUDA graph.

The captured step is the whole training step: the batch gathered from the data set on the device
(and augmented there, with the device's random numbers, where the config augments), forward, loss,
backward and the optimiser's step. The workloads judged against PyTorch (``TORCH_SPEED_UPS``) run
with cuDNN's autotuner on (``cudnn.benchmark``) and are timed as captured graphs only on CUDA."""

from __future__ import annotations

import functools
import gc
import logging
from math import prod

import numpy as np

from ..config.schema import Config
from ..layers import LAYER_TYPES
from ..precision import get_precision
from ..train import trainer as training
from .measuring import epoch_summary, steady_state, step_summary, timed_calls
from .settings import (GRAPH_ONLY, MATHS, MIB, MICRO_LEARNING_RATE, MICRO_WARMUP, MICRO_WARMUP_SECONDS, STEADY_REPLAYS,
                       STEADY_SECONDS, TORCH_SPEED_UPS, TRAINING_CONFIGS, BenchmarkError)
from .workloads import augmentation, data_dir, micro_data, micro_layer_sizes, workload_config

log = logging.getLogger(__name__)


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
    for name in (*TRAINING_CONFIGS, "micro"):
        if name in settings["workloads"]:
            results[name] = _torch_workload(torch, name, settings)
    return results


def _torch_workload(torch, name: str, settings: dict) -> dict | None:
    try:
        if name == "micro":
            return torch_micro(torch, settings["micro_size"], settings["repeat"], MATHS, "cuda",
                               (settings["steady_seconds"], settings["steady_replays"]))
        config = workload_config(name, settings["device"], data_dir(name, settings), 1, False,
                                 math=settings.get("math", "fp32"))
        return torch_training(torch, name, config, settings["epochs"], settings["limit_images"], "cuda")
    except (RuntimeError, BenchmarkError) as error:
        log.error("--compare torch: %s failed with PyTorch: %s", name, " ".join(str(error).split()))
        return None


def set_torch_math(torch, math: str) -> None:
    allow = get_precision(math).tensor_cores
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
                         params["padding"], params["dilation"], bias=params.get("bias", True))
    if spec.type == "pooling":
        pool = nn.MaxPool2d if params["mode"] == "max" else nn.AvgPool2d
        return pool(params["kernel_size"], params["stride"], params["padding"])
    if spec.type == "activation":
        return torch_activation(nn, params["mode"], params["coef"])
    if spec.type == "batchnorm":  # spatial after a convolution, per value after a Dense layer
        planes = shape[1] * shape[2] > 1
        return (nn.BatchNorm2d if planes else nn.BatchNorm1d)(shape[0], eps=params.get("eps", 1e-5),
                                                              momentum=params.get("momentum", 0.1))
    if spec.type == "dropout":
        return nn.Dropout(params.get("rate", 0.5))
    if spec.type == "global_average_pooling":
        return nn.AdaptiveAvgPool2d(1)
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
    if opt.name in ("adam", "adamw"):
        adam = torch.optim.AdamW if opt.name == "adamw" else torch.optim.Adam
        on_gpu = next(model.parameters()).is_cuda  # a captured graph needs the step count on the device
        return adam(model.parameters(), lr=opt.lr, betas=tuple(opt.betas), eps=opt.eps, weight_decay=opt.weight_decay,
                    capturable=on_gpu)
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


class TorchAugment:
    """The config's augmentation on a batch on the device, graph-capturable: per sample, dy and dx
    uniform integers in [-p, p] and a horizontal flip with probability 1/2 (the device's generator),

        out[b, c, y, x] = in[b, c, y + dy, xs + dx],  xs = W - 1 - x if flipped else x,

    0 outside the image (the images are normalised already, so 0 is the mean). One padding and one
    indexing kernel move the pixels; the indices come from a few kernels over (N, H) and (N, W)."""

    def __init__(self, torch, padding: int, flip: bool, shape, device: str):
        self.torch, self.padding, self.flip = torch, padding, flip
        _, height, width = shape
        self.rows = torch.arange(height, device=device)  # (H,) y
        self.columns = torch.arange(width, device=device)  # (W,) x
        self.mirrored = width - 1 - self.columns  # (W,) W - 1 - x
        self.channels = torch.arange(shape[0], device=device)[None, :, None, None]  # (1, C, 1, 1)

    def __call__(self, x):
        torch, p = self.torch, self.padding
        n = x.shape[0]
        padded = torch.nn.functional.pad(x, (p, p, p, p))  # (N, C, H + 2p, W + 2p), zeros around
        shifts = torch.randint(0, 2 * p + 1, (2, n, 1), device=x.device)  # dy + p, dx + p: (2, N, 1)
        columns = self.columns.expand(n, -1)  # (N, W)
        if self.flip:
            flipped = torch.randint(0, 2, (n, 1), device=x.device, dtype=torch.bool)  # (N, 1)
            columns = torch.where(flipped, self.mirrored, self.columns)
        rows = self.rows + shifts[0]  # (N, H): y + dy + p
        columns = columns + shifts[1]  # (N, W): xs + dx + p
        samples = torch.arange(n, device=x.device)[:, None, None, None]  # (N, 1, 1, 1)
        return padded[samples, self.channels, rows[:, None, :, None], columns[:, None, None, :]]


class TorchTraining:
    """SGD steps on a data set held on the device, batches picked by a device permutation, augmented
    on the device where the config augments (``augmentation``). In the config's math (bf16 and fp16
    under autocast: 16-bit matmuls and convolutions, FP32 weights), or with ``pure_bf16`` PyTorch's
    pure bfloat16: the model (its weights, and so its optimiser's state) and the data set in
    bfloat16, the loss in FP32 from the bfloat16 outputs."""

    def __init__(self, torch, config: Config, images: np.ndarray, labels: np.ndarray, device: str,
                 pure_bf16: bool = False):
        self.torch, self.device, self.count = torch, device, len(labels)
        self.batch_size = config.train.batch_size
        self.model, self.loss = torch_model(torch, config)
        self.model.to(device)
        self.images = torch.from_numpy(images).to(device)  # (N, C, H, W)
        if pure_bf16:
            self.model.to(torch.bfloat16)
            self.images = self.images.to(torch.bfloat16)
        self.optimizer = torch_optimizer(torch, self.model, config)
        self.labels = torch.from_numpy(labels).to(device)  # (N,)
        augment = augmentation(config)
        self.augment = augment and TorchAugment(torch, augment["crop_padding"], augment["flip"], images.shape[1:],
                                                device)
        self.graphs: dict[int, tuple] = {}
        self.autocast = None if pure_bf16 else autocast_type(torch, config.math)

    def step(self, index) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        x = self.images.index_select(0, index)
        if self.augment:
            x = self.augment(x)
        with self.torch.autocast(self.device, dtype=self.autocast or self.torch.bfloat16,
                                 enabled=self.autocast is not None):
            outputs = self.model(x)
        self.loss(outputs.float(), self.labels.index_select(0, index)).backward()
        self.optimizer.step()

    def batches(self):
        order = self.torch.randperm(self.count, device=self.device)
        return [order[start:start + self.batch_size] for start in range(0, self.count, self.batch_size)]

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


def autocast_type(torch, math: str):
    """The type PyTorch's autocast computes ``math`` in (bf16, fp16), or None for FP32 and TF32. fp16 runs without
    a GradScaler: its overflow check reads the device back, which no CUDA graph can hold."""
    dtype = get_precision(math).operand_dtype
    return None if dtype is None else getattr(torch, dtype.name)


def torch_training(torch, name: str, config: Config, epochs: int, limit: int | None, device: str) -> dict:
    """Median epoch ms of ``config``'s workload with PyTorch in its math, eager and (on CUDA) CUDA
    graphs; GRAPH_ONLY workloads on CUDA as graphs only. On CUDA in math bf16, PyTorch's pure bfloat16
    too ("pure_bf16_graph", ``TorchTraining``), as a captured graph."""
    set_torch_math(torch, config.math)
    autotuned = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = autotuned or name in TORCH_SPEED_UPS
    try:
        images, labels = training.load_split(config, "train")
        images, labels = np.ascontiguousarray(images[:limit]), np.ascontiguousarray(labels[:limit])
        modes = ("eager",) if device != "cuda" else ("graph",) if name in GRAPH_ONLY else ("eager", "graph")
        memory = TorchMemory(torch, device)
        results = timed_epochs(TorchTraining(torch, config, images, labels, device), modes, epochs, memory)
        if device == "cuda" and config.math == "bf16":
            memory = TorchMemory(torch, device)
            pure = TorchTraining(torch, config, images, labels, device, pure_bf16=True)
            results["pure_bf16_graph"] = timed_epochs(pure, ("graph",), epochs, memory)["graph"]
    finally:
        torch.backends.cudnn.benchmark = autotuned
        set_torch_math(torch, "fp32")
    for mode, summary in results.items():
        log.info("torch %s %s: %.2f ms an epoch", name, mode, summary["epoch_ms"])
    return results


def timed_epochs(run: TorchTraining, modes, epochs: int, memory: TorchMemory) -> dict:
    """{mode: the median of ``epochs`` epochs of ``run`` after a warm-up one, with the peak memory of that
    mode (``memory``, started before ``run`` was made)} for each of ``modes``: eager, or graph (captured
    first)."""
    synchronize = torch_synchronizer(run.torch, run.device)
    results = {}
    for mode in modes:
        memory.reset_peak()
        if mode == "graph":
            run.capture()
        epoch = run.graph_epoch if mode == "graph" else run.eager_epoch
        results[mode] = {**epoch_summary(timed_calls(epoch, epochs, synchronize, 1), run.count),
                         "peak_memory_mib": memory.peak_mib()}
    return results


class TorchMemory:
    """PyTorch's peak device memory above what it had allocated when this was made:
    torch.cuda.max_memory_allocated (the tensors its allocator hands out, a captured graph's pool
    included; not its allocator's cache, the CUDA context or the libraries' handles). None off CUDA."""

    def __init__(self, torch, device: str):
        self.cuda = torch.cuda if device == "cuda" else None
        if self.cuda is not None:
            gc.collect()  # the runs before this one let go of their tensors
            self.baseline = self.cuda.memory_allocated()

    def reset_peak(self) -> None:
        if self.cuda is not None:
            self.cuda.reset_peak_memory_stats()

    def peak_mib(self) -> float | None:
        return None if self.cuda is None else (self.cuda.max_memory_allocated() - self.baseline) / MIB


def torch_micro_model(torch, size: int, device: str):
    """The micro-benchmark's network in PyTorch: Linear → Tanh → Linear → Sigmoid → Linear → Sigmoid."""
    features, hidden1, hidden2, outputs = micro_layer_sizes(size)
    nn = torch.nn
    return nn.Sequential(nn.Linear(features, hidden1), nn.Tanh(), nn.Linear(hidden1, hidden2), nn.Sigmoid(),
                         nn.Linear(hidden2, outputs), nn.Sigmoid()).to(device)


def pure_bf16_micro_step(torch, size: int, device: str):
    """(model, step): the micro step in PyTorch's pure bfloat16, a model of its own with bfloat16 weights
    (SGD updates them in bfloat16) on bfloat16 inputs, the loss in FP32 from the bfloat16 outputs."""
    model = torch_micro_model(torch, size, device).to(torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=MICRO_LEARNING_RATE)
    inputs, targets = (torch.from_numpy(array).to(device) for array in micro_data(size))
    inputs = inputs.to(torch.bfloat16)  # (N, features)

    def step():
        optimizer.zero_grad(set_to_none=True)
        outputs = model(inputs)  # (N, 10) bfloat16
        (0.5 * (outputs.float() - targets).pow(2).sum() / size).backward()
        optimizer.step()

    return model, step


def torch_micro(torch, size: int, repeat: int, maths, device: str,
                steady: tuple[float, int] = (STEADY_SECONDS, STEADY_REPLAYS)) -> dict:
    """Median ms of the micro-benchmark step with PyTorch, eager and (on CUDA) as a CUDA graph, the
    graph also at steady state (``steady``: seconds of untimed replays, timed replays); in bf16 on
    CUDA, PyTorch's pure bfloat16 step too (``pure_bf16_micro_step``), as a graph and at steady state."""
    model = torch_micro_model(torch, size, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=MICRO_LEARNING_RATE)
    inputs, targets = (torch.from_numpy(array).to(device) for array in micro_data(size))

    def step(bf16: bool):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            outputs = model(inputs)
        (0.5 * (outputs.float() - targets).pow(2).sum() / size).backward()
        optimizer.step()

    synchronize = torch_synchronizer(torch, device)
    warmup_seconds = MICRO_WARMUP_SECONDS if device == "cuda" else 0.0
    results = {}
    for math in maths:
        set_torch_math(torch, math)
        math_step = functools.partial(step, math == "bf16")  # bf16: autocast, FP32 weights and loss
        found = results[math] = {
            "eager": step_summary(timed_calls(math_step, repeat, synchronize, MICRO_WARMUP, warmup_seconds))}
        if device != "cuda":
            continue
        graphs = {"graph": math_step}
        if math == "bf16":
            graphs["pure_bf16_graph"] = pure_bf16_micro_step(torch, size, device)[1]
        for mode, graph_step in graphs.items():
            replay = torch_capture(torch, graph_step).replay
            found[mode] = step_summary(timed_calls(replay, repeat, synchronize, MICRO_WARMUP, warmup_seconds))
            found[f"{mode}_steady"] = steady_state(replay, synchronize, *steady)
    set_torch_math(torch, "fp32")
    return results
