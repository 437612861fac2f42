"""Shrink or fit a height x width x channels uint8 array: OpenCV's SIMD resize, then a crop or
pad in NumPy.

Pillow's resize is a plain C convolution: shrinking a photo to 224x224 took it longer than
libjpeg-turbo took to decode the photo, most of the cost of reading original files at a fixed
size; OpenCV's SIMD bilinear takes a fraction of that (benchmarks/bench_resize.py). Its
bilinear does not widen its filter when shrinking, so below a scale of 1/2 a box average by
a whole factor comes first (see ``_scaled``). JPEGs reach this step already reduced by a
power of two in the decoder (``imaging.decode_resized``), so the common case is a scale
between 1/2 and 1. Images with alpha (``mode="keep"``) are scaled with their colour weighted
by alpha, as Pillow scales them.
"""

from __future__ import annotations

import functools
from types import ModuleType

import numpy as np

from packer.fork_gate import FORK_GATE

__all__ = [
    "FITS",
    "load",
    "centre_box",
    "resize",
    "resized_size",
    "scale_to",
    "sample_box",
    "mirrored",
]

FITS = ("crop", "pad", "stretch")


@functools.cache
def _cv2() -> ModuleType:
    import cv2  # slow to import: on first use, not in every `packer` command

    # One thread per call: packer's callers already resize on every core (the reader's
    # decode threads, the pack's processes), and OpenCV's own pool threads spin between calls,
    # costing CPU that decoding needs (benchmarks/bench_augment.py --cpu shows it).
    # Process-wide, as OpenCV's setting is.
    cv2.setNumThreads(1)
    return cv2


def opencv() -> ModuleType:
    """The cv2 module, imported on first use under the fork gate (see ``load``)."""
    if _cv2.cache_info().currsize == 0:
        load()
    return _cv2()


def load() -> None:
    """Import OpenCV now, in this thread, before threads that resize start: a fork while
    another thread imports leaves the child a module lock no thread will release (see
    ``imaging.load_plugins``)."""
    with FORK_GATE:
        _cv2()


def resized_size(
    width: int, height: int, max_side: int | None, size: tuple[int, int] | None, fit: str
) -> tuple[int, int] | None:
    """The (width, height) the whole image scales to for ``resize``, before any pad (for
    "crop": the size that covers the target, of which ``resize`` scales only the centre);
    None if unchanged. JPEG decoding at a reduced scale never goes below it."""
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


def centre_box(height: int, width: int, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """What ``fit="crop"`` keeps of a ``height`` x ``width`` image: (top, left, height,
    width) of its centre at the aspect ratio of ``size`` (height, width)."""
    h, w = size
    box_h = max(1, min(height, round(width * h / w)))
    box_w = max(1, min(width, round(height * w / h)))
    return (height - box_h) // 2, (width - box_w) // 2, box_h, box_w


def resize(
    pixels: np.ndarray,
    max_side: int | None = None,
    size: tuple[int, int] | None = None,
    fit: str = "crop",
) -> np.ndarray:
    """Shrink so the longest side is at most ``max_side``, or bring to an exact (height, width).

    ``fit`` for an exact size: "crop" keeps the centre at the target's aspect ratio and scales
    it, "pad" scales to fit then centres on black, "stretch" ignores the aspect ratio. Returns
    ``pixels`` itself when nothing changes, else a new contiguous array with as many channels.
    """
    if fit not in FITS:
        raise ValueError(f"fit must be one of {', '.join(FITS)}, not {fit!r}")
    height, width, channels = pixels.shape
    if size is not None and fit == "crop":
        # The centre is cut out first: nothing is scaled only to be cut away.
        top, left, box_h, box_w = centre_box(height, width, size)
        if (box_h, box_w) != (height, width):
            pixels = pixels[top : top + box_h, left : left + box_w]
        return _scaled(pixels, (size[1], size[0]))
    scaled = resized_size(width, height, max_side, size, fit)
    if scaled is not None:
        pixels = _scaled(pixels, scaled)
    if size is None or fit == "stretch" or pixels.shape[:2] == size:
        return pixels
    canvas = np.zeros((*size, channels), np.uint8)
    top, left = (size[0] - pixels.shape[0]) // 2, (size[1] - pixels.shape[1]) // 2
    canvas[top : top + pixels.shape[0], left : left + pixels.shape[1]] = pixels
    return canvas


def scale_to(pixels: np.ndarray, to: tuple[int, int]) -> np.ndarray:
    """``pixels`` scaled to ``to`` (width, height) as ``resize`` scales (a box average by a
    whole factor first where it shrinks by more than half, then bilinear): itself if already
    that size and contiguous, else a new array."""
    return _scaled(pixels, to)


def _scaled(pixels: np.ndarray, to: tuple[int, int]) -> np.ndarray:
    """``pixels`` scaled to ``to`` (width, height): itself if it already is that size and
    contiguous, else a new array."""
    height, width, channels = pixels.shape
    if (width, height) == to:
        return np.ascontiguousarray(pixels)
    cv2 = _cv2()
    weighted = channels in (2, 4)  # LA, RGBA: colour weighted by alpha, as Pillow does
    if weighted:
        pixels = _premultiplied(pixels)
    # Bilinear alone would skip pixels below a scale of 1/2. There, first a box average by a
    # whole factor (OpenCV's fast case of INTER_AREA, where a general INTER_AREA is several
    # times slower; benchmarks/bench_resize.py): every pixel counts, and what is left is at
    # most a halving. The < factor pixels that do not fill a box are cut from the edges,
    # evenly.
    x, y = max(1, width // to[0]), max(1, height // to[1])
    if x > 1 or y > 1:
        top, left = height % y // 2, width % x // 2
        pixels = pixels[top : top + height - height % y, left : left + width - width % x]
        pixels = cv2.resize(pixels, (width // x, height // y), interpolation=cv2.INTER_AREA)
    # OpenCV reads views with strided rows as they are, takes up to 4 channels, and returns a
    # 2-D array for one.
    pixels = cv2.resize(pixels, to, interpolation=cv2.INTER_LINEAR).reshape(to[1], to[0], -1)
    return _unpremultiplied(pixels) if weighted else pixels


def sample_box(
    pixels: np.ndarray,
    origin: tuple[float, float],
    step: tuple[float, float],
    to: tuple[int, int],
) -> np.ndarray:
    """``to`` (width, height) pixels sampled bilinearly from ``pixels`` (1 or 3 channels), the
    output's pixel (x, y) covering the input's from ``origin`` + (x, y) * ``step``, in input
    pixels (fractions allowed): a resize of a region whose edges fall between pixels. Without
    a box average first, so for steps of at most 2. Edges beyond the image repeat its border."""
    cv2 = _cv2()
    (x0, y0), (sx, sy) = origin, step
    # The inverse map, pixel centres to pixel centres: out (x + 0.5) -> in x0 + (x + 0.5) * sx.
    matrix = np.array([[sx, 0.0, x0 + 0.5 * sx - 0.5], [0.0, sy, y0 + 0.5 * sy - 0.5]])
    flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
    out = cv2.warpAffine(pixels, matrix, to, flags=flags, borderMode=cv2.BORDER_REPLICATE)
    return out.reshape(to[1], to[0], -1)


def mirrored(pixels: np.ndarray) -> np.ndarray:
    """A new contiguous array of ``pixels`` mirrored left to right: OpenCV's flip, many times
    faster than NumPy's copy of the reversed view, whose strides are 3 bytes."""
    channels = pixels.shape[2]
    if channels > 4:
        return np.ascontiguousarray(pixels[:, ::-1])
    return _cv2().flip(pixels, 1).reshape(pixels.shape)


def _premultiplied(pixels: np.ndarray) -> np.ndarray:
    """Colour times alpha, as float32, with alpha: scaled so, the colour of a transparent
    pixel (often junk) cannot bleed into the visible pixels beside it."""
    alpha = pixels[:, :, -1:].astype(np.float32)
    return np.concatenate([pixels[:, :, :-1] * (alpha / 255), alpha], axis=2)


def _unpremultiplied(scaled: np.ndarray) -> np.ndarray:
    colour, alpha = scaled[:, :, :-1], scaled[:, :, -1:]
    colour = np.divide(colour * 255, alpha, out=np.zeros_like(colour), where=alpha > 0)
    return np.clip(np.rint(np.concatenate([colour, alpha], axis=2)), 0, 255).astype(np.uint8)
