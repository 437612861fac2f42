"""`pack` end to end, on both backends: nothing lost, nothing doubled, order as promised."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import encoded, shard_checksum, store_path, write_image
from PIL import Image, ImageOps

from packer import PackOptions, pack, read_manifest
from packer.errors import PackerError, StoreError, StoreExistsError
from packer.imaging import decode as imaging
from packer.packing.scan import Skipped
from packer.packing.source import load_source
from packer.store.access import open_store
from packer.store.record import checksum


def _sha(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def _options(backend: str, **kwargs: object) -> PackOptions:
    kwargs.setdefault("seed", 1)
    kwargs.setdefault("workers", 2)
    return PackOptions(backend=backend, **kwargs)  # type: ignore[arg-type]


def test_round_trip_every_image_exactly_once_bytes_identical(
    image_dir: Path, tmp_path: Path, backend: str
) -> None:
    out = store_path(tmp_path, backend)
    result = pack(image_dir, out, _options(backend))
    sources = {p.relative_to(image_dir).as_posix(): p.read_bytes() for p in image_dir.rglob("*.*")}
    with open_store(out) as store:
        records = list(store.records())
        assert len(store) == len(records) == len(sources) == result.manifest.num_records
        assert sorted(r.path for r in records) == sorted(sources)  # each exactly once
        classes = result.manifest.label_columns[0]["classes"]
        for r in records:
            assert bytes(r.data) == sources[r.path]
            assert classes[r.labels[0]] == r.path.split("/")[0]
            with Image.open(image_dir / r.path) as im:
                assert r.shape == (im.height, im.width, 3)
                assert r.format == im.format
    assert not out.with_name(out.name + ".partial").exists()
    assert result.skipped == []


def test_raw_pixels_equal_pillow_decode_with_exif(tmp_path: Path, backend: str) -> None:
    root = tmp_path / "imgs"
    write_image(root / "a" / "plain.png", size=(7, 5), seed=1)
    pixels = np.random.default_rng(2).integers(0, 256, (4, 9, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = 6
    (root / "b").mkdir()
    Image.fromarray(pixels).save(root / "b" / "turned.png", exif=exif)
    exif[0x0112] = 8  # a JPEG: its pixels come from libjpeg-turbo, turned as Pillow turns them
    Image.fromarray(np.kron(pixels, np.ones((4, 4, 1), np.uint8))).save(
        root / "b" / "turned.jpg", exif=exif, quality=90
    )
    out = store_path(tmp_path, backend)
    pack(root, out, _options(backend, raw=True))
    with open_store(out) as store:
        by_path = {store.record(i).path: store[i][0] for i in range(len(store))}
    for rel, image in by_path.items():
        with Image.open(root / rel) as im:
            expected = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
        assert np.array_equal(image, expected)
    assert by_path["b/turned.png"].shape == (9, 4, 3)  # upright: width and height swapped
    assert by_path["b/turned.jpg"].shape == (36, 16, 3)


def test_raw_fixed_size_in_hdf5_is_one_n_h_w_c_array(image_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "raw.h5"
    result = pack(image_dir, out, _options("hdf5", raw=True, size=(12, 10), mode="L"))
    assert result.manifest.storage.shape == [12, 10, 1]
    import h5py

    with h5py.File(out / "shard-00000.h5", "r") as f:
        assert f["images"].shape == (21, 12, 10, 1) and f["images"].dtype == np.uint8
    with open_store(out) as store:
        assert all(store[i][0].shape == (12, 10, 1) for i in range(len(store)))


@pytest.mark.parametrize("encode", ["jpeg", "png", "webp"])
def test_reencode_with_max_side(image_dir: Path, tmp_path: Path, encode: str) -> None:
    out = tmp_path / "small.lmdb"
    result = pack(image_dir, out, _options("lmdb", encode=encode, max_side=20, quality=80))
    assert result.manifest.storage.payload == "encoded"
    assert result.manifest.storage.encoding == encode
    with open_store(out) as store:
        for i in range(len(store)):
            record = store.record(i)
            assert record.format == encode.upper()
            image, _ = store[i]
            assert max(image.shape[:2]) <= 20 and image.shape == record.shape
            with Image.open(image_dir / record.path) as im:
                if max(im.size) <= 20:  # never enlarged
                    assert image.shape[:2] == (im.height, im.width)


def test_fixed_size_crop(image_dir: Path, tmp_path: Path, backend: str) -> None:
    out = store_path(tmp_path, backend)
    pack(image_dir, out, _options(backend, size=(16, 24), fit="crop", encode="png"))
    with open_store(out) as store:
        assert {store[i][0].shape for i in range(len(store))} == {(16, 24, 3)}


def test_order_is_a_seeded_permutation(image_dir: Path, tmp_path: Path, backend: str) -> None:
    def order(name: str, **kwargs: object) -> list[str]:
        out = store_path(tmp_path, backend, name)
        pack(image_dir, out, _options(backend, **kwargs))
        with open_store(out) as store:
            return [r.path for r in store.records()]

    first, again, other = order("a", seed=5), order("b", seed=5, workers=1), order("c", seed=6)
    sorted_paths = [i.path for i in load_source(image_dir).items]
    assert sorted(first) == sorted_paths and first != sorted_paths
    assert first == again  # same inputs + seed -> same order, whatever the worker count
    assert other != first
    assert order("d", shuffle=False) == sorted_paths
    shard_a = read_manifest(store_path(tmp_path, backend, "a")).shards
    shard_b = read_manifest(store_path(tmp_path, backend, "b")).shards
    assert [s.checksum for s in shard_a] == [s.checksum for s in shard_b]  # identical content


def test_seed_is_recorded_when_not_given(image_dir: Path, tmp_path: Path) -> None:
    first = pack(image_dir, tmp_path / "a.lmdb", PackOptions(workers=2))
    again = pack(image_dir, tmp_path / "b.lmdb", PackOptions(workers=2, seed=first.manifest.seed))
    assert isinstance(first.manifest.seed, int)
    assert [s.checksum for s in first.manifest.shards] == [
        s.checksum for s in again.manifest.shards
    ]


@pytest.mark.parametrize("shards", [1, 3, 21, 50])
def test_fixed_number_of_shards(image_dir: Path, tmp_path: Path, backend: str, shards: int) -> None:
    out = store_path(tmp_path, backend)
    manifest = pack(image_dir, out, _options(backend, shards=shards)).manifest
    counts = [s.num_records for s in manifest.shards]
    assert len(counts) == min(shards, 21) and sum(counts) == 21
    assert max(counts) - min(counts) <= 1
    _check_global_index(out)


def test_shard_size_bounds_each_shard(image_dir: Path, tmp_path: Path, backend: str) -> None:
    out = store_path(tmp_path, backend)
    limit = 4000
    manifest = pack(image_dir, out, _options(backend, shard_size=limit)).manifest
    assert len(manifest.shards) > 2
    for shard in manifest.shards:
        assert shard.payload_bytes <= limit or shard.num_records == 1
    _check_global_index(out)


def _check_global_index(out: Path) -> None:
    """Record i is at (shard, offset) and the shards front to back give the store order."""
    with open_store(out) as store:
        in_order = [r.path for r in store.records()]
        for i in range(len(store)):
            shard, offset = store.locate(i)
            assert store.shard(shard).read_record(offset).path == in_order[i]
            assert store.record(i).path == in_order[i]


def test_manifest_records_how_the_store_was_made(
    image_dir: Path, tmp_path: Path, backend: str
) -> None:
    out = store_path(tmp_path, backend)
    pack(image_dir, out, _options(backend, seed=42))
    m = read_manifest(out)
    assert (m.backend, m.num_records, m.seed, m.shuffled) == (backend, 21, 42, True)
    assert m.label_source == "folders"
    assert m.stats["label_counts"] == [{"0": 7, "1": 7, "2": 7}]
    assert m.stats["formats"] == {"JPEG": 12, "PNG": 9}
    assert m.options["check"] == "full" and m.options["seed"] == 42
    for shard in m.shards:
        data = (out / shard.file).read_bytes()
        assert (len(data), shard_checksum(data)) == (shard.bytes, shard.checksum)
    assert sorted(os.listdir(out)) == ["manifest.json"] + [s.file for s in m.shards]


def test_existing_output_is_refused_unless_overwrite(image_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.lmdb"
    pack(image_dir, out, _options("lmdb", seed=1))
    with pytest.raises(StoreExistsError, match="already exists; pass --overwrite"):
        pack(image_dir, out, _options("lmdb", seed=2))
    assert read_manifest(out).seed == 1
    pack(image_dir, out, _options("lmdb", seed=2, overwrite=True))
    assert read_manifest(out).seed == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "out.lmdb"]


def test_overwrite_never_deletes_a_folder_that_is_not_a_store(
    image_dir: Path, tmp_path: Path
) -> None:
    precious = tmp_path / "precious.lmdb"
    write_image(precious / "photo.jpg")
    with pytest.raises(StoreExistsError, match="not a packer store; refusing"):
        pack(image_dir, precious, _options("lmdb", overwrite=True))
    assert (precious / "photo.jpg").exists()


def test_output_inside_source_is_refused(image_dir: Path) -> None:
    with pytest.raises(PackerError, match="inside the source folder"):
        pack(image_dir, image_dir / "out.lmdb", _options("lmdb"))


def test_stale_partial_is_replaced_but_a_live_one_is_respected(
    image_dir: Path, tmp_path: Path
) -> None:
    import fcntl

    out = tmp_path / "out.lmdb"
    partial = tmp_path / "out.lmdb.partial"
    partial.mkdir()
    (partial / "shard-00000.lmdb").write_bytes(b"half")
    (partial / ".lock").touch()
    with open(partial / ".lock") as held:  # another pack still running
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(StoreError, match="another pack is writing"):
            pack(image_dir, out, _options("lmdb"))
    pack(image_dir, out, _options("lmdb"))  # the lock is gone: a crashed pack's leftovers
    assert read_manifest(out).num_records == 21 and not partial.exists()


def test_a_store_keeps_a_bounded_number_of_shards_open(
    image_dir: Path, tmp_path: Path, backend: str
) -> None:
    from packer.store import access

    out = store_path(tmp_path, backend)
    pack(image_dir, out, _options(backend, shards=21))  # one record per shard
    with open_store(out) as store:
        for i in reversed(range(len(store))):  # touch every shard
            assert store.record(i).path
            assert len(store._readers) <= access.OPEN_SHARDS
        assert len(store._readers) == min(access.OPEN_SHARDS, 21)
        _check_global_index(out)


def test_kept_bytes_are_read_once_and_still_checked_against_the_scan(tmp_path: Path) -> None:
    """A Dask task keeps the bytes its check read (the local pack's pool does not, to keep
    them out of its pipes): the file is not read again, and a size change is still caught."""
    from packer.packing.prepare import prepare_file
    from packer.packing.shard_job import to_record
    from packer.packing.source import SourceItem

    path = write_image(tmp_path / "a.jpg", seed=1)
    data, options = path.read_bytes(), PackOptions(seed=0)
    item = SourceItem("a.jpg", len(data), (0,))
    kept, plain = prepare_file(path, options, True), prepare_file(path, options)
    path.unlink()  # from here on, only what was kept is there to read
    record = to_record(tmp_path, item, kept, options)
    assert not isinstance(record, Skipped) and bytes(record.data) == data
    assert record.crc32 == checksum(data)
    assert to_record(tmp_path, item, plain, options) == Skipped(
        "a.jpg", "cannot read: No such file or directory"
    )
    grown = SourceItem("a.jpg", len(data) - 1, (0,))  # the file the scan saw was smaller
    assert to_record(tmp_path, grown, kept, options) == Skipped(
        "a.jpg", "file changed while packing"
    )


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise on this OS")
@pytest.mark.parametrize("check", ["full", "header"])
def test_every_file_is_announced_to_the_kernel_before_it_is_read(
    image_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, check: str
) -> None:
    """Files get a WILLNEED hint ahead of their reads (as their task goes to the pool; with a
    header check, up to _HINT_BYTES ahead), so cold reads are in flight early; a hint never
    blocks (a FIFO) nor fails a pack (a missing file)."""
    from packer.packing.pipeline import _will_read

    hinted: list[str] = []
    real = os.posix_fadvise

    def spy(fd: int, offset: int, length: int, advice: int) -> None:
        assert advice == os.POSIX_FADV_WILLNEED
        hinted.append(os.readlink(f"/proc/self/fd/{fd}") if Path("/proc/self").exists() else "")
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", spy)
    result = pack(image_dir, tmp_path / "out.lmdb", PackOptions(seed=0, workers=1, check=check))
    assert len(hinted) == result.manifest.num_records + len(result.skipped)
    if Path("/proc/self").exists():
        assert sorted(hinted) == sorted(str(p.resolve()) for p in image_dir.rglob("*.*"))
    fifo, plain = tmp_path / "pipe.jpg", write_image(tmp_path / "a.jpg", seed=1)
    os.mkfifo(fifo)
    hinted.clear()
    done = threading.Event()
    paths, sizes = (
        [str(fifo), str(tmp_path / "gone.jpg"), str(plain)],
        [0, 10, plain.stat().st_size],
    )
    announced: list[int] = []
    threading.Thread(
        target=lambda: (announced.append(_will_read(paths, sizes, 1 << 20)), done.set()),
        daemon=True,
    ).start()
    assert done.wait(10)  # returned: the FIFO did not block it, the missing file did not stop it
    assert len(hinted) == 2 and announced == [sizes[2]]  # the FIFO and the real file


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise on this OS")
@pytest.mark.parametrize("check", ["full", "header"])
def test_hints_stay_within_their_byte_budget(
    image_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, check: str
) -> None:
    """Files are announced in order while they fit in what is left of the budget; a pack
    whose budget is used up still packs every file, unannounced."""
    import sys

    from packer.packing.pipeline import _will_read

    files = sorted(image_dir.rglob("*.*"))
    sizes = [f.stat().st_size for f in files]
    paths = [str(f) for f in files]
    assert _will_read(paths, sizes, sizes[0] + sizes[1]) == sizes[0] + sizes[1]
    assert _will_read(paths, sizes, sizes[0] + sizes[1] - 1) == sizes[0]  # the 2nd: no room
    assert _will_read(paths, sizes, 0) == 0

    hinted: list[int] = []
    real = os.posix_fadvise
    monkeypatch.setattr(os, "posix_fadvise", lambda *a: (hinted.append(a[0]), real(*a))[1])
    monkeypatch.setattr(sys.modules["packer.packing.pipeline"], "_HINT_BYTES", 0)
    options = PackOptions(seed=0, workers=1, check=check)
    result = pack(image_dir, tmp_path / "none.lmdb", options)
    assert result.manifest.num_records == len(files) and not hinted
    monkeypatch.setattr(sys.modules["packer.packing.pipeline"], "_HINT_BYTES", 2 * max(sizes))
    result = pack(image_dir, tmp_path / "some.lmdb", options)
    assert result.manifest.num_records == len(files) and 0 < len(hinted) < len(files)


def test_early_writeback_syncs_behind_the_writer_and_reports_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """write_shard has the kernel flush a shard every 32 MB while writing (the final fsync
    still makes it durable); here with a 4-byte step, on real files."""
    from packer.packing.shard_job import _Writeback

    synced: list[int] = []
    real_sync = getattr(os, "fdatasync", os.fsync)
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real_sync(fd))[1])
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_sync(fd))[1])
    path = tmp_path / "shard"
    small = _Writeback(path, every=1 << 20)
    small.wrote(100)
    small.close()
    assert small._thread is None  # a small shard starts no thread
    writeback = _Writeback(path, every=4)
    with open(path, "wb") as f:
        for _ in range(3):
            f.write(b"x" * 8)
            f.flush()
            writeback.wrote(8)
    thread = writeback._thread
    assert thread is not None
    deadline = time.monotonic() + 5
    while not synced and time.monotonic() < deadline:
        time.sleep(0.01)
    assert synced  # the real file was synced, by the thread, while it was being written
    writeback.close()
    assert not thread.is_alive()
    failing = _Writeback(tmp_path / "gone", every=1)
    failing.wrote(1)
    assert failing._thread is not None
    failing._thread.join(5)  # it meets the missing file and ends (unless close came first)
    with pytest.raises(FileNotFoundError):
        failing.close()
    quiet = _Writeback(tmp_path / "gone", every=1)
    quiet.wrote(1)
    quiet.close(check=False)  # on the error path of write_shard: the first error wins
    assert quiet._thread is not None and not quiet._thread.is_alive()


@pytest.mark.skipif(not hasattr(os, "nice"), reason="process priorities are a POSIX notion")
@pytest.mark.parametrize("check", ["header", "full"])
def test_workers_that_only_probe_headers_yield_the_cores_to_the_writer(check: str) -> None:
    """Header probes only need to stay ahead of the writer: their workers run at a lower
    priority (on two cores they took time from it); workers that decode do not."""
    from packer.packing.pipeline import _start_pool

    pool = _start_pool(PackOptions(backend="lmdb", workers=1, check=check))
    try:
        niceness = pool.submit(os.getpriority, os.PRIO_PROCESS, 0).result()
    finally:
        pool.shutdown()
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    assert niceness == (min(19, ours + 10) if check == "header" else ours)


@pytest.mark.parametrize("check", ["full", "header", "header, an odd file found late"])
def test_a_pack_leaves_no_thread_or_process_behind(
    image_dir: Path, tmp_path: Path, check: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool is joined before pack returns. A thread left running would make the next pack
    start its workers with forkserver (fork is only safe with no other thread), ~0.5 s
    slower: shutting the pool down early with ``wait=False`` did that, since its manager
    thread is then forgotten, and the final ``shutdown(wait=True)`` no longer joins it.
    A header check of plain files starts its pool only for a file it must ask Pillow about
    (a WebP here, after a sample that saw none)."""
    if check.endswith("late"):
        write_image(image_dir / "cat" / "odd.webp", seed=99)
        monkeypatch.setattr(sys.modules["packer.packing.pipeline"], "_SAMPLE", 0)
    elif check == "header":  # plain files: checked in the read-ahead thread, no pool at all
        items = load_source(image_dir).items
        assert sys.modules["packer.packing.pipeline"]._plain_sample(image_dir, items, PackOptions())
    before = set(threading.enumerate())
    for n in range(2):
        options = PackOptions(backend="lmdb", check=check.split(",")[0])  # type: ignore[arg-type]
        result = pack(image_dir, tmp_path / f"s{n}.lmdb", options)
        assert result.manifest.num_records == len(list(image_dir.rglob("*.*")))
        assert set(threading.enumerate()) <= before  # none left (earlier tests' may end)
        assert multiprocessing.active_children() == []


def _files_of_every_kind(root: Path) -> dict[str, bytes]:
    """Plain JPEGs and PNGs, and files a header check must leave to Pillow: other formats,
    EXIF and XMP orientations, transparency, 16 bits, broken headers, not images."""
    rng = np.random.default_rng(5)
    saved = encoded

    def noise(mode: str, size: tuple[int, int]) -> Image.Image:
        pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
        return Image.fromarray(pixels).convert(mode)

    rotated = Image.Exif()
    rotated[0x0112] = 6
    files = {
        f"plain/{i}.{'png' if i % 3 else 'jpg'}": saved(
            noise("RGB", (9 + i, 5 + i)), "PNG" if i % 3 else "JPEG"
        )
        for i in range(30)
    }
    files |= {
        "odd/rotated.jpg": saved(noise("RGB", (12, 7)), "JPEG", exif=rotated),
        "odd/xmp.jpg": saved(noise("RGB", (12, 7)), "JPEG", xmp=b'<x tiff:Orientation="8"/>'),
        "odd/grey.webp": saved(noise("L", (6, 4)), "WEBP"),
        "odd/anim.gif": saved(noise("P", (6, 4)), "GIF"),
        "odd/keyed.png": saved(noise("P", (6, 4)), "PNG", transparency=0),
        "odd/wide.png": saved(Image.fromarray(np.zeros((3, 5), np.uint16)), "PNG"),
        "odd/rgba.png": saved(noise("RGBA", (6, 4)), "PNG"),
        "odd/cmyk.jpg": saved(noise("CMYK", (6, 4)), "JPEG"),
        "odd/no-frame.jpg": b"\xff\xd8\xff\xe0\x00\x04AB\xff\xda\x00\x02" + bytes(30),
        "odd/text.png": b"not a png at all\n",
        "odd/cut.jpg": saved(noise("RGB", (64, 64)), "JPEG")[:120],
        # plain, but its header is past what a worker reads of it (headers.HEAD_BYTES)
        "odd/big-header.jpg": saved(noise("RGB", (12, 7)), "JPEG", icc_profile=bytes(40_000)),
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return files


@pytest.mark.parametrize("where", ["pool", "thread", "thread, small pieces"])
def test_a_header_check_gives_pillows_answer_for_every_file(
    tmp_path: Path, backend: str, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each record has the shape and format, each skip the reason, that a Pillow probe of its
    file gives, with the bytes as they are and the order a full check gives; whether the
    headers are checked in the pool (a folder whose sample has odd files, as this one) or
    in the read-ahead thread, which vouches for plain JPEGs and PNGs and asks the pool about
    the rest. In small pieces, several wait for the pool at once, and some for want of room."""
    from packer.packing.prepare import probed, reason

    module = sys.modules["packer.packing.pipeline"]
    if where.startswith("thread"):
        monkeypatch.setattr(module, "_SAMPLE", 0)  # sample nothing: as if all were plain
    if where.endswith("small pieces"):
        monkeypatch.setattr(module, "_VOUCH_FILES", 3)
        monkeypatch.setattr(module, "_PIECE_BYTES", 1000)
        monkeypatch.setattr(module, "_AHEAD_BYTES", 3000)

    root = tmp_path / "imgs"
    files = _files_of_every_kind(root)
    options = _options(backend, check="header", labels="none")
    items = load_source(root, "none").items
    assert module._plain_sample(root, items, options) == (where != "pool")
    result = pack(root, store_path(tmp_path, backend), options)
    expected: dict[str, object] = {}
    for name in files:
        try:
            _, _, shape, fmt = probed(imaging.probe(root / name), "RGB")
            expected[name] = (shape, fmt)
        except Exception as e:  # noqa: BLE001 - Pillow's refusal, as the pack words it
            expected[name] = reason(e)
    assert sum(isinstance(v, str) for v in expected.values()) >= 3  # the broken ones
    got: dict[str, object] = {s.path: s.reason for s in result.skipped}
    with open_store(result.store) as store:
        records = list(store.records())
    for r in records:
        assert bytes(r.data) == files[r.path]
        got[r.path] = (r.shape, r.format)
    assert got == expected
    full = pack(root, store_path(tmp_path / "full", backend), _options(backend, labels="none"))
    with open_store(full.store) as store:
        in_full = [r.path for r in store.records()]
    assert [r.path for r in records if r.path in in_full] == [p for p in in_full if p in got]


def test_a_header_check_reads_a_bounded_stretch_ahead_of_pillows_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files read while earlier ones wait for the pool are held in memory: a piece is handed
    on once the bytes read past its start exceed _AHEAD_BYTES, answered or not (here every
    file is a WebP, left to Pillow, whose pool takes a while to start)."""
    module = sys.modules["packer.packing.pipeline"]
    sizes = []
    for i in range(40):
        sizes.append(write_image(tmp_path / "imgs" / f"{i:02}.webp", seed=i).stat().st_size)
    monkeypatch.setattr(module, "_VOUCH_FILES", 2)
    monkeypatch.setattr(module, "_AHEAD_BYTES", 6 * max(sizes))
    reads: list[str] = []
    real = module.read_item
    monkeypatch.setattr(module, "read_item", lambda *a: (reads.append(a[1].path), real(*a))[1])
    options = PackOptions(backend="lmdb", check="header", workers=1)
    items = load_source(tmp_path / "imgs", "none").items
    pool = module._PoolOnDemand(options)
    try:
        pieces = module._read_and_vouch(tmp_path / "imgs", items, pool, options)
        first = next(pieces)
        assert [r.path for r in first] == [i.path for i in items[:2]]
        assert len(reads) <= 2 + 6 + 2  # its own files, _AHEAD_BYTES' worth, one more piece
        assert [r.format for p in [first, *pieces] for r in p] == ["WEBP"] * 40
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.skipif(
    not hasattr(os, "fork"), reason="the pool forks its workers only where fork exists"
)
def test_forked_workers_inherit_pillows_plugins(tmp_path: Path) -> None:
    """Each worker imported every Pillow plugin on its first file (~30 ms of CPU, at the start
    of every pack) until the parent imported them before forking. A fresh process, so that
    nothing has imported them yet; the worker reports before it has opened any image."""
    code = """
from PIL import Image
from packer.packing.options import PackOptions
from packer.packing.pipeline import _start_pool

def plugins_loaded():
    return Image._initialized == 2  # Pillow's own flag: Image.init() has run

pool = _start_pool(PackOptions(backend="lmdb", workers=2))
print(pool.submit(plugins_loaded).result())
pool.shutdown()
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
