"""Reading ahead: the bytes of an epoch's next chunks read in large sequential requests,
in a thread of their own, while the chunks before them are gathered and decoded.

    spans, in read order -> [read-ahead thread: extents, then reads front to back] -> take(i)
                                                                         -> read_window

A store is mostly larger than memory, on a disk or share whose cost is per request. Read
through a memory map or HDF5's own small reads, the chunks of a shuffled epoch become many
small requests (a page fault's read-around, a column's slice), each paying the device's
per-request price, and nothing is read while a window decodes. Here each chunk's byte ranges
(its payloads, as the shard reader tells them) are read in 512 KB steps, which the kernel's
sequential read-ahead turns into requests of a megabyte or more, its last few megabytes first
so that the kernel's read-ahead stops at its end (``_read``), up to ``depth`` chunks ahead of
the reader, into buffers that go back to the system once taken (``_fresh``). The shard
readers then take the payloads from these bytes, so they are not copied again. Anything this
thread cannot read (no extents, a short file, damage) is left to the usual reads, which report
it.

An epoch's read-ahead runs on into the first chunks of the next (``then``) while the last
window decodes and its batches in flight are taken, until the next epoch starts and takes
their bytes (``leftover``, ``carried``): else each epoch would start by waiting for a whole
window with nothing to decode.
"""

from __future__ import annotations

import mmap
import os
import random
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from packer.fork_gate import FORK_GATE
from packer.reading.epoch import Span
from packer.store.access import Store
from packer.store.base import Fetched

__all__ = [
    "ReadAhead",
    "SUPPORTED",
    "auto_depth",
    "memory_for_cache",
    "share_not_in_memory",
    "store_bytes",
]

# Consecutive reads of this size let the kernel's read-ahead grow its window and the page
# cache's folios, so the device sees requests of 1 MB and more; one read of a whole range
# is split into small requests instead (measured on a throttled loop device:
# docs/benchmarks/storage.md).
_STEP = 512 << 10
_OPEN_FILES = 16
MIN_DEPTH = 2  # chunks: two keep a disk busy while one is taken
# POSIX with the kernel's advice (Linux, the BSDs); elsewhere the reader reads as it did.
SUPPORTED = hasattr(os, "preadv") and hasattr(os, "posix_fadvise")
_PROBES = random.Random()  # where share_not_in_memory looks; not the user's random state


class ReadAhead:
    """Reads the byte ranges of ``spans`` of the store at ``path``, in order, at most
    ``depth`` spans ahead of the last one taken, then on into ``then()`` (the next epoch's
    spans), whose bytes ``leftover()`` hands to the next epoch's ReadAhead as its
    ``carried``. Not thread-safe: one thread takes."""

    def __init__(
        self,
        path: Path,
        spans: Sequence[Span],
        depth: int,
        then: Callable[[], Sequence[Span]] | None = None,
        carried: dict[Span, Fetched] | None = None,
    ) -> None:
        self._path, self._spans, self._depth = path, list(spans), depth
        # Planned by this thread once it gets there, not as the epoch starts.
        self._next, self._then = then, len(self._spans)
        # Already read: ready without a read. Only this epoch's first spans can have been
        # (another epoch's, or a resumed one's, are let go at once).
        first = set(self._spans[:depth])
        self._carried = {s: f for s, f in (carried or {}).items() if s in first}
        # A store larger than the memory there is cannot stay in the page cache anyway:
        # its bytes are dropped from it once copied here.
        self._uncached = store_bytes(path) > memory_for_cache()
        self._ready: dict[int, Fetched | None] = {}
        self._wanted = 0  # the first span the reader may still ask for
        self._done = False  # the thread has ended: spans not ready will never be
        self._closed = False
        self._lock = threading.Condition()
        # A forked child inherits this object but not its thread, and maybe the lock held.
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="packer-read-ahead", daemon=True)
        self._thread.start()

    def take(self, index: int) -> Fetched | None:
        """The fetched bytes of span ``index``, waiting for them; None where they were not
        read (the caller reads the span itself). Spans before ``index`` are given up."""
        with self._lock:
            self._wanted = max(self._wanted, index)
            for passed in [i for i in self._ready if i < index]:
                del self._ready[passed]
            self._lock.notify_all()
            while index not in self._ready and not self._done:
                self._lock.wait()
            self._wanted = max(self._wanted, index + 1)
            self._lock.notify_all()
            return self._ready.pop(index, None)

    def leftover(self) -> dict[Span, Fetched]:
        """Stop reading ahead, and give up the bytes read of ``then``, by span (none in a
        forked child: its lock may have been held when the process forked)."""
        if os.getpid() != self._pid:
            return {}
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._thread.join(timeout=5.0)
        with self._lock:
            read = {i: f for i, f in self._ready.items() if i >= self._then and f is not None}
            return {self._spans[i]: fetched for i, fetched in read.items()}

    def close(self) -> None:
        if os.getpid() != self._pid:  # a forked child's copy: nothing runs here to stop
            return
        with self._lock:
            self._closed = True
            self._ready.clear()
            self._lock.notify_all()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        store: Store | None = None
        files = _Files()
        warmed: set[int] = set()  # shards whose index bytes were read
        try:
            store = Store(self._path)
            for index, span in enumerate(self._upcoming()):
                with self._lock:
                    while not self._closed and index >= self._wanted + self._depth:
                        self._lock.wait()
                    if self._closed:
                        return
                    if index < self._wanted:  # passed by already
                        continue
                fetched = self._carried.pop(span, None) or self._fetch(store, files, span, warmed)
                with self._lock:
                    self._ready[index] = fetched
                    self._lock.notify_all()
        except Exception:  # the store cannot be opened here: the reads proper will say why
            pass
        finally:
            with self._lock:
                self._done = True
                self._lock.notify_all()
            files.close()
            if store is not None:
                with FORK_GATE:
                    store.close()

    def _upcoming(self) -> Iterator[Span]:
        """The spans to read, and once they are read, the next epoch's."""
        yield from self._spans
        if self._next is not None:
            following = list(self._next())
            self._spans += following
            yield from following

    def _fetch(self, store: Store, files: _Files, span: Span, warmed: set[int]) -> Fetched | None:
        try:
            with FORK_GATE:  # HDF5's and LMDB's locks must not be held across a fork
                shard = store.shard(span.shard)
                ranges = shard.extents(span.start, span.stop)
                index = shard.index_extents() if span.shard not in warmed else []
            warmed.add(span.shard)
            fds = files.get(store.path / store.manifest.shards[span.shard].file)
            for offset, length in index:  # into the page cache, for the reader's own reads
                _read(fds, offset, length)
            got = [(offset, _read(fds, offset, length)) for offset, length in ranges]
            if self._uncached:  # our copy is the one used: the cache's would only crowd out
                for offset, length in ranges:  # the pages still being read ahead
                    os.posix_fadvise(fds.exact, offset, length, os.POSIX_FADV_DONTNEED)
        except Exception:  # damage or an unreadable file: the read proper names it
            return None
        if not got or any(data is None for _, data in got):
            return None
        return Fetched([(offset, data) for offset, data in got if data is not None])


def store_bytes(path: Path) -> int:
    """Bytes of the files of the store at ``path``."""
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def share_not_in_memory(files: Sequence[Path], samples: int = 32) -> float | None:
    """About what share of ``files``' bytes the page cache does not hold: ``samples`` pages,
    spread evenly over them, each read without waiting for the device (RWF_NOWAIT: a page
    not in memory fails at once). None where this system cannot tell.

    The probes read through a descriptor advised as random, so a page not in memory costs
    one page read in the background, not the kernel's read-around; each call probes other
    pages (one at random in each of ``samples`` equal stretches), not those the last one
    brought in."""
    nowait = getattr(os, "RWF_NOWAIT", None)
    sizes = []
    for file in files:
        try:
            sizes.append(file.stat().st_size)
        except OSError:
            return None
    total = sum(sizes)
    if nowait is None or not total:
        return None
    missing = 0
    byte = bytearray(1)
    positions = [(k + _PROBES.random()) * total / samples for k in range(samples)]
    start = 0
    for file, size in zip(files, sizes, strict=True):
        mine = [int(at) - start for at in positions if start <= at < start + size]
        start += size
        if not mine:
            continue
        try:
            fd = os.open(file, os.O_RDONLY)
        except OSError:
            return None
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            for offset in mine:
                try:
                    os.preadv(fd, [byte], offset, nowait)  # one byte: its page or nothing
                except BlockingIOError:
                    missing += 1
        except OSError:  # a file system that cannot read without waiting
            return None
        finally:
            os.close(fd)
    return missing / samples


def auto_depth(window_chunks: int, chunk_bytes: float, memory: int, reserved: float = 0) -> int:
    """Chunks to read ahead of a store the page cache cannot hold: a whole shuffle window, so
    that the next window is read while this one is decoded, in at most half of what
    ``memory`` leaves beside the reader's other buffers (``reserved``: its window and the
    batches in flight), and never fewer than MIN_DEPTH.

    Two chunks keep the disk busy while raw records are read, but decoding a window takes as
    long as reading one: with two, the rest of each window was read while the decode threads
    waited (benchmarks/bench_storage.py, decoded epochs)."""
    fits = int(max(0.0, (memory - reserved) / 2) // max(chunk_bytes, 1.0))
    return max(MIN_DEPTH, min(window_chunks, fits))


def memory_for_cache() -> int:
    """Bytes the page cache may hold for this process: the memory available on the machine,
    or under this process's cgroup limit where that is less (a container, a job's cap)."""
    available = 1 << 62
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) << 10
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, group = line.split(":", 2)
            if controllers in ("", "memory") or "memory" in controllers.split(","):
                v1 = Path("/sys/fs/cgroup/memory") / group.lstrip("/") / "memory.limit_in_bytes"
                v2 = Path("/sys/fs/cgroup") / group.lstrip("/") / "memory.max"
                for limit in (v1, v2):
                    if limit.is_file() and limit.read_text().strip().isdigit():
                        available = min(available, int(limit.read_text()))
    except (OSError, ValueError):
        pass
    return available


def _read(fds: _Descriptors, offset: int, length: int) -> memoryview | None:
    """``length`` bytes of the file at ``offset``; None if the file ends first.

    The last ``fds.tail`` bytes are read first, in one request without the kernel's
    read-ahead, then the rest front to back in _STEP reads with it. Read last, the tail met
    the pages the kernel had marked to start its next read-ahead, which then ran on past the
    range into another chunk's bytes: read for nothing where that chunk is not read soon (a
    mixture reads part of each store's chunks an epoch; benchmarks/bench_mix_storage.py).
    Read first, it is in memory before the read-ahead of the rest, at most two windows
    ahead, reaches it."""
    view = _fresh(length)
    body = max(0, length - fds.tail)
    for fd, start, stop, step in (
        (fds.exact, body, length, length),
        (fds.sequential, 0, body, _STEP),
    ):
        done = start
        while done < stop:
            n = os.preadv(fd, [view[done : min(done + step, stop)]], offset + done)
            if n <= 0:
                return None
            done += n
    return view


# Private: a forked child (a DataLoader worker) gets its own copy on write, as of malloc's.
_PRIVATE = {"flags": mmap.MAP_PRIVATE} if hasattr(mmap, "MAP_PRIVATE") else {}


def _fresh(nbytes: int) -> memoryview:
    """``nbytes`` zeroed bytes of an anonymous map of their own, unmapped when the last view
    goes. Through malloc, glibc raises its threshold for mapping a request to the largest map
    freed, so after the first chunk every chunk's buffer came from this thread's heap, which
    fragments: a reader's process grew epoch after epoch until a memory cap that one store's
    reads fitted in killed a mixture of two (benchmarks/bench_mix_storage.py). A block's
    smaller copies stay with malloc, whose reuse spares them a fresh map's page faults."""
    if nbytes <= 0:
        return memoryview(bytearray(0))
    return memoryview(mmap.mmap(-1, nbytes, **_PRIVATE))


class _Descriptors:
    """Two descriptors of one file: one the kernel reads ahead on, one it does not."""

    def __init__(self, path: Path) -> None:
        self.sequential = os.open(path, os.O_RDONLY)
        self.exact = os.open(path, os.O_RDONLY)
        os.posix_fadvise(self.exact, 0, 0, os.POSIX_FADV_RANDOM)
        # The kernel reads up to two windows ahead of a sequential reader.
        self.tail = 2 * _window_bytes(self.sequential)

    def close(self) -> None:
        os.close(self.sequential)
        os.close(self.exact)


def _window_bytes(fd: int) -> int:
    """The kernel's read-ahead window for the device holding ``fd``'s file (its backing
    device's read_ahead_kb: a disk's, or a network file system's); 2 MB where unknown."""
    device = os.fstat(fd).st_dev
    try:
        text = Path(f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb")
        return int(text.read_text()) << 10
    except (OSError, ValueError):
        return 2 << 20


class _Files:
    """Descriptors of the shard files read lately, at most _OPEN_FILES of them. The reads
    go through descriptors of their own: the kernel keeps read-ahead state per descriptor,
    and these read nothing but ranges front to back."""

    def __init__(self) -> None:
        self._open: OrderedDict[Path, _Descriptors] = OrderedDict()

    def get(self, path: Path) -> _Descriptors:
        fds = self._open.get(path)
        if fds is None:
            fds = self._open[path] = _Descriptors(path)
            while len(self._open) > _OPEN_FILES:
                self._open.popitem(last=False)[1].close()
        self._open.move_to_end(path)
        return fds

    def close(self) -> None:
        for fds in self._open.values():
            fds.close()
        self._open.clear()
