"""Shrink or fit a height x width x channels uint8 array: OpenCV's SIMD resize, then a crop or
pad in NumPy.

Pillow's resize is a plain C convolution: shrinking a 360x355 photo to 224x224 took it 0.90 ms
(bilinear) and 1.41 ms (bicubic) on this project's machine, three times the libjpeg-turbo
decode of the same photo, and most of the cost of reading original files at a fixed size.
OpenCV's bilinear takes 0.12 ms (timed by hand; the README's reading benchmarks show the
effect on the reader). Its bilinear does not widen its filter when shrinking, so a scale
below 1/2 would alias; there ``INTER_AREA`` averages every source pixel instead. JPEGs reach
this step already reduced by a power of two in the decoder (``imaging.decode_resized``), so
the common case is a scale between 1/2 and 1.
"""

from __future__ import annotations

import functools
from types import ModuleType

import numpy as np

from packer.fork_gate import FORK_GATE

__all__ = ["FITS", "load", "resize", "resized_size"]

FITS = ("crop", "pad", "stretch")


@functools.cache
def _cv2() -> ModuleType:
    import cv2  # 76 ms: on first use, not in every `packer` command

    return cv2


def load() -> None:
    """Import OpenCV now, in this thread, before threads that resize start: a fork while
    another thread imports leaves the child a module lock no thread will release (see
    ``imaging.load_plugins``)."""
    with FORK_GATE:
        _cv2()


def resized_size(
    width: int, height: int, max_side: int | None, size: tuple[int, int] | None, fit: str
) -> tuple[int, int] | None:
    """The (width, height) ``resize`` scales to before any crop or pad; None if unchanged."""
    if size is not None:
        h, w = size
        if fit == "stretch":
            return (w, h)
        scale = (max if fit == "crop" else min)(w / width, h / height)
    elif max_side is not None and max(width, height) > max_side:
        scale = max_side / max(width, height)
    else:
        return None
    return (max(1, round(width * scale)), max(1, round(height * scale)))


def resize(
    pixels: np.ndarray,
    max_side: int | None = None,
    size: tuple[int, int] | None = None,
    fit: str = "crop",
) -> np.ndarray:
    """Shrink so the longest side is at most ``max_side``, or bring to an exact (height, width).

    ``fit`` for an exact size: "crop" scales to cover then keeps the centre, "pad" scales to
    fit then centres on black, "stretch" ignores the aspect ratio. Returns ``pixels`` itself
    when nothing changes, else a new contiguous array with as many channels.
    """
    if fit not in FITS:
        raise ValueError(f"fit must be one of {', '.join(FITS)}, not {fit!r}")
    height, width, channels = pixels.shape
    scaled = resized_size(width, height, max_side, size, fit)
    if scaled is not None and scaled != (width, height):
        cv2 = _cv2()
        shrink = min(scaled[0] / width, scaled[1] / height)
        method = cv2.INTER_AREA if shrink < 0.5 else cv2.INTER_LINEAR
        # OpenCV takes up to 4 channels, and returns a 2-D array for one.
        pixels = cv2.resize(np.ascontiguousarray(pixels), scaled, interpolation=method)
        pixels = pixels.reshape(scaled[1], scaled[0], channels)
    if size is None or fit == "stretch" or pixels.shape[:2] == size:
        return pixels
    height, width = size
    if fit == "crop":
        top, left = (pixels.shape[0] - height) // 2, (pixels.shape[1] - width) // 2
        return np.ascontiguousarray(pixels[top : top + height, left : left + width])
    canvas = np.zeros((height, width, channels), np.uint8)
    top, left = (height - pixels.shape[0]) // 2, (width - pixels.shape[1]) // 2
    canvas[top : top + pixels.shape[0], left : left + pixels.shape[1]] = pixels
    return canvas
