"""cudnnnet.predict from Python: one result per image, whatever holds the images (issue 31, item 5)."""

import numpy as np
import pytest
from PIL import Image

import cudnnnet
from cudnnnet import Network
from cudnnnet.config.schema import load_config, parse_config
from cudnnnet.train.trainer import build_network
from run_helpers import REPO_ROOT


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """configs/mnist_mlp.yaml's network with its initial weights, loaded from its checkpoint."""
    root = tmp_path_factory.mktemp("mlp")
    config = load_config(REPO_ROOT / "configs" / "mnist_mlp.yaml")
    build_network(config, "host").save(root / "model.npz", config=config.to_dict())
    return Network.load(root / "model.npz")


def digits(count: int) -> np.ndarray:
    """uint8 (count, 28, 28): vertical bars of different widths, bright on black."""
    images = np.zeros((count, 28, 28), np.uint8)
    for index in range(count):
        images[index, 6:22, 12:14 + 2 * index] = 255
    return images


def probabilities(results) -> list:
    assert all(result.error is None for result in results), [result.error for result in results]
    return [result.probabilities for result in results]


def test_an_n_h_w_array_is_n_images(mlp):
    batch = digits(3)
    results = cudnnnet.predict(mlp, batch)
    assert [result.image for result in results] == ["<array 0>", "<array 1>", "<array 2>"]
    assert probabilities(results) == probabilities(cudnnnet.predict(mlp, list(batch)))
    assert probabilities(results)[0] != probabilities(results)[2]


def test_an_n_c_h_w_array_is_n_images(mlp):
    batch = digits(3)
    assert probabilities(cudnnnet.predict(mlp, batch[:, None])) == probabilities(cudnnnet.predict(mlp, batch))


def test_a_pil_image_is_one_image_and_a_list_may_mix_images_arrays_and_paths(mlp, tmp_path):
    batch = digits(2)
    image = Image.fromarray(batch[0], "L")
    image.save(tmp_path / "one.png")
    alone = cudnnnet.predict(mlp, image)
    assert len(alone) == 1 and alone[0].image == "<image 0>"
    mixed = cudnnnet.predict(mlp, [image, batch[1], tmp_path / "one.png", str(tmp_path / "one.png")])
    assert [result.image for result in mixed] == ["<image 0>", "<array 1>", str(tmp_path / "one.png"),
                                                  str(tmp_path / "one.png")]
    first, second, from_file, from_text = probabilities(mixed)
    assert first == probabilities(alone)[0] == from_file == from_text
    assert second == probabilities(cudnnnet.predict(mlp, batch[1]))[0]


def test_a_colour_n_h_w_c_batch_is_n_images_of_a_photo_network(tmp_path):
    raw = load_config(REPO_ROOT / "configs" / "image_folder.yaml").to_dict()
    raw["data"].update(dir=str(tmp_path), image_size=[12, 12], channels=3, shape=[3, 12, 12], classes=["cat", "dog"],
                       normalize={"mean": 0.5, "std": 0.25})
    build_network(parse_config(raw), "host").save(tmp_path / "model.npz", config=raw)
    network = Network.load(tmp_path / "model.npz")
    photos = np.random.default_rng(0).integers(0, 256, (4, 12, 12, 3), dtype=np.uint8)
    channels_last = cudnnnet.predict(network, photos)
    channels_first = cudnnnet.predict(network, photos.transpose(0, 3, 1, 2))
    one_by_one = [cudnnnet.predict(network, Image.fromarray(photo, "RGB"))[0] for photo in photos]
    assert len(channels_last) == 4
    assert probabilities(channels_last) == probabilities(channels_first) == probabilities(one_by_one)


def test_an_array_of_no_image_shape_is_one_error_naming_the_shapes_read(mlp):
    with pytest.raises(cudnnnet.errors.InvalidArgumentError, match=r"shape \(2, 3, 4, 5, 6\).*\(N, H, W\)"):
        cudnnnet.predict(mlp, np.zeros((2, 3, 4, 5, 6), np.uint8))


def test_something_that_is_no_image_is_named(mlp):
    with pytest.raises(cudnnnet.errors.InvalidArgumentError, match=r"predict takes .*got int"):
        cudnnnet.predict(mlp, [3])
