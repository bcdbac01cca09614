"""cudnnnet-benchmark --gpus N: its refusals and its table on any machine, the measurement on two GPUs."""

import json
import os
import subprocess
import sys

import pytest

from cudnnnet.benchmark.scaling import format_scaling
from cudnnnet.cli import benchmark
from run_helpers import REPO_ROOT
from test_distributed_gpu import gpu_count


def _row(one, several, target):
    return {"one_gpu": {"epoch_ms": one}, "several_gpus": {"epoch_ms": several}, "scaling": one / several,
            "target": target}


def test_the_table_gives_each_workload_s_scaling_against_its_target():
    report = {"gpus": 2, "epochs": 3, "workloads": {
        "cnn": {"slides": _row(120.0, 62.0, 1.9), "fast": _row(82.0, 46.0, 1.9), "torch_ddp": _row(550.0, 276.0, None)},
        "mlp": {"fast": _row(15.0, 9.0, None)}}}
    lines = format_scaling(report).splitlines()
    assert lines[0].split() == ["workload", "engine", "1", "GPU", "(ms)", "2", "GPUs", "(ms)", "scaling", "target",
                                "status", "DDP/ours"]
    assert lines[2].split() == ["cnn", "slides", "120.00", "62.00", "1.94x", ">=", "1.9x", "PASS", "4.45x"]
    assert lines[3].split() == ["cnn", "fast", "82.00", "46.00", "1.78x", ">=", "1.9x", "MISS", "6.00x"]
    assert lines[4].split() == ["cnn", "torch_ddp", "550.00", "276.00", "1.99x"]
    assert lines[5].split() == ["mlp", "fast", "15.00", "9.00", "1.67x"]


def test_micro_is_timed_by_the_step_and_scaled_against_its_target(monkeypatch):
    """One GPU's step over N GPUs' step, in each engine and for DDP, judged against micro's 2-GPU target."""
    from cudnnnet.benchmark import scaling

    def step(ms):
        return {"step_ms": ms, "step_ms_all": [ms]}

    measured = []

    def fake_measure(count, settings, module=scaling.MODULE, plain=True):
        measured.append((count, settings["workloads"], module))
        if module == scaling.TORCH_MODULE:  # DDP's figures: {workload: summary}
            return {"micro": step(46.0 if count == 1 else 25.0)}
        return {"micro": {"slides": step(50.0), "fast": step(40.0)} if count == 1 else
                {"slides": step(26.0), "fast": step(20.0)}}

    monkeypatch.setattr(scaling, "_measure", fake_measure)
    settings = {"workloads": ["micro", "original"], "epochs": 3, "compare": "torch"}
    report = scaling.measure_scaling(settings, 2)
    assert {workloads[0] for _, workloads, _ in measured} == {"micro"} and len(measured) == 4
    rows = report["workloads"]["micro"]
    assert rows["fast"]["scaling"] == pytest.approx(2.0) and rows["fast"]["target"] == 1.9
    assert rows["slides"]["scaling"] == pytest.approx(50 / 26) and rows["torch_ddp"]["target"] is None
    lines = scaling.format_scaling(report).splitlines()
    assert lines[2].split() == ["micro", "slides", "50.00", "26.00", "1.92x", ">=", "1.9x", "PASS", "0.96x"]
    assert lines[3].split() == ["micro", "fast", "40.00", "20.00", "2.00x", ">=", "1.9x", "PASS", "1.25x"]
    assert lines[4].split() == ["micro", "torch_ddp", "46.00", "25.00", "1.84x"]


def test_micro_s_samples_are_split_among_the_ranks():
    from cudnnnet.benchmark.scaling_micro import micro_part

    parts = [micro_part(10, rank, 3) for rank in range(3)]
    assert [list(part) for part in parts] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert list(micro_part(10, 0, 1)) == list(range(10))


@pytest.mark.parametrize("arguments, message", [
    (["--gpus", "2", "--device", "host"], "leave --device host out"),
    (["--gpus", "2", "--only", "original"], "--only names none of them"),
    (["--gpus", "2", "--only", "micro", "--math", "fp16"], "micro in fp32, tf32 or bf16"),
])
def test_what_gpus_cannot_measure_is_one_line_and_exit_2(capsys, arguments, message):
    assert benchmark.main(arguments) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


@pytest.mark.gpu
@pytest.mark.parametrize("compare", [(), ("--compare", "torch")])
def test_two_gpus_are_timed_beside_one(mnist_dir, tmp_path, compare):
    if gpu_count() < 2:
        pytest.skip("needs 2 GPUs of one host")
    if compare:
        pytest.importorskip("torch")
    report_file = tmp_path / "scaling.json"
    finished = subprocess.run(
        [sys.executable, "-m", "cudnnnet.cli.benchmark", "--gpus", "2", "--only", "cnn", "--epochs", "2",
         "--data-dir", str(mnist_dir), "--json", str(report_file), *compare],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert finished.returncode == 0, finished.stderr[-4000:]
    report = json.loads(report_file.read_text())
    for engine in ("slides", "fast", *(("torch_ddp",) if compare else ())):
        row = report["workloads"]["cnn"][engine]
        assert len(row["several_gpus"]["epoch_ms_all"]) == 2
        assert row["scaling"] == pytest.approx(row["one_gpu"]["epoch_ms"] / row["several_gpus"]["epoch_ms"])
        assert row["scaling"] > 1.2  # two GPUs train an epoch faster than one
    assert "cnn" in finished.stdout and "scaling" in finished.stdout


@pytest.mark.gpu
def test_the_micro_step_is_timed_on_two_gpus_beside_one(tmp_path):
    if gpu_count() < 2:
        pytest.skip("needs 2 GPUs of one host")
    report_file = tmp_path / "scaling.json"
    finished = subprocess.run(
        [sys.executable, "-m", "cudnnnet.cli.benchmark", "--gpus", "2", "--only", "micro", "--micro-size", "4000",
         "--repeat", "10", "--json", str(report_file)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert finished.returncode == 0, finished.stderr[-4000:]
    report = json.loads(report_file.read_text())
    for engine in ("slides", "fast"):
        row = report["workloads"]["micro"][engine]
        assert len(row["several_gpus"]["step_ms_all"]) == 10
        assert row["scaling"] == pytest.approx(row["one_gpu"]["step_ms"] / row["several_gpus"]["step_ms"])
        assert row["scaling"] > 1.0
    assert "micro" in finished.stdout
