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
    """``pixels`` (height x width x channels) turned as Pillow's ``exif_transpose`` turns an
    image of EXIF ``orientation`` (1-8); a fresh contiguous array unless already upright."""
    steps = UPRIGHT_STEPS.get(orientation)
    if steps is None:
        return pixels
    for flip in steps:
        pixels = np.flip(pixels, flip) if flip else pixels.swapaxes(0, 1)
    return np.ascontiguousarray(pixels)


# EXIF orientation -> the steps that stand the stored image upright, in turn: a flip of
# these axes (0: rows, 1: columns), or () for a swap of rows and columns.
UPRIGHT_STEPS: dict[int, tuple[tuple[int, ...], ...]] = {
    2: ((1,),),  # mirrored
    3: ((0, 1),),  # upside down
    4: ((0,),),  # mirrored upside down
    5: ((),),  # transposed
    6: ((), (1,)),  # turned a quarter, clockwise to fix
    7: ((0, 1), ()),  # transverse
    8: ((), (0,)),  # turned a quarter, anticlockwise to fix
}
