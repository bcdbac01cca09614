"""Network: an ordered list of layers ending in a loss layer, as the C++ design's Network.

    model = Network(backend="cuda", seed=0)
    model.add_layer(Dense("fc1", 500)); model.add_layer(Activation("relu1", "relu"))
    model.add_layer(Dense("fc2", 10));  model.add_layer(Softmax("softmax"))
    output = model.forward(images); model.backward(targets); model.update(0.01)

A network owns its engine and precision (``Network(engine="fast", math="bf16")``, ``set_engine``,
``set_math``; None: the backend's defaults). Its calls enter them on its backend for their own
duration (``Backend.using``), so two networks in one process compute each in its own settings.

Under math bf16 or fp16 a network whose layers all store 16 bits (every layer type today:
layers.base.activation_dtype) keeps its activations and their gradients in 16 bits
(``activation_dtype``); its input is converted once into a buffer of its own, a 16-bit input of that
dtype read as it is.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from math import prod
from pathlib import Path

import numpy as np

from .backends import get_backend
from .engine import Engine, get_engine
from .errors import CheckpointError, ConfigError, InvalidArgumentError, ShapeError, TensorSizeError
from .interop import safetensors_file, torch_names
from .io import checkpoint
from .layers import LAYER_TYPES, Activation, BatchNorm, Dense, Dropout, Layer, LossLayer, Parameter, WeightBiasLayer
from .layers.base import activation_dtype
from .limits import too_many_layers
from .precision import DType, Precision, get_precision
from .tensor import Tensor, as_shape, check_tensor_values, float32_values

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "cudnnnet-checkpoint"
CHECKPOINT_VERSION = 1
OPTIMIZER_PREFIX = "optimizer."  # optimiser state saved beside the weights, e.g. optimizer.velocity.fc1.weight
_TYPE_NAMES = {cls: name for name, cls in LAYER_TYPES.items()}


def in_own_settings(method):
    """``method`` runs with the network's engine and precision in force on its backend (``settings``)."""
    @functools.wraps(method)
    def scoped(self, *args, **kwargs):
        with self.settings():
            return method(self, *args, **kwargs)
    return scoped


class Network:
    def __init__(self, layers=(), backend="host", seed: int = 0, input_shape=None,
                 engine: "str | Engine | None" = None, math: "str | Precision | None" = None):
        self.layers: list[Layer] = []
        self._layer_names: set[str] = set()  # of self.layers: add_layer's duplicate check in constant time
        self.backend = get_backend(backend)
        self.engine: Engine | None = None  # which calls the layers make (None: the backend's in force)
        self.precision: Precision | None = None  # in which arithmetic (None: the backend's in force)
        self.set_engine(engine).set_math(math)
        self.seed = int(seed)
        self.input_shape: tuple[int, int, int] | None = None  # (c, h, w) of one sample
        self._scalars = None  # device scalars: loss, correct count
        self.checkpoint_metadata: dict | None = None  # set by Network.load
        self.training_config = None  # the validated Config in that checkpoint's metadata, if it has one
        self._checked_batch = None  # the batch size check_batch last passed for forward
        self._inputs: dict = {}  # (shape, dtype) -> the buffer an input of another dtype is converted into
        for layer in layers:
            self.add_layer(layer)
        if input_shape is not None:
            self.build(input_shape)

    # ---- settings ----------------------------------------------------------------------------
    def set_engine(self, engine: "str | Engine | None") -> "Network":
        """This network's engine ("slides", "fast" or an Engine; None: its backend's in force)."""
        self.engine = None if engine is None else get_engine(engine)
        return self

    def set_math(self, math: "str | Precision | None") -> "Network":
        """This network's precision ("fp32", "tf32", "bf16", "fp16" or a Precision; None: its backend's in force)."""
        self.precision = None if math is None else get_precision(math)
        return self

    def settings(self):
        """A block with this network's engine and precision in force on its backend (Backend.using):
        its own calls run in it; the optimiser's step and a Trainer enter it too."""
        return self.backend.using(engine=self.engine, math=self.precision)

    # ---- structure ---------------------------------------------------------------------------
    def add_layer(self, layer: Layer) -> "Network":
        if not isinstance(layer, Layer):
            raise InvalidArgumentError(f"add_layer takes a Layer, got {type(layer).__name__}")
        if self.input_shape is not None:
            raise InvalidArgumentError(f"cannot add layer {layer.name!r}: the network is already built")
        problem = too_many_layers(len(self.layers) + 1)
        if problem:
            raise InvalidArgumentError(f"cannot add layer {layer.name!r}: {problem}")
        if layer.name in self._layer_names:
            raise InvalidArgumentError(f"a layer named {layer.name!r} is already in the network")
        if self.layers and self.layers[-1].is_loss:
            raise InvalidArgumentError(
                f"cannot add layer {layer.name!r} after the loss layer {self.layers[-1].name!r}: the loss layer comes last"
            )
        layer.training = self.training  # a layer added after eval() evaluates too
        self.layers.append(layer)
        self._layer_names.add(layer.name)
        return self

    @property
    def loss_layer(self) -> LossLayer:
        if not self.layers or not self.layers[-1].is_loss:
            raise InvalidArgumentError("the network has no loss layer (softmax or mse) at its end")
        return self.layers[-1]

    def output_shapes(self, input_shape) -> list[tuple[int, int, int]]:
        """Each layer's output (c, h, w) for a sample of ``input_shape``; raises ShapeError if one does not fit."""
        shape = as_shape(input_shape)[:3]
        shapes = []
        for layer in self.layers:
            shape = layer.output_sample_shape(shape)
            shapes.append(shape)
        return shapes

    def build(self, input_shape) -> "Network":
        """Infer every layer's shapes from a sample shape (c, h, w) and create the parameters (seeded)."""
        if not self.layers:
            raise InvalidArgumentError("the network has no layers")
        self.loss_layer  # noqa: B018  (raises if missing)
        input_shape = as_shape(input_shape)[:3]
        check_model_size(self.layers, input_shape)
        shape = input_shape
        for index, layer in enumerate(self.layers):
            shape = layer.build(shape, self.backend, np.random.default_rng([self.seed, index]))
        self.layers[0].gradient_stop = True
        self._pair_activations()
        self.input_shape = input_shape
        return self

    def _pair_activations(self) -> None:
        """A Dense or Conv2D with a bias followed by an Activation: where the engine fuses them
        (``fuse_bias_activation``), f runs in the first one's bias kernel, one launch and one pass
        over y fewer per pair; after a Dense, the Activation's backward kernel then sums the Dense's
        bias gradient too. A BatchNorm followed by a ReLU: where the engine runs our batch
        normalisation (``batch_norm_kernel``), it applies f and f' in its own passes. Otherwise each
        layer makes its own calls."""
        for layer, following in zip(self.layers, self.layers[1:]):
            if isinstance(layer, WeightBiasLayer) and layer.has_bias and isinstance(following, Activation):
                layer.activation = following.descriptor
                following.after_bias = True
                log.debug("%s may run in %s's bias kernel", following.name, layer.name)
                if isinstance(layer, Dense):
                    layer.next_activation, following.dense_before = following, layer
            if isinstance(layer, BatchNorm) and isinstance(following, Activation) and following.mode == "relu":
                layer.activation = following.descriptor
                following.after_batch_norm = True
                log.debug("%s may run in %s's kernels", following.name, layer.name)

    def summary(self) -> str:
        lines, shape = [], self.input_shape
        for layer in self.layers:
            shape = layer.output_sample_shape(shape)
            count = sum(p.value.size for p in layer.parameters())
            lines.append(f"{layer.name:<12} {type(layer).__name__:<10} -> {shape}  params {count}")
        return "\n".join(lines)

    # ---- computation -------------------------------------------------------------------------
    def _as_input(self, x) -> Tensor:
        """``x`` as a tensor on this backend: a Tensor, or an array-like of finite real numbers
        (converted to float32). A new batch size is checked first (``check_batch``), so a batch whose
        outputs could not fit this machine is refused rather than allocated."""
        if not isinstance(x, Tensor):
            x = Tensor.from_numpy(_finite(float32_values(x, "forward"), "forward: the input"), self.backend)
        if self.input_shape is None:
            self.build(x.shape[1:])
        if x.n != self._checked_batch:
            self.check_batch(x.n)
            self._checked_batch = x.n
        return self._stored_input(x.to(self.backend))

    @property
    def activation_dtype(self) -> DType:
        """The dtype of the activations and their gradients in the precision in force on the backend
        (inside this network's calls, its own): layers.base.activation_dtype."""
        return activation_dtype(self.layers, self.backend.precision)

    def _stored_input(self, x: Tensor) -> Tensor:
        """``x`` where it holds the activations' dtype, else its values converted into this network's
        buffer of its shape and that dtype (one per pair, so a captured graph reads a fixed address)."""
        dtype = self.activation_dtype
        if x.dtype is dtype:
            return x
        key = (x.shape, dtype)
        if key not in self._inputs:
            self._inputs[key] = Tensor(x.shape, self.backend, dtype=dtype)
        # x₁₆ = x rounded to nearest even (or a 16-bit x in float32)
        return self._inputs[key].copy_(x)

    def _as_target(self, target) -> Tensor:
        """The one-hot ``target`` as a tensor on this backend: a Tensor, or an array-like converted as
        ``forward`` converts its input; an array of the last output's size per sample (N, classes) is
        taken in the output's shape (N, classes, 1, 1). The loss layer checks the shape."""
        if not isinstance(target, Tensor):
            array = _finite(float32_values(target, "the target"), "the target")
            output = self.loss_layer.output
            if output is not None:
                if array.size != output.size or array.shape[:1] != output.shape[:1]:
                    raise ShapeError(f"layer {self.loss_layer.name!r}: target has shape {array.shape}, the output "
                                     f"has shape {output.shape}")
                array = array.reshape(output.shape)
            target = Tensor.from_numpy(array, self.backend)
        return target.to(self.backend)

    @in_own_settings
    def forward(self, x) -> Tensor:
        """Run every layer; returns the last layer's output (probabilities for Softmax), (N, classes, 1, 1).
        A pass begins (``Backend.start_pass``): it ends after ``backward`` or at the next forward."""
        output = self._as_input(x)
        self.backend.start_pass()
        for layer in self.layers:
            output = layer.forward(output)
        return output

    @in_own_settings
    def backward(self, target, loss: Tensor | None = None, count: Tensor | None = None) -> None:
        """Back-propagate from the loss layer given the one-hot ``target`` of the last forward (a Tensor
        or an array-like, as ``forward`` takes its input).

        With ``loss`` and ``count`` (one-element tensors), the loss layer also adds the batch's mean
        loss and its number of correct predictions into them (one fused kernel for Softmax on CUDA).
        """
        target = self._as_target(target)
        if loss is None:
            grad = self.loss_layer.backward(target)
        else:
            grad = self.loss_layer.backward_with_metrics(target, loss, count)
        for layer in reversed(self.layers[:-1]):
            grad = layer.backward(grad)
        self.backend.end_pass()

    @in_own_settings
    def forward_backward(self, x, target: Tensor, loss: Tensor, count: Tensor, loss_scale: Tensor | None = None,
                         after_backward=None) -> None:
        """A training step's ``forward(x)`` then ``backward(target, loss, count)``, with the loss
        layer's forward and backward in one call (one fused kernel for Softmax on CUDA). With
        ``loss_scale`` (a one-element tensor S, loss_scaling.py) every gradient carries S.
        ``after_backward(layer)``, where given, is called once each layer's gradients are queued
        (several GPUs reduce them meanwhile)."""
        output = self._as_input(x)
        self.backend.start_pass()
        for layer in self.layers[:-1]:
            output = layer.forward(output)
        # dJ/dŷ, times S read from device memory where given, then in the activations' dtype
        grad = self.loss_layer.forward_backward_with_metrics(output, target.to(self.backend), loss, count, loss_scale)
        for layer in reversed(self.layers[:-1]):
            grad = layer.backward(grad)
            if after_backward is not None:
                after_backward(layer)
        self.backend.end_pass()

    @in_own_settings
    def forward_metrics(self, x, target: Tensor, loss: Tensor, count: Tensor, loss_scale: float) -> None:
        """An evaluation batch: ``forward(x)`` up to the loss layer, whose ``forward_metrics`` adds
        loss_scale·N·(the batch's mean loss) into ``loss`` and its correct predictions into ``count``
        on the device (one fused kernel for Softmax on CUDA, whose probabilities are then not kept)."""
        output = self._as_input(x)
        self.backend.start_pass()
        for layer in self.layers[:-1]:
            output = layer.forward(output)
        self.loss_layer.forward_metrics(output, target.to(self.backend), loss, count, loss_scale)
        self.backend.end_pass()

    @in_own_settings
    def update(self, learning_rate: float) -> None:
        """Plain SGD, the original's update: W = W - lr·dW for every parameter (cublasSaxpy)."""
        for parameter in self.parameter_list():
            self.backend.sgd_update(parameter.value, parameter.grad, None, learning_rate, 0.0, 0.0)

    @in_own_settings
    def train_step(self, x, target, learning_rate: float) -> None:
        """One step of the original's training: ``forward(x)``, ``backward(target)``, ``update(learning_rate)``.

        Where the engine applies SGD in the weight gradient (``sgd_in_weight_gradient``: the fast
        engine), each Dense layer's backward makes its weight-gradient GEMM the update,
        W = W − lr·x·dyᵀ (alpha −lr, beta 1, C = W), after its dx GEMM has read the W of the forward;
        that layer's ``grad_weight`` is then neither written nor read (it keeps its earlier values),
        and ``update``'s SGD runs on every other parameter. The same step, one pass over the weight
        fewer, without dW written and read back."""
        rate = _learning_rate(learning_rate)
        self.forward(x)
        fused = [layer for layer in self.layers if isinstance(layer, Dense)] \
            if self.backend.engine.sgd_in_weight_gradient else []
        for layer in fused:
            layer.sgd_rate = rate
        try:
            self.backward(target)
        finally:
            for layer in fused:
                layer.sgd_rate = None
        updated = {id(layer.weight) for layer in fused}
        for parameter in self.parameter_list():
            if id(parameter.value) not in updated:
                self.backend.sgd_update(parameter.value, parameter.grad, None, rate, 0.0, 0.0)

    def check_batch(self, batch_size: int) -> None:
        """Refuse (ModelSizeError) a batch whose tensors this built network could not make, before
        any is allocated (see ``check_model_size``)."""
        self._require_built("check a batch size")
        check_model_size(self.layers, self.input_shape, batch_size)

    def predict(self, x) -> Tensor:
        """The output of a forward pass in evaluation mode (no gradients are needed or kept)."""
        with self.evaluating():
            return self.forward(x)

    def _scalar(self, index: int) -> Tensor:
        if self._scalars is None or self._scalars.backend is not self.backend:
            self._scalars = Tensor.zeros((2,), self.backend)
        return self._scalars.view((1,), index)

    @in_own_settings
    def loss(self, target) -> float:
        """Mean loss of the last forward against ``target`` (synchronises a GPU)."""
        return self.loss_layer.loss(self._as_target(target), self._scalar(0)).item()

    @in_own_settings
    def accuracy(self, target) -> float:
        """Fraction of the last forward's samples whose argmax matches ``target``'s."""
        target = self._as_target(target)
        return self.loss_layer.correct(target, self._scalar(1)).item() / target.n

    # ---- parameters --------------------------------------------------------------------------
    def parameter_list(self) -> list[Parameter]:
        return [parameter for layer in self.layers for parameter in layer.parameters()]

    def parameters(self) -> dict[str, Tensor]:
        return {p.name: p.value for p in self.parameter_list()}

    def gradients(self) -> dict[str, Tensor]:
        return {p.name: p.grad for p in self.parameter_list()}

    def to(self, backend) -> "Network":
        """Move every parameter to ``backend`` (``host``, ``cuda`` or a Backend)."""
        self.backend = get_backend(backend)
        for layer in self.layers:
            layer.to(self.backend)
        self._scalars = None
        self._inputs = {}
        return self

    def buffers(self) -> dict[str, Tensor]:
        """Every layer's non-trainable state (BatchNorm's running statistics), by qualified name."""
        return {name: value for layer in self.layers for name, value in layer.buffers().items()}

    def state_dict(self) -> dict[str, np.ndarray]:
        """Every parameter and buffer as a float32 host array (a 16-bit tensor's values too), by qualified name
        (``fc1.weight``, ``bn1.running_mean``): what checkpoints hold, the float32 master weights."""
        return {name: value.numpy() for name, value in {**self.parameters(), **self.buffers()}.items()}

    def load_state_dict(self, arrays: dict) -> None:
        """Copy parameters and buffers in by name; checks every name, shape and value first (finite, and
        what each layer can compute with: ``Layer.check_state``), so a mismatch changes nothing."""
        tensors = {**self.parameters(), **self.buffers()}
        checkpoint.check_compatible(arrays, {name: value.shape for name, value in tensors.items()})
        values = {name: float32_values(arrays[name], f"load_state_dict: {name}") for name in tensors}
        for name, array in values.items():
            if not np.isfinite(array).all():
                raise CheckpointError(f"{name} holds NaN or infinite values")
        for layer in self.layers:
            layer.check_state(values)
        for name, value in tensors.items():
            value.copy_(Tensor.from_numpy(values[name].reshape(value.shape)))

    # ---- training and evaluation mode ----------------------------------------------------------
    training = True

    def train(self, mode: bool = True) -> "Network":
        """Training mode (``mode`` True, the default state) or evaluation mode for every layer: in
        evaluation Dropout is the identity and BatchNorm normalises with its running statistics."""
        self.training = bool(mode)
        for layer in self.layers:
            layer.training = self.training
        return self

    def eval(self) -> "Network":
        """Evaluation mode: ``train(False)``."""
        return self.train(False)

    @contextlib.contextmanager
    def evaluating(self):
        """Evaluation mode inside the block, the previous mode restored after it."""
        previous = self.training
        self.eval()
        try:
            yield self
        finally:
            self.train(previous)

    def skip_dropout_masks(self, batches) -> None:
        """Every Dropout layer's generator advanced past the masks of the training steps in ``batches``
        ((batch size, steps) runs, in order), as a resumed run needs (Dropout.skip_masks)."""
        self._require_built("skip dropout masks")
        batches = list(batches)
        for layer in self.layers:
            if isinstance(layer, Dropout):
                layer.skip_masks(batches)

    # ---- checkpoints -------------------------------------------------------------------------
    def spec(self) -> list[dict]:
        """The model as config mappings ({type, name, ...}): enough to rebuild it."""
        return [{"type": _TYPE_NAMES[type(layer)], "name": layer.name, **layer.config()} for layer in self.layers]

    def metadata(self) -> dict:
        return {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION,
                "input_shape": list(self.input_shape), "model": self.spec()}

    def save(self, path, extra_arrays: dict | None = None, **extra_metadata) -> Path:
        """Write every weight and the model config to one file, atomically: a ``.safetensors`` file
        where ``path`` ends so (the metadata as JSON in its header), else an ``.npz``."""
        self._require_built("save")
        arrays = self.state_dict()
        arrays.update(extra_arrays or {})
        metadata = {**self.metadata(), **extra_metadata}
        save = safetensors_file.save_safetensors if safetensors_file.is_safetensors(path) else checkpoint.save_npz
        save(path, arrays, metadata)
        log.info("saved checkpoint %s", path)
        return Path(path)

    def load_weights(self, path) -> dict:
        """Load weights from a checkpoint into this (built) network; returns the checkpoint's metadata.

        A ``.safetensors`` file may also hold a PyTorch ``state_dict`` of the same architecture, its
        modules named as the layers: its names and layouts are mapped (``interop.torch_names``)."""
        self._require_built("load weights")
        if not safetensors_file.is_safetensors(path):
            arrays, metadata = checkpoint.load_npz(path, self.checkpoint_shapes().get)
            self._load_checkpoint_arrays(arrays, path)
            return metadata
        arrays, metadata = safetensors_file.load_safetensors(path, skip=torch_names.is_ignored)
        self._load_checkpoint_arrays(torch_names.to_network_layout(arrays, self._checkpoint_shapes(arrays)), path)
        return metadata

    def _checkpoint_shapes(self, arrays) -> dict[str, tuple]:
        """{name: shape this network stores under it} for the names of ``arrays`` it knows (torch's unwrapped)."""
        names = {name.removeprefix(torch_names.WRAPPER_PREFIX) for name in arrays}
        shapes = self.checkpoint_shapes()
        return {name: shapes[name] for name in names if name in shapes}

    def checkpoint_shapes(self) -> dict[str, tuple]:
        """{name: shape} of every array this network's checkpoints may store: a parameter's or a buffer's
        (``bn1.running_mean``), its optimiser state's (``optimizer.velocity.fc1.weight``, Adam's
        ``optimizer.m.fc1.weight`` and ``optimizer.v.fc1.weight``, ``optimizer.step``, Adam's
        ``optimizer.adam_steps``, the fp16 loss scale's ``optimizer.loss_scale``). Made once, in time
        linear in the layers, for a reader to look every name up in."""
        parameters = {name: value.shape for name, value in self.parameters().items()}
        shapes = {f"{OPTIMIZER_PREFIX}step": (1,), f"{OPTIMIZER_PREFIX}adam_steps": (1,),
                  f"{OPTIMIZER_PREFIX}loss_scale": (3,)}  # [scale, clean steps, skipped steps] (loss_scaling.py)
        for state in ("velocity", "m", "v"):
            shapes.update({f"{OPTIMIZER_PREFIX}{state}.{name}": shape for name, shape in parameters.items()})
        shapes.update(parameters)
        shapes.update({name: value.shape for name, value in self.buffers().items()})
        return shapes

    def _load_checkpoint_arrays(self, arrays: dict, path) -> None:
        """The weights among a checkpoint's arrays (its optimiser state aside), all or nothing."""
        weights = {name: array for name, array in arrays.items() if not name.startswith(OPTIMIZER_PREFIX)}
        try:
            self.load_state_dict(weights)
        except CheckpointError as error:
            raise CheckpointError(f"{path}: {error}") from None

    @classmethod
    def load(cls, path, backend="host") -> "Network":
        """Rebuild the network a checkpoint describes and load its weights. It is in training mode, as a
        new network is: ``predict`` evaluates; call ``eval()`` before ``forward`` for inference.

        The metadata is read and the network built (its size checked) first; each array is then
        checked against the shape the network expects before it is read.
        """
        safetensors = safetensors_file.is_safetensors(path)
        metadata = (safetensors_file.load_safetensors_metadata if safetensors else checkpoint.load_npz_metadata)(path)
        if safetensors and not metadata:
            raise CheckpointError(f"{path}: a safetensors file without a cudnnnet model description (a PyTorch "
                                  f"state_dict, say): build the network from its config and call load_weights "
                                  f"(on the command line: --config CONFIG)")
        training_config = _training_config(metadata, path)
        try:
            network = cls.from_spec(_model_spec(metadata, path), _input_shape(metadata, path), backend)
        except (TypeError, InvalidArgumentError, ShapeError) as error:
            raise CheckpointError(f"{path}: its model description cannot be built: {error}") from None
        _check_classes(network, training_config, path)
        load = safetensors_file.load_safetensors if safetensors else checkpoint.load_npz
        arrays, _ = load(path, network.checkpoint_shapes().get)
        network._load_checkpoint_arrays(arrays, path)
        network.checkpoint_metadata = metadata
        network.training_config = training_config
        return network

    def save_original(self, directory) -> Path:
        """Write the C++ original's pretrained directory: ``L.bin`` and ``L.bias.bin`` per layer with weights.

        Raw little-endian float32 with no header; Dense weights as the original's (in, out)
        column-major matrix, Conv2D weights (out, in, k, k). Each file is written atomically.
        """
        self._require_built("save the original's files")
        checkpoint.write_original(directory, self.state_dict())
        return Path(directory)

    def load_original(self, directory) -> None:
        """Load the C++ original's ``.bin`` files into this (built) network, all or nothing.

        Every file is read and its size checked against the network's shapes before any weight
        changes, so a missing, truncated or mismatched file raises CheckpointError (naming it)
        and leaves the network as it was. The files carry no architecture: build the network
        from its config first. A network with buffers (BatchNorm's running statistics), which the
        files cannot hold, is refused naming them before any file is read.
        """
        self._require_built("load the original's files")
        if self.buffers():
            raise CheckpointError(f"{directory}: the original's .bin files hold weights and biases only, and this "
                                  f"network also needs {', '.join(self.buffers())} (BatchNorm's running statistics); "
                                  f"load it from a cudnnnet checkpoint (model.npz)")
        expected = {name: value.shape for name, value in self.parameters().items()}
        self.load_state_dict(checkpoint.read_original(directory, expected))

    def export_onnx(self, path, preprocessing=None) -> Path:
        """Write this network as an ONNX model (``interop.onnx_export``; needs the ``onnx`` extra)."""
        from .interop.onnx_export import export_onnx

        return export_onnx(self, path, preprocessing)

    @classmethod
    def from_spec(cls, model: list[dict], input_shape, backend="host", seed: int = 0) -> "Network":
        """A network from config mappings ({type, name, ...params}) built for ``input_shape`` (c, h, w)."""
        network = cls(backend=backend, seed=seed)
        for entry in model:
            params = {key: value for key, value in entry.items() if key not in ("type", "name")}
            network.add_layer(LAYER_TYPES[entry["type"]](entry["name"], **params))
        return network.build(input_shape)

    def _require_built(self, action: str) -> None:
        if self.input_shape is None:
            raise InvalidArgumentError(f"cannot {action}: the network is not built yet (call build or forward first)")


class ModelSizeError(TensorSizeError):
    """A model too large to build; ``index`` is the layer at fault (None: the model as a whole)."""

    def __init__(self, message: str, index: int | None):
        super().__init__(message)
        self.index = index


def _finite(array: np.ndarray, what: str) -> np.ndarray:
    """``array``, or InvalidArgumentError naming ``what`` where it holds NaN or infinite values."""
    bad = array.size - int(np.count_nonzero(np.isfinite(array)))
    if bad:
        raise InvalidArgumentError(f"{what} holds {bad} NaN or infinite values (of {array.size}); it must be finite")
    return array


def _learning_rate(value) -> float:
    """``value`` as a finite float learning rate; InvalidArgumentError naming it otherwise."""
    try:
        rate = float(value)
    except (TypeError, ValueError):
        rate = None
    if rate is None or not np.isfinite(rate):
        raise InvalidArgumentError(f"train_step: invalid learning rate {value!r}; it must be a finite number")
    return rate


def check_model_size(layers, input_shape, batch_size: int = 1) -> None:
    """Refuse, before anything is allocated, a model that could not be made.

    Every parameter and every layer's output for a batch of ``batch_size`` must fit one tensor
    (``MAX_TENSOR_VALUES``), and the float32 memory they take together (parameters three times:
    value, gradient, velocity; outputs twice: output, gradient) must fit the machine's physical
    memory. Raises ModelSizeError naming the layer, or ShapeError if a layer does not fit the
    output of the one before it.
    """
    shape, total_values = tuple(input_shape), 0
    check_tensor_values((batch_size, *shape), f"the input for a batch of {batch_size}")
    for index, layer in enumerate(layers):
        try:
            parameters = layer.parameter_shapes(shape)
            for name, parameter_shape in parameters.items():
                check_tensor_values(parameter_shape, f"layer {layer.name!r}: its {name}")
            shape = layer.output_sample_shape(shape)
            check_tensor_values((batch_size, *shape), f"layer {layer.name!r}: its output for a batch of {batch_size}")
        except TensorSizeError as error:
            raise ModelSizeError(str(error), index) from None
        total_values += 3 * sum(prod(p) for p in parameters.values()) + 2 * batch_size * prod(shape)
    memory = physical_memory()
    if memory is not None and 4 * total_values > memory:
        raise ModelSizeError(f"the model needs {4 * total_values / 2**30:.1f} GiB for its parameters, gradients and "
                             f"the outputs of a batch of {batch_size}, more than this machine's "
                             f"{memory / 2**30:.1f} GiB of memory", None)


def physical_memory() -> int | None:
    """Bytes of physical memory of this machine, or None where the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _model_spec(metadata: dict, path) -> list[dict]:
    model = metadata.get("model")
    valid = isinstance(model, list) and all(
        isinstance(entry, dict) and entry.get("type") in LAYER_TYPES and isinstance(entry.get("name"), str)
        for entry in model
    )
    if metadata.get("format") != CHECKPOINT_FORMAT or not valid:
        raise CheckpointError(f"{path}: not a cudnnnet checkpoint (no valid model description in its metadata)")
    return model


def _training_config(metadata: dict, path):
    """The validated training config a checkpoint carries (its data normalisation and image geometry
    are predicted with; a config older than a key reads as what its writer did), or None when it carries none."""
    from .config.schema import parse_config, with_checkpoint_defaults  # YAML comes with it: imported with a checkpoint

    if metadata.get("config") is None:
        return None
    try:
        return parse_config(with_checkpoint_defaults(metadata["config"]),
                            source=f"{path}: the training config in its metadata")
    except ConfigError as error:
        raise CheckpointError(str(error)) from None


def _check_classes(network: "Network", training_config, path) -> None:
    """The class names a checkpoint's config keeps label the network's scores: one name per score."""
    classes = None if training_config is None else training_config.data.classes
    scores = int(np.prod(network.output_shapes(network.input_shape)[-1]))
    if classes and len(classes) != scores:
        raise CheckpointError(f"{path}: its metadata names {len(classes)} classes, but the network ends in {scores} "
                              f"scores; a checkpoint needs one class name per score")


def _input_shape(metadata: dict, path) -> tuple[int, int, int]:
    shape = metadata.get("input_shape")
    try:
        return as_shape(shape)[:3]
    except (ShapeError, TypeError):
        raise CheckpointError(f"{path}: invalid input_shape {shape!r} in the checkpoint's metadata") from None
