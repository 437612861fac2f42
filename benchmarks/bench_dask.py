"""Pack time on a local Dask cluster of 1, 2 and 4 worker processes against the
single-machine pack, side by side in one run, on one generated image folder.

    python benchmarks/bench_dask.py       # writes docs/benchmarks/components/dask.md
    python benchmarks/bench_dask.py --images 40 --shards 2 --workers 1 --out /tmp/dask.md

Each cluster is started before its clock starts (its start-up time is reported apart), so
the figures compare the packing itself. Every Dask store is checked to be byte-identical to
the local one.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import reporting
from distributed import LocalCluster
from PIL import Image

from packer import PackOptions, pack


def make_images(root: Path, count: int) -> None:
    rng = np.random.default_rng(0)
    for i in range(count):
        # Smooth content, like photos: a noise field blown up, so JPEG sizes are realistic.
        small = rng.integers(0, 256, (12, 16, 3), np.uint8)
        image = Image.fromarray(small).resize((320, 240), Image.BILINEAR)
        out = io.BytesIO()
        image.save(out, "JPEG", quality=90)
        path = root / f"class_{i % 10}" / f"{i:06}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(out.getvalue())


def shard_hashes(store: Path) -> list[str]:
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(store.glob("shard-*"))]


def timed_pack(source: Path, out: Path, options: PackOptions) -> float:
    started = time.perf_counter()
    pack(source, out, options)
    return time.perf_counter() - started


def page(command: str, args: argparse.Namespace, rows: list[dict[str, Any]]) -> str:
    """The results page: each packer's time against the local pack's."""
    text = reporting.header("Packing on a Dask cluster", command)
    check = "full check" if args.check == "full" else "header check"
    text += (
        f"{args.images:,} generated 320x240 JPEGs packed into {args.shards} LMDB shards "
        f"({check}), by the local pack and by local Dask clusters of worker processes (one "
        "thread each). Each cluster is started before its clock starts, its start-up shown "
        f"apart; every Dask store is byte-identical to the local one. {reporting.load()}\n\n"
    )
    text += reporting.table(
        ["packer", "seconds", "images/s", "vs local (time)", "cluster start-up"],
        [
            [r["packer"], f"{r['seconds']:.2f}", f"{r['images_per_s']:,.0f}",
             f"{r['vs_local']:.2f}", f"{r['startup_s']:.2f} s" if r["startup_s"] else ""]
            for r in rows
        ],
    )  # fmt: skip
    fastest = min(rows[1:], key=lambda r: r["seconds"])
    return text + (
        f"The fastest Dask run ({fastest['packer']}) takes {fastest['vs_local']:.2f}× the local "
        f"pack's time on this machine of {os.cpu_count()} cores.\n"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--encode", choices=["jpeg", "png", "webp"], help="re-encode (CPU-bound)")
    parser.add_argument("--max-side", type=int)
    parser.add_argument("--check", choices=["header", "full"], default="full")
    parser.add_argument("--json", action="store_true", help="print JSON; write no page")
    reporting.out_option(parser, "components/dask.md")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench-dask-"))
    try:
        source = work / "images"
        make_images(source, args.images)
        base = PackOptions(
            seed=0, shards=args.shards, check=args.check, encode=args.encode, max_side=args.max_side
        )
        rows = []
        local = work / "local.lmdb"
        seconds = timed_pack(source, local, base)  # the pool uses every core
        rows.append(
            {"packer": "local pack (pool on every core)", "seconds": seconds, "startup_s": 0.0}
        )
        for n in args.workers:
            started = time.perf_counter()
            with LocalCluster(
                n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0"
            ) as cluster:
                startup = time.perf_counter() - started
                out = work / f"dask{n}.lmdb"
                options = PackOptions(**{**vars(base), "dask": cluster.scheduler_address})
                seconds = timed_pack(source, out, options)
            if shard_hashes(out) != shard_hashes(local):
                raise SystemExit(f"the store packed by {n} Dask workers differs from the local one")
            rows.append(
                {
                    "packer": f"Dask, {n} worker{'s' if n > 1 else ''}",
                    "seconds": seconds,
                    "startup_s": startup,
                }
            )
            shutil.rmtree(out)
        for row in rows:
            row["vs_local"] = round(row["seconds"] / rows[0]["seconds"], 2)
            row["images_per_s"] = round(args.images / row["seconds"], 1)
            row["seconds"] = round(row["seconds"], 2)
            row["startup_s"] = round(row["startup_s"], 2)
        if args.json:
            print(
                json.dumps({"images": args.images, "shards": args.shards, "rows": rows}, indent=1)
            )
            return
        text = page(reporting.command(__file__, argv), args, rows)
        reporting.write(args.out, text)
        print(text)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
