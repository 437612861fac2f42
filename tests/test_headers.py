"""packer.imaging.headers holds to Pillow: whenever it vouches for a file, ``imaging.probe`` gives
the same ImageInfo, and it vouches for the plain JPEGs and PNGs that make up most folders.

Checked on files Pillow writes in every mode and with every kind of metadata, on the shared
corpus of odd files, on headers built to hit each rule, and on thousands of random
mutations of real headers. Mutations are seeded: a failure names its seed and its bytes.
"""

from __future__ import annotations

import random
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from helpers import corpus_dir, encoded, image_bytes
from PIL import Image, PngImagePlugin

from packer.imaging import decode as imaging
from packer.imaging import headers

LIMIT = imaging.DEFAULT_MAX_PIXELS


def pillow(data: bytes, max_pixels: int = LIMIT) -> imaging.ImageInfo | str:
    try:
        return imaging.probe(data, max_pixels)
    except Exception as e:  # noqa: BLE001 - any refusal is an answer to compare with
        return f"{type(e).__name__}: {e}"


def agrees(data: bytes, max_pixels: int = LIMIT) -> imaging.ImageInfo | None:
    """headers' answer, after checking that it is Pillow's wherever it gives one."""
    ours = headers.vouch(data, max_pixels)
    if ours is not None:
        assert ours == pillow(data, max_pixels), data[:64]
    return ours


def noise(mode: str, size: tuple[int, int] = (13, 7)) -> Image.Image:
    rng = np.random.default_rng(len(mode))
    bands = len(Image.new(mode, (1, 1)).getbands())
    pixels = rng.integers(0, 256, (size[1], size[0], bands), dtype=np.uint8)
    if mode in ("L", "P"):
        return Image.fromarray(pixels[..., 0], "L").convert(mode)
    if mode == "CMYK":
        return Image.frombytes("CMYK", size, pixels.tobytes())
    return Image.fromarray(pixels, mode)


def exif(**tags: object) -> Image.Exif:
    found = Image.Exif()
    for name, value in tags.items():
        found[getattr(Image.ExifTags.Base, name)] = value
    return found


XMP_ROTATED = b'<x:xmpmeta><rdf:Description tiff:Orientation="6"/></x:xmpmeta>'

# Files it must vouch for: what Pillow, cameras and scanners write every day.
PLAIN: dict[str, Callable[[], bytes]] = {
    "jpeg rgb": lambda: image_bytes((40, 30)),
    "jpeg grey": lambda: encoded(noise("L"), "JPEG"),
    "jpeg cmyk": lambda: encoded(noise("CMYK"), "JPEG"),
    "jpeg progressive": lambda: encoded(noise("RGB"), "JPEG", progressive=True),
    "jpeg 4:4:4, restart markers": lambda: encoded(
        noise("RGB"), "JPEG", subsampling=0, restart_marker_blocks=1
    ),
    "jpeg with dpi": lambda: encoded(noise("RGB"), "JPEG", dpi=(300, 300)),
    "jpeg with comment": lambda: encoded(noise("RGB"), "JPEG", comment=b"taken at noon"),
    "jpeg with icc": lambda: encoded(noise("RGB"), "JPEG", icc_profile=b"\x00" * 5000),
    "jpeg with exif, no orientation": lambda: encoded(
        noise("RGB"), "JPEG", exif=exif(Make="packer")
    ),
    "jpeg with exif resolution": lambda: encoded(
        noise("RGB"), "JPEG", exif=exif(XResolution=300.0, ResolutionUnit=2, Orientation=3)
    ),
    "jpeg with xmp beside exif orientation": lambda: encoded(
        noise("RGB"), "JPEG", exif=exif(Orientation=1), xmp=XMP_ROTATED
    ),
    **{
        f"jpeg exif orientation {o}": (
            lambda o=o: encoded(noise("RGB"), "JPEG", exif=exif(Orientation=o))  # type: ignore[misc]
        )
        for o in range(1, 9)
    },
    "jpeg big-endian exif": lambda: encoded(noise("RGB"), "JPEG", exif=_big_endian_exif(6)),
    **{
        f"png {mode}": (lambda m=mode: encoded(noise(m), "PNG"))
        for mode in ("L", "RGB", "P", "LA", "RGBA")
    },  # type: ignore[misc]
    "png interlaced": lambda: _png(ihdr=struct.pack(">LLBBBBB", 5, 3, 8, 2, 0, 0, 1)),
    "png with dpi": lambda: encoded(noise("RGB"), "PNG", dpi=(72, 72)),
}


def _big_endian_exif(orientation: int) -> bytes:
    entry = struct.pack(">HHLHH", 0x0112, 3, 1, orientation, 0)
    return b"Exif\x00\x00MM\x00*" + struct.pack(">LH", 8, 1) + entry + b"\x00" * 4


@pytest.mark.parametrize("name", sorted(PLAIN))
def test_it_vouches_for_plain_files_as_pillow_would(name: str) -> None:
    data = PLAIN[name]()
    ours = agrees(data)
    assert ours is not None, f"{name}: left to Pillow"
    assert ours.format in ("JPEG", "PNG")


def test_exif_orientation_swaps_the_size_as_pillow_does() -> None:
    for orientation in range(1, 9):
        info = agrees(encoded(noise("RGB", (13, 7)), "JPEG", exif=exif(Orientation=orientation)))
        assert info is not None
        assert (info.width, info.height) == ((7, 13) if orientation >= 5 else (13, 7))


def _png(*chunks: tuple[bytes, bytes], ihdr: bytes | None = None) -> bytes:
    """A PNG of the given chunks after IHDR (8-bit RGB, 5x3 unless ``ihdr``), and a valid IDAT."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">L", len(body)) + kind + body + struct.pack(">L", zlib.crc32(kind + body))
        )

    header = ihdr or struct.pack(">LLBBBBB", 5, 3, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"".join(b"\x00" + bytes(15) for _ in range(3)))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + b"".join(chunk(k, b) for k, b in chunks)
        + chunk(b"IDAT", pixels)
        + chunk(b"IEND", b"")
    )


def _with_segment(jpeg: bytes, marker: int, body: bytes) -> bytes:
    """``jpeg`` with one more segment right after SOI."""
    return jpeg[:2] + struct.pack(">BBH", 0xFF, marker, len(body) + 2) + body + jpeg[2:]


def _exif_segment(*entries: tuple[int, int, int, bytes], order: str = "<") -> bytes:
    tiff = (b"II*\x00" if order == "<" else b"MM\x00*") + struct.pack(order + "L", 8)
    tiff += struct.pack(order + "H", len(entries))
    tiff += b"".join(
        struct.pack(order + "HHL", t, k, n) + v.ljust(4, b"\x00") for t, k, n, v in entries
    )
    return b"Exif\x00\x00" + tiff + b"\x00" * 4


BASE = image_bytes((40, 30))
SHORT_6 = struct.pack("<H", 6)

# Files it must leave to Pillow, each for one of its rules (Pillow refuses some of them,
# answers differently for others, and for the rest it is simply not sure).
DOUBTFUL: dict[str, Callable[[], bytes]] = {
    "not an image": lambda: b"hello, world\n" * 10,
    "webp": lambda: image_bytes(fmt="WEBP"),
    "gif": lambda: encoded(noise("P"), "GIF"),
    "truncated before the scan": lambda: BASE[:300],
    "junk before a marker": lambda: BASE[:2] + b"\x00" + BASE[2:],
    "fill bytes before a marker": lambda: BASE[:2] + b"\xff" + BASE[2:],
    "12-bit frame": lambda: BASE.replace(b"\xff\xc0\x00\x11\x08", b"\xff\xc0\x00\x11\x0c", 1),
    "lossless frame": lambda: BASE.replace(b"\xff\xc0", b"\xff\xc3", 1),
    "two-component frame": lambda: BASE.replace(
        b"\xff\xc0\x00\x11\x08\x00\x1e\x00\x28\x03", b"\xff\xc0\x00\x11\x08\x00\x1e\x00\x28\x02", 1
    ),
    "frame with a stray byte": lambda: _stray_byte_in_frame(BASE),
    "a quantization table cut short": lambda: _with_segment(BASE, 0xDB, b"\x00" + bytes(40)),
    "a short JFIF segment": lambda: _with_segment(BASE, 0xE0, b"JFIF\x00"),
    "a short ICC fragment": lambda: _with_segment(BASE, 0xE2, b"ICC_PROFILE\x00\x01"),
    "a short Adobe segment": lambda: _with_segment(BASE, 0xEE, b"Adobe\x00"),
    "MPF (an MPO)": lambda: _with_segment(BASE, 0xE2, b"MPF\x00" + bytes(40)),
    "Photoshop block": lambda: _with_segment(BASE, 0xED, b"Photoshop 3.0\x00"),
    "xmp orientation alone": lambda: encoded(noise("RGB"), "JPEG", xmp=XMP_ROTATED),
    "two exif segments": lambda: _with_segment(
        encoded(noise("RGB"), "JPEG", exif=exif(Orientation=6)), 0xE1, _exif_segment()[:-4]
    ),
    "exif orientation as LONG": lambda: _with_segment(
        BASE, 0xE1, _exif_segment((0x0112, 4, 1, struct.pack("<L", 6)))
    ),
    "exif orientation twice": lambda: _with_segment(
        BASE, 0xE1, _exif_segment((0x0112, 3, 1, SHORT_6), (0x0112, 3, 1, struct.pack("<H", 1)))
    ),
    "exif entry of an unknown type": lambda: _with_segment(
        BASE, 0xE1, _exif_segment((0x0112, 3, 1, SHORT_6), (0x9999, 99, 1, b""))
    ),
    "exif value past its end": lambda: _with_segment(
        BASE, 0xE1, _exif_segment((0x010F, 2, 400, struct.pack("<L", 8)), (0x0112, 3, 1, SHORT_6))
    ),
    "exif directory past its end": lambda: _with_segment(
        BASE, 0xE1, _exif_segment((0x0112, 3, 1, SHORT_6))[:-6]
    ),
    "exif resolution as text": lambda: _with_segment(
        BASE[:2] + BASE[20:],
        0xE1,
        _exif_segment((0x0128, 3, 1, b"\x02\x00"), (0x011A, 2, 2, b"7\x00")),
    ),
    "exif in a motorola-less header": lambda: _with_segment(
        BASE, 0xE1, b"Exif\x00\x00XX*\x00" + bytes(20)
    ),
    "png 16-bit": lambda: encoded(
        Image.fromarray(np.arange(12, dtype=np.uint16).reshape(3, 4)), "PNG"
    ),
    "png 1-bit": lambda: encoded(noise("L").convert("1"), "PNG"),
    "png with transparency": lambda: encoded(noise("P"), "PNG", transparency=3),
    "png with text": lambda: encoded(noise("RGB"), "PNG", pnginfo=_text()),
    "png with exif": lambda: encoded(noise("RGB"), "PNG", exif=exif(Orientation=6)),
    "png animated": lambda: encoded(
        noise("RGB"), "PNG", save_all=True, append_images=[noise("RGB")]
    ),
    "png bad crc": lambda: _flip(_png((b"gAMA", struct.pack(">L", 45455))), 41),
    "png short gAMA": lambda: _png((b"gAMA", b"\x00\x01")),
    "png IHDR not first": lambda: _png()[:8] + _png((b"sRGB", b"\x00"))[33:46] + _png()[8:],
    "png bad filter method": lambda: _png(ihdr=struct.pack(">LLBBBBB", 5, 3, 8, 2, 0, 1, 0)),
    "png of no pixels": lambda: _png(ihdr=struct.pack(">LLBBBBB", 0, 3, 8, 2, 0, 0, 0)),
    "png cut in IHDR": lambda: _png()[:25],
}


def _stray_byte_in_frame(jpeg: bytes) -> bytes:
    """The 3-component frame segment (19 bytes) one byte longer, a zero at its end."""
    at = jpeg.index(b"\xff\xc0\x00\x11")
    return jpeg[:at] + b"\xff\xc0\x00\x12" + jpeg[at + 4 : at + 19] + b"\x00" + jpeg[at + 19 :]


def _text() -> PngImagePlugin.PngInfo:
    info = PngImagePlugin.PngInfo()
    info.add_text("Software", "packer")
    return info


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


@pytest.mark.parametrize("name", sorted(DOUBTFUL))
def test_it_leaves_the_doubtful_to_pillow(name: str) -> None:
    data = DOUBTFUL[name]()
    assert headers.vouch(data, LIMIT) is None


def test_a_file_is_vouched_for_from_its_first_bytes_only_when_its_header_fits(
    tmp_path: Path,
) -> None:
    """vouch_file reads HEAD_BYTES: a header longer than that (a large ICC profile here)
    is left to Pillow, though vouch answers for the whole file."""
    small, large = tmp_path / "small.jpg", tmp_path / "large.jpg"
    small.write_bytes(PLAIN["jpeg with icc"]())
    large.write_bytes(encoded(noise("RGB"), "JPEG", icc_profile=bytes(headers.HEAD_BYTES)))
    assert headers.vouch_file(small, LIMIT) == agrees(small.read_bytes()) is not None
    assert agrees(large.read_bytes()) is not None
    assert headers.vouch_file(large, LIMIT) is None


def test_it_leaves_images_over_the_pixel_limit_to_pillow() -> None:
    data = image_bytes((40, 30))
    assert agrees(data, 40 * 30) is not None
    assert agrees(data, 40 * 30 - 1) is None  # imaging refuses it, in its own words


@pytest.mark.filterwarnings("ignore::UserWarning")  # Pillow's, on the damaged EXIF and MPF
def test_the_doubtful_cases_are_real() -> None:
    """Each rule matters: Pillow refuses, or answers otherwise than a naive parser would."""
    refused = [name for name, make in DOUBTFUL.items() if isinstance(pillow(make()), str)]
    # Refused by Pillow outright (not merely unusual):
    for name in (
        "a quantization table cut short",
        "a short JFIF segment",
        "a short ICC fragment",
        "frame with a stray byte",
        "12-bit frame",
        "png bad crc",
        "png short gAMA",
        "png bad filter method",
    ):
        assert name in refused
    xmp = pillow(DOUBTFUL["xmp orientation alone"]())
    assert isinstance(xmp, imaging.ImageInfo) and (xmp.width, xmp.height) == (7, 13)


def pillows_orientation(data: bytes) -> int:
    try:
        return imaging.orientation(data)
    except Exception:  # noqa: BLE001 - unreadable: no orientation to apply
        return 1


@pytest.mark.parametrize("name", [*sorted(PLAIN), *sorted(DOUBTFUL)])
def test_the_exif_orientation_is_the_one_pillow_applies(name: str) -> None:
    """What decode_on_gpu turns nvJPEG's pixels by: from a few steps over the segments where
    a JPEG has no APP1, else from the full header; Pillow's in every case (XMP alone too)."""
    data = {**DOUBTFUL, **PLAIN}[name]()
    assert headers.exif_orientation(data) == pillows_orientation(data)


def test_shared_corpus() -> None:
    """Every file of the corpus of odd images: vouched for only as Pillow would."""
    vouched = 0
    for path in sorted(corpus_dir().rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            vouched += agrees(data) is not None
            assert headers.exif_orientation(data) == pillows_orientation(data), path.name
    assert vouched > 0


def _mutants(data: bytes, rng: random.Random, header: int) -> bytes:
    """``data`` with one random change within its first ``header`` bytes."""
    at = rng.randrange(2, header)
    how = rng.randrange(6)
    if how == 0:
        return data[:at] + bytes([rng.randrange(256)]) + data[at + 1 :]
    if how == 1:
        return data[:at] + bytes([data[at] ^ (1 << rng.randrange(8))]) + data[at + 1 :]
    if how == 2:
        return data[:at]  # cut
    if how == 3:
        return data[:at] + data[at + rng.randrange(1, 8) :]  # bytes dropped
    if how == 4:
        return data[:at] + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4))) + data[at:]
    span = rng.randrange(1, 24)  # a stretch repeated, as a duplicated segment would be
    return data[:at] + data[at : at + span] * 2 + data[at + span :]


@pytest.mark.parametrize(
    "name",
    [
        "jpeg exif orientation 6",
        "jpeg with exif resolution",
        "jpeg with icc",
        "jpeg big-endian exif",
        "png P",
        "png with dpi",
        "jpeg with xmp beside exif orientation",
    ],
)
def test_random_mutations_of_real_headers(name: str) -> None:
    data = PLAIN[name]()
    header = data.find(b"\xff\xda") + 12 if data.startswith(b"\xff\xd8") else data.find(b"IDAT") + 8
    rng = random.Random(name)
    vouched = 0
    for _ in range(1500):
        mutant = _mutants(data, rng, header)
        vouched += agrees(mutant) is not None
        assert headers.exif_orientation(mutant) == pillows_orientation(mutant)
    assert 0 < vouched < 1500  # the mutations reach both sides of its rules
