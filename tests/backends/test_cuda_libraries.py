"""The CUDA extra's libraries on any machine, GPU or not: cuda-bindings, NVRTC, cuBLAS(Lt) and cuDNN
are found and loaded as the backend loads them, their versions answer, cuDNN descriptors are made,
and every kernel in kernels/*.cu compiles with NVRTC for the architectures the extras promise,
compiled as the package compiles it (``kernel_cubin``: its headers inlined by ``kernel_source``).

Runs where an extra (``.[cuda12]`` or ``.[cuda13]``) is installed, skips elsewhere; none of it needs
a driver or a GPU. The compile tests need only cuda-bindings and the NVRTC wheel (what CI installs
to run them: .ci/run). CUDA 13's NVRTC no longer compiles for GPUs older than sm_75 (V100 is sm_70):
those need the cuda12 extra, and the test checks both sides of that.
"""

import importlib.util

import pytest

from cudnnnet.backends.descriptors import (ActivationDescriptor, ActivationMode, ConvolutionDescriptor,
                                           PoolingDescriptor, PoolingMode)
from cudnnnet.backends.cuda.kernel import KERNEL_DIR
from cudnnnet.errors import DeviceUnavailableError, NvrtcError

KERNEL_FILES = sorted(path.name for path in KERNEL_DIR.glob("*.cu"))
ARCHITECTURES = ("sm_80", "sm_90")  # A100, H100
OLDEST_CUDA13_ARCH = 75  # CUDA 13 dropped sm_50 to sm_72 (V100 is sm_70)
VOLTA = "sm_70"


@pytest.fixture(scope="module")
def nvrtc_major() -> int:
    """The CUDA major version of the installed cuda-bindings, with NVRTC loaded as the backend loads it."""
    if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.bindings") is None:
        pytest.skip("cuda-bindings is not installed (the CUDA extras: pip install -e \".[cuda13]\" or \".[cuda12]\")")
    from cudnnnet.backends.cuda.bindings import nvrtc, runtime

    runtime.load()
    major = runtime.runtime_get_version() // 1000  # cudaRuntimeGetVersion answers without a driver
    try:
        nvrtc.load(major)
    except DeviceUnavailableError as error:
        pytest.skip(f"NVRTC {major} is not installed: {error}")
    return major


@pytest.fixture(scope="module")
def cuda_major(nvrtc_major) -> int:
    """The CUDA major version of the installed extra, its libraries loaded as the backend loads them."""
    from cudnnnet.backends.cuda import context

    try:
        context._load_libraries(nvrtc_major)
    except DeviceUnavailableError as error:
        pytest.skip(f"the CUDA {nvrtc_major} libraries are not all installed: {error}")
    return nvrtc_major


def test_versions_answer_and_match_the_extra(cuda_major):
    from cudnnnet.backends.cuda.bindings import cublaslt, cudnn, nvrtc

    assert cuda_major in (12, 13)
    assert nvrtc.version()[0] == cuda_major
    assert cublaslt.get_version() // 10_000 == cuda_major  # CUBLAS_VERSION: major·10000 + minor·100 + patch
    assert cudnn.get_version() // 10_000 == 9  # cuDNN 9: the loader opens libcudnn.so.9


def test_cudnn_descriptors_are_made_without_a_gpu(cuda_major):
    from cudnnnet.backends.cuda.descriptors import (ActivationDescriptorHandle, ConvolutionDescriptorHandle,
                                                    FilterDescriptor, PoolingDescriptorHandle, TensorDescriptor)
    from cudnnnet.backends.cuda.bindings import cudnn

    descriptors = [TensorDescriptor((32, 20, 24, 24)), FilterDescriptor((50, 20, 5, 5)),
                   ConvolutionDescriptorHandle(ConvolutionDescriptor(50, 20, 5), cudnn.DEFAULT_MATH),
                   PoolingDescriptorHandle(PoolingDescriptor(PoolingMode.MAX, 2, 0, 2)),
                   ActivationDescriptorHandle(ActivationDescriptor(ActivationMode.RELU))]
    assert all(descriptor.handle for descriptor in descriptors)
    for descriptor in descriptors:
        descriptor.close()


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("filename", KERNEL_FILES)
def test_every_kernel_compiles(nvrtc_major, filename, arch, monkeypatch):
    from cudnnnet.backends.cuda import kernel

    monkeypatch.setenv(kernel.NO_CACHE_ENV, "1")  # compile, never read a cached cubin
    kernel.compile_cubin.cache_clear()
    assert kernel.kernel_cubin(filename, arch).startswith(kernel.ELF_MAGIC)


def test_volta_needs_the_cuda12_extra(nvrtc_major, monkeypatch):
    from cudnnnet.backends.cuda import kernel

    monkeypatch.setenv(kernel.NO_CACHE_ENV, "1")
    kernel.compile_cubin.cache_clear()
    if nvrtc_major == 12:
        assert kernel.kernel_cubin("sgd.cu", VOLTA).startswith(kernel.ELF_MAGIC)
    else:
        with pytest.raises(NvrtcError, match="nvrtcCompileProgram"):
            kernel.kernel_cubin("sgd.cu", VOLTA)
