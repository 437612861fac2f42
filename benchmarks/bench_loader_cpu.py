#!/usr/bin/env python3
"""What feeding a model costs the training process itself: packer's reader decoding in worker
processes against a DataLoader over the folder, side by side.

On a machine with many cores the decode workers have cores to spare; the training process
has one GIL, shared by its training loop and whatever the loader does there. This measures
that share: CPU seconds of the training process per image (every thread of it: the reader's
prefetch thread and pool threads, or the DataLoader's pin and result handling), and of the
workers, for ImageNet-like 400x350 JPEGs decoded and resized to 224x224 by ``workers``
processes either way.

  packer      ``open_reader(store, batch_size=256, size=(224, 224), decode_in="processes",
              workers=W, across_epochs=False)``: the reader's process reads the store and
              sends each worker its part's encoded bytes; decoded pixels come back through
              shared memory into the batch array.
  dataloader  ``DataLoader(folder, batch_size=256, num_workers=W, shuffle=True,
              persistent_workers=True)``, each worker opening files with Pillow, resizing
              to 224x224 (bilinear) and collating into shared memory.

Epochs in turns (which goes first alternates), after a warm-up epoch each; files and store
warm in the page cache.

    python benchmarks/bench_loader_cpu.py     # ~2 minutes on 2 cores; writes
                                              # docs/benchmarks/components/loader-cpu.md
    python benchmarks/bench_loader_cpu.py --images 300 --repeat 1 --out /tmp/r.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import reporting
from bench_small_images import make_corpus, packed
from PIL import Image

from packer import open_reader
from packer.arguments import default_workers

BATCH, SIDE = 256, 224
PROSE = """{images:,} ImageNet-like 400x350 JPEGs, decoded and resized to {side}x{side} in
batches of {batch} by {workers} worker processes: packer's `open_reader(store, size=({side},
{side}), decode_in="processes", workers={workers})` against a `DataLoader` over the folder
(`num_workers={workers}`, Pillow and a bilinear resize in each worker). Epochs in turns, a
warm-up epoch each first, files and store warm in the page cache. Per image: CPU time of the
training process (every thread of it) and of the workers, the median of the epochs. The
training process's time is what a training loop's Python shares a GIL and cores with. """


class ResizedFolder:
    """The DataLoader's dataset: each file opened with Pillow and resized as the reader does."""

    def __init__(self, folder: Path) -> None:
        self.files = sorted(str(p) for p in folder.rglob("*.jpg"))

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Any:
        import torch

        with Image.open(self.files[i]) as im:
            im = im.convert("RGB").resize((SIDE, SIDE), Image.Resampling.BILINEAR)
            return torch.from_numpy(np.array(im)), int(Path(self.files[i]).parent.name[5:])


def epoch(batches: Any) -> dict[str, float]:
    """One epoch's images/s, and CPU microseconds per image of this process and its workers."""
    wall, own, kids, images = time.perf_counter(), time.process_time(), reporting.children_cpu(), 0
    for pixels, _ in batches:
        images += len(pixels)
    wall = time.perf_counter() - wall
    return {
        "images_per_s": images / wall,
        "process_us": (time.process_time() - own) / images * 1e6,
        "workers_us": (reporting.children_cpu() - kids) / images * 1e6,
    }


def main(argv: list[str] | None = None) -> None:
    import torch
    from torch.utils.data import DataLoader

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/packer-bench-reader-cpu"))
    parser.add_argument("--images", type=int, default=1_500)
    parser.add_argument("--repeat", type=int, default=3, help="timed epochs of each")
    parser.add_argument("--workers", type=int, default=default_workers())
    parser.add_argument("--json", action="store_true", help="print JSON; write no page")
    reporting.out_option(parser, "components/loader-cpu.md")
    args = parser.parse_args(argv)

    folder = args.workdir / f"jpeg400-{args.images}"
    make_corpus(folder, 400, 350, "JPEG", args.images)
    store = packed(folder, args.workdir / f"jpeg400-{args.images}.lmdb")
    loader = DataLoader(
        ResizedFolder(folder),
        batch_size=BATCH,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=True,
        generator=torch.Generator().manual_seed(0),
    )
    reader = open_reader(
        store,
        batch_size=BATCH,
        size=(SIDE, SIDE),
        decode_in="processes",
        workers=args.workers,
        across_epochs=False,
    )
    runs: dict[str, list[dict[str, float]]] = {"packer": [], "dataloader": []}
    with reader:
        for r in range(-1, args.repeat):  # -1: warm-up, workers started, files cached
            for kind in list(runs) if r % 2 == 0 else list(runs)[::-1]:
                figures = epoch(reader.epoch(r + 1) if kind == "packer" else loader)
                if r >= 0:
                    runs[kind].append(figures)
    out: dict[str, Any] = {"workers": args.workers, "images": args.images, "batch": BATCH}
    for kind, epochs in runs.items():
        out[kind] = {
            "images_per_s": round(max(e["images_per_s"] for e in epochs)),
            "process_us": round(statistics.median(e["process_us"] for e in epochs)),
            "workers_us": round(statistics.median(e["workers_us"] for e in epochs)),
        }
    out["process_ratio"] = round(out["packer"]["process_us"] / out["dataloader"]["process_us"], 2)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    text = reporting.header("The training process's share", reporting.command(__file__, argv))
    text += PROSE.format(images=args.images, workers=args.workers, batch=BATCH, side=SIDE)
    text += f"{reporting.load()}\n\n"
    text += reporting.table(
        ["loader", "images/s (best)", "training process, µs/image", "workers, µs/image"],
        [
            [
                kind,
                f"{out[kind]['images_per_s']:,}",
                out[kind]["process_us"],
                out[kind]["workers_us"],
            ]
            for kind in runs
        ],
    )
    text += (
        f"packer's reader process spends {out['process_ratio']:.1f}× the DataLoader's main "
        "process's CPU time per image.\n"
    )
    reporting.write(args.out, text)
    print(text)


if __name__ == "__main__":
    main()
