#!/usr/bin/env python3
"""Benchmark training augmentation: packer's ``augment=`` against the loaders people use.

Two generated corpora (synthetic, photo-like: smooth colour fields, soft blobs and fine
grain, JPEG quality 90; made once and cached under ``--workdir``):

  small  ImageNet-like: --small photos of 300-500 x 250-450 px (default 3,000)
  large  --large photos of 2-12 megapixels (default 1,024: four batches, so that every
         DataLoader worker has whole batches to make; with fewer photos than batches times
         workers, some workers sit idle and the DataLoader runs on fewer cores)

Each is packed into an LMDB store of the original bytes. Per corpus, one epoch each of
(batch 256, output 224 x 224 uint8, all cores, runs interleaved, each in a fresh process
after 3 batches of warm-up; rates: the best of --repeat; ratios: the median of each repeat's):

  packer augment   open_reader(augment=[RandomResizedCrop(224), RandomHorizontalFlip()])
  packer size      open_reader(size=(224, 224)): decode + resize alone, the limit
  packer tv        open_reader(transform=torchvision v2 RandomResizedCrop + flip)
  dataloader tv    torch DataLoader (workers = cores) over the folder: Pillow decode,
                   torchvision v2 RandomResizedCrop(224) + RandomHorizontalFlip
  ffcv             FFCV's RandomResizedCropRGBImageDecoder + RandomHorizontalFlip over its
                   own .beton of the same photos (re-encoded at quality 90), where FFCV
                   imports; else skipped with the reason

torch runs with one intra-op thread in this process (DataLoader workers do the same), so the
torchvision transform in ``packer tv`` runs on the reader's threads alone: on a shared machine,
torch's own extra threads would otherwise buy that run a larger share of the cores.

torchvision and FFCV are not packer dependencies: run this in an environment that has them
(docs/benchmarks/augment.md says which).

    python benchmarks/bench_augment.py                 # both corpora, a few minutes
    python benchmarks/bench_augment.py --quick         # smoke test
    python benchmarks/bench_augment.py --json
    python benchmarks/bench_augment.py --cpu           # CPU per image, one thread, no loaders
    python benchmarks/bench_augment.py --from-json run.json   # the page from a saved --json

A whole run (not --quick, --only or --cpu) ends by writing its results page,
docs/benchmarks/augment.md (or --out); a partial run writes one only where --out is given.
The page is rendered from the run's JSON report alone, so ``--from-json`` renders it again
from a saved report (docs/benchmarks/augment.json holds the page's) without rerunning.

``--cpu`` (and a whole run, after its epochs) times each way's work per image in one thread with ``time.process_time`` (first
300 small photos, first 20 large): a cost that other jobs on a shared machine do not move, as
they move the epoch rates (each loader's share of the cores depends on how many threads and
processes it runs). packer augment / size: the reader's decode step alone
(``decode_placed`` / ``decode_resized``); packer tv: libjpeg-turbo decode + torchvision;
dataloader tv: Pillow decode + torchvision, as the DataLoader's workers do.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import reporting  # noqa: E402

import packer  # noqa: E402
from packer.augment import RandomHorizontalFlip, RandomResizedCrop  # noqa: E402

SIZE = 224
CORES = os.cpu_count() or 1


# -- corpora -------------------------------------------------------------------------------


def _photo(args: tuple[Path, int, int, int]) -> None:
    """One synthetic photo: smooth fields and blobs drawn at 1/4 size and enlarged, plus
    per-pixel grain, so the JPEG carries detail at every scale, as a photo does."""
    path, height, width, seed = args
    rng = np.random.default_rng(seed)
    h, w = max(8, height // 4), max(8, width // 4)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    planes = []
    for _ in range(3):
        a, b, c = rng.uniform(-1, 1, 3)
        value = 120 + 50 * np.sin(a * x / (w / 9) + b * y / (h / 7) + c * 6)
        for _ in range(6):
            cy, cx = rng.uniform(0, h), rng.uniform(0, w)
            r = rng.uniform(0.03, 0.2) * max(h, w)
            value += rng.uniform(-70, 70) * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * r * r))
        planes.append(value)
    small = np.clip(np.stack(planes, -1), 0, 255).astype(np.uint8)
    import cv2

    big = cv2.resize(small, (width, height), interpolation=cv2.INTER_CUBIC)
    grain = rng.integers(-10, 11, (height, width, 1), dtype=np.int16)
    pixels = np.clip(big.astype(np.int16) + grain, 0, 255).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, quality=90)


def make_corpus(folder: Path, count: int, large: bool) -> Path:
    """``count`` photos in 10 class folders under ``folder``, made once."""
    done = folder / ".complete"
    if done.exists() and int(done.read_text()) == count:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    rng = np.random.default_rng(27 + large)
    jobs = []
    for i in range(count):
        if large:
            pixels = rng.uniform(2e6, 12e6)
            aspect = rng.choice([4 / 3, 3 / 2, 16 / 9, 3 / 4, 2 / 3])
            width = int(np.sqrt(pixels * aspect))
            height = int(pixels / width)
        else:
            width, height = int(rng.integers(300, 501)), int(rng.integers(250, 451))
        jobs.append((folder / f"class{i % 10}" / f"{i:05d}.jpg", height, width, i))
    with Pool(CORES) as pool:
        pool.map(_photo, jobs, chunksize=4)
    done.write_text(str(count))
    return folder


def packed(folder: Path, store: Path) -> Path:
    if not store.exists():
        packer.pack(folder, store, packer.PackOptions(seed=0))
    return store


# -- the runs ------------------------------------------------------------------------------


def packer_run(store: Path, **options: Any) -> Callable[[int], Iterator[Any]]:
    def epoch(e: int) -> Iterator[Any]:
        with packer.open_reader(store, batch_size=256, seed=0, workers=CORES, **options) as r:
            for images, _ in r.epoch(e):
                yield images

    return epoch


class HwcTorchvision:
    """torchvision's training transforms on packer's upright HWC uint8 array, back to HWC
    uint8: what a user passes as ``transform=``."""

    def __init__(self) -> None:
        from torchvision.transforms import v2

        self.steps = v2.Compose(
            [v2.RandomResizedCrop(SIZE, antialias=True), v2.RandomHorizontalFlip()]
        )

    def __call__(self, pixels: np.ndarray) -> np.ndarray:
        import torch

        chw = torch.from_numpy(pixels).permute(2, 0, 1)
        return self.steps(chw).permute(1, 2, 0).numpy()


class FolderDataset:
    """Map-style dataset over the image files: Pillow decode, torchvision v2 crop + flip."""

    def __init__(self, folder: Path) -> None:
        from torchvision.transforms import v2

        self.files = sorted(folder.rglob("*.jpg"))
        self.steps = v2.Compose(
            [
                v2.RandomResizedCrop(SIZE, antialias=True),
                v2.RandomHorizontalFlip(),
                v2.PILToTensor(),
            ]
        )

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        with Image.open(self.files[i]) as im:
            return self.steps(im.convert("RGB")), int(self.files[i].parent.name[5:])


def dataloader_run(folder: Path) -> Callable[[int], Iterator[Any]]:
    import torch

    dataset = FolderDataset(folder)

    def epoch(e: int) -> Iterator[Any]:
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=256, shuffle=True, num_workers=CORES, persistent_workers=False
        )
        for images, _ in loader:
            yield images

    return epoch


def ffcv_run(folder: Path, beton: Path) -> tuple[Callable[[int], Iterator[Any]] | None, str]:
    """FFCV's fused crop-and-decode loader, or None and why not."""
    try:
        from ffcv.fields import IntField, RGBImageField
        from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
        from ffcv.loader import Loader, OrderOption
        from ffcv.transforms import RandomHorizontalFlip as FfcvFlip
        from ffcv.transforms import ToTensor
        from ffcv.writer import DatasetWriter
    except Exception as e:  # not installed, or built against another numpy / torch
        return None, f"FFCV does not import here: {type(e).__name__}: {e}"

    class Photos:
        def __init__(self) -> None:
            self.files = sorted(folder.rglob("*.jpg"))

        def __len__(self) -> int:
            return len(self.files)

        def __getitem__(self, i: int) -> tuple[Image.Image, int]:
            with Image.open(self.files[i]) as im:
                return im.convert("RGB"), int(self.files[i].parent.name[5:])

    try:
        if not beton.exists():
            partial = beton.with_suffix(".partial")
            fields = {
                "image": RGBImageField(write_mode="jpg", jpeg_quality=90),
                "label": IntField(),
            }
            DatasetWriter(str(partial), fields, num_workers=CORES).from_indexed_dataset(Photos())
            partial.rename(beton)
    except Exception as e:
        return None, f"FFCV could not write its dataset: {type(e).__name__}: {e}"

    loaders: list[Any] = []  # one Loader for every epoch, as FFCV is used: it compiles once

    def epoch(e: int) -> Iterator[Any]:
        if not loaders:
            loaders.append(
                Loader(
                    str(beton),
                    batch_size=256,
                    num_workers=CORES,
                    order=OrderOption.RANDOM,
                    os_cache=True,
                    pipelines={
                        "image": [
                            RandomResizedCropRGBImageDecoder((SIZE, SIZE)),
                            FfcvFlip(),
                            ToTensor(),
                        ],
                        "label": [IntDecoder(), ToTensor()],
                    },
                )
            )
        for images, _ in loaders[0]:
            yield images

    return epoch, ""


def timed(epoch: Callable[[int], Iterator[Any]], e: int) -> tuple[float, int]:
    """(images per second, images) of one epoch, checking every batch is 224 x 224 uint8."""
    start, n = time.perf_counter(), 0
    for images in epoch(e):
        shape = tuple(images.shape)
        assert str(images.dtype).endswith("uint8") and SIZE in shape and shape.count(SIZE) == 2
        n += shape[0]
    return n / (time.perf_counter() - start), n


def cpu_per_image(folder: Path, count: int, repeat: int) -> dict[str, float]:
    """Milliseconds of CPU per image for each way's per-image work, in this one thread."""
    import io
    from functools import partial

    from packer.augment import Augment, record_rng
    from packer.imaging.decode import decode_array, decode_placed, decode_resized

    payloads = [p.read_bytes() for p in sorted(folder.rglob("*.jpg"))[:count]]
    steps = Augment([RandomResizedCrop(SIZE), RandomHorizontalFlip()])
    ways: dict[str, Callable[[int, bytes], Any]] = {
        "packer augment": lambda i, d: decode_placed(
            d, partial(steps.place, rng=record_rng(0, 0, i))
        ),
        "packer size": lambda i, d: decode_resized(d, size=(SIZE, SIZE)),
    }
    try:  # libjpeg-turbo's smallest scale: every byte still entropy-decoded, little else done
        from simplejpeg import decode_jpeg

        ways["entropy floor"] = lambda i, d: decode_jpeg(d, "RGB", min_width=1, min_height=1)
    except ImportError:  # no wheel for this platform: packer decodes with Pillow, no floor row
        pass
    try:
        torchvision = HwcTorchvision()
        with_pillow = FolderDataset(folder).steps
    except ImportError as e:  # as the epoch runs that need it, left out with the reason
        print(f"  torchvision ways not timed: {e}", file=sys.stderr)
        return time_ways(ways, payloads, repeat)

    def pillow_tv(data: bytes) -> Any:
        with Image.open(io.BytesIO(data)) as im:
            return with_pillow(im.convert("RGB"))

    ways["packer tv"] = lambda i, d: torchvision(decode_array(d))
    ways["dataloader tv"] = lambda i, d: pillow_tv(d)
    return time_ways(ways, payloads, repeat)


def time_ways(
    ways: dict[str, Callable[[int, bytes], Any]], payloads: list[bytes], repeat: int
) -> dict[str, float]:
    """The least CPU milliseconds per image of each way over ``payloads``, of ``repeat``."""
    best: dict[str, float] = {}
    for _ in range(repeat):
        for label, way in ways.items():
            start = time.process_time()
            for i, data in enumerate(payloads):
                way(i, data)
            spent = (time.process_time() - start) / len(payloads) * 1e3
            best[label] = min(best.get(label, spent), spent)
    return best


# -- main ----------------------------------------------------------------------------------

GOALS = [  # (run, against, ratio at least, corpus): the median of the repeats' ratios
    ("packer augment", "ffcv", 1.0, "small"),
    ("packer augment", "ffcv", 1.0, "large"),
    ("packer augment", "dataloader tv", 1.7, "small"),
    ("packer augment", "dataloader tv", 4.0, "large"),
    ("packer augment", "packer size", 0.9, "small"),
    ("packer augment", "packer size", 0.9, "large"),
]


LABELS = ("packer augment", "packer size", "packer tv", "dataloader tv", "ffcv")
CPU_SAMPLE = {"small": 300, "large": 20}  # photos timed by --cpu, the first of each corpus


def median_ratio(repeats: list[dict[str, float]], mine: str, other: str) -> float | None:
    """The median of ``mine / other`` within each repeat (None where a repeat lacks either):
    the two runs of one repeat were made minutes apart at most, where the best of each could
    come from different repeats, under different load."""
    if not repeats or not all(mine in r and other in r for r in repeats):
        return None
    return round(float(np.median([r[mine] / r[other] for r in repeats])), 2)


def make_run(label: str, name: str, folder: Path, workdir: Path) -> Callable[[int], Iterator[Any]]:
    """The epochs of one way over one corpus (FFCV's .beton already written)."""
    store = workdir / f"{name}.lmdb"
    if label == "packer augment":
        return packer_run(store, augment=[RandomResizedCrop(SIZE), RandomHorizontalFlip()])
    if label == "packer size":
        return packer_run(store, size=(SIZE, SIZE))
    if label == "packer tv":
        return packer_run(store, transform=HwcTorchvision())
    if label == "dataloader tv":
        return dataloader_run(folder)
    run, why = ffcv_run(folder, workdir / f"{name}.beton")
    if run is None:
        raise RuntimeError(why)
    return run


def one_run(label: str, name: str, folder: Path, workdir: Path, epoch: int) -> float:
    """In a fresh process: the first 3 batches of an epoch to warm up (page cache, FFCV's
    JIT, pools), then one whole epoch timed. A process per run, so that no run inherits
    another's threads, workers or memory: in one process, runs made right after FFCV's
    were slower."""
    run = make_run(label, name, folder, workdir)
    for k, _ in enumerate(run(epoch + 1000)):
        if k == 2:
            break
    return timed(run, epoch)[0]


def bench(name: str, folder: Path, workdir: Path, repeat: int, use_ffcv: bool) -> dict[str, Any]:
    import subprocess

    packed(folder, workdir / f"{name}.lmdb")
    labels = list(LABELS)
    skipped = {}
    if use_ffcv:
        _, why = ffcv_run(folder, workdir / f"{name}.beton")  # writes its .beton, once
        if why:
            skipped["ffcv"] = why
    else:
        skipped["ffcv"] = "--no-ffcv"
    labels = [label for label in labels if label not in skipped]
    best: dict[str, float] = {}
    every: list[dict[str, float]] = []  # each repeat's rates: ratios are taken within one
    for r in range(repeat):
        order = labels[r % len(labels) :] + labels[: r % len(labels)]  # rotate: none always first
        every.append({})
        for label in order:
            if label in skipped:
                continue
            command = [sys.executable, __file__, "--one", label, name, str(folder), str(workdir)]
            done = subprocess.run([*command, str(r)], capture_output=True, text=True)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                skipped[label] = f"failed: {last[:300]}"
                continue
            rate = float(done.stdout.split()[-1])
            best[label] = max(best.get(label, 0.0), rate)
            every[-1][label] = rate
            print(f"  {name} repeat {r}: {label:15s} {rate:8.1f} img/s", file=sys.stderr)
    every = [{k: v for k, v in rates.items() if k not in skipped} for rates in every]
    count = len(list(folder.rglob("*.jpg")))
    megabytes = sum(p.stat().st_size for p in folder.rglob("*.jpg")) / 1e6
    ratios = {label: median_ratio(every, label, "dataloader tv") for label in best}
    return {
        "images": count,
        "MB": round(megabytes),
        "rates": {k: v for k, v in best.items() if k not in skipped},
        "repeats": every,
        "x_dataloader": {k: v for k, v in ratios.items() if v is not None and k not in skipped},
        "skipped": skipped,
    }


def build_report(results: dict[str, Any], command: str) -> dict[str, Any]:
    """A run's JSON report: where and how it ran, each corpus's figures, and the goals with
    the median of their per-repeat ratios (a goal whose runs did not all run is left out)."""
    goals = []
    for mine, other, target, corpus in GOALS:
        ratio = median_ratio(results.get(corpus, {}).get("repeats", []), mine, other)
        if ratio is not None:
            goals.append(
                {
                    "goal": f"{corpus}: {mine} >= {target}x {other}",
                    "corpus": corpus,
                    "run": mine,
                    "against": other,
                    "target": target,
                    "ratio": ratio,
                    "met": ratio >= target,
                }
            )
    return {
        "machine": reporting.machine(),
        "date": reporting.today(),
        "load": round(os.getloadavg()[1], 1),  # the last 5 minutes': rates move with it
        "cores": CORES,
        "command": command,
        "versions": versions(),
        "results": results,
        "goals": goals,
    }


def versions() -> dict[str, str]:
    """The versions of the loaders compared, where they import: as installed (FFCV 1.0.2's
    own ``__version__`` still says 0.0.3rc1)."""
    from importlib.metadata import version

    found = {}
    for name in ("torch", "torchvision", "ffcv"):
        try:
            __import__(name)
            found[name] = version(name)
        except Exception:  # not installed, or does not import here (FFCV: reason in skipped)
            continue
    return found


# -- the results page ----------------------------------------------------------------------

CORPUS = {"small": "ImageNet-like", "large": "large photos"}
PHOTOS = {"small": "ImageNet-like photos", "large": "large photos"}
ROW = {  # how the results table names each way ({cores}, {ffcv}: from the report)
    "packer augment": "packer, `augment=[RandomResizedCrop(224), RandomHorizontalFlip()]`",
    "packer size": "packer, `size=(224, 224)`, no augmentation (the limit)",
    "packer tv": "packer, torchvision v2 crop + flip in `transform=`",
    "dataloader tv": "DataLoader over the folder, {cores} workers, Pillow + torchvision v2 crop "
    "+ flip",
    "ffcv": "FFCV{ffcv}, `RandomResizedCropRGBImageDecoder` + `RandomHorizontalFlip`",
}
SHORT = {
    "packer augment": "packer augment",
    "packer size": "packer `size=`",
    "packer tv": "packer tv",
    "dataloader tv": "DataLoader + torchvision",
    "ffcv": "FFCV",
    "entropy floor": "libjpeg-turbo at 1/8 scale (the floor)",
}


def _ms(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _spread(results: dict[str, Any]) -> float:
    """How far one way's rate moved between repeats, at most (best / worst)."""
    spreads = [
        max(rates) / min(rates)
        for found in results.values()
        for label in found.get("rates", {})
        if (rates := [r[label] for r in found.get("repeats", []) if label in r])
    ]
    return max(spreads, default=1.0)


def _setting(report: dict[str, Any]) -> str:
    results, cores = report["results"], report["cores"]
    have = report.get("versions", {})
    env = "".join(
        f", {name} {have[name]}" for name in ("torch", "torchvision", "ffcv") if name in have
    )
    text = ""
    if report.get("cpu_command"):  # a page put together from a run and a separate --cpu run
        text += f"CPU table: `{report['cpu_command']}`.\n\n"
    text += (
        f"In an environment with packer{env} (FFCV: `apt-get install libturbojpeg0-dev "
        "libopencv-dev pkg-config`, then `pip install ffcv`). torchvision and FFCV are not "
        "packer dependencies.\n\n"
    )
    corpora = []
    for name, shape in (("small", "300–500 × 250–450 px"), ("large", "2–12 megapixels")):
        if name in results and "images" in results[name]:
            found = results[name]
            batches = -(-found["images"] // 256)
            corpora.append(
                f"**{CORPUS[name]}**, {found['images']:,} photos of {shape} ({found['MB']} MB, "
                f"{batches} batches an epoch)"
            )
    repeats = max((len(f.get("repeats", [])) for f in results.values()), default=0)
    text += (
        "Corpora, made by the script (synthetic, photo-like: smooth colour fields, soft blobs and "
        f"fine grain, JPEG quality 90): {'; '.join(corpora)}. Each packed into an LMDB store of "
        "the original bytes; FFCV gets its own `.beton` of the same photos "
        '(`RGBImageField(write_mode="jpg", jpeg_quality=90)`). Every loader: batch 256, output '
        f"224×224 uint8, {cores} cores ({cores} decode threads, {cores} DataLoader workers, "
        f"{cores} FFCV workers), one epoch per run, each run in a fresh process after 3 warm-up "
        f"batches, runs interleaved in a rotating order. Rates: best of {repeats} (each repeat "
        f"in brackets); ratios: the median of the {repeats} repeats' ratios.\n\n"
    )
    return text


def _rates_table(report: dict[str, Any]) -> str:
    results = report["results"]
    corpora = [name for name in ("small", "large") if "rates" in results.get(name, {})]
    columns = ["loader"]
    for name in corpora:
        columns += [f"{CORPUS[name]}: images/s (each repeat)", "x DataLoader"]
    ffcv = report.get("versions", {}).get("ffcv")
    fill = {"cores": report["cores"], "ffcv": f" {ffcv}" if ffcv else ""}
    rows = []
    for label in LABELS:
        row = [ROW[label].format(**fill)]
        for name in corpora:
            found = results[name]
            if label not in found["rates"]:
                why = found["skipped"].get(label)
                row += ["not run (`--no-ffcv`)" if why == "--no-ffcv" else "skipped (below)", ""]
                continue
            each = ", ".join(f"{r[label]:.0f}" for r in found["repeats"] if label in r)
            ratio = found["x_dataloader"].get(label)
            row += [
                f"**{found['rates'][label]:.0f}** ({each})",
                "" if ratio is None else f"{ratio:.2f}",
            ]
        rows.append(row)
    return reporting.table(columns, rows)


def _goals_table(report: dict[str, Any]) -> str:
    rows = [
        [
            f"{CORPUS[g['corpus']]}: {SHORT[g['run']]} >= {g['target']}x {SHORT[g['against']]}",
            f"{g['ratio']:.2f}",
            "met" if g["met"] else "**not met**",
        ]
        for g in report["goals"]
    ]
    return reporting.table(["goal", "ratio (median of the repeats')", ""], rows)


def _cpu_table(results: dict[str, Any]) -> str:
    corpora = [name for name in ("small", "large") if "cpu_ms_per_image" in results.get(name, {})]
    if not corpora:
        return ""
    rows = [
        [SHORT[label], *(_ms(results[name]["cpu_ms_per_image"][label]) for name in corpora)]
        for label in (*LABELS, "entropy floor")
        if all(label in results[name]["cpu_ms_per_image"] for name in corpora)
    ]
    columns = ["CPU per image, one thread (ms)", *(CORPUS[name] for name in corpora)]
    return reporting.table(columns, rows)


def _skipped(results: dict[str, Any]) -> str:
    text = ""
    for name, found in results.items():
        for label, why in found.get("skipped", {}).items():
            if why == "--no-ffcv":
                continue
            if (
                "can't allocate memory" in why
            ):  # FFCV sizes each batch's buffer by the largest image
                why = (
                    "its loader allocates a buffer for the batch at the largest image's size and "
                    f"failed here (`{why.removeprefix('failed: ')}`)"
                )
            text += f"{SHORT[label]} on the {PHOTOS[name]}: {why}, so it is not compared there.\n\n"
    return text


def _cpu_note(results: dict[str, Any]) -> str:
    if not any("cpu_ms_per_image" in found for found in results.values()):
        return ""
    return (
        "The CPU table times each way's work per image in one thread (`time.process_time`, "
        f"first {CPU_SAMPLE['small']} and first {CPU_SAMPLE['large']} photos): a cost other jobs "
        "do not move, unlike the epoch rates, where each loader's share of a busy machine "
        "depends on how many threads and processes it runs. packer augment / size: the reader's "
        "decode step (`decode_placed` / `decode_resized`); packer tv: libjpeg-turbo decode + "
        "torchvision; dataloader tv: Pillow decode + torchvision; the floor: simplejpeg's "
        "decode at libjpeg-turbo's smallest scale, no crop or resize.\n\n"
    )


def _findings(report: dict[str, Any]) -> str:
    """What the figures say, each figure taken from the report."""
    results = report["results"]
    goals = {(g["corpus"], g["run"], g["against"]): g for g in report["goals"]}
    lines = []
    small, large = results.get("small", {}), results.get("large", {})
    cpu_s, cpu_l = small.get("cpu_ms_per_image", {}), large.get("cpu_ms_per_image", {})

    def each(found: dict[str, Any], mine: str, other: str) -> list[float]:
        return [r[mine] / r[other] for r in found.get("repeats", []) if mine in r and other in r]

    vs_size = each(small, "packer augment", "packer size")
    ffcv, loader = (
        goals.get(("small", "packer augment", "ffcv")),
        goals.get(("small", "packer augment", "dataloader tv")),
    )
    if cpu_s and vs_size and ffcv and loader:
        lines.append(
            "On ImageNet-sized photos the random crop costs "
            f"{cpu_s['packer augment'] - cpu_s['packer size']:.2f} ms of CPU per image over "
            "`size=` (the draws, the placement, and crops larger than the centre crop), and the "
            f"augmented epochs ran at {min(vs_size):.2f}–{max(vs_size):.2f}× the unaugmented ones. "
            f"packer augments at {ffcv['ratio']:.1f}× FFCV's fused decoder and "
            f"{loader['ratio']:.1f}× the DataLoader with torchvision."
        )
    vs_size = each(large, "packer augment", "packer size")
    vs_loader = each(large, "packer augment", "dataloader tv")
    loader = goals.get(("large", "packer augment", "dataloader tv"))
    if "dataloader tv" in cpu_l and vs_size and vs_loader and loader:
        cost = cpu_l["packer augment"] / cpu_l["packer size"]
        reach = "met" if loader["met"] else f"short of {loader['target']:g}×"
        lines.append(
            "On large photos the reduced-scale decode is where the gain comes from, and a random "
            "crop often needs a finer scale than the centre crop does (a crop of 8% of the area "
            f"decodes at 1/2 or 1/4 where `size=` decodes at 1/8): {cost:.2f}× the CPU per image "
            f"of `size=` ({1 / cost:.2f}× its rate); the epoch ratio ran from "
            f"{min(vs_size):.2f} to {max(vs_size):.2f} over the repeats. Against the DataLoader "
            f"with torchvision, {cpu_l['dataloader tv'] / cpu_l['packer augment']:.1f}× less CPU "
            f"per image, {loader['ratio']:.2f}× the rate (median; {max(vs_loader):.2f} in the best "
            f"repeat): {reach}."
        )
    floor = cpu_l.get("entropy floor")
    if floor and "dataloader tv" in cpu_l and "packer augment" in cpu_l:
        lines.append(
            "What bounds large photos is entropy decoding: every decoder here, packer's, "
            "Pillow's and FFCV's, Huffman-decodes every byte of the JPEG, whatever the scale or "
            f"crop. libjpeg-turbo at 1/8 scale, which does little else, costs {_ms(floor)} ms per "
            f"photo, {floor / cpu_l['packer augment']:.0%} of packer augment's CPU, so a loader "
            f"that decodes whole files spends at most {cpu_l['dataloader tv'] / floor:.1f}× less "
            "CPU per image than the DataLoader. libjpeg-turbo could stop at the crop's last row "
            "(`jpeg_skip_scanlines`, or TurboJPEG 3's cropping region), but the rows above "
            "the crop must still be decoded, and neither simplejpeg nor Pillow exposes it."
        )
    tv = [c["packer tv"] / c["packer augment"] for c in (cpu_s, cpu_l) if "packer tv" in c]
    if tv:
        lines.append(
            f"torchvision's transforms inside packer's `transform=` cost {min(tv):.1f}–"
            f"{max(tv):.1f}× the CPU of `augment=` per image, and their draws cannot be reproduced."
        )
    if not lines:
        return ""
    return "What the figures say:\n\n" + "".join(f"- {line}\n" for line in lines)


def render(report: dict[str, Any]) -> str:
    """The results page of one run, from its JSON report alone."""
    on = report["machine"]
    if report.get("load") is not None:
        on += f", shared with other jobs (load average about {report['load']:.0f} during the run"
        spread = _spread(report["results"])
        if spread > 1:  # more than one repeat
            on += f", so rates moved up to {spread:.1f}x between repeats: compare within a column"
        on += ")"
    text = reporting.header(
        "Benchmark: augmented epochs", report["command"], on=on, date=report["date"]
    )
    text += _setting(report) + _rates_table(report) + _goals_table(report)
    text += _cpu_table(report["results"]) + _skipped(report["results"])
    text += _cpu_note(report["results"]) + _findings(report)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/packer-bench-augment"))
    parser.add_argument("--small", type=int, default=3000)
    parser.add_argument("--large", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--only", choices=("small", "large"))
    parser.add_argument("--no-ffcv", action="store_true")
    parser.add_argument("--quick", action="store_true", help="300 small, 20 large, 1 repeat")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--cpu", action="store_true", help="CPU per image in one thread only")
    parser.add_argument(
        "--out",
        type=Path,
        help="results page (default: docs/benchmarks/augment.md, by a whole run only)",
    )
    parser.add_argument(
        "--from-json", type=Path, metavar="FILE", help="render the page from a saved --json report"
    )
    parser.add_argument(
        "--one", nargs=5, help=argparse.SUPPRESS
    )  # label corpus folder workdir epoch
    args = parser.parse_args()
    if args.from_json:
        report = json.loads(args.from_json.read_text(encoding="utf-8"))
        print(reporting.write(args.out or reporting.DOCS / "augment.md", render(report)))
        return
    import torch

    torch.set_num_threads(1)
    if args.one:
        label, name, folder, workdir, epoch = args.one
        print(one_run(label, name, Path(folder), Path(workdir), int(epoch)))
        return
    if args.quick:
        args.small, args.large, args.repeat = 300, 20, 1
        args.workdir = args.workdir.with_name(args.workdir.name + "-quick")
    args.workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    for name, count in (("small", args.small), ("large", args.large)):
        if args.only and args.only != name:
            continue
        workdir = args.workdir / f"{name}-{count}"  # its stores go with the corpus they hold
        workdir.mkdir(exist_ok=True)
        folder = make_corpus(workdir / "photos", count, name == "large")
        if not args.cpu:
            results[name] = bench(name, folder, workdir, args.repeat, not args.no_ffcv)
        cost = cpu_per_image(folder, CPU_SAMPLE[name], max(args.repeat, 3))
        print(f"{name}: ms of CPU per image, one thread", file=sys.stderr)
        for label, ms in cost.items():
            print(
                f"  {label:15s} {ms:7.2f}  ({ms / cost['packer size']:.2f}x size)",
                file=sys.stderr,
            )
        results.setdefault(name, {})["cpu_ms_per_image"] = cost
    if args.cpu:
        print(json.dumps(results, indent=2) if args.json else "", end="")
        return
    report = build_report(results, reporting.command(__file__))
    if args.out or not (args.quick or args.only):  # a partial run's page only where asked
        page = reporting.write(args.out or reporting.DOCS / "augment.md", render(report))
        print(f"wrote {page}", file=sys.stderr)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{report['machine']}; batch 256, 224x224 uint8, best of {args.repeat}")
    for corpus, found in results.items():
        print(f"\n{corpus}: {found['images']} photos, {found['MB']} MB")
        for label, rate in found["rates"].items():
            print(f"  {label:15s} {rate:8.1f} img/s")
        for label, why in found["skipped"].items():
            print(f"  {label:15s} skipped: {why}")
    print()
    for goal in report["goals"]:
        print(f"  {goal['goal']:45s} {goal['ratio']:5.2f}x  {'met' if goal['met'] else 'NOT met'}")


if __name__ == "__main__":
    main()
