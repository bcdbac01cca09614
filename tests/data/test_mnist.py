import gzip
import hashlib
import io
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cudnnnet.data import mnist
from cudnnnet.data.mnist import load_mnist, one_hot, parse_idx, read_idx, read_images, read_labels
from cudnnnet.errors import DataError, UsageError
from hostile_files import plant, within


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


# ---- the IDX parser ------------------------------------------------------------------------


def test_parse_idx_round_trips_images_and_labels(idx_tools):
    images, labels = idx_tools.fake_split(5)
    np.testing.assert_array_equal(parse_idx(idx_tools.idx_bytes(images)), images)
    np.testing.assert_array_equal(parse_idx(idx_tools.idx_bytes(labels)), labels)
    assert idx_tools.idx_bytes(images)[:4] == (2051).to_bytes(4, "big")
    assert idx_tools.idx_bytes(labels)[:4] == (2049).to_bytes(4, "big")


@pytest.mark.parametrize("stored_name, compress", [("plain-name", True), ("looks.gz", False)])
def test_gzip_is_detected_by_magic_bytes_not_extension(tmp_path, idx_tools, stored_name, compress):
    images, _ = idx_tools.fake_split(3)
    data = idx_tools.idx_bytes(images)
    path = tmp_path / stored_name
    path.write_bytes(gzip.compress(data) if compress else data)
    np.testing.assert_array_equal(read_images(path), images)


def test_non_idx_magic_is_refused(tmp_path):
    path = tmp_path / "page.html"
    path.write_bytes(b"<html>not found</html>")
    with pytest.raises(DataError, match=r"page\.html: not an IDX file.*2051.*2049"):
        read_idx(path)


def test_unsupported_dtype_is_refused(idx_tools):
    data = bytearray(idx_tools.idx_bytes(np.zeros(4)))
    data[2] = 0x0D
    with pytest.raises(DataError, match="0x0D is not supported.*0x08"):
        parse_idx(bytes(data), "floats.idx")


def test_labels_file_given_as_images_is_refused(tmp_path, idx_tools):
    path = tmp_path / "labels.idx"
    path.write_bytes(idx_tools.idx_bytes(np.zeros(4)))
    with pytest.raises(DataError, match=r"labels\.idx: magic 2049 .*expected magic 2051"):
        read_images(path)


def test_images_file_given_as_labels_is_refused(tmp_path, idx_tools):
    path = tmp_path / "images.idx"
    path.write_bytes(idx_tools.idx_bytes(np.zeros((2, 28, 28))))
    with pytest.raises(DataError, match=r"images\.idx: magic 2051 .*expected magic 2049"):
        read_labels(path)


def test_truncated_payload_names_file_and_both_sizes(tmp_path, idx_tools):
    path = tmp_path / "short-images"
    path.write_bytes(idx_tools.idx_bytes(np.zeros((3, 28, 28)))[:-10])
    with pytest.raises(DataError) as caught:
        read_images(path)
    message = str(caught.value)
    assert "short-images" in message and "truncated" in message
    assert str(3 * 28 * 28) in message and str(3 * 28 * 28 - 10) in message


def test_trailing_bytes_are_refused(idx_tools):
    with pytest.raises(DataError, match="too long.*call for 4 data bytes, found 5"):
        parse_idx(idx_tools.idx_bytes(np.zeros(4)) + b"x", "long")


def test_truncated_header_is_refused():
    with pytest.raises(DataError, match="truncated header: 3 dimensions need a 16-byte header"):
        parse_idx(bytes([0, 0, 8, 3, 0, 0, 0, 1]), "head")
    with pytest.raises(DataError, match="too short"):
        parse_idx(b"\x00\x00", "tiny")
    with pytest.raises(DataError, match="0 dimensions"):
        parse_idx(bytes([0, 0, 8, 0]), "scalar")


def test_truncated_gzip_names_the_file(tmp_path, idx_tools):
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(idx_tools.idx_bytes(np.zeros((3, 28, 28))))[:-20])
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte\.gz: corrupt or truncated gzip"):
        read_idx(path)


def test_out_of_range_label_names_first_bad_index_and_value(tmp_path, idx_tools):
    path = tmp_path / "labels"
    path.write_bytes(idx_tools.idx_bytes(np.array([1, 2, 10, 3, 255])))
    with pytest.raises(DataError, match=r"labels: label 10 at index 2 is outside 0\.\.9"):
        read_labels(path)


def test_unreadable_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="cannot read"):
        read_idx(tmp_path / "absent")


# ---- load_mnist on fake files --------------------------------------------------------------


def test_load_mnist_scales_and_types(tmp_path, idx_tools):
    images, labels = idx_tools.fake_split(7)
    idx_tools.write_split(tmp_path, "test", images, labels)
    loaded_images, loaded_labels = load_mnist(tmp_path, "test", download=False, verify=False)
    assert loaded_images.dtype == np.float32 and loaded_images.shape == (7, 1, 28, 28)
    assert loaded_labels.dtype == np.int64 and loaded_labels.shape == (7,)
    np.testing.assert_array_equal(loaded_images[:, 0], images.astype(np.float32) / 255)
    np.testing.assert_array_equal(loaded_labels, labels)


def test_uncompressed_file_names_are_accepted(tmp_path, idx_tools):
    images, labels = idx_tools.fake_split(4)
    idx_tools.write_split(tmp_path, "train", images, labels, compress=False)
    assert not list(tmp_path.glob("*.gz"))
    _, loaded_labels = load_mnist(tmp_path, "train", download=False, verify=False)
    np.testing.assert_array_equal(loaded_labels, labels)


def test_count_mismatch_is_refused(tmp_path, idx_tools):
    images, labels = idx_tools.fake_split(6)
    idx_tools.write_split(tmp_path, "train", images, labels[:5])
    with pytest.raises(DataError, match="holds 6 images but .*train-labels-idx1-ubyte.gz holds 5 labels"):
        load_mnist(tmp_path, download=False, verify=False)


def test_images_of_the_wrong_size_are_refused(tmp_path, idx_tools):
    idx_tools.write_split(tmp_path, "train", np.zeros((2, 20, 28)), np.zeros(2))
    with pytest.raises(DataError, match="images are 20×28, MNIST's are 28×28"):
        load_mnist(tmp_path, download=False, verify=False)


def test_checksum_is_verified_on_load(tmp_path, idx_tools):
    images, labels = idx_tools.fake_split(3)
    idx_tools.write_split(tmp_path, "train", images, labels)
    with pytest.raises(DataError) as caught:
        load_mnist(tmp_path, download=False)
    message = str(caught.value)
    assert "train-images-idx3-ubyte.gz: checksum mismatch" in message
    assert md5(idx_tools.idx_bytes(images)) in message and mnist.IDX_MD5["train-images-idx3-ubyte"] in message
    assert "delete it so it is downloaded again, or check that --data-dir points at the MNIST files" in message
    assert "verify=False" not in message  # a flag no command-line tool has


@pytest.mark.parametrize("options, problem", [
    ({"split": "validation"}, "unknown MNIST split 'validation'"),
    ({"pad": -1}, "pad must be an integer >= 0"),
    ({"pad": True}, "pad must be an integer >= 0"),
    ({"normalize": (0.1, 0.0)}, "std > 0"),
    ({"normalize": 0.5}, r"normalize must be None or \(mean, std\)"),
])
def test_invalid_options_are_refused(tmp_path, idx_tools, options, problem):
    idx_tools.write_split(tmp_path, "train", *idx_tools.fake_split(2))
    with pytest.raises(DataError, match=problem):
        load_mnist(tmp_path, download=False, verify=False, **options)


def test_pad_uses_the_background_and_normalize_follows(tmp_path, idx_tools):
    images, labels = idx_tools.fake_split(3)
    idx_tools.write_split(tmp_path, "train", images, labels)
    plain, _ = load_mnist(tmp_path, download=False, verify=False)
    mean, std = 0.25, 0.5
    padded, _ = load_mnist(tmp_path, download=False, verify=False, pad=2, normalize=(mean, std))
    assert padded.shape == (3, 1, 32, 32)
    np.testing.assert_allclose(padded[:, :, 2:30, 2:30], (plain - mean) / std, rtol=1e-6)
    border = np.ones((32, 32), bool)
    border[2:30, 2:30] = False
    np.testing.assert_allclose(padded[:, 0][:, border], (0 - mean) / std)


def test_results_are_cached_but_fresh_arrays(tmp_path, idx_tools):
    idx_tools.write_split(tmp_path, "train", *idx_tools.fake_split(3))
    first, _ = load_mnist(tmp_path, download=False, verify=False)
    first[:] = -1.0
    hits_before = mnist._read_cached.cache_info().hits
    second, _ = load_mnist(tmp_path, download=False, verify=False)
    assert mnist._read_cached.cache_info().hits == hits_before + 2
    assert second.min() >= 0.0


def test_cache_sees_a_replaced_file(tmp_path, idx_tools):
    images, labels = idx_tools.fake_split(3)
    idx_tools.write_split(tmp_path, "train", images, labels)
    load_mnist(tmp_path, download=False, verify=False)
    idx_tools.write_split(tmp_path, "train", *idx_tools.fake_split(5, seed=1))
    replaced, _ = load_mnist(tmp_path, download=False, verify=False)
    assert replaced.shape[0] == 5


# ---- directories ---------------------------------------------------------------------------


def test_missing_explicit_directory_is_an_error(tmp_path):
    with pytest.raises(DataError, match=r"data directory .*nowhere does not exist"):
        load_mnist(tmp_path / "nowhere")


def test_missing_environment_directory_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDNNNET_DATA", str(tmp_path / "gone"))
    with pytest.raises(DataError, match=r"CUDNNNET_DATA=.*gone does not exist"):
        load_mnist()


def test_directory_resolution_order(tmp_path, monkeypatch):
    explicit, from_env = tmp_path / "explicit", tmp_path / "env"
    explicit.mkdir()
    from_env.mkdir()
    assert mnist.resolve_data_dir() == (tmp_path / "xdg-cache" / "cudnnnet" / "mnist", False)
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert mnist.resolve_data_dir() == (tmp_path / "home" / ".cache" / "cudnnnet" / "mnist", False)
    monkeypatch.setenv("CUDNNNET_DATA", str(from_env))
    assert mnist.resolve_data_dir() == (from_env, True)
    assert mnist.resolve_data_dir(explicit) == (explicit, True)


def test_missing_files_without_download_are_named(tmp_path):
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte\(\.gz\), t10k-labels-idx1-ubyte\(\.gz\)"):
        load_mnist(tmp_path, "test", download=False)


def test_data_errors_are_usage_errors():
    assert issubclass(DataError, UsageError)


# ---- one_hot -------------------------------------------------------------------------------


def test_one_hot():
    encoded = one_hot(np.array([3, 0, 9]))
    assert encoded.dtype == np.float32 and encoded.shape == (3, 10)
    np.testing.assert_array_equal(encoded.argmax(axis=1), [3, 0, 9])
    np.testing.assert_array_equal(encoded.sum(axis=1), 1.0)
    assert one_hot([1], classes=3).tolist() == [[0.0, 1.0, 0.0]]


@pytest.mark.parametrize("labels, problem", [
    ([0, 10], "label 10 at index 1"), ([-1], "label -1 at index 0"), ([0.5], "integer array"),
])
def test_one_hot_refuses_bad_labels(labels, problem):
    with pytest.raises(DataError, match=problem):
        one_hot(np.array(labels))


# ---- downloading ---------------------------------------------------------------------------


def _publish_fake_split(directory: Path, idx_tools, monkeypatch, split: str = "test") -> dict[str, bytes]:
    """Write a fake gzip split into ``directory`` and make its MD5s the expected ones."""
    images, labels = idx_tools.fake_split(4)
    idx_tools.write_split(directory, split, images, labels)
    published = {path.name: path.read_bytes() for path in directory.glob("*.gz")}
    for name, data in published.items():
        monkeypatch.setitem(mnist.GZIP_MD5, name, md5(data))
    return published


def test_download_into_cache_then_load(tmp_path, idx_tools, monkeypatch, serve_directory):
    published = _publish_fake_split(tmp_path / "mirror", idx_tools, monkeypatch)
    url = serve_directory(tmp_path / "mirror")
    images, labels = load_mnist(split="test", verify=False, mirrors=[url])
    cache = tmp_path / "xdg-cache" / "cudnnnet" / "mnist"
    assert sorted(path.name for path in cache.iterdir()) == sorted(published)
    for name, data in published.items():
        assert (cache / name).read_bytes() == data
    assert images.shape == (4, 1, 28, 28) and labels.shape == (4,)


def test_download_falls_back_to_the_next_mirror(tmp_path, idx_tools, monkeypatch, serve_directory):
    _publish_fake_split(tmp_path / "mirror", idx_tools, monkeypatch)
    (tmp_path / "empty").mkdir()
    mirrors = [serve_directory(tmp_path / "empty"), serve_directory(tmp_path / "mirror")]
    directory = mnist.download_mnist(splits="test", mirrors=mirrors)
    assert len(list(directory.glob("t10k-*.gz"))) == 2


def test_wrong_checksum_download_is_refused_and_keeps_the_cached_file(tmp_path, idx_tools, monkeypatch,
                                                                      serve_directory):
    cache = tmp_path / "cache"
    published = _publish_fake_split(cache, idx_tools, monkeypatch)
    mirror = tmp_path / "mirror"
    idx_tools.write_split(mirror, "test", *idx_tools.fake_split(4, seed=99))
    bad_name = "t10k-images-idx3-ubyte.gz"
    bad_md5 = md5((mirror / bad_name).read_bytes())
    with pytest.raises(DataError) as caught:
        mnist.download_mnist(cache, splits=["test"], force=True, mirrors=[serve_directory(mirror)])
    message = str(caught.value)
    assert bad_name in message and bad_md5 in message and mnist.GZIP_MD5[bad_name] in message
    assert (cache / bad_name).read_bytes() == published[bad_name]
    assert sorted(path.name for path in cache.iterdir()) == sorted(published)


def test_unreachable_mirror_is_a_data_error_naming_the_url(tmp_path):
    with pytest.raises(DataError, match=r"could not download train-images-idx3-ubyte\.gz .*127\.0\.0\.1:9.*; put them "
                                        r"there, or give the folder that holds them with --data-dir \(data\.dir\) "
                                        r"or \$CUDNNNET_DATA"):
        load_mnist()
    cache = tmp_path / "xdg-cache" / "cudnnnet" / "mnist"
    assert list(cache.iterdir()) == []


def test_real_files_download_from_a_local_mirror(tmp_path, mnist_dir, serve_directory):
    if not (mnist_dir / "t10k-labels-idx1-ubyte.gz").is_file():
        pytest.skip(f"{mnist_dir} holds no gzip files to serve")
    images, labels = load_mnist(tmp_path, "test", mirrors=[serve_directory(mnist_dir)])
    assert images.shape == (10000, 1, 28, 28)
    assert labels[:5].tolist() == [7, 2, 1, 0, 4]


# ---- the real data -------------------------------------------------------------------------


@pytest.mark.parametrize("split, count, first_labels", [
    ("train", 60000, [5, 0, 4, 1, 9]), ("test", 10000, [7, 2, 1, 0, 4]),
])
def test_real_mnist(mnist_dir, split, count, first_labels):
    images, labels = load_mnist(mnist_dir, split, download=False)
    assert images.shape == (count, 1, 28, 28) and images.dtype == np.float32
    assert labels.shape == (count,) and labels.dtype == np.int64
    assert labels[:5].tolist() == first_labels
    assert images.min() == 0.0 and images.max() == 1.0
    assert set(np.unique(labels)) == set(range(10))
    assert 0.1 < images.mean() < 0.15


def test_real_mnist_uncompressed_copy_verifies(tmp_path, mnist_dir):
    compressed, _ = load_mnist(mnist_dir, "test", download=False)
    for idx_name in mnist.SPLIT_FILES["test"]:
        source = mnist_dir / f"{idx_name}.gz"
        if not source.is_file():
            pytest.skip(f"{source} is not there to decompress")
        (tmp_path / idx_name).write_bytes(gzip.decompress(source.read_bytes()))
    raw, _ = load_mnist(tmp_path, "test", download=False)
    np.testing.assert_array_equal(raw, compressed)


def test_real_mnist_pad_and_normalize(mnist_dir):
    images, _ = load_mnist(mnist_dir, "test", download=False, pad=2, normalize=(mnist.MNIST_MEAN, mnist.MNIST_STD))
    assert images.shape == (10000, 1, 32, 32)
    interior = images[:, :, 2:30, 2:30]
    assert abs(float(interior.mean())) < 0.05 and abs(float(interior.std()) - 1.0) < 0.05


def test_known_checksums_match_the_shared_md5sums(mnist_dir):
    sums_file = mnist_dir / "MD5SUMS"
    if not sums_file.is_file():
        pytest.skip(f"{sums_file} absent")
    listed = dict(reversed(line.split()) for line in sums_file.read_text().splitlines() if line.strip())
    assert listed == mnist.GZIP_MD5


# ---- fuzzing -------------------------------------------------------------------------------


def _parse_or_data_error(data: bytes) -> None:
    try:
        array = parse_idx(data, "fuzz")
    except DataError:
        return
    assert array.dtype == np.uint8


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_parse_or_raise_data_error(data):
    _parse_or_data_error(data)


@settings(max_examples=200, deadline=None)
@given(ndim=st.integers(0, 4), dims=st.lists(st.integers(0, 2**32 - 1), min_size=4, max_size=4),
       dtype=st.sampled_from([0x08, 0x08, 0x09, 0x0D]), payload=st.binary(max_size=64),
       small=st.booleans())
def test_mutated_headers_parse_or_raise_data_error(ndim, dims, dtype, payload, small):
    if small:
        dims = [size % 5 for size in dims]
    header = bytes([0, 0, dtype, ndim]) + b"".join(size.to_bytes(4, "big") for size in dims[:ndim])
    _parse_or_data_error(header + payload)


@pytest.mark.parametrize("dims", [(0, 154, 242280253, 247201435), (65536, 65536, 65536, 0)])
def test_an_empty_array_whose_other_dims_overflow_is_a_data_error(dims):
    header = bytes([0, 0, 0x08, len(dims)]) + b"".join(size.to_bytes(4, "big") for size in dims)
    with pytest.raises(DataError, match=r"describe an empty array whose other dims multiply to \d+, more than"):
        parse_idx(header, "fuzz")


def test_an_empty_array_of_mnist_dims_parses():
    header = bytes([0, 0, 0x08, 3]) + b"".join(size.to_bytes(4, "big") for size in (0, 28, 28))
    assert parse_idx(header, "empty").shape == (0, 28, 28)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 200), flip=st.integers(0, 199))
def test_damaged_gzip_files_load_or_raise_data_error(tmp_path, cut, flip):
    data = bytearray(gzip.compress(bytes([0, 0, 8, 1, 0, 0, 0, 3, 1, 2, 3])))
    data[flip % len(data)] ^= 0x5A
    path = tmp_path / "fuzz.gz"
    path.write_bytes(bytes(data[:cut]))
    try:
        labels = read_labels(path)
    except DataError:
        return
    assert labels.ndim == 1 and labels.max(initial=0) < 10


def test_no_stray_environment_leaks_into_tests():
    assert "CUDNNNET_DATA" not in os.environ
    assert mnist.MIRRORS == ("http://127.0.0.1:9/",)


# ---- the disk cache of parsed files --------------------------------------------------------


def new_process() -> None:
    """Forget what this process has parsed, as a new process would have: only the disk cache is left."""
    mnist._read_cached.cache_clear()


@pytest.fixture
def parse_calls(monkeypatch) -> list:
    """The names of the files read and parsed (not taken from a cache) from now on."""
    calls = []
    read = mnist.read_idx_bytes

    def counting_read(path):
        calls.append(Path(path).name)
        return read(path)

    monkeypatch.setattr(mnist, "read_idx_bytes", counting_read)
    return calls


@pytest.fixture
def parsed_dir(tmp_path) -> Path:
    return tmp_path / "xdg-cache" / "cudnnnet" / "parsed"


def test_a_new_process_loads_from_the_disk_cache(tmp_path, idx_tools, parsed_dir, monkeypatch):
    images, labels = idx_tools.fake_split(4)
    idx_tools.write_split(tmp_path / "data", "test", images, labels)
    first = load_mnist(tmp_path / "data", "test", download=False, verify=False)
    assert sorted(path.suffix for path in parsed_dir.iterdir()) == [".json", ".json", ".npy", ".npy"]
    new_process()

    def no_parsing(path):
        raise AssertionError(f"{path} was parsed again")

    monkeypatch.setattr(mnist, "read_idx_bytes", no_parsing)
    second = load_mnist(tmp_path / "data", "test", download=False, verify=False)
    for before, after in zip(first, second):
        np.testing.assert_array_equal(before, after)
        assert before.dtype == after.dtype


def test_cached_and_parsed_real_mnist_are_identical_and_verify(mnist_dir, monkeypatch, parsed_dir):
    new_process()
    monkeypatch.setenv(mnist.NO_CACHE_ENV, "1")
    parsed = load_mnist(mnist_dir, "test", download=False)
    assert not parsed_dir.exists()
    monkeypatch.delenv(mnist.NO_CACHE_ENV)
    new_process()
    load_mnist(mnist_dir, "test", download=False)  # writes the entries
    new_process()
    cached = load_mnist(mnist_dir, "test", download=False)  # verify=True checks the cached MD5
    for one, other in zip(parsed, cached):
        np.testing.assert_array_equal(one, other)
    new_process()


def test_the_cached_checksum_is_still_verified(tmp_path, idx_tools, parse_calls):
    images, labels = idx_tools.fake_split(3)
    idx_tools.write_split(tmp_path, "train", images, labels)
    load_mnist(tmp_path, download=False, verify=False)
    new_process()
    with pytest.raises(DataError, match=f"checksum mismatch: the uncompressed data has MD5 "
                                        f"{md5(idx_tools.idx_bytes(images))}"):
        load_mnist(tmp_path, download=False)
    assert len(parse_calls) == 2  # the first load only


@pytest.mark.parametrize("change", ["content, same size", "size", "mtime only"])
def test_a_changed_source_is_parsed_again(tmp_path, idx_tools, parse_calls, change):
    images, labels = idx_tools.fake_split(3)
    idx_tools.write_split(tmp_path, "test", images, labels)
    load_mnist(tmp_path, "test", download=False, verify=False)
    new_process()
    images_file = tmp_path / "t10k-images-idx3-ubyte.gz"
    stat = images_file.stat()
    if change != "mtime only":
        images, labels = idx_tools.fake_split(3 if change == "content, same size" else 5, seed=1)
        idx_tools.write_split(tmp_path, "test", images, labels, compress=True)
    os.utime(images_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    parse_calls.clear()
    loaded, _ = load_mnist(tmp_path, "test", download=False, verify=False)
    assert "t10k-images-idx3-ubyte.gz" in parse_calls
    np.testing.assert_array_equal(loaded[:, 0], images.astype(np.float32) / 255)


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    huge = io.BytesIO()
    np.lib.format.write_array_header_1_0(huge, {"descr": "|u1", "fortran_order": False, "shape": (2**40,)})
    path.write_bytes({"emptied": b"", "truncated": data[:len(data) // 2], "garbage": b"\x93NUMPY\x01\x00junk",
                      "nested": b"[" * 100_000 + b"]" * 100_000, "declaring a terabyte": huge.getvalue()}[how])


@pytest.mark.parametrize("suffix", [".npy", ".json"])
@pytest.mark.parametrize("how", ["emptied", "truncated", "garbage", "nested", "declaring a terabyte"])
def test_a_damaged_cache_entry_is_ignored_and_rewritten(tmp_path, idx_tools, parse_calls, parsed_dir, suffix, how):
    images, labels = idx_tools.fake_split(3)
    idx_tools.write_split(tmp_path, "test", images, labels)
    load_mnist(tmp_path, "test", download=False, verify=False)
    for path in parsed_dir.glob(f"*{suffix}"):
        _damage(path, how)
    new_process()
    parse_calls.clear()
    loaded_images, loaded_labels = load_mnist(tmp_path, "test", download=False, verify=False)
    np.testing.assert_array_equal(loaded_labels, labels)
    assert sorted(parse_calls) == ["t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
    new_process()
    parse_calls.clear()
    load_mnist(tmp_path, "test", download=False, verify=False)
    assert parse_calls == []  # rewritten whole


@pytest.mark.parametrize("suffix", [".npy", ".json"])
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_device_planted_as_a_cache_file_is_ignored_promptly_and_replaced(tmp_path, idx_tools, parse_calls,
                                                                                   parsed_dir, suffix, kind):
    images, labels = idx_tools.fake_split(3)
    idx_tools.write_split(tmp_path, "test", images, labels)
    load_mnist(tmp_path, "test", download=False, verify=False)
    planted = sorted(parsed_dir.glob(f"*{suffix}"))
    for path in planted:
        plant(path, kind)
    new_process()
    parse_calls.clear()
    with within(5):
        _, loaded_labels = load_mnist(tmp_path, "test", download=False, verify=False)
    np.testing.assert_array_equal(loaded_labels, labels)
    assert len(parse_calls) == 2 and all(path.is_file() and not path.is_symlink() for path in planted)
    new_process()
    parse_calls.clear()
    load_mnist(tmp_path, "test", download=False, verify=False)
    assert parse_calls == []  # rewritten as files


def test_an_entry_describing_another_array_is_ignored(tmp_path, idx_tools, parse_calls, parsed_dir):
    images, labels = idx_tools.fake_split(3)
    idx_tools.write_split(tmp_path, "test", images, labels)
    load_mnist(tmp_path, "test", download=False, verify=False)
    for path in parsed_dir.glob("*.npy"):
        np.save(path, np.zeros((2, 28, 28), np.uint8))  # a crash between writing the array and its sidecar
    new_process()
    parse_calls.clear()
    loaded_images, _ = load_mnist(tmp_path, "test", download=False, verify=False)
    assert loaded_images.shape[0] == 3 and len(parse_calls) == 2


def test_an_entry_whose_array_fails_the_check_is_ignored_and_rewritten(tmp_path, idx_tools, parse_calls, parsed_dir):
    images, labels = idx_tools.fake_split(3)
    idx_tools.write_split(tmp_path, "test", images, labels)
    load_mnist(tmp_path, "test", download=False, verify=False)
    for path in parsed_dir.glob("*.npy"):
        array = np.load(path)
        if array.ndim == 1:
            np.save(path, np.full_like(array, 200))  # flipped bits in the cache: labels no file of ours holds
    new_process()
    parse_calls.clear()
    _, loaded_labels = load_mnist(tmp_path, "test", download=False, verify=False)
    np.testing.assert_array_equal(loaded_labels, labels)
    assert parse_calls == ["t10k-labels-idx1-ubyte.gz"]
    new_process()
    parse_calls.clear()
    load_mnist(tmp_path, "test", download=False, verify=False)
    assert parse_calls == []  # rewritten


def test_a_bit_flipped_within_range_in_a_cache_entry_is_caught_warned_and_rebuilt(tmp_path, idx_tools, parse_calls,
                                                                                   parsed_dir, caplog):
    """Every value still in range (a pixel, a label 0..9): only the digest recorded with the entry sees it."""
    images, labels = idx_tools.fake_split(3)
    idx_tools.write_split(tmp_path, "test", images, labels)
    load_mnist(tmp_path, "test", download=False, verify=False)
    flipped = sorted(parsed_dir.glob("*.npy"))
    for path in flipped:
        data = bytearray(path.read_bytes())
        data[-1] ^= 1  # the last pixel (0..255) or the last label (0..9 stays 0..9)
        path.write_bytes(bytes(data))
        array = np.load(path)
        assert array.max() < (256 if array.ndim == 3 else 10), "the flip left the range: the test proves nothing"
    new_process()
    parse_calls.clear()
    with caplog.at_level(logging.WARNING, logger=mnist.logger.name):
        loaded_images, loaded_labels = load_mnist(tmp_path, "test", download=False, verify=False)
    np.testing.assert_array_equal(loaded_labels, labels)
    np.testing.assert_array_equal(loaded_images[:, 0], images.astype(np.float32) / 255)
    assert sorted(parse_calls) == ["t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 2 and all("do not match the checksum recorded when it was written" in text
                                      for text in warnings)
    assert all(any(f"cache file {path}:" in text for text in warnings) for path in flipped)
    new_process()
    parse_calls.clear()
    load_mnist(tmp_path, "test", download=False, verify=False)
    assert parse_calls == []  # rewritten


def test_an_entry_of_the_format_without_a_digest_is_parsed_again(tmp_path, idx_tools, parse_calls, parsed_dir):
    images, labels = idx_tools.fake_split(3)
    idx_tools.write_split(tmp_path, "test", images, labels)
    load_mnist(tmp_path, "test", download=False, verify=False)
    for path in parsed_dir.glob("*.json"):
        sidecar = json.loads(path.read_text())
        del sidecar["sha256"]
        path.write_text(json.dumps(sidecar))
    new_process()
    parse_calls.clear()
    load_mnist(tmp_path, "test", download=False, verify=False)
    assert len(parse_calls) == 2


@pytest.mark.parametrize("blocked", ["read-only directory", "a file in the way"])
def test_an_unwritable_cache_still_loads(tmp_path, idx_tools, parsed_dir, monkeypatch, caplog, blocked):
    images, labels = idx_tools.fake_split(3)
    idx_tools.write_split(tmp_path / "data", "test", images, labels)
    if blocked == "read-only directory":
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only directories")
        parsed_dir.mkdir(parents=True)
        parsed_dir.chmod(0o500)
    else:
        (tmp_path / "not-a-directory").write_text("")
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-a-directory"))
    caplog.set_level("DEBUG", logger="cudnnnet.data.mnist")
    try:
        _, loaded_labels = load_mnist(tmp_path / "data", "test", download=False, verify=False)
    finally:
        if parsed_dir.exists():
            parsed_dir.chmod(0o700)
    np.testing.assert_array_equal(loaded_labels, labels)
    assert any("not caching" in record.getMessage() for record in caplog.records)
    assert all(record.levelname == "DEBUG" for record in caplog.records)


def test_no_cache_variable_turns_reading_and_writing_off(tmp_path, idx_tools, parse_calls, parsed_dir, monkeypatch):
    idx_tools.write_split(tmp_path, "test", *idx_tools.fake_split(3))
    load_mnist(tmp_path, "test", download=False, verify=False)
    entries = {path: path.read_bytes() for path in parsed_dir.iterdir()}
    monkeypatch.setenv(mnist.NO_CACHE_ENV, "1")
    new_process()
    parse_calls.clear()
    load_mnist(tmp_path, "test", download=False, verify=False)
    assert len(parse_calls) == 2  # the entries were there, and not read
    shutil.rmtree(parsed_dir)
    new_process()
    load_mnist(tmp_path, "test", download=False, verify=False)
    assert len(entries) == 4 and not parsed_dir.exists()


def test_the_data_directory_is_never_written(tmp_path, idx_tools):
    data = tmp_path / "data"
    idx_tools.write_split(data, "test", *idx_tools.fake_split(3))
    before = {path.name: path.stat().st_mtime_ns for path in data.iterdir()}
    for _ in range(2):
        load_mnist(data, "test", download=False, verify=False)
        new_process()
    assert {path.name: path.stat().st_mtime_ns for path in data.iterdir()} == before


def test_an_invalid_file_is_not_cached(tmp_path, idx_tools, parsed_dir):
    images, _ = idx_tools.fake_split(3)
    idx_tools.write_split(tmp_path, "test", images, np.array([1, 2, 10]))
    with pytest.raises(DataError, match="label 10"):
        load_mnist(tmp_path, "test", download=False, verify=False)
    sources = [json.loads(path.read_text())["source"] for path in parsed_dir.glob("*.json")]
    assert sources == [str((tmp_path / "t10k-images-idx3-ubyte.gz").resolve())]  # the valid images only


# ---- declared sizes: nothing is decompressed beyond what a header declares ----------------------


def zeros_gzip(header: bytes, megabytes: int) -> bytes:
    """A gzip stream of ``header`` then ``megabytes`` MiB of zeros, a few KiB on disk (repeated members)."""
    return gzip.compress(header) + gzip.compress(bytes(1 << 20)) * megabytes


def test_a_stream_inflating_past_its_declared_size_is_refused_as_too_long(tmp_path, monkeypatch):
    path = tmp_path / "labels.gz"
    path.write_bytes(zeros_gzip(bytes([0, 0, 8, 1, 0, 0, 0, 3, 1, 2, 3]), 64))
    reads = []
    original_read = gzip.GzipFile.read
    monkeypatch.setattr(gzip.GzipFile, "read", lambda self, size=-1: reads.append(size) or original_read(self, size))
    with pytest.raises(DataError, match=r"labels\.gz: too long: header dims \(3,\) call for 3 data bytes, the file holds more"):
        read_labels(path)
    assert -1 not in reads and sum(reads) <= 4 + 4 + 3 + 1


def test_a_header_declaring_more_than_the_limit_is_refused_before_any_data(tmp_path):
    path = tmp_path / "images.gz"
    path.write_bytes(zeros_gzip(bytes([0, 0, 8, 3]) + b"".join(size.to_bytes(4, "big") for size in (2**20, 2**10, 28)), 1))
    with pytest.raises(DataError, match=rf"images\.gz: IDX header dims \(1048576, 1024, 28\) describe 30064771072 bytes, "
                                        rf"more than the {mnist.MAX_IDX_BYTES} bytes"):
        read_idx(path)


@pytest.mark.parametrize("declared, pattern", [
    ({"images": (60001, 28, 28), "labels": (60001,)},
     r"train-images-idx3-ubyte\.gz: the header declares 60001 images; MNIST's file holds 60000, so this is not MNIST"),
    ({"labels": (70000,)}, r"holds 12 images but .*train-labels-idx1-ubyte\.gz holds 70000 labels"),
    ({"images": (12, 4000, 4000)}, r"train-images-idx3-ubyte\.gz: images are 4000×4000, MNIST's are 28×28"),
    ({"images": (2**20,)}, r"train-images-idx3-ubyte\.gz: magic 2049 is not an MNIST images file"),
])
def test_mnist_headers_are_checked_as_a_pair_before_any_data_is_read(tmp_path, idx_tools, monkeypatch, declared, pattern):
    images, labels = idx_tools.fake_split(12)
    idx_tools.write_split(tmp_path, "train", images, labels)
    for which, dims in declared.items():
        name = mnist.SPLIT_FILES["train"][0 if which == "images" else 1]
        header = bytes([0, 0, 8, len(dims)]) + b"".join(size.to_bytes(4, "big") for size in dims)
        (tmp_path / f"{name}.gz").write_bytes(zeros_gzip(header, 8))
    monkeypatch.setattr(mnist, "read_idx_bytes", lambda *args: pytest.fail("data read before the headers were checked"))
    with pytest.raises(DataError, match=pattern):
        load_mnist(tmp_path, "train", download=False)


def test_without_verification_a_larger_data_set_still_loads(tmp_path, idx_tools, monkeypatch):
    monkeypatch.setitem(mnist.SPLIT_COUNTS, "train", 5)
    images, labels = idx_tools.fake_split(12)
    idx_tools.write_split(tmp_path, "train", images, labels)
    with pytest.raises(DataError, match="declares 12 images; MNIST's file holds 5"):
        load_mnist(tmp_path, "train", download=False)
    assert load_mnist(tmp_path, "train", download=False, verify=False)[0].shape == (12, 1, 28, 28)
