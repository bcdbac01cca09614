"""``curves.png``: loss and accuracy per epoch, train and test (or validation), and the learning rate,
drawn with Pillow.

Two panels side by side (a third with the learning rate), each with its title, axis labels, a light
grid, epoch ticks, the train and test series as lines with round markers, and a legend. A point sits at its fractional epoch
(steps / steps per epoch), so a run stopped part-way through an epoch is drawn where it stopped.
The y axis leaves a band above the data for the legend, which therefore hides no point or line. The figure is drawn at
``SCALE`` times its size and shrunk at the end by averaging each SCALE × SCALE block (Image.reduce),
which smooths lines, markers and text. Pillow draws; the PNG file is written here (unfiltered rows,
fast zlib level), which skips the image plugins Pillow's save imports and its per-row filter search.
Pillow is imported when a figure is drawn, so importing this module costs nothing.
"""

from __future__ import annotations

import logging
import math
import struct
import zlib
from pathlib import Path

from ..io.files import atomic_write

log = logging.getLogger(__name__)

WIDTH, HEIGHT = 1000, 400  # pixels of the PNG, as matplotlib's 10 × 4 inches at 100 dpi
PANEL_WIDTH = WIDTH // 2  # a third panel, the learning rate's, widens the figure by one more
SCALE = 2
FONT_SIZE = 13 * SCALE
# left, top, right, bottom margins of a panel's plot area, in drawing pixels
MARGINS = (75 * SCALE, 35 * SCALE, 15 * SCALE, 50 * SCALE)
WHITE, BLACK, GRID, LEGEND_EDGE = (255, 255, 255), (0, 0, 0), (222, 222, 222), (204, 204, 204)
SERIES = (  # (history key suffix, legend label, colour): matplotlib's first two default colours
    ("train", "train (mean over the epoch)", (31, 119, 180)),
    ("test", "test (end of the epoch)", (255, 127, 14)),
)
VALIDATION_SERIES = ("validation", "validation (end of the epoch)", SERIES[1][2])  # rows of a run with data.validation
LEARNING_RATE = ("learning rate", (44, 160, 44))  # matplotlib's third default colour
PANELS = ("loss", "accuracy")
LINE_WIDTH, MARKER_RADIUS = 2 * SCALE, 4 * SCALE
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_COMPRESSION = 1  # zlib level: the figure is mostly flat colour, so the fastest level costs little size


def plot_curves(history: list[dict], path: Path, steps_per_epoch: int | None = None,
                learning_rates: list[tuple[float, float]] | None = None) -> None:
    """Write ``path`` (PNG, atomically) showing ``history``'s rows; an empty history writes nothing.

    With ``steps_per_epoch``, a row is drawn at its fractional epoch (its ``steps`` / steps_per_epoch),
    else at its ``epoch`` number. ``learning_rates``: (fractional epoch, rate) points of the run's
    learning rate, drawn as a line in a third panel."""
    if not history:
        return
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(FONT_SIZE)
    epochs = [_epoch_of(row, steps_per_epoch) for row in history]
    panels = [(metric, _epoch_series(history, epochs, metric), True) for metric in PANELS]
    if learning_rates:
        label, colour = LEARNING_RATE
        panels.append((label, [(label, colour, [x for x, _ in learning_rates], [y for _, y in learning_rates])], False))
    canvas = Image.new("RGB", (PANEL_WIDTH * len(panels) * SCALE, HEIGHT * SCALE), WHITE)
    panel_width = PANEL_WIDTH * SCALE
    for index, (title, series, markers) in enumerate(panels):
        box = (index * panel_width + MARGINS[0], MARGINS[1],
               (index + 1) * panel_width - MARGINS[2], canvas.height - MARGINS[3])
        _draw_panel(canvas, ImageDraw.Draw(canvas), font, box, series, title, markers)
    figure = canvas.reduce(SCALE)
    with atomic_write(path) as file:
        file.write(png_bytes(figure))
    log.debug("wrote %s (%d epochs)", path, len(history))


def png_bytes(image) -> bytes:
    """An RGB Pillow image as a PNG file: 8-bit truecolour, no interlacing, every row unfiltered."""
    width, height = image.size
    pixels, stride = image.tobytes(), 3 * width
    rows = b"".join(b"\0" + pixels[start:start + stride] for start in range(0, len(pixels), stride))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # depth 8, colour type 2 (RGB)
    return PNG_SIGNATURE + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", zlib.compress(rows, PNG_COMPRESSION)) \
        + _png_chunk(b"IEND", b"")


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    """length, type, data, CRC-32 of type and data."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _epoch_of(row: dict, steps_per_epoch: int | None) -> float:
    """Where a history row is drawn: its fractional epoch where the steps per epoch are known."""
    if steps_per_epoch and isinstance(row.get("steps"), (int, float)):
        return row["steps"] / steps_per_epoch
    return float(row["epoch"])


def _epoch_series(history: list[dict], epochs: list[float], metric: str) -> list:
    """[(label, colour, x values, y values)] of the train and test (or validation) figures of ``metric``."""
    second = VALIDATION_SERIES if f"validation_{metric}" in history[0] else SERIES[1]
    return [(label, colour, epochs, [float(row[f"{key}_{metric}"]) for row in history])
            for key, label, colour in (SERIES[0], second)]


def _draw_panel(canvas, draw, font, box, series, metric, markers: bool = True) -> None:
    """A panel titled ``metric`` of ``series`` [(label, colour, x values, y values)]: each point marked where
    ``markers``, else a line over a y axis from 0 (the learning rate's)."""
    entries = [(label, colour) for label, colour, _, _ in series]
    x_range = _padded_range([x for _, _, xs, _ in series for x in xs])
    values = [value for _, _, _, values in series for value in values]
    y_range = _padded_range(values) if markers else _from_zero(values)
    y_range = _with_legend_band(y_range, box, _legend_size(font, entries)[1] + 16 * SCALE)
    x_ticks = _ticks(*x_range, min_step=1 if x_range[1] - x_range[0] >= 2 else 0.0)
    y_ticks = _ticks(*y_range)
    to_pixel = _mapping(box, x_range, y_range)
    left, top, right, bottom = box
    for tick in x_ticks:
        x, _ = to_pixel(tick, y_range[0])
        draw.line((x, top, x, bottom), fill=GRID, width=SCALE)
        draw.text((x, bottom + 4 * SCALE), _tick_label(tick, x_ticks), fill=BLACK, font=font, anchor="mt")
    for tick in y_ticks:
        _, y = to_pixel(x_range[0], tick)
        draw.line((left, y, right, y), fill=GRID, width=SCALE)
        draw.text((left - 5 * SCALE, y), _tick_label(tick, y_ticks), fill=BLACK, font=font, anchor="rm")
    for _, colour, xs, values in series:
        points = [to_pixel(x, y) for x, y in zip(xs, values) if math.isfinite(y)]
        if len(points) > 1:
            draw.line(points, fill=colour, width=LINE_WIDTH, joint="curve")
        for x, y in points if markers or len(points) == 1 else ():
            draw.ellipse((x - MARKER_RADIUS, y - MARKER_RADIUS, x + MARKER_RADIUS, y + MARKER_RADIUS), fill=colour)
    draw.rectangle(box, outline=BLACK, width=SCALE)
    draw.text(((left + right) / 2, top - 8 * SCALE), metric, fill=BLACK, font=font, anchor="md")
    draw.text(((left + right) / 2, canvas.height - 6 * SCALE), "epoch", fill=BLACK, font=font, anchor="md")
    _draw_vertical_text(canvas, font, metric, (box[0] - 70 * SCALE, (top + bottom) // 2))
    _draw_legend(draw, font, box, entries)


def _padded_range(values: list[float]) -> tuple[float, float]:
    """(low, high) around the finite ``values`` with 5 % room; a single value gets room of its own size."""
    finite = [value for value in values if math.isfinite(value)] or [0.0, 1.0]
    low, high = min(finite), max(finite)
    pad = (high - low) * 0.05 or max(abs(high) * 0.05, 0.5)
    return low - pad, high + pad


def _from_zero(values: list[float]) -> tuple[float, float]:
    """(0, a little above the largest finite value), or (0, 1) where none is above 0."""
    high = max((value for value in values if math.isfinite(value)), default=0.0)
    return 0.0, high * 1.05 if high > 0 else 1.0


def _with_legend_band(y_range: tuple[float, float], box, band: float) -> tuple[float, float]:
    """``y_range`` raised at the top so that the highest value is drawn ``band`` drawing pixels below
    the plot area's top edge: the legend goes in that band."""
    low, high = y_range
    height = box[3] - box[1]
    return low, low + (high - low) * height / max(height - band, 1)


def _ticks(low: float, high: float, min_step: float = 0.0, count: int = 5) -> list[float]:
    """Round tick values (steps of 1, 2 or 5 × 10^k, at least ``min_step``) from ``low`` to ``high``."""
    raw = (high - low) / count
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = max(min_step, next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw))
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _tick_label(value: float, ticks: list[float]) -> str:
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    return f"{round(value, decimals) + 0.0:.{decimals}f}"  # + 0.0: no "-0.00"


def _mapping(box, x_range, y_range):
    """Data (x, y) → drawing pixel (x, y), y growing upwards."""
    left, top, right, bottom = box
    x_scale = (right - left) / (x_range[1] - x_range[0])
    y_scale = (bottom - top) / (y_range[1] - y_range[0])
    return lambda x, y: (left + (x - x_range[0]) * x_scale, bottom - (y - y_range[0]) * y_scale)


def _draw_vertical_text(canvas, font, text: str, left_middle: tuple[int, int]) -> None:
    """``text`` read bottom to top, its left edge at ``left_middle``'s x, centred on its y."""
    from PIL import Image, ImageDraw

    width = int(font.getlength(text)) + 2 * SCALE
    label = Image.new("RGB", (width, FONT_SIZE + 4 * SCALE), WHITE)
    ImageDraw.Draw(label).text((SCALE, 0), text, fill=BLACK, font=font)
    label = label.rotate(90, expand=True)
    canvas.paste(label, (left_middle[0], left_middle[1] - label.height // 2))


def _legend_size(font, entries) -> tuple[int, int]:
    """(width, height) of the legend in drawing pixels."""
    row_height, sample = FONT_SIZE + 6 * SCALE, 24 * SCALE
    return (sample + 12 * SCALE + max(int(font.getlength(label)) for label, _ in entries),
            row_height * len(entries) + 6 * SCALE)


def _draw_legend(draw, font, box, entries) -> tuple[float, float, float, float]:
    """A framed legend in the plot area's top-right corner, in the band the y axis leaves above the
    data: a marked line and a label per series. Returns its frame (left, top, right, bottom)."""
    row_height, sample = FONT_SIZE + 6 * SCALE, 24 * SCALE
    width, height = _legend_size(font, entries)
    right = box[2] - 8 * SCALE
    top = box[1] + 8 * SCALE
    draw.rectangle((right - width, top, right, top + height), fill=WHITE, outline=LEGEND_EDGE, width=SCALE)
    for row, (label, colour) in enumerate(entries):
        y = top + 3 * SCALE + row_height * row + row_height // 2
        x = right - width + 4 * SCALE
        draw.line((x, y, x + sample, y), fill=colour, width=LINE_WIDTH)
        centre = x + sample // 2
        draw.ellipse((centre - MARKER_RADIUS, y - MARKER_RADIUS, centre + MARKER_RADIUS, y + MARKER_RADIUS), fill=colour)
        draw.text((x + sample + 6 * SCALE, y), label, fill=BLACK, font=font, anchor="lm")
    return right - width, top, right, top + height
