import tracemalloc

import numpy as np
import pytest

from cudnnnet.data import BatchLoader
from cudnnnet.errors import DataError


def indexed_set(count: int, side: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Images whose first pixel holds their own index, and labels index % 10."""
    images = np.zeros((count, 1, side, side), dtype=np.float32)
    images[:, 0, 0, 0] = np.arange(count)
    return images, np.arange(count) % 10


def epoch_indices(batches) -> np.ndarray:
    return np.concatenate([images[:, 0, 0, 0].astype(np.int64) for images, _, _ in batches])


def test_every_training_image_is_seen_exactly_once_per_epoch():
    loader = BatchLoader(*indexed_set(60000), batch_size=64, seed=3)
    for _ in range(2):
        seen = epoch_indices(loader)
        assert seen.shape == (60000,)
        np.testing.assert_array_equal(np.sort(seen), np.arange(60000))


def test_batches_hold_matching_images_one_hot_and_labels():
    images, labels = indexed_set(100)
    for batch_images, batch_one_hot, batch_labels in BatchLoader(images, labels, batch_size=32):
        assert batch_images.dtype == np.float32 and batch_one_hot.dtype == np.float32
        assert batch_labels.dtype == np.int64
        indices = batch_images[:, 0, 0, 0].astype(np.int64)
        np.testing.assert_array_equal(batch_labels, labels[indices])
        np.testing.assert_array_equal(batch_one_hot.argmax(axis=1), batch_labels)
        np.testing.assert_array_equal(batch_one_hot.sum(axis=1), 1.0)
        assert batch_one_hot.shape == (len(batch_labels), 10)


@pytest.mark.parametrize("count, batch, drop_last, sizes", [
    (100, 32, False, [32, 32, 32, 4]),
    (100, 32, True, [32, 32, 32]),
    (96, 32, False, [32, 32, 32]),
    (5, 8, False, [5]),
])
def test_batch_sizes_and_length(count, batch, drop_last, sizes):
    loader = BatchLoader(*indexed_set(count), batch_size=batch, drop_last=drop_last)
    assert [len(labels) for _, _, labels in loader] == sizes
    assert len(loader) == loader.steps_per_epoch == len(sizes)


def test_epochs_differ_and_a_seed_repeats_them():
    first = BatchLoader(*indexed_set(500), batch_size=50, seed=7)
    epoch0, epoch1 = epoch_indices(first), epoch_indices(first)
    assert not np.array_equal(epoch0, epoch1)
    again = BatchLoader(*indexed_set(500), batch_size=50, seed=7)
    np.testing.assert_array_equal(epoch_indices(again), epoch0)
    np.testing.assert_array_equal(epoch_indices(again), epoch1)
    other_seed = BatchLoader(*indexed_set(500), batch_size=50, seed=8)
    assert not np.array_equal(epoch_indices(other_seed), epoch0)


def test_resuming_at_an_epoch_replays_its_order():
    loader = BatchLoader(*indexed_set(300), batch_size=64, seed=1)
    orders = [epoch_indices(loader) for _ in range(3)]
    resumed = BatchLoader(*indexed_set(300), batch_size=64, seed=1)
    resumed.epoch = 2
    np.testing.assert_array_equal(epoch_indices(resumed), orders[2])
    np.testing.assert_array_equal(resumed.permutation(1), orders[1])
    np.testing.assert_array_equal(epoch_indices(resumed.epoch_batches(0)), orders[0])
    assert resumed.epoch == 3


def test_without_shuffle_the_order_is_the_data_order():
    loader = BatchLoader(*indexed_set(70), batch_size=16, shuffle=False)
    np.testing.assert_array_equal(epoch_indices(loader), np.arange(70))
    np.testing.assert_array_equal(epoch_indices(loader), np.arange(70))


def test_float32_data_is_not_copied_and_batches_are_small_copies():
    images, labels = indexed_set(20000, side=28)  # 62.7 MB
    loader = BatchLoader(images, labels, batch_size=100)
    assert np.shares_memory(loader.images, images)
    tracemalloc.start()
    try:
        for step, (batch_images, _, _) in enumerate(loader):
            assert not np.shares_memory(batch_images, images)
            if step == 5:
                break
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 100 * 28 * 28 * 4 + 2_000_000


@pytest.mark.parametrize("arguments, problem", [
    ({"batch_size": 0}, "batch_size must be an integer > 0, got 0"),
    ({"batch_size": True}, "batch_size must be an integer > 0"),
    ({"batch_size": 2.0}, "batch_size must be an integer > 0"),
    ({"seed": -1}, "seed must be an integer >= 0"),
    ({"batch_size": 64, "drop_last": True}, "drop_last with batch_size 64 > 10 samples"),
    ({"labels": np.arange(9)}, r"labels shaped \(9,\) do not match 10 images"),
    ({"labels": np.full(10, 12)}, "label 12 at index 0 is outside 0..9"),
    ({"labels": np.zeros(10)}, "1-D integer array"),
    ({"images": np.zeros((10, 28, 28))}, r"images must be shaped \(N, C, H, W\)"),
    ({"images": np.zeros((0, 1, 2, 2)), "labels": np.zeros(0, int)}, "the data set is empty"),
])
def test_invalid_arguments_are_refused(arguments, problem):
    images, labels = indexed_set(10)
    values = {"images": images, "labels": labels, "batch_size": 4, **arguments}
    with pytest.raises(DataError, match=problem):
        BatchLoader(**values)


def test_negative_epoch_is_refused():
    with pytest.raises(DataError, match="epoch must be an integer >= 0, got -1"):
        BatchLoader(*indexed_set(10), batch_size=4).permutation(-1)


def test_real_training_set_is_covered(mnist_dir):
    from cudnnnet.data import load_mnist

    images, labels = load_mnist(mnist_dir, "train", download=False)
    loader = BatchLoader(images, labels, batch_size=64, seed=0)
    assert len(loader) == 938
    counts = np.bincount(np.concatenate([batch_labels for _, _, batch_labels in loader]), minlength=10)
    np.testing.assert_array_equal(counts, np.bincount(labels, minlength=10))
