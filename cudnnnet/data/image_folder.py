"""A folder of labelled images: ``root/<class>/<image>``, read once into uint8 pixels and cached.

With ``root/train/<class>/`` and ``root/test/<class>/`` the two splits are those folders; else the
images of ``root/<class>/`` are split by ``data.test_fraction`` with ``data.split_seed``. Classes
are the sorted sub-folder names. Images are decoded with Pillow in worker processes and converted by
``images.photo_array``, the conversion prediction makes too: turned upright, 16-bit and float samples
scaled to 8 bits, transparency composited onto white, converted to grey (1 channel) or RGB (3;
``data.channels: auto`` takes 3 as soon as one image has colour, grey images then in every channel)
and fitted to ``data.image_size`` where it is given (else all must share one size) as ``data.resize``
says: ``crop`` (the default) resizes an image so its shorter side covers that size and takes the
centre, ``stretch`` resizes it to that size.

The decoded array is cached beside MNIST's parsed files (``mnist.parsed_cache_dir()/folders``),
keyed by the folder's file list with every file's size and mtime and by the recipe, so a second
run reads one ``.npy`` instead of decoding. An entry is three files, written in this order:
``KEY.pixels.npy``, ``KEY.labels.npy`` and ``KEY.json``, which records the SHA-256 of both arrays
(``cache.array_digest``); an entry without it, or whose arrays no longer have those digests (damaged
on disk: a warning), is decoded again and rewritten. A file Pillow cannot decode, or an image above
predict's pixel limit (``images.DEFAULT_MAX_PIXELS``, read from its header), is named; with
``data.corrupt: skip`` it is left out (and logged), else the load is refused.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import CudnnnetError, DataError, ImageError
from ..io import cache
from .pixels import IMAGE_SUFFIXES, PHOTO_CHANNELS, RESIZE_MODES, Split

logger = logging.getLogger(__name__)

CHUNK = 512  # images per task sent to a worker process
MAX_FOLDER_BYTES = 1 << 33  # decoded pixels a folder may make
CACHE_FORMAT = 7  # raised whenever decoding or the entry's files change, so that cached folders are decoded again
ARRAYS = ("pixels", "labels")  # an entry's arrays, KEY.<name>.npy, written before its KEY.json


def load_image_folder(data, split: str):
    """The Split ``split`` of the folder ``data.dir`` (a DataConfig with dataset image-folder)."""

    if data.resize not in RESIZE_MODES:
        raise DataError(f"invalid data.resize {data.resize!r}: expected one of {', '.join(RESIZE_MODES)}")
    if data.channels not in PHOTO_CHANNELS or isinstance(data.channels, bool):
        raise DataError(f"invalid data.channels {data.channels!r}: expected 1, 3 or auto")
    root = Path(data.dir)
    if not root.is_dir():
        raise DataError(f"data.dir {root} is not a directory; image-folder reads root/<class>/<image> files")
    if (root / "train").is_dir() and (root / "test").is_dir():
        classes = class_names(root / "train")
        pixels, labels = decoded_folder(root / split, classes, _channels_known(data))
        if split == "train":
            _check_every_class_has_images(root / "train", classes, labels)
        return Split(pixels, labels, classes)
    classes = class_names(root)
    pixels, labels = decoded_folder(root, classes, data)
    _check_every_class_has_images(root, classes, labels)
    test = _test_indices(len(labels), data.test_fraction, data.split_seed)
    keep = np.zeros(len(labels), dtype=bool)
    keep[test] = True
    chosen = keep if split == "test" else ~keep
    if not chosen.any():
        raise DataError(f"{root}: the {split} split of {len(labels)} images by test_fraction {data.test_fraction} is "
                        f"empty; add images or change data.test_fraction")
    return Split(pixels[chosen], labels[chosen], classes)


def _channels_known(data):
    """``data`` with channels ``auto`` made the channels of ``data.shape`` (1 or 3) where it names them: the
    training images' choice, which a test/ folder (in training, and a checkpoint's in evaluation) follows as
    predict does, converting a colour test image to grey for a network trained on grey images. (One folder
    split by test_fraction is decoded once, so both splits have the channels auto chose for all of it.)"""
    if data.channels != "auto" or data.shape is None or data.shape[0] not in (1, 3):
        return data
    return dataclasses.replace(data, channels=data.shape[0])


def _check_every_class_has_images(folder: Path, classes: tuple[str, ...], labels: np.ndarray) -> None:
    """A class folder of the training images holds at least one image that could be read."""
    counts = np.bincount(labels, minlength=len(classes))
    if not counts.all():
        empty = classes[int(np.argmin(counts))]
        raise DataError(f"{folder / empty}: a class folder without readable image files; add images to it or remove it")


def _test_indices(count: int, fraction: float, seed: int) -> np.ndarray:
    """The indices of the test split: a seeded permutation's first round(fraction · count)."""
    order = np.random.default_rng(seed).permutation(count)
    return order[:int(round(fraction * count))]


def class_names(folder: Path) -> tuple[str, ...]:
    """The sorted names of ``folder``'s sub-folders (hidden ones left out)."""
    names = [entry.name for entry in _entries(folder) if _is_folder(entry) and not entry.name.startswith(".")]
    if not names:
        raise DataError(f"{folder}: no class folders; image-folder reads {folder}/<class>/<image> files")
    unprintable = [name for name in names if not name.isprintable()]
    if unprintable:
        raise DataError(f"{folder}/{unprintable[0]!r}: a class folder's name must be printable text (no line breaks "
                        f"or control characters); rename it")
    return tuple(names)


def _entries(folder: Path) -> list[os.DirEntry]:
    """The entries of ``folder``, sorted by name; DataError naming it where it cannot be read."""
    try:
        with os.scandir(folder) as entries:
            return sorted(entries, key=lambda entry: entry.name)
    except OSError as error:
        raise DataError(f"cannot read {folder}: {error.strerror or error}") from error


def _is_folder(entry: os.DirEntry) -> bool:
    """Whether ``entry`` is a folder, symbolic links followed; a link that loops or leads nowhere is not."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def _file_stat(entry: os.DirEntry) -> os.stat_result | None:
    """The status of ``entry`` (symbolic links followed) where it is a regular file; None for anything
    else, a link that loops or leads nowhere, or a file gone since the folder was listed."""
    try:
        return entry.stat() if entry.is_file() else None
    except OSError:
        return None


def list_files(folder: Path, classes: tuple[str, ...]) -> list[tuple[str, int, int, int]]:
    """[(path relative to ``folder``, label, size, mtime_ns)] of every image file, sorted by path; hidden
    files (a Mac's ``._NAME.jpg`` metadata beside each photo, say) left out as hidden folders are."""
    files = []
    for label, name in enumerate(classes):
        directory = folder / name
        if not directory.is_dir():
            continue
        for entry in _entries(directory):
            image = entry.name.lower().endswith(IMAGE_SUFFIXES) and not entry.name.startswith(".")
            stat = _file_stat(entry) if image else None
            if stat is not None:
                files.append((f"{name}/{entry.name}", label, stat.st_size, stat.st_mtime_ns))
    unknown = [entry.name for entry in _entries(folder) if _is_folder(entry) and entry.name not in classes
               and not entry.name.startswith(".")]
    if unknown:
        raise DataError(f"{folder}/{unknown[0]}: a class the training folder does not have "
                        f"(classes: {', '.join(classes)})")
    if not files:
        named = ", ".join(classes[:5]) + (", ..." if len(classes) > 5 else "")
        raise DataError(f"{folder}: no image files ({', '.join(IMAGE_SUFFIXES)}) in its class folders ({named}); "
                        f"image-folder reads {folder}/<class>/<image>, or train/<class>/ and test/<class>/ folders "
                        f"there")
    return files


def decoded_folder(folder: Path, classes: tuple[str, ...], data) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 (N, C, H, W), int64 (N,)) of every readable image in ``folder``, from the cache when it holds
    this very file list and recipe."""
    files = list_files(folder, classes)
    recipe = {"format": CACHE_FORMAT, "channels": data.channels, "image_size": data.image_size,
              "corrupt": data.corrupt, "resize": data.resize, "folder": str(folder.resolve()),
              "exif_orientation": True}
    key = hashlib.sha256(json.dumps([recipe, files]).encode(errors="surrogateescape")).hexdigest()[:32]
    entry = _cache_dir() / key if _cache_dir() else None
    cached = _load_cached(entry) if entry else None
    if cached is not None:
        logger.info("%s: %d images from the cache %s", folder, len(cached[1]), entry)
        return cached
    pixels, labels = _decode_all(folder, files, data)
    if entry:
        _store(entry, pixels, labels)
    return pixels, labels


def _cache_dir() -> Path | None:
    from .mnist import NO_CACHE_ENV, parsed_cache_dir

    if os.environ.get(NO_CACHE_ENV, "") not in ("", "0"):
        return None
    try:
        return parsed_cache_dir() / "folders"
    except RuntimeError:
        return None


def _array_path(entry: Path, name: str) -> Path:
    return entry.with_suffix(f".{name}.npy")


def _load_cached(entry: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """(pixels, labels) of the cache entry when it is whole and both arrays have the digests recorded
    in its JSON, else None."""
    def read() -> tuple[object, np.ndarray, np.ndarray]:
        digests = json.loads(cache.read_bytes(entry.with_suffix(".json")))
        return (digests, *(cache.map_array(_array_path(entry, name)) for name in ARRAYS))

    stored = cache.read_entry(read, entry, "decoded folder", logger)
    if stored is None:
        return None
    digests, pixels, labels = stored
    if not (isinstance(digests, dict) and all(isinstance(digests.get(name), str) for name in ARRAYS)
            and pixels.dtype == np.uint8 and pixels.ndim == 4 and pixels.nbytes <= MAX_FOLDER_BYTES
            and labels.dtype == np.int64 and labels.shape == (pixels.shape[0],)):
        logger.debug("ignoring the cache entry %s: it records no digests or holds other arrays", entry)
        return None
    arrays = [np.array(pixels), np.array(labels)]  # read only once their shapes are known to fit
    for name, array in zip(ARRAYS, arrays):
        if not cache.digest_matches(array, digests[name], _array_path(entry, name), logger):
            return None
    return arrays[0], arrays[1]


def _store(entry: Path, pixels: np.ndarray, labels: np.ndarray) -> None:
    """Write the arrays, then the JSON of their digests, each atomically; a failure is only logged."""
    arrays = dict(zip(ARRAYS, (pixels, labels)))
    digests = json.dumps({name: cache.array_digest(array) for name, array in arrays.items()}).encode()
    writers = {_array_path(entry, name): (lambda file, array=array: np.save(file, array, allow_pickle=False))
               for name, array in arrays.items()}
    cache.store_entry({**writers, entry.with_suffix(".json"): lambda file: file.write(digests)}, str(entry), logger)


def _decode_all(folder: Path, files, data) -> tuple[np.ndarray, np.ndarray]:
    """(pixels, labels) of ``files``, each image checked as it arrives: a corrupt one (unless skipped) or
    more decoded bytes than MAX_FOLDER_BYTES stop the decoding there, the work not yet started cancelled."""
    paths = [str(folder / relative) for relative, _, _, _ in files]
    size = tuple(data.image_size) if data.image_size else None
    if size is not None:
        _check_bytes(folder, len(paths), 3 if data.channels == 3 else 1, size)  # auto: at least one channel
    images, labels, total = [], [], 0
    with contextlib.closing(_decoded(paths, size, data)) as decoded:
        for path, (_, label, _, _), image in zip(paths, files, decoded):
            if isinstance(image, str):
                if data.corrupt != "skip":
                    raise DataError(f"{path}: cannot decode the image ({image}); remove it, or set data.corrupt: skip")
                logger.warning("skipping %s: cannot decode the image (%s)", path, image)
                continue
            total += image.nbytes
            if total > MAX_FOLDER_BYTES:
                raise DataError(f"{folder}: its first {len(images) + 1} of {len(paths)} images already make more than "
                                f"{MAX_FOLDER_BYTES} bytes decoded; set a smaller data.image_size")
            images.append(image)
            labels.append(label)
    if not images:
        raise DataError(f"{folder}: none of its {len(paths)} image files could be decoded")
    return _stack(folder, paths, images, data.channels), np.asarray(labels, dtype=np.int64)


def _decoded(paths: list[str], size, data) -> Iterator[np.ndarray | str]:
    """``decode_files``' result for each path in order, chunk by chunk as the worker processes finish them;
    closed early, it cancels the chunks not yet started."""
    chunks = [paths[start:start + CHUNK] for start in range(0, len(paths), CHUNK)]
    workers = min(len(chunks), os.cpu_count() or 1)
    settings = (size, data.resize, data.channels)
    if workers <= 1:
        for chunk in chunks:
            yield from decode_files(chunk, *settings)
        return
    pool = concurrent.futures.ProcessPoolExecutor(workers)
    try:
        for part in pool.map(decode_files, chunks, *([setting] * len(chunks) for setting in settings)):
            yield from part
    except concurrent.futures.process.BrokenProcessPool as error:
        raise CudnnnetError(f"a process decoding the images of {Path(paths[0]).parent.parent} died (killed by the "
                            f"system: out of memory, perhaps)") from error
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _check_bytes(folder: Path, count: int, channels: int, size: tuple[int, int]) -> None:
    """DataError where ``count`` images of ``channels`` × ``size`` pixels make more than MAX_FOLDER_BYTES."""
    if count * channels * size[0] * size[1] > MAX_FOLDER_BYTES:
        raise DataError(f"{folder}: {count} images of {channels}×{size[0]}×{size[1]} make more than "
                        f"{MAX_FOLDER_BYTES} bytes; set a smaller data.image_size")


def _stack(folder: Path, paths, images: list[np.ndarray], channels: str | int) -> np.ndarray:
    """uint8 (N, C, H, W) of images that are (H, W) grey or (H, W, 3) RGB, all one size."""
    first = images[0].shape[:2]
    odd = next((index for index, image in enumerate(images) if image.shape[:2] != first), None)
    if odd is not None:
        raise DataError(f"{paths[odd]}: {images[odd].shape[1]}×{images[odd].shape[0]} pixels, the first image is "
                        f"{first[1]}×{first[0]}; set data.image_size [height, width] to resize them all")
    colour = any(image.ndim == 3 for image in images)
    count = 3 if channels == 3 or (channels == "auto" and colour) else 1
    _check_bytes(folder, len(images), count, first)
    out = np.empty((len(images), count) + first, dtype=np.uint8)
    for index, image in enumerate(images):
        out[index] = _channels_first(image, count)
    return out


def _channels_first(image: np.ndarray, channels: int) -> np.ndarray:
    """(H, W) grey -> (channels, H, W), the grey in every channel; (H, W, 3) RGB -> (3, H, W)."""
    if image.ndim == 2:
        return np.broadcast_to(image, (channels,) + image.shape)
    return image.transpose(2, 0, 1)


def decode_files(paths: list[str], size: tuple[int, int] | None, resize: str = "crop",
                 channels: int | str = "auto") -> list:
    """For each path: uint8 (H, W) grey or (H, W, 3) RGB pixels as ``channels`` (1, 3 or auto: each image
    as its mode is) says, fitted to ``size`` (height, width) when given as ``resize`` says, made by
    ``images.photo_file_array`` as predict makes them (an image above predict's pixel limit refused from
    its header, never decoded); or the text of the error that stopped it being decoded."""
    from .images import photo_file_array

    decoded = []
    for path in paths:
        try:
            decoded.append(photo_file_array(path, channels, size, resize))
        except ImageError as error:
            decoded.append(str(error).removeprefix(f"{path}: "))
        except (OSError, ValueError, SyntaxError) as error:
            decoded.append(f"{type(error).__name__}: {error}")
    return decoded
