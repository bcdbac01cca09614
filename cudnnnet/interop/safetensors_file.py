"""The safetensors format, read and written with NumPy alone (no ``safetensors`` package needed).

A file is an 8-byte little-endian header length, a UTF-8 JSON header, then the tensors' bytes:

    {"fc1.weight": {"dtype": "F32", "shape": [500, 784, 1, 1], "data_offsets": [0, 1568000]}, ...,
     "__metadata__": {"format": "cudnnnet-checkpoint", "cudnnnet": "<our .npz metadata as JSON>"}}

``data_offsets`` are byte ranges of the data that follows the header; the tensors cover it with no gap
and no overlap. We write float32 in row-major order, the header padded with spaces to a multiple of
8 bytes (as the reference writer does), and our checkpoint metadata (the model, the training config)
as one JSON string under ``__metadata__["cudnnnet"]``, since safetensors metadata maps strings to
strings. We read F32, F16, BF16 and F64 tensors (what a PyTorch ``state_dict`` holds for weights),
converted to float32; everything is checked from the header before any tensor's bytes are read.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from math import prod
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from ..errors import CheckpointError
from ..io.checkpoint import (MAX_CHECKPOINT_BYTES, MAX_METADATA_BYTES, _check_exists, _decode_metadata,
                             _encode_metadata, _float32_for_loading, _float32_for_saving, _one_line, _write_file)
from ..tensor import MAX_TENSOR_VALUES

log = logging.getLogger(__name__)

SUFFIX = ".safetensors"
HEADER_METADATA = "__metadata__"
OUR_METADATA = "cudnnnet"  # the key of our metadata's JSON inside the header's __metadata__
_LENGTH = struct.Struct("<Q")
MAX_HEADER_BYTES = MAX_METADATA_BYTES + (16 << 20)  # our metadata and the tensors' entries
_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8"), "BF16": np.dtype("<u2")}
# integer tensors a state_dict may hold (BatchNorm's num_batches_tracked): their sizes are checked, never read
_SKIPPABLE = {"I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def is_safetensors(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a safetensors file (by its suffix)."""
    return Path(path).suffix == SUFFIX


# ---- writing --------------------------------------------------------------------------------


def save_safetensors(path: str | os.PathLike, arrays: Mapping[str, np.ndarray], metadata: Mapping) -> None:
    """Write ``arrays`` (as float32) and ``metadata`` (a JSON object, as our checkpoints carry) to one
    ``.safetensors`` file, atomically; the errors of ``checkpoint.save_npz``."""
    path = Path(path)
    values = {name: _float32_for_saving(path, name, array) for name, array in sorted(arrays.items())}
    text = _encode_metadata(path, metadata).tobytes().decode("utf-8")
    header, offset = {HEADER_METADATA: {"format": str(metadata.get("format", "")), OUR_METADATA: text}}, 0
    for name, array in values.items():
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    encoded = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)

    def write(file) -> None:
        file.write(_LENGTH.pack(len(encoded)) + encoded)
        for array in values.values():
            file.write(array.astype("<f4", copy=False).tobytes(order="C"))
    _write_file(path, write)
    log.info("saved %d arrays to %s", len(values), path)


# ---- reading --------------------------------------------------------------------------------


def load_safetensors(path: str | os.PathLike, shapes: Callable[[str], tuple | None] | None = None,
                     skip: Callable[[str], bool] = lambda name: False) -> tuple[dict[str, np.ndarray], dict]:
    """({name: float32 array}, our metadata or {} where the file has none) of a ``.safetensors`` file.

    ``shapes(name)``, where given, is the shape the network expects (None: a name it has no use for):
    each tensor's declared shape is checked against it, and without it against MAX_TENSOR_VALUES per
    tensor and MAX_CHECKPOINT_BYTES in all, before anything is read. The tensors named by ``skip`` are
    left out (an integer tensor among them is not refused). Raises CheckpointError naming the
    file for a missing, truncated or malformed file, an unknown dtype, or values that are not finite.
    """
    path = Path(path)
    with _open(path) as file:
        header, data_start, data_bytes = _read_header(path, file)
        entries = {name: entry for name, entry in _entries(path, header, data_bytes).items() if not skip(name)}
        _check_declared(path, entries, shapes)
        arrays = {name: _read_tensor(path, file, data_start, name, entry) for name, entry in entries.items()}
    log.info("loaded %d arrays from %s", len(arrays), path)
    return arrays, _our_metadata(path, header)


def load_safetensors_metadata(path: str | os.PathLike) -> dict:
    """Only our metadata of a ``.safetensors`` file ({} where it has none); the header's errors of ``load_safetensors``."""
    path = Path(path)
    with _open(path) as file:
        header, _, data_bytes = _read_header(path, file)
        _entries(path, header, data_bytes)
    return _our_metadata(path, header)


def _open(path: Path):
    _check_exists(path)
    try:
        return open(path, "rb")
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({_one_line(exc)})") from exc


def _read_header(path: Path, file) -> tuple[dict, int, int]:
    """(the header's JSON object, where the data starts, how many bytes of data follow)."""
    size = os.fstat(file.fileno()).st_size
    prefix = file.read(_LENGTH.size)
    if len(prefix) < _LENGTH.size:
        raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, shorter than its 8-byte header length)")
    (length,) = _LENGTH.unpack(prefix)
    if length > MAX_HEADER_BYTES or _LENGTH.size + length > size:
        raise CheckpointError(f"{path}: not a safetensors file, or a truncated one (its header declares {length} "
                              f"bytes; the file has {size})")
    try:
        header = json.loads(file.read(length).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a safetensors file (its header is not UTF-8 JSON: {_one_line(exc)})") from exc
    except RecursionError:
        raise CheckpointError(f"{path}: not a safetensors file (its header is JSON nested too deeply)") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: not a safetensors file (its header is a JSON {type(header).__name__}, not an object)")
    return header, _LENGTH.size + length, size - _LENGTH.size - length


def _entries(path: Path, header: dict, data_bytes: int) -> dict[str, tuple[str, tuple, int, int]]:
    """{name: (dtype, shape, begin, end)}, each checked; together they cover the data exactly."""
    entries = {name: _entry(path, name, value) for name, value in header.items() if name != HEADER_METADATA}
    position = 0
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda item: item[1][2:]):
        if begin != position:
            raise CheckpointError(f"{path}: tensor {name!r} starts at byte {begin} of the data, expected {position} "
                                  f"(tensors must cover the data without gaps or overlaps)")
        position = end
    if position != data_bytes:
        raise CheckpointError(f"{path}: truncated or corrupt safetensors file (its tensors declare {position} bytes "
                              f"of data, the file holds {data_bytes})")
    return entries


def _entry(path: Path, name: str, value) -> tuple[str, tuple, int, int]:
    if not isinstance(value, dict) or value.get("dtype") not in (*_DTYPES, *_SKIPPABLE):
        dtype = value.get("dtype") if isinstance(value, dict) else value
        raise CheckpointError(f"{path}: tensor {name!r} has dtype {dtype!r}; readable are {', '.join(_DTYPES)}")
    shape, offsets = value.get("shape"), value.get("data_offsets")
    if not isinstance(shape, list) or not all(type(size) is int and size >= 0 for size in shape):
        raise CheckpointError(f"{path}: tensor {name!r} has an invalid shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
        raise CheckpointError(f"{path}: tensor {name!r} has invalid data_offsets {offsets!r}")
    begin, end = offsets
    itemsize = _DTYPES[value["dtype"]].itemsize if value["dtype"] in _DTYPES else _SKIPPABLE[value["dtype"]]
    if begin < 0 or end - begin != prod(shape) * itemsize:
        raise CheckpointError(f"{path}: tensor {name!r}: data_offsets {offsets} do not hold its shape {tuple(shape)} "
                              f"of {value['dtype']}")
    return value["dtype"], tuple(shape), begin, end


def _check_declared(path: Path, entries: Mapping, shapes) -> None:
    total = 0
    for name, (dtype, shape, begin, end) in entries.items():
        if dtype not in _DTYPES:
            raise CheckpointError(f"{path}: tensor {name!r} has dtype {dtype}; weights are floating point "
                                  f"({', '.join(_DTYPES)})")
        expected = None if shapes is None else shapes(name)
        if shapes is not None and expected is not None and shape != tuple(expected):
            raise CheckpointError(f"{path}: {name}: checkpoint has {shape}, network needs {tuple(expected)}")
        if prod(shape) > MAX_TENSOR_VALUES:
            raise CheckpointError(f"{path}: tensor {name!r} declares shape {shape}, {prod(shape)} values, more than "
                                  f"the {MAX_TENSOR_VALUES} a tensor may hold")
        total += end - begin
    if shapes is None and total > MAX_CHECKPOINT_BYTES:
        raise CheckpointError(f"{path}: the tensors declare {total} bytes in all, more than the "
                              f"{MAX_CHECKPOINT_BYTES} a checkpoint may hold")


def _read_tensor(path: Path, file, data_start: int, name: str, entry: tuple) -> np.ndarray:
    dtype, shape, begin, end = entry
    file.seek(data_start + begin)
    blob = file.read(end - begin)
    if len(blob) != end - begin:
        raise CheckpointError(f"{path}: truncated safetensors file (tensor {name!r} ends after {len(blob)} of "
                              f"{end - begin} bytes)")
    values = np.frombuffer(blob, dtype=_DTYPES[dtype])
    if dtype == "BF16":  # the high 16 bits of a float32
        values = (values.astype(np.uint32) << 16).view(np.float32)
    return _float32_for_loading(path, name, values.reshape(shape))


def _our_metadata(path: Path, header: dict) -> dict:
    """Our checkpoint metadata from the header's ``__metadata__`` ({} where it carries none: another tool's file)."""
    extra = header.get(HEADER_METADATA, {})
    text = extra.get(OUR_METADATA) if isinstance(extra, dict) else None
    if not isinstance(extra, dict) or not isinstance(text, (str, type(None))):
        raise CheckpointError(f"{path}: invalid {HEADER_METADATA} (safetensors metadata maps strings to strings)")
    return {} if text is None else _decode_metadata(path, np.frombuffer(text.encode("utf-8"), dtype=np.uint8))
