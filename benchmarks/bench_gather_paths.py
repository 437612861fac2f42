#!/usr/bin/env python3
"""Ways a shuffling raw reader could copy pixels, timed bare (no reader around them), against
the reader itself: the measurement behind the design notes' "single-copy gather".

Each run reads --epochs shuffled epochs of ``benchmarks/bench_reader.py``'s raw 64x64 HDF5
store (its generated folder and store, cached in the same place; made here where missing) with the reader's epoch plan (chunks of 47 records, windows of
8 chunks), batches of 256 made new and the last 6 kept alive, as a prefetching reader does:

  hdf5 window + take     HDF5 reads each chunk into a window, np.take gathers each batch
                         (what the reader does)
  hdf5 map, grouped take memory maps of the shard's HDF5 chunks; each batch's records grouped
                         by chunk, one np.take per group straight from the page cache
  hdf5 map, per record   the same maps, each record copied to its row by a line of Python
                         (keeps the order inside the batch)
  reader hdf5            open_reader(store, batch_size=256, verify=False), the same epochs

HDF5 only: an LMDB shard of raw pixels holds blocks of consecutive records (format 5), so its
chunk is already read by copying a few blocks' payload bytes, with no per-record work.

    python benchmarks/bench_gather_paths.py   # ~1 minute; writes docs/benchmarks/components/...
    python benchmarks/bench_gather_paths.py --images 300 --epochs 1 --repeat 1 --out /tmp/g.md
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
import numpy as np
import reporting
from bench_reader import SEED, packed, prepare_folder

from packer import PackOptions, open_reader, read_manifest
from packer.reading import epoch as plan

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


def reader(store: Path, epochs: int) -> None:
    with open_reader(store, batch_size=BATCH, seed=0, verify=False) as r:
        for epoch in range(epochs):
            for _ in r.epoch(epoch):
                pass


def raw_store(workdir: Path, images: int) -> Path:
    """bench_reader.py's raw 64x64 HDF5 store of its ``images``-image folder, packed where it
    is missing (by its own cache, so either script reuses the other's)."""
    name = f"images-{images}"
    data = prepare_folder(workdir / name, images, (200, 500))
    options = PackOptions(backend="hdf5", seed=SEED, raw=True, size=(64, 64))
    return packed(data, workdir / "stores" / name / "raw-64x64.h5", options)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/packer-bench-read"))
    parser.add_argument("--images", type=int, default=3000, help="the generated folder's size")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    reporting.out_option(parser, "components/gather-paths.md")
    args = parser.parse_args(argv)
    h5 = raw_store(args.workdir, args.images)
    (h5_shard,) = [h5 / s.file for s in read_manifest(h5).shards]
    maps = H5Maps(h5_shard)  # the maps address the same pixels h5py reads
    with h5py.File(h5_shard, "r") as f:
        for record in {0, maps.rows_per_chunk, maps.shape[0] - 1}:
            chunk, row = maps.where(np.array([record]))
            assert np.array_equal(maps.chunks[int(chunk[0])][int(row[0])], f["images"][record])
    n, shape = maps.shape[0], maps.shape[1:]
    runs: dict[str, Callable[[], None]] = {
        "window + take (the reader's way)": lambda: hdf5_window_take(h5_shard, args.epochs),
        "maps, grouped take": lambda: hdf5_map_grouped(h5_shard, args.epochs),
        "maps, per record": lambda: hdf5_map_per_record(h5_shard, args.epochs),
        "the reader (`verify=False`)": lambda: reader(h5, args.epochs),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeat):  # interleaved: every way is timed side by side
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - started)
    text = reporting.header("Gathering raw batches", reporting.command(__file__, argv))
    text += (
        f"An HDF5 store of {n:,} raw {'x'.join(map(str, shape))} records (the raw store of "
        f"`bench_reader.py`), {args.epochs} shuffled epochs a run "
        f"with the reader's epoch plan (chunks of {CHUNK} records, windows of {BUFFER} chunks), "
        f"batches of {BATCH} made new and the last {ALIVE} kept alive, as a prefetching reader "
        f"does; seconds a run, {args.repeat} runs of each way interleaved. *window + take*: each "
        "chunk read into a window, `np.take` gathers each batch; *maps*: memory maps of the "
        "shard's HDF5 chunks, a batch's records grouped by chunk and taken straight from the page "
        "cache, or copied one by one by a line of Python. The repeats after the first (which warms "
        "caches up) are shown as a range. HDF5 only: an LMDB shard of raw pixels holds blocks of "
        "consecutive records, so its chunk is already copied a few blocks' payload bytes at a "
        f"time. {reporting.load()}\n\n"
    )
    rows = []
    for name, seconds in times.items():
        rest = sorted(seconds[1:] or seconds)
        rows.append([name, f"{min(seconds):.4f}", f"{rest[0]:.4f}-{rest[-1]:.4f}"])
    text += reporting.table(["way", "best s", "repeats 2+, s"], rows)
    reporting.write(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
