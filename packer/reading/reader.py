"""``open_reader``: batches from a store, read sequentially, reshuffled locally, prefetched.

    Producer (packer.reading.produce, one background thread) -> Prefetcher queue -> Reader -> you

The producer side (reading, gathering, GPU copies) runs in one background thread; checks,
decoding and transforms run in a pool of ``workers`` threads; the training loop only takes
finished batches off a bounded queue. At an epoch's end the producer goes on with the next
epoch, so an epoch boundary costs the training loop no wait. Store handles are opened
lazily in the process that reads, so a Reader pickles as its path and options and works in
DataLoader workers.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import threading
import time
import weakref
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from packer.errors import StoreError, UsageError
from packer.prefetch import Prefetcher
from packer.reading import epoch as plan
from packer.reading.batching import Batch
from packer.reading.options import ReaderOptions, default_chunk_size, rank_and_world
from packer.reading.produce import EPOCH_END, Producer
from packer.store.access import open_manifest

__all__ = ["Reader", "open_reader"]

log = logging.getLogger(__name__)

# Readers with threads running, closed at exit while the interpreter is still whole: a daemon
# thread still inside h5py or Pillow when it is torn down can abort the process (seen in
# DataLoader workers abandoned mid-epoch).
_RUNNING: weakref.WeakSet[Reader] = weakref.WeakSet()


@atexit.register
def _close_running_readers() -> None:
    for reader in list(_RUNNING):
        reader.close()


def open_reader(path: Path | str, *, batch_size: int, **options: Any) -> Reader:
    """Open a store for training: an iterable of (images, labels) batches, one epoch per loop.

    Example::

        with open_reader("out.lmdb", batch_size=256, seed=0) as reader:
            for epoch in range(90):
                for images, labels in reader.epoch(epoch):
                    train_step(images, labels)

    See ``ReaderOptions`` and the README for every option.
    """
    return Reader(path, ReaderOptions(batch_size=batch_size, **options))


class Reader:
    """Iterates a store in batches. Not thread-safe: one epoch iterates at a time (starting
    another stops the previous one). ``close()`` or ``with`` stops the background threads."""

    def __init__(self, path: Path | str, options: ReaderOptions) -> None:
        self.path = Path(path)
        self.options = options
        self.manifest = open_manifest(self.path, options.images, options.labels)
        if self.manifest.backend != "pytables":
            # Before planning epochs from the counts: read_manifest bounded those by the size
            # of each shard file there is, so a missing one could claim any count.
            for info in self.manifest.shards:
                if not (self.path / info.file).exists():
                    raise StoreError(f"{self.path}: {info.file} is missing")
        self.rank, self.world_size = rank_and_world(options.rank, options.world_size)
        counts = [s.num_records for s in self.manifest.shards]
        self.chunk_size = options.chunk_size or default_chunk_size(self.manifest.stats, sum(counts))
        worker, workers = options.worker or (0, 1)
        self._producer = Producer(
            self.path,
            options,
            self.manifest,
            (self.rank, self.world_size, worker, workers),
            self.chunk_size,
        )
        self._next_epoch = 0
        self._resume: tuple[int, int] | None = None  # (epoch, batches already delivered)
        self._active: Prefetcher[Any] | None = None
        self._ahead: tuple[int, int] | None = None  # (epoch, skip) _active is producing ahead
        # _active's next item is the end of an epoch whose batches were all taken (a loop
        # that stopped after len(reader) batches without asking for more): pass over it.
        self._stale_end = False
        self._position = (0, 0)  # (epoch, batches delivered in it)
        self._counters = _Counters(None)

    # -- the epoch plan ---------------------------------------------------------------

    def records_per_epoch(self) -> int:
        """Records this reader yields per epoch (its rank's share, its worker's part of it)."""
        rank, world, worker, workers = self._producer.parts
        share = plan.share_size(self.manifest.num_records, world, rank, self.options.remainder)
        return plan.share_size(share, workers, worker, "uneven")

    def __len__(self) -> int:
        n, b = self.records_per_epoch(), self.options.batch_size
        return n // b if self.options.drop_last else math.ceil(n / b)

    def record_order(self, epoch: int) -> np.ndarray:
        """Global indices of the records this reader yields in ``epoch``, in order; no I/O."""
        return self._producer.record_order(epoch)

    # -- iteration --------------------------------------------------------------------

    def epoch(self, epoch: int) -> Iterator[tuple[Any, ...]]:
        """The batches of ``epoch``: (images, labels), or (images, labels, paths) with with_paths."""
        skip = 0
        if self._resume is not None and self._resume[0] == epoch:
            skip = self._resume[1]
        self._resume = None
        if self._active is None or self._ahead != (epoch, skip):
            # Nothing prefetched for this epoch (the first, a resume, an epoch skipped or
            # repeated, an epoch left before its end): start a producer here.
            self._stop_active()
            self._producer.start_processes()  # from this thread: see ProcessDecoder
            stop = threading.Event()  # set when the prefetcher stops: decode threads give up early
            self._active = Prefetcher(
                partial(self._producer.epochs, epoch, skip, stop),
                depth=self.options.prefetch,
                name="packer-prefetch",
                stop=stop,
            )
        stale_end, self._stale_end, self._ahead = self._stale_end, False, None
        _RUNNING.add(self)
        self._position = (epoch, skip)
        self._counters = _Counters(self._active)  # figures are per epoch
        return self._consume(self._active, self._counters, epoch, skip, stale_end)

    def _consume(
        self,
        prefetcher: Prefetcher[Any],
        counters: _Counters,
        epoch: int,
        delivered: int,
        stale_end: bool,
    ) -> Iterator[tuple[Any, ...]]:
        # Its own prefetcher and counters: an abandoned epoch closed late never touches the
        # figures of the epoch that replaced it.
        finished = False
        try:
            for item in prefetcher:
                if item is EPOCH_END and stale_end:
                    stale_end = False
                    continue
                if item is EPOCH_END:
                    finished = True
                    break
                batch, ready = item
                if ready is not None:
                    ready()  # the training stream waits for this batch's copy to the GPU
                delivered += 1
                self._position = (epoch, delivered)
                counters.add(batch)
                yield (
                    (batch.images, batch.labels, batch.paths)
                    if self.options.with_paths
                    else (batch.images, batch.labels)
                )
            self._next_epoch = epoch + 1
        finally:
            counters.stop(prefetcher)
            taken = not finished and delivered == len(self) > 0  # all but the end marker
            if taken:
                self._next_epoch = epoch + 1
            if (finished or taken) and self.options.across_epochs and self._active is prefetcher:
                self._ahead = (epoch + 1, 0)  # its producer is already on the next epoch
                self._stale_end = taken
            else:
                prefetcher.close()
                if self._active is prefetcher:
                    self._active = None

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        """The next epoch (the first is 0, or the one a loaded state names)."""
        epoch = self._resume[0] if self._resume is not None else self._next_epoch
        return self.epoch(epoch)

    # -- resume, stats, lifetime ------------------------------------------------------

    def state_dict(self) -> dict[str, int]:
        """Where iteration stands: load it into a new reader to resume at the next batch."""
        epoch, delivered = self._position
        if delivered >= len(self) and len(self) > 0:
            epoch, delivered = epoch + 1, 0
        return {"epoch": epoch, "batch": delivered, "seed": self.options.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("seed", self.options.seed) != self.options.seed:
            raise UsageError(
                f"state was saved with seed {state['seed']}, this reader has seed {self.options.seed}"
            )
        self._resume = (int(state["epoch"]), int(state["batch"]))
        self._next_epoch = int(state["epoch"])

    def stats(self) -> dict[str, float]:
        """Live figures of the current (or last) epoch: is training waiting for data?"""
        return self._counters.snapshot(self._active)

    def _stop_active(self) -> None:
        self._ahead, self._stale_end = None, False
        if self._active is not None:
            self._active.close()
            self._active = None

    def close(self) -> None:
        self._stop_active()
        self._producer.close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit the daemon threads just end
            self._stop_active()

    def __getstate__(self) -> dict[str, Any]:
        # A reader travels to DataLoader workers as its path, options and position only.
        return {
            "path": self.path,
            "options": self.options,
            "next_epoch": self._next_epoch,
            "resume": self._resume,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["options"])  # type: ignore[misc]
        self._next_epoch = state["next_epoch"]
        self._resume = state["resume"]


_NO_WAITS = {"wait_s": 0.0, "waits": 0, "fills": 0}


class _Counters:
    """images/s, MB/s and the share of wall time the training loop spent waiting, for one
    epoch (its prefetcher may have served the epoch before: its figures are differences)."""

    def __init__(self, prefetcher: Prefetcher[Any] | None) -> None:
        self.batches = self.images = self.nbytes = self.skipped = 0
        self.started = time.perf_counter()
        self.stopped = 0.0
        self.wait_s = self.queue_fill = 0.0
        self.counting = prefetcher is not None  # False: before the first epoch, all zeros
        # The prefetcher's running totals when this epoch started.
        self._base = prefetcher.stats() if prefetcher is not None else _NO_WAITS

    def add(self, batch: Batch) -> None:
        self.batches += 1
        self.images += len(batch.paths)
        self.skipped += batch.skipped
        self.nbytes += batch.nbytes

    def _read(self, prefetcher: Prefetcher[Any]) -> None:
        now, base = prefetcher.stats(), self._base
        waits = now["waits"] - base["waits"]
        self.wait_s = now["wait_s"] - base["wait_s"]
        self.queue_fill = (now["fills"] - base["fills"]) / waits if waits else 0.0

    def stop(self, prefetcher: Prefetcher[Any]) -> None:
        self.stopped = time.perf_counter()
        self._read(prefetcher)

    def snapshot(self, active: Prefetcher[Any] | None) -> dict[str, float]:
        if self.stopped:
            end = self.stopped
        else:
            end = time.perf_counter()
            if active is not None:
                self._read(active)
        elapsed = max(end - self.started, 1e-9) if self.counting else 0.0
        return {
            "batches": self.batches,
            "images": self.images,
            "skipped": self.skipped,
            "seconds": round(elapsed, 3),
            "images_per_s": round(self.images / elapsed, 1) if elapsed else 0.0,
            "mb_per_s": round(self.nbytes / 1e6 / elapsed, 1) if elapsed else 0.0,
            "wait_s": round(self.wait_s, 3),
            "wait_share": round(self.wait_s / elapsed, 3) if elapsed else 0.0,
            "queue_fill": round(self.queue_fill, 2),
        }
