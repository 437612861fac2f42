"""A strict reader of common JPEG and PNG headers: ``--check header`` without Pillow's cost.

``vouch(data)`` answers only where ``imaging.probe`` would give the very same ImageInfo, and
returns None for anything else, which then goes to Pillow: Pillow stays the judge of what
an image is, this only takes the common case off its hands. It reads bytes already in
memory, so it opens no file and starts no process (a few microseconds a file, where an
``Image.open`` of the file costs 30-50), and it cannot crash: it is plain Python on bytes.

"The same answer" means the same format, upright size, mode and transparency, and that
Pillow opens the file without error. So it walks the same markers and chunks Pillow's JPEG
and PNG plugins do and answers only when each is one it knows Pillow accepts as it is:

- JPEG: segments back to back from SOI to SOS; one baseline, extended or progressive 8-bit
  frame of 1, 3 or 4 components; DQT tables that fill their segments; no MPF segment
  (Pillow would call the file MPO), no Photoshop block; EXIF read only when its first
  directory is whole and plain, and an XMP packet only beside an EXIF orientation (Pillow
  takes an orientation from XMP when EXIF has none);
- PNG: IHDR first, 8 bits a sample, then only PLTE, gAMA, cHRM, sRGB and pHYs, each with
  a good CRC, up to the first IDAT (no transparency chunk, no eXIf, no APNG).

tests/test_headers.py holds it to Pillow: on real files of every kind, and on thousands of
mutated headers, whenever it answers, Pillow's answer is the same.
"""

from __future__ import annotations

import os
import struct
import zlib

from packer.imaging.decode import DEFAULT_MAX_PIXELS, ImageInfo, orientation

__all__ = ["HEAD_BYTES", "exif_orientation", "vouch", "vouch_oriented", "vouch_file"]

_JPEG = b"\xff\xd8\xff"
_PNG = b"\x89PNG\r\n\x1a\n"


def vouch(data: bytes | memoryview, max_pixels: int) -> ImageInfo | None:
    """What ``imaging.probe(data, max_pixels)`` would say of ``data``, or None if unsure."""
    found = vouch_oriented(data, max_pixels)
    return None if found is None else found[0]


def vouch_oriented(data: bytes | memoryview, max_pixels: int) -> tuple[ImageInfo, int] | None:
    """``vouch``, with the EXIF orientation (1-8) Pillow would apply to the pixels (always 1
    for a PNG vouched for, which has no eXIf chunk): what another decoder needs to give
    Pillow's upright image."""
    head = bytes(data[:8])
    try:
        if head.startswith(_JPEG):
            found = _jpeg(data)
        elif head == _PNG:
            png = _png(data)
            found = None if png is None else (png, 1)
        else:
            return None
    except (IndexError, struct.error):  # a field past the end of the data: Pillow decides
        return None
    if found is None or not (0 < found[0].width * found[0].height <= max_pixels):
        return None  # the bomb refusal and its wording are imaging._open's
    return found


def exif_orientation(data: bytes | memoryview) -> int:
    """The EXIF orientation (1-8) that decoding ``data`` stands upright, from its header
    alone: for a decoder that does not apply it (nvJPEG). 1 where the header is unreadable:
    whether the pixels decode is the decoder's to say."""
    if data[:3] == _JPEG and not _app1_before_scan(data):
        return 1  # no APP1 segment, so neither EXIF nor XMP: most photos, in a few steps
    found = vouch_oriented(data, DEFAULT_MAX_PIXELS)
    if found is not None:
        return found[1]
    try:
        return orientation(data)
    except Exception:
        return 1


def _app1_before_scan(data: bytes | memoryview) -> bool:
    """Whether a JPEG may hold an APP1 segment (EXIF, XMP) before its scan: True unless its
    segments, walked from the start, reach the scan without one."""
    pos, end = 2, len(data) - 4
    while pos <= end:
        if data[pos] != 0xFF:
            return True  # not a marker where one should be: the full parse decides
        marker = data[pos + 1]
        if marker == 0xDA:  # start of scan: the headers are over
            return False
        if marker == 0xE1:
            return True
        pos += 2 + ((data[pos + 2] << 8) | data[pos + 3])
    return True


HEAD_BYTES = 16 << 10  # what vouch_file reads: headers with more (a big EXIF) go to Pillow


def vouch_file(path: str | os.PathLike[str], max_pixels: int) -> ImageInfo | None:
    """``vouch`` of the file at ``path``, from its first HEAD_BYTES.

    Raises:
        OSError: the file cannot be read.
    """
    with open(path, "rb") as f:
        return vouch(f.read(HEAD_BYTES), max_pixels)


# --- JPEG ------------------------------------------------------------------------------

_FRAMES = {0xC0, 0xC1, 0xC2}  # the frames in the wild; lossless, arithmetic, 12-bit: Pillow
_SKIPPED = {0xC4, 0xDD, 0xFE}  # DHT, DRI, COM: read past, nothing in them can fail
_DQT, _SOS, _APP0, _APP15 = 0xDB, 0xDA, 0xE0, 0xEF
_JPEG_MODES = {1: "L", 3: "RGB", 4: "CMYK"}
_XMP = b"http://ns.adobe.com/xap/1.0/\x00"


def _jpeg(data: bytes | memoryview) -> tuple[ImageInfo, int] | None:
    pos, end = 2, len(data)
    frame: tuple[int, int, str] | None = None  # width, height, mode
    exif: bytes | None = None
    xmp = jfif_dpi = False
    while True:
        if pos + 4 > end or data[pos] != 0xFF:
            return None  # fill bytes, junk or a cut: Pillow's loop copes or refuses
        marker = data[pos + 1]
        length = data[pos + 2] << 8 | data[pos + 3]
        body, pos = pos + 4, pos + 2 + length
        if length < 2 or pos > end:
            return None
        if marker == _SOS:
            break
        if marker in _FRAMES:
            if frame is not None or length < 8 or (length - 8) % 3:
                return None  # a second frame, or components Pillow would index past
            bits, height, width, layers = struct.unpack_from(">BHHB", data, body)
            if bits != 8 or layers not in _JPEG_MODES:
                return None
            frame = width, height, _JPEG_MODES[layers]
        elif marker == _DQT:
            if not _tables_fill(data, body, pos):
                return None
        elif _APP0 <= marker <= _APP15:
            size, tag = pos - body, bytes(data[body : min(pos, body + len(_XMP))])
            if marker == 0xE0 and tag.startswith(b"JFIF"):
                if size < 7:
                    return None  # Pillow reads the version unguarded
                jfif_dpi = jfif_dpi or (size >= 12 and tag[7] in (1, 2))
            elif marker == 0xE1 and tag.startswith(b"Exif\x00\x00"):
                if exif is not None:
                    return None  # Pillow joins several into one
                exif = bytes(data[body + 6 : pos])
            elif marker == 0xE1 and tag == _XMP:
                xmp = True
            elif marker == 0xE2 and tag.startswith(b"ICC_PROFILE\x00"):
                if size < 14:
                    return None  # Pillow reads the fragment count unguarded
            elif (marker == 0xE2 and tag.startswith(b"MPF\x00")) or marker == 0xED:
                return None  # MPO; Photoshop's resource blocks
            elif marker == 0xEE and tag.startswith(b"Adobe") and size < 7:
                return None
        elif marker not in _SKIPPED:
            return None
    if frame is None:
        return None
    width, height, mode = frame
    orientation = 1
    if exif is not None:
        found = _exif_orientation(exif, check_dpi=not jfif_dpi)
        if found is None:
            return None
        orientation = found or 1
        xmp = xmp and not found
    if xmp:
        return None  # an orientation may be in it
    if orientation >= 5:
        width, height = height, width
    return ImageInfo("JPEG", height, width, mode, False), orientation


def _tables_fill(data: bytes | memoryview, start: int, stop: int) -> bool:
    """Whether a DQT segment is whole tables, 8- or 16-bit, as Pillow requires."""
    while start < stop:
        start += 1 + (64 if data[start] < 16 else 128)
    return start == stop


# TIFF field types 1-12 and the bytes of one value; Pillow skips other types unread.
_UNIT = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8}
_ORIENTATION, _SHORT = 0x0112, 3
_RESOLUTION = {0x011A: 5, 0x0128: 3}  # XResolution a RATIONAL, ResolutionUnit a SHORT


def _exif_orientation(tiff: bytes, check_dpi: bool) -> int | None:
    """The orientation in EXIF's first directory (0 if it has none), where Pillow reads
    that directory whole and plain; None otherwise. ``check_dpi``: Pillow also reads the
    resolution tags (a JPEG without a JFIF density), and some odd types of them make it
    refuse the file."""
    order = {b"II*\x00": "<", b"MM\x00*": ">"}.get(tiff[:4])
    if order is None:
        return None
    (offset,) = struct.unpack_from(order + "L", tiff, 4)
    (count,) = struct.unpack_from(order + "H", tiff, offset)
    if offset + 2 + 12 * count + 4 > len(tiff):
        return None
    entry = struct.Struct(order + "HHL4s")
    orientation, seen, out_of_line = 0, set(), 0
    for i in range(count):
        tag, kind, n, value = entry.unpack_from(tiff, offset + 2 + 12 * i)
        if kind not in _UNIT or n == 0 or tag in seen:
            return None  # Pillow would skip or drop entries: not plain
        seen.add(tag)
        size = n * _UNIT[kind]
        if size > 4:
            (at,) = struct.unpack_from(order + "L", value)
            out_of_line += size
            if at + size > len(tiff) or out_of_line > len(tiff):
                return None
        if tag == _ORIENTATION:
            if kind != _SHORT or n != 1:
                return None
            (orientation,) = struct.unpack_from(order + "H", value)
            orientation = orientation if 1 <= orientation <= 8 else 1
        elif check_dpi and tag in _RESOLUTION and (kind, n) != (_RESOLUTION[tag], 1):
            return None
    return orientation


# --- PNG -------------------------------------------------------------------------------

_PNG_MODES = {0: "L", 2: "RGB", 3: "P", 4: "LA", 6: "RGBA"}  # colour type, at 8 bits
_PLAIN_CHUNKS = {b"PLTE": 0, b"gAMA": 4, b"cHRM": 32, b"sRGB": 1, b"pHYs": 9}  # least length
_CHUNK = struct.Struct(">L4s")


def _png(data: bytes | memoryview) -> ImageInfo | None:
    length, kind = _CHUNK.unpack_from(data, 8)
    if kind != b"IHDR" or length != 13 or not _crc_good(data, 8, 13):
        return None
    width, height, bits, colour, compression, filtering, interlace = struct.unpack_from(
        ">LLBBBBB", data, 16
    )
    if bits != 8 or colour not in _PNG_MODES or compression or filtering or interlace > 1:
        return None
    pos = 33
    while True:
        length, kind = _CHUNK.unpack_from(data, pos)
        if kind == b"IDAT":
            break
        least = _PLAIN_CHUNKS.get(kind)
        if least is None or length < least or not _crc_good(data, pos, length):
            return None
        pos += 12 + length
    return ImageInfo("PNG", height, width, _PNG_MODES[colour], False)


def _crc_good(data: bytes | memoryview, pos: int, length: int) -> bool:
    """Whether the chunk at ``pos`` (``length`` bytes of data) is whole and its CRC right."""
    stop = pos + 8 + length
    if stop + 4 > len(data):
        return False
    (stored,) = struct.unpack_from(">L", data, stop)
    return zlib.crc32(data[pos + 4 : stop]) == stored
