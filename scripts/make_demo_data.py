"""Generate a small, deterministic, labelled image folder for demos, tests and training examples.

Layout: ``OUTDIR/<class>/<class>_<nnnn>.<jpg|png>`` for six classes (circle, cross, hstripes,
square, triangle, vstripes). Each image is a noisy background of a random colour with one filled
shape in a contrasting random colour at a random position and scale, so the label can only be
learnt from the shape, never from colour. The mix deliberately exercises packer's decode paths:
~70% JPEG / ~30% PNG, non-square sizes, ~5% JPEGs stored rotated with an EXIF Orientation tag
(upright after ``ImageOps.exif_transpose``), ~5% grayscale (L) and ~5% RGBA PNGs.

The same arguments give byte-identical files (one seeded numpy Generator consumed in a fixed
order), given the same numpy and Pillow builds.

    python scripts/make_demo_data.py OUTDIR [--per-class N] [--seed S] [--size-range MIN MAX]
                                            [--csv PATH] [--force] [--quiet]
"""

from __future__ import annotations

import argparse
import csv
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

CLASSES = (
    "circle",
    "cross",
    "hstripes",
    "square",
    "triangle",
    "vstripes",
)  # sorted: index == shape_id
PNG_FRACTION = 0.30
SPECIAL_FRACTION = 0.05  # share of each special kind: EXIF-rotated, grayscale, RGBA
MIN_CONTRAST = 90  # luma gap shape/background, so grayscale copies stay learnable
NOISE_SIGMA = 6.0
MIN_SIDE = 16  # below this, stripes and crosses degenerate into blobs
# Pixel rotation to store so that exif_transpose (3: 180, 6: ROTATE_270, 8: ROTATE_90) undoes it.
STORE_ROTATION = {
    3: Image.Transpose.ROTATE_180,
    6: Image.Transpose.ROTATE_90,
    8: Image.Transpose.ROTATE_270,
}


@dataclass(frozen=True)
class Variant:
    ext: str  # "jpg" or "png"
    mode: str = "RGB"  # "RGB", "L" or "RGBA"
    rotated: bool = False  # JPEG stored rotated, with an EXIF Orientation tag


def plan_variants(total: int, rng: np.random.Generator) -> list[Variant]:
    """Exact counts rather than per-image coin flips, so even tiny sets contain every kind."""
    k = max(1, round(SPECIAL_FRACTION * total))
    plan = [Variant("jpg", rotated=True)] * k + [Variant("png", "RGBA")] * k
    plan += [Variant("jpg" if i % 2 == 0 else "png", "L") for i in range(k)]
    plan += [Variant("png")] * max(0, round(PNG_FRACTION * total) - k - k // 2)
    plan += [Variant("jpg")] * (total - len(plan))
    return [plan[i] for i in rng.permutation(total)]


def luma(rgb: np.ndarray) -> float:
    return float(rgb @ np.array([0.299, 0.587, 0.114]))  # same weights as Pillow's convert("L")


def contrasting_colours(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    background = rng.integers(0, 256, 3)
    while True:  # always terminates: MIN_CONTRAST < 128, so some colour is far enough
        foreground = rng.integers(0, 256, 3)
        if abs(luma(foreground) - luma(background)) >= MIN_CONTRAST:
            return background, foreground


def shape_mask(label: str, size: tuple[int, int], rng: np.random.Generator) -> Image.Image:
    """Binary mask of one filled shape, fully inside the image."""
    width, height = size
    side = rng.uniform(0.45, 0.85) * min(width, height)
    cx, cy = rng.uniform(side / 2, width - side / 2), rng.uniform(side / 2, height - side / 2)
    x0, y0, x1, y1 = cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2
    mask = Image.new("L", size, 0)
    draw = ImageDraw.Draw(mask)
    if label == "circle":
        draw.ellipse((x0, y0, x1, y1), fill=255)
    elif label == "square":
        draw.rectangle((x0, y0, x1, y1), fill=255)
    elif label == "triangle":  # equilateral, randomly rotated, inscribed in the box's circle
        angles = rng.uniform(0, 2 * np.pi) + np.arange(3) * 2 * np.pi / 3
        draw.polygon(
            [(cx + side / 2 * np.cos(a), cy + side / 2 * np.sin(a)) for a in angles], fill=255
        )
    elif label == "cross":
        half_arm = rng.uniform(0.25, 0.4) * side / 2
        draw.rectangle((cx - half_arm, y0, cx + half_arm, y1), fill=255)
        draw.rectangle((x0, cy - half_arm, x1, cy + half_arm), fill=255)
    else:  # hstripes / vstripes: n filled bands separated by n-1 gaps of the same width
        bands = int(rng.integers(3, 6))
        band = side / (2 * bands - 1)
        for i in range(bands):
            start = 2 * i * band
            if label == "hstripes":
                draw.rectangle((x0, y0 + start, x1, y0 + start + band), fill=255)
            else:
                draw.rectangle((x0 + start, y0, x0 + start + band, y1), fill=255)
    return mask


def render(
    label: str, size: tuple[int, int], variant: Variant, rng: np.random.Generator
) -> Image.Image:
    """The upright picture, in the variant's colour mode."""
    background, foreground = contrasting_colours(rng)
    noise = rng.normal(0.0, NOISE_SIGMA, (size[1], size[0], 3))
    image = Image.fromarray(np.clip(background + noise, 0, 255).round().astype(np.uint8))
    mask = shape_mask(label, size, rng)
    image.paste(tuple(int(c) for c in foreground), mask=mask)
    if variant.mode == "L":
        return image.convert("L")
    if variant.mode == "RGBA":  # translucent background, opaque shape: compositing keeps the label
        background_alpha = int(rng.integers(96, 224))
        image.putalpha(
            Image.fromarray(np.where(np.asarray(mask) > 0, 255, background_alpha).astype(np.uint8))
        )
    return image


def write_image(
    upright: Image.Image, path: Path, variant: Variant, rng: np.random.Generator
) -> None:
    if variant.ext == "png":
        upright.save(path, format="PNG")
        return
    quality = int(rng.integers(75, 96))
    if not variant.rotated:
        upright.save(path, format="JPEG", quality=quality)
        return
    orientation = int(rng.choice([3, 6, 8]))
    exif = Image.Exif()
    exif[0x0112] = orientation
    upright.transpose(STORE_ROTATION[orientation]).save(
        path, format="JPEG", quality=quality, exif=exif
    )


def write_csv(csv_path: Path, outdir: Path, files: list[Path]) -> None:
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(
            handle, lineterminator="\n"
        )  # "\n" keeps the bytes platform-independent
        writer.writerow(["path", "label", "shape_id"])
        for path in files:
            writer.writerow(
                [
                    path.relative_to(outdir).as_posix(),
                    path.parent.name,
                    CLASSES.index(path.parent.name),
                ]
            )


def validate(per_class: int, size_range: tuple[int, int]) -> None:
    low, high = size_range
    if per_class < 1:
        raise ValueError(f"--per-class must be >= 1, got {per_class}")
    if not MIN_SIDE <= low <= high:
        raise ValueError(f"--size-range needs {MIN_SIDE} <= MIN <= MAX, got {low} {high}")


def make_demo_data(
    outdir: Path,
    per_class: int = 60,
    seed: int = 0,
    size_range: tuple[int, int] = (40, 160),
    csv_path: Path | None = None,
) -> list[Path]:
    """Write the demo set into ``outdir`` (must be absent or empty); return the image paths, sorted."""
    validate(per_class, size_range)
    outdir = Path(outdir)
    if outdir.exists() and (not outdir.is_dir() or any(outdir.iterdir())):
        raise FileExistsError(f"{outdir} exists and is not empty (use --force to replace it)")
    rng = np.random.default_rng(seed)  # the only source of randomness, consumed in a fixed order
    variants = iter(plan_variants(len(CLASSES) * per_class, rng))
    low, high = size_range
    written: list[Path] = []
    for label in CLASSES:
        (outdir / label).mkdir(parents=True, exist_ok=True)
        for index in range(per_class):
            variant = next(variants)
            size = (int(rng.integers(low, high + 1)), int(rng.integers(low, high + 1)))
            path = outdir / label / f"{label}_{index:04d}.{variant.ext}"
            write_image(render(label, size, variant, rng), path, variant, rng)
            written.append(path)
    written.sort()
    if csv_path is not None:
        write_csv(Path(csv_path), outdir, written)
    return written


def remove_for_force(outdir: Path) -> None:
    resolved = outdir.resolve()
    cwd = Path.cwd().resolve()
    if resolved in (
        cwd,
        *cwd.parents,
        Path.home().resolve(),
    ):  # a typo must not wipe a home or a repo
        raise ValueError(f"refusing to delete {outdir} with --force")
    if resolved.is_dir():
        shutil.rmtree(resolved)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--per-class", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--size-range", type=int, nargs=2, default=(40, 160), metavar=("MIN", "MAX")
    )
    parser.add_argument("--csv", type=Path, default=None, help="also write path,label,shape_id")
    parser.add_argument(
        "--force", action="store_true", help="delete and recreate a non-empty OUTDIR"
    )
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    try:
        validate(args.per_class, tuple(args.size_range))  # before --force deletes anything
        if args.force:
            remove_for_force(args.outdir)
        files = make_demo_data(
            args.outdir, args.per_class, args.seed, tuple(args.size_range), args.csv
        )
    except (ValueError, FileExistsError) as error:
        print(f"make_demo_data: error: {error}", file=sys.stderr)
        return 2
    if not args.quiet:
        total_bytes = sum(path.stat().st_size for path in files)
        print(
            f"wrote {len(files)} files in {len(CLASSES)} classes, {total_bytes} bytes -> {args.outdir}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
