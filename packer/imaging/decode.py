"""Pillow policy, in one place: how a file becomes an upright image of a known mode.

Rules (see shared RELIABILITY-NOTES, Pillow section):
- only a full ``load()`` proves an image decodes; ``verify()`` passes truncated JPEGs;
- a fresh ``Image.open`` per attempt, and any exception from open, EXIF or load is final;
- images over ``max_pixels`` are refused after reading the header, before any decode;
- truncated files are never padded (``LOAD_TRUNCATED_IMAGES`` is never turned on);
- EXIF orientation is applied whenever pixels are decoded; multi-frame files give frame 0;
- 16-bit and 32-bit grey is scaled to 8 bits (Pillow's ``convert`` would clip it);
- converting to RGB or L drops an alpha channel, as ``convert`` does (torchvision does the same).
"""

from __future__ import annotations

import functools
import io
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps

from packer.fork_gate import FORK_GATE
from packer.imaging import cropping, jpeg_turbo, resizing

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "MODES",
    "ImageInfo",
    "orientation",
    "probe",
    "verify",
    "decode",
    "decode_array",
    "decoded_shape",
    "CHANNELS",
    "output_mode",
    "normalize_mode",
    "decode_resized",
    "decode_placed",
    "from_array",
    "encode",
    "to_array",
    "load_plugins",
]

DEFAULT_MAX_PIXELS = Image.MAX_IMAGE_PIXELS or 89_478_485  # Pillow's own warning threshold
MODES = ("RGB", "L", "keep")
_KEPT_MODES = {"L", "LA", "RGB", "RGBA"}
# Every format Pillow can open, except EPS, which runs Ghostscript on untrusted input.
_BLOCKED_FORMATS = {"EPS"}
_EXIF_ORIENTATION = 0x0112
_EXIF_IN_HEADER = {"JPEG", "MPO", "TIFF", "WEBP"}

Source = bytes | memoryview | str | os.PathLike[str]


@dataclass(frozen=True, slots=True)
class ImageInfo:
    format: str  # Pillow's format name: "JPEG", "PNG", ...
    height: int  # upright, after EXIF orientation
    width: int
    mode: str  # Pillow's mode of the file
    has_transparency: bool = False


@functools.cache
def _formats() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the common formats, every allowed one). Trying the common ones first spares each
    open a walk through every plugin, under the GIL, before it reaches JPEG or PNG."""
    Image.init()
    allowed = tuple(f for f in Image.OPEN if f not in _BLOCKED_FORMATS)
    return tuple(f for f in ("JPEG", "PNG", "WEBP") if f in allowed), allowed


def load_plugins() -> None:
    """Import every Pillow plugin now, in this thread. Pillow imports them on first use, and
    an import under way in another thread when the process forks leaves the child a module
    lock that no thread of it will ever release: its first decode would hang. A fork waits
    for the imports (FORK_GATE)."""
    with FORK_GATE:
        _formats()


def _open(source: Source, max_pixels: int) -> Image.Image:
    def file() -> io.BytesIO | str | os.PathLike[str]:
        return io.BytesIO(source) if isinstance(source, (bytes, memoryview)) else source

    common, allowed = _formats()
    try:
        try:
            im = Image.open(file(), formats=common)
        except Image.UnidentifiedImageError:
            im = Image.open(file(), formats=allowed)
    except Image.DecompressionBombError as e:  # Pillow's own limit, twice MAX_IMAGE_PIXELS
        found = re.search(r"\((\d+) pixels\)", str(e))
        pixels = f"{int(found.group(1)):,} pixels" if found else "its size"
        raise ValueError(
            f"decompression bomb refused: {pixels} is over the limit of {max_pixels:,} (--max-pixels)"
        ) from None
    width, height = im.size
    if width <= 0 or height <= 0:
        raise ValueError(f"image has no pixels ({width}x{height})")
    if width * height > max_pixels:
        raise ValueError(
            f"decompression bomb refused: {width * height:,} pixels ({width}x{height}) "
            f"is over the limit of {max_pixels:,} (--max-pixels)"
        )
    return im


def _orientation(im: Image.Image) -> int:
    """EXIF orientation, read without decoding pixels: Pillow's ``getexif`` loads a whole PNG
    to find an eXIf chunk after the image data, so only header EXIF is looked at there."""
    try:
        if im.format in _EXIF_IN_HEADER:
            exif = im.getexif()
        elif "exif" in im.info:
            exif = Image.Exif()
            exif.load(im.info["exif"])
        else:
            return 1
        value = exif.get(_EXIF_ORIENTATION, 1)
    except Exception:  # malformed EXIF is metadata damage, not pixel damage
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def orientation(source: Source, max_pixels: int = DEFAULT_MAX_PIXELS) -> int:
    """The EXIF orientation (1-8) that decoding ``source`` applies, read from its header."""
    with _open(source, max_pixels) as im:
        return _orientation(im)


def probe(source: Source, max_pixels: int = DEFAULT_MAX_PIXELS) -> ImageInfo:
    """Parse the header only: cheap, proves the file is an image of sane size, not that it decodes."""
    with _open(source, max_pixels) as im:
        width, height = im.size
        if _orientation(im) >= 5:  # orientations 5-8 swap width and height
            width, height = height, width
        return ImageInfo(im.format or "unknown", height, width, im.mode, "transparency" in im.info)


def verify(source: Source, max_pixels: int = DEFAULT_MAX_PIXELS) -> ImageInfo:
    """Decode every pixel (the only proof a file is intact) but convert nothing: the check
    of a file stored as it is. The size is upright, as ``decode`` would give it."""
    with _open(source, max_pixels) as im:
        # Decoding first: an object that failed once (e.g. in getexif) may then load "fine".
        if not (
            im.format == "JPEG"
            and isinstance(source, (bytes, memoryview))
            and jpeg_turbo.decode(source, im.mode, im.mode) is not None
        ):
            im.load()
        orientation = _orientation(im)
        width, height = im.size[::-1] if orientation >= 5 else im.size
        return ImageInfo(im.format or "unknown", height, width, im.mode, "transparency" in im.info)


def decode(
    source: Source,
    mode: str = "RGB",
    max_pixels: int = DEFAULT_MAX_PIXELS,
    shrink_to: Callable[[int, int], tuple[int, int] | None] | None = None,
) -> tuple[Image.Image, ImageInfo]:
    """Fully decode ``source`` to an upright image in ``mode`` ("RGB", "L" or "keep").

    Args:
        shrink_to: maps the upright (width, height) to the size the caller will shrink
            to, or None; lets JPEG decode at a reduced scale (never below that size),
            which is several times faster than a full decode and resize.
    """
    im = _open(source, max_pixels)
    try:
        info = ImageInfo(
            im.format or "unknown", im.size[1], im.size[0], im.mode, "transparency" in im.info
        )
        target = _draft_target(im, shrink_to)
        if target is not None:
            im.draft(im.mode, target)
        im.load()
        ImageOps.exif_transpose(im, in_place=True)  # no copy when already upright
    except Exception:
        im.close()
        raise
    info = ImageInfo(info.format, im.size[1], im.size[0], info.mode, info.has_transparency)
    return normalize_mode(im, mode), info


def decode_array(
    source: bytes | memoryview,
    mode: str = "RGB",
    max_pixels: int = DEFAULT_MAX_PIXELS,
    writable: bool = True,
) -> np.ndarray:
    """``to_array(decode(source, mode, max_pixels)[0], writable)``, with a JPEG's pixels
    decoded by libjpeg-turbo straight into the array where that gives Pillow's pixels
    (``packer.imaging.jpeg_turbo``): faster, and free of the GIL."""
    turbo = _decoded_by_turbo(source, mode, max_pixels)
    if turbo is not None:
        return jpeg_turbo.upright(*turbo)
    im, _ = decode(source, mode, max_pixels)
    return to_array(im, writable)


def decoded_shape(
    source: bytes | memoryview, mode: str = "RGB", max_pixels: int = DEFAULT_MAX_PIXELS
) -> tuple[int, ...]:
    """The shape of ``decode_array(source, mode, max_pixels)``, from a full decode that makes
    no array of what Pillow decodes: the check of a stored image."""
    turbo = _decoded_by_turbo(source, mode, max_pixels)
    if turbo is not None:  # upright without turning the pixels
        (height, width, channels), orientation = turbo[0].shape, turbo[1]
        return (width, height, channels) if orientation >= 5 else (height, width, channels)
    im, _ = decode(source, mode, max_pixels)
    return (im.height, im.width, CHANNELS[im.mode])


def _decoded_by_turbo(
    source: bytes | memoryview,
    mode: str,
    max_pixels: int,
    shrink_to: Callable[[int, int], tuple[int, int] | None] | None = None,
) -> tuple[np.ndarray, int] | None:
    """A JPEG's pixels in ``mode`` from libjpeg-turbo, as stored, and its EXIF orientation;
    or None: not a JPEG (by Pillow's own test of the first bytes, so other formats are
    opened once), or one that Pillow must decode itself. ``shrink_to`` as for ``decode``:
    the same reduced scale that Pillow's draft picks, so the pixels are Pillow's too."""
    if bytes(source[:3]) != b"\xff\xd8\xff":
        return None
    with _open(source, max_pixels) as im:
        if im.format != "JPEG":
            return None
        target = _draft_target(im, shrink_to)
        reduced = None if target is None else _draft_size(im.size, target)
        pixels = jpeg_turbo.decode(source, im.mode, output_mode(im.mode, False, mode), reduced)
        return None if pixels is None else (pixels, _orientation(im))


def _draft_target(
    im: Image.Image, shrink_to: Callable[[int, int], tuple[int, int] | None] | None
) -> tuple[int, int] | None:
    """The (width, height) of the stored, unrotated JPEG that ``shrink_to`` asks for, or None."""
    if shrink_to is None or im.format != "JPEG":
        return None
    turned = _orientation(im) >= 5
    width, height = im.size[::-1] if turned else im.size
    target = shrink_to(width, height)
    return None if target is None else (target[::-1] if turned else target)


def _draft_size(size: tuple[int, int], target: tuple[int, int]) -> tuple[int, int]:
    """The (width, height) Pillow's JPEG draft decodes ``size`` at for ``target``: reduced by
    the largest of 8, 4, 2 (or 1) that keeps both sides at least the target's."""
    fits = min(size[0] // target[0], size[1] // target[1])
    scale = next((s for s in (8, 4, 2) if fits >= s), 1)
    return (-(-size[0] // scale), -(-size[1] // scale))


def decode_resized(
    source: bytes | memoryview,
    mode: str = "RGB",
    max_pixels: int = DEFAULT_MAX_PIXELS,
    max_side: int | None = None,
    size: tuple[int, int] | None = None,
    fit: str = "crop",
) -> np.ndarray:
    """Decoded upright in ``mode`` and resized (``resizing.resize``), as height x width x
    channels uint8, read-only where nothing copied it. A JPEG is decoded at the smallest
    power-of-two scale (1/2, 1/4, 1/8) that still covers the target, which costs a fraction
    of a full decode, by libjpeg-turbo where it can (``packer.imaging.jpeg_turbo``)."""
    shrink_to = functools.partial(resizing.resized_size, max_side=max_side, size=size, fit=fit)
    pixels = _shrunk_upright(source, mode, max_pixels, shrink_to)
    return resizing.resize(pixels, max_side, size, fit)


def _shrunk_upright(
    source: bytes | memoryview,
    mode: str,
    max_pixels: int,
    shrink_to: Callable[[int, int], tuple[int, int] | None],
) -> np.ndarray:
    """Decoded upright in ``mode``, a JPEG at the reduced scale ``shrink_to`` allows: by
    libjpeg-turbo where it can, else by Pillow; read-only where nothing copied it."""
    turbo = _decoded_by_turbo(source, mode, max_pixels, shrink_to)
    if turbo is not None:
        return jpeg_turbo.upright(*turbo)
    im, _ = decode(source, mode, max_pixels, shrink_to=shrink_to)
    return to_array(im, writable=False)


def decode_placed(
    source: bytes | memoryview,
    place: Callable[[int, int], cropping.Placement],
    mode: str = "RGB",
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> np.ndarray:
    """Decoded upright in ``mode`` and drawn as ``place(height, width)`` puts it (a crop,
    resize, pad and mirror in one; ``cropping.render``), as a new height x width x channels
    uint8 array. ``place`` is asked once, with the upright size, before any pixel is
    decoded, so a JPEG is decoded only at the smallest reduced scale (1/2, 1/4, 1/8) at
    which the placed region keeps every pixel the output needs."""
    asked: list[tuple[int, int, cropping.Placement]] = []

    def placed(height: int, width: int) -> cropping.Placement:
        if not asked:
            asked.append((height, width, place(height, width)))
        return asked[0][2]

    def shrink_to(width: int, height: int) -> tuple[int, int]:
        return cropping.least_decoded(placed(height, width), height, width)

    pixels = _shrunk_upright(source, mode, max_pixels, shrink_to)
    if not asked:  # not a JPEG: decoded at full size, placed now
        placed(pixels.shape[0], pixels.shape[1])
    height, width, placement = asked[0]
    return cropping.render(pixels, placement, height, width)


def from_array(pixels: np.ndarray) -> Image.Image:
    """The Pillow image of ``to_array``'s height x width x channels uint8 layout."""
    return Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels)


def output_mode(source_mode: str, has_transparency: bool, policy: str = "RGB") -> str:
    """The 8-bit mode ``normalize_mode`` gives an image of ``source_mode`` under ``policy``."""
    if policy not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {policy!r}")
    if policy != "keep":
        return policy
    if source_mode in _KEPT_MODES:
        return source_mode
    if source_mode in ("1", "I;16", "I;16B", "I;16L", "I", "F"):
        return "L"
    if source_mode == "La":
        return "LA"
    if source_mode in ("RGBa", "PA") or (source_mode == "P" and has_transparency):
        return "RGBA"
    return "RGB"  # P, CMYK, YCbCr, LAB, HSV, RGBX


CHANNELS = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4}


def normalize_mode(im: Image.Image, policy: str = "RGB") -> Image.Image:
    """Bring any Pillow mode to 8-bit: "RGB", "L", or with "keep" the nearest of L, LA, RGB, RGBA."""
    target = output_mode(im.mode, "transparency" in im.info, policy)
    if im.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        im = _grey_to_8bit(im)
    return im if im.mode == target else im.convert(target)


def _grey_to_8bit(im: Image.Image) -> Image.Image:
    values = np.asarray(im)
    if im.mode == "F":
        scaled = np.clip(values, 0, 255)
    else:  # 16-bit samples (also PGM's 16-bit, opened as "I"): keep the top 8 bits
        scaled = np.clip(values.astype(np.int64) >> 8, 0, 255)
    return Image.fromarray(scaled.astype(np.uint8), "L")


def encode(im: Image.Image, fmt: str, quality: int = 90) -> bytes:
    """Encode to "jpeg", "png" or "webp". JPEG has no alpha: RGBA and LA lose it."""
    out = io.BytesIO()
    if fmt == "jpeg":
        if im.mode not in ("RGB", "L"):
            im = im.convert("L" if im.mode == "LA" else "RGB")
        im.save(out, "JPEG", quality=quality)
    elif fmt == "png":
        im.save(out, "PNG", compress_level=6)
    elif fmt == "webp":
        im.save(out, "WEBP", quality=quality, method=4)
    else:
        raise ValueError(f"unknown encoding {fmt!r}; choose jpeg, png or webp")
    return out.getvalue()


def to_array(im: Image.Image, writable: bool = True) -> np.ndarray:
    """Height x width x channels uint8 (grey images get one channel), writable unless the
    caller copies it anyway (``writable=False`` saves a copy of every pixel)."""
    array = np.asarray(im, dtype=np.uint8)
    if writable and not array.flags.writeable:  # a view of Pillow's bytes; transforms may write
        array = array.copy()
    return array[:, :, None] if array.ndim == 2 else array
