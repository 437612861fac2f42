"""The prefetch thread's work: an epoch's batches, from the plan to finished batches.

    lane (pure: packer.reading.lanes) -> a Cursor per store (packer.reading.cursor):
      read_window, gather -> finish_batch (threads or processes, per store) -> one batch
      -> [to torch / GPU]

A Producer holds what producing needs (options, manifests, the stores' handles) and nothing
of the Reader that owns it: the thread references only the Producer, so a Reader dropped
without close() is still collected, and its finalizer stops the thread.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from packer.arguments import default_workers
from packer.augment import source_seed
from packer.imaging import decode as imaging
from packer.imaging import resizing
from packer.reading import epoch as plan
from packer.reading.batch_memory import BatchMemory, BatchRows
from packer.reading.batching import (
    Batch,
    Stopped,
    Window,
    finish_batch,
    split_window,
)
from packer.reading.cursor import Cursor
from packer.reading.decode_procs import (
    ProcessDecoder,
    choose,
    image_bytes,
    merge_parts,
    part_bytes,
    payload_bytes,
)
from packer.reading.lanes import Lane, Layout, Phase, Planner
from packer.reading.readahead import (
    SUPPORTED,
    ReadAhead,
    auto_depth,
    memory_for_cache,
    share_not_in_memory,
    store_bytes,
)
from packer.store.access import Store
from packer.store.manifest import Manifest

if TYPE_CHECKING:
    from packer.reading.options import ReaderOptions

__all__ = ["Producer", "Source", "EPOCH_END"]

_STOP_POLL_S = 0.1  # how often a wait for a batch part looks at stop
# A store that fits in memory is read ahead when at least this share of it is not there:
# from the disk, reading ahead is what keeps the decode threads busy while a window is read;
# from memory, it only adds a copy. About where the two costs cross.
_MOSTLY_NOT_IN_MEMORY = 0.25
EPOCH_END = object()  # what a producer sends between one epoch's batches and the next's


@dataclass(frozen=True)
class Source:
    """One store a reader reads: its path and manifest."""

    path: Path
    manifest: Manifest
    chunk_size: int  # records per chunk, as the reader reads it

    @property
    def fixed_shape(self) -> tuple[int, ...] | None:
        """The one (h, w, c) of its records, for raw pixels of one shape; else None."""
        storage = self.manifest.storage
        if storage.payload == "raw" and storage.shape is not None:
            return tuple(storage.shape)
        return None


class Producer:
    """Makes the batches of one reader's lane of each epoch (its rank's share, its worker's
    part of it), from one store or a mixture of several."""

    def __init__(
        self,
        sources: list[Source],
        options: ReaderOptions,
        parts: tuple[int, int, int, int],
        planner: Planner,
    ) -> None:
        self.sources, self.options, self.planner = sources, options, planner
        self.parts = parts  # rank, world size, worker, workers
        self._stores: list[Store] | None = None
        self._store_pid = -1
        # Each store's window array of the last epoch, for the next epoch's windows (Cursor).
        self._spare_windows: list[list[np.ndarray]] = [[] for _ in sources]
        self._planned: tuple[Any, Lane] | None = None  # the last lane planned, and its key
        # Held while planning: the reader's thread and the prefetch thread ask for each new
        # epoch's lane at about the same moment, and the second waits for the first's.
        self._planning = threading.Lock()
        self._auto_depth: dict[Path, int] = {}  # read_ahead=None: the depth for each store
        # Each store's read-ahead of the epoch just gathered, left reading on into the next
        # epoch's first spans until that epoch starts and takes their bytes (see ReadAhead).
        self._reading_on: list[ReadAhead | None] = [None for _ in sources]
        # "threads" or "processes": processes where every store asks for them
        chosen = {choose(options, source.manifest) for source in sources}
        self.decode_in = "processes" if chosen == {"processes"} else "threads"
        self._processes: ProcessDecoder | None = None
        # Batches in the queue and in the pool's hands, and a few more: about as many as are
        # ever alive at once.
        workers = options.workers or default_workers()
        self._memory = BatchMemory(options.prefetch + workers + 2)
        # Whatever the threads will import, imported here: see imaging.load_plugins.
        imaging.load_plugins()
        if options.size is not None or options.augment is not None:
            resizing.load()
        if options.output == "torch":
            import packer.reading.to_torch  # noqa: F401

    @property
    def layout(self) -> Layout:
        return Layout(self.parts[1], self.parts[3], self.options.batch_size, self.options.drop_last)

    def lane(self, epoch: int, phases: tuple[Phase, ...] = ()) -> Lane:
        """What this reader yields of ``epoch`` after the ``phases`` already read (a resume)."""
        key = (epoch, phases)
        with self._planning:
            if self._planned is not None and self._planned[0] == key:
                return self._planned[1]
            rank, _, worker, _ = self.parts
            lane = self.planner.lane(epoch, phases, self.layout, rank, worker)
            self._planned = (key, lane)
            return lane

    def epochs(self, epoch: int, phases: tuple[Phase, ...], stop: threading.Event) -> Iterator[Any]:
        """Runs in the prefetch thread: ``epoch``'s batches (what is left of it after
        ``phases``), a marker at its end, then (with across_epochs) the next epoch's, until
        the reader stops it."""
        try:
            while True:
                yield from self._produce(self.lane(epoch, phases), stop, epoch)
                yield EPOCH_END
                if not self.options.across_epochs:
                    return
                epoch, phases = epoch + 1, ()
        finally:  # stopped between epochs: nothing will take what is read on
            for i, ahead in enumerate(self._reading_on):
                if ahead is not None:
                    ahead.close()
                self._reading_on[i] = None

    def _produce(
        self, lane: Lane, stop: threading.Event, epoch: int
    ) -> Iterator[tuple[Batch, Callable[[], None] | None]]:
        """Runs in the prefetch thread: read, gather, hand batches to the decode pool
        (``epoch``: what augmentation draws are keyed by, with seed and record)."""
        opts = self.options
        stores = self._open_stores()
        augment = opts.augmenting
        verify = [opts.verify and s.manifest.storage.checksums for s in self.sources]
        finish = [
            partial(
                finish_batch,
                store=store,
                decode=opts.decode,
                mode=opts.mode or source.manifest.storage.mode,
                verify=check,
                on_error=opts.on_error,
                transform=opts.transform,
                size=opts.size,
                fit=opts.fit,
                collate=opts.collate,
                stop=stop,
                augment=augment,
                seed=source_seed(opts.seed, k),
                epoch=epoch,
            )
            for k, (store, source, check) in enumerate(
                zip(stores, self.sources, verify, strict=True)
            )
        ]
        mover = _gpu_mover(opts)
        workers = opts.workers or default_workers()
        # Raw pixels of one shape (in every store) land in one batch array as they are
        # gathered; with no transform, resize or collate to run they are finished once
        # gathered: the pool would only add two thread hops per batch.
        shapes = {s.fixed_shape for s in self.sources}
        shared = shapes.pop() if len(shapes) == 1 else None
        ready = shared is not None and opts.transform is None and opts.collate is None
        ready = ready and opts.size is None and opts.augment is None
        # Batches with work per image are split among the threads, so even the first batch
        # of an epoch, which nothing can prefetch, is ready in 1/workers of the time; a
        # user's collate wants the whole batch.
        split = 1 if ready or opts.collate is not None else workers
        processes = None if ready else self.start_processes()
        with ThreadPoolExecutor(workers, thread_name_prefix="packer-decode") as pool:
            pending: deque[tuple[list[tuple[int, Future[Batch]]], BatchRows | None]] = deque()
            try:
                for parts, rows, sources in self._gathered(
                    stores, lane, verify, shared, epoch, ready
                ):
                    if isinstance(parts, Batch):  # the whole batch finished as gathered
                        yield mover(parts)
                        continue
                    if ready:
                        done = [(i, p if isinstance(p, Batch) else finish[i](p)) for i, p in parts]
                        yield mover(self._joined(done, rows, sources))
                        continue
                    windows = cast(list[tuple[int, Window]], parts)  # nothing comes finished
                    # A mixture's batch is split as one store's would be, each store's part
                    # into its share of the pieces: a piece per store per worker doubled
                    # the hand-offs (and, with processes, the messages) per batch.
                    records = sum(len(window) for _, window in windows)
                    pieces = [
                        (i, piece)
                        for i, window in windows
                        for piece in split_window(window, round(split * len(window) / records))
                    ]
                    if processes is not None:
                        # Each part's pixels go to their rows of the batch, written there by
                        # the worker or copied there as they come: joining copies nothing.
                        batch_rows = processes.batch_rows(records, self._memory)
                        starts = np.cumsum([0] + [len(p) for _, p in pieces])[:-1].tolist()
                        futures = [
                            (i, processes.submit(i, piece, epoch, batch_rows, at))
                            for (i, piece), at in zip(pieces, starts, strict=True)
                        ]
                    else:
                        batch_rows = None
                        futures = [(i, pool.submit(finish[i], piece)) for i, piece in pieces]
                    pending.append((futures, batch_rows))
                    # A batch goes once done, or once the pool has enough in hand without
                    # it: a done batch kept back waits for the next gather, which may be
                    # waiting for the disk (an epoch's opening window).
                    while pending and (
                        len(pending) > workers or all(f.done() for _, f in pending[0][0])
                    ):
                        yield mover(self._first_done(pending, stop))
                while pending:
                    yield mover(self._first_done(pending, stop))
            finally:
                for futures, _ in pending:
                    for _, future in futures:
                        future.cancel()

    def _first_done(
        self,
        pending: deque[tuple[list[tuple[int, Future[Batch]]], BatchRows | None]],
        stop: threading.Event,
    ) -> Batch:
        """The first pending batch, taken off ``pending`` once its parts are done."""
        futures, batch_rows = pending.popleft()
        return self._joined([(i, _result(f, stop)) for i, f in futures], batch_rows=batch_rows)

    def _joined(
        self,
        parts: list[tuple[int, Batch]],
        rows: np.ndarray | None = None,
        sources: np.ndarray | None = None,
        batch_rows: BatchRows | None = None,
    ) -> Batch:
        """One batch of its finished parts; in a mixture, with the store of each record
        (``sources``: as planned, for ``rows`` gathered whole, where no record is skipped;
        ``batch_rows``: the batch array the parts' pixels may have been copied into)."""
        stack = self.options.collate is None
        if not self.planner.mixed:
            return merge_parts([batch for _, batch in parts], stack, self._memory, batch_rows)
        if rows is not None and all(
            isinstance(b.images, np.ndarray) and not b.skipped for _, b in parts
        ):
            return _one_batch(parts, rows, sources, len(self.sources))
        batch = merge_parts([b for _, b in parts], stack, self._memory, batch_rows)
        batch.sources = np.repeat(
            np.array([i for i, _ in parts], np.int64), [len(b.paths) for _, b in parts]
        )
        batch.per_source = _per_source(parts, len(self.sources))
        return batch

    def record_order(self, epoch: int) -> np.ndarray:
        """Global indices of the records this reader yields in ``epoch``, in order; no I/O.
        For a mixture, rows of (store, index), each batch's records grouped by store as
        they are yielded."""
        lane = self.lane(epoch)
        per_source = []
        for source, pieces in zip(self.sources, lane.pieces, strict=True):
            starts = source.manifest.shard_starts()
            parts = [np.zeros(0, np.int64)]
            for piece in pieces:
                spans = piece.spans
                ranges = [
                    np.arange(starts[s.shard] + s.start, starts[s.shard] + s.stop) for s in spans
                ]
                parts.append(np.concatenate(ranges)[piece.positions()])
            per_source.append(np.concatenate(parts))
        if lane.mix is None:
            return per_source[0]
        mix = lane.mix.astype(np.int64)
        index = np.zeros(len(mix), np.int64)
        for i, indices in enumerate(per_source):
            index[mix == i] = indices
        batch = np.arange(len(mix)) // self.options.batch_size
        order = np.lexsort((np.arange(len(mix)), mix, batch))  # by batch, then store
        return np.stack([mix[order], index[order]], axis=1)

    def _gathered(
        self,
        stores: list[Store],
        lane: Lane,
        verify: list[bool],
        shared: tuple[int, ...] | None,
        epoch: int,
        stored: bool,
    ) -> Iterator[tuple[Batch | list[tuple[int, Window | Batch]], np.ndarray | None, Any]]:
        """Batches of records in the lane's order (``epoch``'s), not yet decoded, as (store,
        records) parts (raw pixels of one shape checked with ``verify`` as they are read, see
        read_window); ``shared``: the one shape of every store's raw pixels, gathered into
        one array; ``stored``: those pixels need nothing more, so a part that lies in one
        clean window comes finished (a Batch, see Cursor.stored), and a batch whose every
        part did comes as one Batch, which carries its own rows and sources. With a batch of
        parts, its pixel array and, in a mixture, the store of each of its records."""
        opts = self.options
        cursors: list[Cursor] = []
        try:
            for i, (source, store) in enumerate(zip(self.sources, stores, strict=True)):
                pieces = lane.pieces[i]
                ahead = self._read_ahead(i, [s for p in pieces for s in p.spans], epoch)
                spare = self._spare_windows[i]
                array = spare.pop() if spare else None  # popped: an abandoned epoch may run on
                cursors.append(Cursor(store, pieces, source.fixed_shape, verify[i], ahead, array))
            total, size = len(lane), opts.batch_size
            per_batch = _counts_per_batch(lane, size, len(cursors))
            # The store of each record, batch by batch, grouped by store as the parts are:
            # made once a lane, so a batch takes a slice of it rather than running a loop.
            sources = None
            if per_batch is not None:
                stores_of = np.tile(np.arange(len(cursors), dtype=np.int64), len(per_batch))
                sources = np.repeat(stores_of, per_batch.ravel())
            counts_of = [] if per_batch is None else per_batch.tolist()
            for number, start in enumerate(range(0, total, size)):
                n = min(size, total - start)
                if n < size and opts.drop_last:
                    break
                counts = [n] if per_batch is None else counts_of[number]
                rows = self._memory.empty((n, *shared)) if shared else None
                parts: list[tuple[int, Window | Batch]] = []
                finished = stored and rows is not None
                row = 0
                for i, count in enumerate(counts):
                    if count:
                        into = rows[row : row + count] if rows is not None else None
                        part = (
                            cursors[i].stored(count, into) if stored and into is not None else None
                        )
                        if part is None:
                            finished = False
                        parts.append((i, cursors[i].take(count, into) if part is None else part))
                        row += count
                # A copy: a view would carry the whole lane's array (torch shares it whole).
                of_batch = None if sources is None else sources[start : start + n].copy()
                if finished and rows is not None:  # the batch carries its rows and sources
                    done = cast(list[tuple[int, Batch]], parts)
                    yield _one_batch(done, rows, of_batch, len(cursors)), None, None
                else:
                    yield parts, rows, of_batch
        finally:
            for i, cursor in enumerate(cursors):
                array = cursor.close()
                self._reading_on[i] = cursor.ahead  # stopped by the next epoch, or by epochs()
                if array is not None:
                    self._spare_windows[i][:] = [array]

    def _read_ahead(self, i: int, spans: list[plan.Span], epoch: int) -> ReadAhead | None:
        """Store ``i``'s read-ahead for ``epoch``: given the bytes of its first spans that
        the last epoch's read-ahead read, and reading on into the next epoch's spans where
        the reader goes on to it (across_epochs)."""
        source = self.sources[i]
        # Stopped only now, not as the last window was gathered: it reads on while the
        # batches in flight are decoded and taken.
        before, self._reading_on[i] = self._reading_on[i], None
        carried = before.leftover() if before is not None else {}
        if not spans or not SUPPORTED or source.manifest.backend == "pytables":
            return None
        depth = self.options.read_ahead
        if depth is None:  # only where the page cache cannot serve the epoch
            depth = self._auto(i)
        if not depth:
            return None
        then = partial(self._spans_of, epoch + 1, i) if self.options.across_epochs else None
        return ReadAhead(source.path, spans, depth, then, carried)

    def _spans_of(self, epoch: int, i: int) -> list[plan.Span]:
        """Store ``i``'s spans in this reader's lane of a fresh ``epoch``, in read order."""
        rank, _, worker, _ = self.parts
        lane = self.planner.lane(epoch, (), self.layout, rank, worker)
        return [span for piece in lane.pieces[i] for span in piece.spans]

    def _auto(self, i: int) -> int:
        """read_ahead=None: chunks to read ahead of store ``i`` this epoch: none for a store
        the page cache holds; else the next window, as memory allows. A store that fits in
        memory but is mostly not there yet (the first epoch from a disk, or after other
        work pushed it out) is read ahead too, and is kept there for the epochs after."""
        source = self.sources[i]
        memory = memory_for_cache()
        if store_bytes(source.path) <= memory:
            files = [source.path / shard.file for shard in source.manifest.shards]
            missing = share_not_in_memory(files)
            if missing is None or missing < _MOSTLY_NOT_IN_MEMORY:
                return 0
        if source.path not in self._auto_depth:  # decided once per store, not each epoch
            self._auto_depth[source.path] = self._depth(i, memory)
        return self._auto_depth[source.path]

    def _depth(self, i: int, memory: int) -> int:
        source, window = self.sources[i], self.planner.window_chunks[i]
        opts, stats = self.options, source.manifest.stats
        mean = (stats.get("payload_bytes") or {}).get("mean") or 0
        chunk = source.chunk_size * mean
        if opts.size is not None:
            image = opts.size[0] * opts.size[1] * 3
        elif opts.decode:  # at most the stored images' size (a crop is smaller)
            image = (
                ((stats.get("height") or {}).get("mean") or 0)
                * ((stats.get("width") or {}).get("mean") or 0)
                * 3
            )
        else:
            image = mean
        in_flight = (opts.prefetch + (opts.workers or default_workers()) + 2) * opts.batch_size
        reserved = window * chunk + in_flight * image
        return auto_depth(window, chunk, memory, reserved)

    def start_processes(self) -> ProcessDecoder | None:
        """The pool of decode processes, where this reader decodes in processes: started
        once per process (a DataLoader worker forked from this one starts its own), kept for
        every epoch. The reader starts it from the thread that asks for an epoch, which
        usually lives as long as the process (see ProcessDecoder)."""
        if self.decode_in != "processes":
            return None
        if self._processes is None or self._processes.pid != os.getpid():
            opts = self.options
            given = [
                (
                    source.path,
                    source.manifest,
                    {
                        "decode": opts.decode,
                        "mode": opts.mode or source.manifest.storage.mode,
                        "verify": opts.verify and source.manifest.storage.checksums,
                        "on_error": opts.on_error,
                        "transform": opts.transform,
                        "size": opts.size,
                        "fit": opts.fit,
                        "collate": opts.collate,
                        "augment": opts.augmenting,
                        "seed": source_seed(opts.seed, k),
                    },
                )
                for k, source in enumerate(self.sources)
            ]
            workers = opts.workers or default_workers()
            manifests = [source.manifest for source in self.sources]
            self._processes = ProcessDecoder(
                workers,
                given,
                opts.collate is None,
                part_bytes(opts, manifests),
                payload_bytes(opts, manifests),
                # A block for each batch in the queue or in the pool's hands, and a few for
                # those the training loop holds.
                (opts.prefetch + workers + 4, opts.batch_size, image_bytes(opts, manifests)),
            )
        return self._processes

    def _open_stores(self) -> list[Store]:
        if self._stores is None or self._store_pid != os.getpid():
            opts = self.options
            self._stores = [
                Store(s.path, images=opts.images, labels=opts.labels) for s in self.sources
            ]
            self._store_pid = os.getpid()
        return self._stores

    def close(self) -> None:
        """Close the stores' handles, if this process opened them (never a parent's)."""
        if self._stores is not None and self._store_pid == os.getpid():
            for store in self._stores:
                store.close()
        self._stores = None
        if self._processes is not None and self._processes.pid == os.getpid():
            self._processes.close()
        self._processes = None
        self._memory.clear()  # the free blocks; batches still held keep theirs


def _result(future: Future[Batch], stop: threading.Event) -> Batch:
    """``future``'s batch part, waited for in slices: once ``stop`` is set the thread gives
    up on it. A decode thread notices stop itself, but a decode process cannot: its part
    would hold a Ctrl-C for as long as the user's transform runs."""
    while not wait([future], timeout=_STOP_POLL_S).done:
        if stop.is_set():
            raise Stopped("the epoch was stopped")
    return future.result()


def _one_batch(
    parts: list[tuple[int, Batch]], rows: np.ndarray, sources: Any, stores: int
) -> Batch:
    """A raw batch whose parts are finished and are their rows of the batch array already
    (gathered into them): one Batch of them, with nothing copied, and ``sources``."""
    if len(parts) == 1:
        batch = parts[0][1]
    else:
        paths: list[str] = []
        for _, part in parts:
            paths += part.paths
        labels = np.concatenate([part.labels for _, part in parts])
        batch = Batch(rows, labels, paths, 0, rows.nbytes)
    batch.sources = sources
    batch.per_source = _per_source(parts, stores)
    return batch


def _per_source(parts: list[tuple[int, Batch]], stores: int) -> list[int]:
    """How many of a mixture's batch's records each of its ``stores`` gave: counted here, per
    part, rather than from ``sources`` per record in the training loop's thread."""
    counts = [0] * stores
    for i, part in parts:
        counts[i] += len(part.paths)
    return counts


def _counts_per_batch(lane: Lane, size: int, stores: int) -> np.ndarray | None:
    """How many records each store gives each batch of a mixture's lane, (batches, stores)
    (None: one store)."""
    if lane.mix is None:
        return None
    n = len(lane.mix)
    cells = np.arange(n) // size * stores + lane.mix  # (batch, store) of each record
    return np.bincount(cells, minlength=-(-n // size) * stores).reshape(-1, stores)


def _gpu_mover(opts: ReaderOptions) -> Callable[[Batch], tuple[Batch, Callable[[], None] | None]]:
    if opts.output != "torch":
        return lambda batch: (batch, None)
    from packer.reading.to_torch import BatchMover

    return BatchMover(opts.pin_memory, opts.device)
