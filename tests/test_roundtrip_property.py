"""Properties, over random inputs: every record written through a shard writer reads back
unchanged from either backend; and every epoch, for any seed, world size, DataLoader worker
count and remainder policy, reads each record exactly once (as the policy says)."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from helpers import write_image
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packer import PackOptions, open_reader, pack
from packer.reading.options import ReaderOptions
from packer.reading.reader import Reader
from packer.store import ShardMeta, open_shard_reader, open_shard_writer, shard_name
from packer.store.manifest import Manifest, ShardInfo, Storage, write_manifest
from packer.store.record import Record, checksum

# -- records through the shard writers and readers --------------------------------------


def _noise(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).bytes(size)


# Empty payloads are legal in both layouts (an LMDB value is then meta only; in HDF5 two equal
# offsets); big ones, up to 200 KB, cross LMDB's overflow pages and HDF5's chunk boundaries.
payloads = st.one_of(
    st.binary(max_size=64),
    st.builds(_noise, st.integers(0, 200_000), st.integers(0, 2**32 - 1)),
)
paths = st.text(  # anything a file name can hold: no NUL, no lone surrogate (scan refuses those)
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    min_size=1,
    max_size=40,
)
shapes = st.tuples(*[st.integers(0, 2**31 - 1)] * 3)
formats = st.sampled_from(["JPEG", "PNG", "WEBP", "GIF", "raw", "MPO", "Ünïcode"])


@st.composite
def shards(draw: st.DrawFn) -> tuple[int, list[Record]]:
    """(label columns, records) of one shard."""
    columns = draw(st.integers(0, 4))
    labels = st.tuples(*[st.integers(-(2**63), 2**63 - 1)] * columns)
    records = []
    for _ in range(draw(st.integers(0, 12))):
        data = draw(payloads)
        shape = draw(shapes)
        records.append(
            Record(data, draw(labels), draw(paths), checksum(data), shape, draw(formats))
        )
    return columns, records


def _fields(record: Record) -> tuple[object, ...]:
    return (
        bytes(record.data),
        tuple(record.labels),
        record.path,
        record.crc32,
        tuple(record.shape),
        record.format,
    )


def _write(backend: str, folder: Path, meta: ShardMeta, records: list[Record]) -> Path:
    path = folder / shard_name(backend, 0)
    writer = open_shard_writer(backend, path, meta)
    for record in records:
        writer.append(record)
    writer.close()
    return path


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(backend=st.sampled_from(["lmdb", "hdf5"]), shard=shards(), cut=st.data())
def test_every_record_reads_back_unchanged(
    backend: str, shard: tuple[int, list[Record]], cut: st.DataObject
) -> None:
    columns, records = shard
    n = len(records)
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(backend, Path(tmp), ShardMeta(0, columns), records)
        reader = open_shard_reader(backend, path)
        try:
            assert len(reader) == n
            block = reader.read_block(0, n)
            assert [_fields(block.record(i)) for i in range(n)] == [_fields(r) for r in records]
            start = cut.draw(st.integers(0, n), label="start")
            stop = cut.draw(st.integers(start, n), label="stop")
            part = reader.read_block(start, stop)
            assert [_fields(part.record(i)) for i in range(len(part))] == [
                _fields(r) for r in records[start:stop]
            ]
            for i in range(n):
                assert _fields(reader.read_record(i)) == _fields(records[i])
            assert reader.read_labels().tolist() == [list(r.labels) for r in records]
        finally:
            reader.close()


@st.composite
def raw_shards(draw: st.DrawFn) -> tuple[list[int], list[Record]]:
    """(shape, records) of a shard of raw pixels that all share that shape."""
    shape = [draw(st.integers(1, 40)), draw(st.integers(1, 40)), draw(st.sampled_from([1, 3, 4]))]
    size = int(np.prod(shape))
    records = []
    for i in range(draw(st.integers(0, 20))):
        data = _noise(size, draw(st.integers(0, 2**16)))
        records.append(Record(data, (i % 3,), f"{i}.png", checksum(data), tuple(shape), "raw"))  # type: ignore[arg-type]
    return shape, records


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    backend=st.sampled_from(["lmdb", "hdf5"]),
    compression=st.sampled_from([None, "gzip", "lzf"]),
    shard=raw_shards(),
    cut=st.data(),
)
def test_raw_pixels_of_one_shape_read_back_into_a_buffer_unchanged(
    backend: str, compression: str | None, shard: tuple[list[int], list[Record]], cut: st.DataObject
) -> None:
    """The reader's path for raw stores: a block read straight into its (n, h, w, c) buffer."""
    shape, records = shard
    n = len(records)
    meta = ShardMeta(0, 1, raw_shape=shape, compression=compression if backend == "hdf5" else None)
    with tempfile.TemporaryDirectory() as tmp:
        reader = open_shard_reader(backend, _write(backend, Path(tmp), meta, records))
        try:
            start = cut.draw(st.integers(0, n), label="start")
            stop = cut.draw(st.integers(start, n), label="stop")
            out = np.full((stop - start + 2, *shape), 7, np.uint8)  # a reused, larger buffer
            block = reader.read_block(start, stop, out=out[: stop - start])
            expected = [np.frombuffer(r.data, np.uint8).reshape(shape) for r in records[start:stop]]
            assert isinstance(block.data, np.ndarray) and block.data.shape == (stop - start, *shape)
            assert all(np.array_equal(a, b) for a, b in zip(block.data, expected, strict=True))
            assert np.all(out[stop - start :] == 7)  # nothing written past the block
            assert [_fields(block.record(i)) for i in range(len(block))] == [
                _fields(r) for r in records[start:stop]
            ]
        finally:
            reader.close()


# -- exactly-once epochs through the reader ------------------------------------------------


def _layout(folder: Path, sizes: list[int]) -> Path:
    """A store folder whose manifest describes shards of ``sizes`` records (sparse files of
    plausible size): enough for a Reader to plan epochs, which needs no record."""
    store = folder / "plan.lmdb"
    store.mkdir()
    infos = []
    for number, size in enumerate(sizes):
        file = store / shard_name("lmdb", number)
        with open(file, "wb") as f:
            f.truncate(64 * size + 8192)
        infos.append(
            ShardInfo(file.name, size, file.stat().st_size, "xxh3_128:" + "0" * 32, 100 * size)
        )
    manifest = Manifest(
        backend="lmdb",
        num_records=sum(sizes),
        shards=infos,
        storage=Storage("original", "RGB"),
        label_source="none",
        label_columns=[],
        seed=0,
        shuffled=True,
        packer_version="test",
        created="now",
    )
    write_manifest(store, manifest)
    return store


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(0, 50), min_size=1, max_size=5),
    chunk=st.integers(1, 9),
    buffer_chunks=st.integers(1, 4),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 1000),
    world=st.integers(1, 4),
    workers=st.integers(1, 3),
    remainder=st.sampled_from(["uneven", "drop", "pad"]),
)
def test_ranks_times_workers_read_every_record_once_per_epoch(
    sizes: list[int],
    chunk: int,
    buffer_chunks: int,
    seed: int,
    epoch: int,
    world: int,
    workers: int,
    remainder: str,
) -> None:
    """The whole plan of real Readers (chunks, their shuffle, rank shares, each rank's share
    split among its DataLoader workers, shuffle windows): across ranks and workers, every
    record once ("uneven"); equal disjoint shares that leave out fewer than world records
    ("drop"); equal shares covering every record, fewer than world of them twice ("pad")."""
    total = sum(sizes)
    with tempfile.TemporaryDirectory() as tmp:
        store = _layout(Path(tmp), sizes)
        per_rank = []
        for rank in range(world):
            mine: list[int] = []
            for worker in range(workers):
                options = ReaderOptions(
                    batch_size=4,
                    seed=seed,
                    chunk_size=chunk,
                    buffer_chunks=buffer_chunks,
                    rank=rank,
                    world_size=world,
                    remainder=remainder,
                    worker=(worker, workers),
                )
                order = Reader(store, options).record_order(epoch).tolist()
                assert len(order) == Reader(store, options).records_per_epoch()
                mine += order
            per_rank.append(mine)
    counts = Counter(i for mine in per_rank for i in mine)
    assert set(counts) <= set(range(total))
    if remainder == "uneven":
        assert counts == Counter(range(total))
        assert max(map(len, per_rank)) - min(map(len, per_rank)) <= 1
    elif remainder == "drop":
        assert [len(mine) for mine in per_rank] == [total // world] * world
        assert max(counts.values(), default=1) == 1 and total - len(counts) < world
    else:
        assert [len(mine) for mine in per_rank] == [-(-total // world)] * world
        assert set(counts) == set(range(total)) and sum(counts.values()) - total < world


@pytest.fixture(scope="module")
def real_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """30 real images in 3 shards."""
    tmp = tmp_path_factory.mktemp("plan")
    for i in range(30):
        write_image(tmp / "images" / f"c{i % 2}" / f"{i:02d}.png", size=(6 + i % 5, 7), seed=i)
    store = tmp / "real.lmdb"
    pack(tmp / "images", store, PackOptions(seed=5, workers=2, shards=3))
    return store


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 50),
    world=st.integers(1, 3),
    workers=st.integers(1, 3),
    remainder=st.sampled_from(["uneven", "drop", "pad"]),
    batch_size=st.integers(1, 11),
    chunk=st.integers(1, 7),
)
def test_the_reader_yields_exactly_its_planned_order(
    real_store: Path,
    seed: int,
    epoch: int,
    world: int,
    workers: int,
    remainder: str,
    batch_size: int,
    chunk: int,
) -> None:
    """What a reader yields is its record_order, record for record: so the plan's
    exactly-once property above holds for the batches training sees."""
    store_paths: list[str] = []
    with open_reader(real_store, batch_size=1, shuffle=False, with_paths=True) as ordered:
        store_paths = [p for _, _, batch in ordered for p in batch]
    for rank in range(world):
        for worker in range(workers):
            with open_reader(
                real_store,
                batch_size=batch_size,
                seed=seed,
                chunk_size=chunk,
                buffer_chunks=2,
                rank=rank,
                world_size=world,
                remainder=remainder,
                worker=(worker, workers),
                with_paths=True,
                workers=1,
            ) as reader:
                got = [p for _, _, batch in reader.epoch(epoch) for p in batch]
                assert got == [store_paths[i] for i in reader.record_order(epoch)]
