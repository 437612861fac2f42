"""``pack``: a folder of images in, a pre-shuffled, sharded store out.

    scan -> shuffle -> plan shards -> prepare in a process pool -> shard writers -> commit
                                      (or one Dask task per shard: packer.packing.dask_pack;
                                       a header check of plain JPEGs and PNGs needs no pool)

This is the only module that knows the whole sequence; each step is a function or class
from a module with one job. Each finished shard is recorded in a ledger (``packer.packing.ledger``)
so that the same command resumes an interrupted pack. Locally, only this process writes (one
writer per shard, in turn); the pool's workers only read, check and re-encode. Results come
back in submission order from a bounded window of tasks, so output is identical for the same
seed whatever the number of workers, and memory stays bounded whatever the folder's size.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from packer.about import __version__
from packer.errors import BadImageError, EmptySourceError, PackerError, ResumeError, StoreError
from packer.imaging import decode as imaging
from packer.imaging import headers
from packer.packing import append, interrupts
from packer.packing.file_list import FileList, SourceItem
from packer.packing.ledger import Ledger, PackIdentity, ShardResult, inputs_digest
from packer.packing.options import PackOptions
from packer.packing.prepare import Prepared, Rejected, init_worker, prepare_files, probed
from packer.packing.scan import Skipped
from packer.packing.shard_job import (
    PackContext,
    ShardJob,
    estimated_sizes,
    hashed,
    read_item,
    storage,
    to_record,
    write_shard,
)
from packer.packing.shuffle import new_seed, permutation
from packer.packing.source import Source, load_source
from packer.packing.stats import RecordStats
from packer.prefetch import Prefetcher
from packer.store import backend_for_path, shard_name
from packer.store.hdf5_store import is_disk_full
from packer.store.manifest import Manifest
from packer.store.record import Record, SourceRead
from packer.store.staging import Staging, describe_write_error

__all__ = ["Progress", "PackResult", "pack", "plan_shards"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Progress:
    stage: str  # "scan" (total unknown) or "pack"
    done: int
    total: int | None


ProgressFn = Callable[[Progress], None]


@dataclass
class PackResult:
    """What ``pack`` did: the store and its manifest, how long it took, the files it skipped
    and why, and what a resumed or appending pack kept or added."""

    store: Path
    manifest: Manifest
    seconds: float
    source_bytes: int  # bytes of the source files this run packed
    skipped: list[Skipped] = field(default_factory=list)
    kept_shards: int = 0  # shards an interrupted run had finished, which this one resumed from
    kept_records: int = 0  # records in those shards
    appended_to: int = 0  # with --append: records the store held before
    # with --append, when the store already held these inputs and nothing was added: when
    # they were added ("appended on <date> as shards 2..3")
    already_added: str | None = None

    def skipped_by_reason(self) -> Counter[str]:
        """How many files were skipped for each kind of reason."""
        return Counter(s.reason.split(":", 1)[0] for s in self.skipped)

    def to_json(self) -> dict[str, Any]:
        """The summary ``packer pack --json`` prints."""
        m = self.manifest
        packed_now = m.num_records - self.appended_to - self.kept_records
        return {
            "store": str(self.store),
            "backend": m.backend,
            "packed": m.num_records - self.appended_to,
            "store_records": m.num_records,
            "skipped": len(self.skipped),
            "skipped_by_reason": dict(self.skipped_by_reason()),
            "shards": len(m.shards),
            "source_bytes": self.source_bytes,
            "store_bytes": sum(s.bytes for s in m.shards),
            "seconds": round(self.seconds, 3),
            "kept_shards": self.kept_shards,
            "images_per_s": round(packed_now / self.seconds, 1) if self.seconds else None,
            "mb_per_s": round(self.source_bytes / 1e6 / self.seconds, 1) if self.seconds else None,
            "seed": self._seed(),
            "already_added": self.already_added,
        }

    def _seed(self) -> int | None:
        """This pack's seed: with --append, that of the new shards, not the store's first."""
        if self.already_added is not None:
            return None
        return int(
            self.manifest.source["appends"][-1]["seed"] if self.appended_to else self.manifest.seed
        )


def pack(
    source: Path | str,
    output: Path | str,
    options: PackOptions | None = None,
    *,
    progress: ProgressFn | None = None,
) -> PackResult:
    """Pack the images under ``source`` into a new store at ``output``.

    The store appears at ``output`` only when complete. Shards are written in
    ``output.partial``; after Ctrl-C, a kill or a full disk the finished ones stay there,
    and the same call resumes from them (``options.resume`` insists on it), giving the same
    store an uninterrupted pack would have. After any other error nothing is left. Bad files
    are skipped and listed in the manifest, or stop the pack with ``options.on_error == "fail"``.
    With ``options.append`` the images become new shards of the existing store at ``output``
    (see ``packer.packing.append``), unless the store already holds these inputs: then nothing is
    written and ``already_added`` says when they were; with ``options.dask`` the shards are
    written on a Dask cluster.

    Raises:
        PackerError: a problem the user can act on (see ``packer.errors``).
    """
    started = time.perf_counter()
    source, output = Path(source), Path(output)
    options = options or PackOptions(backend=backend_for_path(output) or "lmdb")
    _check_paths(source, output)
    if options.dask:
        from packer.packing.dask_pack import require_dask  # Dask is an optional extra

        require_dask()  # before the scan, which can take minutes
    src = load_source(
        source,
        options.labels,
        path_column=options.path_column,
        label_columns=options.label_columns,
        progress=(lambda n: progress(Progress("scan", n, None))) if progress else None,
    )
    if options.on_error == "fail" and src.skipped:
        first = src.skipped[0]
        raise BadImageError(str(source / first.path), first.reason)
    digest = inputs_digest(src)
    base: Manifest | None = None
    if options.append:
        base, options = append.open_base(output, options)
        earlier = append.earlier_pack(base, src.root, digest)
        if earlier is not None:
            seconds = time.perf_counter() - started
            return PackResult(
                output, base, seconds, 0, appended_to=base.num_records, already_added=earlier
            )
        src = append.relabel(src, base)
        staging = Staging(output, keep_unfinished=True, staged=append.appending_path(output))
    else:
        staging = Staging(output, options.overwrite, keep_unfinished=True)
    ledger = Ledger(staging.path)
    first_shard = len(base.shards) if base else 0
    identity = PackIdentity.of(
        src, options, f"{base.num_records} records in {first_shard} shards" if base else ""
    )
    try:
        seed = _resume_or_start_over(staging, ledger, identity, options)
        count = len(src.items)
        items = src.items.take(permutation(count, seed)) if options.shuffle else src.items
        plan = plan_shards(estimated_sizes(items, options), options)
        ledger.begin(identity, seed, len(plan))
    except BaseException as e:
        # An unfinished pack of other inputs stays for its own command; nothing else does.
        if ledger.saved_plan() is not None:
            staging.release()
        else:
            staging.discard()
        if isinstance(e, OSError) and is_disk_full(e):  # before the first shard, as after it
            reason = describe_write_error(e, output.parent, "pack")
            raise StoreError(f"{output}: {reason}; nothing was written") from e
        raise

    shards: list[ShardResult] = []

    def make(folder: Path) -> Manifest:
        shards[:] = _write_shards(src, items, plan, options, ledger, progress, first_shard)
        ledger.forget()
        added = _manifest(src, shards, options, seed, digest)
        return append.grown(base, added) if base else added

    def add_to_store(manifest: Manifest) -> None:
        append.add_shards(staging.path, output, manifest, first_shard)

    def resumable() -> str | None:
        finished = ledger.count_finished()
        if not finished:
            return None
        return (
            f"{finished} of {len(plan)} shards are finished and kept in {staging.path}: "
            "run the same command again to resume"
        )

    manifest = staging.build(make, "pack", resumable, add_to_store if base else None)
    skipped = [Skipped(s["path"], s["reason"]) for s in manifest.skipped]
    seconds = time.perf_counter() - started
    kept = [s for s in shards if s.resumed]
    return PackResult(
        output,
        manifest,
        seconds,
        sum(s.source_bytes for s in shards if not s.resumed),
        skipped[len(base.skipped) :] if base else skipped,
        len(kept),
        sum(s.info.num_records for s in kept),
        base.num_records if base else 0,
    )


def _resume_or_start_over(
    staging: Staging, ledger: Ledger, identity: PackIdentity, options: PackOptions
) -> int:
    """The seed of this pack: an unfinished run of the same pack is resumed with its seed;
    anything else left in the staging folder is cleared (or, with ``--resume``, refused)."""
    saved = ledger.saved_plan()
    why_not = identity.difference(saved) if saved is not None else "there is no unfinished pack"
    if why_not is None:
        assert saved is not None
        log.warning("resuming the unfinished pack in %s", staging.path)
        return int(saved["seed"])
    if options.resume:
        raise ResumeError(
            f"cannot resume {staging.final} from {staging.path}: {why_not}; "
            "pack without --resume to start over"
        )
    if saved is not None:
        log.warning("%s: starting over, since %s", staging.path, why_not)
    elif staging.leftovers():
        log.warning("removing %s, left by a run that cannot be resumed", staging.path)
    staging.clear()
    return options.seed if options.seed is not None else new_seed()


def _check_paths(source: Path, output: Path) -> None:
    try:
        output.resolve().relative_to(source.resolve())
    except ValueError:
        return
    raise PackerError(f"{output} is inside the source folder {source}; write the store elsewhere")


def plan_shards(sizes: Sequence[int] | np.ndarray, options: PackOptions) -> list[range]:
    """Split the packed order into shards: ``options.shards`` equal counts, or runs of about
    ``options.shard_size`` estimated bytes. Planned up front, from sizes known before any
    image is read, so the plan is the same on every run of the same inputs."""
    n = len(sizes)
    if options.shards is not None:
        count = min(options.shards, n)
        bounds = [round(i * n / count) for i in range(count + 1)]
        return [range(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    plan, start, filled = [], 0, 0
    for first in range(0, n, _PLAN_CHUNK):  # Python ints a chunk at a time, not n at once
        for i, nbytes in enumerate(list(sizes[first : first + _PLAN_CHUNK]), first):
            if filled and filled + nbytes > options.shard_size:
                plan.append(range(start, i))
                start, filled = i, 0
            filled += nbytes
    plan.append(range(start, n))
    return plan


_PLAN_CHUNK = 1 << 16


def _write_shards(
    src: Source,
    items: FileList,
    plan: list[range],
    options: PackOptions,
    ledger: Ledger,
    progress: ProgressFn | None,
    first: int = 0,
) -> list[ShardResult]:
    """Write every shard of ``plan`` (numbered from ``first``) that the ledger does not
    already hold as finished, here or on a Dask cluster; each is recorded in the ledger as
    soon as it is done."""
    context = PackContext(src.root, [c.to_json() for c in src.columns], options)
    paths = [ledger.folder / shard_name(options.backend, first + i) for i in range(len(plan))]
    results: list[ShardResult | None] = [ledger.finished(path) for path in paths]
    jobs = [
        ShardJob(first + i, paths[i], items[plan[i].start : plan[i].stop])
        for i, result in enumerate(results)
        if result is None
    ]
    for job in jobs:
        ledger.clear(job.path)
    counter = _Counter(len(items) - sum(len(job.items) for job in jobs), len(items), progress)
    if options.dask:
        from packer.packing.dask_pack import write_on_cluster  # Dask is an optional extra

        written = write_on_cluster(jobs, context, ledger, counter.add)
    else:
        written = _write_here(jobs, context, ledger, counter.add)
    for index, result in written:
        results[index - first] = result
    finished = [r for r in results if r is not None]
    if not any(r.info.num_records for r in finished):
        all_skipped = src.skipped + [s for r in finished for s in r.skipped]
        reasons = Counter(s.reason for s in all_skipped).most_common(3)
        raise EmptySourceError(
            f"{src.root}: none of {len(items)} files could be packed "
            f"(most common reasons: {'; '.join(f'{r} x{n}' for r, n in reasons)})"
        )
    return finished


class _Counter:
    """Records handled so far, reported to the progress callback."""

    def __init__(self, done: int, total: int, progress: ProgressFn | None) -> None:
        self.done, self.total, self.progress = done, total, progress

    def add(self, records: int = 1) -> None:
        self.done += records
        if self.progress is not None:
            self.progress(Progress("pack", self.done, self.total))


def _write_here(
    jobs: list[ShardJob], context: PackContext, ledger: Ledger, step: Callable[[], None]
) -> Iterator[tuple[int, ShardResult]]:
    """Write the shards in this process, in turn, from one ordered stream of records that
    the worker pool prepares for all of them (the read-ahead thread, for a header check of
    plain JPEGs and PNGs: _plain_sample)."""
    items = FileList.concat([job.items for job in jobs])
    options, root = context.options, context.root
    # Ctrl-C and SIGTERM are raised only where the writer waits for records (interrupts).
    with interrupts.Deferred() as signals:
        # One thread reads and checksums the source bytes and keeps up to _AHEAD_BYTES of
        # records ready, while this one writes. It, not the writer, keeps the pool's window of
        # tasks full, so workers never wait for a commit or a fsync.
        pool: ProcessPoolExecutor | _PoolOnDemand
        if options.probes_only and _plain_sample(root, items, options):
            pool = _PoolOnDemand(options)
            pieces = lambda: _read_and_vouch(root, items, pool, options)  # noqa: E731
        else:
            pool = _start_pool(options)
            pieces = lambda: _read_ahead(  # noqa: E731
                root, items, _prepared_in_order(pool, root, items, options), options
            )
        ahead: Prefetcher[list[Record | Skipped]] = Prefetcher(
            pieces, depth=_AHEAD_BYTES // _PIECE_BYTES, name="packer-read", poll=signals.check
        )
        records = itertools.chain.from_iterable(ahead)
        try:
            # A finished shard is hashed, synced and recorded (Ledger.finish syncs it) while
            # the next one is written: the writer never waits for a shard's fsync.
            with ThreadPoolExecutor(1, thread_name_prefix="packer-hash") as hasher:
                finishing = []
                for job in jobs:
                    result = write_shard(job, context, records, step, sync=False)
                    finishing.append((job, hasher.submit(_finish, ledger, job.path, result)))
                for job, future in finishing:
                    yield job.index, future.result()
        finally:
            ahead.close()  # stops and joins the read-ahead thread on an error
            pool.shutdown(wait=True, cancel_futures=True)


def _finish(ledger: Ledger, path: Path, result: ShardResult) -> ShardResult:
    result = hashed(path, result)
    ledger.finish(path, result)  # only once the shard is on disk
    return result


_AHEAD_BYTES = 64 << 20  # records queued ahead of the writer (plus the pieces in hand at each end)
_PIECE_BYTES = 4 << 20  # records are handed over in pieces of at most this (or one record)


def _read_ahead(
    root: Path,
    items: FileList,
    tasks: Iterator[list[Prepared | Rejected]],
    options: PackOptions,
) -> Iterator[list[Record | Skipped]]:
    """The records of ``items`` in order, in pieces of at most one pool task and _PIECE_BYTES
    (or a single record), so that the writer gets each piece as soon as it is read; runs in
    the read-ahead thread (reads and CRC-32 release the GIL)."""
    done = 0
    for results in tasks:
        piece: list[Record | Skipped] = []
        nbytes = 0
        for item, result in zip(items[done : done + len(results)], results):
            if piece and nbytes + item.size > _PIECE_BYTES:
                yield piece
                piece, nbytes = [], 0
            piece.append(to_record(root, item, result, options))
            nbytes += item.size
        done += len(results)
        yield piece


def _plain_sample(root: Path, items: FileList, options: PackOptions) -> bool:
    """Whether packer.imaging.headers vouches for each of the first _SAMPLE files (in packed, so
    random, order): how a header check is to run.

    A folder of plain JPEGs and PNGs, the common case, is checked in the read-ahead thread
    (_read_and_vouch), and a pool is started only for an odd file among them. Any other
    folder is checked in a pool started now, whose workers read each header in turn (with
    packer.imaging.headers, and Pillow for the rest) a window of tasks ahead of the reads, as a full
    check runs: the pool's start with forkserver later, once threads run (~0.3 s), and its
    answers coming behind the reads made a folder of odd files 2.3 and 1.15 times slower
    (docs/design-notes.md)."""
    for path in (os.path.join(root, item.path) for item in items[:_SAMPLE]):
        try:
            if headers.vouch_file(path, options.max_pixels) is None:
                return False
        except OSError:
            return False  # reported when it is read
    return True


_SAMPLE = 32


def _read_and_vouch(
    root: Path, items: FileList, pool: _PoolOnDemand, options: PackOptions
) -> Iterator[list[Record | Skipped]]:
    """``--check header``: the records of ``items`` in order, in pieces (as _read_ahead).

    Each file is read first, then its header checked where its bytes are by
    packer.imaging.headers, which vouches for plain JPEGs and PNGs exactly as Pillow would; only
    the files it leaves to Pillow go to the pool. (Probing every file in the pool made a
    warm pack take half as long again as no check at all: docs/design-notes.md.) A piece waits
    for the pool's answers while the pieces after it are read, up to _AHEAD_BYTES of them.
    """
    # Offsets of each file in the stream of bytes to read: 8 bytes a file, not a list of
    # paths and Python ints (~150 bytes a file).
    ends = np.concatenate([[0], np.cumsum(items.sizes)])
    hinted = 0  # items[:hinted] announced to the kernel
    waiting: deque[
        tuple[int, int, list[Record | Skipped | SourceRead], list[str], Future[Any] | None]
    ]
    waiting = deque()  # pieces read: (first item, end, records, files asked about, answers)
    start = 0
    while start < len(items):
        # A piece: up to _VOUCH_FILES files and _PIECE_BYTES (or one file).
        stop = _bisect_right(ends, ends[start] + _PIECE_BYTES, start + 2) - 1
        stop = min(stop, start + _VOUCH_FILES, len(items))
        reach = _bisect_right(ends, ends[start] + _HINT_BYTES) - 1
        if reach > hinted:
            ahead = items[hinted:reach]
            _will_read(_paths(root, ahead), ahead.sizes.tolist(), _HINT_BYTES)
            hinted = reach
        piece = [_vouched(root, item, options) for item in items[start:stop]]
        doubtful = [
            os.path.join(root, items[start + k].path)
            for k, r in enumerate(piece)
            if isinstance(r, SourceRead)
        ]
        asked = pool.probe(doubtful) if doubtful else None
        waiting.append((start, stop, piece, doubtful, asked))
        start = stop
        while waiting and (
            waiting[0][4] is None
            or waiting[0][4].done()
            or ends[start] - ends[waiting[0][0]] > _AHEAD_BYTES
        ):
            yield _answered(*waiting.popleft(), items)
    while waiting:
        yield _answered(*waiting.popleft(), items)


_VOUCH_FILES = 128  # files a piece at most (as the pool's tasks of header probes)


def _bisect_right(ends: np.ndarray, value: int, low: int = 0) -> int:
    """bisect.bisect_right(ends, value, low), on an array."""
    return max(low, int(np.searchsorted(ends, value, side="right")))


def _paths(root: Path, items: FileList) -> list[str]:
    return [os.path.join(root, item.path) for item in items]


def _vouched(root: Path, item: SourceItem, options: PackOptions) -> Record | Skipped | SourceRead:
    """The record of ``item`` where packer.imaging.headers vouches for its bytes; else the bytes,
    for Pillow to judge."""
    read = read_item(root, item, options)
    if isinstance(read, Skipped):
        return read
    info = headers.vouch(read.data, options.max_pixels)
    if info is None:
        return read
    known = probed(info, options.mode)
    return read.record(known.shape, known.format)


def _answered(
    start: int,
    stop: int,
    piece: list[Record | Skipped | SourceRead],
    doubtful: list[str],
    asked: Future[list[Prepared | Rejected]] | None,
    items: FileList,
) -> list[Record | Skipped]:
    """A piece of _read_and_vouch with the pool's answers for the files it asked about
    (``doubtful``, its SourceReads in order)."""
    answers = iter(_result(doubtful, asked) if asked is not None else ())
    done: list[Record | Skipped] = []
    for item, read in zip(items[start:stop], piece):
        if isinstance(read, SourceRead):
            answer = next(answers)
            if isinstance(answer, Rejected):
                read = Skipped(item.path, answer.reason)
            else:
                read = read.record(answer.shape, answer.format)
        done.append(read)
    return done


class _PoolOnDemand:
    """The worker pool of a header check, started when a file first needs Pillow: a folder
    of plain JPEGs and PNGs never starts it. By then this pack has threads, so its workers
    start with forkserver (_start_pool): 0.3-0.5 s, once."""

    def __init__(self, options: PackOptions) -> None:
        self.options = options
        self.pool: ProcessPoolExecutor | None = None

    def probe(self, paths: list[str]) -> Future[list[Prepared | Rejected]]:
        """Pillow's header check of the files at ``paths``, in the pool."""
        if self.pool is None:
            self.pool = _start_pool(self.options)
        return self.pool.submit(prepare_files, paths)

    def shutdown(self, wait: bool, cancel_futures: bool) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=wait, cancel_futures=cancel_futures)


def _start_pool(options: PackOptions) -> ProcessPoolExecutor:
    """The worker pool, its processes started now, before this pack opens a shard or a thread.

    fork starts workers in milliseconds (forkserver in a good part of a second) and is safe at
    this point: workers only run Pillow and never touch the parent's handles. If the calling
    program has threads of its own, a fork could copy a lock one of them holds, so forkserver
    is used. Forked workers inherit Pillow's plugins, imported here once: otherwise each
    worker imported them all on its first file, at the start of every pack.
    """
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        method = "fork"
        imaging.load_plugins()
    else:
        method = "forkserver" if "forkserver" in methods else "spawn"
    pool = ProcessPoolExecutor(
        options.num_workers,
        multiprocessing.get_context(method),
        initializer=init_worker,
        # forkserver's workers are the forkserver's children, which dies with this process
        initargs=(options, 0 if method == "forkserver" else os.getpid()),
    )
    pool.submit(int).result()  # with fork, every worker process is started by the first task
    return pool


def _prepared_in_order(
    pool: ProcessPoolExecutor, root: Path, items: FileList, options: PackOptions
) -> Iterator[list[Prepared | Rejected]]:
    """Results for ``items``' files in order, one list per task, from the pool, through a
    bounded window of tasks whose files are announced to the kernel."""
    workers = options.num_workers
    # A header probe is tens of microseconds, a decode milliseconds: probes go in bigger
    # tasks, so that pool round trips do not outweigh them; decodes in small ones, which
    # balance the workers.
    cap = 128 if options.probes_only else 32
    task_size = max(1, min(cap, len(items) // (workers * 8)))
    window = workers * 4
    pending: deque[tuple[list[str], int, Future[list[Prepared | Rejected]]]] = deque()
    hinted = 0  # bytes announced for the pending tasks

    def done() -> list[Prepared | Rejected]:
        nonlocal hinted
        batch, announced, future = pending.popleft()
        hinted -= announced
        return _result(batch, future)

    try:
        for start in range(0, len(items), task_size):
            part = items[start : start + task_size]
            batch = _paths(root, part)
            announced = _will_read(batch, part.sizes.tolist(), _HINT_BYTES - hinted)
            hinted += announced
            pending.append((batch, announced, pool.submit(prepare_files, batch)))
            if len(pending) >= window:
                yield done()
        while pending:
            yield done()
    finally:
        for _, _, future in pending:
            future.cancel()


# Source bytes announced ahead at most: a window of tasks of large files (8 tasks of 128
# files here) could otherwise ask the kernel for more than memory holds, and have it evict
# the first files before they are read. Less than this left cold header packs waiting on the
# disk; more gained little (benchmarks/bench_pack.py, cold).
_HINT_BYTES = 128 << 20


def _will_read(paths: list[str], sizes: list[int], budget: int) -> int:
    """Ask the kernel to start reading ``paths`` now (POSIX_FADV_WILLNEED), in order, as long
    as their ``sizes`` fit in ``budget`` bytes; returns the bytes announced. Called as their
    task goes to the pool, a window of tasks before the writer needs their bytes: on a cold
    disk the reads are then in flight, many at a time, while earlier files are checked and
    written, where otherwise each file's header probe and then its read waited on the disk
    in turn. Warm files cost an open and a close. A file that cannot be opened is left to
    the read that will report it; O_NONBLOCK: a FIFO put in a file's place must not hang."""
    if not hasattr(os, "posix_fadvise"):  # macOS, Windows
        return 0
    announced = 0
    for path, size in zip(paths, sizes):
        if announced + size > budget:
            break
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            announced += size
        except OSError:
            pass  # a hint only
        finally:
            os.close(fd)
    return announced


def _result(
    batch: list[str], future: Future[list[Prepared | Rejected]]
) -> list[Prepared | Rejected]:
    try:
        return future.result()
    except BrokenProcessPool as e:
        raise PackerError(
            f"a worker process died while reading one of {len(batch)} files starting at "
            f"{batch[0]} (a decoder crash or out of memory); move the file aside and pack again"
        ) from e


def _manifest(
    src: Source, shards: list[ShardResult], options: PackOptions, seed: int, digest: str
) -> Manifest:
    stats = RecordStats(len(src.columns))
    shapes: set[tuple[int, int, int]] = set()
    for shard in shards:
        stats.merge(shard.stats)
        shapes.update(shard.shapes)
    common_shape = list(next(iter(shapes))) if len(shapes) == 1 else None
    skipped = src.skipped + [s for shard in shards for s in shard.skipped]
    return Manifest(
        backend=options.backend,
        num_records=sum(s.info.num_records for s in shards),
        shards=[s.info for s in shards],
        storage=storage(options, common_shape),
        label_source=src.label_source,
        label_columns=[c.to_json() for c in src.columns],
        seed=seed,
        shuffled=options.shuffle,
        packer_version=__version__,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        options=options.to_json(),
        stats=stats.to_json(),
        skipped=[{"path": s.path, "reason": s.reason} for s in skipped],
        source={
            "root": str(src.root.resolve()),
            "files": len(src.items) + len(src.skipped),
            "packed_bytes": sum(s.source_bytes for s in shards),
            "inputs_sha256": digest,  # ledger.inputs_digest: how an append knows it ran before
        },
    )
