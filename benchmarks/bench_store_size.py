"""How much larger a store is than its source files, by record size: LMDB rounds each large
value up to whole 4 KB pages, so small images cost more; HDF5 packs them end to end.

Packs folders of noise JPEGs of one side each (from 32 to 512 px, ~2 KB to ~240 KB a file),
the same total bytes in each (a store's fixed costs weigh on a small one), with default options,
and writes docs/benchmarks/store-size.md and store-size.svg.

    python benchmarks/bench_store_size.py                          # ~1 minute
    python benchmarks/bench_store_size.py --mb 0.1 --out /tmp/size.md   # smoke test
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import reporting
from PIL import Image

from packer import PackOptions, pack

SIDES = (32, 64, 128, 256, 512)


def make_folder(folder: Path, side: int, total_bytes: float) -> tuple[int, int]:
    """Noise JPEGs of ``side`` px in one class folder until they hold ``total_bytes``; their
    count and bytes."""
    rng = np.random.default_rng(side)
    (folder / "noise").mkdir(parents=True)
    count = total = 0
    while total < total_bytes:
        path = folder / "noise" / f"{count:06d}.jpg"
        pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(path, quality=90)
        count, total = count + 1, total + path.stat().st_size
    return count, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mb", type=float, default=32.0, help="source MB per record size")
    parser.add_argument("--out", type=Path, default=reporting.DOCS / "store-size.md")
    args = parser.parse_args(argv)
    rows, ratios = [], {"LMDB": [], "HDF5": []}
    with tempfile.TemporaryDirectory() as tmp:
        for side in SIDES:
            folder = Path(tmp) / f"side-{side}"
            count, source = make_folder(folder, side, args.mb * 1e6)
            cells = [f"{side}x{side}", f"{count:,}", f"{source / count / 1e3:,.1f} KB"]
            for backend, ext in (("lmdb", "lmdb"), ("hdf5", "h5")):
                options = PackOptions(backend=backend, seed=0, workers=1)
                manifest = pack(folder, Path(tmp) / f"{side}.{ext}", options).manifest
                ratio = sum(s.bytes for s in manifest.shards) / source
                ratios[backend.upper()].append(ratio)
                cells.append(f"{ratio:.3f}")
            rows.append(cells)
    text = reporting.header("Store size by record size", reporting.command(__file__, argv))
    text += (
        f"Noise JPEGs (quality 90), {args.mb:g} MB of them for each size, packed with default "
        "options. The ratio is the shards' bytes over the source files' bytes (1.000: no "
        "overhead).\n\n"
    )
    text += reporting.table(["image", "files", "mean file", "LMDB / source", "HDF5 / source"], rows)
    chart = args.out.with_suffix(".svg")
    groups = [row[2] for row in rows]
    if reporting.bar_chart(chart, "Store size over source size", "ratio", groups, ratios):
        text += f"![Store size over source size, by mean file size]({chart.name})\n"
    reporting.write(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
