"""The prefetch thread's work: an epoch's batches, from the plan to finished batches.

    epoch plan (pure) -> read_window -> gather -> finish_batch (threads) -> [to torch / GPU]

A Producer holds what producing needs (options, manifest, the store's handles) and nothing
of the Reader that owns it: the thread references only the Producer, so a Reader dropped
without close() is still collected, and its finalizer stops the thread.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from packer.arguments import default_workers
from packer.imaging import decode as imaging
from packer.imaging import resizing
from packer.reading import epoch as plan
from packer.reading.batching import (
    Batch,
    Window,
    concat,
    finish_batch,
    gather,
    merge_batches,
    read_window,
    split_window,
)
from packer.reading.decode_procs import ProcessDecoder, choose, merge_parts
from packer.reading.readahead import (
    SUPPORTED,
    ReadAhead,
    auto_depth,
    memory_for_cache,
    store_bytes,
)
from packer.store.access import Store
from packer.store.base import Fetched
from packer.store.manifest import Manifest

if TYPE_CHECKING:
    from packer.reading.options import ReaderOptions

__all__ = ["Producer", "EPOCH_END"]

EPOCH_END = object()  # what a producer sends between one epoch's batches and the next's


class Producer:
    """Makes the batches of one reader's share of each epoch (its rank's, its worker's)."""

    def __init__(
        self,
        path: Path,
        options: ReaderOptions,
        manifest: Manifest,
        parts: tuple[int, int, int, int],
        chunk_size: int,
    ) -> None:
        self.path, self.options, self.manifest = path, options, manifest
        self.parts = parts  # rank, world size, worker, workers
        self._chunk_size = chunk_size
        self._chunks = plan.chunk_spans([s.num_records for s in manifest.shards], chunk_size)
        self._store: Store | None = None
        self._store_pid = -1
        # The window array an epoch last read into, for the next epoch's windows (_gathered).
        self._spare_windows: list[np.ndarray] = []
        self.decode_in = choose(options, manifest)  # "threads" or "processes"
        self._processes: ProcessDecoder | None = None
        # Whatever the threads will import, imported here: see imaging.load_plugins.
        imaging.load_plugins()
        if options.size is not None:
            resizing.load()
        if options.output == "torch":
            import packer.reading.to_torch  # noqa: F401

    def spans(self, epoch: int) -> list[plan.Span]:
        rank, world, worker, workers = self.parts
        order = (
            plan.shuffled_chunks(self._chunks, self.options.seed, epoch)
            if self.options.shuffle
            else self._chunks
        )
        mine = plan.take_share(order, rank, world, self.options.remainder)
        return plan.take_share(mine, worker, workers, "uneven")

    def epochs(self, epoch: int, skip_batches: int, stop: threading.Event) -> Iterator[Any]:
        """Runs in the prefetch thread: ``epoch``'s batches, a marker at its end, then (with
        across_epochs) the next epoch's, until the reader stops it."""
        while True:
            yield from self._produce(epoch, skip_batches, stop)
            yield EPOCH_END
            if not self.options.across_epochs:
                return
            epoch, skip_batches = epoch + 1, 0

    def _produce(
        self, epoch: int, skip_batches: int, stop: threading.Event
    ) -> Iterator[tuple[Batch, Callable[[], None] | None]]:
        """Runs in the prefetch thread: read, gather, hand batches to the decode pool."""
        opts = self.options
        store = self._open_store()
        given = self._finish_options()
        finish: Callable[[Window], Batch] = partial(finish_batch, store=store, stop=stop, **given)
        mover = _gpu_mover(opts)
        workers = opts.workers or default_workers()
        # Raw pixels of one shape are checked as they are read; with no
        # transform, resize or collate to run they are finished once gathered: the pool
        # would only add two thread hops per batch.
        raw = self.manifest.storage.payload == "raw" and self.manifest.storage.shape is not None
        ready = raw and opts.transform is None and opts.collate is None and opts.size is None
        # Batches with work per image are split among the threads, so even the first batch
        # of an epoch, which nothing can prefetch, is ready in 1/workers of the time; a
        # user's collate wants the whole batch.
        split = 1 if ready or opts.collate is not None else workers
        processes = None if ready else self.start_processes()
        with ThreadPoolExecutor(workers, thread_name_prefix="packer-decode") as pool:
            submit: Callable[[Window], Future[Batch]] = (
                processes.submit if processes else lambda part: pool.submit(finish, part)
            )
            pending: deque[list[Future[Batch]]] = deque()
            try:
                skip = skip_batches * opts.batch_size
                merge = partial(
                    merge_parts if processes else merge_batches, stack=opts.collate is None
                )
                for window in self._gathered(store, epoch, skip, given["verify"]):
                    if ready:
                        yield mover(merge([finish(window)]))
                        continue
                    pending.append([submit(part) for part in split_window(window, split)])
                    while len(pending) > workers:
                        yield mover(merge([f.result() for f in pending.popleft()]))
                while pending:
                    yield mover(merge([f.result() for f in pending.popleft()]))
            finally:
                for parts in pending:
                    for future in parts:
                        future.cancel()

    def planned_windows(self, epoch: int) -> Iterator[tuple[list[plan.Span], np.ndarray]]:
        """This reader's share of ``epoch`` as shuffle windows: (spans, order of their records)."""
        for index, spans in enumerate(plan.windows(self.spans(epoch), self.options.buffer_chunks)):
            yield spans, self._window_order(epoch, index, sum(len(s) for s in spans))

    def _window_order(self, epoch: int, index: int, size: int) -> np.ndarray:
        if not self.options.shuffle:
            return np.arange(size)
        rank, world, worker, workers = self.parts
        return plan.window_order(
            size, (self.options.seed, epoch, rank, world, worker, workers), index
        )

    def record_order(self, epoch: int) -> np.ndarray:
        """Global indices of the records this reader yields in ``epoch``, in order; no I/O."""
        starts = self.manifest.shard_starts()
        parts = [np.zeros(0, np.int64)]
        for spans, order in self.planned_windows(epoch):
            ranges = [np.arange(starts[s.shard] + s.start, starts[s.shard] + s.stop) for s in spans]
            parts.append(np.concatenate(ranges)[order])
        return np.concatenate(parts)

    def _gathered(self, store: Store, epoch: int, skip: int, verify: bool) -> Iterator[Window]:
        """Batches of records in the epoch's order, not yet decoded (raw pixels of one shape
        checked with ``verify`` as they are read, see read_window)."""
        opts = self.options
        fixed = self.manifest.storage.shape if self.manifest.storage.payload == "raw" else None
        groups = plan.windows(self.spans(epoch), opts.buffer_chunks)
        first = 0  # resuming: whole windows before the resume point are not read
        while first < len(groups) and skip >= sum(len(s) for s in groups[first]):
            skip -= sum(len(s) for s in groups[first])
            first += 1
        ahead = self._read_ahead([s for spans in groups[first:] for s in spans])
        taken = 0  # spans read so far
        carry: list[Window] = []
        carried = 0
        rows: np.ndarray | None = None
        window: Window | None = None
        # Batches are gathered copies, so a window's array is free to reuse once the next
        # window is due, and from one epoch to the next: a new one is page-faulted afresh,
        # which cost the reader bench's raw epochs of 3,000 records 12% (HDF5) to 19% (LMDB)
        # of their rate. Reused whole (its base): windows differ in length by a few records, and a
        # slice of the last one would soon be too short. Popped, not shared: the thread of an
        # abandoned epoch may still be running.
        try:
            array: np.ndarray | None = self._spare_windows.pop()
        except IndexError:
            array = None
        try:
            for index in range(first, len(groups)):
                spans = groups[index]
                order = self._window_order(epoch, index, sum(len(s) for s in spans))
                window = None  # one window alive at a time, not two
                fetched = partial(_take, ahead, taken) if ahead is not None else None
                taken += len(spans)
                window = read_window(store, spans, fixed, array, verify, fetched)
                if isinstance(window.data, np.ndarray):
                    array = window.data if window.data.base is None else window.data.base
                order = order[skip:]
                skip = 0
                start = 0
                while start < len(order):
                    take = min(opts.batch_size - carried, len(order) - start)
                    if fixed and rows is None:  # pixels of one shape: a batch array, in parts
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
        finally:
            if ahead is not None:
                ahead.close()
            if array is not None:
                self._spare_windows[:] = [array]

    def _read_ahead(self, spans: list[plan.Span]) -> ReadAhead | None:
        if not spans or not SUPPORTED or self.manifest.backend == "pytables":
            return None
        depth = self.options.read_ahead
        if depth is None:  # only where the page cache cannot serve the epoch
            memory = memory_for_cache()
            if store_bytes(self.path) <= memory:
                return None
            mean = (self.manifest.stats.get("payload_bytes") or {}).get("mean") or 0
            depth = auto_depth(self.options.buffer_chunks, self._chunk_size * mean, memory)
        return ReadAhead(self.path, spans, depth) if depth else None

    def _finish_options(self) -> dict[str, Any]:
        """finish_batch's keywords but the store and the stop event: what a batch's decode needs."""
        opts, storage = self.options, self.manifest.storage
        return {
            "decode": opts.decode,
            "mode": opts.mode or storage.mode,
            "verify": opts.verify and storage.checksums,
            "on_error": opts.on_error,
            "transform": opts.transform,
            "size": opts.size,
            "fit": opts.fit,
            "collate": opts.collate,
        }

    def start_processes(self) -> ProcessDecoder | None:
        """The pool of decode processes, where this reader decodes in processes: started
        once per process (a DataLoader worker forked from this one starts its own), kept for
        every epoch. The reader starts it from the thread that asks for an epoch, which
        usually lives as long as the process (see ProcessDecoder)."""
        if self.decode_in != "processes":
            return None
        if self._processes is None or self._processes.pid != os.getpid():
            workers = self.options.workers or default_workers()
            stack = self.options.collate is None
            self._processes = ProcessDecoder(
                workers, self.path, self.manifest, self._finish_options(), stack
            )
        return self._processes

    def _open_store(self) -> Store:
        if self._store is None or self._store_pid != os.getpid():
            self._store = Store(self.path, images=self.options.images, labels=self.options.labels)
            self._store_pid = os.getpid()
        return self._store

    def close(self) -> None:
        """Close the store's handles, if this process opened them (never a parent's)."""
        if self._store is not None and self._store_pid == os.getpid():
            self._store.close()
        self._store = None
        if self._processes is not None and self._processes.pid == os.getpid():
            self._processes.close()
        self._processes = None


def _take(ahead: ReadAhead, first: int, k: int) -> Fetched | None:
    return ahead.take(first + k)


def _gpu_mover(opts: ReaderOptions) -> Callable[[Batch], tuple[Batch, Callable[[], None] | None]]:
    if opts.output != "torch":
        return lambda batch: (batch, None)
    from packer.reading.to_torch import BatchMover

    return BatchMover(opts.pin_memory, opts.device)
