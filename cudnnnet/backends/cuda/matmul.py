"""GEMMs with a timed choice of algorithm: the fast engine's ``sgemm`` and its convolution GEMMs.

cublasSgemm takes the kernel cuBLAS's heuristic picks for the sizes; for the small matrices of our
networks another of cuBLASLt's algorithms is often faster. So a GEMM problem — transposes, m, n,
k, leading dimensions, batch and strides, math mode, the operands' alignment — gets a plan once, as
a convolution does:

    candidates = cublasSgemm(StridedBatched) + cublasLtMatmulAlgoGetHeuristic's algorithms
                 + the transposing candidate below
    plan       = the candidate with the least GPU time, each timed on the call's own operands

and every later call of that problem runs its plan: cublasLtMatmul with the stored algorithm, or
cublasSgemm when that won (a cuBLASLt algorithm must be ``MARGIN`` faster to be taken). The
transposing candidate copies the operands to the layout tensor cores read fastest, both with K
contiguous (cublasSgeam into the engine's scratch), then runs the "TN" cublasSgemm:

    A' = op(A)ᵀ (k × m),  B' = op(B) (k × n)       cublasSgeam where op(A) or op(B) needs it
    C  = alpha·A'ᵀ·B' + beta·C                     cublasSgemm (OP_T, OP_N)

which helps a weight gradient dW = x·dyᵀ, whose operands both have K (the batch) as the slow
dimension. The search "heuristic", and a problem first met during a CUDA-graph capture (nothing
can be timed there), take cublasSgemm without timing. Every candidate computes the same FP32 (or
TF32) GEMM, deterministically; they differ in tiling and in how K is split.

Under math "bf16" A and B are bfloat16 (the copies of low_precision.py, or a 16-bit MLP's activations),
C float32 or, for a 16-bit activation (``c_half``), bfloat16 rounded once from the FP32 sum, FP32
accumulation: the untimed candidate is cublasGemmEx (cublasGemmStridedBatchedEx for a batch: the
GEMM convolution's; CUDA_R_16BF operands, CUBLAS_COMPUTE_32F), the cuBLASLt layouts of A and B are
CUDA_R_16BF, and there is no transposing candidate (cublasSgeam copies float32 only). Math "fp16"
is the same with CUDA_R_16F operands.

A problem with an epilogue (``sgemm_bias_activation``: a 16-bit Dense's y = f(Wᵀx + b), f a ReLU or
none) runs on cuBLASLt alone, CUBLASLT_EPILOGUE_BIAS or RELU_BIAS with a bias of C's type set on the
descriptor before each call: its candidates are the heuristic's algorithms (cublasGemmEx has no
epilogue), untimed it takes the first, and where the heuristic offers none ``run`` says so and runs
nothing, for the caller to compute the same otherwise.

Timed plans are kept on disk (below, in ``cache.plan_dir()``: one file per problem, keyed by the GPU,
the cuBLAS and cuBLASLt versions, the problem, the cuBLAS workspace and the rules above), so that a new process
neither asks the heuristic nor times anything for a problem met before. A stored cuBLASLt
algorithm is checked by its first run, the call that read it (cublasLtMatmulAlgoCheck would cost
as much as the heuristic): a status error there sends the problem back to the search, as does a
transposing plan no longer within TRANSPOSE_LIMIT_BYTES; the file is rewritten.
"""

from __future__ import annotations

import ctypes
import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from ...errors import CublasError, OutOfMemoryError
from ...io import cache
from ...precision import BFLOAT16, FLOAT16, FP32, Precision
from ..base import OP_N, OP_T
from .bindings import cublas, cublaslt
from .buffer import FLOAT32_BYTES, DeviceBuffer
from .handles import Event

log = logging.getLogger(__name__)

CANDIDATES = 16  # algorithms asked of the cuBLASLt heuristic
MARGIN = 0.98  # a cuBLASLt algorithm replaces cublasSgemm when it takes under 98 % of its time
OPERAND_TYPES = {BFLOAT16: cublas.R_16BF, FLOAT16: cublas.R_16F}  # Precision.operand_dtype -> cudaDataType_t of A, B
MAX_ALIGNMENT = 256  # bytes: cuBLASLt's default minimum alignment of every operand
TRANSPOSE_LIMIT_BYTES = 1 << 30  # the most scratch the transposing candidate may take
GEMM_PLAN_FORMAT = 2  # raise when what a plan file holds, or how a plan is chosen, changes
GEMM_FIELDS = {"sgemm": {"candidate", "microseconds"}, "transposed": {"candidate", "microseconds"},
               "lt": {"candidate", "microseconds", "algo"}}  # what a plan file's choice holds, by candidate
ALGO_BYTES = ctypes.sizeof(cublaslt.MatmulAlgo)  # cublasLtMatmulAlgo_t: 64 opaque bytes
ALIGNED_FLOATS = MAX_ALIGNMENT // FLOAT32_BYTES


@dataclass(frozen=True)
class GemmProblem:
    """C(m×n) = alpha·op(A)·op(B) + beta·C, column-major, for ``batch`` matrices at strides."""

    transa: int
    transb: int
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    batch: int = 1
    stride_a: int = 0
    stride_b: int = 0
    stride_c: int = 0
    precision: Precision = FP32
    alignment: tuple = (MAX_ALIGNMENT,) * 3  # bytes that A, B and C's addresses are multiples of (≤ 256)
    c_half: bool = False  # C holds the operands' 16-bit type (a 16-bit activation), not float32
    epilogue: int = 0  # cuBLASLt's epilogue on C (cublaslt.EPILOGUE_BIAS, EPILOGUE_RELU_BIAS), its bias a vector
    #                    of m values of C's type given with each call; 0: none. cuBLASLt alone runs it

    @property
    def c_type(self) -> int:
        """cudaDataType_t of C: the operands' 16-bit type where ``c_half``, else CUDA_R_32F."""
        return operand_type_of(self.precision) if self.c_half else cublas.R_32F

    @property
    def stored_a(self) -> tuple[int, int]:
        return (self.m, self.k) if self.transa == OP_N else (self.k, self.m)

    @property
    def stored_b(self) -> tuple[int, int]:
        return (self.k, self.n) if self.transb == OP_N else (self.n, self.k)

    @property
    def transposes(self) -> tuple[bool, bool]:
        """Whether A and B must be copied to reach the TN layout (K contiguous in both)."""
        return self.transa == OP_N, self.transb == OP_T

    @property
    def transposed_values(self) -> int:
        """Scratch floats of the transposing candidate: A' (k × m) then B' (k × n), 256-byte aligned."""
        copy_a, copy_b = self.transposes
        return _aligned(self.k * self.m) * copy_a + self.k * self.n * copy_b

    @property
    def c_values(self) -> int:
        """The floats from C's first value to its last, all matrices of the batch."""
        return self.stride_c * (self.batch - 1) + self.ldc * (self.n - 1) + self.m


def compute_type(precision: Precision) -> int:
    """cublasComputeType_t of ``precision``: FP32 sums, on TF32 tensor cores where it allows them."""
    return cublaslt.COMPUTE_32F_FAST_TF32 if precision.tensor_cores else cublaslt.COMPUTE_32F


def operand_type_of(precision: Precision) -> int:
    """cudaDataType_t of A and B under ``precision``: its 16-bit type, else CUDA_R_32F."""
    return OPERAND_TYPES.get(precision.operand_dtype, cublas.R_32F)


def problem_json(problem: GemmProblem) -> dict:
    """``problem`` as JSON values, its precision by name (a plan file's "math")."""
    values = asdict(problem)
    del values["precision"]
    if not problem.c_half:  # a float32 C: the key plans stored before 16-bit Cs had
        del values["c_half"]
    if not problem.epilogue:  # no epilogue: the key plans stored before epilogues had
        del values["epilogue"]
    return {**values, "math": problem.precision.name, "alignment": list(problem.alignment)}


def _aligned(values: int) -> int:
    return -(-values // ALIGNED_FLOATS) * ALIGNED_FLOATS


def alignment(*pointers: int) -> tuple:
    """The largest power of two (at most 256) that divides each address."""
    return tuple(min(MAX_ALIGNMENT, pointer & -pointer) if pointer else MAX_ALIGNMENT for pointer in pointers)


class LtMatmul:
    """The cuBLASLt descriptors of one problem: the operation (with its epilogue, if any) and the layouts
    of A, B and C (= D)."""

    def __init__(self, problem: GemmProblem):
        self.desc = cublaslt.matmul_desc_create(compute_type(problem.precision))
        self.layouts = []
        self.bias = None  # the bias address the descriptor holds (an epilogue's)
        try:
            cublaslt.matmul_desc_set_int32(self.desc, cublaslt.DESC_TRANSA, problem.transa)
            cublaslt.matmul_desc_set_int32(self.desc, cublaslt.DESC_TRANSB, problem.transb)
            if problem.epilogue:
                cublaslt.matmul_desc_set_uint32(self.desc, cublaslt.DESC_EPILOGUE, problem.epilogue)
                cublaslt.matmul_desc_set_int32(self.desc, cublaslt.DESC_BIAS_DATA_TYPE, problem.c_type)
            operand_type = operand_type_of(problem.precision)
            for (rows, cols), ld, stride, data_type in (
                    (problem.stored_a, problem.lda, problem.stride_a, operand_type),
                    (problem.stored_b, problem.ldb, problem.stride_b, operand_type),
                    ((problem.m, problem.n), problem.ldc, problem.stride_c, problem.c_type)):
                self.layouts.append(cublaslt.matrix_layout_create(rows, cols, ld, data_type))
                if problem.batch > 1:
                    cublaslt.matrix_layout_set_batch(self.layouts[-1], problem.batch, stride)
        except Exception:
            self.close()
            raise

    def set_bias(self, pointer: int) -> None:
        """The epilogue's bias vector for the calls from here on (the heuristic reads its alignment too)."""
        if pointer != self.bias:
            cublaslt.matmul_desc_set_pointer(self.desc, cublaslt.DESC_BIAS_POINTER, pointer)
            self.bias = pointer

    def algorithms(self, handle: int, workspace_bytes: int, problem: GemmProblem) -> list:
        """The heuristic's algorithms that fit the workspace and the operands' alignment."""
        preference = cublaslt.preference_create(workspace_bytes)
        try:
            for attribute, value in zip(cublaslt.PREF_MIN_ALIGNMENT, (*problem.alignment, problem.alignment[2])):
                cublaslt.preference_set_uint32(preference, attribute, value)
            if problem.c_half:  # a split K is summed in FP32, as the host's oracle sums, never in C's 16 bits
                cublaslt.preference_set_uint32(preference, cublaslt.PREF_REDUCTION_SCHEME_MASK,
                                               cublaslt.REDUCTION_SCHEMES_IN_COMPUTE_TYPE)
            a, b, c = self.layouts
            return cublaslt.algo_get_heuristic(handle, self.desc, a, b, c, c, preference, CANDIDATES)
        finally:
            cublaslt.preference_destroy(preference)

    def close(self) -> None:
        for layout in self.layouts:
            cublaslt.matrix_layout_destroy(layout)
        self.layouts = []
        if self.desc:
            cublaslt.matmul_desc_destroy(self.desc)
            self.desc = 0


@dataclass
class GemmPlan:
    """What runs a problem: ``algorithm`` None is cublasSgemm(StridedBatched); ``transposed``
    copies the operands to the TN layout first."""

    problem: GemmProblem
    lt: LtMatmul | None = None
    algorithm: cublaslt.MatmulAlgo | None = None
    microseconds: float | None = None  # the winner's time per call, when timed
    transposed: bool = False
    unproven: bool = False  # a cuBLASLt algorithm read from disk that has not run here yet

    def close(self) -> None:
        if self.lt is not None:
            self.lt.close()
            self.lt = None

    def __repr__(self) -> str:
        engine = "cublasLtMatmul" if self.algorithm is not None else "cublasSgemm"
        engine = f"cublasSgeam + TN {engine}" if self.transposed else engine
        timed = f", {self.microseconds:.2f} us" if self.microseconds is not None else ""
        return f"GemmPlan({self.problem}, {engine}{timed})"


class GemmEngine:
    """Plans and runs the GEMMs of one CudaBackend (its cuBLAS and cuBLASLt handles, stream and
    workspace)."""

    def __init__(self, context, scalar):
        self.context = context
        self.scalar = scalar  # float -> the host pointer cuBLAS reads it from
        self.plans: dict[tuple[GemmProblem, str], GemmPlan] = {}  # (problem, search) -> plan
        self._timer: GemmTimer | None = None
        self._scratch: DeviceBuffer | None = None  # transposed operands; grow-only
        self._outgrown: list[DeviceBuffer] = []  # a captured graph may still read them

    def run(self, problem: GemmProblem, search: str, alpha: float, a: int, b: int, beta: float, c: int,
            bias: int = 0) -> bool:
        """C = alpha·op(A)·op(B) + beta·C with ``problem``'s plan, made first if there is none:
        ``search`` "exhaustive" times the candidates, "heuristic" takes cublasSgemm (cuBLASLt's first
        algorithm for an epilogue, whose bias is at ``bias``). False, having run nothing, where the
        problem has an epilogue and cuBLASLt offers no algorithm for it."""
        plan = self.plans.get((problem, search))
        alpha_pointer, beta_pointer = self.scalar(alpha), self.scalar(beta)
        if plan is None:
            self.context.finish_warm_up()
            plan = self.plans[problem, search] = self._plan(problem, search, alpha_pointer, a, b, beta_pointer, c,
                                                            beta == 0.0, bias)
        if plan.unproven:
            plan = self.plans[problem, search] = self._prove(plan, alpha_pointer, a, b, beta_pointer, c, beta == 0.0,
                                                             bias)
            return _runnable(plan)
        if not _runnable(plan):
            return False
        self._execute(plan, alpha_pointer, a, b, beta_pointer, c, bias)
        return True

    def close(self) -> None:
        for plan in self.plans.values():
            plan.close()
        self.plans.clear()
        self._timer = None
        for buffer in (self._scratch, *self._outgrown):
            if buffer is not None:
                buffer.free()
        self._scratch = None
        self._outgrown.clear()

    # ---- running a plan ----------------------------------------------------------------------
    def _execute(self, plan: GemmPlan, alpha, a: int, b: int, beta, c: int, bias: int = 0) -> None:
        p = plan.problem
        if plan.transposed:
            self._transposed(p, alpha, a, b, beta, c, self._scratch.ptr)
            return
        if plan.algorithm is None:
            self._cublas_sgemm(p, alpha, a, b, beta, c)
            return
        workspace, workspace_bytes = self.context.cublas_workspace
        layout_a, layout_b, layout_c = plan.lt.layouts
        if p.epilogue:
            plan.lt.set_bias(bias)
        cublaslt.matmul(self.context.cublas_lt.handle, plan.lt.desc, alpha, a, layout_a, b, layout_b, beta, c, layout_c,
                        c, layout_c, plan.algorithm, workspace, workspace_bytes, self.context.stream.address)

    def _cublas_sgemm(self, p: GemmProblem, alpha, a: int, b: int, beta, c: int) -> None:
        """The slides' call: cublasSgemm (cublasSgemmStridedBatched for a batch); cublasGemmEx in bf16 and fp16
        (cublasGemmStridedBatchedEx for a batch)."""
        handle = self.context.cublas.handle
        if p.precision.half and p.batch > 1:
            # Cᵢ = alpha·op(A₁₆ᵢ)·op(B₁₆ᵢ) + beta·Cᵢ
            operand_type = operand_type_of(p.precision)
            cublas.gemm_strided_batched_ex(handle, p.transa, p.transb, p.m, p.n, p.k, alpha, a, operand_type, p.lda,
                                           p.stride_a, b, operand_type, p.ldb, p.stride_b, beta, c, p.c_type, p.ldc,
                                           p.stride_c, p.batch, cublas.COMPUTE_32F, cublas.GEMM_DEFAULT)
            return
        if p.precision.half:
            # C = alpha·op(A₁₆)·op(B₁₆) + beta·C
            operand_type = operand_type_of(p.precision)
            cublas.gemm_ex(handle, p.transa, p.transb, p.m, p.n, p.k, alpha, a, operand_type, p.lda, b, operand_type,
                           p.ldb, beta, c, p.c_type, p.ldc, cublas.COMPUTE_32F, cublas.GEMM_DEFAULT)
            return
        if p.batch == 1:
            cublas.sgemm(handle, p.transa, p.transb, p.m, p.n, p.k, alpha, a, p.lda, b, p.ldb, beta, c, p.ldc)
        else:
            cublas.sgemm_strided_batched(handle, p.transa, p.transb, p.m, p.n, p.k, alpha, a, p.lda, p.stride_a, b,
                                         p.ldb, p.stride_b, beta, c, p.ldc, p.stride_c, p.batch)

    def _transposed(self, p: GemmProblem, alpha, a: int, b: int, beta, c: int, scratch: int) -> None:
        handle, one, zero = self.context.cublas.handle, self.scalar(1.0), self.scalar(0.0)
        copy_a, copy_b = p.transposes
        lda, ldb = p.lda, p.ldb
        if copy_a:
            # A' = Aᵀ           (k × m) = (m × k)ᵀ
            copied_a = scratch
            cublas.sgeam(handle, OP_T, OP_N, p.k, p.m, one, a, lda, zero, copied_a, p.k, copied_a, p.k)
            a, lda = copied_a, p.k
        if copy_b:
            # B' = Bᵀ           (k × n) = (n × k)ᵀ
            copied_b = scratch + FLOAT32_BYTES * _aligned(p.k * p.m) * copy_a
            cublas.sgeam(handle, OP_T, OP_N, p.k, p.n, one, b, ldb, zero, copied_b, p.k, copied_b, p.k)
            b, ldb = copied_b, p.k
        # C = alpha·A'ᵀ·B' + beta·C   (m × n) = (k × m)ᵀ · (k × n)
        cublas.sgemm(handle, OP_T, OP_N, p.m, p.n, p.k, alpha, a, lda, b, ldb, beta, c, p.ldc)

    def _grow_scratch(self, values: int) -> None:
        """The transposed operands' scratch, grown (never shrunk) to ``values`` floats."""
        if self._scratch is not None and self._scratch.nbytes >= FLOAT32_BYTES * values:
            return
        if self._scratch is not None:
            self._outgrown.append(self._scratch)
        self._scratch = DeviceBuffer.allocate(FLOAT32_BYTES * values)

    # ---- planning ----------------------------------------------------------------------------
    def _plan(self, problem: GemmProblem, search: str, alpha, a: int, b: int, beta, c: int,
              beta_is_zero: bool, bias: int = 0) -> GemmPlan:
        """The stored plan of an exhaustive search where the disk cache holds one that still applies,
        else the fastest candidate, stored; untimed for the heuristic search, degenerate sizes and a
        capture: cublasSgemm, or for an epilogue cuBLASLt's first algorithm."""
        if search != "exhaustive" or min(problem.m, problem.n, problem.k) <= 0 or self.context.is_capturing():
            return self._first_epilogue_algorithm(problem, bias) if problem.epilogue else GemmPlan(problem)
        plan = self._stored_plan(problem, read_gemm_plan(GemmKey.of(self.context, problem, search)))
        return plan if plan is not None else self._search_and_store(problem, alpha, a, b, beta, c, beta_is_zero, bias)

    def _search_and_store(self, problem: GemmProblem, alpha, a: int, b: int, beta, c: int,
                          beta_is_zero: bool, bias: int = 0) -> GemmPlan:
        plan = self._search(problem, alpha, a, b, beta, c if beta_is_zero else None, bias)
        if plan.microseconds is not None:
            write_gemm_plan(GemmKey.of(self.context, problem, "exhaustive"), GemmChoice.of(plan))
        return plan

    def _prove(self, plan: GemmPlan, alpha, a: int, b: int, beta, c: int, beta_is_zero: bool,
               bias: int = 0) -> GemmPlan:
        """Run a stored cuBLASLt plan for the first time, on the call's operands; where cuBLASLt refuses
        the algorithm (a status error: it checks before it launches), search again, store and run that
        (nothing runs where an epilogue is left without an algorithm)."""
        try:
            self._execute(plan, alpha, a, b, beta, c, bias)
        except CublasError as error:
            log.debug("the cached GEMM plan for %s fails here (%s): searching again", plan.problem, error)
            plan.close()
            plan = self._search_and_store(plan.problem, alpha, a, b, beta, c, beta_is_zero, bias)
            if _runnable(plan):
                self._execute(plan, alpha, a, b, beta, c, bias)
            return plan
        plan.unproven = False
        return plan

    def _search(self, problem: GemmProblem, alpha, a: int, b: int, beta, c: int | None, bias: int = 0) -> GemmPlan:
        """The fastest candidate (``_fastest``); cublasSgemm untimed where cuBLASLt offers no algorithm
        (for an epilogue, a plan without one)."""
        lt = self._lt_matmul(problem, bias)
        algorithms = lt.algorithms(self.context.cublas_lt.handle, self.context.cublas_workspace[1], problem)
        if not algorithms:
            lt.close()
            return GemmPlan(problem)
        if self._timer is None:
            self._timer = GemmTimer(self.context)
        return self._fastest(problem, lt, algorithms, alpha, a, b, beta, c, bias)

    def _lt_matmul(self, problem: GemmProblem, bias: int) -> LtMatmul:
        """The problem's cuBLASLt descriptors, an epilogue's bias set (the heuristic reads its alignment)."""
        lt = LtMatmul(problem)
        if problem.epilogue:
            lt.set_bias(bias)
        return lt

    def _first_epilogue_algorithm(self, problem: GemmProblem, bias: int) -> GemmPlan:
        """The heuristic's first algorithm for an epilogue, untimed; a plan without one where it offers none."""
        lt = self._lt_matmul(problem, bias)
        algorithms = lt.algorithms(self.context.cublas_lt.handle, self.context.cublas_workspace[1], problem)
        if not algorithms:
            lt.close()
            return GemmPlan(problem)
        return GemmPlan(problem, lt, cublaslt.MatmulAlgo.from_buffer_copy(algorithms[0].algo))

    def _stored_plan(self, problem: GemmProblem, choice: GemmChoice | None) -> GemmPlan | None:
        """The plan of a choice read from the disk cache, or None where there is none or it no longer applies."""
        if choice is None:
            return None
        if problem.epilogue and choice.candidate != "lt":
            return None
        if choice.candidate == "sgemm":
            plan = GemmPlan(problem)
        elif choice.candidate == "transposed":
            plan = self._stored_transposed(problem)
        else:
            plan = self._stored_lt(problem, cublaslt.MatmulAlgo.from_buffer_copy(choice.algo))
        if plan is None:
            log.debug("the cached GEMM plan for %s (%s) is no longer valid here: searching again", problem,
                      choice.candidate)
            return None
        plan.microseconds = choice.microseconds
        log.debug("GEMM plan from the disk cache: %r", plan)
        return plan

    def _stored_transposed(self, problem: GemmProblem) -> GemmPlan | None:
        """The transposing plan, its scratch grown, where the candidate applies to ``problem``."""
        if not _transposable(problem):
            return None
        try:
            self._grow_scratch(problem.transposed_values)
        except OutOfMemoryError:
            log.debug("no room for the transposing plan's %d bytes of scratch", FLOAT32_BYTES * problem.transposed_values)
            return None
        return GemmPlan(problem, transposed=True)

    def _stored_lt(self, problem: GemmProblem, algorithm: cublaslt.MatmulAlgo) -> GemmPlan:
        """The cuBLASLt plan of ``algorithm``, to be proven by its first run (``_prove``)."""
        return GemmPlan(problem, LtMatmul(problem), algorithm, unproven=True)

    def _fastest(self, problem: GemmProblem, lt: LtMatmul, algorithms: list, alpha, a, b, beta, c,
                 bias: int = 0) -> GemmPlan:
        """Time cublasSgemm and each algorithm on the call's operands and keep the fastest (for an
        epilogue, the fastest algorithm: cublasSgemm has none). ``c`` None (beta non-zero: timing runs
        must not accumulate into C) times into a scratch C."""
        scratch = None if c is not None else DeviceBuffer.allocate(FLOAT32_BYTES * problem.c_values)
        target = c if scratch is None else scratch.ptr
        try:
            best, best_us = GemmPlan(problem), math.inf
            if not problem.epilogue:
                best_us = self._timer.microseconds(lambda: self._execute(best, alpha, a, b, beta, target))
            sgemm_us = best_us
            for algorithm in algorithms:
                plan = GemmPlan(problem, lt, cublaslt.MatmulAlgo.from_buffer_copy(algorithm.algo))
                us = self._timer.microseconds(lambda: self._execute(plan, alpha, a, b, beta, target, bias))
                if us is not None and us < MARGIN * sgemm_us and us < best_us:
                    best, best_us = plan, us
            us = self._time_transposed(problem, alpha, a, b, beta, target)
            if us is not None and us < MARGIN * sgemm_us and us < best_us:
                best, best_us = GemmPlan(problem, transposed=True), us
                self._grow_scratch(problem.transposed_values)
        finally:
            if scratch is not None:
                scratch.free()
        if best.lt is None:
            lt.close()
        best.microseconds = best_us if math.isfinite(best_us) else None  # None: an epilogue none of whose algorithms ran
        log.debug("%r (cublasSgemm %.2f us, %d cuBLASLt algorithms timed)", best, sgemm_us, len(algorithms))
        return best

    def _time_transposed(self, problem: GemmProblem, alpha, a: int, b: int, beta, c: int) -> float | None:
        """The transposing candidate's time, in a scratch of its own; None where it does not apply
        (a batch, an operand pair already TN, or more scratch than TRANSPOSE_LIMIT_BYTES)."""
        if not _transposable(problem):
            return None
        values = problem.transposed_values
        try:
            scratch = DeviceBuffer.allocate(FLOAT32_BYTES * values)
        except OutOfMemoryError:
            log.debug("no room for the transposing candidate's %d bytes of scratch", FLOAT32_BYTES * values)
            return None
        try:
            return self._timer.microseconds(lambda: self._transposed(problem, alpha, a, b, beta, c, scratch.ptr))
        finally:
            scratch.free()


def _runnable(plan: GemmPlan) -> bool:
    """Whether ``plan`` runs its problem: every plan does, but one of an epilogue left without an algorithm."""
    return not plan.problem.epilogue or plan.algorithm is not None


def _transposable(problem: GemmProblem) -> bool:
    """Whether the transposing candidate applies: one float32 matrix, an operand to copy, at most
    TRANSPOSE_LIMIT_BYTES of scratch."""
    values = problem.transposed_values
    return (problem.batch == 1 and not problem.precision.half and values > 0
            and FLOAT32_BYTES * values <= TRANSPOSE_LIMIT_BYTES)


class GemmTimer:
    """GPU microseconds per call of a GEMM candidate: the calls are queued behind ``spin`` so that
    they run back to back, between two CUDA events."""

    SPIN_NS_PER_CALL = 15_000  # more than the host needs to queue one call
    SPIN_NS_BASE = 30_000
    TARGET_US = 100.0  # calls per measurement: enough for about this much GPU time (at most MAX_CALLS)
    MAX_CALLS = 16

    def __init__(self, context):
        self.context = context
        self.spin = context.kernel("spin")
        self.start, self.end = Event(), Event()

    def microseconds(self, call) -> float | None:
        """The faster of two measurements after a warm-up one; None when the candidate fails
        (cuBLASLt may refuse an algorithm at run time, e.g. CUBLAS_STATUS_NOT_SUPPORTED)."""
        try:
            first = self._measure(call, 1)
        except CublasError as error:
            log.debug("a GEMM candidate failed while timed: %s", error)
            return None
        calls = max(1, min(self.MAX_CALLS, int(self.TARGET_US / max(first, 1e-3))))
        return min(self._measure(call, calls) for _ in range(2))

    def _measure(self, call, calls: int) -> float:
        stream = self.context.stream
        self.spin.launch(1, stream.handle, self.SPIN_NS_BASE + self.SPIN_NS_PER_CALL * calls)
        self.start.record(stream)
        for _ in range(calls):
            call()
        self.end.record(stream)
        self.end.synchronize()
        return 1000.0 * self.start.elapsed_ms(self.end) / calls


# ---- plans on disk ---------------------------------------------------------------------------
# One JSON file per plan in cache.plan_dir(), beside the convolution plans (plan_cache.py):
#   key:  the GPU's name and compute capability, the cuBLAS and cuBLASLt versions, the GemmProblem,
#         the search, the cuBLAS workspace, the rules of the choice and GEMM_PLAN_FORMAT
#   file: the candidate that won ("sgemm", "lt" with cuBLASLt's ALGO_BYTES algorithm bytes in hex,
#         or "transposed") and its microseconds per call


@dataclass(frozen=True)
class GemmKey:
    """Everything that decides which candidate a GEMM plan takes."""

    device_name: str
    compute_capability: tuple[int, int]
    cublas_version: int
    cublaslt_version: int
    problem: GemmProblem
    search: str
    workspace_bytes: int  # the cuBLAS workspace, which cuBLASLt's algorithms share

    @classmethod
    def of(cls, context, problem: GemmProblem, search: str) -> GemmKey:
        """The key of ``problem``, planned by ``search`` on ``context``'s GPU and libraries."""
        return cls(context.device_name, context.compute_capability, context.cublas_version, context.cublaslt_version,
                   problem, search, context.cublas_workspace[1])

    def as_json(self) -> dict:
        """The key as JSON values (lists for tuples), with the format and the rules of the choice."""
        return {
            "format": GEMM_PLAN_FORMAT,
            "plan": "gemm",
            "device_name": self.device_name,
            "compute_capability": list(self.compute_capability),
            "cublas_version": self.cublas_version,
            "cublaslt_version": self.cublaslt_version,
            "problem": problem_json(self.problem),
            "search": self.search,
            "workspace_bytes": self.workspace_bytes,
            "candidates": CANDIDATES,
            "margin": MARGIN,
            "transpose_limit_bytes": TRANSPOSE_LIMIT_BYTES,
        }


@dataclass(frozen=True)
class GemmChoice:
    """The candidate a GEMM plan took and its GPU time per call: "sgemm" (cublasSgemm or its strided
    batch), "lt" (cublasLtMatmul with ``algo``, the algorithm's ALGO_BYTES opaque bytes) or
    "transposed" (cublasSgeam to the TN layout, then cublasSgemm)."""

    candidate: str
    microseconds: float
    algo: bytes | None = None

    @classmethod
    def of(cls, plan: GemmPlan) -> GemmChoice:
        """What ``plan`` (a timed one) runs, and its time."""
        if plan.transposed:
            return cls("transposed", plan.microseconds)
        if plan.algorithm is None:
            return cls("sgemm", plan.microseconds)
        return cls("lt", plan.microseconds, bytes(plan.algorithm))

    def as_json(self) -> dict:
        stored = {"candidate": self.candidate, "microseconds": self.microseconds}
        return stored if self.algo is None else {**stored, "algo": self.algo.hex()}


def gemm_plan_path(key: GemmKey) -> Path | None:
    """The cache file of ``key``, or None when the disk cache is turned off."""
    return cache.keyed_path(cache.plan_dir, key.as_json())


def read_gemm_plan(key: GemmKey) -> GemmChoice | None:
    """The choice stored for ``key``, or None (no entry, cache off, damaged entry)."""
    return cache.read_keyed(cache.plan_dir, key.as_json(), _gemm_choice, "plan", log)


def write_gemm_plan(key: GemmKey, choice: GemmChoice) -> None:
    """Store ``choice`` for ``key``, atomically; a failure is only logged."""
    cache.write_keyed(cache.plan_dir, key.as_json(), {"choice": choice.as_json()}, "GEMM plan", log)


def _gemm_choice(entry: dict) -> GemmChoice | None:
    """The entry's choice when it holds the fields of a known candidate, a finite time that is not
    negative and, for "lt", ALGO_BYTES bytes of hex."""
    stored = entry.get("choice")
    if not isinstance(stored, dict) or not isinstance(stored.get("candidate"), str):
        return None
    candidate, microseconds = stored["candidate"], stored.get("microseconds")
    if set(stored) != GEMM_FIELDS.get(candidate) or not _is_microseconds(microseconds):
        return None
    algo = _algo_bytes(stored["algo"]) if candidate == "lt" else None
    if candidate == "lt" and algo is None:
        return None
    return GemmChoice(candidate, float(microseconds), algo)


def _is_microseconds(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and value >= 0


def _algo_bytes(text) -> bytes | None:
    """cuBLASLt's algorithm from its hex, or None when ``text`` is not ALGO_BYTES bytes of hex."""
    if not isinstance(text, str):
        return None
    try:
        algo = bytes.fromhex(text)
    except ValueError:
        return None
    return algo if len(algo) == ALGO_BYTES else None
