"""The data sets of data.dataset on generated files: CIFAR-10 binary records, Fashion-MNIST-named IDX
files, IDX pairs by path with MD5 sums, npz archives, and image folders (corrupt, grey and RGB
mixed, mixed sizes, the cache)."""

import gzip
import io
import os
import signal
import zipfile

import numpy as np
import pytest
from PIL import Image

from cudnnnet.config.schema import DataConfig
from cudnnnet.data import image_folder, sources
from cudnnnet.data.sources import load_source
from cudnnnet.errors import DataError
from hostile_files import plant, within
from image_modes import COLOUR_MODES, GREY_MODES, mode_folder


def cifar_records(labels: np.ndarray, pixels: np.ndarray) -> bytes:
    """CIFAR-10 binary records: label byte, then the 3×32×32 pixels channel by channel."""
    return b"".join(bytes([int(label)]) + image.tobytes() for label, image in zip(labels, pixels))


def write_cifar(directory, per_file: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    written = {}
    for name in sources.CIFAR10_FILES["train"] + sources.CIFAR10_FILES["test"]:
        labels = rng.integers(0, 10, per_file)
        pixels = rng.integers(0, 256, (per_file, 3, 32, 32), dtype=np.uint8)
        (directory / name).write_bytes(cifar_records(labels, pixels))
        written[name] = (pixels, labels)
    return written


def test_cifar10_binary_records_read_as_rgb_images_in_file_order(tmp_path):
    written = write_cifar(tmp_path)
    train = load_source(DataConfig(dataset="cifar10", dir=str(tmp_path)), "train", download=False)
    expected = np.concatenate([written[name][0] for name in sources.CIFAR10_FILES["train"]])
    assert train.pixels.shape == (15, 3, 32, 32) and np.array_equal(train.pixels, expected)
    assert np.array_equal(train.labels, np.concatenate([written[name][1] for name in sources.CIFAR10_FILES["train"]]))
    assert train.classes[0] == "airplane" and len(train.classes) == 10
    test = load_source(DataConfig(dataset="cifar10", dir=str(tmp_path)), "test", download=False)
    assert np.array_equal(test.pixels, written["test_batch.bin"][0])


@pytest.mark.parametrize("damage, message", [
    (lambda data: data[:-1], "not a whole number of CIFAR-10 records"),
    (lambda data: bytes([10]) + data[1:], "record 0 has label 10"),
])
def test_a_damaged_cifar10_file_is_named(tmp_path, damage, message):
    write_cifar(tmp_path)
    path = tmp_path / "data_batch_3.bin"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(DataError, match=f"{path}.*{message}|{message}"):
        load_source(DataConfig(dataset="cifar10", dir=str(tmp_path)), "train", download=False)


EXTRACT_WITH_A_FULL_DISK = """
import resource, signal, sys
from cudnnnet.data import sources
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))
sources.CIFAR10_ARCHIVE_MD5 = sys.argv[2]
try:
    sources._download_cifar(sources.Path(sys.argv[1]))
except sources.DataError as error:
    print(error)
"""


def test_a_cifar10_extraction_that_fails_midway_leaves_no_part_of_a_file(tmp_path):
    """The disk filled up (or the user pressed Ctrl-C) while the records were extracted: the next run
    finds the files missing and extracts them again, never a truncated file it then refuses, or reads short."""
    import subprocess
    import sys
    import tarfile

    records = tmp_path / "records"
    records.mkdir()
    write_cifar(records, per_file=20)  # 61 460 bytes a file: more than the 50 000 the process may write
    archive = tmp_path / "cifar" / "cifar-10-binary.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(records.iterdir()):
            tar.add(path, arcname=f"cifar-10-batches-bin/{path.name}")
    finished = subprocess.run([sys.executable, "-c", EXTRACT_WITH_A_FULL_DISK, str(archive.parent),
                               sources.file_md5(archive)], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert "cannot extract the CIFAR-10 records" in finished.stdout, finished.stdout + finished.stderr
    assert sorted(path.name for path in archive.parent.iterdir()) == [archive.name]
    with pytest.raises(DataError, match="CIFAR-10 train files missing"):
        load_source(DataConfig(dataset="cifar10", dir=str(archive.parent)), "train", download=False)


def test_missing_cifar10_files_are_listed_without_a_download(tmp_path):
    with pytest.raises(DataError, match="CIFAR-10 test files missing.*test_batch.bin"):
        load_source(DataConfig(dataset="cifar10", dir=str(tmp_path)), "test", download=False)


def test_without_data_dir_cifar10_and_the_idx_family_use_the_user_cache(tmp_path, idx_tools):
    """The shipped fashion_mnist_cnn and cifar10_cnn configs give no data.dir: their files are looked
    for in (and downloaded to) $XDG_CACHE_HOME/cudnnnet/<dataset>."""
    written = write_cifar(_made(tmp_path / "xdg-cache" / "cudnnnet" / "cifar10"))
    test = load_source(DataConfig(dataset="cifar10"), "test", download=False)
    assert np.array_equal(test.pixels, written["test_batch.bin"][0])
    folder = tmp_path / "xdg-cache" / "cudnnnet" / "kmnist"
    with pytest.raises(DataError, match=f"KMNIST train file train-images-idx3-ubyte.* missing from {folder}"):
        load_source(DataConfig(dataset="kmnist"), "train", download=False)


def _made(folder):
    folder.mkdir(parents=True)
    return folder


def test_a_failed_download_says_how_to_give_the_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "CIFAR10_URL", "http://127.0.0.1:9/cifar-10-binary.tar.gz")
    with pytest.raises(DataError, match=r"could not download cifar-10-binary\.tar\.gz into .*cifar10: .*127\.0\.0\.1:9"
                                        r".*; put the files there, or give the folder that holds them with --data-dir"):
        load_source(DataConfig(dataset="cifar10"), "train")


@pytest.mark.parametrize("dataset", ["mnist", "fashion-mnist", "cifar10"])
def test_without_a_home_or_xdg_cache_a_data_set_without_a_folder_is_named(monkeypatch, dataset):
    """A service account with no home directory and no $XDG_CACHE_HOME: no user cache to download into."""
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(os.path, "expanduser", lambda path: path)  # what it returns where the user has no home
    with pytest.raises(DataError, match=f"no folder for {dataset}: neither \\$XDG_CACHE_HOME nor a home directory "
                                        r"is set.*give the folder .* with --data-dir"):
        load_source(DataConfig(dataset=dataset), "train")


def test_fashion_mnist_named_files_are_checked_against_the_published_md5(tmp_path, idx_tools):
    images, labels = idx_tools.fake_split(8)
    idx_tools.write_split(tmp_path, "train", images, labels)
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte\.gz: checksum mismatch.*8d4fb7e6c68d591d4c3dfef9ec88bf0d"):
        load_source(DataConfig(dataset="fashion-mnist", dir=str(tmp_path)), "train", download=False)


@pytest.mark.parametrize("dataset", ["fashion-mnist", "kmnist"])
def test_uncompressed_family_files_are_checked_by_data_md5_and_otherwise_read_with_a_warning(tmp_path, idx_tools,
                                                                                               dataset, caplog):
    """The published sums are of the .gz files; a user's uncompressed files are checked against the
    sums data.md5 gives, and read with a warning naming the file where it gives none."""
    images, labels = idx_tools.fake_split(8)
    idx_tools.write_split(tmp_path, "train", images, labels, compress=False)
    names = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte")
    sums = {name: sources.file_md5(tmp_path / name) for name in names}
    checked = load_source(DataConfig(dataset=dataset, dir=str(tmp_path), md5=sums), "train", download=False)
    assert np.array_equal(checked.pixels, images) and np.array_equal(checked.labels, labels)
    assert not [record for record in caplog.records if record.levelname == "WARNING"]
    with pytest.raises(DataError, match=r"train-labels-idx1-ubyte: checksum mismatch: MD5 [0-9a-f]{32}, data\.md5 "
                                        r"expects 0{32}"):
        load_source(DataConfig(dataset=dataset, dir=str(tmp_path), md5={**sums, names[1]: "0" * 32}), "train",
                    download=False)
    caplog.clear()
    unchecked = load_source(DataConfig(dataset=dataset, dir=str(tmp_path)), "train", download=False)
    assert np.array_equal(unchecked.pixels, images)
    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert len(warnings) == 2 and all("uncompressed, so not checked" in text and "data.md5" in text for text in warnings)
    assert str(tmp_path / names[0]) in warnings[0]


def test_an_idx_pair_by_path_loads_with_its_md5_and_is_refused_with_another(tmp_path, idx_tools):
    images, labels = idx_tools.fake_split(8)
    idx_tools.write_split(tmp_path, "train", images, labels)
    idx_tools.write_split(tmp_path, "test", images[:4], labels[:4])
    paths = {f"{split}_{part}": str(tmp_path / f"{prefix}-{part}-idx{3 if part == 'images' else 1}-ubyte.gz")
             for split, prefix in (("train", "train"), ("test", "t10k")) for part in ("images", "labels")}
    md5 = {os.path.basename(paths["train_images"]): sources.file_md5(tmp_path / os.path.basename(paths["train_images"]))}
    loaded = load_source(DataConfig(dataset="idx", md5=md5, **paths), "train")
    assert np.array_equal(loaded.pixels, images) and np.array_equal(loaded.labels, labels)
    wrong = {name: "0" * 32 for name in md5}
    with pytest.raises(DataError, match="train-images-idx3-ubyte.gz: checksum mismatch: MD5 [0-9a-f]{32}"):
        load_source(DataConfig(dataset="idx", md5=wrong, **paths), "train")


@pytest.mark.parametrize("kind, named", [("fifo", "a FIFO"), ("device", "a character device")])
def test_a_pipe_or_device_given_as_a_data_file_is_refused_not_waited_on(tmp_path, idx_tools, kind, named):
    """An npz, IDX or checksummed file that is a FIFO waited for a writer for ever; /dev/zero as an .npz
    was read without end."""
    images, labels = idx_tools.fake_split(4)
    idx_tools.write_split(tmp_path, "train", images, labels)
    idx_paths = {f"{split}_{part}": str(tmp_path / f"train-{part}-idx{3 if part == 'images' else 1}-ubyte.gz")
                 for split in ("train", "test") for part in ("images", "labels")}
    planted = tmp_path / "planted"
    plant(planted, kind)
    cases = [
        (DataConfig(dataset="npz", train_file=str(planted), test_file=str(planted)),
         rf"planted: not a regular file \({named}\); give the .npz file itself"),
        (DataConfig(dataset="idx", **{**idx_paths, "train_images": str(planted)}),
         rf"cannot read {planted}: not a regular file \({named}\)"),
        (DataConfig(dataset="idx", md5={"planted": "0" * 32}, **{**idx_paths, "train_labels": str(planted)}),
         rf"cannot read {planted}: not a regular file \({named}\)"),
    ]
    with within(5):
        for data, message in cases:
            with pytest.raises(DataError, match=message):
                load_source(data, "train")


def write_npz(path, **arrays):
    np.savez(path, **arrays)
    return path


def test_npz_of_uint8_and_of_float_pixels(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (6, 3, 5, 7), dtype=np.uint8)
    y = np.array([0, 1, 2, 2, 1, 0])
    uint8_file = write_npz(tmp_path / "a.npz", x=x, y=y)
    float_file = write_npz(tmp_path / "b.npz", x=x.astype(np.float32) / 255, y=y)
    for path in (uint8_file, float_file):
        loaded = load_source(DataConfig(dataset="npz", train_file=str(path), test_file=str(path)), "train")
        assert np.array_equal(loaded.pixels, x) and np.array_equal(loaded.labels, y)
        assert loaded.classes == ("0", "1", "2")


@pytest.mark.parametrize("arrays, message", [
    (dict(x=np.zeros((3, 4, 4), np.uint8)), "no array 'y'"),
    (dict(x=np.zeros((3, 4, 4), np.uint8), y=np.zeros(2, np.int64)), "y must hold 3 integer labels"),
    (dict(x=np.full((3, 4, 4), 2.0, np.float32), y=np.zeros(3, np.int64)), r"float x must hold finite values in \[0, 1\]"),
    (dict(x=np.zeros((3, 4), np.uint8), y=np.zeros(3, np.int64)), "x must hold images shaped"),
    (dict(x=np.zeros((3, 0, 28), np.uint8), y=np.zeros(3, np.int64)),
     r"images of size 0×28 hold no pixels \(x has shape \(3, 0, 28\)\)"),  # was 'tensor sizes must be positive'
    (dict(x=np.zeros((3, 1, 4, 0), np.float32), y=np.zeros(3, np.int64)), r"images of size 4×0 hold no pixels"),
    (dict(x=np.zeros((3, 4, 4), np.uint8), y=np.array([0, -1, 0])), "label -1 is negative"),
    (dict(x=np.zeros((3, 4, 4), np.uint8), y=np.array([0, 100_000, 0])),
     r"label 100000 at index 1 would make 100001 classes; labels are 0\.\.K-1 for K classes, at most 100000"),
    (dict(x=np.zeros((3, 4, 4), np.uint8), y=np.array([0, (1 << 63) + 5, 0], np.uint64)),
     r"label 9223372036854775813 at index 1 would make"),
])
def test_a_bad_npz_is_named_with_what_is_wrong(tmp_path, arrays, message):
    path = write_npz(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DataError, match=f"{path}: .*{message}|{path}: {message}"):
        load_source(DataConfig(dataset="npz", train_file=str(path), test_file=str(path)), "train")


def test_an_npz_of_pickled_objects_or_an_absurd_declared_size_is_refused_unread(tmp_path):
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, x=np.array([object()], dtype=object), y=np.zeros(1, np.int64))
    with pytest.raises(DataError, match="holds Python objects"):
        sources.read_npz(pickled)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "|u1", "fortran_order": False, "shape": (1 << 20, 1 << 20)})
    huge = tmp_path / "huge.npz"
    with zipfile.ZipFile(huge, "w") as archive:
        archive.writestr("x.npy", header.getvalue() + b"\0" * 16)
        archive.writestr("y.npy", header.getvalue())
    with pytest.raises(DataError, match=r"declares shape \(1048576, 1048576\)"):
        sources.read_npz(huge)


def peak_bytes_reading_npz(path) -> int:
    """The peak of the memory Python allocated while ``read_npz(path)`` ran (refused, as the caller checks)."""
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(DataError):
            sources.read_npz(path)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("x_header, y_header, message", [
    (((16384, 32, 32), "|u1"), ((5,), "<i8"), r"y must hold 16384 integer labels, got dtype int64 shape \(5,\)"),
    (((16384, 32, 32), "|u1"), ((16384,), "|V8"), r"y must hold 16384 integer labels, got dtype \|V8"),
    (((4, 32, 32), "|V4096"), ((4,), "<i8"), r"x must be uint8 or float in \[0, 1\], got dtype \|V4096"),
    (((8192, 2, 32, 32), "|u1"), ((8192,), "<i8"), r"x must hold images shaped .* got shape \(8192, 2, 32, 32\)"),
])
def test_an_npz_whose_headers_disagree_is_refused_before_either_member_is_inflated(tmp_path, x_header, y_header,
                                                                                    message):
    """x declares 16 MiB (in 16 KB on disk); what its and y's headers say suffices to refuse it."""
    from hostile_files import Entry, npy_header, write_zip

    (x_shape, x_dtype), (y_shape, y_dtype) = x_header, y_header
    y_bytes = bytes(np.prod(y_shape, dtype=np.int64) * np.dtype(y_dtype).itemsize)
    path = tmp_path / "bomb.npz"
    write_zip(path, {"x.npy": Entry(npy_header(x_shape, x_dtype), zero_megabytes=16),
                     "y.npy": Entry(npy_header(y_shape, y_dtype) + y_bytes)})
    assert path.stat().st_size < 256 << 10
    with pytest.raises(DataError, match=f"{path}: {message}"):
        sources.read_npz(path)
    assert peak_bytes_reading_npz(path) < 4 << 20


READ_NPZ_PEAK = """
import resource, sys
from cudnnnet.data import sources
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
x, y = sources.read_npz(sources.Path(sys.argv[1]))
assert x.dtype == sources.np.uint8 and x.shape == (2048, 1, 128, 128)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
"""


def test_an_npz_of_float_pixels_is_read_and_converted_in_little_more_than_its_size(tmp_path):
    """128 MiB of float32 pixels: the zip entry read at once (a second copy while its pieces were joined)
    and converted at once (x · 255 and its rounding, two more float copies) took over 500 MiB."""
    import subprocess
    import sys
    from hostile_files import Entry, npy_header, write_zip

    count = 2048  # 2048 × 128 × 128 float32: 128 MiB
    path = tmp_path / "floats.npz"
    write_zip(path, {"x.npy": Entry(npy_header((count, 1, 128, 128), "<f4"), zero_megabytes=128),
                     "y.npy": Entry(npy_header((count,), "<i8") + bytes(8 * count))})
    finished = subprocess.run([sys.executable, "-c", READ_NPZ_PEAK, str(path)], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert finished.returncode == 0, finished.stderr
    grown_mib = float(finished.stdout)
    assert grown_mib < 128 + 32 + 48, f"reading 128 MiB of floats into 32 MiB of pixels took {grown_mib:.0f} MiB more"


# ---- image folders -------------------------------------------------------------------------


def save_image(path, array):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def folder_config(root, **keys):
    return DataConfig(dataset="image-folder", dir=str(root), **keys)


def test_a_photo_turned_by_its_exif_orientation_is_trained_on_as_predict_reads_it(tmp_path):
    """A phone stores a portrait photo as landscape pixels and an EXIF orientation; predict turns it
    upright, so training must too (it read the stored pixels: every such photo lay on its side)."""
    from cudnnnet.data.images import load_photo

    stored = np.random.default_rng(3).integers(0, 256, (6, 8, 3), dtype=np.uint8)  # 8 wide, 6 high
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90° clockwise to display"
    for split in ("train", "test"):
        for name in ("cat", "dog"):
            path = tmp_path / split / name / "a.png"
            path.parent.mkdir(parents=True)
            Image.fromarray(stored).save(path, exif=exif.tobytes())
    loaded = load_source(folder_config(tmp_path), "train")
    upright = np.rot90(stored, k=-1).transpose(2, 0, 1)  # 6 wide, 8 high
    assert loaded.pixels.shape == (2, 3, 8, 6) and np.array_equal(loaded.pixels[0], upright)
    assert np.array_equal(load_photo(tmp_path / "test" / "cat" / "a.png", 3, 8, 6), upright)


def test_pillow_s_warnings_about_a_folder_image_are_not_printed(tmp_path):
    """Turning a photo upright reads its EXIF block; a corrupt one made Pillow print a UserWarning."""
    import warnings

    from test_images import jpeg_with_corrupt_exif

    for split in ("train", "test"):
        for name in ("cat", "dog"):
            jpeg_with_corrupt_exif(_made(tmp_path / split / name) / "a.jpg", np.full((6, 8, 3), 200, np.uint8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_source(folder_config(tmp_path), "train").pixels.shape == (2, 3, 6, 8)


def test_grey_and_rgb_images_mixed_make_rgb_with_grey_in_every_channel(tmp_path):
    grey = np.arange(48, dtype=np.uint8).reshape(6, 8)
    colour = np.random.default_rng(2).integers(0, 256, (6, 8, 3), dtype=np.uint8)
    for split in ("train", "test"):
        save_image(tmp_path / split / "cat" / "a.png", grey)
        save_image(tmp_path / split / "dog" / "b.png", colour)
    loaded = load_source(folder_config(tmp_path), "train")
    assert loaded.classes == ("cat", "dog") and loaded.labels.tolist() == [0, 1]
    assert loaded.pixels.shape == (2, 3, 6, 8)
    assert all(np.array_equal(loaded.pixels[0, channel], grey) for channel in range(3))
    assert np.array_equal(loaded.pixels[1], colour.transpose(2, 0, 1))
    grey_only = load_source(folder_config(tmp_path, channels=1), "train")
    assert grey_only.pixels.shape == (2, 1, 6, 8) and np.array_equal(grey_only.pixels[0, 0], grey)


def test_a_corrupt_image_is_named_and_refused_or_skipped(tmp_path):
    root = tmp_path / "photos"  # not tmp_path: the cache's folder there would be one more class
    for index in range(3):
        save_image(root / "a" / f"{index}.png", np.full((4, 4), index, np.uint8))
    corrupt = root / "a" / "broken.png"
    corrupt.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    with pytest.raises(DataError, match=f"{corrupt}: cannot decode the image.*data.corrupt: skip"):
        load_source(folder_config(root, test_fraction=0.34), "train")
    skipped = [load_source(folder_config(root, test_fraction=0.34, corrupt="skip"), split) for split in ("train", "test")]
    assert sum(len(split.labels) for split in skipped) == 3


def test_an_image_above_predict_s_pixel_limit_is_refused_from_its_header_or_skipped(tmp_path, monkeypatch):
    """Training decoded every image Pillow opens (up to 179 megapixels: a 320 KB PNG took 1.6 GiB in each
    decoding process) where predict refuses one above 50 megapixels from its header."""
    from PIL import ImageFile
    from test_images import png_header_only

    root = tmp_path / "photos"  # not tmp_path: the cache's folder there would be one more class
    for index in range(4):
        save_image(root / "ab"[index % 2] / f"{index}.png", np.full((4, 4), index, np.uint8))
    huge = root / "b" / "huge.png"
    huge.write_bytes(png_header_only(10_000, 6_000))  # 60 megapixels, below Pillow's own limit
    decode = ImageFile.ImageFile.load

    def decode_within_the_limit(image, *args, **kwargs):
        assert image.size[0] * image.size[1] <= 50_000_000, f"decoded a {image.size} image"
        return decode(image, *args, **kwargs)

    monkeypatch.setattr(ImageFile.ImageFile, "load", decode_within_the_limit)
    with pytest.raises(DataError, match=rf"{huge}: cannot decode the image \(the image is 10000x6000 \(60.0 "
                                        rf"megapixels\), larger than the limit of 50 megapixels\); remove it, or "
                                        rf"set data.corrupt: skip"):
        load_source(folder_config(root, test_fraction=0.5), "train")
    skipped = [load_source(folder_config(root, test_fraction=0.5, corrupt="skip"), part) for part in ("train", "test")]
    assert sum(len(split.labels) for split in skipped) == 4


def test_links_that_loop_or_lead_nowhere_are_no_images_or_classes(tmp_path):
    """A link in a loop raised OSError from listing the folder (exit 1, 'Too many levels of symbolic links'),
    where a link to nothing was passed over, as predict passes over both."""
    root = tmp_path / "photos"  # not tmp_path: the cache's folder there would be one more class
    for index in range(4):
        save_image(root / "ab"[index % 2] / f"{index}.png", np.full((4, 4), index, np.uint8))
    for link, target in ((root / "a" / "loop.png", "loop.png"), (root / "a" / "gone.png", "nothing.png"),
                         (root / "loop", "loop"), (root / "gone", "nothing")):
        os.symlink(target, link)
    split = [load_source(folder_config(root, test_fraction=0.5), split) for split in ("train", "test")]
    assert split[0].classes == ("a", "b") and sum(len(part.labels) for part in split) == 4


def test_hidden_files_are_no_images_as_hidden_folders_are_no_classes(tmp_path):
    """A Mac writes ._NAME.jpg beside each photo on a foreign disk; as an image it stopped training
    ('cannot decode the image (not an image file Pillow can read)'), though hidden folders are passed over."""
    root = tmp_path / "photos"  # not tmp_path: the cache's folder there would be one more class
    for index in range(4):
        save_image(root / "ab"[index % 2] / f"{index}.png", np.full((4, 4), index, np.uint8))
        (root / "ab"[index % 2] / f"._{index}.png").write_bytes(b"\x00\x05\x16\x07" + bytes(78))  # AppleDouble
    save_image(root / ".thumbnails" / "0.png", np.zeros((4, 4), np.uint8))
    split = [load_source(folder_config(root, test_fraction=0.5), split) for split in ("train", "test")]
    assert split[0].classes == ("a", "b") and sum(len(part.labels) for part in split) == 4


def test_splits_in_folders_of_other_names_are_named_with_the_layouts_read(tmp_path):
    """train/ and val/ were read as two classes holding no images: 'no image files in its class folders'."""
    for split in ("train", "val"):
        save_image(tmp_path / "photos" / split / "cat" / "a.png", np.zeros((4, 4), np.uint8))
    with pytest.raises(DataError, match=r"photos: no image files \(.*\) in its class folders \(train, val\); "
                                        r"image-folder reads .*photos/<class>/<image>, or train/<class>/ and "
                                        r"test/<class>/ folders there"):
        load_source(folder_config(tmp_path / "photos"), "train")


@pytest.mark.parametrize("keys, decoded_chunks, message", [
    ({"image_size": (4, 4)}, 0, r"photos: 8 images of 1×4×4 make more than 40 bytes; set a smaller data.image_size"),
    ({}, 3, r"photos: its first 3 of 8 images already make more than 40 bytes decoded; set a smaller data.image_size"),
    ({"corrupt": "refuse"}, 2, r"photos/a/2.png: cannot decode the image"),
])
def test_a_folder_too_large_decoded_or_with_a_corrupt_image_stops_before_the_rest_is_decoded(
        tmp_path, monkeypatch, keys, decoded_chunks, message):
    """The bytes the decoded folder may take were checked, and a corrupt image refused, only once every
    image had been decoded and held in memory (a folder of photos decoded for minutes, then was refused)."""
    root = tmp_path / "photos"  # not tmp_path: the cache's folder there would be one more class
    for index in range(8):
        save_image(root / "ab"[index % 2] / f"{index}.png", np.full((4, 4), index, np.uint8))
    if "corrupt" in keys:
        (root / "a" / "2.png").write_bytes(b"not an image")
    else:
        monkeypatch.setattr(image_folder, "MAX_FOLDER_BYTES", 40)  # two images of 16 bytes, not three
    chunks = []
    real_decode = image_folder.decode_files
    monkeypatch.setattr(image_folder, "decode_files",
                        lambda paths, *args: chunks.append(paths) or real_decode(paths, *args))
    monkeypatch.setattr(image_folder, "CHUNK", 1)
    monkeypatch.setattr(os, "cpu_count", lambda: 1)  # decoded in this process, where decode_files is counted
    with pytest.raises(DataError, match=message):
        load_source(folder_config(root, test_fraction=0.5, **keys), "train")
    assert len(chunks) == decoded_chunks


def test_a_folder_s_images_are_the_files_predict_reads_from_a_folder(tmp_path):
    """Training left .pnm and .pfm files out of a class folder without a word; predict read them."""
    from cudnnnet.data.images import folder_images

    root = tmp_path / "photos"  # not tmp_path: the cache's folder there would be one more class
    save_image(root / "a" / "0.png", np.full((4, 4), 10, np.uint8))
    Image.fromarray(np.full((4, 4), 20, np.uint8)).save(root / "a" / "1.pnm", format="PPM")
    save_image(root / "b" / "3.png", np.full((4, 4), 40, np.uint8))
    Image.fromarray(np.full((4, 4), 0.5, np.float32)).save(root / "b" / "2.pfm")
    listed = [path.relative_to(root).as_posix() for name in ("a", "b") for path in folder_images(root / name)]
    assert [relative for relative, _, _, _ in image_folder.list_files(root, ("a", "b"))] == listed == [
        "a/0.png", "a/1.pnm", "b/2.pfm", "b/3.png"]
    both = [load_source(folder_config(root, test_fraction=0.5), split) for split in ("train", "test")]
    assert sorted(int(image[0, 0, 0]) for split in both for image in split.pixels) == [10, 20, 40, 128]


_DECODE_FILES = image_folder.decode_files


def _killed_at_1_png(paths, *args):
    """image_folder.decode_files, but the process is killed at 1.png (a module's function: sent to the pool)."""
    if paths[0].endswith("1.png"):
        os.kill(os.getpid(), signal.SIGKILL)
    return _DECODE_FILES(paths, *args)


def test_a_decoding_process_that_dies_is_one_error_not_a_traceback(tmp_path, monkeypatch):
    """A decoding process killed by the system (out of memory) ended training with concurrent.futures'
    BrokenProcessPool traceback."""
    from cudnnnet.errors import CudnnnetError

    root = tmp_path / "photos"  # not tmp_path: the cache's folder there would be one more class
    for index in range(4):
        save_image(root / "ab"[index % 2] / f"{index}.png", np.full((4, 4), index, np.uint8))
    monkeypatch.setattr(image_folder, "decode_files", _killed_at_1_png)  # the forked processes inherit it
    monkeypatch.setattr(image_folder, "CHUNK", 1)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    with pytest.raises(CudnnnetError, match=r"a process decoding the images of .*photos died \(killed by the system: "
                                            r"out of memory, perhaps\)$") as raised:
        load_source(folder_config(root, test_fraction=0.5), "train")
    assert not isinstance(raised.value, DataError)  # not the data's fault: exit 1, not 2


def test_one_folder_is_split_by_a_seeded_fraction(tmp_path):
    root = tmp_path / "photos"  # not tmp_path: the cache's folder there would be one more class
    for index in range(10):
        save_image(root / ("x" if index % 2 else "y") / f"{index}.png", np.full((3, 3), index, np.uint8))
    train = load_source(folder_config(root, test_fraction=0.3, split_seed=5), "train")
    test = load_source(folder_config(root, test_fraction=0.3, split_seed=5), "test")
    assert (len(train.labels), len(test.labels)) == (7, 3)
    values = sorted(int(image[0, 0, 0]) for image in np.concatenate([train.pixels, test.pixels]))
    assert values == list(range(10))
    other = load_source(folder_config(root, test_fraction=0.3, split_seed=6), "test")
    assert not np.array_equal(other.pixels, test.pixels)


def test_mixed_sizes_need_image_size_and_are_resized_to_it(tmp_path):
    save_image(tmp_path / "a" / "small.png", np.zeros((4, 4), np.uint8))
    save_image(tmp_path / "a" / "large.png", np.full((9, 12), 200, np.uint8))
    save_image(tmp_path / "b" / "other.png", np.zeros((4, 4), np.uint8))
    with pytest.raises(DataError, match=r"small.png: 4×4 pixels, the first image is 12×9; set data.image_size"):
        load_source(folder_config(tmp_path, test_fraction=0.34, split_seed=1), "train")
    resized = load_source(folder_config(tmp_path, test_fraction=0.34, image_size=(5, 6)), "train")
    assert resized.pixels.shape[1:] == (1, 5, 6)


def photo_folder(root, shape=(30, 50, 3)) -> list:
    """train/ and test/ folders of two classes, each with one random image of ``shape``; the paths."""
    rng = np.random.default_rng(sum(shape))
    paths = []
    for split in ("train", "test"):
        for name in ("cat", "dog"):
            paths.append(root / split / name / "a.png")
            save_image(paths[-1], rng.integers(0, 256, shape, dtype=np.uint8))
    return paths


@pytest.mark.parametrize("resize", [None, "crop", "stretch"])
def test_a_folder_is_trained_on_the_pixels_predict_reads(tmp_path, resize):
    """A landscape photo in a folder trained at a portrait image_size: training had stretched it while
    predict cropped it; both now fit it as data.resize says (crop by default), through one function."""
    from cudnnnet.data.images import load_photo

    paths = photo_folder(tmp_path)
    config = folder_config(tmp_path, image_size=(12, 8), **({} if resize is None else {"resize": resize}))
    trained = load_source(config, "train")
    assert trained.pixels.shape == (2, 3, 12, 8)
    for path, pixels in zip(paths, trained.pixels):
        assert np.array_equal(pixels, load_photo(path, 3, 12, 8, resize=config.resize))
    other = "stretch" if config.resize == "crop" else "crop"
    assert not np.array_equal(trained.pixels[0], load_photo(paths[0], 3, 12, 8, resize=other))


@pytest.mark.parametrize("image_size", [(12, 8), None])
@pytest.mark.parametrize("channels, modes, read_as", [
    (1, COLOUR_MODES + GREY_MODES, 1), (3, COLOUR_MODES + GREY_MODES, 3), ("auto", COLOUR_MODES + GREY_MODES, 3),
    ("auto", GREY_MODES, 1)], ids=["grey", "rgb", "auto with colour", "auto, all grey"])
def test_a_folder_image_of_every_mode_is_trained_on_the_pixels_predict_reads(tmp_path, channels, modes, read_as,
                                                                          image_size):
    """One conversion in training and prediction: training had dropped the alpha of RGBA, LA and
    transparent palette images (predict composites them on white), read LA as colour, and made grey
    from colour after resizing (predict before)."""
    from cudnnnet.data.images import load_photo

    paths = mode_folder(tmp_path, modes)
    keys = {"channels": channels, **({"image_size": image_size} if image_size else {})}
    trained = load_source(folder_config(tmp_path, **keys), "train")
    height, width = image_size or (30, 50)
    assert trained.pixels.shape == (len(modes), read_as, height, width)
    for path, pixels in zip(paths, trained.pixels):
        assert np.array_equal(pixels, load_photo(path, read_as, height, width)), path.parent.name


def test_transparency_is_composited_on_white_and_grey_alpha_images_stay_grey(tmp_path):
    """A transparent pixel is white, a half-transparent one halfway to white, in training as in predict;
    LA images are grey (channels auto keeps one channel), and not read as colour with their alpha dropped."""
    value = np.full((4, 6), 60, np.uint8)
    alpha = np.repeat(np.array([0, 128, 255], np.uint8), 2)[None].repeat(4, axis=0)
    for split in ("train", "test"):
        save_image(tmp_path / split / "grey" / "a.png", np.dstack([value, alpha]))
        save_image(tmp_path / split / "opaque" / "a.png", np.dstack([value, np.full_like(alpha, 255)]))
        keyed = np.where(alpha == 0, 7, value.astype(np.uint16) * 257).astype(np.uint16)  # 16 bits, 7 transparent
        (tmp_path / split / "keyed").mkdir()
        Image.fromarray(keyed).save(tmp_path / split / "keyed" / "a.png", transparency=7)
    trained = load_source(folder_config(tmp_path), "train")
    assert trained.pixels.shape == (3, 1, 4, 6)
    assert trained.pixels[0, 0, 0].tolist() == [255, 255, 157, 157, 60, 60]  # 60·128/255 + 255·127/255 = 157.1
    assert trained.pixels[1, 0, 0].tolist() == [255, 255, 60, 60, 60, 60]  # classes grey, keyed, opaque
    assert (trained.pixels[2] == 60).all()


def test_a_folder_decoded_before_transparency_was_composited_is_not_taken_from_the_cache(tmp_path, monkeypatch):
    """An entry of the format before, holding RGBA images with their alpha dropped, is decoded again."""
    for split in ("train", "test"):
        for name, alpha in (("clear", 0), ("solid", 255)):
            save_image(tmp_path / split / name / "a.png", np.dstack([np.full((4, 4, 3), 30, np.uint8),
                                                                     np.full((4, 4), alpha, np.uint8)]))
    with monkeypatch.context() as old:
        old.setattr(image_folder, "CACHE_FORMAT", 4)
        old.setattr(image_folder, "decode_files", lambda paths, *args: [np.full((4, 4, 3), 30, np.uint8)] * len(paths))
        assert (load_source(folder_config(tmp_path), "train").pixels == 30).all()
    trained = load_source(folder_config(tmp_path), "train")
    assert (trained.pixels[0] == 255).all() and (trained.pixels[1] == 30).all()


@pytest.mark.parametrize("resize", ["crop", "stretch"])
def test_a_square_folder_image_gives_the_pixels_it_gave_before_resize_existed(tmp_path, resize):
    paths = photo_folder(tmp_path, shape=(24, 24, 3))
    trained = load_source(folder_config(tmp_path, image_size=(8, 8), resize=resize), "train")
    for path, pixels in zip(paths, trained.pixels):
        with Image.open(path) as image:
            before = np.asarray(image.convert("RGB").resize((8, 8), Image.Resampling.BILINEAR))
        assert np.array_equal(pixels, before.transpose(2, 0, 1))


def test_a_folder_decoded_with_one_resize_is_not_taken_from_the_cache_for_the_other(tmp_path, monkeypatch):
    photo_folder(tmp_path)
    stretched = load_source(folder_config(tmp_path, image_size=(12, 8), resize="stretch"), "train")
    decoded = []
    real_decode = image_folder.decode_files
    monkeypatch.setattr(image_folder, "decode_files",
                        lambda paths, *args: decoded.append(args) or real_decode(paths, *args))
    cropped = load_source(folder_config(tmp_path, image_size=(12, 8)), "train")
    assert decoded == [((12, 8), "crop", "auto")] and not np.array_equal(cropped.pixels, stretched.pixels)
    assert np.array_equal(load_source(folder_config(tmp_path, image_size=(12, 8), resize="stretch"), "train").pixels,
                          stretched.pixels) and len(decoded) == 1  # each kept in its own entry


def test_an_unknown_resize_given_from_python_is_refused_before_any_image_is_decoded(tmp_path):
    photo_folder(tmp_path)
    with pytest.raises(DataError, match=r"invalid data.resize 'fit': expected one of crop, stretch"):
        load_source(folder_config(tmp_path, image_size=(12, 8), resize="fit"), "train")


def test_the_decoded_folder_is_cached_and_a_changed_file_is_decoded_again(tmp_path, monkeypatch):
    for index in range(4):
        save_image(tmp_path / "train" / "a" / f"{index}.png", np.full((3, 3), index, np.uint8))
        save_image(tmp_path / "test" / "a" / f"{index}.png", np.full((3, 3), index, np.uint8))
    first = load_source(folder_config(tmp_path), "train")
    decoded = []
    real_decode = image_folder.decode_files
    monkeypatch.setattr(image_folder, "decode_files",
                        lambda paths, *args: decoded.append(paths) or real_decode(paths, *args))
    again = load_source(folder_config(tmp_path), "train")
    assert decoded == [] and np.array_equal(again.pixels, first.pixels)
    save_image(tmp_path / "train" / "a" / "0.png", np.full((3, 3), 77, np.uint8))
    os.utime(tmp_path / "train" / "a" / "0.png", ns=(1, 1))
    changed = load_source(folder_config(tmp_path), "train")
    assert len(decoded) == 1 and changed.pixels[0, 0, 0, 0] == 77


@pytest.mark.parametrize("array, offset", [("pixels", -1), ("labels", -8)])  # a pixel; a label's low byte
def test_a_bit_flipped_within_range_in_the_folder_cache_is_caught_warned_and_decoded_again(
        tmp_path, monkeypatch, caplog, array, offset):
    root = tmp_path / "photos"  # not tmp_path: the cache's folder there would be one more class
    for index in range(4):
        save_image(root / ("a" if index % 2 else "b") / f"{index}.png", np.full((3, 3), 10 * index, np.uint8))
    config = folder_config(root, test_fraction=0.25)
    first = load_source(config, "train")
    (entry,) = (tmp_path / "xdg-cache").rglob(f"*.{array}.npy")
    data = bytearray(entry.read_bytes())
    data[offset] ^= 1  # a pixel value 0..255, or a label 0 <-> 1 of the two classes: still in range
    entry.write_bytes(bytes(data))
    stored = np.load(entry)
    assert stored.min() >= 0 and stored.max() < (256 if array == "pixels" else 2), "the test proves nothing"
    decoded = []
    real_decode = image_folder.decode_files
    monkeypatch.setattr(image_folder, "decode_files",
                        lambda paths, *args: decoded.append(paths) or real_decode(paths, *args))
    with caplog.at_level("WARNING", logger=image_folder.logger.name):
        again = load_source(config, "train")
    assert len(decoded) == 1
    assert np.array_equal(again.pixels, first.pixels) and np.array_equal(again.labels, first.labels)
    assert [record.getMessage() for record in caplog.records if record.levelname == "WARNING"] == [
        f"ignoring the cache file {entry}: its contents do not match the checksum recorded when it was written "
        f"(damaged on disk); reading the source again"]
    load_source(config, "train")
    assert len(decoded) == 1  # rewritten


def test_a_folder_cache_entry_without_its_digests_is_decoded_again(tmp_path, monkeypatch):
    for split in ("train", "test"):
        for name in ("a", "b"):
            save_image(tmp_path / split / name / "0.png", np.zeros((3, 3), np.uint8))
    load_source(folder_config(tmp_path), "train")
    (digests,) = (tmp_path / "xdg-cache").rglob("*.json")
    digests.unlink()  # what a crash after writing the arrays leaves
    decoded = []
    monkeypatch.setattr(image_folder, "decode_files", lambda paths, *args: decoded.append(paths) or
                        [np.zeros((3, 3), np.uint8)] * len(paths))
    load_source(folder_config(tmp_path), "train")
    assert len(decoded) == 1 and digests.is_file()


@pytest.mark.parametrize("suffix", [".pixels.npy", ".labels.npy", ".json"])
def test_a_fifo_planted_as_a_folder_cache_file_is_ignored_promptly_and_replaced(tmp_path, monkeypatch, suffix):
    for split in ("train", "test"):
        for name in ("a", "b"):
            save_image(tmp_path / split / name / "0.png", np.full((3, 3), 40 if name == "a" else 90, np.uint8))
    first = load_source(folder_config(tmp_path), "train")
    (planted,) = (tmp_path / "xdg-cache").rglob(f"*{suffix}")
    plant(planted, "fifo")
    decoded = []
    real_decode = image_folder.decode_files
    monkeypatch.setattr(image_folder, "decode_files", lambda *args: decoded.append(args) or real_decode(*args))
    with within(5):
        again = load_source(folder_config(tmp_path), "train")
    assert len(decoded) == 1 and np.array_equal(again.pixels, first.pixels) and planted.is_file()
    assert np.array_equal(load_source(folder_config(tmp_path), "train").labels, first.labels) and len(decoded) == 1


def test_a_test_folder_with_a_class_training_lacks_is_named(tmp_path):
    save_image(tmp_path / "train" / "a" / "0.png", np.zeros((3, 3), np.uint8))
    save_image(tmp_path / "test" / "b" / "0.png", np.zeros((3, 3), np.uint8))
    with pytest.raises(DataError, match="test/b: a class the training folder does not have"):
        load_source(folder_config(tmp_path), "test")


def test_gzip_idx_family_file_written_here_is_not_mistaken_for_the_published_one(tmp_path, idx_tools):
    images, labels = idx_tools.fake_split(4)
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(idx_tools.idx_bytes(images)))
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_tools.idx_bytes(labels)))
    with pytest.raises(DataError, match="KMNIST expects 5c965bf0a639b31b8f53240b1b52f4d7"):
        load_source(DataConfig(dataset="kmnist", dir=str(tmp_path)), "test", download=False)


def test_16_bit_and_float_images_are_scaled_to_8_bits_as_predict_reads_them(tmp_path):
    gradient = np.arange(64, dtype=np.float32).reshape(8, 8) * 4  # 0 .. 252
    for split in ("train", "test"):
        for name, samples in (("deep", (gradient * 257).astype(np.uint16)), ("float", gradient / 255)):
            path = tmp_path / split / name / ("0.png" if name == "deep" else "0.tif")
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(samples).save(path)
    loaded = load_source(folder_config(tmp_path), "train")
    assert loaded.classes == ("deep", "float") and loaded.pixels.shape == (2, 1, 8, 8)
    assert np.abs(loaded.pixels.astype(int) - gradient.astype(int)).max() <= 1


@pytest.mark.parametrize("layout", ["one folder", "train and test folders"])
def test_a_class_folder_without_images_is_named(tmp_path, layout):
    root = tmp_path / "photos" if layout == "one folder" else tmp_path / "photos" / "train"
    for index in range(3):
        save_image(root / "a" / f"{index}.png", np.full((4, 4), index, np.uint8))
    (root / "b").mkdir()
    (root / "b" / "notes.txt").write_text("no image here\n")
    if layout != "one folder":
        save_image(tmp_path / "photos" / "test" / "a" / "0.png", np.zeros((4, 4), np.uint8))
    with pytest.raises(DataError, match=rf"^{root / 'b'}: a class folder without readable image files; add images "
                                        rf"to it or remove it$"):
        load_source(folder_config(tmp_path / "photos", test_fraction=0.34), "train")


def test_a_class_folder_name_that_is_not_printable_text_is_named(tmp_path):
    for name in ("cats", "dogs\nold"):
        save_image(tmp_path / "photos" / name / "0.png", np.zeros((4, 4), np.uint8))
    with pytest.raises(DataError, match=r"photos/'dogs\\nold': a class folder's name must be printable text \(no line "
                                        r"breaks or control characters\); rename it"):
        load_source(folder_config(tmp_path / "photos"), "train")
