#!/usr/bin/env python3
"""Benchmark ``packer.packing.pipeline`` against what the machine can do at best, side by side.

Measured on a generated image folder (``scripts/make_demo_data.py``, ~70% JPEG / 30% PNG,
300-640 px sides by default, cached under ``--workdir``), default storage mode (original
bytes), for each backend:

  1. pack with ``check="header"`` vs the COPY LIMIT: read every source file once
     (``open().read()``) and write it into one output file opened once, then fsync.
  2. pack with ``check="full"`` vs the DECODE LIMIT: the copy pass in this process while a
     pre-started pool of all cores reads and decodes every file once with Pillow
     (``Image.open(io.BytesIO(b)).load()``, files passed by path); the wall time of both
     running concurrently. Shown too, the same with JPEGs decoded by libjpeg-turbo straight
     into NumPy (simplejpeg), as packer's check decodes them. The pool is started before
     the clock (packer's pool start-up counts against packer) and shut down after it, so
     that packs run, as from the CLI, in a process with no other threads (with threads
     about, packer starts its workers with forkserver rather than fork: ~0.2 s more per
     pack here).
  3. re-encode (``max_side=128``, JPEG out) at ``workers=1`` vs ``workers=0`` (all cores).
  4. store size: sum of ``manifest.shards[*].bytes`` / sum of source file sizes; the
     manifest's own size apart.

Shown too: the header checks alone, in one thread: every file parsed by Pillow
(``imaging.probe``), as ``check="header"`` did in its pool until 2026-11-24, and every file
checked as it does now, on bytes already read (``packer.imaging.headers``, Pillow for what it declines).

Targets: packer time / limit time <= 1.3 (1, 2); store size <= 1.02x the sources (4).
Each run's CPU-seconds (its threads and worker processes, from getrusage) are shown beside
its seconds: on N cores a run cannot take less than CPU-seconds / N, which bounds a pack
whose every core is busy (a warm header check on two cores).
Every figure is the best of ``--repeat`` runs; all measurements are interleaved within each
repeat, in a new (seeded) order each repeat, so ratios compare runs made side by side and no
run always follows the same one. 1 and 2 run twice: with the source files warm in the page
cache (reads cost memory copies), and cold: each source file's cached pages dropped before
the run (``posix_fadvise(POSIX_FADV_DONTNEED)``, no root needed), so that every file is read
from the disk, as when packing a folder larger than memory.

    python benchmarks/bench_pack.py                       # `make bench`; ~220 MB, a few minutes
    python benchmarks/bench_pack.py --quick               # smoke test, < 30 s
    python benchmarks/bench_pack.py --backends lmdb --repeat 5 --json
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import random
import resource
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import reporting
import simplejpeg
from PIL import Image

from packer import PackOptions, pack
from packer.arguments import default_workers
from packer.imaging import decode as imaging
from packer.imaging import headers
from packer.inspect.look import drop_cached
from packer.store.manifest import MANIFEST_NAME, Manifest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from make_demo_data import CLASSES, make_demo_data  # noqa: E402

DEFAULT_IMAGES = 1800  # ~124 KB each at 300-640 px: ~220 MB
QUICK_IMAGES = 60
SEED = 0
TIME_TARGET = 1.3
SIZE_TARGET = 1.02
EXT = {"lmdb": "lmdb", "hdf5": "h5"}
TURBO_LIMIT = "decode limit (turbo)"
PROBES = "header probes (1 process)"
VOUCHED = "header checks, as packed (1 thread)"
Kept = dict[str, tuple[Manifest, int]]  # run key -> (manifest, manifest file bytes)
COLD = " (cold)"
NOTES = [
    "warm: source files in the page cache, reads are memory copies; (cold): each source "
    "file's cached pages dropped before the run (POSIX_FADV_DONTNEED), reads go to the disk",
    "decode limit = copy pass and decode pool run concurrently (wall time of both); "
    "its pool is started before the clock, packer's is not; it is shut down after, so packs run "
    "in a process with no other threads, as from the CLI (packer then forks its workers)",
    "ratio = packer time / limit time, the best repeat of each (judged); median of the repeats "
    "= the median of each repeat's pack / the limit run in that repeat (shown, not judged); "
    "re-encode ratio = speedup over workers=1",
    "turbo = the decode limit with JPEGs decoded by libjpeg-turbo (simplejpeg), as packer's "
    "full check decodes them; the target is judged against the Pillow limit",
    "CPU s = CPU-seconds of the best run: this process's threads and its worker processes; "
    "on N cores no run takes less than CPU s / N seconds",
    "header probes = every file's header parsed by imaging.probe (Pillow) in one process; "
    "header checks, as packed = every file's header checked by packer.imaging.headers on its first "
    "16 KB, read before the clock (Pillow, from the file, for what it declines), as "
    "--check header does on the bytes it reads to store: shown, not judged",
]


@dataclass(frozen=True)
class Dataset:
    root: Path
    files: list[Path]
    nbytes: int


def prepare_data(folder: Path, images: int, size_range: tuple[int, int]) -> Dataset:
    """The cached image folder; regenerated when missing or made with other parameters."""
    per_class = math.ceil(images / len(CLASSES))
    params = {"per_class": per_class, "seed": SEED, "size_range": list(size_range)}
    stamp = folder.with_suffix(".json")
    if not stamp.is_file() or json.loads(stamp.read_text()) != params or not folder.is_dir():
        shutil.rmtree(folder, ignore_errors=True)
        print(f"generating {per_class * len(CLASSES)} images in {folder} ...", file=sys.stderr)
        make_demo_data(folder, per_class, SEED, size_range)
        stamp.write_text(json.dumps(params))
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return Dataset(folder, files, sum(p.stat().st_size for p in files))


def copy_files(files: list[Path], target: Path) -> None:
    """The copy limit: each file read once, appended to one file, one fsync at the end."""
    with open(target, "wb") as out:
        for path in files:
            with open(path, "rb") as f:
                out.write(f.read())
        out.flush()
        os.fsync(out.fileno())


def decode_files(paths: list[str], turbo: bool) -> int:
    """Pool task: read and fully decode each file, with Pillow, or JPEGs with libjpeg-turbo
    straight into NumPy (``turbo``, as packer's check does); returns the pixel count."""
    pixels = 0
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        if turbo and data[:3] == b"\xff\xd8\xff":  # Pillow's own test for a JPEG
            pixels += simplejpeg.decode_jpeg(data, "RGB").size // 3
            continue
        im = Image.open(io.BytesIO(data))
        im.load()
        pixels += im.width * im.height
    return pixels


def probe_files(files: list[Path]) -> None:
    """Every file's header parsed in this process, as packer's ``--check header`` does in its
    pool (``imaging.probe``, Pillow): that check's CPU, shown beside the copy limit's."""
    imaging.load_plugins()  # a pack's workers inherit them loaded (packer.packing.pipeline._start_pool)
    for path in files:
        imaging.probe(path)


def check_headers(files: list[Path], heads: list[bytes]) -> None:
    """Every file's header checked as ``--check header`` does, on bytes the pack has read
    anyway (here each file's first 16 KB, read before the clock): by ``packer.imaging.headers``, and
    by Pillow from the file where it declines (in the pack, in the worker pool)."""
    imaging.load_plugins()
    for path, head in zip(files, heads):
        if headers.vouch(head, imaging.DEFAULT_MAX_PIXELS) is None:
            imaging.probe(path)


def first_bytes(files: list[Path]) -> list[bytes]:
    """Each file's first bytes, as many as a pack's workers read to check a header."""
    out = []
    for path in files:
        with path.open("rb") as f:
            out.append(f.read(headers.HEAD_BYTES))
    return out


def copy_and_decode(files: list[Path], target: Path, workers: int, turbo: bool) -> float:
    """The decode limit: a pool decodes every file while this process copies them. Returns
    the seconds that took; the pool is started before the clock and shut down after it."""
    paths = [str(p) for p in files]
    size = max(1, len(paths) // (workers * 8))
    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(abs, range(workers)))  # start every worker before the clock runs
        started = time.perf_counter()
        pending = [
            pool.submit(decode_files, paths[i : i + size], turbo)
            for i in range(0, len(paths), size)
        ]
        copy_files(files, target)
        for future in pending:
            future.result()
        return time.perf_counter() - started


def pack_once(data: Dataset, out: Path, options: PackOptions, keep: Kept, key: str) -> None:
    """One pack; keeps its manifest and the manifest file's size for the store-size figures."""
    result = pack(data.root, out, options)
    keep[key] = (result.manifest, (out / MANIFEST_NAME).stat().st_size)


def cpu_seconds() -> float:
    """CPU time so far of this process (all its threads) and of its ended child processes
    (pool workers, counted once a pool is shut down)."""
    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    )


def timed(
    fn: Callable[[], float | None], scratch: Path, cold: list[Path] | None = None
) -> tuple[float, float]:
    """Seconds ``fn`` takes, or those it returns (a run that keeps set-up off its clock), and
    the CPU-seconds it used; ``cold``: files evicted from the page cache first, off the clock."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    if cold:
        os.sync()  # dirty pages cannot be dropped
        drop_cached(cold)
    cpu = cpu_seconds()
    started = time.perf_counter()
    own = fn()
    seconds = time.perf_counter() - started if own is None else own
    cpu = cpu_seconds() - cpu
    shutil.rmtree(scratch)
    return seconds, cpu


def plan(
    data: Dataset,
    backends: list[str],
    scratch: Path,
    workers: int,
    keep: Kept,
    cold: bool,
) -> dict[str, Callable[[], float | None]]:
    """Every measurement by name (each repeat runs them in an order of its own); with
    ``cold``, the limits and packs again as cold runs (named with COLD)."""
    copy_to = scratch / "copy.bin"
    runs: dict[str, Callable[[], float | None]] = {
        "copy limit": partial(copy_files, data.files, copy_to),
        "decode limit": partial(copy_and_decode, data.files, copy_to, workers, False),
        TURBO_LIMIT: partial(copy_and_decode, data.files, copy_to, workers, True),
        PROBES: partial(probe_files, data.files),
        VOUCHED: partial(check_headers, data.files, first_bytes(data.files)),
    }
    for b in backends:
        store = scratch / f"store.{EXT[b]}"
        for check in ("header", "full"):
            options = PackOptions(backend=b, seed=SEED, check=check)
            runs[f"pack {b} check={check}"] = partial(
                pack_once, data, store, options, keep, f"{b} {check}"
            )
    if cold:
        for name in [
            "copy limit",
            "decode limit",
            *(f"pack {b} check={c}" for b in backends for c in ("header", "full")),
        ]:
            runs[name + COLD] = runs[name]
    for w in (1, 0):
        options = PackOptions(backend=backends[0], seed=SEED, max_side=128, workers=w)
        runs[f"re-encode {backends[0]} workers={w}"] = partial(
            pack_once, data, scratch / f"store.{EXT[backends[0]]}", options, keep, f"re-encode {w}"
        )
    return runs


Times = dict[str, list[tuple[float, float]]]  # run name -> (seconds, CPU-seconds) of each repeat


def measure(
    runs: dict[str, Callable[[], float | None]], repeat: int, scratch: Path, files: list[Path]
) -> Times:
    times: Times = {name: [] for name in runs}
    for r in range(repeat):
        # A new order each repeat (seeded): a run can leave the machine busy for the next
        # (the kernel freeing or writing back a 220 MB store), so none always follows another.
        for name in random.Random(r).sample(list(runs), len(runs)):
            fn = runs[name]
            times[name].append(timed(fn, scratch, files if name.endswith(COLD) else None))
            seconds, cpu = times[name][-1]
            print(
                f"  repeat {r + 1}/{repeat}: {name}: {seconds:.3f} s, CPU {cpu:.3f} s",
                file=sys.stderr,
            )
    return times


def figures(
    data: Dataset, backends: list[str], times: Times, keep: Kept, workers: int
) -> dict[str, Any]:
    fastest = {name: min(ts) for name, ts in times.items()}  # the best repeat's (seconds, CPU)
    best = {name: seconds for name, (seconds, _) in fastest.items()}
    n, mb = len(data.files), data.nbytes / 1e6
    rows = {
        name: {
            "seconds": round(t, 4),
            "cpu_seconds": round(cpu, 4),
            "images_per_s": round(n / t, 1),
            "mb_per_s": round(mb / t, 1),
            "all_seconds": [round(x, 4) for x, _ in times[name]],
        }
        for name, (t, cpu) in fastest.items()
    }
    targets: list[dict[str, Any]] = []
    sizes: dict[str, dict[str, Any]] = {}
    cases = [("header", "copy limit", ""), ("full", "decode limit", "")]
    if "copy limit" + COLD in best:
        cases += [("header", "copy limit" + COLD, COLD), ("full", "decode limit" + COLD, COLD)]
    for b in backends:
        for check, limit, cold in cases:
            name = f"pack {b} check={check}{cold}"
            ratio = best[name] / best[limit]
            # Shown, not judged: each repeat's pack against the limit run in the same repeat,
            # the median of those; how far one repeat strays from the best on a shared machine.
            typical = statistics.median(p / q for (p, _), (q, _) in zip(times[name], times[limit]))
            rows[name]["ratio"] = round(ratio, 3)
            rows[name]["median_ratio"] = round(typical, 3)
            if check == "full" and not cold:
                rows[name]["vs_turbo_limit"] = round(best[name] / best[TURBO_LIMIT], 3)
            targets.append(
                {
                    "name": f"{name} vs {limit}",
                    "ratio": round(ratio, 3),
                    "median_ratio": round(typical, 3),
                    "target": TIME_TARGET,
                    "pass": ratio <= TIME_TARGET,
                }
            )
        manifest, manifest_bytes = keep[f"{b} header"]
        shard_bytes = sum(s.bytes for s in manifest.shards)
        ratio = shard_bytes / data.nbytes
        sizes[b] = {
            "shard_bytes": shard_bytes,
            "source_bytes": data.nbytes,
            "ratio": round(ratio, 4),
            "manifest_bytes": manifest_bytes,
            "shards": len(manifest.shards),
        }
        targets.append(
            {
                "name": f"store size {b} vs sources",
                "ratio": round(ratio, 4),
                "target": SIZE_TARGET,
                "pass": ratio <= SIZE_TARGET,
            }
        )
    one, all_ = (f"re-encode {backends[0]} workers={w}" for w in (1, 0))
    rows[all_]["ratio"] = round(best[one] / best[all_], 3)
    return {
        "timings": rows,
        "targets": targets,
        "store_size": sizes,
        "reencode": {
            "backend": backends[0],
            "max_side": 128,
            "workers_all": workers,
            "images_per_s_1": rows[one]["images_per_s"],
            "images_per_s_all": rows[all_]["images_per_s"],
            "speedup": rows[all_]["ratio"],
        },
    }


def render(report: dict[str, Any]) -> str:
    d = report["data"]
    lines = [
        f"command: {report['command']}",
        f"machine: {report['machine']}",
        f"data: {d['images']} images, {d['mb']:.1f} MB (avg {d['avg_kb']:.0f} KB), sides "
        f"{d['size_range'][0]}-{d['size_range'][1]} px, {d['root']}",
        f"best of {report['repeat']} repeat(s)",
        *(f"note: {n}" for n in NOTES),
        "",
        f"{'measurement':<32}{'seconds':>9}{'CPU s':>8}{'images/s':>10}{'MB/s':>8}{'ratio':>8}",
    ]
    for name, row in report["timings"].items():
        ratio = f"{row['ratio']:.2f}" if "ratio" in row else ""
        turbo = f"  ({row['vs_turbo_limit']:.2f} vs turbo)" if "vs_turbo_limit" in row else ""
        lines.append(
            f"{name:<32}{row['seconds']:>9.3f}{row['cpu_seconds']:>8.3f}{row['images_per_s']:>10.1f}"
            f"{row['mb_per_s']:>8.1f}{ratio:>8}{turbo}"
        )
    lines += [
        "",
        f"{'store size':<12}{'shards MB':>10}{'source MB':>10}{'ratio':>8}{'manifest KB':>13}",
    ]
    for b, s in report["store_size"].items():
        lines.append(
            f"{b:<12}{s['shard_bytes'] / 1e6:>10.2f}{s['source_bytes'] / 1e6:>10.2f}"
            f"{s['ratio']:>8.4f}{s['manifest_bytes'] / 1e3:>13.1f}"
        )
    r = report["reencode"]
    lines += [
        "",
        f"re-encode max_side=128 ({r['backend']}): "
        f"workers=1 {r['images_per_s_1']:.1f} img/s, workers=0 ({r['workers_all']} cores) "
        f"{r['images_per_s_all']:.1f} img/s, speedup {r['speedup']:.2f}x",
        "",
    ]
    for t in report["targets"]:
        verdict = "PASS" if t["pass"] else "FAIL"
        spread = f"; median of the repeats {t['median_ratio']:.3f}" if "median_ratio" in t else ""
        lines.append(f"{verdict}  {t['name']}: {t['ratio']:.3f} (target <= {t['target']}{spread})")
    return "\n".join(lines)


def page(report: dict[str, Any]) -> str:
    """The results page (docs/benchmarks/packing.md): the same figures as Markdown tables."""
    d = report["data"]
    text = reporting.header(
        "Packing: packer against copying and decoding the folder", report["command"]
    )
    text += (
        f"{d['images']:,} generated images ({d['mb']:.1f} MB, {d['avg_kb']:.0f} KB on average, "
        f"sides {d['size_range'][0]}-{d['size_range'][1]} px), best of {report['repeat']}.\n\n"
        + "".join(f"- {note}\n" for note in NOTES)
        + "\n"
    )
    rows = [
        [
            name,
            f"{row['seconds']:.3f}",
            f"{row['cpu_seconds']:.3f}",
            f"{row['images_per_s']:,.0f}",
            f"{row['ratio']:.2f}" if "ratio" in row else "",
        ]
        for name, row in report["timings"].items()
    ]
    text += reporting.table(["measurement", "seconds", "CPU s", "images/s", "ratio"], rows)
    sizes = [
        [b, f"{s['shard_bytes'] / 1e6:.2f}", f"{s['source_bytes'] / 1e6:.2f}", f"{s['ratio']:.3f}"]
        for b, s in report["store_size"].items()
    ]
    text += reporting.table(["store", "shards MB", "source MB", "store / source"], sizes)
    return text + reporting.goals(report["targets"])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add = parser.add_argument
    add("--backends", default="lmdb,hdf5", help="comma-separated: lmdb, hdf5")
    add("--repeat", type=int, default=None, help="best of N (default 3; 1 with --quick)")
    add("--images", type=int, default=None, help=f"data set size (default {DEFAULT_IMAGES})")
    add("--size-range", type=int, nargs=2, default=(300, 640), metavar=("MIN", "MAX"))
    add("--workdir", type=Path, default=Path("/tmp/packer-bench"), help="data cache, scratch")
    add("--quick", action="store_true", help=f"{QUICK_IMAGES} images, 1 repeat: a smoke test")
    add("--json", action="store_true", help="print one JSON object instead of the table")
    add("--warm-only", action="store_true", help="skip the cold runs (files evicted first)")
    add("--out", type=Path, default=None, help="results page (default: docs' unless --quick)")
    args = parser.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not args.backends or set(args.backends) - {"lmdb", "hdf5"}:
        parser.error("--backends takes lmdb, hdf5 or both")
    args.repeat = args.repeat or (1 if args.quick else 3)
    args.images = args.images or (QUICK_IMAGES if args.quick else DEFAULT_IMAGES)
    if args.repeat < 1 or args.images < 1:
        parser.error("--repeat and --images must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    command = reporting.command(__file__, given)
    workers = default_workers()
    folder = args.workdir / ("quick" if args.quick else "images")
    data = prepare_data(folder, args.images, (args.size_range[0], args.size_range[1]))
    scratch = args.workdir / "scratch"
    keep: Kept = {}
    cold = not args.warm_only and hasattr(os, "posix_fadvise")
    runs = plan(data, args.backends, scratch, workers, keep, cold)
    times = measure(runs, args.repeat, scratch, data.files)
    report = {
        "command": command,
        "repeat": args.repeat,
        "notes": NOTES,
        "machine": f"{workers} cores usable ({os.cpu_count()} total), {platform.system()} "
        f"{platform.machine()}, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.2f} at the end (shared machine)",
        "data": {
            "root": str(data.root),
            "images": len(data.files),
            "mb": data.nbytes / 1e6,
            "avg_kb": data.nbytes / len(data.files) / 1e3,
            "size_range": list(args.size_range),
        },
        **figures(data, args.backends, times, keep, workers),
    }
    print(json.dumps(report, indent=1) if args.json else render(report))
    out = args.out or (None if args.quick else reporting.DOCS / "packing.md")
    if out is not None:
        reporting.write(out, page(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
