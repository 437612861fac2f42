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
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from packer.errors import StateError, StoreError, UsageError
from packer.prefetch import Prefetcher
from packer.reading import epoch as plan
from packer.reading.batching import Batch
from packer.reading.lanes import Layout, Phase, Planner
from packer.reading.mixture import check_weights, quotas
from packer.reading.options import ReaderOptions, default_chunk_size, rank_and_world
from packer.reading.produce import EPOCH_END, Producer, Source
from packer.reading.state import from_state, run_identity, to_state
from packer.store.access import open_manifest
from packer.store.manifest import Manifest

__all__ = ["Reader", "open_reader", "StorePaths"]

# One store, or a mixture: several in order, or a mapping of names to stores.
StorePaths = Path | str | Sequence[Path | str] | Mapping[str, Path | str]

log = logging.getLogger(__name__)

# Readers with threads running, closed at exit while the interpreter is still whole: a daemon
# thread still inside h5py or Pillow when it is torn down can abort the process (seen in
# DataLoader workers abandoned mid-epoch).
_RUNNING: weakref.WeakSet[Reader] = weakref.WeakSet()


@atexit.register
def _close_running_readers() -> None:
    for reader in list(_RUNNING):
        reader.close()


def open_reader(
    path: StorePaths,
    *,
    batch_size: int,
    weights: Sequence[float] | Mapping[str, float] | None = None,
    epoch_size: int | None = None,
    **options: Any,
) -> Reader:
    """Open a store for training: an iterable of (images, labels) batches, one epoch per loop.

    Example::

        with open_reader("out.lmdb", batch_size=256, seed=0) as reader:
            for epoch in range(90):
                for images, labels in reader.epoch(epoch):
                    train_step(images, labels)

    Several stores (a list, or a mapping of names to stores) are read as one mixture, each
    in its share of every batch: ``weights`` (one per store; None: in proportion to their
    sizes) and ``epoch_size`` (records per epoch; None: until the store scarcest for its
    weight has given each record once). A mixture's batches are (images, labels, sources),
    ``sources`` the index of each record's store. ``options``: every other keyword is a
    field of ``ReaderOptions`` (``help(packer.ReaderOptions)`` lists them all).
    """
    return Reader(
        path,
        ReaderOptions(batch_size=batch_size, **options),
        weights=weights,
        epoch_size=epoch_size,
    )


class Reader:
    """Iterates a store, or a mixture of stores, in batches. Not thread-safe: one epoch
    iterates at a time (starting another stops the previous one). ``close()`` or ``with``
    stops the background threads."""

    def __init__(
        self,
        path: StorePaths,
        options: ReaderOptions,
        *,
        weights: Sequence[float] | Mapping[str, float] | None = None,
        epoch_size: int | None = None,
    ) -> None:
        self._given = (path, weights, epoch_size)  # what a pickled reader is made again from
        self.names, self.paths = _named_paths(path)
        self.path = self.paths[0]
        self.options = options
        self.manifests = [open_manifest(p, options.images, options.labels) for p in self.paths]
        self.manifest = self.manifests[0]
        for where, manifest in zip(self.paths, self.manifests, strict=True):
            if manifest.backend != "pytables":
                # Before planning epochs from the counts: read_manifest bounded those by the
                # size of each shard file there is, so a missing one could claim any count.
                for info in manifest.shards:
                    if not (where / info.file).exists():
                        raise StoreError(f"{where}: {info.file} is missing")
        if len(self.paths) > 1:
            _check_mixable(self.paths, self.manifests, options)
        if epoch_size is not None and (
            isinstance(epoch_size, bool) or not isinstance(epoch_size, int) or epoch_size < 1
        ):
            raise UsageError(f"epoch_size must be a positive integer, not {epoch_size!r}")
        if isinstance(weights, Mapping):
            weights = _weights_by_name(weights, self.names)
        self.weights = check_weights(weights, len(self.paths))
        counts = [m.num_records for m in self.manifests]
        self.quotas = quotas(counts, self.weights, epoch_size)
        self.rank, self.world_size = rank_and_world(options.rank, options.world_size)
        self.chunk_sizes = [
            options.chunk_size or default_chunk_size(m.stats, m.num_records) for m in self.manifests
        ]
        self.chunk_size = self.chunk_sizes[0]
        self.planner = Planner(
            [
                plan.chunk_spans([s.num_records for s in m.shards], size)
                for m, size in zip(self.manifests, self.chunk_sizes, strict=True)
            ],
            self.quotas,
            seed=options.seed,
            shuffle=options.shuffle,
            buffer_chunks=options.buffer_chunks,
            remainder=options.remainder,
        )
        worker, workers = options.worker or (0, 1)
        self._producer = Producer(
            [
                Source(p, m, size)
                for p, m, size in zip(self.paths, self.manifests, self.chunk_sizes, strict=True)
            ],
            options,
            (self.rank, self.world_size, worker, workers),
            self.planner,
        )
        self._identity = run_identity(
            self.names,
            self.manifests,
            self.quotas,
            self.chunk_sizes,
            seed=options.seed,
            shuffle=options.shuffle,
            buffer_chunks=options.buffer_chunks,
            remainder=options.remainder,
            window_chunks=self.planner.window_chunks,
        )
        self._next_epoch = 0
        # A loaded state: (epoch, the phases of it already read elsewhere).
        self._resume: tuple[int, tuple[Phase, ...]] | None = None
        self._active: Prefetcher[Any] | None = None
        # (epoch, phases) _active is producing ahead.
        self._ahead: tuple[int, tuple[Phase, ...]] | None = None
        # _active's next item is the end of an epoch whose batches were all taken (a loop
        # that stopped after len(reader) batches without asking for more): pass over it.
        self._stale_end = False
        self._position = (0, 0)  # (epoch, batches delivered in it by this reader)
        self._phases: tuple[Phase, ...] = ()  # the phases of that epoch before this reader's
        self._planned = 0  # batches this reader yields of that epoch
        self._counters = _Counters(None, self.names)

    # -- the epoch plan ---------------------------------------------------------------

    @property
    def layout(self) -> Layout:
        """How this reader's job reads: world size, DataLoader workers, batch size."""
        return self._producer.layout

    def records_per_epoch(self) -> int:
        """Records this reader yields per epoch (its rank's share, its worker's part of it)."""
        rank, world, worker, workers = self._producer.parts
        total = 0
        for quota in self.quotas:
            share = plan.share_size(quota, world, rank, self.options.remainder)
            total += plan.share_size(share, workers, worker, "uneven")
        return total

    def __len__(self) -> int:
        n, b = self.records_per_epoch(), self.options.batch_size
        return n // b if self.options.drop_last else math.ceil(n / b)

    def record_order(self, epoch: int) -> np.ndarray:
        """Global indices of the records this reader yields in ``epoch``, in order; no I/O.
        For a mixture, rows of (store, index)."""
        return self._producer.record_order(epoch)

    # -- iteration --------------------------------------------------------------------

    def epoch(self, epoch: int) -> Iterator[tuple[Any, ...]]:
        """The batches of ``epoch``: (images, labels), or (images, labels, paths) with
        with_paths; a mixture's carry each record's store after the labels."""
        phases: tuple[Phase, ...] = ()
        if self._resume is not None and self._resume[0] == epoch:
            phases = self._resume[1]
        self._resume = None
        if self._active is None or self._ahead != (epoch, phases):
            # Nothing prefetched for this epoch (the first, a resume, an epoch skipped or
            # repeated, an epoch left before its end): start a producer here.
            self._stop_active()
            self._producer.start_processes()  # from this thread: see ProcessDecoder
            stop = threading.Event()  # set when the prefetcher stops: decode threads give up early
            self._active = Prefetcher(
                partial(self._producer.epochs, epoch, phases, stop),
                depth=self.options.prefetch,
                name="packer-prefetch",
                stop=stop,
            )
        stale_end, self._stale_end, self._ahead = self._stale_end, False, None
        _RUNNING.add(self)
        self._position, self._phases = (epoch, 0), phases
        self._planned = self._producer.lane(epoch, phases).batches(
            self.options.batch_size, self.options.drop_last
        )
        self._counters = _Counters(self._active, self.names)  # figures are per epoch
        return self._consume(self._active, self._counters, epoch, stale_end)

    def _consume(
        self,
        prefetcher: Prefetcher[Any],
        counters: _Counters,
        epoch: int,
        stale_end: bool,
    ) -> Iterator[tuple[Any, ...]]:
        # Its own prefetcher and counters: an abandoned epoch closed late never touches the
        # figures of the epoch that replaced it.
        finished = False
        delivered = 0
        mixed = self.planner.mixed
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
                out = (
                    (batch.images, batch.labels, batch.sources)
                    if mixed
                    else (batch.images, batch.labels)
                )
                yield (*out, batch.paths) if self.options.with_paths else out
            self._next_epoch = epoch + 1
        finally:
            counters.stop(prefetcher)
            taken = not finished and delivered == self._planned > 0  # all but the end marker
            if taken:
                self._next_epoch = epoch + 1
            if (finished or taken) and self.options.across_epochs and self._active is prefetcher:
                self._ahead = (epoch + 1, ())  # its producer is already on the next epoch
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

    def state_dict(self) -> dict[str, Any]:
        """Where the run stands, to load into a new reader (on any number of ranks, with any
        batch size) that then yields exactly what no rank has yet: the stores, seed and plan
        it belongs to, the epoch, and how far all ranks together have got through it.

        Every rank takes the same number of batches (as with DDP), so rank 0's state is the
        whole job's: save it, and load it on every rank.
        """
        epoch, delivered = self._position
        return self.state_after(epoch, (*self._phases, Phase(self.layout, delivered)))

    def state_after(self, epoch: int, phases: Sequence[Phase]) -> dict[str, Any]:
        """The state of a run that has read ``phases`` of ``epoch`` (each: a layout, and the
        batches every rank took in it); the next epoch's start where they read it all."""
        phases = tuple(p for p in phases if p.batches)
        try:
            lanes, done = self.planner.replay(epoch, phases, self.layout)
        except ValueError as e:
            raise StateError(f"epoch {epoch}: {e}") from None
        if phases and not any(len(lane) for lane in lanes):
            epoch, phases, done = epoch + 1, (), 0
        return to_state(self._identity, epoch, phases, done)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` (from ``state_dict``) stands: the next epoch this reader
        reads is that epoch, without the records any rank had already had of it.

        Raises:
            StateError: the state is damaged, or of another store, mixture, seed or plan;
                the message names what differs.
        """
        epoch, phases, done = from_state(state, self._identity)
        try:
            _, used = self.planner.replay(epoch, phases, self.layout)
        except ValueError as e:
            raise StateError(f"state is damaged: epoch {epoch}: {e}") from None
        if used != done:
            raise StateError(
                f"state is damaged: it says {done} records of epoch {epoch} were read, "
                f"its phases say {used}"
            )
        self._resume = (epoch, phases)
        self._next_epoch = epoch
        self._position, self._phases = (epoch, 0), phases  # saved again as it was loaded

    def stats(self) -> dict[str, Any]:
        """Live figures of the current (or last) epoch: is training waiting for data? For a
        mixture, ``sources``: each store's images and share of them."""
        return self._counters.snapshot(self._active)

    def _stop_active(self) -> None:
        self._ahead, self._stale_end = None, False
        if self._active is not None:
            self._active.close()
            self._active = None

    def close(self) -> None:
        """Stop the background threads and close the store (also on leaving ``with``)."""
        try:
            self._stop_active()
        finally:  # a Ctrl-C in the join must not leave decode processes behind
            self._producer.close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        # A reader dropped without close lets go of its threads, stores and decode processes
        # now, not when the collector finds them. At interpreter exit the daemon threads just end.
        with contextlib.suppress(Exception):
            self.close()

    def __getstate__(self) -> dict[str, Any]:
        # A reader travels to DataLoader workers as its path, options and position only.
        return {
            "given": self._given,
            "options": self.options,
            "next_epoch": self._next_epoch,
            "resume": self._resume,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        path, weights, epoch_size = state["given"]
        self.__init__(path, state["options"], weights=weights, epoch_size=epoch_size)  # type: ignore[misc]
        self._next_epoch = state["next_epoch"]
        self._resume = state["resume"]


_NO_WAITS = {"wait_s": 0.0, "waits": 0, "fills": 0}


class _Counters:
    """images/s, MB/s and the share of wall time the training loop spent waiting, for one
    epoch (its prefetcher may have served the epoch before: its figures are differences)."""

    def __init__(self, prefetcher: Prefetcher[Any] | None, names: list[str]) -> None:
        self.batches = self.images = self.nbytes = self.skipped = 0
        self.names = names
        self.per_source = [0] * len(names)
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
        if batch.per_source is not None:
            self.per_source = [a + b for a, b in zip(self.per_source, batch.per_source)]

    def _read(self, prefetcher: Prefetcher[Any]) -> None:
        now, base = prefetcher.stats(), self._base
        waits = now["waits"] - base["waits"]
        self.wait_s = now["wait_s"] - base["wait_s"]
        self.queue_fill = (now["fills"] - base["fills"]) / waits if waits else 0.0

    def stop(self, prefetcher: Prefetcher[Any]) -> None:
        self.stopped = time.perf_counter()
        self._read(prefetcher)

    def snapshot(self, active: Prefetcher[Any] | None) -> dict[str, Any]:
        if self.stopped:
            end = self.stopped
        else:
            end = time.perf_counter()
            if active is not None:
                self._read(active)
        elapsed = max(end - self.started, 1e-9) if self.counting else 0.0
        figures: dict[str, Any] = {
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
        if len(self.names) > 1:
            figures["sources"] = {
                name: {
                    "images": int(count),
                    "share": round(count / self.images, 4) if self.images else 0.0,
                }
                for name, count in zip(self.names, self.per_source, strict=True)
            }
        return figures


def _named_paths(path: StorePaths) -> tuple[list[str], list[Path]]:
    """(names, paths) of the stores asked for: a store's name is its folder's name, or the
    mapping's key."""
    if isinstance(path, (str, Path)):
        return [Path(path).name], [Path(path)]
    if isinstance(path, Mapping):
        names, paths = [str(k) for k in path], [Path(v) for v in path.values()]
    else:
        paths = [Path(p) for p in path]
        names = [p.name for p in paths]
    if not paths:
        raise UsageError("no store to read: give a store, or a list of stores to mix")
    return names, paths


def _weights_by_name(weights: Mapping[str, float], names: list[str]) -> list[float]:
    unknown = sorted(set(weights) - set(names))
    if unknown or len(weights) != len(names):
        missing = sorted(set(names) - set(weights))
        raise UsageError(
            f"weights name {', '.join(unknown) or 'no unknown store'} and leave out "
            f"{', '.join(missing) or 'none'}: give one weight per store, by its name"
        )
    return [weights[name] for name in names]


def _check_mixable(paths: list[Path], manifests: list[Manifest], options: ReaderOptions) -> None:
    """Stores mixed into one batch must agree on what a batch holds."""
    for where, manifest in zip(paths, manifests, strict=True):
        if manifest.num_records == 0:
            raise UsageError(f"{where}: the store holds no records, so it cannot be mixed")
    columns = {len(m.label_columns) for m in manifests}
    if len(columns) > 1:
        counts = ", ".join(f"{p.name}: {len(m.label_columns)}" for p, m in zip(paths, manifests))
        raise UsageError(f"stores mixed must have as many label columns; they have {counts}")
    modes = {m.storage.mode for m in manifests}
    if options.mode is None and options.decode and len(modes) > 1:
        raise UsageError(
            f"the stores decode to different colour modes ({', '.join(sorted(modes))}): "
            "pass mode='RGB' (or 'L') to mix them"
        )
