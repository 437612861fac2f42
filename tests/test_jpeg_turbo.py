"""libjpeg-turbo's fast path (packer.imaging.jpeg_turbo): Pillow's pixels, byte for byte, or Pillow.

Every case compares ``imaging.decode_array`` (fast path where it applies) with Pillow's own
decode (``imaging.decode`` then ``to_array``), and checks which path ran, so a case that
should be fast cannot quietly fall back and pass.
"""

from __future__ import annotations

import io
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from helpers import EXIF_DISPLAY, corpus_dir
from PIL import Image

from packer.imaging import decode as imaging
from packer.imaging import jpeg_turbo, resizing

# Which path ran is asserted only where the fast path is on (Pillow on libjpeg-turbo, as in
# its wheels); the pixels are compared everywhere.
TURBO = jpeg_turbo.ENABLED


def _jpeg(mode: str, size: tuple[int, int], seed: int = 0, **save: object) -> bytes:
    """A JPEG with real detail (noise over gradients), so every DCT coefficient matters."""
    width, height = size
    rng = np.random.default_rng(seed)
    ramp = np.add.outer(np.arange(height), np.arange(width)) * 255 // max(1, width + height - 2)
    channels = {"L": 1, "RGB": 3, "CMYK": 4}[mode]
    pixels = ramp[:, :, None] + rng.integers(-40, 40, (height, width, channels))
    pixels = np.clip(pixels, 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels[:, :, 0] if channels == 1 else pixels, mode).save(out, "JPEG", **save)
    return out.getvalue()


def _pillow(data: bytes, mode: str) -> np.ndarray:
    im, _ = imaging.decode(data, mode)
    return imaging.to_array(im)


def _file_mode(data: bytes) -> str:
    with Image.open(io.BytesIO(data)) as im:
        return im.mode


JPEGS = {
    "rgb 4:2:0 odd size": _jpeg("RGB", (333, 201)),
    "rgb 4:2:2": _jpeg("RGB", (64, 48), subsampling=1),
    "rgb 4:4:4 quality 100": _jpeg("RGB", (50, 70), subsampling=0, quality=100),
    "rgb progressive": _jpeg("RGB", (120, 90), progressive=True),
    "rgb optimized, restart markers": _jpeg(
        "RGB", (97, 61), optimize=True, restart_marker_blocks=2
    ),
    "rgb 1x1": _jpeg("RGB", (1, 1)),
    "grey": _jpeg("L", (77, 33)),
    "grey progressive": _jpeg("L", (40, 41), progressive=True),
}


@pytest.mark.parametrize("mode", ["RGB", "L", "keep"])
@pytest.mark.parametrize("name", sorted(JPEGS))
def test_pixels_are_pillows(name: str, mode: str) -> None:
    data = JPEGS[name]
    file_mode = _file_mode(data)
    fast = (file_mode, imaging.output_mode(file_mode, False, mode)) != ("RGB", "L")
    # The path taken is the one expected: libjpeg-turbo for every pair but colour -> grey.
    wanted = imaging.output_mode(file_mode, False, mode)
    assert (jpeg_turbo.decode(data, file_mode, wanted) is not None) == (fast and TURBO)
    pixels = imaging.decode_array(data, mode)
    assert pixels.dtype == np.uint8 and pixels.flags.writeable and pixels.flags.c_contiguous
    assert np.array_equal(pixels, _pillow(data, mode))
    assert imaging.decoded_shape(data, mode) == pixels.shape


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_matches_pillows_transpose(orientation: int) -> None:
    stored = np.random.default_rng(orientation).integers(0, 256, (24, 40, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    Image.fromarray(stored).save(out, "JPEG", exif=exif, quality=95)
    data = out.getvalue()
    assert (jpeg_turbo.decode(data, "RGB", "RGB") is not None) == TURBO
    pixels = imaging.decode_array(data)
    assert pixels.shape == EXIF_DISPLAY[orientation](stored).shape
    assert pixels.flags.c_contiguous and pixels.flags.writeable
    assert np.array_equal(pixels, _pillow(data, "RGB"))
    assert imaging.decoded_shape(data) == pixels.shape  # turned without turning pixels


def test_off_where_pillow_is_not_on_libjpeg_turbo(monkeypatch: pytest.MonkeyPatch) -> None:
    data = JPEGS["rgb 4:2:0 odd size"]
    monkeypatch.setattr(jpeg_turbo, "ENABLED", False)
    assert jpeg_turbo.decode(data, "RGB", "RGB") is None
    assert np.array_equal(imaging.decode_array(data), _pillow(data, "RGB"))


@pytest.mark.parametrize("mode", ["RGB", "L", "keep"])
def test_other_formats_are_pillows_alone(mode: str) -> None:
    rgba = np.random.default_rng(3).integers(0, 256, (13, 21, 4), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(rgba).save(out, "PNG")
    data = out.getvalue()
    pixels = imaging.decode_array(data, mode)
    assert np.array_equal(pixels, _pillow(data, mode))
    assert (
        imaging.decoded_shape(data, mode)
        == pixels.shape
        == (13, 21, 4 if mode == "keep" else 3 if mode == "RGB" else 1)
    )


def test_cmyk_is_left_to_pillow() -> None:
    data = _jpeg("CMYK", (30, 20))
    assert jpeg_turbo.decode(data, "CMYK", "RGB") is None
    assert np.array_equal(imaging.decode_array(data), _pillow(data, "RGB"))


def test_a_libjpeg_warning_falls_back_to_pillow_which_decodes_it() -> None:
    # Junk before the scan's marker: libjpeg warns ("extraneous bytes"), Pillow decodes anyway.
    good = JPEGS["rgb 4:2:0 odd size"]
    scan = good.index(b"\xff\xda")
    data = good[:scan] + b"\x00\x00\x00" + good[scan:]
    assert jpeg_turbo.decode(data, "RGB", "RGB") is None
    assert np.array_equal(imaging.decode_array(data), _pillow(good, "RGB"))
    assert imaging.verify(data).format == "JPEG"


def test_a_truncated_jpeg_fails_as_pillow_fails() -> None:
    data = JPEGS["rgb 4:2:0 odd size"][:-500]
    assert jpeg_turbo.decode(data, "RGB", "RGB") is None
    with pytest.raises(OSError, match="truncated"):
        imaging.decode_array(data)
    with pytest.raises(OSError, match="truncated"):
        imaging.verify(data)


def test_the_pixel_limit_is_still_pillows() -> None:
    data = _jpeg("RGB", (40, 30))
    with pytest.raises(ValueError, match="decompression bomb refused"):
        imaging.decode_array(data, max_pixels=1_000)
    with pytest.raises(ValueError, match="decompression bomb refused"):
        imaging.verify(data, max_pixels=1_000)


def _outcome(call: object) -> tuple[str, object]:
    try:
        return "ok", call()  # type: ignore[operator]
    except Exception as e:  # noqa: BLE001 - the outcome compared is any error at all
        return "error", type(e).__name__


@pytest.mark.filterwarnings("ignore:Corrupt EXIF data")
@pytest.mark.parametrize("mode", ["RGB", "keep"])
def test_corpus_jpegs_decode_as_pillow_decodes_them(mode: str) -> None:
    """Odd real-world JPEGs (bad EXIF, ICC after SOF, junk headers, CMYK, truncation): the
    same pixels, or the same failure, as Pillow alone."""
    files = sorted(p for p in (corpus_dir() / "images").rglob("*.jpg"))
    assert len(files) >= 10
    for path in files:
        data = Path(path).read_bytes()
        fast = _outcome(lambda data=data: imaging.decode_array(data, mode))
        slow = _outcome(lambda data=data: _pillow(data, mode))
        assert fast[0] == slow[0], path.name
        if fast[0] == "ok":
            assert np.array_equal(fast[1], slow[1]), path.name  # type: ignore[arg-type]
        else:
            assert fast[1] == slow[1], path.name
        assert _outcome(lambda data=data: imaging.verify(data))[0] == slow[0], path.name


def test_packer_runs_without_its_accelerators(tmp_path: Path) -> None:
    """Where simplejpeg and isal have no wheels they are not installed: packer imports, packs
    and reads with Pillow and zlib alone, to the same pixels and checksums."""
    source = tmp_path / "images" / "a"
    source.mkdir(parents=True)
    (source / "one.jpg").write_bytes(JPEGS["rgb 4:2:0 odd size"])
    (source / "two.jpg").write_bytes(JPEGS["grey"])
    script = f"""
import sys, zlib
sys.path.insert(0, {str(Path(__file__).parent)!r})
import without_accelerators  # simplejpeg and isal now raise ImportError, as make test-plain
import numpy as np
from packer import PackOptions, open_store
from packer.imaging import jpeg_turbo
from packer import pack
from packer.store import record
assert not jpeg_turbo.ENABLED and record._crc32 is zlib.crc32 and record.CRC32_BY == "zlib"
assert jpeg_turbo.why_off().startswith("simplejpeg is not installed")
pack({str(tmp_path / "images")!r}, {str(tmp_path / "out.lmdb")!r}, PackOptions(seed=0, workers=1))
with open_store({str(tmp_path / "out.lmdb")!r}) as store:
    for i in range(len(store)):
        np.save(sys.stdout.buffer, store[i][0])
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    out = io.BytesIO(done.stdout)
    got = sorted((np.load(out) for _ in range(2)), key=lambda a: a.shape)
    want = sorted(
        (imaging.decode_array(JPEGS[name]) for name in ("rgb 4:2:0 odd size", "grey")),
        key=lambda a: a.shape,
    )
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("orientation", [1, 6])
@pytest.mark.parametrize(
    ("name", "size", "scale"),
    [
        ("rgb 4:2:0 odd size", (40, 30), 4),  # (height, width); the JPEG is 333x201
        ("rgb 4:2:0 odd size", (100, 100), 2),  # 1/4 would fall short of covering 100x100
        ("rgb progressive", (10, 10), 8),
        ("grey", (30, 30), 1),  # 77x33: no reduction keeps 30 rows
    ],
)
def test_a_reduced_scale_decode_is_pillows_draft(
    monkeypatch: pytest.MonkeyPatch, name: str, size: tuple[int, int], scale: int, orientation: int
) -> None:
    """Read-time ``size`` and pack-time ``--size`` decode a JPEG at the power-of-two scale
    Pillow's draft picks, so a resized image has the same pixels with or without
    libjpeg-turbo."""
    data = JPEGS[name]
    with Image.open(io.BytesIO(data)) as im:
        width, height = im.size
        if orientation != 1:
            exif = Image.Exif()
            exif[0x0112] = orientation
            out = io.BytesIO()
            im.save(out, "JPEG", exif=exif, quality=95)
            data = out.getvalue()
    for fit in ("crop", "pad"):
        fast = imaging.decode_resized(data, "RGB", size=size, fit=fit)
        with monkeypatch.context() as m:
            m.setattr(jpeg_turbo, "ENABLED", False)
            slow = imaging.decode_resized(data, "RGB", size=size, fit=fit)
        assert fast.shape == (*size, 3) and np.array_equal(fast, slow)
    shrink = partial(resizing.resized_size, max_side=None, size=size, fit="crop")
    im, _ = imaging.decode(data, "RGB", shrink_to=shrink)
    reduced = (-(-width // scale), -(-height // scale))
    assert im.size == (reduced if orientation == 1 else reduced[::-1])
    if TURBO:  # the fast path decoded it too, at the same scale, to the same pixels
        turbo = imaging._decoded_by_turbo(data, "RGB", imaging.DEFAULT_MAX_PIXELS, shrink)
        assert turbo is not None
        assert np.array_equal(jpeg_turbo.upright(*turbo), imaging.to_array(im))
