"""One shard of a pack: its source files' records in, a finished shard file out.

The same function writes a shard whether the records come from the local pack's worker
pool or are prepared inside a Dask task, so both ways write byte-identical shards.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packer.errors import BadImageError
from packer.packing.file_list import FileList, SourceItem
from packer.packing.ledger import ShardResult
from packer.packing.options import PackOptions
from packer.packing.prepare import Prepared, Rejected
from packer.packing.scan import Skipped
from packer.packing.stats import RecordStats
from packer.store import ShardMeta, open_shard_writer
from packer.store.manifest import ShardInfo, Storage
from packer.store.record import Record, SourceRead, read_source

__all__ = [
    "PackContext",
    "ShardJob",
    "estimated_bytes",
    "read_item",
    "storage",
    "to_record",
    "write_shard",
]


@dataclass(frozen=True)
class PackContext:
    """What every shard of one pack shares."""

    root: Path  # the source folder
    columns: list[dict[str, Any]]  # label columns, as the manifest lists them
    options: PackOptions


@dataclass(frozen=True)
class ShardJob:
    index: int
    path: Path  # where the finished shard belongs
    items: FileList  # its source files, in store order


def write_shard(
    job: ShardJob,
    context: PackContext,
    records: Iterator[Record | Skipped],
    step: Callable[[], None] = lambda: None,
    to: Path | None = None,
    sync: bool = True,
) -> ShardResult:
    """Write ``job``'s shard at ``to`` (default ``job.path``) from the next ``len(job.items)``
    records, calling ``step`` after each. The result's ``info`` has the counts, not yet the
    file's hash. Without ``sync`` the caller fsyncs the file (a pack's Ledger.finish does).
    On any error the half-written file is removed."""
    options = context.options
    path = to or job.path
    meta = ShardMeta.of_store(
        job.index,
        options.backend,
        storage(options, None),
        context.columns,
        options.fixed_shape(),
    )
    expected = int(estimated_sizes(job.items, options).sum())
    writer = open_shard_writer(options.backend, path, meta, expected)
    result = ShardResult(ShardInfo(job.path.name, 0, 0, "", 0), RecordStats(len(context.columns)))
    writeback = _Writeback(path)
    try:
        for item in job.items:
            record = next(records)
            if isinstance(record, Skipped):
                if options.on_error == "fail":
                    raise BadImageError(str(context.root / item.path), record.reason)
                result.skipped.append(record)
            else:
                writer.append(record)
                writeback.wrote(len(record.data))
                result.info.num_records += 1
                result.info.payload_bytes += len(record.data)
                result.source_bytes += item.size
                result.stats.add(len(record.data), record.shape, record.format, record.labels)
                result.add_shape(record.shape)
            step()
        writeback.close()
        writer.close(sync)
    except BaseException:
        writeback.close(check=False)
        writer.abort()
        path.unlink(missing_ok=True)  # a half shard is no use to a resume, and frees the space
        raise
    return result


class _Writeback:
    """Has the kernel write a shard's pages to disk while the shard is being written, so
    that the fsync in the writer's ``close`` finds little left to do. Without it that fsync
    waited for the whole shard (~0.1 s per 200 MB here) at the end of a pack, with the
    worker pool idle. Durability does not rest on this: ``close`` still syncs everything.

    After each ``every`` bytes written, a thread calls fdatasync on its own descriptor of
    the file (the call releases the GIL); a request made while one runs is merged into the
    next. A shard smaller than ``every`` never starts the thread.
    """

    def __init__(self, path: Path, every: int = 32 << 20) -> None:
        self._path = path
        self._every = every
        self._unsynced = 0
        self._wake = threading.Event()
        self._stopping = False
        self._error: OSError | None = None
        self._thread: threading.Thread | None = None

    def wrote(self, nbytes: int) -> None:
        self._unsynced += nbytes
        if self._unsynced < self._every:
            return
        self._unsynced = 0
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="packer-writeback", daemon=True)
            self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        sync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync
        fd = None
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stopping:
                    return
                if fd is None:
                    fd = os.open(self._path, os.O_RDONLY)
                sync(fd)
        except OSError as e:  # the writer's own fsync would meet it too; close raises it
            self._error = e
        finally:
            if fd is not None:
                os.close(fd)

    def close(self, check: bool = True) -> None:
        """Stop the thread; raise the error a sync met, if any (unless not ``check``)."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        if check and self._error is not None:
            raise self._error


def hashed(path: Path, result: ShardResult) -> ShardResult:
    """``result`` with its ``info`` completed from the finished file at ``path``."""
    result.info = ShardInfo.of_file(path, result.info.num_records, result.info.payload_bytes)
    return result


def to_record(
    root: Path, item: SourceItem, result: Prepared | Rejected, options: PackOptions
) -> Record | Skipped:
    """The record for ``item`` from what a worker made of it. Source bytes stored as they
    are (the original payload) are read here, unless the worker kept them."""
    if isinstance(result, Rejected):
        return Skipped(item.path, result.reason)
    labels, shape, fmt = item.labels, result.shape, result.format
    if options.payload != "original" or result.payload is not None:
        assert result.payload is not None and result.crc32 is not None
        if options.payload == "original" and len(result.payload) != item.size:
            return Skipped(item.path, _CHANGED)
        return Record(result.payload, labels, item.path, result.crc32, shape, fmt)
    read = read_item(root, item, options)
    if isinstance(read, Skipped):
        return read
    if result.crc32 not in (None, read.crc32):  # the worker's check read other bytes
        return Skipped(item.path, _CHANGED)
    return read.record(shape, fmt)


_CHANGED = "file changed while packing"


def read_item(root: Path, item: SourceItem, options: PackOptions) -> SourceRead | Skipped:
    """The source bytes of ``item``, to be stored as they are; Skipped if they cannot be
    read or are not the ``item.size`` bytes the scan found."""
    framed = options.backend == "lmdb"  # read straight into the LMDB value's layout
    try:
        read = read_source(os.path.join(root, item.path), item.size, item.path, item.labels, framed)
    except OSError as e:
        return Skipped(item.path, f"cannot read: {e.strerror}")
    return read if len(read.data) == item.size else Skipped(item.path, _CHANGED)


def estimated_bytes(item: SourceItem, options: PackOptions) -> int:
    """What ``item`` will take in the store, guessed before it is read."""
    if not options.raw:
        return item.size  # untouched bytes exactly; re-encoded ones rarely larger
    shape = options.fixed_shape()
    if shape is not None:
        return shape[0] * shape[1] * shape[2]
    if options.max_side is not None:
        return min(item.size * 10, options.max_side**2 * 4)
    return item.size * 10  # a JPEG decodes to roughly ten times its size


def estimated_sizes(items: FileList, options: PackOptions) -> np.ndarray:
    """``estimated_bytes`` of each of ``items``, as one array."""
    sizes = items.sizes
    if not options.raw:
        return sizes
    shape = options.fixed_shape()
    if shape is not None:
        return np.full(len(sizes), shape[0] * shape[1] * shape[2], np.int64)
    if options.max_side is not None:
        return np.minimum(sizes * 10, options.max_side**2 * 4)
    return sizes * 10


def storage(options: PackOptions, common_shape: list[int] | None) -> Storage:
    """The manifest's (and each shard's) account of what a record's payload is."""
    return Storage(
        payload=options.payload,
        mode=options.mode,
        encoding=options.encoding,
        quality=options.quality if options.encoding in ("jpeg", "webp") else None,
        max_side=options.max_side,
        size=list(options.size) if options.size else None,
        fit=options.fit if options.size else None,
        shape=options.fixed_shape() or (common_shape if options.raw else None),
        compression=options.compression,
    )
