#!/usr/bin/env python3
"""Ways a shuffling raw reader could copy pixels, timed bare (no reader around them), against
the reader itself: what the README's "What would close more of the gap" rests on.

Each run reads --epochs shuffled epochs of ``benchmarks/bench_reader.py``'s raw 64x64 stores
(packed there; run it first) with the reader's epoch plan (chunks of 47 records, windows of
8 chunks), batches of 256 made new and the last 6 kept alive, as a prefetching reader does:

  hdf5 window + take     HDF5 reads each chunk into a window, np.take gathers each batch
                         (what the reader does)
  hdf5 map, grouped take memory maps of the shard's HDF5 chunks; each batch's records grouped
                         by chunk, one np.take per group straight from the page cache
  hdf5 map, per record   the same maps, each record copied to its row by a line of Python
                         (keeps the order inside the batch)
  lmdb window + take     each value copied into a window, np.take per batch (the reader's way)
  lmdb scatter           each value copied straight to its row in its batch: no window, no take
  reader hdf5 / lmdb     open_reader(store, batch_size=256, verify=False), the same epochs

    python benchmarks/bench_gather_paths.py            # ~10 s
"""

from __future__ import annotations

import argparse
import mmap
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

import h5py
import lmdb
import numpy as np
import reporting

from packer import open_reader, read_manifest
from packer.reading import epoch as plan
from packer.store.lmdb_store import record_key

BATCH, CHUNK, BUFFER, ALIVE = 256, 47, 8, 6


def windows(num_records: int, epoch: int) -> list[list[plan.Span]]:
    spans = plan.chunk_spans([num_records], CHUNK)
    return list(plan.windows(plan.shuffled_chunks(spans, 0, epoch), BUFFER))


def batches_of(order: np.ndarray) -> list[np.ndarray]:
    return [order[a : a + BATCH] for a in range(0, len(order), BATCH)]


class H5Maps:
    """Row views of a raw HDF5 shard's chunks, each chunk a view of one read-only file map."""

    def __init__(self, path: Path) -> None:
        with h5py.File(path, "r") as f:
            data = f["images"]
            self.shape, self.rows_per_chunk = data.shape, data.chunks[0]
            chunks = [data.id.get_chunk_info(i) for i in range(data.id.get_num_chunks())]
        self.file = path.open("rb")
        self.map = mmap.mmap(self.file.fileno(), 0, access=mmap.ACCESS_READ)
        row = int(np.prod(self.shape[1:]))
        self.chunks = [
            np.frombuffer(self.map, np.uint8, c.size, c.byte_offset).reshape(-1, *self.shape[1:])
            for c in chunks
        ]
        assert all(c.size == self.rows_per_chunk * row for c in chunks)

    def where(self, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return records // self.rows_per_chunk, records % self.rows_per_chunk


def hdf5_window_take(path: Path, epochs: int) -> None:
    kept: deque[np.ndarray] = deque(maxlen=ALIVE)
    with h5py.File(path, "r", rdcc_nbytes=0) as f:
        data = f["images"]
        window = np.empty((BUFFER * CHUNK, *data.shape[1:]), np.uint8)
        for epoch in range(epochs):
            for w in windows(len(data), epoch):
                at = 0
                for s in w:
                    space = data.id.get_space()
                    space.select_hyperslab((s.start, 0, 0, 0), (len(s), *data.shape[1:]))
                    rows = window[at : at + len(s)]
                    data.id.read(h5py.h5s.create_simple(rows.shape), space, rows)
                    at += len(s)
                order = np.random.default_rng(epoch).permutation(at)
                for part in batches_of(order):
                    batch = np.empty((len(part), *data.shape[1:]), np.uint8)
                    kept.append(np.take(window, part, axis=0, out=batch, mode="clip"))


def shuffled_batches(num_records: int, epochs: int) -> Iterator[np.ndarray]:
    """The record numbers of each batch, in the order the window shuffle gives them."""
    for epoch in range(epochs):
        for w in windows(num_records, epoch):
            records = np.concatenate([np.arange(s.start, s.stop) for s in w])
            order = np.random.default_rng(epoch).permutation(len(records))
            yield from batches_of(records[order])


def hdf5_map_grouped(path: Path, epochs: int) -> None:
    maps, kept = H5Maps(path), deque(maxlen=ALIVE)
    for part in shuffled_batches(maps.shape[0], epochs):
        chunk, row = maps.where(part)
        by_chunk = np.argsort(chunk, kind="stable")
        chunk, row = chunk[by_chunk], row[by_chunk]
        batch = np.empty((len(part), *maps.shape[1:]), np.uint8)
        bounds = np.flatnonzero(np.diff(chunk)) + 1
        for a, b in zip([0, *bounds], [*bounds, len(part)]):
            np.take(maps.chunks[chunk[a]], row[a:b], axis=0, out=batch[a:b], mode="clip")
        kept.append(batch)


def hdf5_map_per_record(path: Path, epochs: int) -> None:
    maps, kept = H5Maps(path), deque(maxlen=ALIVE)
    for part in shuffled_batches(maps.shape[0], epochs):
        batch = np.empty((len(part), *maps.shape[1:]), np.uint8)
        for i, (c, r) in enumerate(zip(*(x.tolist() for x in maps.where(part)))):
            batch[i] = maps.chunks[c][r]
        kept.append(batch)


def lmdb_read(txn: lmdb.Transaction, span: plan.Span, targets: list[memoryview]) -> None:
    cursor = txn.cursor()
    cursor.set_key(record_key(span.start))
    for target, value in zip(targets, cursor.iternext(keys=False)):
        target[:] = value


def lmdb_window_take(path: Path, epochs: int, num_records: int, shape: tuple[int, ...]) -> None:
    kept: deque[np.ndarray] = deque(maxlen=ALIVE)
    row = int(np.prod(shape))
    window = np.empty((BUFFER * CHUNK, *shape), np.uint8)
    flat = window.reshape(-1).data
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    with env, env.begin(buffers=True) as txn:
        for epoch in range(epochs):
            for w in windows(num_records, epoch):
                at = 0
                for s in w:
                    lmdb_read(
                        txn, s, [flat[(at + i) * row : (at + i + 1) * row] for i in range(len(s))]
                    )
                    at += len(s)
                order = np.random.default_rng(epoch).permutation(at)
                for part in batches_of(order):
                    batch = np.empty((len(part), *shape), np.uint8)
                    kept.append(np.take(window, part, axis=0, out=batch, mode="clip"))


def lmdb_scatter(path: Path, epochs: int, num_records: int, shape: tuple[int, ...]) -> None:
    kept: deque[np.ndarray] = deque(maxlen=ALIVE)
    row = int(np.prod(shape))
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    with env, env.begin(buffers=True) as txn:
        for epoch in range(epochs):
            for w in windows(num_records, epoch):
                size = sum(len(s) for s in w)
                order = np.random.default_rng(epoch).permutation(size)
                batches = [np.empty((len(p), *shape), np.uint8) for p in batches_of(order)]
                flats = [b.reshape(-1).data for b in batches]
                place = np.empty(size, np.int64)
                place[order] = np.arange(size)  # window position -> position in the output
                targets = [
                    flats[q // BATCH][q % BATCH * row : (q % BATCH + 1) * row]
                    for q in place.tolist()
                ]
                at = 0
                for s in w:
                    lmdb_read(txn, s, targets[at : at + len(s)])
                    at += len(s)
                kept.extend(batches)


def reader(store: Path, epochs: int) -> None:
    with open_reader(store, batch_size=BATCH, seed=0, verify=False) as r:
        for epoch in range(epochs):
            for _ in r.epoch(epoch):
                pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/packer-bench-read"))
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    stores = args.workdir / "stores" / "images-3000"
    h5, lm = stores / "raw-64x64.h5", stores / "raw-64x64.lmdb"
    if not (h5.is_dir() and lm.is_dir()):
        print(
            f"no raw stores under {stores}: run benchmarks/bench_reader.py first", file=sys.stderr
        )
        return 1
    (h5_shard,) = [h5 / s.file for s in read_manifest(h5).shards]
    maps = H5Maps(h5_shard)  # the maps address the same pixels h5py reads
    with h5py.File(h5_shard, "r") as f:
        for record in {0, maps.rows_per_chunk, maps.shape[0] - 1}:
            chunk, row = maps.where(np.array([record]))
            assert np.array_equal(maps.chunks[int(chunk[0])][int(row[0])], f["images"][record])
    manifest = read_manifest(lm)
    (lm_shard,) = [lm / s.file for s in manifest.shards]
    shape = tuple(manifest.storage.shape)
    n = manifest.num_records
    runs: dict[str, Callable[[], None]] = {
        "hdf5 window + take": lambda: hdf5_window_take(h5_shard, args.epochs),
        "hdf5 map, grouped take": lambda: hdf5_map_grouped(h5_shard, args.epochs),
        "hdf5 map, per record": lambda: hdf5_map_per_record(h5_shard, args.epochs),
        "reader hdf5": lambda: reader(h5, args.epochs),
        "lmdb window + take": lambda: lmdb_window_take(lm_shard, args.epochs, n, shape),
        "lmdb scatter": lambda: lmdb_scatter(lm_shard, args.epochs, n, shape),
        "reader lmdb": lambda: reader(lm, args.epochs),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeat):  # interleaved: every way is timed side by side
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - started)
    print(reporting.header("Gathering raw batches", reporting.command(__file__)))
    print(f"{n:,} raw {'x'.join(map(str, shape))} records, {args.epochs} epochs; seconds:")
    for name, seconds in times.items():
        rest = sorted(seconds[1:] or seconds)  # the first repeat warms caches up
        print(f"  {name:24} best {min(seconds):.4f}   repeats 2+: {rest[0]:.4f}-{rest[-1]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
