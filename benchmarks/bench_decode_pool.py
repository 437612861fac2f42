"""Threads or processes for the reader's decode pool, and which decoder? Measured here.

    python benchmarks/bench_decode_pool.py    # writes docs/benchmarks/components/decode-pool.md
    python benchmarks/bench_decode_pool.py --images 40 --side 64 --repeat 1 --out /tmp/d.md

Decodes the same JPEG bytes (held in memory, as the reader holds a window) to RGB arrays with
(a) one thread, (b) a pool of N threads, (c) a pool of N processes that receive the bytes and
return the arrays by pickling, as a process pool must; each with Pillow (``convert("RGB")``,
``np.asarray``) and with libjpeg-turbo straight into NumPy (``simplejpeg.decode_jpeg``, what
packer's reader uses for JPEGs). Both release the GIL while they decode, so threads can use
every core without the pickling that processes pay for.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from functools import partial

import numpy as np
import reporting
import simplejpeg
from PIL import Image


def make_jpegs(count: int, side: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(count):
        base = rng.integers(0, 256, (side // 8, side // 8, 3), dtype=np.uint8)
        im = Image.fromarray(base).resize((side, side + i % 64), Image.Resampling.BILINEAR)
        buffer = io.BytesIO()
        im.save(buffer, "JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def pillow(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


def turbo(data: bytes) -> np.ndarray:
    return simplejpeg.decode_jpeg(data, "RGB")


def decode_batch(decode: Callable[[bytes], np.ndarray], batch: list[bytes]) -> list[np.ndarray]:
    return [decode(d) for d in batch]


def run(
    pool: Executor | None, decode: Callable[[bytes], np.ndarray], batches: list[list[bytes]]
) -> float:
    start = time.perf_counter()
    if pool is None:
        for batch in batches:
            decode_batch(decode, batch)
    else:
        for _ in pool.map(decode_batch, [decode] * len(batches), batches):
            pass
    return time.perf_counter() - start


def best(repeat: int, fn: Callable[[], float]) -> float:
    return min(fn() for _ in range(repeat))


def page(command: str, args: argparse.Namespace, cores: int, rates: dict[str, float]) -> str:
    """The results page: images/s by decoder and pool, and what the figures say."""
    pools = ["one thread", f"{cores} threads", f"{cores} processes"]
    text = reporting.header("Decoding JPEGs", command)
    text += (
        f"{args.images:,} JPEGs of about {args.side}x{args.side} (quality 90), held in memory as "
        f"the reader holds a window, decoded to RGB arrays in batches of {args.batch}; images a "
        f'second, best of {args.repeat}. Pillow is `Image.open(...).convert("RGB")`; '
        "libjpeg-turbo is `simplejpeg.decode_jpeg`, straight into NumPy, as packer's reader "
        "decodes JPEGs. A process pool receives the bytes and returns the arrays by pickling, as "
        f"a process pool must. {reporting.load()}\n\n"
    )
    rows = [
        [decoder, *(f"{rates[f'{decoder}, {pool}']:,.0f}" for pool in pools)]
        for decoder in ("Pillow", "libjpeg-turbo")
    ]
    text += reporting.table(["decoder", *pools], rows)
    threads, processes = (rates[f"libjpeg-turbo, {pool}"] for pool in pools[1:])
    turbo_vs_pillow = threads / rates[f"Pillow, {pools[1]}"]
    return text + (
        f"On {cores} threads libjpeg-turbo decodes {turbo_vs_pillow:.2f}× Pillow's images a "
        f"second; {cores} processes give {processes / threads:.2f}× {cores} threads.\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1500)
    parser.add_argument("--side", type=int, default=400)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print JSON; write no page")
    reporting.out_option(parser, "components/decode-pool.md")
    args = parser.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    jpegs = make_jpegs(args.images, args.side)
    batches = [jpegs[i : i + args.batch] for i in range(0, len(jpegs), args.batch)]
    with ThreadPoolExecutor(cores) as threads, ProcessPoolExecutor(cores) as processes:
        run(processes, pillow, batches[:cores])  # start the workers before timing
        times = {
            f"{name}, {pool_name}": best(args.repeat, partial(run, pool, decode, batches))
            for name, decode in (("Pillow", pillow), ("libjpeg-turbo", turbo))
            for pool_name, pool in (
                ("one thread", None),
                (f"{cores} threads", threads),
                (f"{cores} processes", processes),
            )
        }
    rates = {k: args.images / v for k, v in times.items()}
    if args.json:
        print(
            json.dumps(
                {"images": args.images, "side": args.side, "cores": cores, "images_per_s": rates}
            )
        )
        return 0
    text = page(reporting.command(__file__, argv), args, cores, rates)
    reporting.write(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
