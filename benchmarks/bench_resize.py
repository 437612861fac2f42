#!/usr/bin/env python3
"""Per-image cost and quality of resizing, on one thread: Pillow's resize against packer's
(``packer.imaging.resizing``: OpenCV), and the reader's whole ``size=`` path (``imaging.decode_resized``).

The images are ``benchmarks/bench_reader.py``'s generated folder (made here if missing, cached in
the same place): ~70% JPEG / 30% PNG, 200-500 px. Every figure is the best of --repeat runs
over the same --images images of each format, in milliseconds per image:

  decode            libjpeg-turbo (JPEG) or Pillow (PNG) to an RGB array (imaging.decode_array)
  Pillow bilinear   Image.fromarray(pixels).resize((224, 224), BILINEAR), the DataLoader's resize
  Pillow bicubic    the same with BICUBIC, what packer's own resize used before OpenCV
  OpenCV bilinear   cv2.resize(pixels, (224, 224), INTER_LINEAR) alone, with no box average
  packer            resizing.resize(pixels, size=(224, 224), fit="stretch")
  decode + resize   imaging.decode_resized(payload, size=(224, 224)): the reader's size= path

Quality: each JPEG stretched to 224x224 by each resize, scored in PSNR (dB) against a Lanczos
resize of the same pixels (higher is closer).

    python benchmarks/bench_resize.py     # ~1 minute, plus generating the folder; writes
                                          # docs/benchmarks/components/resize.md
    python benchmarks/bench_resize.py --images 100 --repeat 2 --json
    python benchmarks/bench_resize.py --folder-images 40 --images 5 --repeat 1 --out /tmp/r.md
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from packer.imaging import decode as imaging
from packer.imaging import resizing

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reporting
from bench_reader import prepare_folder  # noqa: E402

TARGET = (224, 224)


def best_ms(run: Callable[[Any], object], items: list[Any], repeat: int) -> float:
    best = math.inf
    for _ in range(repeat):
        started = time.perf_counter()
        for item in items:
            run(item)
        best = min(best, time.perf_counter() - started)
    return best / len(items) * 1e3


def pillow(pixels: np.ndarray, method: Image.Resampling) -> np.ndarray:
    return np.asarray(Image.fromarray(pixels).resize(TARGET[::-1], method))


def opencv_bilinear(pixels: np.ndarray) -> np.ndarray:
    import cv2

    return cv2.resize(pixels, TARGET[::-1], interpolation=cv2.INTER_LINEAR)


def psnr(got: np.ndarray, want: np.ndarray) -> float:
    error = np.mean((got.astype(np.float64) - want.astype(np.float64)) ** 2)
    return 10 * math.log10(255**2 / error) if error else math.inf


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/packer-bench-read"))
    parser.add_argument("--images", type=int, default=300, help="images of each format")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--folder-images", type=int, default=3000, help="the generated folder's size"
    )
    parser.add_argument("--json", action="store_true", help="print JSON; write no page")
    reporting.out_option(parser, "components/resize.md")
    args = parser.parse_args(argv)

    count = args.folder_images
    folder = prepare_folder(args.workdir / f"images-{count}", count, (200, 500))
    by_format: dict[str, list[bytes]] = {".jpg": [], ".png": []}
    for path in folder.files:
        if path.suffix in by_format and len(by_format[path.suffix]) < args.images:
            by_format[path.suffix].append(path.read_bytes())
    resizing.load()  # the import, outside the clocks

    rows: dict[str, dict[str, float]] = {}
    for suffix, payloads in by_format.items():
        pixels = [imaging.decode_array(p, writable=False) for p in payloads]
        rows["JPEG" if suffix == ".jpg" else "PNG"] = {
            "decode": best_ms(
                lambda p: imaging.decode_array(p, writable=False), payloads, args.repeat
            ),
            "Pillow bilinear": best_ms(lambda a: pillow(a, Image.BILINEAR), pixels, args.repeat),
            "Pillow bicubic": best_ms(lambda a: pillow(a, Image.BICUBIC), pixels, args.repeat),
            "OpenCV bilinear": best_ms(opencv_bilinear, pixels, args.repeat),
            "packer": best_ms(
                lambda a: resizing.resize(a, size=TARGET, fit="stretch"), pixels, args.repeat
            ),
            "decode + resize": best_ms(
                lambda p: imaging.decode_resized(p, size=TARGET), payloads, args.repeat
            ),
        }

    jpegs = [imaging.decode_array(p, writable=False) for p in by_format[".jpg"]]
    lanczos = [pillow(a, Image.LANCZOS) for a in jpegs]
    quality = {
        name: float(np.mean([psnr(resize(a), want) for a, want in zip(jpegs, lanczos)]))
        for name, resize in {
            "packer": lambda a: resizing.resize(a, size=TARGET, fit="stretch"),
            "Pillow bilinear": lambda a: pillow(a, Image.BILINEAR),
            "Pillow bicubic": lambda a: pillow(a, Image.BICUBIC),
        }.items()
    }

    report = {
        "command": reporting.command(__file__, argv),
        "images_per_format": args.images,
        "ms_per_image": rows,
        "psnr_vs_lanczos_db": quality,
    }
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    text = reporting.header("Resizing decoded images", report["command"])
    text += (
        f"{len(by_format['.jpg'])} JPEGs and {len(by_format['.png'])} PNGs of 200-500 px (the "
        "generated folder of `bench_reader.py`), resized to 224x224 on one thread; milliseconds "
        f"an image, best of {args.repeat}. *decode*: libjpeg-turbo (JPEG) or Pillow (PNG) to an "
        "RGB array; *Pillow bilinear*, the DataLoader's resize; *Pillow bicubic*; *OpenCV "
        "bilinear* alone, with no box average; *packer's resize* "
        '(`resizing.resize(pixels, size=(224, 224), fit="stretch")`); *decode + resize*, '
        "the reader's `size=` path (a JPEG decoded at a reduced scale first). "
        f"{reporting.load()}\n\n"
    )
    columns = list(next(iter(rows.values())))
    text += reporting.table(
        ["", *[c.replace("packer", "packer's resize") for c in columns]],
        [[fmt, *(f"{row[c]:.3f}" for c in columns)] for fmt, row in rows.items()],
    )
    text += (
        "Quality: each JPEG stretched to 224x224, scored in PSNR against a Lanczos resize of the "
        "same pixels (higher is closer): "
        + ", ".join(f"{name} {db:.1f} dB" for name, db in quality.items())
        + ".\n"
    )
    reporting.write(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
