#!/usr/bin/env python3
"""Benchmark HDF5 layouts for variable-length encoded image records.

Records are incompressible (random bytes, like JPEG) with sizes drawn from a
lognormal (median ~110 KB, sigma 0.7, clipped to 5 KB..1 MB).  Layouts:

  (a) vlen  -- one ``h5py.vlen_dtype(np.uint8)`` dataset, one element per record;
               a chunk read is ``ds[start:stop]``.
  (b) flat  -- one 1-D uint8 dataset holding all records back to back, plus an
               ``offsets`` uint64 dataset of length N+1; a chunk read is
               ``offsets[start:stop+1]``, one ``data[o0:o1]`` slice, then
               zero-copy memoryview splitting.  Tried with HDF5 chunk sizes
               256 KiB..16 MiB and as a contiguous (non-chunked) dataset.

Reported per layout: write throughput (records appended in ~4 MB batches, as a
packer would), sequential chunk-read throughput (``--chunk-size`` consecutive
records per call) as records/s, MB/s and speed ratio vs the reference layout
(flat, 16 MiB chunks), and file-size overhead vs the sum of record sizes.
Each figure is the best of ``--repeat`` runs; layouts are interleaved within
each repeat so the ratios are measured side by side.

NOTE: reads are WARM -- the files were just written and sit in the page cache
(dropping caches needs root), so reads measure HDF5/h5py overhead, not disk.
Writes land in the page cache too (each file is synced after its clock stops, so the next
write does not pay for its writeback) and are noisy on a shared box.
Files are opened with h5py's default 1 MiB chunk cache (rdcc_nbytes).

Run (1 MB = 10**6 bytes):
    python benchmarks/bench_hdf5_layout.py    # ~1 GB; writes its page under docs/benchmarks/
    python benchmarks/bench_hdf5_layout.py --total-mb 50 --repeat 1 --json
    python benchmarks/bench_hdf5_layout.py --total-mb 2 --repeat 1 --out /tmp/h5.md
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np
import reporting

KIB = 1024
MB = 1_000_000
WRITE_BUFFER = 4 * MB  # a packer flushes pending records once this many bytes are buffered
VLEN_CHUNK_ELEMS = 1024  # HDF5 chunk of the vlen dataset, in elements (16 B each)
REFERENCE = "flat-16MiB"  # recommended packer default; ratios are relative to it

Reader = Callable[[h5py.File, int, int], list[memoryview]]


@dataclass(frozen=True)
class Layout:
    name: str
    kind: str  # "vlen" or "flat"
    chunk_bytes: int | None = None  # flat only; None = contiguous


LAYOUTS = [
    Layout("vlen", "vlen"),
    Layout("flat-256KiB", "flat", 256 * KIB),
    Layout("flat-1MiB", "flat", 1024 * KIB),
    Layout("flat-4MiB", "flat", 4096 * KIB),
    Layout(REFERENCE, "flat", 16384 * KIB),
    Layout("flat-contig", "flat", None),
]


def make_payload(total_bytes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Return (pool, offsets): record i is pool[offsets[i]:offsets[i+1]]."""
    rng = np.random.default_rng(seed)
    sizes: list[int] = []
    while sum(sizes) < total_bytes:
        draw = rng.lognormal(np.log(110_000), 0.7, size=1024)
        sizes.extend(np.clip(draw, 5_000, 1_000_000).astype(np.int64).tolist())
    ends = np.cumsum(np.array(sizes, dtype=np.uint64))
    n = int(np.searchsorted(ends, total_bytes)) + 1
    offsets = np.concatenate([[0], ends[:n]]).astype(np.uint64)
    pool = np.frombuffer(rng.bytes(int(offsets[-1])), dtype=np.uint8)
    return pool, offsets


def write_batches(offsets: np.ndarray) -> list[tuple[int, int]]:
    """Split records into [start, stop) batches of about WRITE_BUFFER bytes."""
    batches, start, n = [], 0, len(offsets) - 1
    for i in range(1, n + 1):
        if offsets[i] - offsets[start] >= WRITE_BUFFER or i == n:
            batches.append((start, i))
            start = i
    return batches


def write_vlen(path: str, pool: np.ndarray, offsets: np.ndarray) -> None:
    with h5py.File(path, "w") as f:
        ds = f.create_dataset(
            "data",
            shape=(0,),
            maxshape=(None,),
            dtype=h5py.vlen_dtype(np.uint8),
            chunks=(VLEN_CHUNK_ELEMS,),
        )
        for start, stop in write_batches(offsets):
            batch = np.empty(stop - start, dtype=object)
            batch[:] = [pool[offsets[i] : offsets[i + 1]] for i in range(start, stop)]
            ds.resize((stop,))
            ds[start:stop] = batch


def write_flat(
    path: str, pool: np.ndarray, offsets: np.ndarray, fill_time: str, chunk_bytes: int | None
) -> None:
    with h5py.File(path, "w") as f:
        # fill_time="never" (our default): every byte gets written anyway.  With h5py's
        # default ("ifset"), a chunk bigger than the 1 MiB chunk cache that is first hit by
        # a partial write gets zero-filled on disk first, roughly halving write speed.
        if chunk_bytes is None:  # contiguous: needs the total size upfront
            ds = f.create_dataset(
                "data", shape=(int(offsets[-1]),), dtype=np.uint8, fill_time=fill_time
            )
        else:
            ds = f.create_dataset(
                "data",
                shape=(0,),
                maxshape=(None,),
                dtype=np.uint8,
                chunks=(chunk_bytes,),
                fill_time=fill_time,
            )
        for start, stop in write_batches(offsets):
            # A packer holds one bytes object per image: join them into one buffer.
            buf = np.concatenate([pool[offsets[i] : offsets[i + 1]] for i in range(start, stop)])
            lo, hi = int(offsets[start]), int(offsets[stop])
            if chunk_bytes is not None:
                ds.resize((hi,))
            ds[lo:hi] = buf
        f.create_dataset("offsets", data=offsets)


def read_vlen(f: h5py.File, start: int, stop: int) -> list[memoryview]:
    return [memoryview(rec) for rec in f["data"][start:stop]]


def read_flat(f: h5py.File, start: int, stop: int) -> list[memoryview]:
    offs = f["offsets"][start : stop + 1]
    view = memoryview(f["data"][int(offs[0]) : int(offs[-1])])
    rel = (offs - offs[0]).tolist()
    return [view[a:b] for a, b in zip(rel[:-1], rel[1:])]


def reader(layout: Layout) -> Reader:
    return read_vlen if layout.kind == "vlen" else read_flat


def time_write(
    layout: Layout, path: str, pool: np.ndarray, offsets: np.ndarray, fill_time: str
) -> float:
    """Write the whole file once; return elapsed seconds (including close)."""
    if os.path.exists(path):
        os.remove(path)
    t0 = time.perf_counter()
    if layout.kind == "vlen":
        write_vlen(path, pool, offsets)
    else:
        write_flat(path, pool, offsets, fill_time, layout.chunk_bytes)
    seconds = time.perf_counter() - t0
    # Untimed: the next write must not pay for this file's writeback. fsync, not os.sync:
    # only this file's pages, not every dirty page of the machine's other work.
    with open(path, "rb") as f:
        os.fsync(f.fileno())
    return seconds


def time_read(layout: Layout, path: str, n: int, chunk_size: int) -> float:
    """Read all records sequentially, chunk_size per call; return elapsed seconds."""
    read = reader(layout)
    t0 = time.perf_counter()
    with h5py.File(path, "r") as f:
        for start in range(0, n, chunk_size):
            read(f, start, min(start + chunk_size, n))
    return time.perf_counter() - t0


def verify(
    layout: Layout, path: str, pool: np.ndarray, offsets: np.ndarray, chunk_size: int
) -> None:
    """Check that the first and last chunk round-trip byte for byte."""
    n = len(offsets) - 1
    with h5py.File(path, "r") as f:
        for start in (0, max(0, n - chunk_size)):
            stop = min(start + chunk_size, n)
            for i, rec in zip(range(start, stop), reader(layout)(f, start, stop)):
                assert rec == pool[offsets[i] : offsets[i + 1]].tobytes(), (layout.name, i)


def run(args: argparse.Namespace) -> dict[str, Any]:
    pool, offsets = make_payload(int(args.total_mb * MB))
    n, total = len(offsets) - 1, int(offsets[-1])
    writes: dict[str, list[float]] = {lay.name: [] for lay in LAYOUTS}
    reads: dict[str, list[float]] = {lay.name: [] for lay in LAYOUTS}
    with tempfile.TemporaryDirectory(dir=args.tmpdir) as tmp:
        paths = {lay.name: os.path.join(tmp, f"{lay.name}.h5") for lay in LAYOUTS}
        for _ in range(args.repeat):  # interleave layouts within each repeat
            for lay in LAYOUTS:
                t = time_write(lay, paths[lay.name], pool, offsets, args.fill_time)
                writes[lay.name].append(t)
        for lay in LAYOUTS:
            verify(lay, paths[lay.name], pool, offsets, args.chunk_size)
        for _ in range(args.repeat):
            for lay in LAYOUTS:
                reads[lay.name].append(time_read(lay, paths[lay.name], n, args.chunk_size))
        file_bytes = {name: os.path.getsize(p) for name, p in paths.items()}
    ref_w, ref_r = min(writes[REFERENCE]), min(reads[REFERENCE])
    results = []
    for lay in LAYOUTS:
        w, r = min(writes[lay.name]), min(reads[lay.name])
        results.append(
            {
                "layout": lay.name,
                "hdf5_chunk_bytes": lay.chunk_bytes,
                "write_s": w,
                "write_mb_s": total / MB / w,
                "write_rec_s": n / w,
                "write_vs_ref": ref_w / w,
                "read_s": r,
                "read_mb_s": total / MB / r,
                "read_rec_s": n / r,
                "read_vs_ref": ref_r / r,
                "file_bytes": file_bytes[lay.name],
                "overhead_pct": 100 * (file_bytes[lay.name] / total - 1),
            }
        )
    sizes = np.diff(offsets)
    return {
        "records": n,
        "payload_bytes": total,
        "chunk_size": args.chunk_size,
        "repeat": args.repeat,
        "flat_fill_time": args.fill_time,
        "reference": REFERENCE,
        "record_bytes_median": float(np.median(sizes)),
        "record_bytes_p5_p95": [float(np.percentile(sizes, q)) for q in (5, 95)],
        "reads_warm_page_cache": True,
        "h5py": h5py.__version__,
        "hdf5": h5py.version.hdf5_version,
        "results": results,
    }


def layout_name(layout: str, chunk_bytes: int | None) -> str:
    if layout == "vlen":
        return "one vlen uint8 dataset"
    if chunk_bytes is None:
        return "flat bytes + offsets, contiguous"
    size = f"{chunk_bytes >> 20} MiB" if chunk_bytes >= 1 << 20 else f"{chunk_bytes >> 10} KiB"
    return f"flat bytes + offsets, {size} chunks"


def page(rep: dict[str, Any], command: str) -> str:
    """The results page: the setup, then read and write speed and size by layout."""
    p5, p95 = (x / 1e3 for x in rep["record_bytes_p5_p95"])
    text = reporting.header("HDF5 layouts", command)
    text += (
        f"{rep['records']:,} records of random bytes (incompressible, like JPEG), "
        f"{rep['payload_bytes'] / MB:,.0f} MB; record size median "
        f"{rep['record_bytes_median'] / 1e3:.0f} KB, p5-p95 {p5:.0f}-{p95:.0f} KB. Written in "
        f"batches of about 4 MB as a pack writes, then read {rep['chunk_size']:,} consecutive "
        f"records a call; best of {rep['repeat']}, the layouts interleaved. Reads are warm (the "
        "files sit in the page cache): they measure HDF5 and h5py, not the disk. Flat datasets "
        f"are written with `fill_time={rep['flat_fill_time']}`; h5py {rep['h5py']}, HDF5 "
        f"{rep['hdf5']}. *vs 16 MiB chunks*: speed relative to flat bytes in 16 MiB chunks "
        f"(above 1 is faster). {reporting.load()}\n\n"
    )
    rows = [
        [
            layout_name(r["layout"], r["hdf5_chunk_bytes"]),
            f"{r['read_mb_s']:,.0f}",
            f"{r['read_vs_ref']:.2f}",
            f"{r['write_mb_s']:,.0f}",
            f"{r['write_vs_ref']:.2f}",
            f"{r['overhead_pct']:.2f}%",
        ]
        for r in rep["results"]
    ]
    columns = ["layout", "read MB/s", "read vs 16 MiB chunks", "write MB/s"]
    columns += ["write vs 16 MiB chunks", "file over payload"]
    return text + reporting.table(columns, rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--total-mb", type=float, default=1000, help="payload size in MB")
    parser.add_argument("--chunk-size", type=int, default=1024, help="records per read call")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (best kept)")
    parser.add_argument("--json", action="store_true", help="print JSON; write no page")
    parser.add_argument("--tmpdir", default=None, help="directory for the test files")
    parser.add_argument(
        "--fill-time",
        default="never",
        choices=["never", "ifset", "alloc"],
        help="HDF5 fill time of flat datasets (h5py's default is ifset)",
    )
    reporting.out_option(parser, "components/hdf5-layout.md")
    args = parser.parse_args(argv)
    report = run(args)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    text = page(report, reporting.command(__file__, argv))
    reporting.write(args.out, text)
    print(text)


if __name__ == "__main__":
    main()
