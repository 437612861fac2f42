"""The reader's path for plain JPEGs and PNGs (packer.imaging.plain) gives Pillow's pixels, byte
for byte, or declines and leaves the file to Pillow."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from helpers import corpus_dir, encoded
from PIL import Image

from packer.imaging import decode as imaging
from packer.imaging import plain
from packer.imaging.jpeg_turbo import ENABLED as TURBO


def _pillow(data: bytes, mode: str) -> np.ndarray:
    """Pillow alone: open, load, EXIF transpose, convert (imaging.decode), as an array."""
    return imaging.to_array(imaging.decode(data, mode)[0])


def _photo(height: int, width: int, seed: int, channels: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (height // 4 + 1, width // 4 + 1, channels), dtype=np.uint8)
    return np.kron(base, np.ones((4, 4, 1), np.uint8))[:height, :width]


def _with_chunk(png: bytes, kind: bytes, body: bytes) -> bytes:
    """``png`` with a chunk inserted after IHDR (which ends at byte 33), its CRC right."""
    crc = zlib.crc32(kind + body)
    chunk = struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)
    return png[:33] + chunk + png[33:]


def _cases() -> dict[str, bytes]:
    rgb, grey = _photo(30, 20, 1), _photo(17, 33, 2, 1)[:, :, 0]
    cases = {
        "png rgb": encoded(Image.fromarray(rgb), "PNG"),
        "png grey": encoded(Image.fromarray(grey), "PNG"),
        "png interlaced": encoded(Image.fromarray(rgb), "PNG", interlace=1),
        "png palette": encoded(Image.fromarray(rgb).convert("P"), "PNG"),
        "png rgba": encoded(Image.fromarray(rgb).convert("RGBA"), "PNG"),
        "jpeg rgb": encoded(Image.fromarray(rgb), "JPEG", quality=90),
        "jpeg grey": encoded(Image.fromarray(grey), "JPEG"),
        "jpeg cmyk": encoded(Image.fromarray(rgb).convert("CMYK"), "JPEG"),
    }
    cases["png gamma"] = _with_chunk(cases["png rgb"], b"gAMA", struct.pack(">I", 45455))
    for orientation in range(1, 9):
        exif = Image.Exif()
        exif[0x0112] = orientation
        cases[f"jpeg exif {orientation}"] = encoded(Image.fromarray(rgb), "JPEG", exif=exif)
    return cases


CASES = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("mode", ["RGB", "L", "keep"])
def test_pixels_are_pillows_or_none(name: str, mode: str) -> None:
    data = CASES[name]
    pixels = plain.pixels(data, mode)
    if pixels is None:
        return
    expected = _pillow(data, mode)
    assert pixels.dtype == np.uint8 and pixels.flags.writeable and pixels.flags.c_contiguous
    np.testing.assert_array_equal(pixels, expected)


def test_the_common_files_take_the_fast_path() -> None:
    for name in ["png rgb", "png grey", "png interlaced", "png gamma"]:
        assert plain.pixels(CASES[name], "RGB") is not None, name
    assert plain.pixels(CASES["png palette"], "RGB") is None  # Pillow converts those
    assert plain.pixels(CASES["png rgba"], "RGB") is None
    for orientation in range(1, 9):
        found = plain.pixels(CASES[f"jpeg exif {orientation}"], "RGB")
        assert (found is not None) == TURBO


def test_damaged_and_foreign_bytes_are_left_to_pillow() -> None:
    png = CASES["png rgb"]
    assert plain.pixels(png[: len(png) // 2], "RGB") is None  # cut short
    broken = bytearray(png)
    broken[60] ^= 0xFF  # inside the image data
    found = plain.pixels(bytes(broken), "RGB")
    if found is not None:  # libpng read it: then Pillow must too, to the same pixels
        np.testing.assert_array_equal(found, _pillow(bytes(broken), "RGB"))
    assert plain.pixels(b"GIF89a" + bytes(40), "RGB") is None
    gif = io.BytesIO()
    Image.new("RGB", (4, 4)).save(gif, "GIF")
    assert plain.pixels(gif.getvalue(), "RGB") is None


def test_every_corpus_file_it_decodes_is_pillows() -> None:
    images = sorted(p for p in (corpus_dir() / "images").rglob("*") if p.is_file())
    decoded = 0
    for path in images:
        data = path.read_bytes()
        for mode in ("RGB", "keep"):
            pixels = plain.pixels(data, mode)
            if pixels is None:
                continue
            decoded += 1
            np.testing.assert_array_equal(pixels, _pillow(data, mode), err_msg=str(path))
    # The corpus files this path decodes are JPEGs, which it takes only with libjpeg-turbo.
    assert decoded > 0 or not TURBO


def test_pixel_limit_is_kept(tmp_path: Path) -> None:
    assert plain.pixels(CASES["png rgb"], "RGB", max_pixels=100) is None
