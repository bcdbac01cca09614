"""Convolution plans: an algorithm for forward, backward-data and backward-filter, chosen once per
(descriptor, input shape, math mode) by one search helper, and the workspace they need.

An algorithm is cuDNN's (its cudnnConvolution*Algo_t value) or ``GEMM_ALGORITHM``, our
explicit-GEMM engine (gemm_convolution.py: im2col + cuBLAS), a candidate in the fast engine only;
its weight gradient is a candidate once per number of samples summed inside one GEMM (1, 2, 4, …).
In the fast engine a stride-1 backward data is also a candidate as a forward convolution
(``by_forward``): dx = dy ⋆ W′ with the flipped, transposed filter W′[c, k, r, s] = W[k, c, R−1−r, S−1−s]
and padding d·(R−1) − p, run by an exact cuDNN forward algorithm (the same products, summed in
another order).
The search is the engine's (cudnnnet.engine):

    "find"        cudnnFindConvolution*Algorithm: cuDNN runs its algorithms and ranks them by time
                  (the slides' engine: cuDNN's own choice, nothing timed by us);
    "exhaustive"  cudnnGet*Algorithm_v7 lists the algorithms (no run); each eligible one and the GEMM
                  engine are timed by the backend (CUDA events, on scratch tensors), the fastest taken;
    "heuristic"   cudnnGet*Algorithm_v7's first eligible choice.

Under ``math: bf16`` the x, w and y descriptors are CUDNN_DATA_BFLOAT16 (cuDNN's BFLOAT16_CONFIG:
bfloat16 tensors, FLOAT compute, CUDNN_TENSOR_OP_MATH); the backend converts the float32 operands
into bfloat16 scratch and the bfloat16 result back (low_precision.py), or, in a 16-bit CNN, reads its
bfloat16 x and dy and writes its bfloat16 y and dx as they are (the weight's gradient stays float32); only the GEMM and direct
algorithms are eligible there, as in FP32 (FFT and Winograd ones transform the operands in 16 bits and
miss the FP32 sum of the rounded products by far more than its rounding), and of those only the
deterministic ones (the others add partial sums atomically into the output, here in bfloat16). The GEMM
engine and the flipped-filter backward data are candidates there too, in 16 bits (gemm_convolution.py,
``backward_data_by_forward``), their results rounded to the 16-bit format as cuDNN's. Math "fp16" is
the same with half tensors (PSEUDO_HALF_CONFIG). Under CUDNN_FMA_MATH (our
FP32) only exact algorithms are eligible: no tensor-core algorithm and
no FFT or Winograd one (they differ from the host by ~1e-3); and only
deterministic ones, while any is eligible, where the engine asks for them (the fast engine: the same
seed then gives the same weights); the slides engine takes cuDNN's fastest, as the C++ design did.

``plan_with`` makes a plan from algorithms chosen before (kept on disk by plan_cache.py, or chosen
for a larger batch of the same convolution): no listing and no timing, only cudnnGet*WorkspaceSize,
which also refuses an algorithm that cannot run the shapes."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Callable

from ...errors import CudnnError
from ...precision import BFLOAT16, FLOAT16, Precision
from ..descriptors import ConvolutionDescriptor
from . import gemm_convolution
from .bindings import cudnn
from .buffer import FLOAT32_BYTES
from .descriptors import ConvolutionDescriptorHandle, DescriptorCache, FilterDescriptor, TensorDescriptor
from .gemm_convolution import GEMM_ALGORITHM, GemmShape
from .kernel import blocks_for
from .low_precision import half_format

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Algorithm:
    """A cuDNN algorithm enum value (or GEMM_ALGORITHM) and the workspace it needs."""

    algo: int
    workspace_bytes: int
    deterministic: bool = True
    samples_per_gemm: int = 1  # the GEMM engine's weight gradient: samples summed inside one GEMM
    by_forward: bool = False  # backward data as cudnnConvolutionForward (``algo`` a forward one) with W′

    @property
    def label(self) -> str:
        if self.by_forward:
            return f"forward-{self.algo}"
        return str(self.algo) if self.samples_per_gemm == 1 else f"{self.algo}x{self.samples_per_gemm}"


@dataclass(frozen=True)
class FlippedFilter:
    """Backward data as a forward convolution: the (C, K, R, S) filter W′ and padding d·(R−1) − p."""

    desc: ConvolutionDescriptor  # C output channels from K input channels
    w: FilterDescriptor  # (C, K, R, S)
    conv: ConvolutionDescriptorHandle

    @property
    def filter_bytes(self) -> int:  # W′ at the start of the workspace (room for float32), the forward algorithm's after it
        return -(-FLOAT32_BYTES * self.desc.out_channels * self.desc.in_channels * self.desc.kernel_size ** 2
                 // WORKSPACE_ALIGNMENT) * WORKSPACE_ALIGNMENT


WORKSPACE_ALIGNMENT = 256  # bytes: where the forward algorithm's workspace starts after W′


@dataclass(frozen=True)
class ConvolutionPlan:
    """Descriptors and algorithms for one convolution at one input shape."""

    desc: ConvolutionDescriptor
    x_shape: tuple[int, int, int, int]
    y_shape: tuple[int, int, int, int]
    precision: Precision
    x: TensorDescriptor  # (N, C, H, W)
    w: FilterDescriptor  # (K, C, R, S)
    conv: ConvolutionDescriptorHandle
    y: TensorDescriptor  # (N, K, OH, OW)
    gemm_shape: GemmShape  # the sizes our explicit-GEMM engine uses
    forward: Algorithm
    backward_data: Algorithm
    backward_filter: Algorithm
    flipped: FlippedFilter | None = None  # where backward data can run as a forward convolution (stride 1)

    @property
    def workspace_bytes(self) -> int:
        return max(self.forward.workspace_bytes, self.backward_data.workspace_bytes, self.backward_filter.workspace_bytes)

    def __repr__(self) -> str:
        return (
            f"ConvolutionPlan({self.desc}, x={self.x_shape}, y={self.y_shape}, math={self.precision}, "
            f"algorithms=({self.forward.label}, {self.backward_data.label}, {self.backward_filter.label}), "
            f"workspace={self.workspace_bytes})"
        )


@dataclass(frozen=True)
class Direction:
    """The cuDNN calls of one convolution direction; ``operands`` orders (x, w, conv, y) as they take them."""

    name: str
    max_count: Callable
    heuristic: Callable  # cudnnGet*Algorithm_v7
    find: Callable  # cudnnFind*Algorithm
    workspace_size: Callable  # cudnnGet*WorkspaceSize
    operands: Callable
    run: Callable  # cudnnConvolution{Forward,BackwardData,BackwardFilter}(handle, alpha, a, b, conv, algo, ws, beta, out)
    gemm: Callable  # the explicit-GEMM engine's run(backend, gemm_shape, alpha, a, b, beta, out, workspace, algorithm,
    #                 precision): precision the plan's


FORWARD = Direction(
    "forward",
    cudnn.get_convolution_forward_algorithm_max_count,
    cudnn.get_convolution_forward_algorithm_v7,
    cudnn.find_convolution_forward_algorithm,
    cudnn.get_convolution_forward_workspace_size,
    lambda x, w, conv, y: (x, w, conv, y),
    cudnn.convolution_forward,
    lambda backend, shape, alpha, x, w, beta, y, workspace, algorithm, precision: gemm_convolution.forward(
        backend, shape, alpha, x, w, beta, y, workspace, precision),
)
BACKWARD_DATA = Direction(
    "backward_data",
    cudnn.get_convolution_backward_data_algorithm_max_count,
    cudnn.get_convolution_backward_data_algorithm_v7,
    cudnn.find_convolution_backward_data_algorithm,
    cudnn.get_convolution_backward_data_workspace_size,
    lambda x, w, conv, y: (w, y, conv, x),  # (w, dy, conv, dx)
    cudnn.convolution_backward_data,
    lambda backend, shape, alpha, w, dy, beta, dx, workspace, algorithm, precision: gemm_convolution.backward_data(
        backend, shape, alpha, w, dy, beta, dx, workspace, precision),
)
BACKWARD_FILTER = Direction(
    "backward_filter",
    cudnn.get_convolution_backward_filter_algorithm_max_count,
    cudnn.get_convolution_backward_filter_algorithm_v7,
    cudnn.find_convolution_backward_filter_algorithm,
    cudnn.get_convolution_backward_filter_workspace_size,
    lambda x, w, conv, y: (x, y, conv, w),  # (x, dy, conv, dw)
    cudnn.convolution_backward_filter,
    lambda backend, shape, alpha, x, dy, beta, dw, workspace, algorithm, precision: gemm_convolution.backward_filter(
        backend, shape, alpha, x, dy, beta, dw, workspace, backend.context.ones(shape.batch),
        algorithm.samples_per_gemm, precision),
)
DIRECTIONS = (FORWARD, BACKWARD_DATA, BACKWARD_FILTER)
DIRECTION_NAMES = tuple(direction.name for direction in DIRECTIONS)


TENSOR_CORE_MATH = (cudnn.TENSOR_OP_MATH, cudnn.TENSOR_OP_MATH_ALLOW_CONVERSION)
# FFT and Winograd algorithms trade accuracy (~1e-3 relative in FP32, worse in 16 bits) for speed; in
# FP32 and bf16 only the exact GEMM/direct ones are taken (cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t values).
EXACT_ALGORITHMS = {"forward": (0, 1, 2, 3), "backward_data": (0, 1), "backward_filter": (0, 1, 3)}
# bf16 (CUDNN_TENSOR_OP_MATH): the exact ones that are deterministic; backward-data algorithm 0 and
# backward-filter algorithms 0 and 3 add partial sums atomically into the bfloat16 output, rounding each.
BF16_ALGORITHMS = {"forward": (0, 1, 2, 3), "backward_data": (1,), "backward_filter": (1,)}
ELIGIBLE_ALGORITHMS = {cudnn.FMA_MATH: EXACT_ALGORITHMS, cudnn.TENSOR_OP_MATH: BF16_ALGORITHMS}  # by math type


def _ineligible(math_type: int, direction: str, algo: int) -> bool:
    """Whether cuDNN's ``algo`` is left out under ``math_type`` (FP32 and bf16 take a fixed list)."""
    eligible = ELIGIBLE_ALGORITHMS.get(math_type)
    return eligible is not None and algo not in eligible[direction]


def cudnn_candidates(handle: int, direction: Direction, operands: tuple, limit: int, math_type: int,
                     find: bool = False) -> list[Algorithm]:
    """cuDNN's algorithms that it supports here, exact under CUDNN_FMA_MATH and bf16, whose workspace fits in
    ``limit`` bytes, in cuDNN's order: by its heuristic (cudnnGet*_v7), or with ``find`` by the
    times it measured (cudnnFind*)."""
    count = direction.max_count(handle)
    results = (cudnn.AlgoPerf * count)()
    returned = (direction.find if find else direction.heuristic)(handle, *operands, count, results)
    candidates = []
    for perf in results[:returned]:
        if perf.status != cudnn.STATUS_SUCCESS:
            continue
        if math_type == cudnn.FMA_MATH and perf.mathType in TENSOR_CORE_MATH:
            continue
        if _ineligible(math_type, direction.name, perf.algo):
            continue
        try:
            nbytes = direction.workspace_size(handle, *operands, perf.algo)
        except CudnnError as error:
            log.debug("convolution %s algorithm %d skipped: %s", direction.name, perf.algo, error)
            continue
        if nbytes <= limit:
            candidates.append(Algorithm(perf.algo, nbytes, perf.determinism == cudnn.DETERMINISTIC))
    return candidates


def make_plan(handle: int, descriptors: DescriptorCache, desc: ConvolutionDescriptor, x_shape, y_shape,
              precision: Precision, math_type: int, limit: int, search: str, gemm_candidate: bool = True,
              measure=None, deterministic: bool = True) -> ConvolutionPlan:
    """Descriptors from the cache, then one algorithm per direction.

    The candidates are cuDNN's algorithms (``cudnn_candidates``, ranked by cudnnFind* for
    ``search="find"``) — with ``deterministic``, its deterministic ones, the others only if none of
    those nor the GEMM engine fits — and, with ``gemm_candidate``, our explicit-GEMM engine where its
    workspace fits and, at stride 1, backward data as cuDNN's forward algorithms over the flipped filter. With ``search="exhaustive"``, ``measure(plan, direction)`` (milliseconds of one
    run, timed by the backend) picks the fastest of them; otherwise cuDNN's first choice wins.
    """
    x, w, conv, y = _descriptors(descriptors, desc, x_shape, y_shape, precision, math_type)
    flipped = flipped_filter(descriptors, desc, precision, math_type) if gemm_candidate else None
    handles = (x.handle, w.handle, conv.handle, y.handle)
    gemm_shape = gemm_convolution.GemmShape.of(desc, x_shape, y_shape)
    choices = {}
    for direction in DIRECTIONS:
        operands = direction.operands(*handles)
        found = cudnn_candidates(handle, direction, operands, limit, math_type, search == "find")
        if not found and search == "find":
            log.info("cudnnFind offered no eligible convolution %s algorithm at %s: taking cudnnGet*_v7's",
                     direction.name, x_shape)
            found = cudnn_candidates(handle, direction, operands, limit, math_type)
        candidates = [algorithm for algorithm in found if algorithm.deterministic or not deterministic]
        if gemm_candidate:
            candidates += _gemm_candidates(direction.name, gemm_shape, limit, precision.half)
        if gemm_candidate and direction is BACKWARD_DATA and flipped is not None:
            candidates += [algorithm for algorithm in by_forward_candidates(handle, x, y, flipped, limit, math_type)
                           if algorithm.deterministic or not deterministic]
        candidates = candidates or found
        if not candidates:
            raise CudnnError(
                direction.heuristic.__name__, cudnn.STATUS_NOT_SUPPORTED, "CUDNN_STATUS_NOT_SUPPORTED",
                f"no convolution {direction.name} algorithm is supported with a workspace of at most {limit} bytes",
            )
        choices[direction.name] = candidates
    plan = ConvolutionPlan(desc, x_shape, y_shape, precision, x, w, conv, y, gemm_shape,
                           **{name: candidates[0] for name, candidates in choices.items()}, flipped=flipped)
    if search == "exhaustive" and measure is not None:
        plan = _fastest(plan, choices, measure)
    log.debug("planned %r", plan)
    return plan


def _gemm_candidates(direction: str, shape: GemmShape, limit: int, half: bool = False) -> list[Algorithm]:
    """The GEMM engine (in 16 bits with ``half``) where it runs within ``limit`` bytes: once, or in
    backward_filter once per number of samples summed inside one GEMM."""
    groupings = gemm_convolution.samples_per_gemm_choices(shape) if direction == "backward_filter" else (1,)
    candidates = []
    for samples in groupings:
        nbytes = gemm_convolution.workspace_bytes(direction, shape, samples, half)
        if nbytes <= limit and gemm_convolution.supports(shape, samples):
            candidates.append(Algorithm(GEMM_ALGORITHM, nbytes, samples_per_gemm=samples))
    return candidates


def by_forward_candidates(handle: int, x: TensorDescriptor, y: TensorDescriptor, flipped: FlippedFilter, limit: int,
                          math_type: int) -> list[Algorithm]:
    """Backward data as cuDNN's exact forward algorithms over (dy, W′) -> dx, W′ within ``limit`` too."""
    operands = (y.handle, flipped.w.handle, flipped.conv.handle, x.handle)
    found = cudnn_candidates(handle, FORWARD, operands, limit - flipped.filter_bytes, math_type)
    return [replace(algorithm, workspace_bytes=algorithm.workspace_bytes + flipped.filter_bytes, by_forward=True)
            for algorithm in found]


def backward_data_by_forward(backend, plan: ConvolutionPlan, algorithm: Algorithm, alpha, w, dy, beta, dx,
                             workspace: int) -> None:
    """dx = alpha·(dy ⋆ W′) + beta·dx by cudnnConvolutionForward, W′ flipped from w into the workspace."""
    if plan.precision.half:
        _backward_data_by_forward_half(backend, plan, algorithm, alpha, w, dy, beta, dx, workspace)
        return
    flipped, context = plan.flipped, backend.context
    k, c, r, s = plan.desc.filter_shape
    # W′[c, k, r, s] = W[k, c, R−1−r, S−1−s]      (C, K, R, S)
    context.kernel("flip_filter").launch(blocks_for(k * c * r * s), context.stream.handle, workspace, w.data.ptr, k, c,
                                         r * s)
    cudnn.convolution_forward(context.cudnn.handle, context.scalar(alpha), plan.y.handle, dy.data.ptr, flipped.w.handle,
                              workspace, flipped.conv.handle, algorithm.algo, workspace + flipped.filter_bytes,
                              algorithm.workspace_bytes - flipped.filter_bytes, context.scalar(beta), plan.x.handle,
                              dx.data.ptr)


def _backward_data_by_forward_half(backend, plan: ConvolutionPlan, algorithm: Algorithm, alpha, w, dy, beta, dx,
                                   workspace: int) -> None:
    """The same in 16 bits (as ``ConvolutionPlanner.run`` runs cuDNN there): W′₁₆ flipped from W's 16-bit
    copy, dx₁₆ = dy₁₆ ⋆ W′₁₆ (rounded by cuDNN), then dx = alpha·float(dx₁₆) + beta·dx; a 16-bit dx (a
    16-bit CNN's, alpha 1 and beta 0) is cuDNN's output itself."""
    flipped, fmt, context = plan.flipped, half_format(plan.precision), backend.context
    k, c, r, s = plan.desc.filter_shape
    direct = dx.dtype is fmt.dtype
    w16, dy16, *slot = context.half.operands((w, w.size), (dy, dy.size), output=0 if direct else dx.size, fmt=fmt)
    dx16 = dx.data.ptr if direct else slot[0]
    # W′₁₆[c, k, r, s] = W₁₆[k, c, R−1−r, S−1−s]      (C, K, R, S)
    context.kernel("flip_filter_half").launch(blocks_for(k * c * r * s), context.stream.handle, workspace, w16, k, c,
                                              r * s)
    # dx₁₆ = dy₁₆ ⋆ W′₁₆
    cudnn.convolution_forward(context.cudnn.handle, context.scalar(1.0), plan.y.handle, dy16, flipped.w.handle,
                              workspace, flipped.conv.handle, algorithm.algo, workspace + flipped.filter_bytes,
                              algorithm.workspace_bytes - flipped.filter_bytes, context.scalar(0.0), plan.x.handle,
                              dx16)
    if not direct:
        # dx = alpha·float(dx₁₆) + beta·dx
        context.half.to_float(dx.data.ptr, dx16, alpha, beta, dx.size, fmt=fmt)


def plan_with(handle: int, descriptors: DescriptorCache, desc: ConvolutionDescriptor, x_shape, y_shape,
              precision: Precision, math_type: int, limit: int, algorithms: dict[str, Algorithm]) -> ConvolutionPlan | None:
    """A plan running ``algorithms`` (by direction name) at these shapes, without listing or timing
    candidates; None where one of them cannot run here or needs more than ``limit`` bytes.

    The workspaces are asked of cuDNN (computed for the GEMM engine) at these shapes, never taken
    from ``algorithms``: cudnnGet*WorkspaceSize fails for an algorithm that does not support the
    shapes. Under CUDNN_FMA_MATH and bf16's CUDNN_TENSOR_OP_MATH only exact algorithms are accepted, as
    ``make_plan`` does.
    """
    x, w, conv, y = _descriptors(descriptors, desc, x_shape, y_shape, precision, math_type)
    by_forward = any(algorithm.by_forward for algorithm in algorithms.values())
    flipped = flipped_filter(descriptors, desc, precision, math_type) if by_forward else None
    handles = (x.handle, w.handle, conv.handle, y.handle)
    gemm_shape = gemm_convolution.GemmShape.of(desc, x_shape, y_shape)
    chosen = {}
    for direction in DIRECTIONS:
        algorithm = algorithms[direction.name]
        if algorithm.by_forward:
            nbytes = _by_forward_bytes(handle, direction, x, y, flipped, algorithm, math_type)
        else:
            nbytes = _workspace_bytes(handle, direction, direction.operands(*handles), gemm_shape, algorithm, math_type,
                                      precision.half)
        if nbytes is None or nbytes > limit:
            log.debug("convolution %s algorithm %d cannot run at %s within %d bytes (workspace %s)",
                      direction.name, algorithm.algo, x_shape, limit, nbytes)
            return None
        chosen[direction.name] = replace(algorithm, workspace_bytes=nbytes)
    return ConvolutionPlan(desc, x_shape, y_shape, precision, x, w, conv, y, gemm_shape, **chosen, flipped=flipped)


# Precision.operand_dtype -> cudnnDataType_t of x, w and y (float32 otherwise); float16 is cuDNN's
# PSEUDO_HALF_CONFIG (half tensors, FLOAT compute) and takes bf16's algorithms (the same CUDNN_TENSOR_OP_MATH list)
DATA_TYPES = {BFLOAT16: cudnn.DATA_BFLOAT16, FLOAT16: cudnn.DATA_HALF}


def data_type(precision: Precision) -> int:
    """cudnnDataType_t of a convolution's x, w and y under ``precision``."""
    return DATA_TYPES.get(precision.operand_dtype, cudnn.DATA_FLOAT)


def _descriptors(descriptors: DescriptorCache, desc: ConvolutionDescriptor, x_shape, y_shape, precision: Precision,
                 math_type: int):
    """(x, w, conv, y) descriptors from the cache, x, w and y of ``precision``'s data type."""
    values = data_type(precision)
    x, y = descriptors.tensor(x_shape, values), descriptors.tensor(y_shape, values)
    return x, descriptors.filter(desc.filter_shape, values), descriptors.convolution(desc, math_type), y


def flipped_filter(descriptors: DescriptorCache, desc: ConvolutionDescriptor, precision: Precision,
                    math_type: int) -> FlippedFilter | None:
    """W′'s descriptors where backward data is a forward convolution: stride 1, padding p <= d·(R−1);
    W′ of ``precision``'s data type (float32, or the 16-bit one W′ is flipped from W's 16-bit copy in)."""
    padding = desc.dilation * (desc.kernel_size - 1) - desc.padding
    if desc.stride != 1 or padding < 0:
        return None
    flipped = ConvolutionDescriptor(desc.in_channels, desc.out_channels, desc.kernel_size, 1, padding, desc.dilation)
    return FlippedFilter(flipped, descriptors.filter(flipped.filter_shape, data_type(precision)),
                         descriptors.convolution(flipped, math_type))


def _by_forward_bytes(handle: int, direction: Direction, x: TensorDescriptor, y: TensorDescriptor,
                      flipped: FlippedFilter | None, algorithm: Algorithm, math_type: int) -> int | None:
    """The workspace of backward data as forward ``algorithm.algo`` (W′ included), or None where it cannot run."""
    if direction is not BACKWARD_DATA or flipped is None or algorithm.samples_per_gemm != 1:
        return None
    if _ineligible(math_type, FORWARD.name, algorithm.algo):
        return None
    try:
        nbytes = FORWARD.workspace_size(handle, y.handle, flipped.w.handle, flipped.conv.handle, x.handle,
                                        algorithm.algo)
    except CudnnError:
        return None
    return nbytes + flipped.filter_bytes


def _workspace_bytes(handle: int, direction: Direction, operands: tuple, gemm_shape: GemmShape,
                     algorithm: Algorithm, math_type: int, half: bool = False) -> int | None:
    """The workspace ``algorithm`` needs in ``direction`` (the GEMM engine's in 16 bits with ``half``),
    or None where it cannot run these shapes."""
    algo, samples = algorithm.algo, algorithm.samples_per_gemm
    if algo == GEMM_ALGORITHM:
        if (samples != 1 and direction.name != "backward_filter") or not gemm_convolution.supports(gemm_shape, samples):
            return None
        return gemm_convolution.workspace_bytes(direction.name, gemm_shape, samples, half)
    if samples != 1 or _ineligible(math_type, direction.name, algo):
        return None
    try:
        return direction.workspace_size(handle, *operands, algo)
    except CudnnError:
        return None


CONTENDER_RATIO = 2.0  # candidates measured within this factor of the fastest are measured again
CONTENDER_ROUNDS = 2  # ... this many more times, in turn, each keeping its fastest time


def _fastest(plan: ConvolutionPlan, choices: dict, measure) -> ConvolutionPlan:
    """The plan with, in each direction, the candidate ``measure`` found fastest. A measurement can
    catch the GPU slow for a moment, so the contenders (within CONTENDER_RATIO of the fastest) are
    measured CONTENDER_ROUNDS more times, in turn, and each keeps its fastest time."""
    for name, candidates in choices.items():
        if len(candidates) > 1:
            times = [measure(replace(plan, **{name: candidate}), name) for candidate in candidates]
            contenders = [index for index, time in enumerate(times) if time <= CONTENDER_RATIO * min(times)]
            for _ in range(CONTENDER_ROUNDS if len(contenders) > 1 else 0):
                for index in contenders:
                    times[index] = min(times[index], measure(replace(plan, **{name: candidates[index]}), name))
            best = min(range(len(candidates)), key=times.__getitem__)
            log.debug("convolution %s %s: %s ms", name, plan.x_shape,
                      ", ".join(f"algorithm {c.label} {t:.4f}" for c, t in zip(candidates, times)))
            plan = replace(plan, **{name: candidates[best]})
    return plan
