"""Training on your own data, on the real MNIST written out by the test: as an IDX pair named by
path, as an .npz and as a folder of PNGs. The same images train the same MLP to the same accuracy
whichever way they were stored; then evaluate and predict name the folder's classes."""

import json
import re

import numpy as np
import pytest
from PIL import Image

from run_helpers import REPO_ROOT, run_script
from cudnnnet.config.schema import load_config, parse_config
from cudnnnet.data.mnist import load_mnist_pixels
from cudnnnet.train.trainer import Trainer

TRAIN_COUNT, TEST_COUNT, STEPS = 6000, 1000, 300
MARGIN = 0.015  # the three differ only in the order the images are listed, so in the shuffled batches


def idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(size).to_bytes(4, "big") for size in array.shape)
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


@pytest.fixture(scope="module")
def mnist_as_files(mnist_dir, tmp_path_factory):
    """The first 6 000 training and 1 000 test images of MNIST as IDX files, .npz archives and PNG folders."""
    root = tmp_path_factory.mktemp("own-data")
    splits = {"train": [array[:TRAIN_COUNT] for array in load_mnist_pixels(mnist_dir, "train", download=False)],
              "test": [array[:TEST_COUNT] for array in load_mnist_pixels(mnist_dir, "test", download=False)]}
    for split, (images, labels) in splits.items():
        (root / f"{split}-images.idx").write_bytes(idx_bytes(images))
        (root / f"{split}-labels.idx").write_bytes(idx_bytes(labels))
        np.savez(root / f"{split}.npz", x=images, y=labels)
        for index, (image, label) in enumerate(zip(images, labels)):
            folder = root / "folder" / split / f"digit-{label}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(folder / f"{index:05d}.png")
    return root


def data_section(kind: str, root) -> dict:
    normalize = {"mean": 0.1307, "std": 0.3081}
    if kind == "idx":
        return {"dataset": "idx", "normalize": normalize, **{f"{split}_{part}": str(root / f"{split}-{part}.idx")
                                                              for split in ("train", "test") for part in ("images", "labels")}}
    if kind == "npz":
        return {"dataset": "npz", "normalize": normalize, "train_file": str(root / "train.npz"),
                "test_file": str(root / "test.npz")}
    return {"dataset": "image-folder", "dir": str(root / "folder"), "normalize": normalize}


def train(kind: str, root, output):
    config = load_config(REPO_ROOT / "configs" / "mnist_mlp.yaml").to_dict()
    config["data"] = data_section(kind, root)
    config["train"].update(epochs=1, steps=STEPS)
    config["device"] = "host"
    trainer = Trainer(parse_config(config, source=f"<{kind}>"), output, progress=False)
    trainer.run()
    return json.loads((output / "metrics.json").read_text())["test_accuracy"], trainer


@pytest.mark.slow
def test_mnist_as_idx_npz_and_png_folder_trains_to_the_same_accuracy(mnist_as_files, tmp_path):
    accuracies, trainers = {}, {}
    for kind in ("idx", "npz", "folder"):
        accuracies[kind], trainers[kind] = train(kind, mnist_as_files, tmp_path / kind)
    assert accuracies["idx"] >= 0.88, accuracies
    assert accuracies["npz"] == accuracies["idx"]  # the very arrays, in the same order
    assert abs(accuracies["folder"] - accuracies["idx"]) <= MARGIN, accuracies
    folder = trainers["folder"]
    assert folder.config.data.classes == tuple(f"digit-{digit}" for digit in range(10))
    assert np.array_equal(np.sort(folder.train_pixels.pixels.reshape(TRAIN_COUNT, -1), axis=0),
                          np.sort(trainers["idx"].train_pixels.pixels.reshape(TRAIN_COUNT, -1), axis=0))

    evaluated = run_script("evaluate", "--weights", str(tmp_path / "folder" / "model.npz"), "--device", "host")
    assert evaluated.returncode == 0, evaluated.stderr
    assert f"test accuracy {accuracies['folder']:.4f}" in evaluated.stdout
    assert evaluated.stdout.splitlines()[1].split()[1:] == [f"digit-{digit}" for digit in range(10)]

    seven = next((mnist_as_files / "folder" / "test" / "digit-7").iterdir())
    predicted = run_script("predict", "--weights", str(tmp_path / "folder" / "model.npz"), "--device", "host",
                           "--top-k", "3", str(seven))
    assert predicted.returncode == 0, predicted.stderr
    name, top = predicted.stdout.rsplit(": ", 1)
    assert name == str(seven) and top.startswith("digit-7 ") and top.count("digit-") == 3


def test_a_folder_model_predicts_rgb_photos_of_any_size_resized_and_cropped(tmp_path):
    rng = np.random.default_rng(0)
    for split, count in (("train", 24), ("test", 8)):
        for index in range(count):
            red = index % 2 == 0
            image = rng.integers(0, 60, (12, 12, 3), dtype=np.uint8)
            image[..., 0 if red else 2] += 180
            folder = tmp_path / "photos" / split / ("red" if red else "blue")
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(folder / f"{index}.png")
    config = load_config(REPO_ROOT / "configs" / "image_folder.yaml").to_dict()
    config["data"].update(dir=str(tmp_path / "photos"), image_size=[8, 8])
    config["train"].update(epochs=3, batch_size=8)
    config["device"] = "host"
    Trainer(parse_config(config, source="<photos>"), tmp_path / "run", progress=False).run()
    big_red = np.zeros((40, 90, 3), np.uint8)
    big_red[..., 0] = 230
    Image.fromarray(big_red).save(tmp_path / "big_red.jpg")
    predicted = run_script("predict", "--weights", str(tmp_path / "run" / "model.npz"), "--device", "host", "--json",
                           str(tmp_path / "big_red.jpg"))
    assert predicted.returncode == 0, predicted.stderr
    result = json.loads(predicted.stdout)[0]
    assert result["label"] == "red" and result["probabilities"][1] > 0.5


def small_folder(root, classes=("a", "b"), count=4):
    for name in classes:
        (root / name).mkdir(parents=True, exist_ok=True)
        for index in range(count):
            Image.fromarray(np.full((8, 8), 40 * index, np.uint8)).save(root / name / f"{index}.png")
    return root


def train_folder(root, output):
    return run_script("train", "--config", "image_folder", "--data-dir", str(root), "--device", "host",
                      "--output", str(output), "--epochs", "1", "--quiet")


def test_a_corrupt_image_stops_training_with_one_line_naming_it_and_exit_2(tmp_path):
    root = small_folder(tmp_path / "photos")
    (root / "b" / "broken.jpg").write_bytes(b"not a jpeg")
    finished = train_folder(root, tmp_path / "run")
    assert finished.returncode == 2
    assert finished.stderr.strip().splitlines() == [
        f"cudnnnet-train: error: {root / 'b' / 'broken.jpg'}: cannot decode the image (not an image file Pillow can "
        f"read); remove it, or set data.corrupt: skip"]
    assert not (tmp_path / "run").exists()


def test_a_colour_test_image_is_read_as_grey_by_a_model_trained_on_grey_images(tmp_path):
    """channels auto: the training images choose, and test/ follows them as predict does. A colour image
    in test/ made the test split RGB: training refused it ('the test images are (3, 8, 8) (C, H, W), the
    training images (1, 8, 8); set data.image_size'), and evaluate refused a model trained without it."""
    from cudnnnet.data.images import load_photo

    for split in ("train", "test"):
        small_folder(tmp_path / "photos" / split)
    colour = tmp_path / "photos" / "test" / "a" / "colour.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8, 3), np.uint8)).save(colour)
    finished = train_folder(tmp_path / "photos", tmp_path / "run")
    assert finished.returncode == 0, finished.stderr
    evaluated = run_script("evaluate", "--weights", str(tmp_path / "run"), "--device", "host", "--json")
    assert evaluated.returncode == 0, evaluated.stderr
    assert np.array(json.loads(evaluated.stdout)["confusion_matrix"]).sum() == 9
    from cudnnnet.config.schema import DataConfig
    from cudnnnet.data.sources import load_source

    test = load_source(DataConfig(dataset="image-folder", dir=str(tmp_path / "photos"), shape=(1, 8, 8)), "test")
    assert test.pixels.shape == (9, 1, 8, 8)
    assert np.array_equal(test.pixels[4], load_photo(colour, 1, 8, 8))  # a/colour.png follows a/3.png


def test_a_model_without_one_score_per_class_folder_is_named_with_exit_2(tmp_path):
    root = small_folder(tmp_path / "photos", classes=("a", "b", "c"))
    finished = train_folder(root, tmp_path / "run")
    assert finished.returncode == 2
    assert "the data has 3 classes, so it needs 3 class scores, shape (3, 1, 1) (a last dense layer with out_size 3)" in finished.stderr


def test_evaluate_takes_a_model_of_other_than_ten_classes(tmp_path):
    root = small_folder(tmp_path / "photos", count=6)
    assert train_folder(root, tmp_path / "run").returncode == 0
    evaluated = run_script("evaluate", "--weights", str(tmp_path / "run"), "--device", "host", "--json")
    assert evaluated.returncode == 0, evaluated.stderr
    figures = json.loads(evaluated.stdout)
    assert figures["classes"] == ["a", "b"] and np.array(figures["confusion_matrix"]).shape == (2, 2)


def test_a_single_class_folder_is_refused_with_exit_2(tmp_path):
    root = small_folder(tmp_path / "photos", classes=("cats",))
    finished = train_folder(root, tmp_path / "run")
    assert finished.returncode == 2
    assert finished.stderr.strip().splitlines() == [
        "cudnnnet-train: error: image_folder (with overrides): the data has 1 class (cats); a classifier needs at "
        "least 2 (for image-folder, one sub-folder per class)"]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("train_labels, test_labels, classes, message", [
    ([0, 1, 2, 1], [0, 1, 0, 1], ["a", "b"],
     "the training split has label 2 at index 2; data.classes names 2 classes (labels 0..1)"),
    ([0, 1, 0, 1], [0, 1, 1, 3], ["a", "b"], "the test split has label 3 at index 3; data.classes names 2 classes"),
    ([0, 1, 0, 1], [0, 2, 1, 0], None,
     "the test split has label 2 at index 1; the training split's labels make 2 classes (labels 0..1)"),
])
def test_a_label_of_no_class_is_named_with_its_split_and_where_the_classes_come_from(
        tmp_path, train_labels, test_labels, classes, message):
    """A training label past data.classes was 'labels: label 2 at index 2 is outside 0..1', naming neither
    the split nor data.classes, and the test split's message blamed the training split's classes."""
    from cudnnnet.errors import DataError

    for split, labels in (("train", train_labels), ("test", test_labels)):
        np.savez(tmp_path / f"{split}.npz", x=np.zeros((4, 4, 4), np.uint8), y=np.array(labels))
    config = load_config(REPO_ROOT / "configs" / "mnist_mlp.yaml").to_dict()
    config["data"] = {"dataset": "npz", "train_file": str(tmp_path / "train.npz"),
                      "test_file": str(tmp_path / "test.npz"), **({"classes": classes} if classes else {})}
    config["device"] = "host"
    with pytest.raises(DataError, match=re.escape(message)):
        Trainer(parse_config(config, source="<npz>"), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
