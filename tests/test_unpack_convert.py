"""`unpack_store` and `convert_store` on real stores, both backends: nothing lost, nothing
changed, nothing written outside the folder asked for, nothing half-written."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from helpers import image_bytes, rewrite_lmdb_record, shard_checksum, store_path, write_image
from PIL import Image

from packer import PackOptions, open_reader, pack, read_manifest
from packer.errors import (
    CorruptRecordError,
    PackInterrupted,
    StoreError,
    StoreExistsError,
    UsageError,
)
from packer.inspect.convert import convert_store
from packer.inspect.unpack import unpack_store
from packer.store.access import open_store
from packer.store.manifest import write_manifest
from packer.store.record import Record


def _options(backend: str = "lmdb", **kwargs: object) -> PackOptions:
    kwargs.setdefault("seed", 1)
    kwargs.setdefault("workers", 2)
    return PackOptions(backend=backend, **kwargs)  # type: ignore[arg-type]


def _files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (hidden ones included), by relative path."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _fields(store: Path) -> list[tuple[Any, ...]]:
    with open_store(store) as s:
        return [(bytes(r.data), r.labels, r.path, r.crc32, r.shape, r.format) for r in s.records()]


def _rewrite_lmdb_record(store: Path, index: int, **changes: Any) -> Record:
    record = rewrite_lmdb_record(store, index, **changes)
    assert isinstance(record, Record)
    return record


def _everything_under(root: Path, but: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p != but and not p.is_relative_to(but)
    }


# --------------------------------------------------------------------------- unpack


def test_unpack_round_trip_is_byte_identical(image_dir: Path, tmp_path: Path, backend: str) -> None:
    store = store_path(tmp_path, backend)
    pack(image_dir, store, _options(backend, shards=2))
    calls: list[tuple[int, int]] = []
    result = unpack_store(store, tmp_path / "out", progress=lambda d, t: calls.append((d, t)))
    source = _files(image_dir)
    assert _files(tmp_path / "out") == source  # every file, bytes identical, nothing extra
    assert (result.files, result.bytes) == (21, sum(len(b) for b in source.values()))
    assert calls == [(i, 21) for i in range(1, 22)]
    report = result.to_json()
    assert report["files"] == 21 and report["layout"] == "paths"
    assert report["outdir"] == str(tmp_path / "out")


def test_unpack_takes_an_open_store_and_leaves_it_open(image_dir: Path, tmp_path: Path) -> None:
    pack(image_dir, tmp_path / "s.lmdb", _options())
    with open_store(tmp_path / "s.lmdb") as store:
        unpack_store(store, tmp_path / "out")
        assert store.record(3).path  # still usable
    assert _files(tmp_path / "out") == _files(image_dir)


def test_unpack_classes_layout_and_deterministic_names(tmp_path: Path, backend: str) -> None:
    root = tmp_path / "images"
    for n, rel in enumerate(
        ["cat/a/x.jpg", "cat/b/x.jpg", "cat/c/x.jpg", "cat/y.png", "dog/x.jpg", "dog/z.jpg"]
    ):
        write_image(root / rel, size=(10 + n, 12), seed=n)
    store = store_path(tmp_path, backend)
    pack(root, store, _options(backend))
    unpack_store(store, tmp_path / "one", layout="classes")
    unpack_store(store, tmp_path / "two", layout="classes")
    one = _files(tmp_path / "one")
    assert one == _files(tmp_path / "two")  # the same names every time

    expected: dict[str, bytes] = {}
    with open_store(store) as s:
        for i, record in enumerate(s.records()):
            label = s.manifest.label_columns[0]["classes"][record.labels[0]]
            assert label == record.path.split("/")[0]
            name = f"{label}/{record.path.rsplit('/', 1)[-1]}"
            if name in expected:  # a later record with a name taken: -<its index>
                name = name.replace(".jpg", f"-{i}.jpg")
            expected[name] = (root / record.path).read_bytes()
    assert one == expected
    assert sorted(n.split("/")[0] for n in one) == ["cat"] * 4 + ["dog"] * 2
    assert sum(n.startswith("cat/x-") for n in one) == 2


def test_unpack_classes_with_integer_labels_and_without_labels(
    image_dir: Path, tmp_path: Path
) -> None:
    table = tmp_path / "labels.csv"
    paths = sorted(p.relative_to(image_dir).as_posix() for p in image_dir.rglob("*.*"))
    table.write_text("path,label\n" + "".join(f"{p},{i % 4 + 10}\n" for i, p in enumerate(paths)))
    pack(image_dir, tmp_path / "csv.lmdb", _options(labels=str(table)))
    unpack_store(tmp_path / "csv.lmdb", tmp_path / "out", layout="classes")
    out = _files(tmp_path / "out")
    for i, p in enumerate(paths):
        assert out[f"{i % 4 + 10}/{p.split('/')[1]}"] == (image_dir / p).read_bytes()
    assert len(out) == 21

    pack(image_dir, tmp_path / "none.lmdb", _options(labels="none"))
    with pytest.raises(UsageError, match="has no labels"):
        unpack_store(tmp_path / "none.lmdb", tmp_path / "none", layout="classes")
    with pytest.raises(UsageError, match="layout must be one of"):
        unpack_store(tmp_path / "none.lmdb", tmp_path / "none", layout="flat")


@pytest.mark.parametrize(
    ("backend", "extra"),
    [("lmdb", {}), ("hdf5", {}), ("hdf5", {"size": (12, 10), "mode": "L"})],
    ids=["lmdb", "hdf5", "hdf5-fixed-grey"],
)
def test_unpack_raw_store_writes_pngs_of_the_stored_pixels(
    image_dir: Path, tmp_path: Path, backend: str, extra: dict[str, Any]
) -> None:
    write_image(image_dir / "cat" / "cat_1.png", size=(9, 7), seed=99)  # beside cat_1.jpg
    store = store_path(tmp_path, backend)
    pack(image_dir, store, _options(backend, raw=True, **extra))
    result = unpack_store(store, tmp_path / "out")
    out = tmp_path / "out"
    assert result.files == 22 and len(_files(out)) == 22
    seen: set[str] = set()
    with open_store(store) as s:
        for i, record in enumerate(s.records()):
            name = record.path.rsplit(".", 1)[0] + ".png"
            if name in seen:  # cat_1.jpg and cat_1.png both became cat_1.png
                name = name.replace(".png", f"-{i}.png")
            seen.add(name)
            with Image.open(out / name) as im:
                assert im.format == "PNG"
                pixels = np.asarray(im)
            assert np.array_equal(pixels.reshape(s[i][0].shape), s[i][0])
    assert "cat/cat_1.png" in seen and any(n.startswith("cat/cat_1-") for n in seen)


@pytest.mark.parametrize(("encode", "ext"), [("jpeg", ".jpg"), ("webp", ".webp")])
def test_unpack_reencoded_store_keeps_bytes_with_their_extension(
    image_dir: Path, tmp_path: Path, encode: str, ext: str
) -> None:
    pack(image_dir, tmp_path / "s.lmdb", _options(encode=encode, max_side=20))
    unpack_store(tmp_path / "s.lmdb", tmp_path / "out")
    out = _files(tmp_path / "out")
    with open_store(tmp_path / "s.lmdb") as s:
        expected = {r.path.rsplit(".", 1)[0] + ext: bytes(r.data) for r in s.records()}
    assert out == expected


@pytest.mark.parametrize("evil", ["../evil.jpg", "a/../../evil.jpg", "/ABSOLUTE", ""])
def test_unpack_refuses_a_path_leaving_outdir(image_dir: Path, tmp_path: Path, evil: str) -> None:
    evil = evil.replace("/ABSOLUTE", str(tmp_path / "evil.jpg"))
    store = tmp_path / "s.lmdb"
    pack(image_dir, store, _options(shards=2))
    _rewrite_lmdb_record(store, 15, path=evil)
    outdir = tmp_path / "nest" / "out"
    outdir.parent.mkdir()
    before = _everything_under(tmp_path, outdir)
    with pytest.raises(StoreError, match=rf"record 15 has path {evil!r}, which is absolute"):
        unpack_store(store, outdir)
    assert _everything_under(tmp_path, outdir) == before  # nothing written outside outdir
    assert len(_files(outdir)) == 15  # the records before it, inside
    with pytest.raises(StoreError, match="record 15"):  # whatever the layout
        unpack_store(store, tmp_path / "classes", layout="classes")


def test_unpack_refuses_a_symlink_out_of_outdir(image_dir: Path, tmp_path: Path) -> None:
    pack(image_dir, tmp_path / "s.lmdb", _options())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    outdir = tmp_path / "out"
    outdir.mkdir()
    (outdir / "dog").symlink_to(elsewhere)
    with pytest.raises(
        StoreError,
        match=r"leads outside .*\(a symbolic link\); refusing to write record \d+ \(dog/",
    ):
        unpack_store(tmp_path / "s.lmdb", outdir, overwrite=True)
    assert list(elsewhere.iterdir()) == []


def test_unpack_refuses_an_unsafe_class_name(image_dir: Path, tmp_path: Path) -> None:
    store = tmp_path / "s.lmdb"
    pack(image_dir, store, _options())
    manifest = read_manifest(store)
    manifest.label_columns[0]["classes"][1] = "../up"
    write_manifest(store, manifest)
    with pytest.raises(StoreError, match="class name '../up' is not a safe folder name"):
        unpack_store(store, tmp_path / "a" / "out", layout="classes")
    assert not (tmp_path / "a" / "up").exists()
    unpack_store(store, tmp_path / "b")  # the paths layout does not use class names


def test_unpack_refuses_a_nonempty_outdir_unless_overwrite(image_dir: Path, tmp_path: Path) -> None:
    store = tmp_path / "s.lmdb"
    pack(image_dir, store, _options())
    outdir = tmp_path / "out"
    (outdir / "cat").mkdir(parents=True)
    (outdir / "cat" / "cat_1.jpg").write_bytes(b"old")
    (outdir / "notes.txt").write_bytes(b"mine")
    with pytest.raises(StoreExistsError, match="is not empty; pass --overwrite"):
        unpack_store(store, outdir)
    assert _files(outdir) == {"cat/cat_1.jpg": b"old", "notes.txt": b"mine"}
    unpack_store(store, outdir, overwrite=True)
    assert _files(outdir) == {**_files(image_dir), "notes.txt": b"mine"}

    (tmp_path / "a_file").write_bytes(b"x")
    with pytest.raises(StoreExistsError, match="not a folder"):
        unpack_store(store, tmp_path / "a_file", overwrite=True)
    with pytest.raises(UsageError, match="inside the store"):
        unpack_store(store, store / "unpacked")
    (tmp_path / "empty").mkdir()
    assert unpack_store(store, tmp_path / "empty").files == 21  # an empty folder is fine


def test_unpack_stops_at_a_damaged_record(image_dir: Path, tmp_path: Path) -> None:
    store = tmp_path / "s.lmdb"
    pack(image_dir, store, _options())
    with open_store(store) as s:
        data = bytearray(s.record(9).data)
    data[len(data) // 2] ^= 0xFF
    damaged = _rewrite_lmdb_record(store, 9, data=bytes(data))  # the CRC is left as it was
    with pytest.raises(
        CorruptRecordError, match=rf"record 9 in shard-00000.lmdb \({damaged.path}\)"
    ):
        unpack_store(store, tmp_path / "out")
    out = _files(tmp_path / "out")
    assert len(out) == 9 and damaged.path not in out
    assert all(out[p] == (image_dir / p).read_bytes() for p in out)


@pytest.mark.parametrize("workers", [1, 3])
def test_unpack_of_raw_pixels_writes_every_record_before_a_damaged_one(
    image_dir: Path, tmp_path: Path, workers: int
) -> None:
    """PNGs are encoded in threads, ahead of the writing; the damage stops it all the same."""
    store = store_path(tmp_path, "hdf5")
    pack(image_dir, store, _options("hdf5", raw=True, size=(8, 8)))
    with open_store(store) as s:
        before = {s.record(i).path.rsplit(".", 1)[0] + ".png": s[i][0] for i in range(9)}
        damaged = s.record(9).path
    with h5py.File(store / read_manifest(store).shards[0].file, "r+") as f:
        pixels = f["images"][9]
        pixels[0, 0, 0] ^= 0xFF
        f["images"][9] = pixels  # the CRC is left as it was
    with pytest.raises(CorruptRecordError, match=rf"record 9 in shard-00000.h5 \({damaged}\)"):
        unpack_store(store, tmp_path / "out", workers=workers)
    out = _files(tmp_path / "out")
    assert sorted(out) == sorted(before)
    for name, pixels in before.items():
        with Image.open(tmp_path / "out" / name) as im:
            assert np.array_equal(np.asarray(im.convert("RGB")), pixels)
    assert not [t for t in threading.enumerate() if t.name.startswith("packer-unpack")]


def _ctrl_c_at_the_sixth_rename(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C at the worst moment, between writing a file and renaming it into place."""
    real_replace, calls = os.replace, []

    def interrupted(src: Any, dst: Any) -> None:
        calls.append(dst)
        if len(calls) == 6:
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", interrupted)


def test_interrupted_unpack_leaves_only_complete_files(
    image_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "s.h5"
    pack(image_dir, store, _options("hdf5"))
    _ctrl_c_at_the_sixth_rename(monkeypatch)
    with pytest.raises(PackInterrupted, match="5 complete file"):
        unpack_store(store, tmp_path / "out")
    monkeypatch.undo()
    out = _files(tmp_path / "out")
    assert len(out) == 5  # no temporary file left, and the sixth not under its name
    assert all(out[p] == (image_dir / p).read_bytes() for p in out)


def test_unpack_refuses_a_negative_worker_count(image_dir: Path, tmp_path: Path) -> None:
    store = tmp_path / "s.lmdb"
    pack(image_dir, store, _options())
    with pytest.raises(UsageError, match="workers must be 0 .all cores. or more, not -2"):
        unpack_store(store, tmp_path / "out", workers=-2)
    assert not (tmp_path / "out").exists()


def test_interrupted_unpack_of_raw_pixels_stops_its_threads(
    image_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = store_path(tmp_path, "lmdb")
    pack(image_dir, store, _options(raw=True, size=(8, 8)))
    _ctrl_c_at_the_sixth_rename(monkeypatch)
    with pytest.raises(PackInterrupted, match="5 complete file"):
        unpack_store(store, tmp_path / "out", workers=3)
    monkeypatch.undo()
    assert not [t for t in threading.enumerate() if t.name.startswith("packer-unpack")]
    assert len(_files(tmp_path / "out")) == 5


# --------------------------------------------------------------------------- convert


def _batches(store: Path, epoch: int) -> list[tuple[list[np.ndarray], np.ndarray, list[str]]]:
    with open_reader(store, batch_size=4, seed=3, with_paths=True, chunk_size=3) as reader:
        return [
            ([np.asarray(im) for im in images], np.asarray(labels), list(paths))
            for images, labels, paths in reader.epoch(epoch)
        ]


def _same_batches(a: Path, b: Path) -> None:
    for epoch in (0, 1):
        left, right = _batches(a, epoch), _batches(b, epoch)
        assert len(left) == len(right) > 0
        for (images_a, labels_a, paths_a), (images_b, labels_b, paths_b) in zip(left, right):
            assert paths_a == paths_b and np.array_equal(labels_a, labels_b)
            assert all(np.array_equal(x, y) for x, y in zip(images_a, images_b, strict=True))


@pytest.mark.parametrize(
    "extra", [{}, {"raw": True, "size": (12, 10)}], ids=["original", "raw-fixed-size"]
)
def test_convert_lmdb_to_hdf5_and_back_keeps_every_record(
    image_dir: Path, tmp_path: Path, extra: dict[str, Any]
) -> None:
    src, h5, back = tmp_path / "src.lmdb", tmp_path / "conv.h5", tmp_path / "back.lmdb"
    original = pack(image_dir, src, _options(shards=3, **extra)).manifest
    calls: list[tuple[int, int]] = []
    to_h5 = convert_store(src, h5, progress=lambda d, t: calls.append((d, t)))
    to_lmdb = convert_store(h5, back)
    assert calls[-1] == (21, 21) and len(calls) == 21

    records = _fields(src)
    assert _fields(h5) == records and _fields(back) == records  # every field, same order
    for converted, path, backend in ((to_h5, h5, "hdf5"), (to_lmdb, back, "lmdb")):
        assert read_manifest(path).to_json() == converted.to_json()
        assert converted.backend == backend and converted.num_records == 21
        assert [s.num_records for s in converted.shards] == [7, 7, 7]  # same boundaries
        assert [s.payload_bytes for s in converted.shards] == [
            s.payload_bytes for s in original.shards
        ]
        for name in (
            "storage",
            "label_source",
            "label_columns",
            "seed",
            "shuffled",
            "stats",
            "skipped",
            "source",
        ):
            assert getattr(converted, name) == getattr(original, name), name
        for shard in converted.shards:
            data = (path / shard.file).read_bytes()
            assert (len(data), shard_checksum(data)) == (shard.bytes, shard.checksum)
        assert sorted(os.listdir(path)) == ["manifest.json"] + [s.file for s in converted.shards]
        assert converted.options["backend"] == backend
        assert converted.options["seed"] == original.options["seed"]
        with open_store(path) as a, open_store(src) as b:
            assert all(a.locate(i) == b.locate(i) for i in range(21))
        _same_batches(src, path)
    assert to_h5.options["converted_from"]["backend"] == "lmdb"
    assert to_h5.options["converted_from"]["store"] == str(src.resolve())
    assert to_lmdb.options["converted_from"]["backend"] == "hdf5"
    assert to_lmdb.options["converted_from"]["converted_from"]["backend"] == "lmdb"
    with h5py.File(h5 / "shard-00001.h5", "r") as f:
        if extra:
            assert f["images"].shape == (7, 12, 10, 3) and "data" not in f
        else:
            assert "data" in f and "images" not in f


def test_convert_keeps_empty_shards_and_skipped_files(image_dir: Path, tmp_path: Path) -> None:
    whole = image_bytes((30, 30), "JPEG", seed=5)
    (image_dir / "dog" / "zz_cut.jpg").write_bytes(whole[: len(whole) // 2])
    src = tmp_path / "src.h5"
    original = pack(image_dir, src, _options("hdf5", shards=22)).manifest
    counts = [s.num_records for s in original.shards]
    assert 0 in counts and len(original.skipped) == 1
    converted = convert_store(src, tmp_path / "dest.lmdb")
    assert [s.num_records for s in converted.shards] == counts
    assert converted.skipped == original.skipped
    assert _fields(tmp_path / "dest.lmdb") == _fields(src)


def test_convert_with_a_shard_size_cuts_new_shards(image_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "src.lmdb"
    pack(image_dir, src, _options())
    converted = convert_store(src, tmp_path / "dest.h5", shard_size=4000)
    assert len(converted.shards) > 2
    for shard in converted.shards:
        assert shard.payload_bytes <= 4000 or shard.num_records == 1
    assert converted.options["shard_size"] == 4000
    assert _fields(tmp_path / "dest.h5") == _fields(src)
    converted = convert_store(src, tmp_path / "dest2.h5", shard_size="1MB")
    assert len(converted.shards) == 1


def test_convert_refuses_an_existing_dest_unless_overwrite(image_dir: Path, tmp_path: Path) -> None:
    src, dest = tmp_path / "src.lmdb", tmp_path / "dest.h5"
    pack(image_dir, src, _options())
    pack(image_dir, dest, _options("hdf5", seed=7))
    with pytest.raises(StoreExistsError, match="already exists; pass --overwrite"):
        convert_store(src, dest)
    assert read_manifest(dest).seed == 7
    convert_store(src, dest, overwrite=True)
    assert read_manifest(dest).seed == 1 and "converted_from" in read_manifest(dest).options
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest.h5", "images", "src.lmdb"]

    with pytest.raises(UsageError, match="overlap"):
        convert_store(src, src, backend="hdf5", overwrite=True)
    with pytest.raises(UsageError, match="cannot tell the backend"):
        convert_store(src, tmp_path / "dest.store")
    convert_store(src, tmp_path / "dest.store", backend="hdf5")
    assert read_manifest(tmp_path / "dest.store").backend == "hdf5"


def test_convert_error_midway_leaves_nothing(image_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "src.lmdb"
    pack(image_dir, src, _options(shards=3))
    with open_store(src) as s:
        data = bytearray(s.record(18).data)
    data[0] ^= 0xFF
    _rewrite_lmdb_record(src, 18, data=bytes(data))  # in the last shard: two are written first
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(CorruptRecordError, match="record 18 in shard-00002.lmdb"):
        convert_store(src, tmp_path / "dest.h5")
    assert sorted(os.listdir(tmp_path)) == before  # no dest, no dest.partial


@pytest.mark.parametrize(("source", "target"), [("lmdb", "hdf5"), ("hdf5", "lmdb")])
def test_interrupted_convert_leaves_nothing(
    image_dir: Path, tmp_path: Path, source: str, target: str
) -> None:
    src = store_path(tmp_path, source, "src")
    pack(image_dir, src, _options(source, shards=3))
    dest = store_path(tmp_path, target, "dest")
    before = sorted(os.listdir(tmp_path))

    def ctrl_c(done: int, total: int) -> None:
        if done == 10:
            raise KeyboardInterrupt

    with pytest.raises(PackInterrupted, match="nothing was written"):
        convert_store(src, dest, progress=ctrl_c)
    assert sorted(os.listdir(tmp_path)) == before
    convert_store(src, dest)  # and the same conversion then just works
    assert _fields(dest) == _fields(src)
