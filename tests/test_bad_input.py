"""Bad input (issue requirement "Bad input").

Corrupt, truncated, unreadable and non-image files are reported with their path and a reason
and skipped (``on_error="skip"``, the default), or stop the pack (``on_error="fail"``) with
nothing left behind. Only a full decode proves an image is good. Odd names, symlinks and
hidden entries are handled. Everything here is a real file under ``tmp_path`` made from real
Pillow bytes, packed into a real LMDB or HDF5 store and read back through ``open_store``.
"""

from __future__ import annotations

import hashlib
import io
import os
import signal
import stat
import struct
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import image_bytes, store_path, write_image
from PIL import Image

from packer.cli import cli
from packer.errors import BadImageError, EmptySourceError, LabelsError
from packer.packing.options import PackOptions
from packer.packing.pipeline import PackResult, pack
from packer.store.access import open_store
from packer.store.staging import partial_path

NOT_AN_IMAGE = "not an image (Pillow cannot identify it)"
LOOP = "links to a folder already walked (symlink loop or alias)"


# --- helpers -------------------------------------------------------------------------------


def sha(data: bytes | memoryview) -> str:
    return hashlib.sha256(bytes(data)).hexdigest()


def options(backend: str, **kwargs: object) -> PackOptions:
    kwargs.setdefault("workers", 2)
    return PackOptions(backend=backend, labels="none", seed=0, **kwargs)  # type: ignore[arg-type]


def assert_store_holds_exactly(result: PackResult, valid: dict[str, bytes]) -> None:
    """Every valid image is in the store exactly once, with its source bytes; nothing else is."""
    with open_store(result.store) as store:
        assert len(store) == len(valid)
        records = list(store.records())
    assert Counter(r.path for r in records) == Counter(dict.fromkeys(valid, 1))
    assert {r.path: sha(r.data) for r in records} == {p: sha(b) for p, b in valid.items()}
    assert result.manifest.num_records == len(valid)


def reported(result: PackResult) -> dict[str, str]:
    """{path: reason} of the skipped files; the result and the manifest on disk agree."""
    from_result = {s.path: s.reason for s in result.skipped}
    assert len(from_result) == len(result.skipped), "a file was reported twice"
    with open_store(result.store) as store:
        from_manifest = {s["path"]: s["reason"] for s in store.manifest.skipped}
        assert len(from_manifest) == len(store.manifest.skipped)
    assert from_manifest == from_result
    for reason in from_result.values():
        assert reason and "\n" not in reason
    return from_result


def nothing_left(out: Path) -> None:
    assert not out.exists() and not out.is_symlink()
    assert not partial_path(out).exists()


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header_only(width: int, height: int) -> bytes:
    """A PNG signature, an IHDR claiming ``width`` x ``height`` RGB, and IEND: no pixels."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IEND", b"")


# A JPEG and a PNG big enough that every cut below lands in the pixel data, past the header.
JPEG = image_bytes(size=(96, 64), fmt="JPEG", seed=0)
PNG = image_bytes(size=(64, 48), fmt="PNG", seed=12)
JPEG_SCAN = JPEG.find(b"\xff\xda")  # start of scan: the header ends here
PNG_IDAT = PNG.find(b"IDAT")
PNG_IEND = PNG.find(b"IEND")


def jpeg_cut(keep: int) -> bytes:
    assert JPEG_SCAN > 0 and JPEG_SCAN + 16 < keep < len(JPEG)
    return JPEG[:keep]


def png_cut(keep: int) -> bytes:
    assert 0 < PNG_IDAT + 16 < keep < PNG_IEND
    return PNG[:keep]


def corrupt_png_stream() -> bytes:
    data = bytearray(PNG)
    data[PNG_IDAT + 40 : PNG_IDAT + 60] = bytes(20)  # zlib stream damaged, chunk CRC now wrong
    return bytes(data)


def corrupt_jpeg_header() -> bytes:
    data = bytearray(JPEG)
    data[:32] = bytes(32)  # SOI and APP0 gone: no format recognises it
    return bytes(data)


# --- the zoo: every kind of bad file beside valid ones, packed once per backend and check ----


@dataclass(frozen=True)
class Bad:
    name: str  # relative path written under the source folder
    make: Callable[[Path], None]  # creates the entry at that path
    exact: str | None = None  # the reason, when it is packer's own text
    contains: tuple[str, ...] = ()  # substrings of the reason, when the text is Pillow's
    header_skips: bool = True  # also skipped with check="header" (else packed: header is fine)
    reported_as: str | None = None  # the path in the report, when not ``name``
    content: bytes | None = None  # the bytes stored when header_skips is False


def _bytes(data: bytes) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        path.write_bytes(data)

    return make


def _non_utf8(path: Path) -> None:
    raw = os.fsencode(path.parent) + b"/bad\xff.jpg"
    fd = os.open(raw, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, image_bytes(seed=7))  # a good image, but a name that is not text
    finally:
        os.close(fd)


BAD = [
    Bad("empty.jpg", _bytes(b""), exact=NOT_AN_IMAGE),
    Bad("noise.jpg", _bytes(np.random.default_rng(3).bytes(4096)), exact=NOT_AN_IMAGE),
    Bad("notes.txt", _bytes(b"not a picture\nat all\n"), exact=NOT_AN_IMAGE),
    Bad("corrupt_header.jpg", _bytes(corrupt_jpeg_header()), exact=NOT_AN_IMAGE),
    Bad(
        "corrupt_stream.png",
        _bytes(corrupt_png_stream()),
        contains=("OSError: ", "broken data stream"),
        header_skips=False,
        content=corrupt_png_stream(),
    ),
    Bad(
        "cut/jpeg_50.jpg",
        _bytes(jpeg_cut(len(JPEG) // 2)),
        contains=("OSError: ", "image file is truncated"),
        header_skips=False,
        content=jpeg_cut(len(JPEG) // 2),
    ),
    Bad(
        "cut/jpeg_90.jpg",
        _bytes(jpeg_cut(len(JPEG) * 9 // 10)),
        contains=("OSError: ", "image file is truncated"),
        header_skips=False,
        content=jpeg_cut(len(JPEG) * 9 // 10),
    ),
    # The EOI marker and the last byte of scan data. (Cutting only the 2-byte EOI marker is
    # not always caught: when the scan data is complete, Pillow decodes every pixel.)
    Bad(
        "cut/jpeg_last_3_bytes.jpg",
        _bytes(jpeg_cut(len(JPEG) - 3)),
        contains=("OSError: ", "image file is truncated"),
        header_skips=False,
        content=jpeg_cut(len(JPEG) - 3),
    ),
    Bad(
        "cut/png_50.png",
        _bytes(png_cut(len(PNG) // 2)),
        contains=("OSError: ", "truncated"),
        header_skips=False,
        content=png_cut(len(PNG) // 2),
    ),
    Bad(
        "cut/png_90.png",
        _bytes(png_cut(len(PNG) * 9 // 10)),
        contains=("OSError: ", "truncated"),
        header_skips=False,
        content=png_cut(len(PNG) * 9 // 10),
    ),
    # Claims 10 Gpx: Pillow's own DecompressionBombError fires in Image.open.
    Bad(
        "bomb_10gpx.png",
        _bytes(png_header_only(100_000, 100_000)),
        contains=("decompression bomb",),
    ),
    # Claims 100 Mpx, over packer's default limit but under Pillow's 2x error: packer's check.
    Bad(
        "bomb_100mpx.png",
        _bytes(png_header_only(10_000, 10_000)),
        exact="ValueError: decompression bomb refused: 100,000,000 pixels (10000x10000) "
        "is over the limit of 89,478,485 (--max-pixels)",
    ),
    Bad(
        "dangling.jpg",
        lambda p: os.symlink(p.parent / "no-such-file.jpg", p),
        exact="broken symlink",
    ),
    Bad("pipe.jpg", lambda p: os.mkfifo(p), exact="not a regular file"),
    Bad(
        "names/bad\udcff.jpg",
        lambda p: _non_utf8(p),
        exact="file name is not valid UTF-8",
        reported_as=repr("names/bad\udcff.jpg"),
    ),
]

# Valid images whose type is what Pillow identifies, whatever the name says.
VALID = {
    "a.jpg": (image_bytes(seed=1), "JPEG"),
    "sub/b.png": (image_bytes(size=(20, 30), fmt="PNG", seed=2), "PNG"),
    "sub/deeper/c.webp": (image_bytes(size=(17, 9), fmt="WEBP", seed=3), "WEBP"),
    "png_named.jpg": (image_bytes(size=(12, 8), fmt="PNG", seed=4), "PNG"),
    "jpeg_named.png": (image_bytes(size=(8, 12), fmt="JPEG", seed=5), "JPEG"),
    "jpeg_without_extension": (image_bytes(size=(30, 10), fmt="JPEG", seed=6), "JPEG"),
}


@dataclass
class Zoo:
    root: Path
    check: str
    result: PackResult

    def skips(self, bad: Bad) -> bool:
        return self.check == "full" or bad.header_skips

    def valid(self) -> dict[str, bytes]:
        valid = {path: data for path, (data, _) in VALID.items()}
        for bad in BAD:
            if not self.skips(bad):
                assert bad.content is not None
                valid[bad.name] = bad.content
        return valid


@pytest.fixture(scope="module")
def zoo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("zoo") / "src"
    for path, (data, _) in VALID.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    for bad in BAD:
        (root / bad.name).parent.mkdir(parents=True, exist_ok=True)
        bad.make(root / bad.name)
    return root


@pytest.fixture(
    scope="module",
    params=[("lmdb", "full"), ("hdf5", "full"), ("lmdb", "header"), ("hdf5", "header")],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def zoo(
    request: pytest.FixtureRequest, zoo_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Zoo:
    backend, check = request.param
    out = store_path(tmp_path_factory.mktemp(f"zoo-{backend}-{check}"), backend)
    return Zoo(zoo_root, check, pack(zoo_root, out, options(backend, check=check)))


def test_zoo_store_holds_every_valid_image_exactly_once(zoo: Zoo) -> None:
    assert_store_holds_exactly(zoo.result, zoo.valid())


@pytest.mark.parametrize("bad", BAD, ids=lambda b: b.name.encode("ascii", "replace").decode())
def test_zoo_bad_file_is_reported_with_path_and_reason(zoo: Zoo, bad: Bad) -> None:
    skipped = reported(zoo.result)
    path = bad.reported_as or bad.name
    if not zoo.skips(bad):  # check="header": the header is intact, so it is packed as it is
        assert path not in skipped
        with open_store(zoo.result.store) as store:
            stored = [r for r in store.records() if r.path == path]
        assert [bytes(r.data) for r in stored] == [bad.content]
        return
    assert path in skipped, f"{path} not reported; reported: {sorted(skipped)}"
    reason = skipped[path]
    if bad.exact is not None:
        assert reason == bad.exact
    for part in bad.contains:
        assert part in reason


def test_zoo_reports_nothing_but_the_bad_files(zoo: Zoo) -> None:
    expected = {bad.reported_as or bad.name for bad in BAD if zoo.skips(bad)}
    assert set(reported(zoo.result)) == expected
    assert zoo.result.manifest.source["files"] == len(VALID) + len(BAD)


def test_zoo_format_is_what_pillow_identifies_not_the_extension(zoo: Zoo) -> None:
    with open_store(zoo.result.store) as store:
        by_path = {store.record(i).path: i for i in range(len(store))}
        for path, (data, fmt) in VALID.items():
            record = store.record(by_path[path])
            assert record.format == fmt, path
            pixels, labels = store[by_path[path]]
            source = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
            assert pixels.shape == source.shape == record.shape
            assert labels.shape == (0,)
            if fmt == "PNG":  # lossless: the stored image is the source image
                assert np.array_equal(pixels, source)


# --- decompression bombs through --max-pixels on a real, small image -------------------------


def test_image_over_max_pixels_is_refused_as_a_bomb(backend: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    small = write_image(src / "small.jpg", size=(16, 16), seed=1).read_bytes()  # 256 px
    write_image(src / "big.jpg", size=(32, 24), seed=2)  # 768 px
    out = store_path(tmp_path, backend)
    result = pack(src, out, options(backend, max_pixels=500))
    assert reported(result) == {
        "big.jpg": "ValueError: decompression bomb refused: 768 pixels (32x24) "
        "is over the limit of 500 (--max-pixels)"
    }
    assert_store_holds_exactly(result, {"small.jpg": small})


def test_image_far_over_max_pixels_reports_the_limit_that_was_asked(tmp_path: Path) -> None:
    src = tmp_path / "src"
    small = write_image(src / "small.jpg", size=(8, 8), seed=1).read_bytes()  # 64 px
    write_image(src / "big.jpg", size=(32, 24), seed=2)  # 768 px > 2 x 100
    result = pack(src, store_path(tmp_path, "lmdb"), options("lmdb", max_pixels=100))
    assert_store_holds_exactly(result, {"small.jpg": small})
    reason = reported(result)["big.jpg"]
    # Pillow refuses it first (over twice the limit), in packer's words and with our limit
    assert (
        reason
        == "ValueError: decompression bomb refused: 768 pixels is over the limit of 100 (--max-pixels)"
    )


# --- walking: links, loops, hidden entries, names --------------------------------------------


def test_symlink_loops_end_the_walk_and_each_image_is_packed_once(
    backend: str, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    valid = {
        "a.jpg": write_image(src / "a.jpg", seed=1).read_bytes(),
        "sub/b.png": write_image(src / "sub" / "b.png", seed=2).read_bytes(),
        "sub/deeper/c.jpg": write_image(src / "sub" / "deeper" / "c.jpg", seed=3).read_bytes(),
    }
    os.symlink("..", src / "sub" / "loop")  # sub/loop -> the source root
    os.symlink("..", src / "sub" / "deeper" / "up")  # sub/deeper/up -> sub
    os.symlink(".", src / "sub" / "self")  # sub/self -> sub
    result = pack(src, store_path(tmp_path, backend), options(backend))
    assert_store_holds_exactly(result, valid)
    assert reported(result) == {"sub/loop": LOOP, "sub/deeper/up": LOOP, "sub/self": LOOP}


def test_hidden_files_and_folders_are_ignored_and_not_reported(
    backend: str, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    valid = {
        "a.jpg": write_image(src / "a.jpg", seed=1).read_bytes(),
        "sub/b.png": write_image(src / "sub" / "b.png", seed=2).read_bytes(),
    }
    write_image(src / ".hidden.jpg", seed=3)  # a good image, but hidden
    write_image(src / ".secret" / "c.jpg", seed=4)  # a good image in a hidden folder
    write_image(src / "sub" / ".cache" / "d.png", seed=5)
    (src / "sub" / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (src / ".git").mkdir()
    (src / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    result = pack(src, store_path(tmp_path, backend), options(backend))
    assert_store_holds_exactly(result, valid)
    assert reported(result) == {}
    assert result.manifest.source["files"] == 2


ODD_NAMES = [
    "a b.jpg",
    "  leading and trailing  .jpg",
    "it's.jpg",
    'say "cheese".jpg',
    "back\\slash.jpg",
    "percent %s %d {x}.jpg",
    "café.jpg",  # NFC
    "cafe\u0301.jpg",  # NFD: a different name, kept as a different file
    "日本語 フォルダ/写真 1.png",
    "emoji 😀/ünïcödé.jpg",
    "tab\there.jpg",
    "new\nline.jpg",
]


def test_odd_names_are_packed_and_kept_exactly(backend: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    valid = {}
    for i, name in enumerate(ODD_NAMES):
        path = src / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(image_bytes(fmt="PNG" if name.endswith(".png") else "JPEG", seed=i))
        valid[name] = path.read_bytes()
    result = pack(src, store_path(tmp_path, backend), options(backend))
    assert reported(result) == {}
    assert_store_holds_exactly(result, valid)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads chmod-000 files and folders anyway")
def test_unreadable_file_and_folder_are_reported(backend: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    valid = {"a.jpg": write_image(src / "a.jpg", seed=1).read_bytes()}
    locked = write_image(src / "locked.jpg", seed=2)
    write_image(src / "closed" / "b.jpg", seed=3)
    locked.chmod(0)
    (src / "closed").chmod(0)
    try:
        for check in ("full", "header"):
            out = store_path(tmp_path, backend, f"out-{check}")
            result = pack(src, out, options(backend, check=check))
            assert reported(result) == {
                "locked.jpg": "cannot read: Permission denied",
                "closed": "cannot list folder: Permission denied",
            }
            assert_store_holds_exactly(result, valid)
    finally:
        (src / "closed").chmod(stat.S_IRWXU)
        locked.chmod(stat.S_IRUSR | stat.S_IWUSR)


# --- on_error="fail": BadImageError naming the file, and nothing left behind -----------------


@pytest.mark.parametrize(
    ("name", "data", "reason"),
    [
        ("zz_truncated.jpg", jpeg_cut(len(JPEG) * 9 // 10), "image file is truncated"),
        ("zz_notes.txt", b"hello\n", NOT_AN_IMAGE),
    ],
    ids=["truncated-jpeg", "text-file"],
)
def test_on_error_fail_stops_the_pack_and_leaves_nothing(
    backend: str, tmp_path: Path, name: str, data: bytes, reason: str
) -> None:
    src = tmp_path / "src"
    for i in range(6):
        write_image(src / f"ok_{i}.jpg", seed=i)
    (src / name).write_bytes(data)
    out = store_path(tmp_path, backend)
    # Sorted order and 3 shards: the bad file comes last, after two shards were written.
    opts = options(backend, on_error="fail", shuffle=False, shards=3)
    with pytest.raises(BadImageError) as caught:
        pack(src, out, opts)
    error = caught.value
    assert error.path == str(src / name)
    assert reason in error.reason
    assert str(error) == f"{src / name}: {error.reason}"
    assert "\n" not in str(error)
    nothing_left(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_on_error_fail_stops_on_a_broken_symlink(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_image(src / "a.jpg", seed=1)
    os.symlink(src / "gone.jpg", src / "dangling.jpg")
    out = store_path(tmp_path, "lmdb")
    with pytest.raises(BadImageError) as caught:
        pack(src, out, options("lmdb", on_error="fail"))
    assert caught.value.path == str(src / "dangling.jpg")
    assert caught.value.reason == "broken symlink"
    nothing_left(out)


# --- whole-source errors: one line, the right class, nothing written -------------------------


@pytest.mark.parametrize("labels", ["none", "folders"])
def test_empty_source_folder(tmp_path: Path, labels: str) -> None:
    root = tmp_path / "src"
    root.mkdir()
    write_image(root / ".hidden.jpg")  # hidden files do not count
    (root / ".cache").mkdir()
    write_image(root / ".cache" / "a.jpg")
    out = store_path(tmp_path, "lmdb")
    with pytest.raises(EmptySourceError) as caught:
        pack(root, out, PackOptions(labels=labels, workers=1))
    assert str(caught.value) == f"{root}: no files to pack (hidden files are ignored)"
    nothing_left(out)


def test_class_folder_layout_without_class_folders(tmp_path: Path) -> None:
    root = tmp_path / "src"
    write_image(root / "a.jpg")  # a file, but not inside a class folder
    out = store_path(tmp_path, "lmdb")
    with pytest.raises(EmptySourceError) as caught:
        pack(root, out, PackOptions(labels="folders", workers=1))
    message = str(caught.value)
    assert message.startswith(f"{root}: no class sub-folders with files in them")
    assert "--labels none" in message and "\n" not in message
    nothing_left(out)


def test_source_with_only_bad_files(backend: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jpg").write_bytes(b"")
    (src / "b.png").write_text("text")
    (src / "c.jpg").write_bytes(jpeg_cut(len(JPEG) // 2))
    out = store_path(tmp_path, backend)
    with pytest.raises(EmptySourceError) as caught:
        pack(src, out, options(backend))
    message = str(caught.value)
    assert message.startswith(f"{src}: none of 3 files could be packed (most common reasons: ")
    assert f"{NOT_AN_IMAGE} x2" in message
    assert "image file is truncated" in message
    assert "\n" not in message
    nothing_left(out)


def _labelled_source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    write_image(src / "a.jpg", seed=1)
    write_image(src / "sub" / "b.png", seed=2)
    return src


def test_labels_csv_naming_missing_files(tmp_path: Path) -> None:
    src = _labelled_source(tmp_path)
    table = tmp_path / "labels.csv"
    table.write_text("path,label\na.jpg,cat\nsub/b.png,dog\nmissing.jpg,cat\n")
    out = store_path(tmp_path, "lmdb")
    with pytest.raises(LabelsError) as caught:
        pack(src, out, PackOptions(labels=str(table), workers=1))
    assert str(caught.value) == (
        f"{table} names 1 file(s) that do not exist under {src}, e.g. missing.jpg"
    )
    nothing_left(out)


@pytest.mark.parametrize("value", ["../x.jpg", "sub/../../x.jpg", "..\\x.jpg", "ABSOLUTE"])
def test_labels_csv_path_escaping_the_folder(tmp_path: Path, value: str) -> None:
    src = _labelled_source(tmp_path)
    write_image(tmp_path / "x.jpg", seed=9)  # it exists: refused for where it is, not as missing
    if value == "ABSOLUTE":
        value = str(tmp_path / "x.jpg")
    table = tmp_path / "labels.csv"
    table.write_text(f"path,label\na.jpg,cat\n{value},dog\n")
    out = store_path(tmp_path, "lmdb")
    with pytest.raises(LabelsError) as caught:
        pack(src, out, PackOptions(labels=str(table), workers=1))
    assert str(caught.value) == f"{table}:3: path {value!r} is not inside the source folder"
    nothing_left(out)


# --- the CLI ---------------------------------------------------------------------------------


@pytest.fixture
def runner() -> Iterator[CliRunner]:
    """A CliRunner; `packer pack` installs a SIGTERM handler, put the test process's back."""
    before = signal.getsignal(signal.SIGTERM)
    yield CliRunner()
    signal.signal(signal.SIGTERM, before)


@pytest.mark.parametrize(
    ("option", "value", "allowed"),
    [("--check", "fast", "'full', 'header'"), ("--encode", "gif", "'jpeg', 'png', 'webp'")],
)
def test_cli_unknown_option_value_is_a_usage_error(
    runner: CliRunner, tmp_path: Path, option: str, value: str, allowed: str
) -> None:
    src = _labelled_source(tmp_path)
    out = tmp_path / "out.lmdb"
    result = runner.invoke(cli, ["pack", str(src), str(out), option, value])
    assert result.exit_code == 2
    assert "Usage: " in result.output
    assert (
        f"Error: Invalid value for '{option}': '{value}' is not one of {allowed}." in result.output
    )
    nothing_left(out)


def test_cli_empty_source_is_one_error_line(runner: CliRunner, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    out = tmp_path / "out.lmdb"
    result = runner.invoke(cli, ["pack", str(src), str(out), "--labels", "none"])
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"Error: {src}: no files to pack (hidden files are ignored)"
    ]
    nothing_left(out)


def test_cli_on_error_fail_names_the_file(runner: CliRunner, backend: str, tmp_path: Path) -> None:
    src = _labelled_source(tmp_path)
    (src / "corrupt.jpg").write_bytes(corrupt_jpeg_header())
    out = store_path(tmp_path, backend)
    result = runner.invoke(
        cli,
        [
            "pack",
            str(src),
            str(out),
            "--labels",
            "none",
            "--seed",
            "0",
            "--workers",
            "2",
            "--on-error",
            "fail",
            "--quiet",
        ],
    )
    assert result.exit_code == 1
    assert result.output.splitlines() == [f"Error: {src / 'corrupt.jpg'}: {NOT_AN_IMAGE}"]
    nothing_left(out)
