#!/usr/bin/env python3
"""Benchmark: a store larger than memory on slow storage, read and packed as a user would.

Needs root, loop devices and cgroups, through the slow-storage tool (``--tool``, by default
``../shared/tools/slow-storage`` beside the project): it makes an ext4 file system on a loop
device, then runs each case in a fresh process with that device throttled to a storage
profile and the process's memory, page cache included, capped, so that no epoch is served
from memory. Where it cannot (not root, no tool, no loop device) it says why and exits 0.

On that file system: --photos photo-like JPEGs (about 90 KB each, 6.3 GB by default), an
LMDB and an HDF5 store packed from them, and a second, smaller folder for the packing case.
Then, for each profile (hdd, nas, cloud), memory capped at half the store:

  limit       the shard files read front to back in 1 MB reads (as `cat` reads them)
  raw         packer's reader, default options, decode=False, three epochs: every epoch's
              time against the limit's (goal: >= 0.9 each epoch, both backends)
  decoded     the same, decoding to 224x224 (size=, as for training; goal: >= 0.9 x
              min(limit, cold decode limit), each epoch); the cold decode limit: the same
              case on the ssd profile (500 MB/s, not the limit), epoch by epoch. Also the
              seconds each epoch waits for its first batch
  DataLoader  a torch DataLoader over the folder (workers = cores, Pillow decode and resize
              to 224x224, shuffled) and the plain one-by-one Pillow loop doing the same, each
              for --baseline-seconds (a rate)
  pack        (hdd only) packing the small folder against reading its files once in path
              order (goal: >= 0.9)
  cold fit    (hdd only) the decoded case with memory not capped, two epochs: a store that
              fits in memory, its first epoch read from the device, the second from the page
              cache; by default and with read_ahead=0

Every figure comes from one run, side by side; the table goes to docs/benchmarks/storage.md
(or --out) with the machine, the command and the date.

    sudo python benchmarks/bench_storage.py                 # ~100 minutes, 24 GB of disk
    sudo python benchmarks/bench_storage.py --quick         # a smaller set, one profile
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import reporting

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT.parent / "shared" / "tools" / "slow-storage"
MOUNT = Path("/mnt/packer-bench")
BATCH, SEED, EPOCHS = 256, 0, 3
SIZE = (224, 224)  # decoded images are resized to what a model trains on, as in training
PROFILES = ("hdd", "nas", "cloud")
RAW_GOAL = DECODED_GOAL = PACK_GOAL = 0.9
LOADER_GOAL = 15.0


# -- the data -----------------------------------------------------------------------------


def photo(index: int) -> bytes:
    """A photo-like JPEG: smooth colour fields and sensor-like noise, 300-480 x 400-640 px,
    quality 90 (about 90 KB; ImageNet's average 110 KB)."""
    import io

    from PIL import Image

    rng = np.random.default_rng([SEED, index])
    h, w = int(rng.integers(300, 480)), int(rng.integers(400, 640))
    coarse = rng.integers(0, 256, (6, 8, 3), np.uint8)
    base = Image.fromarray(coarse).resize((w, h), Image.Resampling.BICUBIC)
    pixels = np.asarray(base, np.int16) + rng.normal(0, 14, (h, w, 3)).astype(np.int16)
    out = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


def _write_photos(args: tuple[Path, range]) -> int:
    folder, indices = args
    total = 0
    for i in indices:
        target = folder / f"class{i % 10}" / f"{i:07d}.jpg"
        if target.is_file():  # made by an earlier, interrupted run
            continue
        data = photo(i)
        target.write_bytes(data)
        total += len(data)
    return total


def make_folder(folder: Path, count: int, first: int = 0) -> None:
    """``count`` photos, numbered from ``first`` (photo(i) differs for every i)."""
    for c in range(10):
        (folder / f"class{c}").mkdir(parents=True, exist_ok=True)
    step, end = 200, first + count
    parts = [(folder, range(a, min(a + step, end))) for a in range(first, end, step)]
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        total = sum(pool.map(_write_photos, parts))
    print(f"  {count:,} photos in {folder} ({total / 1e9:.2f} GB written now)", file=sys.stderr)


def prepare(mount: Path, photos: int, pack_photos: int) -> dict[str, Path]:
    from packer import PackOptions, pack

    paths = {
        "folder": mount / "photos",
        "small": mount / "to-pack",
        "lmdb": mount / "photos.lmdb",
        "hdf5": mount / "photos.h5",
    }
    stamp = mount / "prepared.json"
    wanted = {"photos": photos, "pack_photos": pack_photos}
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        return paths
    for p in (paths["lmdb"], paths["hdf5"]):
        shutil.rmtree(p, ignore_errors=True)
    print("preparing the data (once) ...", file=sys.stderr)
    make_folder(paths["folder"], photos)
    make_folder(paths["small"], pack_photos)
    for backend in ("lmdb", "hdf5"):
        pack(paths["folder"], paths[backend], PackOptions(backend=backend, seed=SEED))
    subprocess.run(["sync"], check=True)
    stamp.write_text(json.dumps(wanted))
    return paths


# -- the cases, each run in a fresh, throttled process ------------------------------------


def case_limit(store: Path) -> dict[str, Any]:
    from packer.inspect.look import read_files
    from packer.store.manifest import read_manifest

    files = [store / s.file for s in read_manifest(store).shards]
    return read_files(files)


def case_reader(
    store: Path, decode: bool, epochs: int, read_ahead: int | None = None
) -> dict[str, Any]:
    from packer import open_reader

    times, firsts = [], []
    size = SIZE if decode else None
    options = {"decode": decode, "size": size, "read_ahead": read_ahead}
    with open_reader(store, batch_size=BATCH, seed=SEED, **options) as reader:
        for epoch in range(epochs):
            started, images = time.perf_counter(), 0
            for _, labels in reader.epoch(epoch):
                if not images:
                    firsts.append(time.perf_counter() - started)
                images += len(labels)
            times.append(time.perf_counter() - started)
    return {"images": images, "epoch_seconds": times, "first_batch_seconds": firsts}


def _files(folder: Path) -> list[Path]:
    files = sorted(folder.rglob("*.jpg"))
    random.Random(SEED).shuffle(files)
    return files


def case_loop(folder: Path, seconds: float) -> dict[str, Any]:
    """The plain loop: each file opened, decoded and resized by Pillow, one by one, shuffled."""
    started, images = time.perf_counter(), 0
    for file in _files(folder):
        _decoded(file)
        images += 1
        if time.perf_counter() - started >= seconds:
            break
    return {"images": images, "seconds": time.perf_counter() - started}


def case_dataloader(folder: Path, seconds: float) -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader, Dataset

    files = _files(folder)

    class Photos(Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return len(files)

        def __getitem__(self, i: int) -> torch.Tensor:
            return torch.from_numpy(_decoded(files[i]))

    loader = DataLoader(
        Photos(), batch_size=1, num_workers=os.cpu_count() or 1, collate_fn=lambda b: b
    )
    started, images = time.perf_counter(), 0
    for batch in loader:
        images += len(batch)
        if time.perf_counter() - started >= seconds:
            break
    return {"images": images, "seconds": time.perf_counter() - started}


def _decoded(file: Path) -> np.ndarray:
    """A file decoded to RGB and resized to SIZE by Pillow, as a folder dataset does."""
    from PIL import Image

    with Image.open(file) as im:
        return np.array(im.convert("RGB").resize(SIZE[::-1], Image.Resampling.BILINEAR))


def case_path_order(folder: Path) -> dict[str, Any]:
    """Every file of the folder read once, whole, in path order: what packing must read."""
    started, nbytes = time.perf_counter(), 0
    for file in sorted(folder.rglob("*")):
        if file.is_file():
            nbytes += len(file.read_bytes())
    return {"bytes": nbytes, "seconds": time.perf_counter() - started}


def case_pack(folder: Path, out: Path) -> dict[str, Any]:
    from packer import PackOptions, pack

    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    pack(folder, out, PackOptions(seed=SEED))
    seconds = time.perf_counter() - started
    shutil.rmtree(out, ignore_errors=True)
    return {"seconds": seconds}


def case_decode_limit(store: Path) -> dict[str, Any]:
    """The reader's decoding alone: a second epoch, warm and unthrottled, the first having
    brought the store into memory (not capped)."""
    result = case_reader(store, True, 2)
    return {"images_per_s": result["images"] / result["epoch_seconds"][1]}


CASES = {
    "limit": lambda a: case_limit(Path(a.store)),
    "raw": lambda a: case_reader(Path(a.store), False, a.epochs),
    "decoded": lambda a: case_reader(Path(a.store), True, a.epochs),
    "decoded-no-read-ahead": lambda a: case_reader(Path(a.store), True, a.epochs, 0),
    "loop": lambda a: case_loop(Path(a.store), a.seconds),
    "dataloader": lambda a: case_dataloader(Path(a.store), a.seconds),
    "path-order": lambda a: case_path_order(Path(a.store)),
    "pack": lambda a: case_pack(Path(a.store), Path(a.out)),
    "decode-limit": lambda a: case_decode_limit(Path(a.store)),
}


def run_case(
    tool: Path, profile: str | None, memory: str, case: str, store: Path, **extra: Any
) -> dict[str, Any]:
    """``case`` in a fresh process, throttled to ``profile`` (None: not throttled)."""
    command = [sys.executable, __file__, "--case", case, "--store", str(store)]
    for key, value in extra.items():
        command += [f"--{key}", str(value)]
    if profile is not None:
        command = [str(tool), "run", profile, memory, "--", *command]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:  # shown in the table, with what was measured around it
        print(
            f"  {case} on {profile}: exit {done.returncode}: {done.stderr[-500:]}", file=sys.stderr
        )
        killed = done.returncode == 137 or "Killed" in done.stderr
        return {"failed": "out of memory" if killed else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- the run ----------------------------------------------------------------------------


@contextmanager
def slow_file_system(tool: str, mount: Path, size: str, keep: bool) -> Iterator[Path]:
    """The slow-storage file system at ``mount``: made there unless one is mounted already,
    and taken down afterwards unless ``keep`` (or it was there before)."""
    mounted = mount.is_mount()
    if not mounted:
        subprocess.run([tool, "up", str(mount), size], check=True)
    try:
        yield mount
    finally:
        if not keep and not mounted:
            subprocess.run([tool, "down", str(mount)], check=False)


def cannot_run(tool: Path) -> str | None:
    if not sys.platform.startswith("linux"):
        return "needs Linux (loop devices and cgroups)"
    if os.geteuid() != 0:
        return "needs root (it mounts a loop device and sets cgroup limits)"
    if not tool.is_file():
        return f"the slow-storage tool is not at {tool} (--tool PATH)"
    if not Path("/dev/loop-control").exists():
        return "no loop devices here (/dev/loop-control is missing)"
    return None


def measure(args: argparse.Namespace, paths: dict[str, Path]) -> dict[str, Any]:
    tool = Path(args.tool)
    store_bytes = sum(f.stat().st_size for f in paths["lmdb"].iterdir())
    memory = f"{store_bytes // 2 // (1 << 20)}M"
    report: dict[str, Any] = {"store_bytes": store_bytes, "memory": memory, "profiles": {}}
    decode_limit = run_case(tool, None, "0", "decode-limit", paths["lmdb"])["images_per_s"]
    report["decode_limit"] = decode_limit
    # What the cores decode, epoch by epoch, when the device is not the limit: the decoded
    # case on a device four times faster (ssd), with the same memory cap and a cold start.
    report["cold_decode"] = {
        backend: run_case(tool, "ssd", memory, "decoded", paths[backend], epochs=args.epochs)
        for backend in ("lmdb", "hdf5")
    }
    for profile in args.profiles:
        print(f"{profile}, memory capped at {memory} ...", file=sys.stderr)
        rows: dict[str, Any] = {}
        for backend in ("lmdb", "hdf5"):
            store = paths[backend]
            limit = run_case(tool, profile, memory, "limit", store)
            raw = run_case(tool, profile, memory, "raw", store, epochs=args.epochs)
            decoded = run_case(tool, profile, memory, "decoded", store, epochs=args.epochs)
            rows[backend] = {"limit": limit, "raw": raw, "decoded": decoded}
        for case in ("loop", "dataloader"):
            rows[case] = run_case(
                tool, profile, memory, case, paths["folder"], seconds=args.baseline_seconds
            )
        if profile == "hdd":
            rows["path-order"] = run_case(tool, profile, memory, "path-order", paths["small"])
            rows["pack"] = run_case(
                tool,
                profile,
                memory,
                "pack",
                paths["small"],
                out=paths["small"].with_suffix(".lmdb"),
            )
            for backend in ("lmdb", "hdf5"):
                rows[backend]["cold fit"] = {
                    case: run_case(tool, profile, "0", case, paths[backend], epochs=2)
                    for case in ("decoded", "decoded-no-read-ahead")
                }
        report["profiles"][profile] = rows
    return report


def _rate(case: dict[str, Any]) -> float | None:
    """Images a second over a case's epochs (or its whole run); None if it failed."""
    if "failed" in case:
        return None
    seconds = sum(case["epoch_seconds"]) if "epoch_seconds" in case else case["seconds"]
    epochs = len(case.get("epoch_seconds", [1]))
    return case["images"] * epochs / seconds


def _ceilings(report: dict[str, Any], backend: str, limit_seconds: float) -> list[float] | None:
    """Each epoch's limit: the lesser of the device's rate (``limit_seconds`` for the store)
    and the cores' cold decode rate in that epoch (None where that case failed)."""
    cold = _rates(report["cold_decode"][backend])
    if cold is None:
        return None
    return [min(report["photos"] / limit_seconds, rate) for rate in cold]


def _decoded_cells(
    report: dict[str, Any], backend: str, decoded: dict[str, Any], limit_seconds: float
) -> str:
    """A decoded case's epochs: images a second, each against its epoch's limit, and the
    seconds each waited for its first batch."""
    ceilings = _ceilings(report, backend, limit_seconds)
    if "failed" in decoded or ceilings is None:
        return " | ".join(["failed"] * 3)
    rates = [report["photos"] / t for t in decoded["epoch_seconds"]]
    return " | ".join(
        [
            _cells(rates, ",.0f"),
            _cells([r / c for r, c in zip(rates, ceilings, strict=False)], ".2f"),
            _cells(decoded["first_batch_seconds"], ".1f"),
        ]
    )


def _rates(case: dict[str, Any]) -> list[float] | None:
    """Images a second of each of a case's epochs; None if it failed."""
    if "failed" in case:
        return None
    return [case["images"] / t for t in case["epoch_seconds"]]


def _cells(values: list[float] | None, form: str) -> str:
    return "failed" if values is None else ", ".join(format(v, form) for v in values)


def render(report: dict[str, Any], command: str) -> str:
    lines = [
        reporting.header("Benchmark: data larger than memory, on slow storage", command).rstrip(),
        "",
        f"{report['photos']:,} photo-like JPEGs (about 90 KB each), packed with default "
        f"options into a {report['store_bytes'] / 1e9:.2f} GB store, on an ext4 file system on "
        "a loop device throttled to each profile (requests per second and MB/s, by cgroup: "
        "hdd 150 and 120, nas 800 and 110, cloud 3,000 and 125); each case in a fresh process "
        f"whose memory, page cache included, is capped at {report['memory']}B, half the "
        f"store, so every epoch reads from the device. Reader: batch {BATCH}, default "
        "options. Ratios are against the limits measured in the same run, per epoch; higher "
        "is better. Decoded epochs are held to the lesser of the device's rate and what the "
        "cores decode in that epoch when the device is not the limit: the same case on the "
        "ssd profile (500 MB/s), with the same memory cap. The first epoch of a process "
        "decodes more slowly than the next ones on this machine, a virtual machine whose "
        "memory the host backs afresh once freed; every case starts from a dropped page "
        "cache. The epochs after the first start on the chunks the last one read ahead. A case "
        "that ran out of the capped memory says so.",
        "",
        "| profile | store | limit: files read in order | raw epochs (decode=False), x limit "
        "| decoded epochs (224x224), images/s | decoded, x min(limit, cold decode limit) "
        "| decoded, seconds to the first batch |",
        "|---|---|---|---|---|---|---|",
    ]
    decode_limit = report["decode_limit"]
    for profile, rows in report["profiles"].items():
        for backend in ("lmdb", "hdf5"):
            limit, raw, decoded = (rows[backend][k] for k in ("limit", "raw", "decoded"))
            seconds = limit["seconds"]
            ratios = None if "failed" in raw else [seconds / t for t in raw["epoch_seconds"]]
            lines.append(
                f"| {profile} | {backend.upper()} | {limit['mb_per_s']:.0f} MB/s, "
                f"{report['photos'] / seconds:,.0f} images/s | {_cells(ratios, '.2f')} | "
                f"{_decoded_cells(report, backend, decoded, seconds)} |"
            )
    lines += [
        "",
        f"Cold decode limit (the decoded case on the ssd profile, {os.cpu_count()} cores), "
        "images/s by epoch: "
        + "; ".join(
            f"{b.upper()} {_cells(_rates(report['cold_decode'][b]), ',.0f')}"
            for b in ("lmdb", "hdf5")
        )
        + f". Warm and unthrottled, from the page cache: {decode_limit:,.0f} images/s.",
        *_first_epoch_lines(report),
        "",
        "| profile | one-by-one Pillow loop | DataLoader over the folder "
        f"({os.cpu_count()} workers) | packer decoded (LMDB, all epochs) | packer / DataLoader |",
        "|---|---|---|---|---|",
    ]
    for profile, rows in report["profiles"].items():
        loop, loader = (_rate(rows[k]) for k in ("loop", "dataloader"))
        ours = _rate(rows["lmdb"]["decoded"])
        shown = [f"{r:,.0f} images/s" if r else "failed" for r in (loop, loader, ours)]
        ratio = f"{ours / loader:.1f}x" if ours and loader else "-"
        lines.append(f"| {profile} | {' | '.join(shown)} | {ratio} |")
    hdd = report["profiles"].get("hdd", {})
    if "pack" in hdd and "failed" not in hdd["pack"] and "failed" not in hdd["path-order"]:
        read, packed = hdd["path-order"], hdd["pack"]
        lines += [
            "",
            f"Packing on hdd: a folder of {report['pack_photos']:,} photos "
            f"({read['bytes'] / 1e6:,.0f} MB) packed in {packed['seconds']:.1f} s; reading its "
            f"files once in path order takes {read['seconds']:.1f} s: "
            f"{read['seconds'] / packed['seconds']:.2f}x (goal >= {PACK_GOAL}).",
        ]
    lines += _cold_fit_lines(report)
    lines += [
        "",
        f"Goals: raw epochs >= {RAW_GOAL}x the limit, every epoch, both backends; decoded >= "
        f"{DECODED_GOAL}x min(limit, cold decode limit); >= {LOADER_GOAL:.0f}x the DataLoader on "
        "hdd.",
    ]
    return "\n".join(lines) + "\n"


def _first_epoch_lines(report: dict[str, Any]) -> list[str]:
    """Where the device was the lower limit of a first decoded epoch: the seconds it took
    beyond that limit, beside the time one shuffle window takes to read, a cost paid once a
    run whatever the store's size."""
    from packer.reading.options import ReaderOptions, default_chunk_size

    mean = report["store_bytes"] / report["photos"]
    chunk = default_chunk_size({"payload_bytes": {"mean": mean}}, report["photos"])
    chunks = ReaderOptions(BATCH).buffer_chunks
    window = chunks * chunk * mean
    late = []
    for profile, rows in report["profiles"].items():
        for backend in ("lmdb", "hdf5"):
            decoded, limit = rows[backend]["decoded"], rows[backend]["limit"]
            ceilings = _ceilings(report, backend, limit["seconds"])
            device = report["photos"] / limit["seconds"]
            if "failed" in decoded or ceilings is None or ceilings[0] < device:
                continue  # failed, or the cores were the lower limit
            beyond = decoded["epoch_seconds"][0] - limit["seconds"]
            read = window / (limit["mb_per_s"] * 1e6)
            late.append(f"{profile} {backend.upper()} {beyond:.1f} s (a window: {read:.1f} s)")
    if not late:
        return [
            "",
            "In every first decoded epoch of this run the cores, not the device, were the "
            "lower limit.",
        ]
    return [
        "",
        "Where the device was the lower limit, the first decoded epoch's seconds beyond it: "
        f"{'; '.join(late)}. A window is shuffled only once it is wholly read, so where the "
        "cores decode about as fast as the device reads, decoding falls one window "
        f"({chunks} chunks, {window / 1e6:,.0f} MB) behind the device once a run, in its "
        "first epoch; the epochs after it start on the window read ahead. That cost does not "
        "grow with the store.",
    ]


def _cold_fit_lines(report: dict[str, Any]) -> list[str]:
    """The table of a store that fits in memory, its first epoch read cold (hdd)."""
    hdd = report["profiles"].get("hdd", {})
    if not all("cold fit" in hdd.get(b, {}) for b in ("lmdb", "hdf5")):
        return []
    lines = [
        "",
        "A store that fits in memory, its first epoch read from the device (hdd, memory not "
        "capped, decoded to 224x224, two epochs in a fresh process; the page cache keeps the "
        "store after the first):",
        "",
        "| store | default: epoch seconds | first epoch, x min(limit, cold decode limit) "
        "| `read_ahead=0`: epoch seconds | first epoch, default / `read_ahead=0` (speed) |",
        "|---|---|---|---|---|",
    ]
    for backend in ("lmdb", "hdf5"):
        cases = hdd[backend]["cold fit"]
        ours, plain = cases["decoded"], cases["decoded-no-read-ahead"]
        if "failed" in ours or "failed" in plain:
            lines.append(f"| {backend.upper()} | failed | | | |")
            continue
        ceilings = _ceilings(report, backend, hdd[backend]["limit"]["seconds"])
        first, first_plain = ours["epoch_seconds"][0], plain["epoch_seconds"][0]
        ratio = f"{report['photos'] / first / ceilings[0]:.2f}" if ceilings else "failed"
        lines.append(
            f"| {backend.upper()} | {_cells(ours['epoch_seconds'], '.1f')} | {ratio} | "
            f"{_cells(plain['epoch_seconds'], '.1f')} | {first_plain / first:.2f}x |"
        )
    return lines


def loaders_chart(report: dict[str, Any], path: Path) -> bool:
    """Images a second by loader and storage profile, the second table as bars."""
    profiles = list(report["profiles"])
    rates = {
        "one-by-one Pillow loop": [_rate(report["profiles"][p]["loop"]) or 0 for p in profiles],
        "DataLoader over the folder": [
            _rate(report["profiles"][p]["dataloader"]) or 0 for p in profiles
        ],
        "packer (LMDB)": [_rate(report["profiles"][p]["lmdb"]["decoded"]) or 0 for p in profiles],
    }
    return reporting.bar_chart(path, "Decoded to 224x224, by storage", "images/s", profiles, rates)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tool", default=str(TOOL), help="the slow-storage tool")
    parser.add_argument("--mount", default=str(MOUNT), help="where to mount the file system")
    parser.add_argument("--size", default="24G", help="the file system's size")
    # About 6.3 GB: half of it leaves the reader room beside its own buffers (a window and
    # the batches in flight, about 0.6 GB) to read the next window ahead, as a training
    # machine's memory does; half of a smaller store would be mostly those buffers. The
    # first epoch's one-off wait (a window) weighs on a small store as it never does at a
    # user's scale.
    parser.add_argument("--photos", type=int, default=74_000)
    parser.add_argument("--pack-photos", type=int, default=1_500)
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=PROFILES)
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--baseline-seconds", type=float, default=30.0)
    parser.add_argument("--quick", action="store_true", help="3,000 photos, hdd only")
    parser.add_argument("--keep", action="store_true", help="leave the file system mounted")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "storage.md"))
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    # One case, in a throttled child process (used by the run itself).
    parser.add_argument("--case", choices=sorted(CASES), help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=30.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:
        print(json.dumps(CASES[args.case](args)))
        return 0
    if args.quick:
        args.photos, args.pack_photos, args.profiles = 3_000, 500, ["hdd"]
        args.baseline_seconds = 15.0
    reason = cannot_run(Path(args.tool))
    if reason:
        print(f"bench_storage: skipped: {reason}")
        return 0
    with slow_file_system(args.tool, Path(args.mount), args.size, args.keep) as mount:
        paths = prepare(mount, args.photos, args.pack_photos)
        report = measure(args, paths)
    report.update(photos=args.photos, pack_photos=args.pack_photos)
    text = render(report, reporting.command(__file__, argv))
    chart = Path(args.out).with_suffix(".svg")
    if loaders_chart(report, chart):
        text += f"\n![Images a second by loader and storage profile]({chart.name})\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(json.dumps(report, indent=1) if args.json else text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
