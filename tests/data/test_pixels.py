"""PixelImages: uint8 images and the float32 images made from them, on the host and on every backend."""

import numpy as np
import pytest

from cudnnnet.data import mnist
from cudnnnet.data.loader import BatchLoader
from cudnnnet.data.pixels import PixelImages, to_float_images
from cudnnnet.errors import DataError

RECIPES = [(None, 0), ((mnist.MNIST_MEAN, mnist.MNIST_STD), 0), ((mnist.MNIST_MEAN, mnist.MNIST_STD), 2), (None, 3)]


def random_pixels(count: int = 7, height: int = 5, width: int = 6, seed: int = 0) -> np.ndarray:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(count, height, width), dtype=np.uint8)
    pixels[0, 0, 0], pixels[0, 0, 1] = 0, 255  # both ends of the range
    return pixels


@pytest.mark.parametrize("normalize, pad", RECIPES)
def test_floats_are_to_float_images_and_the_shape_is_theirs(normalize, pad):
    pixels = random_pixels()
    images = PixelImages(pixels, normalize, pad)
    expected = to_float_images(pixels, normalize, pad)
    assert images.shape == expected.shape == (7, 1, 5 + 2 * pad, 6 + 2 * pad) and images.size == expected.size
    assert images.floats.dtype == np.float32 and np.array_equal(images.floats, expected)
    assert images.floats is images.floats  # converted once


@pytest.mark.parametrize("normalize, pad", RECIPES)
def test_a_tensor_made_from_pixels_on_the_backend_has_the_host_bits(backend, normalize, pad):
    """On a GPU only the bytes are copied and a kernel does /255, the padding and the normalisation:
    the same float32 operations as the host, so the same bits."""
    pixels = random_pixels(count=33, height=28, width=28, seed=1)
    images = PixelImages(pixels, normalize, pad)
    tensor = images.to_tensor(backend)
    assert tensor.shape == images.shape
    made = tensor.numpy()
    assert np.array_equal(made.view(np.uint32), to_float_images(pixels, normalize, pad).view(np.uint32))


def test_the_real_training_set_made_on_the_backend_equals_load_mnist(backend, mnist_dir):
    normalize = (mnist.MNIST_MEAN, mnist.MNIST_STD)
    pixels, labels = mnist.load_mnist_pixels(mnist_dir, "train", download=False)
    images, same_labels = mnist.load_mnist(mnist_dir, "train", download=False, normalize=normalize, pad=2)
    assert pixels.dtype == np.uint8 and pixels.shape == (60000, 28, 28) and np.array_equal(labels, same_labels)
    assert np.array_equal(PixelImages(pixels, normalize, 2).to_tensor(backend).numpy(), images)


def test_head_keeps_the_recipe():
    images = PixelImages(random_pixels(), (0.5, 0.25), 1)
    first = images.head(3)
    assert first.shape == (3, 1, 7, 8) and np.array_equal(first.floats, images.floats[:3])


@pytest.mark.parametrize("pixels", [np.zeros((2, 3, 3), np.float32), np.zeros((2, 9), np.uint8), [[[1]]]])
def test_pixels_must_be_uint8_shaped_n_h_w(pixels):
    with pytest.raises(DataError, match=r"PixelImages needs uint8 pixels shaped \(N, H, W\)"):
        PixelImages(pixels)


@pytest.mark.parametrize("normalize, pad, problem", [((0.1, 0.0), 0, "a std > 0"), (None, -1, "pad must be"),
                                                     ("mean", 0, "None or \\(mean, std\\)")])
def test_the_recipe_is_checked(normalize, pad, problem):
    with pytest.raises(DataError, match=problem):
        PixelImages(random_pixels(), normalize, pad)


def test_a_loader_of_pixel_images_converts_only_when_a_batch_needs_the_floats():
    pixels = random_pixels(count=10)
    images, labels = PixelImages(pixels, None, 1), np.arange(10) % 3
    loader = BatchLoader(images, labels, batch_size=4, seed=5, classes=3)
    assert loader.num_samples == 10 and loader.steps_per_epoch == 3 and len(loader.permutation(0)) == 10
    assert "floats" not in vars(images)
    reference = BatchLoader(to_float_images(pixels, None, 1), labels, batch_size=4, seed=5, classes=3)
    for (x, onehot, ids), (x_ref, onehot_ref, ids_ref) in zip(loader.epoch_batches(1), reference.epoch_batches(1)):
        assert np.array_equal(x, x_ref) and np.array_equal(onehot, onehot_ref) and np.array_equal(ids, ids_ref)


PER_CHANNEL = ((0.49, 0.48, 0.45), (0.25, 0.24, 0.26))


@pytest.mark.parametrize("normalize, pad", [(None, 0), ((0.5, 0.25), 1), (PER_CHANNEL, 0), (PER_CHANNEL, 2)])
def test_rgb_pixels_make_each_channel_with_its_own_mean_and_std_on_every_backend(backend, normalize, pad):
    pixels = np.random.default_rng(3).integers(0, 256, size=(5, 3, 4, 6), dtype=np.uint8)
    images = PixelImages(pixels, normalize, pad)
    assert images.shape == (5, 3, 4 + 2 * pad, 6 + 2 * pad)
    mean, std = ((0.0,) * 3, (1.0,) * 3) if normalize is None else (np.broadcast_to(value, 3) for value in normalize)
    for channel in range(3):
        plane = np.pad(pixels[:, channel], ((0, 0), (pad, pad), (pad, pad))).astype(np.float32) / np.float32(255)
        expected = (plane - np.float32(mean[channel])) / np.float32(std[channel])
        assert np.array_equal(images.floats[:, channel], expected), channel
    assert np.array_equal(images.to_tensor(backend).numpy(), images.floats)


@pytest.mark.parametrize("chunk_bytes", [1, 40, 200, 1 << 24], ids=["a row", "two rows", "two images", "all"])
def test_channel_statistics_are_the_mean_and_std_of_each_channel(chunk_bytes):
    from cudnnnet.data.pixels import channel_statistics

    pixels = np.random.default_rng(4).integers(0, 256, size=(9, 3, 5, 5), dtype=np.uint8)
    mean, std = channel_statistics(pixels, chunk_bytes=chunk_bytes)
    scaled = pixels / 255.0
    assert np.allclose(mean, scaled.mean(axis=(0, 2, 3)), atol=1e-6)
    assert np.allclose(std, scaled.std(axis=(0, 2, 3)), atol=1e-6)


def test_channel_statistics_of_large_images_take_little_memory_beside_them():
    """They were taken 2048 images at a time as 32-bit integers: four times the pixels of a whole folder of
    large images (8 images of 30000×30000 asked for 26.8 GiB); now 16 MiB of pixels at a time."""
    import tracemalloc

    from cudnnnet.data.pixels import channel_statistics

    pixels = np.full((4, 3, 2000, 2000), 7, np.uint8)  # 48 MB
    tracemalloc.start()
    try:
        mean, std = channel_statistics(pixels)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert np.allclose(mean, 7 / 255, atol=1e-6) and std == (1.0,) * 3  # a constant channel: unscaled
    assert peak < 80 << 20, f"{peak / 2**20:.0f} MiB beside 46 MiB of pixels"


def test_a_normalisation_for_another_number_of_channels_is_refused():
    with pytest.raises(DataError, match="normalize gives 3 values for images of 1 channels"):
        to_float_images(random_pixels(), PER_CHANNEL)
