"""The NCCL binding against the installed library (nvidia-nccl-cu12/-cu13): its symbols bind, the calls
that need no GPU work, and a failing call raises NcclError naming it. Skips where NCCL is not installed."""

import pytest

from cudnnnet.errors import DeviceUnavailableError, NcclError


@pytest.fixture(scope="module")
def nccl():
    from cudnnnet.backends.cuda.bindings import nccl
    from cudnnnet.backends.cuda.communicator import load_nccl

    try:
        load_nccl()
    except DeviceUnavailableError as error:
        pytest.skip(f"NCCL is not installed: {error}")
    return nccl


def test_the_library_binds_and_names_its_version(nccl):
    version = nccl.get_version()
    assert version >= 21000  # ncclAvg, the average the gradients use, needs NCCL 2.10


def test_a_unique_id_is_made_without_a_gpu(nccl):
    first, second = nccl.get_unique_id(), nccl.get_unique_id()
    assert len(first) == nccl.UNIQUE_ID_BYTES and first != second


def test_a_failing_call_raises_ncclerror_naming_it(nccl):
    with pytest.raises(NcclError, match="ncclCommInitRank failed with nccl") as raised:
        nccl.comm_init_rank(2, bytes(nccl.UNIQUE_ID_BYTES), 5)  # rank 5 of 2
    assert raised.value.function == "ncclCommInitRank" and raised.value.status != 0


def test_a_unique_id_of_the_wrong_size_is_refused(nccl):
    with pytest.raises(ValueError, match="128 bytes, got 3"):
        nccl.comm_init_rank(1, b"abc", 0)
