"""The engine: which calls run a layer — the slides' cuBLAS/cuDNN calls, or our fast path.

One policy, consulted where a choice is made (as Chainer's ``chainer.config.use_cudnn`` is read
by each function, and CuPy's ``CUPY_ACCELERATORS`` by each routine). ``backend.engine`` is the one
in force: a Network's own (``Network(engine=...)``) during its calls, else an enclosing
``backend.using(engine=...)`` block's, else the backend's default (``backend.set_engine``); layers,
the network and the CUDA backend read its fields, never attributes of their own.

``slides`` (the default) runs the C++ design's library calls and nothing in their place:

    Dense       y = Wᵀx (cublasSgemm), y += b·1ᵀ (rank-1 cublasSgemm); db cublasSgemv, dW, dx cublasSgemm
    Activation  cudnnActivationForward / cudnnActivationBackward
    Softmax     cudnnSoftmaxForward; the loss by kernels/loss.cu; dx by cudaMemcpyAsync + cublasSaxpy + cublasSscal
    Conv2D      cudnnConvolutionForward + cudnnAddTensor; cudnnConvolutionBackwardBias (in two passes over
                reshaped views of dy from 32 samples on: backends/cuda/backward_bias.py) / Filter / Data,
                algorithms from cudnnFindConvolution*Algorithm within the workspace limit: the fastest
                exact one it measured, deterministic or not (the C++ design's PREFER_FASTEST)
    Pooling     cudnnPoolingForward / cudnnPoolingBackward
    BatchNorm   cudnnBatchNormalizationForwardTraining / ForwardInference / Backward
    SGD         cublasSaxpy (momentum and weight decay: cublasSscal / cublasSaxpy), the rate read from
                device memory, each call over all parameters at once (optim.pack)

and our kernels only where the slides had one or no library call exists (``SLIDES_KERNELS``).

``fast`` is the same arithmetic with our fusions and kernels: bias + activation in one kernel,
softmax + loss + gradient in one, timed cuBLASLt GEMM plans, our explicit-GEMM convolution and a
stride-1 backward data as a forward convolution of the flipped filter timed against cuDNN's
algorithms (deterministic ones only, so a seed gives the same weights), activation backward
(writing dx's bfloat16 copy too under math bf16, and after a Dense that layer's bias gradient),
max-pooling and bias-gradient kernels, one-launch SGD (and in ``Network.train_step`` plain SGD on a
Dense weight applied by its weight-gradient GEMM), batch normalisation in training by our kernels
with a following ReLU applied in them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UsageError

# Our NVRTC kernels that slides mode may launch: the loss reduction (the slides' own kernel), the
# accuracy count, the batch gather (plain, or with the training crop and flip) and the uint8 ->
# float32 image conversion (no library call does these), the Adam update (an optimiser the slides do not have, which no library call computes) and
# the trainer's watch on the loss (the first non-finite step, recorded on the device), and under
# ``math: bf16`` the float32 <-> bfloat16 conversions around cublasGemmEx and the cuDNN convolutions
# (the slides' calls in their 16-bit form; no library call converts an array), the same for
# ``math: fp16`` with its dynamic loss scaling (the overflow check, the scale's update and the
# skipped step's coefficients of the cuBLAS SGD: no library call decides on the device). Extend it
# when a kernel of that kind is added.
SLIDES_KERNELS = frozenset({
    "cross_entropy_loss",
    "squared_error_loss",
    "accuracy_count",
    "gather_batch",
    "gather_augmented_batch",
    "pixels_to_images",
    "adam_update_many",
    "record_nonfinite",
    "to_bf16",
    "to_bf16_x4",
    "bf16_to_float",
    "to_fp16",
    "to_fp16_x4",
    "fp16_to_float",
    "find_nonfinite_gradients",
    "update_loss_scale",
    "sgd_scaled_coefficients",
    "channel_sum16",  # a 16-bit dy's float32 bias gradient: cudnnConvolutionBackwardBias takes one data type
})

CONVOLUTION_SEARCHES = ("find", "exhaustive", "heuristic")


@dataclass(frozen=True)
class Engine:
    """What runs each choice point; every field is read by exactly the code named beside it."""

    name: str
    fuse_bias_activation: bool  # Dense/Conv2D: bias + a following activation in one kernel (bias_activation_forward)
    gemm_epilogue: bool  # Dense with a 16-bit y and a following ReLU or none: y = f(Wᵀx + b) in one cuBLASLt call
    #                      (sgemm_bias_activation, the bias and ReLU in the GEMM's epilogue)
    fuse_loss: bool  # Softmax: softmax, loss, accuracy and gradient in one kernel
    gemm_plans: bool  # CudaBackend.sgemm: timed cuBLASLt / cublasSgemm plans (matmul.py); else cublasSgemm
    convolution_search: str  # "find": cudnnFind*; "exhaustive": our timer over cuDNN and the GEMM engine;
    #                          "heuristic": cudnnGet*_v7's first choice
    gemm_convolution: bool  # our explicit-GEMM convolution (gemm_convolution.py) and backward data as a
    #                         forward convolution of the flipped filter (convolution.py) are candidates
    deterministic_convolution: bool  # only deterministic algorithms where any is eligible; else cuDNN's fastest
    activation_kernel: bool  # activation backward by kernels/activation.cu; else cudnnActivationBackward
    activation_sums_bias: bool  # Activation.sums_bias_gradient: the backward kernel of an Activation fused after
    #                             a Dense sums that Dense's bias gradient; else the Dense's cublasSgemv
    max_pooling_kernel: bool  # non-overlapping max-pooling backward by kernels/pooling.cu; else cudnnPoolingBackward
    channel_sum: bool  # convolution bias gradient by kernels/channel_sum.cu; else cudnnConvolutionBackwardBias
    sgd_kernel: bool  # SGD by kernels/sgd*.cu (one launch for all parameters); else cuBLAS level-1 calls
    sgd_in_weight_gradient: bool  # Network.train_step: a Dense layer's weight-gradient GEMM writes W − lr·x·dyᵀ
    #                               into W (alpha −lr, beta 1); else backward, then update's SGD on every parameter
    batch_norm_kernel: bool  # BatchNorm in training by kernels/batch_norm.cu, a following ReLU applied in it;
    #                          else cudnnBatchNormalization{ForwardTraining,Backward}
    kernels: frozenset | None  # our kernels this engine may launch (None: any)

    def __post_init__(self):
        if self.convolution_search not in CONVOLUTION_SEARCHES:
            raise UsageError(f"invalid convolution_search {self.convolution_search!r}; "
                             f"valid are {', '.join(CONVOLUTION_SEARCHES)}")

    def __str__(self) -> str:
        return self.name

    def allows_kernel(self, name: str) -> bool:
        """Whether our kernel ``name`` is one this engine may launch."""
        return self.kernels is None or name in self.kernels


SLIDES = Engine("slides", fuse_bias_activation=False, gemm_epilogue=False, fuse_loss=False, gemm_plans=False,
                convolution_search="find", gemm_convolution=False, deterministic_convolution=False, activation_kernel=False,
                activation_sums_bias=False, max_pooling_kernel=False, channel_sum=False, sgd_kernel=False,
                sgd_in_weight_gradient=False, batch_norm_kernel=False, kernels=SLIDES_KERNELS)
FAST = Engine("fast", fuse_bias_activation=True, gemm_epilogue=True, fuse_loss=True, gemm_plans=True,
              convolution_search="exhaustive", gemm_convolution=True, deterministic_convolution=True, activation_kernel=True,
              activation_sums_bias=True, max_pooling_kernel=True, channel_sum=True, sgd_kernel=True,
              sgd_in_weight_gradient=True, batch_norm_kernel=True, kernels=None)
ENGINES = {engine.name: engine for engine in (SLIDES, FAST)}
DEFAULT_ENGINE = SLIDES.name


def get_engine(engine: "str | Engine") -> Engine:
    """The engine called ``engine`` ("slides" or "fast"), or ``engine`` itself if an Engine."""
    if isinstance(engine, Engine):
        return engine
    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}; valid engines are {', '.join(ENGINES)}")
    return ENGINES[engine]
