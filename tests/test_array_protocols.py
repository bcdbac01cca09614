"""Tensor.__cuda_array_interface__ (version 3) beside DLPack: a CUDA tensor's memory read by PyTorch without
a copy; a host tensor has none (AttributeError, as CuPy's host arrays), so consumers fall back."""

import numpy as np
import pytest

from cudnnnet import Tensor
from cudnnnet.backends.cuda.array_protocols import array_interface
from cudnnnet.errors import DTypeError


def test_a_host_tensor_has_no_cuda_array_interface():
    tensor = Tensor.zeros((2, 3), "host")
    assert not hasattr(tensor, "__cuda_array_interface__")
    with pytest.raises(AttributeError, match="host memory and has no __cuda_array_interface__"):
        tensor.__cuda_array_interface__  # noqa: B018


@pytest.mark.parametrize("dtype, typestr", [("float32", "<f4"), ("float16", "<f2")])
def test_the_interface_describes_c_contiguous_values_at_the_pointer(dtype, typestr):
    assert array_interface(0x7F0000001000, (2, 3, 1, 1), dtype, 0x55) == {
        "shape": (2, 3, 1, 1), "typestr": typestr, "data": (0x7F0000001000, False), "strides": None, "version": 3,
        "stream": 0x55}


def test_the_default_stream_is_written_as_1_never_0():
    assert array_interface(0x1000, (4,), "float32", 0)["stream"] == 1


def test_a_dtype_the_protocol_cannot_name_is_refused_pointing_to_dlpack():
    with pytest.raises(DTypeError, match=r"no typestr for bfloat16 \(it describes float32, float16\); export a "
                                         r"bfloat16 tensor through DLPack"):
        array_interface(0x1000, (4,), "bfloat16", 1)


@pytest.mark.gpu
def test_torch_reads_our_memory_without_a_copy_and_sees_our_writes():
    torch = pytest.importorskip("torch")
    from cudnnnet.backends import cuda_available, get_backend

    if not cuda_available() or not torch.cuda.is_available():
        pytest.skip("needs a usable GPU for cudnnnet and for PyTorch")
    cuda = get_backend("cuda")
    values = np.arange(24, dtype=np.float32).reshape(2, 3, 2, 2)
    ours = Tensor.from_numpy(values, cuda)
    interface = ours.__cuda_array_interface__
    assert interface["version"] == 3 and interface["typestr"] == "<f4" and interface["shape"] == (2, 3, 2, 2)
    theirs = torch.as_tensor(ours, device="cuda")
    assert theirs.data_ptr() == ours.data.ptr and theirs.dtype == torch.float32 and tuple(theirs.shape) == (2, 3, 2, 2)
    np.testing.assert_array_equal(theirs.cpu().numpy(), values)
    ours.write_(values * -2)  # queued on our stream; torch orders its reads after it
    cuda.synchronize()
    np.testing.assert_array_equal(theirs.cpu().numpy(), values * -2)
    theirs.fill_(7.0)  # and ours sees torch's writes: the same memory
    torch.cuda.synchronize()
    np.testing.assert_array_equal(ours.numpy(), np.full_like(values, 7.0))
