"""The one interface every backend implements: write a shard, read it back.

Everything else in packer (scanning, shuffling, the pool, the manifest, the reader) is
written once against this and knows nothing of LMDB or HDF5.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

from packer.manifest import Storage
from packer.record import Block, Record

__all__ = ["ShardMeta", "ShardWriter", "ShardReader"]


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
        needed = math.prod(self.raw_shape)  # math's: 0.1 us a record, NumPy's 3
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


class ShardReader(Protocol):
    """Reads one finished shard. Open it in the thread or process that reads (never across fork)."""

    meta: dict[str, Any]

    def __len__(self) -> int: ...

    def read_block(self, start: int, stop: int, out: np.ndarray | None = None) -> Block:
        """Records ``start`` to ``stop`` (exclusive) in one sequential pass.

        ``out``: for raw pixels of one shape, an (n, h, w, c) uint8 array to read the
        payloads into (the block's ``data`` is then a view of it), saving a copy.
        """

    def read_record(self, index: int) -> Record: ...

    def read_labels(self) -> np.ndarray:
        """Every record's labels, (n, label columns) int64, without copying the payloads."""

    def close(self) -> None: ...
