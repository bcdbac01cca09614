"""The precision policy (cudnnnet.precision): its vocabulary, defined once and read by the config,
the command lines, the benchmark and the backends; its facts, which callers act on."""

from __future__ import annotations

import dataclasses

import pytest

from cudnnnet.backends.cuda import backend as cuda_backend
from cudnnnet.backends.cuda import convolution, low_precision, matmul
from cudnnnet.backends.host import backend as host_backend
from cudnnnet.benchmark import settings as benchmark_settings
from cudnnnet.cli import benchmark as benchmark_cli
from cudnnnet.config import load_config, parse_config
from cudnnnet.errors import ConfigError, UsageError
from cudnnnet.precision import (BF16, DEFAULT_PRECISION, FP16, FP32, HALF_PRECISIONS, PRECISION_NAMES, PRECISIONS,
                                TF32, Precision, get_precision)
from run_helpers import REPO_ROOT


def test_the_vocabulary_and_its_facts():
    assert PRECISION_NAMES == ("fp32", "tf32", "bf16", "fp16") and DEFAULT_PRECISION == "fp32"
    assert [precision.operand_dtype for precision in (FP32, TF32, BF16, FP16)] == [None, None, "bfloat16", "float16"]
    assert HALF_PRECISIONS == ("bf16", "fp16") and BF16.half and not TF32.half
    assert [name for name, precision in PRECISIONS.items() if precision.loss_scaling] == ["fp16"]
    assert [name for name, precision in PRECISIONS.items() if precision.tensor_cores] == ["tf32"]
    assert str(BF16) == "bf16" and get_precision("fp16") is FP16 and get_precision(TF32) is TF32


@pytest.mark.parametrize("bad", ["fp8", "FP32", None, ["bf16"]])
def test_an_unknown_precision_is_a_usage_error_naming_the_valid_ones(bad):
    with pytest.raises(UsageError, match=rf"invalid math mode {repr(bad).replace('[', '.')}.*; "
                                         r"valid are fp32, tf32, bf16, fp16"):
        get_precision(bad)


def test_a_precision_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        BF16.loss_scaling = True  # type: ignore[misc]
    assert isinstance(FP32, Precision)


def test_the_config_reads_the_vocabulary():
    raw = load_config(REPO_ROOT / "configs" / "mnist_mlp.yaml").to_dict()
    assert parse_config({**raw, "math": "fp16"}).math == "fp16"
    with pytest.raises(ConfigError, match=r"math: expected one of fp32, tf32, bf16, fp16, got 'fp8'"):
        parse_config({**raw, "math": "fp8"})


def test_the_benchmark_and_the_command_line_read_the_vocabulary():
    assert benchmark_settings.WORKLOAD_MATHS == PRECISION_NAMES
    assert benchmark_settings.HALF_MATHS == HALF_PRECISIONS
    assert benchmark_settings.MATHS == ("fp32", "tf32", "bf16")  # the micro-benchmark: no loss scaling
    math = next(action for action in benchmark_cli.build_parser()._actions if action.dest == "math")
    assert tuple(math.choices) == PRECISION_NAMES and math.default == DEFAULT_PRECISION


def test_the_backends_tables_cover_the_vocabulary_and_nothing_else():
    """Each backend's translation of a mode into its library's constants names modes of the vocabulary."""
    assert tuple(cuda_backend.MATH_MODES) == PRECISION_NAMES
    assert host_backend.SET_MATHS == PRECISION_NAMES and host_backend.MATHS == ("fp32", "bf16", "fp16")
    assert set(low_precision.HALF_FORMATS) == set(HALF_PRECISIONS) == set(convolution.DATA_TYPES)
    assert set(matmul.OPERAND_TYPES) == set(HALF_PRECISIONS) and tuple(matmul.COMPUTE_TYPES) == PRECISION_NAMES
