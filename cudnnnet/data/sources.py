"""The data sets a config names under ``data.dataset``, each read into uint8 pixels and labels.

    mnist          MNIST's IDX files (``mnist.py``), downloaded and MD5-checked
    fashion-mnist  Zalando's Fashion-MNIST, the same IDX layout, its published files and MD5 sums
    kmnist         Kuzushiji-MNIST, likewise
    idx            any IDX images/labels pair given by path (``train_images`` ... ``test_labels``)
    npz            NumPy archives holding ``x`` (uint8, or float in [0, 1]) and ``y`` (integer labels)
    cifar10        CIFAR-10's binary version: records of 1 label byte + 3 072 pixel bytes (3×32×32)
    image-folder   ``root/<class>/*.png|jpg|...`` (see ``image_folder.py``)

``load_source(data, split, download)`` gives a ``Split``: pixels uint8 (N, H, W) or (N, C, H, W),
labels int64 (N,) and the class names. Every size a file declares is checked before anything
is allocated; every error is a DataError naming the file.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import shutil
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..io import cache
from ..io.files import atomic_write
from . import mnist
from .pixels import Split  # noqa: F401 (re-exported: the loaders' result)

MAX_CLASSES = 100_000  # labels 0..K-1 of K classes at most, in data files and in data.classes

logger = logging.getLogger(__name__)

DIGIT_CLASSES = tuple(str(digit) for digit in range(10))
FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot")
KMNIST_CLASSES = ("o", "ki", "su", "tsu", "na", "ha", "ma", "ya", "re", "wo")
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


@dataclass(frozen=True)
class IdxFamily:
    """A data set published as MNIST's four gzip IDX files: where, with which MD5 sums, which classes."""

    name: str
    mirrors: tuple[str, ...]
    gzip_md5: dict
    classes: tuple[str, ...]


# Published sums: Fashion-MNIST's README (github.com/zalandoresearch/fashion-mnist), KMNIST's
# (github.com/rois-codh/kmnist), as torchvision checks them too.
IDX_FAMILIES = {
    "fashion-mnist": IdxFamily("Fashion-MNIST", (
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
        "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/"), {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310"}, FASHION_CLASSES),
    "kmnist": IdxFamily("KMNIST", ("http://codh.rois.ac.jp/kmnist/dataset/kmnist/",), {
        "train-images-idx3-ubyte.gz": "bdb82020997e1d708af4cf47b453dcf7",
        "train-labels-idx1-ubyte.gz": "e144d726b3acfaa3e44228e80efcd344",
        "t10k-images-idx3-ubyte.gz": "5c965bf0a639b31b8f53240b1b52f4d7",
        "t10k-labels-idx1-ubyte.gz": "7320c461ea6c1c855c0b718fb2a4b134"}, KMNIST_CLASSES),
}

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
CIFAR10_ARCHIVE_MD5 = "c32a1d4ab5d03f1284b67883e8d87530"  # the CIFAR-10 page's sum of the binary archive
CIFAR10_FILES = {"train": tuple(f"data_batch_{index}.bin" for index in range(1, 6)), "test": ("test_batch.bin",)}
CIFAR10_KNOWN_NAMES = (*CIFAR10_FILES["train"], *CIFAR10_FILES["test"], "cifar-10-batches-bin",
                       "cifar-10-binary.tar.gz")  # what a folder holding CIFAR-10 (or part of it) holds
CIFAR10_RECORD = 1 + 3 * 32 * 32  # label byte, then 1 024 red, 1 024 green, 1 024 blue bytes
CIFAR10_BATCH = 10_000  # records in each published file
MAX_NPZ_BYTES = 1 << 32  # pixels an .npz member may declare
NPZ_CONVERT_BYTES = 8 << 20  # bytes of an .npz member read, and of its float samples converted to 8 bits, at a time




def class_names(config) -> tuple[str, ...] | None:
    """The class names of ``config``'s data: its own list, a named data set's, else None (read from the data)."""
    named = {"mnist": DIGIT_CLASSES, "fashion-mnist": FASHION_CLASSES, "kmnist": KMNIST_CLASSES,
             "cifar10": CIFAR10_CLASSES}
    return config.data.classes or named.get(config.data.dataset)


def load_source(data, split: str, download: bool = True) -> Split:
    """``split`` ("train" or "test") of the data set ``data`` (a DataConfig) names."""
    if split not in ("train", "test"):
        raise DataError(f"unknown split {split!r}; valid splits: 'train', 'test'")
    loader = _LOADERS.get(data.dataset)
    if loader is None:
        raise DataError(f"unknown data set {data.dataset!r}; valid: {', '.join(_LOADERS)}")
    return loader(data, split, download)


def _mnist(data, split: str, download: bool) -> Split:
    pixels, labels = mnist.load_mnist_pixels(data.dir, split, download=download)
    return Split(pixels, labels, data.classes or DIGIT_CLASSES)


# ---- the IDX family ------------------------------------------------------------------------


def _idx_family(data, split: str, download: bool) -> Split:
    family = IDX_FAMILIES[data.dataset]
    directory = family_dir(data)
    images_name, labels_name = mnist.SPLIT_FILES[split]
    paths = []
    for idx_name in (images_name, labels_name):
        path = mnist._find_file(directory, idx_name) if directory.is_dir() else None
        if path is None and download:
            if data.dir and directory.is_dir():
                mnist.check_download_target(directory, mnist.IDX_FILE_NAMES, family.name, mnist.IDX_FILES_SHOWN)
            path = _download(f"{idx_name}.gz", directory, family.mirrors, family.gzip_md5[f"{idx_name}.gz"])
        if path is None:
            raise DataError(f"{family.name} {split} file {idx_name}(.gz) missing from {directory}; allow the download "
                            f"or set data.dir to a directory that holds it")
        _check_family_file(path, family, data.md5)
        paths.append(path)
    pixels, labels = read_idx_pair(paths[0], paths[1], len(data.classes or family.classes))
    return Split(pixels, labels, data.classes or family.classes)


def _check_family_file(path: Path, family: IdxFamily, md5: dict | None) -> None:
    """A gzip file against its published MD5; any file against data.md5 where that names it. The
    publishers give sums of the .gz files only, so an uncompressed file is checked only by data.md5
    (its MD5 as ``md5sum`` prints it) and is otherwise read with a warning that nothing checked it."""
    if path.suffix == ".gz":
        _check_md5(path, family.gzip_md5[path.name], family.name)
    if md5 and path.name in md5:
        _check_md5(path, md5[path.name], "data.md5")
    elif path.suffix != ".gz":
        logger.warning("%s: uncompressed, so not checked against %s's published MD5 sums (those are of the .gz "
                       "files); give its MD5 in data.md5 to check it", path, family.name)


def family_dir(data) -> Path:
    """data.dir, else the user cache's folder for this data set ($XDG_CACHE_HOME/cudnnnet/<dataset>)."""
    return Path(data.dir) if data.dir else mnist.default_cache_dir(data.dataset)


def _download(file_name: str, directory: Path, mirrors, md5: str) -> Path:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DataError(f"cannot create {directory}: {error.strerror or error}; set data.dir to a writable "
                        f"directory") from error
    try:
        return mnist._download_file(file_name, directory, mirrors, 60.0, md5)
    except DataError as error:
        raise DataError(f"{error}; put the files there, or give the folder that holds them with --data-dir "
                        f"(data.dir)") from error


def file_md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    try:
        with cache.open_regular(path) as file:  # a FIFO or a device is refused, never waited on or read without end
            while chunk := file.read(1 << 20):
                digest.update(chunk)
    except OSError as error:
        raise DataError(f"cannot read {path}: {error.strerror or error}") from error
    return digest.hexdigest()


def _check_md5(path: Path, expected: str, what: str) -> None:
    found = file_md5(path)
    if found != expected.lower():
        raise DataError(f"{path}: checksum mismatch: MD5 {found}, {what} expects {expected}; the file is damaged "
                        f"or not {what}'s: delete it so it is downloaded again")


def read_idx_pair(images_path: Path, labels_path: Path, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 (N, H, W), int64 (N,)) from an IDX images file and its labels, both headers checked first."""
    images_dims, labels_dims = mnist.read_idx_dims(images_path), mnist.read_idx_dims(labels_path)
    if images_dims is not None and labels_dims is not None and len(images_dims) == 3 and len(labels_dims) == 1 \
            and images_dims[0] != labels_dims[0]:
        raise DataError(f"{images_path} holds {images_dims[0]} images but {labels_path} holds {labels_dims[0]} labels")
    images = mnist.read_images(images_path)
    labels = mnist.read_labels(labels_path, classes)
    if images.shape[0] != labels.shape[0]:
        raise DataError(f"{images_path} holds {images.shape[0]} images but {labels_path} holds {labels.shape[0]} labels")
    if images.shape[0] == 0:
        raise DataError(f"{images_path} holds no images")
    return images, labels.astype(np.int64)


def _idx(data, split: str, download: bool) -> Split:
    images_path, labels_path = (Path(getattr(data, f"{split}_{part}")) for part in ("images", "labels"))
    for path in (images_path, labels_path):
        if data.md5 and path.name in data.md5:
            _check_md5(path, data.md5[path.name], "data.md5")
    classes = data.classes or DIGIT_CLASSES
    pixels, labels = read_idx_pair(images_path, labels_path, len(classes) if data.classes else 256)
    return Split(pixels, labels, classes if data.classes else _numbered(labels))


def _numbered(labels: np.ndarray) -> tuple[str, ...]:
    """Class names "0" .. "K-1" for labels in 0..K-1."""
    return tuple(str(index) for index in range(int(labels.max()) + 1))


# ---- npz -----------------------------------------------------------------------------------


def _npz(data, split: str, download: bool) -> Split:
    path = Path(getattr(data, f"{split}_file"))
    if data.md5 and path.name in data.md5:
        _check_md5(path, data.md5[path.name], "data.md5")
    x, y = read_npz(path)
    return Split(x, y, data.classes or _numbered(y))


def read_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 (N, H, W) or (N, C, H, W), int64 (N,)) from an .npz of ``x`` and ``y``, never unpickled.
    Every check the members' headers allow (sizes, dtypes, shapes, the counts of images and labels) is
    made on both before either member's data is read; the labels' values are checked once read."""
    try:
        with cache.open_regular(path) as handle, zipfile.ZipFile(handle) as archive:
            x_member, y_member = (_npz_header(path, archive, name, MAX_NPZ_BYTES) for name in ("x", "y"))
            _check_npz_headers(path, x_member, y_member)
            x, y = (_npz_data(path, archive, member) for member in (x_member, y_member))
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except cache.NotRegularFile as error:
        raise DataError(f"{path}: {error.strerror}; give the .npz file itself") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as error:
        raise DataError(f"{path}: not a readable .npz file ({error})") from error
    if y.min() < 0:
        raise DataError(f"{path}: label {int(y.min())} is negative")
    if y.max() >= MAX_CLASSES:  # on y's own dtype: a uint64 label past int64 is not cast to a negative one
        raise DataError(f"{path}: label {int(y.max())} at index {int(np.argmax(y))} would make {int(y.max()) + 1} "
                        f"classes; labels are 0..K-1 for K classes, at most {MAX_CLASSES}")
    return _as_pixels(x, path), y.astype(np.int64)


@dataclass(frozen=True)
class _NpzMember:
    """One ``NAME.npy`` member of an .npz, as its zip entry and .npy header declare it."""

    name: str
    info: zipfile.ZipInfo
    shape: tuple
    dtype: np.dtype
    fortran_order: bool
    header_size: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def _npz_header(path: Path, archive: zipfile.ZipFile, name: str, limit: int) -> _NpzMember:
    """Member ``name`` of the .npz ``path`` from its .npy header (shape, dtype, no objects), checked against
    ``limit`` bytes and the zip entry's size; nothing past the header is decompressed."""
    try:
        info = archive.getinfo(f"{name}.npy")
    except KeyError:
        raise DataError(f"{path}: no array {name!r} (an .npz for training holds x and y)") from None
    with archive.open(info) as stream:
        version = np.lib.format.read_magic(stream)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read_header(stream)
        member = _NpzMember(name, info, tuple(shape), dtype, fortran_order, stream.tell())
    if dtype.hasobject:
        raise DataError(f"{path}: array {name!r} holds Python objects; refused (allow_pickle=False)")
    if member.nbytes > limit or info.file_size != member.header_size + member.nbytes:
        raise DataError(f"{path}: array {name!r} declares shape {member.shape} of {dtype} ({member.nbytes} bytes); the "
                        f"entry holds {info.file_size} bytes, the limit is {limit}")
    return member


def _check_npz_headers(path: Path, x: _NpzMember, y: _NpzMember) -> None:
    """x declares images of a pixel type, y as many integer labels."""
    if len(x.shape) not in (3, 4) or x.shape[0] == 0 or (len(x.shape) == 4 and x.shape[1] not in (1, 3)):
        raise DataError(f"{path}: x must hold images shaped (N, H, W) or (N, C, H, W) with C 1 or 3, got shape {x.shape}")
    if 0 in x.shape[-2:]:
        raise DataError(f"{path}: images of size {x.shape[-2]}×{x.shape[-1]} hold no pixels (x has shape {x.shape})")
    if x.dtype != np.uint8 and x.dtype.kind != "f":
        raise DataError(f"{path}: x must be uint8 or float in [0, 1], got dtype {x.dtype}")
    if y.shape != (x.shape[0],) or not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{path}: y must hold {x.shape[0]} integer labels, got dtype {y.dtype} shape {y.shape}")


def _npz_data(path: Path, archive: zipfile.ZipFile, member: _NpzMember) -> np.ndarray:
    """The array of a member whose header was checked, reading only the bytes it declares."""
    with archive.open(member.info) as stream:
        stream.read(member.header_size)
        data, read = _read_into_one_buffer(stream, member.nbytes)
    if read != member.nbytes:
        raise DataError(f"{path}: array {member.name!r} is truncated ({read} of {member.nbytes} bytes)")
    return np.frombuffer(data, dtype=member.dtype).reshape(member.shape, order="F" if member.fortran_order else "C")


def _read_into_one_buffer(stream, nbytes: int) -> tuple[bytearray, int]:
    """(a buffer of ``nbytes``, how many of them ``stream`` filled before it ended), read a chunk at a time:
    a zip entry's ``read(nbytes)`` joins its pieces into a second copy of them all."""
    buffer = bytearray(nbytes)
    filled = 0
    with memoryview(buffer) as view:
        while filled < nbytes:
            chunk = stream.read(min(nbytes - filled, NPZ_CONVERT_BYTES))
            if not chunk:
                break
            view[filled:filled + len(chunk)] = chunk
            filled += len(chunk)
    return buffer, filled


def _as_pixels(x: np.ndarray, path: Path) -> np.ndarray:
    """uint8 pixels of uint8 or float x, converted a few images at a time: the float temporaries of a
    whole x would take twice its size again."""
    if x.dtype == np.uint8:
        return x
    if not np.issubdtype(x.dtype, np.floating):
        raise DataError(f"{path}: x must be uint8 or float in [0, 1], got dtype {x.dtype}")
    pixels = np.empty(x.shape, np.uint8)
    step = max(1, NPZ_CONVERT_BYTES // max(1, x[0].nbytes))
    for start in range(0, len(x), step):
        part = x[start:start + step]
        if not np.isfinite(part).all() or part.min() < 0 or part.max() > 1:
            raise DataError(f"{path}: float x must hold finite values in [0, 1] (found {x.min()}..{x.max()})")
        pixels[start:start + step] = np.rint(part * 255).astype(np.uint8)
    return pixels


# ---- CIFAR-10 ------------------------------------------------------------------------------


def _cifar10(data, split: str, download: bool) -> Split:
    directory = family_dir(data)
    paths = [_cifar_file(directory, name) for name in CIFAR10_FILES[split]]
    if any(path is None for path in paths) and download:
        if data.dir and directory.is_dir():
            mnist.check_download_target(directory, CIFAR10_KNOWN_NAMES, "CIFAR-10", "data_batch_1.bin ... "
                                        "test_batch.bin, cifar-10-batches-bin/ or cifar-10-binary.tar.gz")
        _download_cifar(directory)
        paths = [_cifar_file(directory, name) for name in CIFAR10_FILES[split]]
    missing = [name for name, path in zip(CIFAR10_FILES[split], paths) if path is None]
    if missing:
        raise DataError(f"CIFAR-10 {split} files missing from {directory}: {', '.join(missing)}; allow the download "
                        f"or set data.dir to the folder of the binary version (cifar-10-batches-bin)")
    parts = [read_cifar_records(path) for path in paths]
    pixels = np.concatenate([part[0] for part in parts])
    labels = np.concatenate([part[1] for part in parts])
    return Split(pixels, labels, data.classes or CIFAR10_CLASSES)


def _cifar_file(directory: Path, name: str) -> Path | None:
    for candidate in (directory / name, directory / "cifar-10-batches-bin" / name):
        if candidate.is_file():
            return candidate
    return None


def read_cifar_records(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 (N, 3, 32, 32), int64 (N,)) from a file of CIFAR-10 binary records."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as error:
        raise DataError(f"cannot read {path}: {error.strerror or error}") from error
    if size == 0 or size % CIFAR10_RECORD or size > 6 * CIFAR10_BATCH * CIFAR10_RECORD:
        raise DataError(f"{path}: {size} bytes is not a whole number of CIFAR-10 records of {CIFAR10_RECORD} bytes "
                        f"(1 label byte + 3072 pixel bytes), at most {6 * CIFAR10_BATCH} of them")
    try:
        records = np.fromfile(path, dtype=np.uint8).reshape(-1, CIFAR10_RECORD)
    except OSError as error:
        raise DataError(f"cannot read {path}: {error.strerror or error}") from error
    labels = records[:, 0].astype(np.int64)
    bad = np.flatnonzero(labels >= len(CIFAR10_CLASSES))
    if bad.size:
        raise DataError(f"{path}: record {int(bad[0])} has label {int(labels[bad[0]])}, outside 0..9; not CIFAR-10's "
                        f"binary version")
    return np.ascontiguousarray(records[:, 1:].reshape(-1, 3, 32, 32)), labels


def _download_cifar(directory: Path) -> None:
    """Download the binary archive, check its MD5 and extract only the six record files."""
    archive = directory / "cifar-10-binary.tar.gz"
    if not archive.is_file():
        _download(archive.name, directory, (CIFAR10_URL.rsplit("/", 1)[0],), CIFAR10_ARCHIVE_MD5)
    _check_md5(archive, CIFAR10_ARCHIVE_MD5, "CIFAR-10")
    wanted = {name for names in CIFAR10_FILES.values() for name in names}
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                name = Path(member.name).name
                if member.isfile() and name in wanted and member.size <= CIFAR10_BATCH * CIFAR10_RECORD:
                    with atomic_write(directory / name) as file:  # never a part of a file for a later run to read
                        shutil.copyfileobj(tar.extractfile(member), file)
    except (tarfile.TarError, OSError, EOFError) as error:
        raise DataError(f"{archive}: cannot extract the CIFAR-10 records: {error}") from error


def _image_folder(data, split: str, download: bool) -> Split:
    from .image_folder import load_image_folder

    return load_image_folder(data, split)


_LOADERS = {"mnist": _mnist, "fashion-mnist": _idx_family, "kmnist": _idx_family, "idx": _idx, "npz": _npz,
            "cifar10": _cifar10, "image-folder": _image_folder}
DATASETS = tuple(_LOADERS)
