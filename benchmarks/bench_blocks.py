#!/usr/bin/env python3
"""Benchmark small records: store size against the files, and the raw reader against a bare read.

1. Store size / source size by record size: folders of noise PNGs of about 500 B, 2 KB, 8 KB,
   64 KB, 1 MB and 10 MB (ImageNet-like names, ``class_k/img_nnnnnn.png``), each packed as it
   is (the default, original bytes) into LMDB and HDF5. Ratio = the shard files' bytes / the
   files' bytes (their sizes, not the disk blocks they take). Target <= 1.05.
2. Raw reader vs a bare read of the same shards: ``--raw-images`` noise images packed
   ``raw=True, size=(32, 32)``; ``open_reader(store, batch_size=256)`` with its defaults
   (shuffled, checksums verified) reading 5 epochs, against an LMDB cursor walk copying every
   value into bytes, or h5py reading ``images`` in slices of the reader's chunk size into one
   reused array by HDF5's own call. Best of ``--repeat`` runs, interleaved. Target >= 0.5.
   Shown too, the floor under any shuffling reader (bench_reader.py's kept_reads): the same
   reads copied into a window of 8 chunks, and each window copied out again in a random
   order into batches of 256; no checks, no labels or paths, no threads. And that floor with
   one CRC-32 pass over each window, the least that verifying checksums adds.

Folders and stores are cached under ``--workdir``, warm in the page cache: reads cost memory
copies, not disk.

    python benchmarks/bench_blocks.py     # ~3 minutes, plus generating the first time; writes
                                          # docs/benchmarks/small-records.md
    python benchmarks/bench_blocks.py --quick --json
    python benchmarks/bench_blocks.py --quick --raw-images 300 --repeat 1 --out /tmp/small.md
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import h5py
import lmdb
import numpy as np
from PIL import Image

from packer import PackOptions, open_reader, pack, read_manifest
from packer.reading.options import default_chunk_size
from packer.store.manifest import FORMAT_VERSION

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reporting  # noqa: E402
from bench_reader import kept_reads  # noqa: E402

# Record size -> images generated for it (about 2-60 MB of files each).
SIZES = {500: 4000, 2_000: 3000, 8_000: 1000, 64_000: 300, 1_000_000: 30, 10_000_000: 6}
QUICK_SIZES = {500: 400, 2_000: 300, 64_000: 30, 1_000_000: 4}
SIZE_TARGET, RAW_TARGET = 1.05, 0.5
RAW_IMAGES, QUICK_RAW_IMAGES, BATCH = 20_000, 2_000, 256
EPOCHS = 5  # epochs a raw run reads (one reader for all of them), or passes of a bare loop


def noise_png(path: Path, nbytes: int, rng: np.random.Generator) -> None:
    """A PNG of noise of about ``nbytes`` (noise does not compress: pixels + ~70 B)."""
    channels = 1 if nbytes < 4000 else 3
    side = max(4, int(math.sqrt(max(nbytes - 70, 16) / channels)))
    pixels = rng.integers(0, 256, (side, side, channels), dtype=np.uint8)
    Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels).save(path, compress_level=0)


def folder(root: Path, nbytes: int, count: int) -> Path:
    stamp = root / ".made"
    if stamp.is_file() and stamp.read_text() == f"{nbytes} {count}":
        return root
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(nbytes)
    print(f"generating {count} images of ~{nbytes:,} B in {root} ...", file=sys.stderr)
    for i in range(count):
        path = root / f"class_{i % 10}" / f"img_{i:06d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        noise_png(path, nbytes, rng)
    stamp.write_text(f"{nbytes} {count}")
    return root


def files_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*.png"))


def packed(source: Path, out: Path, **options: Any) -> Path:
    """``source`` packed into ``out`` once (names carry the format: a new one packs again)."""
    if not (out / "manifest.json").is_file():
        print(f"packing {out.name} ...", file=sys.stderr)
        pack(source, out, PackOptions(seed=0, overwrite=True, **options))
    return out


def shards_bytes(store: Path) -> int:
    return sum(s.bytes for s in read_manifest(store).shards)


def size_part(work: Path, sizes: dict[int, int]) -> list[dict[str, Any]]:
    rows = []
    for nbytes, count in sizes.items():
        source = folder(work / f"files-{nbytes}", nbytes, count)
        files = files_bytes(source)
        row: dict[str, Any] = {"record_bytes": files // count, "records": count, "files": files}
        for backend, ext in (("lmdb", "lmdb"), ("hdf5", "h5")):
            store = packed(source, work / f"size-{nbytes}-v{FORMAT_VERSION}.{ext}", backend=backend)
            row[backend] = round(shards_bytes(store) / files, 4)
        rows.append(row)
    return rows


def lmdb_walk(store: Path) -> int:
    """Every value of every shard copied out as bytes by a cursor walk."""
    for shard in read_manifest(store).shards:
        env = lmdb.open(str(store / shard.file), subdir=False, readonly=True, lock=False)
        with env, env.begin() as txn:  # buffers=False: each value copied into bytes
            for _value in txn.cursor().iternext(keys=False):
                pass
    return read_manifest(store).num_records


def h5_slices(store: Path) -> int:
    """``images`` in slices of the reader's chunk size, by HDF5's own read, into one array."""
    manifest = read_manifest(store)
    chunk = default_chunk_size(manifest.stats, manifest.num_records)
    for shard in manifest.shards:
        with h5py.File(store / shard.file, "r", locking=False, rdcc_nbytes=0) as f:
            data = f["images"]
            rows = np.empty((chunk, *data.shape[1:]), data.dtype)
            for a in range(0, len(data), chunk):
                n = min(chunk, len(data) - a)
                space = data.id.get_space()
                space.select_hyperslab((a, 0, 0, 0), (n, *data.shape[1:]))
                data.id.read(h5py.h5s.create_simple((n, *data.shape[1:])), space, rows[:n])
    return manifest.num_records


def reader_epochs(store: Path, **options: Any) -> int:
    """EPOCHS epochs of one reader (opening it, starting its threads, counted)."""
    images = 0
    with open_reader(store, batch_size=BATCH, **options) as reader:
        for epoch in range(EPOCHS):
            for batch, _ in reader.epoch(epoch):
                images += len(batch)
    return images


def repeated(run: Callable[[Path], int], store: Path) -> int:
    return sum(run(store) for _ in range(EPOCHS))


def raw_part(work: Path, images: int, repeat: int) -> list[dict[str, Any]]:
    source = folder(work / f"files-raw-{images}", 1500, images)
    stores = {
        b: packed(
            source,
            work / f"raw32-{images}-v{FORMAT_VERSION}.{ext}",
            backend=b,
            raw=True,
            size=(32, 32),
        )
        for b, ext in (("lmdb", "lmdb"), ("hdf5", "h5"))
    }
    runs: dict[str, Callable[[], int]] = {}
    for backend, store in stores.items():
        bare = lmdb_walk if backend == "lmdb" else h5_slices
        runs[f"bare {backend}"] = partial(repeated, bare, store)
        runs[f"floor {backend}"] = partial(repeated, shuffle_floor, store)
        with_checks = partial(shuffle_floor, check=True)
        runs[f"floor {backend} checked"] = partial(repeated, with_checks, store)
        runs[f"reader {backend}"] = partial(reader_epochs, store)
        runs[f"reader {backend} verify=False"] = partial(reader_epochs, store, verify=False)
    best: dict[str, float] = {}
    for _ in range(repeat):
        for name, run in runs.items():
            started = time.perf_counter()
            count = run()
            rate = count / (time.perf_counter() - started)
            best[name] = max(best.get(name, 0.0), rate)
    rows = []
    for backend in stores:
        bare = best[f"bare {backend}"]
        for name in (
            f"floor {backend}",
            f"floor {backend} checked",
            f"reader {backend}",
            f"reader {backend} verify=False",
        ):
            rows.append(
                {
                    "run": name,
                    "images_per_s": round(best[name]),
                    "bare": round(bare),
                    "ratio": round(best[name] / bare, 3),
                    "of_floor": round(best[name] / best[f"floor {backend}"], 3),
                }
            )
    return rows


def shuffle_floor(store: Path, check: bool = False) -> int:
    manifest = read_manifest(store)
    chunk = default_chunk_size(manifest.stats, manifest.num_records)
    return int(kept_reads(store, chunk, 8, 1, shuffle=True, check=check)["images"])


SIZE_PROSE = """Folders of noise PNGs (which do not compress) of about the size in the first column, named
like ImageNet's (`class_3/img_000123.png`), packed with default options (the files' bytes
stored as they are). Ratio = the shard files' bytes / the files' bytes (their sizes, not the
disk blocks they occupy). Target ≤ {target}.

"""
SIZE_COST = """What a record costs beyond its bytes: in LMDB, its share of a block's compressed header
(offsets, CRC-32, labels, shape, format, path) and of the half page a block wastes on average;
in HDF5, its deflated small columns.
"""
RAW_PROSE = """{images:,} noise images packed `raw=True, size=(32, 32)` (3 KB a record, one shard); every run
reads {epochs} epochs (a reader opened once for them: its start counts), best of {repeat}, all
runs interleaved. *Bare*: an LMDB cursor walk copying every value (a block) into bytes, or
h5py reading `/images` in slices of the reader's chunk size into one reused array by HDF5's own
call, in file order. *Floor*: the bare reads copied into a window of 8 chunks, each window
copied out again in a random order into batches of {batch}: what any shuffling reader copies,
with no checks, labels, paths or threads. *Floor, checked*: the floor and one CRC-32 pass over
each window as it fills, the least a reader that verifies checksums adds. *Reader*:
`open_reader(store, batch_size={batch})`, its defaults (shuffled, checksums verified). Target:
reader ≥ {target}× bare. {load}

"""
READER_COST = """Where the rest of the time goes, by profiles of the reader rather than by this
script: Python per block and per batch, each block's header parsed (inflate, msgpack, checks)
in the first epoch, and the copy, hand-off and queueing of every batch.
"""


def page(report: dict[str, Any]) -> str:
    """The results page: store size by record size, then the raw reader against a bare read."""
    text = reporting.header("Small records", report["command"])
    text += "## Store size against the files\n\n" + SIZE_PROSE.format(target=SIZE_TARGET)
    rows = [
        [
            f"{row['record_bytes']:,} B"
            if row["record_bytes"] < 4000
            else f"{row['record_bytes'] / 1e3:,.1f} KB"
            if row["record_bytes"] < 1e6
            else f"{row['record_bytes'] / 1e6:,.1f} MB",
            f"{row['records']:,}",
            f"{row['files'] / 1e6:.1f} MB",
            f"{row['lmdb']:.3f}",
            f"{row['hdf5']:.3f}",
        ]
        for row in report["sizes"]
    ]
    text += reporting.table(["record", "records", "files", "LMDB", "HDF5"], rows)
    worst = max(max(row["lmdb"], row["hdf5"]) for row in report["sizes"])
    smallest = report["sizes"][0]
    text += (
        f"Target {'met' if worst <= SIZE_TARGET else 'not met'}: the largest ratio is "
        f"{worst:.3f}. At {smallest['record_bytes']:,} B a record LMDB adds "
        f"{(smallest['lmdb'] - 1) * 100:.1f}% and HDF5 {(smallest['hdf5'] - 1) * 100:.1f}%.\n\n"
        + SIZE_COST
    )
    text += "\n## Raw reader against a bare read\n\n" + RAW_PROSE.format(
        images=report["raw_images"],
        epochs=EPOCHS,
        repeat=report["repeat"],
        batch=BATCH,
        target=RAW_TARGET,
        load=report["load"],
    )
    rows = [
        [
            row["run"].replace(" lmdb", ", LMDB").replace(" hdf5", ", HDF5")
            .replace(" verify=False", ", `verify=False`").replace(" checked", ", checked"),
            f"{row['images_per_s']:,}",
            f"{row['bare']:,}",
            f"{row['ratio']:.2f}",
            f"{row['of_floor']:.2f}",
        ]
        for row in report["raw"]
    ]  # fmt: skip
    text += reporting.table(["run", "images/s", "bare images/s", "× bare", "× floor"], rows)
    readers = [row for row in report["raw"] if row["run"].startswith("reader")]
    defaults = [row for row in readers if "verify" not in row["run"]]
    verdict = "met" if min(row["ratio"] for row in defaults) >= RAW_TARGET else "not met"
    text += (
        f"Target {verdict}: with its defaults the reader gets "
        + " and ".join(
            f"{row['ratio']:.2f}× a bare read ({row['of_floor']:.2f}× the floor) on "
            f"{row['run'].split()[1].upper()}"
            for row in defaults
        )
        + ". "
    )
    checked = [row for row in report["raw"] if row["run"].endswith("checked")]
    text += (
        "Checking CRC-32s alone puts the floor at "
        + " and ".join(
            f"{row['ratio']:.2f}× a bare read on {row['run'].split()[1].upper()}" for row in checked
        )
        + ". "
    )
    rate = {row["run"]: row["images_per_s"] for row in readers}
    text += (
        "Verified, the reader runs at "
        + " and ".join(
            f"{row['images_per_s'] / rate[row['run'] + ' verify=False']:.2f}× its rate with "
            f"`verify=False` on {row['run'].split()[1].upper()}"
            for row in defaults
        )
        + ".\n\n"
        + READER_COST
    )
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/packer-bench-blocks"))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer, smaller folders")
    parser.add_argument(
        "--raw-images", type=int, help=f"images of the raw part ({RAW_IMAGES:,}; quick: "
        f"{QUICK_RAW_IMAGES:,})"
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print JSON; write no page")
    reporting.out_option(parser, "small-records.md")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    raw_images = args.raw_images or (QUICK_RAW_IMAGES if args.quick else RAW_IMAGES)
    report = {
        "command": reporting.command(__file__, argv),
        "machine": reporting.machine(),
        "repeat": args.repeat,
        "raw_images": raw_images,
        "sizes": size_part(args.workdir, QUICK_SIZES if args.quick else SIZES),
        "raw": raw_part(args.workdir, raw_images, args.repeat),
        "load": reporting.load(),
    }
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    text = page(report)
    reporting.write(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
