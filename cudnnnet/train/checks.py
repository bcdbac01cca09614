"""The rules a training run is checked against before its first step, each in one function that
cudnnnet-train (on the config, before any data is read) and the Trainer (once the data is read)
both call: the model fits its input and every tensor fits, it ends in one score per class, a
BatchNorm never takes a statistic over one value, and a resumed checkpoint holds the same model."""

from __future__ import annotations

from ..data.mnist import SPLIT_COUNTS
from ..data.sources import class_names
from ..errors import CheckpointError, ConfigError, InvalidArgumentError, ShapeError, TensorSizeError
from ..layers import LAYER_TYPES, BatchNorm
from ..network import ModelSizeError, Network, check_model_size
from .setup import input_shape, smallest_input_shape


def check_model(config) -> None:
    """Every layer fits the output of the one before it, the last gives one score per class, and
    every tensor fits (``check_model_fits``).

    Raises ConfigError naming the config file and the layer, before anything is built or loaded.
    """
    if input_shape(config) is not None:
        check_normalize(config, input_shape(config)[0])
    shape = check_model_fits(config)
    classes = class_names(config)
    if shape is not None and classes is not None:
        check_ends_in_class_scores(config, shape, classes, f"{config.data.dataset} needs")


def check_model_fits(config, images: tuple[int, int] = (SPLIT_COUNTS["train"], SPLIT_COUNTS["test"])):
    """The per-image output shape of the model's last layer, where each layer fits the output of the one
    before it and every tensor fits (``check_size``, ``images``: the training and test images, which
    bound the batches); ConfigError naming the config file and the layer where one does not. None
    where the input's shape is for the data to say (cudnnnet-train's check before the data is read;
    the Trainer checks again once it is)."""
    shape = smallest_input_shape(config)  # where only the images' channels are unknown: one, the least they make
    if shape is None:
        return None
    for index, spec in enumerate(config.model):
        try:
            shape = LAYER_TYPES[spec.type](spec.name, **spec.params).output_sample_shape(shape)
        except (ShapeError, InvalidArgumentError) as error:
            raise ConfigError(f"{config.source}: {_model_key(config, index)}: {error}") from None
    check_size(config, images)
    return shape


def check_normalize(config, channels: int) -> None:
    """A mean and std given per channel give one value, or one for each of the images' channels."""
    if not isinstance(config.data.normalize, tuple):
        return
    for key, value in zip(("mean", "std"), config.data.normalize):
        count = len(value) if isinstance(value, tuple) else 1
        if count not in (1, channels):
            valid = "1" if channels == 1 else f"1 or {channels}"
            raise ConfigError(f"{config.source}: data.normalize.{key}: {count} values (one per channel) for "
                              f"{config.data.dataset}'s images of {channels} channel{'s' if channels > 1 else ''}; "
                              f"give {valid}")


def check_size(config, images: tuple[int, int] = (SPLIT_COUNTS["train"], SPLIT_COUNTS["test"])) -> None:
    """The model's tensors, for the largest batch the run makes (of ``images``: the training and test
    images, at most), fit the libraries and this machine (see ``check_model_size``); checked before any
    array is made, on a model whose shapes fit (with one channel where the images' channels are not
    known yet)."""
    shape = smallest_input_shape(config)
    if shape is None:  # the data says it: the Trainer checks its sizes once it is read
        return
    layers = [LAYER_TYPES[spec.type](spec.name, **spec.params) for spec in config.model]
    batch = max(min(config.train.batch_size, images[0]), min(config.train.eval_batch_size, images[1]))
    try:
        check_model_size(layers, shape, batch)
    except ModelSizeError as error:
        raise ConfigError(f"{config.source}: {_model_key(config, error.index)}: {error}; make the model or "
                          f"train.batch_size / train.eval_batch_size smaller") from None
    except TensorSizeError as error:
        raise ConfigError(f"{config.source}: data.pad: {error}; make data.pad or train.batch_size smaller") from None


def _model_key(config, index: int | None) -> str:
    return "model" if index is None else f"model[{index}] ({config.model[index].type})"


def check_class_scores(network: Network, classes, config) -> None:
    """ConfigError unless there are two classes or more and the network gives one score per class,
    shape (classes, 1, 1)."""
    if len(classes) < 2:
        raise ConfigError(f"{config.source}: the data has {len(classes)} class ({', '.join(classes)}); a classifier "
                          f"needs at least 2 (for image-folder, one sub-folder per class)")
    check_ends_in_class_scores(config, network.output_shapes(network.input_shape)[-1], classes,
                               f"the data has {len(classes)} classes, so it needs")


def check_ends_in_class_scores(config, shape, classes, whose: str) -> None:
    """ConfigError unless a model whose last layer gives ``shape`` per image gives one score per class,
    shape (classes, 1, 1): the rule the command line checks from the config and the Trainer from the data.
    ``whose``: who needs them, as the message says it ("mnist needs", "the data has 3 classes, so it needs")."""
    if tuple(shape) != (len(classes), 1, 1):
        raise ConfigError(f"{config.source}: model[{len(config.model) - 1}]: the model ends in outputs of shape "
                          f"{tuple(shape)} per image; {whose} {len(classes)} class scores, shape ({len(classes)}, 1, 1) "
                          f"(a last dense layer with out_size {len(classes)})")


def check_batch_statistics(network: Network, batch_size: int, samples: int, config) -> None:
    """ConfigError where a BatchNorm layer would take a statistic over one value in training: a batch
    of one image (the full batch, or the epoch's last one of ``samples`` images) through a BatchNorm
    per activation, or over 1×1 planes."""
    last = samples % batch_size or batch_size
    for index, layer in enumerate(network.layers):
        if not isinstance(layer, BatchNorm):
            continue
        for batch in sorted({min(batch_size, samples), last}):
            if layer.values_per_statistic(batch) > 1:
                continue
            where = ("train.batch_size is 1" if batch == batch_size else
                     f"the epoch's last batch holds 1 of its {samples} training images")
            raise ConfigError(f"{config.source}: model[{index}] (batchnorm {layer.name!r}): {where}, and batch "
                              f"normalisation over one value per statistic outputs β alone (no gradient reaches the "
                              f"layers before it) and has no variance to estimate; choose a train.batch_size that "
                              f"leaves at least 2 images in every batch")


def check_resumed_model(path, metadata: dict, config, config_name: str) -> None:
    """CheckpointError unless the checkpoint at ``path`` (``metadata``: its metadata) holds a training
    config and was trained with the model of ``config`` (``config_name`` names it in the message)."""
    stored = metadata.get("config")
    saved = stored.get("model") if isinstance(stored, dict) else None
    if not isinstance(saved, list):
        raise CheckpointError(f"{path}: no training config in its metadata; it can be loaded but not resumed")
    difference = model_difference(saved, config.to_dict()["model"])
    if difference:
        raise CheckpointError(f"{path}: trained with a different model than {config_name}: {difference}")


def model_difference(saved: list, wanted: list) -> str | None:
    """How the layers ``saved`` in a checkpoint's config differ from those ``wanted`` (each a
    ``LayerSpec.to_dict()``): the first layer that differs, or the counts; None where they are the same."""
    for index, (theirs, ours) in enumerate(zip(saved, wanted)):
        if theirs != ours:
            return f"model[{index}] is {_layer_text(theirs)} in the checkpoint, {_layer_text(ours)} in the config"
    if len(saved) != len(wanted):
        return f"{len(saved)} layers in the checkpoint, {len(wanted)} in the config"
    return None


def _layer_text(layer) -> str:
    if not isinstance(layer, dict):
        return repr(layer)
    params = ", ".join(f"{key}={value!r}" for key, value in layer.items() if key not in ("type", "name"))
    return f"{layer.get('type')} {layer.get('name')!r}" + (f" ({params})" if params else "")
