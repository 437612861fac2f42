"""Decoding in worker processes, and the choice between them and the decode threads.

Threads serve large images well on a few cores: libjpeg-turbo, libpng, zlib and CRC-32
release the GIL for the heavy part. A small image is the other way round: of a 32x32 PNG's
~30 us, half is the record's Python (checks, header, arrays) that holds the GIL, and so is
whatever Python the training loop runs beside the reader: threads take turns. The same turns
cap many threads on large images: each holds the GIL for a sliver of every image, and with a
dozen of them the slivers add up to the whole, while the training loop, queueing a GPU's
kernels, waits its turn too. Worker processes each have their own GIL, and leave the
training process's to the training loop.

    producer thread: read_window -> gather -> a batch part's payloads -> an outbox slot
    worker process:  finish_batch (verify, decode, transform) -> the part's rows of its
                     batch's block (with ``size``), else one array -> a landing slot
    reader's process: the batch is its block; or the slot's pixels copied to their rows

Both ways the bytes go through shared memory (packer.reading.shared_slots), and only the
part's metadata and a slot's number through the pipe: pickled, written, read and unpickled,
the bytes cost the reader's one process, which does that for every worker, most of its time.
With ``size`` every image's bytes are known, so each batch is lent a block of a shared batch
area and its workers write straight to their rows: the training loop gets the block, as a
DataLoader's main process gets its workers' batches. A slot holds what is expected of a part
(pixels: from the store's mean image; payloads: twice the store's mean); a batch that finds no
block free (the training loop keeps batches), or a part that finds no slot free or does not
fit one, takes the next way down: a landing slot, then the pipe. For a large image coming back
whole, on a few cores, even one copy costs more than the GIL does, so ``choose`` keeps threads
for it.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from packer.arguments import default_workers
from packer.errors import UsageError
from packer.imaging import decode as imaging
from packer.imaging import resizing
from packer.lifeline import die_with_parent
from packer.reading.batch_memory import BatchMemory, BatchRows
from packer.reading.batching import Batch, Window, finish_batch, merge_batches
from packer.reading.shared_slots import BatchArea, InPlace, Landed, Landing, Outbox, Sent

if TYPE_CHECKING:
    from packer.reading.options import ReaderOptions
    from packer.store.access import Store
    from packer.store.manifest import Manifest

__all__ = [
    "DECODE_IN",
    "SMALL_PIXELS",
    "choose",
    "part_bytes",
    "payload_bytes",
    "image_bytes",
    "ProcessDecoder",
    "merge_parts",
]

DECODE_IN = ("threads", "processes")
# Images of at most this many pixels on average (the store's own statistics) decode in
# processes by default: small images are mostly Python work that holds the GIL, and larger
# ones, on a few cores, cost more to copy back from the workers than the GIL costs threads
# (benchmarks/bench_small_images.py measures both).
SMALL_PIXELS = 128 * 128
# From this many decode workers on, larger images decode in processes too, where what comes
# back of each is at most RETURNED_PIXELS (the output of ``size`` or ``augment``, else the
# store's mean image): the threads' turns at the GIL, not the cores, bound them, and starve a
# training loop that feeds a GPU (benchmarks/bench_gpu.py, on 16 cores, 224x224 outputs).
# Larger outputs keep threads: their copy back is the cost bench_small_images measures.
MANY_WORKERS = 8
RETURNED_PIXELS = 256 * 256
# The most address space each shared area maps (landing slots, outbox, batch blocks): pages
# are touched only as slots are used, and a part larger than half of it takes the pipe.
_AREA_BYTES = 1 << 30
# How long close() waits for the pool's manager thread to reap its workers, which it does as
# soon as they have ended or been killed: a bound, so that close never hangs on it.
_MANAGER_WAIT_S = 5.0


def choose(options: ReaderOptions, manifest: Manifest) -> str:
    """Where this reader decodes: ``options.decode_in`` if given, else "processes" for a
    store of small encoded images, or with MANY_WORKERS or more for images that come back
    small, read outside a DataLoader worker, else "threads"."""
    if options.decode_in is not None:
        if options.decode_in == "processes":
            _check_sendable(options)
        return options.decode_in
    storage = manifest.storage
    if not options.decode or (storage.payload == "raw" and options.size is None):
        return "threads"  # nothing to decode: checksums and gathers are fast in threads
    if options.worker is not None or multiprocessing.current_process().daemon:
        return "threads"  # a DataLoader's worker: its processes are the parallelism
    height, width = _mean_size(manifest)
    small = bool(height and width and height * width <= SMALL_PIXELS)
    many = (options.workers or default_workers()) >= MANY_WORKERS
    if not small and not (many and _returned_pixels(options, height, width) <= RETURNED_PIXELS):
        return "threads"
    try:
        _check_sendable(options)
    except UsageError:
        return "threads"  # a transform that only threads can run
    return "processes"


def _mean_size(manifest: Manifest) -> tuple[float | None, float | None]:
    """The store's mean image height and width, from its statistics (None where unknown)."""
    stats = manifest.stats or {}
    return (stats.get("height") or {}).get("mean"), (stats.get("width") or {}).get("mean")


def _returned_pixels(options: ReaderOptions, height: float | None, width: float | None) -> float:
    """About how many pixels of each image a worker sends back: the ``size``, the output of
    ``augment`` for the store's mean image, else that mean image (unknown: unbounded)."""
    if options.size is not None:
        return float(options.size[0] * options.size[1])
    if not height or not width:
        return math.inf
    augment = options.augmenting
    if augment is not None:
        out_h, out_w = augment.place(round(height), round(width), np.random.default_rng(0)).shape
        return float(out_h * out_w)
    return float(height * width)


def part_bytes(options: ReaderOptions, manifests: list[Manifest]) -> int:
    """The bytes of pixels a batch part brings back: the size of a landing slot. Exact with
    ``size``; else for each store's mean image (``augment``'s output for it, or the image
    itself); 0 where no store knows its mean. A part that comes back larger takes the pipe."""
    most = 0.0
    for manifest in manifests:
        height, width = _mean_size(manifest)
        channels = {"L": 1, "RGB": 3}.get(options.mode or manifest.storage.mode, 4)
        most = max(most, _returned_pixels(options, height, width) * channels)
    return int(_part_records(options) * most) if math.isfinite(most) else 0


def payload_bytes(options: ReaderOptions, manifests: list[Manifest]) -> int:
    """The bytes of payloads a batch part takes to a worker: the size of an outbox slot, for
    twice each store's mean payload (payloads vary); 0 where no store knows its mean. A part
    that is larger takes the pipe."""
    means = [(m.stats.get("payload_bytes") or {}).get("mean") or 0 for m in manifests]
    return int(_part_records(options) * 2 * max(means)) if all(means) else 0


def image_bytes(options: ReaderOptions, manifests: list[Manifest]) -> int:
    """The bytes of every decoded image, where known in advance (a ``size``, no augment, a
    mode of one byte a channel in every store); else 0."""
    if options.size is None or options.augment is not None:
        return 0
    channels = {{"L": 1, "RGB": 3}.get(options.mode or m.storage.mode, 0) for m in manifests}
    if len(channels) != 1 or not min(channels):
        return 0
    return options.size[0] * options.size[1] * channels.pop()


def _part_records(options: ReaderOptions) -> int:
    """The most records of a batch part: a batch is split into ``workers`` parts, of at least
    8 records each (split_window)."""
    workers = options.workers or default_workers()
    return max(-(-options.batch_size // workers), min(options.batch_size, 15)) + 1


def _check_sendable(options: ReaderOptions) -> None:
    if options.worker is not None or multiprocessing.current_process().daemon:
        raise UsageError(
            "decode_in='processes' cannot run inside a DataLoader worker (a daemonic process "
            "may not start processes); its workers already decode in parallel: leave "
            "decode_in unset or use 'threads'"
        )
    for name in ("transform", "collate"):
        function = getattr(options, name)
        try:
            # Serialised as the pool will send it, to this reader's own workers; nothing
            # read from a store is ever unpickled (payloads travel as bytes).
            ForkingPickler.dumps(function)
        except Exception as e:
            raise UsageError(
                f"decode_in='processes' needs a {name} that can be sent to another process "
                f"(a function defined at module level, not a lambda or closure): {e}"
            ) from None


@dataclass(frozen=True)
class _Names:
    """What finish_batch's error messages need of the store: its path and shard files."""

    path: str
    manifest: Any


@dataclass(frozen=True)
class _ShardFile:
    file: str


@dataclass(frozen=True)
class _Shards:
    shards: list[_ShardFile]


class ProcessDecoder:
    """A pool of ``workers`` processes that finish batch parts as finish_batch does.

    Forked where the platform can (a worker starts in milliseconds, runs no import of the
    main script, and inherits Pillow's plugins): the fork waits for every lock packer's own
    threads take (packer.fork_gate), and a worker only decodes. Each worker dies with the
    process that started it (packer.lifeline), SIGKILLed or not: by the kernel where this is
    the main thread (PR_SET_PDEATHSIG follows the thread that forked), else by a watch within
    half a second.
    """

    def __init__(
        self,
        workers: int,
        stores: list[tuple[Path, Manifest, dict[str, Any]]],
        stack: bool,
        part_bytes: int = 0,
        payload_bytes: int = 0,
        batches: tuple[int, int, int] = (0, 0, 0),
    ) -> None:
        """``stores``: each store the reader reads (a mixture has several), with finish_batch's
        keywords for it but the store, the stop event and the epoch. ``part_bytes``: the
        most a batch part's pixels take, where known in advance (else 0): the size of a
        landing slot; ``payload_bytes``: of its payloads, the size of an outbox slot.
        ``batches``: the batch area's blocks, records a block and bytes a record, for images
        of a size known in advance (else zeros)."""
        given = [
            (_Names(str(path), _Shards([_ShardFile(s.file) for s in manifest.shards])), finish)
            for path, manifest, finish in stores
        ]
        kernel = threading.current_thread() is threading.main_thread()
        methods = multiprocessing.get_all_start_methods()
        method = "fork" if "fork" in methods else "spawn"
        if method == "fork":  # imported once here, not in every worker
            imaging.load_plugins()
            resizing.load()
        context = multiprocessing.get_context(method)
        # Mapped before the fork, so every worker shares them; spawned workers could not.
        # Parts in flight: the batches the producer keeps in hand (workers + 1), each split
        # into a part per worker; a landing slot is held only while a part is copied out.
        fork = method == "fork"
        landing = _fitting(2 * workers + 2, part_bytes) if fork and stack else 0
        self._landing = Landing(landing, part_bytes, context) if landing else None
        outbox = _fitting((workers + 2) * workers, payload_bytes) if fork else 0
        self._outbox = Outbox(outbox, payload_bytes, context) if outbox else None
        blocks, records, self._row_bytes = batches
        batch_bytes = records * self._row_bytes
        blocks = _fitting(blocks, batch_bytes) if fork and stack else 0
        self._batches = BatchArea(blocks, batch_bytes) if blocks else None
        self._pool = ProcessPoolExecutor(
            workers,
            context,
            initializer=_init_worker,
            initargs=(
                given,
                stack,
                os.getpid(),
                kernel,
                self._landing,
                self._outbox,
                self._batches,
            ),
        )
        self.pid = os.getpid()
        self._pool.submit(int).result()  # with fork, the first task starts every worker

    def submit(
        self, store: int, part: Window, epoch: int, rows: BatchRows | None = None, at: int = 0
    ) -> Future[Batch]:
        """Finish ``part``, records of the reader's ``store``-th store in ``epoch`` (what
        augmentation draws are keyed by), in a worker; its payloads travel as bytes (not
        views of a map). ``rows``: the batch's, which this part's begin at ``at``: where the
        worker writes its pixels if the batch has a block, else where they are copied to as
        they come back.
        What the worker logged (records skipped with on_error="skip") is logged here, as
        the threads would have logged it."""
        sent = None
        if not isinstance(part.data, np.ndarray):
            sent = self._outbox.send(part.data) if self._outbox is not None else None
            data = sent or [p if isinstance(p, bytes) else bytes(p) for p in part.data]
            # A Sent in a Window's place for payloads: only _finish_part sees it, and swaps
            # the payloads back in before anything reads them.
            part = replace(part, data=data)  # type: ignore[arg-type]
        into = None  # where the worker writes the part's pixels in place, and how many
        if rows is not None and rows.block is not None:
            into = (rows.offset + at * rows.row_bytes, len(part), rows.row_bytes)
        inner = self._pool.submit(_finish_part, store, part, epoch, into)
        outer: Future[Batch] = Future()
        # The pool holds ``inner`` until it is done, and ``inner`` holds ``outer`` until then:
        # a strong reference back would make a cycle, and the part's pixels (a batch's rows)
        # would live on until the garbage collector came by.
        outer.add_done_callback(partial(_cancel_with, weakref.ref(inner)))
        unsent = None  # what frees the part's outbox slot if no worker ever takes it
        if sent is not None and self._outbox is not None:
            unsent = partial(self._outbox.release, sent.slot)
        inner.add_done_callback(partial(_settle, outer, self._landing, rows, at, unsent))
        return outer

    def batch_rows(self, records: int, memory: BatchMemory) -> BatchRows | None:
        """Rows for a batch of ``records``: a block of the batch area where one is free, else
        in ``memory`` for pixels that land; None where neither can be (no slots)."""
        lent = self._batches.lend() if self._batches is not None else None
        if lent is not None:
            offset, block = lent
            return BatchRows(records, memory, block, self._row_bytes, offset, self._batches)
        return BatchRows(records, memory) if self._landing is not None else None

    @property
    def landed(self) -> int:
        """How many parts' pixels came back through shared memory so far."""
        return 0 if self._landing is None else self._landing.landed

    @property
    def placed(self) -> int:
        """How many parts' pixels their workers wrote in place in their batch so far."""
        return 0 if self._batches is None else self._batches.placed

    @property
    def sent(self) -> int:
        """How many parts' payloads went to the workers through shared memory so far."""
        return 0 if self._outbox is None else self._outbox.sent

    def close(self) -> None:
        """Stop the workers; a task under way is abandoned: its worker is killed, so that a
        slow transform does not hold up a Ctrl-C, and the pool's pipes are closed on return."""
        pool = self._pool
        # The executor's own processes: before Python 3.14 it has no call that ends them.
        workers = list((pool._processes or {}).values())
        # Its manager thread and result queue: the shutdown below forgets both, so a second
        # shutdown(wait=True) would neither wait for the one nor close the other.
        manager = cast("threading.Thread | None", pool._executor_manager_thread)  # typeshed errs
        results = pool._result_queue
        pool.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + 0.2  # an idle worker ends at once; a busy one is killed
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
            if worker.is_alive():
                worker.kill()
        # Else the pipes stay open until that thread ends and the collector finds them.
        if manager is not None:
            manager.join(_MANAGER_WAIT_S)  # it reaps the workers, the killed ones too
            if manager.is_alive():  # never seen; its pipes are left to the collector
                return
        if results is not None:
            results.close()
        for worker in workers:
            worker.join()
            worker.close()  # its sentinel pipes


def merge_parts(
    parts: list[Batch], stack: bool, memory: BatchMemory, rows: BatchRows | None = None
) -> Batch:
    """The finished parts of one batch in one Batch: arrays of one shape joined in one copy
    into ``memory``, or in none where each landed in its place in ``rows``."""
    arrays = [p.images for p in parts if isinstance(p.images, np.ndarray)]
    joinable = len(arrays) == len(parts) and len({a.shape[1:] for a in arrays}) == 1
    if stack and len(parts) > 1 and joinable:
        whole = rows.whole(arrays) if rows is not None else None
        if whole is None and len({a.dtype for a in arrays}) == 1:
            shape = (sum(len(a) for a in arrays), *arrays[0].shape[1:])
            whole = np.concatenate(arrays, out=memory.empty(shape, arrays[0].dtype))
        elif whole is None:
            whole = np.concatenate(arrays)
        return Batch(
            whole,
            np.concatenate([p.labels for p in parts]),
            [path for p in parts for path in p.paths],
            sum(p.skipped for p in parts),
            sum(p.nbytes for p in parts),
        )
    return merge_batches(parts, stack, memory)


def _cancel_with(inner: weakref.ref[Future[Any]], outer: Future[Batch]) -> None:
    """``outer`` done: cancel ``inner`` too if ``outer`` was cancelled."""
    task = inner()
    if task is not None and outer.cancelled():
        task.cancel()


def _fitting(slots: int, slot_bytes: int) -> int:
    """How many of ``slots`` slots of ``slot_bytes`` a shared area maps: as many as
    _AREA_BYTES holds; 0 (no area) where the slot size is unknown or fewer than 2 fit."""
    slots = min(slots, _AREA_BYTES // max(slot_bytes, 1))
    return slots if slot_bytes > 0 and slots >= 2 else 0


def _settle(
    outer: Future[Batch],
    landing: Landing | None,
    rows: BatchRows | None,
    at: int,
    unsent: Callable[[], None] | None,
    inner: Future[tuple[Batch, list[logging.LogRecord]]],
) -> None:
    if inner.cancelled():
        if unsent is not None:  # no worker took the part, so none will free its slot
            unsent()
        if not outer.done():
            outer.cancel()
        return
    error = inner.exception()
    if error is None:
        batch, records = inner.result()
        if isinstance(batch.images, Landed):  # its slot freed even if nobody waits now
            assert landing is not None
            batch.images = landing.take(batch.images, rows, at)
        elif isinstance(batch.images, InPlace):
            assert rows is not None and rows.area is not None
            batch.images = rows.placed(at, batch.images.shape, np.dtype(batch.images.dtype))
            rows.area.placed += 1
    if outer.done():  # given up on (cancelled) while the worker ran
        return
    if error is not None:
        outer.set_exception(error)
        return
    for record in records:
        logger = logging.getLogger(record.name)
        if logger.isEnabledFor(record.levelno):
            logger.handle(record)
    outer.set_result(batch)


class _Collect(logging.Handler):
    """In a worker: packer's log records, kept to go back with the batch part."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        record.msg, record.args = record.getMessage(), None  # its arguments may not pickle
        record.exc_info = record.exc_text = None
        self.records.append(record)


# What _init_worker gave this worker: its stores, whether parts are stacked, and its slots.
_Given = tuple[
    list[tuple[_Names, dict[str, Any]]], bool, Landing | None, Outbox | None, BatchArea | None
]
_worker: _Given | None = None
_collected = _Collect()


def _fits(images: Any, most: int, row_bytes: int) -> bool:
    """Whether ``images`` are at most ``most`` arrays of one shape and type, each of
    ``row_bytes``: what a part's rows in its batch's block hold."""
    if not isinstance(images, list) or not 0 < len(images) <= most:
        return False
    first = images[0]
    return (
        isinstance(first, np.ndarray)
        and first.nbytes == row_bytes
        and all(
            isinstance(im, np.ndarray) and im.shape == first.shape and im.dtype == first.dtype
            for im in images
        )
    )


def _owned(image: Any, outbox: Outbox) -> Any:
    """``image``, copied where it lies in ``outbox``'s area."""
    if isinstance(image, np.ndarray) and outbox.holds(image):
        return image.copy()
    return image


_part_memory = BatchMemory(2)  # a worker's, for each part's pixels


def _init_worker(
    stores: list[tuple[_Names, dict[str, Any]]],
    stack: bool,
    parent: int,
    kernel: bool,
    landing: Landing | None,
    outbox: Outbox | None,
    batches: BatchArea | None,
) -> None:
    global _worker
    _worker = (stores, stack, landing, outbox, batches)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the reader's to handle
    logger = logging.getLogger("packer")  # every record goes back to the reader's process
    logger.handlers, logger.propagate = [_collected], False
    logger.setLevel(logging.DEBUG)
    die_with_parent(parent, kernel)


def _finish_part(
    store: int, part: Window, epoch: int, into: tuple[int, int, int] | None
) -> tuple[Batch, list[logging.LogRecord]]:
    """``into``: where in the batch area the part's rows go (offset, most rows, bytes a row),
    if its batch has a block there."""
    assert _worker is not None, "not a decode worker"
    stores, stack, landing, outbox, batches = _worker
    names, finish = stores[store]
    _collected.records = []
    sent = part.data if isinstance(part.data, Sent) else None
    if sent is not None:
        assert outbox is not None, "payloads sent through an outbox this worker lacks"
        part = replace(part, data=outbox.received(sent))
    try:
        batch = finish_batch(part, store=cast("Store", names), epoch=epoch, **finish)
        if into is not None and batches is not None and _fits(batch.images, *into[1:]):
            placed = batches.write(into[0], cast("list[np.ndarray]", batch.images))
            return replace(batch, images=placed), _collected.records  # type: ignore[arg-type]
        if stack:  # in memory used again: the part is copied on at once, to a slot or the pipe
            batch = merge_batches([batch], stack, _part_memory)
        if outbox is not None and isinstance(batch.images, list):
            # An image may be its payload as it lies (raw pixels, kept as they are): the slot
            # is another part's once freed, and this one is pickled after that.
            batch.images = [_owned(image, outbox) for image in batch.images]
    finally:
        if sent is not None and outbox is not None:
            outbox.release(sent.slot)
    if landing is not None and isinstance(batch.images, np.ndarray):
        landed = landing.put(batch.images)
        if landed is not None:
            batch = replace(batch, images=landed)  # type: ignore[arg-type]
    return batch, _collected.records
