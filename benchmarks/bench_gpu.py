#!/usr/bin/env python3
"""Benchmark: a ResNet trained on a GPU from packer's reader. Does the GPU wait for data?

Needs a CUDA GPU and torchvision (the models, the folder baseline's transforms, nvJPEG). On
--photos ImageNet-like JPEGs (bench_storage's photos: 300-480 x 400-640 px, about 90 KB),
packed to LMDB, for ResNet-50 and ResNet-18 (torchvision's), mixed precision (bfloat16),
channels-last, batches of 256, 224 x 224:

  limit           the GPU's own training rate: steps on a batch already on the GPU
  packer          open_reader(size=(224, 224), output="torch", pin_memory=True,
                  device="cuda"), every core decoding (where the defaults choose); per
                  epoch images/s and reader.stats()["wait_share"]
  packer-threads  the same with decode_in="threads" (ResNet-50 only)
  packer-augment  the same with augment=[RandomResizedCrop(224), RandomHorizontalFlip()]
  dataloader      torchvision's ImageFolder over the folder with the same augmentation, a
                  DataLoader with one worker process per core and pinned memory
  packer-workers  packer's TorchDataset (the same augmentation) through that many DataLoader
                  workers
  nvjpeg          the store's JPEG bytes decoded on the GPU (torchvision.io.decode_jpeg) and
                  resized there, by a thread and a stream of its own
  decode limit    each loader alone, batches copied to the GPU, no training: how fast the
                  CPUs (or nvJPEG) feed it
  trace           a torch.profiler trace of a few ResNet-50 steps fed by packer: does each
                  batch's copy to the GPU run on a stream of its own beside the kernels?
  train_example   scripts/train_example.py --device cuda, every loader, on its demo set

Each case writes its figures to --out as it finishes (gpu.json, the trace's timeline), so a
run cut short keeps what it measured. --render turns a run's folder into the results page
docs/benchmarks/gpu.md and its timeline picture, on any machine.

    python benchmarks/bench_gpu.py --out /tmp/gpu         # on the GPU machine, ~6 minutes
    python benchmarks/bench_gpu.py --render /tmp/gpu      # the page, from that run
    python benchmarks/bench_gpu.py --render docs/benchmarks/gpu.json   # again, from the saved runs
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import reporting

BATCH, SIZE, SEED = 256, 224, 0
MODELS = ("resnet50", "resnet18")
MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)  # ImageNet's, as every torchvision model uses
STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
WAIT_GOAL, LOADER_GOAL, DECODE_GOAL = 0.02, 1.5, 0.9
DEVICE = "cuda"  # --device cpu: a smoke run of the whole script, its figures meaningless
PAGE = reporting.DOCS / "gpu.md"
PICTURE = reporting.DOCS / "gpu-timeline.svg"


def sync() -> None:
    """Wait for the GPU's queued work: a time read before it would not include it."""
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


class Results:
    """gpu.json in the output folder, rewritten as each case finishes."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "gpu.json"
        self.data: dict[str, Any] = {}

    def put(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.path.write_text(json.dumps(self.data, indent=1))
        print(f"[{time.strftime('%H:%M:%S')}] {key}: {json.dumps(value)[:400]}", flush=True)


# -- the machine and the data ------------------------------------------------------------


def describe_machine() -> dict[str, Any]:
    import torch
    import torchvision

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    on_gpu = DEVICE == "cuda"
    return {
        "gpu": torch.cuda.get_device_name(0) if on_gpu else "no GPU (a smoke run)",
        "gpu_memory_gb": round(torch.cuda.get_device_properties(0).total_memory / 1e9)
        if on_gpu
        else 0,
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "torchvision": torchvision.__version__,
        "date": reporting.today(),
    }


def prepare(workdir: Path, photos: int) -> tuple[Path, Path, dict[str, Any]]:
    from bench_storage import make_folder

    from packer import PackOptions, pack

    folder, store = workdir / "photos", workdir / "photos.lmdb"
    started = time.perf_counter()
    make_folder(folder, photos)
    made = time.perf_counter() - started
    started = time.perf_counter()
    if not (store / "manifest.json").exists():
        pack(folder, store, PackOptions(seed=SEED))
    packed = time.perf_counter() - started
    size = sum(p.stat().st_size for p in store.rglob("*") if p.is_file())
    figures = {
        "photos": photos,
        "store_gb": round(size / 1e9, 2),
        "generate_s": round(made, 1),
        "pack_s": round(packed, 1),
    }
    return folder, store, figures


# -- the model and the loop --------------------------------------------------------------


class Trainer:
    """One torchvision ResNet, bfloat16 autocast, channels-last; ``step`` takes uint8 NHWC
    images anywhere and queues one training step on the GPU without waiting for it."""

    def __init__(self, name: str, classes: int) -> None:
        import torch
        import torchvision

        self.torch = torch
        torch.manual_seed(SEED)
        self.model = getattr(torchvision.models, name)(num_classes=classes)
        self.model = self.model.to(DEVICE).to(memory_format=torch.channels_last)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.mean = torch.tensor(MEAN, device=DEVICE).view(1, 3, 1, 1)
        self.std = torch.tensor(STD, device=DEVICE).view(1, 3, 1, 1)

    def inputs(self, images: Any) -> Any:
        # NHWC -> an NCHW view whose memory is channels-last: no copy for the layout.
        x = images.to(DEVICE, non_blocking=True).permute(0, 3, 1, 2)
        return (x.float() - self.mean) / self.std

    def step(self, images: Any, labels: Any) -> None:
        torch = self.torch
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            logits = self.model(self.inputs(images))
            loss = torch.nn.functional.cross_entropy(logits, labels.to(DEVICE, non_blocking=True))
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def limit(self) -> float:
        """Images/s on one batch already on the GPU: what no loader can beat."""
        torch = self.torch
        steps, warmup = (30, 10) if DEVICE == "cuda" else (2, 1)
        images = torch.randint(0, 256, (BATCH, SIZE, SIZE, 3), dtype=torch.uint8, device=DEVICE)
        labels = torch.randint(0, 10, (BATCH,), device=DEVICE)
        for _ in range(warmup):
            self.step(images, labels)
        sync()
        started = time.perf_counter()
        for _ in range(steps):
            self.step(images, labels)
        sync()
        return steps * BATCH / (time.perf_counter() - started)


EpochBatches = Callable[[int], Iterable[Any]]


def run_epochs(
    batches: EpochBatches,
    epochs: int,
    trainer: Trainer | None,
    stats: Callable[[], dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Each epoch: images/s and the share of it spent in next() (the loop waiting for data),
    and the reader's own wait_share where there is a reader. Without a trainer each batch is
    only copied to the GPU: the rate the loader alone can feed."""

    rows = []
    for epoch in range(epochs):
        sync()
        started, cpu_started = time.perf_counter(), time.process_time()
        waited, images = 0.0, 0
        iterator = iter(batches(epoch))
        while True:
            asked = time.perf_counter()
            batch = next(iterator, None)
            waited += time.perf_counter() - asked
            if batch is None:
                break
            if trainer is None:
                batch[0].to(DEVICE, non_blocking=True)
            else:
                trainer.step(batch[0], batch[1])
            images += len(batch[1])
        sync()
        seconds = time.perf_counter() - started
        row = {
            "epoch": epoch,
            "images": images,
            "seconds": round(seconds, 2),
            "images_per_s": round(images / seconds),
            "wait_share": round(waited / seconds, 4),
            # this process's threads, not its children: the host's share of GPU decoding
            "cpu_s": round(time.process_time() - cpu_started, 2),
        }
        if stats is not None:
            row["reader_wait_share"] = stats()["wait_share"]
        rows.append(row)
    return rows


# -- the loaders -------------------------------------------------------------------------


def augment_steps() -> list[Any]:
    from packer.augment import RandomHorizontalFlip, RandomResizedCrop

    return [RandomResizedCrop(SIZE), RandomHorizontalFlip()]


class Loader:
    """One way of feeding the loop: ``batches(epoch)``, ``stats`` where it has a reader."""

    stats: Callable[[], dict[str, Any]] | None = None

    def batches(self, epoch: int) -> Iterable[Any]:
        raise NotImplementedError

    def close(self) -> None:
        pass


def every_reader() -> dict[str, Any]:
    """What every packer loader here is opened with: the same batches, order and epochs."""
    return {"batch_size": BATCH, "seed": SEED, "drop_last": True}


class PackerLoader(Loader):
    def __init__(self, store: Path, **options: Any) -> None:
        from packer import open_reader

        self.reader = open_reader(
            store,
            **every_reader(),
            output="torch",
            pin_memory=DEVICE == "cuda",
            device=DEVICE if DEVICE == "cuda" else None,
            **options,
        )
        self.stats = self.reader.stats

    def batches(self, epoch: int) -> Iterable[Any]:
        return self.reader.epoch(epoch)

    def close(self) -> None:
        self.reader.close()


class HwcAugment:
    """torchvision's RandomResizedCrop and flip on the PIL image, then uint8 HWC as packer's."""

    def __init__(self) -> None:
        from torchvision.transforms import v2

        self.steps = v2.Compose([v2.RandomResizedCrop(SIZE), v2.RandomHorizontalFlip()])

    def __call__(self, image: Any) -> Any:
        import torch

        return torch.from_numpy(np.array(self.steps(image.convert("RGB"))))


class FolderLoader(Loader):
    """What most training scripts do: ImageFolder, a DataLoader, a worker process per core."""

    def __init__(self, folder: Path, workers: int) -> None:
        import torch
        from torch.utils.data import DataLoader
        from torchvision.datasets import ImageFolder

        self.loader = DataLoader(
            ImageFolder(str(folder), transform=HwcAugment()),
            batch_size=BATCH,
            shuffle=True,
            num_workers=workers,
            pin_memory=DEVICE == "cuda",
            drop_last=True,
            persistent_workers=True,
            generator=torch.Generator().manual_seed(SEED),
        )

    def batches(self, epoch: int) -> Iterable[Any]:
        return self.loader

    def close(self) -> None:
        del self.loader  # its persistent workers end with it


class PackerWorkersLoader(Loader):
    """packer's TorchDataset: the store read through DataLoader worker processes."""

    def __init__(self, store: Path, workers: int) -> None:
        from torch.utils.data import DataLoader

        from packer.torch_adapter import TorchDataset

        self.dataset = TorchDataset(
            store,
            **every_reader(),
            output="torch",
            workers=1,  # one decode thread per worker process: the processes are the pool
            augment=augment_steps(),
        )
        self.loader = DataLoader(
            self.dataset, batch_size=None, num_workers=workers, pin_memory=DEVICE == "cuda"
        )

    def batches(self, epoch: int) -> Iterable[Any]:
        self.dataset.set_epoch(epoch)
        return self.loader


class NvjpegLoader(Loader):
    """The store's JPEG bytes (decode=False), decoded on the GPU by nvJPEG in batches and
    brought to 224 x 224 there (packer.gpu_decode.decode_on_gpu: a thread and a stream of its
    own, a few batches ahead): the CPUs only read."""

    def __init__(self, store: Path) -> None:
        from packer import open_reader

        self.reader = open_reader(store, **every_reader(), decode=False, workers=4)

    def batches(self, epoch: int) -> Iterator[Any]:
        from packer.gpu_decode import decode_on_gpu

        return decode_on_gpu(self.reader.epoch(epoch), (SIZE, SIZE), device=DEVICE)

    def close(self) -> None:
        self.reader.close()


# -- the cases ---------------------------------------------------------------------------


def measure(make: Callable[[], Loader], epochs: int, trainer: Trainer | None) -> dict[str, Any]:
    started = time.perf_counter()
    loader = make()
    opened = time.perf_counter() - started
    try:
        rows = run_epochs(loader.batches, epochs, trainer, loader.stats)
    finally:
        loader.close()
    return {"open_s": round(opened, 2), "epochs": rows}


def loaders(folder: Path, store: Path, cores: int) -> dict[str, Callable[[], Loader]]:
    return {
        "packer": lambda: PackerLoader(store, size=(SIZE, SIZE)),
        "packer-threads": lambda: PackerLoader(store, size=(SIZE, SIZE), decode_in="threads"),
        "packer-augment": lambda: PackerLoader(store, augment=augment_steps()),
        "dataloader": lambda: FolderLoader(folder, cores),
        "packer-workers": lambda: PackerWorkersLoader(store, cores),
        "nvjpeg": lambda: NvjpegLoader(store),
    }


def trace_steps(store: Path, out: Path, classes: int) -> dict[str, Any]:
    """A profiler trace of ResNet-50 steps fed by packer, and what it shows of the copies."""
    from torch.profiler import ProfilerActivity, profile, schedule

    trainer = Trainer("resnet50", classes)
    loader = PackerLoader(store, size=(SIZE, SIZE))
    trace = out / "trace.json.gz"
    try:
        with profile(
            activities=[ProfilerActivity.CPU]
            + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else []),
            schedule=schedule(wait=8, warmup=2, active=4),
            on_trace_ready=lambda p: p.export_chrome_trace(str(trace)),
        ) as profiler:
            for i, (images, labels) in enumerate(loader.batches(0)):
                trainer.step(images, labels)
                profiler.step()
                if i >= 14:
                    break
            sync()
    finally:
        loader.close()
    with gzip.open(trace, "rt") as f:
        events = json.load(f)["traceEvents"]
    timeline = gpu_timeline(events)
    (out / "timeline.json").write_text(json.dumps(timeline))
    return summarize_timeline(timeline)


def gpu_timeline(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The trace's GPU work as intervals (microseconds from the first): kernels by stream,
    and the host-to-device copies of a batch (1 MB or more) with their stream."""
    kernels: dict[str, list[tuple[float, float]]] = {}
    copies = []
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        stream = str(e.get("args", {}).get("stream", e.get("tid")))
        if e.get("cat") == "kernel":
            kernels.setdefault(stream, []).append((e["ts"], e["ts"] + e["dur"]))
        elif (
            e.get("cat") == "gpu_memcpy"
            and "HtoD" in e.get("name", "")
            and e.get("args", {}).get("bytes", 0) >= 1 << 20
        ):
            copies.append({"stream": stream, "start": e["ts"], "end": e["ts"] + e["dur"]})
    starts = [s for spans in kernels.values() for s, _ in spans] + [c["start"] for c in copies]
    origin = min(starts, default=0.0)
    return {
        "kernels": {
            s: [(a - origin, b - origin) for a, b in sorted(spans)] for s, spans in kernels.items()
        },
        "copies": [
            {**c, "start": c["start"] - origin, "end": c["end"] - origin}
            for c in sorted(copies, key=lambda c: c["start"])
        ],
    }


def _training_stream(timeline: dict[str, Any]) -> str | None:
    """The stream that trains: the one with the most kernel time."""
    busy = {s: sum(b - a for a, b in spans) for s, spans in timeline["kernels"].items()}
    return max(busy, key=lambda s: busy[s], default=None)


def _merged(spans: Iterable[tuple[float, float]], gap: float = 0.0) -> list[tuple[float, float]]:
    """The spans as busy stretches: overlapping ones, and ones at most ``gap`` apart, joined."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1] + gap:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _covered(start: float, end: float, spans: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in spans)


def summarize_timeline(timeline: dict[str, Any]) -> dict[str, Any]:
    """Which stream trains (the most kernel time), which the copies use, how much of each
    copy's time the training stream was busy, and how busy it was over the traced steps."""
    training = _training_stream(timeline)
    spans = _merged(timeline["kernels"][training]) if training else []
    copies = timeline["copies"]
    copy_time = sum(c["end"] - c["start"] for c in copies)
    overlapped = sum(_covered(c["start"], c["end"], spans) for c in copies)
    window = spans[-1][1] - spans[0][0] if spans else 0.0
    return {
        "training_stream": training,
        "copy_streams": sorted({c["stream"] for c in copies}),
        "copies": len(copies),
        "copy_ms_mean": round(copy_time / max(len(copies), 1) / 1000, 3),
        "copy_overlapped_share": round(overlapped / copy_time, 3) if copy_time else None,
        "training_stream_busy_share": round(sum(b - a for a, b in spans) / window, 3)
        if window
        else None,
    }


def train_example(workdir: Path, cores: int, seconds: int) -> dict[str, Any]:
    """scripts/train_example.py --device cuda on its demo set, every loader: its table."""
    command = [
        sys.executable,
        "scripts/train_example.py",
        *("--device", DEVICE, "--pin-memory", "--model", "large", "--image-size", "64"),
        *("--loader", "all", "--epochs", "3", "--workers", str(cores), "--json"),
        *("--workdir", str(workdir / "train-example")),
    ]
    try:
        done = subprocess.run(
            command, cwd=reporting.ROOT, capture_output=True, text=True, timeout=seconds
        )
    except subprocess.TimeoutExpired:
        return {"command": shlex.join(command[1:-2]), "rows": None, "error": f"over {seconds} s"}
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    summary = next((line for line in lines if line.get("kind") == "summary"), None)
    return {
        "command": "python " + shlex.join(command[1:-2]),
        "rows": summary["rows"] if summary else None,
        "error": done.stderr[-2000:] if done.returncode else "",
    }


def run(args: argparse.Namespace) -> None:
    import torch

    torch.backends.cudnn.benchmark = True
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    results = Results(out)
    deadline = time.monotonic() + args.budget_s
    results.put("machine", describe_machine())
    results.put("command", reporting.command(__file__))
    folder, store, data = prepare(args.workdir, args.photos)
    results.put("data", data)
    cores = os.cpu_count() or 1
    ways = loaders(folder, store, cores)
    fewer = lambda: PackerLoader(  # noqa: E731
        store, size=(SIZE, SIZE), decode_in="threads", workers=cores // 2
    )
    ways_alone = {**ways, "packer-threads-half": fewer}
    trainers: dict[str, Trainer] = {}

    def trained(model: str, name: str) -> Callable[[], Any]:
        def case() -> Any:
            if model not in trainers:  # each model built and its limit measured once
                trainers[model] = Trainer(model, classes=10)
                results.put(f"{model}/limit", round(trainers[model].limit()))
            return measure(ways[name], args.epochs, trainers[model])

        return case

    every = {
        **{f"{m}/{n}": trained(m, n) for m in MODELS for n in ways},
        **{f"decode/{n}": partial(measure, ways_alone[n], args.epochs, None) for n in ways_alone},
        "trace": lambda: trace_steps(store, out, classes=10),
        "train_example": lambda: train_example(args.workdir, cores, seconds=60),
    }
    for key in args.cases.split(",") if args.cases else ORDER:
        if time.monotonic() > deadline:
            print(f"budget spent: {key} and what follows not run", flush=True)
            return
        results.put(key, every[key]())


# What a run measures, in turn: the comparison that decides the goals first, side by side for
# both models; then the loaders alone, the other variants, the trace and the example, as the
# budget allows.
_FIRST, _THEN = ("packer", "dataloader", "nvjpeg"), ("packer-augment", "packer-workers")
_LOADERS = tuple(loaders(Path(), Path(), 1))  # their names: nothing is opened
ORDER = [
    *(f"{m}/{n}" for m in MODELS for n in _FIRST),
    *(f"decode/{n}" for n in _FIRST),
    *(f"{m}/{n}" for m in MODELS for n in _THEN),
    "resnet50/packer-threads",
    *(f"decode/{n}" for n in (*_LOADERS, "packer-threads-half") if n not in _FIRST),
    "trace",
    "train_example",
]
# Any of them, and each model with each loader (--cases).
CASES = {*ORDER, *(f"{m}/{n}" for m in MODELS for n in _LOADERS)}


# -- the page ----------------------------------------------------------------------------

REPORT = reporting.DOCS / "gpu.json"
NAMES = {
    "packer": "packer, `size=(224, 224)`",
    "packer-threads": 'packer, `decode_in="threads"`',
    "packer-augment": "packer, `augment=` crop + flip",
    "dataloader": "DataLoader over the folder, crop + flip",
    "packer-workers": "packer's TorchDataset in DataLoader workers, crop + flip",
    "nvjpeg": "nvJPEG on the GPU (torchvision), `size` 224",
}
CPU_LOADERS = ("packer", "packer-threads", "packer-augment", "dataloader", "packer-workers")


def compact(timeline: dict[str, Any]) -> dict[str, Any]:
    """What the picture needs of a trace's timeline: the training stream's busy spans (gaps
    under 20 us closed) and the copies, in milliseconds."""
    training = _training_stream(timeline)
    spans = _merged(timeline["kernels"][training], gap=20.0) if training else []
    return {
        "training": [[round(a / 1e3, 3), round(b / 1e3, 3)] for a, b in spans],
        "copies": [
            [round(c["start"] / 1e3, 3), round(c["end"] / 1e3, 3)] for c in timeline["copies"]
        ],
    }


def collect(folders: list[Path]) -> list[dict[str, Any]]:
    """Each run's gpu.json, its trace's timeline folded in, as docs/benchmarks/gpu.json keeps
    them (the newest run first)."""
    reports = []
    for folder in folders:
        report = json.loads((folder / "gpu.json").read_text())
        timeline = folder / "timeline.json"
        if timeline.is_file() and "trace" in report:
            report["trace"]["timeline"] = compact(json.loads(timeline.read_text()))
        reports.append(report)
    return reports


def render(given: list[Path]) -> None:
    """The page from run folders (saved to docs/benchmarks/gpu.json), or from that file."""
    if len(given) == 1 and given[0].is_file():
        reports = json.loads(given[0].read_text())
    else:
        reports = collect(given)
        reporting.write(REPORT, json.dumps(reports) + "\n")
    timeline = (reports[0].get("trace") or {}).get("timeline")
    drawn = timeline is not None and draw_timeline(timeline, PICTURE)
    reporting.write(PAGE, page(reports, drawn))
    print(f"wrote {PAGE}" + (f" and {PICTURE}" if drawn else ""))


def last(case: dict[str, Any]) -> dict[str, Any]:
    """A case's last epoch: the first one includes starting (workers, cudnn's choices)."""
    return case["epochs"][-1]


def rate(report: dict[str, Any], key: str) -> int | None:
    case = report.get(key)
    return last(case)["images_per_s"] if case else None


def decode_limit(report: dict[str, Any]) -> int:
    """The most images/s any CPU loader fed, alone, in its last epoch: the CPUs' limit."""
    return max(rate(report, f"decode/{n}") or 0 for n in CPU_LOADERS)


def process_us(report: dict[str, Any], name: str) -> int | None:
    """CPU microseconds of the training process per image, loader ``name`` alone, in its last
    epoch (runs from before the figure was kept have none)."""
    case = report.get(f"decode/{name}")
    epoch = last(case) if case else {}
    if "cpu_s" not in epoch or not epoch["images"]:
        return None
    return round(epoch["cpu_s"] / epoch["images"] * 1e6)


def training_table(report: dict[str, Any], model: str, names: dict[str, str] | None = None) -> str:
    base = rate(report, f"{model}/dataloader")
    names = names or NAMES
    with_cpu = any(process_us(report, name) is not None for name in names)
    rows = []
    for name, label in names.items():
        case = report.get(f"{model}/{name}")
        if not case:
            continue
        epochs = case["epochs"]
        alone = rate(report, f"decode/{name}")
        waited = last(case).get("reader_wait_share", last(case)["wait_share"])
        row = [
            label,
            f"{epochs[0]['images_per_s']:,}",
            f"{last(case)['images_per_s']:,}",
            f"{waited:.1%}",
            "-" if alone is None else f"{alone:,}",
        ]
        if with_cpu:
            row.append(str(process_us(report, name) or "-"))
        row.append(f"{last(case)['images_per_s'] / base:.2f}" if base else "-")
        rows.append(row)
    columns = [
        "loader",
        "epoch 1 (images/s)",
        "epoch 2 (images/s)",
        "waiting for data, epoch 2",
        "loader alone (images/s)",
        *(["training process alone (CPU µs/image)"] if with_cpu else []),
        "x DataLoader",
    ]
    return reporting.table(columns, rows)


def cpus_bound(report: dict[str, Any]) -> bool:
    """Whether the CPUs decode fewer images a second than the GPU trains ResNet-50 on: then
    they, not the GPU, bound training, whatever the loader."""
    return decode_limit(report) < report["resnet50/limit"]


def goals(report: dict[str, Any]) -> list[dict[str, Any]]:
    packer = last(report["resnet50/packer"])
    dataloader = rate(report, "resnet50/dataloader") or 1
    waited = packer.get("reader_wait_share", packer["wait_share"])
    # Training can reach the lower of the GPU's rate and what the CPUs decode.
    bound, reach = (
        ("the CPUs' decode limit", decode_limit(report))
        if cpus_bound(report)
        else ("the GPU's limit", report["resnet50/limit"])
    )
    return [
        {
            "name": "ResNet-50: packer's wait_share, where the CPUs could feed the GPU",
            "ratio": waited,
            "target": WAIT_GOAL,
            "pass": None if cpus_bound(report) else waited < WAIT_GOAL,
        },
        {
            "name": f"ResNet-50: packer training / {bound}",
            "ratio": packer["images_per_s"] / reach,
            "target": DECODE_GOAL,
            "lower": False,
            "pass": packer["images_per_s"] / reach >= DECODE_GOAL,
        },
        {
            "name": "ResNet-50: packer / DataLoader, training (the loader bounds both)",
            "ratio": packer["images_per_s"] / dataloader,
            "target": LOADER_GOAL,
            "lower": False,
            "pass": packer["images_per_s"] / dataloader >= LOADER_GOAL,
        },
    ]


def page(reports: list[dict[str, Any]], drawn: bool) -> str:
    now = reports[0]
    m = now["machine"]
    on = (
        f"{m['gpu']} ({m['gpu_memory_gb']} GB), {m['cores']} cores of {m['cpu']}, "
        f"{m['memory_gb']} GB memory; torch {m['torch']} (CUDA {m['cuda']}), "
        f"torchvision {m['torchvision']}, Python {m['python']}"
    )
    command = "python benchmarks/bench_gpu.py --out OUT, then --render OUT"
    text = reporting.header("Training on a GPU", command, on=on, date=m["date"])
    d = now["data"]
    limit50, cpus = now["resnet50/limit"], decode_limit(now)
    text += (
        f"{d['photos']:,} ImageNet-like JPEGs (300-480 x 400-640 px, {d['store_gb']} GB packed "
        "to LMDB, in the page cache), torchvision's ResNet-50, bfloat16 autocast, "
        "channels-last, SGD, batches of 256 at 224 x 224, two epochs per loader, each loader "
        "in turn in one process. The images/s of a training epoch include the GPU's work: "
        "the loop synchronises at each epoch's end.\n\n"
        f"**What bounds it.** The GPU trains ResNet-50 at {limit50:,} images/s on a batch "
        f"already in its memory. The {m['cores']} cores decode and resize at most "
        f"{cpus:,} images/s alone (the best CPU loader below, no training): "
        + (
            "more than the GPU trains on, so training can reach the GPU's rate, and the goals "
            "that apply are packer's wait_share and its training rate against that limit.\n\n"
            if not cpus_bound(now)
            else "the CPUs bound training here, whatever the loader, and wait_share cannot "
            "reach 2% at the GPU's rate. The goal that applies is packer's training rate "
            "against that decode limit.\n\n"
        )
    )
    text += "## ResNet-50\n\n" + training_table(now, "resnet50")
    text += (
        'waiting for data: reader.stats()["wait_share"] for packer, the share of the epoch '
        "spent in next() for the others. loader alone: the same loader, batches copied to the "
        "GPU and nothing trained"
        + (
            "; training process alone: CPU time of the training process itself (every thread, "
            "not the loader's worker processes) per image, in that run"
            if any(process_us(now, name) is not None for name in NAMES)
            else ""
        )
        + ".\n\n"
    )
    text += reporting.goals(goals(now))
    text += findings(now)
    text += trace_section(now, drawn)
    if "resnet18/limit" in now:
        text += (
            f"## ResNet-18\n\nThe same loaders, the GPU's limit {now['resnet18/limit']:,} "
            "images/s:\n\n" + training_table(now, "resnet18")
        )
    text += example_section(now)
    return text


def findings(report: dict[str, Any]) -> str:
    threads = rate(report, "resnet50/packer-threads")
    packer = rate(report, "resnet50/packer") or 0
    half = rate(report, "decode/packer-threads-half")
    full = rate(report, "decode/packer-threads")
    gpu = rate(report, "decode/nvjpeg")
    lines = ["## Findings\n"]
    if threads:
        lines.append(
            f"- **Decoding in processes.** With {report['machine']['cores']} decode threads "
            f"in the training process, ResNet-50 trained at {threads:,} images/s; with the "
            f"same work in worker processes, {packer:,} ({packer / threads:.2f}x). The "
            "threads take turns at the GIL for a sliver of each image, and the training loop, "
            "which queues the GPU's kernels from Python, waits its turn among them."
            + (
                f" Alone, half as many threads decode {half:,} images/s and all of them "
                f"{full:,}: past about eight, threads add turns, not speed."
                if half and full
                else ""
            )
            + " The threads' wait_share reads 0%: the loop, not the data, was late. From 8 "
            "decode workers on, the reader decodes in processes by default where each image "
            "comes back at most 256 x 256 (`size=`, `augment=`).\n"
        )
    if gpu:
        lines.append(
            f"- **Decoding on the GPU.** nvJPEG (torchvision.io.decode_jpeg on the GPU, "
            f"a thread and a stream of its own, the CPUs only reading) decodes and resizes "
            f"{gpu:,} images/s alone, {gpu / decode_limit(report):.2f}x the CPUs' limit; "
            f"feeding ResNet-50, whose GPU time it shares, it trained at "
            f"{rate(report, 'resnet50/nvjpeg') or 0:,} images/s. These steps are now "
            "`packer.gpu_decode.decode_on_gpu`.\n"
        )
    return "\n".join(lines) + "\n"


def trace_section(report: dict[str, Any], drawn: bool) -> str:
    t = report.get("trace") or {}
    if not t.get("copies"):
        return ""
    busy = t["training_stream_busy_share"]
    if busy >= 0.9:
        gaps = "These steps ran on batches the reader had ready, so the GPU ran at its own rate."
    elif cpus_bound(report):
        gaps = (
            "Decoding bounded these steps, as it bounds the epochs above: the gaps in the "
            "training stream are the GPU waiting for the CPUs' next batch, not for its copy."
        )
    else:
        gaps = (
            "The gaps in the training stream are neither its copy nor data late (the reader's "
            "wait_share above): the loop that queues its kernels was late."
        )
    text = (
        "## The copy beside the step\n\n"
        "A torch.profiler trace of four ResNet-50 steps fed by packer (`pin_memory=True, "
        'device="cuda"`): each batch (256 x 224 x 224 x 3 bytes, pinned) is copied to the '
        f"GPU on stream {', '.join(t['copy_streams'])} while the training kernels run on "
        f"stream {t['training_stream']}. {t['copies']} copies of {t['copy_ms_mean']} ms each; "
        f"{t['copy_overlapped_share']:.0%} of their time the training stream was busy beside "
        f"them, and it was busy {busy:.0%} of the traced steps. The training stream waits "
        "only for its own batch's copy (an event), never for the copy stream as a whole. "
        f"{gaps}\n\n"
    )
    if drawn:
        text += f"![GPU timeline]({PICTURE.name})\n\n"
    return text


def example_section(report: dict[str, Any]) -> str:
    example = report.get("train_example") or {}
    if not example.get("rows"):
        return ""
    text = f"## The example script\n\n`{example['command']}` (the demo set's small images):\n\n"
    return text + reporting.table(
        ["loader", "images/s", "waiting for data", "held-out accuracy"],
        [
            [
                r["loader"],
                f"{r['images_per_s']:,}",
                f"{r['wait_share']:.0%}",
                f"{r['heldout_accuracy']:.0%}",
            ]
            for r in example["rows"]
        ],
    )


def draw_timeline(timeline: dict[str, Any], path: Path) -> bool:
    """Two lanes: the training stream's kernels and the copy stream's batches."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"{path.name}: not drawn (pip install matplotlib)", file=sys.stderr)
        return False
    plt.rcParams["svg.hashsalt"] = "packer"
    figure, axes = plt.subplots(figsize=(8, 1.8))
    lanes = [
        ("training kernels", timeline["training"], "tab:blue"),
        ("batch copies", timeline["copies"], "tab:orange"),
    ]
    for row, (_, spans, colour) in enumerate(lanes):
        axes.broken_barh([(a, b - a) for a, b in spans], (row - 0.35, 0.7), color=colour)
    axes.set_yticks(range(len(lanes)), [name for name, _, _ in lanes])
    axes.set_xlabel("milliseconds")
    axes.spines[["top", "right"]].set_visible(False)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, metadata={"Date": None})
    plt.close(figure)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="run here: figures and the trace go to OUT")
    parser.add_argument(
        "--render",
        type=Path,
        nargs="+",
        help="write the page from run folders (the newest first), or from its gpu.json",
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/packer-bench-gpu"))
    parser.add_argument("--photos", type=int, default=20_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--budget-s", type=int, default=420, help="start no case after this")
    parser.add_argument(
        "--cases", help="only these, comma-separated: resnet18/nvjpeg,decode/packer,trace,..."
    )
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a smoke run, no figures"
    )
    args = parser.parse_args(argv)
    if args.render:
        render(args.render)
        return 0
    if args.out is None:
        parser.error("--out (run) or --render (page)")
    unknown = sorted(set(args.cases.split(",")) - CASES) if args.cases else []
    if unknown:
        parser.error(f"--cases: no such case {', '.join(unknown)}; one of {', '.join(ORDER)}")
    import torch

    global DEVICE, BATCH, SIZE
    DEVICE = args.device
    if DEVICE == "cpu":  # small enough for a CPU to train on in a minute
        BATCH, SIZE = 16, 64
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; nothing to measure", file=sys.stderr)
        return 0
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
