"""PyTorch, optional: a store as an IterableDataset for DataLoader worker processes. Imported only
when asked for."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from packer.about import install_hint
from packer.errors import UsageError
from packer.reading.options import ReaderOptions, rank_and_world
from packer.reading.reader import Reader

try:
    from torch.utils.data import IterableDataset, get_worker_info
except ModuleNotFoundError as e:
    if e.name != "torch":
        raise
    # Reached by importing TorchDataset: say what to install.
    raise ModuleNotFoundError(
        f"packer.torch_adapter needs PyTorch: {install_hint('torch')}",
        name="torch",
    ) from None

__all__ = ["TorchDataset"]


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
        if self.options.decode_in == "processes":
            raise UsageError(
                "decode_in='processes' cannot run inside DataLoader workers (daemonic processes "
                "may not start processes); the DataLoader's workers already decode in parallel"
            )
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
