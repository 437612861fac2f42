"""The one interface every backend implements: write a shard, read it back.

Everything else in packer (scanning, shuffling, the pool, the manifest, the reader) is
written once against this and knows nothing of LMDB or HDF5.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

from packer.store.manifest import Storage
from packer.store.record import Block, Record

__all__ = ["ShardMeta", "ShardWriter", "ShardReader", "Fetched", "merge_ranges"]

# Ranges of a file closer than this are read as one: the bytes between (an LMDB leaf page,
# an HDF5 chunk index node) cost less than another request would.
_MERGE_GAP = 256 << 10


@dataclass
class ShardMeta:
    """What a shard says about itself, so that one shard file is usable alone."""

    index: int  # position of the shard in its store
    num_label_columns: int
    raw_shape: list[int] | None = None  # [h, w, c] when every payload is raw pixels of one shape
    compression: str | None = None  # HDF5 filter for the payload dataset
    extra: dict[str, Any] = field(default_factory=dict)  # storage + label columns, for humans

    @classmethod
    def of_store(
        cls,
        index: int,
        backend: str,
        storage: Storage,
        label_columns: list[dict[str, Any]],
        raw_shape: list[int] | None,
    ) -> ShardMeta:
        """Shard ``index`` of a store with this storage and these label columns."""
        extra = {"backend": backend, "storage": asdict(storage), "label_columns": label_columns}
        return cls(index, len(label_columns), raw_shape, storage.compression, extra)

    def check_row(self, record: Record) -> None:
        """Refuse a record of a raw shard whose pixels are not one row of ``raw_shape``."""
        assert self.raw_shape is not None
        needed = math.prod(self.raw_shape)  # math's, not NumPy's: this runs for every record
        if len(record.data) != needed:
            raise ValueError(
                f"{record.path}: {len(record.data):,} pixel bytes, the shard's shape "
                f"{self.raw_shape} needs {needed:,}"
            )


class ShardWriter(Protocol):
    """Appends records in order; not thread-safe; one writer per shard file."""

    def append(self, record: Record) -> None: ...

    def close(self, sync: bool = True) -> None:
        """Flush and fsync: after close returns, the file is complete on disk. Without
        ``sync`` it is complete, and the caller fsyncs it before counting on it."""

    def abort(self) -> None:
        """Release the file without finishing it; the caller deletes it."""


@dataclass
class Fetched:
    """Byte ranges of one shard file, read ahead in large sequential requests (see
    packer.reading.readahead): a shard reader takes a record's bytes from here rather than through
    its own small reads. A record outside them is read the usual way."""

    ranges: list[tuple[int, memoryview]]  # (file offset, the bytes there), in file order

    def view(self, offset: int, length: int) -> memoryview | None:
        """The file's bytes ``offset`` to ``offset + length``, if one range holds them."""
        for start, data in self.ranges:  # a span has one range or a few: a scan will do
            if start <= offset and offset + length <= start + len(data):
                return data[offset - start : offset - start + length]
        return None

    @property
    def nbytes(self) -> int:
        return sum(len(data) for _, data in self.ranges)


class ShardReader(Protocol):
    """Reads one finished shard. Open it in the thread or process that reads (never across fork)."""

    meta: dict[str, Any]

    def __len__(self) -> int: ...

    def read_block(
        self,
        start: int,
        stop: int,
        out: np.ndarray | None = None,
        fetched: Fetched | None = None,
    ) -> Block:
        """Records ``start`` to ``stop`` (exclusive) in one sequential pass.

        ``out``: for raw pixels of one shape, an (n, h, w, c) uint8 array to read the
        payloads into (the block's ``data`` is then a view of it), saving a copy.
        ``fetched``: the file bytes of ``extents(start, stop)``, already read; payloads
        found there are taken from it (views of it, not copies).
        """

    def extents(self, start: int, stop: int) -> list[tuple[int, int]]:
        """(file offset, length) of the byte ranges holding the payloads of records
        ``start`` to ``stop``, in file order; [] where they cannot be told apart from the
        file's other bytes (then nothing is read ahead)."""

    def index_extents(self) -> list[tuple[int, int]]:
        """(file offset, length) of the bytes read for any record of the shard (its small
        columns and metadata, where they lie apart from the payloads): read ahead once,
        when a shard is first read."""

    def read_record(self, index: int) -> Record: ...

    def read_labels(self) -> np.ndarray:
        """Every record's labels, (n, label columns) int64, without copying the payloads."""

    def close(self) -> None: ...


def check_range(start: int, stop: int, count: int) -> None:
    """Refuse records ``start`` to ``stop`` unless they lie within a shard of ``count``."""
    if not 0 <= start <= stop <= count:
        raise IndexError(f"records {start}:{stop} out of range for {count} records")


def check_index(index: int, count: int) -> None:
    """Refuse record ``index`` unless it lies within a shard of ``count``."""
    if not 0 <= index < count:
        raise IndexError(f"record {index} out of range for {count} records")


def merge_ranges(pieces: list[tuple[int, int]], file_bytes: int) -> list[tuple[int, int]]:
    """(offset, length) pieces as the fewest ranges that cover them inside the file's
    ``file_bytes``, in file order, pieces less than _MERGE_GAP apart joined."""
    ranges: list[list[int]] = []
    for offset, length in sorted(pieces):
        end = min(offset + length, file_bytes)
        if offset < 0 or end <= offset:
            continue  # nothing there to read ahead (the read proper reports any damage)
        if ranges and offset <= ranges[-1][1] + _MERGE_GAP:
            ranges[-1][1] = max(ranges[-1][1], end)
        else:
            ranges.append([offset, end])
    return [(a, b - a) for a, b in ranges]
