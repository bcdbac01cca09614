"""The original workload: scripts/train.py as a whole, a training process timed by wall clock."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import site
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from ..config.shipped import CONFIG_DIR
from .settings import ORIGINAL_CONFIGS, BenchmarkError

log = logging.getLogger(__name__)

TRAINER = ("-m", "cudnnnet.cli.launch")  # cudnnnet-train as a module: the same in a checkout and an install
PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # the folder holding this cudnnnet package
# Third-party packages every training process imports: where their bytecode is not cached and cannot
# be written (PYTHONDONTWRITEBYTECODE), each process compiles their source again.
PROCESS_IMPORTS = ("numpy", "yaml", "cuda.bindings", "cuda.pathfinder")


def original_command(name: str, settings: dict, output: str, engine: str | None = None) -> list[str]:
    command = [sys.executable, *TRAINER, "--config", str(CONFIG_DIR / ORIGINAL_CONFIGS[name]),
               "--device", settings["device"], "--quiet", "--output", output]
    if settings["data_dir"] is not None:
        command += ["--data-dir", str(settings["data_dir"])]
    if engine is not None:
        command += ["--engine", engine]
    return command


def trainer_environment(package_parent: Path = PACKAGE_PARENT) -> dict | None:
    """The environment of the trainer's process, so that it imports this very cudnnnet: unchanged
    (None) where the package is installed in a site-packages folder; otherwise (a checkout run
    through scripts/, which puts the checkout on sys.path) with ``package_parent`` first on PYTHONPATH."""
    paths = sysconfig.get_paths()
    site_folders = {Path(folder).resolve() for folder in (*site.getsitepackages(), paths["purelib"], paths["platlib"])}
    if package_parent.resolve() in site_folders:
        return None
    inherited = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(package_parent), inherited)))}


def run_original_once(name: str, settings: dict, engine: str | None = None) -> tuple[float, float]:
    """(wall-clock seconds, test accuracy) of one run of the original workload ``name``."""
    with tempfile.TemporaryDirectory(prefix="cudnnnet-original-") as output:
        command = original_command(name, settings, output, engine)
        environment = trainer_environment()
        started = time.perf_counter()
        finished = subprocess.run(command, capture_output=True, text=True, env=environment)
        seconds = time.perf_counter() - started
        if finished.returncode != 0:
            last = (finished.stderr.strip().splitlines() or ["no output"])[-1]
            reason = last.split(": error: ", 1)[-1]  # the trainer's own message, without its program name
            raise BenchmarkError(f"original {name}: the training process ({ORIGINAL_CONFIGS[name]}, --device "
                                 f"{settings['device']}) failed with exit code {finished.returncode}: {reason}")
        metrics = json.loads((Path(output) / "metrics.json").read_text(encoding="utf-8"))
    return seconds, metrics["test_accuracy"]


def uncompiled_packages(names=PROCESS_IMPORTS, dont_write: bool | None = None) -> list[str]:
    """The packages among ``names`` that a new process must compile from source every time: their
    ``__init__.py`` has no cached bytecode and writing it is turned off (``sys.dont_write_bytecode``,
    which PYTHONDONTWRITEBYTECODE sets and subprocesses inherit). Packages not installed are left out."""
    if not (sys.flags.dont_write_bytecode if dont_write is None else dont_write):
        return []
    uncompiled = []
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        origin = spec.origin if spec is not None else None
        if origin and origin.endswith(".py") and not Path(importlib.util.cache_from_source(origin)).exists():
            uncompiled.append(name)
    return uncompiled


def benchmark_original(name: str, settings: dict, engine: str | None = None) -> dict:
    runs = []
    for run_number in range(1, settings["original_runs"] + 1):
        log.info("original %s: run %d of %d, a whole training process on %s%s", name, run_number,
                 settings["original_runs"], settings["device"], f" ({engine} engine)" if engine else "")
        runs.append(run_original_once(name, settings, engine))
        log.info("original %s: run %d took %.2f s (test accuracy %.4f)", name, run_number, *runs[-1])
    seconds = [run[0] for run in runs]
    summary = {"config": f"configs/{ORIGINAL_CONFIGS[name]}", "seconds": statistics.median(seconds),
               "seconds_all": seconds, "test_accuracy": runs[-1][1]}
    log.info("original %s %s: %.2f s for the whole process, test accuracy %.4f", name, engine or "", summary["seconds"],
             summary["test_accuracy"])
    return summary


def measure_original(settings: dict) -> dict:
    """The original workloads of each engine ({engine: {name: summary}}), run before this process
    touches the GPU (its subprocesses have it alone)."""
    if settings["device"] == "host":
        log.info("original on the host: each run trains 1600 steps of batch 256 with NumPy (minutes for the cnn)")
    return {engine: {name: benchmark_original(name, settings, engine) for name in ORIGINAL_CONFIGS}
            for engine in settings["engines"]}
