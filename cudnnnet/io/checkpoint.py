"""Checkpoint file formats: our ``.npz`` and the C++ original's directory of raw ``.bin`` files.

This module knows files, not networks: it reads and writes ``{name: float32 array}`` dictionaries
(names like ``conv1.weight``, ``fc1.bias``) and checks them against the shapes a network expects.

``.npz``
    One NumPy zip archive holding every array by name, plus the metadata (a JSON object) encoded
    as UTF-8 in a uint8 array under ``__metadata__`` (NumPy scalars become numbers; NaN and
    infinities are written as Python's json writes them). Nothing is pickled, and loading refuses
    pickled object arrays. Saving is atomic: a crash leaves the previous checkpoint in place.

The original's pretrained directory (``Network::write_file`` / ``load_pretrain``)
    ``L.bin`` holds layer L's weights and ``L.bias.bin`` its biases, raw little-endian float32
    with no header. Our ``L.weight`` is ``L.bin``, our ``L.bias`` is ``L.bias.bin``. A Dense
    layer's weights there are the (in, out) column-major matrix cuBLAS multiplies with;
    a Conv2D's are (out, in, k, k) row-major, as ours (see the layout functions below).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import struct
import zipfile
from math import prod
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Mapping, NamedTuple

import numpy as np

from ..errors import CheckpointError, WriteError
from ..tensor import MAX_TENSOR_VALUES
from .files import atomic_write
from .zip_directory import declared_directory, entries_at_most

log = logging.getLogger(__name__)

METADATA_KEY = "__metadata__"
WEIGHT_SUFFIX, BIAS_SUFFIX = ".weight", ".bias"
ORIGINAL_DTYPE = np.dtype("<f4")  # raw little-endian float32, as Blob::file_write writes it

_ZIP_SIGNATURE = b"PK\x03\x04"
# a file name's byte that is not UTF-8, as os.fsdecode holds it (a data.dir, say): written as its JSON escape
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")
MAX_METADATA_BYTES = 16 << 20  # the model, the training config and a history of up to ~100 000 epochs
MAX_CHECKPOINT_BYTES = 4 << 30  # all arrays of a checkpoint read without the network's shapes
# the entries of a checkpoint: those of limits.MAX_LAYERS layers, at most 8 arrays a layer (BatchNorm's weight,
# bias, running statistics, Adam's two moments of each parameter), and the metadata
MAX_CHECKPOINT_ENTRIES = 100_000
# What a damaged archive makes zipfile and NumPy raise; a flipped header bit can claim an unknown compression
# method (NotImplementedError) or encryption (RuntimeError).
_NPZ_READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile, KeyError,
                    NotImplementedError, RuntimeError, struct.error)


def _write_file(path: Path, write) -> None:
    """Write ``path`` atomically through ``write(file)``; an OSError (a full disk, say) becomes a WriteError."""
    try:
        with atomic_write(path) as file:
            write(file)
    except OSError as exc:
        raise WriteError(f"{path}: cannot write the checkpoint ({_one_line(exc)})") from exc


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


# ---- .npz -----------------------------------------------------------------------------------


def save_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray], metadata: Mapping) -> None:
    """Write ``arrays`` (as float32) and ``metadata`` (as JSON) to one ``.npz``, atomically.

    Parent directories are created. Raises CheckpointError for a name that cannot be stored, a
    non-floating-point array or metadata that is not JSON, and WriteError for a failed write (the
    previous file at ``path``, if any, is then left as it was).
    """
    path = Path(path)
    members = {f"{name}.npy": _float32_for_saving(path, name, array) for name, array in arrays.items()}
    members[f"{METADATA_KEY}.npy"] = _encode_metadata(path, metadata)
    _write_file(path, lambda file: _write_zip(file, members))
    log.info("saved %d arrays to %s", len(arrays), path)


def _float32_for_saving(path: Path, name: str, array) -> np.ndarray:
    if not isinstance(name, str) or not name or name == METADATA_KEY or "/" in name:
        raise CheckpointError(f"{path}: cannot store an array under the name {name!r}")
    array = np.asarray(array)
    if not np.issubdtype(array.dtype, np.floating):
        raise CheckpointError(f"{path}: array {name!r} has dtype {array.dtype}; checkpoints hold floating-point arrays")
    return np.ascontiguousarray(array, dtype=np.float32)


def _encode_metadata(path: Path, metadata: Mapping) -> np.ndarray:
    if not isinstance(metadata, Mapping):
        raise CheckpointError(f"{path}: metadata must be a dict, got {type(metadata).__name__}")
    try:
        text = json.dumps(dict(metadata), sort_keys=True, ensure_ascii=False, default=_json_value)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: metadata cannot be written as JSON ({_one_line(exc)})") from exc
    text = _LONE_SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)  # read back as it was
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


def _json_value(value):
    """NumPy scalars and arrays in metadata become their Python equivalents."""
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _write_zip(file: BinaryIO, members: Mapping[str, np.ndarray]) -> None:
    """The layout np.savez writes, without its keyword clashes and with pickling disabled."""
    with zipfile.ZipFile(file, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for member, array in members.items():
            with archive.open(member, mode="w", force_zip64=True) as stream:
                np.lib.format.write_array(stream, array, allow_pickle=False)


def load_npz(path: str | os.PathLike, shapes: Callable[[str], tuple | None] | None = None
             ) -> tuple[dict[str, np.ndarray], dict]:
    """Read a checkpoint written by ``save_npz``: ({name: float32 array}, metadata).

    Never unpickles. Raises CheckpointError (one line naming the file) for a missing file, a
    file that is not an ``.npz``, a truncated or corrupt archive, a pickled object array, a
    missing or invalid ``__metadata__``, or an array that is not floating point or not finite.

    Sizes are checked before anything is decompressed or allocated. From the zip directory: every
    name (a ``.npy`` entry, none twice, at most MAX_CHECKPOINT_ENTRIES, and with ``shapes`` one the
    network has a use for: ``shapes(name)`` is the shape it expects, or None). From each ``.npy``
    header: its dtype (floating point; the metadata's uint8) and its shape, against ``shapes(name)``
    and, without ``shapes``, against MAX_TENSOR_VALUES per array and MAX_CHECKPOINT_BYTES in all;
    the metadata against MAX_METADATA_BYTES. Only the bytes a header declares are read, so a small
    archive whose members inflate to gigabytes is refused from its headers.
    """
    path = Path(path)
    _check_exists(path)
    with _open_archive(path) as archive:
        directory = _directory(path, archive, shapes)
        metadata = _decode_metadata(path, _read_metadata_entry(path, archive, directory))
        arrays = _read_arrays(path, archive, _entries(path, archive, directory), shapes)
    log.info("loaded %d arrays from %s", len(arrays), path)
    return arrays, metadata


def load_npz_metadata(path: str | os.PathLike) -> dict:
    """Only the metadata of a checkpoint (of the arrays only the names in the zip directory are read);
    the errors of ``load_npz``."""
    path = Path(path)
    _check_exists(path)
    with _open_archive(path) as archive:
        return _decode_metadata(path, _read_metadata_entry(path, archive, _directory(path, archive, None)))


def _check_exists(path: Path) -> None:
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint file")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a folder, not a checkpoint file")
    if not path.is_file():  # opening a FIFO waits for a writer for ever; a device is read without end
        raise CheckpointError(f"{path}: not a regular file (a pipe or a device); give a checkpoint file")


@contextlib.contextmanager
def _open_archive(path: Path) -> Iterator[zipfile.ZipFile]:
    """The checkpoint's zip archive; every error reading it becomes a CheckpointError naming the file."""
    _check_zip_signature(path)
    try:
        _check_declared_entries(path)
        with zipfile.ZipFile(path) as archive:
            yield archive
    except CheckpointError:
        raise
    except _NPZ_READ_ERRORS as exc:
        raise CheckpointError(f"{path}: truncated or corrupt .npz checkpoint ({_one_line(exc)})") from exc


def _check_zip_signature(path: Path) -> None:
    try:
        with open(path, "rb") as file:
            head = file.read(len(_ZIP_SIGNATURE))
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({_one_line(exc)})") from exc
    if head == b"":
        raise CheckpointError(f"{path}: the checkpoint file is empty (0 bytes)")
    if head == b"\x93NUM":
        raise CheckpointError(f"{path}: a single .npy array, not an .npz checkpoint")
    if head != _ZIP_SIGNATURE:
        raise CheckpointError(f"{path}: not an .npz checkpoint (not a zip archive; starts with {head!r})")


def _check_declared_entries(path: Path) -> None:
    """Refuse more than MAX_CHECKPOINT_ENTRIES entries from the count the zip's end records declare, or the
    entry signatures in the directory they point at where that is more, before zipfile reads the whole
    directory (``_directory`` counts again what zipfile found)."""
    with open(path, "rb") as file:
        directory = declared_directory(file)
        if directory is None:
            return
        count = directory.entries
        if count <= MAX_CHECKPOINT_ENTRIES:
            count = max(count, entries_at_most(file, directory))
    if count > MAX_CHECKPOINT_ENTRIES:
        raise CheckpointError(_too_many_entries(path, count))


def _too_many_entries(path: Path, count: int) -> str:
    return f"{path}: {count} entries, more than the {MAX_CHECKPOINT_ENTRIES} a checkpoint may hold"


class _Entry(NamedTuple):
    """One ``NAME.npy`` entry of the archive, as its zip and .npy headers declare it."""

    info: zipfile.ZipInfo
    shape: tuple
    dtype: np.dtype


def _directory(path: Path, archive: zipfile.ZipFile, shapes) -> dict[str, zipfile.ZipInfo]:
    """{array name: zip entry} from the zip directory alone (no entry is opened): at most
    MAX_CHECKPOINT_ENTRIES, each a ``NAME.npy`` held once and, with ``shapes``, a name the network has
    a use for."""
    infos = archive.infolist()
    if len(infos) > MAX_CHECKPOINT_ENTRIES:
        raise CheckpointError(_too_many_entries(path, len(infos)))
    directory = {}
    for info in infos:
        if not info.filename.endswith(".npy") or info.is_dir():
            raise CheckpointError(f"{path}: entry {info.filename!r} is not a NumPy array (.npy)")
        name = info.filename[: -len(".npy")]
        if name in directory:
            raise CheckpointError(f"{path}: entry {info.filename!r} appears twice; a checkpoint holds each array once")
        if shapes is not None and name != METADATA_KEY and shapes(name) is None:
            raise CheckpointError(f"{path}: {name}: in the checkpoint, but the network has no such parameter")
        directory[name] = info
    return directory


def _entries(path: Path, archive: zipfile.ZipFile, directory: Mapping[str, zipfile.ZipInfo]) -> dict[str, _Entry]:
    """{array name: entry} of every array but the metadata, from their headers (no data is decompressed)."""
    return {name: _entry(path, archive, info, name) for name, info in directory.items() if name != METADATA_KEY}


def _entry(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> _Entry:
    with archive.open(info) as stream:
        shape, dtype, _, _ = _read_npy_header(path, stream, name)
    return _Entry(info, shape, dtype)


def _read_metadata_entry(path: Path, archive: zipfile.ZipFile, directory: Mapping[str, zipfile.ZipInfo]
                         ) -> np.ndarray | None:
    """The metadata's bytes, its size and its header (a 1-D uint8 array) checked before they are read."""
    info = directory.get(METADATA_KEY)
    if info is None:
        return None
    if info.file_size > MAX_METADATA_BYTES:
        raise CheckpointError(f"{path}: {METADATA_KEY} declares {info.file_size} bytes, more than the "
                              f"{MAX_METADATA_BYTES} metadata may take")
    entry = _entry(path, archive, info, METADATA_KEY)
    if entry.dtype != np.uint8 or len(entry.shape) != 1:
        raise CheckpointError(f"{path}: invalid {METADATA_KEY} (a {entry.dtype} array of shape {entry.shape})")
    return _read_member(path, archive, entry, METADATA_KEY)


def _read_arrays(path: Path, archive: zipfile.ZipFile, entries: Mapping[str, _Entry], shapes) -> dict[str, np.ndarray]:
    """Every array but the metadata, all checked from their headers before any data is read."""
    _check_declared(path, entries, shapes)
    return {name: _float32_for_loading(path, name, _read_member(path, archive, entry, name))
            for name, entry in entries.items()}


def _read_npy_header(path: Path, stream, name: str) -> tuple[tuple, np.dtype, bool, int]:
    """(shape, dtype, fortran order, header length) of the .npy file ``stream`` is at the start of."""
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
    elif version == (2, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(stream)
    else:
        raise CheckpointError(f"{path}: array {name!r} is a .npy file of version {version}; checkpoints use 1.0 or 2.0")
    if dtype.hasobject:
        raise CheckpointError(
            f"{path}: array {name!r} holds pickled Python objects; refused (a checkpoint holds plain arrays)")
    return tuple(shape), dtype, fortran_order, stream.tell()


def _check_declared(path: Path, entries: Mapping[str, _Entry], shapes) -> None:
    """Every array's declared shape is the one the network expects, or within the limits."""
    total = 0
    for name, (_, shape, dtype) in entries.items():
        if dtype.kind != "f":
            raise CheckpointError(f"{path}: array {name!r} has dtype {dtype.str}; expected floating point")
        expected = None if shapes is None else shapes(name)
        if expected is not None and shape != tuple(expected):
            raise CheckpointError(f"{path}: {name}: checkpoint has {shape}, network needs {tuple(expected)}")
        if prod(shape) > MAX_TENSOR_VALUES:
            raise CheckpointError(f"{path}: array {name!r} declares shape {shape}, {prod(shape)} values, more than "
                                  f"the {MAX_TENSOR_VALUES} a tensor may hold")
        total += prod(shape) * dtype.itemsize
    if shapes is None and total > MAX_CHECKPOINT_BYTES:
        raise CheckpointError(f"{path}: the arrays declare {total} bytes in all, more than the "
                              f"{MAX_CHECKPOINT_BYTES} a checkpoint may hold")


def _read_member(path: Path, archive: zipfile.ZipFile, entry: _Entry, name: str) -> np.ndarray:
    """The array of one entry whose header was checked, reading (decompressing) only the bytes it declares."""
    info = entry.info
    with archive.open(info) as stream:
        shape, dtype, fortran_order, header_size = _read_npy_header(path, stream, name)
        if (shape, dtype) != (entry.shape, entry.dtype):  # the file was rewritten meanwhile
            raise CheckpointError(f"{path}: truncated or corrupt .npz checkpoint (entry {name!r} changed while "
                                  f"it was read)")
        nbytes = prod(shape) * dtype.itemsize
        if info.file_size != header_size + nbytes:
            raise CheckpointError(f"{path}: truncated or corrupt .npz checkpoint (entry {name!r} holds "
                                  f"{info.file_size} bytes, its header declares {header_size + nbytes})")
        data = bytearray(nbytes)  # writable, as np.load's arrays are
        filled = _read_into(stream, memoryview(data))
    if filled != nbytes:
        raise CheckpointError(f"{path}: truncated or corrupt .npz checkpoint (entry {name!r} ends after "
                              f"{filled} of {nbytes} bytes)")
    return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran_order else "C")


def _read_into(stream, buffer: memoryview) -> int:
    """Fill ``buffer`` from ``stream``; the number of bytes read (fewer where the stream ends)."""
    filled = 0
    while filled < len(buffer):
        count = stream.readinto(buffer[filled:])
        if not count:
            break
        filled += count
    return filled


def _decode_metadata(path: Path, encoded: np.ndarray | None) -> dict:
    if encoded is None:
        raise CheckpointError(f"{path}: no {METADATA_KEY} entry; not a cudnnnet checkpoint")
    if encoded.dtype != np.uint8 or encoded.ndim != 1:
        raise CheckpointError(f"{path}: invalid {METADATA_KEY} (a {encoded.dtype} array of shape {encoded.shape})")
    try:
        metadata = json.loads(encoded.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{path}: invalid {METADATA_KEY}: not UTF-8 JSON ({_one_line(exc)})") from exc
    except RecursionError:
        raise CheckpointError(f"{path}: invalid {METADATA_KEY}: JSON nested too deeply to read") from None
    if not isinstance(metadata, dict):
        raise CheckpointError(f"{path}: invalid {METADATA_KEY}: a JSON {type(metadata).__name__}, not an object")
    return metadata


def _float32_for_loading(path: Path, name: str, array: np.ndarray) -> np.ndarray:
    if not np.issubdtype(array.dtype, np.floating):
        raise CheckpointError(f"{path}: array {name!r} has dtype {array.dtype}; expected floating point")
    array = np.ascontiguousarray(array, dtype=np.float32)
    _check_finite(path, name, array)
    return array


def _check_finite(source: Path, name: str, array: np.ndarray) -> None:
    if not np.isfinite(array).all():
        raise CheckpointError(f"{source}: {name} holds NaN or infinite values")


# ---- compatibility --------------------------------------------------------------------------


def check_compatible(
    arrays: Mapping[str, np.ndarray],
    expected: Mapping[str, tuple],
    source: str | os.PathLike | None = None,
) -> None:
    """Raise CheckpointError naming the first missing name, unexpected name, or shape difference.

    ``expected`` maps each parameter name of the network to its shape. ``source`` (the file)
    prefixes the message when given.
    """
    prefix = f"{source}: " if source is not None else ""
    for name in expected:
        if name not in arrays:
            raise CheckpointError(f"{prefix}{name}: missing from the checkpoint (the network needs shape {tuple(expected[name])})")
    for name in arrays:
        if name not in expected:
            raise CheckpointError(f"{prefix}{name}: in the checkpoint, but the network has no such parameter")
    for name, shape in expected.items():
        found = tuple(np.shape(arrays[name]))
        if found != tuple(shape):
            raise CheckpointError(f"{prefix}{name}: checkpoint has {found}, network needs {tuple(shape)}")


# ---- the original's layout ------------------------------------------------------------------


def dense_to_original(weight: np.ndarray) -> bytes:
    """Our Dense weight (out, in, 1, 1), row-major -> the original's bytes.

    The original keeps W as the (in, out) matrix cuBLAS reads column-major (ld = in): element
    (i, o) at offset o·in + i. That is W_orig = wᵀ written in Fortran order, which happens to be
    the same bytes as our (out, in) row-major array.
    """
    weight = np.asarray(weight)
    out_size, in_size = _dense_sizes(weight.shape)
    matrix = weight.astype(np.float32).reshape(out_size, in_size).T  # (in, out)
    return matrix.astype(ORIGINAL_DTYPE).tobytes(order="F")


def original_to_dense(blob: bytes, out_size: int, in_size: int) -> np.ndarray:
    """The original's Dense bytes ((in, out) column-major) -> our weight (out, in, 1, 1) float32."""
    matrix = np.frombuffer(blob, dtype=ORIGINAL_DTYPE).reshape((in_size, out_size), order="F")
    return np.ascontiguousarray(matrix.T, dtype=np.float32).reshape(out_size, in_size, 1, 1)


def conv_to_original(weight: np.ndarray) -> bytes:
    """Our Conv2D weight (out, in, k, k) -> the original's bytes: the same (out, in, k, k) row-major."""
    return _row_major_bytes(weight)


def original_to_conv(blob: bytes, shape: tuple) -> np.ndarray:
    """The original's Conv2D bytes -> our weight of ``shape`` (out, in, k, k) float32."""
    return _from_row_major_bytes(blob, shape)


def _row_major_bytes(array: np.ndarray) -> bytes:
    """Conv2D weights and all biases: the values in row-major order as little-endian float32."""
    return np.ascontiguousarray(array, dtype=ORIGINAL_DTYPE).tobytes(order="C")


def _from_row_major_bytes(blob: bytes, shape: tuple) -> np.ndarray:
    return np.frombuffer(blob, dtype=ORIGINAL_DTYPE).reshape(shape).astype(np.float32)


def _dense_sizes(shape: tuple) -> tuple[int, int]:
    if _is_dense_weight(shape):
        return int(shape[0]), int(shape[1])
    raise ValueError(f"a Dense weight is shaped (out, in, 1, 1) or (out, in), got {tuple(shape)}")


def _is_dense_weight(shape: tuple) -> bool:
    """A weight (out, in, 1, 1) or (out, in) is written as a Dense matrix.

    A 1x1 convolution has this shape too; its original layout is the same bytes, so the choice
    does not change the file.
    """
    return len(shape) == 2 or (len(shape) == 4 and tuple(shape[2:]) == (1, 1))


def original_file_name(name: str) -> str:
    """``L.weight`` -> ``L.bin``, ``L.bias`` -> ``L.bias.bin``; anything else has no file."""
    if name.endswith(WEIGHT_SUFFIX) and len(name) > len(WEIGHT_SUFFIX):
        return name[: -len(WEIGHT_SUFFIX)] + ".bin"
    if name.endswith(BIAS_SUFFIX) and len(name) > len(BIAS_SUFFIX):
        return name + ".bin"
    raise CheckpointError(f"{name}: the original format stores only L.weight (L.bin) and L.bias (L.bias.bin)")


def _to_original(name: str, array: np.ndarray) -> bytes:
    array = np.asarray(array)
    if not name.endswith(WEIGHT_SUFFIX):
        return _row_major_bytes(array)
    return dense_to_original(array) if _is_dense_weight(array.shape) else conv_to_original(array)


def _from_original(name: str, blob: bytes, shape: tuple) -> np.ndarray:
    if not name.endswith(WEIGHT_SUFFIX):
        return _from_row_major_bytes(blob, shape)
    if _is_dense_weight(shape):
        return original_to_dense(blob, *_dense_sizes(shape)).reshape(shape)
    return original_to_conv(blob, shape)


def write_original(directory: str | os.PathLike, arrays: Mapping[str, np.ndarray]) -> None:
    """Write each ``L.weight`` to ``directory/L.bin`` and ``L.bias`` to ``L.bias.bin`` (atomic per file)."""
    directory = Path(directory)
    paths = {name: directory / original_file_name(name) for name in arrays}  # every name has a file, or none is written
    for name, array in arrays.items():
        path = paths[name]
        blob = _to_original(name, array)
        _write_file(path, lambda file, blob=blob: file.write(blob))
    log.info("wrote %d parameter files to %s", len(arrays), directory)


def read_original(directory: str | os.PathLike, expected: Mapping[str, tuple]) -> dict[str, np.ndarray]:
    """Read the original's ``.bin`` files for every name in ``expected`` (name -> shape).

    Raises CheckpointError for a missing directory or file, or a file whose size is not the
    expected shape's (naming the file and both byte counts).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: no such pretrained-parameter directory")
    arrays = {name: _read_original_file(directory, name, tuple(shape)) for name, shape in expected.items()}
    log.info("read %d parameter files from %s", len(arrays), directory)
    return arrays


def _read_original_file(directory: Path, name: str, shape: tuple) -> np.ndarray:
    path = directory / original_file_name(name)
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (it holds {name}, shape {shape})")
    expected_bytes = prod(shape) * ORIGINAL_DTYPE.itemsize
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            blob = file.read(expected_bytes) if size == expected_bytes else b""  # a file of another size is not read
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({_one_line(exc)})") from exc
    if size != expected_bytes or len(blob) != expected_bytes:
        raise CheckpointError(
            f"{path}: expected {expected_bytes} bytes (float32 {name} of shape {shape}), found {size} bytes"
        )
    array = _from_original(name, blob, shape)
    _check_finite(path, name, array)
    return array
