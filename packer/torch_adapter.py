"""PyTorch, optional: a store as an IterableDataset for DataLoader worker processes. Imported only
when asked for."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from packer.about import require_torch
from packer.errors import UsageError
from packer.reading.lanes import Phase
from packer.reading.options import ReaderOptions, rank_and_world
from packer.reading.reader import Reader, StorePaths

# Reached by importing TorchDataset: say what to install.
require_torch("packer.torch_adapter")
from torch.utils.data import IterableDataset, get_worker_info  # noqa: E402

__all__ = ["TorchDataset"]


class TorchDataset(IterableDataset):  # type: ignore[type-arg,unused-ignore]
    """A store as an IterableDataset for ``DataLoader(ds, batch_size=None, num_workers=N)``.

    Each worker process opens its own reader over its own part of this rank's share, so no
    record is read twice or skipped. Call ``set_epoch(e)`` before each epoch (as with
    DistributedSampler); without persistent workers, the workers see the new epoch. Rank and
    world size, unless given, are taken in this process when the dataset is made and at each
    ``set_epoch`` (from torch.distributed, else RANK / WORLD_SIZE), never in a worker.

    ``path``, ``weights`` and ``epoch_size`` are as for ``open_reader``: a list of stores is
    read as a mixture. ``state_dict(batches, num_workers)`` and ``load_state_dict`` resume
    mid-epoch, on any number of ranks and workers.
    """

    def __init__(
        self,
        path: StorePaths,
        *,
        batch_size: int,
        weights: Sequence[float] | Mapping[str, float] | None = None,
        epoch_size: int | None = None,
        **options: Any,
    ) -> None:
        self.path = path
        self._mix: dict[str, Any] = {"weights": weights, "epoch_size": epoch_size}
        self.options = ReaderOptions(batch_size=batch_size, **options)
        if self.options.decode_in == "processes":
            raise UsageError(
                "decode_in='processes' cannot run inside DataLoader workers (daemonic processes "
                "may not start processes); the DataLoader's workers already decode in parallel"
            )
        # Validate the stores and options now, not in a worker.
        self._reader(self.options).close()
        self._given_ranks = (self.options.rank, self.options.world_size)
        self._settle_ranks()
        self.epoch = 0
        self._resume: dict[str, Any] | None = None  # a loaded state, for its epoch

    def _reader(self, options: ReaderOptions) -> Reader:
        return Reader(self.path, options, **self._mix)

    def _settle_ranks(self) -> None:
        # Rank and world size are found in this process, where torch.distributed is
        # initialised: a spawned worker has no process group and would read the whole store
        # as rank 0 of 1.
        rank, world = rank_and_world(*self._given_ranks)
        self.options = replace(self.options, rank=rank, world_size=world)

    def set_epoch(self, epoch: int) -> None:
        """Iterate epoch ``epoch`` next (call it each epoch, as with DistributedSampler)."""
        self.epoch = epoch
        self._settle_ranks()  # again: the process group may have been initialised since

    def state_dict(self, batches: int, num_workers: int) -> dict[str, Any]:
        """The state after the training loop took ``batches`` batches of the current epoch
        (since it began, or since ``load_state_dict`` resumed it) from a DataLoader with
        ``num_workers`` workers (which hands out the workers' batches
        in turn, as it does by default). Load it, on any number of ranks and workers, with
        ``load_state_dict``."""
        options = replace(self.options, worker=(0, max(1, num_workers)))
        before: tuple[Phase, ...] = ()
        with self._reader(options) as reader:
            if self._resume is not None and self._resume["epoch"] == self.epoch:
                reader.load_state_dict(self._resume)
                before = reader._resume[1] if reader._resume is not None else ()
            return reader.state_after(self.epoch, (*before, Phase(reader.layout, batches)))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state`` (from ``state_dict``, or a Reader's): the epoch it names comes
        next, without the records already had; call ``set_epoch`` with ``state["epoch"]``
        (``self.epoch`` is set to it here)."""
        with self._reader(self.options) as reader:
            reader.load_state_dict(state)  # refused here, in the training process, if wrong
        self._resume = state
        self.epoch = int(state["epoch"])

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        info = get_worker_info()
        # One epoch per reader here: nothing would use batches prefetched for the next.
        options = replace(self.options, across_epochs=False)
        if info is not None:
            # Each DataLoader worker is a process of its own: one decode thread each by default.
            options = replace(
                options, worker=(info.id, info.num_workers), workers=options.workers or 1
            )
        with self._reader(options) as reader:
            if self._resume is not None and self._resume["epoch"] == self.epoch:
                reader.load_state_dict(self._resume)
            yield from reader.epoch(self.epoch)
