"""curves.png drawn with Pillow: two panels, both series in their colours, any number of epochs."""

import io
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from cudnnnet.train import curves
from cudnnnet.train.curves import plot_curves

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
    code = ("import sys, cudnnnet; before = set(sys.modules); import cudnnnet.train.curves; "
            "print(sorted(name for name in set(sys.modules) - before if name.split('.')[0] == 'PIL'))")
    finished = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.strip() == "[]"


@pytest.fixture
def drawn(monkeypatch):
    """What plot_curves draws, per panel: the data markers (centres, drawn before the legend) and the legend's frame."""
    from PIL import ImageDraw

    panels, markers = [], []
    ellipse = ImageDraw.ImageDraw.ellipse

    def record_ellipse(draw, box, *args, **kwargs):
        markers.append(((box[0] + box[2]) / 2, (box[1] + box[3]) / 2, (box[2] - box[0]) / 2))
        return ellipse(draw, box, *args, **kwargs)

    legend = curves._draw_legend

    def record_legend(*args, **kwargs):
        points = list(markers)
        frame = legend(*args, **kwargs)
        panels.append((points, frame))
        markers.clear()  # the legend's own markers too
        return frame

    monkeypatch.setattr(ImageDraw.ImageDraw, "ellipse", record_ellipse)
    monkeypatch.setattr(curves, "_draw_legend", record_legend)
    return panels


def rising(epochs: int) -> list[dict]:
    return [{**row, "train_accuracy": 0.9 + 0.01 * index, "test_accuracy": 0.99, "train_loss": 0.1,
             "test_loss": 0.2 - 0.01 * index} for index, row in enumerate(history(epochs))]


@pytest.mark.parametrize("rows", [history(1), history(2), history(10, flat=True), rising(1), rising(5)],
                         ids=["one epoch", "two epochs", "flat", "one epoch, high accuracy", "rising to the top"])
def test_the_legend_hides_no_point(tmp_path, drawn, rows):
    plot_curves(rows, tmp_path / "curves.png", steps_per_epoch=30)
    assert len(drawn) == len(curves.PANELS)
    for points, (left, top, right, bottom) in drawn:
        assert len(points) == 2 * len(rows)  # every point of both series was drawn
        for x, y, radius in points:
            clear = x + radius < left or x - radius > right or y + radius < top or y - radius > bottom
            assert clear, f"a point at ({x:.0f}, {y:.0f}) is under the legend {left, top, right, bottom}"


def test_points_sit_at_their_fractional_epoch(tmp_path, drawn):
    """Steps 10, 30 and 45 of 30 an epoch are epochs 1/3, 1 and 1.5, spaced in that proportion."""
    rows = [{**row, "epoch": epoch, "steps": steps} for row, epoch, steps in zip(history(3), (1, 1, 2), (10, 30, 45))]
    plot_curves(rows, tmp_path / "curves.png", steps_per_epoch=30)
    points, _ = drawn[0]
    first, second, third = sorted(x for x, _, _ in points[:3])
    assert (second - first) / (third - second) == pytest.approx((1 - 1 / 3) / 0.5, rel=1e-3)
