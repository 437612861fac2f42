"""The Pillow policy: upright pixels, 8-bit modes, bomb refusal, reduced-scale JPEG decoding."""

from __future__ import annotations

import io
from functools import partial

import numpy as np
import pytest
from helpers import EXIF_DISPLAY, image_bytes
from PIL import Image

from packer.imaging import decode as imaging
from packer.imaging import resizing


def _with_orientation(pixels: np.ndarray, orientation: int, fmt: str = "PNG") -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt, exif=exif)
    return out.getvalue()


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_gives_upright_pixels(orientation: int) -> None:
    stored = np.random.default_rng(orientation).integers(0, 256, (5, 9, 3), dtype=np.uint8)
    data = _with_orientation(stored, orientation)
    im, info = imaging.decode(data)
    expected = EXIF_DISPLAY[orientation](stored)
    assert np.array_equal(imaging.to_array(im), expected)
    assert (info.height, info.width) == expected.shape[:2]
    assert imaging.probe(data).height == expected.shape[0]  # header only, same geometry


def test_sixteen_bit_grey_is_scaled_not_clipped() -> None:
    values = np.array([[0, 255, 256, 1024], [4095, 32768, 65280, 65535]], dtype=np.uint16)
    out = io.BytesIO()
    Image.fromarray(values).save(out, "PNG")  # uint16 -> a 16-bit grey PNG
    im, info = imaging.decode(out.getvalue(), "L")
    assert info.mode in ("I;16", "I")
    assert np.array_equal(np.asarray(im), (values >> 8).astype(np.uint8))


@pytest.mark.parametrize(
    ("make", "kept"),
    [
        (lambda: Image.new("1", (4, 4), 1), "L"),
        (lambda: Image.new("LA", (4, 4), (9, 200)), "LA"),
        (lambda: Image.new("RGBA", (4, 4), (1, 2, 3, 4)), "RGBA"),
        (lambda: Image.new("CMYK", (4, 4), (0, 255, 0, 0)), "RGB"),
        (lambda: Image.new("P", (4, 4), 0), "RGB"),
    ],
)
def test_modes(make: object, kept: str) -> None:
    im = make()  # type: ignore[operator]
    assert imaging.normalize_mode(im, "keep").mode == kept
    assert imaging.normalize_mode(im, "RGB").mode == "RGB"
    assert imaging.normalize_mode(im, "L").mode == "L"
    assert imaging.output_mode(im.mode, False, "keep") == kept


def test_palette_with_transparency_keeps_alpha() -> None:
    im = Image.new("P", (2, 2), 0)
    im.putpalette([10, 20, 30] * 256)
    im.info["transparency"] = 0
    out = io.BytesIO()
    im.save(out, "PNG")
    decoded, info = imaging.decode(out.getvalue(), "keep")
    assert decoded.mode == "RGBA" and info.has_transparency
    assert imaging.to_array(decoded)[0, 0].tolist() == [10, 20, 30, 0]


def test_bomb_refused_before_decoding() -> None:
    data = image_bytes((100, 50), "PNG")
    with pytest.raises(
        ValueError,
        match=r"decompression bomb refused: 5,000 pixels \(100x50\) is over the limit of 4,999",
    ):
        imaging.decode(data, max_pixels=4_999)
    with pytest.raises(ValueError, match="decompression bomb"):
        imaging.probe(data, max_pixels=4_999)
    assert imaging.decode(data, max_pixels=5_000)[0].size == (100, 50)


def test_truncated_jpeg_passes_probe_but_not_decode() -> None:
    data = image_bytes((64, 64), "JPEG")[:-200]
    assert imaging.probe(data).width == 64
    with pytest.raises(OSError, match="truncated"):
        imaging.decode(data)


def test_jpeg_draft_decodes_at_reduced_scale_but_not_below_target() -> None:
    data = image_bytes((800, 600), "JPEG")
    shrink = partial(resizing.resized_size, max_side=150, size=None, fit="crop")
    im, info = imaging.decode(data, shrink_to=shrink)
    assert (info.width, info.height) == im.size
    assert im.width < 800 and im.width >= 150 and im.height >= 113
    turned = _with_orientation(np.zeros((600, 800, 3), np.uint8), 6, "JPEG")
    im, _ = imaging.decode(turned, shrink_to=shrink)
    assert im.height > im.width and im.height >= 150 and im.width >= 113


def test_encode_formats_round_trip() -> None:
    im = Image.new("RGBA", (8, 6), (10, 20, 30, 128))
    assert Image.open(io.BytesIO(imaging.encode(im, "png"))).mode == "RGBA"
    assert Image.open(io.BytesIO(imaging.encode(im, "jpeg"))).mode == "RGB"
    assert Image.open(io.BytesIO(imaging.encode(im, "webp"))).format == "WEBP"
    with pytest.raises(ValueError, match="unknown encoding 'gif'"):
        imaging.encode(im, "gif")
