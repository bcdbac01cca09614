"""Checkpoint formats: .npz round trips and refusals, the original's .bin layout, atomic saves."""

import io
import json
import os
import pickle
import struct
import tracemalloc
import zipfile

import numpy as np
import pytest

from cudnnnet.io import checkpoint
from cudnnnet.io.checkpoint import (
    check_compatible,
    dense_to_original,
    load_npz,
    original_to_dense,
    read_original,
    save_npz,
    write_original,
)
from cudnnnet.errors import CheckpointError, WriteError
from hostile_files import Entry, npy_header, write_zip


def lenet_like_arrays(seed=0):
    rng = np.random.default_rng(seed)
    shapes = {
        "conv1.weight": (20, 1, 5, 5),
        "conv1.bias": (20,),
        "fc1.weight": (500, 800, 1, 1),
        "fc1.bias": (500,),
        "fc2.weight": (10, 500, 1, 1),
        "fc2.bias": (10,),
    }
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def shapes_of(arrays):
    return {name: array.shape for name, array in arrays.items()}


def assert_same_arrays(got, want):
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == np.float32
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def npz_with_members(path, members):
    """An .npz written member by member, to build checkpoints save_npz would never write."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, array in members.items():
            with archive.open(f"{name}.npy", "w") as stream:
                np.lib.format.write_array(stream, array, allow_pickle=True)


def metadata_array(metadata):
    return np.frombuffer(json.dumps(metadata).encode(), dtype=np.uint8)


# ---- .npz round trip ----------------------------------------------------------------------


def test_npz_round_trip_keeps_arrays_and_metadata(tmp_path):
    arrays = lenet_like_arrays()
    metadata = {"model": "lenet", "epoch": 3, "accuracy": np.float32(0.5), "layers": ["conv1", "fc1"]}
    path = tmp_path / "deep" / "er" / "model.npz"  # parents are created
    save_npz(path, arrays, metadata)
    loaded, loaded_metadata = load_npz(path)
    assert_same_arrays(loaded, arrays)
    assert loaded_metadata == {"model": "lenet", "epoch": 3, "accuracy": 0.5, "layers": ["conv1", "fc1"]}


def test_npz_holds_no_pickle_and_metadata_as_utf8_json(tmp_path):
    path = tmp_path / "model.npz"
    save_npz(path, {"fc1.bias": np.ones(3, np.float64)}, {"name": "réseau"})
    with np.load(path, allow_pickle=False) as archive:
        assert sorted(archive.files) == ["__metadata__", "fc1.bias"]
        assert archive["__metadata__"].dtype == np.uint8
        assert archive["__metadata__"].tobytes().decode("utf-8") == '{"name": "réseau"}'
        assert archive["fc1.bias"].dtype == np.float32


def test_metadata_naming_a_folder_whose_name_is_not_utf8_is_written_and_read_back_as_it_was(tmp_path):
    """A data.dir whose name holds a byte that is not UTF-8 (a Latin-1 name: os.fsdecode keeps it as a lone
    surrogate) made the checkpoint's JSON unencodable: training ended with a UnicodeEncodeError traceback
    when it saved, and its weights were lost."""
    folder = os.fsdecode(b"/data/caf\xe9")
    path = tmp_path / "model.npz"
    save_npz(path, {"fc1.bias": np.ones(3, np.float32)}, {"data": {"dir": folder}, "name": "réseau"})
    _, metadata = load_npz(path)
    assert metadata == {"data": {"dir": folder}, "name": "réseau"}
    assert os.fsencode(metadata["data"]["dir"]) == b"/data/caf\xe9"
    with np.load(path, allow_pickle=False) as archive:  # still UTF-8 JSON: the byte as its escape
        assert archive["__metadata__"].tobytes().decode("utf-8") == (
            '{"data": {"dir": "/data/caf\\udce9"}, "name": "réseau"}')


def test_npz_float64_and_float16_are_read_as_float32(tmp_path):
    path = tmp_path / "model.npz"
    npz_with_members(path, {"a.weight": np.arange(4, dtype=np.float64), "a.bias": np.ones(2, np.float16),
                            "__metadata__": metadata_array({})})
    arrays, _ = load_npz(path)
    assert arrays["a.weight"].dtype == np.float32 and arrays["a.bias"].dtype == np.float32
    np.testing.assert_array_equal(arrays["a.weight"], [0, 1, 2, 3])


@pytest.mark.parametrize("name", ["__metadata__", "", "a/b", 3])
def test_save_refuses_names_it_cannot_store(tmp_path, name):
    with pytest.raises(CheckpointError, match="cannot store"):
        save_npz(tmp_path / "m.npz", {name: np.ones(2, np.float32)}, {})


def test_save_refuses_integer_arrays_and_non_json_metadata(tmp_path):
    with pytest.raises(CheckpointError, match="int64"):
        save_npz(tmp_path / "m.npz", {"fc1.weight": np.ones(2, np.int64)}, {})
    with pytest.raises(CheckpointError, match="JSON"):
        save_npz(tmp_path / "m.npz", {"fc1.weight": np.ones(2, np.float32)}, {"when": object()})
    assert list(tmp_path.iterdir()) == []


# ---- .npz refusals ------------------------------------------------------------------------


def test_load_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="nope.npz: no such checkpoint file"):
        load_npz(tmp_path / "nope.npz")


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_pipe_or_device_given_as_a_checkpoint_is_refused_not_waited_on(tmp_path, kind):
    """predict --weights FIFO waited for a writer for ever (evaluate and --resume too)."""
    from hostile_files import plant, within

    plant(tmp_path / "model.npz", kind)
    with within(5):
        for load in (load_npz, checkpoint.load_npz_metadata):
            with pytest.raises(CheckpointError, match=r"model\.npz: not a regular file \(a pipe or a device\); give a "
                                                      r"checkpoint file"):
                load(tmp_path / "model.npz")


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.95])
def test_load_truncated_npz(tmp_path, keep):
    good = tmp_path / "good.npz"
    save_npz(good, lenet_like_arrays(), {"epoch": 1})
    data = good.read_bytes()
    bad = tmp_path / "truncated.npz"
    bad.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(CheckpointError, match=r"truncated\.npz: truncated or corrupt"):
        load_npz(bad)


def test_load_npz_with_corrupted_array_bytes(tmp_path):
    path = tmp_path / "flipped.npz"
    save_npz(path, {"fc1.weight": np.zeros(1000, np.float32)}, {})
    data = bytearray(path.read_bytes())
    data[2000:2010] = b"\xff" * 10  # inside the array's data: the CRC no longer matches
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="flipped.npz: truncated or corrupt"):
        load_npz(path)


@pytest.mark.parametrize(
    "content, problem",
    [
        (np.random.default_rng(1).bytes(4096), "not an .npz checkpoint"),
        (b"epoch: 3\nweights: lots\n", "not an .npz checkpoint"),
        (b"", "the checkpoint file is empty"),
    ],
    ids=["random-bytes", "text", "empty"],
)
def test_load_files_that_are_not_npz(tmp_path, content, problem):
    path = tmp_path / "model.npz"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=f"model.npz: {problem}"):
        load_npz(path)


def test_load_single_npy_is_refused(tmp_path):
    path = tmp_path / "model.npz"
    with open(path, "wb") as file:
        np.save(file, np.ones(3, np.float32))
    with pytest.raises(CheckpointError, match="single .npy array"):
        load_npz(path)


class Bomb:
    """Unpickling this would run code; the loader must refuse before that."""

    unpickled = False

    def __reduce__(self):
        return (Bomb._explode, ())

    @staticmethod
    def _explode():
        Bomb.unpickled = True
        return "exploded"


def test_load_refuses_pickled_object_array(tmp_path):
    path = tmp_path / "pickled.npz"
    objects = np.array([Bomb(), 1], dtype=object)
    npz_with_members(path, {"fc1.weight": objects, "__metadata__": metadata_array({})})
    with pytest.raises(CheckpointError, match="'fc1.weight' holds pickled Python objects; refused"):
        load_npz(path)
    assert not Bomb.unpickled


def test_load_refuses_pickled_metadata(tmp_path):
    path = tmp_path / "pickled.npz"
    npz_with_members(path, {"fc1.weight": np.ones(2, np.float32), "__metadata__": np.array({"a": 1}, dtype=object)})
    with pytest.raises(CheckpointError, match="pickled"):
        load_npz(path)


def test_load_refuses_a_raw_pickle(tmp_path):
    path = tmp_path / "model.npz"
    path.write_bytes(pickle.dumps({"fc1.weight": [1.0, 2.0]}))
    with pytest.raises(CheckpointError, match="not an .npz checkpoint"):
        load_npz(path)


@pytest.mark.parametrize(
    "metadata, problem",
    [
        (None, "no __metadata__ entry"),
        (np.frombuffer(b"\xff\xfe{", dtype=np.uint8), "not UTF-8 JSON"),
        (np.frombuffer(b"{not json", dtype=np.uint8), "not UTF-8 JSON"),
        (metadata_array([1, 2]), "a JSON list, not an object"),
        (np.zeros(3, np.float32), "invalid __metadata__"),
    ],
    ids=["missing", "not-utf8", "not-json", "not-object", "wrong-dtype"],
)
def test_load_refuses_bad_metadata(tmp_path, metadata, problem):
    members = {"fc1.weight": np.ones(2, np.float32)}
    if metadata is not None:
        members["__metadata__"] = metadata
    path = tmp_path / "model.npz"
    npz_with_members(path, members)
    with pytest.raises(CheckpointError, match=problem):
        load_npz(path)


@pytest.mark.parametrize("array", [np.arange(3), np.array([True]), np.array(["a"]), np.ones(2, np.complex64)])
def test_load_refuses_non_float_arrays(tmp_path, array):
    path = tmp_path / "model.npz"
    npz_with_members(path, {"fc1.weight": array, "__metadata__": metadata_array({})})
    with pytest.raises(CheckpointError, match="'fc1.weight' has dtype .*; expected floating point"):
        load_npz(path)


def test_load_refuses_non_finite_values(tmp_path):
    path = tmp_path / "model.npz"
    npz_with_members(path, {"fc1.weight": np.array([1.0, np.nan], np.float32), "__metadata__": metadata_array({})})
    with pytest.raises(CheckpointError, match="fc1.weight holds NaN"):
        load_npz(path)


def test_load_refuses_zip_member_that_is_not_an_array(tmp_path):
    path = tmp_path / "model.npz"
    npz_with_members(path, {"__metadata__": metadata_array({})})
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("notes.txt", "hello")
    with pytest.raises(CheckpointError, match="'notes.txt' is not a NumPy array"):
        load_npz(path)


# ---- compatibility ------------------------------------------------------------------------


# ---- declared sizes: headers are checked before any data is decompressed -----------------------


def metadata_entry(text: bytes = b"{}") -> Entry:
    return Entry(npy_header((len(text),), "|u1") + text)


def test_an_array_declaring_another_shape_than_the_network_needs_is_refused_from_its_header(tmp_path):
    path = tmp_path / "bomb.npz"
    write_zip(path, {"fc.weight.npy": Entry(npy_header((2**28,)), 1024), "__metadata__.npy": metadata_entry()})
    assert path.stat().st_size < 2 * (1 << 20)
    with pytest.raises(CheckpointError, match=r"bomb\.npz: fc\.weight: checkpoint has \(268435456,\), network needs \(10, 4\)"):
        load_npz(path, {"fc.weight": (10, 4)}.get)


def test_an_array_the_network_has_no_use_for_is_refused_from_its_header(tmp_path):
    path = tmp_path / "extra.npz"
    write_zip(path, {"junk.npy": Entry(npy_header((2**28,)), 1024), "__metadata__.npy": metadata_entry()})
    with pytest.raises(CheckpointError, match=r"extra\.npz: junk: in the checkpoint, but the network has no such parameter"):
        load_npz(path, {"fc.weight": (10, 4)}.get)


def test_without_shapes_an_array_larger_than_a_tensor_is_refused_from_its_header(tmp_path):
    path = tmp_path / "huge.npz"
    write_zip(path, {"w.npy": Entry(npy_header((2**31,)), 1), "__metadata__.npy": metadata_entry()})
    with pytest.raises(CheckpointError, match=r"huge\.npz: array 'w' declares shape \(2147483648,\), 2147483648 values, "
                                              r"more than the 2147483647 a tensor may hold"):
        load_npz(path)


def test_without_shapes_the_total_is_limited(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "MAX_CHECKPOINT_BYTES", 1000)
    path = tmp_path / "many.npz"
    save_npz(path, {f"a{index}": np.zeros(100, np.float32) for index in range(3)}, {})
    with pytest.raises(CheckpointError, match=r"many\.npz: the arrays declare 1200 bytes in all, more than the 1000"):
        load_npz(path)


def test_an_entry_larger_than_its_header_declares_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "long.npz"
    write_zip(path, {"w.npy": Entry(npy_header((4,)), 1024), "__metadata__.npy": metadata_entry()})
    with pytest.raises(CheckpointError, match=r"long\.npz: truncated or corrupt \.npz checkpoint \(entry 'w' holds "
                                              r"1073741952 bytes, its header declares 144\)"):
        load_npz(path, {"w": (4,)}.get)


def test_metadata_declaring_more_than_the_limit_is_refused_from_its_header(tmp_path):
    path = tmp_path / "meta.npz"
    write_zip(path, {"__metadata__.npy": Entry(npy_header((1 << 30,), "|u1"), 1024)})
    with pytest.raises(CheckpointError, match=r"meta\.npz: __metadata__ declares 1073741952 bytes, more than the 16777216"):
        checkpoint.load_npz_metadata(path)


@pytest.mark.parametrize("text, problem", [
    (b"[" * 100_000 + b"]" * 100_000, "JSON nested too deeply to read"),
    (b'{"a": 1' + b"0" * 5000 + b"}", "not UTF-8 JSON"),
])
def test_metadata_that_json_cannot_read_is_a_checkpoint_error(tmp_path, text, problem):
    path = tmp_path / "meta.npz"
    save_npz(path, {}, {})
    with zipfile.ZipFile(path, "w") as archive:
        with archive.open("__metadata__.npy", "w") as stream:
            np.lib.format.write_array(stream, np.frombuffer(text, np.uint8))
    with pytest.raises(CheckpointError, match=rf"meta\.npz: invalid __metadata__: {problem}"):
        load_npz(path)


def test_load_npz_metadata_reads_no_array(tmp_path, monkeypatch):
    path = tmp_path / "model.npz"
    save_npz(path, lenet_like_arrays(), {"epoch": 3})
    monkeypatch.setattr(checkpoint, "_read_arrays", lambda *args: pytest.fail("an array was read"))
    assert checkpoint.load_npz_metadata(path) == {"epoch": 3}


def peak_bytes_while(call) -> int:
    """The peak of the memory Python allocated while ``call()`` ran (its exception, if any, swallowed)."""
    tracemalloc.start()
    try:
        call()
    except CheckpointError:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("shapes", [None, {"fc.weight": (64, 64)}.get])
def test_an_array_of_a_wide_dtype_is_refused_from_its_header_before_it_is_inflated(tmp_path, shapes):
    """64 x 64 values of |V4096 (16 MiB), the shape the network needs, in 20 KB on disk."""
    path = tmp_path / "wide.npz"
    write_zip(path, {"fc.weight.npy": Entry(npy_header((64, 64), "|V4096"), 16), "__metadata__.npy": metadata_entry()})
    assert path.stat().st_size < 64 << 10
    with pytest.raises(CheckpointError, match=r"wide\.npz: array 'fc\.weight' has dtype \|V4096; expected floating point"):
        load_npz(path, shapes)
    assert peak_bytes_while(lambda: load_npz(path, shapes)) < 4 << 20


def test_metadata_of_another_dtype_is_refused_from_its_header_before_it_is_inflated(tmp_path):
    path = tmp_path / "wide.npz"
    write_zip(path, {"__metadata__.npy": Entry(npy_header((1024,), "|V8192"), 8)})
    with pytest.raises(CheckpointError, match=r"wide\.npz: invalid __metadata__ \(a \|V8192 array of shape \(1024,\)\)"):
        checkpoint.load_npz_metadata(path)
    assert peak_bytes_while(lambda: checkpoint.load_npz_metadata(path)) < 4 << 20


def count_opened_entries(monkeypatch) -> list:
    """The names of the zip entries opened from now on."""
    opened = []
    original_open = zipfile.ZipFile.open

    def open_and_count(archive, name, *args, **kwargs):
        opened.append(getattr(name, "filename", name))
        return original_open(archive, name, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "open", open_and_count)
    return opened


def with_empty_extras(path, count: int):
    """A valid checkpoint of one array, then ``count`` empty float32 arrays the network has no use for."""
    save_npz(path, {"fc.weight": np.ones((2, 2), np.float32)}, {"epoch": 1})
    empty = io.BytesIO()
    np.lib.format.write_array(empty, np.zeros(0, np.float32))
    with zipfile.ZipFile(path, "a") as archive:
        for index in range(count):
            archive.writestr(f"extra{index}.npy", empty.getvalue())
    return path


def test_names_the_network_has_no_use_for_are_refused_from_the_zip_directory_before_any_entry_is_opened(
        tmp_path, monkeypatch):
    path = with_empty_extras(tmp_path / "extras.npz", 2000)
    opened = count_opened_entries(monkeypatch)
    with pytest.raises(CheckpointError, match=r"extras\.npz: extra0: in the checkpoint, but the network has no such "
                                              r"parameter"):
        load_npz(path, {"fc.weight": (2, 2)}.get)
    assert opened == []
    assert checkpoint.load_npz_metadata(path) == {"epoch": 1}  # of the arrays, only their names are read
    assert set(opened) == {"__metadata__.npy"}


def test_more_entries_than_a_checkpoint_holds_are_refused_from_the_zip_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "MAX_CHECKPOINT_ENTRIES", 100)
    path = with_empty_extras(tmp_path / "extras.npz", 99)
    opened = count_opened_entries(monkeypatch)
    for load in (load_npz, checkpoint.load_npz_metadata):
        with pytest.raises(CheckpointError, match=r"extras\.npz: 101 entries, more than the 100 a checkpoint may hold"):
            load(path)
    assert opened == []



def declaring_entries(path, count: int, comment: bytes = b"", zip64: bool = False):
    """A valid checkpoint of one array whose end record (with ``zip64``, a ZIP64 record before it) declares
    ``count`` entries; the directory itself is unchanged, so zipfile would find the one entry and the metadata."""
    save_npz(path, {"fc.weight": np.ones((2, 2), np.float32)}, {"epoch": 1})
    return redeclared(path, count, comment, zip64)


def redeclared(path, count: int, comment: bytes = b"", zip64: bool = False):
    """The archive at ``path`` with its end record rewritten to declare ``count`` entries (see declaring_entries)."""
    data = path.read_bytes()
    end = data.rindex(b"PK\x05\x06")
    signature, disk, directory_disk, _, _, size, offset, _ = struct.unpack("<4s4H2LH", data[end:end + 22])
    if zip64:
        record = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, size, offset)
        locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, end, 1)
        record_count, size, offset = 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF
        body = data[:end] + record + locator
    else:
        record_count, body = count, data[:end]
    eocd = struct.pack("<4s4H2LH", signature, disk, directory_disk, record_count, record_count, size, offset,
                       len(comment))
    path.write_bytes(body + eocd + comment)
    return path


@pytest.mark.parametrize("zip64, comment", [(False, b""), (False, b"a comment"), (True, b"")])
def test_more_entries_than_a_checkpoint_holds_are_refused_from_the_end_record_before_zipfile_reads_them(
        tmp_path, monkeypatch, zip64, comment):
    """zipfile reads the whole directory as it opens an archive (a second for 200 000 entries): the count
    the end record, or its ZIP64 record, declares is refused before zipfile is asked."""
    count = 200_000 if zip64 else 60_000  # a plain end record counts in 16 bits: the limit is lowered for it
    if not zip64:
        monkeypatch.setattr(checkpoint, "MAX_CHECKPOINT_ENTRIES", 50_000)
    path = declaring_entries(tmp_path / "claims.npz", count, comment, zip64)
    with zipfile.ZipFile(path) as archive:  # the directory holds two entries: only the declared count is large
        assert len(archive.infolist()) == 2
    refuse_zipfile(monkeypatch)
    for load in (load_npz, checkpoint.load_npz_metadata):
        with pytest.raises(CheckpointError, match=rf"claims\.npz: {count} entries, more than the "
                                                  rf"{checkpoint.MAX_CHECKPOINT_ENTRIES} a checkpoint may hold"):
            load(path)



def refuse_zipfile(monkeypatch):
    """From now on, zipfile.ZipFile fails the test if it is asked to open anything."""
    def unreachable(*args, **kwargs):
        raise AssertionError("zipfile.ZipFile opened an archive that holds too many entries")

    monkeypatch.setattr(zipfile, "ZipFile", unreachable)


@pytest.mark.parametrize("zip64", [False, True])
def test_a_directory_of_more_entries_than_its_end_record_declares_is_refused_before_zipfile_reads_it(
        tmp_path, monkeypatch, zip64):
    """zipfile reads as many entries as the directory's size holds, whatever count the end record declares:
    the entries are counted from their signatures in the directory before zipfile is asked."""
    monkeypatch.setattr(checkpoint, "MAX_CHECKPOINT_ENTRIES", 100)
    path = redeclared(with_empty_extras(tmp_path / "hidden.npz", 99), 2, zip64=zip64)
    with zipfile.ZipFile(path) as archive:
        assert len(archive.infolist()) == 101
    refuse_zipfile(monkeypatch)
    for load in (load_npz, checkpoint.load_npz_metadata):
        with pytest.raises(CheckpointError, match=r"hidden\.npz: 101 entries, more than the 100 a checkpoint may hold"):
            load(path)

@pytest.mark.parametrize("zip64, comment", [(False, b"a comment"), (True, b"")])
def test_an_end_record_declaring_few_enough_entries_loads(tmp_path, zip64, comment):
    path = declaring_entries(tmp_path / "fine.npz", 2, comment, zip64)
    arrays, metadata = load_npz(path)
    assert metadata == {"epoch": 1} and list(arrays) == ["fc.weight"]


def test_an_entry_held_twice_is_refused_from_the_zip_directory(tmp_path):
    path = tmp_path / "twice.npz"
    write_zip(path, {"w.npy": Entry(npy_header((1,)) + bytes(4)), "__metadata__.npy": metadata_entry()})
    with zipfile.ZipFile(path, "a") as archive, pytest.warns(UserWarning, match="Duplicate name"):
        archive.writestr("w.npy", b"")
    with pytest.raises(CheckpointError, match=r"twice\.npz: entry 'w\.npy' appears twice; a checkpoint holds each "
                                              r"array once"):
        load_npz(path)


def test_check_compatible_accepts_matching_shapes():
    arrays = lenet_like_arrays()
    check_compatible(arrays, shapes_of(arrays))


def test_check_compatible_names_the_shape_difference():
    arrays = {"fc1.weight": np.zeros((500, 784), np.float32)}
    with pytest.raises(CheckpointError) as error:
        check_compatible(arrays, {"fc1.weight": (500, 800)}, source="model.npz")
    assert str(error.value) == "model.npz: fc1.weight: checkpoint has (500, 784), network needs (500, 800)"


def test_check_compatible_names_missing_then_unexpected():
    arrays = lenet_like_arrays()
    expected = shapes_of(arrays)
    del arrays["fc2.bias"]
    arrays["fc3.weight"] = np.zeros((2, 2), np.float32)
    with pytest.raises(CheckpointError, match=r"^fc2.bias: missing from the checkpoint \(the network needs shape \(10,\)\)$"):
        check_compatible(arrays, expected)
    expected.pop("fc2.bias")
    with pytest.raises(CheckpointError, match="^fc3.weight: in the checkpoint, but the network has no such parameter$"):
        check_compatible(arrays, expected)


# ---- the original's .bin files ------------------------------------------------------------


def tiny_dense_weight():
    """Dense 3 -> 2 with weight (o, i) = 10·o + i, shaped like ours: (out, in, 1, 1)."""
    out_size, in_size = 2, 3
    weight = np.array([[10 * o + i for i in range(in_size)] for o in range(out_size)], np.float32)
    return weight.reshape(out_size, in_size, 1, 1)


def hand_made_original_bytes():
    """The original's (in, out) column-major blob: element (i, o) at offset o·in + i."""
    in_size, out_size = 3, 2
    values = [None] * (in_size * out_size)
    for o in range(out_size):
        for i in range(in_size):
            values[o * in_size + i] = 10.0 * o + i
    return struct.pack("<6f", *values)


def test_hand_made_dense_layout():
    assert hand_made_original_bytes() == struct.pack("<6f", 0, 1, 2, 10, 11, 12)
    assert dense_to_original(tiny_dense_weight()) == hand_made_original_bytes()
    np.testing.assert_array_equal(original_to_dense(hand_made_original_bytes(), 2, 3), tiny_dense_weight())


def test_written_bin_files_match_the_hand_made_bytes(tmp_path):
    write_original(tmp_path, {"dense1.weight": tiny_dense_weight(), "dense1.bias": np.array([0.5, -1.0], np.float32)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dense1.bias.bin", "dense1.bin"]
    assert (tmp_path / "dense1.bin").read_bytes() == hand_made_original_bytes()
    assert (tmp_path / "dense1.bias.bin").read_bytes() == struct.pack("<2f", 0.5, -1.0)


def test_reading_hand_written_bin_files(tmp_path):
    (tmp_path / "dense1.bin").write_bytes(hand_made_original_bytes())
    (tmp_path / "dense1.bias.bin").write_bytes(struct.pack("<2f", 0.5, -1.0))
    arrays = read_original(tmp_path, {"dense1.weight": (2, 3, 1, 1), "dense1.bias": (2,)})
    np.testing.assert_array_equal(arrays["dense1.weight"], tiny_dense_weight())
    np.testing.assert_array_equal(arrays["dense1.bias"], [0.5, -1.0])
    assert arrays["dense1.weight"].dtype == np.float32


def test_conv_layout_is_out_in_k_k_row_major(tmp_path):
    weight = np.arange(2 * 1 * 3 * 3, dtype=np.float32).reshape(2, 1, 3, 3)
    write_original(tmp_path, {"conv1.weight": weight})
    assert (tmp_path / "conv1.bin").read_bytes() == struct.pack("<18f", *range(18))


def test_original_round_trip(tmp_path):
    arrays = lenet_like_arrays()
    write_original(tmp_path / "pretrained", arrays)
    assert_same_arrays(read_original(tmp_path / "pretrained", shapes_of(arrays)), arrays)


def test_original_truncated_bin(tmp_path):
    arrays = lenet_like_arrays()
    write_original(tmp_path, arrays)
    path = tmp_path / "fc1.bin"
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(CheckpointError, match=r"fc1\.bin: expected 1600000 bytes .* found 1599996 bytes"):
        read_original(tmp_path, shapes_of(arrays))


def test_original_bin_file_of_the_wrong_size_is_not_read(tmp_path):
    with open(tmp_path / "fc1.bin", "wb") as file:
        file.truncate(8 << 30)  # sparse: 8 GiB declared, nothing on disk
    (tmp_path / "fc1.bias.bin").write_bytes(bytes(40))
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match=r"fc1\.bin: expected 1600 bytes .* found 8589934592 bytes"):
            read_original(tmp_path, {"fc1.weight": (10, 40, 1, 1), "fc1.bias": (10,)})
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()


def test_original_missing_file_and_directory(tmp_path):
    arrays = lenet_like_arrays()
    write_original(tmp_path, arrays)
    os.remove(tmp_path / "conv1.bias.bin")
    with pytest.raises(CheckpointError, match=r"conv1\.bias\.bin: missing"):
        read_original(tmp_path, shapes_of(arrays))
    with pytest.raises(CheckpointError, match="no such pretrained-parameter directory"):
        read_original(tmp_path / "absent", shapes_of(arrays))


def test_original_refuses_names_without_a_file():
    with pytest.raises(CheckpointError, match="bn1.gamma"):
        checkpoint.original_file_name("bn1.gamma")


def test_writing_the_original_with_a_name_it_has_no_file_for_writes_no_file(tmp_path):
    arrays = {"fc1.weight": np.ones((2, 3, 1, 1), np.float32), "bn1.running_mean": np.zeros((2,), np.float32)}
    with pytest.raises(CheckpointError, match=r"bn1\.running_mean: the original format stores only"):
        checkpoint.write_original(tmp_path, arrays)
    assert list(tmp_path.iterdir()) == []


# ---- atomic saves -------------------------------------------------------------------------


def failing(*args, **kwargs):
    raise OSError(28, "No space left on device")


def test_failed_replace_leaves_previous_checkpoint_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "model.npz"
    save_npz(path, lenet_like_arrays(0), {"epoch": 1})
    before = path.read_bytes()
    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(WriteError, match="model.npz: cannot write the checkpoint .*No space left"):
        save_npz(path, lenet_like_arrays(1), {"epoch": 2})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.npz"]


def test_failure_in_the_middle_of_writing_leaves_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "model.npz"
    save_npz(path, lenet_like_arrays(0), {"epoch": 1})
    before = path.read_bytes()
    real_write_array = np.lib.format.write_array
    calls = []

    def write_then_crash(stream, array, **kwargs):
        calls.append(array.shape)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real_write_array(stream, array, **kwargs)

    monkeypatch.setattr(np.lib.format, "write_array", write_then_crash)
    with pytest.raises(KeyboardInterrupt):
        save_npz(path, lenet_like_arrays(1), {"epoch": 2})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.npz"]
    monkeypatch.undo()
    assert load_npz(path)[1] == {"epoch": 1}


def test_failed_bin_write_leaves_previous_file(tmp_path, monkeypatch):
    write_original(tmp_path, {"dense1.weight": tiny_dense_weight()})
    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(WriteError, match="dense1.bin: cannot write"):
        write_original(tmp_path, {"dense1.weight": tiny_dense_weight() + 1})
    assert (tmp_path / "dense1.bin").read_bytes() == hand_made_original_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["dense1.bin"]


def test_save_fsyncs_file_and_directory(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    save_npz(tmp_path / "model.npz", {"a.bias": np.ones(1, np.float32)}, {})
    assert len(synced) == 2


def test_npz_written_to_a_file_object_is_what_numpy_reads():
    buffer = io.BytesIO()
    checkpoint._write_zip(buffer, {"x.npy": np.arange(3, dtype=np.float32)})
    buffer.seek(0)
    with np.load(buffer, allow_pickle=False) as archive:
        np.testing.assert_array_equal(archive["x"], [0, 1, 2])
