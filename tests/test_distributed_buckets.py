"""How several GPUs split the packed gradient buffer into buckets reduced during the backward pass, and
when the average of the copies applies the optimiser's step."""

import pytest

from cudnnnet.train.distributed.replicas import gradient_buckets, step_for_average, timed_weight_blocks, weight_blocks
from cudnnnet.optim.optimizers import PACK_ALIGNMENT, SGD, Adam, packed_offsets
from cudnnnet.tensor import Tensor


class Layer:
    def __init__(self, name):
        self.name = name


def _padded(size):
    return -(-size // PACK_ALIGNMENT) * PACK_ALIGNMENT


def test_mnist_cnn_s_dense_gradients_are_reduced_before_its_convolutions_are_computed():
    """conv1, relu, conv2, fc1, fc2: fc2 and fc1 (the big one) close a bucket as soon as fc1's
    backward is queued; the convolutions' gradients form the last bucket, closed at conv1."""
    conv1, relu, conv2, fc1, fc2 = (Layer(name) for name in ("conv1", "relu", "conv2", "fc1", "fc2"))
    sizes = {id(conv1): [500, 20], id(conv2): [25000, 50], id(fc1): [400000, 500], id(fc2): [5000, 10]}
    buckets = gradient_buckets([conv1, relu, conv2, fc1, fc2], sizes, bucket_values=1 << 18)
    convolutions = _padded(500) + _padded(20) + _padded(25000) + _padded(50)
    dense = _padded(400000) + _padded(500) + _padded(5000) + _padded(10)
    assert buckets == {id(fc1): (convolutions, dense), id(conv1): (0, convolutions)}


@pytest.mark.parametrize("bucket_values", [1, 100, 10_000, 1 << 30])
def test_the_buckets_cover_the_buffer_once_each_closed_by_a_layer_whose_gradients_it_holds(bucket_values):
    layers = [Layer(str(index)) for index in range(8)]
    sizes = {id(layers[index]): [size] for index, size in ((0, 10), (2, 3000), (3, 70), (5, 20000), (7, 5))}
    buckets = gradient_buckets(layers, sizes, bucket_values)
    offsets, total = packed_offsets(size for layer in layers for size in sizes.get(id(layer), []))
    spans = sorted(buckets.values())
    assert spans[0][0] == 0 and sum(count for _, count in spans) == total
    assert all(first + count == second for (first, count), (second, _) in zip(spans, spans[1:]))
    owners = [layer for layer in layers if id(layer) in sizes]
    for layer in layers:
        if id(layer) in buckets:
            start, count = buckets[id(layer)]
            assert start == offsets[owners.index(layer)]  # the closing layer's gradients open the bucket
    assert len(buckets) == (1 if bucket_values > total else len(buckets))
    assert id(layers[0]) in buckets  # the first layer with parameters always closes the last bucket


def test_a_large_dense_weight_gradient_opening_its_bucket_is_reduced_in_blocks():
    """The micro step's fc1 (5 000 × 10 000 weights) opens the last bucket: its weight gradient is
    computed and reduced in blocks, the bucket keeps its bias and what follows; fc2's weight gradient,
    also large but not at its bucket's start, and small ones stay whole."""
    fc1, fc2, fc3 = (Layer(name) for name in ("fc1", "fc2", "fc3"))
    buckets = {id(fc1): (0, 50_005_000), id(fc2): (50_005_000, 5_011_010)}
    weights = {id(fc1): (0, 50_000_000), id(fc2): (50_005_064, 5_000_000), id(fc3): (55_010_064, 10_000)}
    left, blocks = weight_blocks(buckets, weights, block_values=1 << 23)
    assert blocks == {id(fc1): 6}
    assert left == {id(fc1): (50_000_000, 5_000), id(fc2): (50_005_000, 5_011_010)}
    assert weight_blocks(buckets, weights, block_values=1 << 30) == (buckets, {})


def test_a_blocked_weight_gradient_alone_in_its_bucket_leaves_it_empty():
    fc = Layer("fc")
    left, blocks = weight_blocks({id(fc): (0, 1000)}, {id(fc): (0, 1000)}, block_values=300)
    assert blocks == {id(fc): 4} and left == {id(fc): (1000, 0)}


def _two_dense_network():
    from cudnnnet.backends import get_backend
    from cudnnnet.layers import MSE, Dense
    from cudnnnet.network import Network

    layers = [Dense("fc1", 300), Dense("fc2", 10), MSE("quadratic")]
    return Network(layers, backend=get_backend("host"), seed=0, input_shape=(40, 1, 1))


@pytest.mark.parametrize("tolerance, expected", [(float("inf"), 5), (0.0, 1)])
def test_a_weight_gradient_takes_the_most_blocks_no_slower_than_its_one_gemm(tolerance, expected):
    """Timed on the layer's shapes: any split fits an infinite tolerance (the most blocks), none fits 0."""
    network = _two_dense_network()
    assert timed_weight_blocks(network, network.layers[0], 16, max_blocks=5, tolerance=tolerance) == expected


@pytest.mark.parametrize("momentum", [0.9, 0.0])
def test_the_average_applies_sgd_s_packed_step_in_the_fast_engine(momentum):
    network = _two_dense_network().set_engine("fast")
    optimizer = SGD(network, lr=0.1, momentum=momentum, weight_decay=0.01)
    values, velocity, lr, applied_momentum, weight_decay = step_for_average(network, optimizer, optimizer.groups[0][0])
    assert values is optimizer.groups[0][0] and lr is optimizer.lr and (applied_momentum, weight_decay) == (momentum, 0.01)
    assert (velocity is None) == (momentum == 0.0)


def test_the_slides_engine_adam_loss_scaling_and_other_values_keep_the_optimiser_s_own_step():
    network = _two_dense_network().set_engine("slides")
    optimizer = SGD(network, lr=0.1, momentum=0.9)
    assert step_for_average(network, optimizer, optimizer.groups[0][0]) is None  # the slides' cuBLAS update
    network.set_engine("fast")
    assert step_for_average(network, Adam(network, lr=0.01), optimizer.groups[0][0]) is None
    assert step_for_average(network, optimizer, Tensor.zeros(optimizer.groups[0][0].shape, network.backend)) is None
    optimizer.loss_scale = Tensor.zeros((4,), network.backend)  # its step may be skipped after the overflow check
    assert step_for_average(network, optimizer, optimizer.groups[0][0]) is None
