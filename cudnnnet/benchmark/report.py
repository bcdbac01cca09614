"""The report: versions, the table of results against the targets, and its text."""

from __future__ import annotations

import datetime
import logging
import platform

import numpy as np

from .. import __version__
from ..backends import get_backend
from ..engine import ENGINES
from ..errors import CudnnnetError
from ..precision import FP32, Precision, get_precision
from .original import measure_original, uncompiled_packages
from .measuring import steady_last
from .settings import (MATHS, MICRO_FASTER_THAN_TORCH, MICRO_SIZE, SLIDES_TARGETS, STEADY_REPLAYS,
                       STEADY_SECONDS, TARGET_DEVICE, TARGETS, TORCH_SPEED_UPS, TRAINING_CONFIGS)
from .torch_reference import compare_torch
from .workloads import generated_data, measure

log = logging.getLogger(__name__)


def versions(backend) -> dict:
    found = {"cudnnnet": __version__, "python": platform.python_version(), "numpy": np.__version__}
    context = getattr(backend, "context", None)
    if context is None:
        return found
    try:
        from ..backends.cuda.bindings import cublas, runtime

        found.update(cuda_runtime=runtime.runtime_get_version(), cuda_driver=runtime.driver_get_version(),
                     cudnn=context.cudnn_version, cublas=cublas.get_version(context.cublas.handle))
    except (ImportError, AttributeError, CudnnnetError) as error:
        log.info("library versions not available: %s", error)
    return found


def _get(mapping, *keys):
    for key in keys:
        if not isinstance(mapping, dict) or mapping.get(key) is None:
            return None
        mapping = mapping[key]
    return mapping


TIME_UNITS = ("ms", "s")  # rows whose ratios compare PyTorch's time with ours


def _row(workload: str, unit: str, ours: dict, theirs: dict | None = None, targets: dict | None = None) -> dict:
    """One table row: ``ours`` and ``targets`` by engine name, ``theirs`` PyTorch's cells by column
    (torch_eager or torch_graph, and torch_bf16_graph). A row of times has ratios: PyTorch's time over
    each engine's (ratio_ENGINE; ratio_bf16_ENGINE for the pure bfloat16 graph's)."""
    row = {"workload": workload, "unit": unit}
    row.update({engine: ours.get(engine) for engine in ENGINES})
    row.update(torch_eager=None, torch_graph=None, torch_bf16_graph=None)
    row.update(theirs or {})
    reference = row["torch_graph"] if row["torch_graph"] is not None else row["torch_eager"]
    timed = unit in TIME_UNITS
    for engine in ENGINES:
        row[f"ratio_{engine}"] = _ratio(reference, ours.get(engine)) if timed else None
        row[f"ratio_bf16_{engine}"] = _ratio(row["torch_bf16_graph"], ours.get(engine)) if timed else None
    for engine in ENGINES:
        row[f"target_{engine}"] = (targets or {}).get(engine)
        row[f"status_{engine}"] = None
    return row


def _ratio(theirs, ours):
    return theirs / ours if theirs is not None and ours else None


def _in_column(mode: str, value, pure_bf16=None) -> dict:
    """PyTorch's cells holding ``value`` in ``mode``'s column (eager, or a graph's), and PyTorch's pure
    bfloat16 graph's ``pure_bf16`` where it ran."""
    return {"torch_eager" if mode == "eager" else "torch_graph": value, "torch_bf16_graph": pure_bf16}


def _by_engine(sections: dict, *keys) -> dict:
    """{engine: the value at ``keys`` in that engine's results} for the engines that have one."""
    found = {engine: _get(section, *keys) for engine, section in sections.items()}
    return {engine: value for engine, value in found.items() if value is not None}


STEADY_LABEL = "graph, steady state"  # the micro graph rows' steady state (measuring.steady_state)
BF16_SPEED_UP = 1.5  # math bf16 or fp16: each engine's epoch target is PyTorch's captured autocast epoch over this


def training_rows(name: str, sections: dict, torch_results, math: "str | Precision" = FP32) -> list[dict]:
    """Rows of ``name`` (mlp or cnn) from ``sections`` ({engine: its section}), trained in ``math``."""
    rows, precision = [], get_precision(math)
    label = name if precision == FP32 else f"{name} {precision}"
    has_graph = any(section["graph"] is not None for section in sections.values())
    target_mode = "graph" if has_graph else "eager"
    for mode in ("graph", "eager"):
        epochs = _by_engine(sections, mode, "epoch_ms")
        if not epochs:
            continue
        theirs = _get(torch_results, name, mode, "epoch_ms")
        pure = _get(torch_results, name, f"pure_bf16_{mode}")  # a graph's only
        targets = {}
        torch_graph = _get(torch_results, name, "graph", "epoch_ms")
        if mode == target_mode and name in TORCH_SPEED_UPS:
            if mode == "graph" and torch_graph:
                targets = {engine: torch_graph / TORCH_SPEED_UPS[name] for engine in ENGINES}
        elif mode == target_mode and precision == FP32:
            targets = {"fast": TARGETS.get(f"{name}_epoch_ms"),
                       "slides": torch_graph or SLIDES_TARGETS.get(f"{name}_epoch_ms")}
        elif mode == target_mode and precision.half and torch_graph:
            targets = {engine: torch_graph / BF16_SPEED_UP for engine in ENGINES}
        rows.append(_row(f"{label} epoch, {mode}", "ms", epochs, _in_column(mode, theirs, _get(pure, "epoch_ms")),
                         targets))
        rate = _get(torch_results, name, mode, "images_per_second")
        rows.append(_row(f"{label} throughput, {mode}", "img/s", _by_engine(sections, mode, "images_per_second"),
                         _in_column(mode, rate, _get(pure, "images_per_second"))))
        memory = _by_engine(sections, mode, "peak_memory_mib")
        their_memory = _get(torch_results, name, mode, "peak_memory_mib")
        if memory or their_memory is not None:
            rows.append(_row(f"{label} peak memory, {mode}", "MiB", memory,
                             _in_column(mode, their_memory, _get(pure, "peak_memory_mib"))))
    return rows


MICRO_MODES = {"graph": "graph", "graph_steady": STEADY_LABEL, "eager": "eager"}  # in the table's order


def micro_rows(sections: dict, torch_results) -> list[dict]:
    """Each math mode's step as a captured graph, that graph at steady state, and eager; the fast
    engine's target on the graph row where the backend has graphs (else on the eager row): TARGETS,
    and under MICRO_FASTER_THAN_TORCH no slower than PyTorch's step in that mode where it ran."""
    rows = []
    size = next(iter(sections.values()))["size"]
    has_graph = any(_by_engine(sections, math, "graph") for math in MATHS)
    target_mode = "graph" if has_graph else "eager"
    for math in MATHS:
        for mode, label in MICRO_MODES.items():
            steps = _by_engine(sections, math, mode, "step_ms")
            if not steps:
                continue
            theirs = _get(torch_results, "micro", math, mode, "step_ms")
            pure = _get(torch_results, "micro", math, f"pure_bf16_{mode}", "step_ms")  # bf16's graphs only
            targets = {}
            if mode == target_mode:
                target = TARGETS[f"micro_{math}_ms"]
                targets = {"fast": min(target, theirs) if theirs and math in MICRO_FASTER_THAN_TORCH else target}
            rows.append(_row(f"micro {math} step ({size}), {label}", "ms", steps, _in_column(mode, theirs, pure),
                             targets))
    return rows


def original_rows(sections: dict) -> list[dict]:
    rows = []
    names = next(iter(sections.values()))
    for name in names:
        rows.append(_row(f"original {name}, whole process", "s", _by_engine(sections, name, "seconds"),
                         targets={"fast": TARGETS[f"original_{name}_s"]}))
        accuracy = {engine: 100.0 * value for engine, value in _by_engine(sections, name, "test_accuracy").items()}
        rows.append(_row(f"original {name}, test accuracy", "%", accuracy))
    return rows


def judge(rows: list[dict], applicable: bool) -> None:
    """Mark each engine's cell that has a target PASS or MISS, or n/a where the run is not the target's workload."""
    for row in rows:
        for engine in ENGINES:
            target, value = row[f"target_{engine}"], row[engine]
            if target is not None and value is not None:
                row[f"status_{engine}"] = ("PASS" if value <= target else "MISS") if applicable else "n/a"


def table_rows(results: dict, torch_results, settings: dict) -> list[dict]:
    """The table from ``results`` ({engine: {workload: section}})."""
    on_gpu = settings["device"] == "cuda"
    rows = []

    def sections(name: str) -> dict:
        return {engine: found[name] for engine, found in results.items() if name in found}

    for name in TRAINING_CONFIGS:
        if sections(name):
            section_rows = training_rows(name, sections(name), torch_results, settings.get("math", FP32))
            judge(section_rows, on_gpu and settings["limit_images"] is None)
            rows += section_rows
    if sections("micro"):
        section_rows = micro_rows(sections("micro"), torch_results)
        judge(section_rows, on_gpu and settings["micro_size"] == MICRO_SIZE)
        rows += section_rows
    if sections("original"):
        section_rows = original_rows(sections("original"))
        judge(section_rows, on_gpu)
        rows += section_rows
    return rows


def _cell(value, unit: str | None = None) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if unit == "img/s":
        return f"{value:,.0f}"
    if unit == "ratio":
        return f"{value:.2f}x"
    return f"{value:,.2f}" if abs(value) < 1000 else f"{value:,.0f}"


def _target_cell(target) -> str:
    return "-" if target is None else f"<= {target:g}"


def _status_cell(row: dict) -> str:
    statuses = [row[f"status_{engine}"] for engine in ENGINES]
    return "-" if not any(statuses) else "/".join(status or "-" for status in statuses)


def _value_column(heading: str, key: str, unit: str | None = None) -> tuple:
    """(heading, the cell of a row): the row's ``key`` in the row's unit, or in ``unit``."""
    return heading, lambda row: _cell(row[key], unit or row["unit"])


COLUMNS = (
    ("workload", lambda row: row["workload"]), ("unit", lambda row: row["unit"]),
    *(_value_column(engine, engine) for engine in ENGINES),
    _value_column("torch eager", "torch_eager"), _value_column("torch graph", "torch_graph"),
    _value_column("torch bf16 graph", "torch_bf16_graph"),
    *(_value_column(f"torch/{engine}", f"ratio_{engine}", "ratio") for engine in ENGINES),
    *(_value_column(f"torch bf16/{engine}", f"ratio_bf16_{engine}", "ratio") for engine in ENGINES),
    *((f"{engine} target", lambda row, engine=engine: _target_cell(row[f"target_{engine}"])) for engine in ENGINES),
    (f"status ({'/'.join(ENGINES)})", _status_cell),
)
LEFT_ALIGNED = 2  # the workload and unit columns; the others are right-aligned


# PyTorch's pure bfloat16 graph and its ratios: printed only where a row has that graph (--math bf16, the micro's bf16)
PURE_BF16_COLUMNS = ("torch bf16 graph", *(f"torch bf16/{engine}" for engine in ENGINES))


def has_pure_bf16(rows: list[dict]) -> bool:
    return any(row.get("torch_bf16_graph") is not None for row in rows)


def format_table(rows: list[dict], header: str) -> str:
    columns = [column for column in COLUMNS if has_pure_bf16(rows) or column[0] not in PURE_BF16_COLUMNS]
    cells = [tuple(heading for heading, _ in columns)] + [tuple(cell(row) for _, cell in columns) for row in rows]
    widths = [max(len(line[column]) for line in cells) for column in range(len(columns))]
    lines = ["  ".join(text.ljust(width) if column < LEFT_ALIGNED else text.rjust(width)
                       for column, (text, width) in enumerate(zip(line, widths))) for line in cells]
    return "\n".join([header, lines[0], "-" * len(lines[0])] + lines[1:])


def table_header(report: dict) -> str:
    versions_text = ", ".join(f"{key} {value}" for key, value in report["versions"].items())
    device = report["device"] if report["backend"] in report["device"] else f"{report['device']} ({report['backend']})"
    workloads = report.get("settings", {}).get("workloads", ())
    lines = [f"device: {device}; {versions_text}",
             "slides, fast: cudnnnet's engines (cudnnnet.engine); torch/ENGINE: PyTorch's time over that "
             "engine's in the same mode (> 1: cudnnnet is faster); "
             f"targets are for an {TARGET_DEVICE}, the slides engine's graph epochs PyTorch's captured graph"
             + "".join(f"; {name}: PyTorch's captured graph over {factor:g} in both engines"
                       for name, factor in TORCH_SPEED_UPS.items() if name in workloads)
             + (f"; micro {', '.join(MICRO_FASTER_THAN_TORCH)}: the fast engine's limit or PyTorch's step, "
                "the lower" if "micro" in workloads else "")]
    if has_pure_bf16(report.get("table", ())):
        lines.append("torch eager, torch graph: PyTorch in the row's math (bf16 and fp16 under autocast); torch bf16 "
                     "graph: PyTorch's pure bfloat16 (model, input and SGD in bfloat16, the loss in float32 from the "
                     "bfloat16 outputs) as a captured graph; torch bf16/ENGINE: its time over that engine's")
    if any(row["torch_eager"] is not None or row["torch_graph"] is not None for row in _memory_rows(report)):
        lines.append("peak memory: ours the device memory in use (cudaMemGetInfo) above the run's start; PyTorch's "
                     "torch.cuda.max_memory_allocated above the run's start (its allocator's cache not counted)")
    if any(row["workload"].endswith(STEADY_LABEL) for row in report.get("table", ())):
        lines.append(steady_note(report.get("settings", {})))
    if report["backend"] == "cuda" and TARGET_DEVICE not in report["device"]:
        lines.append(f"note: this GPU is not an {TARGET_DEVICE}, so PASS/MISS compares it with another GPU's targets")
    uncompiled = report.get("uncompiled_packages")
    if uncompiled:
        lines.append(f"note: {', '.join(uncompiled)} have no cached bytecode and PYTHONDONTWRITEBYTECODE is set, "
                     "so each whole-process run compiled their source; python -m compileall on them (as pip "
                     "install does) removes that time")
    return "\n".join(lines)


def _memory_rows(report: dict) -> list[dict]:
    return [row for row in report.get("table", ()) if row["unit"] == "MiB"]


def steady_note(settings: dict) -> str:
    seconds = settings.get("steady_seconds", STEADY_SECONDS)
    replays = settings.get("steady_replays", STEADY_REPLAYS)
    return (f"{STEADY_LABEL}: right after the graph row's steps, the graph replayed untimed for {seconds:g} s, then "
            f"{replays} timed replays; the median of the last {steady_last(replays)} (the untimed replays' count: "
            "warmup_replays in --json)")


def build_report(settings: dict) -> dict:
    log.info("benchmarking %s on %s", ", ".join(settings["workloads"]), settings["device"])
    original = measure_original(settings) if "original" in settings["workloads"] else None
    backend = get_backend(settings["device"])
    log.info("device: %s", backend.device_name)
    with generated_data(settings) as with_data:
        results = measure(with_data, backend)
        torch_results = compare_torch(with_data) if settings["compare"] == "torch" else None
    for engine, found in (original or {}).items():
        results[engine]["original"] = found
    found = versions(backend)
    if torch_results is not None:
        found.update(torch=torch_results["version"], torch_cudnn=torch_results["cudnn"])
    report = {"device": backend.device_name, "backend": backend.name,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "versions": found, "settings": settings,
              "targets": {**TARGETS, **{f"{name}_speed_up_over_torch_graph": factor
                                        for name, factor in TORCH_SPEED_UPS.items()}}, "results": results,
              "torch": torch_results, "uncompiled_packages": uncompiled_packages() if original is not None else []}
    report["table"] = table_rows(results, torch_results, settings)
    return report
