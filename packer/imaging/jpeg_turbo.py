"""JPEG pixels decoded by libjpeg-turbo straight into a NumPy array (simplejpeg).

Pillow decodes a JPEG into its own four-bytes-per-pixel storage, and getting an array out
of that (``Image.tobytes``) copies every pixel twice with the GIL held. simplejpeg decodes
into the array itself, with the GIL released throughout: faster than Pillow on one thread
and more so on two (docs/benchmarks/components/decode-pool.md). It is the same
libjpeg-turbo with the same default DCT and upsampling, so the pixels are Pillow's, byte
for byte (tests/test_jpeg_turbo.py).

Only pixels come from here. Pillow still parses every header (format, size, mode, EXIF,
the pixel limit) and has the last word on any file this path declines or fails. Where
Pillow itself is built on another JPEG library (IJG's libjpeg 9 upsamples chroma its own
way), this path is off, so pixels never depend on which decoder ran; so it is where
simplejpeg has no wheel to install.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from PIL import features

try:
    import simplejpeg
except ImportError:  # a platform without its wheels (see pyproject): Pillow decodes everything
    simplejpeg = None

__all__ = ["ENABLED", "decode", "upright", "why_off"]

ENABLED = simplejpeg is not None and bool(features.check_feature("libjpeg_turbo"))


def why_off() -> str | None:
    """None where this path decodes JPEGs, else why Pillow decodes them all."""
    if simplejpeg is None:
        return "simplejpeg is not installed (no wheel for this platform)"
    if not ENABLED:
        return "Pillow is not built on libjpeg-turbo"
    return None


# (Pillow's mode of the file, the mode wanted) -> libjpeg-turbo's output colour space.
# Not L from colour: Pillow's RGB -> L weights are not libjpeg's luma channel. Not CMYK:
# Pillow inverts Adobe CMYK its own way.
_COLORSPACES = {("RGB", "RGB"): "RGB", ("L", "L"): "GRAY", ("L", "RGB"): "RGB"}


def decode(
    data: bytes | memoryview, file_mode: str, mode: str, reduced: tuple[int, int] | None = None
) -> np.ndarray | None:
    """A JPEG's pixels as height x width x channels uint8, as stored (not yet upright), or
    None where Pillow must decode it: a mode pair it would convert differently, or any
    error or warning from libjpeg (``strict``), such as a truncated file.

    ``reduced``: the (width, height) of a scaled decode (DCT scaling) that Pillow's draft
    would make; libjpeg-turbo picks the smallest scale that reaches it, which is that one.
    """
    colorspace = _COLORSPACES.get((file_mode, mode))
    if colorspace is None or not ENABLED:
        return None
    least = {} if reduced is None else {"min_width": reduced[0], "min_height": reduced[1]}
    try:
        return simplejpeg.decode_jpeg(data, colorspace, **least)
    except ValueError:
        return None


def upright(pixels: np.ndarray, orientation: int) -> np.ndarray:
    """``pixels`` turned as Pillow's ``exif_transpose`` turns an image of EXIF
    ``orientation`` (1-8); a fresh contiguous array unless already upright."""
    turn = _TURNS.get(orientation)
    return pixels if turn is None else np.ascontiguousarray(turn(pixels))


# EXIF orientation -> the view of the stored pixels that stands the image upright.
_TURNS: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    2: lambda p: p[:, ::-1],  # mirrored
    3: lambda p: p[::-1, ::-1],  # upside down
    4: lambda p: p[::-1],  # mirrored upside down
    5: lambda p: p.transpose(1, 0, 2),  # transposed
    6: lambda p: p.transpose(1, 0, 2)[:, ::-1],  # turned a quarter, clockwise to fix
    7: lambda p: p[::-1, ::-1].transpose(1, 0, 2),  # transverse
    8: lambda p: p.transpose(1, 0, 2)[::-1],  # turned a quarter, anticlockwise to fix
}
