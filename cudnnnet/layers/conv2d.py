"""2-D convolution layer on cuDNN (cross-correlation, NCHW, filters (K, C, k, k)).

                                   slides engine                       fast engine
    forward   y  = x ⋆ w           cudnnConvolutionForward             the plan's algorithm: cuDNN's or
                                                                       our explicit-GEMM convolution
              y  = y + b           cudnnAddTensor                      y = f(y + b): our bias_activation
                                                                       kernel, f of the next Activation
    backward  db = Σₙ Σ_{h,w} dy   cudnnConvolutionBackwardBias, in    our channel_sum kernel
                                   two passes from 32 samples on
                                   (N = A·B: Σ over a, h, w, then
                                   over b; see backward_bias.py)
              dw = Σₙ xₙ ⋆ dyₙ     cudnnConvolutionBackwardFilter      the plan's algorithm
              dx = dy ⋆ᵀ w         cudnnConvolutionBackwardData        the plan's algorithm

Algorithms and the workspace are chosen by the backend once per input shape (``plan``), so a new
batch size (the test set's, say) gets a plan of its own: in the slides engine cuDNN's own choice
(cudnnFindConvolution*Algorithm within the workspace limit), in the fast engine the fastest of
cuDNN's algorithms and our explicit-GEMM convolution as the backend timed them.

``bias=False`` leaves b out (no parameter, no bias call, no db): right before a BatchNorm a bias
changes nothing, as the normalisation subtracts the batch mean it shifts. A following activation
then runs as its own layer in both engines (the fast engine applies f in the bias kernel).

Under math bf16 or fp16 in a network that stores 16 bits (layers.base.activation_dtype), x, y, dy and dx
are 16-bit tensors (h: the rounding to the format, nearest even; w₁₆ = h(w), the pass's copy), w, b, dw
and db float32, every sum float32. Each engine's convolutions store their product rounded once, cuDNN's
16-bit output and the GEMM convolution's alike, so the two engines differ in the bias add only:

    slides  y  = h(h(x ⋆ w₁₆) + h(b))          cudnnAddTensor takes one data type: b's 16-bit copy
    fast    y  = h(f(h(x ⋆ w₁₆) + b))          bias_activation_forward16, b read in float32
    both    db = Σₙ Σ_{h,w} dy                 float32 sum of the 16-bit values (channel_sum16: the
                                               slides engine's too, cuDNN's takes one data type)
            dw = h(Σₙ xₙ ⋆ dyₙ)                float32 tensor, rounded once as the float32-activation
                                               path does
            dx = h(dy ⋆ᵀ w₁₆)
"""

from __future__ import annotations

from ..backends.descriptors import ConvolutionDescriptor
from ..errors import InvalidArgumentError, ShapeError
from ..tensor import Tensor
from .base import WeightBiasLayer, he_uniform, positive_int


class Conv2D(WeightBiasLayer):
    stores_16_bits = True  # x, y, dy and dx may be 16-bit: the convolutions read them and store y and dx rounded

    def __init__(self, name: str, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0,
                 dilation: int = 1, bias: bool = True):
        super().__init__(name)
        if not isinstance(bias, bool):
            raise InvalidArgumentError(f"layer {name!r}: bias must be true or false, got {bias!r}")
        self.has_bias = bias
        self.out_channels = positive_int(name, "out_channels", out_channels)
        self.kernel_size = positive_int(name, "kernel_size", kernel_size)
        self.stride = positive_int(name, "stride", stride)
        self.padding = positive_int(name, "padding", padding, minimum=0)
        self.dilation = positive_int(name, "dilation", dilation)
        self.descriptor = None
        self.plan = None

    def _descriptor(self, in_channels: int) -> ConvolutionDescriptor:
        return ConvolutionDescriptor(self.out_channels, in_channels, self.kernel_size, self.stride,
                                     self.padding, self.dilation)

    def config(self):
        found = {"out_channels": self.out_channels, "kernel_size": self.kernel_size, "stride": self.stride,
                 "padding": self.padding, "dilation": self.dilation}
        return found if self.has_bias else {**found, "bias": False}

    def output_sample_shape(self, input_shape):
        c, h, w = input_shape
        span = (self.kernel_size - 1) * self.dilation + 1
        if span > h + 2 * self.padding or span > w + 2 * self.padding:
            hint = " (a Dense layer before it leaves no spatial size)" if h == w == 1 else ""
            raise ShapeError(
                f"layer {self.name!r}: kernel {self.kernel_size} (span {span} with dilation {self.dilation}) "
                f"is larger than its padded input {h + 2 * self.padding}×{w + 2 * self.padding} "
                f"from input shape ({c}, {h}, {w}){hint}"
            )
        return self._descriptor(c).output_shape((1, c, h, w))[1:]

    def parameter_shapes(self, input_shape):
        shapes = {"weight": (self.out_channels, input_shape[0], self.kernel_size, self.kernel_size)}
        return {**shapes, "bias": (1, self.out_channels, 1, 1)} if self.has_bias else shapes

    def init_parameters(self, rng):
        self.descriptor = self._descriptor(self.input_sample_shape[0])
        fan_in = self.input_sample_shape[0] * self.kernel_size ** 2  # C·k·k
        self.weight = Tensor.from_numpy(he_uniform(rng, self.descriptor.filter_shape, fan_in), self.backend)  # (K, C, k, k)
        if self.has_bias:
            self.bias = Tensor.zeros((1, self.out_channels), self.backend)  # (1, K, 1, 1)
        self.zero_gradients()

    def allocate(self, input_shape, output_shape):
        return {"plan": self.backend.convolution_plan(self.descriptor, input_shape, output_shape)}

    def forward(self, input: Tensor) -> Tensor:
        self.prepare(input)
        b = self.backend
        self._plan_in_force()
        # y = x ⋆ w
        b.convolution_forward(self.plan, 1.0, input, self.weight, 0.0, self.output)
        if not self.has_bias:
            return self.output
        if b.engine.fuse_bias_activation:
            # y = f(y + b)  (bias (1, K, 1, 1) broadcast over N, H, W; f of the next layer or the identity)
            b.bias_activation_forward(self.activation, self.bias, self.output)
        else:
            # y = 1·b + 1·y  (bias (1, K, 1, 1) broadcast over N, H, W)
            b.add_tensor(1.0, self.bias, 1.0, self.output)
        return self.output

    def _plan_in_force(self) -> None:
        """A plan computes in the precision it was made under (CUDA's carry one; the host's do not):
        where another precision is now in force (``Network.set_math`` after training), plan anew."""
        planned = getattr(self.plan, "precision", None)
        if planned is not None and planned is not self.backend.precision:
            self.plan = self._batch_buffers["plan"] = self.backend.convolution_plan(
                self.descriptor, self.input.shape, self.output.shape)

    def backward(self, grad_output: Tensor) -> Tensor:
        b, dy = self.backend, grad_output
        if self.has_bias:
            # db = Σₙ Σ_{h,w} dy      (1, K, 1, 1)
            b.convolution_backward_bias(1.0, dy, 0.0, self.grad_bias)
        # dw = Σₙ xₙ ⋆ dyₙ
        b.convolution_backward_filter(self.plan, 1.0, self.input, dy, 0.0, self.grad_weight)
        if not self.gradient_stop:
            # dx = dy ⋆ᵀ w
            b.convolution_backward_data(self.plan, 1.0, self.weight, dy, 0.0, self.grad_input)
        return self.grad_input
