"""Our own CUDA kernels: ``kernels/*.cu`` compiled with NVRTC for the device's architecture,
loaded with the driver API and launched on the context stream.

Compiled cubins are kept per process and on disk (``kernel_cache_dir()``), in files named by the
SHA-256 of everything that shapes the result: the source, its name, the architecture, the
compile options and the NVRTC version. ``CUDNNNET_NO_CACHE=1`` turns the disk cache off. The
disk cache never fails a compile: a file that cannot be read, or a cubin the driver refuses, is
compiled again and rewritten; a cache directory that cannot be written is left alone (``cache.py``).
"""

from __future__ import annotations

import collections
import ctypes
import functools
import hashlib
import logging
import re
from ctypes import c_float, c_int, c_longlong, c_ulonglong, c_void_p
from pathlib import Path

from ...errors import CudaError, NvrtcError
from ...io import cache
from .bindings import nvrtc, runtime
from .handles import Owned

log = logging.getLogger(__name__)

KERNEL_DIR = Path(__file__).with_name("kernels")
BLOCK_SIZE = 256  # threads per block; the kernels' shared-memory reductions are sized by it
MAX_BLOCKS = 1024  # grid-stride loops cover the rest
MAX_ELEMENTWISE_BLOCKS = 65535  # elementwise kernels: one float4 per thread up to 16.7 M float4s, then grid-stride
NO_CACHE_ENV = cache.NO_CACHE_ENV
ELF_MAGIC = b"\x7fELF"  # every cubin is an ELF file

# kernel name: (source file, argument types in order)
KERNELS = {
    "cross_entropy_loss": ("loss.cu", (c_void_p, c_void_p, c_void_p, c_longlong, c_float)),
    "squared_error_loss": ("loss.cu", (c_void_p, c_void_p, c_void_p, c_longlong, c_float)),
    "accuracy_count": ("loss.cu", (c_void_p, c_void_p, c_void_p, c_longlong, c_int)),
    "sgd_update": ("sgd.cu", (c_void_p, c_void_p, c_void_p, c_void_p, c_float, c_float, c_float, c_longlong)),
    "sgd_update_x4": ("sgd.cu", (c_void_p, c_void_p, c_void_p, c_void_p, c_float, c_float, c_float, c_longlong)),
    "gather_batch": ("data.cu", (c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_longlong,
                                 c_longlong, c_int)),
    "gather_augmented_batch": ("data.cu", (c_void_p,) * 7 + (c_longlong, c_int, c_int, c_int, c_int, c_int, c_int,
                                                                c_ulonglong)),
    "record_nonfinite": ("nonfinite.cu", (c_void_p, c_void_p)),
    "pixels_to_images": ("data.cu", (c_void_p, c_void_p, c_longlong, c_int, c_int, c_int, c_float, c_float)),
    "cross_entropy_backward": ("cross_entropy_backward.cu",
                               (c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_longlong, c_int, c_float)),
    "softmax_cross_entropy_backward": ("cross_entropy_backward.cu", (c_void_p, c_void_p, c_void_p, c_void_p, c_void_p,
                                                                      c_void_p, c_longlong, c_int, c_float, c_float)),
    "sgd_update_many": ("sgd_update_many.cu", (c_void_p, c_int, c_longlong, c_void_p, c_float, c_float, c_float,
                                               c_void_p)),
    "im2col": ("convolution.cu", (c_void_p, c_void_p) + (c_int,) * 11),
    "im2col_half": ("convolution.cu", (c_void_p, c_void_p) + (c_int,) * 12),
    "flip_filter": ("convolution.cu", (c_void_p, c_void_p, c_int, c_int, c_int)),
    "flip_filter_half": ("convolution.cu", (c_void_p, c_void_p, c_int, c_int, c_int)),
    "col2im": ("convolution.cu", (c_void_p, c_void_p, c_float, c_float) + (c_int,) * 11),
    "round_result": ("convolution.cu", (c_void_p, c_void_p, c_float, c_float, c_int, c_longlong)),
    "bias_activation_forward": ("bias_activation.cu", (c_void_p, c_void_p, c_int, c_int, c_int, c_int, c_float,
                                                       c_void_p)),
    "bias_activation_forward_dense4": ("bias_activation.cu", (c_void_p, c_void_p, c_int, c_int, c_int, c_float,
                                                              c_void_p)),
    "max_pooling_backward": ("pooling.cu", (c_void_p, c_void_p, c_void_p, c_float, c_float) + (c_int,) * 7),
    "channel_sum": ("channel_sum.cu", (c_void_p, c_void_p, c_void_p, c_void_p, c_float, c_float) + (c_int,) * 5),
    "spin": ("timing.cu", (c_longlong,)),
    "activation_backward": ("activation.cu", (c_void_p,) * 4 + (c_int, c_float, c_float, c_float, c_longlong,
                                                                c_void_p)),
    "activation_backward_x4": ("activation.cu", (c_void_p,) * 4 + (c_int, c_float, c_float, c_float, c_longlong,
                                                                   c_void_p)),
    "activation_bias_backward": ("activation.cu", (c_void_p,) * 3 + (c_int, c_float, c_int, c_int, c_int, c_void_p,
                                                                     c_void_p)),
    "activation_bias_backward_x4": ("activation.cu", (c_void_p,) * 3 + (c_int, c_float, c_int, c_int, c_int,
                                                                        c_void_p, c_void_p)),
    "activation_bias_sums": ("activation.cu", (c_void_p, c_void_p, c_int, c_int)),
    # a 16-bit multilayer perceptron's activations (issue 29): format 1 bfloat16, 2 IEEE half
    "bias_activation_forward16": ("bias_activation.cu", (c_void_p, c_void_p, c_int, c_int, c_int, c_int, c_float,
                                                         c_int)),
    "activation_backward16": ("activation.cu", (c_void_p,) * 4 + (c_int, c_float, c_float, c_float, c_longlong,
                                                                  c_int)),
    "activation_bias_backward16": ("activation.cu", (c_void_p,) * 3 + (c_int, c_float, c_int, c_int, c_int,
                                                                       c_void_p, c_int)),
    "bias_activation_forward16_dense8": ("bias_activation.cu", (c_void_p, c_void_p, c_longlong, c_int, c_int, c_float,
                                                                c_int)),
    "bias_activation_forward16_spatial8": ("bias_activation.cu", (c_void_p, c_void_p, c_longlong, c_int, c_int, c_int,
                                                                  c_float, c_int)),
    "activation_bias_backward16_x8": ("activation.cu", (c_void_p,) * 3 + (c_int, c_float, c_int, c_int, c_int,
                                                                          c_void_p, c_int)),
    "bias_activation_to_half": ("bias_activation.cu", (c_void_p,) * 3 + (c_int,) * 4 + (c_float, c_int)),
    "softmax_cross_entropy_backward16": ("cross_entropy_backward.cu", (c_void_p,) * 6 + (c_longlong, c_int, c_float,
                                                                                         c_float, c_int)),
    # a 16-bit convolutional network's activations (issue 29)
    "im2col_half16": ("convolution.cu", (c_void_p, c_void_p) + (c_int,) * 12),
    "round_result16": ("convolution.cu", (c_void_p, c_void_p, c_int, c_longlong)),
    "col2im16": ("convolution.cu", (c_void_p, c_void_p) + (c_int,) * 11),
    "max_pooling_backward16": ("pooling.cu", (c_void_p, c_void_p, c_void_p, c_float, c_float) + (c_int,) * 8),
    "channel_sum16": ("channel_sum.cu", (c_void_p, c_void_p, c_void_p, c_void_p, c_float, c_float) + (c_int,) * 6),
    "batch_norm_sums16": ("batch_norm.cu", (c_void_p, c_void_p) + (c_int,) * 6),
    "batch_norm_forward_apply16": ("batch_norm.cu", (c_void_p, c_void_p, c_void_p, c_int) + (c_void_p,) * 7
                                   + (c_float, c_float) + (c_int,) * 7),
    "batch_norm_gradient_sums16": ("batch_norm.cu", (c_void_p,) * 7 + (c_int,) * 7),
    "batch_norm_backward_apply16": ("batch_norm.cu", (c_void_p,) * 4 + (c_int,) + (c_void_p,) * 7 + (c_int,) * 7),
    # layers, optimisers and the bf16 math of issue 18
    "to_bf16": ("bf16.cu", (c_void_p, c_void_p, c_longlong)),
    "to_bf16_x4": ("bf16.cu", (c_void_p, c_void_p, c_longlong)),
    "bf16_to_float": ("bf16.cu", (c_void_p, c_void_p, c_float, c_float, c_longlong)),
    "batch_norm_sums": ("batch_norm.cu", (c_void_p, c_void_p) + (c_int,) * 5),
    "batch_norm_forward_apply": ("batch_norm.cu", (c_void_p, c_void_p, c_void_p, c_int) + (c_void_p,) * 7
                                 + (c_float, c_float) + (c_int,) * 6),
    "batch_norm_gradient_sums": ("batch_norm.cu", (c_void_p,) * 7 + (c_int,) * 6),
    "batch_norm_backward_apply": ("batch_norm.cu", (c_void_p,) * 4 + (c_int,) + (c_void_p,) * 7 + (c_int,) * 6),
    "batch_norm_totals": ("batch_norm.cu", (c_void_p, c_void_p, c_int, c_int, c_longlong, c_void_p, c_void_p,
                                            c_void_p)),
    "adam_update_many": ("adam_update_many.cu", (c_void_p, c_int, c_longlong, c_void_p, c_float, c_void_p, c_float,
                                                 c_float, c_float, c_float, c_int, c_void_p)),
    # the gradient average between the GPUs of one host (peer_reduce.py)
    "peer_push": ("peer_reduce.cu", (c_void_p, c_longlong, c_longlong, c_void_p, c_int, c_int, c_void_p)),
    "peer_average": ("peer_reduce.cu", (c_void_p, c_longlong, c_longlong, c_longlong, c_void_p, c_int, c_int, c_int,
                                        c_float, c_void_p, c_ulonglong, c_ulonglong, c_int, c_void_p)),
    "peer_wait_acks": ("peer_reduce.cu", (c_void_p, c_int, c_int, c_void_p)),
    "peer_signal": ("peer_reduce.cu", (c_void_p, c_int, c_int, c_void_p, c_ulonglong, c_ulonglong)),
    # math fp16 and its dynamic loss scaling
    "to_fp16": ("fp16.cu", (c_void_p, c_void_p, c_longlong)),
    "to_fp16_x4": ("fp16.cu", (c_void_p, c_void_p, c_longlong)),
    "fp16_to_float": ("fp16.cu", (c_void_p, c_void_p, c_float, c_float, c_longlong)),
    "find_nonfinite_gradients": ("loss_scale.cu", (c_void_p, c_longlong, c_void_p)),
    "update_loss_scale": ("loss_scale.cu", (c_void_p, c_float, c_float, c_float)),
    "sgd_scaled_coefficients": ("loss_scale.cu", (c_void_p, c_void_p, c_float, c_void_p, c_float, c_float)),
}

# Launches of our kernels by kernel name (as ``bindings.calls`` counts library calls), so that a
# test can prove how many launches a fused call takes.
launches: collections.Counter = collections.Counter()


def reset_launches() -> None:
    """Forget every launch counted so far."""
    launches.clear()


def blocks_for(count: int) -> int:
    """Blocks of BLOCK_SIZE threads for ``count`` items (at least 1, at most MAX_BLOCKS)."""
    return max(1, min(MAX_BLOCKS, -(-count // BLOCK_SIZE)))


def compile_options(arch: str) -> list[bytes]:
    return [f"--gpu-architecture={arch}".encode(), b"-default-device", b"--std=c++17", f"-DBLOCK_SIZE={BLOCK_SIZE}".encode()]


@functools.lru_cache(maxsize=None)
def compile_cubin(source: bytes, name: str, arch: str) -> bytes:
    """NVRTC: ``source`` → cubin for ``arch`` (e.g. "sm_90"), from the disk cache when it holds this
    very compile. NvrtcError carries the compile log."""
    path = cached_cubin_path(source, name, arch)
    cubin = _read_cubin(path) if path else None
    if cubin is None:
        cubin = _compile(source, name, arch)
        if path:
            _write_cubin(path, cubin)
    return cubin


def _compile(source: bytes, name: str, arch: str) -> bytes:
    program = nvrtc.create_program(source, name.encode())
    try:
        try:
            nvrtc.compile_program(program, compile_options(arch))
        except NvrtcError as error:
            raise NvrtcError(error.function, error.status, error.status_name, f"{name}:\n{program_log(program)}") from None
        warnings = program_log(program)
        if warnings:
            log.debug("NVRTC log for %s:\n%s", name, warnings)
        return nvrtc.get_cubin(program, nvrtc.get_cubin_size(program))
    finally:
        nvrtc.destroy_program(program)


# ---- the disk cache of cubins --------------------------------------------------------------


def kernel_cache_dir() -> Path:
    """$XDG_CACHE_HOME/cudnnnet/kernels, else ~/.cache/cudnnnet/kernels."""
    return cache.cache_root() / "kernels"


def cached_cubin_path(source: bytes, name: str, arch: str) -> Path | None:
    """The cache file of this compile, or None when the disk cache is turned off."""
    if cache.cache_off():
        return None
    digest = hashlib.sha256()
    for part in (source, name.encode(), arch.encode(), *compile_options(arch), repr(nvrtc.version()).encode()):
        digest.update(len(part).to_bytes(8, "little") + part)  # length-prefixed: no two inputs run together
    return cache.entry_path(kernel_cache_dir, f"{digest.hexdigest()}.cubin")


def _read_cubin(path: Path) -> bytes | None:
    cubin = cache.read_entry(lambda: cache.read_bytes(path), path, "cubin", log)
    if cubin is None:
        return None
    if not cubin.startswith(ELF_MAGIC):
        log.debug("the cached file %s is not a cubin (%d bytes, no ELF header): compiling", path, len(cubin))
        return None
    log.debug("cubin from %s", path)
    return cubin


def _write_cubin(path: Path, cubin: bytes) -> None:
    cache.store_entry({path: lambda file: file.write(cubin)}, "the cubin", log)


def program_log(program) -> str:
    text = nvrtc.get_program_log(program, nvrtc.get_program_log_size(program))
    return text.rstrip(b"\0").decode(errors="replace").strip()


class KernelModule(Owned):
    """A cubin loaded into the current context (cuModuleLoadData / cuModuleUnload)."""

    __slots__ = ()

    def __init__(self, cubin: bytes):
        image = ctypes.c_char_p(cubin)  # points at the bytes object's buffer while `cubin` lives
        super().__init__(runtime.module_load_data(ctypes.cast(image, c_void_p).value), runtime.module_unload)

    def function(self, name: str):
        return runtime.module_get_function(self.handle, name.encode())


class Kernel:
    """One ``__global__`` function with argument slots reused by every launch: a launch writes the
    values into the slots and passes the fixed void*[] of their addresses to cuLaunchKernel."""

    __slots__ = ("name", "function", "module", "_slots", "_pointers", "_params")

    def __init__(self, module: KernelModule, name: str, argtypes: tuple):
        self.name = name
        self.module = module  # keeps the module loaded while the kernel lives
        self.function = module.function(name)
        self._slots = tuple(argtype() for argtype in argtypes)
        self._pointers = (c_void_p * len(argtypes))(*(ctypes.addressof(slot) for slot in self._slots))
        self._params = ctypes.addressof(self._pointers)

    def launch(self, blocks: int, stream, *args) -> None:
        """<<<blocks, BLOCK_SIZE, 0, stream>>>(*args)."""
        for slot, value in zip(self._slots, args, strict=True):
            slot.value = value
        launches[self.name] += 1
        runtime.launch_kernel(self.function, (blocks, 1, 1), (BLOCK_SIZE, 1, 1), 0, stream, self._params)


INCLUDE = re.compile(rb'^#include "([A-Za-z0-9_]+[.]cuh)"[^\n]*$', re.MULTILINE)


def kernel_source(filename: str) -> bytes:
    """``kernels/filename`` with each ``#include "NAME.cuh"`` line replaced by kernels/NAME.cuh's text:
    what NVRTC compiles and what names the cached cubin, so a changed header compiles every file again."""
    source = (KERNEL_DIR / filename).read_bytes()
    return INCLUDE.sub(lambda match: (KERNEL_DIR / match.group(1).decode()).read_bytes(), source)


def kernel_cubin(filename: str, arch: str) -> bytes:
    """The cubin of ``kernels/filename`` for ``arch``, compiled from ``kernel_source`` (once per
    process, or taken from the disk cache): what ``load_module`` loads."""
    return compile_cubin(kernel_source(filename), filename, arch)


def load_module(filename: str, arch: str) -> KernelModule:
    """Compile (once per process, or take from the disk cache) and load ``kernels/filename``.

    A cached cubin that the driver refuses (a damaged file) is compiled again, rewritten and loaded
    (once: a fresh cubin that is refused too raises the CudaError).
    """
    try:
        return KernelModule(kernel_cubin(filename, arch))
    except CudaError as error:
        source = kernel_source(filename)
        path = cached_cubin_path(source, filename, arch)
        if path is None or not path.is_file():
            raise
        log.debug("the driver refused the cached cubin %s (%s): compiling it again", path, error)
        compile_cubin.cache_clear()  # forget the refused cubin
        cubin = _compile(source, filename, arch)
        _write_cubin(path, cubin)
        return KernelModule(cubin)
