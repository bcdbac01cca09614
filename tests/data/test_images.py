"""Image files -> MNIST-like inputs: formats, polarity, scale, centring, listing, refusals."""

import gzip
import io
import logging
import os
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile

from cudnnnet.data.images import IMAGE_SUFFIXES, fitted, list_images, load_image, load_photo, photo_pixels, preprocess
from cudnnnet.errors import ImageError

MNIST_TEST_IMAGES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "mnist" / "t10k-images-idx3-ubyte.gz"


def read_idx_images(path, count):
    """A few MNIST digits (count, 28, 28) uint8, read directly from the IDX file."""
    with gzip.open(path) as file:
        return np.frombuffer(file.read(), np.uint8, offset=16).reshape(-1, 28, 28)[:count]


@pytest.fixture(scope="module")
def mnist_digits():
    if not MNIST_TEST_IMAGES.exists():
        pytest.skip(f"MNIST test images not found at {MNIST_TEST_IMAGES}")
    return read_idx_images(MNIST_TEST_IMAGES, 50)


def drawn_digit():
    """A synthetic '7' with a cross-bar: ink 255 on 0, 90x70, off-centre, anti-aliased edges."""
    ink = np.zeros((90, 70), np.float32)
    ink[15:25, 10:60] = 1.0  # top bar
    for row in range(25, 80):  # slanted stroke
        col = 55 - (row - 25) * 30 // 55
        ink[row, col - 5 : col + 5] = 1.0
    ink[48:54, 25:50] = 1.0  # cross-bar
    blurred = np.asarray(Image.fromarray(ink * 255).convert("L").resize((70, 90), Image.Resampling.BILINEAR))
    return blurred  # uint8, bright digit on black


def black_on_white():
    return 255 - drawn_digit()


@pytest.fixture(scope="module")
def reference():
    """The grey black-on-white PNG's result: every format below must give (nearly) this."""
    return preprocess(Image.fromarray(black_on_white(), "L"))


def mad(a, b):
    return float(np.abs(np.asarray(a) - np.asarray(b)).mean())


def png_header_only(width, height):
    """A PNG announcing width x height (1-bit grey) with a few bytes of data: tiny on disk."""

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


# ---- MNIST's own digits come back as they were ---------------------------------------------


def test_mnist_digits_come_back_unchanged(tmp_path, mnist_digits):
    differences = []
    for index, digit in enumerate(mnist_digits):
        path = tmp_path / f"{index}.png"
        Image.fromarray(digit).save(path)
        differences.append(mad(load_image(path)[0], digit / 255.0))
    assert max(differences) < 0.05
    assert np.mean(differences) < 0.005


def test_size_32_pads_mnist_frame_by_two(tmp_path, mnist_digits):
    for index, digit in enumerate(mnist_digits[:10]):
        path = tmp_path / f"{index}.png"
        Image.fromarray(digit).save(path)
        padded = load_image(path, size=32)[0]
        assert padded.shape == (32, 32)
        assert mad(padded[2:30, 2:30], digit / 255.0) < 0.05
        assert padded[:2].max() == padded[30:].max() == padded[:, :2].max() == padded[:, 30:].max() == 0


def test_scaled_up_three_times_with_padding_gives_nearly_the_same(tmp_path, mnist_digits):
    differences = []
    for index, digit in enumerate(mnist_digits[:20]):
        big = Image.fromarray(255 - digit).resize((84, 84), Image.Resampling.NEAREST)
        page = Image.new("L", (150, 120), 255)
        page.paste(big, (40, 10))
        path = tmp_path / f"{index}.png"
        page.save(path)
        differences.append(mad(load_image(path)[0], digit / 255.0))
    assert max(differences) < 0.05
    assert np.mean(differences) < 0.02


# ---- formats and modes ---------------------------------------------------------------------


def rgb_blue_ink():
    grey = black_on_white().astype(np.float32) / 255.0
    paper, ink = np.array([250, 248, 240]), np.array([20, 30, 120])
    return Image.fromarray((grey[..., None] * paper + (1 - grey[..., None]) * ink).astype(np.uint8), "RGB")


def rgba_transparent_background():
    """Black ink whose opacity is the ink; transparent pixels are black too (alpha must be used)."""
    alpha = drawn_digit()
    rgba = np.zeros(alpha.shape + (4,), np.uint8)
    rgba[..., 3] = alpha
    return Image.fromarray(rgba, "RGBA")


def palette_with_transparency():
    image = Image.fromarray(black_on_white(), "L").convert("P")
    image.info["transparency"] = int(np.asarray(image)[0, 0])  # the background colour is transparent
    return image


def sixteen_bit():
    return Image.fromarray(black_on_white().astype(np.uint16) * 257)


def sixteen_bit_colour_key():
    """Ink on a background of one nearly black 16-bit value that a tRNS chunk makes transparent."""
    samples = black_on_white().astype(np.uint16) * 257
    samples[samples == 65535] = 1
    image = Image.fromarray(samples)
    image.info["transparency"] = 1
    return image


def grey_alpha():
    return Image.fromarray(black_on_white(), "L").convert("LA")


FORMATS = {
    "png-grey": (lambda: Image.fromarray(black_on_white(), "L"), "png", 1e-6),
    "png-rgb": (rgb_blue_ink, "png", 0.02),
    "png-rgba-transparent": (rgba_transparent_background, "png", 0.01),
    "png-la": (grey_alpha, "png", 1e-6),
    "png-palette": (lambda: Image.fromarray(black_on_white(), "L").convert("P"), "png", 0.01),
    "png-palette-transparent": (palette_with_transparency, "png", 0.02),
    "png-16-bit": (sixteen_bit, "png", 1e-4),
    "png-16-bit-transparent": (sixteen_bit_colour_key, "png", 1e-4),
    "png-bilevel": (lambda: Image.fromarray(black_on_white(), "L").convert("1"), "png", 0.06),
    "jpeg": (lambda: Image.fromarray(black_on_white(), "L"), "jpg", 0.02),
    "jpeg-rgb": (rgb_blue_ink, "jpeg", 0.03),
    "bmp": (lambda: Image.fromarray(black_on_white(), "L"), "bmp", 1e-6),
    "bmp-rgb": (rgb_blue_ink, "bmp", 0.02),
    "gif": (lambda: Image.fromarray(black_on_white(), "L"), "gif", 0.01),
    "tiff": (lambda: Image.fromarray(black_on_white(), "L"), "tiff", 1e-6),
}


@pytest.mark.parametrize("kind", FORMATS)
def test_every_format_and_mode_gives_the_same_digit(tmp_path, reference, kind):
    make, suffix, tolerance = FORMATS[kind]
    path = tmp_path / f"digit.{suffix}"
    make().save(path)
    result = load_image(path)
    assert result.shape == (1, 28, 28) and result.dtype == np.float32
    assert 0.0 <= result.min() and result.max() <= 1.0
    assert mad(result, reference) <= tolerance


def test_sixteen_bit_png_is_read_at_full_depth(tmp_path):
    path = tmp_path / "deep.png"
    sixteen_bit().save(path)
    with Image.open(path) as image:
        assert image.mode.startswith("I")
    assert load_image(path).max() == pytest.approx(1.0)


def test_light_and_dark_backgrounds_give_the_same_result(tmp_path):
    Image.fromarray(black_on_white(), "L").save(tmp_path / "dark-on-light.png")
    Image.fromarray(drawn_digit(), "L").save(tmp_path / "light-on-dark.png")
    dark_on_light = load_image(tmp_path / "dark-on-light.png")
    light_on_dark = load_image(tmp_path / "light-on-dark.png")
    assert mad(dark_on_light, light_on_dark) < 1e-6
    assert dark_on_light[0, 0].max() == 0.0  # the background becomes black


def test_grey_paper_background_is_subtracted():
    page = (0.3 * drawn_digit() + 120).astype(np.uint8)  # faint bright ink on mid-grey
    result = preprocess(page)
    assert result[0, :, 0].max() == 0.0
    assert result.max() == pytest.approx(1.0, abs=0.05)


# ---- geometry -------------------------------------------------------------------------------


def centre_of_mass(image):
    rows, cols = np.indices(image.shape)
    return (rows * image).sum() / image.sum(), (cols * image).sum() / image.sum()


def bounding_box_size(image, threshold=0.1):
    rows = np.flatnonzero((image > threshold).any(axis=1))
    cols = np.flatnonzero((image > threshold).any(axis=0))
    return rows[-1] - rows[0] + 1, cols[-1] - cols[0] + 1


@pytest.mark.parametrize("size", [28, 32])
def test_digit_fits_twenty_and_is_centred_by_mass(size):
    page = np.zeros((600, 800), np.uint8)
    page[40:240, 600:700] = 255  # a tall block far from the centre
    page[40:80, 560:760] = 255
    result = preprocess(page, size=size)[0]
    height, width = bounding_box_size(result)
    assert max(height, width) == 20
    row, col = centre_of_mass(result)
    assert abs(row - size / 2) <= 0.5 and abs(col - size / 2) <= 0.5


def test_aspect_ratio_is_kept():
    page = np.zeros((300, 300), np.uint8)
    page[50:250, 140:160] = 255  # 200 tall, 20 wide
    height, width = bounding_box_size(preprocess(page)[0])
    assert height == 20 and width in (2, 3)


def test_small_digit_is_enlarged_to_twenty():
    page = np.zeros((100, 100), np.uint8)
    page[45:55, 47:52] = 255
    height, width = bounding_box_size(preprocess(page)[0])
    assert height == 20 and 9 <= width <= 11


def test_normalize_applies_mean_and_std():
    plain = preprocess(drawn_digit())
    normalized = preprocess(drawn_digit(), normalize=(0.1307, 0.3081))
    np.testing.assert_allclose(normalized, (plain - 0.1307) / 0.3081, rtol=1e-6)


@pytest.mark.parametrize("normalize", [(0.5, 0.0), (0.5,), "ab"])
def test_invalid_normalize_is_refused(normalize):
    with pytest.raises(ValueError, match="invalid normalize"):
        preprocess(drawn_digit(), normalize=normalize)


@pytest.mark.parametrize("size", [19, 0, 28.0, True])
def test_invalid_size_is_refused(size):
    with pytest.raises(ValueError, match="invalid image size"):
        preprocess(drawn_digit(), size=size)


# ---- in-memory inputs ----------------------------------------------------------------------


def test_arrays_and_pil_images_agree(reference):
    grey = black_on_white()
    assert mad(preprocess(grey), reference) < 1e-6
    assert mad(preprocess(grey.astype(np.float32) / 255.0), reference) < 1e-6
    assert mad(preprocess(grey[None]), reference) < 1e-6
    assert mad(preprocess(np.asarray(rgb_blue_ink())), reference) < 0.02
    assert mad(preprocess(np.asarray(rgba_transparent_background())), reference) < 0.01
    assert mad(preprocess(rgba_transparent_background()), reference) < 0.01


@pytest.mark.parametrize("array", [np.zeros((4, 4, 2)), np.zeros((0, 5)), np.array([["a"]]), np.full((5, 5), np.nan)])
def test_arrays_that_are_not_images_are_refused(array):
    with pytest.raises(ImageError, match="<array>"):
        preprocess(array)


GRADIENT = np.arange(64, dtype=np.float32).reshape(8, 8) * 4  # 0 .. 252


@pytest.mark.parametrize("mode, samples", [("F", GRADIENT / 255), ("I;16", GRADIENT * 257), ("I", GRADIENT)],
                         ids=["float in [0, 1]", "16-bit", "32-bit integers"])
def test_photos_of_16_bit_and_float_samples_read_as_their_8_bit_image(tmp_path, mode, samples):
    path = tmp_path / "photo.tif"
    image = Image.fromarray(samples.astype(np.uint16 if mode == "I;16" else np.int32 if mode == "I" else np.float32))
    assert image.mode == mode
    image.save(path)
    for channels in (1, 3):
        pixels = load_photo(path, channels, 8, 8)
        assert pixels.shape == (channels, 8, 8) and pixels.dtype == np.uint8
        assert np.abs(pixels.astype(int) - GRADIENT.astype(int)).max() <= 1


def test_a_16_bit_grey_png_s_transparent_value_is_white_in_a_photo(tmp_path):
    """A tRNS chunk's grey value is transparent, composited on white as any other transparency (it was
    dropped with the 16 bits: the transparent samples kept their stored grey)."""
    Image.fromarray(np.array([[1000, 30000], [1000, 65535]], np.uint16)).save(tmp_path / "deep.png", transparency=1000)
    with Image.open(tmp_path / "deep.png") as image:
        assert image.mode == "I;16" and image.info["transparency"] == 1000, "the test proves nothing"
    assert load_photo(tmp_path / "deep.png", 1, 2, 2)[0].tolist() == [[255, 117], [255, 255]]
    assert load_photo(tmp_path / "deep.png", 3, 2, 2)[:, 0, 0].tolist() == [255, 255, 255]


def test_32_bit_samples_above_16_bits_are_white_in_a_photo_not_wrapped_around(tmp_path):
    """70000 / 65535 · 255 is 272: cast to 8 bits it had become 16, nearly black."""
    Image.fromarray(np.array([[0, 32768, 65535, 70000, 2**31 - 1]], np.int32)).save(tmp_path / "deep.tif")
    assert load_photo(tmp_path / "deep.tif", 1, 1, 5)[0, 0].tolist() == [0, 128, 255, 255, 255]


def test_a_float_photo_with_nan_samples_is_refused(tmp_path):
    samples = np.full((8, 8), 0.5, np.float32)
    samples[2, 3] = np.nan
    Image.fromarray(samples, "F").save(tmp_path / "nan.tif")
    with pytest.raises(ImageError, match=r"nan\.tif: the image holds NaN or infinite values \(1 of its 64 samples\); "
                                         r"an image holds finite values only"):
        load_photo(tmp_path / "nan.tif", 3, 8, 8)


@pytest.mark.parametrize("suffix", [".tif", ".pfm"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_float_images_with_non_finite_samples_are_refused(tmp_path, suffix, value):
    samples = np.zeros((28, 28), np.float32)
    samples[6:22, 12:16] = 1.0
    samples[3, 4] = value
    path = tmp_path / f"float{suffix}"
    Image.fromarray(samples, mode="F").save(path)
    with pytest.raises(ImageError, match=rf"float\{suffix}: the image holds NaN or infinite values \(1 of its 784 samples\)"):
        load_image(path)
    samples[3, 4] = 0.0
    Image.fromarray(samples, mode="F").save(path)
    assert np.isfinite(load_image(path)).all()


def test_preprocess_refuses_other_types():
    with pytest.raises(TypeError, match="list"):
        preprocess([[0, 1]])


# ---- listing --------------------------------------------------------------------------------


def test_list_images_expands_folders_and_keeps_named_files(tmp_path):
    folder = tmp_path / "digits"
    folder.mkdir()
    for name in ["b.png", "a.JPG", "c.bmp", "notes.txt", ".hidden", "._b.png"]:  # ._b.png: a Mac's metadata
        (folder / name).write_bytes(b"x")
    (folder / "sub.png").mkdir()  # a folder named like an image is not an image
    named, hidden = tmp_path / "scan.dat", tmp_path / ".named.png"
    named.write_bytes(b"x")
    hidden.write_bytes(b"x")
    listed = list_images([folder, str(named), hidden, tmp_path / "missing.png"])
    assert listed == [folder / "a.JPG", folder / "b.png", folder / "c.bmp", named, hidden, tmp_path / "missing.png"]
    assert list_images(str(folder)) == listed[:3]


def test_list_images_of_empty_folder_is_empty(tmp_path, caplog):
    assert list_images([tmp_path]) == []
    assert "no image files" in caplog.text


def test_suffixes_cover_the_common_formats():
    assert {".png", ".jpg", ".jpeg", ".bmp"} <= IMAGE_SUFFIXES


# ---- refusals -------------------------------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(ImageError, match=r"missing\.png: no such file"):
        load_image(tmp_path / "missing.png")


def test_a_link_to_nothing_or_in_a_loop_is_named_as_such(tmp_path):
    """Both were 'no such file', of a name the user sees listed."""
    (tmp_path / "gone.png").symlink_to("nothing.png")
    (tmp_path / "loop.png").symlink_to("loop.png")
    with pytest.raises(ImageError, match=r"gone\.png: a symbolic link to nothing\.png, which does not exist or is a "
                                         r"link in a loop"):
        load_image(tmp_path / "gone.png")
    with pytest.raises(ImageError, match=r"loop\.png: a symbolic link to loop\.png, which does not exist"):
        load_photo(tmp_path / "loop.png", 3, 8, 8)


def test_folder_instead_of_file(tmp_path):
    with pytest.raises(ImageError, match="is a folder"):
        load_image(tmp_path)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.png"
    path.write_bytes(b"")
    with pytest.raises(ImageError, match=r"empty\.png: the file is empty \(0 bytes\)"):
        load_image(path)


def test_a_pipe_or_device_is_not_called_empty(tmp_path):
    pipe = tmp_path / "digit.png"
    os.mkfifo(pipe)
    for path in (pipe, Path(os.devnull)):
        with pytest.raises(ImageError, match=rf"{path.name}: not a regular file \(a pipe or a device\); give an "
                                             rf"image file"):
            load_image(path)


def test_non_image_file(tmp_path):
    path = tmp_path / "notes.png"
    path.write_text("this is not a picture of a digit\n")
    with pytest.raises(ImageError, match=r"notes\.png: not an image file Pillow can read"):
        load_image(path)


def test_truncated_image(tmp_path):
    path = tmp_path / "cut.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (200, 200), dtype=np.uint8)).save(path)
    path.write_bytes(path.read_bytes()[:2000])
    with pytest.raises(ImageError, match=r"cut\.png: cannot decode the image"):
        load_image(path)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Image.new("L", (1, 1), 0),
        lambda: Image.new("L", (1, 1), 255),
        lambda: Image.new("RGB", (64, 48), (255, 255, 255)),
        lambda: Image.new("L", (64, 48), 128),
        lambda: Image.new("RGBA", (64, 48), (0, 0, 0, 0)),
    ],
    ids=["1-pixel-black", "1-pixel-white", "blank-white", "uniform-grey", "fully-transparent"],
)
def test_image_without_digit(tmp_path, make):
    path = tmp_path / "blank.png"
    make().save(path)
    with pytest.raises(ImageError, match=r"blank\.png: no digit found"):
        load_image(path)


def test_noisy_blank_jpeg_has_no_digit(tmp_path):
    noise = np.random.default_rng(0).normal(240, 3, (60, 80)).clip(0, 255).astype(np.uint8)
    path = tmp_path / "paper.jpg"
    Image.fromarray(noise).save(path)
    with pytest.raises(ImageError, match="no digit found"):
        load_image(path)


@pytest.fixture
def decoding_forbidden(monkeypatch):
    """Fail the test if any pixel data is decoded."""

    def refuse(self, *args, **kwargs):
        raise AssertionError(f"decoded a {self.size} image")

    monkeypatch.setattr(ImageFile.ImageFile, "load", refuse)


def test_huge_image_is_refused_from_its_header(tmp_path, decoding_forbidden):
    path = tmp_path / "huge.png"
    path.write_bytes(png_header_only(20_000, 20_000))
    assert path.stat().st_size < 200
    with pytest.raises(ImageError, match=r"huge\.png: the image is too large"):
        load_image(path)


def test_image_above_the_limit_is_refused_before_decoding(tmp_path, decoding_forbidden):
    path = tmp_path / "large.png"
    path.write_bytes(png_header_only(10_000, 6_000))  # 60 megapixels: below Pillow's own limit
    with pytest.raises(ImageError, match=r"large\.png: the image is 10000x6000 .* limit of 50 megapixels"):
        load_image(path)


def test_pixel_limit_is_configurable(tmp_path):
    path = tmp_path / "digit.png"
    Image.fromarray(black_on_white(), "L").save(path)
    with pytest.raises(ImageError, match="larger than the limit"):
        load_image(path, max_pixels=1000)
    assert load_image(path, max_pixels=70 * 90).shape == (1, 28, 28)


def test_error_messages_are_one_line(tmp_path):
    path = tmp_path / "cut.png"
    Image.fromarray(np.zeros((50, 50), np.uint8)).save(path)
    path.write_bytes(path.read_bytes()[:60])
    with pytest.raises(ImageError) as error:
        load_image(path)
    assert "\n" not in str(error.value) and str(path) in str(error.value)


@pytest.mark.parametrize("height, width, target", [(40, 90, (16, 16)), (90, 40, (8, 12)), (7, 5, (32, 32)),
                                                   (64, 64, (16, 16)), (30, 31, (30, 20)), (1, 4000, (16, 16))])
def test_a_photo_is_its_centre_crop_of_the_resized_image(tmp_path, height, width, target):
    """Only the crop is resampled, but what predict reads is the centre of the whole image resized so its
    shorter side covers the input (bilinear), within one level of rounding."""
    samples = np.random.default_rng(height * width).integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(samples).save(tmp_path / "photo.png")
    out_height, out_width = target
    scale = max(out_height / height, out_width / width)
    covering = (max(out_width, round(width * scale)), max(out_height, round(height * scale)))
    resized = np.asarray(Image.fromarray(samples).resize(covering, Image.Resampling.BILINEAR), dtype=int)
    left, top = (covering[0] - out_width) // 2, (covering[1] - out_height) // 2
    expected = resized[top:top + out_height, left:left + out_width].transpose(2, 0, 1)
    pixels = load_photo(tmp_path / "photo.png", 3, out_height, out_width)
    assert pixels.shape == (3, out_height, out_width)
    assert np.abs(pixels.astype(int) - expected).max() <= 1


@pytest.mark.parametrize("side, target", [(64, 16), (20, 20), (7, 32)])
@pytest.mark.parametrize("resize", ["crop", "stretch"])
def test_a_square_photo_into_a_square_input_is_the_plain_resize_either_way(tmp_path, side, target, resize):
    """What image-folder training (stretch) and predict (crop) made of a square image before either
    could be chosen: both the whole image resized (bilinear), to the last pixel."""
    samples = np.random.default_rng(side).integers(0, 256, (side, side, 3), dtype=np.uint8)
    Image.fromarray(samples).save(tmp_path / "square.png")
    plain = np.asarray(Image.fromarray(samples).resize((target, target), Image.Resampling.BILINEAR))
    assert np.array_equal(load_photo(tmp_path / "square.png", 3, target, target, resize=resize),
                          plain.transpose(2, 0, 1))


@pytest.mark.parametrize("height, width, target", [(40, 90, (16, 16)), (90, 40, (8, 12)), (6, 8, (8, 6))])
def test_stretch_resizes_the_whole_photo_and_crop_keeps_its_aspect_ratio(height, width, target):
    samples = np.random.default_rng(height).integers(0, 256, (height, width), dtype=np.uint8)
    image = Image.fromarray(samples)
    out_height, out_width = target
    stretched = np.asarray(fitted(image, out_height, out_width, "stretch"))
    assert np.array_equal(stretched, np.asarray(image.resize((out_width, out_height), Image.Resampling.BILINEAR)))
    cropped = np.asarray(fitted(image, out_height, out_width, "crop"))
    assert cropped.shape == stretched.shape == target and not np.array_equal(cropped, stretched)
    assert np.array_equal(photo_pixels(samples, 1, out_height, out_width, resize="stretch")[0], stretched)
    assert np.array_equal(photo_pixels(samples, 1, out_height, out_width)[0], cropped)  # crop: the default


def test_an_unknown_resize_is_refused_naming_the_valid_ones():
    with pytest.raises(ValueError, match=r"invalid resize 'fit': expected one of crop, stretch"):
        fitted(Image.new("L", (4, 3)), 2, 2, "fit")


def jpeg_with_corrupt_exif(path: Path, samples: np.ndarray) -> Path:
    """A JPEG whose EXIF block declares more entries than it holds (as some editors write them)."""
    exif = Image.Exif()
    exif[0x0112] = 1  # orientation: upright
    buffer = io.BytesIO()
    Image.fromarray(samples).save(buffer, "JPEG", exif=exif.tobytes(), quality=100)
    data = bytearray(buffer.getvalue())
    ifd = data.find(b"Exif\x00\x00") + 6 + 8  # after the TIFF header: the first IFD's entry count
    data[ifd:ifd + 2] = b"\x30\x30"
    path.write_bytes(bytes(data))
    return path


def test_pillow_s_warnings_about_an_image_are_logged_not_printed(tmp_path, caplog):
    """A corrupt EXIF block made Pillow print a two-line UserWarning (with its own source path) to
    stderr for each read, even under --quiet; the image is read all the same."""
    digit = np.zeros((28, 28), np.uint8)
    digit[6:22, 12:16] = 255
    path = jpeg_with_corrupt_exif(tmp_path / "digit.jpg", digit)
    caplog.set_level(logging.DEBUG, logger="cudnnnet.data.images")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning that escapes fails the test
        assert load_image(path).shape == (1, 28, 28)
        assert load_photo(path, 3, 8, 8).shape == (3, 8, 8)
    assert f"{path}: Corrupt EXIF data" in caplog.text


def test_a_photo_array_is_read_as_preprocess_reads_an_array():
    """Floats in [0, 1] were cast to uint8 (0 or 1: a black photo), 16-bit and larger integers wrapped."""
    pixels = np.random.default_rng(0).integers(0, 256, (12, 10, 3), dtype=np.uint8)
    expected = photo_pixels(pixels, 3, 8, 8)
    for same in (pixels / 255, (pixels / 255).astype(np.float32), pixels.astype(np.float64),
                 pixels.astype(np.uint16) * 257):
        assert np.array_equal(photo_pixels(same, 3, 8, 8), expected), same.dtype
    grey = pixels[..., 0]
    assert np.array_equal(photo_pixels(grey[None], 1, 8, 8), photo_pixels(grey, 1, 8, 8))
    assert np.array_equal(photo_pixels(grey[..., None] > 127, 1, 8, 8), photo_pixels((grey > 127) * 255, 1, 8, 8))


@pytest.mark.parametrize("array, pattern", [
    (np.full((8, 8), np.nan), r"<array>: the image holds NaN or infinite values \(64 of its 64 samples\)"),
    (np.array([[None] * 8] * 8), r"<array>: cannot read an array of dtype object as an image"),
    (np.ones((8, 8), complex), r"<array>: cannot read an array of dtype complex128 as an image"),
    (np.zeros((1, 1, 1, 8, 8)), r"<array>: cannot read an array of shape \(1, 1, 1, 8, 8\) as an image"),
    (np.zeros((0, 8)), r"<array>: cannot read an array of shape \(0, 8\)"),
], ids=["NaN", "objects", "complex", "five dimensions", "empty"])
def test_a_photo_array_that_is_no_image_is_an_image_error(array, pattern):
    with pytest.raises(ImageError, match=pattern):
        photo_pixels(array, 3, 8, 8)
