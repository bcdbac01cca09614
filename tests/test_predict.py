"""Prediction from image files: scripts/predict.py and cudnnnet.predict on real MNIST digits drawn as files."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import cudnnnet
from cudnnnet import Network
from cudnnnet.config.schema import load_config, parse_config
from cudnnnet.data.mnist import read_images, read_labels
from cudnnnet.train.trainer import build_network
from run_helpers import REPO_ROOT, run_script, train_cli

DIGITS = 200
MIN_ACCURACY = 0.97
PAPER, INK = np.array([245, 232, 190], np.float32), np.array([25, 50, 160], np.float32)  # cream paper, blue ink


# ---- the styles: a digit (28, 28) uint8, bright on black as in MNIST -> an image to save ------


def black_on_white(digit):
    return Image.fromarray(255 - digit, "L")


def white_on_black(digit):
    return Image.fromarray(digit, "L")


def rgb_grey(digit):
    return black_on_white(digit).convert("RGB")


def blue_ink_on_cream(digit):
    coverage = digit[..., np.newaxis].astype(np.float32) / 255.0
    return Image.fromarray(np.round(PAPER + coverage * (INK - PAPER)).astype(np.uint8), "RGB")


def black_ink_on_transparent(digit):
    pixels = np.zeros((28, 28, 4), np.uint8)
    pixels[..., 3] = digit
    return Image.fromarray(pixels, "RGBA")


def scaled_three_times_onto_a_sheet(image, paper):
    """The image enlarged to 84x84 (bicubic) and placed off-centre on a 150x130 sheet of ``paper``."""
    sheet = Image.new(image.mode, (150, 130), paper)
    sheet.paste(image.resize((84, 84), Image.Resampling.BICUBIC), (40, 15))
    return sheet


STYLES = {  # name: (draw, file suffix, save options)
    "black_on_white": (black_on_white, ".png", {}),
    "white_on_black": (white_on_black, ".bmp", {}),
    "rgb_grey": (rgb_grey, ".png", {}),
    "blue_ink_on_cream": (blue_ink_on_cream, ".png", {}),
    "rgba_transparent": (black_ink_on_transparent, ".png", {}),
    "scaled_x3_padded": (lambda digit: scaled_three_times_onto_a_sheet(black_on_white(digit), 255), ".png", {}),
    "jpeg": (black_on_white, ".jpg", {"quality": 85}),
    "jpeg_colour_x3": (lambda digit: scaled_three_times_onto_a_sheet(blue_ink_on_cream(digit), tuple(PAPER.astype(int))),
                       ".jpg", {"quality": 75}),
}


def idx_file(mnist_dir: Path, name: str) -> Path:
    return next(path for path in sorted(mnist_dir.glob(f"{name}*")) if path.is_file())


@pytest.fixture(scope="module")
def mnist_test_digits(mnist_dir):
    """The first DIGITS test digits (N, 28, 28) uint8 and their labels, read from the real IDX files."""
    images = read_images(idx_file(mnist_dir, "t10k-images-idx3-ubyte"))[:DIGITS]
    labels = read_labels(idx_file(mnist_dir, "t10k-labels-idx1-ubyte"))[:DIGITS]
    return images, labels


def render(folder: Path, style: str, digits: np.ndarray) -> Path:
    """Write each digit as ``folder/NNN<suffix>`` in ``style``."""
    draw, suffix, options = STYLES[style]
    folder.mkdir(parents=True, exist_ok=True)
    for index, digit in enumerate(digits):
        draw(digit).save(folder / f"{index:03d}{suffix}", **options)
    return folder


@pytest.fixture(scope="module")
def rendered(mnist_test_digits, tmp_path_factory):
    """{style: folder of the DIGITS test digits drawn in that style}."""
    root = tmp_path_factory.mktemp("digits")
    return {style: render(root / style, style, mnist_test_digits[0]) for style in STYLES}


def image_index(result: dict) -> int:
    return int(Path(result["image"]).stem)


def predict_cli(weights, *arguments: str, device: str = "host"):
    """Run scripts/predict.py --json; returns (the finished process, the parsed JSON list or None)."""
    finished = run_script("predict", "--weights", str(weights), "--json", "--quiet", "--device", device, *arguments,
                          timeout=600)
    results = json.loads(finished.stdout) if finished.stdout.strip() else None
    return finished, results


def predicted_digits(results) -> np.ndarray:
    """The script's digits in the order of the files' numbers."""
    return np.array([result["digit"] for result in sorted(results, key=image_index)])


# ---- accuracy on every style, through the script ---------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("style", list(STYLES))
def test_predict_script_reads_every_style(trained_cnn, rendered, mnist_test_digits, style):
    finished, results = predict_cli(trained_cnn / "model.npz", str(rendered[style]))
    assert finished.returncode == 0, finished.stderr
    assert sorted(image_index(result) for result in results) == list(range(DIGITS))
    for result in results:
        assert set(result) == {"image", "digit", "label", "probabilities"}
        assert result["label"] == str(result["digit"])  # an MNIST network's classes are the digits
        assert len(result["probabilities"]) == 10 and abs(sum(result["probabilities"]) - 1) < 1e-4
        assert result["digit"] == int(np.argmax(result["probabilities"]))
    assert np.mean(predicted_digits(results) == mnist_test_digits[1]) >= MIN_ACCURACY, style


@pytest.mark.slow
def test_the_api_predicts_files_and_arrays_as_the_script_does(trained_cnn, rendered, mnist_test_digits):
    network = Network.load(trained_cnn / "model.npz", backend="host")
    images, labels = mnist_test_digits
    from_files = cudnnnet.predict(network, [rendered["black_on_white"]])
    _, from_script = predict_cli(trained_cnn / "model.npz", str(rendered["black_on_white"]))
    assert [result.to_dict() for result in from_files] == from_script
    from_arrays = cudnnnet.predict(network, list(images))
    assert np.mean(np.array([result.digit for result in from_arrays]) == labels) >= MIN_ACCURACY
    from_bmp = cudnnnet.predict(network, rendered["white_on_black"])  # the same uint8 pixels as the arrays
    assert [result.probabilities for result in from_bmp] == [result.probabilities for result in from_arrays]
    assert all(result.probability == max(result.probabilities) for result in from_arrays)


# ---- natural images: the geometry the network was trained with ------------------------------------


@pytest.fixture(scope="module")
def folder_checkpoints(tmp_path_factory):
    """configs/image_folder.yaml's network for 3×12×12 inputs, saved three times with its initial
    weights: trained with data.resize crop, with stretch, and by a version before the key (none)."""
    root = tmp_path_factory.mktemp("folder-models")
    raw = load_config(REPO_ROOT / "configs" / "image_folder.yaml").to_dict()
    raw["data"].update(dir=str(root), image_size=[12, 12], channels=3, shape=[3, 12, 12], classes=["cat", "dog"],
                       normalize={"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3]})
    network = build_network(parse_config(raw), "host")
    for resize in ("crop", "stretch", None):
        saved = {**raw, "data": {key: value for key, value in raw["data"].items() if key != "resize"}}
        if resize is not None:
            saved["data"]["resize"] = resize
        network.save(root / f"{resize or 'legacy'}.npz", config=saved)
    return root


@pytest.mark.parametrize("model, resize", [("crop", "crop"), ("stretch", "stretch"), ("legacy", "stretch")])
def test_a_folder_model_predicts_a_photo_fitted_as_it_was_trained(folder_checkpoints, tmp_path, model, resize):
    """A checkpoint from before data.resize was trained on stretched images, so it predicts on them."""
    from cudnnnet.data.images import load_photo
    from cudnnnet.data.pixels import to_float_images
    from cudnnnet.tensor import Tensor

    photo = tmp_path / "landscape.png"
    Image.fromarray(np.random.default_rng(5).integers(0, 256, (30, 50, 3), dtype=np.uint8)).save(photo)
    network = Network.load(folder_checkpoints / f"{model}.npz", backend="host")
    assert network.training_config.data.resize == resize
    (result,) = cudnnnet.predict(network, [photo])
    normalize = network.training_config.data.normalize
    expected = {}
    for geometry in ("crop", "stretch"):
        inputs = to_float_images(load_photo(photo, 3, 12, 12, resize=geometry)[None], normalize, 0)
        expected[geometry] = network.predict(Tensor.from_numpy(inputs, network.backend)).numpy().reshape(-1)
    assert not np.allclose(expected["crop"], expected["stretch"], atol=1e-6), "the photo does not tell them apart"
    assert np.allclose(result.probabilities, expected[resize], atol=1e-6)


def test_a_folder_model_predicts_a_photo_of_any_mode_as_it_was_trained_on_it(folder_checkpoints, tmp_path):
    """Transparent, palette, CMYK, grey and 16-bit photos: predicting the file gives the network's output
    on the pixels training made of it (training had dropped transparency, which predict composites on white)."""
    from cudnnnet.data.pixels import to_float_images
    from cudnnnet.data.sources import load_source
    from cudnnnet.tensor import Tensor
    from image_modes import COLOUR_MODES, GREY_MODES, mode_folder

    network = Network.load(folder_checkpoints / "crop.npz", backend="host")
    paths = mode_folder(tmp_path, COLOUR_MODES + GREY_MODES)
    data = dataclasses.replace(network.training_config.data, dir=str(tmp_path), classes=None, shape=None)
    trained = load_source(data, "train")
    inputs = to_float_images(trained.pixels, data.normalize, data.pad)
    expected = network.predict(Tensor.from_numpy(inputs, network.backend)).numpy().reshape(len(paths), -1)
    results = cudnnnet.predict(network, paths)
    assert [result.error for result in results] == [None] * len(paths)
    assert np.allclose([result.probabilities for result in results], expected, atol=1e-6)


def test_each_image_is_one_line_whatever_its_file_name_holds(folder_checkpoints, tmp_path):
    """A line break in a file name split the image's line in two, and a name that is not UTF-8 stopped
    predict with a UnicodeEncodeError traceback where the output is strict UTF-8 (a desktop's locale)."""
    import os
    import subprocess
    import sys

    folder = tmp_path / "photos"
    folder.mkdir()
    photo = Image.fromarray(np.zeros((12, 12, 3), np.uint8))
    for name in ("plain.png", "line\nbreak.png"):
        photo.save(folder / name)
    photo.save(os.fsdecode(bytes(folder) + b"/latin-\xe9.png"))
    Path(os.fsdecode(bytes(folder) + b"/bad\n\xff.png")).write_text("not an image")
    finished = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "predict.py"), "--weights",
                               str(folder_checkpoints / "crop.npz"), "--device", "host", "--quiet", str(folder)],
                              capture_output=True, env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"}, timeout=600)
    assert finished.returncode == 2, finished.stderr
    assert finished.stderr.decode().splitlines() == [
        f"cudnnnet-predict: error: {folder}/bad\\n\\xff.png: not an image file Pillow can read"]
    assert [line.split(": ")[0] for line in finished.stdout.decode().splitlines()] == [
        f"{folder}/latin-\\xe9.png", f"{folder}/line\\nbreak.png", f"{folder}/plain.png"]


def test_a_folder_is_predicted_a_batch_at_a_time_never_held_whole(folder_checkpoints, tmp_path, monkeypatch):
    """Every image of the folders given was read and kept as float32 before the first was predicted: a
    folder of 100 000 photos for a 224×224 RGB model would have held 60 GB."""
    from cudnnnet.data import images

    for index in range(10):
        Image.fromarray(np.full((12, 12, 3), index * 20, np.uint8)).save(tmp_path / f"{index}.png")
    (tmp_path / "5.png").write_text("not an image")
    network = Network.load(folder_checkpoints / "crop.npz", backend="host")
    expected = cudnnnet.predict(network, [tmp_path])
    events = []
    load_photo, predict_batch = images.load_photo, network.predict
    monkeypatch.setattr(images, "load_photo",
                        lambda *args, **kwargs: events.append("read") or load_photo(*args, **kwargs))
    monkeypatch.setattr(network, "predict",
                        lambda batch: events.append(f"batch of {batch.shape[0]}") or predict_batch(batch))
    results = cudnnnet.predict(network, [tmp_path], batch_size=4)
    assert events == ["read"] * 4 + ["batch of 4"] + ["read"] * 5 + ["batch of 4"] + ["read"] + ["batch of 1"]
    assert [(result.image, result.error) for result in results] == [(result.image, result.error) for result in expected]
    assert results[5].error is not None and results[5].probabilities == [] == expected[5].probabilities
    for result, alone in zip(results, expected):
        assert np.allclose(result.probabilities, alone.probabilities, atol=1e-5)  # batches of 4, not one of 9


def test_a_network_of_neither_grey_nor_rgb_inputs_is_refused_by_predict(folder_checkpoints, tmp_path):
    raw = Network.load(folder_checkpoints / "crop.npz", backend="host").training_config.to_dict()
    raw["data"].update(shape=[4, 12, 12])
    build_network(parse_config(raw), "host").save(tmp_path / "four.npz", config=raw)
    network = Network.load(tmp_path / "four.npz", backend="host")
    Image.new("RGB", (12, 12)).save(tmp_path / "photo.png")
    with pytest.raises(cudnnnet.errors.InvalidArgumentError,
                       match=r"predict reads grey or RGB images; this network takes \(4, 12, 12\)"):
        cudnnnet.predict(network, [tmp_path / "photo.png"])


# ---- bad files ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def untrained_mlp(tmp_path_factory):
    """configs/mnist_mlp.yaml's network with its initial weights, as model.npz and as the original's .bin files."""
    root = tmp_path_factory.mktemp("untrained")
    config = load_config(REPO_ROOT / "configs" / "mnist_mlp.yaml")
    network = build_network(config, "host")
    network.save(root / "model.npz", config=config.to_dict())
    network.save_original(root / "pretrained")
    return root


def test_an_output_folder_is_read_as_its_checkpoint(untrained_mlp, tmp_path):
    """A folder holding model.npz (what cudnnnet-train writes) predicts as that checkpoint does."""
    digits = np.zeros((3, 28, 28), np.uint8)
    digits[:, 6:22, 12:16] = 255
    folder = render(tmp_path / "digits", "black_on_white", digits)
    from_file, results_from_file = predict_cli(untrained_mlp / "model.npz", str(folder))
    from_folder, results_from_folder = predict_cli(untrained_mlp, str(folder))
    assert from_file.returncode == from_folder.returncode == 0, from_folder.stderr
    assert results_from_folder == results_from_file


def test_bad_files_are_each_named_and_the_others_predicted(untrained_mlp, tmp_path):
    digits = np.zeros((6, 28, 28), np.uint8)
    digits[:, 6:22, 12:16] = 255
    folder = render(tmp_path / "mixed", "black_on_white", digits)
    (folder / "text.png").write_text("not an image\n")
    (folder / "empty.jpg").write_bytes(b"")
    (folder / "notes.txt").write_text("a file without an image suffix is not taken from a folder\n")
    finished, results = predict_cli(untrained_mlp / "model.npz", str(folder))
    assert finished.returncode == 2
    errors = finished.stderr.splitlines()
    assert len(errors) == 2, finished.stderr
    assert any("text.png" in line and "not an image file" in line for line in errors), errors
    assert any("empty.jpg" in line and "empty" in line for line in errors), errors
    predicted = [result for result in results if result["digit"] is not None]
    assert sorted(Path(result["image"]).name for result in predicted) == [f"{index:03d}.png" for index in range(6)]
    assert {Path(result["image"]).name for result in results if "error" in result} == {"text.png", "empty.jpg"}


def test_an_image_with_nan_samples_is_named_and_the_others_predicted(untrained_mlp, tmp_path):
    digits = np.zeros((2, 28, 28), np.uint8)
    digits[:, 6:22, 12:16] = 255
    folder = render(tmp_path / "mixed", "white_on_black", digits)
    samples = digits[0].astype(np.float32) / 255.0
    samples[0, 0] = np.nan
    Image.fromarray(samples, mode="F").save(folder / "nan.tif")
    finished, results = predict_cli(untrained_mlp / "model.npz", str(folder))
    assert finished.returncode == 2
    assert finished.stderr.splitlines() == [f"cudnnnet-predict: error: {folder / 'nan.tif'}: the image holds NaN or "
                                            f"infinite values (1 of its 784 samples); an image holds finite values only"]
    assert [result["digit"] is not None for result in results] == [True, True, False]


def test_the_api_takes_folders_files_and_arrays_and_can_be_called_again(untrained_mlp, tmp_path):
    digits = np.zeros((3, 28, 28), np.uint8)
    digits[:, 6:22, 12:16] = 255
    folder = render(tmp_path / "digits", "white_on_black", digits)
    network = Network.load(untrained_mlp / "model.npz")
    first = cudnnnet.predict(network, [folder, digits[0]])
    again = cudnnnet.predict(network, folder / "000.bmp")
    assert [result.image for result in first] == [str(folder / f"{index:03d}.bmp") for index in range(3)] + ["<array 3>"]
    assert all(result.error is None and result.probability == max(result.probabilities) for result in first)
    assert again[0].probabilities == first[0].probabilities == first[3].probabilities


def test_a_named_missing_file_is_an_error_and_the_rest_predicted(untrained_mlp, tmp_path):
    folder = render(tmp_path / "one", "white_on_black", np.pad(np.full((10, 4), 255, np.uint8), ((9, 9), (12, 12)))[None])
    finished, results = predict_cli(untrained_mlp / "model.npz", str(folder / "000.bmp"), str(tmp_path / "absent.png"))
    assert finished.returncode == 2
    assert finished.stderr.splitlines() == [f"cudnnnet-predict: error: {tmp_path / 'absent.png'}: no such file"]
    assert results[0]["digit"] is not None and results[1]["digit"] is None


# ---- the original's .bin files ------------------------------------------------------------------


def test_a_bin_directory_with_its_config_predicts_as_the_npz(untrained_mlp, rendered):
    config = str(REPO_ROOT / "configs" / "mnist_mlp.yaml")
    from_bin, bin_results = predict_cli(untrained_mlp / "pretrained", "--config", config, str(rendered["jpeg"]))
    from_npz, npz_results = predict_cli(untrained_mlp / "model.npz", str(rendered["jpeg"]))
    assert from_bin.returncode == 0 and from_npz.returncode == 0, from_bin.stderr + from_npz.stderr
    assert bin_results == npz_results


def test_a_bin_directory_without_config_is_a_one_line_error(untrained_mlp, tmp_path):
    finished, results = predict_cli(untrained_mlp / "pretrained", str(tmp_path))
    assert finished.returncode == 2 and results is None
    [line] = finished.stderr.splitlines()
    assert line.startswith("cudnnnet-predict: error: ") and str(untrained_mlp / "pretrained") in line
    assert "--config" in line


def test_a_bin_directory_of_another_network_is_named(untrained_mlp, tmp_path):
    config = str(REPO_ROOT / "configs" / "mnist_cnn.yaml")
    finished, _ = predict_cli(untrained_mlp / "pretrained", "--config", config, str(tmp_path))
    assert finished.returncode == 2
    [line] = finished.stderr.splitlines()
    assert "conv1.bin: missing" in line


# ---- the same checkpoint on the GPU and on the host ---------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("trained_on", ["cuda", "host"])
def test_a_checkpoint_predicts_the_same_on_gpu_and_host(cuda, mnist_dir, rendered, tmp_path, trained_on):
    trained = train_cli("configs/mnist_cnn.yaml", tmp_path, mnist_dir, "--steps", "60", device=trained_on)
    assert trained.returncode == 0, trained.stderr
    assert json.loads((tmp_path / "metrics.json").read_text())["backend"] == trained_on
    folder = str(rendered["blue_ink_on_cream"])
    on_gpu, gpu_results = predict_cli(tmp_path / "model.npz", folder, device="cuda")
    on_host, host_results = predict_cli(tmp_path / "model.npz", folder, device="host")
    assert on_gpu.returncode == 0 and on_host.returncode == 0, on_gpu.stderr + on_host.stderr
    assert [result["image"] for result in gpu_results] == [result["image"] for result in host_results]
    assert [result["digit"] for result in gpu_results] == [result["digit"] for result in host_results]
    np.testing.assert_allclose([result["probabilities"] for result in gpu_results],
                               [result["probabilities"] for result in host_results], rtol=0, atol=1e-5)
