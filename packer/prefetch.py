"""Prefetching: one producer thread keeps the next batches ready in a bounded queue
while the training step runs on the current one."""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["Prefetcher"]

T = TypeVar("T")

logger = logging.getLogger(__name__)

_POLL_S = 0.1  # both sides block in slices this long, to notice stop / a dead peer
_JOIN_TIMEOUT_S = 5.0  # how long close() waits for the producer before warning

_END = object()  # end-of-source marker sent through the queue


class _Failure:
    """Carries an exception raised in the producer through the queue."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Shared:
    """State shared with the producer, which must never reference the Prefetcher
    (else a Prefetcher dropped without close() could not be collected/finalized)."""

    __slots__ = ("queue", "stop", "thread", "produce_s")

    def __init__(self, depth: int, stop: threading.Event | None) -> None:
        self.queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self.stop = stop if stop is not None else threading.Event()
        self.thread: threading.Thread | None = None
        self.produce_s = 0.0  # written by the producer only


def _put(shared: _Shared, msg: object) -> bool:
    """Puts ``msg`` unless stop is requested first; returns whether it was queued."""
    while not shared.stop.is_set():
        try:
            shared.queue.put(msg, timeout=_POLL_S)
            return True
        except queue.Full:
            pass
    return False


def _produce(source: Callable[[], Iterator[T]], shared: _Shared) -> None:
    """Producer thread body: runs ``source()`` here so its handles belong to this thread."""
    it: Iterator[T] | None = None
    try:
        it = iter(source())
        while not shared.stop.is_set():
            t0 = time.perf_counter()
            try:
                msg: object = next(it)
            except StopIteration:
                msg = _END
            shared.produce_s += time.perf_counter() - t0
            if not _put(shared, msg) or msg is _END:
                return
            del msg  # don't pin a delivered item while producing the next one
    except BaseException as exc:  # forwarded to the consumer, which re-raises it
        _put(shared, _Failure(exc))
    finally:
        # Only this thread may close the generator: closing it from another thread
        # while next() runs here raises "generator already executing".
        close = getattr(it, "close", None)
        if callable(close):
            try:
                close()
            except Exception:
                logger.warning("closing the prefetch source failed", exc_info=True)


def _drain(q: queue.Queue[object]) -> None:
    """Empties ``q``, waking a producer blocked in put(). Its lock is taken with a time limit:
    CPython can raise KeyboardInterrupt in the consumer between a Condition's acquire and its
    with block, which leaves the queue's lock held for good; waiting for it would hang close().
    The producer, blocked on that lock too, is then left behind (close() warns)."""
    if not q.mutex.acquire(timeout=_POLL_S):
        return
    try:
        q.queue.clear()
        q.not_full.notify_all()
    finally:
        q.mutex.release()


def _get(shared: _Shared, thread: threading.Thread, poll: Callable[[], None] | None) -> object:
    """Consumer-side get; raises RuntimeError if the producer died without a message."""
    while True:
        if poll is not None:
            poll()
        try:
            return shared.queue.get(timeout=_POLL_S)
        except queue.Empty:
            if thread.is_alive():
                continue
            try:  # it may have put its last message just before exiting
                return shared.queue.get_nowait()
            except queue.Empty:
                raise RuntimeError(
                    f"prefetch thread {thread.name!r} ended without signalling end of data"
                ) from None


def _shutdown(shared: _Shared) -> None:
    """Stops and joins the producer; shared by close() and the GC finalizer."""
    shared.stop.set()
    _drain(shared.queue)  # frees a slot so a producer blocked in put() wakes now
    thread = shared.thread
    # The finalizer may run from a GC pass triggered in the producer thread itself.
    if thread is not None and thread is not threading.current_thread():
        thread.join(_JOIN_TIMEOUT_S)
        if thread.is_alive():
            logger.warning(
                "prefetch thread %r did not stop within %.1f s; it exits when "
                "the source's current next() returns",
                thread.name,
                _JOIN_TIMEOUT_S,
            )
    _drain(shared.queue)  # drop items put after the first drain (release memory)


class Prefetcher(Generic[T]):
    """Iterator over ``source()``'s items, produced ahead by one background thread.

    Contracts:
        * Ordering: items are delivered exactly once, in the order ``source()`` yields.
        * Bounded: at most ``depth`` ready items are queued, plus the one the producer
          holds while waiting for space, so it runs at most ``depth + 1`` items ahead.
        * Threads: the daemon thread is started lazily by the first ``__next__``
          (never by ``__init__``, so an object created before a fork owns no thread),
          and ``source()`` is called inside it so file handles are opened by the
          thread that reads them. Consumption is single-threaded: call ``__next__``
          from one thread at a time.
        * Errors: an exception raised by ``source()`` or by its iterator is re-raised
          by the next ``__next__`` as the same object, with the producer's frames in
          its traceback; afterwards ``__next__`` raises StopIteration.
        * Lifetime: ``close()`` (or leaving a ``with`` block) stops and joins the
          thread and closes the source iterator (if it has ``close()``, e.g. a
          generator) from the producer thread. A Prefetcher garbage-collected without
          ``close()`` is closed by a finalizer; at interpreter exit nothing is joined
          (the daemon thread just dies), so exit never hangs. ``source`` must not
          reference the Prefetcher, or that finalizer can never run.
        * Interrupts: the consumer waits in short slices, so KeyboardInterrupt raised
          while blocked in ``__next__`` propagates promptly; call ``close()`` after.
          ``poll`` is called before each slice, so a caller that defers its signals
          (packer.packing.interrupts) can raise them there.

    Args:
        source: Zero-argument callable returning the iterator to prefetch from.
        depth: Maximum number of ready items held in the queue (>= 1).
        name: Name of the producer thread.
        stop: The Event set when the Prefetcher stops (close, finalizer): a source that
            shares it can give up long work early, so that close() need not wait for it.
        poll: Called by the consumer each time ``__next__`` waits (every 0.1 s while it
            waits, and once for an item already there); what it raises, ``__next__`` raises.

    Raises:
        ValueError: If ``depth`` < 1.
        RuntimeError: From ``__next__`` if the producer thread is gone without having
            sent the end or an exception (e.g. in a child forked after iteration began).
    """

    def __init__(
        self,
        source: Callable[[], Iterator[T]],
        depth: int = 2,
        name: str = "packer-prefetch",
        stop: threading.Event | None = None,
        poll: Callable[[], None] | None = None,
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got depth={depth!r}")
        self._source = source
        self._depth = depth
        self._name = name
        self._poll = poll
        self._shared = _Shared(depth, stop)
        self._done = False
        # Consumer-side statistics, written by the consuming thread only.
        self._items = self._calls = self._fill_sum = 0
        self._wait_s = 0.0
        self._finalizer = weakref.finalize(self, _shutdown, self._shared)
        self._finalizer.atexit = False  # never join at interpreter exit

    def __iter__(self) -> Prefetcher[T]:
        return self

    def __next__(self) -> T:
        shared = self._shared
        if self._done or shared.stop.is_set():
            raise StopIteration
        thread = shared.thread
        if thread is None:
            thread = threading.Thread(
                target=_produce, args=(self._source, shared), name=self._name, daemon=True
            )
            shared.thread = thread
            thread.start()
        self._calls += 1
        self._fill_sum += shared.queue.qsize()
        t0 = time.perf_counter()
        try:
            msg = _get(shared, thread, self._poll)
        finally:
            self._wait_s += time.perf_counter() - t0
        if isinstance(msg, _Failure) or msg is _END:
            self._done = True
            self._finalizer()  # the producer is exiting: join it, free the queue
            if isinstance(msg, _Failure):
                raise msg.exc  # same object; its traceback keeps the producer frames
            raise StopIteration
        self._items += 1
        return msg  # type: ignore[return-value]

    def close(self) -> None:
        """Stops the producer, joins it and closes the source. Idempotent.

        Waits up to 5 s for the thread; if it is still inside the source's ``next``
        after that, a warning is logged and the thread exits (closing the source)
        as soon as that call returns. Later ``__next__`` calls raise StopIteration.
        """
        self._done = True
        self._finalizer()  # weakref.finalize runs its callback at most once

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def stats(self) -> dict[str, float]:
        """Returns live statistics (cheap; safe to call at any time).

        Returns:
            ``items``: items delivered; ``wait_s``: seconds the consumer spent in
            ``__next__`` waiting for an item; ``produce_s``: seconds the producer spent
            inside the source's ``next``; ``queue_fill``: mean number of ready items
            found in the queue at each ``__next__`` (0..depth), from ``fills`` (their
            sum) and ``waits`` (the calls); ``depth``.
        """
        return {
            "items": self._items,
            "waits": self._calls,
            "fills": self._fill_sum,
            "wait_s": self._wait_s,
            "produce_s": self._shared.produce_s,
            "queue_fill": self._fill_sum / self._calls if self._calls else 0.0,
            "depth": self._depth,
        }
