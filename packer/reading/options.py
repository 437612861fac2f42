"""What a reader is asked for: its options, checked once, and the defaults that depend on the
store (chunk size) or on the job (rank and world size)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from packer.arguments import check_workers
from packer.augment import Augment
from packer.errors import UsageError
from packer.imaging.decode import DEFAULT_MAX_PIXELS
from packer.imaging.resizing import FITS
from packer.reading import epoch as plan

__all__ = ["ReaderOptions", "rank_and_world", "default_chunk_size"]

_CHUNK_BYTES = 32 << 20  # default chunk: about this many payload bytes per sequential read


@dataclass(frozen=True)
class ReaderOptions:
    """Every option of a reader: ``open_reader(path, batch_size=..., **options)`` makes one,
    checked once. docs/reading.md says more of each.

    Attributes:
        batch_size: records per batch.
        shuffle: read in a seeded order (False: store order).
        seed: the epoch order is a pure function of (seed, epoch, rank, world size).
        chunk_size: records read in one sequential pass; None: about 32 MB of payload, and
            at least 64 chunks.
        buffer_chunks: chunks a shuffle window mixes; a mixture's stores share them.
        read_ahead: chunks whose bytes a thread reads ahead of the reader in large
            sequential requests (packer.reading.readahead); 0: none. None: the next window
            for a store larger than the memory available, or for one that fits but is
            mostly not in memory this epoch (a cold first epoch); none for one the page
            cache holds, where reading ahead would only add a copy.
        prefetch: finished batches kept ready.
        across_epochs: at an epoch's end, go on with the next one, so it starts at once.
        workers: decode threads or processes; None: all cores.
        decode_in: "threads" or "processes"; None: processes for a store of small images
            (its manifest's mean size) or with 8 workers or more for outputs of at most
            256x256 pixels (see packer.reading.decode_procs), threads otherwise and inside
            DataLoader workers.
        decode: False: the stored payloads as they are, not decoded.
        transform: run on each decoded HWC image, in the decode pool.
        collate: makes a batch of its images; None: one N×H×W×C array where they share a
            shape, else a list.
        drop_last: leave out a short last batch.
        rank: this process's rank; None: torch.distributed's, else $RANK, else 0.
        world_size: ranks in the job; None: as for ``rank``, else 1.
        remainder: records that do not divide among ranks: "drop", "pad" or "uneven".
        on_error: a damaged record "raise"s CorruptRecordError, or is "skip"ped and counted.
        verify: check every record's CRC-32.
        mode: colour mode to decode to, "RGB", "L" or "keep"; None: the store's own.
        size: resize every image to (height, width) as it is decoded (JPEGs at a reduced
            scale first, then packer.imaging.resizing).
        fit: how ``size`` fits an image of another shape: "crop", "pad" or "stretch".
        augment: steps from packer.augment (RandomResizedCrop, RandomHorizontalFlip, Resize,
            CenterCrop), run as each image is decoded, their draws keyed by (seed, epoch,
            record).
        output: "numpy" or "torch".
        pin_memory: torch batches in pinned memory.
        device: copy each torch batch there ("cuda") on a side stream, ahead of its step.
        with_paths: batches are (images, labels, paths).
        images: a plain HDF5 file: the image array's path, where it is not clear.
        labels: a plain HDF5 file: the label array's path.
        worker: (id, count) inside a DataLoader: set by TorchDataset, not by hand.
    """

    batch_size: int
    shuffle: bool = True
    seed: int = 0
    chunk_size: int | None = None
    buffer_chunks: int = 8
    read_ahead: int | None = None
    prefetch: int = 4
    across_epochs: bool = True
    workers: int | None = None
    decode_in: str | None = None
    decode: bool = True
    transform: Callable[[Any], Any] | None = None
    collate: Callable[[list[Any]], Any] | None = None
    drop_last: bool = False
    rank: int | None = None
    world_size: int | None = None
    remainder: str = "drop"
    on_error: str = "raise"
    verify: bool = True
    mode: str | None = None
    size: tuple[int, int] | None = None
    fit: str = "crop"
    augment: tuple[Any, ...] | None = None
    output: str = "numpy"
    pin_memory: bool = False
    device: str | None = None
    with_paths: bool = False
    images: str | None = None
    labels: str | None = None
    worker: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        positive = ("batch_size", "buffer_chunks", "prefetch", "chunk_size", "workers")
        for name in positive:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise UsageError(f"{name} must be a positive integer, not {value!r}")
        if self.workers is not None:
            check_workers(self.workers, f"workers={self.workers}")  # thousands would thrash
        ahead = self.read_ahead
        if ahead is not None and (not isinstance(ahead, int) or ahead < 0):
            raise UsageError(f"read_ahead must be a whole number of chunks, not {ahead!r}")
        choices = {
            "on_error": ("raise", "skip"),
            "output": ("numpy", "torch"),
            "remainder": plan.REMAINDERS,
            "fit": FITS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise UsageError(
                    f"{name} must be one of {', '.join(allowed)}, not {getattr(self, name)!r}"
                )
        if self.decode_in not in (None, "threads", "processes"):
            raise UsageError(
                f"decode_in must be threads, processes or None (chosen), not {self.decode_in!r}"
            )
        if self.size is not None:
            pair = isinstance(self.size, (tuple, list)) and len(self.size) == 2
            if not pair or not all(isinstance(v, int) and v > 0 for v in self.size):
                raise UsageError(f"size must be (height, width) in pixels, not {self.size!r}")
            if self.size[0] * self.size[1] > DEFAULT_MAX_PIXELS:
                raise UsageError(
                    f"size {tuple(self.size)} is {self.size[0] * self.size[1]:,} pixels, over "
                    f"the limit of {DEFAULT_MAX_PIXELS:,} the reader decodes an image to"
                )
            if not self.decode:
                raise UsageError("size needs decode=True: encoded bytes cannot be resized")
            object.__setattr__(self, "size", tuple(self.size))  # a list would not hash
        if self.augment is not None:
            steps = Augment(self.augment)  # checks them: one line for what is wrong
            if self.size is not None:
                raise UsageError("augment sets the output size: pass size or augment, not both")
            if not self.decode:
                raise UsageError("augment needs decode=True: encoded bytes cannot be cropped")
            object.__setattr__(self, "augment", steps.steps)  # a list would not hash
        if (self.pin_memory or self.device) and self.output != "torch":
            raise UsageError("pin_memory and device need output='torch'")

    @property
    def augmenting(self) -> Augment | None:
        """The ``augment`` steps, ready to run; None without any."""
        return None if self.augment is None else Augment(self.augment)


def rank_and_world(rank: int | None, world: int | None) -> tuple[int, int]:
    """Explicit values, else torch.distributed when initialised, else RANK / WORLD_SIZE."""
    if rank is None or world is None:
        found = _distributed()
        if found is None:
            found = (int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)))
        rank = found[0] if rank is None else rank
        world = found[1] if world is None else world
    if not 0 <= rank < world:
        raise UsageError(f"rank {rank} is out of range for world_size {world}")
    return rank, world


def _distributed() -> tuple[int, int] | None:
    import sys

    if "torch" not in sys.modules:  # never import torch just to ask
        return None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def default_chunk_size(stats: dict[str, Any], num_records: int) -> int:
    mean = (stats.get("payload_bytes") or {}).get("mean") or 100_000
    by_bytes = max(1, int(_CHUNK_BYTES // max(mean, 1)))
    return max(1, min(by_bytes, math.ceil(num_records / 64), 4096))
