"""Stress the reader: thousands of open / iterate / stop / close cycles, then many epochs,
and say whether threads, open files or memory grew.

    python scripts/stress_reader.py                          # 20,000 cycles, 200 epochs
    python scripts/stress_reader.py --cycles 2000 --epochs 20 --json
    python scripts/stress_reader.py --store out.lmdb --store out.h5

Without --store it packs two small stores (LMDB and HDF5, 2 shards each, 24 generated images)
in a temporary folder. Each cycle opens a reader and stops it one of six ways, in turn: break
after the first batch, a full epoch, an exception in the loop, dropped without close (the
finalizers must clean up), an epoch abandoned for another, a resume from state_dict. Every
epoch of the second part is checked to hold each record exactly once.

Threads (all, and those named packer-*), open file descriptors (/proc/self/fd) and RSS
(/proc/self/statm) are measured after a warm-up, halfway and at the end; the exit status is 1
when any grew past its tolerance: threads and descriptors not at all, RSS by more than
--rss-tolerance-mb (default 16) over the run, or half that over its second half.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packer import PackOptions, open_reader, open_store, pack  # noqa: E402


class _Boom(Exception):
    """Raised inside a training loop on purpose."""


def snapshot() -> dict[str, Any]:
    """Threads, open descriptors and resident memory of this process, now."""
    gc.collect()
    deadline = time.monotonic() + 5  # a stopped reader's threads may take a moment to end
    while _packer_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    fds = _open_files()
    return {
        "threads": threading.active_count(),
        "packer_threads": _packer_threads(),
        "fds": len(fds),
        "open": fds,
        "rss_mb": round(pages * os.sysconf("SC_PAGE_SIZE") / 1e6, 1),
    }


def _open_files() -> list[str]:
    """What each open descriptor of this process is (a file's path, pipe:[n], socket:[n])."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the descriptor listdir itself used, closed since
            continue
    return sorted(found)


def _packer_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("packer-"))


def _options(i: int) -> dict[str, Any]:
    """Options varied by cycle, so that many paths through the reader are taken."""
    return {"batch_size": 3 + i % 3, "workers": 1 + i % 2, "prefetch": 1 + i % 3, "seed": i % 5}


def _break(store: Path, i: int) -> None:
    with open_reader(store, **_options(i)) as reader:
        for _ in reader:
            break


def _complete(store: Path, i: int) -> None:
    with open_reader(store, **_options(i)) as reader:
        for _ in reader.epoch(i % 3):
            pass


def _raise(store: Path, i: int) -> None:
    try:
        with open_reader(store, **_options(i)) as reader:
            for _ in reader:
                raise _Boom
    except _Boom:
        pass


def _drop(store: Path, i: int) -> None:
    reader = open_reader(store, **_options(i))
    batches = iter(reader)
    next(batches)
    del batches, reader  # no close: the finalizers must stop the threads


def _abandon(store: Path, i: int) -> None:
    with open_reader(store, **_options(i)) as reader:
        first = reader.epoch(0)
        next(first)
        for _ in reader.epoch(1):  # starting an epoch stops the one left behind
            break


def _resume(store: Path, i: int) -> None:
    with open_reader(store, **_options(i)) as reader:
        batches = iter(reader)
        next(batches)
        state = reader.state_dict()
    with open_reader(store, **_options(i)) as reader:
        reader.load_state_dict(state)
        next(iter(reader))


SCENARIOS: dict[str, Callable[[Path, int], None]] = {
    "break": _break,
    "complete": _complete,
    "raise": _raise,
    "drop": _drop,
    "abandon": _abandon,
    "resume": _resume,
}


def cycles(stores: list[Path], count: int, start: int = 0) -> None:
    """``count`` cycles, each on the next store and the next way of stopping."""
    names = list(SCENARIOS)
    for i in range(start, start + count):
        SCENARIOS[names[i % len(names)]](stores[i % len(stores)], i)


def epochs(stores: list[Path], count: int) -> int:
    """``count`` epochs of one reader per store, each checked to hold every record once."""
    checked = 0
    for store in stores:
        with open_store(store) as opened:
            everything = Counter(record.path for record in opened.records())
        with open_reader(store, batch_size=5, with_paths=True) as reader:
            for epoch in range(count):
                seen = Counter(path for _, _, paths in reader.epoch(epoch) for path in paths)
                if seen != everything:
                    raise AssertionError(f"{store}: epoch {epoch} is not exactly once")
                checked += 1
    return checked


def run(stores: list[Path], cycle_count: int, epoch_count: int, warmup: int = 60) -> dict[str, Any]:
    """The figures: snapshots after warm-up, halfway and at the end, and the time taken."""
    cycles(stores, warmup)
    before = snapshot()
    started = time.perf_counter()
    half = cycle_count // 2
    cycles(stores, half, warmup)
    halfway = snapshot()
    cycles(stores, cycle_count - half, warmup + half)
    checked = epochs(stores, epoch_count)
    after = snapshot()
    return {
        "stores": [str(s) for s in stores],
        "cycles": cycle_count,
        "scenarios": list(SCENARIOS),
        "epochs_checked": checked,
        "seconds": round(time.perf_counter() - started, 1),
        "before": before,
        "halfway": halfway,
        "after": after,
    }


def leaks(figures: dict[str, Any], rss_tolerance_mb: float = 16.0) -> list[str]:
    """What grew past its tolerance (empty: nothing leaked)."""
    before, halfway, after = figures["before"], figures["halfway"], figures["after"]
    found = []
    if after["threads"] > before["threads"] or after["packer_threads"]:
        found.append(
            f"threads {before['threads']} -> {after['threads']}: {after['packer_threads']}"
        )
    if after["fds"] > before["fds"]:
        opened = sorted((Counter(after["open"]) - Counter(before["open"])).elements())
        found.append(f"open descriptors {before['fds']} -> {after['fds']}: {', '.join(opened)}")
    if after["rss_mb"] - before["rss_mb"] > rss_tolerance_mb:
        found.append(f"RSS {before['rss_mb']} -> {after['rss_mb']} MB")
    if after["rss_mb"] - halfway["rss_mb"] > rss_tolerance_mb / 2:
        found.append(f"RSS still growing: {halfway['rss_mb']} -> {after['rss_mb']} MB")
    return found


@contextmanager
def small_stores() -> Iterator[list[Path]]:
    """Two small stores (LMDB and HDF5, 2 shards, 24 images of 8 to 31 px) in a temp folder."""
    with tempfile.TemporaryDirectory(prefix="stress-reader-") as tmp:
        root = Path(tmp) / "images"
        rng = np.random.default_rng(0)
        for i in range(24):
            size = (8 + i, 8 + (i * 7) % 24)
            pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
            out = io.BytesIO()
            Image.fromarray(pixels).save(out, "PNG" if i % 3 else "JPEG")
            (root / f"c{i % 3}").mkdir(parents=True, exist_ok=True)
            (root / f"c{i % 3}" / f"{i:02d}.{'png' if i % 3 else 'jpg'}").write_bytes(
                out.getvalue()
            )
        stores = [Path(tmp) / "small.lmdb", Path(tmp) / "small.h5"]
        for store in stores:
            backend = "lmdb" if store.suffix == ".lmdb" else "hdf5"
            pack(root, store, PackOptions(backend=backend, seed=0, workers=1, shards=2))
        yield stores


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", action="append", type=Path, help="a store (repeatable)")
    parser.add_argument("--cycles", type=int, default=20_000)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--rss-tolerance-mb", type=float, default=16.0)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if args.store:
        figures = run(args.store, args.cycles, args.epochs)
    else:
        with small_stores() as stores:
            figures = run(stores, args.cycles, args.epochs)
    figures["command"] = " ".join([Path(sys.executable).name, *sys.argv])
    figures["leaks"] = leaks(figures, args.rss_tolerance_mb)
    if args.json:
        print(json.dumps(figures, indent=1))
    else:
        print(
            f"{figures['cycles']:,} cycles ({', '.join(SCENARIOS)}) and "
            f"{figures['epochs_checked']:,} checked epochs in {figures['seconds']}s"
        )
        for when in ("before", "halfway", "after"):
            f = figures[when]
            print(
                f"  {when:8} threads {f['threads']:3}  fds {f['fds']:4}  RSS {f['rss_mb']:7.1f} MB"
            )
        print("  leaks: " + ("; ".join(figures["leaks"]) or "none"))
    return 1 if figures["leaks"] else 0


if __name__ == "__main__":
    sys.exit(main())
