"""MNIST: the IDX file reader, the download with checksums, and ``load_mnist``.

IDX format (http://yann.lecun.com/exdb/mnist/): two zero bytes, a dtype code (0x08 = unsigned
byte), the number of dimensions, then one big-endian uint32 per dimension, then the values.
Images files carry magic 2051 (0x00000803, dims N × rows × cols), label files 2049 (0x00000801,
dims N). Files may be gzip-compressed; that is detected from the gzip magic bytes, not the name.

Parsed files are kept in a cache on disk (``parsed_cache_dir()``): the array as ``.npy`` and a
JSON sidecar naming the source (resolved path, size, mtime), the MD5 of its uncompressed bytes and
the SHA-256 of the array (``cache.array_digest``). An entry is used only while its source is
unchanged and its array still has that digest; ``CUDNNNET_NO_CACHE=1`` turns the cache off. The
cache never fails a load: an entry that cannot be read, or whose array was damaged (a warning), is
ignored and written again from the source; a cache directory that cannot be written is left alone.

Every error this module raises on purpose is a ``DataError`` naming the file and the problem.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import json
import logging
import math
import os
import tempfile
import zlib
from pathlib import Path
from typing import Iterable

import numpy as np

from ..errors import DataError
from ..io import cache
from ..io.files import new_file_mode
from .pixels import check_recipe, to_float_images

logger = logging.getLogger(__name__)

IMAGES_MAGIC = 2051
LABELS_MAGIC = 2049
UBYTE_CODE = 0x08
GZIP_MAGIC = b"\x1f\x8b"
IMAGE_SIDE = 28
NUM_CLASSES = 10
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081

SPLIT_COUNTS = {"train": 60_000, "test": 10_000}  # images (and labels) in MNIST's files
SPLIT_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

# MD5 of the gzip files as the mirrors serve them (identical to /work/shared/data/mnist/MD5SUMS).
GZIP_MD5 = {
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
}

# MD5 of the uncompressed IDX bytes: checked on every load, so a raw or re-compressed copy of
# the real data loads and anything else is refused.
IDX_MD5 = {
    "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
    "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
}

MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)

DATA_ENV = "CUDNNNET_DATA"
NO_CACHE_ENV = cache.NO_CACHE_ENV
DOWNLOAD_CHUNK = 1 << 20


# ---- IDX parsing ---------------------------------------------------------------------------


# Larger than any IDX data set of 28x28 digits (EMNIST's largest split holds ~550 MB of pixels); a
# header declaring more is refused before anything is decompressed or allocated.
MAX_IDX_BYTES = 1 << 30


def parse_idx(data: bytes, source: str = "<bytes>") -> np.ndarray:
    """The array held by an uncompressed IDX byte string (read-only, a view of ``data``)."""
    if len(data) < 4:
        raise DataError(f"{source}: too short for an IDX header ({len(data)} bytes, need at least 4)")
    if data[0] != 0 or data[1] != 0:
        raise DataError(f"{source}: not an IDX file (magic {int.from_bytes(data[:4], 'big')}; "
                        f"MNIST uses {IMAGES_MAGIC} for images and {LABELS_MAGIC} for labels)")
    if data[2] != UBYTE_CODE:
        raise DataError(f"{source}: IDX dtype code 0x{data[2]:02X} is not supported; "
                        f"MNIST uses unsigned bytes (0x{UBYTE_CODE:02X})")
    ndim = data[3]
    if ndim == 0:
        raise DataError(f"{source}: IDX header declares 0 dimensions; MNIST files have 1 (labels) or 3 (images)")
    header_size = 4 + 4 * ndim
    if len(data) < header_size:
        raise DataError(f"{source}: truncated header: {ndim} dimensions need a {header_size}-byte "
                        f"header, the file has {len(data)} bytes")
    dims = _header_dims(data[:header_size])
    _check_declared_size(dims, source)
    expected = math.prod(dims)
    found = len(data) - header_size
    if found != expected:
        state = "truncated" if found < expected else "too long"
        raise DataError(f"{source}: {state}: header dims {dims} call for {expected} data bytes, "
                        f"found {found}")
    return np.frombuffer(data, dtype=np.uint8, count=expected, offset=header_size).reshape(dims)


def _header_dims(header: bytes) -> tuple[int, ...]:
    """The big-endian uint32 sizes after the 4 magic bytes of a complete IDX header."""
    return tuple(int.from_bytes(header[4 + 4 * i: 8 + 4 * i], "big") for i in range(header[3]))


def _check_declared_size(dims: tuple[int, ...], source: str, limit: int = MAX_IDX_BYTES) -> None:
    """Refuses dims whose bytes exceed ``limit``, and dims with a 0 whose other sizes do: NumPy refuses
    such a shape even though it holds no element."""
    if math.prod(dims) > limit:
        raise DataError(f"{source}: IDX header dims {dims} describe {math.prod(dims)} bytes, more than the "
                        f"{limit} bytes an MNIST-like file may hold; not an MNIST file")
    extent = math.prod(size for size in dims if size)
    if extent > limit:
        raise DataError(f"{source}: IDX header dims {dims} describe an empty array whose other dims multiply to "
                        f"{extent}, more than the {limit} bytes an MNIST-like file may hold; not an MNIST file")


def read_idx_bytes(path: Path, limit: int = MAX_IDX_BYTES) -> bytes:
    """The uncompressed IDX bytes of ``path``, gunzipped when it starts with the gzip magic.

    Only the header and then at most the data bytes it declares (plus one, to tell a file that is
    too long) are decompressed, after the declared size is checked against ``limit``: a small
    gzip stream that inflates to gigabytes is refused from its header.
    """
    with _idx_stream(path) as stream:
        try:
            return _read_declared(stream, path, limit)
        except (EOFError, zlib.error, gzip.BadGzipFile) as error:
            raise DataError(f"{path}: corrupt or truncated gzip data ({error})") from error
        except OSError as error:
            raise DataError(f"cannot read {path}: {error.strerror or error}") from error


def read_idx_dims(path: Path) -> tuple[int, ...] | None:
    """The dims an IDX file's header declares, decompressing only the header; None when the file
    is too short, damaged or not an IDX ubyte file (reading it all then says why)."""
    try:
        with _idx_stream(path) as stream:
            return _read_header(stream)[1]
    except (DataError, OSError, EOFError, zlib.error):
        return None


@contextlib.contextmanager
def _idx_stream(path: Path):
    """A binary stream of the uncompressed bytes of ``path`` (gunzipped when it starts with the gzip magic)."""
    try:
        file = cache.open_regular(path)  # a FIFO or a device given as a data file is refused, never waited on
        compressed = file.read(len(GZIP_MAGIC)) == GZIP_MAGIC
        file.seek(0)
    except OSError as error:
        raise DataError(f"cannot read {path}: {error.strerror or error}") from error
    with file:
        yield gzip.GzipFile(fileobj=file) if compressed else file


def _read_header(stream) -> tuple[bytes, tuple[int, ...] | None]:
    """(the header bytes read, the dims they declare or None when they are not a complete IDX ubyte header)."""
    header = stream.read(4)
    if len(header) < 4 or header[:3] != bytes([0, 0, UBYTE_CODE]) or header[3] == 0:
        return header, None
    header += stream.read(4 * header[3])
    return header, (_header_dims(header) if len(header) == 4 + 4 * header[3] else None)


def _read_declared(stream, path: Path, limit: int) -> bytes:
    """The header, then the data bytes it declares and one more; a malformed header reads no data
    (``parse_idx`` then says what is wrong with it)."""
    header, dims = _read_header(stream)
    if dims is None:
        return header
    _check_declared_size(dims, str(path), limit)
    size = math.prod(dims)
    data = header + stream.read(size + 1)
    if len(data) > len(header) + size:
        raise DataError(f"{path}: too long: header dims {dims} call for {size} data bytes, the file holds more")
    return data


def read_idx(path: Path) -> np.ndarray:
    """The array in the IDX file ``path`` (gzip or raw)."""
    return parse_idx(read_idx_bytes(path), str(path))


def _check_magic(array: np.ndarray, path: Path, magic: int, ndim: int, what: str) -> None:
    _check_magic_dims(array.shape, path, magic, ndim, what)


def _check_magic_dims(dims: tuple[int, ...], path: Path, magic: int, ndim: int, what: str) -> None:
    if len(dims) != ndim:
        found = (UBYTE_CODE << 8) | len(dims)
        raise DataError(f"{path}: magic {found} is not an MNIST {what} file (expected magic {magic}, "
                        f"{ndim} dimension{'s' if ndim > 1 else ''})")


def images_from_idx(array: np.ndarray, path: Path) -> np.ndarray:
    """Check that a parsed IDX array is an images file (magic 2051, N × rows × cols, rows, cols > 0)."""
    _check_magic(array, path, IMAGES_MAGIC, 3, "images")
    if array.shape[1] == 0 or array.shape[2] == 0:
        raise DataError(f"{path}: images of size {array.shape[1]}×{array.shape[2]} hold no pixels")
    return array


def labels_from_idx(array: np.ndarray, path: Path, classes: int = NUM_CLASSES) -> np.ndarray:
    """Check that a parsed IDX array is a labels file (magic 2049) with every label in 0..classes-1."""
    _check_magic(array, path, LABELS_MAGIC, 1, "labels")
    return check_labels(array, classes, str(path))


def check_labels(labels: np.ndarray, classes: int = NUM_CLASSES, source: str = "labels") -> np.ndarray:
    """``labels`` itself when it is a 1-D integer array with every value in 0..classes-1."""
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{source}: labels must be a 1-D integer array, got dtype {labels.dtype} "
                        f"shape {labels.shape}")
    bad = np.flatnonzero((labels < 0) | (labels >= classes))
    if bad.size:
        index = int(bad[0])
        raise DataError(f"{source}: label {int(labels[index])} at index {index} is outside 0..{classes - 1}")
    return labels


def read_images(path: Path) -> np.ndarray:
    """uint8 images (N, rows, cols) from an IDX images file."""
    return images_from_idx(read_idx(path), path)


def read_labels(path: Path, classes: int = NUM_CLASSES) -> np.ndarray:
    """uint8 labels (N,) from an IDX labels file, each in 0..classes-1."""
    return labels_from_idx(read_idx(path), path, classes)


# ---- checksums and the in-process cache ----------------------------------------------------


def md5_of(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _verify_idx_checksum(found: str, path: Path, idx_name: str) -> None:
    expected = IDX_MD5[idx_name]
    if found != expected:
        raise DataError(f"{path}: checksum mismatch: the uncompressed data has MD5 {found}, "
                        f"MNIST's {idx_name} has {expected}; the file is damaged or not MNIST's: delete it "
                        f"so it is downloaded again, or check that --data-dir points at the MNIST files")


@functools.lru_cache(maxsize=8)
def _read_cached(file_key: tuple[str, int, int], idx_name: str) -> tuple[np.ndarray, str]:
    """(parsed, checked, read-only array, MD5 of the uncompressed bytes) of one file.

    ``file_key`` = (resolved path, mtime in ns, size): a file that changes gets a new key. The
    array comes from the disk cache when it holds an entry for this very file, else from parsing.
    """
    path = Path(file_key[0])
    entry = _cache_entry(file_key[0])
    cached = _load_entry(entry, file_key) if entry else None
    if cached is not None and not _passes_check(cached[0], idx_name, path):
        logger.debug("ignoring the cache entry %s: its array fails the check of %s", entry, path)
        cached = None
    if cached is None:
        data = read_idx_bytes(path)
        array, md5 = parse_idx(data, str(path)), md5_of(data)
    else:
        array, md5 = cached
    _check(array, idx_name, path)
    if entry and cached is None:
        _store_entry(entry, file_key, array, md5)
    logger.debug("%s %s: shape %s", "parsed" if cached is None else "cached", path, array.shape)
    return array, md5


def _check(array: np.ndarray, idx_name: str, path: Path) -> None:
    """The images or labels checks of a parsed IDX array; DataError naming ``path`` where it fails."""
    if "images" in idx_name:
        images_from_idx(array, path)
    else:
        labels_from_idx(array, path)


def _passes_check(array: np.ndarray, idx_name: str, path: Path) -> bool:
    try:
        _check(array, idx_name, path)
    except DataError:
        return False
    return True


# ---- the disk cache of parsed files --------------------------------------------------------


def _cache_entry(resolved_path: str) -> Path | None:
    """The cache entry (without suffix) for a source file, or None when the cache is turned off."""
    digest = hashlib.sha256(resolved_path.encode(errors="surrogateescape")).hexdigest()[:32]
    return cache.entry_path(parsed_cache_dir, digest)


def _sidecar(file_key: tuple[str, int, int], md5: str, array: np.ndarray, digest: str) -> dict:
    """What the entry's JSON holds: the source as it was parsed, and the array's dtype, shape and digest."""
    path, mtime_ns, size = file_key
    return {"source": path, "size": size, "mtime_ns": mtime_ns, "md5": md5, "dtype": str(array.dtype),
            "shape": list(array.shape), "sha256": digest}


def _load_entry(entry: Path, file_key: tuple[str, int, int]) -> tuple[np.ndarray, str] | None:
    """(array, MD5) from the cache entry when it describes the source as it is now and its array has
    the digest recorded with it, else None."""
    def read() -> tuple[object, np.ndarray]:
        sidecar = json.loads(cache.read_bytes(entry.with_suffix(".json")))
        return sidecar, cache.map_array(entry.with_suffix(".npy"))  # nothing read yet

    stored = cache.read_entry(read, entry, "parsed file", logger)
    if stored is None:
        return None
    sidecar, mapped = stored
    md5, digest = (sidecar.get("md5"), sidecar.get("sha256")) if isinstance(sidecar, dict) else (None, None)
    if not isinstance(md5, str) or not isinstance(digest, str) or sidecar != _sidecar(file_key, md5, mapped, digest) \
            or mapped.nbytes > MAX_IDX_BYTES:
        logger.debug("ignoring the cache entry %s: it describes another file or array", entry)
        return None
    array = np.array(mapped)  # read only once the entry is known to describe this file
    if not cache.digest_matches(array, digest, entry.with_suffix(".npy"), logger):
        return None
    array.flags.writeable = False
    return array, md5


def _store_entry(entry: Path, file_key: tuple[str, int, int], array: np.ndarray, md5: str) -> None:
    """Write the cache entry (array, then sidecar, each atomically); a failure is only logged."""
    sidecar = json.dumps(_sidecar(file_key, md5, array, cache.array_digest(array))).encode()
    cache.store_entry({entry.with_suffix(".npy"): lambda file: np.save(file, array, allow_pickle=False),
                       entry.with_suffix(".json"): lambda file: file.write(sidecar)}, file_key[0], logger)


def _read_mnist_file(path: Path, idx_name: str) -> tuple[np.ndarray, str]:
    try:
        stat = path.stat()
    except OSError as error:
        raise DataError(f"cannot read {path}: {error.strerror or error}") from error
    return _read_cached((str(path.resolve()), stat.st_mtime_ns, stat.st_size), idx_name)


# ---- locating and downloading --------------------------------------------------------------


def default_cache_dir(dataset: str = "mnist") -> Path:
    """$XDG_CACHE_HOME/cudnnnet/<dataset>, else ~/.cache/cudnnnet/<dataset>: where a data set is
    downloaded; DataError where neither is set (no home directory), saying how to give the folder."""
    try:
        return cache.cache_root() / dataset
    except RuntimeError as error:
        where = f"--data-dir (data.dir) or ${DATA_ENV}" if dataset == "mnist" else "--data-dir (data.dir)"
        raise DataError(f"no folder for {dataset}: neither $XDG_CACHE_HOME nor a home directory is set, so there "
                        f"is no user cache; give the folder that holds (or will hold) it with {where}") from error


def parsed_cache_dir() -> Path:
    """$XDG_CACHE_HOME/cudnnnet/parsed, else ~/.cache/cudnnnet/parsed: the parsed files."""
    return cache.cache_root() / "parsed"


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> tuple[Path, bool]:
    """(directory, explicit): ``data_dir``, else $CUDNNNET_DATA, else the user cache directory.

    An explicit directory (argument or environment variable) must already exist.
    """
    if data_dir is not None:
        origin, path = "data directory ", Path(data_dir)
    elif os.environ.get(DATA_ENV):
        origin, path = f"data directory {DATA_ENV}=", Path(os.environ[DATA_ENV])
    else:
        return default_cache_dir(), False
    if not path.is_dir():
        raise DataError(f"{origin}{path} does not exist or is not a directory; create it, or leave "
                        f"the directory unset to use the cache at {default_cache_dir()}")
    return path, True


def _find_file(directory: Path, idx_name: str) -> Path | None:
    for candidate in (directory / f"{idx_name}.gz", directory / idx_name):
        if candidate.is_file():
            return candidate
    return None


IDX_FILE_NAMES = tuple(name + suffix for names in SPLIT_FILES.values() for name in names for suffix in ("", ".gz"))
IDX_FILES_SHOWN = ", ".join(f"{name}(.gz)" for names in SPLIT_FILES.values() for name in names)


def check_download_target(directory: Path, known_names: Iterable[str], dataset: str, shown: str) -> None:
    """A folder named for a data set (--data-dir, data.dir, $CUDNNNET_DATA) that holds other files but none of
    ``known_names`` is not the data set's folder: DataError saying so, rather than downloading the data set into
    it. An empty folder, or one holding some of the files, is where a download goes. ``shown``: the files,
    as the message lists them."""
    if any((directory / name).exists() for name in known_names):
        return
    try:
        other = next((entry.name for entry in directory.iterdir() if not entry.name.startswith(".")), None)
    except OSError:
        return  # the download names whatever is wrong with the folder
    if other is not None:
        raise DataError(f"no {dataset} in {directory}: it holds other files ({other!r}, ...) and none of {shown}; "
                        f"give --data-dir (data.dir) the folder that holds them, or an empty folder to download "
                        f"them into")


def _check_split(split: str) -> tuple[str, str]:
    if split not in SPLIT_FILES:
        raise DataError(f"unknown MNIST split {split!r}; valid splits: 'train', 'test'")
    return SPLIT_FILES[split]


def _fetch_to_temp(url: str, directory: Path, file_name: str, timeout: float) -> tuple[Path, str]:
    """Stream ``url`` into a temporary file in ``directory``; (temp path, MD5 of what arrived)."""
    import urllib.request

    handle, temp_name = tempfile.mkstemp(dir=directory, prefix=f".{file_name}.", suffix=".part")
    digest = hashlib.md5(usedforsecurity=False)
    try:
        os.fchmod(handle, new_file_mode())
        with os.fdopen(handle, "wb") as temp_file, urllib.request.urlopen(url, timeout=timeout) as response:
            while chunk := response.read(DOWNLOAD_CHUNK):
                digest.update(chunk)
                temp_file.write(chunk)
            temp_file.flush()
            os.fsync(temp_file.fileno())
    except BaseException:
        os.unlink(temp_name)
        raise
    return Path(temp_name), digest.hexdigest()


def _download_file(file_name: str, directory: Path, mirrors: Iterable[str], timeout: float,
                   expected: str | None = None) -> Path:
    """Download ``file_name`` from the first mirror that serves it with the MD5 ``expected`` (MNIST's
    own sum of that file where not given)."""
    import http.client  # with ssl and email, a noticeable share of an import that seldom downloads

    expected = expected or GZIP_MD5[file_name]
    failures = []
    for mirror in mirrors:
        url = mirror.rstrip("/") + "/" + file_name
        logger.info("downloading %s", url)
        try:
            temp_path, found = _fetch_to_temp(url, directory, file_name, timeout)
        except (OSError, ValueError, http.client.HTTPException) as error:
            failures.append(f"{url}: {error}")
            continue
        if found != expected:
            temp_path.unlink()
            failures.append(f"{url}: refused {file_name}: MD5 {found} does not match the expected {expected}")
            continue
        target = directory / file_name
        os.replace(temp_path, target)
        logger.info("saved %s (MD5 %s)", target, found)
        return target
    raise DataError(f"could not download {file_name} into {directory}: " + "; ".join(failures or ["no mirrors given"]))


def download_mnist(data_dir: str | os.PathLike | None = None, splits: Iterable[str] = ("train", "test"),
                   force: bool = False, mirrors: Iterable[str] | None = None, timeout: float = 60.0) -> Path:
    """Download the gzip files of ``splits`` into the data directory; returns the directory.

    Files already present are kept unless ``force``. A download is checked against the known MD5
    before it replaces anything, so a bad download never overwrites a good file. ``mirrors``
    defaults to ``MIRRORS``: base URLs tried in order.
    """
    directory, explicit = resolve_data_dir(data_dir)
    if not explicit:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise DataError(f"cannot create the MNIST cache directory {directory}: {error.strerror or error}; "
                            f"set {DATA_ENV} to a writable directory") from error
    splits = (splits,) if isinstance(splits, str) else tuple(splits)
    mirrors = MIRRORS if mirrors is None else (mirrors,) if isinstance(mirrors, str) else tuple(mirrors)
    for split in splits:
        for idx_name in _check_split(split):
            if force or _find_file(directory, idx_name) is None:
                _download_file(f"{idx_name}.gz", directory, mirrors, timeout)
    return directory


def _split_paths(split: str, data_dir, download: bool, mirrors: Iterable[str] | None) -> tuple[Path, Path]:
    idx_names = _check_split(split)
    directory, explicit = resolve_data_dir(data_dir)
    paths = [_find_file(directory, idx_name) if directory.is_dir() else None for idx_name in idx_names]
    missing = [idx_name for idx_name, path in zip(idx_names, paths) if path is None]
    if missing and not download:
        raise DataError(f"MNIST {split} files missing from {directory}: "
                        + ", ".join(f"{name}(.gz)" for name in missing)
                        + f"; allow download or set {DATA_ENV} to a directory that holds them")
    if missing:
        if explicit and directory.is_dir():
            check_download_target(directory, IDX_FILE_NAMES, "MNIST", IDX_FILES_SHOWN)
        try:
            download_mnist(data_dir, splits=(split,), mirrors=mirrors)
        except DataError as error:
            raise DataError(f"MNIST {split} files missing from {directory}: "
                            + ", ".join(f"{name}(.gz)" for name in missing) + f", and {error}; put them there, or "
                            f"give the folder that holds them with --data-dir (data.dir) or ${DATA_ENV}") from error
        paths = [_find_file(directory, idx_name) for idx_name in idx_names]
    return paths[0], paths[1]


# ---- loading -------------------------------------------------------------------------------


def load_mnist(data_dir: str | os.PathLike | None = None, split: str = "train", download: bool = True,
               normalize: tuple[float, float] | None = None, pad: int = 0, verify: bool = True,
               mirrors: Iterable[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(images float32 (N, 1, 28+2·pad, 28+2·pad) in [0, 1] or normalised, labels int64 (N,)).

    ``data_dir``: explicit directory, else $CUDNNNET_DATA, else the user cache directory. Missing
    files are downloaded when ``download``. ``verify`` checks the MD5 of the uncompressed data
    against the real MNIST's. ``normalize`` = (mean, std) is applied after /255 and after padding,
    so the padding is the background value 0 before normalisation.
    """
    check_recipe(normalize, pad)
    pixels, labels = load_mnist_pixels(data_dir, split, download, verify, mirrors)
    return to_float_images(pixels, normalize, int(pad)), labels


def load_mnist_pixels(data_dir: str | os.PathLike | None = None, split: str = "train", download: bool = True,
                      verify: bool = True, mirrors: Iterable[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(pixels uint8 (N, 28, 28), labels int64 (N,)): ``load_mnist`` before the float conversion."""
    images_path, labels_path = _split_paths(split, data_dir, download, mirrors)
    images_name, labels_name = SPLIT_FILES[split]
    _check_declared_pair(images_path, labels_path, SPLIT_COUNTS[split] if verify else None)
    images, images_md5 = _read_mnist_file(images_path, images_name)
    labels, labels_md5 = _read_mnist_file(labels_path, labels_name)
    if images.shape[0] != labels.shape[0]:
        raise DataError(f"{images_path} holds {images.shape[0]} images but {labels_path} holds "
                        f"{labels.shape[0]} labels")
    if images.shape[1:] != (IMAGE_SIDE, IMAGE_SIDE):
        raise DataError(f"{images_path}: images are {images.shape[1]}×{images.shape[2]}, MNIST's are "
                        f"{IMAGE_SIDE}×{IMAGE_SIDE}")
    if images.shape[0] == 0:
        raise DataError(f"{images_path} holds no images")
    if verify:
        _verify_idx_checksum(images_md5, images_path, images_name)
        _verify_idx_checksum(labels_md5, labels_path, labels_name)
    return images, labels.astype(np.int64)


def _check_declared_pair(images_path: Path, labels_path: Path, mnist_count: int | None) -> None:
    """What the two headers declare, before either file's data is read: an images file of
    N × 28 × 28 and a labels file of N, with N at most MNIST's own count when the data must
    be MNIST (``mnist_count``), so a small file declaring a huge size allocates nothing.
    A header that cannot be read here is left to the full read, which names the problem."""
    images_dims, labels_dims = read_idx_dims(images_path), read_idx_dims(labels_path)
    if images_dims is not None:
        _check_magic_dims(images_dims, images_path, IMAGES_MAGIC, 3, "images")
        if images_dims[1:] != (IMAGE_SIDE, IMAGE_SIDE):
            raise DataError(f"{images_path}: images are {images_dims[1]}×{images_dims[2]}, MNIST's are "
                            f"{IMAGE_SIDE}×{IMAGE_SIDE}")
    if labels_dims is not None:
        _check_magic_dims(labels_dims, labels_path, LABELS_MAGIC, 1, "labels")
    if images_dims is not None and labels_dims is not None and images_dims[0] != labels_dims[0]:
        raise DataError(f"{images_path} holds {images_dims[0]} images but {labels_path} holds "
                        f"{labels_dims[0]} labels")
    for path, dims, what in ((images_path, images_dims, "images"), (labels_path, labels_dims, "labels")):
        if mnist_count is not None and dims is not None and dims[0] > mnist_count:
            raise DataError(f"{path}: the header declares {dims[0]} {what}; MNIST's file holds {mnist_count}, "
                            f"so this is not MNIST")


def one_hot(labels, classes: int = NUM_CLASSES) -> np.ndarray:
    """float32 (N, classes) with a 1 in each row's label column."""
    labels = check_labels(np.asarray(labels), classes)
    encoded = np.zeros((labels.shape[0], classes), dtype=np.float32)
    encoded[np.arange(labels.shape[0]), labels] = 1.0
    return encoded
