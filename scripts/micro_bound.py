#!/usr/bin/env python3
"""How far the bf16 micro step is above its own GEMMs, on one GPU.

The benchmark's micro step (10 000 × 10 000 → 5 000 → 1 000 → 10, tanh and sigmoids, MSE, SGD) in the
fast engine under ``math: bf16``, and beside it, each as a captured CUDA graph:

    our step         the whole step, as ``cudnnnet-benchmark --only micro --math bf16`` times it
    our GEMMs        only the step's GEMM calls, recorded from one eager step and replayed with the
                     same plans and operands (fc1's weight gradient applying SGD to the float32 W)
    PyTorch's step   PyTorch's pure bfloat16 step (``--compare torch``'s "torch bf16 graph" column)
    PyTorch's GEMMs  the same eight products as ``torch.mm`` on bfloat16 tensors

Each graph is replayed in turn for ``--seconds`` after one second of warm-up, ``--rounds`` times; a
figure is the median of the last half of a run's replays. Needs a CUDA GPU; the PyTorch rows need
PyTorch (left out, with a note, without it).
"""

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

if importlib.util.find_spec("cudnnnet") is None:  # not installed: run the package of this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cudnnnet.backends import get_backend  # noqa: E402
from cudnnnet.benchmark.settings import MICRO_SIZE  # noqa: E402
from cudnnnet.benchmark.workloads import build_micro_network, micro_data, micro_input, micro_step  # noqa: E402
from cudnnnet.errors import DeviceUnavailableError  # noqa: E402
from cudnnnet.tensor import Tensor  # noqa: E402


def our_graphs(backend, size: int) -> dict:
    """({name: replay} for our whole fast bf16 step and for its GEMM calls alone, what the graphs read)."""
    inputs, targets = micro_data(size)
    x = Tensor.from_numpy(inputs.reshape(size, size, 1, 1), backend)
    target = Tensor.from_numpy(targets, backend)
    network = build_micro_network(size, backend).set_engine("fast").set_math("bf16")
    step = micro_step(network, micro_input(network, x), target)
    for _ in range(3):  # plans timed, buffers and bfloat16 copies made: nothing left that a capture cannot do
        step()
    gemm_calls = recorded_gemm_calls(backend, step)
    backend.synchronize()
    with backend.capture() as whole:
        step()
    with backend.capture() as gemms:
        for call in gemm_calls:
            backend._gemm.run(*call)
    owners = (network, x, target)  # the graphs read their buffers
    return {"our step": whole.launch, "our GEMMs": gemms.launch}, owners


def recorded_gemm_calls(backend, step) -> list:
    """The arguments of every GEMM the step runs (GemmEngine.run: problem, search, alpha, A, B, beta, C)."""
    engine, calls = backend._gemm, []
    run = engine.run

    def recording(*arguments):
        calls.append(arguments)
        run(*arguments)

    engine.run = recording
    try:
        step()
    finally:
        del engine.run
    return calls


def torch_graphs(size: int) -> dict:
    """({name: replay} for PyTorch's pure-bf16 step and its eight products alone, what the graphs read,
    PyTorch's synchronize); ({}, (), a no-op) without PyTorch."""
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: its rows are left out")
        return {}, (), lambda: None
    from cudnnnet.benchmark import torch_reference

    _, step = torch_reference.pure_bf16_micro_step(torch, size, "cuda")
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    x = torch.rand(size, size, **bf16)
    w1, w2, w3 = (torch.rand(rows, cols, **bf16) * 0.01 for rows, cols in ((size // 2, size), (size // 10, size // 2),
                                                                          (10, size // 10)))
    grad_output = torch.rand(size, 10, **bf16) * 0.01

    def products():
        h1 = x @ w1.t()                  # forward: (N, 5000), (N, 1000), (N, 10)
        h2 = h1 @ w2.t()
        h2 @ w3.t()
        grad_output.t() @ h2             # fc3: dW, dx
        grad_h2 = grad_output @ w3
        grad_h2.t() @ h1                 # fc2: dW, dx
        grad_h1 = grad_h2 @ w2
        grad_h1.t() @ x                  # fc1: dW (no dx: x needs no gradient)

    graphs = {"PyTorch's step": torch_reference.torch_capture(torch, step),
              "PyTorch's GEMMs": torch_reference.torch_capture(torch, products)}
    owners = (step, x, w1, w2, w3, grad_output)
    return {name: graph.replay for name, graph in graphs.items()}, owners, torch.cuda.synchronize


def timed(replay, synchronize, seconds: float) -> float:
    """Median ms of the last half of ``seconds`` of replays, after one second of them untimed."""
    for duration, keep in ((1.0, False), (seconds, True)):
        times, start = [], time.perf_counter()
        while time.perf_counter() - start < duration:
            began = time.perf_counter()
            replay()
            synchronize()
            times.append(time.perf_counter() - began)
    return 1000.0 * statistics.median(times[len(times) // 2:])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=MICRO_SIZE, help="samples and features (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds a graph a round (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every graph in turn (default %(default)s)")
    args = parser.parse_args(argv)
    if args.size < 20 or args.size % 10 or args.seconds <= 0 or args.rounds < 1:
        parser.error("--size must be a multiple of 10 from 20, --seconds positive and --rounds at least 1")
    try:
        backend = get_backend("cuda")
    except DeviceUnavailableError as error:
        parser.exit(2, f"micro_bound: {error}\n")
    # the owners hold what the graphs read, until main returns
    theirs, their_owners, torch_synchronize = torch_graphs(args.size)
    ours, our_owners = our_graphs(backend, args.size)
    graphs = {**ours, **theirs}

    def synchronize():
        torch_synchronize()
        backend.synchronize()

    print(f"{backend.context.device_name}: micro bf16 step, {args.size} wide, ms a replay (median of the last half)")
    for round_ in range(args.rounds):
        figures = (f"{name} {timed(replay, synchronize, args.seconds):.3f}" for name, replay in graphs.items())
        print(f"round {round_ + 1}: " + "; ".join(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
