#!/usr/bin/env python3
"""Small images and millions of files (issue 23): packer's defaults against a DataLoader over
the folder, and packing memory per file, in one run.

  1. reading, decoded, one corpus at a time (10 class folders, photo-like content): 32x32 PNG,
     64x64 JPEG and ImageNet-like 400x350 JPEG. Each corpus is packed to LMDB with default
     options. Timed side by side, interleaved, best of --repeat, each a whole epoch after a
     warm-up epoch (both sides keep their workers between epochs):
       - THE RIVAL: a torch DataLoader over the folder, num_workers = cores, batch 256,
         persistent workers, a map-style dataset that opens each file with Pillow, converts
         it to RGB and returns a tensor (the default collate stacks the batch);
       - packer: ``open_reader(store, batch_size=256)`` with default options (it chooses
         where to decode from the store's statistics) but ``across_epochs=False``, so that
         no reader works between its timed epochs; and with decode_in forced to "threads"
         and to "processes", shown.
     Goal: defaults >= 1.5x the DataLoader on every corpus.
  2. --files N: packing N tiny PNGs (copies of 64 distinct 32x32 PNGs under new names, in
     100 class folders), ``--check header``, in a fresh process: its peak anonymous memory
     (RssAnon, sampled; its RSS also counts the LMDB shard's pages it maps, shown too) and
     time; then ``packer inspect --json`` of the store and ``open_reader`` + ``len`` in fresh
     processes, timed. Goal: peak <= 300 MB for 1M files.
  3. --simulate N: the scan's file list of N entries (names like a folder of N files in 1,000
     class folders, built through the walk's own FileList builder, no file written) labelled,
     digested, shuffled and planned into shards as a pack does, in a fresh process: peak RSS
     and time. Goal: 10M entries in well under 2 GB.

    python benchmarks/bench_small_images.py                      # reading, ~5 minutes
    python benchmarks/bench_small_images.py --files 200000 --simulate 10000000 --skip-reading
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import reporting  # noqa: E402  (benchmarks/reporting.py, beside this script)

CORPORA = {  # name: (width, height, format, images)
    "png32": (32, 32, "PNG", 20_000),
    "jpeg64": (64, 64, "JPEG", 20_000),
    "jpeg400": (400, 350, "JPEG", 1_500),
}
BATCH = 256


def photo_like(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """Smooth blocks plus grain: compresses like a photo, unlike pure noise."""
    block = max(2, min(width, height) // 8)
    base = rng.integers(0, 256, (height // block + 1, width // block + 1, 3), dtype=np.uint8)
    pixels = np.kron(base, np.ones((block, block, 1), np.uint8))[:height, :width].astype(np.int16)
    pixels += rng.integers(-12, 13, pixels.shape, dtype=np.int16)
    return Image.fromarray(pixels.clip(0, 255).astype(np.uint8))


def make_corpus(folder: Path, width: int, height: int, fmt: str, count: int) -> None:
    if (folder / ".done").exists():
        return
    rng = np.random.default_rng(23)
    ext = ".png" if fmt == "PNG" else ".jpg"
    for i in range(count):
        target = folder / f"class{i % 10}" / f"{i:07d}{ext}"
        target.parent.mkdir(parents=True, exist_ok=True)
        out = io.BytesIO()
        photo_like(rng, width, height).save(out, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
        target.write_bytes(out.getvalue())
    (folder / ".done").touch()


def packed(folder: Path, store: Path) -> Path:
    from packer import PackOptions, pack

    if not (store / "manifest.json").exists():
        pack(folder, store, PackOptions(seed=0))
    return store


class FolderDataset:
    """The rival's dataset: every file opened with Pillow, as most training scripts do."""

    def __init__(self, folder: Path) -> None:
        self.files = sorted(str(p) for p in folder.rglob("*") if p.suffix in (".png", ".jpg"))
        self.labels = [int(Path(f).parent.name[5:]) for f in self.files]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        import torch

        with Image.open(self.files[i]) as im:
            pixels = np.asarray(im.convert("RGB"))
        return torch.from_numpy(pixels), self.labels[i]


def _epoch_rate(batches) -> float:  # type: ignore[no-untyped-def]
    started, images = time.perf_counter(), 0
    for images_, _ in batches:
        images += len(images_)
    return images / (time.perf_counter() - started)


def bench_reading(workdir: Path, repeat: int, only: list[str]) -> list[dict]:
    import torch
    from torch.utils.data import DataLoader

    from packer import open_reader

    cores = len(os.sched_getaffinity(0))
    rows = []
    for name, (width, height, fmt, count) in CORPORA.items():
        if only and name not in only:
            continue
        folder = workdir / name
        make_corpus(folder, width, height, fmt, count)
        store = packed(folder, workdir / f"{name}.lmdb")
        loader = DataLoader(
            FolderDataset(folder),
            batch_size=BATCH,
            shuffle=True,
            num_workers=cores,
            persistent_workers=True,
            generator=torch.Generator().manual_seed(0),
        )
        # across_epochs=False: a reader idle between its epochs, as the DataLoader's workers
        # are; by default it would decode its next epoch's first batches while the others
        # are timed, taking their cores and starting its next timed epoch ahead.
        readers = {
            "default": open_reader(store, batch_size=BATCH, seed=0, across_epochs=False),
            "threads": open_reader(
                store, batch_size=BATCH, seed=0, across_epochs=False, decode_in="threads"
            ),
            "processes": open_reader(
                store, batch_size=BATCH, seed=0, across_epochs=False, decode_in="processes"
            ),
        }
        runs: dict[str, list[float]] = {"dataloader": [], **{k: [] for k in readers}}
        epochs = {k: 0 for k in readers}

        for r in range(-1, repeat):  # -1: warm-up, workers started, files and store cached
            kinds = list(runs)
            if r % 2:
                kinds.reverse()
            for kind in kinds:
                if kind == "dataloader":
                    rate = _epoch_rate(loader)
                else:
                    epochs[kind] += 1
                    rate = _epoch_rate(readers[kind].epoch(epochs[kind]))
                if r >= 0:
                    runs[kind].append(rate)
        chosen = readers["default"]._producer.decode_in
        for reader in readers.values():
            reader.close()
        del loader
        best = {k: max(v) for k, v in runs.items()}
        rows.append(
            {
                "corpus": f"{count:,} {width}x{height} {fmt}",
                "dataloader": round(best["dataloader"]),
                "packer": round(best["default"]),
                "chosen": chosen,
                "threads": round(best["threads"]),
                "processes": round(best["processes"]),
                "ratio": round(best["default"] / best["dataloader"], 2),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _status_mb(pid: int, field: str) -> float:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    if f"{field}:" not in text:  # a process that has exited
        return 0.0
    return int(text.split(f"{field}:")[1].split()[0]) / 1024


def _run_measured(command: list[str]) -> tuple[float, float, float, str]:
    """Run ``command``: (seconds, peak anonymous memory in MB, peak RSS in MB, stdout).

    Anonymous memory (RssAnon, sampled every 20 ms) is what the process allocates. Its RSS
    (VmHWM) also counts the pages of the LMDB shard it writes through a memory map, which
    are the file's, written back and dropped by the kernel as it needs."""
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    anon = rss = 0.0
    while child.poll() is None:
        anon = max(anon, _status_mb(child.pid, "RssAnon"))
        rss = max(rss, _status_mb(child.pid, "VmHWM"))
        time.sleep(0.02)
    out, err = child.communicate()
    seconds = time.perf_counter() - started
    if child.returncode:
        raise SystemExit(f"{shlex.join(command)} failed:\n{err}")
    return seconds, anon, rss, out


def make_many(folder: Path, count: int) -> None:
    if (folder / ".done").exists() and len(list(folder.glob("c*"))) == 100:
        marker = (folder / ".done").read_text()
        if marker == str(count):
            return
    rng = np.random.default_rng(1)
    blobs = []
    for _ in range(64):
        out = io.BytesIO()
        photo_like(rng, 32, 32).save(out, "PNG")
        blobs.append(out.getvalue())
    for c in range(100):
        (folder / f"c{c:02d}").mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (folder / f"c{i % 100:02d}" / f"{i:08d}.png").write_bytes(blobs[i % 64])
    (folder / ".done").write_text(str(count))


def bench_files(workdir: Path, count: int) -> dict:
    """Each measurement in a fresh child process."""
    folder = workdir / f"many-{count}"
    make_many(folder, count)
    store = workdir / f"many-{count}.lmdb"
    pack = [
        sys.executable,
        "-m",
        "packer",
        "pack",
        str(folder),
        str(store),
        "--check",
        "header",
        "--overwrite",
        "--seed",
        "0",
        "--json",
    ]
    pack_s, pack_anon, pack_rss, _ = _run_measured(pack)
    inspect = [sys.executable, "-m", "packer", "inspect", str(store), "--json"]
    inspect_s, _, _, _ = _run_measured(inspect)
    opening = (
        "import time; t = time.perf_counter(); from packer import open_reader; "
        f"r = open_reader({str(store)!r}, batch_size=256); n = len(r); "
        "print(time.perf_counter() - t)"
    )
    _, _, _, out = _run_measured([sys.executable, "-c", opening])
    row = {
        "files": count,
        "pack_s": round(pack_s, 1),
        "pack_peak_anon_mb": round(pack_anon),
        "pack_peak_rss_mb": round(pack_rss),
        "inspect_s": round(inspect_s, 2),
        "open_s": round(float(out), 3),
    }
    print(json.dumps(row), flush=True)
    return row


def bench_simulated(count: int) -> dict:
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); import bench_small_images as b; b.simulate({count})"
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'benchmarks'}:{ROOT}"}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode:
        raise SystemExit(done.stderr)
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row["process_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(row), flush=True)
    return row


def simulate(count: int) -> None:
    """In a fresh process: ``count`` scanned entries through the pack's planning steps."""
    from packer.packing.file_list import FileListBuilder
    from packer.packing.ledger import inputs_digest
    from packer.packing.options import PackOptions
    from packer.packing.pipeline import plan_shards
    from packer.packing.shard_job import estimated_sizes
    from packer.packing.shuffle import permutation
    from packer.packing.source import _from_folders

    started = time.perf_counter()
    files = FileListBuilder()
    per_class = -(-count // 1000)
    for c in range(1000):
        first = c * per_class
        for i in range(first, min(first + per_class, count)):
            files.add(f"n{c:08d}/n{c:08d}_{i:08d}.JPEG", 2_000 + i % 5_000)
    found = files.build()
    scanned = time.perf_counter()
    src = _from_folders(Path("/nowhere"), found, [])
    digest = inputs_digest(src)
    options = PackOptions(seed=0)
    items = src.items.take(permutation(len(src.items), 0))
    plan = plan_shards(estimated_sizes(items, options), options)
    planned = time.perf_counter()
    peak = int(Path("/proc/self/status").read_text().split("VmHWM:")[1].split()[0]) / 1024
    print(
        json.dumps(
            {
                "entries": count,
                "peak_mb": round(peak),
                "bytes_per_entry": round(peak * 2**20 / count),
                "list_s": round(scanned - started, 1),
                "label_digest_shuffle_plan_s": round(planned - scanned, 1),
                "shards": len(plan),
                "digest": digest[:12],
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/packer-bench-small"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--corpus", action="append", choices=list(CORPORA), default=[])
    parser.add_argument("--skip-reading", action="store_true")
    parser.add_argument("--files", type=int, default=0, help="pack this many tiny files")
    parser.add_argument("--simulate", type=int, default=0, help="plan this many entries")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    print(reporting.header("Small images and millions of files", reporting.command(__file__)))
    result: dict = {}
    if not args.skip_reading:
        result["reading"] = bench_reading(args.workdir, args.repeat, args.corpus)
    if args.simulate:
        result["simulated"] = bench_simulated(args.simulate)
    if args.files:
        result["packing"] = bench_files(args.workdir, args.files)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
