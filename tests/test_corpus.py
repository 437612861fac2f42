"""The shared pillow-odd corpus: 60 odd and broken images from Pillow's own test suite.

Packed once per backend and checked against the corpus's ``expected.json``: what must pack is
stored once with its exact bytes, what must be skipped is reported with a reason, nothing
else is skipped. The stored records then decode upright, in RGB, without 16-bit clipping.
A raw (decoded pixels, ``mode="keep"``) HDF5 pack is checked against pixels computed here.
Skips, with the reason ``corpus_dir()`` gives, where the shared folder is absent.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from helpers import corpus_dir, store_path
from PIL import Image, ImageOps

from packer.packing.options import PackOptions
from packer.packing.pipeline import PackResult, pack
from packer.reading.reader import open_reader
from packer.store.access import open_store

NOT_AN_IMAGE = "not an image (Pillow cannot identify it)"
# Files in the corpus that are not images at all, and have no entry in expected.json.
NON_IMAGES = {"bmp/README.txt"}
SIXTEEN_BIT = ["12in16bit.tif", "16_bit_noise.tif", "hopper_16bit.pgm"]


@dataclass
class Corpus:
    images: Path
    expected: dict[str, str]  # path under images/ -> "pack" | "skip"

    def by(self, outcome: str) -> set[str]:
        return {path for path, what in self.expected.items() if what == outcome}


@dataclass
class Packed:
    corpus: Corpus
    result: PackResult

    def index(self) -> dict[str, int]:
        """{path: record index} of the store."""
        with open_store(self.result.store) as store:
            return {record.path: i for i, record in enumerate(store.records())}


def sha(data: bytes | memoryview) -> str:
    return hashlib.sha256(bytes(data)).hexdigest()


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    root = corpus_dir()  # skips, with its reason, when ../shared is absent
    expected = json.loads((root / "expected.json").read_text(encoding="utf-8"))
    return Corpus(root / "images", expected)


@pytest.fixture(scope="module", params=["lmdb", "hdf5"])
def packed(
    request: pytest.FixtureRequest, corpus: Corpus, tmp_path_factory: pytest.TempPathFactory
) -> Packed:
    backend = request.param
    out = store_path(tmp_path_factory.mktemp(f"corpus-{backend}"), backend)
    options = PackOptions(backend=backend, labels="none", seed=0, workers=2)
    return Packed(corpus, pack(corpus.images, out, options))


@pytest.fixture(scope="module")
def packed_raw(corpus: Corpus, tmp_path_factory: pytest.TempPathFactory) -> Packed:
    out = store_path(tmp_path_factory.mktemp("corpus-raw"), "hdf5")
    options = PackOptions(backend="hdf5", raw=True, mode="keep", labels="none", seed=0, workers=2)
    return Packed(corpus, pack(corpus.images, out, options))


def all_files(images: Path) -> set[str]:
    return {p.relative_to(images).as_posix() for p in images.rglob("*") if p.is_file()}


@cache
def upright_rgb(path: Path) -> np.ndarray:
    """The source decoded independently: Pillow, EXIF transpose, RGB."""
    with Image.open(path) as im:
        return np.asarray(ImageOps.exif_transpose(im).convert("RGB"))


# --- what is packed and what is skipped ------------------------------------------------------


def test_expected_json_names_every_image_in_the_corpus(corpus: Corpus) -> None:
    assert all_files(corpus.images) == set(corpus.expected) | NON_IMAGES
    assert set(corpus.expected.values()) == {"pack", "skip"}


def test_every_pack_file_is_stored_once_with_its_exact_bytes(packed: Packed) -> None:
    corpus = packed.corpus
    with open_store(packed.result.store) as store:
        assert len(store) == len(corpus.by("pack"))
        records = list(store.records())
    assert Counter(r.path for r in records) == Counter(dict.fromkeys(corpus.by("pack"), 1))
    for record in records:
        assert sha(record.data) == sha((corpus.images / record.path).read_bytes()), record.path


def test_every_skip_file_is_reported_with_a_reason(packed: Packed) -> None:
    skipped = {s.path: s.reason for s in packed.result.skipped}
    assert len(skipped) == len(packed.result.skipped), "a file was reported twice"
    with open_store(packed.result.store) as store:
        assert {s["path"]: s["reason"] for s in store.manifest.skipped} == skipped
    for path in packed.corpus.by("skip"):
        assert path in skipped, f"{path} must be skipped"
        assert skipped[path].strip() and "\n" not in skipped[path]


def test_nothing_else_is_skipped(packed: Packed) -> None:
    skipped = {s.path: s.reason for s in packed.result.skipped}
    assert set(skipped) == packed.corpus.by("skip") | NON_IMAGES
    for path in NON_IMAGES:
        assert skipped[path] == NOT_AN_IMAGE
    assert packed.result.manifest.source["files"] == len(packed.corpus.expected) + len(NON_IMAGES)


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("truncated_jpeg.jpg", "image file is truncated"),  # verify() passes it; load() does not
        ("truncated_image.png", "image file is truncated"),
        ("broken_data_stream.png", "unrecognized data stream"),
        ("decompression_bomb.gif", "decompression bomb"),
        ("decompression_bomb.ico", "decompression bomb"),
        ("bmp/b/badwidth.bmp", "decompression bomb"),
        ("png_decompression_dos.png", "MAX_TEXT_CHUNK"),
        ("broken.png", NOT_AN_IMAGE),
        ("pngtest_bad.png.bin", NOT_AN_IMAGE),
        ("zero_width.gif", NOT_AN_IMAGE),
    ],
)
def test_skip_reasons_say_what_went_wrong(packed: Packed, path: str, words: str) -> None:
    assert packed.corpus.expected[path] == "skip"
    reason = {s.path: s.reason for s in packed.result.skipped}[path]
    if words == NOT_AN_IMAGE:
        assert reason == NOT_AN_IMAGE  # packer's own words
    else:
        assert words in reason  # Pillow's words


# --- what the stored records decode to -------------------------------------------------------


@pytest.mark.filterwarnings("ignore:Corrupt EXIF data:UserWarning")  # hopper_bad_exif.jpg
def test_every_record_decodes_to_upright_rgb_uint8(packed: Packed) -> None:
    with open_store(packed.result.store) as store:
        for i in range(len(store)):
            record = store.record(i)
            pixels, labels = store[i]
            assert pixels.dtype == np.uint8, record.path
            assert pixels.ndim == 3 and pixels.shape[2] == 3, record.path
            assert pixels.shape == record.shape, record.path
            assert pixels.shape == upright_rgb(packed.corpus.images / record.path).shape, (
                record.path
            )
            assert labels.shape == (0,)


@pytest.mark.filterwarnings("ignore:Corrupt EXIF data:UserWarning")  # hopper_bad_exif.jpg
@pytest.mark.parametrize("mode", ["RGB", "L", "keep"])
def test_every_record_is_read_at_a_fixed_size_in_every_fit(packed: Packed, mode: str) -> None:
    """Odd modes (16-bit grey, CMYK, palette with transparency, LA), 1-pixel-high images and
    EXIF turns all come out at the size asked for, through OpenCV's resize."""
    count = len(open_store(packed.result.store))
    for fit in ("crop", "pad", "stretch"):
        options = {"size": (37, 53), "fit": fit, "mode": mode, "with_paths": True}
        with open_reader(packed.result.store, batch_size=16, **options) as reader:
            seen = 0
            for images, _, paths in reader:
                channels = {"RGB": {3}, "L": {1}, "keep": {1, 2, 3, 4}}[mode]
                for image, path in zip(images, paths, strict=True):
                    assert image.dtype == np.uint8 and image.shape[:2] == (37, 53), path
                    assert image.shape[2] in channels, path
                seen += len(paths)
            assert seen == count


def test_orientation_rectangle_comes_out_upright(packed: Packed) -> None:
    path = packed.corpus.images / "orientation_rectangle.jpg"
    with Image.open(path) as im:
        assert im.size == (2, 1) and im.getexif()[0x0112] == 8  # stored 2 wide, 1 high
    with open_store(packed.result.store) as store:
        i = packed.index()["orientation_rectangle.jpg"]
        pixels, _ = store[i]
        assert store.record(i).shape == (2, 1, 3)
    assert pixels.shape == (2, 1, 3)  # upright: height 2, width 1
    assert np.array_equal(pixels, upright_rgb(path))


@pytest.mark.parametrize(
    "name",
    [
        "hopper_orientation_5.jpg",
        "hopper_orientation_6.jpg",
        "hopper_orientation_8.jpg",
        "hopper_orientation_6.webp",
    ],
)
def test_exif_orientation_is_applied(packed: Packed, name: str) -> None:
    path = packed.corpus.images / name
    with Image.open(path) as im:
        as_stored = np.asarray(im.convert("RGB"))
    with Image.open(path) as im:
        expected = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    assert not np.array_equal(as_stored, expected)  # the orientation changes the pixels
    with open_store(packed.result.store) as store:
        pixels, _ = store[packed.index()[name]]
    assert np.array_equal(pixels, expected)


@pytest.mark.parametrize("name", SIXTEEN_BIT)
def test_sixteen_bit_grey_is_scaled_not_clipped(packed: Packed, name: str) -> None:
    path = packed.corpus.images / name
    with Image.open(path) as im:
        assert im.mode in ("I;16", "I")
        source = np.asarray(im).astype(np.int64)
        clipped = np.asarray(im.convert("L"))  # what a naive convert gives: >255 becomes 255
    scaled = (source >> 8).astype(np.uint8)
    with open_store(packed.result.store) as store:
        pixels, _ = store[packed.index()[name]]
    assert pixels.shape == (*source.shape, 3)
    grey = pixels[:, :, 0]
    assert np.array_equal(pixels[:, :, 1], grey) and np.array_equal(pixels[:, :, 2], grey)
    assert np.array_equal(grey, scaled)  # the top 8 of 16 bits
    assert not np.array_equal(grey, clipped)
    assert grey.mean() < 255
    assert int(grey.max()) == int(source.max()) >> 8
    if source.max() < 0xFF00:  # 12in16bit, 16_bit_noise: nowhere near full scale
        assert grey.max() < 255


def test_hopper_16bit_pgm_is_not_all_white(packed: Packed) -> None:
    """The naive convert of this PGM is 255 almost everywhere; scaled, it is a photo."""
    with open_store(packed.result.store) as store:
        pixels, _ = store[packed.index()["hopper_16bit.pgm"]]
    with Image.open(packed.corpus.images / "hopper_16bit.pgm") as im:
        assert np.asarray(im.convert("L")).mean() > 254  # the clipping this guards against
    assert pixels.mean() < 128
    assert (pixels < 255).mean() > 0.9


# --- raw pixels, mode "keep", in HDF5 --------------------------------------------------------


def test_raw_keep_pack_skips_the_same_files(packed_raw: Packed) -> None:
    corpus = packed_raw.corpus
    assert {s.path for s in packed_raw.result.skipped} == corpus.by("skip") | NON_IMAGES
    with open_store(packed_raw.result.store) as store:
        assert len(store) == len(corpus.by("pack"))
        assert store.manifest.storage.payload == "raw"
        assert store.manifest.storage.mode == "keep"
        for record in store.records():
            assert record.format == "raw", record.path
            h, w, c = record.shape
            assert len(record.data) == h * w * c, record.path
            assert c in (1, 2, 3, 4), record.path


def _grey(path: Path) -> np.ndarray:  # L JPEG: one channel
    with Image.open(path) as im:
        assert im.mode == "L"
        return np.asarray(im)[:, :, None]


def _grey_alpha(path: Path) -> np.ndarray:  # LA PNG: two channels, alpha kept
    with Image.open(path) as im:
        assert im.mode == "LA"
        return np.asarray(im)


def _sixteen_bit(path: Path) -> np.ndarray:  # I;16: the top 8 bits, one channel
    with Image.open(path) as im:
        assert im.mode == "I;16"
        return (np.asarray(im).astype(np.uint16) >> 8).astype(np.uint8)[:, :, None]


def _rotated(path: Path) -> np.ndarray:  # 2x1 RGB, EXIF orientation 8: turn 90 degrees left
    with Image.open(path) as im:
        assert im.mode == "RGB" and im.getexif()[0x0112] == 8
        return np.rot90(np.asarray(im))


def _rgba(path: Path) -> np.ndarray:  # 32-bit BMP with alpha: four channels
    with Image.open(path) as im:
        assert im.mode == "RGBA"
        return np.asarray(im)


@pytest.mark.parametrize(
    ("name", "compute", "channels"),
    [
        ("hopper_gray.jpg", _grey, 1),
        ("uncompressed_la.png", _grey_alpha, 2),
        ("16_bit_noise.tif", _sixteen_bit, 1),
        ("orientation_rectangle.jpg", _rotated, 3),
        ("bmp/q/rgba32.bmp", _rgba, 4),
    ],
)
def test_raw_keep_pixels_match_an_independent_decode(
    packed_raw: Packed,
    name: str,
    compute,
    channels: int,  # noqa: ANN001
) -> None:
    expected = compute(packed_raw.corpus.images / name)
    assert expected.ndim == 3 and expected.shape[2] == channels
    with open_store(packed_raw.result.store) as store:
        i = packed_raw.index()[name]
        pixels, _ = store[i]
        record = store.record(i)
    assert record.shape == expected.shape
    assert pixels.dtype == np.uint8
    assert np.array_equal(pixels, expected)
