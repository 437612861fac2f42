"""Every backend honours one contract; and every shard opens with the ecosystem's own tools."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import lmdb
import msgpack
import numpy as np
import pytest
import tables

from packer.store import ShardMeta, hdf5_store, open_shard_reader, open_shard_writer, shard_name
from packer.store.hdf5_store import PATH_SPAN, SPAN, _Spans
from packer.store.lmdb_store import LmdbShardWriter
from packer.store.record import BLOCK_BYTES, Record, checksum, parse_block


def _records(n: int, seed: int = 0, shape: tuple[int, int, int] | None = None) -> list[Record]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        size = int(np.prod(shape)) if shape else int(rng.integers(0, 5000))
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        out.append(
            Record(
                data,
                (i % 3, int(rng.integers(-9, 9))),
                f"dir/ü {i}.jpg",
                checksum(data),
                shape or (i + 1, i + 2, 3),
                "raw" if shape else ("JPEG", "PNG")[i % 2],
            )
        )
    return out


def _write(backend: str, path: Path, records: list[Record], meta: ShardMeta) -> None:
    writer = open_shard_writer(backend, path, meta)
    for record in records:
        writer.append(record)
    writer.close()


def _same(a: Record, b: Record) -> bool:
    return (bytes(a.data), a.labels, a.path, a.crc32, a.shape, a.format) == (
        bytes(b.data),
        b.labels,
        b.path,
        b.crc32,
        b.shape,
        b.format,
    )


@pytest.mark.parametrize("n", [0, 1, 257])
def test_write_then_read_blocks_and_records(tmp_path: Path, backend: str, n: int) -> None:
    path = tmp_path / shard_name(backend, 0)
    records = _records(n)
    _write(backend, path, records, ShardMeta(0, 2))
    reader = open_shard_reader(backend, path)
    assert len(reader) == n and reader.meta["num_records"] == n
    for start, stop in [(0, n), (0, min(n, 10)), (n // 2, n), (n, n)]:
        block = reader.read_block(start, stop)
        assert len(block) == stop - start
        assert all(_same(block.record(i), records[start + i]) for i in range(len(block)))
    if n:
        assert _same(reader.read_record(n - 1), records[n - 1])
    assert reader.read_labels().shape == (n, 2)
    assert reader.read_labels().tolist() == [list(r.labels) for r in records]
    with pytest.raises(IndexError, match=f"records 0:{n + 1} out of range for {n} records"):
        reader.read_block(0, n + 1)
    with pytest.raises(IndexError, match=f"records 0:{n + 1} out of range"):
        reader.extents(0, n + 1)
    with pytest.raises(IndexError, match=f"record {n} out of range for {n} records"):
        reader.read_record(n)
    reader.close()


def test_hdf5_raw_fixed_shape_is_one_array(tmp_path: Path) -> None:
    path = tmp_path / "shard-00000.h5"
    records = _records(50, shape=(6, 4, 3))
    _write("hdf5", path, records, ShardMeta(0, 2, raw_shape=[6, 4, 3], compression="gzip"))
    reader = open_shard_reader("hdf5", path)
    block = reader.read_block(10, 20)
    assert isinstance(block.data, np.ndarray) and block.data.shape == (10, 6, 4, 3)
    expected = np.stack([np.frombuffer(r.data, np.uint8).reshape(6, 4, 3) for r in records[10:20]])
    assert np.array_equal(block.data, expected)
    reader.close()
    with h5py.File(path) as f:
        assert f["images"].compression == "gzip"


_PER_BLOCK = BLOCK_BYTES // 18  # raw 2x3x3 records in one LMDB block


@pytest.mark.parametrize("n", [0, 1, _PER_BLOCK + 5, PATH_SPAN + 5, SPAN + 5])
def test_raw_pixels_of_one_shape_read_back_in_any_block(
    tmp_path: Path, backend: str, n: int
) -> None:
    """LMDB keeps them in blocks, HDF5 readers read small columns and paths in spans: reads
    across a block's or a span's end included."""
    path = tmp_path / shard_name(backend, 0)
    records = _records(n, shape=(2, 3, 3))
    _write(backend, path, records, ShardMeta(0, 2, raw_shape=[2, 3, 3]))
    reader = open_shard_reader(backend, path)
    ends = [(min(n, end - 3), min(n, end + 2)) for end in (_PER_BLOCK, PATH_SPAN, SPAN)]
    after = [(min(n, end), n) for end in (_PER_BLOCK, PATH_SPAN, SPAN)]  # after the first
    for start, stop in [(0, n), (n // 2, n), *ends, *after, (n, n)]:
        out = np.empty((stop - start, 2, 3, 3), np.uint8)
        block = reader.read_block(start, stop, out=out)
        assert block.data.shape == out.shape
        assert stop == start or np.shares_memory(block.data, out)
        assert all(_same(block.record(i), records[start + i]) for i in range(len(block)))
    if n:
        assert _same(reader.read_record(n - 1), records[n - 1])
    assert reader.read_labels().tolist() == [list(r.labels) for r in records]
    reader.close()


@pytest.mark.parametrize("shape, n", [(None, 40), ((2, 3, 3), 700), ((60, 60, 3), 20)])
def test_hdf5_payloads_across_and_beyond_the_staging_array(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: tuple[int, int, int] | None, n: int
) -> None:
    """The writer stages payloads in one reused array: records that do not fit what is left
    of it, and records larger than all of it (60x60x3 rows; one 25 KB payload), are written
    whole and in order."""
    monkeypatch.setattr(hdf5_store, "_FLUSH_BYTES", 10_000)
    path = tmp_path / "shard-00000.h5"
    records = _records(n, shape=shape)
    if shape is None:
        big = bytes(range(256)) * 100
        records[17] = Record(big, (0, 0), "big.png", checksum(big), (1, 1, 3), "PNG")
    _write("hdf5", path, records, ShardMeta(0, 2, raw_shape=list(shape) if shape else None))
    reader = open_shard_reader("hdf5", path)
    block = reader.read_block(0, n)
    assert all(_same(block.record(i), records[i]) for i in range(n))
    reader.close()


def test_a_raw_record_of_another_size_is_refused_by_name(tmp_path: Path, backend: str) -> None:
    path = tmp_path / shard_name(backend, 0)
    writer = open_shard_writer(backend, path, ShardMeta(0, 2, raw_shape=[2, 3, 3]))
    good, bad = _records(1, shape=(2, 3, 3))[0], _records(1)[0]
    writer.append(good)
    with pytest.raises(ValueError, match=rf"{bad.path}: {len(bad.data):,} pixel bytes.*needs 18"):
        writer.append(bad)
    writer.abort()


def test_lmdb_raw_pixels_of_one_shape_lie_back_to_back_in_a_block(tmp_path: Path) -> None:
    path = tmp_path / "shard-00000.lmdb"
    records = _records(20, shape=(2, 3, 3))
    _write("lmdb", path, records, ShardMeta(0, 2, raw_shape=[2, 3, 3]))
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        assert [k for k, _ in txn.cursor()] == [b"0000000000", b"__packer__"]  # one block
        value = txn.get(b"0000000000")
        assert value[: 20 * 18] == b"".join(r.data for r in records)  # the pixels, in order
        index = parse_block(value, 20, 2)
        assert index.paths == [r.path for r in records]
        assert index.crc32.tolist() == [r.crc32 for r in records]
        meta = msgpack.unpackb(txn.get(b"__packer__"))
        assert (meta["layout"], meta["raw_shape"]) == ("blocks", [2, 3, 3])
        assert np.frombuffer(meta["block_starts"], "<u8").tolist() == [0]
    env.close()
    writer = LmdbShardWriter(tmp_path / "other.lmdb", ShardMeta(0, 2, raw_shape=[2, 3, 3]))
    with pytest.raises(ValueError, match="needs 18"):
        writer.append(_records(1, shape=(2, 3, 2))[0])
    writer.abort()


def _sized(sizes: list[int]) -> list[Record]:
    """Records of these payload sizes (bytes of one seeded pattern)."""
    rng = np.random.default_rng(5)
    out = []
    for i, size in enumerate(sizes):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        out.append(Record(data, (i, -i), f"d/{i}.png", checksum(data), (1, 1, 3), "PNG"))
    return out


# Small records share blocks up to BLOCK_BYTES; a record that size or larger has a block of
# its own (and closes the block being filled); a block short of half a page is padded.
_MIXED = [100, BLOCK_BYTES // 2, BLOCK_BYTES // 2, 10, BLOCK_BYTES + 5, 7, 3 * BLOCK_BYTES, 1, 2]


def test_lmdb_blocks_hold_small_records_together_and_large_ones_alone(tmp_path: Path) -> None:
    path = tmp_path / "shard-00000.lmdb"
    records = _sized(_MIXED)
    _write("lmdb", path, records, ShardMeta(0, 2))
    reader = open_shard_reader("lmdb", path)
    starts = np.frombuffer(reader.meta["block_starts"], "<u8").tolist()
    assert starts == [0, 2, 4, 5, 6, 7]
    # Every block has a place in the file (read-ahead finds it without touching the map).
    assert len(np.frombuffer(reader.meta["value_places"], "<u8")) == 2 * len(starts)
    for start in range(len(records)):  # every range, across every block boundary
        for stop in range(start, len(records) + 1):
            block = reader.read_block(start, stop)
            assert [bytes(d) for d in block.data] == [bytes(r.data) for r in records[start:stop]]
            assert block.paths == [r.path for r in records[start:stop]]
            assert block.labels.tolist() == [list(r.labels) for r in records[start:stop]]
    assert all(_same(reader.read_record(i), r) for i, r in enumerate(records))
    assert reader.read_labels().tolist() == [list(r.labels) for r in records]
    reader.close()
    payload = sum(_MIXED)
    assert path.stat().st_size < payload * 1.01 + 64 * 1024  # pages, not a page a record


@pytest.mark.parametrize("gone", [0, 2, 5])
def test_lmdb_blocks_name_the_records_of_a_missing_block(tmp_path: Path, gone: int) -> None:
    path = tmp_path / "shard-00000.lmdb"
    _write("lmdb", path, _sized(_MIXED), ShardMeta(0, 2))
    env = lmdb.open(str(path), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        assert txn.delete(b"%010d" % gone)
    env.close()
    reader = open_shard_reader("lmdb", path)
    last = {0: 1, 2: 3, 5: 5}[gone]
    with pytest.raises(ValueError, match=f"records {gone}..{last} are missing"):
        reader.read_block(0, len(_MIXED))
    with pytest.raises(ValueError, match=f"records {gone}..{last} are missing"):
        reader.read_record(last)
    reader.close()


def test_lmdb_map_grows_and_replays_without_losing_records(tmp_path: Path) -> None:
    path = tmp_path / "shard-00000.lmdb"
    records = _records(900)  # ~2.2 MB into a 64 KB map: doublings in several transactions
    writer = LmdbShardWriter(path, ShardMeta(0, 2), map_size=64 << 10)
    for record in records:
        writer.append(record)
    writer.close()
    assert writer.map_growths >= 5
    reader = open_shard_reader("lmdb", path)
    block = reader.read_block(0, 900)
    assert all(_same(block.record(i), records[i]) for i in range(900))
    payload = sum(len(r.data) for r in records)
    assert path.stat().st_size < 2 * payload  # the file holds data, not the reserved map


def test_lmdb_shard_opens_with_plain_lmdb(tmp_path: Path) -> None:
    path = tmp_path / "shard-00000.lmdb"
    records = _records(20)
    _write("lmdb", path, records, ShardMeta(3, 2, extra={"backend": "lmdb"}))
    assert not Path(str(path) + "-lock").exists()
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        keys = [k for k, _ in txn.cursor()]
        assert keys == [b"0000000000", b"__packer__"]  # 20 small records: one block
        assert msgpack.unpackb(txn.get(b"__packer__"))["index"] == 3
        value = txn.get(b"0000000000")
        index = parse_block(value, 20, 2)
        payload = value[index.offsets[7] : index.offsets[8]]
        assert (payload, index.paths[7]) == (records[7].data, records[7].path)
    env.close()


def test_hdf5_shard_opens_with_h5py_and_pytables(tmp_path: Path) -> None:
    path = tmp_path / "shard-00000.h5"
    records = _records(20)
    _write("hdf5", path, records, ShardMeta(0, 2))
    with h5py.File(path, "r") as f:
        offsets = f["offsets"][:]
        assert bytes(f["data"][offsets[7] : offsets[8]]) == bytes(records[7].data)
        paths = f["path_offsets"][7:9]
        assert bytes(f["path_bytes"][paths[0] : paths[1]]).decode() == records[7].path
        assert json.loads(f.attrs["packer"])["num_records"] == 20
        assert f.id.get_create_plist().get_version()[0] >= 2  # superblock with a checksum
    with tables.open_file(str(path)) as t:
        assert t.root.labels.shape == (20, 2)
        assert t.root.crc32[7] == records[7].crc32


def test_hdf5_store_is_deterministic(tmp_path: Path) -> None:
    a, b = tmp_path / "a" / "shard-00000.h5", tmp_path / "b" / "shard-00000.h5"
    for path in (a, b):
        path.parent.mkdir()
        _write("hdf5", path, _records(30), ShardMeta(0, 2))
    assert a.read_bytes() == b.read_bytes()


def test_not_a_shard(tmp_path: Path, backend: str) -> None:
    path = tmp_path / shard_name(backend, 0)
    if backend == "lmdb":
        env = lmdb.open(str(path), subdir=False, lock=False)
        env.close()
    else:
        h5py.File(path, "w").close()
    with pytest.raises(ValueError, match="not a packer shard"):
        open_shard_reader(backend, path)


def test_hdf5_column_spans_give_the_rows_asked_for_in_any_order(tmp_path: Path) -> None:
    """Spans are read whole only for a second block in a row from one span (sequential reads);
    scattered blocks (a shuffled epoch over a large shard) are read as they are. Either way
    every block is exactly the rows asked for."""
    with h5py.File(tmp_path / "columns.h5", "w") as f:
        f["a"] = np.arange(100, dtype=np.int64)
        f["b"] = np.arange(100, dtype=np.int64) * 7
        spans = _Spans((f["a"], f["b"]), 16)
        rng = np.random.default_rng(0)
        scattered = [(int(s), int(s) + int(rng.integers(0, 9))) for s in rng.integers(0, 90, 60)]
        sequential = [(s, s + 5) for s in range(0, 95, 5)]
        for start, stop in scattered + sequential + scattered:
            a, b = spans.read(start, stop)
            assert a.tolist() == list(range(start, stop))
            assert b.tolist() == [7 * v for v in range(start, stop)]
        spans = _Spans((f["a"],), 16)
        spans.read(40, 44)
        assert spans._kept is None  # one block from a span: read as it is
        spans.read(36, 40)
        assert spans._kept is not None and spans._kept[0] == 32  # a second in a row: kept
