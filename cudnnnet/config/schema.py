"""YAML → typed, validated, frozen config.

A config file holds ``model`` (a list of layers, the last a loss layer), ``data``, ``train``,
``device``, ``math`` and ``engine`` (cudnnnet.engine: ``slides`` or ``fast``). ``load_config(path)``
reads it as ``yaml.safe_load`` does, within the limits of ``config_file``; ``parse_config(mapping)``
validates an already-loaded mapping (for example the copy a checkpoint
stores from ``Config.to_dict()``). Every problem is a ``ConfigError`` whose one-line message names
the file, the key path (``model[2].out_size``, ``train.optimizer.lr``) and what would be valid
(``config_section``); the model's layer entries are read by ``config_layers``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..augmentation import MAX_CROP_PADDING
from ..backends import DEVICES
from ..data.mnist import MNIST_MEAN, MNIST_STD
from ..data.pixels import MAX_IMAGE_PIXELS, RESIZE_MODES
from ..data.sources import DATASETS, MAX_CLASSES
from ..data.streamed import PLACEMENTS
from ..data.validation import parse_validation
from ..engine import DEFAULT_ENGINE, ENGINES
from ..errors import ConfigError
from ..optim.loss_scaling import (LOSS_SCALE_GROWTH_INTERVAL, LOSS_SCALE_INITIAL, MAX_GROWTH_INTERVAL, MAX_LOSS_SCALE,
                                  LossScaleConfig)
from ..optim.optimizers import OPTIMIZERS, OptimizerConfig
from ..optim.schedules import SCHEDULES, ScheduleConfig
from ..precision import DEFAULT_PRECISION, PRECISION_NAMES
from ..tensor import FLOAT32_TINY
from .layers import LayerSpec, parse_model
from .monitor import AUTO as AUTO_MONITOR, EarlyStoppingConfig, check_monitor, parse_early_stopping, parse_monitor
from .reader import read_yaml
from .section import _REQUIRED, _SHORT_REPR, _describe, _float32, _Section, _without_none
from .shipped import resolve_config

TOP_LEVEL_KEYS = ("model", "data", "train", "device", "math", "engine")  # a config file's sections


# ---- the typed config ----------------------------------------------------------------------


IDX_PATH_KEYS = ("train_images", "train_labels", "test_images", "test_labels")
NPZ_PATH_KEYS = ("train_file", "test_file")
CORRUPT_POLICIES = ("refuse", "skip")
LEGACY_RESIZE = "stretch"  # what image-folder training did before data.resize existed
COMPUTED = "computed"  # data.normalize: per-channel mean and std of the training set


@dataclass(frozen=True)
class AugmentConfig:
    """The training batches' augmentation (``augmentation.py``): a random crop of the image padded by
    ``crop_padding`` zeros on each side, and a horizontal flip of half of them where ``flip``."""

    crop_padding: int = 0
    flip: bool = False

    @property
    def active(self) -> bool:
        """Whether it changes any image (padding 0 without flips is the plain batch)."""
        return self.crop_padding > 0 or self.flip

    def to_dict(self) -> dict:
        return {"crop_padding": self.crop_padding, "flip": self.flip}


@dataclass(frozen=True)
class DataConfig:
    """Where the images come from (``dataset`` and its keys, see data/sources.py) and how they are prepared.

    ``classes`` and ``shape`` are known once the data is read: the Trainer fills them in, so a
    checkpoint's config names its classes and its input shape."""

    dataset: str = "mnist"
    dir: str | None = None
    normalize: tuple | str | None = None  # (mean, std), each one value or one per channel, after /255; or "computed"
    pad: int = 0
    placement: str = "auto"  # device: resident on the backend; host: streamed from host memory; auto: by size
    train_images: str | None = None  # idx: the four IDX files
    train_labels: str | None = None
    test_images: str | None = None
    test_labels: str | None = None
    train_file: str | None = None  # npz: archives of x and y
    test_file: str | None = None
    # {file name: MD5} checked before reading: idx, npz, and fashion-mnist / kmnist files (uncompressed ones too)
    md5: dict | None = field(default=None, hash=False)
    channels: str | int = "auto"  # image-folder: 1 (grey), 3 (RGB) or auto (3 when any image has colour)
    image_size: tuple[int, int] | None = None  # image-folder: resize every image to (height, width)
    test_fraction: float = 0.2  # image-folder without train/ and test/: the share held out, by split_seed
    split_seed: int = 0
    corrupt: str = "refuse"  # image-folder: an image that cannot be decoded is refused or skipped
    resize: str = "crop"  # image-folder training and prediction: fit an image by crop (cover, centre) or stretch
    classes: tuple[str, ...] | None = None  # class names, index = label
    shape: tuple[int, int, int] | None = None  # (C, H, W) of the images before padding
    augment: AugmentConfig | None = None  # training batches only; None: off
    validation: float | str | None = None  # each epoch's evaluation set (validation.py); None: the test set

    def to_dict(self) -> dict:
        if self.normalize is None or self.normalize == COMPUTED:
            normalize = bool(self.normalize) and COMPUTED
        else:
            normalize = {"mean": _plain(self.normalize[0]), "std": _plain(self.normalize[1])}
        return _without_none({
            "dataset": self.dataset, "dir": self.dir, "normalize": normalize, "pad": self.pad,
            "placement": self.placement, **{key: getattr(self, key) for key in IDX_PATH_KEYS + NPZ_PATH_KEYS},
            "md5": self.md5, "channels": None if self.channels == "auto" else self.channels,
            "image_size": None if self.image_size is None else list(self.image_size),
            "test_fraction": None if self.dataset != "image-folder" else self.test_fraction,
            "split_seed": self.split_seed or None, "corrupt": None if self.corrupt == "refuse" else self.corrupt,
            "resize": self.resize if self.dataset == "image-folder" or self.resize != "crop" else None,
            "classes": None if self.classes is None else list(self.classes),
            "shape": None if self.shape is None else list(self.shape),
            "augment": None if self.augment is None else self.augment.to_dict(), "validation": self.validation})

    def with_absolute_paths(self) -> "DataConfig":
        """The same data with ``dir`` and the file keys made absolute from the working directory, so that
        a checkpoint names the folder it was trained on wherever it is read (a relative path would be
        read from the reader's working directory)."""
        paths = {key: os.path.abspath(getattr(self, key)) for key in ("dir",) + IDX_PATH_KEYS + NPZ_PATH_KEYS
                 if getattr(self, key) is not None}
        if isinstance(self.validation, str):
            paths["validation"] = os.path.abspath(self.validation)
        return dataclasses.replace(self, **paths)


def _plain(value):
    """A mean or std as YAML writes it: a number, or a list of one per channel."""
    return list(value) if isinstance(value, (tuple, list)) else value


@dataclass(frozen=True)
class TrainConfig:
    optimizer: OptimizerConfig
    schedule: ScheduleConfig = ScheduleConfig()
    batch_size: int = 64
    epochs: int = 1
    steps: int | None = None  # when given, stop after this many steps (overrides epochs)
    seed: int = 0
    log_every: int = 100  # steps
    checkpoint_every: int = 1  # epochs between published output sets; 0 ("never"): only at the end
    graph: bool = True  # capture the CUDA training step as a CUDA graph
    eval_batch_size: int = 1000
    # over several GPUs (global batch = batch_size × GPUs): "linear" multiplies the rate by the number of
    # GPUs, reached linearly over lr_warmup_epochs (Goyal et al. 2017); "none" keeps it. One GPU: no change.
    lr_scaling: str = "linear"
    lr_warmup_epochs: float = 1.0
    grad_reduce: str = "fp32"  # over several GPUs: "bf16" averages the gradients in bfloat16 (half the traffic)
    loss_scale: LossScaleConfig = LossScaleConfig()  # math: fp16 only
    monitor: str = AUTO_MONITOR  # the figure best.npz and early stopping watch (monitoring.py)
    early_stopping: EarlyStoppingConfig | None = None

    def to_dict(self) -> dict:
        return _without_none({
            "batch_size": self.batch_size, "epochs": self.epochs, "steps": self.steps, "seed": self.seed,
            "optimizer": self.optimizer.to_dict(), "schedule": self.schedule.to_dict(),
            "log_every": self.log_every, "checkpoint_every": self.checkpoint_every, "graph": self.graph,
            "eval_batch_size": self.eval_batch_size, "lr_scaling": self.lr_scaling,
            "lr_warmup_epochs": self.lr_warmup_epochs, "loss_scale": self.loss_scale.to_dict(),
            "grad_reduce": None if self.grad_reduce == "fp32" else self.grad_reduce,
            "monitor": None if self.monitor == AUTO_MONITOR else self.monitor,
            "early_stopping": None if self.early_stopping is None else self.early_stopping.to_dict(),
        })


LR_SCALINGS = ("linear", "none")  # train.lr_scaling: the learning-rate rule for the global batch of several GPUs
GRAD_REDUCES = ("fp32", "bf16")  # train.grad_reduce: the type the gradients are averaged over several GPUs in


@dataclass(frozen=True)
class Config:
    model: tuple[LayerSpec, ...]
    data: DataConfig
    train: TrainConfig
    device: str = "auto"
    math: str = DEFAULT_PRECISION  # a name of cudnnnet.precision.PRECISIONS
    engine: str = DEFAULT_ENGINE  # "slides": the C++ design's library calls; "fast": our fusions and kernels
    source: str = field(default="<dict>", compare=False)

    def to_dict(self) -> dict:
        """Plain dicts, lists and scalars; ``parse_config(config.to_dict())`` gives an equal Config."""
        return {"model": [layer.to_dict() for layer in self.model], "data": self.data.to_dict(),
                "train": self.train.to_dict(), "device": self.device, "math": self.math, "engine": self.engine}

    def with_overrides(self, epochs: int | None = None, steps: int | None = None, batch_size: int | None = None,
                       seed: int | None = None, device: str | None = None,
                       data_dir: str | os.PathLike | None = None, graph: bool | None = None,
                       engine: str | None = None) -> "Config":
        """A new validated Config with the given values replaced (None keeps a value).

        Giving ``epochs`` without ``steps`` drops the file's ``steps``, so the epochs asked for run.
        """
        raw = self.to_dict()
        train_overrides = {"epochs": epochs, "steps": steps, "batch_size": batch_size, "seed": seed, "graph": graph}
        raw["train"].update({key: value for key, value in train_overrides.items() if value is not None})
        if epochs is not None and steps is None:
            raw["train"].pop("steps", None)
        if device is not None:
            raw["device"] = device
        if engine is not None:
            raw["engine"] = engine
        if data_dir is not None:
            raw["data"]["dir"] = os.fspath(data_dir)
        return parse_config(raw, source=f"{self.source} (with overrides)")





# ---- data and train ------------------------------------------------------------------------


def _parse_normalize(data: _Section, dataset: str) -> tuple | str | None:
    value = data.value.get("normalize")
    if value is None or value is False:
        return None
    if value is True:
        return (MNIST_MEAN, MNIST_STD) if dataset == "mnist" else COMPUTED
    if value == COMPUTED:
        return COMPUTED
    if not isinstance(value, dict):
        data.fail("normalize", f"expected false, true (MNIST's mean {MNIST_MEAN}, std {MNIST_STD}; for another data "
                               f"set the training set's), {COMPUTED!r} (per channel, from the training set) or "
                               f"a mapping with mean and std, got {_describe(value)}")
    normalize = data.section("normalize")
    normalize.only(("mean", "std"))
    if isinstance(normalize.value.get("mean"), list) or isinstance(normalize.value.get("std"), list):
        return (_channel_numbers(normalize, "mean", None), _channel_numbers(normalize, "std", 0.0))
    return (_float32(normalize, "mean", normalize.number("mean")),
            _float32(normalize, "std", normalize.number("std", low=0.0, low_open=True), FLOAT32_TINY))


def _channel_numbers(section: _Section, key: str, low: float | None) -> tuple[float, ...]:
    """A list of 1 or 3 numbers (one per channel), each > ``low`` when given."""
    values = section.get(key, _REQUIRED, "a list of 1 or 3 numbers")
    if not isinstance(values, list) or len(values) not in (1, 3):
        section.fail(key, f"expected a number or a list of 1 or 3 numbers (one per channel), got {_describe(values)}")
    item = _Section({str(index): value for index, value in enumerate(values)}, section.key_path(key), section.source)
    return tuple(_float32(item, str(index), item.number(str(index), low=low, low_open=low is not None),
                          0.0 if low is None else FLOAT32_TINY) for index in range(len(values)))


def _path(data: _Section, key: str, required: bool, what: str = "a file path") -> str | None:
    """A file or folder path: a non-empty string without a NUL byte (which no file system holds), ``~`` expanded
    as a shell would."""
    value = data.get(key, _REQUIRED if required else None, what)
    if value is not None and (not isinstance(value, str) or not value or "\0" in value):
        data.fail(key, f"expected {what} (a non-empty string without NUL bytes), got {_describe(value)}")
    return None if value is None else os.path.expanduser(value)


def _parse_md5(data: _Section) -> dict | None:
    if not data.has("md5"):
        return None
    md5 = data.section("md5")
    if not isinstance(md5.value, dict) or not md5.value:
        data.fail("md5", f"expected a mapping of file name to MD5 (32 hex digits), got {_describe(md5.value)}")
    for name, value in md5.value.items():
        if not isinstance(value, str) or not re.fullmatch(r"[0-9a-fA-F]{32}", value):
            md5.fail(str(name), f"expected an MD5 of 32 hex digits, got {_describe(value)}")
    return {str(name): value.lower() for name, value in md5.value.items()}


def _parse_classes(data: _Section) -> tuple[str, ...] | None:
    names = data.get("classes", None, "a list of class names")
    if names is None:
        return None
    if not isinstance(names, list) or not names or len(names) > MAX_CLASSES \
            or not all(isinstance(name, str) and name and name.isprintable() for name in names) \
            or len(set(names)) != len(names):
        data.fail("classes", f"expected a list of distinct non-empty class names of printable text (no line breaks "
                             f"or control characters; label i is the i-th), got {_describe(names)}")
    return tuple(names)


def _parse_pair(data: _Section, key: str, low: int) -> tuple[int, int] | None:
    value = data.get(key, None, "[height, width]")
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value, value]
    if not isinstance(value, list) or len(value) != 2:
        data.fail(key, f"expected [height, width] or one integer, got {_describe(value)}")
    item = _Section({"height": value[0], "width": value[1]}, data.key_path(key), data.source)
    return (item.integer("height", low=low, high=65_536), item.integer("width", low=low, high=65_536))


def _parse_image_size(data: _Section) -> tuple[int, int] | None:
    """data.image_size: [height, width] of at most MAX_IMAGE_PIXELS, the most an image file may hold: every
    image of a folder is decoded at that size, whatever its own (30000×30000 took 23 GB before the model
    was found too large)."""
    size = _parse_pair(data, "image_size", 1)
    if size is not None and size[0] * size[1] > MAX_IMAGE_PIXELS:
        data.fail("image_size", f"{size[0]}×{size[1]} is {size[0] * size[1] / 1e6:.0f} megapixels; an image is at most "
                                f"{MAX_IMAGE_PIXELS / 1e6:g} megapixels")
    return size


def _parse_shape(data: _Section) -> tuple[int, int, int] | None:
    value = data.get("shape", None, "[channels, height, width]")
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 3:
        data.fail("shape", f"expected [channels, height, width], got {_describe(value)}")
    item = _Section({"channels": value[0], "height": value[1], "width": value[2]}, data.key_path("shape"), data.source)
    return (item.integer("channels", low=1, high=4), item.integer("height", low=1, high=65_536),
            item.integer("width", low=1, high=65_536))


def _parse_channels(data: _Section) -> str | int:
    value = data.get("channels", "auto", "1, 3 or auto")
    if value not in ("auto", 1, 3) or isinstance(value, bool):
        data.fail("channels", f"expected 1, 3 or auto, got {_describe(value)}")
    return value


def _parse_augment(data: _Section) -> AugmentConfig | None:
    """data.augment: false or absent (off), or {crop_padding: P, flip: true|false}."""
    value = data.value.get("augment")
    if value is None or value is False:
        return None
    if not isinstance(value, dict):
        data.fail("augment", f"expected false or a mapping {{crop_padding: P, flip: true|false}} (P an integer "
                             f"in [0, {MAX_CROP_PADDING}]), got {_describe(value)}")
    augment = data.section("augment")
    augment.only(("crop_padding", "flip"))
    return AugmentConfig(crop_padding=augment.integer("crop_padding", 0, low=0, high=MAX_CROP_PADDING),
                         flip=augment.boolean("flip", False))


DATA_KEYS = ("dataset", "dir", "normalize", "pad", "placement") + IDX_PATH_KEYS + NPZ_PATH_KEYS + (
    "md5", "channels", "image_size", "test_fraction", "split_seed", "corrupt", "resize", "classes", "shape",
    "augment", "validation")


def _parse_data(data: _Section) -> DataConfig:
    data.only(DATA_KEYS)
    dataset = data.choice("dataset", DATASETS, "mnist")
    directory = _path(data, "dir", False, "a directory path")
    if dataset == "image-folder" and directory is None:
        data.fail("dir", "missing required key: image-folder reads dir/<class>/<image> (or dir/train/, dir/test/)")
    paths = {key: _path(data, key, dataset == "idx") for key in IDX_PATH_KEYS}
    paths.update({key: _path(data, key, dataset == "npz") for key in NPZ_PATH_KEYS})
    return DataConfig(dataset=dataset, dir=directory,
                      normalize=_parse_normalize(data, dataset), pad=data.integer("pad", 0, low=0),
                      placement=data.choice("placement", PLACEMENTS, "auto"), **paths, md5=_parse_md5(data),
                      channels=_parse_channels(data), image_size=_parse_image_size(data),
                      test_fraction=data.number("test_fraction", 0.2, low=0.0, high=1.0, low_open=True, high_open=True),
                      split_seed=data.integer("split_seed", 0, low=0), corrupt=data.choice("corrupt", CORRUPT_POLICIES,
                                                                                         "refuse"),
                      resize=data.choice("resize", RESIZE_MODES, "crop"), classes=_parse_classes(data),
                      shape=_parse_shape(data), augment=_parse_augment(data), validation=parse_validation(data))


ADAMW_WEIGHT_DECAY = 0.01  # AdamW's default decoupled weight decay (PyTorch's)


def _parse_optimizer(optimizer: _Section) -> OptimizerConfig:
    name = optimizer.choice("name", OPTIMIZERS, "sgd")
    if name != "sgd":
        return _parse_adam(optimizer, name)
    optimizer.only(("name", "lr", "momentum", "weight_decay", "nesterov"), context="optimizer sgd")
    if optimizer.boolean("nesterov", False):
        optimizer.fail("nesterov", "nesterov momentum is not supported; remove the key or set it to false")
    return OptimizerConfig(
        name=name,
        lr=_float32(optimizer, "lr", optimizer.number("lr", low=0.0, low_open=True, float32=True)),
        momentum=optimizer.number("momentum", 0.0, low=0.0, high=1.0, high_open=True, float32=True),
        weight_decay=_float32(optimizer, "weight_decay", optimizer.number("weight_decay", 0.0, low=0.0)),
    )


def _parse_adam(optimizer: _Section, name: str) -> OptimizerConfig:
    """adam or adamw: lr, betas [β1, β2] each in [0, 1), eps > 0 (a normal float32), weight_decay >= 0."""
    optimizer.only(("name", "lr", "betas", "eps", "weight_decay"), context=f"optimizer {name}")
    betas = optimizer.get("betas", [0.9, 0.999], "a list [beta1, beta2]")
    if not isinstance(betas, (list, tuple)) or len(betas) != 2:
        optimizer.fail("betas", f"expected a list of two numbers [beta1, beta2], each in [0, 1), got {_describe(betas)}")
    pair = _Section({"beta1": betas[0], "beta2": betas[1]}, optimizer.key_path("betas"), optimizer.source)
    return OptimizerConfig(
        name=name,
        lr=_float32(optimizer, "lr", optimizer.number("lr", low=0.0, low_open=True, float32=True)),
        betas=(pair.number("beta1", low=0.0, high=1.0, high_open=True, float32=True),
               pair.number("beta2", low=0.0, high=1.0, high_open=True, float32=True)),
        eps=_float32(optimizer, "eps", optimizer.number("eps", 1e-8, low=0.0, low_open=True), FLOAT32_TINY),
        weight_decay=_float32(optimizer, "weight_decay", optimizer.number(
            "weight_decay", ADAMW_WEIGHT_DECAY if name == "adamw" else 0.0, low=0.0)),
    )


def _parse_schedule(schedule: _Section) -> ScheduleConfig:
    name = schedule.choice("name", SCHEDULES, "constant")
    warmup = {"warmup_steps": schedule.integer("warmup_steps", 0, low=0)}
    if name == "inverse":
        schedule.only(("name", "decay", "warmup_steps"), context="schedule inverse")
        return ScheduleConfig(name, decay=schedule.number("decay", low=0.0), **warmup)
    if name == "step":
        schedule.only(("name", "step_size", "gamma", "warmup_steps"), context="schedule step")
        return ScheduleConfig(name, step_size=schedule.integer("step_size", low=0, low_open=True),
                              gamma=schedule.number("gamma", low=0.0, high=1.0, low_open=True), **warmup)
    schedule.only(("name", "warmup_steps"), context=f"schedule {name}")
    return ScheduleConfig(name, **warmup)


CHECKPOINT_WORDS = {"epoch": 1, "never": 0}


def _checkpoint_every(train: _Section) -> int:
    """train.checkpoint_every: epochs between checkpoints, "epoch" (1, the default) or "never" (0: only at the end)."""
    value = train.value.get("checkpoint_every")
    if isinstance(value, str):
        if value not in CHECKPOINT_WORDS:
            train.fail("checkpoint_every", f"expected an integer >= 0, epoch or never, got {_describe(value)}")
        return CHECKPOINT_WORDS[value]
    return train.integer("checkpoint_every", 1, low=0)


LOSS_SCALE_WORDS = ("dynamic",)


def _parse_loss_scale(train: _Section) -> LossScaleConfig:
    """train.loss_scale: ``dynamic`` (the default) or a mapping of initial (2^-126 to 2^64) and
    growth_interval (steps, 1 to 2^24)."""
    value = train.value.get("loss_scale")
    if value is None or value in LOSS_SCALE_WORDS:
        return LossScaleConfig()
    if not isinstance(value, dict):
        train.fail("loss_scale", f"expected dynamic or a mapping with initial and growth_interval, got {_describe(value)}")
    scale = train.section("loss_scale")
    scale.only(("initial", "growth_interval"), context="loss_scale")
    initial = scale.number("initial", LOSS_SCALE_INITIAL)
    if not FLOAT32_TINY <= initial <= MAX_LOSS_SCALE:
        scale.fail("initial", f"expected a number in [2^-126, 2^64] ({FLOAT32_TINY:g} to {MAX_LOSS_SCALE:g}), "
                              f"got {_SHORT_REPR.repr(scale.value['initial'])}")
    return LossScaleConfig(
        initial=initial,
        growth_interval=scale.integer("growth_interval", LOSS_SCALE_GROWTH_INTERVAL, low=1, high=MAX_GROWTH_INTERVAL))


def _parse_train(train: _Section) -> TrainConfig:
    train.only(("batch_size", "epochs", "steps", "seed", "optimizer", "schedule", "log_every",
                "checkpoint_every", "graph", "eval_batch_size", "lr_scaling", "lr_warmup_epochs", "loss_scale",
                "monitor", "early_stopping", "grad_reduce"))
    return TrainConfig(
        batch_size=train.integer("batch_size", 64, low=0, low_open=True),
        epochs=train.integer("epochs", 1, low=0, low_open=True),
        steps=train.integer("steps", None, low=0, low_open=True),
        seed=train.integer("seed", 0, low=0),
        optimizer=_parse_optimizer(train.section("optimizer", required=True)),
        schedule=_parse_schedule(train.section("schedule")),
        log_every=train.integer("log_every", 100, low=0, low_open=True),
        checkpoint_every=_checkpoint_every(train),
        graph=train.boolean("graph", True),
        eval_batch_size=train.integer("eval_batch_size", 1000, low=0, low_open=True),
        lr_scaling=train.choice("lr_scaling", LR_SCALINGS, "linear"),
        lr_warmup_epochs=train.number("lr_warmup_epochs", 1.0, low=0),
        grad_reduce=train.choice("grad_reduce", GRAD_REDUCES, "fp32"),
        loss_scale=_parse_loss_scale(train),
        monitor=parse_monitor(train),
        early_stopping=parse_early_stopping(train),
    )


# ---- entry points --------------------------------------------------------------------------


def with_checkpoint_defaults(mapping: Any) -> Any:
    """A checkpoint's stored config with what its writer did where it predates a key: an image-folder
    config with ``data.image_size`` but without ``data.resize`` was trained on images stretched to that
    size (``LEGACY_RESIZE``). Without ``image_size`` no image was resized in training, and prediction
    keeps cropping as it did. Anything else is returned as it is, for ``parse_config`` to validate."""
    data = mapping.get("data") if isinstance(mapping, dict) else None
    if (not isinstance(data, dict) or data.get("dataset") != "image-folder" or "resize" in data
            or data.get("image_size") is None):
        return mapping
    return {**mapping, "data": {**data, "resize": LEGACY_RESIZE}}


def parse_config(mapping: Any, source: str = "<dict>") -> Config:
    """Validate an already-loaded mapping (YAML or ``Config.to_dict()``) into a Config."""
    if not isinstance(mapping, dict):
        raise ConfigError(f"{source}: the top level must be a mapping with keys model, data, train, "
                          f"device, math, engine; got {_describe(mapping)}")
    root = _Section(mapping, "", source)
    root.only(TOP_LEVEL_KEYS)
    config = Config(
        model=parse_model(root.get("model", _REQUIRED, "a non-empty list of layers"), source),
        data=_parse_data(root.section("data")),
        train=_parse_train(root.section("train", required=True)),
        device=root.choice("device", DEVICES, "auto"),
        math=root.choice("math", PRECISION_NAMES, DEFAULT_PRECISION),
        engine=root.choice("engine", tuple(ENGINES), DEFAULT_ENGINE),
        source=source,
    )
    check_monitor(config)
    return config


@dataclass(frozen=True)
class ModelDescription:
    """What a network needs to be built and fed, without training: its layers and its data preparation."""

    model: tuple[LayerSpec, ...]
    data: DataConfig
    source: str = "<dict>"


def load_model_description(path: str | os.PathLike) -> ModelDescription:
    """The ``model`` and ``data`` of the YAML config at ``path``; its other sections (a training
    config's ``train``, ``device``, ``math``, ``engine``), if any, are not needed and not read
    (predicting with the original's .bin files needs no optimiser)."""
    path = resolve_config(path)
    mapping = _read_mapping(path, None)
    source = str(path)
    if not isinstance(mapping, dict):
        raise ConfigError(f"{source}: the top level must be a mapping with keys model and data; got {_describe(mapping)}")
    root = _Section(mapping, "", source)
    root.only(TOP_LEVEL_KEYS)
    return ModelDescription(model=parse_model(root.get("model", _REQUIRED, "a non-empty list of layers"), source),
                            data=_parse_data(root.section("data")), source=source)


def load_config(path: str | os.PathLike, data: bytes | None = None, overrides: Sequence[str] = ()) -> Config:
    """Read and validate the YAML config at ``path``; ``data``: its bytes where they were read already
    (a pipe, ``--config <(...)`` or /dev/stdin, can be read once only). ``path`` may name a shipped
    config ("mnist_mlp": ``shipped_configs``). ``overrides``: ``KEY.PATH=VALUE`` assignments made
    before it is validated (``overrides.py``, the command line's ``--set``)."""
    path = resolve_config(path) if data is None else Path(path)
    if overrides:
        from .overrides import parse_overridden

        return parse_overridden(_read_mapping(path, data), overrides, str(path), parse_config)
    return parse_config(_read_mapping(path, data), source=str(path))


def _read_mapping(path: Path, data: bytes | None):
    """The YAML document at ``path`` (or in ``data``, its bytes), ConfigError where it cannot be read or is empty."""
    mapping = read_yaml(path, data)
    if mapping is None:
        raise ConfigError(f"{path}: the file is empty; a config needs at least model and train.optimizer.lr")
    return mapping
