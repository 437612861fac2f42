#!/usr/bin/env python3
"""Benchmark ``packer.open_reader`` against the best the machine can do, side by side.

One generated image folder (``scripts/make_demo_data.py``: ~70% JPEG / 30% PNG, 200-500 px
sides by default), cached under ``--workdir`` with the stores packed from it. Every figure is
the best of ``--repeat`` runs; within a repeat all runs are interleaved, so every ratio
compares runs made side by side. Reader runs: batch 256, shuffle=True, one epoch.

  1. raw pixels (``PackOptions(raw=True, size=--raw-size)``), LMDB and HDF5, verify=True and
     verify=False vs the LIMIT, a bare read of the same shard files: an LMDB cursor walk
     copying every value into bytes, or h5py ``images[a:b]`` in slices of the reader's chunk
     size, each read into one reused array by HDF5's own call (``dataset.id.read``), as the
     reader reads them: h5py's slicing builds its selection in Python, ~45 us a call. Each
     run reads --raw-epochs epochs (they are short). Target >= 0.9x. Shown too, the floors
     under any shuffling reader, as bare loops: the same reads copied into a
     window of buffer_chunks chunks that stays in memory, and that plus copying each window
     out again, in a random order, into batch arrays.
  2. original bytes (default storage) vs the DECODE LIMIT: a thread pool of all cores decoding
     the same payloads (taken from the store beforehand) with ``Image.open(BytesIO(b))
     .convert("RGB")`` + ``np.asarray``, the clock around the decoding only. Target >= 0.9x.
     Shown too: the same pool with the JPEGs decoded by libjpeg-turbo straight into NumPy
     (``simplejpeg.decode_jpeg``, as the reader does), the limit of the reader's own path.
  3. what users have today: the seeds' baseline (Pillow, one file at a time in the main
     thread, batches of 256 as lists); a torch DataLoader (num_workers=2) over a minimal
     map-style dataset that decodes, converts to RGB and resizes to --resize, vs the reader
     (workers=2) doing the same resize in ``transform=``, and with its own ``size=`` (JPEGs
     decoded at a reduced scale first, then OpenCV's resize; output="torch" for both).
     Target >= 1.5x.
     Shown, not judged: a store packed at that size (``size=``, resize at pack time).
  4. overlap: 3 epochs with a simulated step (sleep --step-ms per batch; by default the
     warm-up epoch's time per batch, so compute ~ loading) vs max(loading alone, steps
     alone), 3 epochs each. Target <= 1.05x. Also shown: one epoch, with and without its
     first batch's latency (which nothing can prefetch in a lone epoch).
  5. --memory: peak RSS (VmHWM) of a fresh process reading one epoch of a raw 32x32 store of
     10k images and of 100k (the 10k files hard-linked 10 times under new names), with the
     same reader settings. Flat: 100k peak <= 1.2x the 10k peak. The first run packs them
     (about a minute; cached).

Image files and stores are warm in the page cache: reads cost memory copies, not disk.

    python benchmarks/bench_reader.py               # ~3 minutes, plus packing the first time
    python benchmarks/bench_reader.py --quick       # smoke test, < 60 s
    python benchmarks/bench_reader.py --memory --repeat 5 --json
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import random
import shutil
import subprocess
import sys
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import h5py
import lmdb
import msgpack
import numpy as np
import reporting
import simplejpeg
from PIL import Image

from packer import PackOptions, open_reader, open_store, pack, read_manifest
from packer.arguments import default_workers, parse_hw
from packer.store import lmdb_store
from packer.store.manifest import FORMAT_VERSION, MANIFEST_NAME
from packer.store.record import checksum

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from make_demo_data import CLASSES, make_demo_data  # noqa: E402

DEFAULT_IMAGES, QUICK_IMAGES, RAW_EPOCHS, OVERLAP_EPOCHS = 3000, 300, 10, 3
MEMORY_IMAGES, QUICK_MEMORY_IMAGES, MEMORY_SIDE = (10_000, 100_000), (1_000, 10_000), 32
BATCH, SEED, WORKERS = 256, 0, 2  # WORKERS: DataLoader num_workers, and the reader's to match
READ_TARGET, LOADER_TARGET, OVERLAP_TARGET, FLAT_TARGET = 0.9, 1.5, 1.05, 1.2
EXT = {"lmdb": "lmdb", "hdf5": "h5"}
BILINEAR = Image.Resampling.BILINEAR
NOTES = [
    "image files and stores are warm in the page cache: every figure is of reading from memory",
    "ratio = limit (or rival) time / packer time, higher is better; overlap: lower is better",
    "a reader run counts opening the reader and starting its threads; a DataLoader run counts "
    "starting its worker processes (persistent_workers=False, the default)",
    "1st batch = seconds to the first batch; wait = reader.stats()['wait_share'] (last epoch)",
    "limits read in file order; the reader reads its chunks in a shuffled order",
    "DataLoader vs 'transform resize': the same work (decode + resize per epoch); 'size=': "
    "the reader's own resize (JPEGs decoded at a reduced scale first, then OpenCV's bilinear, "
    "a whole-factor box average first below 1/2: packer/imaging/resizing.py); 'packed at': "
    "resized at pack time (shown, not judged)",
    "pages kept mapped / lmdb*: LMDB readers keep every page they read mapped, as before packer "
    "unmapped them past 32 MB (packer/store/lmdb_store.py): what bounding RSS costs (shown)",
]
Run = Callable[[], dict[str, float]]


@dataclass(frozen=True)
class Folder:
    root: Path
    files: list[Path]
    labels: list[int]
    nbytes: int
    params: dict[str, Any]


def cached(stamp: Path, params: dict[str, Any], make: Callable[[], object]) -> None:
    """Run ``make`` unless ``stamp`` records the same ``params``."""
    if not stamp.is_file() or json.loads(stamp.read_text()) != params:
        make()
        stamp.write_text(json.dumps(params))


def prepare_folder(root: Path, images: int, size_range: tuple[int, int]) -> Folder:
    """The generated image folder, regenerated when missing or made with other parameters."""
    per_class = math.ceil(images / len(CLASSES))
    params = {"per_class": per_class, "seed": SEED, "size_range": list(size_range)}
    if not root.is_dir():
        root.with_suffix(".json").unlink(missing_ok=True)

    def make() -> None:
        shutil.rmtree(root, ignore_errors=True)
        print(f"generating {per_class * len(CLASSES)} images in {root} ...", file=sys.stderr)
        make_demo_data(root, per_class, SEED, size_range)

    cached(root.with_suffix(".json"), params, make)
    return scan(root, params)


def replicate(data: Folder, root: Path, copies: int) -> Folder:
    """``copies`` hard links of every file of ``data``, each under a name of its own."""

    def make() -> None:
        shutil.rmtree(root, ignore_errors=True)
        for path in data.files:
            (root / path.parent.name).mkdir(parents=True, exist_ok=True)
            for k in range(copies):
                os.link(path, root / path.parent.name / f"{path.stem}_r{k}{path.suffix}")

    params = {**data.params, "copies": copies}
    cached(root.with_suffix(".json"), params, make)
    return scan(root, params)


def scan(root: Path, params: dict[str, Any]) -> Folder:
    files = sorted(p for p in root.rglob("*") if p.is_file())
    labels = [CLASSES.index(p.parent.name) for p in files]
    return Folder(root, files, labels, sum(p.stat().st_size for p in files), params)


def packed(data: Folder, out: Path, options: PackOptions) -> Path:
    """The store packed from ``data``, repacked only when the data or the options changed."""
    stamp = out.with_name(out.name + ".json")
    if not (out / MANIFEST_NAME).is_file():
        stamp.unlink(missing_ok=True)

    def make() -> None:
        print(f"packing {len(data.files)} images into {out} ...", file=sys.stderr)
        pack(data.root, out, replace(options, overwrite=True))

    params = {
        "data": data.params,
        "files": len(data.files),
        "options": options.to_json(),
        "format_version": FORMAT_VERSION,  # a store of an older layout is packed again
    }
    cached(stamp, params, make)
    return out


# -- what is timed ------------------------------------------------------------------------


def read(store: Path, epochs: int = 1, step_s: float = 0.0, **options: Any) -> dict[str, float]:
    """``epochs`` shuffled epochs in batches of 256, sleeping ``step_s`` after each batch."""
    started, images, first = time.perf_counter(), 0, 0.0
    with open_reader(store, batch_size=BATCH, shuffle=True, **options) as reader:
        for epoch in range(epochs):
            for batch, _ in reader.epoch(epoch):
                first = first or time.perf_counter() - started
                images += len(batch)
                if step_s:
                    time.sleep(step_s)
        wait_share = reader.stats()["wait_share"]  # of the last epoch
    return {"images": images, "first_batch_s": first, "wait_share": wait_share}


def pages_kept_mapped(run: Run) -> dict[str, float]:
    """``run`` with LMDB readers keeping every page they read mapped (no sweep)."""
    budget = lmdb_store._MAPPED_BYTES
    lmdb_store._MAPPED_BYTES = 1 << 62
    try:
        return run()
    finally:
        lmdb_store._MAPPED_BYTES = budget


def lmdb_walk(store: Path, epochs: int) -> dict[str, float]:
    """Raw LMDB limit: a cursor walk of every shard, each value (a block of records) copied
    out as bytes."""
    images = 0
    for shard in read_manifest(store).shards * epochs:
        env = lmdb.open(str(store / shard.file), subdir=False, readonly=True, lock=False)
        with env, env.begin() as txn:  # buffers=False: py-lmdb copies each value into bytes
            for _value in txn.cursor().iternext(keys=False):
                pass
        images += shard.num_records
    return {"images": images}


def h5_rows(data: h5py.Dataset, a: int, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """``data[a:a + n]`` (into ``out[:n]`` if given) by HDF5's own read, with no h5py
    selection built in Python: the fastest read h5py offers of a small slice."""
    shape = (n, *data.shape[1:])
    rows = np.empty(shape, data.dtype) if out is None else out[:n]
    space = data.id.get_space()
    space.select_hyperslab((a,) + (0,) * (len(shape) - 1), shape)
    data.id.read(h5py.h5s.create_simple(shape), space, rows)
    return rows


def h5_slices(store: Path, chunk: int, epochs: int) -> dict[str, float]:
    """Raw HDF5 limit: ``images[a:b]`` in slices of the reader's chunk size, in file order,
    each read by ``h5_rows`` into one reused array (a new array per slice would add its
    page faults: slower than the floors)."""
    images = 0
    for shard in read_manifest(store).shards * epochs:
        with h5py.File(store / shard.file, "r", locking=False, rdcc_nbytes=0) as f:
            data = f["images"]
            slice_ = np.empty((chunk, *data.shape[1:]), data.dtype)
            for a in range(0, len(data), chunk):
                images += len(h5_rows(data, a, min(chunk, len(data) - a), slice_))
    return {"images": images}


def kept_reads(
    store: Path,
    chunk: int,
    buffer: int,
    epochs: int,
    shuffle: bool,
    alive: int = 0,
    check: bool = False,
) -> dict[str, float]:
    """The floors under a shuffling reader: the limit's reads, but each chunk copied into a
    window of ``buffer`` chunks that stays in memory (a shuffle buffer), and with
    ``shuffle`` every full window's records copied out again in a random order, 256 to a
    new batch array; with ``alive``, the last that many batches kept, as a prefetch queue
    and the loop holding one keep them (each batch is then new memory, not the last one's,
    already in cache); with ``check``, one CRC-32 pass over each window as it fills, the
    least a reader verifying checksums does (no comparison, no per-record CRCs). No
    threads, no per-record metadata."""
    rng, images = np.random.default_rng(SEED), 0
    shape = read_manifest(store).storage.shape
    window = np.empty((buffer * chunk, *shape), np.uint8)
    row_bytes = window[0].nbytes
    kept: deque[np.ndarray] = deque(maxlen=alive or None)

    def empty(rows: int) -> None:
        nonlocal images
        images += rows
        if check:
            checksum(window[:rows].data)
        if shuffle:
            order = rng.permutation(rows)
            for a in range(0, rows, BATCH):
                part = order[a : a + BATCH]
                batch = np.empty((len(part), *shape), np.uint8)
                np.take(window, part, axis=0, out=batch, mode="clip")
                if alive:
                    kept.append(batch)

    for shard in read_manifest(store).shards * epochs:
        rows, path = 0, store / shard.file
        if path.suffix == ".lmdb":
            env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
            with env, env.begin(buffers=True) as txn:
                meta = msgpack.unpackb(txn.get(b"__packer__"))
                starts = [*np.frombuffer(meta["block_starts"], "<u8").tolist(), shard.num_records]
                flat = window.reshape(-1).data
                for first, end in zip(starts[:-1], starts[1:]):
                    value = txn.get(b"%010d" % first)  # a block: its rows first, back to back
                    at = 0
                    while at < end - first:
                        n = min(end - first - at, len(window) - rows)
                        flat[rows * row_bytes : (rows + n) * row_bytes] = value[
                            at * row_bytes : (at + n) * row_bytes
                        ]
                        rows, at = rows + n, at + n
                        if rows == len(window):
                            empty(rows)
                            rows = 0
        else:
            with h5py.File(path, "r", locking=False, rdcc_nbytes=0) as f:
                data = f["images"]
                for a in range(0, len(data), chunk):
                    n = min(chunk, len(data) - a)
                    if rows + n > len(window):
                        empty(rows)
                        rows = 0
                    h5_rows(data, a, n, window[rows:])
                    rows += n
        empty(rows)
    return {"images": images}


def decode_all(payloads: list[bytes]) -> None:
    for payload in payloads:
        np.asarray(Image.open(io.BytesIO(payload)).convert("RGB"))


def decode_all_turbo(payloads: list[bytes]) -> None:
    """JPEGs by libjpeg-turbo straight into NumPy (simplejpeg), the rest by Pillow."""
    for payload in payloads:
        if payload[:3] == b"\xff\xd8\xff":  # Pillow's own test for a JPEG
            simplejpeg.decode_jpeg(payload, "RGB")
        else:
            np.asarray(Image.open(io.BytesIO(payload)).convert("RGB"))


def decode_limit(
    payloads: list[bytes], workers: int, decode: Callable[[list[bytes]], None] = decode_all
) -> dict[str, float]:
    """Decode limit: every core decodes payloads from memory; only the decoding is timed."""
    size = max(1, len(payloads) // (workers * 16))
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(time.sleep, [0.01] * workers))  # every thread started before the clock
        started = time.perf_counter()
        parts = [payloads[i : i + size] for i in range(0, len(payloads), size)]
        for future in [pool.submit(decode, part) for part in parts]:
            future.result()
        seconds = time.perf_counter() - started
    return {"images": len(payloads), "seconds": seconds}


def pillow_batches(data: Folder) -> Iterator[tuple[list[np.ndarray], list[int]]]:
    """The seeds' baseline: each file opened, converted and copied in turn; lists of 256."""
    order = random.Random(SEED).sample(range(len(data.files)), len(data.files))
    for start in range(0, len(order), BATCH):
        images, labels = [], []
        for i in order[start : start + BATCH]:
            with Image.open(data.files[i]) as im:
                images.append(np.asarray(im.convert("RGB")))
            labels.append(data.labels[i])
        yield images, labels


def pillow_loop(data: Folder) -> dict[str, float]:
    return {"images": sum(len(images) for images, _ in pillow_batches(data))}


def resized(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The reader's transform: the resize the DataLoader's dataset does."""
    return np.asarray(Image.fromarray(image).resize((size[1], size[0]), BILINEAR))


def torch_loader(data: Folder, size: tuple[int, int]) -> dict[str, float]:
    """A DataLoader over a minimal ImageFolder-style dataset: open, RGB, resize, collate."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    # np.asarray of a Pillow image is read-only: torch warns (once per worker), copies nothing
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

    class FolderDataset(Dataset[tuple[np.ndarray, int]]):
        def __len__(self) -> int:
            return len(data.files)

        def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
            with Image.open(data.files[i]) as im:
                image = im.convert("RGB").resize((size[1], size[0]), BILINEAR)
            return np.asarray(image), data.labels[i]

    generator = torch.Generator().manual_seed(SEED)
    loader = DataLoader(
        FolderDataset(), BATCH, shuffle=True, num_workers=WORKERS, generator=generator
    )
    return {"images": sum(len(images) for images, _ in loader)}


def sleep_steps(batches: int, step_s: float) -> dict[str, float]:
    for _ in range(batches):
        time.sleep(step_s)
    return {"images": 0}


# -- planning, measuring, comparing -------------------------------------------------------


@dataclass(frozen=True)
class Compare:
    name: str  # the packer run
    against: list[str]  # the limit or rival; for an overlap, the runs it is the max of
    target: float | None  # None: shown, not judged
    overlap: bool = False  # ratio = time / max(against), lower is better
    less_first: bool = False  # overlap: the epoch less its first batch's latency


def plan(
    args: argparse.Namespace, data: Folder, stores: dict[str, Path], step_s: float
) -> tuple[dict[str, Run], list[Compare]]:
    """Every run by name, in the order one repeat runs them, and the comparisons."""
    import packer.torch_adapter  # noqa: F401  (imports torch here, not in a timed run)

    runs: dict[str, Run] = {}
    compares: list[Compare] = []
    for b in ("lmdb", "hdf5"):
        store, epochs = stores[f"raw {b}"], args.raw_epochs
        with open_reader(store, batch_size=BATCH) as reader:  # starts no thread
            chunk, buffer = reader.chunk_size, reader.options.buffer_chunks
            alive = reader.options.prefetch + 2
        limit = f"limit raw {b}" + (f" (slices of {chunk})" if b == "hdf5" else " (cursor walk)")
        walk = partial(lmdb_walk, store) if b == "lmdb" else partial(h5_slices, store, chunk)
        runs[limit] = partial(walk, epochs)
        kept, shuffled = f"floor raw {b}: reads kept in a window", f"floor raw {b}: + gathers"
        runs[kept] = partial(kept_reads, store, chunk, buffer, epochs, shuffle=False)
        runs[shuffled] = partial(kept_reads, store, chunk, buffer, epochs, shuffle=True)
        # the reader's queue holds `prefetch` batches, the loop one, the producer one it fills
        queued = f"floor raw {b}: + gathers, {alive} batches alive"
        runs[queued] = partial(kept_reads, store, chunk, buffer, epochs, True, alive)
        for verify in (True, False):
            name = f"reader raw {b} verify={verify}"
            runs[name] = partial(read, store, epochs, verify=verify)
            compares.append(Compare(name, [limit], READ_TARGET))
        compares += [Compare(floor, [limit], None) for floor in (kept, shuffled, queued)]
        compares.append(Compare(f"reader raw {b} verify=False", [queued], None))
        if b == "lmdb":
            mapped = "reader raw lmdb verify=False, pages kept mapped"
            runs[mapped] = partial(pages_kept_mapped, partial(read, store, epochs, verify=False))
            compares.append(Compare("reader raw lmdb verify=False", [mapped], None))
    with open_store(stores["original lmdb"]) as opened:
        payloads = [bytes(record.data) for record in opened.records()]
    pillow, turbo = "limit decode (all cores)", "limit decode, JPEGs by libjpeg-turbo (all cores)"
    runs[pillow] = partial(decode_limit, payloads, default_workers())
    runs[turbo] = partial(decode_limit, payloads, default_workers(), decode_all_turbo)
    for b in ("lmdb", "hdf5"):
        runs[f"reader original {b}"] = partial(read, stores[f"original {b}"])
        compares.append(Compare(f"reader original {b}", [pillow], READ_TARGET))
        compares.append(Compare(f"reader original {b}", [turbo], None))
    size, (h, w) = args.resize, args.resize
    rival, mine, at_read, sized = (
        f"DataLoader workers={WORKERS} resize {h}x{w}",
        f"reader workers={WORKERS} transform resize",
        f"reader workers={WORKERS} size={h}x{w}",
        f"reader workers={WORKERS} packed at {h}x{w}",
    )
    runs["seeds baseline (Pillow loop)"] = partial(pillow_loop, data)
    runs[rival] = partial(torch_loader, data, size)
    torch_out: dict[str, Any] = {"workers": WORKERS, "output": "torch"}
    runs[mine] = partial(
        read, stores["original lmdb"], transform=partial(resized, size=size), **torch_out
    )
    runs[at_read] = partial(read, stores["original lmdb"], size=size, fit="stretch", **torch_out)
    runs[sized] = partial(read, stores["sized lmdb"], **torch_out)
    batches = math.ceil(len(data.files) / BATCH)
    steps = f"steps alone ({batches} x {step_s * 1e3:.0f} ms)"
    runs[steps] = partial(sleep_steps, batches, step_s)
    runs["reader original lmdb + steps"] = partial(read, stores["original lmdb"], step_s=step_s)
    overlap = Compare("reader original lmdb + steps", ["reader original lmdb", steps], None, True)
    # Training runs many epochs; with across_epochs only the very first batch is unoverlapped.
    e = OVERLAP_EPOCHS
    alone, with_steps = (
        f"reader original lmdb, {e} epochs",
        f"reader original lmdb + steps, {e} epochs",
    )
    many_steps = f"steps alone ({e} x {batches} x {step_s * 1e3:.0f} ms)"
    runs[alone] = partial(read, stores["original lmdb"], e)
    runs[many_steps] = partial(sleep_steps, e * batches, step_s)
    runs[with_steps] = partial(read, stores["original lmdb"], e, step_s=step_s)
    compares.append(Compare(with_steps, [alone, many_steps], OVERLAP_TARGET, True))
    compares += [
        Compare("reader original lmdb", ["seeds baseline (Pillow loop)"], None),
        Compare(mine, [rival], LOADER_TARGET),
        Compare(at_read, [rival], LOADER_TARGET),
        Compare(sized, [rival], None),
        overlap,
        replace(overlap, target=None, less_first=True),
    ]
    return runs, compares


def measure(runs: dict[str, Run], repeat: int) -> dict[str, list[dict[str, float]]]:
    results: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
    for r in range(repeat):
        for name, run in runs.items():
            started = time.perf_counter()
            figures = run()
            figures.setdefault("seconds", time.perf_counter() - started)
            results[name].append(figures)
            print(f"  repeat {r + 1}/{repeat}: {name}: {figures['seconds']:.3f} s", file=sys.stderr)
    return results


def summarize(
    results: dict[str, list[dict[str, float]]], compares: list[Compare], images: int
) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {}
    for name, tries in results.items():
        best = min(tries, key=lambda f: f["seconds"])
        if int(best["images"]) % images:
            raise RuntimeError(f"{name} yielded {best['images']} images, not n x {images}")
        rows[name] = {k: round(v, 4) for k, v in best.items()}
        rows[name]["images_per_s"] = round(best["images"] / best["seconds"], 1)
        rows[name]["all_seconds"] = [round(f["seconds"], 4) for f in tries]
    targets = []
    for c in compares:
        mine, others = rows[c.name]["seconds"], [rows[a]["seconds"] for a in c.against]
        mine -= rows[c.name]["first_batch_s"] if c.less_first else 0.0
        ratio = mine / max(others) if c.overlap else others[0] / mine
        vs = f"max({', '.join(c.against)})" if c.overlap else c.against[0]
        name = f"{c.name}{' less its 1st batch' if c.less_first else ''} vs {vs}"
        targets.append(target(name, ratio, c.target, lower_is_better=c.overlap))
    return {"timings": rows, "targets": targets}


def target(name: str, ratio: float, goal: float | None, lower_is_better: bool) -> dict[str, Any]:
    ok = None if goal is None else ratio <= goal if lower_is_better else ratio >= goal
    return {
        "name": name,
        "ratio": round(ratio, 3),
        "target": goal,
        "lower": lower_is_better,
        "pass": ok,
    }


# -- memory (--memory) --------------------------------------------------------------------

# A fresh interpreter reads one epoch while a thread samples its RSS every millisecond.
CHILD = r"""
import json, sys, threading, time
from packer import open_reader
from packer.store import lmdb_store
if sys.argv[3:] == ["keep-mapped"]:  # see pages_kept_mapped
    lmdb_store._MAPPED_BYTES = 1 << 62
def status():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmHWM", "VmRSS", "RssAnon", "RssFile")}
peak, done = {"RssAnon": 0, "RssFile": 0}, threading.Event()
def sample():
    while not done.wait(0.001):
        now = status()
        for k in peak: peak[k] = max(peak[k], now[k])
before, images = status(), 0
threading.Thread(target=sample, daemon=True).start()
started = time.perf_counter()
with open_reader(sys.argv[1], **json.loads(sys.argv[2])) as reader:
    for batch, _ in reader:
        images += len(batch)
    chunk = reader.chunk_size
seconds = time.perf_counter() - started
done.set()
print(json.dumps({"before": before["VmRSS"], "hwm": status()["VmHWM"], "anon": peak["RssAnon"],
                  "file": peak["RssFile"], "images": images, "chunk_size": chunk,
                  "images_per_s": images / seconds}))
"""


def memory_child(store: Path, options: dict[str, Any], keep_mapped: bool = False) -> dict[str, Any]:
    argv = [sys.executable, "-c", CHILD, str(store), json.dumps(options)]
    argv += ["keep-mapped"] if keep_mapped else []
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.splitlines()[-1]))


def memory_part(args: argparse.Namespace) -> dict[str, Any]:
    small, big = QUICK_MEMORY_IMAGES if args.quick else MEMORY_IMAGES
    base = prepare_folder(args.workdir / f"small-{small}", small, (32, 96))
    copies = big // small
    folders = [base, replicate(base, args.workdir / f"small-{small}-x{copies}", copies)]
    record = MEMORY_SIDE * MEMORY_SIDE * 3
    rows, targets = [], []
    for b in ("lmdb", "hdf5"):
        raw = PackOptions(backend=b, seed=SEED, raw=True, size=(MEMORY_SIDE, MEMORY_SIDE))
        stores = [
            packed(f, args.workdir / "stores" / f"raw32-{f.root.name}.{EXT[b]}", raw)
            for f in folders
        ]
        # A fixed chunk size; the default, which grows with n; for LMDB, the fixed one with
        # every page read kept mapped (shown: what unmapping them saves).
        settings = [(256, False), (None, False)] + ([(256, True)] if b == "lmdb" else [])
        for chunk, kept in settings:
            options = {"batch_size": BATCH, "shuffle": True, "workers": WORKERS}
            options |= {"chunk_size": chunk} if chunk else {}
            got = [memory_child(s, options, keep_mapped=kept) for s in stores]
            label = f"{b}*" if kept else b
            for g in got:
                g["formula"] = 8 * g["chunk_size"] * record + (4 + WORKERS + 2) * BATCH * record
                rows.append({"backend": label, **g})
            setting = f"{label} {f'chunk_size={chunk}' if chunk else 'default chunk_size'}"
            for key, judged in (("hwm", not kept), ("anon", False)):
                goal = FLAT_TARGET if judged else None
                name = (
                    f"memory {setting}: {'VmHWM' if key == 'hwm' else 'peak anon'} {big} vs {small}"
                )
                targets.append(target(name, got[1][key] / got[0][key], goal, lower_is_better=True))
    return {"rows": rows, "targets": targets}


# -- report -------------------------------------------------------------------------------


def render(report: dict[str, Any]) -> str:
    d = report["data"]
    lines = [
        f"command: {report['command']}",
        f"machine: {report['machine']}",
        f"data: {d['images']} images ({d['formats']}), {d['mb']:.1f} MB, sides "
        f"{d['size_range'][0]}-{d['size_range'][1]} px, {d['root']}",
        f"raw stores {d['raw_size']} px, {report['raw_epochs']} epoch(s) per raw run (limits "
        f"too); step {report['step_ms']:.1f} ms per batch ({report['step_source']})",
        f"best of {report['repeat']} repeat(s)",
        *(f"note: {n}" for n in report["notes"]),
        "",
        f"{'run':<46}{'seconds':>9}{'images/s':>10}{'1st batch':>10}{'wait':>7}",
    ]
    for name, row in report["timings"].items():
        ips = f"{row['images_per_s']:.0f}" if row["images_per_s"] else ""
        first = f"{row['first_batch_s']:.3f}" if "first_batch_s" in row else ""
        wait = f"{row['wait_share']:.2f}" if "wait_share" in row else ""
        lines.append(f"{name:<46}{row['seconds']:>9.3f}{ips:>10}{first:>10}{wait:>7}")
    memory = report.get("memory")
    if memory:
        lines += [
            "",
            "memory, MB: VmHWM = peak RSS; before = RSS before open_reader; peak anon / file = "
            "peak RssAnon / RssFile (sampled every ms); formula = buffer_chunks 8 x chunk x "
            "record + (prefetch 4 + workers 2 + 2) x batch bytes, on top of 'before'; img/s = "
            "one epoch in that process, once (shown, not judged)",
            f"{'backend':<8}{'images':>8}{'chunk':>7}{'VmHWM':>8}{'before':>8}{'anon':>8}"
            f"{'file':>8}{'formula':>9}{'img/s':>10}",
        ]
        for r in memory["rows"]:
            mb = [f"{r[k] / 1e6:>8.1f}" for k in ("hwm", "before", "anon", "file")]
            lines.append(
                f"{r['backend']:<8}{r['images']:>8}{r['chunk_size']:>7}{''.join(mb)}"
                f"{r['formula'] / 1e6:>9.1f}{r['images_per_s']:>10,.0f}"
            )
    lines.append("")
    for t in report["targets"] + (memory["targets"] if memory else []):
        verdict = "info" if t["pass"] is None else "PASS" if t["pass"] else "FAIL"
        goal = (
            "" if t["target"] is None else f" (target {'<=' if t['lower'] else '>='} {t['target']})"
        )
        lines.append(f"{verdict:<5} {t['name']}: {t['ratio']:.3f}{goal}")
    return "\n".join(lines)


def page(report: dict[str, Any]) -> str:
    """The results page (docs/benchmarks/reading.md): the same figures as Markdown tables."""
    d = report["data"]
    text = reporting.header(
        "Reading: packer against bare reads and a DataLoader", report["command"]
    )
    text += (
        f"{d['images']:,} generated images ({d['formats']}; {d['mb']:.1f} MB, sides "
        f"{d['size_range'][0]}-{d['size_range'][1]} px); raw stores {d['raw_size']} px; "
        f"a simulated step of {report['step_ms']:.1f} ms a batch; best of {report['repeat']}.\n\n"
        + "".join(f"- {note}\n" for note in report["notes"])
        + "\n"
    )
    rows = [
        [
            name,
            f"{row['seconds']:.3f}",
            f"{row['images_per_s']:,.0f}" if row["images_per_s"] else "",
            f"{row['wait_share']:.2f}" if "wait_share" in row else "",
        ]
        for name, row in report["timings"].items()
    ]
    text += reporting.table(["run", "seconds", "images/s", "waiting share"], rows)
    memory = report.get("memory")
    if memory:
        rows = [
            [r["backend"], f"{r['images']:,}", r["chunk_size"], f"{r['hwm'] / 1e6:.1f}"]
            for r in memory["rows"]
        ]
        text += reporting.table(["backend", "images", "chunk", "peak RSS, MB"], rows)
    return text + reporting.goals(report["targets"] + (memory["targets"] if memory else []))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add = parser.add_argument
    add("--repeat", type=int, default=None, help="best of N (default 3; 1 with --quick)")
    add("--images", type=int, default=None, help=f"data set size (default {DEFAULT_IMAGES})")
    add("--size-range", type=int, nargs=2, default=(200, 500), metavar=("MIN", "MAX"))
    add("--raw-size", type=parse_hw, default=(64, 64), help="raw stores' HxW (default 64x64)")
    add("--raw-epochs", type=int, default=None, help=f"per raw run (default {RAW_EPOCHS}; quick 1)")
    add("--resize", type=parse_hw, default=(224, 224), help="part 3's HxW (default 224x224)")
    add("--step-ms", type=float, default=None, help="simulated step (default: load time/batch)")
    add("--workdir", type=Path, default=Path("/tmp/packer-bench-read"), help="data cache")
    add("--quick", action="store_true", help=f"{QUICK_IMAGES} images, 1 repeat: a smoke test")
    add("--memory", action="store_true", help="also part 5: peak RSS at 10k vs 100k images")
    add("--json", action="store_true", help="print one JSON object instead of the table")
    add("--out", type=Path, default=None, help="results page (default: docs' unless --quick)")
    args = parser.parse_args(argv)
    args.repeat = args.repeat or (1 if args.quick else 3)
    args.images = args.images or (QUICK_IMAGES if args.quick else DEFAULT_IMAGES)
    args.raw_epochs = args.raw_epochs or (1 if args.quick else RAW_EPOCHS)
    if min(args.repeat, args.images, args.raw_epochs) < 1:
        parser.error("--repeat, --images and --raw-epochs must be at least 1")
    return args


def pack_stores(args: argparse.Namespace, data: Folder, at: Path) -> dict[str, Path]:
    stores, (h, w) = {}, args.resize
    for b in ("lmdb", "hdf5"):
        raw = PackOptions(backend=b, seed=SEED, raw=True, size=args.raw_size)
        stores[f"raw {b}"] = packed(
            data, at / f"raw-{args.raw_size[0]}x{args.raw_size[1]}.{EXT[b]}", raw
        )
        stores[f"original {b}"] = packed(
            data, at / f"original.{EXT[b]}", PackOptions(backend=b, seed=SEED)
        )
    sized = PackOptions(seed=SEED, size=(h, w), fit="stretch")  # the DataLoader's resize
    stores["sized lmdb"] = packed(data, at / f"sized-{h}x{w}.lmdb", sized)
    return stores


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = reporting.command(__file__, argv)
    name = "quick" if args.quick else f"images-{args.images}"
    data = prepare_folder(args.workdir / name, args.images, tuple(args.size_range))
    stores = pack_stores(args, data, args.workdir / "stores" / name)
    for store in stores.values():  # into the page cache
        read(store, decode=False)
    started = time.perf_counter()
    read(stores["original lmdb"])  # a warm-up epoch; its time per batch is the default step
    load_s = time.perf_counter() - started
    step_s = (
        load_s / math.ceil(len(data.files) / BATCH) if args.step_ms is None else args.step_ms / 1e3
    )
    runs, compares = plan(args, data, stores, step_s)
    results = measure(runs, args.repeat)
    formats = read_manifest(stores["original lmdb"]).stats.get("formats", {})
    report: dict[str, Any] = {
        "command": command,
        "machine": f"{default_workers()} cores usable ({os.cpu_count()} total), "
        f"{platform.system()} {platform.machine()}, Python {platform.python_version()}, load "
        f"average {os.getloadavg()[0]:.2f} at the end (shared machine)",
        "repeat": args.repeat,
        "raw_epochs": args.raw_epochs,
        "notes": NOTES,
        "step_ms": step_s * 1e3,
        "step_source": "--step-ms"
        if args.step_ms is not None
        else "auto: a warm-up epoch / batches",
        "data": {
            "root": str(data.root),
            "images": len(data.files),
            "formats": ", ".join(f"{k} {v}" for k, v in formats.items()),
            "mb": data.nbytes / 1e6,
            "size_range": list(args.size_range),
            "raw_size": "x".join(map(str, args.raw_size)),
        },
        **summarize(results, compares, len(data.files)),
    }
    if args.memory:
        report["memory"] = memory_part(args)
    print(json.dumps(report, indent=1) if args.json else render(report))
    out = args.out or (None if args.quick else reporting.DOCS / "reading.md")
    if out is not None:
        reporting.write(out, page(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
