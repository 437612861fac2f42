"""The same epoch read two ways under a simulated training step: what packer is for.

    python scripts/demo_compare.py demo/images demo/demo.lmdb demo/demo.h5 --step-ms 25

First the image folder, one file at a time in the training loop, as a plain Dataset reads it;
then each store, through ``open_reader``. Both decode with the same code (packer's decoder, to
the same ``--size``), in the same shuffled order of batches, each from a cold page cache where
the OS allows it. After each batch the loop sleeps ``--step-ms``: the GPU's work. The share of
the loop's time spent waiting for the next batch is what a training job loses to its data.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

from packer import open_reader
from packer.imaging.decode import decode_resized
from packer.inspect.look import drop_cached

SUFFIXES = {".jpg", ".jpeg", ".png"}


def read_folder(folder: Path, batch_size: int, size: int, step_s: float) -> dict[str, float]:
    """One epoch of the folder, each file opened and decoded when its batch is due."""
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in SUFFIXES)
    random.Random(0).shuffle(files)
    drop_cached(files)
    waited, started = 0.0, time.perf_counter()
    for at in range(0, len(files), batch_size):
        ready = time.perf_counter()
        batch = [
            decode_resized(p.read_bytes(), size=(size, size)) for p in files[at : at + batch_size]
        ]
        np.stack(batch)
        waited += time.perf_counter() - ready
        time.sleep(step_s)
    return _figures(len(files), waited, time.perf_counter() - started)


def read_store(store: Path, batch_size: int, size: int, step_s: float) -> dict[str, float]:
    """One epoch of the store, through the reader (sequential chunks, background prefetch)."""
    drop_cached([p for p in store.rglob("*") if p.is_file()] if store.is_dir() else [store])
    images, waited, started = 0, 0.0, time.perf_counter()
    with open_reader(store, batch_size=batch_size, seed=0, size=(size, size)) as reader:
        batches = iter(reader.epoch(0))
        while True:
            ready = time.perf_counter()
            batch = next(batches, None)
            waited += time.perf_counter() - ready
            if batch is None:
                break
            images += len(batch[0])
            time.sleep(step_s)
    return _figures(images, waited, time.perf_counter() - started)


def _figures(images: int, waited: float, seconds: float) -> dict[str, float]:
    return {
        "images": images,
        "seconds": seconds,
        "images_per_s": images / seconds,
        "wait_share": waited / seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("folder", type=Path, help="the image folder the stores were packed from")
    parser.add_argument("stores", type=Path, nargs="+", help="stores packed from it")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--size", type=int, default=96, help="decode to SIZE x SIZE")
    parser.add_argument("--step-ms", type=float, default=25.0, help="simulated training step")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    step_s = args.step_ms / 1000
    rows = {
        f"{args.folder}/ (one file at a time)": read_folder(
            args.folder, args.batch_size, args.size, step_s
        )
    }
    for store in args.stores:
        rows[f"{store} (packer)"] = read_store(store, args.batch_size, args.size, step_s)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    width = max(map(len, rows))
    print(
        f"\nOne epoch, batches of {args.batch_size} decoded to {args.size}x{args.size}, "
        f"a training step of {args.step_ms:g} ms after each batch:\n"
    )
    print(f"{'read from':<{width}}  {'epoch':>7}  {'images/s':>8}  waiting for data")
    for name, row in rows.items():
        print(
            f"{name:<{width}}  {row['seconds']:>6.2f}s  {row['images_per_s']:>8,.0f}  "
            f"{row['wait_share']:>5.0%} of the time"
        )
    print(
        "\nWaiting for data is time the GPU would sit idle. This folder is small and on a "
        "local disk;\non a network or spinning disk, with more images than memory, the gap "
        "grows (docs/benchmarks/storage.md)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
