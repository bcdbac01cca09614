"""What cudnnnet-benchmark runs and judges: the workloads, their sizes, each device's defaults and
the targets."""

from __future__ import annotations

from ..errors import CudnnnetError
from ..precision import HALF_PRECISIONS, PRECISION_NAMES, PRECISIONS

WORKLOADS = ("mlp", "cnn", "bn_cnn", "cifar10", "micro", "original")
DEFAULT_WORKLOADS = ("mlp", "cnn", "micro", "original")  # bn_cnn and cifar10 when asked for (--only)
TRAINING_CONFIGS = {"mlp": "mnist_mlp.yaml", "cnn": "mnist_cnn.yaml", "bn_cnn": "mnist_bn_cnn.yaml",
                    "cifar10": "cifar10_cnn.yaml"}
ORIGINAL_CONFIGS = {"mlp": "original_mlp.yaml", "cnn": "original_cnn.yaml"}
BATCH_SIZE = 256  # the MNIST workloads' batch; cifar10 trains at its config's (CONFIG_BATCH)
CONFIG_BATCH = ("cifar10",)  # workloads trained at their config's batch size
GRAPH_ONLY = ("cifar10",)  # timed as captured graphs only where the backend has them (eager on the host)
GENERATED_DATA = {"cifar10": (50_000, 1_000)}  # (training, test) images generated for a workload: no download
GENERATED_SEED = 0
MICRO_SIZE = 10_000  # the series' 10 000 × 10 000 input
HOST_MICRO_SIZE = 1_000
MICRO_LEARNING_RATE = 0.05
MICRO_WARMUP = 2
# On a GPU every micro row (ours and PyTorch's, eager and graph) is timed after this long of untimed steps:
# its clock is then in the steady state of that row's load, whatever ran before it.
MICRO_WARMUP_SECONDS = 1.0
# --gpus N's micro step: untimed steps by count, not by seconds, so every rank makes the same number of
# calls (each holds collectives; a rank that made one more would wait on its peers for ever)
SCALING_MICRO_WARMUP = 25
# Each micro graph row (ours and PyTorch's) is also reported at steady state: replayed untimed for this long
# right after its timed steps, then STEADY_REPLAYS timed replays, of which the median of the last half.
STEADY_SECONDS = 3.0
STEADY_REPLAYS = 60
MICRO_SEED = 0
MATHS = tuple(name for name, precision in PRECISIONS.items() if not precision.loss_scaling)  # the micro-benchmark's
WORKLOAD_MATHS = PRECISION_NAMES  # --math: the mlp, cnn, bn_cnn and cifar10 workloads (fp16 with loss scaling)
HALF_MATHS = HALF_PRECISIONS  # 16-bit operands: PyTorch under autocast to that type
MIB = 1 << 20
DEFAULTS = {  # device: (timed epochs, micro repeats)
    "cuda": (10, 20),
    "host": (1, 3),
}

# Targets on an NVIDIA H100, judged beside the measurements (ms for epochs and steps, s for processes).
TARGETS = {
    "mlp_epoch_ms": 15.0,
    "cnn_epoch_ms": 90.0,
    "micro_fp32_ms": 46.0,
    "micro_tf32_ms": 9.1,
    "micro_bf16_ms": 4.0,
    "original_mlp_s": 1.0,
    "original_cnn_s": 2.0,
}
# Math modes whose micro step must also be no slower than PyTorch's in the same mode (fast engine).
MICRO_FASTER_THAN_TORCH = ("bf16",)
# The slides engine's graph epochs: PyTorch's captured graph on an H100 (used where --compare torch was not run).
SLIDES_TARGETS = {
    "mlp_epoch_ms": 31.5,
    "cnn_epoch_ms": 133.0,
}
# --gpus N: the workloads timed on N GPUs beside one, and the scaling (one GPU's epoch over N GPUs') each
# must reach in both engines, by N.
SCALABLE = ("mlp", "cnn", "bn_cnn", "cifar10", "micro")  # micro: per step, its one batch split among the GPUs
SCALING_TARGETS = {"cnn": {2: 1.9, 4: 3.6, 8: 7.0}, "cifar10": {2: 1.9}, "micro": {2: 1.9}}
# Workloads whose graph epoch, in each engine, is judged against PyTorch's captured graph epoch of
# the same run divided by this speed-up (no target where PyTorch was not run).
TORCH_SPEED_UPS = {"cifar10": 1.3}
TARGET_DEVICE = "H100"
HOST_DURATION = ("all workloads take about 13 minutes on a 2-core CPU, 10 of them in the original workload's "
                 "six training processes (--only mlp,cnn,micro skips those)")


class BenchmarkError(CudnnnetError):
    """A workload could not be measured (a subprocess failed, a layer has no PyTorch equivalent)."""
