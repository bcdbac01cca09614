"""scripts/benchmark.py on the host with tiny settings: what it reports, never how fast."""

import json
import py_compile
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from cudnnnet.benchmark import original as bench_original
from cudnnnet.benchmark import report as bench_report
from cudnnnet.benchmark import settings as bench_settings
from cudnnnet.benchmark import torch_reference as bench_torch
from cudnnnet.benchmark import workloads as bench_workloads
from cudnnnet.cli import benchmark
from cudnnnet.cli.train import check_model
from cudnnnet.config.schema import load_config
from cudnnnet.network import Network
from cudnnnet.train.trainer import Trainer, build_network, input_shape
from run_helpers import REPO_ROOT, run_script

TOP_KEYS = {"device", "backend", "date", "versions", "settings", "targets", "results", "torch", "table",
            "uncompiled_packages"}
ROW_KEYS = {"workload", "unit", "slides", "fast", "torch_eager", "torch_graph", "torch_bf16_graph", "ratio_slides",
            "ratio_fast", "ratio_bf16_slides", "ratio_bf16_fast", "target_slides", "target_fast", "status_slides",
            "status_fast"}


def run_benchmark(tmp_path, capsys, *arguments) -> tuple[dict, str, str]:
    """(the JSON report, stdout, stderr) of the benchmark on the host."""
    path = tmp_path / "benchmark.json"
    assert benchmark.main(["--device", "host", "--json", str(path), *map(str, arguments)]) == 0
    captured = capsys.readouterr()
    return json.loads(path.read_text()), captured.out, captured.err


def positive_numbers(values) -> bool:
    return len(values) > 0 and all(isinstance(value, float) and value > 0 for value in values)


# ---- micro -------------------------------------------------------------------------------------


def test_micro_on_the_host_reports_each_step(tmp_path, capsys):
    report, out, _ = run_benchmark(tmp_path, capsys, "--only", "micro", "--micro-size", 64, "--repeat", 3)
    assert set(report) == TOP_KEYS
    assert report["backend"] == "host" and report["torch"] is None
    assert report["versions"]["cudnnnet"] and report["date"]
    assert set(report["results"]) == {"slides", "fast"}  # one column per engine
    row, bf16_row = report["table"]  # FP32 and bf16: the host has no TF32 mode
    assert set(row) == set(bf16_row) == ROW_KEYS
    for engine in ("slides", "fast"):
        micro = report["results"][engine]["micro"]
        assert set(report["results"][engine]) == {"micro"}
        assert micro["size"] == 64 and micro["layers"] == [64, 32, 6, 10] and micro["repeat"] == 3
        for math in ("fp32", "bf16"):
            eager = micro[math]["eager"]
            assert micro[math]["graph"] is None and micro[math]["graph_steady"] is None  # no CUDA graphs here
            assert set(eager) == {"step_ms", "step_ms_all"} and len(eager["step_ms_all"]) == 3
            assert positive_numbers(eager["step_ms_all"]) and eager["step_ms"] > 0
        assert micro["tf32"] is None
        assert row[engine] == micro["fp32"]["eager"]["step_ms"]
        assert bf16_row[engine] == micro["bf16"]["eager"]["step_ms"]
    assert row["target_fast"] == bench_settings.TARGETS["micro_fp32_ms"] and row["target_slides"] is None
    assert bf16_row["target_fast"] == bench_settings.TARGETS["micro_bf16_ms"]  # eager: the only mode here
    assert row["status_fast"] == "n/a"  # a shrunk micro on the host is not the target's workload
    lines = out.strip().splitlines()
    assert lines[0].startswith("device: host") and lines[-2].startswith("micro fp32 step (64), eager")
    assert lines[-1].startswith("micro bf16 step (64), eager")


@pytest.mark.parametrize("math, dtype", [("fp32", "float32"), ("tf32", "float32"), ("bf16", "bfloat16"),
                                         ("fp16", "float16")])
def test_micro_hands_its_network_x_in_the_dtype_of_its_activations(host, math, dtype):
    """Under bf16 and fp16 the micro MLP stores 16-bit activations and is handed a 16-bit x, read as it is
    (PyTorch's pure-bfloat16 column is handed bfloat16 too)."""
    from cudnnnet import Tensor

    network = bench_workloads.build_micro_network(16, host).set_math(math)
    inputs, targets = bench_workloads.micro_data(16)
    x = bench_workloads.micro_input(network, Tensor.from_numpy(inputs.reshape(16, 16, 1, 1), host))
    bench_workloads.micro_step(network, x, Tensor.from_numpy(targets, host))()
    assert x.dtype.name == dtype and network.layers[0].input is x
    assert {layer.output.dtype.name for layer in network.layers[:-1]} == {dtype}


def micro_peak_mib(cuda, math: str, size: int) -> float:
    """The device memory a micro network of ``size`` takes over two slides steps in ``math`` (x made in
    the dtype of its activations), above what was in use before it was built."""
    import gc

    from cudnnnet import Tensor
    from cudnnnet.benchmark.measuring import DeviceMemory
    from cudnnnet.precision import get_precision

    gc.collect()
    memory = DeviceMemory(cuda)
    network = bench_workloads.build_micro_network(size, cuda).set_math(math)
    inputs, targets = bench_workloads.micro_data(size)
    x = Tensor.from_numpy(inputs.reshape(size, size, 1, 1), cuda, dtype=get_precision(math).activation_dtype)
    step = bench_workloads.micro_step(network, x, Tensor.from_numpy(targets, cuda))
    for _ in range(2):
        step()
        memory.sample()
    del network, x, step
    gc.collect()
    return memory.peak_mib


@pytest.mark.gpu
def test_the_micro_networks_peak_device_memory_in_bf16_is_below_fp32s(cuda):
    """Activations, their gradients and x in bfloat16 take half the bytes: more than the weights'
    bfloat16 copies add (8000 → 4000 → 800 → 10: about 540 MiB of float32 activations, gradients and x
    against 70 MiB of copies)."""
    for math in ("fp32", "bf16"):  # handles, kernels and workspaces made before anything is measured
        micro_peak_mib(cuda, math, 64)
    fp32 = micro_peak_mib(cuda, "fp32", 8000)
    bf16 = micro_peak_mib(cuda, "bf16", 8000)
    assert bf16 < 0.85 * fp32, f"bf16 {bf16:.0f} MiB, fp32 {fp32:.0f} MiB"


def fake_micro_section(graph_ms: float, eager_ms: float, steady_ms: float | None = None) -> dict:
    def mode(ms):
        return None if ms is None else {"step_ms": ms, "step_ms_all": [ms]}

    return {"micro": {"size": bench_settings.MICRO_SIZE, "layers": [10_000, 5_000, 1_000, 10], "repeat": 1,
                      **{math: {"graph": mode(graph_ms), "graph_steady": mode(steady_ms), "eager": mode(eager_ms)}
                         for math in bench_settings.MATHS}}}


def test_micro_is_judged_on_its_graph_row_and_in_bf16_against_pytorch_too():
    settings = {"device": "cuda", "limit_images": None, "micro_size": bench_settings.MICRO_SIZE}
    results = {"fast": fake_micro_section(3.9, 4.2), "slides": fake_micro_section(5.0, 5.5)}
    torch_micro = {math: {"graph": {"step_ms": 3.8}, "eager": {"step_ms": 4.5}} for math in bench_settings.MATHS}
    rows = {row["workload"]: row for row in bench_report.table_rows(results, {"micro": torch_micro}, settings)}
    assert list(rows) == [f"micro {math} step (10000), {mode}" for math in bench_settings.MATHS
                          for mode in ("graph", "eager")]
    graph, eager = rows["micro bf16 step (10000), graph"], rows["micro bf16 step (10000), eager"]
    assert (graph["fast"], graph["slides"], eager["fast"]) == (3.9, 5.0, 4.2)
    assert graph["torch_graph"] == 3.8 and graph["torch_eager"] is None and eager["torch_eager"] == 4.5
    assert graph["ratio_fast"] == pytest.approx(3.8 / 3.9) and eager["ratio_fast"] == pytest.approx(4.5 / 4.2)
    # bf16: under 4 ms but slower than PyTorch's 3.8 ms graph step misses; the eager row has no target
    assert graph["target_fast"] == 3.8 and graph["status_fast"] == "MISS" and graph["target_slides"] is None
    assert eager["target_fast"] is None and eager["status_fast"] is None
    fp32 = rows["micro fp32 step (10000), graph"]
    assert fp32["target_fast"] == bench_settings.TARGETS["micro_fp32_ms"] and fp32["status_fast"] == "PASS"
    alone = {row["workload"]: row for row in bench_report.table_rows(results, None, settings)}
    assert alone["micro bf16 step (10000), graph"]["target_fast"] == bench_settings.TARGETS["micro_bf16_ms"]
    assert alone["micro bf16 step (10000), graph"]["status_fast"] == "PASS"


def test_micro_steady_state_is_a_row_beside_the_graph_row_and_judges_nothing():
    settings = {"device": "cuda", "limit_images": None, "micro_size": bench_settings.MICRO_SIZE}
    results = {"fast": fake_micro_section(3.9, 4.2, 4.1), "slides": fake_micro_section(5.0, 5.5, 5.2)}
    torch_micro = {math: {"graph": {"step_ms": 3.8}, "graph_steady": {"step_ms": 4.4}, "eager": {"step_ms": 4.5}}
                   for math in bench_settings.MATHS}
    rows = bench_report.table_rows(results, {"micro": torch_micro}, settings)
    assert [row["workload"] for row in rows] == [f"micro {math} step (10000), {mode}" for math in bench_settings.MATHS
                                                 for mode in ("graph", "graph, steady state", "eager")]
    steady = {row["workload"]: row for row in rows}["micro bf16 step (10000), graph, steady state"]
    assert (steady["fast"], steady["slides"], steady["torch_graph"], steady["torch_eager"]) == (4.1, 5.2, 4.4, None)
    assert steady["ratio_fast"] == pytest.approx(4.4 / 4.1) and steady["ratio_slides"] == pytest.approx(4.4 / 5.2)
    assert steady["target_fast"] is None and steady["status_fast"] is None  # the graph row holds the target
    report = {"device": "NVIDIA H100", "backend": "cuda", "versions": {}, "table": rows,
              "settings": {"workloads": ["micro"], "steady_seconds": 2.5, "steady_replays": 41}}
    text = bench_report.format_table(rows, bench_report.table_header(report))
    assert ("graph, steady state: right after the graph row's steps, the graph replayed untimed for 2.5 s, then 41 "
            "timed replays; the median of the last 20") in text
    assert "micro bf16 step (10000), graph, steady state" in text
    no_steady = bench_report.table_rows({"fast": fake_micro_section(3.9, 4.2)}, None, settings)
    assert not any("steady" in row["workload"] for row in no_steady)
    assert "steady" not in bench_report.table_header({**report, "table": no_steady})


def test_steady_state_warms_up_for_the_seconds_asked_then_takes_the_median_of_the_last_half():
    from cudnnnet.benchmark.measuring import steady_state

    durations = iter([0.002] * 1000)
    calls, synchronised = [], []
    found = steady_state(lambda: (calls.append(1), time.sleep(next(durations))), lambda: synchronised.append(1),
                         0.05, 9)
    assert found["warmup_seconds"] == 0.05 and found["median_of_last"] == 4
    assert found["warmup_replays"] >= 1 and len(calls) == found["warmup_replays"] + 9 == len(synchronised) - 1
    assert len(found["step_ms_all"]) == 9 and positive_numbers(found["step_ms_all"])
    slow_first = iter([0.03] * 5 + [0.001] * 4)
    steady = steady_state(lambda: time.sleep(next(slow_first)), lambda: None, 0.0, 9)
    # the median of all 9 is at least 30 ms (5 of them sleep that long); of the last 4, about 1 ms
    assert steady["warmup_replays"] == 0 and steady["step_ms"] < 30 <= min(steady["step_ms_all"][:5])
    assert steady_state(lambda: None, lambda: None, 0.0, 1)["median_of_last"] == 1


def test_steady_state_flags_set_the_settings_and_refuse_bad_values(capsys):
    parse = benchmark.build_parser().parse_args
    defaults = benchmark.resolve_settings(parse(["--device", "host"]))
    assert (defaults["steady_seconds"], defaults["steady_replays"]) == (bench_settings.STEADY_SECONDS,
                                                                        bench_settings.STEADY_REPLAYS)
    chosen = benchmark.resolve_settings(parse(["--device", "host", "--steady-seconds", "0.5", "--steady-replays", "8"]))
    assert (chosen["steady_seconds"], chosen["steady_replays"]) == (0.5, 8)
    assert benchmark.resolve_settings(parse(["--device", "host", "--steady-seconds", "0"]))["steady_seconds"] == 0.0
    for flag, value, problem in [("--steady-seconds", "-1", "expected a finite number of seconds >= 0, got '-1'"),
                                 ("--steady-seconds", "inf", "expected a finite number of seconds >= 0, got 'inf'"),
                                 ("--steady-seconds", "soon", "expected a number of seconds >= 0, got 'soon'"),
                                 ("--steady-replays", "0", "expected a positive integer, got 0")]:
        with pytest.raises(SystemExit) as exit:
            benchmark.main(["--device", "host", flag, value])
        assert exit.value.code == 2 and problem in capsys.readouterr().err


@pytest.mark.gpu
def test_torch_memory_is_pytorch_s_peak_above_its_start():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA GPU")
    memory = bench_torch.TorchMemory(torch, "cuda")
    kept = torch.empty(4 << 20, dtype=torch.uint8, device="cuda")  # 4 MiB
    memory.reset_peak()
    torch.empty(16 << 20, dtype=torch.uint8, device="cuda")  # 16 MiB, let go at once
    assert 20.0 <= memory.peak_mib() < 21.0 and kept.numel() == 4 << 20
    assert bench_torch.TorchMemory(torch, "cpu").peak_mib() is None


@pytest.mark.gpu
def test_micro_on_the_gpu_reports_the_graph_at_steady_state(cuda):
    section = bench_workloads.benchmark_micro(cuda, 64, 2, "fast", steady=(0.05, 6))
    for math in bench_workloads.micro_maths(cuda):
        steady = section[math]["graph_steady"]
        assert steady["median_of_last"] == 3 and len(steady["step_ms_all"]) == 6 and steady["warmup_replays"] >= 1
        assert positive_numbers(steady["step_ms_all"]) and steady["step_ms"] > 0


def test_micro_network_is_the_series_network_at_full_size():
    assert bench_workloads.micro_layer_sizes(10_000) == (10_000, 5_000, 1_000, 10)
    network = bench_workloads.build_micro_network(20, "host")
    kinds = [(type(layer).__name__, getattr(layer, "mode", None)) for layer in network.layers]
    assert kinds == [("Dense", None), ("Activation", "tanh"), ("Dense", None), ("Activation", "sigmoid"),
                     ("Dense", None), ("Activation", "sigmoid"), ("MSE", None)]
    assert network.output_shapes(network.input_shape)[-1] == (10, 1, 1)


def test_micro_size_defaults_smaller_on_the_host(caplog, monkeypatch):
    args = benchmark.build_parser().parse_args(["--device", "host", "--only", "micro"])
    with caplog.at_level("INFO", logger="cudnnnet.benchmark"):
        settings = benchmark.resolve_settings(args)
    assert settings["micro_size"] == bench_settings.HOST_MICRO_SIZE < bench_settings.MICRO_SIZE
    assert "instead of 10000 × 10000" in caplog.text
    monkeypatch.setattr(benchmark, "no_gpu_reason", lambda: None)  # the driver counts a GPU
    cuda = benchmark.resolve_settings(benchmark.build_parser().parse_args(["--device", "cuda", "--only", "micro"]))
    assert cuda["micro_size"] == bench_settings.MICRO_SIZE and cuda["repeat"] >= 10


@pytest.mark.parametrize(("reason", "device"), [(None, "cuda"), ("libcuda.so.1 cannot be loaded", "host")],
                         ids=["a GPU", "no GPU"])
def test_device_auto_is_the_default_and_asks_the_driver(caplog, monkeypatch, reason, device):
    monkeypatch.setattr(benchmark, "no_gpu_reason", lambda: reason)
    with caplog.at_level("INFO", logger="cudnnnet.benchmark"):
        settings = benchmark.resolve_settings(benchmark.build_parser().parse_args([]))
    assert settings["device"] == device
    assert f"running on {'cuda' if device == 'cuda' else 'the host, where ' + bench_settings.HOST_DURATION}" in caplog.text


def test_device_auto_without_a_gpu_says_so_without_the_driver_s_complaint(caplog, monkeypatch):
    """A machine meant to have no GPU is told where it runs, not asked whether its driver is installed."""
    reason = "libcuda.so.1 cannot be loaded (no such file); is the NVIDIA driver installed?"
    monkeypatch.setattr(benchmark, "no_gpu_reason", lambda: reason)
    with caplog.at_level("DEBUG", logger="cudnnnet.benchmark"):
        benchmark.resolve_settings(benchmark.build_parser().parse_args([]))
    info = [record.getMessage() for record in caplog.records if record.levelname == "INFO"]
    assert info[0] == f"--device auto: no GPU found; running on the host, where {bench_settings.HOST_DURATION}"
    assert not any("driver" in message for message in info)
    assert reason in caplog.text  # at DEBUG


def test_device_cuda_without_a_gpu_is_one_line_before_any_workload_runs(capsys, monkeypatch):
    monkeypatch.setattr(benchmark, "no_gpu_reason", lambda: "libcuda.so.1 cannot be loaded")
    monkeypatch.setattr(bench_original.subprocess, "run", lambda *_, **__: pytest.fail("a workload process started"))
    assert benchmark.main(["--device", "cuda", "--only", "original,micro"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip().splitlines()[-1] == (
        "cudnnnet-benchmark: error: --device cuda: no GPU (libcuda.so.1 cannot be loaded); use --device host "
        "(or auto) to run on the CPU")


def test_help_says_how_long_the_host_takes(capsys):
    with pytest.raises(SystemExit):
        benchmark.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "about 13 minutes on a 2-core CPU" in out and "default auto" in out


# ---- mlp and cnn -------------------------------------------------------------------------------


def test_mlp_and_cnn_epochs_on_a_subset(tmp_path, capsys, monkeypatch, mnist_dir):
    steps = []
    train_batch = Trainer.train_batch
    monkeypatch.setattr(Trainer, "train_batch", lambda self, index: steps.append(index) or train_batch(self, index))
    report, out, _ = run_benchmark(tmp_path, capsys, "--only", "mlp,cnn", "--limit-images", 300, "--epochs", 2,
                                   "--data-dir", mnist_dir, "--engines", "slides")
    assert set(report["results"]) == {"slides"} and set(report["results"]["slides"]) == {"mlp", "cnn"}
    for name in ("mlp", "cnn"):
        section = report["results"]["slides"][name]
        assert section["config"] == f"configs/mnist_{name}.yaml"
        assert section["images"] == 300 and section["batch_size"] == 256
        assert section["graph"] is None  # no CUDA graphs on the host
        eager = section["eager"]
        assert set(eager) == {"epoch_ms", "epoch_ms_all", "images_per_second", "peak_memory_mib"}
        assert len(eager["epoch_ms_all"]) == 2 and positive_numbers(eager["epoch_ms_all"])
        assert eager["images_per_second"] == pytest.approx(300 / (eager["epoch_ms"] / 1000))
        assert eager["peak_memory_mib"] is None  # cudaMemGetInfo-based: none on the host
    # each of the 3 epochs (a warm-up and 2 timed) trains both batches of 300 images, for each model
    assert steps == [0, 1] * 3 * 2
    workloads = [row["workload"] for row in report["table"]]
    assert workloads == ["mlp epoch, eager", "mlp throughput, eager", "cnn epoch, eager", "cnn throughput, eager"]
    assert "mlp epoch, eager" in out
    assert all(row["fast"] is None for row in report["table"])  # the engine not asked for: an empty column


def test_workload_config_is_batch_256_fp32_with_the_graph_setting():
    config = bench_workloads.workload_config("mlp", "host", None, 3, graph=False)
    assert config.train.batch_size == 256 and config.train.epochs == 3 and config.train.graph is False
    assert config.math == "fp32" and config.train.optimizer.momentum == 0.9
    assert bench_workloads.workload_config("cnn", "host", None, 1, graph=True).train.graph is True
    assert config.engine == "slides" and bench_workloads.workload_config("mlp", "host", None, 1, False, "fast").engine == "fast"


@pytest.mark.parametrize("name", ["cnn", "bn_cnn", "cifar10"])
def test_the_cnn_workloads_activations_in_bf16_take_2_bytes_a_value(host, name):
    """The benchmark's convolutional workloads store every activation and gradient in bfloat16 under
    bf16 (issue 29): half the bytes of their fp32 buffers, the peak memory rows' largest part."""
    import numpy as np

    from cudnnnet import Tensor

    nbytes = {}
    for math in ("fp32", "bf16"):
        config = bench_workloads.workload_config(name, "host", None, 1, graph=False, math=math)
        network = build_network(config, host).set_math(math)
        shape = input_shape(config)
        x = np.random.default_rng(0).standard_normal((4, *shape)).astype(np.float32)
        target = np.zeros((4, 10, 1, 1), np.float32)
        target[:, 0] = 1.0
        network.train_step(x, Tensor.from_numpy(target, host), 0.01)
        hidden = network.layers[:-1]
        assert {layer.output.dtype.name for layer in hidden} == {"float32" if math == "fp32" else "bfloat16"}
        nbytes[math] = sum(layer.output.nbytes + layer.grad_input.nbytes for layer in hidden)
    assert nbytes["bf16"] * 2 == nbytes["fp32"]


def test_math_fp16_trains_the_workloads_in_fp16_with_loss_scaling(tmp_path, capsys, mnist_dir, monkeypatch):
    maths = []
    run_epoch = bench_workloads.train_epoch
    monkeypatch.setattr(bench_workloads, "train_epoch", lambda trainer: maths.append(
        (trainer.config.math, trainer.loss_scaler is not None)) or run_epoch(trainer))
    report, out, _ = run_benchmark(tmp_path, capsys, "--only", "mlp", "--limit-images", 300, "--epochs", 1,
                                   "--data-dir", mnist_dir, "--engines", "fast", "--math", "fp16")
    assert report["settings"]["math"] == "fp16" and set(maths) == {("fp16", True)}
    assert [row["workload"] for row in report["table"]] == ["mlp fp16 epoch, eager", "mlp fp16 throughput, eager"]
    assert report["table"][0]["fast"] > 0 and "mlp fp16 epoch, eager" in out


def test_math_fp16_is_judged_against_pytorch_s_autocast_graph_epoch_as_bf16_is():
    sections = fake_engine_results(10.0, 100.0)
    torch_results = {"mlp": {"graph": {"epoch_ms": 18.0}, "eager": {"epoch_ms": 40.0}}}
    for math in ("bf16", "fp16"):
        rows = {row["workload"]: row for row in bench_report.training_rows(
            "mlp", {"fast": sections["mlp"], "slides": sections["mlp"]}, torch_results, math)}
        graph = rows[f"mlp {math} epoch, graph"]
        assert graph["target_fast"] == graph["target_slides"] == pytest.approx(18.0 / bench_report.BF16_SPEED_UP)


def test_math_bf16_rows_show_pytorch_s_pure_bf16_graph_beside_autocast():
    settings = {"device": "cuda", "limit_images": None, "micro_size": bench_settings.MICRO_SIZE, "math": "bf16"}
    results = fake_results(10.0, 100.0)
    torch_results = {name: {"graph": {"epoch_ms": 18.0, "images_per_second": 3e6}, "eager": {"epoch_ms": 40.0},
                            "pure_bf16_graph": {"epoch_ms": 15.0, "images_per_second": 4e6}} for name in ("mlp", "cnn")}
    rows = {row["workload"]: row for row in bench_report.table_rows(results, torch_results, settings)}
    assert all(set(row) == ROW_KEYS for row in rows.values())
    graph, eager = rows["mlp bf16 epoch, graph"], rows["mlp bf16 epoch, eager"]
    assert (graph["torch_graph"], graph["torch_bf16_graph"]) == (18.0, 15.0)
    assert graph["ratio_bf16_fast"] == pytest.approx(15.0 / 10.0) and graph["ratio_bf16_slides"] == pytest.approx(0.5)
    assert graph["ratio_fast"] == pytest.approx(18.0 / 10.0)  # autocast's ratio as before
    assert graph["target_fast"] == pytest.approx(18.0 / bench_report.BF16_SPEED_UP)  # still autocast's graph
    assert eager["torch_bf16_graph"] is None and eager["ratio_bf16_fast"] is None  # a graph only
    throughput = rows["mlp bf16 throughput, graph"]
    assert throughput["torch_bf16_graph"] == 4e6 and throughput["ratio_bf16_fast"] is None  # no ratio but of times
    report = {"device": "NVIDIA H100", "backend": "cuda", "versions": {}, "table": list(rows.values()),
              "settings": {"workloads": ["mlp", "cnn"]}}
    text = bench_report.format_table(report["table"], bench_report.table_header(report))
    heading = next(line for line in text.splitlines() if line.startswith("workload"))
    assert heading.index("torch graph") < heading.index("torch bf16 graph") < heading.index("torch/slides")
    assert heading.index("torch/fast") < heading.index("torch bf16/slides") < heading.index("torch bf16/fast")
    assert "torch bf16 graph: PyTorch's pure bfloat16 (model, input and SGD in bfloat16" in text
    assert [line for line in text.splitlines() if line.startswith("mlp bf16 epoch, graph")][0].split()[-10:-5] == [
        "15.00", "0.60x", "1.80x", "0.50x", "1.50x"]


def test_peak_memory_rows_hold_pytorch_s_peak_beside_ours_in_each_mode():
    settings = {"device": "cuda", "limit_images": None, "micro_size": bench_settings.MICRO_SIZE, "math": "bf16"}
    torch_results = {"mlp": {"graph": {"epoch_ms": 18.0, "peak_memory_mib": 300.0},
                             "eager": {"epoch_ms": 40.0, "peak_memory_mib": 250.0},
                             "pure_bf16_graph": {"epoch_ms": 15.0, "peak_memory_mib": 160.0}}}
    rows = {row["workload"]: row for row in bench_report.table_rows(fake_results(10.0, 100.0), torch_results, settings)}
    graph, eager = rows["mlp bf16 peak memory, graph"], rows["mlp bf16 peak memory, eager"]
    assert (graph["fast"], graph["torch_graph"], graph["torch_bf16_graph"], graph["torch_eager"]) == (
        100.0, 300.0, 160.0, None)
    assert (eager["torch_eager"], eager["torch_graph"], eager["torch_bf16_graph"]) == (250.0, None, None)
    assert graph["ratio_fast"] is None and graph["ratio_bf16_fast"] is None  # ratios of times only
    assert rows["cnn bf16 peak memory, graph"]["torch_graph"] is None  # PyTorch did not run the cnn here
    report = {"device": "NVIDIA H100", "backend": "cuda", "versions": {}, "table": list(rows.values())}
    assert "PyTorch's torch.cuda.max_memory_allocated above the run's start" in bench_report.table_header(report)
    ours_only = bench_report.table_rows(fake_results(10.0, 100.0), None, settings)
    assert "max_memory_allocated" not in bench_report.table_header({**report, "table": ours_only})
    no_memory = {"mlp": {"graph": {"epoch_ms": 10.0, "images_per_second": 6e6, "peak_memory_mib": None},
                         "eager": None}}
    assert not any("memory" in row["workload"]
                   for row in bench_report.training_rows("mlp", {"fast": no_memory["mlp"]}, None, "fp32"))


def test_the_pure_bf16_columns_are_left_out_where_no_row_has_pytorch_s_pure_bf16_graph():
    settings = {"device": "cuda", "limit_images": None, "micro_size": bench_settings.MICRO_SIZE}
    torch_results = {"mlp": {"graph": {"epoch_ms": 20.0, "images_per_second": 3e6}, "eager": {"epoch_ms": 10.0}}}
    rows = bench_report.table_rows(fake_results(10.0, 100.0), torch_results, settings)
    report = {"device": "NVIDIA H100", "backend": "cuda", "versions": {}, "table": rows}
    text = bench_report.format_table(rows, bench_report.table_header(report))
    assert "torch graph" in text and "bf16" not in text
    assert all(row["torch_bf16_graph"] is None and row["ratio_bf16_fast"] is None for row in rows)


def test_micro_bf16_graph_rows_show_pytorch_s_pure_bf16_step():
    settings = {"device": "cuda", "limit_images": None, "micro_size": bench_settings.MICRO_SIZE}
    results = {"fast": fake_micro_section(3.9, 4.2, 4.1), "slides": fake_micro_section(5.0, 5.5, 5.2)}
    torch_micro = {math: {"graph": {"step_ms": 4.3}, "graph_steady": {"step_ms": 4.4}, "eager": {"step_ms": 4.5}}
                   for math in bench_settings.MATHS}
    torch_micro["bf16"].update(pure_bf16_graph={"step_ms": 3.6}, pure_bf16_graph_steady={"step_ms": 3.55})
    rows = {row["workload"]: row for row in bench_report.table_rows(results, {"micro": torch_micro}, settings)}
    graph, steady = rows["micro bf16 step (10000), graph"], rows["micro bf16 step (10000), graph, steady state"]
    assert (graph["torch_graph"], graph["torch_bf16_graph"], steady["torch_bf16_graph"]) == (4.3, 3.6, 3.55)
    assert graph["ratio_bf16_fast"] == pytest.approx(3.6 / 3.9) and steady["ratio_bf16_fast"] == pytest.approx(3.55 / 4.1)
    assert graph["target_fast"] == bench_settings.TARGETS["micro_bf16_ms"]  # autocast's 4.3 ms is above the 4 ms limit
    assert rows["micro bf16 step (10000), eager"]["torch_bf16_graph"] is None
    assert {row["torch_bf16_graph"] for name, row in rows.items() if "bf16" not in name} == {None}


def test_pytorch_autocasts_fp16_to_half_and_bf16_to_bfloat16():
    torch = types.SimpleNamespace(bfloat16="bfloat16", float16="float16")
    assert [bench_torch.autocast_type(torch, math) for math in ("fp32", "tf32", "bf16", "fp16")] == [
        None, None, "bfloat16", "float16"]


def test_engines_flag_picks_the_columns(capsys):
    parse = benchmark.build_parser().parse_args
    assert benchmark.resolve_settings(parse(["--device", "host"]))["engines"] == ["slides", "fast"]
    assert benchmark.resolve_settings(parse(["--device", "host", "--engines", "fast"]))["engines"] == ["fast"]
    with pytest.raises(SystemExit) as exit:
        benchmark.main(["--engines", "slides,turbo"])
    assert exit.value.code == 2 and "unknown engine 'turbo'" in capsys.readouterr().err


# ---- cifar10 -------------------------------------------------------------------------------------


def test_cifar10_trains_the_config_net_on_generated_images(tmp_path, capsys, monkeypatch):
    steps = []
    train_batch = Trainer.train_batch
    monkeypatch.setattr(Trainer, "train_batch", lambda self, index: steps.append(index) or train_batch(self, index))
    report, out, err = run_benchmark(tmp_path, capsys, "--only", "cifar10", "--limit-images", 40, "--epochs", 1,
                                     "--engines", "slides")
    section = report["results"]["slides"]["cifar10"]
    assert section["config"] == "configs/cifar10_cnn.yaml" and section["images"] == 40
    assert section["batch_size"] == 128  # the config's, not the MNIST workloads' 256
    assert section["augment"] == bench_workloads.augmentation(load_config(REPO_ROOT / "configs" / "cifar10_cnn.yaml"))
    assert section["graph"] is None and len(section["eager"]["epoch_ms_all"]) == 1  # no graphs on the host
    assert steps == [0, 0]  # a warm-up epoch and a timed one, each one batch of 40
    assert [row["workload"] for row in report["table"]] == ["cifar10 epoch, eager", "cifar10 throughput, eager"]
    assert "cifar10: 40 training and 40 test images generated (seed 0)" in err
    assert report["targets"]["cifar10_speed_up_over_torch_graph"] == 1.3


def test_cifar10_config_is_the_shipped_net_at_its_own_batch():
    config = bench_workloads.workload_config("cifar10", "host", "DIR", 2, graph=True, engine="fast")
    shipped = load_config(REPO_ROOT / "configs" / "cifar10_cnn.yaml")
    assert config.model == shipped.model and config.train.batch_size == shipped.train.batch_size == 128
    assert all(spec.params["bias"] is False for spec in config.model if spec.type == "conv2d")
    assert config.data.dataset == "cifar10" and config.data.dir == "DIR" and config.data.normalize == "computed"
    assert (config.train.optimizer.momentum, config.train.optimizer.weight_decay) == (0.9, 0.0005)
    assert config.train.graph is True and config.engine == "fast" and config.train.epochs == 2


def test_generated_cifar10_records_are_read_as_the_data_set_and_repeat_with_the_seed(tmp_path):
    from cudnnnet.data.sources import read_cifar_records

    folder = bench_workloads.write_cifar10_records(tmp_path / "a", 12, 3, seed=0)
    parts = [read_cifar_records(folder / f"data_batch_{index}.bin") for index in range(1, 6)]
    assert [len(labels) for _, labels in parts] == [3, 3, 2, 2, 2]
    pixels, labels = read_cifar_records(folder / "test_batch.bin")
    assert pixels.shape == (3, 3, 32, 32) and labels.max() < 10
    again = bench_workloads.write_cifar10_records(tmp_path / "b", 12, 3, seed=0)
    assert (again / "data_batch_2.bin").read_bytes() == (folder / "data_batch_2.bin").read_bytes()
    assert (folder / "data_batch_2.bin").read_bytes() != (folder / "data_batch_3.bin").read_bytes()


class _Augment:
    crop_padding, flip = 4, True


@pytest.mark.parametrize("augment, expected", [
    (None, None),
    ({"crop_padding": 4, "flip": True}, {"crop_padding": 4, "flip": True}),
    ({"crop_padding": 0, "flip": False}, None),
    (_Augment(), {"crop_padding": 4, "flip": True}),
])
def test_augmentation_reads_the_configs_data_augment(augment, expected):
    config = types.SimpleNamespace(data=types.SimpleNamespace(augment=augment))
    assert bench_workloads.augmentation(config) == expected
    assert bench_workloads.augmentation(types.SimpleNamespace(data=object())) is None  # a config without the key


def fake_cifar10_section(graph_ms: float) -> dict:
    return {"cifar10": {"graph": {"epoch_ms": graph_ms, "images_per_second": 5e7 / graph_ms, "peak_memory_mib": 9.0},
                        "eager": None}}


def test_cifar10_is_judged_against_pytorchs_captured_graph_over_1_3_in_both_engines():
    settings = {"device": "cuda", "limit_images": None, "micro_size": bench_settings.MICRO_SIZE}
    results = {"fast": fake_cifar10_section(90.0), "slides": fake_cifar10_section(110.0)}
    torch_results = {"cifar10": {"graph": {"epoch_ms": 130.0, "images_per_second": 5e7 / 130}}}
    rows = {row["workload"]: row for row in bench_report.table_rows(results, torch_results, settings)}
    epoch = rows["cifar10 epoch, graph"]
    assert epoch["target_fast"] == epoch["target_slides"] == pytest.approx(100.0)
    assert (epoch["status_fast"], epoch["status_slides"]) == ("PASS", "MISS")
    assert epoch["ratio_fast"] == pytest.approx(130 / 90) and epoch["torch_graph"] == 130.0
    assert set(rows) == {"cifar10 epoch, graph", "cifar10 throughput, graph", "cifar10 peak memory, graph"}
    alone = {row["workload"]: row for row in bench_report.table_rows(results, None, settings)}
    assert alone["cifar10 epoch, graph"]["target_fast"] is None  # no PyTorch, no target
    header = bench_report.table_header({"device": "NVIDIA H100", "backend": "cuda", "versions": {},
                                        "settings": {"workloads": ["cifar10"]}})
    assert "cifar10: PyTorch's captured graph over 1.3 in both engines" in header


# ---- original ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_original_configs_are_the_original_experiment(name):
    config = load_config(REPO_ROOT / "configs" / f"original_{name}.yaml")
    check_model(config)
    train = config.train
    assert (train.batch_size, train.steps, train.optimizer.lr, train.optimizer.momentum) == (256, 1600, 0.02, 0.0)
    assert (train.schedule.name, train.schedule.decay) == ("inverse", 0.00005)
    assert train.optimizer.weight_decay == 0 and config.data.normalize is None
    model = load_config(REPO_ROOT / "configs" / f"mnist_{name}.yaml").model
    assert config.model == model


def fake_train_script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "train.py"
    script.write_text("import json, sys\nfrom pathlib import Path\n"
                      "output = Path(sys.argv[sys.argv.index('--output') + 1])\n" + body)
    return script


def test_original_reads_the_accuracy_of_each_run(tmp_path, monkeypatch, caplog):
    script = fake_train_script(tmp_path, "(output / 'metrics.json').write_text(json.dumps({'test_accuracy': 0.97}))\n")
    monkeypatch.setattr(bench_original, "TRAINER", (str(script),))
    settings = {"device": "host", "data_dir": tmp_path, "original_runs": 2}
    with caplog.at_level("INFO", logger="cudnnnet.benchmark"):
        result = bench_original.benchmark_original("mlp", settings)
    progress = [message for message in caplog.messages if message.startswith("original mlp: run")]
    assert [message.split(" took ")[0] for message in progress] == [
        "original mlp: run 1 of 2, a whole training process on host", "original mlp: run 1",
        "original mlp: run 2 of 2, a whole training process on host", "original mlp: run 2"]
    assert result["test_accuracy"] == 0.97 and result["config"] == "configs/original_mlp.yaml"
    assert len(result["seconds_all"]) == 2 and positive_numbers(result["seconds_all"]) and result["seconds"] > 0
    command = bench_original.original_command("cnn", settings, "OUT")
    assert command[:2] == [sys.executable, str(script)]
    assert command[2:] == ["--config", str(bench_original.CONFIG_DIR / "original_cnn.yaml"), "--device", "host",
                           "--quiet", "--output", "OUT", "--data-dir", str(tmp_path)]
    assert bench_original.original_command("cnn", settings, "OUT", "fast")[-2:] == ["--engine", "fast"]


def test_the_trainer_process_imports_this_cudnnnet_installed_or_not(tmp_path, monkeypatch):
    site_folder = Path(bench_original.sysconfig.get_paths()["purelib"])
    assert bench_original.trainer_environment(site_folder) is None  # installed: the interpreter finds it
    monkeypatch.setenv("PYTHONPATH", "elsewhere")
    checkout = bench_original.trainer_environment(tmp_path)["PYTHONPATH"]
    assert checkout.split(bench_original.os.pathsep) == [str(tmp_path), "elsewhere"]
    monkeypatch.delenv("PYTHONPATH")
    probe = "import cudnnnet; print(cudnnnet.__file__)"
    finished = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                              env=bench_original.trainer_environment(), timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert Path(finished.stdout.strip()).parent == Path(bench_original.__file__).resolve().parents[1]


def test_original_that_fails_is_an_error_naming_it(tmp_path, monkeypatch):
    script = fake_train_script(tmp_path, "print('cudnnnet-train: error: no GPU', file=sys.stderr)\nsys.exit(2)\n")
    monkeypatch.setattr(bench_original, "TRAINER", (str(script),))
    with pytest.raises(bench_settings.BenchmarkError) as raised:
        bench_original.run_original_once("cnn", {"device": "cuda", "data_dir": None})
    assert str(raised.value) == ("original cnn: the training process (original_cnn.yaml, --device cuda) failed with "
                                 "exit code 2: no GPU")


def test_uncompiled_packages_are_those_without_bytecode_when_none_can_be_written(tmp_path, monkeypatch):
    for name in ("compiled_pkg", "source_pkg"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("VALUE = 1\n")
    py_compile.compile(str(tmp_path / "compiled_pkg" / "__init__.py"), doraise=True)
    monkeypatch.syspath_prepend(str(tmp_path))
    names = ("compiled_pkg", "source_pkg", "no_such_pkg_here")
    assert bench_original.uncompiled_packages(names, dont_write=True) == ["source_pkg"]
    assert bench_original.uncompiled_packages(names, dont_write=False) == []


def test_header_says_when_processes_compiled_their_imports():
    report = {"device": "NVIDIA H100 80GB HBM3", "backend": "cuda", "versions": {"cudnnnet": "0.1.0"}}
    assert "bytecode" not in bench_report.table_header(report)
    text = bench_report.table_header({**report, "uncompiled_packages": ["numpy", "cuda.bindings"]})
    assert "note: numpy, cuda.bindings have no cached bytecode" in text and "compileall" in text


# ---- the table and its targets -----------------------------------------------------------------


def fake_engine_results(mlp_graph_ms: float, cnn_graph_ms: float) -> dict:
    def training(graph_ms):
        mode = {"epoch_ms": graph_ms, "images_per_second": 60000 / graph_ms * 1000, "peak_memory_mib": 100.0}
        return {"graph": mode, "eager": {**mode, "epoch_ms": 2 * graph_ms}}

    return {"mlp": training(mlp_graph_ms), "cnn": training(cnn_graph_ms),
            "original": {"mlp": {"seconds": 0.9, "test_accuracy": 0.97}, "cnn": {"seconds": 2.5, "test_accuracy": 0.99}}}


def fake_results(mlp_graph_ms: float, cnn_graph_ms: float) -> dict:
    """The fast engine at the given graph epochs, the slides engine at three times them."""
    return {"fast": fake_engine_results(mlp_graph_ms, cnn_graph_ms),
            "slides": fake_engine_results(3 * mlp_graph_ms, 3 * cnn_graph_ms)}


def test_targets_pass_or_miss_on_the_gpu_only_for_full_workloads():
    settings = {"device": "cuda", "limit_images": None, "micro_size": bench_settings.MICRO_SIZE}
    torch_results = {"mlp": {"graph": {"epoch_ms": 20.0, "images_per_second": 3e6}, "eager": {"epoch_ms": 10.0}}}
    rows = {row["workload"]: row for row in bench_report.table_rows(fake_results(10.0, 100.0), torch_results, settings)}
    assert rows["mlp epoch, graph"]["status_fast"] == "PASS" and rows["cnn epoch, graph"]["status_fast"] == "MISS"
    # slides against PyTorch's graph of this run (20 ms: 30 ms misses), else the H100's figure (133 ms: 300 misses)
    assert rows["mlp epoch, graph"]["target_slides"] == 20.0 and rows["mlp epoch, graph"]["status_slides"] == "MISS"
    assert rows["cnn epoch, graph"]["target_slides"] == bench_settings.SLIDES_TARGETS["cnn_epoch_ms"]
    assert rows["mlp epoch, eager"]["target_fast"] is None and rows["mlp epoch, eager"]["status_fast"] is None
    assert rows["original mlp, whole process"]["status_fast"] == "PASS"
    assert rows["original cnn, whole process"]["status_fast"] == "MISS"
    assert rows["original cnn, test accuracy"]["fast"] == pytest.approx(99.0)
    assert rows["mlp epoch, graph"]["ratio_fast"] == pytest.approx(2.0)  # torch graph 20 ms / ours 10 ms
    assert rows["mlp epoch, graph"]["ratio_slides"] == pytest.approx(20.0 / 30.0)
    assert rows["mlp epoch, graph"]["torch_eager"] is None and rows["mlp epoch, graph"]["torch_graph"] == 20.0
    assert rows["mlp epoch, eager"]["ratio_fast"] == pytest.approx(0.5)  # torch eager 10 ms / ours 20 ms
    assert rows["mlp peak memory, graph"]["fast"] == 100.0
    limited = bench_report.table_rows(fake_results(10.0, 100.0), None, {**settings, "limit_images": 512})
    assert {row["status_fast"] for row in limited if "epoch" in row["workload"] and row["target_fast"]} == {"n/a"}
    on_host = bench_report.table_rows(fake_results(10.0, 100.0), None, {**settings, "device": "host"})
    assert {row[f"status_{engine}"] for row in on_host for engine in ("slides", "fast")
            if row[f"target_{engine}"] is not None} == {"n/a"}


def test_table_prints_every_row_under_the_device():
    report = {"device": "NVIDIA A100", "backend": "cuda", "versions": {"cudnnnet": "0.1.0"}}
    rows = bench_report.table_rows(fake_results(10.0, 100.0), None,
                                {"device": "cuda", "limit_images": None, "micro_size": bench_settings.MICRO_SIZE})
    text = bench_report.format_table(rows, bench_report.table_header(report))
    lines = text.splitlines()
    assert lines[0].startswith("device: NVIDIA A100 (cuda)") and "not an H100" in text
    assert len([line for line in lines if line.startswith(("mlp", "cnn", "original"))]) == len(rows)
    assert "PASS" in text and "MISS" in text and "<= 15" in text


# ---- PyTorch (on the CPU here: the same code the GPU comparison runs, eager only) ---------------


@pytest.mark.parametrize("config_name", ["mnist_mlp", "mnist_cnn", "lenet5", "original_cnn", "cifar10_cnn"])
def test_torch_model_is_the_same_architecture(config_name):
    torch = pytest.importorskip("torch")
    config = load_config(REPO_ROOT / "configs" / f"{config_name}.yaml")
    model, _ = bench_torch.torch_model(torch, config)
    network: Network = build_network(config, "host")
    ours = sorted(parameter.value.size for parameter in network.parameter_list())
    assert sorted(parameter.numel() for parameter in model.parameters()) == ours
    assert tuple(model(torch.zeros((3,) + input_shape(config))).shape) == (3, 10)


def test_torch_training_and_micro_report_epochs_and_steps(mnist_dir):
    torch = pytest.importorskip("torch")
    config = bench_workloads.workload_config("mlp", "host", mnist_dir, 1, False)
    result = bench_torch.torch_training(torch, "mlp", config, 2, 300, "cpu")
    assert set(result) == {"eager"} and len(result["eager"]["epoch_ms_all"]) == 2
    assert result["eager"]["peak_memory_mib"] is None  # torch.cuda's peak: none on the CPU
    assert positive_numbers(result["eager"]["epoch_ms_all"]) and result["eager"]["images_per_second"] > 0
    micro = bench_torch.torch_micro(torch, 32, 2, bench_settings.MATHS, "cpu")
    assert set(micro) == set(bench_settings.MATHS) and positive_numbers(micro["tf32"]["eager"]["step_ms_all"])
    assert set(micro["bf16"]) == {"eager"}  # graphs, their steady state too, only on CUDA


def test_torch_pure_bf16_keeps_the_model_and_data_in_bfloat16_and_the_loss_in_float32(mnist_dir):
    torch = pytest.importorskip("torch")
    config = bench_workloads.workload_config("mlp", "host", mnist_dir, 1, False, math="bf16")
    images, labels = bench_torch.training.load_split(config, "train")
    run = bench_torch.TorchTraining(torch, config, images[:300], labels[:300], "cpu", pure_bf16=True)
    assert run.autocast is None and run.images.dtype == torch.bfloat16
    assert {parameter.dtype for parameter in run.model.parameters()} == {torch.bfloat16}
    before = [parameter.detach().clone() for parameter in run.model.parameters()]
    losses = []
    run.loss = lambda outputs, labels, loss=run.loss: losses.append(outputs.dtype) or loss(outputs, labels)
    run.eager_epoch()
    assert set(losses) == {torch.float32} and len(losses) == 2  # 300 images: two batches of at most 256
    assert any(not torch.equal(old, new) for old, new in zip(before, run.model.parameters()))
    assert {parameter.dtype for parameter in run.model.parameters()} == {torch.bfloat16}
    autocast = bench_torch.TorchTraining(torch, config, images[:300], labels[:300], "cpu")
    assert autocast.autocast == torch.bfloat16 and {p.dtype for p in autocast.model.parameters()} == {torch.float32}
    result = bench_torch.torch_training(torch, "mlp", config, 1, 300, "cpu")
    assert set(result) == {"eager"}  # the pure bfloat16 run is a captured graph: CUDA only


def test_torch_pure_bf16_micro_step_updates_bfloat16_weights():
    torch = pytest.importorskip("torch")
    model, step = bench_torch.pure_bf16_micro_step(torch, 40, "cpu")
    parameters = list(model.parameters())
    assert {parameter.dtype for parameter in parameters} == {torch.bfloat16}
    before = [parameter.detach().clone() for parameter in parameters]
    step()
    assert all(parameter.grad is not None and parameter.grad.dtype == torch.bfloat16 for parameter in parameters)
    assert any(not torch.equal(old, new) for old, new in zip(before, parameters))


def test_torch_augment_shifts_and_flips_each_sample_within_the_padding():
    """Each augmented sample is its image shifted by some dy, dx in [-2, 2] (zeros outside), mirrored
    or not: found among every such candidate; over 64 samples both flips and several shifts occur."""
    torch = pytest.importorskip("torch")
    images = torch.arange(64 * 2 * 5 * 6, dtype=torch.float32).reshape(64, 2, 5, 6) + 1  # no pixel is 0
    augmented = bench_torch.TorchAugment(torch, 2, True, (2, 5, 6), "cpu")(images)
    padded = torch.nn.functional.pad(images, (2, 2, 2, 2))
    found = set()
    for sample in range(64):
        matches = [(dy, dx, flip) for dy in range(-2, 3) for dx in range(-2, 3) for flip in (False, True)
                   if torch.equal(augmented[sample], padded[sample, :, 2 + dy:7 + dy, 2 + dx:8 + dx].flip(-1) if flip
                                  else padded[sample, :, 2 + dy:7 + dy, 2 + dx:8 + dx])]
        assert len(matches) == 1, f"sample {sample} is no shift or flip of its image"
        found.add(matches[0])
    assert {flip for _, _, flip in found} == {False, True} and len({(dy, dx) for dy, dx, _ in found}) > 5


def test_torch_training_augments_where_the_config_does(monkeypatch, tmp_path):
    torch = pytest.importorskip("torch")
    folder = bench_workloads.write_cifar10_records(tmp_path / "cifar10", 16, 4, seed=0)
    config = bench_workloads.workload_config("cifar10", "host", folder, 1, False)
    run = bench_torch.TorchTraining(torch, config, *bench_torch.training.load_split(config, "train"), "cpu")
    assert (run.augment is None) == (bench_workloads.augmentation(config) is None)  # as the config says
    monkeypatch.setattr(bench_torch, "augmentation", lambda config: {"crop_padding": 4, "flip": True})
    result = bench_torch.torch_training(torch, "cifar10", config, 1, 16, "cpu")
    assert set(result) == {"eager"} and positive_numbers(result["eager"]["epoch_ms_all"])


def test_compare_torch_is_skipped_off_the_gpu(tmp_path, capsys):
    report, _, err = run_benchmark(tmp_path, capsys, "--only", "micro", "--micro-size", 16, "--repeat", 1,
                                   "--compare", "torch")
    assert report["torch"] is None and "--compare torch: only with --device cuda; no comparison" in err
    assert report["table"][0]["torch_eager"] is None and report["table"][0]["ratio_slides"] is None


# ---- the command line --------------------------------------------------------------------------


def test_unknown_workload_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit:
        benchmark.main(["--only", "mlp,gpt"])
    assert exit.value.code == 2
    assert "unknown workload 'gpt'" in capsys.readouterr().err


@pytest.mark.parametrize("json_path, problem", [
    ("absent/out.json", r"--json .*absent/out\.json: the folder .*absent does not exist; create it first"),
    ("a_file/out.json", r"--json .*a_file/out\.json: .*a_file is a file, not a folder"),
    (".", r"--json .* is a folder; give a file name"),
])
def test_an_unusable_json_path_is_refused_before_any_workload_runs(tmp_path, capsys, monkeypatch, json_path, problem):
    (tmp_path / "a_file").write_text("kept\n")
    monkeypatch.setattr(benchmark, "build_report", lambda settings: pytest.fail("a workload ran"))
    assert benchmark.main(["--device", "host", "--only", "micro", "--quiet", "--json", str(tmp_path / json_path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and re.match(r"cudnnnet-benchmark: error: " + problem, lines[0]), lines
    assert (tmp_path / "a_file").read_text() == "kept\n"


def test_script_prints_the_table_last(tmp_path):
    finished = run_script("benchmark", "--device", "host", "--only", "micro", "--micro-size", "16", "--repeat", "1",
                          "--json", str(tmp_path / "out.json"), timeout=300)
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.strip().splitlines()[-1].startswith("micro bf16 step (16), eager")  # the last of MATHS
    assert json.loads((tmp_path / "out.json").read_text())["results"]["slides"]["micro"]["size"] == 16


def test_timed_calls_warm_up_for_the_seconds_asked_before_timing():
    from cudnnnet.benchmark.measuring import timed_calls

    calls = []
    started = time.perf_counter()
    seconds = timed_calls(lambda: (calls.append(1), time.sleep(0.01)), 3, lambda: None, 1, warmup_seconds=0.1)
    elapsed = time.perf_counter() - started
    # untimed calls for 0.1 s at least, however long a loaded machine's sleeps take, then the 3 timed ones
    assert len(seconds) == 3 and len(calls) > 3 + 1 and elapsed >= 0.1 + sum(seconds)
    calls.clear()
    timed_calls(lambda: calls.append(1), 3, lambda: None, 2)
    assert len(calls) == 5
