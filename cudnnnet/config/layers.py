"""The model section of a config: each layer entry read into a LayerSpec. The keys a layer type takes
are its constructor's (``Layer.config_keys``); the functions here check each key's value, with the
config's key paths in their messages, before the layer is built."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ConfigError
from ..layers import LAYER_TYPES, LossLayer
from ..layers.activation import MODES as ACTIVATION_MODES
from ..layers.batchnorm import MODES as BATCH_NORM_MODES
from ..layers.pooling import MODES as POOLING_MODES
from ..limits import too_many_layers
from .section import _describe, _float32, _Section

LOSS_LAYERS = tuple(name for name, layer in LAYER_TYPES.items() if issubclass(layer, LossLayer))
LAYER_NAME_LENGTH = 128  # within a zip member name and a file name (NAME_MAX 255) with a suffix
LAYER_NAME = re.compile(rf"[A-Za-z0-9_-]{{1,{LAYER_NAME_LENGTH}}}")


@dataclass(frozen=True)
class LayerSpec:
    """One layer: its type, unique name, and its validated parameters with defaults filled in."""

    type: str
    name: str
    params: dict = field(hash=False)

    @property
    def is_loss(self) -> bool:
        return self.type in LOSS_LAYERS

    def to_dict(self) -> dict:
        return {"type": self.type, "name": self.name, **self.params}


def _dense(layer: _Section) -> dict:
    return {"out_size": layer.integer("out_size", low=0, low_open=True)}


def _activation(layer: _Section) -> dict:
    mode = layer.choice("mode", ACTIVATION_MODES)
    if mode == "clipped_relu":
        coef = layer.number("coef", low=0.0, low_open=True)
    else:
        coef = layer.number("coef", 1.0 if mode == "elu" else 0.0)
    return {"mode": mode, "coef": _float32(layer, "coef", coef)}


def _conv2d(layer: _Section) -> dict:
    params = {
        "out_channels": layer.integer("out_channels", low=0, low_open=True),
        "kernel_size": layer.integer("kernel_size", low=0, low_open=True),
        "stride": layer.integer("stride", 1, low=0, low_open=True),
        "padding": layer.integer("padding", 0, low=0),
        "dilation": layer.integer("dilation", 1, low=0, low_open=True),
    }
    # bias: false only where written, so a layer with a bias reads as it did before the key existed
    return params if layer.boolean("bias", True) else {**params, "bias": False}


def _pooling(layer: _Section) -> dict:
    kernel_size = layer.integer("kernel_size", low=0, low_open=True)
    return {
        "kernel_size": kernel_size,
        "stride": layer.integer("stride", kernel_size, low=0, low_open=True),
        "padding": layer.integer("padding", 0, low=0, high=kernel_size - 1),
        "mode": layer.choice("mode", POOLING_MODES, "max"),
    }


def _dropout(layer: _Section) -> dict:
    return {"rate": layer.number("rate", 0.5, low=0.0, high=1.0, high_open=True, float32=True)}


def _batchnorm(layer: _Section) -> dict:
    return {
        "mode": layer.choice("mode", BATCH_NORM_MODES, "auto"),
        "momentum": layer.number("momentum", 0.1, low=0.0, high=1.0, low_open=True, float32=True),
        "eps": _float32(layer, "eps", layer.number("eps", 1e-5, low=1e-5)),
        **({"sync": True} if layer.boolean("sync", False) else {}),
    }


VALUE_CHECKS: dict[str, Callable[[_Section], dict]] = {  # a layer type's keys (Layer.config_keys) -> params
    "dense": _dense,
    "activation": _activation,
    "conv2d": _conv2d,
    "pooling": _pooling,
    "dropout": _dropout,
    "batchnorm": _batchnorm,
}


def _params(layer_type: str, layer: _Section) -> dict:
    """The validated parameters of a ``layer_type`` entry; a type whose constructor takes no keys has none."""
    check = VALUE_CHECKS.get(layer_type)
    return {} if check is None else check(layer)


def _parse_layer(value: Any, path: str, source: str, type_counts: Counter) -> LayerSpec:
    layer = _Section(value, path, source)
    layer_type = layer.choice("type", tuple(LAYER_TYPES))
    layer.only(("type", "name") + LAYER_TYPES[layer_type].config_keys(), context=f"a {layer_type} layer")
    type_counts[layer_type] += 1
    name = layer.get("name", f"{layer_type}{type_counts[layer_type]}", "a name")
    if not isinstance(name, str) or not LAYER_NAME.fullmatch(name):
        layer.fail("name", f"expected a name of letters, digits, '_' and '-' (at most {LAYER_NAME_LENGTH} characters), "
                           f"got {_describe(name)}")
    return LayerSpec(layer_type, name, _params(layer_type, layer))


def parse_model(value: Any, source: str) -> tuple[LayerSpec, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{source}: model: expected a non-empty list of layers (mappings with a type), "
                          f"got {_describe(value)}")
    problem = too_many_layers(len(value))
    if problem:  # refused before any layer is read
        raise ConfigError(f"{source}: model: {problem}")
    type_counts: Counter = Counter()
    layers = tuple(_parse_layer(item, f"model[{index}]", source, type_counts) for index, item in enumerate(value))
    _check_names(layers, source)
    _check_loss_last(layers, source)
    return layers


def _check_names(layers: tuple[LayerSpec, ...], source: str) -> None:
    first_index: dict[str, int] = {}
    for index, layer in enumerate(layers):
        if layer.name in first_index:
            raise ConfigError(f"{source}: model[{index}].name: duplicate layer name {layer.name!r} "
                              f"(also model[{first_index[layer.name]}]); layer names must be unique")
        first_index[layer.name] = index


def _check_loss_last(layers: tuple[LayerSpec, ...], source: str) -> None:
    last = len(layers) - 1
    for index, layer in enumerate(layers[:-1]):
        if layer.is_loss:
            raise ConfigError(f"{source}: model[{index}].type: loss layer {layer.type!r} may only be the "
                              f"last layer (model[{last}])")
    if not layers[-1].is_loss:
        raise ConfigError(f"{source}: model[{last}].type: the last layer must be a loss layer "
                          f"({' or '.join(LOSS_LAYERS)}), got {layers[-1].type!r}")
