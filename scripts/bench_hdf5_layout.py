#!/usr/bin/env python3
"""Benchmark HDF5 layouts for variable-length encoded image records.

Compares, for incompressible records (random bytes, sizes lognormal with
median ~110 KB, clipped to 5 KB..1 MB, like JPEGs):

  (a) vlen   -- one ``h5py.vlen_dtype(np.uint8)`` dataset, one element per record;
                a chunk read is ``ds[start:stop]``.
  (b) flat   -- one 1-D uint8 dataset with all records back to back plus an
                ``offsets`` uint64 dataset of length N+1; a chunk read is one
                ``offsets[start:stop+1]`` read, one contiguous ``data[o0:o1]``
                slice, then zero-copy memoryview splitting.  Tried with several
                HDF5 chunk sizes and as a contiguous (non-chunked) dataset.

For each layout it reports write throughput (records appended in ~4 MB batches,
as a packer would), sequential chunk-read throughput (records/s, MB/s, ratio vs
the reference flat layout) and file-size overhead vs the sum of record sizes.
Every figure is the best of ``--repeat`` runs, and layouts are interleaved
within each repeat so ratios are measured side by side.

NOTE: reads are warm -- the files were just written and sit in the page cache
(dropping caches needs root), so this measures HDF5/h5py overhead, not disk.
Writes also land in the page cache (no fsync); they are noisy on a shared box.
Files are opened with h5py's default 1 MiB chunk cache (rdcc_nbytes).

Run:
    python scripts/bench_hdf5_layout.py                      # ~1 GB, table
    python scripts/bench_hdf5_layout.py --total-mb 50 --repeat 1 --json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import dataclass
import h5py
import numpy as np

KIB = 1024
MB = 1_000_000
WRITE_BUFFER = 4 * MB  # flush pending records once this many bytes are buffered
VLEN_CHUNK_ELEMS = 1024  # HDF5 chunk (in elements) of the vlen dataset
REFERENCE = "flat-1MiB"


@dataclass(frozen=True)
class Layout:
    name: str
    kind: str  # "vlen" or "flat"
    chunk_bytes: int | None = None  # flat only; None = contiguous


LAYOUTS = [
    Layout("vlen", "vlen"),
    Layout("flat-256KiB", "flat", 256 * KIB),
    Layout(REFERENCE, "flat", 1024 * KIB),
    Layout("flat-4MiB", "flat", 4096 * KIB),
    Layout("flat-16MiB", "flat", 16384 * KIB),
    Layout("flat-contig", "flat", None),
]


def make_payload(total_bytes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Return (pool, offsets): record i is pool[offsets[i]:offsets[i+1]]."""
    rng = np.random.default_rng(seed)
    sizes: list[int] = []
    while sum(sizes) < total_bytes:
        draw = rng.lognormal(np.log(110_000), 0.7, size=1024)
        sizes.extend(np.clip(draw, 5_000, 1_000_000).astype(np.int64).tolist())
    sizes_arr = np.array(sizes, dtype=np.uint64)
    n = int(np.searchsorted(np.cumsum(sizes_arr), total_bytes)) + 1
    offsets = np.concatenate([[0], np.cumsum(sizes_arr[:n])]).astype(np.uint64)
    pool = np.frombuffer(rng.bytes(int(offsets[-1])), dtype=np.uint8)
    return pool, offsets


def iter_batches(offsets: np.ndarray) -> list[tuple[int, int]]:
    """Split records into [start, stop) batches of about WRITE_BUFFER bytes."""
    batches, start = [], 0
    for i in range(1, len(offsets)):
        if offsets[i] - offsets[start] >= WRITE_BUFFER or i == len(offsets) - 1:
            batches.append((start, i))
            start = i
    return batches


def write_vlen(path: str, pool: np.ndarray, offsets: np.ndarray) -> None:
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("data", shape=(0,), maxshape=(None,),
                              dtype=h5py.vlen_dtype(np.uint8), chunks=(VLEN_CHUNK_ELEMS,))
        for start, stop in iter_batches(offsets):
            batch = np.empty(stop - start, dtype=object)
            batch[:] = [pool[offsets[i]:offsets[i + 1]] for i in range(start, stop)]
            ds.resize((stop,))
            ds[start:stop] = batch


def write_flat(path: str, pool: np.ndarray, offsets: np.ndarray, chunk_bytes: int | None) -> None:
    total = int(offsets[-1])
    with h5py.File(path, "w") as f:
        if chunk_bytes is None:  # contiguous: needs the total size upfront
            ds = f.create_dataset("data", shape=(total,), dtype=np.uint8)
        else:
            ds = f.create_dataset("data", shape=(0,), maxshape=(None,),
                                  dtype=np.uint8, chunks=(chunk_bytes,))
        for start, stop in iter_batches(offsets):
            # A packer gets one bytes object per file: concatenate them into one buffer.
            buf = np.concatenate([pool[offsets[i]:offsets[i + 1]] for i in range(start, stop)])
            lo, hi = int(offsets[start]), int(offsets[stop])
            if chunk_bytes is not None:
                ds.resize((hi,))
            ds[lo:hi] = buf
        f.create_dataset("offsets", data=offsets)


def read_vlen(f: h5py.File, start: int, stop: int) -> list[memoryview]:
    return [memoryview(rec) for rec in f["data"][start:stop]]


def read_flat(f: h5py.File, start: int, stop: int) -> list[memoryview]:
    offs = f["offsets"][start:stop + 1]
    base = int(offs[0])
    view = memoryview(f["data"][base:int(offs[-1])])
    rel = (offs - offs[0]).tolist()
    return [view[a:b] for a, b in zip(rel[:-1], rel[1:])]


def write_layout(layout: Layout, path: str, pool: np.ndarray, offsets: np.ndarray) -> float:
    """Write the whole file once; return elapsed seconds (including close)."""
    if os.path.exists(path):
        os.remove(path)
    os.sync()  # untimed: don't pay for the previous file's writeback (writes land in page cache)
    t0 = time.perf_counter()
    if layout.kind == "vlen":
        write_vlen(path, pool, offsets)
    else:
        write_flat(path, pool, offsets, layout.chunk_bytes)
    return time.perf_counter() - t0


def read_all(layout: Layout, path: str, n: int, chunk_size: int) -> float:
    """Read every record sequentially in chunks; return elapsed seconds."""
    read = read_vlen if layout.kind == "vlen" else read_flat
    t0 = time.perf_counter()
    with h5py.File(path, "r") as f:
        for start in range(0, n, chunk_size):
            recs = read(f, start, min(start + chunk_size, n))
            del recs
    return time.perf_counter() - t0


def verify(layout: Layout, path: str, pool: np.ndarray, offsets: np.ndarray, chunk_size: int) -> None:
    """Check the first and last chunk round-trip byte for byte."""
    n = len(offsets) - 1
    read = read_vlen if layout.kind == "vlen" else read_flat
    with h5py.File(path, "r") as f:
        for start in (0, max(0, n - chunk_size)):
            stop = min(start + chunk_size, n)
            for i, rec in zip(range(start, stop), read(f, start, stop)):
                assert rec == memoryview(pool[offsets[i]:offsets[i + 1]]), (layout.name, i)


def run(total_mb: float, chunk_size: int, repeat: int, tmpdir: str | None) -> dict:
    pool, offsets = make_payload(int(total_mb * MB))
    n, total = len(offsets) - 1, int(offsets[-1])
    sizes = np.diff(offsets)
    writes: dict[str, list[float]] = {lay.name: [] for lay in LAYOUTS}
    reads: dict[str, list[float]] = {lay.name: [] for lay in LAYOUTS}
    with tempfile.TemporaryDirectory(dir=tmpdir) as tmp:
        paths = {lay.name: os.path.join(tmp, f"{lay.name}.h5") for lay in LAYOUTS}
        for _ in range(repeat):  # interleave layouts within each repeat
            for lay in LAYOUTS:
                writes[lay.name].append(write_layout(lay, paths[lay.name], pool, offsets))
        for lay in LAYOUTS:
            verify(lay, paths[lay.name], pool, offsets, chunk_size)
        for _ in range(repeat):
            for lay in LAYOUTS:
                reads[lay.name].append(read_all(lay, paths[lay.name], n, chunk_size))
        file_sizes = {name: os.path.getsize(p) for name, p in paths.items()}
    ref_read = min(reads[REFERENCE])
    results = []
    for lay in LAYOUTS:
        w, r = min(writes[lay.name]), min(reads[lay.name])
        results.append({
            "layout": lay.name,
            "hdf5_chunk_bytes": lay.chunk_bytes,
            "write_s": w, "write_mb_s": total / MB / w, "write_rec_s": n / w,
            "read_s": r, "read_mb_s": total / MB / r, "read_rec_s": n / r,
            "read_speed_vs_ref": ref_read / r,
            "file_bytes": file_sizes[lay.name],
            "overhead_pct": 100 * (file_sizes[lay.name] / total - 1),
        })
    return {
        "records": n, "payload_bytes": total, "chunk_size": chunk_size, "repeat": repeat,
        "record_size_median": float(np.median(sizes)), "record_size_mean": float(sizes.mean()),
        "record_size_p5_p95": [float(np.percentile(sizes, 5)), float(np.percentile(sizes, 95))],
        "reference": REFERENCE, "warm_page_cache": True,
        "h5py": h5py.__version__, "hdf5": h5py.version.hdf5_version, "results": results,
    }


def print_table(report: dict) -> None:
    p5, p95 = report["record_size_p5_p95"]
    print(f"{report['records']} records, {report['payload_bytes'] / MB:.0f} MB payload, "
          f"size median {report['record_size_median'] / 1e3:.0f} KB, p5..p95 "
          f"{p5 / 1e3:.0f}..{p95 / 1e3:.0f} KB; chunk_size={report['chunk_size']}, "
          f"best of {report['repeat']}; h5py {report['h5py']} / HDF5 {report['hdf5']}")
    print("Reads are WARM (page cache): this measures HDF5/h5py overhead, not disk I/O.\n")
    header = (f"{'layout':<13}{'write MB/s':>11}{'write rec/s':>12}{'read MB/s':>11}"
              f"{'read rec/s':>12}{'read vs ' + report['reference']:>19}{'overhead':>10}")
    print(header)
    print("-" * len(header))
    for r in report["results"]:
        print(f"{r['layout']:<13}{r['write_mb_s']:>11.0f}{r['write_rec_s']:>12.0f}"
              f"{r['read_mb_s']:>11.0f}{r['read_rec_s']:>12.0f}"
              f"{r['read_speed_vs_ref']:>18.2f}x{r['overhead_pct']:>9.2f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--total-mb", type=float, default=1000, help="payload size in MB")
    parser.add_argument("--chunk-size", type=int, default=1024, help="records per chunk read")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (best kept)")
    parser.add_argument("--json", action="store_true", help="print a JSON object instead")
    parser.add_argument("--tmpdir", default=None, help="where to write the test files")
    args = parser.parse_args()
    report = run(args.total_mb, args.chunk_size, args.repeat, args.tmpdir)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)


if __name__ == "__main__":
    main()
