"""The gradient average through the peers' mapped memory (backends/cuda/peer_reduce.py): when it is
chosen and what the ranks tell each other (on the host), and its kernels and copies on one GPU, with
the ranks emulated by mailboxes of one device (neither the kernels nor the copies care whose memory a
pointer maps): every rank ends with the same average, summed in rank order, over several steps (both
inbox slots of the push; the one inbox and its acks of the copies) and replays."""

import numpy as np
import pytest

from cudnnnet.backends.cuda import peer_reduce
from cudnnnet.backends.cuda.peer_reduce import (COPY, COPY_MIN_BYTES, PEER_PUSH_MAX_BYTES, PEER_REDUCE_ENV, PUSH,
                                                decode_record, encode_record, inbox_stride, mailbox_bytes, wanted,
                                                why_not_usable, willing)

HANDLE = bytes(range(64))


def test_the_push_is_wanted_where_each_gpu_pushes_little_and_the_copies_where_two_gpus_have_large_gradients():
    assert wanted(2, 1_725_184, "fp32") == PUSH and wanted(4, 1_725_184, "fp32") == PUSH  # the LeNet CNN's
    assert wanted(2, PEER_PUSH_MAX_BYTES, "fp32") == PUSH and wanted(5, PEER_PUSH_MAX_BYTES // 4, "fp32") == PUSH
    assert wanted(3, PEER_PUSH_MAX_BYTES // 2 + 4, "fp32") is None  # pushed twice: NCCL's ring and overlap
    assert wanted(2, PEER_PUSH_MAX_BYTES + 4, "fp32") is None
    assert wanted(2, COPY_MIN_BYTES - 4, "fp32") is None
    assert wanted(2, COPY_MIN_BYTES, "fp32") == COPY and wanted(2, 220_064_768, "fp32") == COPY  # micro's
    assert wanted(3, COPY_MIN_BYTES, "fp32") is None and wanted(4, 220_064_768, "fp32") is None  # sent R - 1 times
    assert wanted(1, 1_725_184, "fp32") is None and wanted(1, COPY_MIN_BYTES, "fp32") is None  # nothing to average
    assert wanted(2, 1_725_184, "bf16") is None and wanted(2, COPY_MIN_BYTES, "bf16") is None  # NCCL in bfloat16
    assert wanted(33, 1024, "fp32") is None and wanted(33, COPY_MIN_BYTES, "fp32") is None  # more ranks than flags


@pytest.mark.parametrize("value, expected", [(None, True), ("1", True), ("0", False), (" 0 ", False)])
def test_cudnnnet_peer_reduce_0_makes_a_rank_unwilling(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(PEER_REDUCE_ENV, raising=False)
    else:
        monkeypatch.setenv(PEER_REDUCE_ENV, value)
    assert willing() is expected


def test_a_record_carries_the_handle_the_host_and_the_willingness():
    record = encode_record(HANDLE, bytes(32 * [7]), True)
    assert len(record) == peer_reduce.RECORD_BYTES
    assert decode_record(record) == (HANDLE, bytes(32 * [7]), True)
    assert decode_record(encode_record(HANDLE, bytes(32), False))[2] is False


def test_the_host_digest_is_stable():
    assert peer_reduce.host_digest() == peer_reduce.host_digest() and len(peer_reduce.host_digest()) == 32


def test_every_rank_willing_on_one_host_is_usable_and_anything_else_says_why():
    here, there = bytes(32 * [1]), bytes(32 * [2])
    assert why_not_usable([encode_record(HANDLE, here, True)] * 3) is None
    unwilling = [encode_record(HANDLE, here, True), encode_record(HANDLE, here, False)]
    assert why_not_usable(unwilling).startswith(f"rank 1 declined ({PEER_REDUCE_ENV}=0")
    assert why_not_usable([encode_record(HANDLE, here, True), encode_record(HANDLE, there, True)]) == \
        "the ranks are on more than one host"


def test_inboxes_are_256_byte_aligned_and_the_mailbox_holds_two_slots_per_rank_to_push_one_to_copy():
    assert inbox_stride(1) == 64 and inbox_stride(64) == 64 and inbox_stride(65) == 128
    assert mailbox_bytes(2, 100) == mailbox_bytes(2, 100, PUSH) == peer_reduce.HEADER_BYTES + 2 * 2 * 128 * 4
    assert mailbox_bytes(3, 100, COPY) == peer_reduce.HEADER_BYTES + 1 * 3 * 128 * 4
    assert peer_reduce.HEADER_BYTES == 2 * peer_reduce.FLAG_BYTES == 8 * 2 * peer_reduce.MAX_RANKS


def _emulated_ranks(cuda, world, count, mode=PUSH):
    from cudnnnet.backends.cuda.buffer import DeviceBuffer
    from cudnnnet.backends.cuda.bindings import runtime

    context = cuda.context
    mailboxes = [DeviceBuffer.allocate(mailbox_bytes(world, count, mode)) for _ in range(world)]
    for mailbox in mailboxes:
        runtime.memset_async(mailbox.ptr, 0, mailbox.nbytes, context.stream.handle)
    return [peer_reduce.PeerReduce(context, rank, world, count, mailboxes[rank], [m.ptr for m in mailboxes], mode=mode)
            for rank in range(world)]


def _expected(values):
    total = np.zeros_like(values[0])
    for value in values:  # in rank order, each sum rounded to float32
        total = (total + value).astype(np.float32)
    return (total * np.float32(1.0 / len(values))).astype(np.float32)


def _one_step(ranks, gradients, count, mode, parts):
    """One step's exchange on every emulated rank: each pushes its gradients, or copies them in ``parts``
    consecutive ranges (as a backward pass's buckets and blocks); then each averages what arrived."""
    bounds = np.linspace(0, count, parts + 1).astype(int)
    for rank, gradient in zip(ranks, gradients):
        if mode == PUSH:
            rank.push(gradient.data.ptr, count)
            continue
        for first, last in zip(bounds[:-1], bounds[1:]):
            rank.copy(gradient.data.ptr, int(first), int(last - first))
    for rank, gradient in zip(ranks, gradients):
        if mode == PUSH:
            rank.combine(gradient.data.ptr, count)
        else:
            rank.average(gradient.data.ptr, count)  # the flags after the copies, then the average


@pytest.mark.gpu
@pytest.mark.parametrize("mode, world, count, parts", [(PUSH, 2, 4096, 1), (PUSH, 3, 1001, 1), (PUSH, 4, 7, 1),
                                                       (COPY, 2, 4096, 3), (COPY, 3, 1001, 1), (COPY, 4, 7, 2)])
def test_every_rank_ends_with_the_rank_order_average_step_after_step(cuda, mode, world, count, parts):
    from cudnnnet.tensor import Tensor

    ranks = _emulated_ranks(cuda, world, count, mode)
    generator = np.random.default_rng(world)
    try:
        for _ in range(3):  # the push's slots 0, 1, 0; the copies' one inbox, written again once acked
            values = [generator.standard_normal(count).astype(np.float32) for _ in range(world)]
            gradients = [Tensor.from_numpy(value, cuda) for value in values]
            _one_step(ranks, gradients, count, mode, parts)
            for gradient in gradients:
                np.testing.assert_array_equal(gradient.numpy().reshape(-1), _expected(values))
    finally:
        cuda.synchronize()
        for rank in ranks:
            rank.close()


@pytest.mark.gpu
@pytest.mark.parametrize("mode, parts", [(PUSH, 1), (COPY, 2)])
def test_a_captured_step_replays_with_the_step_counter_and_acks_on_the_device(cuda, mode, parts):
    from cudnnnet.backends.cuda.handles import CudaGraph
    from cudnnnet.tensor import Tensor

    world, count = 2, 2050
    ranks = _emulated_ranks(cuda, world, count, mode)
    generator = np.random.default_rng(3)
    values = [generator.standard_normal(count).astype(np.float32) for _ in range(world)]
    gradients = [Tensor.from_numpy(value, cuda) for value in values]
    graph = CudaGraph(cuda.context.stream)
    try:
        graph.begin()
        _one_step(ranks, gradients, count, mode, parts)
        graph.end()
        for _ in range(3):  # the first replay averages the values; the next ones average equal values
            graph.launch()
        for gradient in gradients:
            np.testing.assert_array_equal(gradient.numpy().reshape(-1), _expected(values))
    finally:
        cuda.synchronize()
        graph.release()
        for rank in ranks:
            rank.close()


@pytest.mark.gpu
@pytest.mark.parametrize("mode, momentum, weight_decay", [(COPY, 0.9, 5e-4), (COPY, 0.0, 0.0), (PUSH, 0.9, 0.0)])
def test_the_average_can_apply_the_sgd_step_instead_of_storing_it(cuda, mode, momentum, weight_decay):
    """W and v step with the rank-order average (ranges of 343 and 344 floats: single floats around the
    float4s), the same on every rank; each rank's gradients stay its own."""
    from cudnnnet.tensor import Tensor

    world, count, rate = 2, 1030, 0.05
    ranks = _emulated_ranks(cuda, world, count, mode)
    generator = np.random.default_rng(5)
    expected_weights = generator.standard_normal(count).astype(np.float32)
    expected_velocity = np.zeros(count, np.float32)
    weights = [Tensor.from_numpy(expected_weights, cuda) for _ in range(world)]
    velocities = [Tensor.zeros((count,), cuda) if momentum else None for _ in range(world)]
    lr = Tensor.from_numpy(np.array([rate], np.float32), cuda)
    for rank, weight, velocity in zip(ranks, weights, velocities):
        rank.apply_sgd(weight.data.ptr, 0 if velocity is None else velocity.data.ptr, lr.data.ptr, momentum,
                       weight_decay)
    try:
        for _ in range(2):
            values = [generator.standard_normal(count).astype(np.float32) for _ in range(world)]
            gradients = [Tensor.from_numpy(value, cuda) for value in values]
            _one_step(ranks, gradients, count, mode, 3)
            step = _expected(values) + np.float32(weight_decay) * expected_weights
            if momentum:
                expected_velocity = np.float32(momentum) * expected_velocity + step
                step = expected_velocity
            expected_weights = (expected_weights - np.float32(rate) * step).astype(np.float32)
            for gradient, value in zip(gradients, values):
                np.testing.assert_array_equal(gradient.numpy().reshape(-1), value)
            np.testing.assert_array_equal(weights[1].numpy(), weights[0].numpy())
            np.testing.assert_allclose(weights[0].numpy().reshape(-1), expected_weights, rtol=1e-6, atol=1e-7)
            if momentum:
                np.testing.assert_allclose(velocities[0].numpy().reshape(-1), expected_velocity, rtol=1e-6, atol=1e-7)
    finally:
        cuda.synchronize()
        for rank in ranks:
            rank.close()


@pytest.mark.gpu
def test_a_step_with_no_copy_queued_copies_everything_when_it_averages(cuda):
    from cudnnnet.tensor import Tensor

    world, count = 2, 300
    ranks = _emulated_ranks(cuda, world, count, COPY)
    values = [np.random.default_rng(rank).standard_normal(count).astype(np.float32) for rank in range(world)]
    gradients = [Tensor.from_numpy(value, cuda) for value in values]
    try:
        # emulated on one stream, rank 0's average would hold up rank 1's copy queued after it: rank 1 copies
        # first (as a peer on its own GPU may), then rank 0 averages with none queued, then rank 1 averages
        ranks[1].copy(gradients[1].data.ptr, 0, count)
        ranks[0].average(gradients[0].data.ptr, count)
        ranks[1].average(gradients[1].data.ptr, count)
        for gradient in gradients:
            np.testing.assert_array_equal(gradient.numpy().reshape(-1), _expected(values))
        ranks[0].copy(gradients[0].data.ptr, 0, 100)
        with pytest.raises(ValueError, match="100 of 300 gradients were copied"):
            ranks[0].average(gradients[0].data.ptr, count)
    finally:
        cuda.synchronize()
        for rank in ranks:
            rank.close()
