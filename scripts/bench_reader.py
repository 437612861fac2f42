#!/usr/bin/env python3
"""Benchmark ``packer.open_reader`` against the best the machine can do, side by side.

One generated image folder (``scripts/make_demo_data.py``: ~70% JPEG / 30% PNG, 200-500 px
sides by default, cached under ``--workdir`` with the stores packed from it), measured in
one run, every figure the best of ``--repeat`` epochs, all runs interleaved in each repeat:

  1. raw pixels (``PackOptions(raw=True, size=--raw-size)``), LMDB and HDF5: one shuffled
     epoch (batch 256) with verify=True and verify=False vs the LIMIT, a bare read of the
     same shard files: an LMDB cursor walk copying every value to bytes, or h5py
     ``images[a:b]`` in slices of the reader's chunk size. Target >= 0.9x.
  2. original bytes (default storage): reader vs the DECODE LIMIT, a pool of all cores
     decoding the same payloads, taken from the store beforehand, with Pillow
     (``Image.open(BytesIO(b)).convert("RGB")`` + ``np.asarray``). Target >= 0.9x.
  3. what users have today: the seeds' baseline (Pillow one file at a time in the main
     thread, batches of 256 as lists), and a torch DataLoader (num_workers=2, map-style
     dataset decoding + resizing to --resize) vs the reader (workers=2) doing the same
     resize in ``transform=``. Target >= 1.5x the DataLoader. Shown too, not judged: a store
     packed at that size (resize at pack time) vs the same DataLoader.
  4. overlap: an epoch with a simulated step (sleep --step-ms per batch; by default the
     loading time per batch) vs max(loading alone, steps alone). Target <= 1.05x.
  5. ``--memory``: peak RSS (VmHWM) of a fresh process reading a raw 32x32 store of 10k and
     of 100k images (the 10k folder hard-linked 10 times), same reader settings. Flat:
     100k peak <= 1.2x the 10k peak. Packing them takes minutes the first time (cached).

Files and stores are warm in the page cache: reads cost memory copies, not disk.

    python scripts/bench_reader.py               # a few minutes the first time (packing)
    python scripts/bench_reader.py --quick       # smoke test, < 60 s
    python scripts/bench_reader.py --memory --repeat 5 --json
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import random
import shlex
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import h5py
import lmdb
import numpy as np
from PIL import Image

from packer import PackOptions, open_reader, open_store, pack, read_manifest
from packer.manifest import MANIFEST_NAME
from packer.options import default_workers, parse_hw
from packer.store.lmdb_store import META_KEY

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_demo_data import CLASSES, make_demo_data  # noqa: E402

DEFAULT_IMAGES, QUICK_IMAGES = 3000, 300
MEMORY_IMAGES, QUICK_MEMORY_IMAGES = (10_000, 100_000), (1_000, 10_000)
BATCH, SEED, LOADER_WORKERS, RAW_EPOCHS = 256, 0, 2, 10
EXT = {"lmdb": "lmdb", "hdf5": "h5"}
READ_TARGET, LOADER_TARGET, OVERLAP_TARGET, FLAT_TARGET = 0.9, 1.5, 1.05, 1.2
BILINEAR = Image.Resampling.BILINEAR
NOTES = [
    "stores and image files are warm in the page cache (caches cannot be dropped here)",
    "ratio = limit or rival time / packer time (higher is better); overlap = epoch / max(...)",
    "every reader epoch counts opening the reader and starting its threads; the DataLoader's "
    "counts starting its worker processes (persistent_workers=False, the default)",
]
Run = Callable[[], dict[str, float]]
Options = dict[str, Any]


@dataclass(frozen=True)
class Folder:
    root: Path
    files: list[Path]
    labels: list[int]
    nbytes: int
    params: dict[str, Any]


def prepare_folder(folder: Path, images: int, size_range: tuple[int, int]) -> Folder:
    """The cached image folder; regenerated when missing or made with other parameters."""
    per_class = math.ceil(images / len(CLASSES))
    params = {"per_class": per_class, "seed": SEED, "size_range": list(size_range)}
    stamp = folder.with_suffix(".json")
    if not stamp.is_file() or json.loads(stamp.read_text()) != params or not folder.is_dir():
        shutil.rmtree(folder, ignore_errors=True)
        print(f"generating {per_class * len(CLASSES)} images in {folder} ...", file=sys.stderr)
        make_demo_data(folder, per_class, SEED, size_range)
        stamp.write_text(json.dumps(params))
    return scan_folder(folder, params)


def scan_folder(root: Path, params: dict[str, Any]) -> Folder:
    files = sorted(p for p in root.rglob("*") if p.is_file())
    labels = [CLASSES.index(p.parent.name) for p in files]
    return Folder(root, files, labels, sum(p.stat().st_size for p in files), params)


def replicate(data: Folder, target: Path, copies: int) -> Folder:
    """``copies`` hard links of every file, each under a name of its own (cached)."""
    params = {**data.params, "copies": copies}
    stamp = target.with_suffix(".json")
    if not stamp.is_file() or json.loads(stamp.read_text()) != params:
        shutil.rmtree(target, ignore_errors=True)
        for path in data.files:
            (target / path.parent.name).mkdir(parents=True, exist_ok=True)
            for k in range(copies):
                os.link(path, target / path.parent.name / f"{path.stem}_r{k}{path.suffix}")
        stamp.write_text(json.dumps(params))
    return scan_folder(target, params)


def cached_pack(data: Folder, out: Path, options: PackOptions) -> Path:
    """The store packed from ``data`` with ``options``, repacked only when either changed."""
    params = {"data": data.params, "files": len(data.files), "options": options.to_json()}
    stamp = out.with_name(out.name + ".json")
    if (
        stamp.is_file()
        and json.loads(stamp.read_text()) == params
        and (out / MANIFEST_NAME).is_file()
    ):
        return out
    print(f"packing {len(data.files)} images into {out} ...", file=sys.stderr)
    started = time.perf_counter()
    pack(data.root, out, replace(options, overwrite=True))
    print(f"  packed in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    stamp.write_text(json.dumps(params))
    return out


# -- what is timed ------------------------------------------------------------------------


def reader_epoch(
    store: Path, step_s: float = 0.0, epochs: int = 1, **options: Any
) -> dict[str, float]:
    """Shuffled epochs of batches of 256, a sleep of ``step_s`` after each batch."""
    started = time.perf_counter()
    images, first = 0, 0.0
    with open_reader(store, batch_size=BATCH, shuffle=True, **options) as reader:
        for epoch in range(epochs):
            for batch, _ in reader.epoch(epoch):
                first = first or time.perf_counter() - started
                images += len(batch)
                if step_s:
                    time.sleep(step_s)
        stats = reader.stats()  # of the last epoch
    return {"images": images, "first_batch_s": first, "wait_share": stats["wait_share"]}


def lmdb_walk(store: Path, epochs: int) -> dict[str, float]:
    """The raw LMDB limit: one cursor walk per shard, every value copied into bytes."""
    images = 0
    for shard in read_manifest(store).shards * epochs:
        env = lmdb.open(str(store / shard.file), subdir=False, readonly=True, lock=False)
        try:
            with env.begin() as txn:  # buffers=False: each value comes out as its own bytes
                for key, _value in txn.cursor():
                    images += key != META_KEY
        finally:
            env.close()
    return {"images": images}


def h5_slices(store: Path, chunk: int, epochs: int) -> dict[str, float]:
    """The raw HDF5 limit: ``images[a:b]`` in slices of the reader's chunk size, in order."""
    images = 0
    for shard in read_manifest(store).shards * epochs:
        with h5py.File(store / shard.file, "r", locking=False) as f:
            dataset = f["images"]
            for start in range(0, len(dataset), chunk):
                images += len(dataset[start : start + chunk])
    return {"images": images}


def decode_some(payloads: list[bytes]) -> None:
    for payload in payloads:
        np.asarray(Image.open(io.BytesIO(payload)).convert("RGB"))


def decode_limit(payloads: list[bytes], workers: int) -> dict[str, float]:
    """All cores decoding the payloads in memory; the clock runs around the decoding only."""
    size = max(1, len(payloads) // (workers * 16))
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(time.sleep, [0.01] * workers))  # every thread started before the clock
        started = time.perf_counter()
        for f in [
            pool.submit(decode_some, payloads[i : i + size]) for i in range(0, len(payloads), size)
        ]:
            f.result()
        seconds = time.perf_counter() - started
    return {"images": len(payloads), "seconds": seconds}


def pillow_batches(data: Folder) -> Iterator[tuple[list[np.ndarray], list[int]]]:
    """The seeds' baseline: open, convert, asarray one file at a time; lists of 256."""
    order = list(range(len(data.files)))
    random.Random(SEED).shuffle(order)
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
    """packer's transform: the same resize the DataLoader's dataset does."""
    return np.asarray(Image.fromarray(image).resize((size[1], size[0]), BILINEAR))


def torch_loader_epoch(data: Folder, size: tuple[int, int], workers: int) -> dict[str, float]:
    """A DataLoader over a minimal ImageFolder-style dataset: decode, RGB, resize, collate."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    # np.asarray of a Pillow image is read-only; torch warns once per worker, copies nothing
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

    class FolderDataset(Dataset[tuple[np.ndarray, int]]):
        def __len__(self) -> int:
            return len(data.files)

        def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
            with Image.open(data.files[i]) as im:
                image = im.convert("RGB").resize((size[1], size[0]), BILINEAR)
            return np.asarray(image), data.labels[i]

    loader = DataLoader(
        FolderDataset(),
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        generator=torch.Generator().manual_seed(SEED),
    )
    return {"images": sum(len(images) for images, _ in loader)}


def sleep_steps(batches: int, step_s: float) -> dict[str, float]:
    for _ in range(batches):
        time.sleep(step_s)
    return {"images": 0}


# -- planning and measuring ---------------------------------------------------------------


@dataclass(frozen=True)
class Compare:
    name: str  # the packer run
    against: list[str]  # the limit / rival runs; overlap: max of them
    target: float | None  # None: shown, not judged
    overlap: bool = False  # ratio = time / max(against) (lower is better)
    after_first: bool = False  # overlap only: the epoch less its first batch's latency


def plan(
    args: argparse.Namespace, data: Folder, stores: dict[str, Path], step_s: float
) -> tuple[dict[str, Run], list[Compare]]:
    """Every measurement by name, in the order one repeat runs them, and what is compared."""
    runs: dict[str, Run] = {}
    compares: list[Compare] = []
    for b in ("lmdb", "hdf5"):
        store = stores[f"raw {b}"]
        chunk = open_reader(store, batch_size=BATCH).chunk_size  # no thread starts here
        e = args.raw_epochs
        limit = f"limit raw {b}" + (f" (slices of {chunk})" if b == "hdf5" else "")
        runs[limit] = (
            partial(h5_slices, store, chunk, e) if b == "hdf5" else partial(lmdb_walk, store, e)
        )
        for verify in (True, False):
            name = f"reader raw {b} verify={verify}"
            runs[name] = partial(reader_epoch, store, epochs=e, verify=verify)
            compares.append(Compare(name, [limit], READ_TARGET))
    with open_store(stores["original lmdb"]) as opened:
        payloads = [bytes(r.data) for r in opened.records()]
    runs["limit decode (all cores)"] = partial(decode_limit, payloads, default_workers())
    for b in ("lmdb", "hdf5"):
        runs[f"reader original {b}"] = partial(reader_epoch, stores[f"original {b}"])
        compares.append(Compare(f"reader original {b}", ["limit decode (all cores)"], READ_TARGET))
    h, w = args.resize
    rival = f"DataLoader workers={LOADER_WORKERS} resize {h}x{w}"
    runs["seeds baseline (Pillow loop)"] = partial(pillow_loop, data)
    runs[rival] = partial(torch_loader_epoch, data, args.resize, LOADER_WORKERS)
    mine = f"reader workers={LOADER_WORKERS} transform resize"
    runs[mine] = partial(
        reader_epoch,
        stores["original lmdb"],
        workers=LOADER_WORKERS,
        transform=partial(resized, size=args.resize),
        output="torch",
    )
    sized = f"reader workers={LOADER_WORKERS} packed at {h}x{w}"
    runs[sized] = partial(
        reader_epoch, stores["sized lmdb"], workers=LOADER_WORKERS, output="torch"
    )
    compares += [
        Compare("reader original lmdb", ["seeds baseline (Pillow loop)"], None),
        Compare(mine, [rival], LOADER_TARGET),
        Compare(sized, [rival], None),
    ]
    batches = math.ceil(len(data.files) / BATCH)
    runs[f"steps alone ({batches} x {step_s * 1e3:.1f} ms)"] = partial(sleep_steps, batches, step_s)
    runs["reader original lmdb + steps"] = partial(reader_epoch, stores["original lmdb"], step_s)
    compares.append(
        Compare(
            "reader original lmdb + steps",
            ["reader original lmdb", f"steps alone ({batches} x {step_s * 1e3:.1f} ms)"],
            OVERLAP_TARGET,
            overlap=True,
        )
    )
    compares.append(replace(compares[-1], target=None, after_first=True))
    return runs, compares


def measure(runs: dict[str, Run], repeat: int) -> dict[str, list[dict[str, float]]]:
    results: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
    for r in range(repeat):
        for name, fn in runs.items():
            started = time.perf_counter()
            figures = fn()
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
        got = int(best["images"])
        if got % images:
            raise RuntimeError(f"{name} yielded {got} images, not a multiple of {images}")
        rows[name] = {
            **{k: round(v, 4) for k, v in best.items()},
            "images_per_s": round(got / best["seconds"], 1) if got else None,
            "all_seconds": [round(f["seconds"], 4) for f in tries],
        }
    targets = []
    for c in compares:
        mine, others = rows[c.name]["seconds"], [rows[a]["seconds"] for a in c.against]
        mine -= rows[c.name]["first_batch_s"] if c.after_first else 0.0
        ratio = mine / max(others) if c.overlap else others[0] / mine
        ok = None if c.target is None else ratio <= c.target if c.overlap else ratio >= c.target
        vs = f"max({', '.join(c.against)})" if c.overlap else c.against[0]
        targets.append(
            {
                "name": f"{c.name}{' less its 1st batch' if c.after_first else ''} vs {vs}",
                "ratio": round(ratio, 3),
                "target": c.target,
                "lower_is_better": c.overlap,
                "pass": ok,
            }
        )
    return {"timings": rows, "targets": targets}


# -- memory (--memory) --------------------------------------------------------------------

CHILD = r"""
import json, sys
from packer import open_reader
def status():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmHWM", "VmRSS", "RssAnon", "RssFile")}
before, anon, images = status(), 0, 0
with open_reader(sys.argv[1], **json.loads(sys.argv[2])) as reader:
    for batch, _ in reader:
        images += len(batch)
        anon = max(anon, status()["RssAnon"])
    chunk = reader.chunk_size
print(json.dumps({"before": before, "after": status(), "peak_anon": anon, "images": images,
                  "chunk_size": chunk}))
"""


def memory_child(store: Path, options: Options) -> dict[str, Any]:
    """Peak RSS of a fresh interpreter that reads one epoch of ``store``."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(store), json.dumps(options)],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def memory_part(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    small, big = QUICK_MEMORY_IMAGES if args.quick else MEMORY_IMAGES
    base = prepare_folder(workdir / f"small-{small}", small, (32, 96))
    folders = {
        small: base,
        big: replicate(base, workdir / f"small-{small}-x{big // small}", big // small),
    }
    side, rows, targets = 32, [], []
    record = side * side * 3
    for b in ("lmdb", "hdf5"):
        for chunk in (256, None):  # a fixed chunk, then the default (it grows with the store)
            options: Options = {"batch_size": BATCH, "shuffle": True, "workers": LOADER_WORKERS}
            options |= {"chunk_size": chunk} if chunk else {}
            peaks = []
            for n, folder in folders.items():
                out = workdir / "stores" / f"raw{side}-{n}.{EXT[b]}"
                store = cached_pack(
                    folder, out, PackOptions(backend=b, seed=SEED, raw=True, size=(side, side))
                )
                got = memory_child(store, options)
                formula = 8 * got["chunk_size"] * record + (4 + LOADER_WORKERS + 2) * BATCH * record
                rows.append(
                    {
                        "backend": b,
                        "images": got["images"],
                        "chunk_size": got["chunk_size"],
                        "vm_hwm": got["after"]["VmHWM"],
                        "before_rss": got["before"]["VmRSS"],
                        "peak_anon": got["peak_anon"],
                        "rss_file": got["after"]["RssFile"],
                        "formula": formula,
                    }
                )
                peaks.append(got["after"]["VmHWM"])
            ratio = peaks[1] / peaks[0]
            setting = f"chunk_size={chunk}" if chunk else "default chunk_size"
            targets.append(
                {
                    "name": f"memory {b} {setting}: VmHWM {big} vs {small} images",
                    "ratio": round(ratio, 3),
                    "target": FLAT_TARGET,
                    "lower_is_better": True,
                    "pass": ratio <= FLAT_TARGET,
                }
            )
    return {"rows": rows, "targets": targets}


# -- report -------------------------------------------------------------------------------


def render(report: dict[str, Any]) -> str:
    d = report["data"]
    lines = [
        f"command: {report['command']}",
        f"machine: {report['machine']}",
        f"data: {d['images']} images ({d['formats']}), {d['mb']:.1f} MB, sides "
        f"{d['size_range'][0]}-{d['size_range'][1]} px, {d['root']}",
        f"raw stores {d['raw_size']} px; each raw run (limits too) reads {report['raw_epochs']} "
        "epoch(s)",
        f"best of {report['repeat']} repeat(s); step {report['step_ms']:.1f} ms per batch "
        f"({report['step_source']})",
        *(f"note: {n}" for n in report["notes"]),
        "",
        f"{'measurement':<46}{'seconds':>9}{'images/s':>10}{'1st batch':>10}{'wait':>7}",
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
            "memory (MB; formula = 8 x chunk x record + (prefetch 4 + workers 2 + 2) "
            "x batch bytes, on top of 'before'; peak anon sampled once per batch)",
            f"{'backend':<8}{'images':>8}{'chunk':>7}{'VmHWM':>8}{'before':>8}"
            f"{'peak anon':>10}{'RssFile':>9}{'formula':>9}",
        ]
        for r in memory["rows"]:
            lines.append(
                f"{r['backend']:<8}{r['images']:>8}{r['chunk_size']:>7}{r['vm_hwm'] / 1e6:>8.1f}"
                f"{r['before_rss'] / 1e6:>8.1f}{r['peak_anon'] / 1e6:>10.1f}"
                f"{r['rss_file'] / 1e6:>9.1f}{r['formula'] / 1e6:>9.1f}"
            )
    lines.append("")
    for t in report["targets"] + (memory["targets"] if memory else []):
        verdict = "info" if t["pass"] is None else "PASS" if t["pass"] else "FAIL"
        goal = (
            ""
            if t["target"] is None
            else f" (target {'<=' if t['lower_is_better'] else '>='} {t['target']})"
        )
        lines.append(f"{verdict:<5} {t['name']}: {t['ratio']:.3f}{goal}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add = parser.add_argument
    add("--repeat", type=int, default=None, help="best of N (default 3; 1 with --quick)")
    add("--images", type=int, default=None, help=f"data set size (default {DEFAULT_IMAGES})")
    add("--size-range", type=int, nargs=2, default=(200, 500), metavar=("MIN", "MAX"))
    add("--raw-size", type=parse_hw, default=(64, 64), help="raw store HxW (default 64x64)")
    add("--raw-epochs", type=int, default=None, help="epochs per raw run (default 10; quick 1)")
    add("--resize", type=parse_hw, default=(224, 224), help="part 3 resize HxW (default 224)")
    add("--step-ms", type=float, default=None, help="simulated step (default: load time/batch)")
    add("--workdir", type=Path, default=Path("/tmp/packer-bench-read"), help="data cache")
    add("--quick", action="store_true", help=f"{QUICK_IMAGES} images, 1 repeat: a smoke test")
    add("--memory", action="store_true", help="also part 5, peak RSS at 10k vs 100k images")
    add("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    args.repeat = args.repeat or (1 if args.quick else 3)
    args.images = args.images or (QUICK_IMAGES if args.quick else DEFAULT_IMAGES)
    args.raw_epochs = args.raw_epochs or (1 if args.quick else RAW_EPOCHS)
    if min(args.repeat, args.images, args.raw_epochs) < 1:
        parser.error("--repeat, --images and --raw-epochs must be at least 1")
    return args


def timed_epoch(store: Path) -> float:
    started = time.perf_counter()
    reader_epoch(store)
    return time.perf_counter() - started


def pack_stores(args: argparse.Namespace, data: Folder, workdir: Path) -> dict[str, Path]:
    stores, (h, w) = {}, args.resize
    for b in ("lmdb", "hdf5"):
        raw = PackOptions(backend=b, seed=SEED, raw=True, size=args.raw_size)
        stores[f"raw {b}"] = cached_pack(data, workdir / f"raw.{EXT[b]}", raw)
        original = PackOptions(backend=b, seed=SEED)
        stores[f"original {b}"] = cached_pack(data, workdir / f"original.{EXT[b]}", original)
    sized = PackOptions(seed=SEED, size=(h, w), fit="stretch")
    stores["sized lmdb"] = cached_pack(data, workdir / f"sized-{h}x{w}.lmdb", sized)
    return stores


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "scripts/bench_reader.py", *given])
    name = "quick" if args.quick else f"images-{args.images}"
    data = prepare_folder(args.workdir / name, args.images, tuple(args.size_range))
    stores = pack_stores(args, data, args.workdir / "stores" / name)
    for store in stores.values():  # into the page cache
        reader_epoch(store, decode=False)
    batches = math.ceil(len(data.files) / BATCH)
    load_s = timed_epoch(stores["original lmdb"])
    step_s = args.step_ms / 1e3 if args.step_ms is not None else load_s / batches
    runs, compares = plan(args, data, stores, step_s)
    results = measure(runs, args.repeat)
    manifest = read_manifest(stores["original lmdb"])
    report: dict[str, Any] = {
        "command": command,
        "machine": f"{default_workers()} cores usable ({os.cpu_count()} total), {platform.system()} "
        f"{platform.machine()}, Python {platform.python_version()}, load average "
        f"{os.getloadavg()[0]:.2f} at the end (shared machine)",
        "repeat": args.repeat,
        "raw_epochs": args.raw_epochs,
        "notes": NOTES,
        "step_ms": step_s * 1e3,
        "step_source": "--step-ms" if args.step_ms is not None else "auto: warm-up epoch / batches",
        "data": {
            "root": str(data.root),
            "images": len(data.files),
            "formats": ", ".join(f"{k} {v}" for k, v in manifest.stats.get("formats", {}).items()),
            "mb": data.nbytes / 1e6,
            "size_range": list(args.size_range),
            "raw_size": "x".join(map(str, args.raw_size)),
        },
        **summarize(results, compares, len(data.files)),
    }
    if args.memory:
        report["memory"] = memory_part(args, args.workdir)
    print(json.dumps(report, indent=1) if args.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
