"""Decoding in worker processes, and the choice between them and the decode threads.

Threads serve large images well on a few cores: libjpeg-turbo, libpng, zlib and CRC-32
release the GIL for the heavy part. A small image is the other way round: of a 32x32 PNG's
~30 us, half is the record's Python (checks, header, arrays) that holds the GIL, and so is
whatever Python the training loop runs beside the reader: threads take turns. The same turns
cap many threads on large images: each holds the GIL for a sliver of every image, and with a
dozen of them the slivers add up to the whole, while the training loop, queueing a GPU's
kernels, waits its turn too. Worker processes each have their own GIL, and leave the
training process's to the training loop.

    producer thread: read_window -> gather -> [bytes of one batch part] --pipe--> worker process
    worker process:  finish_batch (verify, decode, transform) -> one array --pipe--> merged batch

A part goes out as its payloads and metadata, comes back as one array: a copy each way, a
few percent of a small image's decode. For a large image coming back whole, on a few cores,
the copy back costs more than the GIL does, so ``choose`` keeps threads for it.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import signal
import threading
import time
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
from packer.reading.batching import Batch, Window, finish_batch, merge_batches

if TYPE_CHECKING:
    from packer.reading.options import ReaderOptions
    from packer.store.access import Store
    from packer.store.manifest import Manifest

__all__ = ["DECODE_IN", "SMALL_PIXELS", "choose", "ProcessDecoder", "merge_parts"]

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
    stats = manifest.stats or {}
    height = (stats.get("height") or {}).get("mean")
    width = (stats.get("width") or {}).get("mean")
    small = bool(height and width and height * width <= SMALL_PIXELS)
    many = (options.workers or default_workers()) >= MANY_WORKERS
    if not small and not (many and _returned_pixels(options, height, width) <= RETURNED_PIXELS):
        return "threads"
    try:
        _check_sendable(options)
    except UsageError:
        return "threads"  # a transform that only threads can run
    return "processes"


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
        self, workers: int, stores: list[tuple[Path, Manifest, dict[str, Any]]], stack: bool
    ) -> None:
        """``stores``: each store the reader reads (a mixture has several), with finish_batch's
        keywords for it but the store, the stop event and the epoch."""
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
        self._pool = ProcessPoolExecutor(
            workers,
            multiprocessing.get_context(method),
            initializer=_init_worker,
            initargs=(given, stack, os.getpid(), kernel),
        )
        self.pid = os.getpid()
        self._pool.submit(int).result()  # with fork, the first task starts every worker

    def submit(self, store: int, part: Window, epoch: int) -> Future[Batch]:
        """Finish ``part``, records of the reader's ``store``-th store in ``epoch`` (what
        augmentation draws are keyed by), in a worker; its payloads travel as bytes (not
        views of a map).
        What the worker logged (records skipped with on_error="skip") is logged here, as
        the threads would have logged it."""
        if not isinstance(part.data, np.ndarray):
            part = replace(part, data=[p if isinstance(p, bytes) else bytes(p) for p in part.data])
        inner = self._pool.submit(_finish_part, store, part, epoch)
        outer: Future[Batch] = Future()
        outer.add_done_callback(lambda f: inner.cancel() if f.cancelled() else None)
        inner.add_done_callback(partial(_settle, outer))
        return outer

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


def merge_parts(parts: list[Batch], stack: bool) -> Batch:
    """The finished parts of one batch in one Batch: arrays of one shape joined in one copy."""
    arrays = [p.images for p in parts if isinstance(p.images, np.ndarray)]
    joinable = len(arrays) == len(parts) and len({a.shape[1:] for a in arrays}) == 1
    if stack and len(parts) > 1 and joinable:
        return Batch(
            np.concatenate(arrays),
            np.concatenate([p.labels for p in parts]),
            [path for p in parts for path in p.paths],
            sum(p.skipped for p in parts),
            sum(p.nbytes for p in parts),
        )
    return merge_batches(parts, stack)


def _settle(outer: Future[Batch], inner: Future[tuple[Batch, list[logging.LogRecord]]]) -> None:
    if outer.done():  # given up on (cancelled) while the worker ran
        return
    if inner.cancelled():
        outer.cancel()
        return
    error = inner.exception()
    if error is not None:
        outer.set_exception(error)
        return
    batch, records = inner.result()
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


_worker: tuple[list[tuple[_Names, dict[str, Any]]], bool] | None = None
_collected = _Collect()


def _init_worker(
    stores: list[tuple[_Names, dict[str, Any]]], stack: bool, parent: int, kernel: bool
) -> None:
    global _worker
    _worker = (stores, stack)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the reader's to handle
    logger = logging.getLogger("packer")  # every record goes back to the reader's process
    logger.handlers, logger.propagate = [_collected], False
    logger.setLevel(logging.DEBUG)
    die_with_parent(parent, kernel)


def _finish_part(store: int, part: Window, epoch: int) -> tuple[Batch, list[logging.LogRecord]]:
    assert _worker is not None, "not a decode worker"
    stores, stack = _worker
    names, finish = stores[store]
    _collected.records = []
    batch = finish_batch(part, store=cast("Store", names), epoch=epoch, **finish)
    return (merge_batches([batch], stack) if stack else batch), _collected.records
