"""Resizing arrays (packer.imaging.resizing): geometry, fits, channels, and what the pixels look like."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer.imaging import resizing


@pytest.mark.parametrize(
    ("shape", "max_side", "size", "fit", "expected"),
    [
        ((200, 300), 100, None, "crop", (67, 100)),
        ((300, 200), 100, None, "crop", (100, 67)),
        ((40, 50), 100, None, "crop", (40, 50)),  # never enlarged
        ((200, 300), None, (32, 64), "crop", (32, 64)),
        ((200, 300), None, (32, 64), "pad", (32, 64)),
        ((200, 300), None, (32, 64), "stretch", (32, 64)),
        ((10, 12), None, (40, 30), "crop", (40, 30)),  # enlarged to an exact size
    ],
)
def test_geometry(
    shape: tuple[int, int],
    max_side: int | None,
    size: tuple[int, int] | None,
    fit: str,
    expected: tuple[int, int],
) -> None:
    pixels = np.full((*shape, 3), (200, 100, 50), np.uint8)
    out = resizing.resize(pixels, max_side, size, fit)
    assert out.shape == (*expected, 3) and out.dtype == np.uint8 and out.flags.c_contiguous
    kept = out[:, 8:-8] if fit == "pad" else out  # pad adds black bands at the sides
    assert (kept == (200, 100, 50)).all()  # a flat colour stays exactly that colour


def test_unchanged_pixels_are_returned_as_they_are() -> None:
    pixels = np.zeros((20, 30, 3), np.uint8)
    assert resizing.resize(pixels, max_side=30) is pixels
    assert resizing.resize(pixels, size=(20, 30)) is pixels


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
def test_every_channel_count_keeps_its_channels(channels: int) -> None:
    pixels = np.random.default_rng(channels).integers(0, 256, (30, 40, channels), np.uint8)
    for fit in resizing.FITS:
        assert resizing.resize(pixels, size=(10, 12), fit=fit).shape == (10, 12, channels)


def test_crop_keeps_the_centre_and_pad_centres_on_black() -> None:
    wide = np.zeros((100, 300, 3), np.uint8)
    wide[:, 100:200] = 255  # a white middle third between black thirds
    cropped = resizing.resize(wide, size=(50, 50), fit="crop")  # 150x50, then the centre
    assert (cropped == 255).all()
    padded = resizing.resize(np.full((50, 100, 3), 255, np.uint8), size=(100, 100), fit="pad")
    assert (padded[:25] == 0).all() and (padded[75:] == 0).all()  # black bands, top and bottom
    assert (padded[26:74] == 255).all()


def test_an_unknown_fit_is_refused() -> None:
    with pytest.raises(ValueError, match="fit must be one of crop, pad, stretch"):
        resizing.resize(np.zeros((4, 4, 3), np.uint8), size=(2, 2), fit="squash")


def _smooth(height: int, width: int) -> np.ndarray:
    """A photo-like image: a few low-frequency waves per channel."""
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    waves = [np.sin(7 * x + 3 * y), np.cos(5 * y - 2 * x), np.sin(4 * (x + y))]
    return np.clip(np.stack(waves, axis=2) * 100 + 128, 0, 255).astype(np.uint8)


@pytest.mark.parametrize("scale", [0.9, 0.62, 0.51, 0.3, 0.1])
def test_a_shrunk_image_matches_pillows_antialiased_resize(scale: float) -> None:
    """Within a grey level on average of Pillow's bilinear, whose filter widens with the
    shrink (what torchvision's Resize does to Pillow images), above and below 1/2."""
    pixels = _smooth(360, 355)
    out = resizing.resize(pixels, max_side=round(360 * scale))
    expected = np.asarray(Image.fromarray(pixels).resize(out.shape[1::-1], Image.BILINEAR))
    assert np.abs(out.astype(int) - expected).mean() < 1.0


def test_a_strong_shrink_averages_fine_detail_instead_of_sampling_it() -> None:
    """Below 1/2 every source pixel counts (a box average first): noise shrunk 8x has about
    1/8 of its spread left. A filter of fixed width (bilinear) samples a few pixels and keeps
    about 1/2."""
    noise = np.random.default_rng(0).integers(0, 256, (800, 800, 3), np.uint8)
    out = resizing.resize(noise, size=(100, 100))
    assert out.std() < noise.std() / 4


@pytest.mark.parametrize(("shape", "size"), [((360, 250), (224, 224)), ((120, 400), (64, 96))])
def test_crop_scales_the_centre_box_as_pillow_would(
    shape: tuple[int, int], size: tuple[int, int]
) -> None:
    """ "crop" scales only the centre box of the target's aspect ratio: Pillow's resize of that
    box (``box=``) gives the same image within a grey level."""
    pixels = _smooth(*shape)
    out = resizing.resize(pixels, size=size, fit="crop")
    (height, width), (h, w) = shape, size
    box_w, box_h = min(width, round(height * w / h)), min(height, round(width * h / w))
    left, top = (width - box_w) // 2, (height - box_h) // 2
    box = (left, top, left + box_w, top + box_h)
    expected = np.asarray(Image.fromarray(pixels).resize((w, h), Image.BILINEAR, box=box))
    assert out.shape == (h, w, 3) and np.abs(out.astype(int) - expected).mean() < 1.0


@pytest.mark.parametrize("channels", [2, 4])  # LA, RGBA
def test_a_transparent_pixels_colour_does_not_bleed_into_visible_ones(channels: int) -> None:
    """Colour is weighted by alpha while it is scaled, as Pillow weights it: shrinking opaque
    white beside transparent black gives white pixels of lower alpha at the edge, not grey."""
    pixels = np.zeros((40, 40, channels), np.uint8)
    pixels[:, :20] = 255  # opaque white; the right half is transparent black
    for size, fit in [((10, 13), "stretch"), ((13, 7), "crop"), ((27, 27), "pad")]:
        out = resizing.resize(pixels, size=size, fit=fit)
        alpha = out[:, :, -1]
        assert out.shape == (*size, channels) and ((alpha > 0) & (alpha < 255)).any()
        assert (out[:, :, :-1][alpha > 0] >= 254).all()  # every visible pixel stays white


def test_opencv_is_imported_by_a_reader_that_resizes_and_by_nothing_else(tmp_path: Path) -> None:
    """The CLI and a reader without ``size`` do not pay OpenCV's import (76 ms); a reader with
    ``size`` imports it as it opens, before its threads start (a fork during an import in
    another thread would leave the child a lock it can never take)."""
    pixels = np.random.default_rng(0).integers(0, 256, (30, 40, 3), np.uint8)
    (tmp_path / "images" / "a").mkdir(parents=True)
    Image.fromarray(pixels).save(tmp_path / "images" / "a" / "x.png")
    script = f"""
import sys
import packer.cli.commands
from packer import open_reader, PackOptions
from packer import pack
pack({str(tmp_path / "images")!r}, {str(tmp_path / "s.lmdb")!r}, PackOptions(workers=1))
assert "cv2" not in sys.modules, "imported by the CLI or a pack without a resize"
open_reader({str(tmp_path / "s.lmdb")!r}, batch_size=1).close()
assert "cv2" not in sys.modules, "imported by a reader without size"
reader = open_reader({str(tmp_path / "s.lmdb")!r}, batch_size=1, size=(8, 8))
assert "cv2" in sys.modules, "not imported before the reader's threads start"
reader.close()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
