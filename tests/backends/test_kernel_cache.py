"""The disk cache of NVRTC cubins, on the host: NVRTC and the driver are replaced by fakes that count
compiles and loads, so these tests need no GPU (the real compile is covered by the gpu tests)."""

from __future__ import annotations

import hashlib
import logging

import pytest

from cudnnnet.backends.cuda import kernel
from cudnnnet.backends.cuda.bindings import nvrtc
from cudnnnet.errors import CudaError
from hostile_files import plant, within

SOURCE = b'extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }'
ARCH = "sm_90"
DAMAGED = b"damaged"


class FakeNvrtc:
    """NVRTC's calls as kernel.py makes them; a "cubin" is an ELF header and a digest of the compile."""

    def __init__(self, monkeypatch):
        self.compiles = 0
        self.version = (13, 0)
        for name in ("create_program", "compile_program", "get_program_log_size", "get_program_log",
                     "get_cubin_size", "get_cubin", "destroy_program"):
            monkeypatch.setattr(nvrtc, name, getattr(self, name))
        monkeypatch.setattr(nvrtc, "version", lambda: self.version)

    def create_program(self, source: bytes, name: bytes):
        return {"source": source, "name": name}

    def compile_program(self, program, options: list[bytes]) -> None:
        self.compiles += 1
        digest = hashlib.sha256(program["source"] + b"".join(options) + repr(self.version).encode()).digest()
        program["cubin"] = kernel.ELF_MAGIC + digest

    def get_program_log_size(self, program) -> int:
        return 0

    def get_program_log(self, program, size: int) -> bytes:
        return b""

    def get_cubin_size(self, program) -> int:
        return len(program["cubin"])

    def get_cubin(self, program, size: int) -> bytes:
        return program["cubin"][:size]

    def destroy_program(self, program) -> None:
        program.clear()


class FakeModule:
    """KernelModule standing in for cuModuleLoadData: refuses a cubin holding DAMAGED, as the driver would."""

    loaded: list = []

    def __init__(self, cubin: bytes):
        if DAMAGED in cubin:
            raise CudaError("cuModuleLoadData", 200, "CUDA_ERROR_INVALID_IMAGE")
        FakeModule.loaded.append(cubin)


@pytest.fixture(autouse=True)
def fresh_process(tmp_path, monkeypatch):
    """An empty cache in tmp_path, the disk cache on, and nothing compiled in this "process"."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.delenv(kernel.NO_CACHE_ENV, raising=False)
    kernel.compile_cubin.cache_clear()
    yield
    kernel.compile_cubin.cache_clear()


@pytest.fixture
def fake_nvrtc(monkeypatch) -> FakeNvrtc:
    return FakeNvrtc(monkeypatch)


@pytest.fixture
def cache_dir(tmp_path):
    return tmp_path / "xdg-cache" / "cudnnnet" / "kernels"


def new_process() -> None:
    kernel.compile_cubin.cache_clear()


def test_a_new_process_reads_the_cubin_instead_of_compiling(fake_nvrtc, cache_dir):
    first = kernel.compile_cubin(SOURCE, "twice.cu", ARCH)
    assert kernel.compile_cubin(SOURCE, "twice.cu", ARCH) == first and fake_nvrtc.compiles == 1  # per process
    (cached,) = cache_dir.iterdir()
    assert cached.suffix == ".cubin" and len(cached.stem) == 64 and cached.read_bytes() == first
    new_process()
    assert kernel.compile_cubin(SOURCE, "twice.cu", ARCH) == first
    assert fake_nvrtc.compiles == 1


@pytest.mark.parametrize("change", ["source", "name", "arch", "nvrtc version"])
def test_anything_that_shapes_the_cubin_gives_another_file(fake_nvrtc, cache_dir, change):
    kernel.compile_cubin(SOURCE, "twice.cu", ARCH)
    new_process()
    source, name, arch = SOURCE, "twice.cu", ARCH
    if change == "source":
        source = SOURCE.replace(b"2.0f", b"3.0f")
    elif change == "name":
        name = "thrice.cu"
    elif change == "arch":
        arch = "sm_80"
    else:
        fake_nvrtc.version = (13, 1)
    kernel.compile_cubin(source, name, arch)
    assert fake_nvrtc.compiles == 2 and len(list(cache_dir.iterdir())) == 2


def test_a_header_is_compiled_in_its_includes_place_and_a_changed_header_compiles_again(fake_nvrtc, cache_dir,
                                                                                        tmp_path, monkeypatch):
    monkeypatch.setattr(kernel, "KERNEL_DIR", tmp_path)
    (tmp_path / "scale.cuh").write_text("#define SCALE 2.0f\n")
    (tmp_path / "twice.cu").write_text('#include "scale.cuh"  // SCALE\n' + SOURCE.decode().replace("2.0f", "SCALE"))
    source = kernel.kernel_source("twice.cu")
    assert source.startswith(b"#define SCALE 2.0f\n\nextern") and b"#include" not in source
    kernel.compile_cubin(source, "twice.cu", ARCH)
    new_process()
    (tmp_path / "scale.cuh").write_text("#define SCALE 3.0f\n")
    kernel.compile_cubin(kernel.kernel_source("twice.cu"), "twice.cu", ARCH)
    assert fake_nvrtc.compiles == 2 and len(list(cache_dir.iterdir())) == 2


def test_every_shipped_kernel_source_is_whole_once_its_headers_are_in():
    for path in kernel.KERNEL_DIR.glob("*.cu"):
        source = kernel.kernel_source(path.name)
        assert not [line for line in source.splitlines() if line.startswith(b"#include")], path.name
        assert source.count(b"bf16_bits(float value) {") <= 1, path.name


@pytest.mark.parametrize("content", [b"", b"\x00" * 64, b"not a cubin at all"])
def test_an_empty_or_foreign_cache_file_is_compiled_again_and_rewritten(fake_nvrtc, cache_dir, content):
    cubin = kernel.compile_cubin(SOURCE, "twice.cu", ARCH)
    (cached,) = cache_dir.iterdir()
    cached.write_bytes(content)
    new_process()
    assert kernel.compile_cubin(SOURCE, "twice.cu", ARCH) == cubin and fake_nvrtc.compiles == 2
    assert cached.read_bytes() == cubin


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_device_planted_as_the_cubin_is_compiled_again_promptly_and_replaced(fake_nvrtc, kind, caplog):
    path = kernel.cached_cubin_path(SOURCE, "twice.cu", ARCH)
    plant(path, kind)
    caplog.set_level(logging.DEBUG, logger=kernel.__name__)
    with within(5):
        cubin = kernel.compile_cubin(SOURCE, "twice.cu", ARCH)
    assert fake_nvrtc.compiles == 1 and "not a regular file" in caplog.text
    assert path.is_file() and not path.is_symlink() and path.read_bytes() == cubin
    new_process()
    assert kernel.compile_cubin(SOURCE, "twice.cu", ARCH) == cubin and fake_nvrtc.compiles == 1


def test_an_unreadable_cache_file_and_an_unwritable_cache_only_log(fake_nvrtc, cache_dir, caplog):
    path = kernel.cached_cubin_path(SOURCE, "twice.cu", ARCH)
    path.mkdir(parents=True)  # a directory where the file should be: it can be neither read nor replaced
    caplog.set_level(logging.DEBUG, logger=kernel.__name__)
    for _ in range(2):
        new_process()
        assert kernel.compile_cubin(SOURCE, "twice.cu", ARCH).startswith(kernel.ELF_MAGIC)
    assert fake_nvrtc.compiles == 2 and path.is_dir()
    messages = [record.getMessage() for record in caplog.records]
    assert any("ignoring the unreadable cached cubin" in message for message in messages)
    assert any("not caching the cubin" in message for message in messages)
    assert all(record.levelno == logging.DEBUG for record in caplog.records)


def test_a_cache_directory_that_cannot_be_created_is_skipped(fake_nvrtc, tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file"))
    assert kernel.compile_cubin(SOURCE, "twice.cu", ARCH).startswith(kernel.ELF_MAGIC)


def test_the_no_cache_variable_turns_the_disk_cache_off(fake_nvrtc, cache_dir, monkeypatch):
    kernel.compile_cubin(SOURCE, "twice.cu", ARCH)
    monkeypatch.setenv(kernel.NO_CACHE_ENV, "1")
    new_process()
    kernel.compile_cubin(SOURCE, "twice.cu", ARCH)
    assert fake_nvrtc.compiles == 2  # the file was there, and not read
    monkeypatch.setattr(kernel, "kernel_cache_dir", lambda: pytest.fail("the cache directory was looked up"))
    new_process()
    kernel.compile_cubin(b"// another source", "other.cu", ARCH)


@pytest.fixture
def fake_modules(monkeypatch) -> list:
    FakeModule.loaded = []
    monkeypatch.setattr(kernel, "KernelModule", FakeModule)
    return FakeModule.loaded


def test_a_cached_cubin_the_driver_refuses_is_compiled_again(fake_nvrtc, fake_modules):
    kernel.load_module("loss.cu", ARCH)
    path = kernel.cached_cubin_path((kernel.KERNEL_DIR / "loss.cu").read_bytes(), "loss.cu", ARCH)
    good = path.read_bytes()
    path.write_bytes(good[:8] + DAMAGED)  # an ELF header, then garbage
    new_process()
    kernel.load_module("loss.cu", ARCH)
    assert fake_nvrtc.compiles == 2 and fake_modules == [good, good]
    assert path.read_bytes() == good
    new_process()
    kernel.load_module("loss.cu", ARCH)
    assert fake_nvrtc.compiles == 2  # the rewritten file is used


def test_a_fresh_cubin_the_driver_refuses_is_an_error(fake_nvrtc, fake_modules, monkeypatch):
    compile_program = fake_nvrtc.compile_program

    def compile_damaged(program, options):
        compile_program(program, options)
        program["cubin"] += DAMAGED

    monkeypatch.setattr(nvrtc, "compile_program", compile_damaged)
    with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_IMAGE"):
        kernel.load_module("loss.cu", ARCH)
    assert fake_nvrtc.compiles == 2  # compiled again once, in case the cache was at fault
    monkeypatch.setenv(kernel.NO_CACHE_ENV, "1")
    new_process()
    with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_IMAGE"):
        kernel.load_module("loss.cu", ARCH)
    assert fake_nvrtc.compiles == 3  # no cache to blame: no second compile
