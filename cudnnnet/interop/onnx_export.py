"""A network as an ONNX model (opset 17), run by onnxruntime and any other ONNX runtime.

    graph input   pixels         float32 (N, C, H, W): the image's pixels / 255, N free
    preprocessing Pad, Sub, Div  zero padding then (x − mean) / std, as the network was trained
    layers        Dense → Flatten (where the input is a plane) + Gemm (transB: W is (out, in))
                  Conv2D → Conv;  Pooling → MaxPool / AveragePool (count_include_pad, as cuDNN's)
                  Activation → Relu, Sigmoid, Tanh, Clip(0, coef) (clipped_relu), Elu(coef)
                  BatchNorm → BatchNormalization (inference: the running statistics); per activation
                  on a plane, over the flattened values and reshaped back
                  Dropout → nothing;  GlobalAveragePooling → GlobalAveragePool
    graph output  Softmax → probabilities (N, classes);  MSE → outputs (N, values)
    metadata      classes (JSON list), input_shape (JSON [C, H, W]), normalize, pad

A layer the exporter has no ONNX form for is refused with ExportError naming it, before anything
is written. The file is written atomically.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..backends.descriptors import BatchNormMode
from ..errors import ExportError, MissingExtraError, WriteError
from ..float_images import channel_values
from ..inference import network_classes, training_normalize
from ..io.files import atomic_write
from ..layers import (MSE, Activation, BatchNorm, Conv2D, Dense, Dropout, GlobalAveragePooling, Pooling,
                      Softmax)

log = logging.getLogger(__name__)

OPSET = 17
IR_VERSION = 8  # the IR of opset 17: runtimes from onnxruntime 1.12 on read it
INPUT_NAME = "pixels"
BATCH = "N"
MAX_PROTOBUF_BYTES = 2**31 - 1  # one protobuf message; larger models need external data, not written here
EXTRA_HINT = "pip install 'cudnnnet[onnx]'"


class Preprocessing(NamedTuple):
    """What turns pixels / 255 into the network's input, and what names its outputs."""

    normalize: tuple | None  # (mean, std), each one value or one per channel; None: none
    pad: int  # zeros on each side of the image, before normalising
    classes: tuple[str, ...]


def preprocessing_of(network) -> Preprocessing:
    """The preprocessing the network was trained with, from its checkpoint's config (none without one)."""
    config = network.training_config
    return Preprocessing(training_normalize(network), 0 if config is None else config.data.pad, network_classes(network))


def require_onnx():
    """The ``onnx`` module, or MissingExtraError naming the extra to install."""
    try:
        import onnx
    except ImportError:
        raise MissingExtraError(f"ONNX export needs the onnx package, which is not installed: {EXTRA_HINT}") from None
    return onnx


def export_onnx(network, path: str | os.PathLike, preprocessing: Preprocessing | None = None) -> Path:
    """Write ``network`` (built, as trained) to ``path`` as an ONNX model; returns the path.

    Raises ExportError naming a layer ONNX cannot express, MissingExtraError without ``onnx``, and
    WriteError where the file cannot be written (a file already there is then left as it was).
    """
    onnx = require_onnx()
    if network.input_shape is None:
        raise ExportError("cannot export: the network is not built yet (Network.load a checkpoint, or train one)")
    preprocessing = preprocessing_of(network) if preprocessing is None else preprocessing
    graph = _Graph(onnx, network, preprocessing)
    model = _model(onnx, graph.build(), graph.metadata())
    onnx.checker.check_model(model, full_check=True)
    _write(Path(path), model)
    return Path(path)


def _model(onnx, graph, metadata: dict[str, str]):
    from .. import __version__

    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", OPSET)],
                                   ir_version=IR_VERSION, producer_name="cudnnnet", producer_version=__version__)
    onnx.helper.set_model_props(model, metadata)
    return model


def _write(path: Path, model) -> None:
    size = model.ByteSize()
    if size > MAX_PROTOBUF_BYTES:
        raise ExportError(f"{path}: the model takes {size} bytes, more than the {MAX_PROTOBUF_BYTES} one ONNX file "
                          f"without external data may hold")
    try:
        with atomic_write(path) as file:
            file.write(model.SerializeToString())
    except OSError as exc:
        raise WriteError(f"{path}: cannot write the ONNX model ({' '.join(str(exc).split())})") from exc
    log.info("exported %s (ONNX opset %d, %d bytes)", path, OPSET, size)


class _Graph:
    """The nodes and initialisers of one network's graph, made layer by layer.

    ``value`` names the tensor the next layer reads; ``plane`` is whether it is (N, C, H, W) (else the
    flattened (N, C·H·W)); ``shape`` is one sample's (c, h, w) either way.
    """

    def __init__(self, onnx, network, preprocessing: Preprocessing):
        self.onnx, self.helper = onnx, onnx.helper
        self.network, self.preprocessing = network, preprocessing
        self.nodes, self.initializers = [], []
        self.value, self.plane = INPUT_NAME, True
        channels, height, width = network.input_shape
        self.shape = network.input_shape
        self.image_shape = (channels, height - 2 * preprocessing.pad, width - 2 * preprocessing.pad)

    def build(self):
        self._check_layers()
        self._preprocess()
        for layer in self.network.layers:
            self._EXPORTERS[type(layer)](self, layer)
            self.shape = layer.output_sample_shape(self.shape)
        return self.helper.make_graph(self.nodes, "cudnnnet", [self._input()], [self._output()], self.initializers)

    def metadata(self) -> dict[str, str]:
        """The model's metadata_props: what a user of the file needs to feed it and read its output."""
        normalize = self.preprocessing.normalize
        return {"classes": json.dumps(list(self.preprocessing.classes), ensure_ascii=False),
                "input_shape": json.dumps(list(self.image_shape)),
                "input": "float32 (N, C, H, W): the image's pixels / 255",
                "normalize": json.dumps(None if normalize is None else {"mean": _plain(normalize[0]),
                                                                         "std": _plain(normalize[1])}),
                "pad": str(self.preprocessing.pad)}

    def _check_layers(self) -> None:
        for layer in self.network.layers:
            if type(layer) not in self._EXPORTERS:
                known = ", ".join(sorted(cls.__name__ for cls in self._EXPORTERS))
                raise ExportError(f"layer {layer.name!r} ({type(layer).__name__}) cannot be expressed in ONNX by "
                                  f"this exporter; it exports {known}")

    def _input(self):
        return self.helper.make_tensor_value_info(INPUT_NAME, self.onnx.TensorProto.FLOAT, [BATCH, *self.image_shape])

    def _output(self):
        name = self.value
        return self.helper.make_tensor_value_info(name, self.onnx.TensorProto.FLOAT, [BATCH, int(np.prod(self.shape))])

    # ---- helpers ---------------------------------------------------------------------------
    def constant(self, name: str, array) -> str:
        """An initialiser holding ``array`` (float32, or int64 for shapes), under ``name``."""
        array = np.asarray(array)
        array = array.astype(np.int64 if array.dtype.kind in "iu" else np.float32)
        self.initializers.append(self.onnx.numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(self, op: str, inputs: list[str], output: str, **attributes) -> str:
        self.nodes.append(self.helper.make_node(op, inputs, [output], name=output, **attributes))
        self.value = output
        return output

    def flat(self, name: str) -> None:
        """The current value as (N, C·H·W)."""
        if self.plane:
            self.node("Flatten", [self.value], f"{name}.flat", axis=1)
            self.plane = False

    def as_plane(self, name: str) -> None:
        """The current value as (N, C, H, W)."""
        if not self.plane:
            shape = self.constant(f"{name}.plane_shape", [-1, *self.shape])
            self.node("Reshape", [self.value, shape], f"{name}.plane")
            self.plane = True

    # ---- preprocessing and layers -----------------------------------------------------------
    def _preprocess(self) -> None:
        pad, normalize, channels = self.preprocessing.pad, self.preprocessing.normalize, self.shape[0]
        if isinstance(normalize, str):
            raise ExportError(f"cannot export: the normalisation is {normalize!r}, not its values (a checkpoint "
                              f"written by cudnnnet-train holds the mean and std it computed)")
        if pad:
            pads = self.constant("preprocess.pads", [0, 0, pad, pad, 0, 0, pad, pad])
            self.node("Pad", [self.value, pads], "preprocess.padded", mode="constant")
        if normalize is not None:
            mean = self.constant("preprocess.mean", channel_values(normalize[0], channels)[None])
            std = self.constant("preprocess.std", channel_values(normalize[1], channels)[None])
            self.node("Sub", [self.value, mean], "preprocess.centred")
            self.node("Div", [self.value, std], "preprocess.normalized")

    def _dense(self, layer: Dense) -> None:
        self.flat(layer.name)
        weight = self.constant(f"{layer.name}.weight", layer.weight.numpy().reshape(layer.out_size, -1))  # (out, in)
        bias = self.constant(f"{layer.name}.bias", layer.bias.numpy().reshape(-1))
        self.node("Gemm", [self.value, weight, bias], f"{layer.name}.output", transB=1)

    def _conv2d(self, layer: Conv2D) -> None:
        self.as_plane(layer.name)
        inputs = [self.value, self.constant(f"{layer.name}.weight", layer.weight.numpy())]  # (out, in, k, k)
        if layer.has_bias:
            inputs.append(self.constant(f"{layer.name}.bias", layer.bias.numpy().reshape(-1)))
        k, p, s, d = layer.kernel_size, layer.padding, layer.stride, layer.dilation
        self.node("Conv", inputs, f"{layer.name}.output", kernel_shape=[k, k], pads=[p] * 4, strides=[s, s],
                  dilations=[d, d])

    def _pooling(self, layer: Pooling) -> None:
        self.as_plane(layer.name)
        k, p, s = layer.kernel_size, layer.padding, layer.stride
        window = {"kernel_shape": [k, k], "pads": [p] * 4, "strides": [s, s]}
        if layer.mode == "max":
            self.node("MaxPool", [self.value], f"{layer.name}.output", **window)
        else:
            self.node("AveragePool", [self.value], f"{layer.name}.output", count_include_pad=1, **window)

    def _global_average_pooling(self, layer: GlobalAveragePooling) -> None:
        self.as_plane(layer.name)
        self.node("GlobalAveragePool", [self.value], f"{layer.name}.output")

    def _activation(self, layer: Activation) -> None:
        output = f"{layer.name}.output"
        if layer.mode == "clipped_relu":
            low, high = self.constant(f"{layer.name}.min", np.float32(0)), self.constant(f"{layer.name}.max",
                                                                                        np.float32(layer.coef))
            self.node("Clip", [self.value, low, high], output)
        elif layer.mode == "elu":
            self.node("Elu", [self.value], output, alpha=layer.coef)
        else:
            self.node({"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh"}[layer.mode], [self.value], output)

    def _batch_norm(self, layer: BatchNorm) -> None:
        if layer.batch_norm_mode != BatchNormMode.SPATIAL:  # one statistic per value: channels of (N, C·H·W)
            self.flat(layer.name)
        elif self.shape[1] * self.shape[2] > 1:  # one per channel of a plane
            self.as_plane(layer.name)
        values = [layer.weight, layer.bias, layer.running_mean, layer.running_var]
        inputs = [self.value] + [self.constant(f"{layer.name}.{part}", tensor.numpy().reshape(-1))
                                 for part, tensor in zip(("weight", "bias", "running_mean", "running_var"), values)]
        self.node("BatchNormalization", inputs, f"{layer.name}.output", epsilon=layer.eps)

    def _dropout(self, layer: Dropout) -> None:
        """The identity in inference: no node."""

    def _softmax(self, layer: Softmax) -> None:
        self.flat(layer.name)
        self.node("Softmax", [self.value], "probabilities", axis=1)

    def _mse(self, layer: MSE) -> None:
        self.flat(layer.name)
        self.node("Identity", [self.value], "outputs")

    _EXPORTERS = {Dense: _dense, Conv2D: _conv2d, Pooling: _pooling, GlobalAveragePooling: _global_average_pooling,
                  Activation: _activation, BatchNorm: _batch_norm, Dropout: _dropout, Softmax: _softmax, MSE: _mse}


def _plain(value):
    """A mean or std as JSON takes it: a number, or a list of one per channel."""
    return np.asarray(value, dtype=float).tolist()
