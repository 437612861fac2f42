#!/usr/bin/env python3
"""Benchmark: a mixture of two stores larger than memory, on slow storage, against one store.

A user who mixes datasets has them on the same disk or share as the one store they read
before: a mixture must read each store in long sequential runs, as one store is read, or
the device's seeks eat the epoch. This measures that case, as bench_storage.py does for one
store (root, loop devices and cgroups, through the slow-storage tool; where it cannot run it
says why and exits 0).

Two stores of --photos photo-like JPEGs each (bench_storage's photos, seeded apart), each
packed with default options as LMDB and as HDF5 (--backends), on an ext4 file system on a
throttled loop device. For each backend, each case runs in a fresh process with the memory,
page cache included, capped at half of one store:

  limit   both stores' shard files read front to back in 1 MB reads: the device's rate
  alone   store A, decode=False, --epochs epochs
  mixed   open_reader([A, B], weights=[0.7, 0.3], epoch_size=len(A)), decode=False: the
          same number of records an epoch, drawn from both stores

Figures: each epoch's MB/s of payload (the stores' photos differ in size, so images/s would
compare different bytes), and mixed / alone epoch by epoch. Goal: >= 0.95.

    sudo python benchmarks/bench_mix_storage.py            # ~30 minutes, 12 GB of disk
    sudo python benchmarks/bench_mix_storage.py --quick    # a smaller set, hdd only
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import reporting
from bench_storage import TOOL, cannot_run, make_folder, slow_file_system

MOUNT = Path("/mnt/packer-mix")
PROFILES = ("hdd", "nas", "cloud")
WEIGHTS = [0.7, 0.3]
BACKENDS = {"lmdb": ".lmdb", "hdf5": ".h5"}
BATCH, SEED = 256, 0
GOAL = 0.95


def prepare(mount: Path, photos: int, backends: list[str]) -> dict[str, list[Path]]:
    """Stores A and B of each backend, packed from photos of their own (made once, kept by a
    stamp): each backend's A holds the same photos, and so does its B."""
    from packer import PackOptions, pack

    stores = {b: [mount / f"{name}{BACKENDS[b]}" for name in "ab"] for b in backends}
    stamp, wanted = mount / "prepared.json", {"photos": photos, "backends": sorted(backends)}
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        return stores
    print("preparing the data (once) ...", file=sys.stderr)
    for n, name in enumerate("ab"):
        folder = mount / f"photos-{name}"
        make_folder(folder, photos, first=n * photos)  # B's photos are not A's
        for backend in backends:
            store = stores[backend][n]
            pack(folder, store, PackOptions(backend=backend, seed=SEED, overwrite=True))
    subprocess.run(["sync"], check=True)
    stamp.write_text(json.dumps(wanted))
    return stores


def case_read(stores: list[Path], epochs: int) -> dict[str, Any]:
    """Raw epochs (decode=False) of one store, or of the mixture where given two."""
    from packer import open_reader

    options: dict[str, Any] = {"batch_size": BATCH, "seed": SEED, "decode": False}
    if len(stores) > 1:
        from packer.store.manifest import read_manifest

        size = read_manifest(stores[0]).num_records
        options.update(weights=WEIGHTS, epoch_size=size)
    out: list[dict[str, float]] = []
    with open_reader(stores if len(stores) > 1 else stores[0], **options) as reader:
        for epoch in range(epochs):
            started = time.perf_counter()
            for _ in reader.epoch(epoch):
                pass
            stats = reader.stats()
            out.append({"seconds": time.perf_counter() - started, "mb_per_s": stats["mb_per_s"]})
    return {"epochs": out}


def case_limit(stores: list[Path]) -> dict[str, Any]:
    """Every shard file of ``stores`` read front to back: what the device gives in order."""
    from packer.inspect.look import read_files
    from packer.store.manifest import read_manifest

    return read_files([store / s.file for store in stores for s in read_manifest(store).shards])


def run_case(
    tool: Path, profile: str, memory: str, case: str, stores: list[Path], epochs: int
) -> dict[str, Any]:
    """``case`` in a fresh process, the device throttled to ``profile``, memory capped."""
    command = [sys.executable, __file__, "--case", case, "--epochs", str(epochs)]
    command += [arg for store in stores for arg in ("--store", str(store))]
    command = [str(tool), "run", profile, memory, "--", *command]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(
            f"  {case} on {profile}: exit {done.returncode}: {done.stderr[-500:]}", file=sys.stderr
        )
        return {"failed": "out of memory" if done.returncode == 137 else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args: argparse.Namespace, stores: dict[str, list[Path]]) -> dict[str, Any]:
    tool = Path(args.tool)
    # One cap for every backend: half of the smallest store A, so that none fits.
    one_store = min(sum(f.stat().st_size for f in pair[0].iterdir()) for pair in stores.values())
    memory = args.memory or f"{one_store // 2 // (1 << 20)}M"
    report: dict[str, Any] = {"store_bytes": one_store, "memory": memory, "profiles": {}}
    for profile in args.profiles:
        print(f"{profile}, memory capped at {memory} ...", file=sys.stderr)
        report["profiles"][profile] = {
            backend: {
                "limit": run_case(tool, profile, memory, "limit", pair, 0),
                "alone": run_case(tool, profile, memory, "read", pair[:1], args.epochs),
                "mixed": run_case(tool, profile, memory, "read", pair, args.epochs),
            }
            for backend, pair in stores.items()
        }
    return report


def render(report: dict[str, Any], command: str) -> str:
    text = reporting.header("A mixture of stores on slow storage", command)
    text += (
        f"Two stores of {report['photos']:,} photo-like JPEGs each (about 90 KB; "
        f"{report['store_bytes'] / 1e9:.2f} GB a store), each packed with default options "
        "as LMDB and as HDF5, on an "
        "ext4 file system on a loop device throttled to each profile (see "
        "[Slow storage](storage.md)); each case in a fresh process whose memory, page cache "
        f"included, is capped at {report['memory']}B, so that no epoch is served from memory "
        "(by default half of one store; a store fits only in the smoke test, --quick). "
        "Reader: batch 256, decode=False. alone: store A; mixed: "
        f"`open_reader([A, B], weights={WEIGHTS}, epoch_size=len(A))`, the same number of "
        "records an epoch. Limit: both stores' files read front to back in 1 MB reads.\n\n"
    )
    rows, worst = [], []
    for profile, backends in report["profiles"].items():
        for backend, cases in backends.items():
            alone, mixed = _rates(cases["alone"]), _rates(cases["mixed"])
            ratios = [m / a for m, a in zip(mixed, alone)] if alone and mixed else []
            worst += [min(ratios)] if ratios else []
            limit = cases["limit"].get("mb_per_s")
            rows.append(
                [
                    profile,
                    backend.upper(),
                    f"{limit:,.0f}" if limit else "failed",
                    _cells(alone, "{:,.0f}") if alone else cases["alone"].get("failed", "failed"),
                    _cells(mixed, "{:,.0f}") if mixed else cases["mixed"].get("failed", "failed"),
                    _cells(ratios, "{:.2f}") if ratios else "-",
                ]
            )
    columns = [
        "profile",
        "store",
        "limit, MB/s",
        "alone, MB/s by epoch",
        "mixed 0.7/0.3, MB/s by epoch",
        "mixed / alone",
    ]
    text += reporting.table(columns, rows)
    met = bool(worst) and min(worst) >= GOAL
    text += f"Goal: mixed >= {GOAL}x alone in every epoch. {'Met' if met else 'Not met'}"
    text += f" (worst {min(worst):.2f}).\n" if worst else ".\n"
    return text


def _rates(case: dict[str, Any]) -> list[float] | None:
    epochs = case.get("epochs")
    return [e["mb_per_s"] for e in epochs] if epochs else None


def _cells(values: list[float], form: str) -> str:
    return ", ".join(form.format(v) for v in values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--tool", default=str(TOOL), help="the slow-storage tool")
    parser.add_argument("--mount", default=str(MOUNT), help="where to mount the file system")
    parser.add_argument("--size", default="12G", help="the file system's size")
    parser.add_argument("--photos", type=int, default=16_000, help="photos in each store")
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=PROFILES)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--memory", help="the memory cap (default: half of one store)")
    # A smoke test: stores too small to be larger than the reader's own buffers (a window,
    # the batches in flight), so the cap lets them fit.
    parser.add_argument("--quick", action="store_true", help="2,000 photos a store, hdd only")
    parser.add_argument("--keep", action="store_true", help="leave the file system mounted")
    parser.add_argument("--out", type=Path, default=reporting.DOCS / "mixing-storage.md")
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    # One case, in a throttled child process (used by the run itself).
    parser.add_argument("--case", choices=("limit", "read"), help=argparse.SUPPRESS)
    parser.add_argument("--store", action="append", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:
        result = (
            case_limit(args.store) if args.case == "limit" else case_read(args.store, args.epochs)
        )
        print(json.dumps(result))
        return 0
    if args.quick:
        args.photos, args.profiles, args.memory = 2_000, ["hdd"], "1G"
    reason = cannot_run(Path(args.tool))
    if reason:
        print(f"bench_mix_storage: skipped: {reason}")
        return 0
    with slow_file_system(args.tool, Path(args.mount), args.size, args.keep) as mount:
        stores = prepare(mount, args.photos, args.backends)
        report = measure(args, stores)
    report["photos"] = args.photos
    text = render(report, reporting.command(__file__, argv))
    reporting.write(args.out, text)
    print(json.dumps(report, indent=1) if args.json else text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
