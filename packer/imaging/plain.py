"""Pillow's pixels of a plain JPEG or PNG without Pillow: the reader's path for small images.

A 32x32 PNG takes Pillow ~70 us, most of it Python (opening, parsing chunks, EXIF, mode
checks) around ~25 us of zlib; a 64x64 JPEG ~75 us, of which libjpeg-turbo's own decode is
~45. Where packer.imaging.headers vouches for a file (it answers only where Pillow's answer
is the same, see its docstring) the pixels come straight from a C decoder:

- JPEG: libjpeg-turbo through simplejpeg (packer.imaging.jpeg_turbo), as ``decode_array``
  already decodes them, turned upright by the EXIF orientation the header gave;
- PNG of 8-bit RGB or grey: OpenCV's libpng, into BGR, then swapped to RGB. A PNG's pixels
  are exact, so any decoder that decodes it gives Pillow's; headers vouches only for PNGs
  without transparency, colour profile or eXIf, and 8 bits a sample, so nothing is left for
  Pillow to convert but grey to RGB, done here as Pillow does it (the grey value three times).

Anything else, and any file either decoder declines, returns None: Pillow decodes it and
has the last word (tests/test_plain_decode.py holds this path to Pillow's pixels).
"""

from __future__ import annotations

import numpy as np

from packer.imaging import headers, jpeg_turbo, resizing
from packer.imaging.decode import DEFAULT_MAX_PIXELS, output_mode

__all__ = ["pixels"]

_PNG_MODES = {("RGB", "RGB"), ("L", "L"), ("L", "RGB")}  # (the file's mode, the mode wanted)


def pixels(
    data: bytes, mode: str = "RGB", max_pixels: int = DEFAULT_MAX_PIXELS
) -> np.ndarray | None:
    """``imaging.decode_array(data, mode, max_pixels)``'s pixels (a fresh, writable height x
    width x channels array), or None where Pillow must decode ``data``."""
    vouched = headers.vouch_oriented(data, max_pixels)
    if vouched is None:
        return None
    info, orientation = vouched
    wanted = output_mode(info.mode, info.has_transparency, mode)
    if info.format == "JPEG":
        decoded = jpeg_turbo.decode(data, info.mode, wanted)
        return None if decoded is None else jpeg_turbo.upright(decoded, orientation)
    if info.format != "PNG" or (info.mode, wanted) not in _PNG_MODES:
        return None
    cv2 = resizing.opencv()
    array = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if array is None or array.dtype != np.uint8 or array.shape[:2] != (info.height, info.width):
        return None
    if info.mode == "RGB":
        if array.ndim != 3 or array.shape[2] != 3:
            return None
        return cv2.cvtColor(array, cv2.COLOR_BGR2RGB)
    if array.ndim != 2:
        return None
    if wanted == "L":
        return array[:, :, None]
    return np.repeat(array[:, :, None], 3, axis=2)
