"""Image files -> network inputs, prepared the way MNIST's digits were.

MNIST's digits are bright strokes on a black background, scaled to fit a 20x20 box (keeping the
aspect ratio, anti-aliased) and placed in a 28x28 frame so that their centre of mass is at the
frame's centre. ``preprocess`` does the same to any picture of one digit:

1. greyscale float in [0, 1] (alpha is composited onto white first; 16-bit images keep their depth);
2. inverted when the background is light (median of the border pixels > 0.5), so the digit is bright;
3. the background level (border median) subtracted and the ink stretched to a peak of 1;
4. the digit's box found: the bounding box of the pixels above ``BOX_THRESHOLD`` of the peak;
5. scaled so that box fits ``DIGIT_BOX`` x ``DIGIT_BOX`` (Lanczos on the float image, aspect ratio
   kept, peak stretched to 1 again), cropped with a margin of one output pixel so the faint
   anti-aliased edge below the threshold survives;
6. pasted into a ``size`` x ``size`` canvas with its centre of mass at the canvas centre (an
   integer shift, clipped so the digit stays inside). For ``size=32`` (LeNet-5) the digit box stays
   20x20: MNIST's 28x28 frame padded by 2 on every side;
7. optionally normalised: ``(x - mean) / std``.

The result is float32 shaped (1, size, size): one channel, ready to be stacked into an NCHW batch.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import warnings
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from ..errors import ImageError
from .pixels import IMAGE_SUFFIXES as _SUFFIXES
from .pixels import MAX_IMAGE_PIXELS, PHOTO_CHANNELS, RESIZE_MODES

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = frozenset(_SUFFIXES)  # what a folder given to predict is read for, as image-folder training reads
DEFAULT_MAX_PIXELS = MAX_IMAGE_PIXELS
DIGIT_BOX = 20  # MNIST's digits fit a 20x20 box
BOX_THRESHOLD = 0.1  # a pixel belongs to the digit's bounding box above this fraction of the peak
MIN_CONTRAST = 0.1  # ink fainter than this above the background is no digit
LIGHT_BACKGROUND = 0.5  # a border median above this means a dark digit on a light background

_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")
_WIDE_MODES = (*_SIXTEEN_BIT_MODES, "I", "F")  # one channel of more than 8 bits: Pillow's convert() clips them
# modes of one grey channel (with alpha or not): read as grey by channels "auto"; every other mode (RGB,
# RGBA, P, CMYK, YCbCr, ...) is colour
GREY_MODES = ("1", "L", "LA", "La", *_WIDE_MODES)
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, IndexError, KeyError, TypeError)
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)  # ITU-R 601-2, as Pillow's convert("L")


# ---- listing --------------------------------------------------------------------------------


def list_images(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """Expand folders to their image files (sorted by name, not recursive); keep files as given.

    A file named explicitly is always kept, whatever its suffix, so that loading it reports what is
    wrong with it; inside a folder only files whose suffix is in ``IMAGE_SUFFIXES`` are taken.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    found: list[Path] = []
    for path in map(Path, paths):
        found.extend(_images_in_folder(path) if path.is_dir() else [path])
    return found


def _images_in_folder(folder: Path) -> list[Path]:
    images = folder_images(folder)
    if not images:
        log.warning("%s: no image files (%s) in this folder", folder, ", ".join(sorted(IMAGE_SUFFIXES)))
    return images


def folder_images(folder: Path) -> list[Path]:
    """The image files (by suffix) in ``folder``, sorted by name, not recursive; hidden files (a Mac's
    ``._NAME.jpg`` metadata beside each photo, say) left out, as image-folder training leaves them."""
    return sorted(p for p in folder.iterdir()
                  if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith("."))


# ---- loading --------------------------------------------------------------------------------


def load_image(
    path: str | os.PathLike,
    size: int = 28,
    normalize: Sequence[float] | None = None,
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> np.ndarray:
    """Read one image file of a digit and return it MNIST-like, float32 shaped (1, size, size).

    Raises ImageError (one line naming the file) for a missing, empty, unreadable or too large
    file, or an image in which no digit is found. Images above ``max_pixels`` are refused from
    their header, before any pixel is decoded.
    """
    size, normalize = _check_size(size), _check_normalize(normalize)
    path = Path(path)
    _check_file(path)
    with warnings_logged(path):
        image = _open_image(path, max_pixels)
        try:
            grey = _to_grey(image, path)
        finally:
            image.close()
    return _digit_canvas(grey, size, normalize, path)


def preprocess(
    image: np.ndarray | Image.Image,
    size: int = 28,
    normalize: Sequence[float] | None = None,
) -> np.ndarray:
    """Prepare an in-memory image (PIL image or array) like ``load_image`` prepares a file.

    Arrays may be (H, W) grey, (H, W, 1|3|4) grey/RGB/RGBA or (1, H, W); uint8 is read as 0..255,
    uint16 as 0..65535, floats as 0..1 (or 0..255 when above 1).
    """
    size, normalize = _check_size(size), _check_normalize(normalize)
    if isinstance(image, Image.Image):
        source = getattr(image, "filename", "") or "<image>"
        return _digit_canvas(_to_grey(image, source), size, normalize, source)
    if isinstance(image, np.ndarray):
        return _digit_canvas(_array_to_grey(image), size, normalize, "<array>")
    raise TypeError(f"preprocess takes a PIL image or a NumPy array, got {type(image).__name__}")


def _check_size(size: int) -> int:
    """The canvas side: at least the 20-pixel digit box."""
    if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < DIGIT_BOX:
        raise ValueError(f"invalid image size {size!r}: needs an integer >= {DIGIT_BOX} (28 for MNIST, 32 for LeNet-5)")
    return int(size)


def _check_file(path: Path) -> None:
    if not path.exists():
        if path.is_symlink():
            raise ImageError(f"{path}: a symbolic link to {os.readlink(path)}, which does not exist or is a link "
                             f"in a loop")
        raise ImageError(f"{path}: no such file")
    if path.is_dir():
        raise ImageError(f"{path}: is a folder, not an image file")
    if not path.is_file():
        raise ImageError(f"{path}: not a regular file (a pipe or a device); give an image file")
    if path.stat().st_size == 0:
        raise ImageError(f"{path}: the file is empty (0 bytes)")


@contextlib.contextmanager
def warnings_logged(path: str | os.PathLike) -> Iterator[None]:
    """Pillow's warnings while it reads ``path`` (corrupt EXIF data, say) logged at debug level, not
    printed: the image is read all the same, or refused with its own one-line error."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            for warning in caught:
                log.debug("%s: %s", path, warning.message)


def _open_image(path: Path, max_pixels: int) -> Image.Image:
    """Open lazily (header only), refuse images above ``max_pixels``, then decode the first frame."""
    image = _open_header(path)
    try:
        _check_pixel_count(image, path, max_pixels)
        image.load()
    except _DECODE_ERRORS as exc:
        image.close()
        raise ImageError(f"{path}: cannot decode the image ({_one_line(exc)})") from exc
    except BaseException:
        image.close()
        raise
    return image


def _open_header(path: Path) -> Image.Image:
    """Image.open reads the header only; Pillow itself refuses decompression bombs here."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return Image.open(path)
    except Image.DecompressionBombError as exc:
        raise ImageError(f"{path}: the image is too large to decode ({_one_line(exc)})") from exc
    except UnidentifiedImageError as exc:
        raise ImageError(f"{path}: not an image file Pillow can read") from exc
    except _DECODE_ERRORS as exc:
        raise ImageError(f"{path}: cannot open the image ({_one_line(exc)})") from exc


def _check_pixel_count(image: Image.Image, path: Path, max_pixels: int) -> None:
    width, height = image.size
    if width * height > max_pixels:
        raise ImageError(
            f"{path}: the image is {width}x{height} ({width * height / 1e6:.1f} megapixels), "
            f"larger than the limit of {max_pixels / 1e6:g} megapixels"
        )


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


# ---- greyscale ------------------------------------------------------------------------------


def _to_grey(image: Image.Image, source) -> np.ndarray:
    """A float32 (H, W) greyscale copy of ``image`` in [0, 1], alpha composited onto white."""
    try:
        image = upright(image)
        if image.mode in _WIDE_MODES:
            clear = _transparent_samples(image)
            grey = _wide_samples(image, source)
            return grey if clear is None else np.where(clear, np.float32(1.0), grey)
        return np.asarray(on_white(image).convert("L"), dtype=np.float32) / 255.0
    except _DECODE_ERRORS as exc:
        raise ImageError(f"{source}: cannot convert the {image.mode} image to greyscale ({_one_line(exc)})") from exc


def _wide_samples(image: Image.Image, source) -> np.ndarray:
    """A float32 (H, W) copy in [0, 1] of a 16-bit, 32-bit integer or float image (one channel)."""
    if image.mode in _SIXTEEN_BIT_MODES:
        return np.asarray(image, dtype=np.float32) / 65535.0
    return _scale_unit(_finite(np.asarray(image, dtype=np.float32), source))


def eight_bit(image: Image.Image, source) -> Image.Image:
    """An 8-bit grey ("L") copy of a 16-bit, 32-bit integer or float image, its samples scaled to
    [0, 1] as a digit's are (Pillow's convert() would clip them) and samples above 65535 saturated at
    white; grey with alpha ("LA") where the image has a transparent grey value (a 16-bit PNG's tRNS
    chunk), its samples of that value transparent; any other image as it is."""
    if image.mode not in _WIDE_MODES:
        return image
    unit = np.clip(_wide_samples(image, source), 0.0, 1.0)
    grey = np.round(unit * 255).astype(np.uint8)
    clear = _transparent_samples(image)
    if clear is None:
        return Image.fromarray(grey, "L")
    return Image.fromarray(np.dstack([grey, np.where(clear, 0, 255).astype(np.uint8)]), "LA")


def _transparent_samples(image: Image.Image) -> np.ndarray | None:
    """Where the one-channel image of a wide mode holds its transparent grey value (``info["transparency"]``,
    a PNG's tRNS chunk, compared with the samples as stored); None where it names none."""
    key = image.info.get("transparency")
    if not isinstance(key, (int, np.integer)) or isinstance(key, bool):
        return None
    return np.asarray(image) == key


def upright(image: Image.Image) -> Image.Image:
    """Apply the EXIF orientation of photos taken with a rotated camera (a no-op otherwise)."""
    try:
        return ImageOps.exif_transpose(image)
    except _DECODE_ERRORS:
        log.debug("ignoring an unreadable EXIF orientation", exc_info=True)
        return image


def _has_alpha(image: Image.Image) -> bool:
    return image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info


def on_white(image: Image.Image) -> Image.Image:
    """``image`` composited onto a white background (RGBA, opaque) where it has transparency (an alpha
    channel, or a transparent palette entry or colour key); else ``image`` itself."""
    if not _has_alpha(image):
        return image
    white = Image.new("RGBA", image.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, image.convert("RGBA"))


def _scale_unit(values: np.ndarray) -> np.ndarray:
    """Read integer-valued or float samples as [0, 1]: 0..1 as is, else 0..255, else 0..65535."""
    values = np.clip(values, 0.0, None)
    peak = float(values.max()) if values.size else 0.0
    if peak <= 1.0:
        return values
    return values / (255.0 if peak <= 255.0 else 65535.0)


def _image_array(array: np.ndarray) -> np.ndarray:
    """(H, W), (H, W, 1|3|4) or (1, H, W) samples as (H, W) or (H, W, 3|4); ImageError for another shape."""
    if array.ndim == 3 and array.shape[0] == 1 and array.shape[-1] not in (3, 4):
        array = array[0]
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[-1] not in (3, 4)) or 0 in array.shape:
        raise ImageError(f"<array>: cannot read an array of shape {array.shape} as an image (H, W) or (H, W, 1|3|4)")
    return array


def _array_to_pixels(array: np.ndarray) -> np.ndarray:
    """(H, W), (H, W, 1|3|4) or (1, H, W) samples -> uint8 (H, W) or (H, W, 3|4), each sample read as
    ``_array_to_unit`` reads it (floats in [0, 1] or [0, 255], 16-bit, booleans)."""
    array = _image_array(array)
    if array.dtype == np.uint8:
        return np.ascontiguousarray(array)
    return np.rint(_array_to_unit(array) * 255).astype(np.uint8)


def _array_to_grey(array: np.ndarray) -> np.ndarray:
    """(H, W), (H, W, 1|3|4) or (1, H, W) samples -> float32 (H, W) in [0, 1]."""
    values = _array_to_unit(_image_array(array))
    if values.ndim == 2:
        return values
    if values.shape[-1] == 4:
        alpha = values[..., 3:]
        values = values[..., :3] * alpha + (1.0 - alpha)
    return values @ _LUMA


def _array_to_unit(array: np.ndarray) -> np.ndarray:
    if array.dtype == np.bool_:
        return array.astype(np.float32)
    if array.dtype == np.uint8:
        return array.astype(np.float32) / 255.0
    if array.dtype == np.uint16:
        return array.astype(np.float32) / 65535.0
    if not np.issubdtype(array.dtype, np.number) or np.iscomplexobj(array):
        raise ImageError(f"<array>: cannot read an array of dtype {array.dtype} as an image")
    return _scale_unit(_finite(array.astype(np.float32), "<array>"))


def _finite(values: np.ndarray, source) -> np.ndarray:
    """``values`` when every sample is finite; a float image (TIFF, PFM) may hold NaN or infinities."""
    bad = values.size - int(np.count_nonzero(np.isfinite(values)))
    if bad:
        raise ImageError(f"{source}: the image holds NaN or infinite values ({bad} of its {values.size} samples); "
                         f"an image holds finite values only")
    return values


# ---- the MNIST-like digit -------------------------------------------------------------------


def _digit_canvas(grey: np.ndarray, size: int, normalize, source) -> np.ndarray:
    """grey (H, W) in [0, 1], any polarity -> float32 (1, size, size), the digit bright and centred."""
    ink = _ink(grey, source)
    digit = _scaled_digit(ink, _digit_box(ink))
    canvas = _paste_centred(digit, size)
    return _normalized(canvas, normalize)[np.newaxis]


def _ink(grey: np.ndarray, source) -> np.ndarray:
    """The digit bright on a zero background, peak 1: inverted if light, background subtracted."""
    background = float(np.median(_border(grey)))
    if background > LIGHT_BACKGROUND:
        grey, background = 1.0 - grey, 1.0 - background
    ink = np.clip(grey - background, 0.0, None)
    peak = float(ink.max())
    if peak < MIN_CONTRAST:
        raise ImageError(
            f"{source}: no digit found (the {grey.shape[1]}x{grey.shape[0]} image is blank or uniform)"
        )
    return (ink / peak).astype(np.float32)


def _border(grey: np.ndarray) -> np.ndarray:
    """The pixels of the outermost frame (all of them for an image 1 or 2 pixels thin)."""
    return np.concatenate([grey[0], grey[-1], grey[1:-1, 0], grey[1:-1, -1]])


def _digit_box(ink: np.ndarray) -> tuple[int, int, int, int]:
    """(top, bottom, left, right), exclusive ends: the box of the pixels above BOX_THRESHOLD·peak."""
    mask = ink > BOX_THRESHOLD
    rows = np.flatnonzero(mask.any(axis=1))
    cols = np.flatnonzero(mask.any(axis=0))
    return rows[0], rows[-1] + 1, cols[0], cols[-1] + 1


def _scaled_digit(ink: np.ndarray, box: tuple[int, int, int, int]) -> np.ndarray:
    """The digit scaled so its box's longer side is DIGIT_BOX pixels, aspect ratio kept; peak 1.

    Enlarging crops the box exactly (interpolating past a hard edge would blur it outward).
    Shrinking, or keeping the size, maps the box onto exactly DIGIT_BOX pixels and keeps one
    output pixel of margin around it, so the faint anti-aliased edge below the threshold
    survives (MNIST's own digits then come back unchanged).
    """
    top, bottom, left, right = box
    height, width = bottom - top, right - left
    scale = DIGIT_BOX / max(height, width)
    out_width, out_height = max(1, round(width * scale)), max(1, round(height * scale))
    if scale > 1:
        return _resize(ink[top:bottom, left:right], (out_width, out_height))
    margin_x, margin_y = width / out_width, height / out_height  # one output pixel, in input pixels
    pad = math.ceil(max(margin_x, margin_y))
    region = _crop_padded(ink, top - pad, bottom + pad, left - pad, right + pad)
    source = (pad - margin_x, pad - margin_y, pad + width + margin_x, pad + height + margin_y)
    return _resize(region, (out_width + 2, out_height + 2), source)


def _crop_padded(ink: np.ndarray, top: int, bottom: int, left: int, right: int) -> np.ndarray:
    """ink[top:bottom, left:right], with zeros (the background) where that reaches past the image."""
    height, width = ink.shape
    inside = ink[max(top, 0) : min(bottom, height), max(left, 0) : min(right, width)]
    padding = ((max(-top, 0), max(bottom - height, 0)), (max(-left, 0), max(right - width, 0)))
    return np.pad(inside, padding)


def _resize(region: np.ndarray, size: tuple[int, int], source_box=None) -> np.ndarray:
    """Lanczos-resample ``source_box`` of a float image (all of it by default) to ``size``; peak 1."""
    if source_box is None and size == (region.shape[1], region.shape[0]):
        return region
    image = Image.fromarray(np.ascontiguousarray(region, dtype=np.float32))
    resized = np.asarray(image.resize(size, Image.Resampling.LANCZOS, box=source_box), dtype=np.float32)
    resized = np.clip(resized, 0.0, None)
    return resized / resized.max()


def _paste_centred(digit: np.ndarray, size: int) -> np.ndarray:
    """A size x size canvas with ``digit`` shifted so its centre of mass is at the centre."""
    digit = _trim_margin(_trim_empty(digit), size)
    height, width = digit.shape
    rows, cols = np.indices(digit.shape, dtype=np.float64)
    mass = float(digit.sum())
    centre = size / 2
    top = _clip_offset(centre - float((rows * digit).sum()) / mass, size - height)
    left = _clip_offset(centre - float((cols * digit).sum()) / mass, size - width)
    canvas = np.zeros((size, size), dtype=np.float32)
    canvas[top : top + height, left : left + width] = digit
    return canvas


def _trim_empty(digit: np.ndarray) -> np.ndarray:
    """Drop all-zero outer rows and columns, which would only limit where the digit can go."""
    rows = np.flatnonzero(digit.any(axis=1))
    cols = np.flatnonzero(digit.any(axis=0))
    return digit[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]


def _trim_margin(digit: np.ndarray, size: int) -> np.ndarray:
    """Cut the faint margin evenly where the digit and its margin exceed a canvas as small as 20."""
    excess_rows, excess_cols = max(digit.shape[0] - size, 0), max(digit.shape[1] - size, 0)
    return digit[excess_rows // 2 : digit.shape[0] - (excess_rows - excess_rows // 2),
                 excess_cols // 2 : digit.shape[1] - (excess_cols - excess_cols // 2)]


def _clip_offset(offset: float, largest: int) -> int:
    return int(min(max(round(offset), 0), largest))


def _check_normalize(normalize: Sequence[float] | None) -> tuple[float, float] | None:
    if normalize is None:
        return None
    try:
        mean, std = (float(v) for v in normalize)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"invalid normalize {normalize!r}: needs (mean, std)") from exc
    if not std > 0:
        raise ValueError(f"invalid normalize {normalize!r}: std must be positive")
    return mean, std


def _normalized(canvas: np.ndarray, normalize: tuple[float, float] | None) -> np.ndarray:
    if normalize is None:
        return canvas
    mean, std = normalize
    return ((canvas - mean) / std).astype(np.float32)


# ---- natural images: fitted to the input (crop or stretch) ---------------------------------


def load_photo(path: str | os.PathLike, channels: int, height: int, width: int,
               max_pixels: int = DEFAULT_MAX_PIXELS, resize: str = "crop") -> np.ndarray:
    """uint8 (channels, height, width) of the image file ``path`` as a network trained on an image folder
    or CIFAR-10 reads it (``photo_array``: grey or RGB as ``channels`` says, transparency composited onto
    white, fitted to the target as ``resize`` says)."""
    return _channels_first(photo_file_array(path, channels, (height, width), resize, max_pixels))


def photo_file_array(path: str | os.PathLike, channels: int | str, size: tuple[int, int] | None, resize: str = "crop",
                     max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """``photo_array`` of the image file ``path``, opened as predict opens it: ImageError naming it for a
    file that is missing, empty, not an image, or above ``max_pixels`` (refused from its header, before any
    pixel is decoded)."""
    path = Path(path)
    _check_file(path)
    with warnings_logged(path):
        image = _open_image(path, max_pixels)
        try:
            return photo_array(image, channels, size, path, resize)
        finally:
            image.close()


def _channels_first(array: np.ndarray) -> np.ndarray:
    """(H, W) grey -> (1, H, W); (H, W, 3) RGB -> (3, H, W)."""
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


def photo_pixels(image: Image.Image | np.ndarray, channels: int, height: int, width: int, source="<image>",
                 resize: str = "crop") -> np.ndarray:
    """``load_photo`` of an in-memory image: a PIL image, or an array of (H, W), (H, W, 1|3|4) or
    (1, H, W) samples read as ``preprocess`` reads them (uint8 0..255, floats in [0, 1] or [0, 255],
    16-bit; finite)."""
    if isinstance(image, np.ndarray):
        image = Image.fromarray(_array_to_pixels(image))
    return _channels_first(photo_array(image, channels, (height, width), source, resize))


def photo_array(image: Image.Image, channels: int | str, size: tuple[int, int] | None, source="<image>",
                resize: str = "crop") -> np.ndarray:
    """uint8 (H, W) grey or (H, W, 3) RGB pixels of ``image``: the one conversion of a photo, in
    image-folder training (``image_folder.decode_files``) and in prediction (``photo_pixels``).

    1. turned upright by its EXIF orientation;
    2. 16-bit, 32-bit integer and float samples scaled to 8 bits (``eight_bit``);
    3. transparency composited onto white (``on_white``);
    4. converted to grey (``channels`` 1: ITU-R 601-2 luma, Pillow's ``convert("L")``) or RGB (3), before
       any resizing; ``"auto"`` keeps an image of a ``GREY_MODES`` mode grey and makes any other RGB (a
       grey image copied into three channels is then what RGB makes of it);
    5. fitted to ``size`` (height, width) as ``resize`` says (``fitted``), where a size is given.

    ImageError naming ``source`` for an image that cannot be converted.
    """
    if channels not in PHOTO_CHANNELS or isinstance(channels, bool):
        raise ValueError(f"invalid channels {channels!r}: expected one of 1, 3, auto")
    grey = channels == 1 or (channels == "auto" and image.mode in GREY_MODES)
    try:
        image = on_white(eight_bit(upright(image), source)).convert("L" if grey else "RGB")
        if size is not None:
            image = fitted(image, *size, resize)
        return np.asarray(image, dtype=np.uint8)
    except _DECODE_ERRORS as exc:
        raise ImageError(f"{source}: cannot convert the {image.mode} image ({_one_line(exc)})") from exc


def fitted(image: Image.Image, height: int, width: int, resize: str = "crop") -> Image.Image:
    """``image`` as ``height`` × ``width`` pixels, bilinear: ``crop`` resizes it so its shorter side
    covers them and takes the centre (the aspect ratio kept, the overhang cut off); ``stretch``
    resizes it to them (the aspect ratio changed). An image of that size already is returned as it is.
    The one geometry of image-folder training and of prediction (step 5 of ``photo_array``)."""
    if resize not in RESIZE_MODES:
        raise ValueError(f"invalid resize {resize!r}: expected one of {', '.join(RESIZE_MODES)}")
    if image.size == (width, height):
        return image
    if resize == "stretch":
        return image.resize((width, height), Image.Resampling.BILINEAR)
    return _covered_centre(image, height, width)


def _covered_centre(image: Image.Image, height: int, width: int) -> Image.Image:
    """The centre ``height`` × ``width`` of ``image`` resized so its shorter side covers them (bilinear).

    Only the crop is resampled (``resize`` with the crop's box in the image's own pixels), never the
    whole covering image: a 1-pixel-high strip 50 megapixels long would cover a 32×32 input at
    32 × 1.6 billion pixels.
    """
    scale = max(height / image.height, width / image.width)
    covering = (max(width, round(image.width * scale)), max(height, round(image.height * scale)))
    if covering == image.size:
        left, top = (covering[0] - width) // 2, (covering[1] - height) // 2
        return image.crop((left, top, left + width, top + height))
    x_step, y_step = image.width / covering[0], image.height / covering[1]  # image pixels per covering pixel
    left, top = (covering[0] - width) // 2 * x_step, (covering[1] - height) // 2 * y_step
    box = (left, top, left + width * x_step, top + height * y_step)
    return image.resize((width, height), Image.Resampling.BILINEAR, box=box)
