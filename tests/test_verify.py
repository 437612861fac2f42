"""verify_store: every damage named (shard, record, path), no false alarm, no crash."""

from __future__ import annotations

import json
import random
import shutil
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import lmdb
import msgpack
import numpy as np
import pytest
from format4 import as_format4
from helpers import encoded, packer_command, shard_checksum, store_path, write_image
from PIL import Image

from packer import PackOptions, open_store, pack
from packer.errors import ManifestError
from packer.store import ShardMeta, lmdb_store, open_shard_reader, open_shard_writer
from packer.store.lmdb_store import record_key
from packer.store.manifest import ShardInfo, read_manifest, write_manifest
from packer.store.record import Record, checksum
from packer.store.verify import Problem, VerifyReport, _suspects, verify_store

VARIANTS: dict[str, dict[str, object]] = {
    "original": {},
    "raw": {"raw": True, "size": (8, 8)},
    "png": {"encode": "png", "max_side": 16},
}
SHA = "xxh3_128 mismatch: the file changed after it was packed"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    """Packs (once per module) 40 noise images, JPEG and PNG of 10 to 88 px, into 2 shards.

    Some PNGs are over 4 KB, so an LMDB shard holds both inline and overflow-page values.
    """
    tmp = tmp_path_factory.mktemp("verify")
    root = tmp / "images"
    for i in range(40):
        ext = ".png" if i % 4 == 0 else ".jpg"
        write_image(root / f"c{i % 3}" / f"{i:02d}{ext}", size=(10 + 2 * i, 12 + i), seed=i)
    made: dict[tuple[str, str], Path] = {}

    def get(backend: str, variant: str = "original") -> Path:
        if (backend, variant) not in made:
            out = store_path(tmp, backend, f"{variant}-{backend}")
            options = PackOptions(backend=backend, seed=1, workers=2, shards=2, **VARIANTS[variant])  # type: ignore[arg-type]
            pack(root, out, options)
            made[backend, variant] = out
        return made[backend, variant]

    return get


def _copy(store: Path, to: Path) -> Path:
    """A fresh copy of ``store`` inside the folder ``to``, same name."""
    return Path(shutil.copytree(store, to / store.name))


def _flip(file: Path, offset: int, bit: int) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= 1 << bit
    file.write_bytes(bytes(data))


def _reseal(store: Path, number: int) -> None:
    """Make the manifest's size and checksum of shard ``number`` match the file again."""
    manifest = read_manifest(store)
    info = manifest.shards[number]
    data = (store / info.file).read_bytes()
    manifest.shards[number] = ShardInfo(
        info.file, info.num_records, len(data), shard_checksum(data), info.payload_bytes
    )
    write_manifest(store, manifest)


def _problems(report: VerifyReport) -> set[tuple[str, int | None, str | None, str]]:
    return {(p.shard, p.index, p.path, p.reason) for p in report.problems}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_an_intact_store_has_no_problems(
    stores: Callable[[str, str], Path], backend: str, variant: str
) -> None:
    store = stores(backend, variant)
    manifest = read_manifest(store)
    assert len(manifest.shards) == 2
    for decode in (True, False):
        report = verify_store(store, decode=decode)
        assert report.problems == [] and report.ok
        assert report.records_checked == manifest.num_records == 40
        assert report.shards_checked == 2 and report.store == store
        assert json.loads(json.dumps(report.to_json()))["ok"] is True


@pytest.mark.parametrize("variant", ["original", "raw"])  # raw: checked a block at a time
def test_a_flipped_payload_bit_names_that_record(
    stores: Callable[[str, str], Path], backend: str, tmp_path: Path, variant: str
) -> None:
    store = stores(backend, variant)
    rng = random.Random(7)
    cases = 0
    with open_store(store) as s:
        for index in range(0, 40, 5):  # records of both shards, small and large
            record = s.record(index)
            shard = s.manifest.shards[s.locate(index)[0]].file
            payload = bytes(record.data)
            original = (store / shard).read_bytes()
            at = original.find(payload)
            if at < 0 or original.find(payload, at + 1) >= 0:
                continue  # split over two HDF5 chunks, or not unique: cannot be located
            copy = _copy(store, tmp_path / f"{variant}-case{index}")
            _flip(copy / shard, at + rng.randrange(len(payload)), rng.randrange(8))
            report = verify_store(copy)
            assert _problems(report) == {
                (shard, None, None, SHA),
                (shard, index, record.path, "checksum mismatch"),
            }
            assert report.records_checked == 40 and not report.ok
            cases += 1
    assert cases >= 5


def test_raw_pixels_in_one_array_are_checked_at_once_and_only_suspects_looked_at(
    stores: Callable[[str, str], Path], backend: str
) -> None:
    store = stores(backend, "raw")
    shard = open_shard_reader(backend, store / read_manifest(store).shards[0].file)
    block = shard.read_block(0, len(shard))
    shard.close()
    assert isinstance(block.data, np.ndarray) and len(block) > 6
    assert _suspects(block, "RGB", decode=True) == []
    block.crc32[3] ^= 1
    block.shapes[5] = (9, 8, 3)
    assert _suspects(block, "RGB", decode=True) == [3, 5]
    assert _suspects(block, "RGB", decode=False) == [3]  # shapes matter only when decoding
    assert _suspects(block, "L", decode=True) == list(range(len(block)))  # RGB is not L


_VERIFY_EACH = """
import json, sys
from packer.store.verify import verify_store
for store in sys.argv[1:]:
    print(json.dumps(verify_store(store).to_json()), flush=True)
"""


def test_a_bit_flip_anywhere_in_a_shard_is_found_without_a_crash(
    stores: Callable[[str, str], Path], backend: str, tmp_path: Path
) -> None:
    store = stores(backend, "original")
    shard = read_manifest(store).shards[0].file
    size = (store / shard).stat().st_size
    rng = random.Random(11)
    flips, copies = [], []
    for k in range(10):  # one offset in each tenth of the file: headers, B-tree, payloads
        flips.append((rng.randrange(k * size // 10, (k + 1) * size // 10), rng.randrange(8)))
        copies.append(_copy(store, tmp_path / f"flip{k}"))
        _flip(copies[-1] / shard, *flips[-1])
    # In a child: a damaged LMDB page can kill a process (SIGBUS, or an assertion's abort).
    done = subprocess.run(
        [sys.executable, "-c", _VERIFY_EACH, *map(str, copies)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    reports = [json.loads(line) for line in done.stdout.splitlines()]
    culprit = flips[len(reports)] if len(reports) < len(flips) else "(after the last)"
    assert done.returncode == 0, (
        f"verify died (returncode {done.returncode}) on the flip (offset, bit) "
        f"{culprit} of {shard}: {done.stderr[-2000:]}"
    )
    assert len(reports) == 10
    for (offset, bit), report in zip(flips, reports):
        assert not report["ok"], (offset, bit)
        assert {"shard": shard, "index": None, "path": None, "reason": SHA} in report["problems"]


@pytest.mark.parametrize("cut", ["half", "100 bytes"])
def test_a_truncated_shard_is_named(
    stores: Callable[[str, str], Path], backend: str, tmp_path: Path, cut: str
) -> None:
    store = _copy(stores(backend, "original"), tmp_path)
    info = read_manifest(store).shards[1]
    keep = info.bytes // 2 if cut == "half" else info.bytes - 100
    with open(store / info.file, "r+b") as f:
        f.truncate(keep)
    report = verify_store(store)  # in this process: a short LMDB file is never mapped
    reasons = [p.reason for p in report.problems if p.shard == info.file and p.index is None]
    assert f"{keep:,} bytes on disk, manifest says {info.bytes:,}" in reasons
    if backend == "hdf5":  # h5py refuses a short file itself, with its own words
        assert any(r.startswith("does not open: OSError") and "truncated" in r for r in reasons)
    assert report.records_checked == 40 - info.num_records
    assert report.problems[-1] == Problem(
        "", None, None, f"{40 - info.num_records} of the manifest's 40 records were checked"
    )


def test_a_missing_or_resized_shard_is_named(
    stores: Callable[[str, str], Path], backend: str, tmp_path: Path
) -> None:
    missing = _copy(stores(backend, "original"), tmp_path / "missing")
    shards = read_manifest(missing).shards
    (missing / shards[0].file).unlink()
    report = verify_store(missing)
    assert _problems(report) == {
        (shards[0].file, None, None, "shard file is missing"),
        ("", None, None, f"{shards[1].num_records} of the manifest's 40 records were checked"),
    }
    grown = _copy(stores(backend, "original"), tmp_path / "grown")
    with open(grown / shards[1].file, "ab") as f:
        f.write(b"\0" * 10)
    report = verify_store(grown)  # the records are still all there, and read
    size = f"{shards[1].bytes + 10:,} bytes on disk, manifest says {shards[1].bytes:,}"
    assert _problems(report) == {(shards[1].file, None, None, size)}
    assert report.records_checked == 40


def test_a_negative_worker_count_is_refused(stores: Callable[[str, str], Path]) -> None:
    with pytest.raises(ValueError, match="workers must be 0 .all cores. or more, not -1"):
        verify_store(stores("lmdb"), workers=-1)


def test_problems_are_listed_shard_by_shard_though_files_are_hashed_ahead(
    stores: Callable[[str, str], Path], backend: str, tmp_path: Path
) -> None:
    """Shard 1's file is hashed while shard 0's records are read; its finding comes after
    theirs all the same."""
    store = _copy(stores(backend, "original"), tmp_path)
    junk = b"not an image"
    _rewrite_shard(  # shard 0: record 2 intact by its checksum, but no image
        store,
        backend,
        lambda i, r: (
            Record(junk, r.labels, r.path, checksum(junk), r.shape, r.format) if i == 2 else r
        ),
    )
    second = read_manifest(store).shards[1]
    with open(store / second.file, "ab") as f:
        f.write(b"\0" * 10)
    report = verify_store(store)
    assert [(p.shard, p.index) for p in report.problems] == [
        (read_manifest(store).shards[0].file, 2),
        (second.file, None),
    ]
    assert not [
        t for t in threading.enumerate() if t.name.startswith(("packer-hash", "packer-verify"))
    ]


def _rewrite_shard(store: Path, backend: str, change: Callable[[int, Record], Record]) -> None:
    """Write shard 0 of ``store`` anew through the store writer API, each record passed
    through ``change(index, record)``, and reseal the manifest: the damage is then invisible
    to the file checks, and only a record check can find it."""
    manifest = read_manifest(store)
    file = store / manifest.shards[0].file
    reader = open_shard_reader(backend, file)
    records = [change(i, reader.read_record(i)) for i in range(len(reader))]
    meta = reader.meta
    reader.close()
    file.unlink()
    writer = open_shard_writer(backend, file, ShardMeta(0, meta["num_label_columns"]))
    for record in records:
        writer.append(record)
    writer.close()
    _reseal(store, 0)


@pytest.mark.parametrize("workers", [1, 3])
def test_a_record_that_does_not_decode_is_named(
    stores: Callable[[str, str], Path], backend: str, tmp_path: Path, workers: int
) -> None:
    """Decoding runs in ``workers`` threads; problems come in record order all the same."""
    store = _copy(stores(backend, "original"), tmp_path)
    junk = b"not an image"
    seen: dict[int, Record] = {}

    def change(i: int, record: Record) -> Record:
        seen[i] = record
        if i == 3:  # valid bytes with a valid checksum, but no image
            return Record(
                junk, record.labels, record.path, checksum(junk), record.shape, record.format
            )
        if i == 5:  # an intact image whose stored shape is wrong
            h, w, c = record.shape
            return Record(
                record.data, record.labels, record.path, record.crc32, (h + 1, w, c), record.format
            )
        return record

    _rewrite_shard(store, backend, change)
    report = verify_store(store, workers=workers)
    assert not [t for t in threading.enumerate() if t.name.startswith("packer-verify")]
    assert [(p.shard, p.index, p.path) for p in report.problems] == [
        (f"shard-00000{store.suffix}", 3, seen[3].path),
        (f"shard-00000{store.suffix}", 5, seen[5].path),
    ]
    assert report.problems[0].reason.startswith("does not decode: UnidentifiedImageError")
    h, w, c = seen[5].shape
    assert report.problems[1].reason == f"decodes to {h}x{w}x{c}, stored shape is {h + 1}x{w}x{c}"
    assert report.records_checked == 40
    assert verify_store(store, decode=False).ok  # the checksums alone cannot see either


def test_problems_past_max_problems_are_counted_not_listed(
    stores: Callable[[str, str], Path], backend: str, tmp_path: Path
) -> None:
    store = _copy(stores(backend, "original"), tmp_path)
    junk = b"junk"
    _rewrite_shard(
        store,
        backend,
        lambda i, r: Record(junk, r.labels, r.path, checksum(junk), r.shape, r.format),
    )
    n = read_manifest(store).shards[0].num_records
    report = verify_store(store, max_problems=3)
    assert len(report.problems) == 4 and [p.index for p in report.problems[:3]] == [0, 1, 2]
    assert report.problems[3] == Problem("", None, None, f"{n - 3} more problems not listed")
    assert len(verify_store(store).problems) == n
    with pytest.raises(ValueError, match="max_problems"):
        verify_store(store, max_problems=0)


def test_an_unreadable_lmdb_block_names_its_records_and_the_next_blocks_are_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "images"
    for i in range(12):
        write_image(root / "c" / f"{i:02d}.png", size=(40, 30), seed=i)  # ~3.6 KB each
    monkeypatch.setattr(lmdb_store, "BLOCK_BYTES", 8 << 10)  # two records a block
    store = tmp_path / "s.lmdb"
    pack(root, store, PackOptions(seed=1, workers=1))
    file = store / "shard-00000.lmdb"
    env = lmdb.open(str(file), subdir=False, lock=False, map_size=1 << 26)
    with env.begin(write=True) as txn:
        starts = np.frombuffer(msgpack.unpackb(txn.get(b"__packer__"))["block_starts"], "<u8")
        assert starts.tolist() == list(range(0, 12, 2))
        value = bytearray(txn.get(record_key(4)))  # the block of records 4 and 5
        value[-5] ^= 0xFF  # the header's last byte: zlib's check fails
        txn.put(record_key(4), bytes(value))
    env.close()
    _reseal(store, 0)
    report = verify_store(store)
    assert [(p.index, p.path) for p in report.problems[:2]] == [(4, None), (5, None)]
    assert "cannot be read: ValueError" in report.problems[0].reason
    assert "records 4..5: block header is damaged" in report.problems[0].reason
    assert report.records_checked == 10
    assert report.problems[2:] == [
        Problem("", None, None, "10 of the manifest's 12 records were checked")
    ]


def test_an_unreadable_lmdb_value_of_format_4_is_named_and_its_neighbours_still_checked(
    stores: Callable[[str, str], Path], tmp_path: Path
) -> None:
    store = _copy(stores("lmdb", "original"), tmp_path)
    as_format4(store)
    file = store / "shard-00000.lmdb"
    env = lmdb.open(str(file), subdir=False, lock=False, map_size=1 << 26)
    with env.begin(write=True) as txn:  # a meta length far past the value's end
        txn.put(record_key(2), b"\xff\xff\xff\x00" + b"x" * 20)
    env.close()
    _reseal(store, 0)
    report = verify_store(store)
    assert [(p.shard, p.index, p.path) for p in report.problems[:1]] == [(file.name, 2, None)]
    assert report.problems[0].reason.startswith("cannot be read: ValueError: record meta length")
    assert report.records_checked == 39  # the rest of the block was read one by one
    assert report.problems[1:] == [
        Problem("", None, None, "39 of the manifest's 40 records were checked")
    ]


def test_progress_rises_to_the_record_count(
    stores: Callable[[str, str], Path], backend: str, tmp_path: Path
) -> None:
    store = _copy(stores(backend, "original"), tmp_path)
    calls: list[tuple[int, int]] = []
    verify_store(store, progress=lambda done, total: calls.append((done, total)))
    first = read_manifest(store).shards[0]
    assert calls == [(0, 40), (first.num_records, 40), (40, 40)]  # one block per shard
    (store / first.file).unlink()  # a shard given up on still counts as gone through
    calls.clear()
    verify_store(store, progress=lambda done, total: calls.append((done, total)))
    assert calls == [(0, 40), (first.num_records, 40), (40, 40)]


def test_an_unreadable_manifest_raises(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no such store"):
        verify_store(tmp_path / "nothing.lmdb")
    (tmp_path / "bad.lmdb").mkdir()
    (tmp_path / "bad.lmdb" / "manifest.json").write_text("{")
    with pytest.raises(ManifestError, match="unreadable manifest"):
        verify_store(tmp_path / "bad.lmdb")


def test_a_shard_count_that_disagrees_with_the_manifest_is_named(
    stores: Callable[[str, str], Path], backend: str, tmp_path: Path
) -> None:
    store = _copy(stores(backend, "original"), tmp_path)
    manifest = read_manifest(store)
    first, second = manifest.shards
    first.num_records -= 1  # the total still adds up: only the shards can tell
    second.num_records += 1
    write_manifest(store, manifest)
    report = verify_store(store)
    assert _problems(report) == {
        (
            first.file,
            None,
            None,
            f"holds {first.num_records + 1:,} records, manifest says {first.num_records:,}",
        ),
        (
            second.file,
            None,
            None,
            f"holds {second.num_records - 1:,} records, manifest says {second.num_records:,}",
        ),
        ("", None, None, "39 of the manifest's 40 records were checked"),
    }


def test_raw_pixels_that_do_not_fit_their_shape_are_named(
    stores: Callable[[str, str], Path], backend: str, tmp_path: Path
) -> None:
    store = _copy(stores(backend, "raw"), tmp_path)
    wrong = {1: (9, 8, 3), 4: (8, 24, 1)}  # 216 bytes for 192; right size, but not RGB
    seen: dict[int, Record] = {}

    def change(i: int, record: Record) -> Record:
        seen[i] = record
        if i in wrong:
            record.shape = wrong[i]
        return record

    _rewrite_shard(store, backend, change)
    report = verify_store(store)
    shard = f"shard-00000{store.suffix}"
    assert _problems(report) == {
        (shard, 1, seen[1].path, "192 raw bytes, shape 9x8x3 needs 216"),
        (shard, 4, seen[4].path, "shape 8x24x1 is not RGB pixels"),
    }
    assert verify_store(store, decode=False).ok


def _crashing_flip(file: Path, backend: str) -> int:
    """The file offset of a bit (the 2-bit) whose flip is known to kill a reading process.

    LMDB (SIGABRT, "Assertion 'IS_LEAF(mp)' failed in mdb_cursor_next()"): the P_LEAF flag
    of the second leaf page. A page is pgno u64, pad u16, flags u16, lower u16, upper u16,
    then u16 node offsets; the meta pages hold the page size at byte 40, the main tree's
    root at 128 and the txnid at 144; a branch node begins with its child's pgno in 3 u16s.
    HDF5 (SIGSEGV in h5py's attrs.__getitem__, while opening a shard of the layout before
    checksummed metadata): the flags byte of the datatype message of the variable-length
    string attribute ``formats/format_names``; a checksum now covers it.
    """
    data = file.read_bytes()
    if backend == "hdf5":
        return data.index(b"format_names\0") + 16 + 1

    def u(at: int, n: int) -> int:
        return int.from_bytes(data[at : at + n], "little")

    size = u(40, 4)
    meta = max((0, size), key=lambda m: u(m + 144, 8))
    root = u(meta + 128, 8) * size
    assert u(root + 10, 2) == 1  # P_BRANCH: this shard's tree is two levels deep
    node = root + u(root + 16 + 2, 2)
    child = u(node, 2) | u(node + 2, 2) << 16 | u(node + 4, 2) << 32
    assert u(child * size + 10, 2) == 2  # P_LEAF
    return child * size + 10


def test_a_crashing_bit_flip_is_reported_not_fatal(
    stores: Callable[[str, str], Path], backend: str, tmp_path: Path
) -> None:
    store = _copy(stores(backend, "original"), tmp_path)
    if backend == "lmdb":
        as_format4(store)  # a tree two levels deep: one value a record
    shard = store / read_manifest(store).shards[0].file
    _flip(shard, _crashing_flip(shard, backend), 1)
    done = subprocess.run(
        [sys.executable, "-c", _VERIFY_EACH, str(store)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]  # verify itself survives
    report = json.loads(done.stdout)
    assert not report["ok"]
    found = "incorrect metadata checksum" if backend == "hdf5" else "crashed the reader (SIG"
    assert any(found in p["reason"] for p in report["problems"]), report


def test_a_decoder_warning_is_one_line_naming_the_record(tmp_path: Path) -> None:
    """Issue 29: verify printed Pillow's raw "UserWarning: Corrupt EXIF data" and its source
    line. An image whose EXIF block points past its end decodes all the same: the store is
    OK, and the warning is one line naming the record's path."""
    ifd = struct.pack("<HHHII", 1, 0x010F, 2, 12, 0x100) + struct.pack(
        "<I", 0
    )  # Make: past the end
    exif = b"Exif\0\0II*\0" + struct.pack("<I", 8) + ifd
    source = tmp_path / "src"
    (source / "a").mkdir(parents=True)
    (source / "a" / "bad_exif.jpg").write_bytes(
        encoded(Image.new("RGB", (16, 12)), "JPEG", exif=exif)
    )
    store = tmp_path / "s.lmdb"
    pack(source, store, PackOptions(seed=0, workers=1))
    done = packer_command("inspect", store, "--verify")
    assert done.returncode == 0 and "OK: 1 records" in done.stdout
    assert done.stderr.splitlines() == [
        "a/bad_exif.jpg: warning while decoding: Truncated File Read"
    ], done.stderr
