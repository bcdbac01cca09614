"""The convolution planner of one CUDA backend, as ``GemmEngine`` (matmul.py) is its GEMMs':

- ``plan``: the plan (convolution.py) of a (descriptor, input shape, precision, search), kept in an LRU
  cache of PLAN_CACHE_SIZE; a new one comes from the disk cache (plan_cache.py) where it holds a
  valid one, else from the algorithms of a larger batch's plan, else from ``make_plan``'s search,
  whose candidates ``ConvolutionTimer`` times in an exhaustive search; the context's shared
  workspace grows to fit it before any call runs it;
- ``run``: one direction with its plan's algorithm (cuDNN, the explicit-GEMM convolution, or backward
  data as a forward convolution), in 16 bits under a 16-bit math.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from ...engine import Engine
from ...errors import DeviceError, ShapeError
from ...precision import Precision
from ...tensor import Tensor, as_shape
from ..descriptors import ConvolutionDescriptor
from . import plan_cache
from .backward_bias import scratch_bytes as bias_scratch_bytes
from .convolution import DIRECTION_NAMES, ConvolutionPlan, Direction, backward_data_by_forward, make_plan, plan_with
from .gemm_convolution import GEMM_ALGORITHM
from .handles import Event
from .low_precision import half_format

log = logging.getLogger(__name__)

PLAN_CACHE_SIZE = 64


def search_label(engine: Engine) -> str:
    """How ``engine`` chooses convolution algorithms, as plan keys name it: its search, and whether our
    explicit-GEMM convolution is among the candidates."""
    search = engine.convolution_search
    label = search if engine.gemm_convolution or search == "find" else f"{search}-cudnn"
    return label if engine.deterministic_convolution else f"{label}-any"


class ConvolutionPlanner:
    """The plans of ``backend``'s convolutions, the search and timing that make them, and the run of one."""

    def __init__(self, backend, workspace_limit: int):
        self.backend = backend  # what runs a direction (the GEMM engine, the 16-bit math) and times candidates
        self.workspace_limit = workspace_limit  # bytes a convolution algorithm may use
        self.plans: OrderedDict = OrderedDict()  # (desc, x_shape, precision, search) -> ConvolutionPlan

    @property
    def context(self):
        return self.backend.context

    def close(self) -> None:
        self.plans.clear()

    # ---- plans ---------------------------------------------------------------------------------
    def plan(self, desc: ConvolutionDescriptor, x_shape, y_shape, precision: Precision, math_type: int,
             engine: Engine) -> ConvolutionPlan:
        """Algorithms for this (descriptor, input shape, precision), chosen once and cached; the
        shared workspace grows to fit them and the two-pass bias gradient of ``y_shape`` now, so
        that no later call allocates."""
        x_shape, y_shape = as_shape(x_shape), as_shape(y_shape)
        key = (desc, x_shape, precision, search_label(engine))  # the search names the engine's choice
        plan = self.plans.get(key)
        if plan is None:
            check_convolution_shapes(desc, x_shape, y_shape)
            if self.context.is_capturing():
                raise DeviceError(
                    f"convolution_plan for input {x_shape} was asked for during a CUDA graph capture; "
                    "run one forward pass at this batch size before capturing"
                )
            plan = self._new_plan(desc, x_shape, y_shape, precision, math_type, engine)
            self.context.workspace(max(plan.workspace_bytes, bias_scratch_bytes(y_shape)))
            self.context.ones(x_shape[0])
            self.plans[key] = plan
            if len(self.plans) > PLAN_CACHE_SIZE:
                self.plans.popitem(last=False)
        elif plan.y_shape != y_shape:
            check_convolution_shapes(desc, x_shape, y_shape)
        self.plans.move_to_end(key)
        return plan

    def _new_plan(self, desc: ConvolutionDescriptor, x_shape, y_shape, precision: Precision, math_type: int,
                  engine: Engine) -> ConvolutionPlan:
        """The plan from the disk cache where it holds a valid one, else the algorithms of a larger
        batch's plan where they run at this one, else searched by ``make_plan`` and written to the
        disk cache."""
        disk_key = self.plan_key(desc, x_shape, y_shape, precision, engine)
        plan = (self._plan_from_disk(disk_key, precision, math_type)
                or self._plan_from_larger_batch(desc, x_shape, y_shape, precision, math_type, engine))
        if plan is None:
            self.context.finish_warm_up()  # nothing else on the GPU while cuDNN (or our timer) measures
            plan = make_plan(self.context.cudnn.handle, self.context.descriptors, desc, x_shape, y_shape, precision,
                             math_type, self.workspace_limit, engine.convolution_search,
                             gemm_candidate=engine.gemm_convolution,
                             measure=self._timer(desc, x_shape, y_shape, engine, precision),
                             deterministic=engine.deterministic_convolution)
            plan_cache.write_plan(disk_key, {name: getattr(plan, name) for name in DIRECTION_NAMES})
        return plan

    def plan_key(self, desc: ConvolutionDescriptor, x_shape, y_shape, precision: Precision,
                 engine: Engine) -> plan_cache.PlanKey:
        """The disk cache's key of this convolution on this device and libraries (the precision by name)."""
        context = self.context
        return plan_cache.PlanKey(context.device_name, context.compute_capability, context.cudnn_version,
                                  context.cublas_version, desc, x_shape, y_shape, precision.name, search_label(engine),
                                  self.workspace_limit)

    def _plan_from_disk(self, key: plan_cache.PlanKey, precision: Precision, math_type: int) -> ConvolutionPlan | None:
        """The stored plan of ``key`` when cuDNN still runs its algorithms with the stored workspaces."""
        stored = plan_cache.read_plan(key)
        if stored is None:
            return None
        plan = plan_with(self.context.cudnn.handle, self.context.descriptors, key.desc, key.x_shape, key.y_shape,
                         precision, math_type, self.workspace_limit, stored)
        if plan is None or any(getattr(plan, name) != algorithm for name, algorithm in stored.items()):
            log.debug("the cached convolution plan for %s %s is no longer valid here: searching again", key.desc,
                      key.x_shape)
            return None
        log.debug("convolution plan from the disk cache: %r", plan)
        return plan

    def _plan_from_larger_batch(self, desc: ConvolutionDescriptor, x_shape, y_shape, precision: Precision,
                                math_type: int, engine: Engine) -> ConvolutionPlan | None:
        """A plan with the algorithms of this convolution's plan at the nearest larger batch (same
        sample shape, precision and search), where cuDNN runs them at this batch within the workspace
        limit; workspaces are asked again. Where the engine asks for deterministic algorithms, a larger
        plan holding a non-deterministic one is not reused: this batch may have a deterministic one
        within the limit."""
        label = search_label(engine)
        larger = [plan for (other, shape, plan_precision, search), plan in self.plans.items()
                  if other == desc and plan_precision == precision and search == label
                  and shape[1:] == x_shape[1:] and shape[0] > x_shape[0]]
        if not larger:
            return None
        source = min(larger, key=lambda plan: plan.x_shape[0])
        algorithms = {name: getattr(source, name) for name in DIRECTION_NAMES}
        if engine.deterministic_convolution and not all(algorithm.deterministic for algorithm in algorithms.values()):
            return None
        plan = plan_with(self.context.cudnn.handle, self.context.descriptors, desc, x_shape, y_shape, precision,
                         math_type, self.workspace_limit, algorithms)
        if plan is not None:
            log.debug("convolution plan from the plan at batch %d: %r", source.x_shape[0], plan)
        return plan

    def _timer(self, desc: ConvolutionDescriptor, x_shape, y_shape, engine: Engine, precision: Precision):
        """What times the candidates of an exhaustive search (None for a heuristic one); its scratch
        tensors are allocated at the first measurement (none where every direction has one candidate),
        their activations in ``precision``'s activation dtype (16 bits under bf16 and fp16), as a
        network's are."""
        if engine.convolution_search != "exhaustive":
            return None
        timers: list[ConvolutionTimer] = []

        def measure(plan: ConvolutionPlan, direction: str) -> float:
            if not timers:
                timers.append(ConvolutionTimer(self.backend, x_shape, desc.filter_shape, y_shape,
                                              precision.activation_dtype))
            return timers[0].measure(plan, direction)

        return measure

    # ---- running a plan --------------------------------------------------------------------------
    def run(self, direction: Direction, plan: ConvolutionPlan, alpha, a, b, beta, out) -> None:
        """One direction with the plan's algorithm: cudnnConvolution{Forward,BackwardData,BackwardFilter}
        (``direction.run``), or our explicit-GEMM engine (``direction.gemm``) where the plan chose it."""
        backend, context = self.backend, self.context
        algorithm = getattr(plan, direction.name)
        workspace = context.workspace(algorithm.workspace_bytes)
        if algorithm.algo == GEMM_ALGORITHM:  # in 16 bits under a 16-bit math (gemm_convolution.py)
            direction.gemm(backend, plan.gemm_shape, alpha, a, b, beta, out, workspace, algorithm, plan.precision)
            return
        if algorithm.by_forward:  # backward data as a forward convolution with the flipped filter
            backward_data_by_forward(backend, plan, algorithm, alpha, a, b, beta, out, workspace)
            return
        a_desc, b_desc, conv, out_desc = direction.operands(plan.x.handle, plan.w.handle, plan.conv.handle,
                                                            plan.y.handle)
        if plan.precision.half:
            # out₁₆ = bf16(a) ⋆ bf16(b), then out = alpha·float(out₁₆) + beta·out   (fp16 under math "fp16");
            # a 16-bit out (a 16-bit CNN's y or dx, alpha 1 and beta 0: arguments.check_plan) written as it is
            fmt = half_format(plan.precision)
            direct = out.dtype is fmt.dtype
            a16, b16, *slot = context.half.operands((a, a.size), (b, b.size), output=0 if direct else out.size, fmt=fmt)
            out16 = out.data.ptr if direct else slot[0]
            direction.run(context.cudnn.handle, context.scalar(1.0), a_desc, a16, b_desc, b16, conv, algorithm.algo,
                          workspace, algorithm.workspace_bytes, context.scalar(0.0), out_desc, out16)
            if not direct:
                context.half.to_float(out.data.ptr, out16, alpha, beta, out.size, fmt=fmt)
            return
        direction.run(context.cudnn.handle, context.scalar(alpha), a_desc, a.data.ptr, b_desc, b.data.ptr, conv,
                      algorithm.algo, workspace, algorithm.workspace_bytes, context.scalar(beta), out_desc,
                      out.data.ptr)


class ConvolutionTimer:
    """Times one run of a convolution direction with a candidate plan, on scratch tensors of the
    plan's shapes (zeros; x, dx and dy of the network's activation dtype, w and dw float32), with CUDA
    events: one warm-up run, then the fastest of three, each queued behind the ``spin`` kernel
    (kernels/timing.cu) so that host launch overhead is not timed."""

    RUNS = 3
    SPIN_NS = 300_000  # more than the host needs to queue one run of a direction

    def __init__(self, backend, x_shape, w_shape, y_shape, activation_dtype=None):
        self.backend = backend
        self.x = Tensor.zeros(x_shape, backend, dtype=activation_dtype)  # (N, C, H, W)
        self.dx = Tensor.zeros(x_shape, backend, dtype=activation_dtype)
        self.w, self.dw = Tensor.zeros(w_shape, backend), Tensor.zeros(w_shape, backend)  # (K, C, R, S)
        self.dy = Tensor.zeros(y_shape, backend, dtype=activation_dtype)  # (N, K, OH, OW)
        self.start, self.end = Event(), Event()

    def run(self, plan: ConvolutionPlan, direction: str) -> None:
        b = self.backend
        if direction == "forward":
            b.convolution_forward(plan, 1.0, self.x, self.w, 0.0, self.dy)
        elif direction == "backward_data":
            b.convolution_backward_data(plan, 1.0, self.w, self.dy, 0.0, self.dx)
        else:
            b.convolution_backward_filter(plan, 1.0, self.x, self.dy, 0.0, self.dw)

    def measure(self, plan: ConvolutionPlan, direction: str) -> float:
        """Milliseconds of the fastest of RUNS runs, after one warm-up run."""
        stream = self.backend.context.stream
        self.backend.context.ones(plan.gemm_shape.batch)
        self.run(plan, direction)
        times = []
        for _ in range(self.RUNS):
            # the GPU spins while the host queues the run, so the events time the GPU, not the launches
            self.backend.context.kernel("spin").launch(1, stream.handle, self.SPIN_NS)
            self.start.record(stream)
            self.run(plan, direction)
            self.end.record(stream)
            self.end.synchronize()
            times.append(self.start.elapsed_ms(self.end))
        return min(times)


def check_convolution_shapes(desc: ConvolutionDescriptor, x_shape, y_shape) -> None:
    if x_shape[1] != desc.in_channels:
        raise ShapeError(f"convolution: input {x_shape} has {x_shape[1]} channels, the filter {desc.in_channels}")
    expected = desc.output_shape(x_shape)
    if y_shape != expected or min(expected) < 1:
        raise ShapeError(f"convolution: input {x_shape} gives output {expected} with {desc}, got {y_shape}")
