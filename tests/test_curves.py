"""curves.png drawn with Pillow: two panels, both series in their colours, any number of epochs."""

import io
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from cudnnnet import curves
from cudnnnet.curves import plot_curves

TRAIN_COLOUR, TEST_COLOUR = (colour for _, _, colour in curves.SERIES)


def history(epochs: int, flat: bool = False) -> list[dict]:
    def value(start, end, epoch):
        return start if flat else start + (end - start) * epoch / max(epochs, 1)

    return [{"epoch": epoch + 1, "steps": 30 * (epoch + 1), "train_loss": value(2.0, 0.2, epoch),
             "test_loss": value(1.8, 0.3, epoch), "train_accuracy": value(0.4, 0.97, epoch),
             "test_accuracy": value(0.5, 0.96, epoch)} for epoch in range(epochs)]


def pixels(path) -> np.ndarray:
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (curves.WIDTH, curves.HEIGHT)
        return np.asarray(image.convert("RGB")).astype(int)


def colour_share(region: np.ndarray, colour) -> float:
    """The share of ``region``'s pixels within a small distance of ``colour``."""
    return float((np.abs(region - np.array(colour)).sum(axis=-1) < 30).mean())


@pytest.mark.parametrize("epochs", [1, 2, 10, 60])
def test_both_panels_show_both_series(tmp_path, epochs):
    path = tmp_path / "curves.png"
    plot_curves(history(epochs), path)
    image = pixels(path)
    for panel in (image[:, :curves.WIDTH // 2], image[:, curves.WIDTH // 2:]):
        assert (panel != 255).any(axis=-1).mean() > 0.02  # axes, grid, text and data, not a blank half
        assert colour_share(panel, TRAIN_COLOUR) > 1e-4 and colour_share(panel, TEST_COLOUR) > 1e-4
    assert len({tuple(pixel) for pixel in image.reshape(-1, 3)[::7]}) > 20  # smoothed lines and text


def test_higher_values_are_drawn_higher(tmp_path):
    rows = history(5)
    for row in rows:
        row["test_loss"] = row["train_loss"] + 1.0  # the test series lies above the train series throughout
    plot_curves(rows, tmp_path / "curves.png")
    loss_panel = pixels(tmp_path / "curves.png")[:, :curves.WIDTH // 2]
    mean_row = {}
    for name, colour in (("train", TRAIN_COLOUR), ("test", TEST_COLOUR)):
        rows_hit, _ = np.nonzero((np.abs(loss_panel - np.array(colour)).sum(axis=-1) < 30))
        mean_row[name] = rows_hit.mean()
    assert mean_row["test"] < mean_row["train"]  # image rows grow downwards


def test_flat_series_draw_without_error(tmp_path):
    plot_curves(history(4, flat=True), tmp_path / "curves.png")
    image = pixels(tmp_path / "curves.png")
    assert colour_share(image, TEST_COLOUR) > 1e-4


def test_empty_history_writes_nothing(tmp_path):
    plot_curves([], tmp_path / "curves.png")
    assert not any(tmp_path.iterdir())


def test_the_previous_figure_is_replaced_whole(tmp_path):
    path = tmp_path / "curves.png"
    path.write_bytes(b"old")
    plot_curves(history(3), path)
    assert pixels(path).shape == (curves.HEIGHT, curves.WIDTH, 3)
    assert [child.name for child in tmp_path.iterdir()] == ["curves.png"]  # no temporary file left


@pytest.mark.parametrize("size", [(1, 1), (7, 5), (1000, 400)])
def test_png_bytes_decode_to_the_same_pixels(size):
    rng = np.random.default_rng(3)
    array = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    with Image.open(io.BytesIO(curves.png_bytes(Image.fromarray(array, "RGB")))) as decoded:
        decoded.load()  # reads every chunk, checking its CRC
        assert decoded.format == "PNG" and decoded.mode == "RGB" and decoded.size == size
        assert np.array_equal(np.asarray(decoded), array)


def test_importing_the_module_does_not_import_pillow():
    code = ("import sys, cudnnnet; before = set(sys.modules); import cudnnnet.curves; "
            "print(sorted(name for name in set(sys.modules) - before if name.split('.')[0] == 'PIL'))")
    finished = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.strip() == "[]"
