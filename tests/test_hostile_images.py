"""Hostile images (issue requirement "Hostile images").

One folder holds every awkward input we know of: files cut at several points, empty, noise and
text files, a PNG named .jpg, every odd Pillow mode (CMYK, L, LA, P with transparency, RGBA,
16-bit grey, 1-bit), EXIF orientations 2-8, an animated GIF, a multi-page TIFF, a progressive
JPEG, ICC profiles, 1-pixel-thin images, decompression bombs, WebP, BMP, odd file names, a
symlink loop and duplicate files. It is packed once per backend (labels "none", a fixed seed,
the default full check) and this module proves that:

- the pack completes: no input crashes it;
- every valid image is packed exactly once, and ``open_store(...)[i]`` gives its upright RGB
  pixels: equal to the pixels the test made (exactly for lossless formats, within
  ``JPEG_TOLERANCE`` for JPEG) and to the pixels of packer's documented policy applied through
  Pillow (``ImageOps.exif_transpose``; first frame; 16-bit grey keeps its top 8 bits; alpha and
  palette transparency are dropped, not composited);
- ICC profiles are neither applied nor parsed: the stored bytes keep the profile and the pixels
  are the file's own samples (a garbage profile packs like any other);
- every invalid file is in ``result.skipped`` and ``manifest.skipped`` with its path and a
  reason; a bomb is refused from its header, before any pixel is decoded;
- the totals are exact: ``VALID_TOTAL`` packed, ``INVALID_TOTAL`` reported, plus the loop link.

Found while writing it (Pillow's behaviour, kept as packer's): a PNG cut just before its IEND
chunk still decodes every pixel, so it is valid and packed with exact pixels; cut into its
deflate data it is reported as truncated. A JPEG cut just before its EOI marker is reported.
"""

from __future__ import annotations

import io
import os
import struct
import sys
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from helpers import EXIF_DISPLAY, store_path
from PIL import Image, ImageCms, ImageOps

from packer.packing.options import PackOptions
from packer.packing.pipeline import PackResult, pack
from packer.store.access import open_store
from packer.store.record import Record

MAX_PIXELS = 1_000_000
JPEG_TOLERANCE = 2  # max |difference| per sample for a JPEG source (measured: 1)
NOT_AN_IMAGE = "not an image (Pillow cannot identify it)"
LOOP = "links to a folder already walked (symlink loop or alias)"
LOOP_LINK = "loop/parent"  # a folder symlink to its own parent: reported, never entered


# --- making the inputs -------------------------------------------------------------------------


def noise(height: int, width: int, channels: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)


def blocks(height: int, width: int, channels: int, seed: int) -> np.ndarray:
    """Flat 8x8 blocks of random colour: JPEG at quality 95, 4:4:4, keeps them within 1."""
    small = noise(height // 8, width // 8, channels, seed)
    return np.repeat(np.repeat(small, 8, axis=0), 8, axis=1)


def encode(im: Image.Image, fmt: str, **save: object) -> bytes:
    out = io.BytesIO()
    im.save(out, fmt, **save)
    return out.getvalue()


def rgb(pixels: np.ndarray) -> Image.Image:
    return Image.fromarray(pixels, "RGB")


def jpeg(pixels: np.ndarray, **save: object) -> bytes:
    return encode(rgb(pixels), "JPEG", quality=95, subsampling=0, **save)


def grey_to_rgb(grey: np.ndarray) -> np.ndarray:
    return np.repeat(grey[:, :, None], 3, axis=2)


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header_only(width: int, height: int) -> bytes:
    """A PNG signature, an IHDR claiming ``width`` x ``height`` RGB, and IEND: no pixels."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IEND", b"")


def with_orientation(pixels: np.ndarray, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return jpeg(pixels, exif=exif)


PALETTE = noise(256, 1, 3, 99).reshape(256, 3)  # a colourful palette: GIF keeps mode P


def palette_image(indices: np.ndarray) -> Image.Image:
    im = Image.fromarray(indices, "P")
    im.putpalette(PALETTE.tobytes())
    return im


# --- the list ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Valid:
    name: str  # path under the source folder
    data: bytes
    format: str  # what Pillow identifies, whatever the name says
    truth: np.ndarray  # the upright RGB pixels, from what the test made (not from decoding)
    lossy: bool = False  # JPEG: compare within JPEG_TOLERANCE


@dataclass(frozen=True)
class Invalid:
    name: str
    data: bytes
    reason: str  # the exact reason, or with ``partial`` a piece of it (any case)
    partial: bool = False


def hostile_inputs() -> tuple[list[Valid], list[Invalid]]:
    valid: list[Valid] = []
    invalid: list[Invalid] = []

    # Truncated files. Noise, so every cut lands in the pixel data, past the header.
    whole_jpeg = jpeg(noise(64, 96, 3, 1))
    whole_png = encode(rgb(noise(48, 64, 3, 2)), "PNG")
    iend = whole_png.rindex(b"IEND") - 4  # where the IEND chunk (12 bytes) starts
    for percent in (10, 50, 90):
        cut = len(whole_jpeg) * percent // 100
        invalid.append(Invalid(f"cut/jpeg_{percent}.jpg", whole_jpeg[:cut], "truncated", True))
        cut = len(whole_png) * percent // 100
        invalid.append(Invalid(f"cut/png_{percent}.png", whole_png[:cut], "truncated", True))
    assert whole_jpeg.endswith(b"\xff\xd9")
    invalid.append(Invalid("cut/jpeg_no_eoi.jpg", whole_jpeg[:-2], "truncated", True))
    # The last 4 bytes of deflate data go too (with the Adler-32 and the chunk CRC): caught.
    invalid.append(Invalid("cut/png_idat_tail.png", whole_png[: iend - 12], "truncated", True))
    # Cut just before IEND: every pixel is there, Pillow decodes them all; packed as it is.
    valid.append(Valid("cut/png_no_iend.png", whole_png[:iend], "PNG", noise(48, 64, 3, 2)))

    # Not images at all.
    invalid.append(Invalid("empty.jpg", b"", NOT_AN_IMAGE))
    invalid.append(Invalid("noise.jpg", np.random.default_rng(3).bytes(4096), NOT_AN_IMAGE))
    invalid.append(Invalid("notes.txt", b"a text file, not a picture\n", NOT_AN_IMAGE))

    # Decompression bombs, with max_pixels=1,000,000. A real 2000x2000 PNG (Pillow's own
    # check fires in open, over twice the limit), and a header claiming 1000x1001 with no
    # pixels at all: refused as a bomb, not as truncated, so nothing was decoded.
    bomb = encode(Image.new("RGB", (2000, 2000), (40, 80, 120)), "PNG")
    invalid.append(
        Invalid(
            "bomb_2000x2000.png",
            bomb,
            "ValueError: decompression bomb refused: 4,000,000 pixels is over the limit "
            "of 1,000,000 (--max-pixels)",
        )
    )
    invalid.append(
        Invalid(
            "bomb_header_only.png",
            png_header_only(1000, 1001),
            "ValueError: decompression bomb refused: 1,001,000 pixels (1000x1001) is over "
            "the limit of 1,000,000 (--max-pixels)",
        )
    )

    # A PNG named .jpg: what Pillow identifies wins.
    pixels = noise(12, 20, 3, 4)
    valid.append(Valid("png_named.jpg", encode(rgb(pixels), "PNG"), "PNG", pixels))

    # Modes. The policy: 8-bit RGB; alpha and palette transparency dropped, not composited.
    cmyk = blocks(32, 48, 4, 5)
    valid.append(
        Valid(
            "modes/cmyk.jpg",
            encode(Image.fromarray(cmyk, "CMYK"), "JPEG", quality=95),
            "JPEG",
            np.asarray(Image.fromarray(cmyk, "CMYK").convert("RGB")),  # Pillow's CMYK -> RGB
            lossy=True,
        )
    )
    grey = noise(20, 30, 1, 6)[:, :, 0]
    valid.append(
        Valid("modes/L.png", encode(Image.fromarray(grey, "L"), "PNG"), "PNG", grey_to_rgb(grey))
    )
    la = noise(20, 30, 2, 7)
    valid.append(
        Valid(
            "modes/LA.png",
            encode(Image.fromarray(la, "LA"), "PNG"),
            "PNG",
            grey_to_rgb(la[:, :, 0]),
        )
    )
    indices = noise(20, 30, 1, 8)[:, :, 0]
    im = palette_image(indices)
    valid.append(
        Valid(
            "modes/P_transparency.png",
            encode(im, "PNG", transparency=int(indices[0, 0])),
            "PNG",
            PALETTE[indices],
        )
    )
    rgba = noise(20, 30, 4, 9)
    valid.append(
        Valid("modes/RGBA.png", encode(Image.fromarray(rgba, "RGBA"), "PNG"), "PNG", rgba[:, :, :3])
    )
    sixteen = np.random.default_rng(10).integers(0, 65536, (20, 30), dtype=np.uint16)
    sixteen[0, :4] = (255, 256, 65280, 65535)  # top 8 bits: 0, 1, 255, 255 (not clipped)
    valid.append(
        Valid(
            "modes/grey16.png",
            encode(Image.fromarray(sixteen), "PNG"),
            "PNG",
            grey_to_rgb((sixteen >> 8).astype(np.uint8)),
        )
    )
    bits = noise(20, 30, 1, 11)[:, :, 0] > 127
    valid.append(
        Valid(
            "modes/bilevel.png",
            encode(Image.fromarray(bits), "PNG"),
            "PNG",
            grey_to_rgb(np.where(bits, 255, 0).astype(np.uint8)),
        )
    )

    # EXIF orientations 2-8 on a non-square JPEG (48 wide, 32 high).
    stored = blocks(32, 48, 3, 12)
    for orientation, display in EXIF_DISPLAY.items():
        if orientation == 1:
            continue
        valid.append(
            Valid(
                f"exif/orientation_{orientation}.jpg",
                with_orientation(stored, orientation),
                "JPEG",
                display(stored),
                lossy=True,
            )
        )

    # Multi-frame files give their first frame.
    frames = [noise(16, 24, 1, 13 + i)[:, :, 0] for i in range(3)]
    gif = encode(
        palette_image(frames[0]),
        "GIF",
        save_all=True,
        append_images=[palette_image(f) for f in frames[1:]],
        duration=50,
        loop=0,
    )
    valid.append(Valid("frames/animated.gif", gif, "GIF", PALETTE[frames[0]]))
    pages = [noise(16, 24, 3, 16 + i) for i in range(3)]
    tiff = encode(rgb(pages[0]), "TIFF", save_all=True, append_images=[rgb(p) for p in pages[1:]])
    valid.append(Valid("frames/multipage.tif", tiff, "TIFF", pages[0]))

    # Progressive JPEG, ICC profiles (sRGB, and garbage: neither is applied or parsed).
    pixels = blocks(32, 48, 3, 19)
    valid.append(
        Valid("jpeg/progressive.jpg", jpeg(pixels, progressive=True), "JPEG", pixels, lossy=True)
    )
    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    pixels = blocks(32, 48, 3, 20)
    valid.append(Valid("icc/srgb.jpg", jpeg(pixels, icc_profile=srgb), "JPEG", pixels, lossy=True))
    pixels = noise(20, 30, 3, 21)
    valid.append(Valid("icc/srgb.png", encode(rgb(pixels), "PNG", icc_profile=srgb), "PNG", pixels))
    garbage = np.random.default_rng(22).bytes(600)
    valid.append(
        Valid("icc/garbage.png", encode(rgb(pixels), "PNG", icc_profile=garbage), "PNG", pixels)
    )

    # Thin and tiny.
    for width, height in ((1, 1), (10000, 1), (1, 10000)):
        pixels = noise(height, width, 3, 23 + width)
        valid.append(Valid(f"thin/{width}x{height}.png", encode(rgb(pixels), "PNG"), "PNG", pixels))

    # WebP (lossless) and BMP.
    pixels = noise(20, 30, 3, 30)
    valid.append(
        Valid("other/lossless.webp", encode(rgb(pixels), "WEBP", lossless=True), "WEBP", pixels)
    )
    pixels = noise(21, 31, 3, 31)  # odd width: BMP rows are padded to 4 bytes
    valid.append(Valid("other/image.bmp", encode(rgb(pixels), "BMP"), "BMP", pixels))

    # Names with spaces, quotes and non-ASCII characters.
    pixels = noise(10, 14, 3, 32)
    valid.append(Valid("names/ça va 'x' \"y\" 日本.png", encode(rgb(pixels), "PNG"), "PNG", pixels))
    pixels = blocks(16, 24, 3, 33)
    valid.append(
        Valid('names/dossier été/l\'œil "vu".jpg', jpeg(pixels), "JPEG", pixels, lossy=True)
    )

    # Beside the symlink loop (made by the fixture), and the same bytes under two paths.
    pixels = noise(10, 12, 3, 34)
    valid.append(Valid("loop/inside.png", encode(rgb(pixels), "PNG"), "PNG", pixels))
    pixels = noise(11, 13, 3, 35)
    twin = encode(rgb(pixels), "PNG")
    valid.append(Valid("dup/first.png", twin, "PNG", pixels))
    valid.append(Valid("dup/second.png", twin, "PNG", pixels))
    return valid, invalid


VALID, INVALID = hostile_inputs()
# Derived by hand from the list above, so a lost or an extra input fails the totals test:
# valid: 1 cut PNG + PNG-named-.jpg + 7 modes + 7 orientations + GIF + TIFF + progressive
#        + 3 ICC + 3 thin + WebP + BMP + 2 names + loop/inside + 2 duplicates = 32
# invalid: 8 cuts + empty + noise + text + 2 bombs = 13
VALID_TOTAL = 32
INVALID_TOTAL = 13


# --- what packer's documented policy gives, through Pillow -------------------------------------


def policy_pixels(data: bytes) -> np.ndarray:
    """Frame 0, EXIF orientation applied, 16-bit grey to its top 8 bits, then ``convert``."""
    with Image.open(io.BytesIO(data)) as im:
        im.seek(0)
        upright = ImageOps.exif_transpose(im)
        if upright.mode in ("I;16", "I;16B", "I;16L", "I"):
            top = np.asarray(upright).astype(np.int64) >> 8
            upright = Image.fromarray(top.astype(np.uint8), "L")
        return np.asarray(upright.convert("RGB"))


def assert_pixels(got: np.ndarray, expected: np.ndarray, lossy: bool, what: str) -> None:
    assert got.dtype == np.uint8 and got.shape == expected.shape, (what, got.shape, expected.shape)
    if lossy:
        worst = int(np.abs(got.astype(np.int16) - expected.astype(np.int16)).max())
        assert worst <= JPEG_TOLERANCE, (what, worst)
    else:
        assert np.array_equal(got, expected), what


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile") / "src"
    files = [(v.name, v.data) for v in VALID] + [(b.name, b.data) for b in INVALID]
    for name, data in files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    os.symlink("..", root / LOOP_LINK)  # loop/parent -> the source root
    return root


@dataclass
class Packed:
    result: PackResult
    records: dict[str, list[tuple[int, np.ndarray, Record]]]  # path -> [(index, pixels, record)]
    skipped: dict[str, str]  # path -> reason, checked equal in the result and the manifest


@pytest.fixture(scope="module", params=["lmdb", "hdf5"])
def packed(
    request: pytest.FixtureRequest, source: Path, tmp_path_factory: pytest.TempPathFactory
) -> Packed:
    backend = str(request.param)
    out = store_path(tmp_path_factory.mktemp(f"hostile-{backend}"), backend)
    options = PackOptions(
        backend=backend, labels="none", seed=1234, workers=2, max_pixels=MAX_PIXELS
    )
    result = pack(source, out, options)  # completes: not one input crashes the pack
    records: dict[str, list[tuple[int, np.ndarray, Record]]] = {}
    with open_store(result.store) as store:
        for i in range(len(store)):
            record = store.record(i)
            pixels, labels = store[i]
            assert labels.shape == (0,)
            records.setdefault(record.path, []).append((i, pixels, record))
        manifest_skipped = [(s["path"], s["reason"]) for s in store.manifest.skipped]
    result_skipped = [(s.path, s.reason) for s in result.skipped]
    assert sorted(manifest_skipped) == sorted(result_skipped)
    skipped = dict(result_skipped)
    assert len(skipped) == len(result_skipped), "a file was reported twice"
    return Packed(result, records, skipped)


# --- tests -------------------------------------------------------------------------------------


def test_totals_are_exact(packed: Packed) -> None:
    assert len(VALID) == VALID_TOTAL and len(INVALID) == INVALID_TOTAL
    assert len(packed.result.skipped) == INVALID_TOTAL + 1  # and the loop link
    assert packed.result.manifest.num_records == VALID_TOTAL
    assert sum(len(found) for found in packed.records.values()) == VALID_TOTAL
    assert Counter({path: len(found) for path, found in packed.records.items()}) == Counter(
        dict.fromkeys((v.name for v in VALID), 1)
    )
    assert set(packed.skipped) == {bad.name for bad in INVALID} | {LOOP_LINK}
    assert packed.result.manifest.source["files"] == VALID_TOTAL + INVALID_TOTAL + 1


@pytest.mark.parametrize("item", VALID, ids=lambda v: v.name)
def test_valid_image_is_packed_once_upright_with_its_pixels(packed: Packed, item: Valid) -> None:
    assert item.name not in packed.skipped
    [(_, pixels, record)] = packed.records[item.name]
    assert bytes(record.data) == item.data  # the source bytes, untouched (ICC included)
    assert record.format == item.format
    assert record.shape == pixels.shape
    assert_pixels(pixels, item.truth, item.lossy, f"{item.name}: against the pixels made")
    assert_pixels(pixels, policy_pixels(item.data), item.lossy, f"{item.name}: against policy")


@pytest.mark.parametrize("item", INVALID, ids=lambda b: b.name)
def test_invalid_file_is_reported_with_path_and_reason(packed: Packed, item: Invalid) -> None:
    assert item.name not in packed.records
    reason = packed.skipped[item.name]
    assert reason.strip() and "\n" not in reason
    if item.partial:
        assert item.reason in reason.lower(), reason
    else:
        assert reason == item.reason


def test_symlink_loop_is_reported_and_not_entered(packed: Packed) -> None:
    assert packed.skipped[LOOP_LINK] == LOOP
    assert not any(path.startswith(LOOP_LINK + "/") for path in packed.records)


def test_exif_orientations_5_to_8_swap_height_and_width(packed: Packed) -> None:
    for orientation in range(2, 9):
        [(_, pixels, record)] = packed.records[f"exif/orientation_{orientation}.jpg"]
        assert pixels.shape == record.shape == ((48, 32, 3) if orientation >= 5 else (32, 48, 3))


def test_icc_profile_is_kept_in_the_bytes_but_not_applied(packed: Packed) -> None:
    """packer does no colour management: imaging.py never reads ``icc_profile``. The profile
    stays in the stored bytes, and the pixels are the file's samples (checked exactly above
    for the PNGs; a garbage profile would break any converter)."""
    for name in ("icc/srgb.jpg", "icc/srgb.png", "icc/garbage.png"):
        [(_, _, record)] = packed.records[name]
        with Image.open(io.BytesIO(bytes(record.data))) as im:
            assert im.info.get("icc_profile"), name


@pytest.mark.parametrize("where", ["pool", "read-ahead thread"])
def test_a_header_check_skips_only_what_the_full_check_skips_and_agrees_on_the_rest(
    packed: Packed,
    source: Path,
    tmp_path: Path,
    where: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Packed with ``--check header`` (its headers read by the pool's workers, or by the
    read-ahead thread with packer.imaging.headers and the pool for the rest), the folder gives a
    subset of the full check's skips, each for the same reason, and every record the full
    check also kept has the same bytes, shape and format; the others are files cut in their
    pixel data, which only a decode finds."""
    if where != "pool":
        monkeypatch.setattr(sys.modules["packer.packing.pipeline"], "_SAMPLE", 0)
    backend = packed.result.manifest.backend
    options = PackOptions(
        backend=backend, labels="none", seed=1234, workers=2, max_pixels=MAX_PIXELS, check="header"
    )
    result = pack(source, store_path(tmp_path, backend), options)
    skipped = {s.path: s.reason for s in result.skipped}
    assert skipped.items() <= packed.skipped.items()
    with open_store(result.store) as store:
        records = list(store.records())
    assert len(records) + len(skipped) == len(packed.records) + len(packed.skipped)
    for record in records:
        if record.path in packed.records:
            (_, _, full), *_ = packed.records[record.path]
            assert (bytes(record.data), record.shape, record.format) == (
                bytes(full.data),
                full.shape,
                full.format,
            )
        else:
            assert record.path in packed.skipped  # cut in its pixels: found by a decode


def test_first_frame_is_not_the_others() -> None:
    """The GIF and TIFF checks above would be vacuous if every frame were the same."""
    gif = next(v for v in VALID if v.name == "frames/animated.gif")
    with Image.open(io.BytesIO(gif.data)) as im:
        assert im.n_frames == 3
        im.seek(1)
        assert not np.array_equal(np.asarray(im.convert("RGB")), gif.truth)
    tiff = next(v for v in VALID if v.name == "frames/multipage.tif")
    with Image.open(io.BytesIO(tiff.data)) as im:
        assert im.n_frames == 3
        im.seek(2)
        assert not np.array_equal(np.asarray(im.convert("RGB")), tiff.truth)


SOURCE_MODES = {
    "modes/cmyk.jpg": "CMYK",
    "modes/L.png": "L",
    "modes/LA.png": "LA",
    "modes/P_transparency.png": "P",
    "modes/RGBA.png": "RGBA",
    "modes/grey16.png": "I;16",
    "modes/bilevel.png": "1",
    "frames/animated.gif": "P",
}


@pytest.mark.parametrize(("name", "mode"), SOURCE_MODES.items())
def test_inputs_are_the_hostile_kind_they_claim(name: str, mode: str) -> None:
    """Guards the list itself: a Pillow that wrote these differently would make it tame."""
    item = next(v for v in VALID if v.name == name)
    with Image.open(io.BytesIO(item.data)) as im:
        assert im.mode == mode
        if name == "modes/P_transparency.png":
            assert "transparency" in im.info


def test_progressive_and_exif_inputs_are_what_they_claim() -> None:
    by_name = {v.name: v for v in VALID}
    with Image.open(io.BytesIO(by_name["jpeg/progressive.jpg"].data)) as im:
        assert im.info.get("progressive")
    for orientation in EXIF_DISPLAY.keys() - {1}:
        with Image.open(io.BytesIO(by_name[f"exif/orientation_{orientation}.jpg"].data)) as im:
            assert im.size == (48, 32) and im.getexif()[0x0112] == orientation
