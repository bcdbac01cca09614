"""How several GPUs split the packed gradient buffer into buckets reduced during the backward pass."""

import pytest

from cudnnnet.train.distributed.replicas import gradient_buckets
from cudnnnet.optim.optimizers import PACK_ALIGNMENT, packed_offsets


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
