"""``open_reader``: batches from a store, read sequentially, reshuffled locally, prefetched.

    epoch plan (pure) -> read_window -> gather -> finish_batch (threads) -> [to torch / GPU]
                                                                          -> Prefetcher queue -> you

The producer side (reading, gathering, GPU copies) runs in one background thread; checks,
decoding and transforms run in a pool of ``workers`` threads; the training loop only takes
finished batches off a bounded queue. Store handles are opened lazily in the process that
reads, so a Reader pickles as its path and options and works in DataLoader workers.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from packer import epoch as plan
from packer.access import Store, open_manifest
from packer.batching import (
    Batch,
    Window,
    concat,
    finish_batch,
    gather,
    merge_batches,
    read_window,
    split_window,
)
from packer.errors import StoreError, UsageError
from packer.options import default_workers
from packer.prefetch import Prefetcher

__all__ = ["ReaderOptions", "Reader", "open_reader"]

log = logging.getLogger(__name__)

_CHUNK_BYTES = 32 << 20  # default chunk: about this many payload bytes per sequential read
# Readers with threads running, closed at exit while the interpreter is still whole: a daemon
# thread still inside h5py or Pillow when it is torn down can abort the process (seen in
# DataLoader workers abandoned mid-epoch).
_RUNNING: weakref.WeakSet[Reader] = weakref.WeakSet()


@atexit.register
def _close_running_readers() -> None:
    for reader in list(_RUNNING):
        reader.close()


@dataclass(frozen=True)
class ReaderOptions:
    batch_size: int
    shuffle: bool = True
    seed: int = 0
    chunk_size: int | None = None  # None: about 32 MB of payload, and at least 64 chunks
    buffer_chunks: int = 8
    prefetch: int = 4
    workers: int | None = None  # decode threads; None: all cores
    decode: bool = True
    transform: Callable[[Any], Any] | None = None
    collate: Callable[[list[Any]], Any] | None = None
    drop_last: bool = False
    rank: int | None = None
    world_size: int | None = None
    remainder: str = "drop"  # when records don't divide among ranks: drop / pad / uneven
    on_error: str = "raise"
    verify: bool = True
    mode: str | None = None  # colour mode to decode to; None: the store's own
    output: str = "numpy"  # or "torch"
    pin_memory: bool = False
    device: str | None = None
    with_paths: bool = False
    images: str | None = None  # a plain HDF5 file: the image array's path, where not clear
    labels: str | None = None  # ... and the label array's
    worker: tuple[int, int] | None = None  # (id, count) inside a DataLoader; set by packer.torch

    def __post_init__(self) -> None:
        positive = ("batch_size", "buffer_chunks", "prefetch", "chunk_size", "workers")
        for name in positive:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise UsageError(f"{name} must be a positive integer, not {value!r}")
        choices = {
            "on_error": ("raise", "skip"),
            "output": ("numpy", "torch"),
            "remainder": plan.REMAINDERS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise UsageError(
                    f"{name} must be one of {', '.join(allowed)}, not {getattr(self, name)!r}"
                )
        if (self.pin_memory or self.device) and self.output != "torch":
            raise UsageError("pin_memory and device need output='torch'")


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
        self._chunks = plan.chunk_spans(counts, self.chunk_size)
        self._store: Store | None = None
        self._store_pid = -1
        self._next_epoch = 0
        self._resume: tuple[int, int] | None = None  # (epoch, batches already delivered)
        self._active: Prefetcher[Any] | None = None
        self._position = (0, 0)  # (epoch, batches delivered in it)
        self._counters = _Counters()

    # -- the epoch plan ---------------------------------------------------------------

    def _parts(self) -> tuple[int, int, int, int]:
        worker, workers = self.options.worker or (0, 1)
        return self.rank, self.world_size, worker, workers

    def records_per_epoch(self) -> int:
        """Records this reader yields per epoch (its rank's share, its worker's part of it)."""
        rank, world, worker, workers = self._parts()
        share = plan.share_size(self.manifest.num_records, world, rank, self.options.remainder)
        return plan.share_size(share, workers, worker, "uneven")

    def __len__(self) -> int:
        n, b = self.records_per_epoch(), self.options.batch_size
        return n // b if self.options.drop_last else math.ceil(n / b)

    def _spans(self, epoch: int) -> list[plan.Span]:
        rank, world, worker, workers = self._parts()
        order = (
            plan.shuffled_chunks(self._chunks, self.options.seed, epoch)
            if self.options.shuffle
            else self._chunks
        )
        mine = plan.take_share(order, rank, world, self.options.remainder)
        return plan.take_share(mine, worker, workers, "uneven")

    # -- iteration --------------------------------------------------------------------

    def epoch(self, epoch: int) -> Iterator[tuple[Any, ...]]:
        """The batches of ``epoch``: (images, labels), or (images, labels, paths) with with_paths."""
        skip = 0
        if self._resume is not None and self._resume[0] == epoch:
            skip = self._resume[1]
        self._resume = None
        self._stop_active()
        stop = threading.Event()  # set when the prefetcher stops: decode threads give up early
        prefetcher: Prefetcher[Any] = Prefetcher(
            partial(self._produce, epoch, skip, stop),
            depth=self.options.prefetch,
            name="packer-prefetch",
            stop=stop,
        )
        self._active = prefetcher
        _RUNNING.add(self)
        self._position = (epoch, skip)
        self._counters = _Counters()  # figures are per epoch
        return self._consume(prefetcher, self._counters, epoch, skip)

    def _consume(
        self, prefetcher: Prefetcher[Any], counters: _Counters, epoch: int, delivered: int
    ) -> Iterator[tuple[Any, ...]]:
        # Its own prefetcher and counters: an abandoned epoch closed late never touches the
        # figures of the epoch that replaced it.
        try:
            for item in prefetcher:
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
            prefetcher.close()
            if self._active is prefetcher:
                self._active = None

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        """The next epoch (the first is 0, or the one a loaded state names)."""
        epoch = self._resume[0] if self._resume is not None else self._next_epoch
        return self.epoch(epoch)

    def _open_store(self) -> Store:
        if self._store is None or self._store_pid != os.getpid():
            self._store = Store(self.path, images=self.options.images, labels=self.options.labels)
            self._store_pid = os.getpid()
        return self._store

    def _produce(
        self, epoch: int, skip_batches: int, stop: threading.Event
    ) -> Iterator[tuple[Batch, Callable[[], None] | None]]:
        """Runs in the prefetch thread: read, gather, hand batches to the decode pool."""
        opts = self.options
        store = self._open_store()
        finish = partial(
            finish_batch,
            store=store,
            decode=opts.decode,
            mode=opts.mode or self.manifest.storage.mode,
            verify=opts.verify and self.manifest.storage.checksums,
            on_error=opts.on_error,
            transform=opts.transform,
            collate=opts.collate,
            stop=stop,
        )
        mover = _gpu_mover(opts)
        workers = opts.workers or default_workers()
        # Decoded batches are split among the threads, so even the first batch of an epoch,
        # which nothing can prefetch, is ready in 1/workers of the time. Raw batches of one
        # shape need no decoding, and a user's collate wants the whole batch: not split.
        split = workers if opts.collate is None and self.manifest.storage.shape is None else 1
        # Raw pixels of one shape with no checksum, transform or collate to run are finished
        # once gathered: the pool would only add two thread hops per batch.
        ready = (
            self.manifest.storage.payload == "raw"
            and self.manifest.storage.shape is not None
            and not finish.keywords["verify"]
            and opts.transform is None
            and opts.collate is None
        )
        with ThreadPoolExecutor(workers, thread_name_prefix="packer-decode") as pool:
            pending: deque[list[Future[Batch]]] = deque()
            try:
                for window in self._gathered(store, epoch, skip_batches * opts.batch_size):
                    if ready:
                        yield mover(finish(window))
                        continue
                    pending.append(
                        [pool.submit(finish, part) for part in split_window(window, split)]
                    )
                    while len(pending) > workers:
                        yield mover(merge_batches([f.result() for f in pending.popleft()]))
                while pending:
                    yield mover(merge_batches([f.result() for f in pending.popleft()]))
            finally:
                for parts in pending:
                    for future in parts:
                        future.cancel()

    def _planned_windows(self, epoch: int) -> Iterator[tuple[list[plan.Span], np.ndarray]]:
        """This reader's share of ``epoch`` as shuffle windows: (spans, order of their records)."""
        rank, world, worker, workers = self._parts()
        stream = (self.options.seed, epoch, rank, world, worker, workers)
        for index, spans in enumerate(plan.windows(self._spans(epoch), self.options.buffer_chunks)):
            size = sum(len(s) for s in spans)
            shuffled = self.options.shuffle
            yield spans, plan.window_order(size, stream, index) if shuffled else np.arange(size)

    def record_order(self, epoch: int) -> np.ndarray:
        """Global indices of the records this reader yields in ``epoch``, in order; no I/O."""
        starts = self.manifest.shard_starts()
        parts = [np.zeros(0, np.int64)]
        for spans, order in self._planned_windows(epoch):
            ranges = [np.arange(starts[s.shard] + s.start, starts[s.shard] + s.stop) for s in spans]
            parts.append(np.concatenate(ranges)[order])
        return np.concatenate(parts)

    def _gathered(self, store: Store, epoch: int, skip: int) -> Iterator[Window]:
        """Batches of records in the epoch's order, not yet verified or decoded."""
        opts = self.options
        fixed = self.manifest.storage.shape if self.manifest.storage.payload == "raw" else None
        carry: list[Window] = []
        carried = 0
        rows: np.ndarray | None = None
        window: Window | None = None
        for spans, order in self._planned_windows(epoch):
            size = len(order)
            if skip >= size:  # resuming: whole windows before the resume point are not read
                skip -= size
                continue
            # Batches are gathered copies, so the last window's array is free to reuse; and
            # dropping the window before reading the next keeps one window alive, not two.
            reuse = (
                window.data if window is not None and isinstance(window.data, np.ndarray) else None
            )
            window = None
            window = read_window(store, spans, fixed, reuse)
            order = order[skip:]
            skip = 0
            start = 0
            while start < len(order):
                take = min(opts.batch_size - carried, len(order) - start)
                if fixed and rows is None:  # pixels of one shape: one batch array, filled in parts
                    rows = np.empty((opts.batch_size, *fixed), np.uint8)
                into = rows[carried : carried + take] if rows is not None else None
                carry.append(gather(window, order[start : start + take], into))
                carried += take
                start += take
                if carried == opts.batch_size:
                    yield concat(carry, rows)
                    carry, carried, rows = [], 0, None
        if carry and not opts.drop_last:
            yield concat(carry, None if rows is None else rows[:carried])

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
        if self._active is not None:
            self._active.close()
            self._active = None

    def close(self) -> None:
        self._stop_active()
        if self._store is not None and self._store_pid == os.getpid():
            self._store.close()
        self._store = None

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


class _Counters:
    """images/s, MB/s and the share of wall time the training loop spent waiting."""

    def __init__(self) -> None:
        self.batches = self.images = self.nbytes = self.skipped = 0
        self.started = time.perf_counter()
        self.stopped = 0.0
        self.wait_s = 0.0
        self.queue_fill = 0.0

    def add(self, batch: Batch) -> None:
        self.batches += 1
        self.images += len(batch.paths)
        self.skipped += batch.skipped
        self.nbytes += batch.nbytes

    def stop(self, prefetcher: Prefetcher[Any]) -> None:
        self.stopped = time.perf_counter()
        figures = prefetcher.stats()
        self.wait_s, self.queue_fill = figures["wait_s"], figures["queue_fill"]

    def snapshot(self, active: Prefetcher[Any] | None) -> dict[str, float]:
        end = time.perf_counter() if active is not None or not self.stopped else self.stopped
        if active is not None:
            figures = active.stats()
            self.wait_s, self.queue_fill = figures["wait_s"], figures["queue_fill"]
        elapsed = max(end - self.started, 1e-9) if self.started else 0.0
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


def _gpu_mover(opts: ReaderOptions) -> Callable[[Batch], tuple[Batch, Callable[[], None] | None]]:
    if opts.output != "torch":
        return lambda batch: (batch, None)
    from packer.torch_adapter import BatchMover

    return BatchMover(opts.pin_memory, opts.device)


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
