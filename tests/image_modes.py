"""Image files of every mode Pillow decodes them to (RGB, RGBA and LA with partial transparency, L, 1,
P with transparent palette entries, CMYK, I;16 with a transparent grey value, I, F), in the train/ and
test/ folders of an image folder: what the tests of image-folder training and of prediction both read."""

import numpy as np
from PIL import Image

COLOUR_MODES = ("RGB", "RGBA", "P", "CMYK")
GREY_MODES = ("L", "LA", "1", "I;16", "I", "F")


def mode_image(mode: str, rng) -> tuple[Image.Image, str]:
    """A 30×50 image of ``mode`` with random samples (a partial transparency for RGBA, LA and P) and the
    suffix of a file format that keeps that mode."""
    colour, grey, alpha = (rng.integers(0, 256, shape, dtype=np.uint8) for shape in ((30, 50, 3), (30, 50), (30, 50)))
    alpha[:, :10], alpha[:, 10:20] = 0, 255  # transparent, opaque, then partial
    made = {
        "RGB": lambda: Image.fromarray(colour),
        "RGBA": lambda: Image.fromarray(np.dstack([colour, alpha]), "RGBA"),
        "LA": lambda: Image.fromarray(np.dstack([grey, alpha]), "LA"),
        "L": lambda: Image.fromarray(grey),
        "1": lambda: Image.fromarray(grey > 127),
        "P": lambda: Image.fromarray(colour).quantize(16),
        "CMYK": lambda: Image.fromarray(np.dstack([colour, grey]), "CMYK"),
        "I;16": lambda: Image.fromarray(grey.astype(np.uint16) * 256 + alpha),  # the low byte matters too
        "I": lambda: Image.fromarray(grey.astype(np.int32) * 257),
        "F": lambda: Image.fromarray(grey.astype(np.float32) / 255),
    }
    return made[mode](), ".tif" if mode in ("CMYK", "I", "F") else ".png"


def mode_folder(root, modes) -> list:
    """train/ and test/ folders with one class per mode, holding one image of that mode; the training
    images' paths in class order."""
    paths = []
    named = sorted((mode.replace(";", "_"), mode) for mode in modes)  # class folders, sorted as training sorts them
    for index, (name, mode) in enumerate(named):
        image, suffix = mode_image(mode, np.random.default_rng(index))
        for split in ("train", "test"):
            path = root / split / name / f"a{suffix}"
            path.parent.mkdir(parents=True)
            if mode == "P":  # a palette image whose entries are partly transparent (a PNG tRNS chunk)
                image.save(path, transparency=bytes(range(0, 256, 16)))
            elif mode == "I;16":  # a 16-bit grey image whose first pixel's value is transparent (tRNS)
                image.save(path, transparency=int(np.asarray(image)[0, 0]))
            else:
                image.save(path)
            with Image.open(path) as written:
                keyed = mode in ("P", "I;16")
                assert written.mode == mode and (not keyed or "transparency" in written.info), "the test proves nothing"
            if split == "train":
                paths.append(path)
    return paths
