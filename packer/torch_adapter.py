"""PyTorch, optional: tensors, pinned memory and copies to the GPU that overlap the training
step, and an IterableDataset for DataLoader worker processes. Imported only when asked for."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from packer.about import install_hint
from packer.batching import Batch
from packer.reader import Reader, ReaderOptions, rank_and_world

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ModuleNotFoundError as e:
    if e.name != "torch":
        raise
    # Reached by output="torch" and by importing TorchDataset: say what to install.
    raise ModuleNotFoundError(
        f"output='torch' and packer.torch_adapter need PyTorch: {install_hint('torch')}",
        name="torch",
    ) from None

__all__ = ["BatchMover", "TorchDataset"]

log = logging.getLogger(__name__)


def _tensor(value: Any) -> Any:
    if isinstance(value, list):
        return [_tensor(v) for v in value]
    return torch.from_numpy(value) if hasattr(value, "__array_interface__") else value


class BatchMover:
    """Runs in the prefetch thread: NumPy -> tensors -> pinned -> device, on a side stream.

    For CUDA the copy is queued on a stream of its own with ``non_blocking=True`` from pinned
    memory, so it overlaps the training step; the returned ``ready`` callable, run by the
    consumer before it hands the batch out, makes the training stream wait for that copy
    (and tells the caching allocator the tensors are used there).
    """

    def __init__(self, pin_memory: bool, device: str | None) -> None:
        self.device = torch.device(device) if device else None
        cuda = self.device is not None and self.device.type == "cuda"
        self.pin = pin_memory and torch.cuda.is_available()
        if pin_memory and not self.pin:
            log.warning("pin_memory=True ignored: no CUDA device is available")
        self.stream = torch.cuda.Stream(self.device) if cuda else None

    def __call__(self, batch: Batch) -> tuple[Batch, Callable[[], None] | None]:
        images, labels = _tensor(batch.images), torch.from_numpy(batch.labels)
        if self.pin:
            images = (
                [i.pin_memory() for i in images]
                if isinstance(images, list)
                else images.pin_memory()
            )
            labels = labels.pin_memory()
        if self.stream is None:
            if self.device is not None:
                images = (
                    [i.to(self.device) for i in images]
                    if isinstance(images, list)
                    else images.to(self.device)
                )
                labels = labels.to(self.device)
            return replace(batch, images=images, labels=labels), None
        with torch.cuda.stream(self.stream):
            images = (
                [i.to(self.device, non_blocking=True) for i in images]
                if isinstance(images, list)
                else images.to(self.device, non_blocking=True)
            )
            labels = labels.to(self.device, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(self.stream)

        def ready() -> None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(copied)
            for tensor in images if isinstance(images, list) else [images]:
                tensor.record_stream(current)
            labels.record_stream(current)

        return replace(batch, images=images, labels=labels), ready


class TorchDataset(IterableDataset):  # type: ignore[type-arg,unused-ignore]
    """A store as an IterableDataset for ``DataLoader(ds, batch_size=None, num_workers=N)``.

    Each worker process opens its own reader over its own part of this rank's share, so no
    record is read twice or skipped. Call ``set_epoch(e)`` before each epoch (as with
    DistributedSampler); without persistent workers, the workers see the new epoch. Rank and
    world size, unless given, are taken in this process when the dataset is made and at each
    ``set_epoch`` (from torch.distributed, else RANK / WORLD_SIZE), never in a worker.
    """

    def __init__(self, path: Path | str, *, batch_size: int, **options: Any) -> None:
        self.path = Path(path)
        self.options = ReaderOptions(batch_size=batch_size, **options)
        Reader(self.path, self.options)  # validate the store and options now, not in a worker
        self._given_ranks = (self.options.rank, self.options.world_size)
        self._settle_ranks()
        self.epoch = 0

    def _settle_ranks(self) -> None:
        # Rank and world size are found in this process, where torch.distributed is
        # initialised: a spawned worker has no process group and would read the whole store
        # as rank 0 of 1.
        rank, world = rank_and_world(*self._given_ranks)
        self.options = replace(self.options, rank=rank, world_size=world)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._settle_ranks()  # again: the process group may have been initialised since

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        info = get_worker_info()
        # One epoch per reader here: nothing would use batches prefetched for the next.
        options = replace(self.options, across_epochs=False)
        if info is not None:
            # Each DataLoader worker is a process of its own: one decode thread each by default.
            options = replace(
                options, worker=(info.id, info.num_workers), workers=options.workers or 1
            )
        with Reader(self.path, options) as reader:
            yield from reader.epoch(self.epoch)
