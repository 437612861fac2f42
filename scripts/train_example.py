#!/usr/bin/env python3
"""Train a small CNN from a packer store, and feed the same loop other ways to compare.

    python scripts/train_example.py                    # demo data, packer's reader, 8 epochs
    python scripts/train_example.py --loader all       # every loader in turn, then a table
    python scripts/train_example.py --store train.lmdb --heldout val.lmdb --epochs 20
    python scripts/train_example.py --device cuda --pin-memory --model large --image-size 64

Without --store, the demo set (scripts/make_demo_data.py) is generated twice with different
seeds, a training folder and a held-out folder, checked disjoint (no file of one has the bytes
of a file of the other), and both are packed; all of it is cached under --workdir. The
loaders give the same images, decoded upright in RGB; training images get the standard
augmentation (a RandomResizedCrop to --image-size and a random horizontal flip; packer's
reader runs packer.augment's, the folder loaders draw the same kind of crop with Pillow;
--no-augment: resized whole instead), held-out images are resized to --image-size:

  packer      open_reader over the store of original bytes; decode + resize in its threads
  packer-raw  open_reader over a store packed with --raw --size SxS --fit stretch
  packer-workers  the store of original bytes through DataLoader worker processes
  dataloader  a torch DataLoader with --workers processes over an ImageFolder-style Dataset
  pillow      the baseline: each file opened and decoded in the training loop, one at a time

Each loader trains a fresh model from the same initial weights. Per epoch it prints the
loss, train and held-out accuracy, images/s (the training pass only) and the share of the
epoch the loop spent waiting for data: reader.stats()["wait_share"] for packer, the time
spent in next() for the others (for packer the two agree). With --json, one JSON object per
line. With --store, the folder loaders read the folder the store was packed from.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import shlex
import shutil
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from make_demo_data import make_demo_data
from PIL import Image, ImageOps
from torch import nn
from torch.utils.data import DataLoader, Dataset

from packer import PackOptions, open_reader, pack
from packer.arguments import default_workers
from packer.augment import RandomHorizontalFlip, RandomResizedCrop
from packer.store.access import open_manifest
from packer.torch_adapter import TorchDataset

LOADERS = ("packer", "packer-raw", "packer-workers", "dataloader", "pillow")
TRAIN_SEED, HELDOUT_SEED = 0, 1  # make_demo_data seeds: two sets of different pictures
Batches = Iterable[tuple[torch.Tensor, torch.Tensor]]


# -- the data: demo folders, stores, and where each loader reads ---------------------------


@dataclass(frozen=True)
class Sources:
    """What the loaders read: stores for packer, folders for the others (None: not there)."""

    train_store: Path
    heldout_store: Path | None
    train_dir: Path | None
    heldout_dir: Path | None
    classes: list[str]


def demo_folder(workdir: Path, name: str, per_class: int, seed: int) -> Path:
    folder = workdir / f"{name}-{per_class}"
    if not folder.is_dir():  # generated beside, then renamed: a folder there is complete
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)  # left by an interrupted run
        make_demo_data(partial, per_class=per_class, seed=seed)
        partial.rename(folder)
    return folder


def check_disjoint(train_dir: Path, heldout_dir: Path) -> None:
    """Held-out accuracy means nothing if a held-out image was trained on: compare bytes."""

    def digests(folder: Path) -> set[str]:
        return {
            hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
        }

    shared = digests(train_dir) & digests(heldout_dir)
    if shared:
        raise SystemExit(f"{len(shared)} held-out image(s) also in the training folder")


def packed(folder: Path, store: Path, raw_size: int | None = None) -> Path:
    """``folder`` packed into ``store``, once: a store with a manifest is complete."""
    if not (store / "manifest.json").exists():
        raw = {"raw": True, "size": (raw_size, raw_size), "fit": "stretch"} if raw_size else {}
        store.parent.mkdir(parents=True, exist_ok=True)
        pack(folder, store, PackOptions(seed=0, **raw))  # type: ignore[arg-type]
    return store


def class_names(store: Path) -> list[str]:
    columns = open_manifest(store).label_columns
    if not columns or not columns[0].get("classes"):
        raise SystemExit(f"{store}: needs class labels (a store packed with --labels folders)")
    return list(columns[0]["classes"])


def source_folder(store: Path | None) -> Path | None:
    """The folder a store was packed from, if it is still there."""
    if store is None:
        return None
    root = open_manifest(store).source.get("root")
    return Path(root) if root and Path(root).is_dir() else None


def prepare_sources(args: argparse.Namespace) -> Sources:
    if args.store is not None:
        train_dir, heldout_dir = source_folder(args.store), source_folder(args.heldout)
        return Sources(args.store, args.heldout, train_dir, heldout_dir, class_names(args.store))
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    train_dir = demo_folder(work, "train", args.per_class, TRAIN_SEED)
    heldout_dir = demo_folder(work, "heldout", args.heldout_per_class, HELDOUT_SEED)
    check_disjoint(train_dir, heldout_dir)
    train_store = packed(train_dir, work / f"{train_dir.name}.lmdb")
    heldout_store = packed(heldout_dir, work / f"{heldout_dir.name}.lmdb")
    return Sources(train_store, heldout_store, train_dir, heldout_dir, class_names(train_store))


# -- the loaders: each gives (uint8 N x S x S x 3, int64 N) tensor batches -----------------


def resized(image: Image.Image, size: int) -> np.ndarray:
    """The one preprocessing step every loader shares: RGB, stretched to size x size."""
    rgb = image.convert("RGB")
    if rgb.size != (size, size):
        rgb = rgb.resize((size, size), Image.Resampling.BILINEAR)
    return np.array(rgb)  # a writable copy: torch.from_numpy warns on Pillow's read-only view


def load_file(path: Path, size: int) -> np.ndarray:
    with Image.open(path) as image:
        return resized(ImageOps.exif_transpose(image), size)


class PixelsResized:
    """packer's ``transform``: runs in the reader's decode threads on each upright HWC array."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, pixels: np.ndarray) -> np.ndarray:
        return resized(
            Image.fromarray(pixels.squeeze(-1) if pixels.shape[-1] == 1 else pixels), self.size
        )


def augmented(path: Path, size: int, rng: np.random.Generator) -> np.ndarray:
    """The folder loaders' training augmentation, with Pillow: the crop box drawn as
    torchvision's RandomResizedCrop draws it, resized to size x size, flipped half the time."""
    with Image.open(path) as image:
        rgb = ImageOps.exif_transpose(image).convert("RGB")
    top, left, h, w = RandomResizedCrop(size).get_params(rgb.height, rgb.width, rng)
    crop = rgb.resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    pixels = np.array(crop)
    return np.ascontiguousarray(pixels[:, ::-1]) if rng.random() < 0.5 else pixels


class ImageFolderDataset(Dataset[tuple[torch.Tensor, int]]):
    """What torchvision's ImageFolder does: one folder per class, sorted names -> 0, 1, ...
    With ``augment``, each image is a random crop and flip (``augmented``), drawn from the
    process's own generator, as torchvision's transforms draw theirs."""

    def __init__(self, root: Path, size: int, augment: bool = False) -> None:
        self.classes = sorted(d.name for d in root.iterdir() if d.is_dir() and d.name[0] != ".")
        self.samples = [
            (path, label)
            for label, name in enumerate(self.classes)
            for path in sorted((root / name).rglob("*"))
            if path.is_file() and path.name[0] != "."
        ]
        self.size = size
        self.augment = augment
        self.rng = np.random.default_rng()

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        if self.augment:
            return torch.from_numpy(augmented(path, self.size, self.rng)), label
        return torch.from_numpy(load_file(path, self.size)), label


class Feed:
    """One loader over one data set: ``batches(epoch)``, and reader figures where it has them."""

    def batches(self, epoch: int) -> Batches:
        raise NotImplementedError

    def reader_stats(self) -> dict[str, float] | None:
        return None

    def close(self) -> None:
        pass


def pinned(args: argparse.Namespace) -> bool:
    """Pinned host memory only helps, and only works, for copies to a GPU."""
    return bool(args.pin_memory) and args.device.startswith("cuda")


def reader_options(store: Path, args: argparse.Namespace, shuffle: bool) -> dict[str, Any]:
    """open_reader's options, shared by the in-process reader and the DataLoader workers."""
    shape = open_manifest(store).storage.shape
    fits = shape is not None and shape[:2] == [args.image_size, args.image_size]
    options: dict[str, Any] = {
        "batch_size": args.batch_size,
        "shuffle": shuffle,
        "seed": args.seed,
        "mode": "RGB",
        "transform": None if fits else PixelsResized(args.image_size),
        "output": "torch",
    }
    if shuffle and args.augment:  # training: crops and flips drawn per (seed, epoch, record)
        options["augment"] = [RandomResizedCrop(args.image_size), RandomHorizontalFlip()]
        options["transform"] = None
    return options


class PackerFeed(Feed):
    """open_reader in this process: one prefetch thread, ``--workers`` decode threads."""

    def __init__(self, store: Path, args: argparse.Namespace, shuffle: bool) -> None:
        self.reader = open_reader(
            store,
            workers=args.workers,
            # The reader's prefetch thread copies each batch to the GPU from pinned memory.
            pin_memory=pinned(args),
            device=args.device if args.device.startswith("cuda") else None,
            **reader_options(store, args, shuffle),
        )

    def batches(self, epoch: int) -> Batches:
        return self.reader.epoch(epoch)

    def reader_stats(self) -> dict[str, float] | None:
        return self.reader.stats()

    def close(self) -> None:
        self.reader.close()


class PackerWorkersFeed(Feed):
    """The store through DataLoader worker processes (packer.torch_adapter.TorchDataset):
    decoding and resizing out of the training process's GIL."""

    def __init__(self, store: Path, args: argparse.Namespace, shuffle: bool) -> None:
        self.dataset = TorchDataset(store, **reader_options(store, args, shuffle))
        # Not persistent: a worker keeps the dataset it started with, so a new epoch needs
        # new workers to see set_epoch (a fork each, cheap next to an epoch).
        self.loader = DataLoader(
            self.dataset, batch_size=None, num_workers=args.workers, pin_memory=pinned(args)
        )

    def batches(self, epoch: int) -> Batches:
        self.dataset.set_epoch(epoch)
        return self.loader


class DataLoaderFeed(Feed):
    def __init__(self, folder: Path, args: argparse.Namespace, shuffle: bool) -> None:
        self.loader = DataLoader(
            ImageFolderDataset(folder, args.image_size, augment=shuffle and args.augment),
            batch_size=args.batch_size,
            shuffle=shuffle,
            num_workers=args.workers,
            pin_memory=pinned(args),
            persistent_workers=True,  # as one would train: workers live across epochs
            generator=torch.Generator().manual_seed(args.seed),
        )

    def batches(self, epoch: int) -> Batches:
        return self.loader


class PillowFeed(Feed):
    """The baseline: a shuffled list of files, each opened and decoded when the loop needs it."""

    def __init__(self, folder: Path, args: argparse.Namespace, shuffle: bool) -> None:
        self.dataset = ImageFolderDataset(folder, args.image_size, shuffle and args.augment)
        self.samples = self.dataset.samples
        self.args, self.shuffle = args, shuffle

    def batches(self, epoch: int) -> Batches:
        n, batch_size = len(self.samples), self.args.batch_size
        order = np.arange(n)
        if self.shuffle:
            order = np.random.default_rng([self.args.seed, epoch]).permutation(n)
        picked = [self.samples[i] for i in order]
        for start in range(0, n, batch_size):
            chunk = picked[start : start + batch_size]
            images = np.stack([self.dataset[int(i)][0].numpy() for i in order[start:][:batch_size]])
            yield torch.from_numpy(images), torch.tensor([label for _, label in chunk])


def make_feed(
    loader: str, sources: Sources, args: argparse.Namespace, heldout: bool
) -> Feed | None:
    """The loader over the training data, or over the held-out data (None: no such data)."""
    store = sources.heldout_store if heldout else sources.train_store
    folder = sources.heldout_dir if heldout else sources.train_dir
    if loader in ("packer", "packer-workers"):
        if store is None:
            return None
        feed = PackerFeed if loader == "packer" else PackerWorkersFeed
        return feed(store, args, shuffle=not heldout)
    if folder is None:
        return None
    if loader == "packer-raw":
        name = f"{folder.name}-raw{args.image_size}.lmdb"
        return PackerFeed(packed(folder, args.workdir / name, args.image_size), args, not heldout)
    baseline = DataLoaderFeed if loader == "dataloader" else PillowFeed
    return baseline(folder, args, shuffle=not heldout)


# -- the model and the loop ----------------------------------------------------------------


def conv_bn_relu(inputs: int, outputs: int, stride: int = 1) -> list[nn.Module]:
    return [
        nn.Conv2d(inputs, outputs, 3, stride, padding=1, bias=False),
        nn.BatchNorm2d(outputs),
        nn.ReLU(inplace=True),
    ]


def small_cnn(classes: int) -> nn.Module:
    """Three conv layers, 24k weights: about a second an epoch on two CPU cores."""
    return nn.Sequential(
        *conv_bn_relu(3, 16),
        nn.MaxPool2d(2),
        *conv_bn_relu(16, 32),
        nn.MaxPool2d(2),
        *conv_bn_relu(32, 64),
        nn.AdaptiveMaxPool2d(1),  # "is the shape anywhere": the demo shapes sit anywhere
        nn.Flatten(),
        nn.Linear(64, classes),
    )


class ResidualBlock(nn.Module):
    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            *conv_bn_relu(inputs, outputs, stride),
            nn.Conv2d(outputs, outputs, 3, padding=1, bias=False),
            nn.BatchNorm2d(outputs),
        )
        self.skip: nn.Module = nn.Identity()
        if stride != 1 or inputs != outputs:
            self.skip = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


def large_cnn(classes: int) -> nn.Module:
    """ResNet-18's shape (11M weights), for GPU runs; far too slow to train on a laptop CPU."""
    layers: list[nn.Module] = [*conv_bn_relu(3, 64)]
    width = 64
    for stage, outputs in enumerate((64, 128, 256, 512)):
        for block in range(2):
            layers.append(ResidualBlock(width, outputs, 2 if stage and not block else 1))
            width = outputs
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes))


def model_inputs(images: torch.Tensor, device: torch.device) -> torch.Tensor:
    """uint8 N x H x W x C (anywhere) -> float N x C x H x W in [0, 1] on ``device``."""
    x = images.to(device, non_blocking=True).permute(0, 3, 1, 2).float().div_(255)
    return x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x


class Waited:
    """Wraps an iterator and adds up the time spent in ``next()``: the loop waiting for data."""

    def __init__(self, batches: Batches) -> None:
        self.iterator = iter(batches)
        self.seconds = 0.0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        started = time.perf_counter()
        try:
            return next(self.iterator)
        finally:
            self.seconds += time.perf_counter() - started


@dataclass
class EpochResult:
    loader: str
    epoch: int
    loss: float
    train_accuracy: float
    heldout_accuracy: float | None
    images: int
    seconds: float  # the training pass alone, not the evaluation
    images_per_s: float
    wait_share: float  # of the training pass
    reader: dict[str, float] | None  # reader.stats() of the training pass (packer loaders)


def train_epoch(
    model: nn.Module, optimizer: torch.optim.Optimizer, feed: Feed, epoch: int, device: torch.device
) -> tuple[float, float, int, float, float]:
    """One pass: (mean loss, accuracy, images, seconds, seconds spent waiting for data)."""
    model.train()
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    seen = 0
    started = time.perf_counter()
    batches = Waited(feed.batches(epoch))
    for images, labels in batches:
        x, y = model_inputs(images, device), labels.to(device, non_blocking=True)
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        # Summed on the device: a .item() per step would make a GPU wait for every step.
        loss_sum += loss.detach() * len(y)
        correct += (logits.argmax(1) == y).sum()
        seen += len(y)
    total = loss_sum.item()  # the one synchronisation of the epoch
    seconds = time.perf_counter() - started
    return total / max(seen, 1), correct.item() / max(seen, 1), seen, seconds, batches.seconds


@torch.no_grad()
def accuracy(model: nn.Module, feed: Feed, device: torch.device) -> float:
    model.eval()
    correct = seen = 0
    for images, labels in feed.batches(0):
        logits = model(model_inputs(images, device))
        correct += int((logits.argmax(1).cpu() == labels.cpu()).sum())
        seen += len(labels)
    return correct / max(seen, 1)


class Trainee:
    """One loader feeding one model: its own feeds, weights, optimizer and results."""

    def __init__(
        self, loader: str, sources: Sources, args: argparse.Namespace, device: torch.device
    ) -> None:
        train_feed = make_feed(loader, sources, args, heldout=False)
        if train_feed is None:
            raise SystemExit(f"--loader {loader} needs the image folder the store was packed from")
        self.loader, self.train_feed, self.device = loader, train_feed, device
        self.heldout_feed = make_feed(loader, sources, args, heldout=True)
        torch.manual_seed(args.seed)  # every loader starts from the same weights
        build = large_cnn if args.model == "large" else small_cnn
        self.model = build(len(sources.classes)).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr)
        self.schedule = torch.optim.lr_scheduler.CosineAnnealingLR(self.optimizer, args.epochs)
        self.results: list[EpochResult] = []

    def epoch(self, epoch: int) -> EpochResult:
        figures = train_epoch(self.model, self.optimizer, self.train_feed, epoch, self.device)
        loss, train_acc, images, seconds, waited = figures
        self.schedule.step()
        stats = self.train_feed.reader_stats()
        wait_share = stats["wait_share"] if stats is not None else waited / seconds
        heldout = None
        if self.heldout_feed is not None:
            heldout = accuracy(self.model, self.heldout_feed, self.device)
        result = EpochResult(
            loader=self.loader,
            epoch=epoch,
            loss=loss,
            train_accuracy=train_acc,
            heldout_accuracy=heldout,
            images=images,
            seconds=seconds,
            images_per_s=images / seconds,
            wait_share=wait_share,
            reader=stats,
        )
        self.results.append(result)
        return result

    def close(self) -> None:
        for feed in (self.train_feed, self.heldout_feed):
            if feed is not None:
                feed.close()


def train_side_by_side(
    loaders: Iterable[str], sources: Sources, args: argparse.Namespace, device: torch.device
) -> list[Trainee]:
    """Every loader trains its model one epoch in turn, so a busy spell on a shared machine
    slows them all alike rather than the one that happened to be running."""
    trainees = [Trainee(loader, sources, args, device) for loader in loaders]
    try:
        for epoch in range(args.epochs):
            for trainee in trainees:
                report_epoch(trainee.epoch(epoch), args)
    finally:
        for trainee in trainees:
            trainee.close()
    return trainees


# -- reporting -----------------------------------------------------------------------------


def report_epoch(r: EpochResult, args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps({"kind": "epoch", **asdict(r)}), flush=True)
        return
    heldout = "-" if r.heldout_accuracy is None else f"{r.heldout_accuracy:.1%}"
    print(
        f"{r.loader:<10}  epoch {r.epoch + 1:>2}/{args.epochs}  loss {r.loss:.3f}  "
        f"train acc {r.train_accuracy:6.1%}  held-out acc {heldout:>6}  "
        f"{r.images_per_s:7,.0f} images/s  waiting for data {r.wait_share:4.0%}  ({r.seconds:.2f} s)",
        flush=True,
    )


def summary_row(results: list[EpochResult]) -> dict[str, Any]:
    """The first epoch apart (worker start-up, the first batch of a cold reader), then the
    fastest of the others: on a shared machine, the one least slowed by someone else."""
    fastest = min(results[1:], key=lambda r: r.seconds) if len(results) > 1 else None
    shown = fastest or results[0]  # rates and waiting: of that epoch (epoch 1 if alone)
    return {
        "loader": results[0].loader,
        "first_epoch_s": round(results[0].seconds, 2),
        "epoch_s": round(fastest.seconds, 2) if fastest else None,
        "images_per_s": round(shown.images_per_s),
        "wait_share": round(shown.wait_share, 3),
        "heldout_accuracy": results[-1].heldout_accuracy,
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| loader | epoch 1 (s) | fastest of epochs 2+ (s) | images/s | waiting for data | held-out acc |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        later, acc = row["epoch_s"], row["heldout_accuracy"]
        lines.append(
            f"| {row['loader']} | {row['first_epoch_s']:.2f} | {'-' if later is None else f'{later:.2f}'} | "
            f"{row['images_per_s']:,} | {row['wait_share']:.0%} | {'-' if acc is None else f'{acc:.1%}'} |"
        )
    return "\n".join(lines)


def describe_run(sources: Sources, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "kind": "run",
        "command": "python " + shlex.join(sys.argv),
        "machine": f"{default_workers()} cores usable, {platform.machine()}, "
        f"Python {platform.python_version()}, torch {torch.__version__}, {torch.get_num_threads()} torch threads",
        "device": args.device,
        "train_store": str(sources.train_store),
        "heldout_store": str(sources.heldout_store),
        "classes": len(sources.classes),
        "chance": round(1 / len(sources.classes), 3),
    }


# -- command line --------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loader", choices=(*LOADERS, "all"), default="packer")
    parser.add_argument("--store", type=Path, help="train on this store instead of the demo set")
    parser.add_argument("--heldout", type=Path, help="held-out store (none of --store's images)")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path("demo/train-example"),
        help="demo data and stores (cached)",
    )
    parser.add_argument("--per-class", type=int, default=200, help="demo training images per class")
    parser.add_argument(
        "--heldout-per-class", type=int, default=50, help="demo held-out images per class"
    )
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--image-size", type=int, default=32, help="images are resized to S x S")
    parser.add_argument(
        "--workers", type=int, default=2, help="packer: decode threads; DataLoader: processes"
    )
    parser.add_argument(
        "--torch-threads", type=int, help="torch's intra-op threads (default: torch's)"
    )
    parser.add_argument("--model", choices=("small", "large"), default="small")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument(
        "--pin-memory", action="store_true", help="pinned host memory for GPU copies"
    )
    parser.add_argument("--seed", type=int, default=0, help="weights and shuffling")
    parser.add_argument(
        "--no-augment",
        dest="augment",
        action="store_false",
        help="train on whole resized images, without random crops and flips",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args(argv)
    if args.heldout is not None and args.store is None:
        parser.error("--heldout goes with --store")
    for name in ("epochs", "batch_size", "image_size", "workers", "per_class", "heldout_per_class"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def check_device(name: str) -> torch.device:
    """Fail before any work when a GPU is asked for and torch cannot see one."""
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise SystemExit(f"--device {name}: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            f"--device {name}: torch {torch.__version__} sees no CUDA device (this build "
            f"{'has CUDA ' + torch.version.cuda if torch.version.cuda else 'is CPU-only'}); "
            "use --device cpu"
        )
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise SystemExit(f"--device {name}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    return device


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = check_device(args.device)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    sources = prepare_sources(args)
    run = describe_run(sources, args)
    print(
        json.dumps(run)
        if args.json
        else f"{run['command']}\n{run['machine']}; chance {run['chance']:.1%}"
    )
    loaders = LOADERS if args.loader == "all" else (args.loader,)
    rows = [summary_row(t.results) for t in train_side_by_side(loaders, sources, args, device)]
    if args.json:
        print(json.dumps({"kind": "summary", "rows": rows}))
    else:
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
