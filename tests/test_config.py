import copy
import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from cudnnnet.config.schema import (AugmentConfig, Config, ConfigError, LayerSpec, OptimizerConfig, ScheduleConfig,
                                    load_config, load_model_description, parse_config, with_checkpoint_defaults)
from cudnnnet.errors import InvalidArgumentError, UsageError
from hostile_files import pyyaml_copies_merged_keys

REPO_ROOT = Path(__file__).resolve().parent.parent

LENET_YAML = """\
model:
  - {type: conv2d, name: conv1, out_channels: 20, kernel_size: 5}
  - {type: pooling, kernel_size: 2}
  - {type: conv2d, out_channels: 50, kernel_size: 5, padding: 1}
  - {type: pooling, kernel_size: 3, stride: 1, padding: 1, mode: average}
  - {type: dense, out_size: 500}
  - {type: activation, mode: relu}
  - {type: dense, name: fc2, out_size: 10}
  - {type: softmax}
data:
  normalize: true
  pad: 2
train:
  batch_size: 256
  epochs: 3
  optimizer: {lr: 0.02, momentum: 0.9, weight_decay: 5.0e-4}
  schedule: {name: inverse, decay: 1.0e-4}
device: host
math: tf32
"""


def minimal() -> dict:
    return {"model": [{"type": "dense", "out_size": 10}, {"type": "softmax"}],
            "train": {"optimizer": {"lr": 0.1}}}


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---- valid configs -------------------------------------------------------------------------


def test_load_config_types_values_and_defaults(tmp_path):
    path = write(tmp_path, LENET_YAML)
    config = load_config(path)
    assert config.source == str(path)
    assert [layer.name for layer in config.model] == [
        "conv1", "pooling1", "conv2d2", "pooling2", "dense1", "activation1", "fc2", "softmax1"]
    assert config.model[0] == LayerSpec("conv2d", "conv1", {"out_channels": 20, "kernel_size": 5, "stride": 1,
                                                            "padding": 0, "dilation": 1})
    assert config.model[1].params == {"kernel_size": 2, "stride": 2, "padding": 0, "mode": "max"}
    assert config.model[3].params == {"kernel_size": 3, "stride": 1, "padding": 1, "mode": "average"}
    assert config.model[5].params == {"mode": "relu", "coef": 0.0}
    assert config.data.normalize == (0.1307, 0.3081) and config.data.pad == 2 and config.data.dir is None
    train = config.train
    assert (train.batch_size, train.epochs, train.steps, train.seed) == (256, 3, None, 0)
    assert (train.log_every, train.checkpoint_every, train.graph, train.eval_batch_size) == (100, 1, True, 1000)
    assert train.optimizer.lr == 0.02 and train.optimizer.momentum == 0.9 and train.optimizer.weight_decay == 5e-4
    assert train.schedule.name == "inverse" and train.schedule.decay == 1e-4
    assert (config.device, config.math) == ("host", "tf32")


def test_a_data_path_starting_with_a_tilde_is_read_in_the_home_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    raw = minimal()
    raw["data"] = {"dataset": "idx", "dir": "~/digits", "train_images": "~/digits/train.idx",
                   "train_labels": "labels.idx", "test_images": "t.idx", "test_labels": "tl.idx"}
    data = parse_config(raw).data
    assert (data.dir, data.train_images, data.train_labels) == (str(tmp_path / "digits"),
                                                                str(tmp_path / "digits" / "train.idx"), "labels.idx")


def test_minimal_config_defaults():
    config = parse_config(minimal())
    assert (config.device, config.math, config.source) == ("auto", "fp32", "<dict>")
    assert config.data.dataset == "mnist" and config.data.normalize is None and config.data.pad == 0
    assert config.data.placement == "auto"
    assert config.train.batch_size == 64 and config.train.epochs == 1 and config.train.schedule.name == "constant"
    assert config.train.optimizer.name == "sgd" and config.train.optimizer.momentum == 0.0


@pytest.mark.parametrize("value, epochs", [("epoch", 1), ("never", 0), (3, 3), (0, 0)])
def test_checkpoint_every_takes_a_number_of_epochs_or_a_word(value, epochs):
    raw = minimal()
    raw["train"]["checkpoint_every"] = value
    assert parse_config(raw).train.checkpoint_every == epochs
    assert parse_config(minimal()).train.checkpoint_every == 1


def test_ints_are_accepted_for_floats_and_nulls_mean_absent():
    raw = minimal()
    raw["train"]["optimizer"] = {"lr": 1, "momentum": 0}
    raw["train"]["steps"] = None
    raw["data"] = None
    config = parse_config(raw)
    assert config.train.optimizer.lr == 1.0 and isinstance(config.train.optimizer.lr, float)
    assert config.train.steps is None


@pytest.mark.parametrize("activation, coef", [
    ({"mode": "elu"}, 1.0), ({"mode": "elu", "coef": 0.5}, 0.5), ({"mode": "clipped_relu", "coef": 6}, 6.0),
    ({"mode": "tanh"}, 0.0),
])
def test_activation_coef_defaults(activation, coef):
    raw = minimal()
    raw["model"].insert(0, {"type": "activation", **activation})
    assert parse_config(raw).model[0].params["coef"] == coef


@pytest.mark.parametrize("normalize, expected", [
    (False, None), (True, (0.1307, 0.3081)), ({"mean": 0.5, "std": 2}, (0.5, 2.0)),
])
def test_normalize_forms(normalize, expected):
    raw = minimal()
    raw["data"] = {"normalize": normalize}
    assert parse_config(raw).data.normalize == expected


@pytest.mark.parametrize("placement", ["auto", "device", "host"])
def test_data_placement_is_read_and_round_trips(placement):
    raw = minimal()
    raw["data"] = {"placement": placement}
    config = parse_config(raw)
    assert config.data.placement == placement
    assert config.to_dict()["data"]["placement"] == placement
    assert parse_config(config.to_dict()) == config


@pytest.mark.parametrize("augment, expected", [
    (None, None), (False, None), ({}, AugmentConfig(0, False)), ({"crop_padding": 4, "flip": True}, AugmentConfig(4, True)),
    ({"flip": True}, AugmentConfig(0, True)), ({"crop_padding": 2}, AugmentConfig(2, False))])
def test_data_augment_is_read_and_round_trips(augment, expected):
    raw = minimal()
    raw["data"] = {"augment": augment}
    config = parse_config(raw)
    assert config.data.augment == expected
    assert parse_config(config.to_dict()) == config
    assert ("augment" in config.to_dict()["data"]) == (expected is not None)


@pytest.mark.parametrize("dataset", ["image-folder", "cifar10"])
@pytest.mark.parametrize("resize", [None, "crop", "stretch"])
def test_data_resize_defaults_to_crop_round_trips_and_is_always_written_for_an_image_folder(dataset, resize):
    raw = minimal()
    raw["data"] = {"dataset": dataset, "dir": "photos", **({} if resize is None else {"resize": resize})}
    config = parse_config(raw)
    assert config.data.resize == (resize or "crop")
    assert parse_config(config.to_dict()) == config
    written = config.to_dict()["data"].get("resize")
    assert written == (config.data.resize if dataset == "image-folder" or resize == "stretch" else None)
    assert parse_config(with_checkpoint_defaults(config.to_dict())) == config  # a checkpoint written now reads the same


def test_a_checkpoint_s_image_folder_config_from_before_data_resize_reads_as_stretch():
    """Image folders were stretched to data.image_size before the key existed: predicting with such a
    checkpoint, or resuming it, must fit images the way it was trained. Without an image_size nothing
    was resized in training, and prediction keeps the crop it made before."""
    legacy = minimal()
    legacy["data"] = {"dataset": "image-folder", "dir": "photos", "image_size": [8, 12]}
    assert parse_config(legacy).data.resize == "crop"  # a config written by hand: the new default
    assert parse_config(with_checkpoint_defaults(legacy)).data.resize == "stretch"
    assert "resize" not in legacy["data"]  # the stored mapping is left as it is
    for other in ({"dataset": "cifar10"}, {}, None, {"dataset": "image-folder", "dir": "photos"}):
        raw = {**minimal(), **({} if other is None else {"data": other})}
        assert with_checkpoint_defaults(raw) == raw
    assert with_checkpoint_defaults(["not", "a", "mapping"]) == ["not", "a", "mapping"]


def test_augmentation_is_on_for_the_natural_image_configs_and_off_for_digits():
    augmented = {path.stem: load_config(path).data.augment for path in sorted((REPO_ROOT / "configs").glob("*.yaml"))}
    assert augmented.pop("cifar10_cnn") == augmented.pop("image_folder") == AugmentConfig(4, True)
    assert set(augmented.values()) == {None}, augmented


def test_mse_is_a_loss_layer():
    raw = minimal()
    raw["model"][-1] = {"type": "mse", "name": "loss"}
    assert parse_config(raw).model[-1].is_loss


def test_to_dict_round_trips_and_is_plain(tmp_path):
    config = load_config(write(tmp_path, LENET_YAML))
    plain = config.to_dict()
    assert parse_config(plain) == config
    assert parse_config(yaml.safe_load(yaml.safe_dump(plain))) == config
    assert parse_config(json.loads(json.dumps(plain))) == config
    assert plain["model"][0] == {"type": "conv2d", "name": "conv1", "out_channels": 20, "kernel_size": 5,
                                 "stride": 1, "padding": 0, "dilation": 1}
    raw = config.to_dict()
    raw["model"][0]["bias"] = False  # written only where false: a convolution with a bias reads as before the key
    assert parse_config(raw).model[0].params["bias"] is False and "bias" not in config.model[0].params


def test_round_trip_of_step_schedule_and_steps():
    raw = minimal()
    raw["train"].update(steps=500, schedule={"name": "step", "step_size": 2, "gamma": 0.5})
    raw["data"] = {"dir": "/data/mnist"}
    config = parse_config(raw)
    assert parse_config(config.to_dict()) == config
    assert config.to_dict()["train"]["schedule"] == {"name": "step", "step_size": 2, "gamma": 0.5}


def test_configs_are_frozen():
    config = parse_config(minimal())
    with pytest.raises(AttributeError):
        config.device = "cuda"


def test_schedule_learning_rates():
    raw = minimal()
    raw["train"]["schedule"] = {"name": "inverse", "decay": 0.5}
    inverse = parse_config(raw).train.schedule
    assert inverse.learning_rate(0.1, step=2, epoch=0) == pytest.approx(0.05)
    raw["train"]["schedule"] = {"name": "step", "step_size": 2, "gamma": 0.1}
    step = parse_config(raw).train.schedule
    assert [step.learning_rate(1.0, 0, epoch) for epoch in range(5)] == pytest.approx([1, 1, 0.1, 0.1, 0.01])
    assert parse_config(minimal()).train.schedule.learning_rate(0.3, 1000, 9) == 0.3


@pytest.mark.parametrize("arguments, message", [
    ({"name": "bogus"}, r"unknown schedule 'bogus'; valid are constant, inverse, step, cosine"),
    ({"name": "inverse"}, r"the inverse schedule needs decay, a finite number >= 0, got None"),
    ({"name": "inverse", "decay": float("nan")}, r"needs decay"),
    ({"name": "step"}, r"the step schedule needs step_size, an integer >= 1, and gamma in \(0, 1\], got None and None"),
    ({"name": "step", "step_size": 0, "gamma": 0.5}, r"step_size, an integer >= 1"),
    ({"name": "step", "step_size": 2, "gamma": 2.0}, r"gamma in \(0, 1\]"),
    ({"name": "cosine", "warmup_steps": -3}, r"warmup_steps must be an integer >= 0, got -3"),
    ({"name": "constant", "warmup_steps": 2.5}, r"warmup_steps must be an integer >= 0, got 2\.5"),
    ({"name": "constant", "warmup_steps": True}, r"warmup_steps must be an integer >= 0, got True")])
def test_a_schedule_made_in_python_is_checked_as_a_config_file_is(arguments, message):
    """A ScheduleConfig made in Python was taken as it was: a missing decay or step_size raised a TypeError
    or ZeroDivisionError at the first step, an unknown name ran as constant, a warm-up of 2.5 steps
    took the rate past lr."""
    with pytest.raises(InvalidArgumentError, match=message):
        ScheduleConfig(**arguments)


# ---- overrides -----------------------------------------------------------------------------


def test_with_overrides_replaces_and_validates(tmp_path):
    config = load_config(write(tmp_path, LENET_YAML))
    changed = config.with_overrides(epochs=5, batch_size=32, seed=4, device="cuda", data_dir=tmp_path)
    assert (changed.train.epochs, changed.train.batch_size, changed.train.seed) == (5, 32, 4)
    assert changed.device == "cuda" and changed.data.dir == str(tmp_path)
    assert changed.model == config.model and config.train.epochs == 3
    assert config.with_overrides() == config


def test_epochs_override_drops_the_files_steps_but_steps_override_sets_them():
    raw = minimal()
    raw["train"]["steps"] = 100
    config = parse_config(raw)
    assert config.with_overrides(epochs=2).train.steps is None
    assert config.with_overrides(steps=7).train.steps == 7
    assert config.with_overrides(epochs=2, steps=9).train.steps == 9


@pytest.mark.parametrize("override, problem", [
    ({"epochs": 0}, "train.epochs: expected an integer > 0, got 0"),
    ({"device": "tpu"}, "device: expected one of auto, cuda, host, got 'tpu'"),
    ({"batch_size": True}, "train.batch_size"),
])
def test_invalid_overrides_are_config_errors(override, problem):
    with pytest.raises(ConfigError, match=problem):
        parse_config(minimal(), source="run.yaml").with_overrides(**override)


# ---- errors --------------------------------------------------------------------------------


def _set(raw: dict, path: tuple, value) -> dict:
    raw = copy.deepcopy(raw)
    target = raw
    for key in path[:-1]:
        target = target.setdefault(key, {}) if isinstance(key, str) else target[key]
    if value is _DELETE:
        del target[path[-1]]
    elif isinstance(target, list) and path[-1] == len(target):
        target.append(value)
    else:
        target[path[-1]] = value
    return raw


_DELETE = object()

INVALID = [
    # (path into minimal(), value, message fragment)
    (("colour",), "red", "colour: unknown key 'colour'; valid keys: model, data, train, device, math"),
    (("model",), [], "model: expected a non-empty list of layers"),
    (("model",), {"type": "dense"}, "model: expected a non-empty list"),
    (("model",), _DELETE, "model: missing required key"),
    (("model", 0), "dense", "model[0]: expected a mapping, got 'dense' (string)"),
    (("model", 0, "type"), "lstm", "model[0].type: expected one of dense, activation, softmax, mse, conv2d, pooling"),
    (("model", 0, "type"), _DELETE, "model[0].type: missing required key"),
    (("model", 0, "units"), 3, "model[0].units: unknown key 'units' for a dense layer; valid keys: type, name, out_size"),
    (("model", 0, "out_size"), _DELETE, "model[0].out_size: missing required key; expected an integer > 0"),
    (("model", 0, "out_size"), 0, "model[0].out_size: expected an integer > 0, got 0"),
    (("model", 0, "out_size"), True, "model[0].out_size: expected an integer > 0, got True (boolean)"),
    (("model", 0, "out_size"), 10.0, "model[0].out_size: expected an integer > 0, got 10.0 (number)"),
    (("model", 0, "out_size"), "10", "model[0].out_size: expected an integer > 0, got '10' (string)"),
    (("model", 0, "name"), "fc 1", "model[0].name: expected a name of letters, digits"),
    (("model", 0, "name"), 7, "model[0].name: expected a name"),
    (("model", 0, "name"), "x" * 129, "model[0].name: expected a name of letters, digits, '_' and '-' (at most 128 "
                                      "characters), got 'xxxxxxxx"),
    (("model", 0, "name"), "softmax1", "model[1].name: duplicate layer name 'softmax1' (also model[0])"),
    (("model", 1), {"type": "dense", "out_size": 3}, "model[1].type: the last layer must be a loss layer (softmax or mse), got 'dense'"),
    (("model", 0), {"type": "mse"}, "model[0].type: loss layer 'mse' may only be the last layer (model[1])"),
    (("model", 1, "axis"), 1, "model[1].axis: unknown key 'axis' for a softmax layer; valid keys: type, name"),
    (("model", 0), {"type": "activation", "mode": "gelu"},
     "model[0].mode: expected one of relu, sigmoid, tanh, clipped_relu, elu, got 'gelu'"),
    (("model", 0), {"type": "activation"}, "model[0].mode: missing required key"),
    (("model", 0), {"type": "activation", "mode": "clipped_relu"}, "model[0].coef: missing required key; expected a number > 0"),
    (("model", 0), {"type": "activation", "mode": "clipped_relu", "coef": 0}, "model[0].coef: expected a number > 0"),
    (("model", 0), {"type": "activation", "mode": "elu", "coef": float("nan")}, "model[0].coef: expected a number, got nan (not finite)"),
    (("model", 0), {"type": "conv2d", "out_channels": 4}, "model[0].kernel_size: missing required key"),
    (("model", 0), {"type": "conv2d", "out_channels": 4, "kernel_size": 3, "stride": 0}, "model[0].stride: expected an integer > 0"),
    (("model", 0), {"type": "conv2d", "out_channels": 4, "kernel_size": 3, "padding": -1}, "model[0].padding: expected an integer >= 0"),
    (("model", 0), {"type": "conv2d", "out_channels": 4, "kernel_size": 3, "dilation": 0}, "model[0].dilation: expected an integer > 0"),
    (("model", 0), {"type": "conv2d", "out_channels": 0, "kernel_size": 3}, "model[0].out_channels: expected an integer > 0"),
    (("model", 0), {"type": "conv2d", "out_channels": 4, "kernel_size": 3, "bias": "no"}, "model[0].bias: expected true or false, got 'no'"),
    (("model", 0), {"type": "pooling", "kernel_size": 2, "padding": 2}, r"model[0].padding: expected an integer in [0, 1], got 2"),
    (("model", 0), {"type": "pooling", "kernel_size": 2, "mode": "min"}, "model[0].mode: expected one of max, average"),
    (("model", 0), {"type": "pooling", "kernel_size": 0}, "model[0].kernel_size: expected an integer > 0"),
    (("data",), [], "data: expected a mapping, got [] (list)"),
    (("data", "dataset"), "cifar100", "data.dataset: expected one of mnist, fashion-mnist, kmnist, idx, npz, cifar10, image-folder, got 'cifar100'"),
    (("data", "dir"), 3, "data.dir: expected a directory path"),
    (("data", "pad"), -2, "data.pad: expected an integer >= 0, got -2"),
    (("data", "normalize"), "yes", "data.normalize: expected false, true"),
    (("data", "normalize"), {"mean": 0.1}, "data.normalize.std: missing required key"),
    (("data", "normalize"), {"mean": 0.1, "std": 0}, "data.normalize.std: expected a number > 0"),
    (("data", "normalize"), {"mean": 0.1, "std": 1, "eps": 1}, "data.normalize.eps: unknown key"),
    (("data", "shuffle"), True, "data.shuffle: unknown key 'shuffle'; valid keys: dataset, dir, normalize, pad, placement, train_images"),
    (("data",), {"dataset": "image-folder"}, "data.dir: missing required key: image-folder reads dir/<class>/<image>"),
    (("data",), {"dataset": "idx", "train_images": "a", "train_labels": "b", "test_images": "c"},
     "data.test_labels: missing required key; expected a file path"),
    (("data",), {"dataset": "npz", "train_file": "a.npz"}, "data.test_file: missing required key"),
    (("data", "normalize"), {"mean": [0.5, 0.5], "std": [0.2, 0.2]},
     "data.normalize.mean: expected a number or a list of 1 or 3 numbers (one per channel), got [0.5, 0.5]"),
    (("data", "normalize"), {"mean": [0.5, 0.5, 0.5], "std": [0.2, 0, 0.2]}, "data.normalize.std.1: expected a number > 0, got 0"),
    (("data", "channels"), 2, "data.channels: expected 1, 3 or auto, got 2"),
    (("data", "image_size"), [32], "data.image_size: expected [height, width] or one integer, got [32]"),
    (("data", "image_size"), [32, 0], "data.image_size.width: expected an integer in [1, 65536], got 0"),
    (("data", "image_size"), [30000, 30000], "data.image_size: 30000×30000 is 900 megapixels; an image is at most 50 "
                                             "megapixels"),  # every image was decoded at it: 23 GB for 8 images
    (("data", "test_fraction"), 1.0, "data.test_fraction: expected a number in (0, 1), got 1.0"),
    (("data", "corrupt"), "ignore", "data.corrupt: expected one of refuse, skip, got 'ignore'"),
    (("data", "resize"), "fit", "data.resize: expected one of crop, stretch, got 'fit'"),
    (("data", "resize"), True, "data.resize: expected one of crop, stretch, got True (boolean)"),
    (("data", "md5"), {"a.gz": "xyz"}, "data.md5.'a.gz': expected an MD5 of 32 hex digits, got 'xyz'"),
    (("data", "classes"), ["cat", "cat"], "data.classes: expected a list of distinct non-empty class names"),
    (("data", "classes"), ["cat\ndog", "bird"], "data.classes: expected a list of distinct non-empty class names of "
                                                "printable text (no line breaks or control characters;"),
    (("data", "shape"), [3, 32], "data.shape: expected [channels, height, width], got [3, 32]"),
    (("data", "placement"), "gpu", "data.placement: expected one of auto, device, host, got 'gpu' (string)"),
    (("data", "placement"), True, "data.placement: expected one of auto, device, host, got True (boolean)"),
    (("data", "augment"), True, "data.augment: expected false or a mapping {crop_padding: P, flip: true|false} "
                                "(P an integer in [0, 65535]), got True (boolean)"),
    (("data", "augment"), 4, "data.augment: expected false or a mapping {crop_padding: P, flip: true|false}"),
    (("data", "augment"), {"crop_padding": -1}, "data.augment.crop_padding: expected an integer in [0, 65535], got -1"),
    (("data", "augment"), {"crop_padding": 70_000}, "data.augment.crop_padding: expected an integer in [0, 65535], got 70000"),
    (("data", "augment"), {"crop_padding": 2.5}, "data.augment.crop_padding: expected an integer in [0, 65535], got 2.5 (number)"),
    (("data", "augment"), {"flip": "yes"}, "data.augment.flip: expected true or false, got 'yes' (string)"),
    (("data", "augment"), {"crop": 4}, "data.augment.crop: unknown key 'crop'; valid keys: crop_padding, flip"),
    (("train",), _DELETE, "train: missing required key; expected a mapping"),
    (("train", "optimizer"), _DELETE, "train.optimizer: missing required key"),
    (("train", "optimizer", "lr"), _DELETE, "train.optimizer.lr: missing required key; expected a number > 0"),
    (("train", "optimizer", "lr"), 0, "train.optimizer.lr: expected a number > 0, got 0"),
    (("train", "optimizer", "lr"), "1e-3", "train.optimizer.lr: expected a number > 0, got '1e-3' (string); YAML 1.1"),
    (("train", "optimizer", "lr"), float("inf"), "train.optimizer.lr: expected a number > 0, got inf (not finite)"),
    (("train", "optimizer", "lr"), 10**400, "train.optimizer.lr: expected a number > 0, got 1000"),
    (("train", "optimizer", "name"), "rmsprop", "train.optimizer.name: expected one of sgd, adam, adamw, got 'rmsprop'"),
    (("train", "optimizer"), {"name": "adam", "lr": 0.1, "momentum": 0.9},
     "train.optimizer.momentum: unknown key 'momentum' for optimizer adam; valid keys: name, lr, betas, eps, weight_decay"),
    (("train", "optimizer"), {"name": "sgd", "lr": 0.1, "betas": [0.9, 0.99]},
     "train.optimizer.betas: unknown key 'betas' for optimizer sgd"),
    (("train", "optimizer"), {"name": "adamw", "lr": 0.1, "betas": 0.9},
     "train.optimizer.betas: expected a list of two numbers [beta1, beta2], each in [0, 1), got 0.9 (number)"),
    (("train", "optimizer"), {"name": "adamw", "lr": 0.1, "betas": [0.9, 1.0]},
     r"train.optimizer.betas.beta2: expected a number in [0, 1), got 1.0"),
    (("train", "optimizer"), {"name": "adam", "lr": 0.1, "eps": 0}, "train.optimizer.eps: expected a number > 0, got 0"),
    (("train", "optimizer"), {"name": "adamw", "lr": 0.1, "weight_decay": -0.01},
     "train.optimizer.weight_decay: expected a number >= 0"),
    (("train", "optimizer", "momentum"), 1.0, r"train.optimizer.momentum: expected a number in [0, 1), got 1.0"),
    (("train", "optimizer", "momentum"), -0.1, "train.optimizer.momentum: expected a number in [0, 1)"),
    (("train", "optimizer", "weight_decay"), -1, "train.optimizer.weight_decay: expected a number >= 0"),
    (("train", "optimizer", "nesterov"), True, "train.optimizer.nesterov: nesterov momentum is not supported"),
    (("train", "optimizer", "nesterov"), "no", "train.optimizer.nesterov: expected true or false"),
    (("train", "optimizer", "beta"), 0.9, "train.optimizer.beta: unknown key"),
    (("train", "schedule"), {"name": "linear"}, "train.schedule.name: expected one of constant, inverse, step, cosine"),
    (("train", "schedule"), {"name": "cosine", "decay": 0.1}, "train.schedule.decay: unknown key"),
    (("train", "schedule"), {"name": "inverse"}, "train.schedule.decay: missing required key; expected a number >= 0"),
    (("train", "schedule"), {"name": "inverse", "decay": -1}, "train.schedule.decay: expected a number >= 0"),
    (("train", "schedule"), {"name": "step", "gamma": 0.5}, "train.schedule.step_size: missing required key"),
    (("train", "schedule"), {"name": "step", "step_size": 1.5, "gamma": 0.5}, "train.schedule.step_size: expected an integer > 0"),
    (("train", "schedule"), {"name": "step", "step_size": 1, "gamma": 0}, r"train.schedule.gamma: expected a number in (0, 1]"),
    (("train", "schedule"), {"name": "step", "step_size": 1, "gamma": 1.5}, r"train.schedule.gamma: expected a number in (0, 1]"),
    (("train", "schedule"), {"decay": 0.1},
     "train.schedule.decay: unknown key 'decay' for schedule constant; valid keys: name, warmup_steps"),
    (("train", "schedule"), {"name": "cosine", "warmup_steps": -1}, "train.schedule.warmup_steps: expected an integer >= 0"),
    (("train", "schedule"), {"name": "step", "step_size": 1, "gamma": 0.5, "warmup_steps": 2.5},
     "train.schedule.warmup_steps: expected an integer >= 0, got 2.5"),
    (("train", "schedule"), "inverse", "train.schedule: expected a mapping, got 'inverse' (string)"),
    (("train", "batch_size"), 0, "train.batch_size: expected an integer > 0, got 0"),
    (("train", "batch_size"), False, "train.batch_size: expected an integer > 0, got False (boolean)"),
    (("train", "epochs"), -1, "train.epochs: expected an integer > 0"),
    (("train", "steps"), 0, "train.steps: expected an integer > 0"),
    (("train", "seed"), -5, "train.seed: expected an integer >= 0, got -5"),
    (("train", "seed"), 1.5, "train.seed: expected an integer >= 0, got 1.5 (number)"),
    (("train", "log_every"), 0, "train.log_every: expected an integer > 0"),
    (("train", "checkpoint_every"), -1, "train.checkpoint_every: expected an integer >= 0"),
    (("train", "checkpoint_every"), "weekly", "train.checkpoint_every: expected an integer >= 0, epoch or never, got 'weekly'"),
    (("train", "graph"), 1, "train.graph: expected true or false, got 1 (integer)"),
    (("train", "eval_batch_size"), 0, "train.eval_batch_size: expected an integer > 0"),
    (("train", "lr"), 0.1, "train.lr: unknown key 'lr'; valid keys: batch_size"),
    (("device",), "gpu", "device: expected one of auto, cuda, host, got 'gpu'"),
    (("math",), "fp8", "math: expected one of fp32, tf32, bf16, fp16, got 'fp8'"),
    (("train", "optimizer"), {"name": "adamw", "lr": 0.1, "eps": 1e-50},
     "train.optimizer.eps: expected at least 1.17549e-38 (float32's smallest normal number; a smaller one is 0 or a "
     "denormal on the device), got 1e-50"),
    (("train", "optimizer"), {"name": "adam", "lr": 0.1, "eps": 1e39},
     "train.optimizer.eps: expected at most 3.40282e+38 (float32's largest magnitude), got 1e+39"),
    (("train", "optimizer"), {"lr": 1e39}, "train.optimizer.lr: expected at most 3.40282e+38 (float32's largest magnitude)"),
    (("model", 0), {"type": "batchnorm", "eps": 1.0e39},
     "model[0].eps: expected at most 3.40282e+38 (float32's largest magnitude), got 1e+39"),
    (("model", 0), {"type": "activation", "mode": "clipped_relu", "coef": 1e39},
     "model[0].coef: expected at most 3.40282e+38 (float32's largest magnitude), got 1e+39"),
    (("model", 0), {"type": "activation", "mode": "elu", "coef": -1e39},
     "model[0].coef: expected at least -3.40282e+38 (float32's largest magnitude), got -1e+39"),
    (("data", "normalize"), {"mean": 1e39, "std": 1.0},
     "data.normalize.mean: expected at most 3.40282e+38 (float32's largest magnitude), got 1e+39"),
    (("data", "normalize"), {"mean": 0.5, "std": 1e39},
     "data.normalize.std: expected at most 3.40282e+38 (float32's largest magnitude), got 1e+39"),
    (("data", "normalize"), {"mean": 0.5, "std": 1e-50},
     "data.normalize.std: expected at least 1.17549e-38 (float32's smallest normal number"),
    (("data", "normalize"), {"mean": [0.5, 0.5, 0.5], "std": [1.0, 1e39, 1.0]},
     "data.normalize.std.1: expected at most 3.40282e+38 (float32's largest magnitude), got 1e+39"),
    (("data", "normalize"), {"mean": [0.5, -1e39, 0.5], "std": [1.0, 1.0, 1.0]},
     "data.normalize.mean.1: expected at least -3.40282e+38 (float32's largest magnitude), got -1e+39"),
    (("train", "optimizer"), {"name": "adamw", "lr": 0.1, "weight_decay": 1e39},
     "train.optimizer.weight_decay: expected at most 3.40282e+38"),
    (("train", "loss_scale"), "static", "train.loss_scale: expected dynamic or a mapping with initial and "
                                        "growth_interval, got 'static' (string)"),
    (("train", "loss_scale"), 1024, "train.loss_scale: expected dynamic or a mapping"),
    (("train", "loss_scale"), {"initial": 0}, r"train.loss_scale.initial: expected a number in [2^-126, 2^64] "
                                              r"(1.17549e-38 to 1.84467e+19), got 0"),
    (("train", "loss_scale"), {"initial": -2.0}, "train.loss_scale.initial: expected a number in [2^-126, 2^64]"),
    (("train", "loss_scale"), {"initial": 1e-40}, "train.loss_scale.initial: expected a number in [2^-126, 2^64] "
                                                  "(1.17549e-38 to 1.84467e+19), got 1e-40"),
    (("train", "loss_scale"), {"initial": 2.0 ** 65}, "train.loss_scale.initial: expected a number in [2^-126, 2^64]"),
    (("train", "loss_scale"), {"initial": float("inf")}, "train.loss_scale.initial: expected a number, got inf (not finite)"),
    (("train", "loss_scale"), {"growth_interval": 0}, "train.loss_scale.growth_interval: expected an integer in [1, 16777216], got 0"),
    (("train", "loss_scale"), {"growth_interval": 2.5}, "train.loss_scale.growth_interval: expected an integer in [1, 16777216], got 2.5"),
    (("train", "loss_scale"), {"growth_interval": 16777220},
     "train.loss_scale.growth_interval: expected an integer in [1, 16777216], got 16777220"),
    (("train", "loss_scale"), {"growth": 10},
     "train.loss_scale.growth: unknown key 'growth' for loss_scale; valid keys: initial, growth_interval"),
]


@pytest.mark.parametrize("path, value, fragment", INVALID, ids=[".".join(map(str, case[0])) for case in INVALID])
def test_invalid_values_name_file_key_and_what_is_valid(path, value, fragment):
    with pytest.raises(ConfigError) as caught:
        parse_config(_set(minimal(), path, value), source="cfg.yaml")
    message = str(caught.value)
    assert message.startswith("cfg.yaml: ") and "\n" not in message
    assert fragment in message, message


def test_config_errors_are_usage_errors():
    assert issubclass(ConfigError, UsageError)


def test_top_level_must_be_a_mapping():
    with pytest.raises(ConfigError, match=r"^x\.yaml: the top level must be a mapping .*got \[1, 2\] \(list\)"):
        parse_config([1, 2], source="x.yaml")


@pytest.mark.parametrize("text, fragment", [
    ("", "the file is empty"),
    ("# only a comment\n", "the file is empty"),
    ("model: [unclosed\n", "not valid YAML: line 2, column 1"),
    ("model:\n\t- dense\n", "not valid YAML"),
    ("- just\n- a list\n", "the top level must be a mapping"),
    ("just a string", "the top level must be a mapping"),
    ("model: !!python/object:os.system {}\n", "refused the tag !!python/object:os.system"),
    ("model: !!python/object/apply:os.system [echo pwned]\n", "refused the tag !!python/object/apply:os.system"),
    ("!!python/name:os.system\n", "may not create Python objects"),
    ("lr: !custom 1\n", "unknown YAML tag !custom"),
])
def test_file_level_errors_name_the_file(tmp_path, text, fragment):
    path = write(tmp_path, text, "broken.yaml")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert str(path) in message and fragment in message and "\n" not in message


@pytest.mark.parametrize("text, fragment", [
    ("model: " + "[" * 5000 + "]" * 5000 + "\n", "line 1, column 39: nested deeper than 32 levels"),
    ("model: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n", "nested deeper than 32 levels"),
    ("model:\n  - {type: dense, out_size: 1" + "0" * 5000 + "}\n",
     "line 2, column 29: an integer of 5001 characters is too long to read; every integer setting is at most 2147483647"),
    ("train:\n  optimizer: {lr: 0.1}\n  batch_size: 8\n  optimizer: {lr: 0.01}\n",
     "line 4, column 3: duplicate key 'optimizer' (also on line 2); each key may appear once"),
    ("model: {type: dense, lr: 1, lr: 2}\n", "line 1, column 29: duplicate key 'lr' (also on line 1)"),
    ("m0: &m0 {k0: 1}\n" + "".join(f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}], k{i}: 1}}\n" for i in range(1, 16)),
     "line 14, column 6: the merges (<<) here bring more than 10000 keys into one mapping"
     if pyyaml_copies_merged_keys() else "m0: unknown key 'm0'"),  # a PyYAML keeping each key once reads it
    ("b: &b {" + ", ".join(f"k{i}: 1" for i in range(6000)) + "}\nw: {<<: [*b, *b, *b]}\n",
     "line 2, column 4: the merges (<<) here bring more than 10000 keys"),
], ids=["deep lists", "deep mappings", "long integer", "a key twice", "a key twice in a flow mapping",
        "merges doubling at each line", "one mapping merged many times"])
def test_documents_python_cannot_read_are_config_errors_with_the_line(tmp_path, text, fragment):
    path = write(tmp_path, text, "hostile.yaml")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: ") and fragment in str(caught.value)


def test_a_model_of_more_than_max_layers_is_refused_before_any_layer_is_read(tmp_path):
    """10 001 layers in 60 KB of aliases (a config of 100 000 did not finish building in 90 s)."""
    path = write(tmp_path, "model: [&a {type: activation, mode: relu}" + ", *a" * 10_000 + "]\n"
                           "train: {optimizer: {lr: 0.1}}\n")
    with pytest.raises(ConfigError, match=rf"^{path}: model: a model holds at most 10000 layers, got 10001$"):
        load_config(path)
    settings = minimal()
    settings["model"] = [{"type": "no such layer"}] * 10_001  # not read: the count is refused first
    with pytest.raises(ConfigError, match="model: a model holds at most 10000 layers, got 10001$"):
        parse_config(settings)
    settings["model"] = [{"type": "activation", "mode": "relu"}] * 9_999 + [{"type": "softmax"}]
    assert len(parse_config(settings).model) == 10_000


def test_merges_and_aliases_give_what_they_name(tmp_path):
    """A layer's settings merged from an earlier layer's (``<<: *conv``) and overridden; an alias for a list."""
    path = write(tmp_path, "model:\n  - &conv {type: conv2d, name: c1, out_channels: 4, kernel_size: 3, padding: 1}\n"
                           "  - {<<: *conv, name: c2, out_channels: 8}\n  - {type: dense, out_size: 10}\n"
                           "  - {type: softmax}\ntrain: {optimizer: {name: adam, lr: 0.01, betas: &betas [0.8, 0.9]}}\n",
                 "merged.yaml")
    config = load_config(path)
    assert [(layer.name, layer.params["out_channels"], layer.params["padding"]) for layer in config.model[:2]] \
        == [("c1", 4, 1), ("c2", 8, 1)]
    assert config.train.optimizer.betas == (0.8, 0.9)


def test_a_config_longer_than_the_limit_is_refused_without_reading_it_all(tmp_path):
    path = write(tmp_path, "# padding\n" * 200_000, "long.yaml")
    with pytest.raises(ConfigError, match=r"long\.yaml: longer than 1048576 bytes; a config is a short YAML file"):
        load_config(path)


INTEGER_KEYS = [("model", 0, "out_size"), ("train", "batch_size"), ("train", "epochs"), ("train", "steps"),
                ("train", "seed"), ("train", "log_every"), ("train", "checkpoint_every"), ("train", "eval_batch_size")]


@pytest.mark.parametrize("path", INTEGER_KEYS, ids=lambda path: ".".join(map(str, path)))
@pytest.mark.parametrize("value", [2**31, 10**20, 10**30])
def test_absurd_integers_are_refused_naming_the_key(path, value):
    with pytest.raises(ConfigError) as caught:
        parse_config(_set(minimal(), path, value), source="cfg.yaml")
    key = ".".join(str(part) for part in path).replace(".0.", "[0].")
    assert f"cfg.yaml: {key}: expected an integer" in str(caught.value)
    assert "at most 2147483647 (2^31 - 1)" in str(caught.value)


def test_the_largest_integers_are_accepted():
    config = parse_config(_set(_set(minimal(), ("train", "seed"), 2**31 - 1), ("train", "epochs"), 2**31 - 1))
    assert config.train.seed == config.train.epochs == 2**31 - 1


def test_a_training_config_describes_its_model_with_every_top_level_key(tmp_path):
    """predict --config reads the model and data of any config training takes (engine: fast was refused)."""
    path = write(tmp_path, LENET_YAML + "engine: fast\n")
    assert load_config(path).engine == "fast"
    description = load_model_description(path)
    assert description.model == load_config(path).model and description.data.pad == 2


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"config file .*absent\.yaml does not exist"):
        load_config(tmp_path / "absent.yaml")


def test_directory_and_binary_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00model")
    with pytest.raises(ConfigError, match=r"binary\.yaml: not UTF-8 text"):
        load_config(binary)


def test_error_messages_keep_long_values_short():
    with pytest.raises(ConfigError) as caught:
        parse_config(_set(minimal(), ("device",), "x" * 10_000))
    assert len(str(caught.value)) < 200


@pytest.mark.parametrize("optimizer, expected", [
    ({"name": "adam", "lr": 0.001}, OptimizerConfig(0.001, "adam", betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)),
    ({"name": "adamw", "lr": 0.002, "betas": [0.8, 0.99], "eps": 1.0e-6},
     OptimizerConfig(0.002, "adamw", betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01)),
    ({"name": "adamw", "lr": 0.002, "weight_decay": 0}, OptimizerConfig(0.002, "adamw", weight_decay=0.0)),
])
def test_adam_optimizers_are_read_with_defaults_and_round_trip(optimizer, expected):
    raw = {"model": [{"type": "dense", "out_size": 10}, {"type": "softmax"}],
           "train": {"optimizer": optimizer, "schedule": {"name": "cosine", "warmup_steps": 50}}}
    config = parse_config(raw)
    assert config.train.optimizer == expected
    assert config.train.schedule == ScheduleConfig("cosine", warmup_steps=50)
    assert parse_config(config.to_dict()) == config


@pytest.mark.parametrize("path", sorted((REPO_ROOT / "configs").glob("*.yaml")), ids=lambda path: path.name)
def test_shipped_configs_load_and_round_trip(path):
    config = load_config(path)
    assert parse_config(config.to_dict()) == config


# ---- fuzzing -------------------------------------------------------------------------------

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 2000), st.floats(allow_nan=True),
                     st.sampled_from(["mnist", "sgd", "relu", "max", "step", "inverse", "auto", "fp32", "x", ""]))
_KEYS = st.sampled_from(["model", "data", "train", "device", "math", "type", "name", "out_size", "mode", "coef",
                         "kernel_size", "stride", "padding", "optimizer", "lr", "schedule", "decay", "gamma",
                         "step_size", "normalize", "mean", "std", "pad", "steps", "epochs", "graph", "placement"])
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(_KEYS, inner, max_size=3)), max_leaves=8)


def _optional(**keys) -> st.SearchStrategy:
    return st.fixed_dictionaries({}, optional=keys)


_NUMBERS = st.one_of(st.integers(1, 8), st.floats(0.01, 0.99), st.integers(-2, 40), st.floats(-1, 2), _SCALARS)
_REQUIRED_KEYS = {"dense": ("out_size",), "activation": ("mode",), "softmax": (), "mse": (),
                  "conv2d": ("out_channels", "kernel_size"), "pooling": ("kernel_size",)}
_OPTIONAL_KEYS = {"activation": ("coef",), "conv2d": ("stride", "padding", "dilation"),
                  "pooling": ("stride", "padding", "mode")}
_MODES = st.sampled_from(["relu", "elu", "clipped_relu", "tanh", "max", "average", "gelu"])


def _layer_values(keys) -> dict:
    return {key: _MODES if key == "mode" else _NUMBERS for key in keys}


_LAYER = st.one_of(*(
    st.fixed_dictionaries({"type": st.just(layer_type), **_layer_values(required)},
                          optional={**_layer_values(_OPTIONAL_KEYS.get(layer_type, ())),
                                    "name": st.sampled_from(["a", "b", "fc-1", "bad name"])})
    for layer_type, required in _REQUIRED_KEYS.items()
))
_LAYERS = st.one_of(st.lists(_LAYER, max_size=3).map(lambda body: body + [{"type": "softmax"}]),
                    st.lists(_LAYER, max_size=4), st.sampled_from([None, [], 3, "dense"]))
_CONFIG_SHAPED = st.fixed_dictionaries({"model": _LAYERS}, optional=dict(
    data=_optional(normalize=st.one_of(st.booleans(), _optional(mean=_NUMBERS, std=_NUMBERS)), pad=_NUMBERS,
                   dataset=_SCALARS, placement=st.one_of(st.sampled_from(["auto", "device", "host"]), _SCALARS)),
    train=_optional(optimizer=st.fixed_dictionaries({"lr": _NUMBERS}, optional={"momentum": _NUMBERS, "nesterov": _SCALARS}),
                    schedule=_optional(name=st.sampled_from(["constant", "inverse", "step"]), decay=_NUMBERS,
                                       step_size=_NUMBERS, gamma=_NUMBERS),
                    batch_size=_NUMBERS, steps=_NUMBERS, seed=_NUMBERS),
    device=st.sampled_from(["auto", "cuda", "host", "tpu"]),
))


def _parse_or_config_error(raw) -> None:
    try:
        config = parse_config(raw, source="fuzz")
    except ConfigError as error:
        assert str(error).startswith("fuzz: ") and "\n" not in str(error)
        return
    assert isinstance(config, Config)
    assert parse_config(config.to_dict()) == config


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(_KEYS, _VALUES, max_size=5))
def test_random_mappings_load_or_raise_config_error(raw):
    _parse_or_config_error(raw)


@settings(max_examples=150, deadline=None)
@given(_CONFIG_SHAPED)
def test_random_config_shaped_mappings_load_or_raise_config_error(raw):
    _parse_or_config_error(raw)


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, prefix + (index,))


_VALID = yaml.safe_load(LENET_YAML)
_VALID_PATHS = [path for path in _paths(_VALID) if path]


@settings(max_examples=150, deadline=None)
@given(path=st.sampled_from(_VALID_PATHS), value=st.one_of(_VALUES, st.just(_DELETE)))
def test_mutated_valid_configs_load_or_raise_config_error(path, value):
    _parse_or_config_error(_set(_VALID, path, value))


@settings(max_examples=150, deadline=None)
@given(cut=st.integers(0, len(LENET_YAML)), length=st.integers(0, 8),
       insert=st.text(alphabet=":-[]{}!&*#|>'\"\t\n %@`,0123456789.e", max_size=6))
def test_edited_yaml_text_loads_or_raises_config_error(tmp_path_factory, cut, length, insert):
    path = tmp_path_factory.mktemp("fuzz") / "edited.yaml"
    path.write_text(LENET_YAML[:cut] + insert + LENET_YAML[cut + length:])
    try:
        config = load_config(path)
    except ConfigError as error:
        assert str(error).startswith(str(path)) and "\n" not in str(error)
        return
    assert parse_config(config.to_dict()) == config


def test_own_data_keys_survive_the_round_trip_through_to_dict():
    raw = minimal()
    raw["data"] = {"dataset": "image-folder", "dir": "photos", "image_size": 24, "channels": 3, "corrupt": "skip",
                   "normalize": {"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.2, 0.25]}, "test_fraction": 0.1,
                   "split_seed": 3, "classes": ["cat", "dog"], "shape": [3, 24, 24]}
    data = parse_config(raw).data
    assert data.image_size == (24, 24) and data.channels == 3 and data.normalize == ((0.5, 0.4, 0.3), (0.2, 0.2, 0.25))
    assert parse_config({**raw, "data": data.to_dict()}).data == data
    raw["data"] = {"dataset": "cifar10", "normalize": True}
    assert parse_config(raw).data.normalize == "computed"  # the training set's, for a data set other than MNIST


@pytest.mark.parametrize("value, expected", [
    (None, (65536.0, 2000)),
    ("dynamic", (65536.0, 2000)),
    ({"initial": 1024}, (1024.0, 2000)),
    ({"initial": 1.0e-30}, (1e-30, 2000)),  # below the scale's floor, 2^-24, but float32's 1/S is finite
    ({"growth_interval": 50}, (65536.0, 50)),
    ({"initial": 0.5, "growth_interval": 1}, (0.5, 1)),
])
def test_loss_scale_is_dynamic_by_default_and_round_trips(value, expected):
    """train.loss_scale (math fp16): ``dynamic`` or {initial, growth_interval}; the defaults are not written back."""
    raw = _set(minimal(), ("math",), "fp16")
    if value is not None:
        raw = _set(raw, ("train", "loss_scale"), value)
    config = parse_config(raw)
    assert (config.train.loss_scale.initial, config.train.loss_scale.growth_interval) == expected
    assert config.math == "fp16" and parse_config(config.to_dict()) == config
    assert ("loss_scale" in config.to_dict()["train"]) == (expected != (65536.0, 2000))


LAYER_ENTRIES = {  # a valid entry of each layer type, before an unknown key is added
    "dense": {"out_size": 10}, "activation": {"mode": "relu"}, "softmax": {}, "mse": {},
    "conv2d": {"out_channels": 4, "kernel_size": 3}, "pooling": {"kernel_size": 2}, "dropout": {},
    "batchnorm": {}, "global_average_pooling": {},
}


def with_layer(layer_type: str, **extra) -> dict:
    """minimal() with a ``layer_type`` entry: the loss layer where it is one, else the first layer."""
    raw = minimal()
    raw["model"][1 if layer_type in ("softmax", "mse") else 0] = {"type": layer_type, **LAYER_ENTRIES[layer_type],
                                                                 **extra}
    return raw


@pytest.mark.parametrize("layer_type", sorted(LAYER_ENTRIES))
def test_a_layer_entry_takes_the_keys_of_its_layers_constructor(layer_type):
    """The layer classes are the schema of their config keys: a key outside the constructor's
    parameters is refused, and the message lists them in the constructor's order."""
    import inspect

    from cudnnnet.layers import LAYER_TYPES

    parameters = list(inspect.signature(LAYER_TYPES[layer_type].__init__).parameters)
    keys = ", ".join(["type", "name", *parameters[parameters.index("name") + 1:]])
    with pytest.raises(ConfigError, match=rf"^<dict>: model\[\d\]\.colour: unknown key 'colour' for a {layer_type} "
                                          rf"layer; valid keys: {keys}$"):
        parse_config(with_layer(layer_type, colour="red"))


def test_every_layer_type_is_a_config_entry_whose_keys_build_the_layer():
    """Each layer type's entry is read and its parameters, defaults filled in, are the constructor's
    keywords: a layer type added to LAYER_TYPES with keys needs their value checks in config_layers."""
    from cudnnnet.config.layers import VALUE_CHECKS
    from cudnnnet.layers import LAYER_TYPES

    assert set(LAYER_ENTRIES) == set(LAYER_TYPES)
    for layer_type, layer in LAYER_TYPES.items():
        assert (layer_type in VALUE_CHECKS) == bool(layer.config_keys()), layer_type
        spec = next(spec for spec in parse_config(with_layer(layer_type)).model if spec.type == layer_type)
        assert set(spec.params) <= set(layer.config_keys())
        assert layer(spec.name, **spec.params).config() == spec.params


@pytest.mark.parametrize("layer_type, modes", [("activation", "relu, sigmoid, tanh, clipped_relu, elu"),
                                               ("pooling", "max, average"),
                                               ("batchnorm", "auto, spatial, per_activation")])
def test_a_layers_modes_are_the_ones_its_config_entry_takes(layer_type, modes):
    """One vocabulary per layer: the config refuses a mode the layer refuses, listing the same modes."""
    from cudnnnet.layers import LAYER_TYPES

    with pytest.raises(ConfigError, match=rf"model\[0\]\.mode: expected one of {modes}, got 'cubic'"):
        parse_config(with_layer(layer_type, mode="cubic"))
    with pytest.raises(InvalidArgumentError, match=rf"unknown .*mode 'cubic'; valid modes are {modes}$"):
        LAYER_TYPES[layer_type]("layer", **{**LAYER_ENTRIES[layer_type], "mode": "cubic"})
